"""A run's working directory: the names of its files, and their readers and writers.

    <workdir>/checkpoints/<step>/   orbax checkpoints (checkpoint.Checkpointer)
    <workdir>/metrics.jsonl         one JSON line per logging step (metric_writer)
    <workdir>/tensorboard/          the same scalars as TensorBoard events
    <workdir>/eval_results.json     the last evaluation: {"step": s, metric: value, ...}
    <workdir>/rollbacks.json        the rollbacks so far and the batches they skipped (loss_guard)

Files are written by process 0; every other module names them through this one.
"""

import json
import os
import tempfile
from typing import Any

from contrastive_jax.errors import ConfigError

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
EVAL_RESULTS = "eval_results.json"
ROLLBACKS = "rollbacks.json"


def prepare(workdir: str | os.PathLike | None) -> str:
    """Creates `workdir` if needed and returns its absolute path.

    Raises:
      ConfigError: `workdir` is not given, or cannot be created or written.
    """
    if not workdir:
        raise ConfigError("No workdir: pass --workdir=DIR (created if missing) for checkpoints and metrics.")
    workdir = os.path.abspath(workdir)
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        raise ConfigError(
            f"--workdir={workdir} cannot be created or written ({e.strerror or e}); pass a "
            "directory you can write to (on storage every process shares)."
        ) from e
    return workdir


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """The lines of `metrics.jsonl`, in order (`[]` when there is none)."""
    path = os.path.join(workdir, METRICS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def metrics_by_step(workdir: str | os.PathLike) -> dict[int, dict[str, float]]:
    """`metrics.jsonl` as `{step: {name: value}}`, sorted by step (a step logged twice,
    as a resumed run may: the later line wins)."""
    by_step: dict[int, dict[str, float]] = {}
    for record in read_metrics(workdir):
        by_step.setdefault(record.pop("step"), {}).update(record)
    return dict(sorted(by_step.items()))


def read_eval_results(workdir: str | os.PathLike) -> dict[str, float] | None:
    """`eval_results.json`: `{"step": s, metric: value, ...}`, or None when there is none."""
    path = os.path.join(workdir, EVAL_RESULTS)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_json(path: str | os.PathLike, value: Any, **dump_options: Any) -> None:
    """Writes `value` as JSON to `path` whole or not at all (a kill mid-write leaves the
    previous file): through `<path>.tmp` and an atomic rename."""
    with open(f"{path}.tmp", "w") as f:
        json.dump(value, f, **dump_options)
    os.replace(f"{path}.tmp", path)


def write_eval_results(workdir: str | os.PathLike, step: int, metrics: dict[str, float]) -> None:
    """Writes `{"step": step, **metrics}` to `eval_results.json` (indented, keys sorted)."""
    write_json(os.path.join(workdir, EVAL_RESULTS), {"step": step, **metrics}, indent=2, sort_keys=True)
