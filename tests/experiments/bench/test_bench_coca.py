"""`experiments/bench/bench_coca.py` at toy sizes (`--tiny`): both configs' steps compiled
and timed on the session's shapes records, CoCa's larger than CLIP's (its decoder, its
pooling), and the report."""

import json

import pytest

from experiments.bench import bench_coca


@pytest.mark.slow
@pytest.mark.usefixtures("two_block_vit_tiny")  # the ratios' signs hold at 2 blocks
def test_the_tiny_run_measures_coca_against_clip(tmp_path, shapes_data_dir):
    argv = ["--tiny", "--batch", "4", "--repeats", "1", "--out", str(tmp_path), "--data-dir", shapes_data_dir]
    assert bench_coca.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    clip, coca = results["configs"]["clip_shapes"], results["configs"]["coca_shapes"]
    assert coca["parameters"] > clip["parameters"] and coca["bytes"] > clip["bytes"]
    assert coca["loss"] > clip["loss"]  # the caption term, 2 x ~log 257, on top
    assert "| `coca_shapes` |" in (tmp_path / "results.md").read_text()
