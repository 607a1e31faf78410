"""The critical batch, measured: steps to a validation target at each N with the learning
rate tuned per N (Shallue et al. 2018), over seeds, McCandlish's curve fitted, DCL as a
control of the objective, the replicate noise scale beside it.

Every run trains `configs/cmudict_clip.py` (two 1-D CNN towers, CLIP over the global
batch on 8 simulated CPU devices) on cmudict's `fit` split (108,000 pairs) for `EPOCHS`
epochs, evaluating R@1 both ways on `validation` (13,490 pairs; the test split is never
read here) `EVALS_PER_EPOCH` times an epoch. AdamW's peak learning rate is
`BASE_LEARNING_RATE * sqrt(N / 256) * f` (f = 1 is the earlier study's square-root rule,
f = 4 at N = 4,096 linear scaling); warmup `WARMUP_EPOCHS` epochs, then a cosine to 0.
`--task shapes` runs the same study on a task with more headroom, the generated
image-text set (`SHAPES_FULL`: 60,000 pictures of 32 px written on first use, small CNN
towers: `tasks.TASKS["shapes"]`; image -> caption and back on 1,000 validation pictures;
N in 256, 1,024, 4,096 at five rates, three seeds, no control or noise scale: the
machine's time), into
`experiments/results/critical_batch_study_shapes/`.

Two stages, resumable:

1. **tuning**: N in `BATCH_SIZES` x f in `LR_FACTORS` on the first seed;
2. **seeds**: every seed in turn (a budget cut leaves whole seeds). Each N's rate is
   chosen once, on the tuning seed at the middle target (`control_factors`). The
   second seed checks the tuning: it repeats every rate that was the tuning seed's best
   at one target or more; later seeds repeat the chosen rate. Every seed runs the
   **control**, DCL (the positive out of the denominators) at N in
   `CONTROL_BATCH_SIZES` at the chosen rate: if the small batch's deficit is in the
   objective (the positive's coupling to few negatives), DCL closes it.

What it reports (`summary.md`, `results.json`, `steps_to_target.png`):

* **steps to a target**: the first step at which validation R@1 (the mean of both
  directions) reaches each of `TARGETS`, linearly interpolated between evaluations; per
  N and rate the mean over seeds with its 95% t-interval; per N the best rate among
  those run with every seed. A best factor at the edge of the grid is marked.
* **McCandlish's curve**: ``S(N) = S_min + E_min / N`` (steps S, examples E = N S; the
  model's ``(S / S_min - 1)(E / E_min - 1) = 1``) fitted by least squares over the N that
  reach the target, giving ``B_crit = E_min / S_min``; fitted again per seed for B_crit's
  95% interval.
* **the replicate noise scale** (`noise_scale.compare`) at the final state of each N's best
  run on the first seed: `REPLICATES` global batches at n and n / 4 (each with its own
  negatives) for n in `NOISE_BATCHES`: ``B_simple``, the variance ratio (4 when the noise
  scales as 1 / n) and the objective's bias ``|E g_{n/4} - E g_n|^2``. Cached in
  `noise.json`. Both streams start at step 0, so the batches at n / 4 are the first ones
  at n cut in four, not independent: withdrawn (docs/batch_size_study.md);
  `critical_batch_constant_lr` measures from disjoint batches.

Run (from the repository root; resumable: rerun the same command after a kill, finished
runs and noise measurements are skipped, and so are the runs in the committed
`results.json`):
  .venv/bin/python -m experiments.studies.critical_batch_study             # the grid, results committed
  .venv/bin/python -m experiments.studies.critical_batch_study --seeds 0   # one seed of it
  .venv/bin/python -m experiments.studies.critical_batch_study --hours 1   # no run starts after 1 h;
                                                                   # reports what finished
  .venv/bin/python -m experiments.studies.critical_batch_study --quick     # CI: slices of the data
  .venv/bin/python -m experiments.studies.critical_batch_study --task shapes   # the image-text set
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contrastive_jax.config_lib import override
from contrastive_jax.data.builtin import shapes
from experiments.lib import critical_batch_fit, intervals, query_hits, replicates, sweep, target_steps, tasks

EPOCHS = 6.0
EVALS_PER_EPOCH = 2
BATCH_SIZES = (256, 512, 1024, 2048, 4096)
LR_FACTORS = (1.0, 2.0, 4.0, 8.0)  # on the tuning seed, the first in SEEDS
CONTROL_BATCH_SIZES = (256, 1024, 4096)  # DCL at CLIP's best rate
SEEDS = (0, 1, 2)
BASE_LEARNING_RATE = 1e-3  # AdamW's peak at N = 256 and f = 1
WARMUP_EPOCHS = 0.5
TARGETS = (0.80, 0.84, 0.86, 0.88, 0.90)  # validation R@1, mean of both directions
NOISE_BATCHES = (1024, 4096)
REPLICATES = 16


def learning_rate(n: int, factor: float) -> float:
    """AdamW's peak learning rate at global batch `n`: the square-root rule times `factor`."""
    return BASE_LEARNING_RATE * math.sqrt(n / 256) * factor


def study_run(n: int, factor: float, seed: int, *, epochs: float, train_size: int, loss: str = "clip") -> sweep.Run:
    """The run at global batch `n`, learning-rate factor `factor` and `seed` (`loss`: CLIP,
    or DCL for the control; a DCL run's name and tags say so)."""
    rate = learning_rate(n, factor)
    steps_per_epoch = train_size / n
    num_steps = math.ceil(epochs * steps_per_epoch)
    eval_every = max(1, round(steps_per_epoch / EVALS_PER_EPOCH))
    overrides = {
        **sweep.run_overrides(num_steps=num_steps, seed=seed, warmup_steps=round(WARMUP_EPOCHS * steps_per_epoch)),
        "train.global_batch_size": n,
        "optim.learning_rate": rate,
        "eval.every_steps": eval_every,
        "checkpoint.every_steps": eval_every * 4,
    }
    tags = {"batch_size": n, "lr_factor": factor, "learning_rate": rate, "seed": seed}
    name = f"n{n}_lr{factor:g}_s{seed}"
    if loss != "clip":
        overrides["loss.name"] = loss
        tags["loss"] = loss
        name = f"{loss}_{name}"
    return sweep.Run(name, tags | {"steps": num_steps}, overrides)


def tuning_runs(batch_sizes: Sequence[int], factors: Sequence[float], seed: int, **run_args) -> list[sweep.Run]:
    """The learning-rate grid on the tuning seed: every N with every factor."""
    return [study_run(n, factor, seed, **run_args) for n in batch_sizes for factor in factors]


def replicated_factors(records: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> dict[int, list[float]]:
    """Per N, the factors that are the tuning seed's best at one of `targets` or more:
    the ones the other seeds repeat."""
    factors: dict[int, set[float]] = {}
    for target in targets:
        for n, entry in target_steps.best_runs(records, target).items():
            factors.setdefault(n, set()).add(entry["lr_factor"])
    return {n: sorted(f) for n, f in sorted(factors.items())}


def replicate_runs(factors: Mapping[int, Sequence[float]], seeds: Sequence[int], **run_args) -> list[sweep.Run]:
    """Each N's `factors` again with every seed in `seeds`, seed by seed."""
    return [study_run(n, f, seed, **run_args) for seed in seeds for n, fs in factors.items() for f in fs]


def control_factors(records: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> dict[int, float]:
    """Per N, the rate of the DCL control: CLIP's best in `records` (the tuning seed's) at
    the middle target, or, where N misses it, at the highest lower target it reaches
    (none reached: the factor whose run ends at the highest validation R@1, the smaller
    on a tie)."""
    clip = sorted((r for r in records if target_steps.is_clip(r)), key=lambda r: r["lr_factor"])
    chosen = {}
    for n in {r["batch_size"] for r in clip}:  # max keeps the first, the smaller factor, on a tie
        ends = [r for r in clip if r["batch_size"] == n]
        chosen[n] = max(ends, key=lambda r: target_steps.validation_curve(r)[-1, 1])["lr_factor"]
    for target in targets[: len(targets) // 2 + 1]:
        chosen.update({n: entry["lr_factor"] for n, entry in target_steps.best_runs(records, target).items()})
    return chosen


def fit_mccandlish(batch_sizes: Sequence[int], steps: Sequence[float]) -> dict[str, float]:
    """`S(N) = S_min + E_min / N` by least squares: `s_min`, `e_min`, `b_crit = E_min /
    S_min` and the fit's largest relative residual (needs two or more N)."""
    n = np.asarray(batch_sizes, np.float64)
    s = np.asarray(steps, np.float64)
    design = np.column_stack([np.ones_like(n), 1 / n])
    (s_min, e_min), *_ = np.linalg.lstsq(design, s, rcond=None)
    residual = float(np.max(np.abs(design @ [s_min, e_min] - s) / s))
    return {"s_min": float(s_min), "e_min": float(e_min), "b_crit": float(e_min / s_min), "max_residual": residual}


def noise_scales(base, runs: Sequence[sweep.Run], best: Mapping[int, Mapping], out, noise_batches, count) -> dict:
    """`noise_scale.compare` at the final state of each N's best run on the tuning seed
    (`runs`), for each n in `noise_batches` (cached in `out/noise.json`: a rerun measures
    only what is new; a run read from the committed results has no checkpoint to measure)."""
    from contrastive_jax.training import noise_scale

    cache_file = out / "noise.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    for n, entry in sorted(best.items()):
        run = next((r for r in runs if (r.tags["batch_size"], r.tags["lr_factor"]) == (n, entry["lr_factor"])), None)
        if run is None:
            continue
        name, config = run.name, override(base, run.overrides)
        for size in noise_batches:
            key = f"{name}@{size}"
            workdir = str(out / "runs" / name)
            if key not in cache and not os.path.isdir(os.path.join(workdir, "checkpoints")):
                print(f"[noise] {key}: no checkpoint in {workdir} (delete the run's record to retrain it)", flush=True)
            elif key not in cache:
                print(f"[noise] {key}: {count} replicates at {size} and at {size // 4}", flush=True)
                at_n, _ = replicates.gradients(config, workdir, size, count)
                at_quarter, _ = replicates.gradients(config, workdir, size // 4, count)
                cache[key] = {"run": name, "batch_size": n, "n": size, **noise_scale.compare(at_n, at_quarter, size)}
                cache_file.write_text(json.dumps(cache, indent=1))
    return cache


def final_hits(records: Sequence[Mapping[str, Any]], rates: Mapping[int, float], out, split: str) -> dict:
    """`query_hits.cached_hits` on `split` (the test split, read here only) for every run at
    its N's rate in `rates` (CLIP and DCL, every seed), cached in `out/final.json`."""
    names = [r["name"] for r in records if r["lr_factor"] == rates.get(r["batch_size"])]
    return query_hits.cached_hits(names, out, split)


def _fits(best: Mapping[int, Mapping[str, Any]]) -> str:
    """McCandlish's fit over every N that reached the target, and over those from the N
    that needed the fewest examples on (the model has the examples grow with N: a
    smaller N needing more examples is outside it; left out when that is every N); with
    several seeds, the fit of each seed's steps (at the rates chosen on the mean) and the
    95% t-interval of B_crit."""
    fewest = min(best, key=lambda n: best[n]["steps"] * n) if best else None
    text = ""
    for label, ns in (
        ("every N", sorted(best)),
        ("N >= the fewest-examples N", [n for n in sorted(best) if n >= fewest]),
    ):
        if len(ns) < 2 or (label != "every N" and ns == sorted(best)):
            continue
        fit = fit_mccandlish(ns, [best[n]["steps"] for n in ns])
        text += (
            f"\nMcCandlish's S(N) = S_min + E_min / N over {label} ({', '.join(f'{n:,}' for n in ns)}): "
            f"S_min = {fit['s_min']:.0f} steps, E_min = {fit['e_min']:,.0f} examples, "
            f"**B_crit = {fit['b_crit']:,.0f}** (largest relative residual {fit['max_residual']:.2f}).\n"
        )
        seeds = sorted(set.intersection(*(set(best[n]["by_seed"]) for n in ns)))
        if len(seeds) > 1:
            by_seed = [fit_mccandlish(ns, [best[n]["by_seed"][seed] for n in ns])["b_crit"] for seed in seeds]
            text += (
                f"Each seed's fit: B_crit = {', '.join(f'{b:,.0f}' for b in by_seed)} (seeds "
                f"{', '.join(map(str, seeds))}); mean {np.mean(by_seed):,.0f} "
                f"± {intervals.t_interval(by_seed):,.0f} (95%).\n"
            )
    fits = critical_batch_fit.fit_ranges(target_steps.steps_by_seed(best), sorted(best)[:3])
    if fits:
        text += (
            "\nS(N) = S_min (1 + B_crit / N) on relative residuals (`critical_batch_fit`), with a 95% bootstrap "
            "over the seeds within each N, against the range fitted:\n\n" + critical_batch_fit.range_table(fits)
        )
    return text


def _control_table(records: Sequence[Mapping[str, Any]], targets: Sequence[float]) -> str:
    """DCL against CLIP at the same N, rate and seeds: steps to each target (mean ± 95%)."""
    controls = [r for r in records if not target_steps.is_clip(r)]
    if not controls:
        return ""
    rows = []
    for n, factor in sorted({(r["batch_size"], r["lr_factor"]) for r in controls}):
        seeds = sorted(r["seed"] for r in controls if (r["batch_size"], r["lr_factor"]) == (n, factor))
        cells = []
        for target in targets:
            for clip in (True, False):
                by_seed = target_steps.reached_steps(records, target, clip=clip).get((n, factor), {})
                cells.append(intervals.mean_and_interval([by_seed.get(seed) for seed in seeds]))
        rows.append([f"{n:,}", f"{factor:g}", len(seeds), *cells])
    header = ["N", "f", "seeds", *(f"{loss} to {t:.2f}" for t in targets for loss in ("CLIP", "DCL"))]
    return (
        "\n## The objective apart from the noise: DCL against CLIP at the same rate and seeds\n\n"
        "Steps to validation R@1 (mean ± 95% t-interval over the seeds; `-`: a seed missed it).\n\n"
        + sweep.markdown_table(rows, header)
    )


def _final_table(records: Sequence[Mapping[str, Any]], final: Mapping[str, Mapping], rates: Mapping[int, float]) -> str:
    """The test split at each N's rate (`final`'s runs at another rate, chosen on
    fewer runs, left out): R@1 both ways over the seeds measured (mean ± 95%
    t-interval) and its distance to the ceiling; then each doubling of N and DCL against
    CLIP, the difference of the seed-mean hits with its paired bootstrap over queries."""
    runs: dict[tuple[str, int], list[str]] = {}
    for record in records:
        if record["name"] in final and record["lr_factor"] == rates[record["batch_size"]]:
            runs.setdefault((record.get("loss", "clip"), record["batch_size"]), []).append(record["name"])
    if not runs:
        return ""
    rows = []
    for (loss, n), names in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        cells = []
        for direction in query_hits.DIRECTIONS:
            per_seed = [float(final[name][direction].mean()) for name in names]
            ceiling = final[names[0]][f"{direction}/ceiling"]
            cells += [intervals.mean_and_interval(per_seed, decimals=3), f"{ceiling - np.mean(per_seed):.3f}"]
        rows.append([loss.upper(), f"{n:,}", f"{rates[n]:g}", len(names), *cells])
    ceilings = ", ".join(f"{final[names[0]][f'{d}/ceiling']:.3f} {d}" for d in query_hits.DIRECTIONS)
    header = ["loss", "N", "f", "seeds", "R@1 a_to_b", "ceiling - R@1", "R@1 b_to_a", "ceiling - R@1"]
    text = (
        "\n## The test split, read once: R@1 at each N's rate and its distance to the ceiling\n\n"
        f"The best R@1 any model can reach (identical queries rank alike): {ceilings}. R@1: mean ± the 95% "
        "t-interval over the seeds.\n\n" + sweep.markdown_table(rows, header)
    )
    clip_ns = sorted(n for loss, n in runs if loss == "clip")
    pairs = [(("clip", big), ("clip", small)) for small, big in zip(clip_ns, clip_ns[1:], strict=False)]
    pairs += [(("dcl", n), ("clip", n)) for loss, n in sorted(runs) if loss == "dcl" and ("clip", n) in runs]
    rows = []
    for x, y in pairs:
        cells = [
            intervals.difference_cell(*query_hits.seed_mean_difference(final, runs[x], runs[y], direction))
            for direction in query_hits.DIRECTIONS
        ]
        rows.append([f"{x[0].upper()} {x[1]:,} - {y[0].upper()} {y[1]:,}", *cells])
    header = ["comparison", "R@1 a_to_b difference [95%]", "R@1 b_to_a difference [95%]"]
    if not rows:
        return text
    text += (
        f"\nDifferences of the seed-mean R@1 on the same queries, 95% paired bootstrap over the queries "
        f"({intervals.BOOTSTRAP_RESAMPLES:,} resamples):\n\n" + sweep.markdown_table(rows, header)
    )
    rows = []
    for x, y in pairs:
        cells = []
        for direction in query_hits.DIRECTIONS:
            per_seed = [[float(final[name][direction].mean()) for name in runs[key]] for key in (x, y)]
            interval = intervals.welch_interval(*per_seed)
            cells.append(f"{intervals.difference_cell(*interval)}, {intervals.verdict(*interval[1:])}")
        rows.append([f"{x[0].upper()} {x[1]:,} - {y[0].upper()} {y[1]:,}", *cells])
    return text + (
        "\nThe same differences over the seeds (each seed's R@1 one value; 95% Welch interval), with the "
        "verdict each interval allows:\n\n" + sweep.markdown_table(rows, header)
    )


def summary(
    records: Sequence[Mapping[str, Any]],
    targets: Sequence[float],
    noise: Mapping[str, Any],
    final: Mapping[str, Mapping] | None = None,
    rates: Mapping[int, float] | None = None,
    *,
    title: str,
) -> str:
    """The markdown report on the task `title`: per target, each N's steps at every
    learning rate (mean ± 95% over the seeds run), the best, and the fitted curve; the DCL
    control; the noise scales; the test split's table (`final`: `final_hits`, at `rates`)."""
    clip_records = [r for r in records if target_steps.is_clip(r)]
    text = f"# The critical batch on {title}, {len(records)} runs\n"
    factors = sorted({r["lr_factor"] for r in clip_records})
    for target in targets:
        text += f"\n## Steps to validation R@1 {target:.2f} (mean of both directions)\n\n"
        text += "Steps: mean ± the 95% t-interval's half-width over the seeds run (count in brackets).\n\n"
        rows = []
        best = target_steps.best_runs(clip_records, target)
        reached = target_steps.reached_steps(clip_records, target)
        for n in sorted({r["batch_size"] for r in clip_records}):
            cells = []
            for factor in factors:
                by_seed = reached.get((n, factor), {})
                cells.append(
                    intervals.mean_and_interval(list(by_seed.values())) + (f" ({len(by_seed)})" if by_seed else "")
                )
            chosen = best.get(n)
            mark = " (grid edge)" if chosen and chosen["edge"] else ""
            cells.append(f"{chosen['steps']:.0f} at f={chosen['lr_factor']:g}{mark}" if chosen else "not reached")
            cells.append(f"{chosen['steps'] * n:,.0f}" if chosen else "-")
            rows.append([f"{n:,}", *cells])
        header = ["N", *(f"steps, f={f:g}" for f in factors), "best steps", "examples"]
        text += sweep.markdown_table(rows, header)
        text += _fits(best)
    text += _control_table(records, targets)
    if noise:
        text += "\n## The replicate noise scale at the final state of each N's best run (tuning seed)\n\n"
        rows = [
            [
                f"{entry['batch_size']:,}",
                f"{entry['n']:,}",
                f"{entry['b_simple']:,.0f}",
                f"{entry['variance_ratio']:.2f}",
                f"{entry['bias_squared'] / entry['g_squared']:.3f}",
                f"{entry['g_squared']:.3g}",
            ]
            for entry in noise.values()
        ]
        header = ["run's N", "n", "B_simple", "tr Cov(n/4) / tr Cov(n)", "bias² / \\|E g\\|²", "\\|E g_n\\|²"]
        text += sweep.markdown_table(rows, header)
    return text + (_final_table(records, final, rates) if final else "")


def run(args) -> list[dict]:
    """Trains the tuning seed's grid, then seed by seed the other seeds at each N's best
    rates and the DCL control (skipping finished runs), measures the noise scales and the
    final test table, and writes results, the figure and the summary."""
    task = tasks.TASKS[args.task]
    base = tasks.base_config(args.task, args)
    run_args = {"epochs": args.epochs, "train_size": args.train_size}
    grid_args = {"curve_keys": target_steps.CURVES, "deadline": sweep.deadline(args.hours)}
    tuning_seed = args.seeds[0]
    tuning = tuning_runs(args.batch_sizes, args.lr_factors, tuning_seed, **run_args)
    records = sweep.run_grid(base, tuning, args.out, **grid_args)
    factors, rates = replicated_factors(records, args.targets), control_factors(records, args.targets)
    seeds = []
    for i, seed in enumerate(args.seeds):
        if i == 1:  # the tuning checked: every rate that was the tuning seed's best somewhere
            seeds += replicate_runs(factors, [seed], **run_args)
        elif i > 1:  # the rate chosen per N, replicated
            seeds += [study_run(n, rates[n], seed, **run_args) for n in args.batch_sizes]
        seeds += [study_run(n, rates[n], seed, loss="dcl", **run_args) for n in args.control_batch_sizes]
    records += sweep.run_grid(base, seeds, args.out, **grid_args)
    noise = noise_scales(
        base, tuning, target_steps.best_runs(records, args.targets[0]), args.out, args.noise_batches, args.replicates
    )
    sweep.write_results(records, args.out)
    sweep.save(target_steps.plot(records, args.targets, args.train_size, task.curve_floor, rates), args.out)
    final = final_hits(records, rates, args.out, args.final_split)
    if getattr(args, "pictures", 0):  # the generated set names no match keys: its ceiling from its inputs
        write_input_ceilings(base, args.final_split, args.out)
    (args.out / "summary.md").write_text(summary(records, args.targets, noise, final, rates, title=task.title))
    print(f"wrote {args.out}")
    return records


def write_input_ceilings(base, split: str, out) -> dict[str, Any]:
    """`metrics.input_ceilings` of `split` as `base`'s data reads it (the set names no
    match keys: only the pair is right, identical inputs tie), cached in
    `out/ceiling.json` with the split and the method."""
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.evaluation import metrics
    from contrastive_jax.training import run_plan

    path = out / "ceiling.json"
    if path.exists():
        return json.loads(path.read_text())
    arrays = input_pipeline.eval_arrays(run_plan.data_settings(base), split)
    entry = {
        "split": split,
        **metrics.input_ceilings(arrays["a"], arrays["b"]),
        "method": "metrics.input_ceilings: identical inputs embed alike; ties count against the query",
    }
    path.write_text(json.dumps(entry, indent=1))
    return entry


FULL = dict(
    batch_sizes=list(BATCH_SIZES),
    lr_factors=list(LR_FACTORS),
    seeds=list(SEEDS),
    control_batch_sizes=list(CONTROL_BATCH_SIZES),
    epochs=EPOCHS,
    train_size=target_steps.FIT_PAIRS,
    targets=list(TARGETS),
    noise_batches=list(NOISE_BATCHES),
    replicates=REPLICATES,
    final_split="test",
)
# --quick: 2,048 training pairs, 512 validation pairs, N = 64 and 128, two epochs.
QUICK = dict(
    batch_sizes=[64, 128],
    lr_factors=[1.0, 4.0],
    seeds=[0, 1],
    control_batch_sizes=[128],
    epochs=2.0,
    train_size=1024,
    targets=[0.01],
    noise_batches=[128],
    replicates=4,
    final_split="test[:256]",
)

# The generated image-text set (`tasks.TASKS["shapes"]`), a task with headroom: 60,000
# pictures (54,000 train); validation and the final table on 1,000 pictures each, one
# caption per picture; the grid cut to the machine's time.
SHAPES_PICTURES = 60_000
SHAPES_FULL = dict(
    FULL,
    batch_sizes=[256, 1024, 4096],
    lr_factors=[1.0, 2.0, 4.0, 8.0, 16.0],
    seeds=[0, 1, 2],
    control_batch_sizes=[],
    epochs=8.0,
    train_size=shapes.split_sizes(SHAPES_PICTURES)["train"],
    targets=[0.05, 0.10, 0.15, 0.20, 0.30],
    noise_batches=[],
    final_split="test[:1000]",
    pictures=SHAPES_PICTURES,
)
SHAPES_QUICK = dict(QUICK, noise_batches=[], final_split="test[:64]", pictures=1_500)
PRESETS = {"cmudict": (FULL, QUICK), "shapes": (SHAPES_FULL, SHAPES_QUICK)}  # each task's (full, --quick)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=sorted(PRESETS), default="cmudict", help="the data and towers (default cmudict)"
    )
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="global batch sizes N")
    parser.add_argument("--lr-factors", type=sweep.float_list, help="learning-rate factors f (default 1,2,4,8)")
    parser.add_argument("--control-batch-sizes", type=sweep.int_list, help="N of the DCL control")
    parser.add_argument("--epochs", type=float, help=f"epochs per run (default {EPOCHS:g})")
    parser.add_argument("--targets", type=sweep.float_list, help="validation R@1 targets")
    parser.add_argument("--noise-batches", type=sweep.int_list, help="n of the replicate noise scale")
    parser.add_argument("--replicates", type=int, help=f"independent batches per n (default {REPLICATES})")
    sweep.add_hours_option(parser)
    args = parser.parse_args(argv)
    name = "critical_batch_study" + ("" if args.task == "cmudict" else f"_{args.task}")
    args = sweep.resolve(args, name, *PRESETS[args.task])
    if args.steps is not None:
        parser.error("--steps: every run here trains a number of epochs; pass --epochs.")
    return run(args)


if __name__ == "__main__":
    main()
