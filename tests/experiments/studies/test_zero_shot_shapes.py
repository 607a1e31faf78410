"""experiments/studies/zero_shot_shapes.py --quick: a small CLIP on the generated set, judged by
the benchmark's zero-shot classification and all-caption retrieval."""

import json

import pytest

from experiments.studies import zero_shot_shapes as study


@pytest.mark.e2e
def test_quick_trains_and_reports_every_task(tmp_path, shapes_data_dir):
    results = study.main(["--quick", "--out", str(tmp_path), "--data-dir", shapes_data_dir])
    assert results == json.loads((tmp_path / "results.json").read_text())
    reports = results["reports"]
    assert len(reports) == 3
    for name, report in reports.items():
        assert report["dataset"] == "shapes:test", name
        assert all(0 <= value <= 1 for value in report["metrics"].values()), name
    kinds = reports["kinds, 5 templates"]["metrics"]
    assert kinds["acc5"] == 1.0  # 5 classes: every class is in the top 5
    retrieval = reports["retrieval, all captions"]["metrics"]
    assert retrieval["image_retrieval_recall@1"] <= retrieval["image_retrieval_recall@5"]
    assert "kinds, one template" in (tmp_path / "summary.md").read_text()
