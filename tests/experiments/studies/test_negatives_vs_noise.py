"""experiments/studies/negatives_vs_noise.py: each arm's runs (group_size / extra_negatives,
the optimizer batch, the rate), the protocol keyed by the arm's setting, the noise stage's
replicates with the run's own loss, the report's fit, the fixed-K arm against the plain
loss and the Welch contrast, and --quick end to end (both arms; a rerun trains nothing)."""

import argparse
import functools
import json

import numpy as np
import pytest

from experiments.lib import constant_rate, noise_stage, plateau, replicates, target_steps
from experiments.studies import negatives_vs_noise as study

RUN_ARGS = {"train_size": 108_000, "max_epochs": 16.0, "eval_examples": 32_768}
FIXED_K, FIXED_N = study.arms(argparse.Namespace(**study.FULL))


def record(arm, setting, k, seed, reached_at, top=0.9):
    """The record of `arm`'s run at `setting`, rate step `k`, `seed`, whose validation R@1
    rises linearly to `top` at step `reached_at`."""
    run = arm.run(setting, k, seed, **RUN_ARGS)
    curve = [[step, top * step / reached_at] for step in (reached_at / 2, reached_at)]
    return {"name": run.name, **run.tags, "curves": {f"eval/{m}": curve for m in target_steps.METRICS}}


def test_each_arm_runs_its_loss_option_at_its_batch_and_rate(load_config):
    """Fixed K: groups of 512 at N; fixed N: N = 512 and M = C - 512 extra negatives,
    tagged with C; both at the constant-rate protocol's rate, warmup and cadence, and the
    fixed-N arm's first rate step is N's whatever M."""
    from contrastive_jax.config_lib import override

    grouped = FIXED_K.run(4096, 7, 1, **RUN_ARGS)
    plain = constant_rate.study_run(4096, 7, 1, **RUN_ARGS)
    assert grouped.name == "n4096_g512_k7_s1"
    assert grouped.overrides == {**plain.overrides, "loss.group_size": 512}
    assert grouped.tags == {**plain.tags, "group_size": 512, "negatives": 512}
    extra = FIXED_N.run(2048, 4, 2, **RUN_ARGS)
    assert extra.name == "n512_m1536_k4_s2"
    assert extra.overrides == {**constant_rate.study_run(512, 4, 2, **RUN_ARGS).overrides, "loss.extra_negatives": 1536}
    assert (extra.tags["batch_size"], extra.tags["extra_negatives"], extra.tags["negatives"]) == (512, 1536, 2048)
    config = override(load_config("cmudict_clip"), extra.overrides)
    assert (config.train.global_batch_size, config.loss.extra_negatives, config.loss.group_size) == (512, 1536, 0)
    assert config.optim.learning_rate == pytest.approx(1e-3 * 2**2) and config.optim.schedule == "constant"
    assert [FIXED_N.batch_of(c) for c in FIXED_N.settings] == [512] * 5
    assert [FIXED_K.batch_of(n) for n in FIXED_K.settings] == list(study.FIXED_K_BATCHES)
    assert FIXED_K.replicate_rows(grouped) == (2048, False)  # n = 4K, n / 4 = one group
    plain_arm = study.Arm("plain", "batch_size", study.FIXED_K_BATCHES)  # K = 0: the plateau's plain loss
    assert plain_arm.run(4096, 7, 1, **RUN_ARGS) == type(plain)(plain.name, {**plain.tags, "negatives": 4096},
                                                                 plain.overrides)  # fmt: skip
    assert FIXED_N.replicate_rows(extra) == (512, True)  # the run's N, a quarter of its rows as queries
    assert plain_arm.replicate_rows(plain) == (4096, False)  # the run's N, batches of N / 4 with their own negatives


def test_the_arms_run_are_those_named_in_their_fixed_order(capsys):
    """--arms picks arms by name, run in ARMS' order whatever the order given; the plain
    arm spans the fixed-K arm's N; the shapes task's preset runs the deciding pair."""
    namespace = argparse.Namespace(**{**study.FULL, "arms": ["fixed_k", "plain"]})
    plain, grouped = study.arms(namespace)
    assert (plain.name, plain.group_size, plain.settings) == ("plain", 0, study.FIXED_K_BATCHES)
    assert (grouped.name, grouped.group_size) == ("fixed_k", 512)
    assert [arm.name for arm in study.arms(namespace, ("fixed_n",))] == ["fixed_n"]
    shapes_full, shapes_quick = study.PRESETS["shapes_vit"]
    assert shapes_full["arms"] == shapes_quick["arms"] == ["plain", "fixed_k"] and shapes_full["plain_results"] is None
    assert shapes_full["train_size"] == 270_000  # shapes.split_sizes(300,000)["train"]
    assert study.arm_names("plain,fixed_k") == ["plain", "fixed_k"]
    for bad in ("plain,fixed_q", ","):
        with pytest.raises(SystemExit) as exit_info:
            study.main(["--quick", "--arms", bad])
        assert exit_info.value.code == 2 and "name one or more of plain, fixed_k, fixed_n" in capsys.readouterr().err


def test_the_plain_loss_is_its_arms_records_where_it_ran_else_the_committed_ones(tmp_path):
    committed = [{"name": "n512_k3_s0", "batch_size": 512}]
    (tmp_path / "results.json").write_text(json.dumps(committed))
    ran = [{"name": "n512_k4_s0", "batch_size": 512}]
    assert study.plain_records({"plain": ran, "fixed_k": []}, tmp_path) == ran
    assert [r["name"] for r in study.plain_records({"fixed_k": []}, tmp_path)] == ["n512_k3_s0"]
    assert study.plain_records({"fixed_k": []}, None) == []


def test_the_plain_arm_reports_its_fit_and_the_fixed_k_arm_against_it():
    """With the plain loss an arm (the shapes task), its section fits B_crit over its N
    with "negatives N" and no contrast with itself; the fixed-K arm's contrast reads it."""
    namespace = argparse.Namespace(**{**study.FULL, "arms": ["plain", "fixed_k"]})
    plain_arm, grouped = study.arms(namespace)
    steps = {512: (800, 820, 790), 1024: (420, 430, 410), 2048: (240, 250, 235)}
    plain = [record(plain_arm, n, 3, seed, s) for n, by_seed in steps.items() for seed, s in enumerate(by_seed)]
    ours = [record(grouped, n, 3, seed, 1.2 * s) for n, by_seed in steps.items() for seed, s in enumerate(by_seed)]
    text = study.summary({plain_arm: plain, grouped: ours}, [0.86], {}, 270_000, plain, "shapes_vit")
    assert text.startswith(
        "# More negatives or less noise: plain and fixed_k on the generated image-text set with a ViT"
    )
    plain_part, grouped_part = text.split("## Fixed K = 512 negatives")
    assert "## Plain loss (negatives N), N = 512, 1,024, 2,048, 4,096, 8,192 (9 runs)" in plain_part
    assert "over N from 512 (3 N), negatives N: B_crit" in plain_part and "Against the plain loss" not in plain_part
    assert "| 512 | 768 ± 36 | 921 ± 44 | 1.20 [1.15, 1.25], resolved |" in grouped_part  # 800 x 0.86 / 0.9 steps


def test_the_protocol_tunes_and_ranks_each_setting_of_the_arms_field(rising_record):
    """The fixed-N arm's settings share one batch_size: tuned_steps and best_by_n group by
    `negatives`, each its own best. (Mutation: reached_steps keyed by batch_size whatever
    `by` merges them: red.)"""
    records = [record(FIXED_N, 512, k, 0, {2: 900, 3: 800, 4: 850}[k]) for k in (2, 3, 4)]
    records += [record(FIXED_N, 8192, k, 0, {2: 700, 3: 750, 4: 600}[k]) for k in (2, 3, 4)]
    assert constant_rate.tuned_steps(records, 0, [0.86], by="negatives") == {512: 3, 8192: 4}
    best = constant_rate.best_by_n(records, 0.86, "negatives")
    assert (best[512]["steps"], best[8192]["steps"]) == pytest.approx((800 * 0.86 / 0.9, 600 * 0.86 / 0.9))
    assert best[8192]["edge"] and not best[512]["edge"]
    grown = constant_rate.edge_runs(records, [0, 1], 0.86, 6, functools.partial(FIXED_N.run, **RUN_ARGS), "negatives")
    assert [r.name for r in grown] == ["n512_m7680_k5_s0", "n512_m7680_k5_s1"]


def test_the_fixed_n_contrast_is_welchs_difference_of_the_fewest_and_most_negatives():
    """Steps at 512 negatives less those at 8,192, Welch over 3 seeds each, and their
    ratio. (Mutations, each red: the most less the fewest; the ratio most over fewest.)"""
    fewest, most = [1000.0, 1100.0, 1200.0], [700.0, 760.0, 820.0]
    records = [record(FIXED_N, 512, 3, s, v / 0.86 * 0.9) for s, v in enumerate(fewest)]
    records += [record(FIXED_N, 8192, 3, s, v / 0.86 * 0.9) for s, v in enumerate(most)]
    from experiments.lib import intervals

    difference, low, high = intervals.welch_interval(fewest, most)
    text = study.fixed_n_contrast(records, 0.86)
    assert f"Steps at 512 negatives less steps at 8,192 (N = 512 both): {difference:+,.0f} " in text
    assert f"[{low:+,.0f}, {high:+,.0f}] (Welch, 95%), resolved; as a ratio, " in text
    assert difference == pytest.approx(340)
    assert f"as a ratio, {intervals.ratio_cell(fewest, most)} (of the geometric means" in text
    assert intervals.ratio_cell(fewest, most).startswith("1.45 [")  # (1000 1100 1200)^(1/3) / (700 760 820)^(1/3)
    table = study.steps_table(records, 0.86, FIXED_N)
    assert "| 8,192 | 512 | 3 | 760 ± " in table
    # the data seen per setting: the optimizer's 512 a step at every C (mutation: grouped by batch_size: red)
    reuse = constant_rate.reuse_table(records, [0.86], 108_000, "negatives", "N + M")
    assert "| N + M | batch / split |" in reuse and "| 512 | 0.5% | 3,375 | 3 | 3 |" in reuse
    assert "| 8,192 | 0.5% | 3,375 | 3 | 3 | 0 | 0 | 3.6 |" in reuse


@pytest.mark.slow
def test_the_fixed_k_report_fits_b_crit_with_the_misfit_and_the_weighting_table():
    """S(N) = S_min (1 + B_crit / N) through the fixed-K arm's best steps, B_crit near the
    curve's, its interval, lack of fit and the weighting table at the highest target."""
    curve = {n: 1000 * (1 + 2000 / n) for n in study.FIXED_K_BATCHES}
    records = [record(FIXED_K, n, 5, s, curve[n] * (1 + 0.02 * (s - 1)) / 0.86 * 0.9)
               for n in study.FIXED_K_BATCHES for s in range(3)]  # fmt: skip
    words, fit = study.fixed_k_section(records, 0.86)
    assert fit["b_crit"] == pytest.approx(2000, rel=0.05) and "K = 512 negatives" in words
    text = study.summary({FIXED_K: records, FIXED_N: []}, [0.86], {}, 108_000)
    assert "B_crit at R@1 0.86 by weighting and with each N left out" in text
    assert "chi^2" in text.replace("χ²", "chi^2") or "lack of fit" in text.lower()
    assert "No run finished yet." in text
    assert "Targets below every N's lowest peak (0.900" in text and "| 8,192 | 7.6% | " in text


@pytest.mark.slow
def test_the_fixed_k_arm_against_the_plain_loss_at_each_n_both_ran():
    """Plain steps 100 (1 + 2,000 / N) times 1, 1.1, 1.21 over the seeds; fixed K's the
    same times 1, 1.25, 1.5 at N = 512, 2,048, 8,192: its ratios to the plain are those
    exactly, each with Welch's interval on the logs (half-width t(4) ln 1.1 sqrt(2/3)); the
    falls from 512 to 8,192 are 4.906 / 1.244 = 3.94 and that / 1.5; the plain loss's
    B_crit over the 3 shared N (its 16,384 left out) is the curve's 2,000, and the figure
    draws its steps on the fixed-K panel. (Mutations, each red: the ratio plain over
    fixed K; the plain fit over all its N.)"""
    seeds = (1.0, 1.1, 1.21)
    extra = {512: 1.0, 2048: 1.25, 8192: 1.5}

    def plain_record(n, seed, steps):
        run = constant_rate.study_run(n, 5, seed, **RUN_ARGS)
        curve = [[at, 0.9 * at / (steps / 0.86 * 0.9)] for at in (steps / 2, steps / 0.86 * 0.9)]
        return {"name": run.name, **run.tags, "curves": {f"eval/{m}": curve for m in target_steps.METRICS}}

    plain = [plain_record(n, s, 100 * (1 + 2000 / n) * f) for n in (*extra, 16384) for s, f in enumerate(seeds)]
    ours = [record(FIXED_K, n, 5, s, 100 * (1 + 2000 / n) * f * c / 0.86 * 0.9)
            for n, c in extra.items() for s, f in enumerate(seeds)]  # fmt: skip
    text = study.plain_contrast(ours, plain, 0.86)
    half = 2.776445 * np.log(1.1) * np.sqrt(2 / 3)
    for n, c in extra.items():
        low, high = c * np.exp(-half), c * np.exp(half)
        verdict = "resolved" if low > 1 else "not resolved"
        assert f"| {n:,} | " in text and f" | {c:.2f} [{low:.2f}, {high:.2f}], {verdict} |" in text
    fall = (1 + 2000 / 512) / (1 + 2000 / 8192)
    assert f"From N = 512 to 8,192 the steps fall by a factor of {fall:.2f} [" in text
    assert f"and {fall / 1.5:.2f} [" in text and "with K = 512 fixed (less noise alone)" in text
    assert "The plain loss over the same 3 N: B_crit = 2,000 [" in text and "inside N = 512 … 8,192" in text
    assert study.plain_contrast(ours, [], 0.86) == ""
    assert "Against the plain loss" in study.summary({FIXED_K: ours, FIXED_N: []}, [0.86], {}, 108_000, plain)
    # the figure: the plain loss's steps on the fixed-K panel over the arm's N (its 16,384 left out)
    fig = study.steps_figure({FIXED_K: ours, FIXED_N: []}, [0.86], plain)["steps_to_target"]
    (bars,) = [bars for bars in fig.axes[0].containers if bars.get_label() == "plain loss, R@1 0.86"]
    line = bars.lines[0]
    assert list(line.get_xdata()) == [512, 2048, 8192]
    np.testing.assert_allclose(
        np.asarray(line.get_ydata(), float), [100 * (1 + 2000 / n) * np.mean(seeds) for n in extra]
    )


def test_noise_replicates_at_a_quarter_score_a_quarter_of_the_runs_own_batches(monkeypatch):
    """With `quarter_queries` both sides read the run's N + M rows a step (stream steps 0
    and `count`), the n / 4 side with N / 4 queries; without, batches of n / 4 from
    4 x `count`. (Mutation: the quarter side's batches of n / 4: red.)"""
    from contrastive_jax.training import noise_scale

    calls = []

    def fake_gradients(config, workdir, n, count, *, step, start_step, queries=0):
        calls.append((n, queries, config.loss.extra_negatives, start_step, config.data.seed))
        rng = np.random.default_rng(len(calls))
        return [{"w": rng.normal(size=8) + 1} for _ in range(count)], argparse.Namespace(opt_state=None)

    monkeypatch.setattr(replicates, "gradients", fake_gradients)
    monkeypatch.setattr(noise_scale, "adam_preconditioned", lambda g, opt_state: g)
    from contrastive_jax.config_lib import load_config, override

    config = override(load_config("cmudict_clip"), FIXED_N.run(2048, 3, 1, **RUN_ARGS).overrides)
    measured = noise_stage.noise_at(config, "unused", 8, 512, 4, 50, quarter_queries=True)
    seed = noise_stage.NOISE_DATA_SEED + 1
    assert calls == [(512, 0, 1536, 0, seed), (512, 128, 1536, 4, seed)]
    assert set(measured) == {"sgd", "adam"}
    calls.clear()
    noise_stage.noise_at(config, "unused", 8, 512, 4, 50)
    assert [call[:4] for call in calls] == [(512, 0, 1536, 0), (128, 0, 1536, 16)]


@pytest.mark.slow
def test_replicate_gradients_embed_the_extra_rows_without_gradient(tiny_config, tmp_path):
    """`replicates.gradients` with M = 16 extra negatives and q = 16 of n = 32 rows as
    queries = the gradient of CLIP written by hand: each device's first q / d rows as
    queries against all 48 columns, the last M / d rows' embeddings stopped (the trainer's
    step). (Mutations, each red: the towers applied to every row with the parameters, as
    before `training.forward`; every gradient row a query whatever q.)"""
    import jax
    import jax.numpy as jnp

    from contrastive_jax import sharding
    from contrastive_jax.config_lib import override
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import run_plan

    config = override(tiny_config, {"train.num_train_steps": 1, "loss.extra_negatives": 16})
    run_plan.train_and_evaluate(config, str(tmp_path))
    (grad,), state = replicates.gradients(config, str(tmp_path), 32, 1, queries=16)
    plan = run_plan.build(override(config, {"train.global_batch_size": 32}))
    mesh = plan.trainer.mesh
    batch = jax.device_put(dict(next(iter(input_pipeline.train_dataset(plan.data)))), sharding.data_sharding(mesh))
    per_device = 48 // sharding.batch_shards(mesh)
    extra = (np.arange(48) % per_device) >= 32 // sharding.batch_shards(mesh)  # each device's last 16 / d rows
    queries = (np.arange(48) % per_device) < 16 // sharding.batch_shards(mesh)

    def loss(params):
        variables = {"params": params, "batch_stats": state.batch_stats}
        out = state.apply_fn(variables, batch["a"], batch.get("b"), train=False)
        za, zb = (jnp.where(extra[:, None], jax.lax.stop_gradient(out[k]), out[k]) for k in ("za", "zb"))
        log_p = lambda x, y: jnp.diagonal(jax.nn.log_softmax(x @ y.T / out["temperature"], axis=1))  # noqa: E731
        return -jnp.sum(jnp.where(queries, log_p(za, zb) + log_p(zb, za), 0.0)) / (2 * 16)

    expected = jax.grad(loss)(state.params)
    for got_leaf, expected_leaf in zip(jax.tree.leaves(grad), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(got_leaf, expected_leaf, rtol=1e-4, atol=1e-6)


def test_the_figure_has_a_panel_per_arm_one_arm_too():
    """`--arms fixed_k` alone: one panel (matplotlib's one Axes is no sequence; the figure
    once failed there after every run had finished)."""
    fixed_k, fixed_n = study.arms(argparse.Namespace(**study.QUICK))
    assert len(study.steps_figure({fixed_k: []}, [0.01])["steps_to_target"].axes) == 1
    assert len(study.steps_figure({fixed_k: [], fixed_n: []}, [0.01])["steps_to_target"].axes) == 2


def test_bad_settings_are_one_clear_error(capsys):
    for argv, words in (
        (["--quick", "--fixed-k-batches", "48"], "must divide every --fixed-k-batches"),
        (["--quick", "--fixed-n-negatives", "32"], "be at least --fixed-batch 64"),
        (["--quick", "--replicates", "64"], "must fit in one epoch"),
        (["--quick", "--plateau-batches", "32,128"], "must be among --fixed-k-batches [32, 64]"),
        (["--quick", "--plateau-epochs", "1,0"], "--plateau-epochs [1.0, 0.0] positive"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            study.main(argv)
        assert exit_info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.e2e
def test_quick_runs_both_arms_their_noise_and_the_report_and_resumes(tmp_path, cmudict_data_dir, capsys):
    args = ["--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    by_arm = study.main(args)
    quick_k, quick_n = study.arms(argparse.Namespace(**study.QUICK))
    for r in by_arm["fixed_k"]:
        assert (r["group_size"], r["negatives"]) == (32, 32) and r["batch_size"] in (32, 64)
        config = json.loads((tmp_path / "fixed_k" / "runs" / r["name"] / "config.json").read_text())
        assert (config["loss"]["group_size"], config["train"]["global_batch_size"]) == (32, r["batch_size"])
    for r in by_arm["fixed_n"]:
        assert r["batch_size"] == 64 and r["extra_negatives"] == r["negatives"] - 64 and r["negatives"] in (64, 128)
        config = json.loads((tmp_path / "fixed_n" / "runs" / r["name"] / "config.json").read_text())
        assert config["loss"]["extra_negatives"] == r["extra_negatives"]
        assert config["optim"]["learning_rate"] == pytest.approx(r["learning_rate"])
    for arm in (quick_k, quick_n):  # seed 1 ran the tuned rate and its neighbours at every setting
        records = by_arm[arm.name]
        assert {r[arm.by] for r in records if r["seed"] == 1} == set(arm.settings)
        noise = json.loads((tmp_path / arm.name / "noise.json").read_text())
        assert {e[arm.by] for e in noise.values()} == set(arm.settings)
        assert all(e.get("quarter") == ("queries" if arm is quick_n else None) for e in noise.values())
        assert all(e["n"] == (64 if arm is quick_n else 128) for e in noise.values())
    summary = (tmp_path / "summary.md").read_text()
    assert (
        "## Fixed K = 32 negatives, N = 32, 64" in summary and "## Fixed N = 64, negatives N + M = 64, 128" in summary
    )
    assert "S(N) = S_min (1 + B_crit / N)" in summary and "Steps at 64 negatives less steps at 128" in summary
    assert (tmp_path / "steps_to_target.png").stat().st_size > 0
    assert "Against the plain loss" not in summary  # --quick: no plain loss's records
    # the plateau: the plain loss at N = 32 (standing for both arms: K = 32) and 64, fixed K at 64, seed 0, over
    # 0.5 and 1 epoch, cosine to 0
    plateau_records = json.loads((tmp_path / "plateau" / "results.json").read_text())
    assert sorted((r["arm"], r["batch_size"], r["seed"], r["epochs"]) for r in plateau_records) == [
        ("fixed_k", 64, 0, 0.5), ("fixed_k", 64, 0, 1), ("plain", 32, 0, 0.5), ("plain", 32, 0, 1),
        ("plain", 64, 0, 0.5), ("plain", 64, 0, 1),
    ]  # fmt: skip
    for r in plateau_records:
        config = json.loads((tmp_path / "plateau" / "runs" / r["name"] / "config.json").read_text())
        assert config["loss"]["group_size"] == (32 if r["arm"] == "fixed_k" else 0)
        assert (config["optim"]["schedule"], config["optim"]["end_learning_rate_factor"]) == ("cosine", 0.0)
        assert config["train"]["num_train_steps"] == r["max_steps"] == r["epochs"] * 1024 // r["batch_size"]
        assert config["checkpoint"]["every_steps"] == r["checkpoint_every"] == 2 * config["eval"]["every_steps"]
    assert set(json.loads((tmp_path / "plateau" / "final.json").read_text())) == set(plateau.hit_names(plateau_records))
    assert "## The plateau: each N at its tuned rate, decayed over 0.5 and 1 epochs" in summary
    assert "| fixed_k | 1 | 64 | 2 | 1 |" in summary and "At N = 32 the plain runs stand for both arms." in summary
    assert "| plain − fixed_k, N = 64 | 0.5 | " in summary and "| fixed_k: N = 64 − 32 | 1 | " in summary
    assert "| plain: N = 64 − 32 | 1 vs 0.5 | " in summary and "| plain, N = 32 | 1 vs 0.5 | " in summary
    capsys.readouterr()
    rerun = study.main(args)
    assert json.loads(json.dumps(rerun)) == json.loads(json.dumps(by_arm))
    out = capsys.readouterr().out
    assert "training" not in out and "[noise] " not in out and "[hits] " not in out
    assert (tmp_path / "summary.md").read_text() == summary
    study.main([*args, "--hours", "0", "--plain-results", str(tmp_path / "fixed_k")])  # its own records stand in
    assert "| 32 | " in (tmp_path / "summary.md").read_text().split("Against the plain loss")[1]


def test_the_noise_by_setting_takes_each_runs_last_state_and_splits_b_simple():
    """Per number of negatives, the geometric mean over the seeds of each run's last
    measured state (an earlier state of 10^6 left out), with its t-interval: B_simple
    100, 200, 400 gives 200 [35.7, 1,119]; the fewest negatives' over the most's, 4.00
    (Welch on the logarithms: [0.83, 19.25]), and B_simple's parts, |E g|² and tr Σ,
    each as its own ratio."""

    def entry(negatives, seed, step, b_simple, g_squared):
        form = {"b_simple": b_simple, "g_squared": g_squared, "trace_sigma": b_simple * g_squared}
        return {"negatives": negatives, "seed": seed, "step": step, "sgd": form, "adam": dict(form)}

    noise = {}
    for negatives, scale, g_squared in ((512, 1.0, 0.01), (8192, 0.25, 1.0)):
        for seed, b_simple in enumerate((100, 200, 400)):
            noise[f"{negatives}_{seed}@64"] = entry(negatives, seed, 64, 1e6, 1.0)
            noise[f"{negatives}_{seed}@128"] = entry(negatives, seed, 128, scale * b_simple, g_squared)
    text = noise_stage.noise_by_setting(noise, "negatives", "N + M")
    assert "| 512 | 128, 128, 128 | 200 [36, 1,119] | 200 [36, 1,119] | 0.01 [0.01, 0.01] | 2 [0.357, 11.2] |" in text
    assert "| 8,192 | 128, 128, 128 | 50 [9, 280] |" in text
    assert "At 512 over at 8,192" in text
    assert "B_simple 4.00 [0.83, 19.25], not resolved" in text
    assert "|E g|² 0.01 [0.01, 0.01]" in text and "tr Σ 0.04 [" in text


@pytest.mark.e2e
def test_quick_shapes_runs_the_plain_arm_standing_in_for_fixed_k_at_n_equal_k(tmp_path):
    """The second task (--task shapes_vit, its generated pictures written under --data-dir):
    the plain loss is an arm of its own, trained with the ViT; at N = K its runs stand for
    fixed K's (none trained)."""
    out, data_dir = tmp_path / "out", tmp_path / "data"
    args = ["--task", "shapes_vit", "--quick", "--out", str(out), "--data-dir", str(data_dir), "--seeds", "0"]
    by_arm = study.main(
        [*args, "--fixed-k-batches", "64", "--group-size", "64", "--replicates", "2", "--plateau-seeds", ""]
    )
    assert sorted(by_arm) == ["fixed_k", "plain"] and (data_dir / "shapes-v2-32px-1500" / "metadata.json").exists()
    plain = by_arm["plain"]
    assert {(r["batch_size"], r["negatives"]) for r in plain} == {(64, 64)} and len(plain) == 3  # 3 rates tuned
    config = json.loads((out / "plain" / "runs" / plain[0]["name"] / "config.json").read_text())
    assert (config["model"]["encoder_a"], config["loss"]["group_size"]) == ("vit_micro", 0)
    assert [{**r, "group_size": 64, "stand_in": "plain"} for r in plain] == by_arm["fixed_k"]
    assert not (out / "fixed_k" / "runs").exists()
    assert not (out / "plateau").exists()  # no plateau seeds: the stage is tested on cmudict
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# More negatives or less noise: plain and fixed_k on the generated image-text set")
    assert "## Plain loss (negatives N), N = 64 (3 runs)" in summary
    assert "At N = 64 the plain loss's runs stand for this arm's (one group)." in summary
