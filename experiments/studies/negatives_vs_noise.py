"""More negatives or less noise? Two arms that move one of what a larger batch brings and
hold the other (issue 56, items 1-3), under the constant-rate protocol of
`critical_batch_constant_lr` (`constant_rate`: `configs/cmudict_clip.py` on cmudict's
`fit` split, a warmup of `WARMUP_STEPS` steps then a constant rate on the sqrt(2) grid
tuned per setting, validation R@1 every `EVAL_EXAMPLES` examples, `PATIENCE_EVALS`,
the cap of `MAX_EPOCHS` epochs, every seed at the tuned rate and its neighbours, edge runs).

* **fixed K** (the negatives held, the batch grown): CLIP within disjoint groups of
  `GROUP_SIZE` = K global rows (`config.loss.group_size`), each row against its group's K
  columns, while the optimizer batch N grows over `FIXED_K_BATCHES`. The rate's first
  step is the square-root rule's at N (`rate_grid.first_rate_step`). B_crit is fitted
  over its N (`critical_batch_fit`, the bootstrap with the curve's misfit and the
  weighting table): with the negatives fixed, does S(N) still bend at a knee, and where?
  N stops at 8,192: the plain study's knee lies between 2,048 and 4,096, and fixing the
  negatives can only keep it or move it down (what a larger N then brings is less
  noise alone), so 8,192 is past it either way; a run at 16,384 took about 20 min on
  2 CPU cores in the constant-rate study, and the arm's ten of them would be about a
  third of this study's time.
* **fixed N** (the batch held, the negatives grown): N = `FIXED_BATCH` gradient rows and
  M = C - N extra rows a step embedded without gradient, only negatives
  (`config.loss.extra_negatives`, `training.forward`), so each row's softmax runs
  over C = N + M columns for C in `FIXED_N_NEGATIVES` (M = 0 ... 7,680). The rate's first
  step is N's, whatever M. Do more negatives at a fixed N buy steps? (Welch's difference
  of the steps at the fewest and the most negatives.)

The records' setting: N (field `batch_size`) in the fixed-K arm, the negatives C (field
`negatives`) in the fixed-N arm; both arms tag `batch_size` (the optimizer's N),
`negatives` and their option (`group_size` or `extra_negatives`). The K = 512, N = 512
run of the fixed-K arm and the M = 0 run of the fixed-N arm are the plain CLIP run at
N = 512 (a group of N rows is the whole batch); each arm runs its own.

**Targets** `TARGETS`: validation R@1 0.80, 0.82, 0.84, 0.86, the last stopping a run.
The constant-rate study's runs peak at 0.873-0.889 at N = 256 and stop at 0.882-0.896
at N = 512 (the smallest setting here), so 0.80-0.86 lie below every N's peak there
(`docs/batch_size_study.md`), while 0.88, its highest, sits at the small N's plateau,
where steps to a target blow up at the rate's noise floor rather than the batch's. Both
arms start at the plain N = 512 run; K = 512 groups and extra negatives at N = 512 are
not expected to lower that plateau by 0.02 (the report's peaks say whether they did).

**The noise stage**: the replicate noise scale (B_simple, B_adam; `noise_stage`) at
`NOISE_POINTS` steps along each setting's chosen run on the first `NOISE_SEEDS` seeds,
`REPLICATES` batches at n and n / 4, with the run's own loss. Fixed K: n = 4K and n / 4
= K, whatever N: a replicate's gradient is the mean of its n / K groups' gradients, each
group an independent unit of K examples, so B_simple's estimate (in examples) does not
depend on n once both hold whole groups, and 16 of each fit in one epoch at every N.
Fixed N: n = N, the run's own batches, and its n / 4 side the same batches (N rows and the
run's M extra) with a quarter of the rows as queries (`noise_stage.noise_at`'s
`quarter_queries`): each query's loss, its N + M columns and which of them carry gradient
are the run's; only the number of queries averaged changes. At C >= 4,096 the 2 x 16
batches of C rows read more than an epoch: the stream's next epoch (its own order) goes
on, so those batches are draws of the split, not disjoint ones.

**The plateau** (issue 69, item 1; `plateau`): what more negatives buy in final quality,
not speed. The plain loss and fixed K at `PLATEAU_BATCHES` (the arm's ends; at N = K the
plain runs stand for both), each N at its tuned rate (the plain loss's from
`PLAIN_RESULTS`, fixed K's from its arm's runs, both at the highest target) as the peak of
a cosine decay over each budget of `plateau.EPOCHS` (each twice the one before), on every
seed; the test split read at each run's best checkpoint and its last. No budget here is
past N = 512's plateau, so the answer is read from the doubling: do the gaps between N
close (more negatives reach the plateau sooner) or hold (they raise it)?

**The second task** (issue 69, item 2; `--task shapes_vit`, `SHAPES_FULL`): the generated
image-text set with a ViT for the pictures (`tasks.TASKS["shapes_vit"]`), `SHAPES_PICTURES`
pictures written on first use, validated on 1,000. The deciding pair alone (`--arms`): the
plain loss, an arm of its own here (the cmudict study reads it from `PLAIN_RESULTS`), and
fixed K = 64 over N = 64, 256, 1,024 (this task's knee lies below 512: `SHAPES_FULL`'s
comment), then the plateau stage at N = 64 and 1,024 over `SHAPES_PLATEAU_EPOCHS`; no noise
stage.

The report (`summary.md`, in `negatives_vs_noise_shapes_vit/` for the second task; each
arm's runs in `<arm>/results.{json,csv}`, its noise in
`<arm>/noise.json`; `steps_to_target.png`): per arm and target each setting's best rate
and steps (mean, 95% t over the seeds); fixed K: B_crit over every N with its interval
(misfit included), the lack of fit, the arm against the plain loss at each N (its arm's
runs, else the constant-rate study's, `PLAIN_RESULTS`: `plain_contrast`) and, at the highest target
with a fit, B_crit by weighting and with each N left out; fixed N: the steps at the
fewest negatives less those at the most, with Welch's 95% interval, and their ratio; per
setting the data seen, the censored runs and the targets below every setting's peak
(`constant_rate.reuse_table`); each arm's noise table (with `noise_stage.per_example_words`),
the fixed-K arm's set against its B_crit, the fixed-N arm's at each run's last measured
state by number of negatives, B_simple split into |E g|² and tr Σ
(`noise_stage.noise_by_setting`); the plateau's table and differences (`plateau.summary`;
its runs in `plateau/results.{json,csv}`, their test hits in `plateau/final.json`).

Run (from the repository root; rerun the same command to go on):
  .venv/bin/python -m experiments.studies.negatives_vs_noise --hours 8   # no run starts after 8 h
  .venv/bin/python -m experiments.studies.negatives_vs_noise --hours 0   # the report from what finished
  .venv/bin/python -m experiments.studies.negatives_vs_noise --quick     # CI: slices of the data
  .venv/bin/python -m experiments.studies.negatives_vs_noise --task shapes_vit --hours 2   # the second task
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contrastive_jax.data.builtin import shapes
from experiments import RESULTS
from experiments.lib import (
    constant_rate,
    critical_batch_fit,
    intervals,
    noise_stage,
    plateau,
    query_hits,
    sweep,
    target_steps,
    tasks,
)
from experiments.lib.constant_rate import WARMUP_STEPS
from experiments.lib.rate_grid import first_rate_step, rate_step_of

GROUP_SIZE = 512  # K of the fixed-K arm
FIXED_K_BATCHES = (512, 1024, 2048, 4096, 8192)  # its optimizer batches N
FIXED_BATCH = 512  # N of the fixed-N arm
FIXED_N_NEGATIVES = (512, 1024, 2048, 4096, 8192)  # its columns N + M (M = 0 ... 7,680)
SEEDS = (0, 1, 2)
TARGETS = (0.80, 0.82, 0.84, 0.86)  # validation R@1, mean of both directions; the last stops a run
REPLICATES = 16  # independent batches at each of n and n / 4
NOISE_POINTS = 4  # steps measured along each run, spread evenly, the last included
NOISE_SEEDS = 3  # the first seeds at each setting's chosen rate
PLATEAU_BATCHES = (512, 8192)  # the plateau stage's N: the fixed-K arm's ends
PLAIN_RESULTS = RESULTS / "critical_batch_constant_lr"  # the plain loss's runs (negatives = N), the same protocol


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: its name (its results' folder), the records' field its settings are
    values of (`by`: `batch_size` or `negatives`), the settings, and K (fixed K: the
    groups; 0 with `by` `batch_size`: the plain loss, the plateau's reference) or N
    (fixed N: the optimizer's batch)."""

    name: str
    by: str
    settings: tuple[int, ...]
    group_size: int = 0
    batch_size: int = 0

    def batch_of(self, setting: int) -> int:
        """The optimizer's batch N at `setting`."""
        return setting if self.by == "batch_size" else self.batch_size

    def run(self, setting: int, rate_step: int, seed: int, **run_args) -> sweep.Run:
        """`constant_rate.study_run` at this arm's N for `setting`, with its loss option
        (`loss.group_size` K, or `loss.extra_negatives` M = C - N) in its overrides and
        tags, and `negatives` (the columns of each row's softmax: K or C) tagged."""
        n = self.batch_of(setting)
        plain = constant_rate.study_run(n, rate_step, seed, **run_args)
        if self.by == "batch_size" and not self.group_size:  # the plain loss: each row against all N
            return sweep.Run(plain.name, {**plain.tags, "negatives": n}, plain.overrides)
        if self.by == "batch_size":
            option, value, negatives, label = "group_size", self.group_size, self.group_size, f"g{self.group_size}"
        else:
            option, value, negatives, label = "extra_negatives", setting - n, setting, f"m{setting - n}"
        tags = {**plain.tags, option: value, "negatives": negatives}
        return sweep.Run(f"n{n}_{label}_k{rate_step}_s{seed}", tags, {**plain.overrides, f"loss.{option}": value})

    def title(self) -> str:
        """The arm in a line: what it holds and the settings it grows."""
        settings = ", ".join(f"{s:,}" for s in self.settings)
        if self.by == "batch_size" and not self.group_size:
            return f"Plain loss (negatives N), N = {settings}"
        if self.by == "batch_size":
            return f"Fixed K = {self.group_size:,} negatives, N = {settings}"
        return f"Fixed N = {self.batch_size:,}, negatives N + M = {settings}"

    def replicate_rows(self, run: sweep.Run) -> tuple[int, bool]:
        """The noise stage's `(n, quarter_queries)` for `run`: fixed K, n = 4K and batches of
        n / 4 = one group; fixed N, the run's N and a quarter of its batches' rows as
        queries; the plain loss, the run's N and batches of N / 4 rows, each its own negatives."""
        if self.by == "batch_size":
            return 4 * self.group_size or run.tags["batch_size"], False
        return run.tags["batch_size"], True


ARMS = ("plain", "fixed_k", "fixed_n")  # --arms: the names an arm may have, in the order they run


def arms(args, names: Sequence[str] | None = None) -> tuple[Arm, ...]:
    """The arms of `args` that `names` (None: `args.arms`) names, in `ARMS`' order: the
    plain loss over the fixed-K arm's N, fixed K, fixed N."""
    names = args.arms if names is None else names
    every = (
        Arm("plain", "batch_size", tuple(args.fixed_k_batches)),
        Arm("fixed_k", "batch_size", tuple(args.fixed_k_batches), group_size=args.group_size),
        Arm("fixed_n", "negatives", tuple(args.fixed_n_negatives), batch_size=args.fixed_batch),
    )
    return tuple(arm for arm in every if arm.name in names)


def steps_table(records: Sequence[Mapping[str, Any]], target: float, arm: Arm) -> str:
    """Per setting of `arm`, its best rate step at `target` among those every seed ran
    (`constant_rate.best_by_n`, marked at the edge), its steps (mean [95% t] over the
    seeds) and the seeds; a setting none of whose rates reached it in every seed: not reached."""
    best = constant_rate.best_by_n(records, target, arm.by)
    rows = []
    for setting in sorted({r[arm.by] for r in records}):
        entry = best.get(setting)
        if entry is None:
            rows.append([f"{setting:,}", f"{arm.batch_of(setting):,}", "-", "not reached", "-"])
            continue
        steps = list(entry["by_seed"].values())
        k = f"{rate_step_of(entry['lr_factor'])}" + (" (edge)" if entry["edge"] else "")
        rows.append(
            [f"{setting:,}", f"{arm.batch_of(setting):,}", k, intervals.mean_and_interval(steps), entry["seeds"]]
        )
    label = "N" if arm.by == "batch_size" else "negatives N + M"
    return sweep.markdown_table(rows, [label, "optimizer batch N", "best rate step k", "steps (mean ± 95% t)", "seeds"])


def fixed_k_section(records: Sequence[Mapping[str, Any]], target: float) -> tuple[str, dict | None]:
    """The words at `target` of an arm over N (fixed K, or the plain loss): B_crit over
    every N (`critical_batch_fit`'s bootstrap, the misfit included) with the lack of fit
    and S_N - 2 S_2N; and the fit (None where fewer than the fit's N reach it)."""
    steps_by_n = target_steps.steps_by_seed(constant_rate.best_by_n(records, target))
    fits = critical_batch_fit.fit_ranges(steps_by_n, sorted(steps_by_n)[:1])
    if not fits:
        return "", None
    fit = fits[0]
    return (
        f"\nS(N) = S_min (1 + B_crit / N) over N from {fit['from']:,} ({fit['points']} N), "
        f"{negatives_words(records)}: {critical_batch_fit.b_crit_words(fit)}, S_min = "
        f"{fit['s_min']:.0f} steps. {critical_batch_fit.lack_of_fit_words(fit)} "
        f"{critical_batch_fit.halving_words(steps_by_n)}\n"
    ), fit


def negatives_words(records: Sequence[Mapping[str, Any]]) -> str:
    """The negatives of an arm over N, from its `records`: "K = <K> negatives" (fixed K) or
    "negatives N" (the plain loss)."""
    group_size = records[0].get("group_size", 0)
    return f"K = {group_size:,} negatives" if group_size else "negatives N"


def plain_contrast(records: Sequence[Mapping[str, Any]], plain: Sequence[Mapping[str, Any]], target: float) -> str:
    """The fixed-K arm against the plain loss (each row against all N: `plain`, the
    records of `PLAIN_RESULTS`, the same protocol) at `target`, over the N both reached
    it at: per N each one's best steps and fixed K's over the plain's
    (`intervals.ratio_cell`: above 1, what the negatives beyond K saved at N); from the
    smallest of those N to the largest, each one's steps' fall (the plain's: less noise
    and more negatives; fixed K's: less noise alone); and the plain loss's B_crit fitted
    over the same N (`critical_batch_fit.bootstrap`). Empty when fewer than 2 N are shared."""
    grouped_best, plain_best = constant_rate.best_by_n(records, target), constant_rate.best_by_n(plain, target)
    shared = sorted(set(grouped_best) & set(plain_best))
    if len(shared) < 2:
        return ""
    grouped_steps, plain_steps = target_steps.steps_by_seed(grouped_best), target_steps.steps_by_seed(plain_best)
    rows = [
        [f"{n:,}", intervals.mean_and_interval(plain_steps[n]), intervals.mean_and_interval(grouped_steps[n]),
         intervals.ratio_cell(grouped_steps[n], plain_steps[n])]
        for n in shared
    ]  # fmt: skip
    group_size = records[0]["group_size"]
    table = sweep.markdown_table(
        rows, ["N", "plain: steps (negatives N)", f"fixed K: steps (negatives {group_size:,})", "fixed K / plain"]
    )
    small, large = shared[0], shared[-1]
    fit = critical_batch_fit.bootstrap({n: plain_steps[n] for n in shared})
    return (
        "\nAgainst the plain loss (each row against all N, the same protocol; "
        "ratios of the seeds' geometric means, Welch 95% on the logarithms):\n\n"
        f"{table}\nFrom N = {small:,} to {large:,} the steps fall by a factor of "
        f"{intervals.ratio_cell(plain_steps[small], plain_steps[large])} with the plain loss (less noise and "
        f"more negatives) and {intervals.ratio_cell(grouped_steps[small], grouped_steps[large])} with K = "
        f"{group_size:,} fixed (less noise alone). The plain loss over the same {len(shared)} N: "
        f"{critical_batch_fit.b_crit_words(fit)}. {critical_batch_fit.lack_of_fit_words(fit)}\n"
    )


def fixed_n_contrast(records: Sequence[Mapping[str, Any]], target: float) -> str:
    """The fixed-N arm's answer at `target`: the steps at the fewest negatives less those at
    the most (their best rates, `constant_rate.best_by_n`), with Welch's 95% interval over
    the seeds and `intervals.verdict` (positive: more negatives reach it in fewer steps),
    and the same as a ratio (`intervals.ratio_cell`: fewest over most, the fixed-K arm's
    `plain_contrast` form)."""
    best = constant_rate.best_by_n(records, target, "negatives")
    if len(best) < 2:
        return ""
    fewest, most = min(best), max(best)
    steps_fewest, steps_most = (list(best[c]["by_seed"].values()) for c in (fewest, most))
    difference, low, high = intervals.welch_interval(steps_fewest, steps_most)
    bounds = "[n/a]" if low != low else f"[{low:+,.0f}, {high:+,.0f}]"
    return (
        f"\nSteps at {fewest:,} negatives less steps at {most:,} (N = {records[0]['batch_size']:,} both): "
        f"{difference:+,.0f} {bounds} (Welch, 95%), {intervals.verdict(low, high)}; as a ratio, "
        f"{intervals.ratio_cell(steps_fewest, steps_most)} (of the geometric means, Welch 95% on the logarithms).\n"
    )


def steps_figure(
    by_arm: Mapping[Arm, Sequence[Mapping[str, Any]]],
    targets: Sequence[float],
    plain: Sequence[Mapping[str, Any]] = (),
) -> dict:
    """`steps_to_target`: per arm a panel of each target's best steps (mean, 95% t over
    the seeds) against the arm's setting, log-log, the dotted line perfect scaling from
    the smallest setting; on the fixed-K panel the `plain` loss's at the highest target,
    dashed grey, over the arm's N."""
    fig, _ = sweep.new_figure("steps to a validation R@1 target, rate tuned per setting", ncols=len(by_arm))
    for axis, (arm, records) in zip(fig.axes, by_arm.items(), strict=True):  # fig.axes: a list, one arm too
        for target, color in zip(targets, sweep.colors(len(targets), "viridis"), strict=True):
            best = constant_rate.best_by_n(records, target, arm.by)
            if not best:
                continue
            xs = sorted(best)
            steps = [best[x]["steps"] for x in xs]
            axis.errorbar(xs, steps, yerr=target_steps.error_bars(best, xs), marker="o", capsize=3, color=color,
                          label=f"R@1 {target:.2f}")  # fmt: skip
            axis.plot(xs, [steps[0] * xs[0] / x for x in xs], ls=":", color=color)
        plain_best = constant_rate.best_by_n(plain, targets[-1]) if arm.group_size else {}
        xs = sorted(n for n in plain_best if n in arm.settings)
        if xs:
            axis.errorbar(
                xs, [plain_best[x]["steps"] for x in xs], yerr=target_steps.error_bars(plain_best, xs), marker="s",
                capsize=3, color="grey", ls="--", label=f"plain loss, R@1 {targets[-1]:.2f}",
            )  # fmt: skip
        if records:
            sweep.log_spaced_ticks(axis, sorted({r[arm.by] for r in records}))
            axis.legend(fontsize=7)
        label = {"plain": "N (negatives N)", "fixed_k": f"optimizer batch N (groups of K = {arm.group_size:,})",
                 "fixed_n": f"negatives N + M (N = {arm.batch_size:,})"}[arm.name]  # fmt: skip
        axis.set(xlabel=label, ylabel="steps (dotted: perfect scaling)", yscale="log", title=arm.name)
    return {"steps_to_target": fig}


def arm_summary(
    arm: Arm,
    records: Sequence[Mapping[str, Any]],
    targets: Sequence[float],
    noise,
    train_size: int,
    plain: Sequence[Mapping[str, Any]] = (),
) -> str:
    """One arm's part of the report (`module docstring`): per target its steps table and
    its fit with `plain_contrast` against the `plain` records (fixed K), its fit (the plain
    loss) or its contrast (fixed N); the weighting table at the highest target with a fit;
    the data each setting saw and its censored runs (`constant_rate.reuse_table`, epochs
    of `train_size` pairs); its noise table, an arm over N's against its B_crit, the
    fixed-N arm's by setting (`noise_stage.noise_by_setting`)."""
    text = f"\n## {arm.title()} ({len(records)} runs)\n"
    if not records:
        return text + "\nNo run finished yet.\n"
    shared = sorted({r["batch_size"] for r in records if r.get("stand_in")})
    if shared:
        text += (
            f"\nAt N = {', '.join(f'{n:,}' for n in shared)} the plain loss's runs stand for this arm's (one group).\n"
        )
    headline = None
    for target in targets:
        text += f"\n### Steps to validation R@1 {target:g}\n\n" + steps_table(records, target, arm)
        if arm.by == "negatives":
            text += fixed_n_contrast(records, target)
            continue
        words, fit = fixed_k_section(records, target)
        text += words + (plain_contrast(records, plain, target) if arm.group_size else "")
        headline = (target, fit) if fit else headline
    if headline:
        steps_by_n = target_steps.steps_by_seed(constant_rate.best_by_n(records, headline[0]))
        text += (f"\n### B_crit at R@1 {headline[0]:g} by weighting and with each N left out\n\n"
                 + critical_batch_fit.weighting_table(steps_by_n))  # fmt: skip
    label = "N" if arm.by == "batch_size" else "N + M"
    text += constant_rate.reuse_table(records, targets, train_size, arm.by, label).replace("\n## ", "\n### ")
    if arm.by == "negatives":
        text += "\nEach step reads N + M pairs of the stream; the epochs and the cap count the N trained on.\n"
    if noise:
        text += noise_stage.noise_table(noise, arm.by, f"run's {label}").replace("\n## ", "\n### ")
        if arm.by == "negatives":
            text += noise_stage.noise_by_setting(noise, arm.by, label)
        if headline:
            reaching = {
                (r["batch_size"], r["lr_factor"], r["seed"]): target_steps.validation_curve(r)
                for r in records
                if target_steps.steps_to_target(target_steps.validation_curve(r), headline[0]) is not None
            }
            text += noise_stage.noise_against_b_crit(noise, *headline, reaching)
    return text


def summary(
    by_arm: Mapping[Arm, Sequence[Mapping[str, Any]]],
    targets: Sequence[float],
    noise_by_arm,
    train_size: int,
    plain: Sequence[Mapping[str, Any]] = (),
    task: str = "cmudict",
) -> str:
    """The markdown report on `task` (a name in `tasks.TASKS`): the protocol in a line, then
    each arm's `arm_summary` (the fixed-K arm's against the `plain` loss's records)."""
    arm_names = " and ".join(arm.name for arm in by_arm)
    text = (
        f"# More negatives or less noise: {arm_names} on {tasks.TASKS[task].title}, constant rate after "
        f"{WARMUP_STEPS} warmup steps\n\n"
        "Steps: mean ± the 95% t-interval's half-width over the seeds, at each setting's best rate step k "
        "(peak rate 1e-3 · 2^(k/2)) among those every seed ran; (edge): the best is the smallest or largest of "
        "those. B_crit's interval: `critical_batch_fit.bootstrap` (the seeds resampled within each N, each N's "
        "mean times 1 + tau z for the curve's misfit tau); resolved: the interval lies inside the N fitted. "
        "A difference is resolved when its 95% interval leaves out 0.\n"
    )
    for arm, records in by_arm.items():
        text += arm_summary(arm, records, targets, noise_by_arm.get(arm), train_size, plain)
    return text


def write_partial(arm: Arm, records: Sequence[Mapping[str, Any]], args) -> None:
    """The arm's `results.{json,csv}` of the runs finished so far, between stages:
    `records` over the committed records of the same names (the committed ones of runs
    not visited yet kept)."""
    sweep.write_merged(records, args.out / arm.name)


def plateau_run(arm: Arm, n: int, rate: tuple[int, bool], seed: int, epochs: float, args) -> sweep.Run:
    """`arm`'s plateau run at N = `n`: `rate` (`plateau.tuned_steps`' `(step, tuned)`) the
    peak of a cosine decay to 0 over `epochs` epochs, validated `plateau.EVAL_SPACING` x
    less often, a checkpoint every `plateau.SEGMENT_EVALS` evaluations; tagged with its
    arm, budget, `tuned` and checkpoint cadence (`plateau.checkpoint_steps`)."""
    spacing = {"eval_examples": plateau.EVAL_SPACING * args.eval_examples, "segment_evals": plateau.SEGMENT_EVALS}
    run = arm.run(n, rate[0], seed, train_size=args.train_size, max_epochs=epochs, **spacing)
    every = run.overrides["checkpoint.every_steps"]
    tags = {**run.tags, "arm": arm.name, "epochs": epochs, "tuned": rate[1], "checkpoint_every": every}
    overrides = {**run.overrides, "optim.schedule": "cosine", "optim.end_learning_rate_factor": 0.0}
    return sweep.Run(f"{run.name}_e{epochs:g}", tags, overrides)


def plateau_stage(
    base, args, deadline, plain: Sequence[Mapping[str, Any]], fixed_k: Sequence[Mapping[str, Any]]
) -> str:
    """The plateau stage (`plateau`): the plain loss and fixed K at `args.plateau_batches`,
    each N at its tuned rate (the plain loss's from its records `plain`, its arm's or the
    constant-rate study's; fixed K's from its arm's `fixed_k`), at each budget of
    `args.plateau_epochs`, seed by seed (`args.plateau_seeds`: every budget and N on a seed
    before the next seed); at N = K the plain runs stand for both (a group of K rows is the
    batch). Its runs and test hits in `<out>/plateau/` (`results.{json,csv}`,
    `final.json`); returns its report (`plateau.summary`)."""
    plain_arm, grouped = arms(args, ("plain", "fixed_k"))
    settings, target = args.plateau_batches, args.targets[-1]
    rates = {arm.name: plateau.tuned_steps(records, settings, target, first_rate_step)
             for arm, records in ((plain_arm, plain), (grouped, fixed_k))}  # fmt: skip
    shared = [n for n in settings if n == args.group_size]
    runs = [plateau_run(arm, n, rates[arm.name][n], seed, epochs, args)
            for seed in args.plateau_seeds for epochs in args.plateau_epochs for n in settings
            for arm in ((plain_arm, grouped) if n not in shared else (plain_arm,))]  # fmt: skip
    out = args.out / "plateau"
    records = sweep.run_grid(base, runs, out, curve_keys=target_steps.CURVES, deadline=deadline)
    sweep.write_merged(records, out)  # the runs of other rates, seeds, N or budgets kept, left out of this report
    hits = query_hits.cached_hits(plateau.hit_names(records), out, args.test_split)
    by_arm = {arm.name: [r for r in records if r["arm"] == arm.name] for arm in (plain_arm, grouped)}
    return plateau.summary(by_arm, hits, args.train_size, shared=shared, budgets=args.plateau_epochs)


def run(args) -> dict[str, list[dict]]:
    """Each arm's stages (`constant_rate.run_stages`; finished runs skipped), then each
    arm's noise stage on its chosen runs, the plateau stage (with the fixed-K arm), the
    figure and the summary. Returns each arm's records by its name."""
    base, run_args, grid_args = constant_rate.setup(args, args.task)
    target = args.targets[-1]
    by_arm, noise_by_arm = {}, {}
    for arm in arms(args):
        make_run = functools.partial(arm.run, **run_args)
        shared = [n for n in arm.settings if arm.group_size == n and "plain" in args.arms]  # the plain runs stand in
        by_arm[arm], tuned = constant_rate.run_stages(
            base, [s for s in arm.settings if s not in shared], args.seeds, args.targets, args.out / arm.name,
            make_run=make_run, first_step=lambda setting, arm=arm: first_rate_step(arm.batch_of(setting)),
            grid_args=grid_args, most=args.max_tuning_rates,
            write_partial=functools.partial(write_partial, arm, args=args), by=arm.by,
        )  # fmt: skip
        sweep.write_results(by_arm[arm], args.out / arm.name)
        plain_ran = next((records for ran, records in by_arm.items() if ran.name == "plain"), [])
        by_arm[arm] += stand_ins(plain_ran, shared, arm.group_size)
        best = constant_rate.best_by_n(by_arm[arm], target, arm.by)
        chosen = {s: rate_step_of(best[s]["lr_factor"]) if s in best else k for s, k in tuned.items()}
        measured = [make_run(s, k, seed) for seed in args.seeds[: args.noise_seeds] for s, k in chosen.items()]
        noise_by_arm[arm] = noise_stage.noise_scales(
            base, measured, args.out / arm.name, args, grid_args["deadline"], arm.replicate_rows
        )
    by_name = {arm.name: records for arm, records in by_arm.items()}
    plain = plain_records(by_name, args.plain_results)
    plateau_words = ""
    if "fixed_k" in by_name and args.plateau_seeds:
        plateau_words = plateau_stage(base, args, grid_args["deadline"], plain, by_name["fixed_k"])
    sweep.save(steps_figure(by_arm, args.targets, plain), args.out)
    text = summary(by_arm, args.targets, noise_by_arm, args.train_size, plain, args.task)
    (args.out / "summary.md").write_text(text + plateau_words)
    print(f"wrote {args.out}")
    return by_name


def stand_ins(plain: Sequence[Mapping[str, Any]], shared: Sequence[int], group_size: int) -> list[dict]:
    """The `plain` arm's records at the N in `shared` (N = K: a group of K rows is the whole
    batch) as fixed K's, tagged `group_size` K and `stand_in` (the report says so)."""
    return [{**r, "group_size": group_size, "stand_in": "plain"} for r in plain if r["batch_size"] in shared]


def arm_names(text: str) -> list[str]:
    """Parses --arms: names of `ARMS`, comma-separated."""
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(ARMS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: name one or more of {', '.join(ARMS)}, comma-separated")
    return names


def plain_records(by_name: Mapping[str, Sequence[dict]], folder: Path | None) -> list[dict]:
    """The plain loss's records: its arm's (`by_name["plain"]`) where it ran here, else the
    committed ones in `folder` (`--plain-results`; None: none)."""
    if "plain" in by_name:
        return list(by_name["plain"])
    return list(sweep.committed_records(folder).values()) if folder else []


FULL = dict(
    arms=["fixed_k", "fixed_n"],
    group_size=GROUP_SIZE,
    fixed_k_batches=list(FIXED_K_BATCHES),
    fixed_batch=FIXED_BATCH,
    fixed_n_negatives=list(FIXED_N_NEGATIVES),
    seeds=list(SEEDS),
    targets=list(TARGETS),
    **constant_rate.PROTOCOL,
    replicates=REPLICATES,
    noise_points=NOISE_POINTS,
    noise_seeds=NOISE_SEEDS,
    plain_results=PLAIN_RESULTS,
    plateau_seeds=list(SEEDS),
    plateau_epochs=list(plateau.EPOCHS),
    plateau_batches=list(PLATEAU_BATCHES),
    test_split="test",
)
# --quick: 1,024 training pairs, 256 validation pairs; fixed K: groups of 32, N = 32 and 64;
# fixed N: N = 64, negatives 64 and 128; at most 2 epochs, validation every 256 examples,
# 3 rates tuned (no edge runs), 2 seeds, 4 replicates at the last step of each run on the first seed;
# the plateau at N = 32 and 64 over 0.5 and 1 epoch, seed 0; no plain loss's records to set
# the fixed-K arm against (none ran this protocol).
QUICK = dict(
    arms=["fixed_k", "fixed_n"],
    group_size=32,
    fixed_k_batches=[32, 64],
    fixed_batch=64,
    fixed_n_negatives=[64, 128],
    seeds=[0, 1],
    targets=[0.005, 0.01],
    **constant_rate.QUICK_PROTOCOL,
    replicates=4,
    noise_points=1,
    noise_seeds=1,
    plain_results=None,
    plateau_seeds=[0],
    plateau_epochs=[0.5, 1.0],
    plateau_batches=[32, 64],
    test_split="test[:256]",
)


# The second task (issue 69, item 2): the generated image-text set with a ViT for the
# pictures (`tasks.TASKS["shapes_vit"]`), the deciding pair alone (the plain loss, its own
# arm here, against fixed K = 64) over N = 64 ... 1,024, on SHAPES_PICTURES pictures. Not
# cmudict's 512 ... 8,192: on this task N = 512 is already past the knee (seed 0's tuning:
# N = 2,048 took more steps to validation R@1 0.60 than 512, so a run at 8,192 would read
# some 16x 512's 0.5 M examples, about 2 h here, for each of some 20 runs an arm), so the
# range moves down 8x to hold the knee; the plateau's budgets double from 4 epochs.
SHAPES_PICTURES = 300_000
SHAPES_PLATEAU_EPOCHS = (4.0, 8.0)
SHAPES_FULL = dict(
    FULL,
    arms=["plain", "fixed_k"],
    group_size=64,
    fixed_k_batches=[64, 256, 1024],
    plateau_batches=[64, 1024],
    targets=[0.40, 0.50, 0.60],
    noise_seeds=0,
    plateau_epochs=list(SHAPES_PLATEAU_EPOCHS),
    plain_results=None,
    train_size=shapes.split_sizes(SHAPES_PICTURES)["train"],
    pictures=SHAPES_PICTURES,
    test_split="test[:1000]",
)
# --quick on it: 1,500 pictures (1,024 trained on, 64 validated), the quick arms' N.
SHAPES_QUICK = dict(QUICK, arms=["plain", "fixed_k"], noise_seeds=0, pictures=1_500, test_split="test[:64]")
PRESETS = {"cmudict": (FULL, QUICK), "shapes_vit": (SHAPES_FULL, SHAPES_QUICK)}  # each task's (full, --quick)


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(PRESETS), default="cmudict", help="the data and towers (cmudict)")
    parser.add_argument("--arms", type=arm_names, help=f"the arms run, of {', '.join(ARMS)} (cmudict: fixed_k,fixed_n)")
    parser.add_argument("--group-size", type=int, help=f"K of the fixed-K arm (default {GROUP_SIZE})")
    parser.add_argument("--fixed-k-batches", type=sweep.int_list, help="the fixed-K arm's optimizer batches N")
    parser.add_argument("--fixed-batch", type=int, help=f"N of the fixed-N arm (default {FIXED_BATCH})")
    parser.add_argument("--fixed-n-negatives", type=sweep.int_list, help="the fixed-N arm's negatives N + M")
    parser.add_argument("--replicates", type=int, help=f"independent batches at n and n / 4 (default {REPLICATES})")
    parser.add_argument("--noise-points", type=int, help=f"steps measured along each run (default {NOISE_POINTS})")
    parser.add_argument("--noise-seeds", type=int, help=f"seeds measured at each setting (default {NOISE_SEEDS})")
    parser.add_argument(
        "--plain-results", type=Path, help="the plain loss's results folder to set the fixed-K arm against "
        f"(default {PLAIN_RESULTS.relative_to(RESULTS.parent.parent)}; --quick: none)"
    )  # fmt: skip
    parser.add_argument("--plateau-seeds", type=sweep.int_list, help="the plateau stage's seeds (default 0,1,2)")
    parser.add_argument(
        "--plateau-epochs",
        type=sweep.float_list,
        help=f"its budgets (default {','.join(f'{e:g}' for e in plateau.EPOCHS)})",
    )
    parser.add_argument(
        "--plateau-batches", type=sweep.int_list, help=f"its N, of --fixed-k-batches (default {PLATEAU_BATCHES})"
    )
    parser.add_argument("--test-split", help="the split the plateau's checkpoints are tested on (default test)")
    constant_rate.add_options(parser)
    args = parser.parse_args(argv)
    name = "negatives_vs_noise" + ("" if args.task == "cmudict" else f"_{args.task}")
    args = sweep.resolve(args, name, *PRESETS[args.task])
    constant_rate.check_args(parser, args)
    if any(n % args.group_size for n in args.fixed_k_batches) or min(args.fixed_n_negatives) < args.fixed_batch:
        parser.error(
            f"--group-size {args.group_size} must divide every --fixed-k-batches {args.fixed_k_batches}, and "
            f"--fixed-n-negatives {args.fixed_n_negatives} be at least --fixed-batch {args.fixed_batch} (M >= 0)."
        )
    if args.plateau_seeds and (
        not set(args.plateau_batches) <= set(args.fixed_k_batches) or min(args.plateau_epochs, default=1) <= 0
    ):
        parser.error(
            f"--plateau-batches {args.plateau_batches} must be among --fixed-k-batches {args.fixed_k_batches} (their "
            f"rates are tuned there), and --plateau-epochs {args.plateau_epochs} positive."
        )
    if args.replicates * 5 * args.group_size > args.train_size:
        parser.error(
            f"--replicates {args.replicates}: the fixed-K arm's {args.replicates} x (4K + K) replicate examples "
            f"(K = {args.group_size}) must fit in one epoch of {args.train_size:,}."
        )
    return run(args)


if __name__ == "__main__":
    main()
