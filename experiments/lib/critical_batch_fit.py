"""The critical batch with an honest interval: McCandlish's steps-to-target curve
``S(N) = S_min (1 + B_crit / N)`` fitted over every N, its 95% interval by a bootstrap
that resamples the seeds within each N, and the estimate against the range fitted.

The fit minimises the relative residuals, ``sum_N ((S_min + E_min / N - S_N) / S_N)^2``
with ``E_min = S_min B_crit`` (linear in ``S_min`` and ``E_min``): steps span an order of
magnitude over N, and an unweighted fit would be the smallest N's alone. ``S_min <= 0``
(the steps still halving at the largest N) gives ``B_crit = inf``: not resolved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from experiments.lib import intervals

BOOTSTRAP_RESAMPLES = 2_000
# The fewest seeds at every N for an interval to speak: resampling k seeds with replacement
# gives their mean (k - 1) / k of its variance (two seeds: three distinct means, a spread
# about 0.7 of the seeds' standard error; three seeds about 0.8).
MIN_SEEDS = 3


def fit(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """`(s_min, b_crit)` of ``S(N) = S_min (1 + B_crit / N)`` through `steps` by least
    squares on relative residuals (``b_crit = inf`` where ``s_min <= 0``).

    Args:
      batch_sizes: [M] the global batches N, M >= 2 distinct.
      steps: [M] the steps to the target at each (e.g. the mean over seeds).
    """
    s_min, e_min = _coefficients(batch_sizes, steps)
    return s_min, e_min / s_min if s_min > 0 else math.inf


def _coefficients(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """`(s_min, e_min)` of ``S(N) = S_min + E_min / N`` by least squares on relative residuals."""
    n = np.asarray(batch_sizes, np.float64)
    s = np.asarray(steps, np.float64)
    design = np.column_stack([1 / s, 1 / (n * s)])  # each row divided by its S: relative residuals
    (s_min, e_min), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    return float(s_min), float(e_min)


def misses(steps_by_n: Mapping[int, Sequence[float]]) -> dict[int, tuple[float, float, float]]:
    """Where the curve fitted to the seed means (`fit`) passes outside an N's 95%
    t-interval of its seeds' steps: whether the two parameters describe every N.

    Args:
      steps_by_n: `{N: [k_N] steps to the target, one per seed}`, two or more N.

    Returns:
      `{N: (fitted S(N), the seeds' mean, the interval's half-width)}` for each N missed
      (an N with one seed has no interval and is not judged).
    """
    ns = sorted(steps_by_n)
    s_min, e_min = _coefficients(ns, [np.mean(steps_by_n[n]) for n in ns])
    missed = {}
    for n in ns:
        fitted, mean = s_min + e_min / n, float(np.mean(steps_by_n[n]))
        half_width = intervals.t_interval(steps_by_n[n])
        if abs(fitted - mean) > half_width:  # NaN (one seed): not judged
            missed[n] = (fitted, mean, half_width)
    return missed


def misses_words(steps_by_n: Mapping[int, Sequence[float]]) -> str:
    """`misses` in a sentence: each N the curve misses, its fitted steps against the
    seeds' mean ± half-width, or that it passes inside every N's interval."""
    missed = misses(steps_by_n)
    if not missed:
        return "The fitted curve passes inside every N's 95% t-interval of the seeds' steps."
    where = ", ".join(f"{n:,} ({s:.0f} against {mean:.0f} ± {half:.0f})" for n, (s, mean, half) in missed.items())
    return (
        f"The fitted curve passes outside the seeds' 95% t-interval of the steps at {len(missed)} of "
        f"{len(steps_by_n)} N, at N = {where}; two parameters do not describe those N."
    )


def bootstrap(
    steps_by_n: Mapping[int, Sequence[float]], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> dict[str, float]:
    """`fit` of the seed means and the 95% percentile interval of its ``B_crit`` over
    `resamples` draws that resample, within each N, its seeds with replacement.

    Args:
      steps_by_n: `{N: [k_N] steps to the target, one per seed}`, two or more N (an N with
        one seed adds no spread).
      resamples: bootstrap draws.
      seed: the draws' seed.

    Returns:
      `{"s_min", "b_crit", "low", "high", "seeds"}`: the estimate from the seed means,
      the interval's bounds (order statistics, so an infinite draw is kept, not
      interpolated) and the fewest seeds of any N.
    """
    ns = sorted(steps_by_n)
    rng = np.random.default_rng(seed)
    means = []
    for n in ns:
        values = np.asarray(steps_by_n[n], np.float64)
        means.append(values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1))
    draws = np.sort([fit(ns, column)[1] for column in np.column_stack(means)])
    s_min, b_crit = fit(ns, [np.mean(steps_by_n[n]) for n in ns])
    low, high = draws[int(0.025 * resamples)], draws[math.ceil(0.975 * resamples) - 1]
    seeds = min(len(steps_by_n[n]) for n in ns)
    return {"s_min": s_min, "b_crit": b_crit, "low": float(low), "high": float(high), "seeds": seeds}


def fit_ranges(
    steps_by_n: Mapping[int, Sequence[float]], starts: Sequence[int], **bootstrap_args
) -> list[dict[str, float]]:
    """`bootstrap` over the N from each of `starts` up (each start leaving two or more N):
    how much the estimate hangs on the range fitted. One dict per distinct range,
    `bootstrap`'s with `"from"` (the smallest N fitted: a start with no N of its own
    fits the range of the next N up, once) and `"points"` (the number of N) added."""
    rows = []
    for start in starts:
        kept = {n: steps for n, steps in steps_by_n.items() if n >= start}
        if len(kept) >= 2 and min(kept) not in [row["from"] for row in rows]:
            rows.append({"from": min(kept), "points": len(kept), **bootstrap(kept, **bootstrap_args)})
    return rows


def saturation(steps_by_n: Mapping[int, Sequence[float]]) -> tuple[int, dict[int, tuple[float, float, float]]]:
    """Where a larger batch stops buying steps, without a curve: each N's steps against
    the largest N's (`intervals.welch_interval` over the seeds), and the smallest N from
    which no N up to the largest takes resolved more steps than it.

    Args:
      steps_by_n: `{N: [k_N] steps to the target, one per seed}`, two or more N.

    Returns:
      `(n_saturated, {N: (mean steps at N - at the largest, low, high)})` for every N
      below the largest; `n_saturated` is the largest N itself while the N just below it
      still takes resolved more steps, or has no interval (one seed).
    """
    ns = sorted(steps_by_n)
    differences = {n: intervals.welch_interval(steps_by_n[n], steps_by_n[ns[-1]]) for n in ns[:-1]}
    saturated = ns[-1]
    for n in reversed(ns[:-1]):
        if not differences[n][1] <= 0:  # resolved more steps than the largest N (or no interval)
            break
        saturated = n
    return saturated, differences


def saturation_words(steps_by_n: Mapping[int, Sequence[float]]) -> str:
    """`saturation` in a sentence: between which N the steps stop falling, each side's
    difference from the largest N with its interval."""
    saturated, differences = saturation(steps_by_n)
    largest = max(steps_by_n)
    below = max((n for n in differences if n < saturated), default=None)

    def cell(n):
        difference, low, high = differences[n]
        return f"{difference:+.1f} [{low:+.1f}, {high:+.1f}]"

    if saturated == largest:
        return (
            f"Without a curve, the steps still fall at the largest N: {below:,} takes {cell(below)} steps "
            f"more than {largest:,} (Welch 95% over the seeds)."
        )
    tail = f"from {saturated:,} up no N takes resolved more ({saturated:,}: {cell(saturated)})"
    if below is None:
        return f"Without a curve, no N takes resolved more steps than {largest:,}: {tail}."
    return (
        f"Without a curve: {below:,} takes {cell(below)} steps more than {largest:,} (Welch 95% over the "
        f"seeds, resolved); {tail}: past N = {below:,} … {saturated:,} a larger batch buys no steps these "
        "seeds resolve."
    )


def resolved(low: float, high: float) -> bool:
    """Whether a ``B_crit`` interval pins it down: both bounds finite and positive."""
    return 0 < low and math.isfinite(high)


def has_interval(entry: Mapping[str, float]) -> bool:
    """Whether a `bootstrap` result's interval speaks: every N had `MIN_SEEDS` seeds or
    more (an entry that does not say is taken to)."""
    return entry.get("seeds", MIN_SEEDS) >= MIN_SEEDS


def b_crit_words(entry: Mapping[str, float]) -> str:
    """`"B_crit = 2,340 [1,980, 2,760] (95% bootstrap over seeds; resolved)"` for a
    `bootstrap` result; "not resolved" when `resolved` does not hold (an infinite bound
    written "inf") or `has_interval` does not (too few seeds at an N for an interval)."""
    number = lambda v: f"{v:,.0f}" if math.isfinite(v) else "inf"  # noqa: E731
    if not has_interval(entry):
        verdict = f"not resolved: an N with fewer than {MIN_SEEDS} seeds"
    else:
        verdict = "resolved" if resolved(entry["low"], entry["high"]) else "not resolved"
    return (
        f"B_crit = {number(entry['b_crit'])} [{number(entry['low'])}, {number(entry['high'])}] "
        f"(95% bootstrap over seeds; {verdict})"
    )


def ranges_agree(fits: Sequence[Mapping[str, float]]) -> bool:
    """Whether the `fit_ranges` intervals share a point: else the estimate hangs on the
    range fitted (the curve does not describe every N)."""
    return max(e["low"] for e in fits) <= min(e["high"] for e in fits)


def range_table(fits: Sequence[Mapping[str, float]]) -> str:
    """The markdown table of `fit_ranges`' rows (each start, its N and fewest seeds, and
    ``B_crit`` with its interval and verdict, `b_crit_words`) and a line saying whether
    the ranges agree (`ranges_agree`), or that they are not compared while one lacks an
    interval (`has_interval`)."""
    from experiments.lib import sweep

    rows = [[f"{e['from']:,}", e["points"], e["seeds"], b_crit_words(e)[len("B_crit = ") :]] for e in fits]
    if not all(has_interval(e) for e in fits):
        verdict = f"The ranges are not compared: an N with fewer than {MIN_SEEDS} seeds gives no interval."
    elif ranges_agree(fits):
        verdict = "The ranges' intervals share a point."
    else:
        verdict = "The ranges' intervals share no point: the estimate hangs on the range."
    return sweep.markdown_table(rows, ["fitted from N", "N fitted", "fewest seeds", "B_crit [95%]"]) + f"\n{verdict}\n"
