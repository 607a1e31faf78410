"""The sweep drivers' --quick mode runs end to end and writes its files; reruns skip
finished runs, resume interrupted ones, and refuse a workdir holding another run."""

import json

import numpy as np
import pytest

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from experiments.lib import sweep
from experiments.studies import (
    batch_size_sweep,
    batch_size_sweep_grid,
    batch_size_sweep_report,
    loss_comparison,
    temperature_sweep,
)

COMMON = ["results.csv", "results.json", "summary.md"]


def run_quick(driver, out, data_dir, *extra):
    driver.main(["--quick", "--out", str(out), "--data-dir", data_dir, *extra])
    return json.loads((out / "results.json").read_text())


@pytest.mark.e2e
def test_batch_size_sweep_quick_then_skips_resumes_and_refuses(tmp_path, digits_data_dir, capsys):
    records = run_quick(batch_size_sweep, tmp_path, digits_data_dir)
    expected = COMMON + ["metric_vs_batch.png", "loss_curves.png", "temperature_vs_batch.png", "mi_bound.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in expected)
    assert [(r["batch_size"], r["seed"]) for r in records] == [(16, 0), (64, 0)]
    assert all(0 <= r["a_to_b/R@1"] <= 1 and r["curves"]["train/loss"] for r in records)
    assert (tmp_path / "results.csv").read_text().splitlines()[0].startswith("name,batch_size,seed,steps")
    capsys.readouterr()

    # A rerun trains nothing.
    runs = tmp_path / "runs"
    stamps = {p: p.stat().st_mtime_ns for p in runs.glob("*/eval_results.json")}
    assert run_quick(batch_size_sweep, tmp_path, digits_data_dir) == records
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2
    assert stamps == {p: p.stat().st_mtime_ns for p in runs.glob("*/eval_results.json")}

    # A run interrupted after its last checkpoint resumes from it instead of retraining.
    interrupted = runs / "batch00064_seed0"
    (interrupted / "eval_results.json").unlink()
    lines = (interrupted / "metrics.jsonl").read_text().count("train/loss")
    resumed = run_quick(batch_size_sweep, tmp_path, digits_data_dir)
    assert "resuming from its checkpoint" in capsys.readouterr().out
    assert (interrupted / "metrics.jsonl").read_text().count("train/loss") == lines
    assert resumed[1]["a_to_b/R@1"] == pytest.approx(records[1]["a_to_b/R@1"])

    # The same folder with another run length is refused.
    with pytest.raises(ValueError, match="holds a different run"):
        run_quick(batch_size_sweep, tmp_path, digits_data_dir, "--steps", "3")


def test_the_deadline_leaves_no_workdir_and_an_untrained_one_hides_no_committed_record(tmp_path, load_config):
    runs = [sweep.Run(f"s{seed}", {"seed": seed}, {"seed": seed}) for seed in (0, 1)]
    committed = {"name": "s0", "seed": 0, "a_to_b/R@1": 0.5, "curves": {}}
    (tmp_path / "results.json").write_text(json.dumps([committed]))
    spec_only = tmp_path / "runs" / "s0"  # the run's spec, nothing trained
    spec_only.mkdir(parents=True)
    (spec_only / "config.json").write_text("{}")
    lines = []
    records = sweep.run_grid(load_config("default"), runs, tmp_path, log=lines.append, deadline=0.0)
    assert records == [committed] and "read from" in lines[0] and "not started" in lines[1]
    assert not (tmp_path / "runs" / "s1").exists()
    (spec_only / run_dir.METRICS).write_text("")  # a step logged: the workdir resumes instead
    assert sweep.run_grid(load_config("default"), runs, tmp_path, log=lines.append, deadline=0.0) == []


@pytest.mark.slow
def test_temperature_sweep_quick(tmp_path, digits_data_dir):
    records = run_quick(temperature_sweep, tmp_path, digits_data_dir)
    expected = COMMON + ["metric_vs_temperature.png", "loss_curves.png", "loss_vs_floor.png", "learned_temperature.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in expected)
    assert {(r["temperature"], r["learned"]) for r in records} == {(1.0, False), (0.07, True)}
    fixed = next(r for r in records if not r["learned"])
    assert fixed["train/temperature"] == pytest.approx(1.0)


@pytest.mark.slow
def test_loss_comparison_quick(tmp_path, digits_data_dir):
    records = run_quick(loss_comparison, tmp_path, digits_data_dir)
    assert all((tmp_path / name).stat().st_size > 0 for name in COMMON + ["metrics_by_loss.png", "map_at_r_curves.png"])
    assert [r["loss"] for r in records] == list(loss_comparison.LOSSES)
    assert all(0 <= r["retrieval/MAP@R"] <= 1 and r["curves"]["eval/retrieval/MAP@R"] for r in records)


def test_read_metrics_keeps_the_resumed_lines(tmp_path):
    lines = [
        {"step": 2, "train/loss": 3.0},
        {"step": 4, "train/loss": 2.0},
        {"step": 4, "eval/x": 1.0},
        {"step": 4, "train/loss": 1.5},
    ]  # resumed from step 2: step 4 logged again
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert run_dir.metrics_by_step(tmp_path) == {2: {"train/loss": 3.0}, 4: {"train/loss": 1.5, "eval/x": 1.0}}


def test_summarize_groups_seeds():
    records = [{"n": 16, "m": 1.0}, {"n": 16, "m": 3.0}, {"n": 8, "m": 5.0}]
    x, mean, std = sweep.summarize(records, "n", "m")
    assert x.tolist() == [8, 16] and mean.tolist() == [5.0, 2.0]
    assert std.tolist() == pytest.approx([0.0, 2**0.5])


def test_override_sets_dotted_fields_on_a_locked_copy(load_config):
    base = load_config("default")
    config = override(base, {"loss.temperature": 0.5, "train.global_batch_size": 32})
    assert (config.loss.temperature, config.train.global_batch_size) == (0.5, 32)
    assert base.loss.temperature == 0.07 and config.is_locked
    with pytest.raises(KeyError, match='Did you mean "global_batch_size"'):
        override(base, {"train.global_batch_sise": 32})


def test_fixed_epochs_gives_each_batch_size_its_steps(load_config):
    runs = batch_size_sweep_grid.make_runs(load_config("default"), [16, 64], [0, 1], epochs=2, train_size=1437)
    assert [r.tags["steps"] for r in runs] == [180, 180, 45, 45]
    assert [r.overrides["optim.warmup_steps"] for r in runs[::2]] == [36, 9]  # at most a fifth
    assert len({r.name for r in runs}) == 4


def test_cmudict_study_grid_scales_the_learning_rate_and_warmup_in_epochs(load_config):
    base = load_config("cmudict_clip")
    runs = batch_size_sweep_grid.study_runs(base, [256, 16384, 65536], [0, 1], epochs=3, steps=40, train_size=121_490)
    # N <= 16,384: 3 rules at fixed epochs + sqrt at fixed steps; N = 65,536: fixed-epoch sqrt.
    assert len(runs) == 2 * (4 + 4 + 1) and len({r.name for r in runs}) == 18
    tags = {(r.tags["budget"], r.tags["scaling"], r.tags["batch_size"], r.tags["seed"]): r for r in runs}
    assert {k[:3] for k in tags if k[2] == 65536} == {("epochs", "sqrt", 65536)}
    base_lr = batch_size_sweep_grid.BASE_LEARNING_RATE
    for rule, factor in (("none", 1.0), ("linear", 64.0), ("sqrt", 8.0)):
        run = tags["epochs", rule, 16384, 1]
        assert run.overrides["optim.learning_rate"] == pytest.approx(base_lr * factor)
        assert run.overrides["seed"] == run.overrides["data.seed"] == 1
        assert tags["epochs", rule, 256, 0].overrides["optim.learning_rate"] == pytest.approx(base_lr)
    assert tags["epochs", "sqrt", 65536, 0].overrides["optim.learning_rate"] == pytest.approx(base_lr * 16)
    # Fixed epochs: ceil(3 * 121490 / N) steps; a quarter-epoch warmup (at most a fifth of the run).
    assert tags["epochs", "sqrt", 256, 0].tags["steps"] == 1424
    assert tags["epochs", "sqrt", 256, 0].overrides["optim.warmup_steps"] == 119
    assert tags["epochs", "sqrt", 65536, 0].tags["steps"] == 6
    assert tags["epochs", "sqrt", 65536, 0].overrides["optim.warmup_steps"] == 1  # 0.46 steps: at least 1
    assert tags["steps", "sqrt", 16384, 0].tags["steps"] == tags["steps", "sqrt", 256, 0].tags["steps"] == 40
    # Linear scaling at large N uses LAMB; the loss is streamed above N = 4,096, and no N needs
    # gradient caching (a whole step at 65,536 fits).
    assert tags["epochs", "linear", 16384, 0].overrides["optim.name"] == "lamb"
    assert tags["epochs", "linear", 256, 0].overrides["optim.name"] == "adamw"
    assert tags["epochs", "sqrt", 65536, 0].overrides["loss.chunk_size"] == "auto"
    assert "loss.chunk_size" not in tags["epochs", "none", 256, 0].overrides
    assert not any("train.micro_batch_size" in run.overrides for run in runs)
    # The false-negative-masking series: its loss, only up to N = 16,384.
    masked = batch_size_sweep_grid.study_runs(
        base, [256, 65536], [0], epochs=3, steps=40, train_size=121_490, masked_loss="clip_masked"
    )
    extra = [r for r in masked if r.tags["loss"] == "clip_masked"]
    assert [(r.tags["batch_size"], r.tags["series"]) for r in extra] == [
        (256, "fixed epochs, sqrt, false negatives masked")
    ]
    assert extra[0].overrides["loss.name"] == "clip_masked" and len(masked) == 4 + 1 + 1


def test_false_negative_fraction():
    # Rows 0-1 share a spelling, rows 2-3 a pronunciation, row 4 shares nothing.
    groups = {"word_id": np.array([0, 0, 1, 2, 3]), "pronunciation_id": np.array([0, 1, 2, 2, 3])}
    assert batch_size_sweep.false_negative_fraction(groups, 5, num_batches=2) == pytest.approx(0.8)
    # A batch of 2 of the 5 rows: the pair is a false negative for 2 of the 10 possible pairs.
    rng_fraction = batch_size_sweep.false_negative_fraction(groups, 2, num_batches=4000)
    assert rng_fraction == pytest.approx(2 / 10, abs=0.02)
    assert batch_size_sweep.false_negative_fraction({"id": np.arange(100)}, 50) == 0.0


@pytest.mark.slow  # 10 runs: about 2 minutes on an idle 2-core machine
def test_cmudict_study_quick(tmp_path, cmudict_data_dir):
    batch_size_sweep.main(["--study", "cmudict", "--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir])
    records = json.loads((tmp_path / "results.json").read_text())
    expected = COMMON + [
        "metric_vs_batch.png",
        "loss_curves.png",
        "temperature_vs_batch.png",
        "mi_bound.png",
        "false_negatives_vs_batch.png",
    ]
    assert all((tmp_path / name).stat().st_size > 0 for name in expected)
    # 2 batch sizes x (3 rules at fixed epochs + sqrt at fixed steps + sqrt masking false negatives)
    assert len(records) == 2 * 5
    masked = [r for r in records if r["loss"] == batch_size_sweep.MASKED_LOSS]
    assert {r["series"] for r in masked} == {"fixed epochs, sqrt, false negatives masked"}
    assert all(0 <= r["a_to_b/R@1"] <= 1 and 0 <= r["b_to_a/R@1"] <= 1 for r in records)
    fractions = {r["batch_size"]: r["false_negative_fraction"] for r in records}
    assert 0 <= fractions[256] <= fractions[512] < 1  # (2,048 quick pairs: few repeats)
    assert "fixed epochs, sqrt" in (tmp_path / "summary.md").read_text()


def test_study_figures_when_the_first_series_skips_the_largest_batch():
    """At N = 65,536 only one series runs; the loss-curve figure plots the first series'
    own batch sizes."""

    def record(series, n, seed):
        return {
            "series": series,
            "batch_size": n,
            "seed": seed,
            "steps": 4,
            "a_to_b/R@1": 0.5,
            "train/loss": 1.0 + seed,
            "train/temperature": 0.05,
            "curves": {"train/loss": [[1, 2.0], [4, 1.0 + seed]]},
        }

    records = [record("fixed epochs, none", n, s) for n in (256, 512) for s in (0, 1)]
    records += [record("fixed epochs, sqrt", n, s) for n in (256, 512, 65536) for s in (0, 1)]
    figures = batch_size_sweep_report.plot(records, "a_to_b/R@1")
    assert {"metric_vs_batch", "loss_curves", "temperature_vs_batch", "mi_bound"} <= set(figures)
    assert len(figures["loss_curves"].axes[0].get_lines()) == 2 * 2  # 2 sizes: curve + log N line
