"""experiments/lib/intervals.py: the t-interval over seeds and the paired bootstrap over queries."""

import math

import numpy as np
import pytest

from experiments.lib import intervals


def test_t_interval_is_students_half_width():
    # t(0.975, 2) = 4.3027 times the standard error of 3 values with sd 1
    assert intervals.t_interval([1.0, 2.0, 3.0]) == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert math.isnan(intervals.t_interval([1.0]))


def test_geometric_interval_is_the_t_interval_of_the_logs_mapped_back():
    # logs 0, ln 10, 2 ln 10: mean ln 10, sd ln 10, so 10 times and over exp(4.3027 ln 10 / sqrt 3)
    center, low, high = intervals.geometric_interval([1.0, 10.0, 100.0])
    factor = math.exp(4.3027 * math.log(10) / math.sqrt(3))
    assert (center, low, high) == pytest.approx((10.0, 10.0 / factor, 10.0 * factor), rel=1e-4)
    center, low, high = intervals.geometric_interval([7.0])
    assert center == pytest.approx(7.0) and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="positive values"):
        intervals.geometric_interval([3.0, -1.0])


def test_paired_bootstrap_matches_the_normal_interval_of_the_mean_difference():
    rng = np.random.default_rng(0)
    x = (rng.random(20_000) < 0.90).astype(float)
    y = (rng.random(20_000) < 0.88).astype(float)
    difference, low, high = intervals.paired_bootstrap(x, y)
    d = x - y
    assert difference == pytest.approx(d.mean())
    half_width = 1.96 * d.std() / math.sqrt(len(d))
    assert (high - low) / 2 == pytest.approx(half_width, rel=0.1)
    assert (difference - low) == pytest.approx(high - difference, rel=0.2)
    assert intervals.paired_bootstrap(x, y) == (difference, low, high)  # seeded


def test_paired_bootstrap_pairs_the_queries():
    # Two models right on the same hard queries, one of them also on 1% more: paired,
    # the difference is resolved; scored as two independent samples it would not be.
    rng = np.random.default_rng(1)
    y = (rng.random(10_000) < 0.9).astype(float)
    x = y.copy()
    x[np.flatnonzero(y == 0)[:100]] = 1.0
    difference, low, high = intervals.paired_bootstrap(x, y, resamples=500)
    assert difference == pytest.approx(0.01)
    assert 0.007 < low < 0.01 < high < 0.013
    unpaired = 1.96 * math.sqrt(x.var() / len(x) + y.var() / len(y))
    assert high - low < unpaired / 2
    assert intervals.paired_bootstrap(y, y) == (0.0, 0.0, 0.0)


def test_welch_interval_matches_scipys_unequal_variance_t_test():
    from scipy import stats

    x, y = [0.902, 0.905, 0.899], [0.891, 0.892, 0.8905, 0.889]
    difference, low, high = intervals.welch_interval(x, y)
    want = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    assert difference == pytest.approx(np.mean(x) - np.mean(y))
    assert (low, high) == pytest.approx((want.low, want.high), rel=1e-9)
    assert low > 0  # resolved: every x above every y, little spread
    difference, low, high = intervals.welch_interval([0.744], y)  # one seed: no interval
    assert difference == pytest.approx(0.744 - np.mean(y)) and math.isnan(low) and math.isnan(high)


def test_mean_and_interval_formats_the_t_half_width():
    assert intervals.mean_and_interval([1.0, 2.0, 3.0], decimals=2) == "2.00 ± 2.48"  # 4.3027 / sqrt(3)
    assert intervals.mean_and_interval([0.744], decimals=3) == "0.744"
    assert intervals.mean_and_interval([300.0, None]) == "-"


def test_welch_contrast_is_the_welch_interval_for_two_groups_and_reads_a_shrinking_gain():
    x, y = [0.90, 0.91, 0.93], [0.88, 0.885, 0.89]
    assert intervals.welch_contrast([x, y], [1, -1]) == intervals.welch_interval(x, y)
    # four groups of 3 with sd 0.01 each: se = 0.01 * sqrt(4 / 3), dof = 8, t(0.975, 8) = 2.3060
    groups = [[0.90, 0.91, 0.92], [0.88, 0.89, 0.90], [0.91, 0.92, 0.93], [0.90, 0.91, 0.92]]
    contrast, low, high = intervals.welch_contrast(groups, [1, -1, -1, 1])
    assert contrast == pytest.approx(0.01)
    assert (high - low) / 2 == pytest.approx(2.3060 * 0.01 * math.sqrt(4 / 3), rel=1e-4)
    assert math.isnan(intervals.welch_contrast([[1.0], [2.0, 3.0]], [1, -1])[1])


def test_verdict_follows_the_interval():
    assert intervals.verdict(0.0002, 0.0093) == intervals.verdict(-0.02, -0.01) == "resolved"
    assert intervals.verdict(-0.0126, 0.0035) == intervals.verdict(math.nan, math.nan) == "not resolved"


def test_the_ratio_of_geometric_means_against_a_hand_computed_example():
    """x = 100, 110, 121 against y = 200, 220, 242: the logs' means differ by ln 0.5, each
    side's log variance is (ln 1.1)^2, Welch's degrees of freedom 4, t = 2.776445: the
    ratio 0.5 and 0.5 exp(-+2.776445 ln(1.1) sqrt(2 / 3)) = [0.4028, 0.6206]. (Mutations,
    each red: the ratio inverted; the verdict on the bounds rather than their distance
    from 1.)"""
    ratio, low, high = intervals.ratio_interval([100.0, 110.0, 121.0], [200.0, 220.0, 242.0])
    half = 2.776445 * math.log(1.1) * math.sqrt(2 / 3)
    assert ratio == pytest.approx(0.5) and (low, high) == pytest.approx((0.5 * math.exp(-half), 0.5 * math.exp(half)))
    assert (round(low, 4), round(high, 4)) == (0.4028, 0.6206)
    assert intervals.ratio_cell([100.0, 110.0, 121.0], [200.0, 220.0, 242.0]) == "0.50 [0.40, 0.62], resolved"
    assert intervals.ratio_cell([90.0, 100.0, 110.0], [95.0, 100.0, 105.0]).endswith(", not resolved")
    assert intervals.ratio_cell([100.0], [200.0]) == "0.50 [n/a], not resolved"
