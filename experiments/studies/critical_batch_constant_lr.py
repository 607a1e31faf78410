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

import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.lib import constant_rate, critical_batch_fit, intervals, sweep, target_steps
from experiments.lib.constant_rate import WARMUP_STEPS, best_by_n, reuse_table, study_run
from experiments.lib.noise_stage import noise_against_b_crit, noise_scales, noise_table
from experiments.lib.rate_grid import first_rate_step, rate_step_of

BATCH_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
SEEDS = (0, 1, 2)
TARGETS = (0.80, 0.82, 0.84, 0.86, 0.88)  # validation R@1, mean of both directions; the last stops a run
FIT_STARTS = (256, 512, 1024)  # the fit-range table: every N from each of these up
NOISE_BATCH = 1024  # n of the replicate noise scale (and n / 4)
REPLICATES = 16  # independent batches at each of n and n / 4
NOISE_POINTS = 4  # steps measured along each run, spread evenly, the last included
NOISE_SEEDS = 2  # the first seeds at each N's chosen rate


def seed_runs(tuned: Mapping[int, int], seeds: Sequence[int], **run_args) -> list[sweep.Run]:
    """`constant_rate.seed_runs` of `study_run` with `run_args`."""
    return constant_rate.seed_runs(tuned, seeds, functools.partial(study_run, **run_args))


def edge_runs(
    records: Sequence[Mapping[str, Any]], seeds: Sequence[int], target: float, most: int, **run_args
) -> list[sweep.Run]:
    """`constant_rate.edge_runs` of `study_run` with `run_args`."""
    return constant_rate.edge_runs(records, seeds, target, most, functools.partial(study_run, **run_args))


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


def write_partial(records: Sequence[Mapping[str, Any]], out: Path, targets, starts, train_size: int) -> None:
    """`results.{json,csv}` and `summary.md` of the runs finished so far, between stages
    (a kill loses no finished run's record): `records` over the committed records of
    the same names, the committed ones of runs not visited yet kept."""
    merged = sweep.write_merged(records, out)
    noise_file = out / "noise.json"
    noise = json.loads(noise_file.read_text()) if noise_file.exists() else None
    (out / "summary.md").write_text(summary(merged, targets, starts, noise, train_size))


def run(args) -> list[dict]:
    """Tunes each N on the first seed, then the other seeds at the tuned rate and its
    neighbours, and every seed beyond an edge best (`edge_runs`; finished runs skipped),
    and writes results, the figures, the noise scales and the summary."""
    base, run_args, grid_args = constant_rate.setup(args)
    target = args.targets[-1]
    starts = args.batch_sizes[: len(FIT_STARTS)]  # the full grid: FIT_STARTS
    records, tuned = constant_rate.run_stages(
        base, args.batch_sizes, args.seeds, args.targets, args.out,
        make_run=functools.partial(study_run, **run_args), first_step=first_rate_step, grid_args=grid_args,
        most=args.max_tuning_rates,
        write_partial=lambda records: write_partial(records, args.out, args.targets, starts, args.train_size),
    )  # fmt: skip
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
    **constant_rate.PROTOCOL,
    noise_batch=NOISE_BATCH,
    replicates=REPLICATES,
    noise_points=NOISE_POINTS,
)
# --quick (`constant_rate.QUICK_PROTOCOL`, but 4 rates tuned at most): 256 validation
# pairs, N = 64 and 128, the noise at each run's last step (a kept one: no replay; the
# replay and the spread of the steps have tests of their own).
QUICK = dict(
    batch_sizes=[64, 128],
    seeds=[0, 1],
    targets=[0.005, 0.01],
    **constant_rate.QUICK_PROTOCOL | {"max_tuning_rates": 4},
    noise_batch=64,
    replicates=8,
    noise_points=1,
)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="global batch sizes N")
    parser.add_argument("--noise-batch", type=int, help=f"n of the replicate noise scale (default {NOISE_BATCH:,})")
    parser.add_argument("--replicates", type=int, help=f"independent batches at n and n / 4 (default {REPLICATES})")
    parser.add_argument("--noise-points", type=int, help=f"steps measured along each run (default {NOISE_POINTS})")
    constant_rate.add_options(parser)
    args = sweep.resolve(parser.parse_args(argv), "critical_batch_constant_lr", FULL, QUICK)
    constant_rate.check_args(parser, args)
    if args.noise_batch % 4 or args.replicates * args.noise_batch * 5 // 4 > args.train_size:
        parser.error(
            f"--noise-batch {args.noise_batch} --replicates {args.replicates}: n must divide by 4, and the "
            f"replicates' {args.replicates} x (n + n / 4) examples fit in one epoch of {args.train_size:,}."
        )
    return run(args)


if __name__ == "__main__":
    main()
