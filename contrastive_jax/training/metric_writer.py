"""Training and evaluation scalars to `<workdir>/metrics.jsonl` and TensorBoard, and the
window of steps whose means the loop logs every k steps (`MetricWindow`).

`clu.metric_writers` would do the same, but its last release is from April 2024; these
lines keep the JSONL file exact across resumes (see `MetricWriter`) and write
TensorBoard's event files with the `tensorboard` package's record writer on a plain file
(its `EventFileWriter` goes through `tensorboard.compat.tf`, which imports TensorFlow
whenever it is installed).
"""

import json
import os
import socket
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from contrastive_jax import run_dir
from contrastive_jax.training import noise_scale


class MetricWriter:
    """Scalars to `<workdir>/metrics.jsonl` and `<workdir>/tensorboard/` (process 0 only)."""

    def __init__(self, workdir: str, *, enabled: bool, start_step: int = 0):
        """Opens the files; `metrics.jsonl` keeps only the lines of steps <= `start_step`.

        Lines after the checkpoint a run resumes from were written by the interrupted
        run (the last one possibly cut off by a kill); they are dropped, since the
        resumed run logs those steps again, so the file holds each step once.
        """
        self._enabled = enabled
        if enabled:
            path = os.path.join(workdir, run_dir.METRICS)
            kept = []
            if os.path.exists(path):
                with open(path) as f:
                    kept = [line for line in f if line.endswith("\n") and json.loads(line)["step"] <= start_step]
            with open(f"{path}.tmp", "w") as f:
                f.writelines(kept)
            os.replace(f"{path}.tmp", path)
            self._jsonl = open(path, "a")
            self._summary = _event_file(os.path.join(workdir, run_dir.TENSORBOARD))

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Appends one JSON line `{"step": step, **scalars}` and the TensorBoard scalars."""
        if not self._enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        values = [summary_pb2.Summary.Value(tag=name, simple_value=float(value)) for name, value in scalars.items()]
        event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
        self._summary.write(event.SerializeToString())
        self._summary.flush()

    def close(self) -> None:
        if self._enabled:
            self._jsonl.close()
            self._summary.close()


def _event_file(directory: str) -> RecordWriter:
    """A new TensorBoard event file in `directory` (named as TensorFlow names them), its
    version record written."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}")
    events = RecordWriter(open(path, "wb"))
    events.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    return events


class MetricWindow:
    """The metrics of the steps since the last logging step, logged every k steps.

    `record` takes a finished step's metrics (`guard.check` raising `loss_guard.BadLoss`
    on a bad one) and, at a logging step (every `log_every_steps`, and the last of
    `num_train_steps`), writes their means to `metrics_out` (a `MetricWriter`, replaced
    after a rollback) and `progress` (`console.Progress`), with the time per step, the
    examples per second, the share of the time spent waiting for input, the records
    skipped and the global batch (`train/global_batch`).

    Args:
      batch_of: the global batch of a step (`batch_of(step)`: the batch schedule's).
      batch_shards: the shards the batch is split over (with the logging step's global
        batch, the noise scale's two batch sizes).
      start_step: the step the loop starts after (its first step warms up, untimed).
    """

    def __init__(
        self,
        *,
        log_every_steps: int,
        num_train_steps: int,
        batch_of: Callable[[int], int],
        batch_shards: int,
        guard,
        metrics_out: MetricWriter,
        progress,
        start_step: int,
    ):
        self._log_every_steps, self._num_train_steps = log_every_steps, num_train_steps
        self._batch_of, self._batch_shards = batch_of, batch_shards
        self._guard, self.metrics_out, self._progress = guard, metrics_out, progress
        self._start_step = start_step
        self._window: list[dict[str, float]] = []
        self.skipped_records = 0
        self.restart_timer()

    def restart_timer(self) -> None:
        """Times the steps from now (after a warm-up, a save or an evaluation)."""
        self._timer_start, self._timed_steps, self._input_wait = time.perf_counter(), 0, 0.0

    def waited(self, seconds: float) -> None:
        """Counts `seconds` spent waiting for a batch."""
        self._input_wait += seconds

    def clear(self) -> None:
        """Forgets the metrics of steps undone (a rollback)."""
        self._window.clear()

    @property
    def empty(self) -> bool:
        return not self._window

    def record(self, step: int, metrics) -> dict[str, float]:
        """Fetches a finished step's metrics, raises BadLoss on a bad one, logs every k;
        returns them, as floats."""
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self._guard.check(step, values)
        self._window.append(values)
        if step == self._start_step + 1:  # the first step warms up: time the steps after it
            self.restart_timer()
        else:
            self._timed_steps += 1
        if step % self._log_every_steps == 0 or step == self._num_train_steps:
            self._log(step)
        return values

    def _log(self, step: int) -> None:
        window, global_batch = self._window, self._batch_of(step)
        scalars = {f"train/{k}": float(np.mean([w[k] for w in window])) for k in window[0]}
        scalars["train/global_batch"] = global_batch
        elapsed = time.perf_counter() - self._timer_start
        seconds_per_step = elapsed / max(self._timed_steps, 1)
        if noise_scale.SMALL_KEY in window[0]:
            scalars["train/noise_scale"] = noise_scale.window_b_simple(window, global_batch, self._batch_shards)
        if self._timed_steps:
            scalars["train/examples_per_second"] = global_batch / seconds_per_step
            scalars["train/input_wait_share"] = self._input_wait / elapsed
        if self.skipped_records:
            scalars["train/skipped_records"] = self.skipped_records
        self.metrics_out.write(step, scalars)
        self._progress.log(step, scalars, seconds_per_step=seconds_per_step if self._timed_steps else None)
        window.clear()
        self.restart_timer()
