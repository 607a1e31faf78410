"""What a person at a terminal sees of a run: quiet logs, progress, the summary, errors.

`python -m contrastive_jax.main` (see `main.py`) uses all of it; the training loop uses
`run_line`, `Progress` and `eval_line`, so a run from Python logs the same short lines.

* Logs: `quiet_logs` keeps INFO from contrastive_jax only (orbax, TFDS, JAX and
  absl INFO hidden), without absl's prefix; `filtered_native_stderr` drops the C++
  start-up banners TensorFlow prints while it is imported. `--verbose` keeps everything.
* Progress: a tqdm bar on a terminal, otherwise one short line per logging step
  (`step 50: loss 5.0123, 2,310 examples/s, ETA 1m25s (5% of 1,000)`).
* Summary: `summary` is the table printed on stdout at the end: the headline evaluation
  metrics and where the run's files are.
* Errors: `exit_with_error` prints a person's mistake as one line on stderr (the
  traceback only when verbose) and exits; `CtrlC` makes the first Ctrl-C stop training
  the way SIGTERM does (finish the step, save) and the second abort at once.

Importing this module starts neither JAX nor TensorFlow.
"""

import contextlib
import logging as std_logging
import os
import re
import shlex
import signal
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Mapping, Sequence

import tqdm
from absl import flags, logging

from contrastive_jax import run_dir

VERBOSE_ENV = "CONTRASTIVE_JAX_VERBOSE"  # set to 1: the same as --verbose
USAGE_ERROR = 2  # exit status of a bad config, flag, path or resume (as argparse's)
INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT, the shell's convention)

# The headline evaluation metrics (those the data give), with what they measure.
HEADLINE_METRICS = {
    "a_to_b/R@1": ("Recall@1 retrieving b from a (digits: top -> bottom half; cmudict: spelling -> pronunciation)"),
    "b_to_a/R@1": "Recall@1 retrieving a from b",
    "retrieval/R@1": "Recall@1 of a same-class neighbour (leave-one-out)",
    "retrieval/MAP@R": "MAP@R, same-class retrieval",
    "knn_top1": "kNN accuracy, train split as memory",
    "linear_probe": "linear probe accuracy on frozen embeddings",
}
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# What TensorFlow's C++ start-up prints on every import, whatever the log level.
_NATIVE_NOISE = (
    "All log messages before absl::InitializeLog() is called",
    "oneDNN custom operations are on",
    "cpu_feature_guard.cc",
    "To enable the following instructions:",
)


def verbose_requested(argv: list[str]) -> bool:
    """`--verbose` among the arguments, or CONTRASTIVE_JAX_VERBOSE set (not 0).

    Read from the raw arguments so that it also holds when the flags cannot be parsed.
    """
    flag = any(arg in ("--verbose", "--verbose=true", "--verbose=1") for arg in argv)
    return flag or os.environ.get(VERBOSE_ENV, "0") not in ("", "0")


class _ShortFormatter(std_logging.Formatter):
    """The message alone; warnings and errors prefixed with their level."""

    def format(self, record: std_logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno >= std_logging.WARNING:
            return f"{record.levelname.lower()}: {message}"
        return message


def _ours_or_a_warning(record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or record.pathname.startswith(_PACKAGE_DIR)


def quiet_logs() -> None:
    """absl's handler (all Python logging, once `app.run` started) shows INFO from
    contrastive_jax only, and warnings from anyone, as bare messages."""
    handler = logging.get_absl_handler()
    handler.addFilter(_ours_or_a_warning)
    handler.setFormatter(_ShortFormatter())


@contextlib.contextmanager
def filtered_native_stderr():
    """Drops TensorFlow's C++ start-up banners written to file descriptor 2 meanwhile.

    They cannot be turned off (TF_CPP_MIN_LOG_LEVEL does not reach them); anything else
    written to stderr in the block is passed on when it ends.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines(keepends=True):
                if not any(noise in line for noise in _NATIVE_NOISE):
                    sys.stderr.write(line)


def run_line(mesh, workdir: str, *, global_batch_size: int, num_steps: int, memory=None) -> str:
    """The first line of a run: backend, devices, processes, global and per-device batch,
    the steps, and `memory` (a `memory_fit.StepMemory`: the step's memory per device)
    when given."""
    import jax

    devices = mesh.devices.size
    processes = jax.process_count()
    return (
        f"{jax.default_backend()}: {devices} devices, {processes} "
        f"process{'es' if processes > 1 else ''}; global batch {global_batch_size:,} "
        f"({global_batch_size // devices:,} per device); {num_steps:,} steps; "
        + (f"{memory}; " if memory is not None else "")
        + f"workdir {display_path(workdir)}"
    )


def help_description(doc: str) -> str:
    """A command's `--help` description: its module docstring's first paragraph, whole
    (a sentence, not its first line), on one line; a closing `::` (a code block follows)
    becomes a full stop."""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return paragraph[:-2] + "." if paragraph.endswith("::") else paragraph


HELP_FLAGS = ("--help", "-help", "-h", "--helpshort", "--helpfull")


def help_text(prog: str, doc: str, flag_list: Sequence[flags.Flag]) -> str:
    """A command's `--help`, alike for every command: the usage line, the description
    (`help_description`: one sentence), the rest of the docstring, then each flag with
    its help and default."""
    rest = doc.split("\n\n", 1)[1].rstrip() if "\n\n" in doc else ""
    lines = [f"usage: {prog} --flag=value ...", "", help_description(doc)]
    lines += ["", textwrap.dedent(rest)] if rest else []
    lines += ["", "flags:"]
    for flag in flag_list:
        default = "" if flag.default is None else f" (default: {flag.default_as_str.strip(chr(39))})"
        lines.append(f"  --{flag.name}: {flag.help}{default}")
    return "\n".join(lines)


def parse_flags(
    argv: Sequence[str], flag_values: flags.FlagValues, *, prog: str, doc: str, required: Sequence[str] = ()
) -> flags.FlagValues:
    """`argv` (without the program) parsed by absl into `flag_values`, as every command
    but `main` parses (`main` adds its config: `main.parse_flags`): `--help` prints
    `help_text` and exits 0; an unknown flag, a bad value, a missing `required` flag or
    a stray argument is one line on stderr and exit status 2."""
    if any(arg in HELP_FLAGS for arg in argv):
        print(help_text(prog, doc, [flag_values[name] for name in flag_values]))
        sys.exit(0)
    try:
        remaining = flag_values([prog, *argv])
    except flags.Error as error:
        exit_with_error(f"{error} (see --help)", verbose=False)
    missing = [f"--{name}" for name in required if flag_values[name].value is None]
    if missing:
        exit_with_error(f"{', '.join(missing)} must be given (see --help).", verbose=False)
    if len(remaining) > 1:
        exit_with_error(f"unexpected arguments {remaining[1:]}: flags are written --name=value.", verbose=False)
    return flag_values


def display_path(path: str) -> str:
    """`path` relative to the current directory when it lies under it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def headline(results: Mapping[str, float]) -> dict[str, float]:
    """The `HEADLINE_METRICS` among an evaluation's `results`, in that order."""
    return {name: results[name] for name in HEADLINE_METRICS if name in results}


class Progress:
    """Training progress of process 0: a tqdm bar when stderr is a terminal, otherwise one
    short line per logging step (loss, throughput, time left)."""

    def __init__(self, *, total_steps: int, start_step: int, enabled: bool):
        self._total = total_steps
        self._bar = None
        self._enabled = enabled
        if enabled and sys.stderr.isatty():
            self._bar = tqdm.tqdm(
                total=total_steps,
                initial=start_step,
                desc="train",
                unit="step",
                dynamic_ncols=True,
            )

    def step_done(self) -> None:
        """One more step dispatched (moves the bar)."""
        if self._bar is not None:
            self._bar.update(1)

    def log(self, step: int, scalars: Mapping[str, float], *, seconds_per_step: float | None):
        """The logging step's line (or the bar's postfix): loss, throughput and time left.

        Args:
          scalars: `train/loss` and, once timed, `train/examples_per_second`.
          seconds_per_step: recent time per step (None before any step was timed: the
            first one compiles).
        """
        text = f"loss {scalars['train/loss']:.4f}"
        if "train/examples_per_second" in scalars:
            text += f", {scalars['train/examples_per_second']:,.0f} examples/s"
        if self._bar is not None:
            self._bar.set_postfix_str(text)
        elif self._enabled:
            if seconds_per_step is not None:
                left = _duration((self._total - step) * seconds_per_step)
                text += f", ETA {left} ({100 * step // self._total}% of {self._total:,})"
            logging.info("step %d: %s", step, text)

    def message(self, text: str) -> None:
        """A line between progress updates (an evaluation), above the bar if there is one."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        elif self._enabled:
            logging.info("%s", text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def eval_line(step: int, results: Mapping[str, float]) -> str:
    """`eval at step S: a_to_b/R@1 0.433, ...` (the headline metrics; all of them go to
    metrics.jsonl)."""
    shown = ", ".join(f"{k} {v:.3f}" for k, v in headline(results).items())
    return f"eval at step {step}: {shown or 'see metrics.jsonl'}"


def summary(workdir: str, step: int, results: Mapping[str, float], *, seconds: float) -> str:
    """The table printed at the end of a run: headline metrics and the run's files."""
    where = display_path(workdir)
    metrics = [(name, f"{value:.4f}", HEADLINE_METRICS[name]) for name, value in headline(results).items()]
    files = [
        ("checkpoints", os.path.join(where, run_dir.CHECKPOINTS, ""), "rerunning the command resumes"),
        ("metrics", os.path.join(where, run_dir.METRICS), "training and eval scalars"),
        ("tensorboard", os.path.join(where, run_dir.TENSORBOARD, ""), f"tensorboard --logdir {where}"),
        ("evaluation", os.path.join(where, run_dir.EVAL_RESULTS), "every eval metric"),
    ]
    lines = [f"{where}: trained to step {step:,} (this command: {_duration(seconds)})"]
    for header, rows in ((("metric", "value", "meaning"), metrics), (("file", "path", ""), files)):
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(2)]
        lines += [""] + [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}".rstrip() for a, b, c in [header, *rows]]
    return "\n".join(lines)


def exit_with_error(message: str, *, verbose: bool, status: int = USAGE_ERROR):
    """Prints `error: <message>` on stderr (after the traceback of the exception being
    handled, when verbose) and exits with `status`."""
    if verbose:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def rerun_command(argv: Sequence[str], *, every_process: bool = False) -> str:
    """The shell command that reruns this `contrastive_jax.main` with the same flags
    (`argv`: its `sys.argv`); with `every_process`, the one every process of a
    multi-process run runs, this process's `--process_id` becoming `<I>`."""
    args = list(argv[1:])
    if every_process:
        args = [re.sub(r"^(--process_id=).*", r"\1<I>", arg) for arg in args]
    python = display_path(sys.executable)
    return shlex.join([python, "-m", "contrastive_jax.main", *args])


class CtrlC:
    """The first Ctrl-C (SIGINT) stops training as SIGTERM does; the second aborts.

    While the loop runs, the first SIGINT is passed on as a SIGTERM to this process, so
    `distributed.Preemption` (or, with several processes, JAX's preemption sync) lets the
    step finish and saves it; before the loop (nothing to save yet) it raises
    KeyboardInterrupt as usual. The second SIGINT kills the process at once (status
    130 in a shell); the newest complete checkpoint is kept.
    """

    def __init__(self):
        self.pressed = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        if self.pressed:
            print("Ctrl-C again: aborting now, without saving.", file=sys.stderr, flush=True)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return
        self.pressed = True
        if not _sigterm_saves():
            raise KeyboardInterrupt
        print(
            "Ctrl-C: finishing the current step, then saving a checkpoint (press Ctrl-C again to abort at once).",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)


def _sigterm_saves() -> bool:
    """Whether a SIGTERM now stops training with a save: the loop's handler is installed
    (one process), or jax.distributed's preemption notifier has it (several)."""
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return True
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()
