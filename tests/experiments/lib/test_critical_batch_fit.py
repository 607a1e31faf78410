"""experiments/lib/critical_batch_fit.py: McCandlish's curve recovered from known steps, its
bootstrap interval covering a known B_crit, the fit-range table, the words."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.lib import critical_batch_fit as fit
from experiments.lib import intervals

NS = (256, 512, 1024, 2048, 4096, 8192, 16384)
S_MIN, B_CRIT = 40.0, 2000.0


def curve(ns=NS):
    return [S_MIN * (1 + B_CRIT / n) for n in ns]


def noisy_seeds(rng, relative=0.05, seeds=3):
    """Three seeds per N: the true curve times independent log-normal noise."""
    return {n: list(s * np.exp(relative * rng.standard_normal(seeds))) for n, s in zip(NS, curve(), strict=True)}


def test_fit_recovers_a_known_curve_and_weighs_residuals_relatively():
    assert fit.fit(NS, curve()) == pytest.approx((S_MIN, B_CRIT), rel=1e-9)
    # 10% off at the smallest N (360 steps off 3,165): the relative fit moves B_crit
    # little; an unweighted one would chase that point alone
    steps = curve()
    steps[0] *= 1.1
    assert fit.fit(NS, steps)[1] == pytest.approx(B_CRIT, rel=0.1)


def test_steps_still_halving_at_the_largest_n_give_an_infinite_b_crit():
    s_min, b_crit = fit.fit(NS, [400_000 / n - 5 for n in NS])
    assert s_min < 0 and b_crit == math.inf


def test_bootstrap_without_noise_is_the_point():
    entry = fit.bootstrap({n: [s, s, s] for n, s in zip(NS, curve(), strict=True)}, resamples=200)
    assert entry["b_crit"] == entry["low"] == entry["high"] == pytest.approx(B_CRIT)
    assert entry["seeds"] == 3


def test_bootstrap_interval_covers_a_known_b_crit():
    rng = np.random.default_rng(1)
    entry = fit.bootstrap(noisy_seeds(rng))
    assert entry["low"] < B_CRIT < entry["high"] and entry["high"] / entry["low"] < 1.2
    # over 40 synthetic studies it covers the truth in most (3 seeds per N: a percentile
    # bootstrap under-covers a little; 91 of 100 by hand), and its width follows the noise
    covered = [
        (e := fit.bootstrap(noisy_seeds(rng), resamples=400, seed=i))["low"] < B_CRIT < e["high"] for i in range(40)
    ]
    assert np.mean(covered) >= 0.75
    quiet = fit.bootstrap(noisy_seeds(rng, relative=0.005))
    assert quiet["high"] - quiet["low"] < (entry["high"] - entry["low"]) / 4


def test_fit_ranges_refit_from_each_start_with_two_or_more_n():
    rows = fit.fit_ranges(noisy_seeds(np.random.default_rng(1)), [256, 1024, 8192, 16384], resamples=100)
    assert [(r["from"], r["points"]) for r in rows] == [(256, 7), (1024, 5), (8192, 2)]
    assert all(r["low"] <= r["high"] for r in rows)
    without_256 = {n: steps for n, steps in noisy_seeds(np.random.default_rng(1)).items() if n > 256}
    rows = fit.fit_ranges(without_256, [256, 512, 1024], resamples=100)  # 256 missed the target: once from 512
    assert [(r["from"], r["points"]) for r in rows] == [(512, 6), (1024, 5)]


def test_misses_name_the_n_the_curve_passes_outside_of_and_only_those():
    spread = {n: [s * 0.85, s, s * 1.15] for n, s in zip(NS, curve(), strict=True)}  # means on the curve
    assert fit.misses(spread) == {}
    assert fit.misses_words(spread) == "The fitted curve passes inside every N's 95% t-interval of the seeds' steps."
    # two N off the curve with tight seeds, one above and one below (each about 3 half-widths
    # off the refitted curve, the others within 0.4), and one seed far off: not judged
    tight = lambda n, factor: [curve([n])[0] * factor * x for x in (0.98, 1, 1.02)]  # noqa: E731
    bent = spread | {512: tight(512, 1.3), 16384: tight(16384, 0.75), 4096: [curve([4096])[0] * 2]}
    missed = fit.misses(bent)
    assert sorted(missed) == [512, 16384]
    s_min, e_min = fit._coefficients(NS, [np.mean(bent[n]) for n in NS])
    fitted, mean, half_width = missed[16384]
    assert fitted == pytest.approx(s_min + e_min / 16384) and mean == pytest.approx(0.75 * curve([16384])[0])
    assert half_width == pytest.approx(intervals.t_interval(bent[16384]))
    words = fit.misses_words(bent)
    head = "The fitted curve passes outside the seeds' 95% t-interval of the steps at 2 of 7 N, at N = 512 ("
    assert words.startswith(head)
    tail = f"16,384 ({fitted:.0f} against {mean:.0f} ± {half_width:.0f}); two parameters do not describe those N."
    assert words.endswith(tail)


def test_saturation_is_the_smallest_n_from_which_none_takes_resolved_more_steps_than_the_largest():
    seeds = lambda mean: [mean - 2.0, mean, mean + 2.0]  # noqa: E731  (sd 2 at every N)
    steps = {512: seeds(400), 1024: seeds(200), 2048: seeds(110), 4096: seeds(92), 8192: seeds(93), 16384: seeds(90)}
    saturated, differences = fit.saturation(steps)
    assert saturated == 4096  # 2,048 is 20 above 16,384 (resolved); 4,096 and 8,192 are 2 and 3 (not)
    assert sorted(differences) == [512, 1024, 2048, 4096, 8192]
    assert differences[2048] == pytest.approx(intervals.welch_interval(steps[2048], steps[16384]))
    words = fit.saturation_words(steps)
    low, high = differences[2048][1:]
    assert words.startswith(f"Without a curve: 2,048 takes +20.0 [{low:+.1f}, {high:+.1f}] steps more than 16,384")
    assert words.endswith("past N = 2,048 … 4,096 a larger batch buys no steps these seeds resolve.")
    # a resolved gap above an unresolved one ends the walk down: 8,192 still slower than 16,384
    assert fit.saturation(steps | {8192: seeds(100)})[0] == 16384
    assert fit.saturation_words(steps | {8192: seeds(100)}).startswith(
        "Without a curve, the steps still fall at the largest N: 8,192 takes +10.0 ["
    )
    assert fit.saturation(steps | {4096: [92.0]})[0] == 8192  # one seed: no interval, the walk stops there
    flat = {n: seeds(90) for n in steps}
    assert fit.saturation(flat)[0] == 512
    assert fit.saturation_words(flat).startswith(
        "Without a curve, no N takes resolved more steps than 16,384: from 512"
    )


def test_words_follow_the_interval():
    ends = {"smallest": 512, "largest": 16384}
    inside = {"b_crit": 2340.4, "low": 1980.0, "high": 2760.2} | ends
    words = "B_crit = 2,340 [1,980, 2,760] (95% bootstrap over seeds and misfit; resolved: inside N = 512 … 16,384)"
    assert fit.b_crit_words(inside) == words
    open_ended = dict(inside, low=3000.0, high=math.inf)
    assert fit.b_crit_words(open_ended).endswith("[3,000, inf] (95% bootstrap over seeds and misfit; not resolved: "
                                                 "not inside N = 512 … 16,384)")  # fmt: skip
    # one meaning: the interval leaves out both ends of the N fitted, not merely 0 and inf
    assert fit.resolved(inside) and not fit.resolved(dict(inside, low=400.0))
    assert not fit.resolved(dict(inside, high=16384.0)) and not fit.resolved(dict(inside, low=512.0))
    one_seed = {"b_crit": 1900.0, "low": 1900.0, "high": 1900.0, "seeds": 1} | ends  # no spread: no interval
    assert fit.b_crit_words(one_seed) == "B_crit = 1,900 (no interval: an N with fewer than 3 seeds)"
    assert fit.b_crit_words(dict(inside, seeds=2)) == "B_crit = 2,340 (no interval: an N with fewer than 3 seeds)"
    assert fit.b_crit_words(dict(inside, seeds=3)).endswith("; resolved: inside N = 512 … 16,384)")


def test_the_range_table_says_whether_the_ranges_agree():
    ends = {"largest": 16384}
    agree = [{"from": 256, "points": 7, "seeds": 3, "b_crit": 2000.0, "low": 1800.0, "high": 2300.0, "smallest": 256},
             {"from": 1024, "points": 5, "seeds": 3, "b_crit": 2200.0, "low": 1700.0, "high": 2900.0,
              "smallest": 1024}]  # fmt: skip
    agree = [e | ends for e in agree]
    text = fit.range_table(agree)
    row = "| 1,024 | 5 | 3 | 2,200 [1,700, 2,900] (95% bootstrap over seeds and misfit; resolved: inside N = 1,024 … "
    assert row + "16,384) |" in text
    assert text.endswith("The ranges' intervals share a point.\n")
    hangs = [agree[0], dict(agree[1], low=2400.0)]
    assert not fit.ranges_agree(hangs) and "hangs on the range" in fit.range_table(hangs)
    two_seeds = [agree[0], dict(agree[1], seeds=2, low=2400.0)]
    assert fit.range_table(two_seeds).endswith("not compared: an N with fewer than 3 seeds gives no interval.\n")


def seeds_about(means, relative, rng, seeds=3):
    """`{N: [seeds] steps}`: each N's `means` times independent log-normal seed noise."""
    return {n: list(m * np.exp(relative * rng.standard_normal(seeds))) for n, m in zip(NS, means, strict=True)}


def test_lack_of_fit_is_the_chi2_of_the_curve_against_the_seeds_errors():
    rng = np.random.default_rng(3)
    bent = seeds_about([s * b for s, b in zip(curve(), (1.2, 0.9, 1.0, 1.1, 0.85, 1.0, 1.1), strict=True)], 0.02, rng)
    means = np.array([np.mean(bent[n]) for n in NS])
    errors = np.array([np.std(bent[n], ddof=1) / math.sqrt(3) for n in NS])
    # golden: the inverse-variance fit's chi^2 is the weighted polynomial fit's in 1/N (numpy's, another route)
    line = np.polyfit(1 / np.array(NS, float), means, 1, w=1 / errors)
    golden = float(np.sum(((means - np.polyval(line, 1 / np.array(NS, float))) / errors) ** 2))
    inverse_variance = fit.weightings(bent)["inverse variance (1 / se²)"]
    measured = fit.lack_of_fit(bent, inverse_variance)
    assert measured["chi2"] == pytest.approx(golden, rel=1e-9) and measured["dof"] == 5
    assert measured["p"] == pytest.approx(stats.chi2.sf(golden, 5))
    # the relative fit's chi^2 is no smaller than the smallest a curve of this form reaches
    quoted = fit.lack_of_fit(bent)
    assert quoted["chi2"] >= measured["chi2"] and quoted["p"] < 1e-6
    # tau brings the chi^2 with the between-N spread added to its degrees of freedom
    s_min, e_min = fit._coefficients(NS, means)
    r = (means - s_min - e_min / np.array(NS)) / means
    assert np.sum(r**2 / ((errors / means) ** 2 + quoted["between"] ** 2)) == pytest.approx(5)
    # four N: 2 degrees of freedom, where chi^2's tail is exp(-x / 2)
    four = {n: bent[n] for n in NS[:4]}
    assert fit.lack_of_fit(four)["p"] == pytest.approx(math.exp(-fit.lack_of_fit(four)["chi2"] / 2))
    # on the curve within the seeds' noise: no between-N spread
    assert fit.lack_of_fit({n: [s * 0.99, s, s * 1.01] for n, s in zip(NS, curve(), strict=True)})["between"] == 0
    assert math.isnan(fit.lack_of_fit(bent | {512: [300.0]})["p"])  # one seed: no error to judge by


def test_the_between_n_spread_recovers_a_known_one():
    ns = np.geomspace(256, 65536, 40)
    rng = np.random.default_rng(5)
    steps = {n: list(S_MIN * (1 + B_CRIT / n) * np.exp(0.2 * rng.standard_normal()) * np.exp(
        0.005 * rng.standard_normal(3))) for n in ns}  # fmt: skip
    assert fit.lack_of_fit(steps)["between"] == pytest.approx(0.2, abs=0.06)


def test_the_interval_carries_the_misfit_and_covers_the_truth_where_the_seeds_alone_do_not():
    rng = np.random.default_rng(7)
    # on the curve, seed noise only: the interval covers the truth, about the seeds-only one
    on_curve = [fit.bootstrap(seeds_about(curve(), 0.05, rng), resamples=400, seed=i) for i in range(30)]
    assert np.mean([e["low"] < B_CRIT < e["high"] for e in on_curve]) >= 0.8
    widths = [(e["high"] - e["low"]) / (e["seeds_high"] - e["seeds_low"]) for e in on_curve]
    assert 1 <= np.median(widths) < 2
    # each N bent off the curve by 15% (log-normal), tight seeds: chi^2 large, the seeds'
    # interval too narrow to hold the truth, the misfit's wide enough
    bent = []
    for i in range(30):
        means = [s * math.exp(0.15 * rng.standard_normal()) for s in curve()]
        bent.append(fit.bootstrap(seeds_about(means, 0.01, rng), resamples=400, seed=i))
    assert np.median([e["p"] for e in bent]) < 1e-6
    assert np.median([(e["high"] - e["low"]) / (e["seeds_high"] - e["seeds_low"]) for e in bent]) > 3
    assert np.mean([e["seeds_low"] < B_CRIT < e["seeds_high"] for e in bent]) < 0.5
    assert np.mean([e["low"] < B_CRIT < e["high"] for e in bent]) >= 0.8


def test_the_weighting_table_refits_each_weighting_and_each_n_left_out():
    exact = {n: [s * 0.97, s, s * 1.03] for n, s in zip(NS, curve(), strict=True)}  # means on the curve
    for name, fitter in fit.weightings(exact).items():
        assert fit._curve(*fitter(NS, [np.mean(exact[n]) for n in NS]))[1] == pytest.approx(B_CRIT, rel=1e-6), name
    text = fit.weighting_table(exact, resamples=50)
    assert text.count("\n| ") == 4 + 7  # four weightings, each of the 7 N left out
    assert "| N = 256 left out | 6 | 2,000 [" in text and "(resolved: inside N = 512 … 16,384) | 0 (4) |" in text
    assert "| unweighted | 7 | 2,000 [" in text
    # unweighted chases the smallest N: 10% off there moves it more than the relative fit
    steps = curve()
    steps[0] *= 1.1
    unweighted = fit.weightings(exact)["unweighted"]
    relative_shift = abs(fit.fit(NS, steps)[1] - B_CRIT)
    assert abs(fit._curve(*unweighted(NS, steps))[1] - B_CRIT) > 2 * relative_shift
    assert fit._curve(*fit._log_coefficients(NS, curve()))[1] == pytest.approx(B_CRIT, rel=1e-6)
    two_seeds = {n: steps[:2] for n, steps in exact.items()}
    assert fit.weighting_table(two_seeds) == "Not tabled: an N with fewer than 3 seeds gives no interval.\n"


def test_halving_words_test_s_n_against_r_times_the_next_n():
    """Each N against the next, r = N' / N times larger: S_N - r S_N' with Welch's
    interval (512 -> 1,024: r = 2; 2,048 -> 8,192: r = 4); nothing with one N. (Mutation:
    r = 2 whatever the step, red.)"""
    seeds = lambda mean: [mean - 3.0, mean, mean + 3.0]  # noqa: E731
    steps = {512: seeds(500), 1024: seeds(200), 2048: seeds(100), 8192: seeds(20)}
    words = fit.halving_words(steps)
    contrast, low, high = intervals.welch_contrast([steps[512], steps[1024]], [1.0, -2.0])
    assert contrast == pytest.approx(100)
    assert f"512 → 1,024 +100 [{low:+.0f}, {high:+.0f}], resolved; 1,024 → 2,048 +0 [" in words
    contrast, low, high = intervals.welch_contrast([steps[2048], steps[8192]], [1.0, -4.0])
    assert contrast == pytest.approx(20) and f"2,048 → 8,192 +20 [{low:+.0f}, {high:+.0f}], " in words
    assert fit.halving_words({512: seeds(500)}) == ""
    assert "512 → 2,048 +100 (no interval: one seed)." in fit.halving_words({512: [500.0], 2048: [100.0]})
