"""Command line: `python -m contrastive_jax.main --config=configs/default.py --workdir=DIR`.

Intentionally short (the only file that defines flags), so the logic can be imported
elsewhere: `train.train_and_evaluate(config, workdir)`. Any config field can be
overridden, e.g. `--config.loss.temperature=0.05 --config.train.num_train_steps=100`.

Simulated devices: when `config.num_simulated_devices` > 1 and XLA_FLAGS does not
already set a host device count, this sets
`XLA_FLAGS=--xla_force_host_platform_device_count=<n>` before JAX starts, so a CPU-only
machine trains data parallel over n simulated devices (the CPU backend only; GPUs and
TPUs are used as they are).

Multi-process (one process per host, or several on one machine): pass
`--coordinator_address=HOST:PORT --num_processes=P --process_id=I` to every process, or
`--distributed` alone where JAX detects them (Cloud TPU pod slices, SLURM, Open MPI).
Only process 0 logs at INFO and writes metrics. When a process is lost, the others stop
within `--heartbeat_timeout_seconds` with one line and status 75. SIGTERM (preemption)
saves a checkpoint and exits with status 0; rerunning the same command resumes. See the
README's "Multi-host" section.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, evaluations.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-process: HOST:PORT of process 0 (the same in all)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: how many.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process: this one's id, 0-based.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process with settings JAX detects (TPU pods, SLURM, MPI)."
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_float(
    "heartbeat_timeout_seconds", 30, "Multi-process: stop all when one is silent this long."
)
flags.mark_flags_as_required(["config", "workdir"])


def simulate_cpu_devices(num_devices: int) -> None:
    """Asks XLA for `num_devices` CPU devices, unless XLA_FLAGS already sets a count.

    Call it before JAX starts (before its first use in the process); 1 or fewer: no-op.
    Also used by the sweep drivers under `experiments/` and the Colab notebook.
    """
    xla_flags = os.environ.get("XLA_FLAGS", "")
    if num_devices > 1 and "xla_force_host_platform_device_count" not in xla_flags:
        os.environ["XLA_FLAGS"] = (
            f"{xla_flags} --xla_force_host_platform_device_count={num_devices}"
        ).strip()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    # Keep the log readable: orbax logs every save step at INFO.
    logging.get_absl_handler().python_handler.addFilter(
        lambda record: "/orbax/" not in record.pathname or record.levelno >= logging.WARNING
    )
    simulate_cpu_devices(config.num_simulated_devices)
    # JAX starts here, after XLA_FLAGS is final.
    import jax

    from contrastive_jax import distributed, train

    distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        auto_detect=_DISTRIBUTED.value,
        heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
    )
    if jax.process_index() != 0:
        logging.set_verbosity(logging.WARNING)
    with distributed.ProcessWatchdog(  # another process lost: one line, exit status 75
        timeout_seconds=_HEARTBEAT_TIMEOUT.value, command=distributed.rerun_command(sys.argv)
    ):
        try:
            train.train_and_evaluate(config, _WORKDIR.value)
        except train.Preempted as e:
            logging.warning("%s", e)  # a clean exit: the scheduler reruns the same command


if __name__ == "__main__":
    app.run(main)
