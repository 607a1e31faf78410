"""`experiments/bench/bench_patch_dropout.py` at toy sizes on the CPU (`--tiny`): every rate
timed and compiled, the memory and the largest batch following the kept patches, and the
report's ratios."""

import json

import pytest

from experiments.bench import bench_patch_dropout


@pytest.mark.slow
def test_the_tiny_run_measures_every_rate_against_rate_0(tmp_path):
    assert bench_patch_dropout.main(["--tiny", "--repeats", "1", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    rates = results["rates"]
    assert list(rates) == ["0.0", "0.5", "0.75"]
    assert [rates[r]["patches_kept"] for r in rates] == [16, 8, 4]
    assert rates["0.0"]["bytes_ratio"] == 1.0 and all(v["step_seconds"] > 0 for v in rates.values())
    # The compiled step holds the kept tokens: less memory, a larger batch within the budget.
    assert rates["0.75"]["bytes"] < rates["0.5"]["bytes"] < rates["0.0"]["bytes"]
    assert rates["0.75"]["largest_batch"] > rates["0.5"]["largest_batch"] > rates["0.0"]["largest_batch"]
    report = (tmp_path / "results.md").read_text()
    assert "| 0.5 | 8 |" in report and "Goals at 0.5" in report


def test_the_ratios_are_to_rate_0():
    results = {"rates": {"0.0": {"step_seconds": 2.0, "bytes": 10}, "0.5": {"step_seconds": 1.0, "bytes": 4}}}
    rates = bench_patch_dropout.with_ratios(results)["rates"]
    assert rates["0.5"]["step_seconds_ratio"] == 0.5 and rates["0.5"]["bytes_ratio"] == 0.4
    assert "largest_batch_ratio" not in rates["0.5"]
