"""experiments/studies/epoch_budget_study.py: the grid's arithmetic, the time axis, and --quick
end to end (every method once, resumable: a rerun skips the finished runs)."""

import json

import numpy as np
import pytest

from contrastive_jax.training import noise_scale
from experiments.lib import intervals
from experiments.studies import epoch_budget_study as study


def test_grid_gives_every_batch_the_same_epochs_and_the_largest_300_steps():
    grid = study.methods(study.BATCH_SIZES, study.SMALL_BATCH, study.SEEDS, study.QUEUE_SIZE)
    runs = study.study_runs(grid, epochs=study.EPOCHS, train_size=study.TRAIN_PAIRS)
    # CLIP and SigLIP at 3 N x 3 seeds; DCL, SogCLR x 3 seeds; queue; queue with EMA x 3
    # seeds at 256 and 1,024; the controls: SigLIP at 4,096 from T 0.04 and for twice the
    # epochs, 3 seeds each; EMA without queue x 3 seeds, the queue with detached keys
    assert len(runs) == 2 * 3 * 3 + 2 * 3 + 1 + 6 + 6 + 3 + 1
    assert [r.tags["seed"] for r in runs] == sorted(r.tags["seed"] for r in runs)
    assert len({r.name for r in runs}) == len(runs)
    for run in runs:
        n, steps = run.tags["batch_size"], run.overrides["train.num_train_steps"]
        epochs = study.EPOCHS * (2 if run.tags["method"] == "SigLIP, 2x epochs" else 1)
        assert steps == -(-epochs * study.TRAIN_PAIRS // n)
        assert run.overrides["optim.learning_rate"] == pytest.approx(1e-3 * np.sqrt(n / 256))
        assert run.overrides["optim.warmup_steps"] == min(round(0.5 * study.TRAIN_PAIRS / n), steps // 5)
        assert run.overrides["eval.every_steps"] == 8 * run.overrides["train.log_every_steps"]
        evals = len(range(run.overrides["eval.every_steps"], steps, run.overrides["eval.every_steps"])) + 1
        assert evals == study.EVALS  # the last at the end
    assert min(r.overrides["train.num_train_steps"] for r in runs) >= 300
    assert all(r.overrides["train.log_noise_scale"] for r in runs if r.tags["method"] == "CLIP")
    queues = [r for r in runs if r.overrides["loss.name"] == "moco_queue"]
    forms = sorted(
        (
            r.overrides["loss.queue_size"],
            r.overrides["loss.queue_momentum"],
            r.overrides.get("loss.queue_stop_gradient", False),
        )
        for r in queues
    )
    assert (
        forms == [(0, 0.99, False)] * 3 + [(16_384, 0.0, False)] + [(16_384, 0.0, True)] + [(16_384, 0.99, False)] * 6
    )
    assert {r.tags["batch_size"] for r in runs if r.tags["method"] in ("DCL", "SogCLR")} == {256}
    assert sorted(r.tags["batch_size"] for r in queues) == [256] * 8 + [1024] * 3
    siglip = sorted(
        (r.tags["method"], r.tags["batch_size"], r.overrides["loss.temperature"])
        for r in runs
        if r.overrides["loss.name"] == "siglip"
    )
    assert (
        siglip
        == [("SigLIP", n, 0.1) for n in (256,) * 3 + (1024,) * 3 + (4096,) * 3]
        + [("SigLIP, 2x epochs", 4096, 0.1)] * 3
        + [("SigLIP, T0 0.04", 4096, 0.04)] * 3
    )


def test_training_seconds_add_up_the_logging_windows():
    record = {"batch_size": 100, "curves": {"train/examples_per_second": [[10, 1000.0], [20, 500.0], [25, 250.0]]}}
    assert study.training_seconds(record) == {10: 1.0, 20: 3.0, 25: 5.0}


def test_noise_by_epoch_pools_each_epochs_windows_and_recovers_the_model():
    """Windows logged at steps 5, 10 (epoch 1) and 15 (epoch 2) of N = 64 on 8 devices,
    norms from E|G_B|^2 = |G|^2 + tr / B: each epoch's pooled estimate recovers |G|^2 and
    tr; a pure-noise epoch (|G|^2 = 0 up to rounding, here < 0) is not resolved."""
    n, b = 64, 8
    norm = lambda g2, trace, batch: g2 + trace / batch  # noqa: E731
    small = [[5, norm(2.0, 80.0, b)], [10, norm(4.0, 40.0, b)], [15, norm(-0.5, 30.0, b)]]
    big = [[5, norm(2.0, 80.0, n)], [10, norm(4.0, 40.0, n)], [15, norm(-0.5, 30.0, n)]]
    record = {"batch_size": n, "curves": {"train/noise_small_sq_norm": small, "train/noise_big_sq_norm": big}}
    rows = study.noise_by_epoch(record, train_size=640, num_devices=8)  # 10 steps per epoch
    assert [r[0] for r in rows] == [1, 2]
    np.testing.assert_allclose(rows[0][3:], [3.0, 60.0, 20.0])
    assert rows[1][3] == pytest.approx(-0.5) and np.isnan(rows[1][5])
    pooled = study.pooled_noise([dict(record, noise_by_epoch=rows, noise_small_batch=b)] * 2)
    np.testing.assert_allclose(pooled[0], rows[0])


def test_summary_gives_intervals_the_ceilings_distance_and_each_pairs_difference():
    def record(method, n, seed, a, b):  # seed s trains for 1 + s minutes (sessions differ in pace)
        evals = [[10, 1.0, 60.0 * (1 + seed), a, b]]
        return {
            "method": method,
            "batch_size": n,
            "seed": seed,
            "steps": 10,
            "epochs": 11.0,
            "a_to_b/R@1": a,
            "b_to_a/R@1": b,
            "train/loss": 1.0,
            "train/temperature": 0.03,
            "training_minutes": 1.0 + seed,
            "evals": evals,
        }

    clip_256 = [(0.890, 0.930), (0.892, 0.931), (0.891, 0.933)]
    clip_1024 = [(0.897, 0.940), (0.900, 0.942), (0.898, 0.939)]
    records = [record("CLIP", 256, s, *v) for s, v in reversed(list(enumerate(clip_256)))]
    records += [record("CLIP", 1024, s, *v) for s, v in enumerate(clip_1024)]
    records += [record("DCL", 256, 0, 0.899, 0.936), record("DCL", 256, 1, 0.901, 0.935)]
    records += [record("queue", 256, 0, 0.0, 0.0)]
    groups = study._groups(records)
    assert study.comparisons(groups) == [
        (("CLIP", 1024), ("CLIP", 256)),
        (("DCL", 256), ("CLIP", 256)),
        (("queue", 256), ("CLIP", 256)),
        (("queue", 256), ("DCL", 256)),
    ]
    text = study.summary(records, {"a_to_b": 0.932, "b_to_a": 0.982})
    # CLIP 256: a_to_b mean 0.891, 95% t half-width 4.3027 * 0.001 / sqrt(3) = 0.0025
    assert "| CLIP | 256 | 10 | 3 | 0.891 ± 0.002 | 0.041 | 0.931 ± 0.004 | 0.051 |" in text
    assert "| queue | 256 | 10 | 1 | 0.000 | 0.932 | 0.000 | 0.982 |" in text
    # time: the first seed's, wherever it stands among the records; R@1: the seeds' mean
    clip_row = next(line for line in text.splitlines() if line.startswith("| CLIP | 256 | 10 |"))
    assert clip_row.endswith("| 0.030 ± 0.000 | 1.00 |") and "| CLIP | 256 | 1.0: 0.891 (1.0 min) |" in text
    for (x, y), row in zip(study.comparisons(groups), text.split("## Differences")[1].splitlines()[4:], strict=False):
        want = [intervals.welch_interval([r[m] for r in groups[x]], [r[m] for r in groups[y]]) for m in study.METRICS]
        assert row.startswith(f"| {x[0]}, N={x[1]:,} | {y[0]}, N={y[1]:,} | {len(groups[x])} vs {len(groups[y])} |")
        assert f"{want[0][0]:+.4f}" in row and f"{want[1][0]:+.4f}" in row
        if len(groups[x]) > 1:
            assert f"[{want[0][1]:+.4f}, {want[0][2]:+.4f}]" in row
    # CLIP 1,024 - 256, a_to_b: se 1.054e-3, Welch dof 3.45, t 2.96: half-width 0.0031
    assert "+0.0073 [+0.0042, +0.0105]" in text
    assert "-0.8910 [n/a]" in text  # one seed: no interval
    assert "paired bootstrap" not in text  # no per-query hits: no such section
    assert "gain over CLIP shrink" not in text  # no method beside CLIP at two N
    records += [record("DCL", 1024, s, 0.899 + 0.001 * s, 0.942) for s in range(3)]
    records += [record("DCL", 256, 2, 0.900, 0.936)]
    text = study.summary(records, {"a_to_b": 0.932, "b_to_a": 0.982})
    # DCL's gain at 256 (0.900 - 0.891) less at 1,024 (0.900 - 0.89833): +0.0073, its Welch interval over 4 groups
    groups = study._groups(records)
    keys = [("DCL", 256), ("CLIP", 256), ("DCL", 1024), ("CLIP", 1024)]
    want = intervals.welch_contrast([[r["a_to_b/R@1"] for r in groups[k]] for k in keys], [1, -1, -1, 1])
    assert want[0] == pytest.approx(0.0073, abs=1e-4) and want[1] > 0
    assert f"| DCL | 256 → 1,024 | 3 / 3 / 3 / 3 | {intervals.difference_cell(*want)}, resolved |" in text


def test_summary_bootstraps_the_queries_over_the_seeds_both_sides_have_hits_for():
    rng = np.random.default_rng(0)
    base = rng.random(2000) < 0.85
    runs = {  # (method, N, seed): queries right beyond `base`'s; DCL seed 1 has no hits
        ("CLIP", 256, 0): 0, ("CLIP", 256, 1): 10, ("CLIP", 256, 2): 20,
        ("DCL", 256, 1): 30, ("DCL", 256, 2): 40, ("queue", 256, 0): -1,
    }  # fmt: skip
    records, hits = [], {}
    for (method, n, seed), extra in runs.items():
        name = f"{method}_{n}_{seed}"
        right = base.copy() if extra >= 0 else np.zeros_like(base)
        right[np.flatnonzero(~base)[: max(extra, 0)]] = True
        records.append(
            {"name": name, "method": method, "batch_size": n, "seed": seed, "steps": 10, "epochs": 11.0,
             "a_to_b/R@1": right.mean(), "b_to_a/R@1": right.mean(), "train/loss": 1.0, "train/temperature": 0.03,
             "training_minutes": 1.0, "evals": [[10, 11.0, 60.0, right.mean(), right.mean()]]}
        )  # fmt: skip
        if (method, seed) != ("DCL", 1):
            hits[name] = {"a_to_b": right, "b_to_a": ~right}
    text = study.summary(records, {"a_to_b": 0.932, "b_to_a": 0.982}, hits)
    section = text.split("paired bootstrap over the 2,000 test queries")[1].split("\n## ")[0]
    # DCL against CLIP: seed 2 only (seed 1's DCL hits missing): 40 - 20 queries
    want = [study.query_hits.seed_mean_difference(hits, ["DCL_256_2"], ["CLIP_256_2"], d) for d in ("a_to_b", "b_to_a")]
    assert want[0][0] == pytest.approx(20 / 2000) and want[1][0] == pytest.approx(-20 / 2000)
    assert 0 < want[0][1] < want[0][0] < want[0][2]
    cells = " | ".join(f"{d:+.4f} [{low:+.4f}, {high:+.4f}]" for d, low, high in want)
    assert f"| DCL, N=256 | CLIP, N=256 | 2 | {cells} |" in section
    # the queue against CLIP: seed 0 alone; the queue against DCL: no common seed, left out
    assert f"| queue, N=256 | CLIP, N=256 | 0 | {-base.mean():+.4f} [" in section
    assert "| queue, N=256 | DCL, N=256 |" not in section


def test_r1_vs_batch_figure_draws_every_method_of_a_grid_longer_than_its_markers():
    labels = [f"method {i}" for i in range(10)]
    records = [
        {
            "method": label,
            "batch_size": 256,
            "seed": 0,
            "epochs": 11.0,
            "a_to_b/R@1": 0.9,
            "b_to_a/R@1": 0.9,
            "evals": [[10, 11.0, 60.0, 0.9, 0.9]],
        }
        for label in labels
    ]
    figures = study.plot(records, [256])
    assert figures["r1_vs_batch"].axes[0].get_legend_handles_labels()[1] == labels


@pytest.mark.e2e
def test_quick_runs_every_method_and_resumes(tmp_path, cmudict_data_dir, capsys):
    args = ["--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    records = study.main(args)
    assert sorted(r["method"] for r in records) == sorted(
        [
            "CLIP",
            "SigLIP",
            "DCL",
            "SogCLR",
            "queue K=256",
            "queue K=256, EMA 0.99",
            "SigLIP, T0 0.04",
            "SigLIP, 2x epochs",
            "EMA 0.99, no queue",
            "queue K=256, detached keys",
        ]
    )
    assert {r["batch_size"] for r in records} == {64}
    for r in records:
        assert 0 <= r["a_to_b/R@1"] <= 1 and len(r["evals"]) == 2
        assert r["evals"][-1][0] == r["steps"] and r["training_minutes"] > 0
        assert ("noise_by_epoch" in r) == (r["method"] == "CLIP")
    assert all(np.isfinite(r["noise_by_epoch"][0][4]) for r in records if r["method"] == "CLIP")  # tr Sigma
    for r in (r for r in records if r["method"] == "CLIP"):  # the loop's B_simple: its window's norms
        curves = {k: dict(map(tuple, v)) for k, v in r["curves"].items()}
        for step, logged in curves["train/noise_scale"].items():
            small, big = curves["train/noise_small_sq_norm"][step], curves["train/noise_big_sq_norm"][step]
            want = noise_scale.estimate(small, big, r["batch_size"] // 8, r["batch_size"]).b_simple
            assert logged == pytest.approx(want, rel=1e-6)
    for name in (
        "results.json",
        "results.csv",
        "summary.md",
        "r1_vs_batch.png",
        "r1_vs_epochs.png",
        "r1_vs_training_time.png",
        "noise_scale.png",
    ):
        assert (tmp_path / name).stat().st_size > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "B_simple" in summary and "paired bootstrap over the 512 test queries" in summary
    assert sorted(json.loads((tmp_path / "final.json").read_text())) == sorted(r["name"] for r in records)
    final = study.query_hits.cached_hits([], tmp_path, "test[:512]")  # every run's hits, read back
    for r in records:  # the hits of the last checkpoint: the run's own final evaluation
        assert final[r["name"]]["queries"] == 512
        assert np.mean(final[r["name"]]["a_to_b"]) == pytest.approx(r["a_to_b/R@1"], abs=1e-6)
        assert np.mean(final[r["name"]]["b_to_a"]) == pytest.approx(r["b_to_a/R@1"], abs=1e-6)
    capsys.readouterr()
    assert json.loads(json.dumps(study.main(args))) == json.loads(json.dumps(records))
    out = capsys.readouterr().out
    assert out.count("finished earlier, skipped") == len(records) and "[hits]" not in out
    assert (tmp_path / "summary.md").read_text() == summary
