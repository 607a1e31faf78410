"""experiments/studies/sigmoid_vs_softmax.py: the runs' budget and starts, the tuning axes (three
steps, then the neighbour beyond an edge best, up to a cap), the walk rate -> temperature ->
bias, the comparison's seeds, the verdict words from the interval, and --quick end to end
(a rerun and --hours 0 train nothing and write the same report)."""

import json
import math

import pytest

from experiments.lib import intervals, sweep
from experiments.studies import sigmoid_vs_softmax as study

LIMITS = {"seeds": [0, 1, 2, 3], "epochs": 4.0, "train_size": 108_000, "max_rates": 5, "max_init_values": 4}


def record(loss, n, setting, seed, r1, back=None, limits=LIMITS):
    """The record of `study.limited_run(...)` whose final validation R@1 is `r1` one way
    and `back` (default `r1`) the other."""
    run = study.limited_run(loss, n, setting, seed, limits)
    return {"name": run.name, **run.tags, "a_to_b/R@1": r1, "b_to_a/R@1": r1 if back is None else back, "curves": {}}


def tuned_by(score, loss, n, limits=LIMITS):
    """Plays `study.plan` to the end with `score(setting) -> R@1` standing in for training:
    `(the runs' settings in order, the final Tuning)`."""
    records, order = [], []
    while (tuning := study.plan(records, loss, n, 0, limits)).next_run is not None:
        tags = tuning.next_run.tags
        setting = {axis: tags[axis] for axis in study.AXES[loss]}
        order.append(setting)
        records.append(record(loss, n, setting, 0, score(setting), limits=limits))
    return order, tuning


def test_every_run_of_an_n_has_the_same_epochs_and_each_loss_its_start():
    clip = study.study_run("clip", 64, {"rate_step": 0}, 0, epochs=4.0, train_size=108_000)
    assert clip.name == "clip_n64_k0_s0" and clip.tags["steps"] == 6750 and clip.tags["learning_rate"] == 1e-3
    assert clip.overrides["optim.warmup_steps"] == 422 and clip.overrides["loss.temperature"] == 0.07
    setting = {"rate_step": 4, "temperature_step": 1, "bias_step": -1}
    siglip = study.study_run("siglip", 1024, setting, 3, epochs=4.0, train_size=108_000)
    assert siglip.name == "siglip_n1024_k4_t1_b-1_s3" and siglip.tags["steps"] == 422
    assert siglip.overrides["loss.temperature"] == 0.05 and siglip.overrides["loss.siglip_bias"] == -15.0
    assert siglip.overrides["loss.name"] == "siglip" and siglip.tags["learning_rate"] == pytest.approx(4e-3)
    assert study.start_setting("siglip", 64) == {"rate_step": 0, "temperature_step": 0, "bias_step": 0}
    assert [study.start_setting("clip", n)["rate_step"] for n in study.BATCH_SIZES] == [0, 1, 2, 3, 4]


def test_an_axis_runs_three_steps_then_the_neighbour_beyond_an_edge_best_up_to_its_cap():
    assert study.next_on_axis({}, 2, 5) == 1
    assert study.next_on_axis({1: 0.8, 2: 0.81}, 2, 5) == 3
    assert study.next_on_axis({1: 0.8, 2: 0.81, 3: 0.83}, 2, 5) == 4  # best at the top edge
    assert study.next_on_axis({1: 0.85, 2: 0.81, 3: 0.83}, 2, 5) == 0  # at the bottom edge
    assert study.next_on_axis({1: 0.8, 2: 0.84, 3: 0.83}, 2, 5) is None  # inside
    assert study.next_on_axis({0: 0.7, 1: 0.8, 2: 0.81, 3: 0.83, 4: 0.86}, 2, 5) is None  # the cap
    assert study.next_on_axis({1: 0.8, 2: 0.8, 3: 0.7}, 2, 5) == 0  # a tie: the smaller step is the best
    assert study.at_edge({0: 0.7, 1: 0.8, 2: 0.81, 3: 0.83, 4: 0.86}) and not study.at_edge({2: 0.9})


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
    assert study.setting_words("siglip", tuning.setting) == "k=2 (0.002), T0 0.2, b0 0"


def test_clip_tunes_its_rate_alone_and_an_unfinished_axis_names_its_next_run():
    order, tuning = tuned_by(lambda s: 0.9 - abs(s["rate_step"] - 4), "clip", 1024)
    assert order == [{"rate_step": k} for k in (3, 4, 5)] and tuning.setting == {"rate_step": 4}
    assert not tuning.edges
    start = {"temperature_step": 0, "bias_step": 0}
    half = [record("siglip", 64, {**start, "rate_step": k}, 0, 0.8 + 0.01 * (k == 0)) for k in (-1, 0, 1)]
    tuning = study.plan(half, "siglip", 64, 0, LIMITS)
    assert tuning.next_run.name == "siglip_n64_k0_t-1_b0_s0" and not tuning.complete
    assert tuning.setting == {"rate_step": 0, "temperature_step": 0, "bias_step": 0}


def comparison_records(clip_values, siglip_values, n=256):
    """Both losses tuned at N = `n` (CLIP k = 2, SigLIP k = 3, T0 0.1, b0 -5) on seed 0, and
    their final R@1 on seeds 1, 2, ...; a stray seed run at another setting."""
    records = [record("clip", n, {"rate_step": k}, 0, 0.8 + 0.01 * (k == 2)) for k in (1, 2, 3)]
    siglip = {"temperature_step": 0, "bias_step": 0}
    records += [record("siglip", n, {**siglip, "rate_step": k}, 0, 0.8 + 0.01 * (k == 3)) for k in (1, 2, 3, 4)]
    for t in (-1, 1):
        records.append(record("siglip", n, {"rate_step": 3, "temperature_step": t, "bias_step": 0}, 0, 0.79))
    for b in (-1, 1, 2):
        records.append(
            record("siglip", n, {"rate_step": 3, "temperature_step": 0, "bias_step": b}, 0, 0.8 + 0.02 * (b == 1))
        )
    clip_best, siglip_best = {"rate_step": 2}, {"rate_step": 3, "temperature_step": 0, "bias_step": 1}
    records += [record("clip", n, clip_best, seed, v) for seed, v in enumerate(clip_values, 1)]
    records += [record("siglip", n, siglip_best, seed, v) for seed, v in enumerate(siglip_values, 1)]
    records.append(record("clip", n, {"rate_step": 1}, 1, 0.99))  # not the tuned setting: left out
    return records


def test_the_comparison_reads_the_other_seeds_at_each_losss_tuned_setting():
    found = study.comparison(comparison_records([0.80, 0.81], [0.82, 0.83]), 256, LIMITS)
    assert {loss: sorted(by_seed) for loss, by_seed in found["seeds"].items()} == {"clip": [1, 2], "siglip": [1, 2]}
    assert [study.final_r1(r) for r in found["seeds"]["clip"].values()] == [0.80, 0.81]
    assert found["tuning"]["siglip"].setting == {"rate_step": 3, "temperature_step": 0, "bias_step": 1}
    assert found["edges"] == []  # every best inside the steps it ran


@pytest.mark.parametrize(
    "clip, siglip, words",
    [
        ([0.80, 0.81, 0.805], [0.83, 0.84, 0.835], "resolved, SigLIP ahead"),
        ([0.83, 0.84, 0.835], [0.80, 0.81, 0.805], "resolved, CLIP ahead"),
        ([0.80, 0.84, 0.82], [0.81, 0.83, 0.825], "not resolved"),
        ([0.800, 0.801, 0.802], [0.803, 0.804, 0.805], "resolved, SigLIP ahead"),  # small, but tight
        ([0.80, 0.86, 0.83], [0.85, 0.87, 0.86], "not resolved"),  # large, but the seeds spread
    ],
)
def test_the_finding_quotes_its_interval_and_the_verdict_it_allows(clip, siglip, words):
    diff, low, high = intervals.welch_interval(siglip, clip)
    sentence = study.finding(256, clip, siglip, [])
    assert f"{intervals.difference_cell(diff, low, high)} (95% Welch interval, 3 vs 3 seeds; {words})." in sentence
    assert (low > 0 or high < 0) == words.startswith("resolved")
    text = study.summary(comparison_records(clip, siglip), LIMITS)
    assert f"- {sentence}\n" in text
    verdict = intervals.verdict(low, high)
    assert f"| {intervals.difference_cell(diff, low, high)} | {verdict} | - |" in text


def test_both_losses_tuned_without_a_comparison_seed_yet_have_no_row(recwarn):
    text = study.summary(comparison_records([], []), LIMITS)
    assert "No N has both losses tuned and a seed run yet." in text and "None yet" in text
    assert not recwarn.list  # no mean of an empty group


def test_the_report_flags_an_edge_and_shows_an_unfinished_tuning():
    records = [r for r in comparison_records([0.80, 0.81], [0.82, 0.83]) if r["loss"] == "siglip"]
    clip = [0.5, 0.81, 0.85, 0.90, 0.91]  # the best at the top each time, until the cap of 5 rates
    records += [record("clip", 256, {"rate_step": k}, 0, v) for k, v in zip(range(1, 6), clip)]
    records += [record("clip", 256, {"rate_step": 5}, seed, v) for seed, v in ((1, 0.80), (2, 0.81))]
    records += [record("siglip", 512, {"rate_step": 3, "temperature_step": 0, "bias_step": 0}, 0, 0.8)]
    text = study.summary(records, LIMITS)
    assert "tuned at its grid's edge: CLIP rate)." in text and "| CLIP rate |" in text
    assert (
        "| 256 | CLIP | k=1: 0.500, k=2: 0.810, k=3: 0.850, k=4: 0.900, **k=5: 0.910** | - | - | tuned | rate |" in text
    )
    assert "| 512 | SigLIP | **k=3: 0.800** | - | - | tuning (rate) | - |" in text
    assert "| 512 | CLIP | - | - | - | tuning (rate) | - |" in text


def test_partial_results_keep_the_committed_runs_not_visited_yet(tmp_path):
    earlier = comparison_records([0.80, 0.81], [0.82, 0.83])
    sweep.write_results(earlier, tmp_path)
    newer = record("clip", 256, {"rate_step": 2}, 1, 0.7)
    study.write_partial({newer["name"]: newer}, tmp_path, LIMITS)
    written = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert len(written) == len(earlier) and written[newer["name"]]["a_to_b/R@1"] == 0.7
    assert "| 256 | k=2 (0.002) |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "r1_vs_batch.png").exists()


def test_the_budget_counts_every_run_the_grid_may_take():
    assert study.run_counts(study.BATCH_SIZES, study.SEEDS, study.MAX_RATES, study.MAX_INIT_VALUES) == (100, 130)
    assert study.run_counts([64], [0, 1, 2], 3, 3) == (14, 14)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-rates", "2"], "3 or more"),
        (["--seeds", "0"], "give two or more"),
        (["--steps", "10"], "pass --epochs"),
    ],
)
def test_bad_options_are_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--quick", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_quick_tunes_compares_and_resumes_without_training(tmp_path, cmudict_data_dir, capsys):
    """~2 min on the shared 2-core machine: 14 runs of 16 steps, each compiled anew."""
    args = ["--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    records = study.main(args)
    assert len(records) == 14 and all(r["steps"] == 16 for r in records)
    for r in records:  # validation 4 times, the last at the end: the final metrics
        curve = r["curves"]["eval/a_to_b/R@1"]
        assert [step for step, _ in curve] == [4, 8, 12, 16] and curve[-1][1] == r["a_to_b/R@1"]
    limits = {k: study.QUICK[k] for k in LIMITS}
    found = study.comparison(records, 64, limits)
    assert all(t.complete for t in found["tuning"].values())
    assert {loss: sorted(s) for loss, s in found["seeds"].items()} == {"clip": [1, 2], "siglip": [1, 2]}
    summary = (tmp_path / "summary.md").read_text()
    assert "- At N = 64, SigLIP − CLIP in final validation R@1" in summary and "2 vs 2 seeds" in summary
    assert (tmp_path / "r1_vs_batch.png").exists()
    assert len(json.loads((tmp_path / "results.json").read_text())) == 14
    capsys.readouterr()
    for again in (args, [*args, "--hours", "0"]):
        assert json.loads(json.dumps(study.main(again))) == json.loads(json.dumps(records))
        out = capsys.readouterr().out
        assert "training" not in out and out.count("finished earlier") == 14
        assert (tmp_path / "summary.md").read_text() == summary


def test_the_report_says_what_its_findings_do_not_control():
    text = study.summary(comparison_records([0.80, 0.81], [0.82, 0.83]), LIMITS)
    steps = math.ceil(LIMITS["epochs"] * LIMITS["train_size"] / 256)
    assert "\n## What these findings do not control\n\n- Tuned and compared on the same validation split" in text
    temperature = "- CLIP's temperature is learned from 0.07 and not tuned; SigLIP's initial temperature and bias are."
    assert temperature + "\n" in text
    assert f"a larger N takes fewer steps ({steps:,} at N = 256): how each loss's R@1 moves with N" in text
    assert text.index("## Findings") < text.index("## What these findings") < text.index("## Final validation")
