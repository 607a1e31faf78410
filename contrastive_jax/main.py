"""Command line: `python -m contrastive_jax.main --config=configs/default.py --workdir=DIR`.

Intentionally short (the only file that defines flags), so the logic can be imported
elsewhere: `train.train_and_evaluate(config, workdir)`. Any config field can be
overridden, e.g. `--config.loss.temperature=0.05 --config.train.num_train_steps=100`.

What it prints: a first line (backend, devices, processes, batch, the step's memory per
device), one line per logging step (a progress bar on a terminal), and at the end a
summary table on stdout; INFO logs of other libraries are hidden unless `--verbose` (or
CONTRASTIVE_JAX_VERBOSE=1). A bad config, flag, workdir or resume, or a step that does
not fit in the device's memory, is one line on stderr (`error: ...`, naming the fix)
and exit status 2, with the traceback only when verbose; a crash keeps its traceback. A
loss that went bad (and was not rolled back, see `bad_loss`) is one line and exit
status 1. A run already trained to its last step says so and exits 0. The first Ctrl-C finishes the
step, saves and prints the command that resumes (exit status 130); the second aborts.

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

import contextlib
import json
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from contrastive_jax import console
from contrastive_jax.simulated_devices import simulate_cpu_devices

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file, e.g. configs/default.py."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, evaluations.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-process: HOST:PORT of process 0 (the same in all)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: how many.", lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "Multi-process: this one's id, 0-based.", lower_bound=0
)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process with settings JAX detects (TPU pods, SLURM, MPI)."
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_float(
    "heartbeat_timeout_seconds", 30, "Multi-process: stop all when one is silent this long."
)
_VERBOSE = flags.DEFINE_bool(
    "verbose", False,
    f"All logs (orbax, TFDS, JAX INFO) and the traceback of a bad config or flag; or set "
    f"{console.VERBOSE_ENV}=1.",
)
flags.register_validator(
    "config", lambda config: config is not None,
    "Missing --config: pass a config file, e.g. --config=configs/default.py.",
)
flags.register_validator(
    "workdir", bool,
    "Missing --workdir: pass a directory for checkpoints and metrics (created if missing), "
    "e.g. --workdir=runs/default.",
)
flags.register_multi_flags_validator(
    ["num_processes", "process_id"],
    lambda f: None in (f["num_processes"], f["process_id"]) or f["process_id"] < f["num_processes"],
    "--process_id must be below --num_processes (ids are 0 ... num_processes - 1).",
)


def _config_path(argv: list[str]) -> str | None:
    """The file `--config=FILE[:ARGS]` names in `argv` (the last one), or None."""
    path = None
    for arg, following in zip(argv, argv[1:] + [None]):
        if arg.startswith(("--config=", "-config=")):
            path = arg.split("=", 1)[1]
        elif arg in ("--config", "-config"):
            path = following
    return path.split(":", 1)[0] if path else path


def _flag_error(error: Exception, argv: list[str]) -> str | None:
    """A person's message for an exception parsing the flags (None: not a flag mistake)."""
    config_path = _config_path(argv)
    if isinstance(error, flags.Error):
        message = str(error)
        if "Error whilst parsing config file" in message:  # the config's code raised
            return None
        # absl puts "flag --workdir=None: " before our validators' text.
        return message[message.index("Missing --"):] if "Missing --" in message else message
    if isinstance(error, OSError) and config_path is not None:
        configs = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")
        listed = sorted(f for f in os.listdir(configs) if f.endswith(".py")) if os.path.isdir(configs) else []
        if os.path.isdir(config_path) or not os.path.exists(config_path):
            problem = "is a directory" if os.path.isdir(config_path) else "no such file"
        else:
            problem = f"cannot be loaded ({str(error).splitlines()[-1].strip()})"
        return (
            f"--config={config_path}: {problem} (in {os.getcwd()}); pass a config file such "
            f"as configs/default.py" + (f" (configs/ holds {', '.join(listed)})" if listed else "")
            + "."
        )
    if isinstance(error, SyntaxError) or getattr(error, "name", None) == "get_config":
        problem = (
            f"not a Python file ({error.msg}, line {error.lineno})"
            if isinstance(error, SyntaxError) else "has no get_config()"
        )
        return (
            f"--config={config_path}: {problem}; a config file defines get_config() returning "
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
                return f"--{name}: {config_path} has no field {field!r}. {hint}"
    return None


def _make_config_siblings_importable(config_path: str | None) -> None:
    """A config in a `configs/` folder builds on its siblings (`from configs import
    default`): puts that folder's parent on `sys.path`, wherever the command runs from."""
    if config_path is None:
        return
    folder = os.path.dirname(os.path.abspath(config_path))
    if os.path.basename(folder) == "configs" and os.path.dirname(folder) not in sys.path:
        sys.path.insert(0, os.path.dirname(folder))


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing (which loads the config and applies `--config.x` overrides), with
    a person's mistake as one line and exit status 2."""
    _make_config_siblings_importable(_config_path(argv))
    try:
        remaining = flags.FLAGS(argv)
        _CONFIG.value.get("seed")  # a config file that failed to load raises here
    except Exception as error:  # noqa: BLE001  (a crash is re-raised below)
        message = _flag_error(error, argv)
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
    config, verbose = _CONFIG.value, _VERBOSE.value or console.verbose_requested(sys.argv)
    if not verbose:
        console.quiet_logs()
    simulate_cpu_devices(config.num_simulated_devices)
    ctrl_c = console.CtrlC()
    ctrl_c.install()
    # JAX starts here, after XLA_FLAGS is final.
    with contextlib.nullcontext() if verbose else console.filtered_native_stderr():
        import jax

        from contrastive_jax import distributed, train
        from contrastive_jax.config_lib import ConfigError

    distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        auto_detect=_DISTRIBUTED.value,
        heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
    )
    if jax.process_index() != 0:
        logging.set_verbosity(logging.WARNING)
    started = time.perf_counter()
    with distributed.ProcessWatchdog(  # another process lost: one line, exit status 75
        timeout_seconds=_HEARTBEAT_TIMEOUT.value, command=distributed.rerun_command(sys.argv)
    ):
        try:
            results = train.train_and_evaluate(config, _WORKDIR.value)
        except ConfigError as e:
            console.exit_with_error(str(e), verbose=verbose)
        except FloatingPointError as e:  # a bad loss: the message names the checkpoint
            console.exit_with_error(str(e), verbose=verbose, status=1)
        except train.Preempted as e:
            where = console.display_path(e.directory)
            if jax.process_count() == 1:
                signal_name = "Ctrl-C" if ctrl_c.pressed else "SIGTERM"
                message = (
                    f"{signal_name}: stopped after step {e.step} and saved it in {where}. To "
                    f"resume, run:\n  {console.rerun_command(sys.argv)}"
                )
            else:  # one signalled process stops all; JAX does not say which one it was
                message = (
                    f"Stopped after step {e.step} with the other processes (a SIGTERM or "
                    f"Ctrl-C reached one of them) and saved it in {where}. To resume, run all "
                    f"processes, with I = 0 ... {jax.process_count() - 1}:\n  "
                    f"{distributed.rerun_command(sys.argv)}"
                )
            print(message, file=sys.stderr, flush=True)
            sys.exit(console.INTERRUPTED if ctrl_c.pressed else 0)
        except KeyboardInterrupt:
            console.exit_with_error(
                f"Interrupted (Ctrl-C). To resume, run: {console.rerun_command(sys.argv)}",
                verbose=verbose, status=console.INTERRUPTED,
            )
    if jax.process_index() == 0:
        with open(os.path.join(_WORKDIR.value, "eval_results.json")) as f:
            step = json.load(f)["step"]
        print(console.summary(_WORKDIR.value, step, results, seconds=time.perf_counter() - started))


def run() -> None:
    """The command's entry point."""
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
