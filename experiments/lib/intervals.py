"""The studies' intervals: over seeds (Student's t; Welch's for the difference of two
methods' seed means, and on the logarithms for the ratio of their geometric means) and
over test queries (a paired bootstrap: two models scored on the same queries, the
queries resampled together)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2_000


def t_interval(values: Sequence[float]) -> float:
    """The half-width of the 95% t-interval of the mean of `values` (NaN for one value)."""
    from scipy import stats

    if len(values) < 2:
        return math.nan
    return float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))


def geometric_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """`(geometric mean, low, high)` of positive `values` with the 95% t-interval of the
    mean of their logarithms, mapped back (for a scale that varies by factors, such as a
    noise scale over runs); the bounds are NaN for one value.

    Args:
      values: [k] positive values, one per independent unit (run, seed).
    """
    if min(values) <= 0:
        raise ValueError(f"a geometric mean needs positive values, got {list(values)}.")
    logs = np.log(np.asarray(values, np.float64))
    center, half = float(np.mean(logs)), t_interval(list(logs))
    return math.exp(center), math.exp(center - half), math.exp(center + half)


def mean_and_interval(values: Sequence[float | None], decimals: int = 0) -> str:
    """`"mean ± the 95% t-interval's half-width"` of seeds' values to `decimals` (the mean
    alone for one value; `-` when one is None: a seed missed a target)."""
    if not values or None in values:
        return "-"
    mean = f"{np.mean(values):.{decimals}f}"
    return mean + (f" ± {t_interval(values):.{decimals}f}" if len(values) > 1 else "")


def difference_cell(difference: float, low: float, high: float) -> str:
    """`"+0.0073 [+0.0042, +0.0105]"`: a difference and its interval, to 4 decimals
    (`"[n/a]"` for NaN bounds: one seed)."""
    return f"{difference:+.4f} " + ("[n/a]" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]")


def welch_interval(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """The difference of two means over independent seeds and its 95% Welch interval
    (unequal variances, Welch–Satterthwaite degrees of freedom).

    Args:
      x: [n] one method's final metric, one value per seed.
      y: [m] the other's.

    Returns:
      `(mean(x) - mean(y), low, high)`; the bounds are NaN when either side has one value.
    """
    return welch_contrast([x, y], [1.0, -1.0])


def welch_contrast(groups: Sequence[Sequence[float]], weights: Sequence[float]) -> tuple[float, float, float]:
    """A weighted sum of independent groups' means and its 95% Welch interval (each
    group's variance its own, Welch–Satterthwaite degrees of freedom): e.g. weights
    `[1, -1, -1, 1]` on (A at 256, CLIP at 256, A at 1,024, CLIP at 1,024) is how much A's
    gain over CLIP shrinks from 256 to 1,024.

    Args:
      groups: G groups of per-seed values, [n_g] each.
      weights: [G] the contrast's weights.

    Returns:
      `(contrast, low, high)`; the bounds are NaN when a group has one value.
    """
    from scipy import stats

    groups = [np.asarray(g, np.float64) for g in groups]
    contrast = float(sum(w * g.mean() for w, g in zip(weights, groups, strict=True)))
    if min(len(g) for g in groups) < 2:
        return contrast, math.nan, math.nan
    variances = [w**2 * g.var(ddof=1) / len(g) for w, g in zip(weights, groups, strict=True)]
    if sum(variances) == 0:
        return contrast, contrast, contrast
    dof = sum(variances) ** 2 / sum(v**2 / (len(g) - 1) for v, g in zip(variances, groups, strict=True))
    half_width = float(stats.t.ppf(0.975, dof) * math.sqrt(sum(variances)))
    return contrast, contrast - half_width, contrast + half_width


def verdict(low: float, high: float) -> str:
    """`"resolved"` when a difference's 95% interval `[low, high]` leaves out 0, else
    `"not resolved"` (NaN bounds, one seed, included)."""
    return "resolved" if low > 0 or high < 0 else "not resolved"


def ratio_interval(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """`(ratio, low, high)`: the geometric mean of `x` over that of `y` (independent seeds)
    with the 95% Welch interval of the difference of their mean logarithms, mapped back
    (NaN bounds when either side has one value)."""
    difference, low, high = welch_interval(np.log(x), np.log(y))
    return math.exp(difference), math.exp(low), math.exp(high)


def ratio_cell(x: Sequence[float], y: Sequence[float]) -> str:
    """`"0.82 [0.75, 0.90], resolved"`: `ratio_interval` and its verdict (leaves out 1)."""
    ratio, low, high = ratio_interval(x, y)
    bounds = "[n/a]" if math.isnan(low) else f"[{low:.2f}, {high:.2f}]"
    return f"{ratio:.2f} {bounds}, {verdict(low - 1, high - 1)}"


def paired_bootstrap(
    x: np.ndarray, y: np.ndarray, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float, float]:
    """The mean of `x - y` and its 95% percentile-bootstrap interval, the queries resampled
    in pairs.

    Args:
      x: [n] a per-query score of one model (e.g. 1 where its R@1 is right, or the mean
        of that over its seeds).
      y: [n] the other model's on the same queries.
      resamples: bootstrap resamples of the n queries.
      seed: the resampling's seed.

    Returns:
      `(difference, low, high)`: mean(x - y) and the 2.5% and 97.5% quantiles of the
      resampled means.
    """
    difference = np.asarray(x, np.float64) - np.asarray(y, np.float64)
    rng = np.random.default_rng(seed)
    means = np.concatenate(
        [
            difference[rng.integers(0, len(difference), (count, len(difference)))].mean(axis=1)
            for count in np.diff(np.r_[0:resamples:100, resamples])  # 100 resamples at a time
        ]
    )
    low, high = np.quantile(means, [0.025, 0.975])
    return float(difference.mean()), float(low), float(high)
