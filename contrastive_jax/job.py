"""The training job as its command runs it (`python -m contrastive_jax.main`, whose flags
are `main.py`'s): quiet logs, simulated devices, the processes started, one-line errors,
Ctrl-C and SIGTERM that save and print the command that resumes, and the summary table.
The run itself is `training.run_plan.train_and_evaluate(config, workdir)`.

Importing this module starts neither JAX nor TensorFlow: `run_training` starts JAX once
the devices to simulate are set.
"""

import contextlib
import os
import sys
import time

from absl import logging

from contrastive_jax import console, run_dir
from contrastive_jax.errors import ConfigError
from contrastive_jax.simulated_devices import simulate_cpu_devices


def make_config_siblings_importable(config_path: str | None) -> None:
    """A config in a `configs/` folder builds on its siblings (`from configs import
    default`): puts that folder's parent on `sys.path`, wherever the command runs from."""
    if config_path is None:
        return
    folder = os.path.dirname(os.path.abspath(config_path))
    if os.path.basename(folder) == "configs" and os.path.dirname(folder) not in sys.path:
        sys.path.insert(0, os.path.dirname(folder))


def _stopped_message(stop, process_count: int, ctrl_c: bool) -> str:
    """What a run stopped by SIGTERM or Ctrl-C (`loop.Preempted` `stop`) prints: the
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

        from contrastive_jax.training import distributed, loop, run_plan

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
            results = run_plan.train_and_evaluate(config, workdir)
        except ConfigError as e:
            console.exit_with_error(str(e), verbose=verbose)
        except FloatingPointError as e:  # a bad loss: the message names the checkpoint
            console.exit_with_error(str(e), verbose=verbose, status=1)
        except loop.Preempted as e:
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
