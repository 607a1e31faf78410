"""experiments/studies/critical_batch_constant_lr.py: the constant-rate runs, when a run stops, the
sqrt(2) rate grid's bracketing, the seeds' rates, the per-N edge flag, and --quick end to
end (each run stops at its target or cap; a rerun trains nothing)."""

import argparse
import json
import math

import numpy as np
import pytest

from contrastive_jax import run_dir
from experiments.lib import constant_rate, intervals, noise_stage, rate_grid, replicates, sweep, target_steps
from experiments.studies import critical_batch_constant_lr as study

RUN_ARGS = {"train_size": 108_000, "max_epochs": 16.0, "eval_examples": 32_768}


def record(n, k, seed, values, every=10):
    """A run's record whose validation R@1 (both directions) is `values` every `every` steps."""
    curve = [[every * (i + 1), v] for i, v in enumerate(values)]
    curves = {"eval/a_to_b/R@1": curve, "eval/b_to_a/R@1": curve}
    return {"name": f"n{n}_k{k}_s{seed}", "batch_size": n, "rate_step": k, "lr_factor": 2 ** (k / 2), "seed": seed,
            "curves": curves, "max_steps": 10**6}  # fmt: skip


def test_runs_hold_a_constant_rate_after_fixed_warmup_steps_and_segment_by_evaluations():
    small, large = constant_rate.study_run(256, 2, 0, **RUN_ARGS), constant_rate.study_run(16384, 9, 1, **RUN_ARGS)
    assert small.name == "n256_k2_s0" and small.tags["learning_rate"] == pytest.approx(2e-3)
    assert large.tags["learning_rate"] == pytest.approx(1e-3 * 2**4.5)
    for run in (small, large):
        assert run.overrides["optim.schedule"] == "constant" and run.overrides["optim.warmup_steps"] == 20
    # validation every 32,768 examples (128 steps at 256; 2 at 16,384), a segment 4 of them
    assert [small.overrides[k] for k in ("eval.every_steps", "checkpoint.every_steps")] == [128, 512]
    assert [large.overrides[k] for k in ("eval.every_steps", "checkpoint.every_steps")] == [2, 8]
    assert small.tags["max_steps"] == 6750 and large.tags["max_steps"] == 106  # 16 epochs of 108,000
    assert [rate_grid.first_rate_step(n) for n in (256, 512, 4096, 16384)] == [2, 3, 6, 8]


def test_a_run_stops_at_its_target_or_after_patience_without_a_new_best():
    rising = np.array([[10, 0.5], [20, 0.7], [30, 0.88]])
    assert constant_rate.finished(rising, 0.88) and not constant_rate.finished(rising[:2], 0.88)
    flat = np.array([[1, 0.7], [2, 0.8], [3, 0.79], [4, 0.8], [5, 0.79]])  # best at eval 2, a tie is no new best
    assert constant_rate.finished(flat, 0.88, patience=3) and not constant_rate.finished(flat, 0.88, patience=4)
    assert not constant_rate.finished(np.zeros((0, 2)), 0.88)


def test_tuning_extends_the_grid_past_an_edge_best_and_stops_inside():
    slow, fast, targets = [0.5, 0.7, 0.8, 0.9], [0.7, 0.9], [0.8, 0.88]
    edge_high = [record(256, 1, 0, slow), record(256, 2, 0, slow), record(256, 3, 0, fast)]
    edge_low = [record(256, 1, 0, fast), record(256, 2, 0, slow), record(256, 3, 0, slow)]
    inside = [record(256, 1, 0, slow), record(256, 2, 0, fast), record(256, 3, 0, slow)]
    assert [constant_rate.next_rate_step(r, targets) for r in (edge_high, edge_low, inside)] == [4, 0, None]
    # none reach the highest target (a constant rate's plateau): the fewest steps to the
    # highest one reached (0.80: k = 3 first, though k = 2 ends higher), then the best R@1
    plateaus = [record(256, 1, 0, [0.5, 0.6]), record(256, 2, 0, [0.5, 0.8, 0.85]), record(256, 3, 0, [0.8, 0.7])]
    assert constant_rate.next_rate_step(plateaus, targets) == 4
    assert constant_rate.tuned_steps(plateaus, 0, targets) == {256: 3}
    misses = [record(256, 1, 0, [0.5, 0.6]), record(256, 2, 0, [0.5, 0.7]), record(256, 3, 0, [0.5, 0.65])]
    assert constant_rate.tuned_steps(misses, 0, targets) == {256: 2}


def test_other_seeds_run_the_tuned_rate_and_both_neighbours():
    runs = study.seed_runs({256: 2, 1024: 5}, [1, 2], **RUN_ARGS)
    assert [r.name for r in runs[:6]] == [
        f"n{n}_k{k}_s1" for n, ks in ((256, (1, 2, 3)), (1024, (4, 5, 6))) for k in ks
    ]
    assert len(runs) == 12


def test_best_is_flagged_at_the_edge_of_the_rates_every_seed_ran():
    fast, slow = [0.7, 0.9], [0.5, 0.7, 0.8, 0.9]
    records = [record(256, k, s, fast if k == 3 else slow) for s in (0, 1, 2) for k in (1, 2, 3)]
    records.append(record(256, 4, 0, slow))  # tuned on seed 0 only: not a candidate
    best = constant_rate.best_by_n(records, 0.88)[256]
    assert best["lr_factor"] == 2**1.5 and best["seeds"] == 3 and best["edge"]
    inside = [record(256, k, s, fast if k == 2 else slow) for s in (0, 1, 2) for k in (1, 2, 3)]
    best = constant_rate.best_by_n(inside, 0.88)[256]
    assert best["lr_factor"] == 2.0 and not best["edge"]


def test_every_seed_runs_the_rate_beyond_a_best_at_the_edge_of_the_rates_every_seed_ran():
    fast, slow, miss = [0.7, 0.9], [0.5, 0.7, 0.8, 0.9], [0.5]
    records = [record(256, k, s, fast if k == 3 else slow) for s in (0, 1, 2) for k in (1, 2, 3)]
    records.append(record(256, 4, 0, fast))  # seed 0's tuning only: not a rate every seed ran
    grown = study.edge_runs(records, [0, 1, 2], 0.88, 6, **RUN_ARGS)
    assert [r.name for r in grown] == ["n256_k4_s0", "n256_k4_s1", "n256_k4_s2"]
    assert study.edge_runs(records, [0, 1, 2], 0.88, 3, **RUN_ARGS) == []  # three rates: the cap
    low = [dict(r, curves=record(256, r["rate_step"], r["seed"], fast if r["rate_step"] == 1 else slow)["curves"])
           for r in records]  # fmt: skip
    assert {r.tags["rate_step"] for r in study.edge_runs(low, [0, 1, 2], 0.88, 6, **RUN_ARGS)} == {0}
    missed = records + [record(256, 4, s, miss if s == 1 else fast) for s in (1, 2)]  # k = 4 misses on seed 1
    assert constant_rate.best_by_n(missed, 0.88)[256]["rate_steps"] == [1, 2, 3, 4]
    assert study.edge_runs(missed, [0, 1, 2], 0.88, 6, **RUN_ARGS) == []  # k = 3 is inside what every seed ran


@pytest.mark.slow
def test_summary_quotes_each_targets_b_crit_interval_and_the_fit_range_table():
    rng = np.random.default_rng(0)
    records = []
    for n in (256, 512, 1024, 2048, 4096):
        steps = 40 * (1 + 2000 / n)
        for seed in (0, 1, 2):
            s = steps * np.exp(0.03 * rng.standard_normal())
            records.append(record(n, 2, seed, [0.0, 0.88], every=round(s / 2)))  # reaches 0.88 at `s`
    text = study.summary(records, [0.88], [256, 512, 1024])
    assert "| 256 | " in text and "(3) | " in text
    assert "S(N) = S_min (1 + B_crit / N) over N from 256 (5 N): B_crit = " in text
    line = next(line for line in text.splitlines() if line.startswith("S(N)"))
    assert (
        line.count("95% bootstrap") == 1
        and "95% bootstrap over seeds and misfit; resolved: inside N = 256 … 4,096" in line
    )
    assert " Lack of fit: χ² = " in line and "(the seeds alone give [" in line  # critical_batch_fit.lack_of_fit_words
    assert " Faster than 1/N, S_N − r S_rN " in line and "256 → 512 " in line  # critical_batch_fit.halving_words
    assert "## B_crit at R@1 0.88 by weighting and with each N left out" in text and "| N = 512 left out | 4 | " in text
    assert "## Data seen and censored runs per N (R@1 0.88; 108,000 training pairs)" in text
    assert "S_min = " in line and "]). The fitted curve passes " in line  # critical_batch_fit.misses_words
    assert " Without a curve" in line  # critical_batch_fit.saturation_words
    assert "| 512 | 4 | 3 | " in text and "| 1,024 | 3 | 3 | " in text
    assert "at the edge" not in text
    slower = [dict(r, name=r["name"].replace("k2", "k1"), rate_step=1, lr_factor=2**0.5) for r in records[3:6]]
    for r in slower:  # N = 512 at k = 1 reaches 0.88 one evaluation later: its best (k = 2) is the top
        r["curves"] = {key: [[step, 0.0] for step, _ in curve] + [[curve[-1][0] * 2, 0.88]]
                       for key, curve in r["curves"].items()}  # fmt: skip
    edge_line = "The best rate is at the edge of those every seed ran at N = 512: a rate beyond it may reach"
    assert edge_line in study.summary(records + slower, [0.88], [256, 512, 1024])


def test_the_fit_figure_draws_the_fitted_curve_and_its_knee_with_the_interval():
    rng = np.random.default_rng(0)
    records = [
        record(n, 2, seed, [0.0, 0.88], every=round(40 * (1 + 2000 / n) * np.exp(0.03 * rng.standard_normal()) / 2))
        for n in (256, 512, 1024, 2048)
        for seed in (0, 1, 2)
    ]
    (axis,) = study.fit_figure(records, [0.88], [256])["b_crit_fit"].axes
    fit = study.b_crit_entries(constant_rate.best_by_n(records, 0.88), [256])[0]
    curve = next(line for line in axis.get_lines() if len(line.get_xdata()) == 64)
    x, y = curve.get_xdata(), curve.get_ydata()
    assert (x[0], x[-1]) == (256, 2048) and y == pytest.approx(fit["s_min"] * (1 + fit["b_crit"] / x))
    knee = next(line for line in axis.get_lines() if line.get_marker() == "D")
    assert (knee.get_xdata()[0], knee.get_ydata()[0]) == pytest.approx((fit["b_crit"], 2 * fit["s_min"]))
    bar = next(c for c in axis.collections if c.get_segments() and len(c.get_segments()[0]) == 2
               and c.get_segments()[0][0][1] == c.get_segments()[0][1][1])  # fmt: skip
    assert sorted(p[0] for p in bar.get_segments()[0]) == pytest.approx([fit["low"], fit["high"]])


def test_train_until_refuses_a_schedule_that_depends_on_the_length(tmp_path, load_config):
    with pytest.raises(ValueError, match="stop_when needs config.optim.schedule='constant', not 'cosine'"):
        sweep.train_until(load_config("default"), tmp_path, lambda workdir: True)


def test_replicates_at_n_and_a_quarter_of_it_read_disjoint_examples(tiny_config):
    """The streams `replicate_starts` names: 4 batches of 64 and 4 of 16 share no example
    (`index`: the position in the split); started both at 0, as the cosine study did,
    the quarter batches are the first big one cut in four."""
    from contrastive_jax.config_lib import override
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training.run_plan import data_settings

    def indices(n, start, count=4):
        data = data_settings(override(tiny_config, {"train.global_batch_size": n}))
        stream = input_pipeline.train_dataset(data, start_step=start)
        return [set(np.asarray(batch["index"]).tolist()) for batch, _ in zip(stream, range(count), strict=False)]

    big_start, small_start = noise_stage.replicate_starts(4)
    big, small = indices(64, big_start), indices(16, small_start)
    assert all(len(b) == 64 for b in big) and all(len(q) == 16 for q in small)
    assert not set().union(*big) & set().union(*small)
    assert set().union(*indices(16, 0)) == big[0]


def test_noise_is_measured_at_evenly_spread_steps_and_tabled_with_intervals():
    assert noise_stage.measured_steps(64, 4) == [16, 32, 48, 64]
    assert noise_stage.measured_steps(2, 4) == [1, 2]
    both = {"b_simple": 1234.4, "b_simple_interval": [900.0, 2100.0], "variance_ratio": 3.9}
    both |= {"variance_ratio_interval": [3.1, 4.8], "bias_over_g": -0.05, "bias_over_g_interval": [-0.3, 0.2]}
    entry = {"batch_size": 1024, "seed": 1, "step": 96, "n": 1024, "sgd": both, "adam": dict(both, b_simple=56.0)}
    text = noise_stage.noise_table({"n1024_k4_s1@96": entry})
    assert "(n = 1,024 and 256, disjoint batches)" in text
    assert (
        "| 1,024 | 1 | 96 | 1,234 [900, 2,100] | 56 [900, 2,100] | 3.90 [3.10, 4.80] | -0.05 [-0.30, +0.20] |" in text
    )
    assert "over the 1 states: tr Cov(n/4) / tr Cov(n) is 3.90–3.90, its interval holding 4 in 1 of 1;" in text
    # a second state whose ratio's interval leaves out 4 and whose bias's leaves out 0 (mutation: either
    # count over every state whatever its interval, or the bias's against 4: red)
    off = dict(both, variance_ratio=1.5, variance_ratio_interval=[1.1, 1.9], bias_over_g=0.4)
    off |= {"bias_over_g_interval": [0.2, 0.6]}
    text = noise_stage.noise_table({"n1024_k4_s1@96": entry, "n1024_k4_s1@192": {**entry, "step": 192, "sgd": off}})
    assert "is 1.50–3.90, its interval holding 4 in 1 of 2; bias² / |E g|² is -0.05 to +0.40, its interval" in text
    assert "holding 0 in 1 of 2." in text


def test_the_last_noise_scale_of_each_run_is_set_against_b_crit_with_words():
    def form(value, low, high):
        return {"b_simple": value, "b_simple_interval": [low, high]}

    run = {"batch_size": 256, "seed": 0, "lr_factor": 2.0}
    noise = {
        "n256_k2_s0@512": {**run, "step": 512, "sgd": form(9e4, 8e4, 1e5), "adam": form(50, 40, 60)},
        "n256_k2_s0@1024": {**run, "step": 1024, "sgd": form(2500, 1900, 3100), "adam": form(300, 250, 400)},
    }
    fit = {"b_crit": 2400.0, "low": 2000.0, "high": 2900.0, "smallest": 256, "largest": 4096}
    text = noise_stage.noise_against_b_crit(noise, 0.86, fit)
    head = (
        "Against B_crit = 2,400 [2,000, 2,900] (95% bootstrap over seeds and misfit; resolved: inside N = 256 … 4,096)"
    )
    assert head + " at R@1 0.86" in text
    assert "| 256 | 0 | 1024 | 2,500 [1,900, 3,100], overlaps | 300 [250, 400], apart |" in text
    assert "| 512 |" not in text  # the last checkpoint only
    unresolved = noise_stage.noise_against_b_crit(noise, 0.86, dict(fit, seeds=2))
    assert "| 256 | 0 | 1024 | 2,500 [1,900, 3,100], not compared | 300 [250, 400], not compared |" in unresolved
    assert "Over the" not in text  # no run named as reaching the target
    # averaged within each N first, each run at its last step: N = 256's one run (2,500) and
    # N = 512's two (the geometric mean of 1,600 and 4,000: 2,530), then over the two N
    at_512 = {"batch_size": 512, "lr_factor": 4.0, "step": 64}
    noise |= {
        "n512_k4_s0@64": {**at_512, "seed": 0, "sgd": form(1600, 1, 2), "adam": form(20, 1, 2)},
        "n512_k4_s1@64": {**at_512, "seed": 1, "sgd": form(4000, 1, 2), "adam": form(-5, 1, 2)},
        "n1024_k4_s0@32": {**at_512, "batch_size": 1024, "seed": 0, "sgd": form(1, 1, 2), "adam": form(1, 1, 2)},
    }
    ramp = lambda last, end: np.array([[0.0, 0.0], [last / 2, end + 0.05], [last, end]])  # noqa: E731  (past its peak)
    reaching = {(256, 2.0, 0): ramp(1024, 0.871), (512, 4.0, 0): ramp(64, 0.9), (512, 4.0, 1): ramp(256, 0.86),
                (1024, 2.0, 0): ramp(32, 0.9)}  # 1,024 reached at another rate  # fmt: skip
    center, low, high = intervals.geometric_interval([2500, math.sqrt(1600 * 4000)])
    pooled = noise_stage.noise_against_b_crit(noise, 0.86, fit, reaching)
    assert pooled.endswith(
        "\nOver the 3 runs that reach R@1 0.86 (N = 256, 512), each at its last measured step, the run's end, where "
        "its validation R@1 is 0.455–0.900: averaged within each N first (the geometric mean of its runs), then over "
        f"the 2 N with its 95% t-interval over the N: B_simple {center:,.0f} [{low:,.0f}, {high:,.0f}], overlaps; "
        "B_adam not pooled (an estimate is not positive).\n"
    )  # N = 512, seed 1: step 64 is halfway up its ramp to 0.91 at step 128, 0.455


def test_the_reuse_table_gives_epochs_censored_runs_and_the_targets_under_every_peak():
    def capped(n, k, seed, values, every, cap):
        return record(n, k, seed, values, every) | {"max_steps": cap}

    records = [
        capped(256, 1, 0, [0.5, 0.873, 0.86], 100, 1000),  # a plateau under 0.88: stopped on patience
        capped(256, 1, 1, [0.5, 0.889], 100, 1000),  # reaches 0.88 at step 199.4
        capped(256, 2, 0, [0.5, 0.86, 0.87], 500, 1500),  # the cap: censored (its peak, 0.870, not among all seeds)
        capped(1024, 3, 0, [0.6, 0.9], 10, 1000),  # reaches 0.88 at step 19.3
        capped(1024, 3, 1, [0.6, 0.9], 20, 1000),  # at step 38.7
    ]
    text = constant_rate.reuse_table(records, [0.80, 0.86, 0.88], 2048)
    assert "| 256 | 12.5% | 1,000 | 3 | 1 | 1 | k=2 s0 | - | 0.873–0.889 |" in text  # k=2: seed 0 only
    epochs = (19.333 + 38.667) / 2 * 1024 / 2048
    assert f"| 1,024 | 50.0% | 1,000 | 2 | 2 | 0 | 0 | {epochs:.1f} | 0.900–0.900 |" in text
    assert "Targets below every N's lowest peak (0.873, runs at the rates every seed ran): 0.8, 0.86." in text


@pytest.mark.slow
def test_a_step_the_run_did_not_keep_is_replayed_to_the_runs_own_state(tiny_config, tmp_path):
    """Kept every 2 steps, the run's steps 1 and 3 are replayed (from its start, and from
    step 2 without training it again) to the state and gradient of the same run kept
    every step; a kept step is read where it is. A schedule tied to the run's length cannot be replayed."""
    import jax

    from contrastive_jax import run_dir
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    constant = override(tiny_config, {"optim.schedule": "constant", "train.num_train_steps": 4})
    kept = {every: str(tmp_path / f"every{every}") for every in (1, 2)}
    for every, workdir in kept.items():
        run_plan.train_and_evaluate(override(constant, {"checkpoint.every_steps": every}), workdir)
    assert replicates.kept_steps(kept[2]) == [2, 4]
    assert replicates.replayed(constant, kept[2], 4, str(tmp_path / "unused")) == kept[2]
    for step in (1, 3):
        scratch = replicates.replayed(constant, kept[2], step, str(tmp_path / f"replay{step}"))
        trained = [s for s, values in run_dir.metrics_by_step(scratch).items() if "train/loss" in values]
        assert trained == [step]  # from the checkpoint before (none: the start)
        (replayed_grad,), replayed_state = replicates.gradients(constant, scratch, 64, 1, step=step)
        (own_grad,), own_state = replicates.gradients(constant, kept[1], 64, 1, step=step)
        for replayed_leaf, own_leaf in zip(jax.tree.leaves((replayed_state.params, replayed_grad)),
                                           jax.tree.leaves((own_state.params, own_grad)), strict=True):  # fmt: skip
            np.testing.assert_array_equal(replayed_leaf, own_leaf)
    with pytest.raises(ValueError, match="replaying needs config.optim.schedule='constant', not 'cosine'"):
        replicates.replayed(override(constant, {"optim.schedule": "cosine"}), kept[2], 3, str(tmp_path / "cosine"))


def test_replicates_that_do_not_fit_an_epoch_are_one_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--quick", "--noise-batch", "512"])
    assert exit_info.value.code == 2
    assert "fit in one epoch of 1,024" in capsys.readouterr().err


def test_the_noise_stage_returns_its_runs_entries_and_keeps_the_rest_cached(tiny_config, tmp_path, capsys, monkeypatch):
    """A cached entry of a run no longer chosen (an edge run moved the best) stays in
    noise.json but is not the study's: only the entries of the runs asked for come back,
    measured now or before."""
    chosen, dropped = constant_rate.study_run(512, 3, 0, **RUN_ARGS), constant_rate.study_run(512, 2, 0, **RUN_ARGS)
    cache = {f"{chosen.name}@64": {"step": 64}, f"{dropped.name}@64": {"step": 64}}
    (tmp_path / "noise.json").write_text(json.dumps(cache))
    (tmp_path / "runs" / chosen.name / run_dir.CHECKPOINTS).mkdir(parents=True)
    monkeypatch.setattr(replicates, "kept_steps", lambda workdir: [64])  # measured already: nothing to train
    args = argparse.Namespace(noise_points=1, noise_batch=64, replicates=2)
    got = noise_stage.noise_scales(tiny_config, [chosen], tmp_path, args, deadline=None)
    assert got == {f"{chosen.name}@64": {"step": 64}}
    assert json.loads((tmp_path / "noise.json").read_text()) == cache
    # a run without its workdir (the committed results read elsewhere): its cached entries still count
    assert noise_stage.noise_scales(tiny_config, [dropped], tmp_path, args, deadline=None) == {
        f"{dropped.name}@64": {"step": 64}
    }
    assert f"[noise] {dropped.name}: no checkpoints in" in capsys.readouterr().out


def test_partial_results_keep_the_committed_runs_not_visited_yet(tmp_path):
    earlier = [record(256, 2, 0, [0.7, 0.9]), record(512, 3, 0, [0.8, 0.9])]
    sweep.write_results(earlier, tmp_path)
    study.write_partial([record(256, 2, 0, [0.75, 0.9]), record(256, 3, 0, [0.9])], tmp_path, [0.88], [256], 1024)
    written = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert sorted(written) == ["n256_k2_s0", "n256_k3_s0", "n512_k3_s0"]
    assert written["n256_k2_s0"]["curves"]["eval/a_to_b/R@1"][0][1] == 0.75  # the new record wins
    assert "| 512 | " in (tmp_path / "summary.md").read_text()


@pytest.mark.e2e
def test_quick_stops_each_run_at_its_target_or_cap_and_resumes(tmp_path, cmudict_data_dir, capsys):
    args = ["--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    records = study.main(args)
    for n in (64, 128):  # seed 1: the tuned rate, its neighbours and the steps beyond an edge, each also on seed 0
        ran = {seed: {r["rate_step"] for r in records if (r["batch_size"], r["seed"]) == (n, seed)} for seed in (0, 1)}
        assert len(ran[1]) >= 3 and ran[1] == set(range(min(ran[1]), max(ran[1]) + 1)) and ran[1] <= ran[0]
    run_args = {key: study.QUICK[key] for key in ("train_size", "max_epochs", "eval_examples")}
    assert study.edge_runs(records, [0, 1], 0.01, study.QUICK["max_tuning_rates"], **run_args) == []
    for r in records:
        curve = target_steps.validation_curve(r)
        every = {64: 4, 128: 2}[r["batch_size"]]  # 256 examples
        assert list(curve[:, 0]) == [every * (i + 1) for i in range(len(curve))]
        reached = np.flatnonzero(curve[:, 1] >= 0.01)
        if len(reached):  # it stopped after the segment (4 evaluations) that reached the target
            assert len(curve) == 4 * (reached[0] // 4 + 1)
        else:
            assert curve[-1, 0] == r["max_steps"]
    assert any(curve[-1, 0] < r["max_steps"] for r in records if len(curve := target_steps.validation_curve(r)))
    summary = (tmp_path / "summary.md").read_text()
    assert "## Steps to validation R@1 0.005" in summary and "B_crit = " in summary
    assert all((tmp_path / f"{name}.png").stat().st_size > 0 for name in ("steps_to_target", "b_crit_fit"))
    noise = json.loads((tmp_path / "noise.json").read_text())  # the last step of each N's run on 2 seeds
    assert sorted({(e["batch_size"], e["seed"]) for e in noise.values()}) == [(64, 0), (64, 1), (128, 0), (128, 1)]
    by_name = {r["name"]: r for r in records}
    for name in {key.split("@")[0] for key in noise}:
        last = int(target_steps.validation_curve(by_name[name])[-1, 0])
        steps = sorted(e["step"] for key, e in noise.items() if key.startswith(f"{name}@"))
        assert steps == noise_stage.measured_steps(last, 1) == [last]
    for entry in noise.values():
        for form in ("sgd", "adam"):
            low, high = entry[form]["b_simple_interval"]
            assert entry[form]["trace_sigma"] > 0 and low <= high
    assert "B_adam" in summary and "disjoint batches" in summary
    capsys.readouterr()
    assert json.loads(json.dumps(study.main(args))) == json.loads(json.dumps(records))
    out = capsys.readouterr().out
    assert "training" not in out and out.count("finished earlier") >= len(records)


def test_bad_targets_are_one_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--quick", "--targets", "0.9,0.8"])
    assert exit_info.value.code == 2
    assert "give them in increasing order" in capsys.readouterr().err
