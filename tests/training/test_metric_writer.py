"""metric_writer: metrics.jsonl kept exact across resumes, TensorBoard events without TensorFlow."""

import json
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator

from contrastive_jax.training import metric_writer


def test_scalars_reach_tensorboard_and_the_jsonl_file(tmp_path):
    writer = metric_writer.MetricWriter(str(tmp_path), enabled=True)
    writer.write(1, {"train/loss": 2.5, "train/accuracy": 0.25})
    writer.write(2, {"train/loss": 1.5})
    writer.close()
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.5), (2, 1.5)]
    assert [(e.step, e.value) for e in events.Scalars("train/accuracy")] == [(1, 0.25)]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "train/loss": 2.5, "train/accuracy": 0.25}, {"step": 2, "train/loss": 1.5}]


def test_a_resume_drops_the_lines_after_its_step_and_a_cut_last_line(tmp_path):
    writer = metric_writer.MetricWriter(str(tmp_path), enabled=True)
    for step in (1, 2, 3):
        writer.write(step, {"train/loss": float(step)})
    writer.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "train/lo')  # a kill mid-line
    metric_writer.MetricWriter(str(tmp_path), enabled=True, start_step=2).close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_disabled_writer_writes_nothing(tmp_path):
    writer = metric_writer.MetricWriter(str(tmp_path), enabled=False)
    writer.write(1, {"train/loss": 1.0})
    writer.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_writing_imports_no_tensorflow(tmp_path):
    """Not on import, nor when writing (tensorboard's own EventFileWriter would import it)."""
    code = (
        "import sys; from contrastive_jax.training import loop, metric_writer; "
        f"w = metric_writer.MetricWriter({str(tmp_path)!r}, enabled=True); w.write(1, {{'x': 1.0}}); w.close(); "
        "assert 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
