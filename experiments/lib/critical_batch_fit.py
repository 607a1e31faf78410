"""The critical batch with an honest interval: McCandlish's steps-to-target curve
``S(N) = S_min (1 + B_crit / N)`` fitted over every N, its 95% interval by a bootstrap
that carries both the seeds' spread and the curve's own misfit, and the estimate against
the range fitted, the weighting and each N left out.

The fit minimises the relative residuals, ``sum_N ((S_min + E_min / N - S_N) / S_N)^2``
with ``E_min = S_min B_crit`` (linear in ``S_min`` and ``E_min``): steps span an order of
magnitude over N, and an unweighted fit would be the smallest N's alone. ``S_min <= 0``
(the steps still halving at the largest N) gives ``B_crit = inf``.

The interval (`bootstrap`): the lack of fit is ``chi^2 = sum_N ((mean_N - fitted_N) /
se_N)^2`` on M - 2 degrees of freedom (``se_N`` the seeds' standard error of the mean);
a between-N relative spread ``tau`` is the one that brings it to its degrees of freedom
(``sum_N r_N^2 / (s_N^2 + tau^2) = M - 2``, r and s relative to the mean; 0 when the
curve fits, Paule and Mandel's estimator); each draw resamples the seeds within each N
and multiplies each N's mean by ``1 + tau z_N``, ``z_N`` standard normal. With ``tau = 0``
the draws are the seeds-only bootstrap's (kept beside it as ``seeds_low, seeds_high``).

"Resolved" for B_crit (`resolved`): its 95% interval, the misfit included, lies strictly
inside the N fitted, so it leaves out both nulls, "every N fitted is past the knee"
(B_crit at or below the smallest N) and "no knee within the N fitted" (at or above the
largest).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

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
    return _curve(*_coefficients(batch_sizes, steps))


def _curve(s_min: float, e_min: float) -> tuple[float, float]:
    """`(s_min, b_crit)` from ``S_min + E_min / N``'s coefficients (inf where ``s_min <= 0``)."""
    return s_min, e_min / s_min if s_min > 0 else math.inf


def _coefficients(
    batch_sizes: Sequence[float], steps: Sequence[float], weights: Sequence[float] | None = None
) -> tuple[float, float]:
    """`(s_min, e_min)` of ``S(N) = S_min + E_min / N`` by least squares, each residual
    times its weight (default ``1 / S_N``: relative residuals)."""
    n = np.asarray(batch_sizes, np.float64)
    s = np.asarray(steps, np.float64)
    w = 1 / s if weights is None else np.asarray(weights, np.float64)
    target = np.ones_like(s) if weights is None else w * s  # S_N / S_N is 1 exactly
    (s_min, e_min), *_ = np.linalg.lstsq(np.column_stack([w, w / n]), target, rcond=None)
    return float(s_min), float(e_min)


def _log_coefficients(batch_sizes: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """`_coefficients` on log residuals, ``sum_N (log S(N) - log S_N)^2``, both kept
    positive (started from the relative fit's)."""
    from scipy import optimize

    n, s = np.asarray(batch_sizes, np.float64), np.asarray(steps, np.float64)
    start = np.log(np.maximum(_coefficients(n, s), 1e-6 * s.min()))
    residuals = lambda p: np.log(np.exp(p[0]) + np.exp(p[1]) / n) - np.log(s)  # noqa: E731
    s_min, e_min = np.exp(optimize.least_squares(residuals, start).x)
    return float(s_min), float(e_min)


def weightings(steps_by_n: Mapping[int, Sequence[float]]) -> dict[str, Callable]:
    """The fits of the weighting table, each `(batch_sizes, steps) -> (s_min, e_min)`:
    relative residuals (`fit`'s, the one quoted), inverse variance (each N's residual over
    its seeds' standard error of the mean, fixed from `steps_by_n`: the smallest chi^2 a
    curve of this form reaches), unweighted, and log residuals."""
    errors = np.array([_standard_error(steps_by_n[n]) for n in sorted(steps_by_n)])
    return {
        "relative residuals (quoted)": _coefficients,
        "inverse variance (1 / se²)": lambda ns, s: _coefficients(ns, s, 1 / errors),
        "unweighted": lambda ns, s: _coefficients(ns, s, np.ones(len(s))),
        "log residuals": _log_coefficients,
    }


def _standard_error(values: Sequence[float]) -> float:
    """The seeds' standard error of their mean (NaN for one seed)."""
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def lack_of_fit(steps_by_n: Mapping[int, Sequence[float]], fitter: Callable = _coefficients) -> dict[str, float]:
    """How far the curve `fitter` (`weightings`' form) draws through the seed means misses
    them, against the seeds' own errors: `{"chi2", "dof", "p", "between"}`, ``chi^2 =
    sum_N ((mean_N - S(N)) / se_N)^2`` on M - 2 degrees of freedom, its upper-tail p-value
    (NaN with no degree of freedom or an N with one seed), and the between-N relative
    spread ``tau`` that brings ``sum_N r_N^2 / (s_N^2 + tau^2)`` to M - 2 (r_N, s_N: the
    residual and the standard error over the mean; 0 where chi^2 <= M - 2 or p is NaN)."""
    from scipy import optimize, stats

    ns = sorted(steps_by_n)
    means = np.array([np.mean(steps_by_n[n]) for n in ns])
    s_min, e_min = fitter(ns, means)
    r = (means - s_min - e_min / np.asarray(ns, np.float64)) / means
    r[np.abs(r) < 1e-12] = 0.0  # the fit's rounding, not a miss
    s = np.array([_standard_error(steps_by_n[n]) for n in ns]) / means
    dof = len(ns) - 2
    with np.errstate(divide="ignore", invalid="ignore"):
        chi2 = float(np.sum(np.where(r == 0, 0.0, r**2 / s**2)))  # 0 where on the curve, even with se 0
    if dof < 1 or not np.isfinite(s).all():
        return {"chi2": chi2, "dof": dof, "p": math.nan, "between": 0.0}
    between = 0.0
    if chi2 > dof:
        excess = lambda t2: float(np.sum(r**2 / (s**2 + t2))) - dof  # noqa: E731  (falls as t2 grows)
        high = float(np.sum(r**2)) / dof  # here sum r^2 / (s^2 + t2) <= dof
        between = math.sqrt(optimize.brentq(excess, 1e-12 * high, high))
    return {"chi2": chi2, "dof": dof, "p": float(stats.chi2.sf(chi2, dof)), "between": between}


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
    steps_by_n: Mapping[int, Sequence[float]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    fitter: Callable = _coefficients,
) -> dict[str, float]:
    """`fit` (or `fitter`, `weightings`' form) of the seed means and the 95% percentile
    interval of its ``B_crit`` over `resamples` draws that resample, within each N, its
    seeds with replacement and multiply each N's mean by ``1 + tau z_N`` (``tau``:
    `lack_of_fit`'s between-N spread, ``z_N`` standard normal): the seeds' spread and the
    curve's misfit both.

    Args:
      steps_by_n: `{N: [k_N] steps to the target, one per seed}`, two or more N (an N with
        one seed adds no spread).
      resamples: bootstrap draws.
      seed: the draws' seed.
      fitter: `(batch_sizes, steps) -> (s_min, e_min)`.

    Returns:
      `{"s_min", "b_crit", "low", "high", "seeds_low", "seeds_high", "seeds", "smallest",
      "largest"}` and `lack_of_fit`'s keys: the estimate from the seed means, the
      interval's bounds with the misfit and with the seeds alone (order statistics, so
      an infinite draw is kept, not interpolated), the fewest seeds of any N and the N
      fitted's ends.
    """
    ns = sorted(steps_by_n)
    rng = np.random.default_rng(seed)
    means = []
    for n in ns:
        values = np.asarray(steps_by_n[n], np.float64)
        means.append(values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1))
    means = np.column_stack(means)
    misfit = lack_of_fit(steps_by_n, fitter)
    spread = 1 + misfit["between"] * rng.standard_normal(means.shape)
    entry = dict(zip(("s_min", "b_crit"), _curve(*fitter(ns, [np.mean(steps_by_n[n]) for n in ns])), strict=True))
    for prefix, draws in (("seeds_", means), ("", means * spread)):
        b_crits = np.sort([_curve(*fitter(ns, row))[1] for row in draws])
        entry[prefix + "low"] = float(b_crits[int(0.025 * resamples)])
        entry[prefix + "high"] = float(b_crits[math.ceil(0.975 * resamples) - 1])
    seeds = min(len(steps_by_n[n]) for n in ns)
    return entry | misfit | {"seeds": seeds, "smallest": ns[0], "largest": ns[-1]}


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


def resolved(entry: Mapping[str, float]) -> bool:
    """Whether a `bootstrap` result's ``B_crit`` is resolved: its 95% interval lies
    strictly inside the N fitted (``smallest < low`` and ``high < largest``), leaving out
    "every N fitted is past the knee" and "no knee within the N fitted"."""
    return entry["smallest"] < entry["low"] and entry["high"] < entry["largest"]


def has_interval(entry: Mapping[str, float]) -> bool:
    """Whether a `bootstrap` result's interval speaks: every N had `MIN_SEEDS` seeds or
    more (an entry that does not say is taken to)."""
    return entry.get("seeds", MIN_SEEDS) >= MIN_SEEDS


def _number(value: float) -> str:
    """`"2,340"`, or `"inf"`."""
    return f"{value:,.0f}" if math.isfinite(value) else "inf"


def b_crit_words(entry: Mapping[str, float]) -> str:
    """`"B_crit = 2,340 [1,980, 2,760] (95% bootstrap over seeds and misfit; resolved:
    inside N = 512 … 16,384)"` for a `bootstrap` result; "not resolved" when `resolved`
    does not hold (an infinite bound written "inf"); no interval where `has_interval`
    does not (too few seeds at an N for one)."""
    if not has_interval(entry):
        return f"B_crit = {_number(entry['b_crit'])} (no interval: an N with fewer than {MIN_SEEDS} seeds)"
    inside = f"inside N = {entry['smallest']:,} … {entry['largest']:,}"
    verdict = f"resolved: {inside}" if resolved(entry) else f"not resolved: not {inside}"
    return (
        f"B_crit = {_number(entry['b_crit'])} [{_number(entry['low'])}, {_number(entry['high'])}] "
        f"(95% bootstrap over seeds and misfit; {verdict})"
    )


def lack_of_fit_words(entry: Mapping[str, float]) -> str:
    """`bootstrap`'s lack of fit in a sentence: chi^2, its degrees of freedom and p, the
    between-N spread the interval carries, and the seeds-only interval beside it (none
    where `has_interval` does not hold)."""
    seeds_only = f"the seeds alone give [{_number(entry['seeds_low'])}, {_number(entry['seeds_high'])}]"
    if math.isnan(entry["p"]):
        return "Lack of fit not measured (no degree of freedom, or an N with one seed)" + (
            f"; {seeds_only}." if has_interval(entry) else "."
        )
    return (
        f"Lack of fit: χ² = {entry['chi2']:,.0f} on {entry['dof']} degrees of freedom (p = {entry['p']:.1e}) "
        f"against the seeds' standard errors; the interval carries a between-N spread of "
        f"{100 * entry['between']:.1f}% of each N's steps ({seeds_only})."
    )


def weighting_table(steps_by_n: Mapping[int, Sequence[float]], **bootstrap_args) -> str:
    """The markdown table of ``B_crit`` by weighting (`weightings`) over every N, then with
    each N left out (relative residuals, while three N or more remain): each fit's estimate
    with `bootstrap`'s interval (misfit included), its chi^2 and verdict; a line instead
    while an N has fewer than `MIN_SEEDS` seeds."""
    from experiments.lib import sweep

    if min(map(len, steps_by_n.values())) < MIN_SEEDS:
        return f"Not tabled: an N with fewer than {MIN_SEEDS} seeds gives no interval.\n"
    fits = [(name, steps_by_n, fitter) for name, fitter in weightings(steps_by_n).items()]
    if len(steps_by_n) > 3:
        fits += [(f"N = {n:,} left out", {m: s for m, s in steps_by_n.items() if m != n}, _coefficients)
                 for n in sorted(steps_by_n)]  # fmt: skip
    rows = []
    for name, kept, fitter in fits:
        entry = bootstrap(kept, fitter=fitter, **bootstrap_args)
        words = b_crit_words(entry)[len("B_crit = ") :].replace("(95% bootstrap over seeds and misfit; ", "(")
        rows.append([name, len(kept), words, f"{entry['chi2']:,.0f} ({entry['dof']})"])
    return sweep.markdown_table(rows, ["fit", "N fitted", "B_crit [95%, misfit included]", "χ² (dof)"])


def halving_words(steps_by_n: Mapping[int, Sequence[float]]) -> str:
    """Whether the steps fall faster than 1/N from each N to the next, r times larger:
    ``S_N - r S_rN`` (positive: faster) with its Welch 95% interval over the seeds
    (`intervals.welch_contrast`; none where an N has one seed); "" with fewer than two N."""
    ns = sorted(steps_by_n)
    cells = []
    for n, m in zip(ns, ns[1:]):
        ratio = m / n
        contrast, low, high = intervals.welch_contrast([steps_by_n[n], steps_by_n[m]], [1.0, -ratio])
        if math.isnan(low):
            cells.append(f"{n:,} → {m:,} {contrast:+.0f} (no interval: one seed)")
            continue
        cells.append(f"{n:,} → {m:,} {contrast:+.0f} [{low:+.0f}, {high:+.0f}], {intervals.verdict(low, high)}")
    if not cells:
        return ""
    return (
        "Faster than 1/N, S_N − r S_rN from each N to the next, r times larger (positive: the steps fall more than "
        "r-fold; Welch 95% over the seeds): " + "; ".join(cells) + "."
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
