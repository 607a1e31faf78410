"""The constant-rate protocol of the critical-batch studies (`critical_batch_constant_lr`,
`negatives_vs_noise`): each run trains with a linear warmup over `WARMUP_STEPS` steps
whatever N, then a constant peak rate on the sqrt(2) grid (`rate_grid`), validated every
`EVAL_EXAMPLES` training examples, in segments of `SEGMENT_EVALS` evaluations, stopping
after the segment that reaches the highest target, after `PATIENCE_EVALS` evaluations
without a new best, or at `MAX_EPOCHS` epochs (`study_run`, `finished`).

Its stages (`run_stages`), over the settings of a study (the N of the constant-rate study,
the N or the negatives of an arm of `negatives_vs_noise`), each setting a value of the
records' field `by`:

1. **tuning**, on the first seed, setting by setting: the rate steps around the setting's
   first step, then the neighbour beyond the best while the best is at an edge (`tune`);
2. **seeds**: every other seed at each setting's tuned rate and both its neighbours
   (`seed_runs`); then, while a setting's best at the highest target (over every seed) is
   at the edge of the rates every seed ran, every seed at the rate beyond it (`edge_runs`).

A study passes `make_run(setting, rate_step, seed) -> sweep.Run` (`study_run` with the
study's run arguments bound, or the study's own around it) and `first_step(setting)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contrastive_jax import run_dir
from experiments.lib import sweep, target_steps, tasks
from experiments.lib.rate_grid import learning_rate, rate_step_of, step_beyond_edge

WARMUP_STEPS = 20  # the same at every N
EVAL_EXAMPLES = 32_768  # validation every this many training examples (at least every step)
SEGMENT_EVALS = 4  # evaluations per training segment (the stop is checked between segments)
PATIENCE_EVALS = 12  # no new best validation R@1 in this many evaluations: the run stops
MAX_TUNING_RATES = 6  # rate steps tuned per N at most
MAX_EPOCHS = 16.0  # the cap
# The protocol's options (`add_options`) at their full values and at --quick's (1,024
# training pairs, at most 2 epochs, validation every 256 examples, 3 rates tuned).
PROTOCOL = dict(
    train_size=target_steps.FIT_PAIRS,
    max_epochs=MAX_EPOCHS,
    eval_examples=EVAL_EXAMPLES,
    max_tuning_rates=MAX_TUNING_RATES,
)
QUICK_PROTOCOL = dict(train_size=1024, max_epochs=2.0, eval_examples=256, max_tuning_rates=3)


def study_run(
    n: int,
    rate_step: int,
    seed: int,
    *,
    train_size: int,
    max_epochs: float,
    eval_examples: int,
    segment_evals: int = SEGMENT_EVALS,
) -> sweep.Run:
    """The run at N = `n`, rate step `rate_step` and `seed`: constant rate after
    `WARMUP_STEPS`, validated every `eval_examples` training examples (at least every
    step), capped at `max_epochs` epochs of `train_size` pairs, a checkpoint every
    `segment_evals` evaluations (`run_grid`'s stop is checked there), every one kept
    (the noise scale is measured along the run, the plateau's test at its best)."""
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
        "checkpoint.every_steps": every * segment_evals,
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


def tune(
    base, setting: int, seed: int, targets, out: Path, *, make_run: Callable, first_step: int, grid_args, most: int
) -> list[dict]:
    """The tuning runs at `setting` on `seed` (`make_run(setting, rate_step, seed)`): the
    three steps around `first_step`, then the neighbour beyond the best
    (`best_tuning_run`) while it is at an edge, up to `most` rates (stops early when the
    budget leaves a run unstarted)."""
    runs = [make_run(setting, k, seed) for k in (first_step - 1, first_step, first_step + 1)]
    while True:
        records = sweep.run_grid(base, runs, out, **grid_args)
        step = next_rate_step(records, targets) if len(records) == len(runs) else None
        if step is None or len(runs) >= most:
            return records
        runs.append(make_run(setting, step, seed))


def tuned_steps(
    records: Sequence[Mapping[str, Any]], seed: int, targets: Sequence[float], by: str = "batch_size"
) -> dict[int, int]:
    """`{setting: rate step}`: each setting's (each value of field `by`) best tuning run
    on `seed` (`best_tuning_run`)."""
    by_setting: dict[int, list] = {}
    for record in (r for r in records if r["seed"] == seed):
        by_setting.setdefault(record[by], []).append(record)
    return {setting: best_tuning_run(rs, targets)["rate_step"] for setting, rs in sorted(by_setting.items())}


def seed_runs(tuned: Mapping[int, int], seeds: Sequence[int], make_run: Callable) -> list[sweep.Run]:
    """Seed by seed, each setting's tuned rate step and both its neighbours (`make_run`)."""
    return [make_run(s, k + d, seed) for seed in seeds for s, k in tuned.items() for d in (-1, 0, 1)]


def best_by_n(records: Sequence[Mapping[str, Any]], target: float, by: str = "batch_size") -> dict[int, dict[str, Any]]:
    """`target_steps.best_runs` (the fewest mean steps among the rates run with every seed a
    setting, a value of field `by`, has) with `rate_steps` added (the rate steps run with
    every seed, a miss included) and `edge` redone per setting: the best is the smallest
    or largest of those."""
    best = target_steps.best_runs(records, target, by=by)
    reached = target_steps.reached_steps(records, target, by=by)
    for n, entry in best.items():
        full = sorted(f for (m, f), by_seed in reached.items() if m == n and len(by_seed) == entry["seeds"])
        entry["rate_steps"] = [rate_step_of(f) for f in full]
        entry["edge"] = len(full) > 1 and entry["lr_factor"] in (full[0], full[-1])
    return best


def edge_runs(
    records: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    target: float,
    most: int,
    make_run: Callable,
    by: str = "batch_size",
) -> list[sweep.Run]:
    """The seeds stage's grid grown as the tuning grows seed 0's: every one of `seeds` at
    the rate step beyond each setting's best at `target` (`best_by_n`) where that best is
    at the edge of the rates every seed ran, while fewer than `most` of those."""
    runs = []
    for setting, entry in best_by_n(records, target, by).items():
        if entry["edge"] and len(entry["rate_steps"]) < most:
            step = step_beyond_edge(entry["rate_steps"], rate_step_of(entry["lr_factor"]))
            runs += [make_run(setting, step, seed) for seed in seeds]
    return runs


def run_stages(
    base,
    settings: Sequence[int],
    seeds: Sequence[int],
    targets: Sequence[float],
    out: Path,
    *,
    make_run: Callable,
    first_step: Callable[[int], int],
    grid_args: Mapping[str, Any],
    most: int,
    write_partial: Callable[[list[dict]], None],
    by: str = "batch_size",
) -> tuple[list[dict], dict[int, int]]:
    """`(records, tuned rate steps)`: tunes each of `settings` on the first of `seeds`
    (`tune`), then runs the other seeds at the tuned rate and its neighbours
    (`seed_runs`), and every seed beyond an edge best at the highest of `targets`
    (`edge_runs`, up to `most` rates); finished runs skipped (`sweep.run_grid` with
    `grid_args`), `write_partial(records)` after each setting and stage."""
    records = []
    for setting in settings:
        records += tune(base, setting, seeds[0], targets, out, make_run=make_run, first_step=first_step(setting),
                        grid_args=grid_args, most=most)  # fmt: skip
        write_partial(records)
    tuned = tuned_steps(records, seeds[0], targets, by)
    for seed in seeds[1:]:
        records += sweep.run_grid(base, seed_runs(tuned, [seed], make_run), out, **grid_args)
        write_partial(records)
    while runs := edge_runs(records, seeds, targets[-1], most, make_run, by):
        grown = sweep.run_grid(base, runs, out, **grid_args)
        records = list(({r["name"]: r for r in records} | {r["name"]: r for r in grown}).values())
        write_partial(records)
        if len(grown) < len(runs):  # the budget left a run unstarted
            break
    return records, tuned


def reuse_table(
    records: Sequence[Mapping[str, Any]],
    targets: Sequence[float],
    train_size: int,
    by: str = "batch_size",
    label: str = "N",
) -> str:
    """The data each N saw and the runs the cap censored, at the highest of `targets`: per
    setting (a value of field `by`, headed `label`), one optimizer batch's share of the
    `train_size` pairs, the cap, the runs, those that reach the target, stopped without
    it on patience or at the cap (censored: their steps to it unknown), the best rate's
    epochs to it (`best_by_n`; optimizer batches), and the peak validation R@1 of the runs
    at the rates every seed ran (min–max); then the targets below every such peak, the
    ones a plateau cannot set."""
    target = targets[-1]
    best = best_by_n(records, target, by)
    rows, peaks = [], {}
    for setting in sorted({r[by] for r in records}):
        runs = [r for r in records if r[by] == setting]
        n = runs[0]["batch_size"]
        curves = {r["name"]: target_steps.validation_curve(r) for r in runs}
        missed = [r for r in runs if target_steps.steps_to_target(curves[r["name"]], target) is None]
        censored = [r for r in missed if curves[r["name"]][-1, 0] >= r["max_steps"]]
        seeds = {k: {r["seed"] for r in runs if r["rate_step"] == k} for k in {r["rate_step"] for r in runs}}
        full = [r for r in runs if len(seeds[r["rate_step"]]) == max(map(len, seeds.values()))]
        peaks[setting] = [float(curves[r["name"]][:, 1].max()) for r in full]
        epochs = f"{best[setting]['steps'] * n / train_size:.1f}" if setting in best else "-"
        rows.append([f"{setting:,}", f"{100 * n / train_size:.1f}%", f"{runs[0]['max_steps']:,}", len(runs),
                     len(runs) - len(missed), len(missed) - len(censored),
                     ", ".join(f"k={r['rate_step']} s{r['seed']}" for r in censored) or "0", epochs,
                     f"{min(peaks[setting]):.3f}–{max(peaks[setting]):.3f}"])  # fmt: skip
    header = [label, "batch / split", "cap (steps)", "runs", f"reach {target:g}", "stopped on patience",
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


def setup(args, task: str = "cmudict") -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """`(base config, run arguments, run_grid arguments)` of a constant-rate study's
    `args`: `task`'s config (`tasks.base_config`; cmudict: `configs/cmudict_clip.py` on the
    `fit` split validated on `validation`; --quick: slices of both), `study_run`'s
    `train_size`, `max_epochs` and `eval_examples`, and `sweep.run_grid`'s curves, deadline
    (`--hours`) and stop (the highest of `args.targets` reached, or patience: `finished`)."""
    target = args.targets[-1]
    run_args = {"train_size": args.train_size, "max_epochs": args.max_epochs, "eval_examples": args.eval_examples}
    grid_args = {
        "curve_keys": target_steps.CURVES,
        "deadline": sweep.deadline(args.hours),
        "stop_when": lambda workdir: finished(workdir_curve(workdir), target),
    }
    return tasks.base_config(task, args), run_args, grid_args


def add_options(parser) -> None:
    """The options of a constant-rate study's protocol: --targets, --max-epochs,
    --eval-examples, --max-tuning-rates and --hours (`sweep.add_hours_option`)."""
    parser.add_argument("--targets", type=sweep.float_list, help="validation R@1 targets (the last stops a run)")
    parser.add_argument("--max-epochs", type=float, help=f"each run's cap (default {MAX_EPOCHS:g})")
    parser.add_argument("--eval-examples", type=int, help=f"examples between validations (default {EVAL_EXAMPLES:,})")
    parser.add_argument("--max-tuning-rates", type=int, help=f"rates tuned per setting at most ({MAX_TUNING_RATES})")
    sweep.add_hours_option(parser)


def check_args(parser, args) -> None:
    """`parser.error` for what no constant-rate study takes: `--steps` (each run trains to
    its target or its cap), targets out of increasing order (the last stops each run)."""
    if args.steps is not None:
        parser.error("--steps: each run trains to its target or its cap; pass --max-epochs.")
    if sorted(args.targets) != list(args.targets):
        parser.error(f"--targets {args.targets}: give them in increasing order (the last stops each run).")
