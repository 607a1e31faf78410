"""What the command line does around the run: a person's mistake in the flags as one line,
the run itself with its one-line errors, Ctrl-C and preemption, and the summary.

`main.py` only defines the flags and calls `parse_flags` and `run_training`.
"""

import contextlib
import os
import sys
import time
from collections.abc import Sequence

from absl import flags, logging

from contrastive_jax import console, run_dir
from contrastive_jax.simulated_devices import simulate_cpu_devices


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


def make_config_siblings_importable(config_path: str | None) -> None:
    """A config in a `configs/` folder builds on its siblings (`from configs import
    default`): puts that folder's parent on `sys.path`, wherever the command runs from."""
    if config_path is None:
        return
    folder = os.path.dirname(os.path.abspath(config_path))
    if os.path.basename(folder) == "configs" and os.path.dirname(folder) not in sys.path:
        sys.path.insert(0, os.path.dirname(folder))


def parse_flags(argv: list[str], config_flag, *, doc: str, held: Sequence) -> list[str]:
    """absl's parsing (which loads the config and applies `--config.x` overrides), with
    a person's mistake as one line and exit status 2, and `--help` as every command
    gives it (`console.help_text`: `doc`, then the flags of the holders `held`), exit
    status 0. `config_flag`: the `--config` flag's holder."""
    if any(arg in console.HELP_FLAGS for arg in argv[1:]):
        print(console.help_text("python -m contrastive_jax.main", doc, [flags.FLAGS[h.name] for h in held]))
        sys.exit(0)
    make_config_siblings_importable(config_path(argv))
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


def _stopped_message(stop, process_count: int, ctrl_c: bool) -> str:
    """What a run stopped by SIGTERM or Ctrl-C (`train.Preempted` `stop`) prints: the
    step saved, where, and the command that resumes it."""
    where = console.display_path(stop.directory)
    if process_count == 1:
        return (
            f"{'Ctrl-C' if ctrl_c else 'SIGTERM'}: stopped after step {stop.step} and saved it in "
            f"{where}. To resume, run:\n  {console.rerun_command(sys.argv)}"
        )
    # One signalled process stops all; JAX does not say which one it was.
    return (
        f"Stopped after step {stop.step} with the other processes (a SIGTERM or Ctrl-C reached "
        f"one of them) and saved it in {where}. To resume, run all processes, with I = 0 ... "
        f"{process_count - 1}:\n  {console.rerun_command(sys.argv, every_process=True)}"
    )


def run_training(
    config,
    workdir: str,
    *,
    verbose: bool,
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    auto_detect: bool,
    heartbeat_timeout_seconds: float,
) -> None:
    """Trains and evaluates `config` in `workdir` as the command line does: quiet logs
    unless `verbose`, multi-process start-up, one-line errors (exit status 2, or 1 for a
    bad loss), Ctrl-C and SIGTERM that save and print the command that resumes (exit
    status 130 and `distributed.PREEMPTED_EXIT_STATUS`), and the summary table on stdout."""
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

    try:
        distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            auto_detect=auto_detect,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        )
    except ConfigError as e:
        console.exit_with_error(str(e), verbose=verbose)
    if jax.process_index() != 0:
        logging.set_verbosity(logging.WARNING)
    started = time.perf_counter()
    with distributed.ProcessWatchdog(  # another process lost: one line, exit status 75
        timeout_seconds=heartbeat_timeout_seconds, command=console.rerun_command(sys.argv, every_process=True)
    ):
        try:
            results = train.train_and_evaluate(config, workdir)
        except ConfigError as e:
            console.exit_with_error(str(e), verbose=verbose)
        except FloatingPointError as e:  # a bad loss: the message names the checkpoint
            console.exit_with_error(str(e), verbose=verbose, status=1)
        except train.Preempted as e:
            print(_stopped_message(e, jax.process_count(), ctrl_c.pressed), file=sys.stderr, flush=True)
            sys.exit(console.INTERRUPTED if ctrl_c.pressed else distributed.PREEMPTED_EXIT_STATUS)
        except KeyboardInterrupt:
            console.exit_with_error(
                f"Interrupted (Ctrl-C). To resume, run: {console.rerun_command(sys.argv)}",
                verbose=verbose,
                status=console.INTERRUPTED,
            )
    if jax.process_index() == 0:
        step = run_dir.read_eval_results(workdir)["step"]
        print(console.summary(workdir, step, results, seconds=time.perf_counter() - started))
