"""The critical batch under a schedule that does not depend on N: steps to each validation
target with a fixed warmup in steps, then a constant rate (Shallue et al. 2018;
McCandlish et al. 2018), the rate tuned per N on a sqrt(2) grid, B_crit with a bootstrap
interval over seeds.

The cosine study (`critical_batch_study`) decays every run's rate over 6 epochs, so a
large N reaches its target while its rate is already low: steps-to-target measured the
schedule as much as the batch. Here every run trains `configs/cmudict_clip.py` (two 1-D
CNN towers, CLIP over the global batch on 8 simulated CPU devices) on cmudict's `fit`
split (108,000 pairs) with `optim.schedule = "constant"`: a linear warmup over
`WARMUP_STEPS` steps whatever N, then the peak rate ``1e-3 * 2 ** (k / 2)``
(rate step k, `rate_grid`). Validation R@1 both ways (13,490 pairs; the test split is never read) is
measured every `EVAL_EXAMPLES` training examples (at least every step); a run trains in
segments of `SEGMENT_EVALS` evaluations and stops after the first segment that reached
the highest target, or made no new best for `PATIENCE_EVALS` evaluations, or at the cap
of `MAX_EPOCHS` epochs. Its steps to every target are interpolated from those points.

Stages (resumable; a run's results are written as it finishes):

1. **tuning**, on the first seed, N by N: rate steps ``k0(N) - 1 .. k0(N) + 1``
   (``k0`` from the square-root rule, `first_rate_step`), then the neighbour beyond
   the best while the best (fewest steps to the highest target any of that N's runs
   reaches; a miss ranks by its best R@1) is at the edge of what ran;
2. **seeds**: every other seed at each N's tuned rate and both its neighbours; then, while
   an N's best at the highest target (over every seed) is at the edge of the rates every
   seed ran, every seed at the rate beyond it (`edge_runs`);
3. **noise**: the replicate noise scale (`noise_scale.compare`) at `NOISE_POINTS` steps
   evenly along each N's chosen run (a step between the run's checkpoints replayed from
   the one before, `replicates.replayed`) on the first `NOISE_SEEDS` seeds: `REPLICATES`
   global batches at n = `NOISE_BATCH` and as many at n / 4, from disjoint examples
   (`replicate_starts`; a stream of its own, `NOISE_DATA_SEED` + the seed), with 95%
   bootstrap intervals over the replicates, both for the plain gradient (``B_simple``,
   SGD's) and for the gradient divided by AdamW's ``sqrt(v_hat) + eps`` at that
   checkpoint (``B_adam``). Cached in `noise.json`.

The report (`summary.md`, `results.json`, `steps_to_target.png`, `b_crit_fit.png`): per target, each N's
steps at every rate (mean ± 95% t over seeds); each N's best rate among those run with
every seed, marked where it is at the edge of those; ``B_crit`` fitted over every N with
its 95% bootstrap over seeds (`critical_batch_fit`), and the table of the estimate
against the range fitted.

Run (from the repository root; rerun the same command to go on):
  .venv/bin/python -m experiments.studies.critical_batch_constant_lr --hours 2   # no run starts after 2 h
  .venv/bin/python -m experiments.studies.critical_batch_constant_lr --hours 0   # the report from what finished
  .venv/bin/python -m experiments.studies.critical_batch_constant_lr --quick     # CI: slices of the data
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contrastive_jax import run_dir
from contrastive_jax.config_lib import load_config, override
from experiments.lib import critical_batch_fit, intervals, replicates, sweep, target_steps
from experiments.lib.rate_grid import first_rate_step, learning_rate, rate_step_of, step_beyond_edge

BATCH_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
SEEDS = (0, 1, 2)
TARGETS = (0.80, 0.82, 0.84, 0.86, 0.88)  # validation R@1, mean of both directions; the last stops a run
WARMUP_STEPS = 20  # the same at every N
EVAL_EXAMPLES = 32_768  # validation every this many training examples (at least every step)
SEGMENT_EVALS = 4  # evaluations per training segment (the stop is checked between segments)
PATIENCE_EVALS = 12  # no new best validation R@1 in this many evaluations: the run stops
MAX_TUNING_RATES = 6  # rate steps tuned per N at most
MAX_EPOCHS = 16.0  # the cap
FIT_STARTS = (256, 512, 1024)  # the fit-range table: every N from each of these up
NOISE_BATCH = 1024  # n of the replicate noise scale (and n / 4)
REPLICATES = 16  # independent batches at each of n and n / 4
NOISE_POINTS = 4  # steps measured along each run, spread evenly, the last included
NOISE_SEEDS = 2  # the first seeds at each N's chosen rate
NOISE_DATA_SEED = 1_000  # + the run's seed: the replicates' stream, not the one trained on


def study_run(
    n: int, rate_step: int, seed: int, *, train_size: int, max_epochs: float, eval_examples: int
) -> sweep.Run:
    """The run at N = `n`, rate step `rate_step` and `seed`: constant rate after
    `WARMUP_STEPS`, validated every `eval_examples` training examples (at least every
    step), capped at `max_epochs` epochs of `train_size` pairs, every segment's
    checkpoint kept (the noise scale is measured along the run)."""
    every = max(1, round(eval_examples / n))
    cap = math.ceil(max_epochs * train_size / n)
    rate = learning_rate(rate_step)
    overrides = {
        "seed": seed,
        "data.seed": seed,
        "train.global_batch_size": n,
        "train.num_train_steps": cap,
        "train.log_every_steps": every,
        "optim.schedule": "constant",
        "optim.warmup_steps": WARMUP_STEPS,
        "optim.learning_rate": rate,
        "eval.every_steps": every,
        "checkpoint.every_steps": every * SEGMENT_EVALS,
        "checkpoint.max_to_keep": 1_000,
    }
    tags = {"batch_size": n, "rate_step": rate_step, "lr_factor": 2 ** (rate_step / 2), "seed": seed}
    return sweep.Run(f"n{n}_k{rate_step}_s{seed}", tags | {"learning_rate": rate, "max_steps": cap}, overrides)


def finished(curve: np.ndarray, target: float, patience: int = PATIENCE_EVALS) -> bool:
    """Whether a run with validation `curve` (`[[step, R@1], ...]`) may stop: it reached
    `target`, or its last `patience` evaluations hold no new best."""
    values = curve[:, 1]
    reached = len(values) and values.max() >= target
    stalled = len(values) > patience and values[-patience:].max() <= values[:-patience].max()
    return bool(reached or stalled)


def workdir_curve(workdir: Path) -> np.ndarray:
    """The validation curve (`target_steps.validation_curve`'s) logged so far in `workdir`."""
    history = run_dir.metrics_by_step(workdir)
    curves = {
        f"eval/{m}": [[step, values[f"eval/{m}"]] for step, values in history.items() if f"eval/{m}" in values]
        for m in target_steps.METRICS
    }
    if not curves[f"eval/{target_steps.METRICS[0]}"]:
        return np.zeros((0, 2))
    return target_steps.validation_curve({"curves": curves})


def rank(record: Mapping[str, Any], target: float) -> tuple[float, float]:
    """A tuning run's sort key: steps to `target` (inf on a miss), then minus its best R@1."""
    curve = target_steps.validation_curve(record)
    steps = target_steps.steps_to_target(curve, target)
    return (math.inf if steps is None else steps, -float(curve[:, 1].max()))


def best_tuning_run(records: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> Mapping[str, Any]:
    """The best of one N's tuning runs `records`: the fewest steps (`rank`) to the highest
    of `targets` that one of them reaches (a constant rate may plateau under the highest
    everywhere at an N; none reached: the best R@1)."""
    curves = [target_steps.validation_curve(r) for r in records]
    reached = [t for t in targets if any(curve[:, 1].max() >= t for curve in curves)]
    target = max(reached, default=targets[0])
    return min(records, key=lambda r: rank(r, target))


def next_rate_step(records: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> int | None:
    """The rate step to tune next at one N from its tuning runs `records`: None when the
    best (`best_tuning_run`) is inside the steps run, else the neighbour beyond it."""
    return step_beyond_edge((r["rate_step"] for r in records), best_tuning_run(records, targets)["rate_step"])


def tune(base, n: int, seed: int, targets, out: Path, run_args, grid_args, most: int) -> list[dict]:
    """The tuning runs at N = `n` on `seed`: the three steps around `first_rate_step`,
    then the neighbour beyond the best (`best_tuning_run`) while it is at an edge, up to
    `most` rates (stops early when the budget leaves a run unstarted)."""
    k0 = first_rate_step(n)
    runs = [study_run(n, k, seed, **run_args) for k in (k0 - 1, k0, k0 + 1)]
    while True:
        records = sweep.run_grid(base, runs, out, **grid_args)
        step = next_rate_step(records, targets) if len(records) == len(runs) else None
        if step is None or len(runs) >= most:
            return records
        runs.append(study_run(n, step, seed, **run_args))


def tuned_steps(records: Sequence[Mapping[str, Any]], seed: int, targets: Sequence[float]) -> dict[int, int]:
    """`{N: rate step}`: each N's best tuning run on `seed` (`best_tuning_run`)."""
    by_n: dict[int, list] = {}
    for record in (r for r in records if r["seed"] == seed):
        by_n.setdefault(record["batch_size"], []).append(record)
    return {n: best_tuning_run(rs, targets)["rate_step"] for n, rs in sorted(by_n.items())}


def seed_runs(tuned: Mapping[int, int], seeds: Sequence[int], **run_args) -> list[sweep.Run]:
    """Seed by seed, each N's tuned rate step and both its neighbours."""
    return [study_run(n, k + d, seed, **run_args) for seed in seeds for n, k in tuned.items() for d in (-1, 0, 1)]


def best_by_n(records: Sequence[Mapping[str, Any]], target: float) -> dict[int, dict[str, Any]]:
    """`target_steps.best_runs` (the fewest mean steps among the rates run with every seed an
    N has) with `rate_steps` added (the rate steps run with every seed, a miss included)
    and `edge` redone per N: the best is the smallest or largest of those."""
    best = target_steps.best_runs(records, target)
    reached = target_steps.reached_steps(records, target)
    for n, entry in best.items():
        full = sorted(f for (m, f), by_seed in reached.items() if m == n and len(by_seed) == entry["seeds"])
        entry["rate_steps"] = [rate_step_of(f) for f in full]
        entry["edge"] = len(full) > 1 and entry["lr_factor"] in (full[0], full[-1])
    return best


def edge_runs(
    records: Sequence[Mapping[str, Any]], seeds: Sequence[int], target: float, most: int, **run_args
) -> list[sweep.Run]:
    """The seeds stage's grid grown as the tuning grows seed 0's: every one of `seeds` at
    the rate step beyond each N's best at `target` (`best_by_n`) where that best is at
    the edge of the rates every seed ran, while fewer than `most` of those."""
    runs = []
    for n, entry in best_by_n(records, target).items():
        if entry["edge"] and len(entry["rate_steps"]) < most:
            step = step_beyond_edge(entry["rate_steps"], rate_step_of(entry["lr_factor"]))
            runs += [study_run(n, step, seed, **run_args) for seed in seeds]
    return runs


def b_crit_entries(best: Mapping[int, Mapping[str, Any]], starts: Sequence[int]) -> list[dict[str, float]]:
    """`critical_batch_fit.fit_ranges` of the best runs' steps per seed (`best_by_n`)."""
    return critical_batch_fit.fit_ranges(target_steps.steps_by_seed(best), starts)


def fit_figure(records: Sequence[Mapping[str, Any]], targets: Sequence[float], starts: Sequence[int]) -> dict:
    """`b_crit_fit`: per target, each N's best steps (`best_by_n`: the mean and its 95%
    t-interval over the seeds) against N, log-log, with ``S(N) = S_min (1 + B_crit / N)``
    fitted over every N (`b_crit_entries`' first range) and its knee, N = B_crit where
    S = 2 S_min, with B_crit's 95% bootstrap interval as a horizontal bar (no curve where
    B_crit is not finite; no bar where a bound is not)."""
    fig, axis = sweep.new_figure("S(N) = S_min (1 + B_crit / N) fitted over every N", width=6.0)
    for target, color in zip(targets, sweep.colors(len(targets), "viridis"), strict=True):
        best = best_by_n(records, target)
        fits = b_crit_entries(best, starts)
        if not fits:
            continue
        ns = sorted(best)
        steps, errors = [best[n]["steps"] for n in ns], target_steps.error_bars(best, ns)
        axis.errorbar(ns, steps, yerr=errors, fmt="o", capsize=3, color=color, label=f"R@1 {target:g}")
        fit = fits[0]
        if not math.isfinite(fit["b_crit"]):
            continue
        grid = np.geomspace(ns[0], ns[-1], 64)
        axis.plot(grid, fit["s_min"] * (1 + fit["b_crit"] / grid), color=color, lw=1)
        bar = [[fit["b_crit"] - fit["low"]], [fit["high"] - fit["b_crit"]]]
        bounded = math.isfinite(fit["high"]) and fit["low"] > 0
        axis.errorbar([fit["b_crit"]], [2 * fit["s_min"]], xerr=bar if bounded else None, fmt="D", capsize=3,
                      color=color, mfc="white")  # fmt: skip
    axis.set(xlabel="global batch N", ylabel="steps (diamond: N = B_crit, S = 2 S_min)", yscale="log")
    sweep.log_spaced_ticks(axis, sorted({r["batch_size"] for r in records}))
    axis.legend(fontsize=7)
    return {"b_crit_fit": fig}


def replicate_starts(count: int) -> tuple[int, int]:
    """The stream steps where the `count` replicates at n and those at n / 4 start: the
    examples ``[0, count n)`` and ``[count n, count n + count n / 4)`` of an epoch, disjoint
    (the cosine study started both at 0, so the quarter batches were the first big ones cut
    in four)."""
    return 0, 4 * count


def measured_steps(last: int, points: int) -> list[int]:
    """The steps 1/points, 2/points, ..., all of a run's `last` (rounded; fewer where two
    fractions round to one step)."""
    return sorted({round(last * j / points) for j in range(1, points + 1)} - {0})


def noise_at(config, workdir: Path, step: int, n: int, count: int, resamples: int) -> dict[str, dict]:
    """`{"sgd": ..., "adam": ...}`: `noise_scale.compare` (with `resamples` bootstrap
    draws) at the checkpoint of `step` in `workdir` of the run of `config`, of the plain
    gradients and of the same divided by AdamW's denominator there
    (`noise_scale.adam_preconditioned`); the replicates from a stream of their own
    (``data.seed``: `NOISE_DATA_SEED` + the run's), not the one the run trained on."""
    from contrastive_jax.training import noise_scale

    stream = override(config, {"data.seed": NOISE_DATA_SEED + config.data.seed})
    big_start, small_start = replicate_starts(count)
    at_n, state = replicates.gradients(stream, str(workdir), n, count, step=step, start_step=big_start)
    at_quarter, _ = replicates.gradients(stream, str(workdir), n // 4, count, step=step, start_step=small_start)
    adam = [[noise_scale.adam_preconditioned(g, state.opt_state) for g in side] for side in (at_n, at_quarter)]
    return {
        "sgd": noise_scale.compare(at_n, at_quarter, n, resamples=resamples),
        "adam": noise_scale.compare(*adam, n, resamples=resamples),
    }


def noise_scales(base, runs: Sequence[sweep.Run], out: Path, args, deadline: float | None) -> dict[str, dict]:
    """`noise_at` at `args.noise_points` steps evenly along each of `runs` (`measured_steps`;
    a step the run did not keep is replayed from its checkpoint before, `replicates.replayed`),
    cached in `out/noise.json` entry by entry: a rerun measures only what is new; a run
    without its workdir, read from the committed results, is skipped with a line.
    Returns the entries of `runs` only (the cache keeps a run no longer chosen)."""
    cache_file = out / "noise.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    for run in runs:
        workdir = out / "runs" / run.name
        if not (workdir / run_dir.CHECKPOINTS).is_dir():
            print(f"[noise] {run.name}: no checkpoints in {workdir}", flush=True)
            continue
        config = override(base, run.overrides)
        for step in measured_steps(replicates.kept_steps(str(workdir))[-1], args.noise_points):
            key = f"{run.name}@{step}"
            if key in cache or (deadline is not None and time.monotonic() > deadline):
                continue
            print(f"[noise] {key}: {args.replicates} replicates at {args.noise_batch} and at {args.noise_batch // 4}")
            with tempfile.TemporaryDirectory() as scratch:
                state_dir = Path(replicates.replayed(config, str(workdir), step, scratch))
                resamples = intervals.BOOTSTRAP_RESAMPLES
                measured = noise_at(config, state_dir, step, args.noise_batch, args.replicates, resamples)
            cache[key] = {**run.tags, "step": step, "n": args.noise_batch, **measured}
            cache_file.write_text(json.dumps(cache, indent=1))
    names = {run.name for run in runs}
    return {key: entry for key, entry in cache.items() if key.split("@")[0] in names}


def noise_table(noise: Mapping[str, Mapping[str, Any]]) -> str:
    """The noise section of the report: per run and step measured, B_simple and B_adam, the
    variance ratio and the bias, each with its 95% bootstrap interval over replicates."""

    def cell(entry, key, fmt):
        low, high = entry[f"{key}_interval"]
        return f"{entry[key]:{fmt}} [{low:{fmt}}, {high:{fmt}}]"

    rows = [
        [
            f"{e['batch_size']:,}",
            e["seed"],
            e["step"],
            cell(e["sgd"], "b_simple", ",.0f"),
            cell(e["adam"], "b_simple", ",.0f"),
            cell(e["sgd"], "variance_ratio", ".2f"),
            cell(e["sgd"], "bias_over_g", "+.2f"),
        ]
        for e in sorted(noise.values(), key=lambda e: (e["batch_size"], e["seed"], e["step"]))
    ]
    header = ["run's N", "seed", "step", "B_simple (SGD)", "B_adam", "tr Cov(n/4) / tr Cov(n)", "bias² / \\|E g\\|²"]
    n = next(iter(noise.values()))["n"]
    return (
        f"\n## The replicate noise scale along each N's chosen run (n = {n:,} and {n // 4:,}, disjoint batches)\n\n"
        "Each value with its 95% bootstrap interval over the replicates. B_adam: the gradient divided by "
        "AdamW's sqrt(v_hat) + eps at that step.\n\n" + sweep.markdown_table(rows, header)
    )


def summary(
    records: Sequence[Mapping[str, Any]],
    targets: Sequence[float],
    starts: Sequence[int],
    noise: Mapping[str, Mapping[str, Any]] | None = None,
    train_size: int = target_steps.FIT_PAIRS,
) -> str:
    """The markdown report: per target, `target_section`; for the highest target with a
    fit, B_crit by weighting and with each N left out (`critical_batch_fit.weighting_table`);
    the data each N saw and its censored runs (`reuse_table`, epochs of `train_size`
    pairs); with `noise` (`noise_scales`), its table and its comparison with the highest
    target's B_crit (`noise_against_b_crit`)."""
    text = f"# The critical batch on cmudict, constant rate after {WARMUP_STEPS} warmup steps, {len(records)} runs\n"
    text += (
        "\nSteps: mean ± the 95% t-interval's half-width over the seeds run (count in brackets); "
        "`-`: a seed missed the target. Rate step k: peak rate 1e-3 · 2^(k/2). B_crit's interval: "
        "`critical_batch_fit.bootstrap` (the seeds resampled within each N, each N's mean times "
        "1 + tau z for the curve's misfit tau); resolved: the interval lies inside the N fitted.\n"
    )
    headline = None  # the highest target's fit over every N, its steps per seed, and the runs that reach it
    for target in targets:
        section, fits = target_section(records, target, starts)
        text += section
        if fits:
            best = best_by_n(records, target)
            reaching = {
                (r["batch_size"], r["lr_factor"], r["seed"]): target_steps.validation_curve(r)
                for r in records
                if target_steps.steps_to_target(target_steps.validation_curve(r), target) is not None
            }
            headline = (target, fits[0], reaching, target_steps.steps_by_seed(best))
    if headline:
        target, _, _, steps_by_n = headline
        text += (
            f"\n## B_crit at R@1 {target:g} by weighting and with each N left out\n\n"
            + critical_batch_fit.weighting_table(steps_by_n)
        )
    text += reuse_table(records, targets, train_size)
    if noise:
        text += noise_table(noise) + (noise_against_b_crit(noise, *headline[:3]) if headline else "")
    return text


def target_section(
    records: Sequence[Mapping[str, Any]], target: float, starts: Sequence[int]
) -> tuple[str, list[dict[str, float]]]:
    """One target's part of the report and its fits (`b_crit_entries`): each N's steps at
    every rate and the best; B_crit over every N with its interval, the lack of fit, the
    misses, S_N - 2 S_2N and the saturation; the N whose best rate is at the edge of
    those every seed ran; the fit-range table."""
    best = best_by_n(records, target)
    reached = target_steps.reached_steps(records, target)
    ks = sorted({r["rate_step"] for r in records})
    rows = []
    for n in sorted({r["batch_size"] for r in records}):
        cells = []
        for k in ks:
            by_seed = reached.get((n, 2 ** (k / 2)), {})
            count = f" ({len(by_seed)})" if by_seed else ""
            cells.append(intervals.mean_and_interval(list(by_seed.values())) + count)
        entry = best.get(n)
        if entry:
            k = rate_step_of(entry["lr_factor"])
            cells += [f"{entry['steps']:.0f} at k={k}" + (" (edge)" if entry["edge"] else ""), entry["seeds"]]
        else:
            cells += ["not reached", "-"]
        rows.append([f"{n:,}", *cells])
    text = f"\n## Steps to validation R@1 {target:g} (mean of both directions)\n\n"
    text += sweep.markdown_table(rows, ["N", *(f"k={k}" for k in ks), "best", "seeds"])
    fits = b_crit_entries(best, starts)
    if not fits:
        return text, fits
    steps_by_n = target_steps.steps_by_seed(best)
    text += (
        f"\nS(N) = S_min (1 + B_crit / N) over N from {fits[0]['from']:,} "
        f"({fits[0]['points']} N): {critical_batch_fit.b_crit_words(fits[0])}, "
        f"S_min = {fits[0]['s_min']:.0f} steps. {critical_batch_fit.lack_of_fit_words(fits[0])} "
        f"{critical_batch_fit.misses_words(steps_by_n)} {critical_batch_fit.halving_words(steps_by_n)} "
        f"{critical_batch_fit.saturation_words(steps_by_n)}\n\n"
    )
    if edges := [f"{n:,}" for n, entry in sorted(best.items()) if entry["edge"]]:
        text += (
            f"The best rate is at the edge of those every seed ran at N = {', '.join(edges)}: a rate "
            "beyond it may reach the target sooner, so the fit rests on upper bounds there.\n\n"
        )
    return text + critical_batch_fit.range_table(fits), fits


def reuse_table(records: Sequence[Mapping[str, Any]], targets: Sequence[float], train_size: int) -> str:
    """The data each N saw and the runs the cap censored, at the highest of `targets`: per
    N, one batch's share of the `train_size` pairs, the cap, the runs, those that reach
    the target, stopped without it on patience or at the cap (censored: their steps to it
    unknown), the best rate's epochs to it (`best_by_n`), and the peak validation R@1 of
    the runs at the rates every seed ran (min–max); then the targets below every such
    peak, the ones a plateau cannot set."""
    target = targets[-1]
    best = best_by_n(records, target)
    rows, peaks = [], {}
    for n in sorted({r["batch_size"] for r in records}):
        runs = [r for r in records if r["batch_size"] == n]
        curves = {r["name"]: target_steps.validation_curve(r) for r in runs}
        missed = [r for r in runs if target_steps.steps_to_target(curves[r["name"]], target) is None]
        censored = [r for r in missed if curves[r["name"]][-1, 0] >= r["max_steps"]]
        seeds = {k: {r["seed"] for r in runs if r["rate_step"] == k} for k in {r["rate_step"] for r in runs}}
        full = [r for r in runs if len(seeds[r["rate_step"]]) == max(map(len, seeds.values()))]
        peaks[n] = [float(curves[r["name"]][:, 1].max()) for r in full]
        epochs = f"{best[n]['steps'] * n / train_size:.1f}" if n in best else "-"
        rows.append([f"{n:,}", f"{100 * n / train_size:.1f}%", f"{runs[0]['max_steps']:,}", len(runs),
                     len(runs) - len(missed), len(missed) - len(censored),
                     ", ".join(f"k={r['rate_step']} s{r['seed']}" for r in censored) or "0", epochs,
                     f"{min(peaks[n]):.3f}–{max(peaks[n]):.3f}"])  # fmt: skip
    header = ["N", "batch / split", "cap (steps)", "runs", f"reach {target:g}", "stopped on patience",
              "censored at the cap", f"epochs to {target:g} (best rate)", "peak R@1, rates every seed ran"]  # fmt: skip
    lowest = min(min(p) for p in peaks.values())
    below = [f"{t:g}" for t in targets if t < lowest]
    return (
        f"\n## Data seen and censored runs per N (R@1 {target:g}; {train_size:,} training pairs)\n\n"
        + sweep.markdown_table(rows, header)
        + f"\nTargets below every N's lowest peak ({lowest:.3f}, runs at the rates every seed ran): "
        f"{', '.join(below) or 'none'}. A run stops after the segment that reaches R@1 {target:g}, so an N "
        "whose runs all reach it has a peak, not a measured plateau.\n"
    )


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
    last = {}
    for entry in noise.values():
        key = (entry["batch_size"], entry["seed"])
        if key not in last or entry["step"] > last[key]["step"]:
            last[key] = entry

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


def write_partial(records: Sequence[Mapping[str, Any]], out: Path, targets, starts, train_size: int) -> None:
    """`results.{json,csv}` and `summary.md` of the runs finished so far, between stages
    (a kill loses no finished run's record): `records` over the committed records of
    the same names, the committed ones of runs not visited yet kept."""
    merged = sweep.committed_records(out) | {r["name"]: r for r in records}
    sweep.write_results(list(merged.values()), out)
    noise_file = out / "noise.json"
    noise = json.loads(noise_file.read_text()) if noise_file.exists() else None
    (out / "summary.md").write_text(summary(list(merged.values()), targets, starts, noise, train_size))


def run(args) -> list[dict]:
    """Tunes each N on the first seed, then the other seeds at the tuned rate and its
    neighbours, and every seed beyond an edge best (`edge_runs`; finished runs skipped),
    and writes results, the figures, the noise scales and the summary."""
    base = override(
        load_config("cmudict_clip"),
        {**target_steps.SPLITS, **(target_steps.QUICK_OVERRIDES if args.quick else {}), "data.data_dir": args.data_dir},
    )
    target = args.targets[-1]
    run_args = {"train_size": args.train_size, "max_epochs": args.max_epochs, "eval_examples": args.eval_examples}
    grid_args = {
        "curve_keys": target_steps.CURVES,
        "deadline": sweep.deadline(args.hours),
        "stop_when": lambda workdir: finished(workdir_curve(workdir), target),
    }
    starts = args.batch_sizes[: len(FIT_STARTS)]  # the full grid: FIT_STARTS
    records = []
    for n in args.batch_sizes:
        records += tune(base, n, args.seeds[0], args.targets, args.out, run_args, grid_args, args.max_tuning_rates)
        write_partial(records, args.out, args.targets, starts, args.train_size)
    tuned = tuned_steps(records, args.seeds[0], args.targets)
    for seed in args.seeds[1:]:
        records += sweep.run_grid(base, seed_runs(tuned, [seed], **run_args), args.out, **grid_args)
        write_partial(records, args.out, args.targets, starts, args.train_size)
    while runs := edge_runs(records, args.seeds, target, args.max_tuning_rates, **run_args):
        grown = sweep.run_grid(base, runs, args.out, **grid_args)
        records = list(({r["name"]: r for r in records} | {r["name"]: r for r in grown}).values())
        write_partial(records, args.out, args.targets, starts, args.train_size)
        if len(grown) < len(runs):  # the budget left a run unstarted
            break
    sweep.write_results(records, args.out)
    noise = {}
    if records:
        best = best_by_n(records, target)
        chosen = {n: rate_step_of(best[n]["lr_factor"]) if n in best else k for n, k in tuned.items()}
        rates = {n: 2 ** (k / 2) for n, k in chosen.items()}
        figures = target_steps.plot(records, args.targets, args.train_size, 0.7, rates)
        sweep.save(figures | fit_figure(records, args.targets, starts), args.out)
        measured = [study_run(n, k, seed, **run_args) for seed in args.seeds[:NOISE_SEEDS] for n, k in chosen.items()]
        noise = noise_scales(base, measured, args.out, args, grid_args["deadline"])
    (args.out / "summary.md").write_text(summary(records, args.targets, starts, noise, args.train_size))
    print(f"wrote {args.out}")
    return records


FULL = dict(
    batch_sizes=list(BATCH_SIZES),
    seeds=list(SEEDS),
    targets=list(TARGETS),
    train_size=target_steps.FIT_PAIRS,
    max_epochs=MAX_EPOCHS,
    eval_examples=EVAL_EXAMPLES,
    max_tuning_rates=MAX_TUNING_RATES,
    noise_batch=NOISE_BATCH,
    replicates=REPLICATES,
    noise_points=NOISE_POINTS,
)
# --quick: 1,024 training pairs, 256 validation pairs, N = 64 and 128, at most 2 epochs,
# validation every 256 examples, 4 rates tuned at most.
QUICK = dict(
    batch_sizes=[64, 128],
    seeds=[0, 1],
    targets=[0.005, 0.01],
    train_size=1024,
    max_epochs=2.0,
    eval_examples=256,
    max_tuning_rates=4,
    noise_batch=64,
    replicates=8,
    noise_points=3,
)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="global batch sizes N")
    parser.add_argument("--targets", type=sweep.float_list, help="validation R@1 targets (the last stops a run)")
    parser.add_argument("--max-epochs", type=float, help=f"each run's cap (default {MAX_EPOCHS:g})")
    parser.add_argument("--eval-examples", type=int, help=f"examples between validations (default {EVAL_EXAMPLES:,})")
    parser.add_argument("--max-tuning-rates", type=int, help=f"rates tuned per N at most (default {MAX_TUNING_RATES})")
    parser.add_argument("--noise-batch", type=int, help=f"n of the replicate noise scale (default {NOISE_BATCH:,})")
    parser.add_argument("--replicates", type=int, help=f"independent batches at n and n / 4 (default {REPLICATES})")
    parser.add_argument("--noise-points", type=int, help=f"steps measured along each run (default {NOISE_POINTS})")
    sweep.add_hours_option(parser)
    args = sweep.resolve(parser.parse_args(argv), "critical_batch_constant_lr", FULL, QUICK)
    if args.steps is not None:
        parser.error("--steps: each run trains to its target or its cap; pass --max-epochs.")
    if sorted(args.targets) != list(args.targets):
        parser.error(f"--targets {args.targets}: give them in increasing order (the last stops each run).")
    if args.noise_batch % 4 or args.replicates * args.noise_batch * 5 // 4 > args.train_size:
        parser.error(
            f"--noise-batch {args.noise_batch} --replicates {args.replicates}: n must divide by 4, and the "
            f"replicates' {args.replicates} x (n + n / 4) examples fit in one epoch of {args.train_size:,}."
        )
    return run(args)


if __name__ == "__main__":
    main()
