"""experiments/bench_losses*.py: its workers time the losses and its targets read them."""

import importlib.util
import json
import math

import pytest

from experiments.bench import bench_losses, bench_losses_grid, bench_losses_report, bench_losses_worker

SPEC = {
    "n": 64,
    "d": 8,
    "max_memory_bytes": 2**30,
    "max_repeats": 1,
    "budget_s": 0.1,
    "queue": 1024,
}  # moco_queue's K (the others ignore it)


@pytest.mark.parametrize("loss", bench_losses_grid.LOSSES)
@pytest.mark.parametrize("chunk", [None, 16, "auto"])
def test_jax_worker_times_a_loss_and_reports_its_memory(loss, chunk):
    result = bench_losses_worker.run_worker(SPEC | {"worker": "jax", "loss": loss, "chunk": chunk})
    assert result["seconds"] > 0 and result["temp_bytes"] > 0
    assert math.isfinite(result["value"]) and result["value"] != 0  # SogCLR's may be < 0
    assert result["peak_rss_bytes"] > 2**20


def test_jax_worker_skips_what_does_not_fit():
    result = bench_losses_worker.run_worker(
        SPEC | {"worker": "jax", "loss": "clip", "chunk": None, "max_memory_bytes": 1}
    )
    assert "seconds" not in result and result["skipped"].startswith("needs")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="pip install -e '.[bench]'")
@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_torch_reference_computes_the_same_loss(loss):
    ours = bench_losses_worker.run_worker(SPEC | {"worker": "jax", "loss": loss, "chunk": 16})
    torch = bench_losses_worker.run_worker(SPEC | {"worker": "torch", "loss": loss})
    assert torch["value"] == pytest.approx(ours["value"], rel=1e-5)


def test_targets_read_the_points():
    def point(loss, n, d, chunk, seconds, worker="jax"):
        return {
            "worker": worker,
            "loss": loss,
            "n": n,
            "d": d,
            "chunk": chunk,
            "seconds": seconds,
            "gflops": 6.0 * n * n * d / seconds / 1e9,
        }

    points = [
        point("clip", 16384, 512, None, 10.0),
        point("clip", 16384, 512, 1024, 8.0),
        point("clip", 16384, 512, 256, 9.0),
        point("clip", 16384, 512, None, 40.0, "torch"),
    ]
    peak = points[1]["gflops"] / 0.8  # the streamed point runs at 80% of peak
    rows = {t: (m, v) for t, m, v in bench_losses_report.evaluate_targets(points, peak, {})}
    assert rows["streamed clip N=16,384 D=512: useful 6N^2D / jnp.dot peak >= 70%"] == (
        "80% (chunk 1024, 8.00 s)",
        "met",
    )
    assert rows["clip N=16,384 D=512: streamed / dense time <= 1.0"][1] == "met"
    assert rows["torch clip dense / ours streamed, N=16,384 D=512 >= 3"] == (
        "5.00 (40.00 s vs 8.00 s chunk 1024)",
        "met",
    )


@pytest.mark.slow
def test_quick_sweep_writes_its_results(tmp_path):
    bench_losses.main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    assert {p["loss"] for p in result["points"]} == set(bench_losses_grid.LOSSES)
    assert all("seconds" in p for p in result["points"] if p["worker"] == "jax")
    assert (tmp_path / "results.md").read_text().count("| clip |") >= 4
    assert (tmp_path / "results.png").stat().st_size > 0
