"""experiments/studies/sigmoid_vs_softmax.py (and its _grid): the runs' budget and
starts, the two arms' steps (epoch-matched, step-matched), the tuning axes (three steps, then
the neighbour beyond an edge best, up to a cap) with CLIP's temperature an axis like SigLIP's,
the comparison's seeds scored on the test split, the interval over seeds and test queries,
the verdict words, and --quick end to end (a rerun and --hours 0 train nothing and write the
same report)."""

import json
import math

import numpy as np
import pytest

from experiments.lib import intervals, query_hits, sweep
from experiments.studies import sigmoid_vs_softmax as study
from experiments.studies import sigmoid_vs_softmax_grid as grid

LIMITS = {
    "seeds": [0, 1, 2, 3],
    "epochs": 4.0,
    "train_size": 108_000,
    "max_rates": 5,
    "max_init_values": 4,
    "matched_steps": 844,
    "test_split": "test",
}


def record(loss, n, setting, seed, r1, back=None, steps=None, limits=LIMITS):
    """The record of `grid.limited_run(...)` (`steps`: the epoch arm's at `n` unless given)
    whose final validation R@1 is `r1` one way and `back` (default `r1`) the other."""
    steps = steps or grid.arm_steps("epochs", n, limits)
    run = grid.limited_run(loss, n, setting, seed, steps, limits)
    return {"name": run.name, **run.tags, "a_to_b/R@1": r1, "b_to_a/R@1": r1 if back is None else back, "curves": {}}


def tuned_by(score, loss, n, steps=None, limits=LIMITS):
    """Plays `grid.plan` to the end with `score(setting) -> R@1` standing in for training:
    `(the runs' settings in order, the final Tuning)`."""
    records, order = [], []
    steps = steps or grid.arm_steps("epochs", n, limits)
    while (tuning := grid.plan(records, loss, n, 0, steps, limits)).next_run is not None:
        tags = tuning.next_run.tags
        setting = {axis: tags[axis] for axis in grid.AXES[loss]}
        order.append(setting)
        records.append(record(loss, n, setting, 0, score(setting), steps=steps, limits=limits))
    return order, tuning


def test_every_run_has_its_steps_a_sixteenth_of_warmup_and_each_loss_its_start():
    clip = grid.study_run("clip", 64, {"rate_step": 0, "temperature_step": 0}, 0, steps=6750, train_size=108_000)
    assert clip.name == "clip_n64_k0_t0_6750st_s0" and clip.tags["learning_rate"] == 1e-3
    assert clip.overrides["optim.warmup_steps"] == 422 and clip.overrides["loss.temperature"] == 0.07
    assert clip.tags["epochs"] == 4.0 and clip.overrides["train.num_train_steps"] == 6750
    setting = {"rate_step": 4, "temperature_step": 1, "bias_step": -1}
    siglip = grid.study_run("siglip", 1024, setting, 3, steps=844, train_size=108_000)
    assert siglip.name == "siglip_n1024_k4_t1_b-1_844st_s3" and siglip.tags["epochs"] == 8.002
    assert siglip.overrides["loss.temperature"] == 0.05 and siglip.overrides["loss.siglip_bias"] == -15.0
    assert siglip.overrides["loss.name"] == "siglip" and siglip.tags["learning_rate"] == pytest.approx(4e-3)
    assert siglip.overrides["optim.warmup_steps"] == 53 and siglip.overrides["eval.every_steps"] == 211
    assert grid.start_setting("siglip", 64) == {"rate_step": 0, "temperature_step": 0, "bias_step": 0}
    assert grid.start_setting("clip", 64) == {"rate_step": 0, "temperature_step": 0}
    assert [grid.start_setting("clip", n)["rate_step"] for n in grid.BATCH_SIZES] == [0, 1, 2, 3, 4]


def test_the_step_matched_arm_trains_every_n_for_n_512s_steps_at_4_epochs():
    assert grid.matched_steps(4.0, 108_000) == 844 == 2 * math.ceil(4 * 108_000 / 1024)
    epochs = [grid.arm_steps("epochs", n, LIMITS) for n in grid.BATCH_SIZES]
    assert epochs == [6750, 3375, 1688, 844, 422]
    assert [grid.arm_steps("steps", n, LIMITS) for n in grid.BATCH_SIZES] == [844] * 5
    units = grid.units(grid.BATCH_SIZES, LIMITS)  # N = 512's runs serve both arms, trained once
    assert [(n, s) for n, s, _ in units] == [
        (64, 6750), (64, 844), (128, 3375), (128, 844), (256, 1688), (256, 844), (512, 844), (1024, 422), (1024, 844)
    ]  # fmt: skip
    assert [arms for n, _, arms in units if n == 512] == [("epochs", "steps")]
    # each arm plans on its own runs: a step-matched record is no part of the epoch arm's tuning
    t0 = {"temperature_step": 0}
    records = [record("clip", 64, {**t0, "rate_step": k}, 0, 0.8 + 0.01 * (k == 0), steps=844) for k in (-1, 0, 1)]
    assert grid.plan(records, "clip", 64, 0, 844, LIMITS).next_run.name == "clip_n64_k0_t-1_844st_s0"
    assert grid.plan(records, "clip", 64, 0, 6750, LIMITS).next_run.name == "clip_n64_k-1_t0_6750st_s0"


def test_the_budget_counts_every_run_of_both_arms():
    assert study.unit_counts(grid.SEEDS, grid.MAX_RATES, grid.MAX_INIT_VALUES) == (22, 29)
    fewest, most, low, high = study.budget(grid.BATCH_SIZES, {**LIMITS, "seeds": list(grid.SEEDS)})
    assert (fewest, most) == (9 * 22, 9 * 29)
    minutes = 5 * study.run_minutes(4.0) + sum(study.run_minutes(844 * n / 108_000) for n in (64, 128, 256, 1024))
    assert (low, high) == pytest.approx((22 * minutes / 60, 29 * minutes / 60), rel=1e-3)  # 1,688 steps: 4.001 epochs
    quick = {k: study.QUICK[k] for k in LIMITS}
    assert study.unit_counts(quick["seeds"], 3, 3) == (16, 16) and study.budget([64], quick)[:2] == (32, 32)


def test_an_axis_runs_three_steps_then_the_neighbour_beyond_an_edge_best_up_to_its_cap():
    assert grid.next_on_axis({}, 2, 5) == 1
    assert grid.next_on_axis({1: 0.8, 2: 0.81}, 2, 5) == 3
    assert grid.next_on_axis({1: 0.8, 2: 0.81, 3: 0.83}, 2, 5) == 4  # best at the top edge
    assert grid.next_on_axis({1: 0.85, 2: 0.81, 3: 0.83}, 2, 5) == 0  # at the bottom edge
    assert grid.next_on_axis({1: 0.8, 2: 0.84, 3: 0.83}, 2, 5) is None  # inside
    assert grid.next_on_axis({0: 0.7, 1: 0.8, 2: 0.81, 3: 0.83, 4: 0.86}, 2, 5) is None  # the cap
    assert grid.next_on_axis({1: 0.8, 2: 0.8, 3: 0.7}, 2, 5) == 0  # a tie: the smaller step is the best
    assert grid.at_edge({0: 0.7, 1: 0.8, 2: 0.81, 3: 0.83, 4: 0.86}) and not grid.at_edge({2: 0.9})


def test_siglip_tunes_its_rate_then_temperature_then_bias_each_at_the_others_best():
    def score(s):  # rate best at k0 + 2 = 2, temperature at j = -1; the bias rises past the cap
        return 0.9 - 0.01 * (s["rate_step"] - 2) ** 2 - 0.01 * (s["temperature_step"] + 1) ** 2 + 0.001 * s["bias_step"]

    order, tuning = tuned_by(score, "siglip", 64)
    rates = [s["rate_step"] for s in order if s["temperature_step"] == s["bias_step"] == 0]
    assert rates[:5] == [-1, 0, 1, 2, 3]  # the neighbour beyond the best, twice
    temperatures = [s for s in order if s["rate_step"] == 2 and s["bias_step"] == 0]
    assert [s["temperature_step"] for s in temperatures] == [0, -1, 1, -2]  # 0 ran with the rates
    biases = [s["bias_step"] for s in order if s["rate_step"] == 2 and s["temperature_step"] == -1]
    assert biases == [0, -1, 1, 2]  # the cap, 4 values
    assert len(order) == 5 + 3 + 3
    assert tuning.complete and tuning.setting == {"rate_step": 2, "temperature_step": -1, "bias_step": 2}
    assert tuning.edges == ("bias_step",)
    assert grid.setting_words("siglip", tuning.setting) == "k=2 (0.002), T0 0.2, b0 0"


def test_clip_tunes_its_temperature_at_its_tuned_rate_on_the_same_kind_of_grid():
    def score(s):  # rate best at 4; the temperature best at j = 1 (0.035), then the edge at the cap
        return 0.9 - abs(s["rate_step"] - 4) - 0.01 * abs(s["temperature_step"] - 1)

    order, tuning = tuned_by(score, "clip", 1024)
    assert order[:3] == [{"rate_step": k, "temperature_step": 0} for k in (3, 4, 5)]
    assert order[3:] == [{"rate_step": 4, "temperature_step": t} for t in (-1, 1, 2)]  # the neighbour beyond 1
    assert tuning.setting == {"rate_step": 4, "temperature_step": 1} and not tuning.edges
    run = grid.limited_run("clip", 1024, tuning.setting, 1, 422, LIMITS)
    assert run.overrides["loss.temperature"] == pytest.approx(0.035) and run.tags["temperature_init"] == 0.035
    assert grid.setting_words("clip", tuning.setting) == "k=4 (0.004), T0 0.035"
    order, tuning = tuned_by(lambda s: 0.9 - abs(s["rate_step"] - 4) + 0.01 * s["temperature_step"], "clip", 1024)
    assert [s["temperature_step"] for s in order[3:]] == [-1, 1, 2]  # the cap: 4 initial values
    assert tuning.edges == ("temperature_step",)
    start = {"temperature_step": 0, "bias_step": 0}
    half = [record("siglip", 64, {**start, "rate_step": k}, 0, 0.8 + 0.01 * (k == 0)) for k in (-1, 0, 1)]
    tuning = grid.plan(half, "siglip", 64, 0, 6750, LIMITS)
    assert tuning.next_run.name == "siglip_n64_k0_t-1_b0_6750st_s0" and not tuning.complete


def comparison_records(clip_values, siglip_values, n=256, steps=None):
    """Both losses tuned at N = `n` (CLIP k = 2, T0 0.07; SigLIP k = 3, T0 0.1, b0 -5) on seed
    0, and their seeds 1, 2, ... (validation R@1 the given values); a stray seed run at
    another setting."""
    c = {"temperature_step": 0}
    records = [record("clip", n, {**c, "rate_step": k}, 0, 0.8 + 0.01 * (k == 2), steps=steps) for k in (1, 2, 3)]
    records += [record("clip", n, {"rate_step": 2, "temperature_step": t}, 0, 0.79, steps=steps) for t in (-1, 1)]
    s = {"temperature_step": 0, "bias_step": 0}
    records += [record("siglip", n, {**s, "rate_step": k}, 0, 0.8 + 0.01 * (k == 3), steps=steps) for k in (1, 2, 3, 4)]
    for t in (-1, 1):
        records.append(
            record("siglip", n, {"rate_step": 3, "temperature_step": t, "bias_step": 0}, 0, 0.79, steps=steps)
        )
    for b in (-1, 1, 2):
        setting = {"rate_step": 3, "temperature_step": 0, "bias_step": b}
        records.append(record("siglip", n, setting, 0, 0.8 + 0.02 * (b == 1), steps=steps))
    clip_best, siglip_best = (
        {"rate_step": 2, "temperature_step": 0},
        {"rate_step": 3, "temperature_step": 0, "bias_step": 1},
    )
    records += [record("clip", n, clip_best, seed, v, steps=steps) for seed, v in enumerate(clip_values, 1)]
    records += [record("siglip", n, siglip_best, seed, v, steps=steps) for seed, v in enumerate(siglip_values, 1)]
    records.append(record("clip", n, {**c, "rate_step": 1}, 1, 0.99, steps=steps))  # not the tuned setting
    return records


def hits_of(records, r1_by_name, queries=200):
    """Per-query test hits standing in for `query_hits.cached_hits`: each seed run (seed > 0)
    right on the first `r1_by_name[name] * queries` queries, both ways."""
    hits = {}
    for r in records:
        if r["seed"] > 0 and r["name"] in r1_by_name:
            right = np.arange(queries) < round(r1_by_name[r["name"]] * queries)
            hits[r["name"]] = {"a_to_b": right, "b_to_a": right, "queries": queries}
    return hits


def test_the_comparison_reads_the_other_seeds_at_each_losss_tuned_setting():
    found = grid.comparison(comparison_records([0.80, 0.81], [0.82, 0.83]), 256, 1688, LIMITS)
    assert {loss: sorted(by_seed) for loss, by_seed in found["seeds"].items()} == {"clip": [1, 2], "siglip": [1, 2]}
    assert [grid.final_r1(r) for r in found["seeds"]["clip"].values()] == [0.80, 0.81]
    assert found["tuning"]["clip"].setting == {"rate_step": 2, "temperature_step": 0}
    assert found["tuning"]["siglip"].setting == {"rate_step": 3, "temperature_step": 0, "bias_step": 1}
    assert found["edges"] == []  # every best inside the steps it ran
    assert not grid.comparison(comparison_records([0.8], [0.8]), 256, 844, LIMITS)["seeds"]  # the other arm's


def test_the_interval_adds_the_seeds_and_the_queries_half_widths_in_quadrature():
    # by hand: the seeds' half-width 0.03, the queries' 0.04 -> 0.05 around the seeds' difference
    assert query_hits.combine((0.02, -0.01, 0.05), (0.02, -0.02, 0.06)) == pytest.approx((0.02, -0.03, 0.07))
    assert all(math.isnan(v) for v in query_hits.combine((0.02, math.nan, math.nan), (0.02, 0.0, 0.04))[1:])
    # 2 seeds each on 4 queries: CLIP right on 2 and 3 queries, SigLIP on 3 and 4 -> +0.25.
    # Welch by hand: each side's variance 0.03125, / 2 seeds; dof 2; t(0.975, 2) = 4.3027
    clip = [np.array([1.0, 1, 0, 0]), np.array([1.0, 1, 1, 0])]
    siglip = [np.array([1.0, 1, 1, 0]), np.array([1.0, 1, 1, 1])]
    seeds_half = 4.302653 * math.sqrt(2 * 0.03125 / 2)
    _, q_low, q_high = intervals.paired_bootstrap(np.mean(siglip, axis=0), np.mean(clip, axis=0))
    diff, low, high = query_hits.seeds_and_queries(siglip, clip)
    half = math.sqrt(seeds_half**2 + ((q_high - q_low) / 2) ** 2)
    assert diff == 0.25 and (low, high) == pytest.approx((0.25 - half, 0.25 + half), abs=1e-5)
    assert q_high > q_low and high - low > 2 * seeds_half  # the queries widen it
    # queries that all move alike add nothing; seeds that agree leave the queries' alone
    same = [np.full(4, 0.5), np.full(4, 0.75)]
    assert query_hits.seeds_and_queries([s + 0.1 for s in same], same)[1:] == pytest.approx(
        intervals.welch_interval([0.6, 0.85], [0.5, 0.75])[1:]
    )
    alike = [np.array([1.0, 1, 0, 0])] * 2
    _, low, high = query_hits.seeds_and_queries(alike, [np.array([1.0, 0, 0, 0])] * 2)
    q = intervals.paired_bootstrap(alike[0], np.array([1.0, 0, 0, 0]))
    assert (high - low) == pytest.approx(q[2] - q[1])


@pytest.mark.parametrize(
    "clip, siglip, words",
    [
        ([0.80, 0.81, 0.805], [0.86, 0.87, 0.865], "resolved, SigLIP ahead"),
        ([0.86, 0.87, 0.865], [0.80, 0.81, 0.805], "resolved, CLIP ahead"),
        ([0.80, 0.84, 0.82], [0.81, 0.83, 0.825], "not resolved"),
        ([0.800, 0.805, 0.810], [0.805, 0.810, 0.815], "not resolved"),  # the seeds agree, the queries do not
    ],
)
def test_the_finding_quotes_its_test_interval_over_seeds_and_queries_and_the_verdict(clip, siglip, words):
    records = comparison_records(clip, siglip)
    by_name = {r["name"]: grid.final_r1(r) for r in records}
    found = grid.comparison(records, 256, 1688, LIMITS)["seeds"]
    hits = hits_of(records, {r["name"]: by_name[r["name"]] for loss in found for r in found[loss].values()})
    scores = {
        loss: [query_hits.query_scores(h) for name, h in hits.items() if name.startswith(loss)] for loss in grid.LOSSES
    }
    diff = query_hits.seeds_and_queries(scores["siglip"], scores["clip"])
    sentence = study.finding(256, diff, [3, 3], 200, [])
    assert f"{intervals.difference_cell(*diff)} (95% over 3 vs 3 seeds and 200 test queries; {words})." in sentence
    assert "SigLIP − CLIP in final test R@1 (mean of both directions)" in sentence
    text = study.summary(records, hits, LIMITS, "epochs")
    assert f"- {sentence}\n" in text
    seeds_only = intervals.welch_interval(*(np.mean(s, axis=1) for s in (scores["siglip"], scores["clip"])))
    cells = [intervals.difference_cell(*diff), intervals.difference_cell(*seeds_only), intervals.verdict(*diff[1:])]
    assert "| " + " | ".join(cells) + " |" in text
    assert "No N has" in study.summary(records, hits, LIMITS, "steps")  # the step arm has none of these runs


def test_both_losses_tuned_without_test_hits_yet_have_no_row(recwarn):
    records = comparison_records([0.80, 0.81], [0.82, 0.83])
    text = study.summary(records, {}, LIMITS, "epochs")
    assert "No N has both losses tuned and a seed tested yet." in text and "None yet" in text
    assert not recwarn.list  # no mean of an empty group


def test_the_report_flags_an_edge_and_shows_an_unfinished_tuning():
    records = [r for r in comparison_records([0.80, 0.81], [0.82, 0.83]) if r["loss"] == "siglip"]
    clip = [0.5, 0.81, 0.85, 0.90, 0.91]  # the best at the top each time, until the cap of 5 rates
    records += [record("clip", 256, {"rate_step": k, "temperature_step": 0}, 0, v) for k, v in zip(range(1, 6), clip)]
    records += [record("clip", 256, {"rate_step": 5, "temperature_step": t}, 0, 0.8) for t in (-1, 1)]
    records += [record("clip", 256, {"rate_step": 5, "temperature_step": 0}, s, v) for s, v in ((1, 0.8), (2, 0.81))]
    records += [record("siglip", 512, {"rate_step": 3, "temperature_step": 0, "bias_step": 0}, 0, 0.8)]
    hits = hits_of(records, {r["name"]: 0.8 for r in records})
    text = study.summary(records, hits, LIMITS, "epochs")
    assert "tuned at its grid's edge: CLIP rate)." in text and "| CLIP rate |" in text
    rates = "k=1: 0.500, k=2: 0.810, k=3: 0.850, k=4: 0.900, **k=5: 0.910**"
    assert f"| 256 | CLIP | {rates} | T0 0.14: 0.800, **T0 0.07: 0.910**, T0 0.035: 0.800 | - | tuned | rate |" in text
    assert "| 512 | SigLIP | **k=3: 0.800** | - | - | tuning (rate) | - |" in text
    assert "| 512 | CLIP | - | - | - | tuning (rate) | - |" in text


def test_partial_results_keep_the_committed_runs_and_write_each_arm(tmp_path):
    earlier = comparison_records([0.80, 0.81], [0.82, 0.83])
    sweep.write_results(earlier, tmp_path)
    newer = record("clip", 256, {"rate_step": 2, "temperature_step": 0}, 1, 0.7)
    hits = hits_of(earlier, {r["name"]: 0.8 for r in earlier})
    study.write_partial({newer["name"]: newer}, hits, tmp_path, LIMITS)
    written = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert len(written) == len(earlier) and written[newer["name"]]["a_to_b/R@1"] == 0.7
    assert "| 256 | k=2 (0.002), T0 0.07 |" in (tmp_path / "epoch_matched" / "summary.md").read_text()
    assert (tmp_path / "epoch_matched" / "r1_vs_batch.png").exists()
    assert "step-matched: 0 runs" in (tmp_path / "step_matched" / "summary.md").read_text()


def test_the_report_says_what_its_findings_control():
    records = comparison_records([0.80, 0.81], [0.82, 0.83])
    records += comparison_records([0.80, 0.81], [0.82, 0.83], steps=844)
    for arm, budget in (("epochs", "1,688 steps (4 epochs) at N = 256"), ("steps", "844 steps (2 epochs) at N = 256")):
        text = study.summary(records, {}, LIMITS, arm)
        assert (
            "\n## What these findings control, and what they do not\n\n- Tuned on validation, compared on test" in text
        )
        assert f"- The budget: {budget}; the cosine spans each run." in text
        assert "Both losses' initial temperatures are tuned on the same kind of grid" in text
        assert text.index("## Findings") < text.index("## What these findings") < text.index("## Test R@1")


@pytest.mark.slow
def test_the_run_loop_scores_only_the_comparisons_seeds_on_the_test_split(tmp_path, monkeypatch, capsys):
    """`study.main --quick` with training and the test split's scoring replaced: every run
    of both arms once, the tuning on validation, the seeds' checkpoints on `test[:256]`."""
    trained, scored = [], []

    def fake_grid(base, runs, out, **kwargs):
        (run,) = runs
        trained.append((run, base.eval.split))
        setting = {a: run.tags[a] for a in grid.AXES[run.tags["loss"]]}
        r1 = 0.8 + 0.01 * (run.tags["loss"] == "siglip") - 0.001 * sum(map(abs, setting.values()))
        return [{"name": run.name, **run.tags, "a_to_b/R@1": r1, "b_to_a/R@1": r1, "curves": {}}]

    def fake_hits(names, out, split):
        scored.extend((name, split) for name in names)
        rng = np.random.default_rng(len(scored))
        return {
            n: {"a_to_b": rng.random(256) < 0.8, "b_to_a": rng.random(256) < 0.8, "queries": 256} for n, _ in scored
        }

    monkeypatch.setattr(study.sweep, "run_grid", fake_grid)
    monkeypatch.setattr(study.query_hits, "cached_hits", fake_hits)
    records = study.main(["--quick", "--out", str(tmp_path)])
    assert len(records) == len(trained) == 32 and {split for _, split in trained} == {"validation[:256]"}
    seeds = [run.name for run, _ in trained if run.tags["seed"] > 0]
    assert len(seeds) == 8 and scored == [(name, "test[:256]") for name in seeds]
    assert sorted({run.tags["steps"] for run, _ in trained}) == [8, 16]
    for folder in ("epoch_matched", "step_matched"):
        assert "- At N = 64, SigLIP − CLIP in final test R@1" in (tmp_path / folder / "summary.md").read_text()
    # A second stretch reads every run back, its hits from the cache as they were, and writes
    # the report once, at the end, not after each.
    reports, scored_before = [], list(scored)
    monkeypatch.setattr(study, "write_partial", lambda *args: reports.append(args) or [])
    study.main(["--quick", "--out", str(tmp_path)])
    assert len(reports) == 1 and scored == scored_before


@pytest.mark.slow
def test_quick_tunes_compares_on_test_and_resumes_without_training(tmp_path, cmudict_data_dir, capsys):
    """~3 min on the shared 2-core machine: 16 runs of 16 steps, each compiled anew, the 4
    comparison runs scored on 256 test pairs. The step-matched arm's steps are set to the
    epoch-matched arm's (as at N = 512 in the full study), so both arms read the same runs:
    the arms' separate runs are the stubbed run loop's test above."""
    args = ["--quick", "--matched-steps", "16", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    records = study.main(args)
    assert len(records) == 16 and {r["steps"] for r in records} == {16}
    for r in records:  # validation 4 times, the last at the end: the final metrics
        curve = r["curves"]["eval/a_to_b/R@1"]
        assert [step for step, _ in curve] == [r["steps"] // 4 * i for i in (1, 2, 3, 4)]
        assert curve[-1][1] == r["a_to_b/R@1"]
    config = json.loads((tmp_path / "runs" / records[0]["name"] / "config.json").read_text())
    assert config["eval"]["split"] == "validation[:256]"  # the tuning never reads the test split
    final = json.loads((tmp_path / "final.json").read_text())
    assert sorted(final) == sorted(r["name"] for r in records if r["seed"] > 0)
    assert {entry["queries"] for entry in final.values()} == {256}
    for folder in ("epoch_matched", "step_matched"):
        text = (tmp_path / folder / "summary.md").read_text()
        assert "- At N = 64, SigLIP − CLIP in final test R@1" in text and "2 vs 2 seeds and 256 test queries" in text
        assert (tmp_path / folder / "r1_vs_batch.png").exists()
    summaries = {f: (tmp_path / f / "summary.md").read_text() for f in ("epoch_matched", "step_matched")}
    capsys.readouterr()
    for again in (args, [*args, "--hours", "0"]):
        assert json.loads(json.dumps(study.main(again))) == json.loads(json.dumps(records))
        out = capsys.readouterr().out
        assert "training" not in out and out.count("finished earlier") == 16 and "[hits]" not in out
        assert {f: (tmp_path / f / "summary.md").read_text() for f in summaries} == summaries


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-rates", "2"], "3 or more"),
        (["--seeds", "0"], "give two or more"),
        (["--steps", "10"], "pass --epochs or --matched-steps"),
    ],
)
def test_bad_options_are_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--quick", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
