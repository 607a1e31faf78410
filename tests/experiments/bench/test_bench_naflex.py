"""`experiments/bench/bench_naflex.py` at toy sizes on the CPU (`--tiny`): every tower
compiled and timed, NaFlex's memory against the fixed tower of the same tokens, the
report's rows."""

import json

import pytest

from experiments.bench import bench_naflex


@pytest.mark.slow  # 20 s: five towers compiled
def test_the_tiny_run_measures_every_tower(tmp_path):
    assert bench_naflex.main(["--tiny", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    towers = results["towers"]
    assert list(towers) == [name for name, _, _ in bench_naflex.TOWERS]
    assert all(v["step_seconds"] > 0 and v["bytes"] > 0 for v in towers.values())
    # Memory grows with the tokens; NaFlex at a budget is within a few percent of the same tokens, fixed.
    assert towers["naflex_576"]["bytes"] > towers["naflex_256"]["bytes"] > towers["fixed_224px"]["bytes"]
    assert 0.9 < towers["naflex_256"]["bytes_vs_fixed"] < 1.5 and "bytes_vs_fixed" not in towers["fixed_256px"]
    assert len(results["load_before"]) == 3
    assert "| naflex_256 | 256 |" in (tmp_path / "results.md").read_text()
