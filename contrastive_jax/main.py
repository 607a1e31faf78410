"""Trains and evaluates a config in a working directory, resuming from its newest
checkpoint: `python -m contrastive_jax.main --config=configs/default.py --workdir=DIR`.

The command alone: its flags and their parsing (a person's mistake as one line), then one
call, `job.run_training`, for what it does around the run (start-up, errors, Ctrl-C and
preemption, the summary). The run itself is `training.run_plan.train_and_evaluate(config,
workdir)`, which a notebook or a script calls directly. Any config field can be
overridden, e.g. `--config.loss.temperature=0.05 --config.train.num_train_steps=100`.

What it prints: a first line (backend, devices, processes, batch, the step's memory per
device), one line per logging step (a progress bar on a terminal), and at the end a
summary table on stdout; INFO logs of other libraries are hidden unless `--verbose` (or
CONTRASTIVE_JAX_VERBOSE=1). A bad config, flag, workdir or resume, or a step that does
not fit in the device's memory, is one line on stderr (`error: ...`, naming the fix)
and exit status 2, with the traceback only when verbose; a crash keeps its traceback. A
loss that went bad (and was not rolled back, see `loss_guard`) is one line and exit
status 1. A run already trained to its last step says so and exits 0. The first Ctrl-C finishes the
step, saves and prints the command that resumes (exit status 130); the second aborts.

Simulated devices: when `config.num_simulated_devices` > 1 and XLA_FLAGS does not
already set a host device count, this sets
`XLA_FLAGS=--xla_force_host_platform_device_count=<n>` before JAX starts, so a CPU-only
machine trains data parallel over n simulated devices (the CPU backend only; GPUs and
TPUs are used as they are).

Multi-process (one process per host or per GPU, or several on one machine): pass
`--coordinator_address=HOST:PORT --num_processes=P --process_id=I` to every process, or
`--distributed` alone where JAX detects them (Cloud TPU pod slices, SLURM, Open MPI).
Only process 0 logs at INFO and writes metrics. When a process is lost, the others stop
within `--heartbeat_timeout_seconds` with one line and status 75. SIGTERM (preemption,
a time limit's warning) saves a checkpoint and exits with status 143 (128 + SIGTERM,
`distributed.PREEMPTED_EXIT_STATUS`), in every process: not 0, so that SLURM, a
Kubernetes Job or JobSet restarts the run instead of taking it as finished; rerunning
the same command resumes. Recipes for SLURM, JobSet and Cloud TPU pods are in launch/,
explained in docs/training.md ("Launch recipes").
"""

import os
import sys
from collections.abc import Sequence

from absl import app, flags
from ml_collections import config_flags

from contrastive_jax import console, job

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "a config file, e.g. configs/default.py; --config.<group>.<field>=value overrides a field"
)
_WORKDIR = flags.DEFINE_string("workdir", None, "the directory of checkpoints, metrics and evaluations (created)")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "multi-process: HOST:PORT of process 0 (the same in all)"
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "multi-process: how many", lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "multi-process: this one's id, 0-based", lower_bound=0)
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "multi-process with settings JAX detects (TPU pods, SLURM, MPI)")
_HEARTBEAT_TIMEOUT = flags.DEFINE_float(
    "heartbeat_timeout_seconds", 30, "multi-process: stop all when one is silent this long"
)
_VERBOSE = flags.DEFINE_bool(
    "verbose",
    False,
    f"all logs (orbax, TFDS, JAX INFO) and the traceback of a bad config or flag; or set {console.VERBOSE_ENV}=1",
)
flags.register_validator(
    "config",
    lambda config: config is not None,
    "Missing --config: pass a config file, e.g. --config=configs/default.py.",
)
flags.register_validator(
    "workdir",
    bool,
    "Missing --workdir: pass a directory for checkpoints and metrics (created if missing), "
    "e.g. --workdir=runs/default.",
)
flags.register_multi_flags_validator(
    ["num_processes", "process_id"],
    lambda f: None in (f["num_processes"], f["process_id"]) or f["process_id"] < f["num_processes"],
    "--process_id must be below --num_processes (ids are 0 ... num_processes - 1).",
)


def config_path(argv: list[str]) -> str | None:
    """The file `--config=FILE[:ARGS]` names in `argv` (the last one), or None."""
    path = None
    for arg, following in zip(argv, argv[1:] + [None]):
        if arg.startswith(("--config=", "-config=")):
            path = arg.split("=", 1)[1]
        elif arg in ("--config", "-config"):
            path = following
    return path.split(":", 1)[0] if path else path


def flag_error(error: Exception, argv: list[str]) -> str | None:
    """A person's message for an exception parsing the flags (None: not a flag mistake)."""
    path = config_path(argv)
    if isinstance(error, flags.Error):
        message = str(error)
        if "Error whilst parsing config file" in message:  # the config's code raised
            return None
        # absl puts "flag --workdir=None: " before our validators' text.
        return message[message.index("Missing --") :] if "Missing --" in message else message
    if isinstance(error, OSError) and path is not None:
        configs = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")
        listed = sorted(f for f in os.listdir(configs) if f.endswith(".py")) if os.path.isdir(configs) else []
        if os.path.isdir(path) or not os.path.exists(path):
            problem = "is a directory" if os.path.isdir(path) else "no such file"
        else:
            problem = f"cannot be loaded ({str(error).splitlines()[-1].strip()})"
        return (
            f"--config={path}: {problem} (in {os.getcwd()}); pass a config file such "
            f"as configs/default.py" + (f" (configs/ holds {', '.join(listed)})" if listed else "") + "."
        )
    if isinstance(error, SyntaxError) or getattr(error, "name", None) == "get_config":
        problem = (
            f"not a Python file ({error.msg}, line {error.lineno})"
            if isinstance(error, SyntaxError)
            else "has no get_config()"
        )
        return (
            f"--config={path}: {problem}; a config file defines get_config() returning "
            "a ConfigDict, as configs/default.py does."
        )
    if isinstance(error, (KeyError, AttributeError)):
        # ml_collections: KeyError("'field'\nDid you mean ...") wrapped in AttributeError.
        while error.args and isinstance(error.args[0], BaseException):
            error = error.args[0]
        field, _, hint = str(error.args[0] if error.args else "").partition("\n")
        field = field.strip("'\"")
        for arg in argv:
            name = arg.split("=", 1)[0].lstrip("-")
            if name.startswith("config.") and field in name.split(".")[1:]:
                return f"--{name}: {path} has no field {field!r}. {hint}"
    return None


def parse_flags(argv: list[str], config_flag, *, doc: str, held: Sequence) -> list[str]:
    """absl's parsing (which loads the config and applies `--config.x` overrides), with
    a person's mistake as one line and exit status 2, and `--help` as every command
    gives it (`console.help_text`: `doc`, then the flags of the holders `held`), exit
    status 0. `config_flag`: the `--config` flag's holder."""
    if any(arg in console.HELP_FLAGS for arg in argv[1:]):
        print(console.help_text("python -m contrastive_jax.main", doc, [flags.FLAGS[h.name] for h in held]))
        sys.exit(0)
    job.make_config_siblings_importable(config_path(argv))
    try:
        remaining = flags.FLAGS(argv)
        config_flag.value.get("seed")  # a config file that failed to load raises here
    except Exception as error:  # noqa: BLE001  (a crash is re-raised below)
        message = flag_error(error, argv)
        if message is None:
            raise
        console.exit_with_error(message, verbose=console.verbose_requested(argv))
    if len(remaining) > 1:
        console.exit_with_error(
            f"Unexpected arguments {remaining[1:]}: flags are written --name=value.",
            verbose=False,
        )
    return remaining


def main(argv):
    del argv
    job.run_training(
        _CONFIG.value,
        _WORKDIR.value,
        verbose=_VERBOSE.value or console.verbose_requested(sys.argv),
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        auto_detect=_DISTRIBUTED.value,
        heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
    )


_HELD = (_CONFIG, _WORKDIR, _COORDINATOR, _NUM_PROCESSES, _PROCESS_ID, _DISTRIBUTED, _HEARTBEAT_TIMEOUT, _VERBOSE)


def run() -> None:
    """The command's entry point."""
    app.run(main, flags_parser=lambda argv: parse_flags(argv, _CONFIG, doc=__doc__, held=_HELD))


if __name__ == "__main__":
    run()
