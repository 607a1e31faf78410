"""The noise stage of the constant-rate studies (`critical_batch_constant_lr`,
`negatives_vs_noise`): the replicate noise scale (`noise_scale.compare`) at steps spread
evenly along a run (`measured_steps`; a step between the run's checkpoints replayed from
the one before, `replicates.replayed`): `count` global batches at n and as many at n / 4
from a stream of their own (`NOISE_DATA_SEED` + the run's seed), with 95% bootstrap
intervals over the replicates, both for the plain gradient (``B_simple``, SGD's) and for
the gradient divided by AdamW's ``sqrt(v_hat) + eps`` at that checkpoint (``B_adam``);
cached entry by entry in `noise.json`, tabled (`noise_table`) and set against B_crit
(`noise_against_b_crit`).

With `quarter_queries` (a run with extra negatives, `config.loss.extra_negatives`), the
n / 4 side is not batches of n / 4 but the run's own batches (n gradient rows, its M extra
negatives) of which a quarter of the rows are the loss's queries: every query's loss, its
columns and which of them carry gradient, are the run's; only the number of queries
averaged changes. (Batches of n / 4 filled with extra rows to N + M columns keep each
query's softmax but give gradient to a quarter of the columns: at M = 0 the --quick run
read a bias of 56 |E g|^2.)
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from experiments.lib import critical_batch_fit, intervals, replicates, sweep

NOISE_DATA_SEED = 1_000  # + the run's seed: the replicates' stream, not the one trained on


def replicate_starts(count: int, rows_ratio: int = 4) -> tuple[int, int]:
    """The stream steps where the `count` replicates at n and those at n / 4 start, in
    streams whose steps read `rows_ratio` times as many rows at n as at n / 4 (4; 1 with
    extra negatives, C rows at both): the examples ``[0, count R)`` and from ``count R``
    on of an epoch (R: the rows a step at n), disjoint while they fit in it (the cosine
    study started both at 0, so the quarter batches were the first big ones cut in four)."""
    return 0, rows_ratio * count


def measured_steps(last: int, points: int) -> list[int]:
    """The steps 1/points, 2/points, ..., all of a run's `last` (rounded; fewer where two
    fractions round to one step)."""
    return sorted({round(last * j / points) for j in range(1, points + 1)} - {0})


def noise_at(
    config, workdir: Path, step: int, n: int, count: int, resamples: int, quarter_queries: bool = False
) -> dict[str, dict]:
    """`{"sgd": ..., "adam": ...}`: `noise_scale.compare` (with `resamples` bootstrap
    draws) at the checkpoint of `step` in `workdir` of the run of `config`, of the plain
    gradients and of the same divided by AdamW's denominator there
    (`noise_scale.adam_preconditioned`); the replicates from a stream of their own
    (``data.seed``: `NOISE_DATA_SEED` + the run's), not the one the run trained on. With
    `quarter_queries`, the n / 4 side is batches of n (and the run's extra negatives) of
    which the first quarter of each device's rows are the queries (`replicates.gradients`'
    `queries`): each query's loss is the run's, against the run's own columns."""
    from contrastive_jax.training import noise_scale

    stream = override(config, {"data.seed": NOISE_DATA_SEED + config.data.seed})
    quarter = {"n": n, "queries": n // 4} if quarter_queries else {"n": n // 4}
    big_start, small_start = replicate_starts(count, 1 if quarter_queries else 4)
    at_n, state = replicates.gradients(stream, str(workdir), n, count, step=step, start_step=big_start)
    at_quarter, _ = replicates.gradients(
        stream, str(workdir), count=count, step=step, start_step=small_start, **quarter
    )
    adam = [[noise_scale.adam_preconditioned(g, state.opt_state) for g in grads] for grads in (at_n, at_quarter)]
    return {
        "sgd": noise_scale.compare(at_n, at_quarter, n, resamples=resamples),
        "adam": noise_scale.compare(*adam, n, resamples=resamples),
    }


def noise_scales(
    base,
    runs: Sequence[sweep.Run],
    out: Path,
    args,
    deadline: float | None,
    replicate_rows: Callable[[sweep.Run], tuple[int, bool]] | None = None,
) -> dict[str, dict]:
    """`noise_at` at `args.noise_points` steps evenly along each of `runs` (`measured_steps`;
    a step the run did not keep is replayed from its checkpoint before, `replicates.replayed`),
    `args.replicates` batches at n and n / 4, cached in `out/noise.json` entry by entry: a
    rerun measures only what is new; a run without its workdir, read from the committed
    results, is skipped with a line. `replicate_rows(run)`: `(n, quarter_queries)`
    (`noise_at`'s; None: `args.noise_batch`, batches of n / 4). Returns the entries of `runs` only (the cache keeps
    a run no longer chosen)."""
    cache_file = out / "noise.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    for run in runs:
        workdir = out / "runs" / run.name
        if not (workdir / run_dir.CHECKPOINTS).is_dir():
            print(f"[noise] {run.name}: no checkpoints in {workdir}", flush=True)
            continue
        config = override(base, run.overrides)
        n, quarter_queries = replicate_rows(run) if replicate_rows else (args.noise_batch, False)
        for step in measured_steps(replicates.kept_steps(str(workdir))[-1], args.noise_points):
            key = f"{run.name}@{step}"
            if key in cache or (deadline is not None and time.monotonic() > deadline):
                continue
            print(f"[noise] {key}: {args.replicates} replicates at {n} and at {n // 4}")
            with tempfile.TemporaryDirectory() as scratch:
                state_dir = Path(replicates.replayed(config, str(workdir), step, scratch))
                resamples = intervals.BOOTSTRAP_RESAMPLES
                measured = noise_at(config, state_dir, step, n, args.replicates, resamples, quarter_queries)
            quarter = {"quarter": "queries"} if quarter_queries else {}
            cache[key] = {**run.tags, "step": step, "n": n, **quarter, **measured}
            cache_file.write_text(json.dumps(cache, indent=1))
    names = {run.name for run in runs}
    return {key: entry for key, entry in cache.items() if key.split("@")[0] in names}


def noise_table(noise: Mapping[str, Mapping[str, Any]], by: str = "batch_size", label: str = "run's N") -> str:
    """The noise section of the report: per run (its field `by`, headed `label`) and step
    measured, B_simple and B_adam, the variance ratio and the bias, each with its 95%
    bootstrap interval over replicates; then `per_example_words`."""

    def cell(entry, key, fmt):
        low, high = entry[f"{key}_interval"]
        return f"{entry[key]:{fmt}} [{low:{fmt}}, {high:{fmt}}]"

    rows = [
        [
            f"{e[by]:,}",
            e["seed"],
            e["step"],
            cell(e["sgd"], "b_simple", ",.0f"),
            cell(e["adam"], "b_simple", ",.0f"),
            cell(e["sgd"], "variance_ratio", ".2f"),
            cell(e["sgd"], "bias_over_g", "+.2f"),
        ]
        for e in sorted(noise.values(), key=lambda e: (e[by], e["seed"], e["step"]))
    ]
    header = [label, "seed", "step", "B_simple (SGD)", "B_adam", "tr Cov(n/4) / tr Cov(n)", "bias² / \\|E g\\|²"]
    n = next(iter(noise.values()))["n"]
    return (
        f"\n## The replicate noise scale along each N's chosen run (n = {n:,} and {n // 4:,}, disjoint batches)\n\n"
        "Each value with its 95% bootstrap interval over the replicates. B_adam: the gradient divided by "
        "AdamW's sqrt(v_hat) + eps at that step.\n\n" + sweep.markdown_table(rows, header) + per_example_words(noise)
    )


def per_example_words(noise: Mapping[str, Mapping[str, Any]]) -> str:
    """McCandlish's per-example model checked over every state in `noise` (SGD's
    gradient), in a sentence: with independent examples the replicate variance at n / 4
    is 4 times that at n, and the mean gradients at both sizes agree (bias 0); the range
    of each, and in how many states its 95% interval holds 4 (the ratio) or 0 (the bias)."""
    sgd = [e["sgd"] for e in noise.values()]
    ratios, biases = [e["variance_ratio"] for e in sgd], [e["bias_over_g"] for e in sgd]
    holds_four = sum(low <= 4 <= high for low, high in (e["variance_ratio_interval"] for e in sgd))
    holds_zero = sum(low <= 0 <= high for low, high in (e["bias_over_g_interval"] for e in sgd))
    return (
        f"\nThe per-example model (independent examples: the ratio 4, the bias 0) over the {len(sgd)} states: "
        f"tr Cov(n/4) / tr Cov(n) is {min(ratios):.2f}–{max(ratios):.2f}, its interval holding 4 in {holds_four} "
        f"of {len(sgd)}; bias² / |E g|² is {min(biases):+.2f} to {max(biases):+.2f}, its interval holding 0 in "
        f"{holds_zero} of {len(sgd)}.\n"
    )


def last_states(noise: Mapping[str, Mapping[str, Any]], by: str) -> dict[tuple[int, int], Mapping[str, Any]]:
    """`{(setting, seed): entry}`: each run's last measured state in `noise`, its setting
    the entry's field `by`."""
    last = {}
    for entry in noise.values():
        key = (entry[by], entry["seed"])
        if key not in last or entry["step"] > last[key]["step"]:
            last[key] = entry
    return last


def noise_by_setting(noise: Mapping[str, Mapping[str, Any]], by: str, label: str) -> str:
    """The noise scale at each run's last measured state, setting by setting (its field
    `by`, headed `label`): over the seeds, the geometric mean and 95% t-interval
    (`intervals.geometric_interval`) of B_simple, B_adam and of B_simple's two parts,
    |E g|² and tr Σ (SGD's gradient); then the fewest setting's over the most's for each
    (`intervals.ratio_cell`), which says whether a setting lowers the noise through the
    covariance or through the mean gradient."""
    runs = {}  # setting: its runs' last states, by seed
    for (setting, _), entry in sorted(last_states(noise, by).items()):
        runs.setdefault(setting, []).append(entry)
    settings = sorted(runs)
    parts = {
        "B_simple": ("sgd", "b_simple"),
        "B_adam": ("adam", "b_simple"),
        "|E g|²": ("sgd", "g_squared"),
        "tr Σ": ("sgd", "trace_sigma"),
    }

    def values(setting, form, key):
        return [e[form][key] for e in runs[setting]]

    def cell(setting, form, key):
        center, low, high = intervals.geometric_interval(values(setting, form, key))
        digits = ",.0f" if key == "b_simple" else ".3g"
        bounds = "[n/a]" if np.isnan(low) else f"[{low:{digits}}, {high:{digits}}]"
        return f"{center:{digits}} {bounds}"

    rows = [
        [f"{setting:,}", ", ".join(str(e["step"]) for e in runs[setting])]
        + [cell(setting, *part) for part in parts.values()]
        for setting in settings
    ]
    text = (
        f"\n### The noise scale at each run's last measured state, by {label}\n\n"
        "Geometric mean [95% t-interval] over the seeds; B_simple = tr Σ / |E g|².\n\n"
        + sweep.markdown_table(rows, [label, "steps (per seed)", *(name.replace("|", "\\|") for name in parts)])
    )
    if len(settings) < 2:
        return text
    fewest, most = settings[0], settings[-1]
    ratios = "; ".join(
        f"{name} {intervals.ratio_cell(values(fewest, *part), values(most, *part))}" for name, part in parts.items()
    )
    welch = "ratio of geometric means, Welch 95% on the logarithms"
    return text + f"\nAt {fewest:,} over at {most:,} ({welch}): {ratios}.\n"


def noise_against_b_crit(
    noise: Mapping[str, Mapping[str, Any]],
    target: float,
    fit: Mapping[str, float],
    reaching: Mapping[tuple[int, float, int], np.ndarray] | None = None,
) -> str:
    """Each N's noise scale at its last measured step (per seed) against B_crit's
    interval at `target` (`fit`, `critical_batch_fit.bootstrap`'s): for B_simple and
    B_adam, "overlaps" when the two 95% intervals share a point, else "apart" ("not
    compared" while B_crit has no interval, `critical_batch_fit.has_interval`); then,
    over the runs in `reaching` (`{(N, lr_factor, seed): validation curve}` of the runs
    that reach `target`), the validation R@1 at those last steps (the runs' ends) and
    the noise scale averaged within each N first (the geometric mean of its runs), then
    over the N, with its 95% t-interval over the N (`intervals.geometric_interval`), set
    against B_crit too."""
    last = last_states(noise, "batch_size")

    def verdict(low, high):
        if not critical_batch_fit.has_interval(fit):
            return "not compared"
        return "overlaps" if low <= fit["high"] and fit["low"] <= high else "apart"

    def compared(form):
        low, high = form["b_simple_interval"]
        return f"{form['b_simple']:,.0f} [{low:,.0f}, {high:,.0f}], {verdict(low, high)}"

    rows = [
        [f"{n:,}", seed, e["step"], compared(e["sgd"]), compared(e["adam"])] for (n, seed), e in sorted(last.items())
    ]
    text = (
        f"\nAgainst {critical_batch_fit.b_crit_words(fit)} at R@1 {target:g}, each run's last measured noise "
        'scale ("overlaps": the two 95% intervals share a point):\n\n'
        + sweep.markdown_table(rows, ["run's N", "seed", "step", "B_simple [95%]", "B_adam [95%]"])
    )
    reaching = reaching or {}
    pooled = [e for e in last.values() if (e["batch_size"], e["lr_factor"], e["seed"]) in reaching]
    by_n = sorted({e["batch_size"] for e in pooled})
    if len(by_n) < 2:
        return text
    words = []
    for form, name in (("sgd", "B_simple"), ("adam", "B_adam")):
        values = [[e[form]["b_simple"] for e in pooled if e["batch_size"] == n] for n in by_n]
        if min(map(min, values)) <= 0:
            words.append(f"{name} not pooled (an estimate is not positive)")
            continue
        center, low, high = intervals.geometric_interval([intervals.geometric_interval(v)[0] for v in values])
        words.append(f"{name} {center:,.0f} [{low:,.0f}, {high:,.0f}], {verdict(low, high)}")
    r_at_end = [np.interp(e["step"], *reaching[(e["batch_size"], e["lr_factor"], e["seed"])].T) for e in pooled]
    return text + (
        f"\nOver the {len(pooled)} runs that reach R@1 {target:g} (N = {', '.join(f'{n:,}' for n in by_n)}), each "
        f"at its last measured step, the run's end, where its validation R@1 is {min(r_at_end):.3f}–"
        f"{max(r_at_end):.3f}: averaged within each N first (the geometric mean of its runs), then over the "
        f"{len(by_n)} N with its 95% t-interval over the N: {'; '.join(words)}.\n"
    )
