"""Training and evaluation scalars to `<workdir>/metrics.jsonl` and TensorBoard.

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
from collections.abc import Mapping

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from contrastive_jax import run_dir


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
