"""Does a batch-size schedule pay? A stage schedule and the noise-scale rule against the best
constant batch (issue 55, item 3), under the constant-rate protocol of
`critical_batch_constant_lr` (`constant_rate`: `configs/cmudict_clip.py` on cmudict's `fit`
split, a warmup of `WARMUP_STEPS` steps then a constant rate on the sqrt(2) grid tuned per
arm, validation R@1 both ways on `validation` every `EVAL_EXAMPLES` examples at most,
`PATIENCE_EVALS`, a cap of `MAX_EPOCHS` epochs, every seed at the tuned rate and both its
neighbours, edge runs).

The arms (`config.train.batch_schedule`, `training/batch_schedule.py`), both from N = 512:

* **stages** `STAGES` = ``512@0,2048@32,4096@64``: 512 for steps 1-32, 2,048 for 33-64,
  4,096 from step 65 on. Chosen from the constant-rate study's own runs
  (`experiments/results/critical_batch_constant_lr/`): through the warmup a larger batch
  buys nothing (R@1 at step 16 is 0.12-0.24 at the best rates from N = 2,048 to 16,384),
  and the replicate noise scale a quarter of the way is B_simple 47-174 (below 512); Adam's
  B_adam measured along the 2,048 and 4,096 runs is 322-733 at steps 24-32, 731-2,541 at
  steps 48-64 and 1,312-11,003 from step 72, so each stage's batch is about B_adam at its
  first step (the last a floor); and the last stage stops where a larger batch stops
  buying steps (between 2,048 and 4,096).
* **noise** (`"noise"`): start at 512, and after every `NOISE_WINDOW_STEPS` = 16 steps double
  the batch when the in-training B_simple over those steps exceeds `NOISE_FACTOR` = 1 x N,
  up to `BATCH_MAX` = 4,096 (the stages' last). The rule keeps N between B_simple and
  2 B_simple; at the constant runs' ends B_crit (2,157 at R@1 0.88) is 1.6 x their
  B_simple (1,330), inside that bracket, where the default factor 2 (N between B_simple / 2
  and B_simple) is not. A pilot at N = 512 (rate step 3) read the device-share B_simple
  155-247 over its 16-step windows up to step 80 (validation R@1 0.05-0.68), so the rule
  keeps 512 early and doubles once the noise scale passes it.

**The rate.** Rate step k is the first stage's rate (``1e-3 * 2 ** (k / 2)`` at N = 512,
tuned from `rate_grid.first_rate_step(512)` as the constant study tunes N = 512); each
later batch N takes it times sqrt(N / 512) (`LR_SCALING` = "sqrt", `optim.lr_scaling`): the
constant study's tuned steps rise about one sqrt(2) step per doubling of N (k = 3 at 512,
5 at 1,024, 6 at 2,048, 6-7 at 4,096), which is the square-root rule; the linear rule's two
steps per doubling would put 4,096 at k = 9, the worst rate tried at 8,192. The warmup
counts steps and is not restarted by a change.

**Cadence, patience and cap.** An arm's runs are validated every round(`EVAL_EXAMPLES` /
4,096) = 8 steps, the constant 4,096 runs' cadence: at the last batch every 32,768
examples as the constant runs, earlier stages more often (a finer grid for the same
interpolation). A run stops on patience after 8 x `PATIENCE_EVALS` = 96 evaluations
without a new best (`Arm.patience`): N = 512's patience in examples while at 512, so a
noise run that stays there is not stopped sooner than the constant 512 runs; longer at a
larger batch. The stages' cap is the step at which they have read `MAX_EPOCHS` epochs;
the noise arm's is that of N = 512 (the most steps it can need).

**The constant batches are not rerun**: the committed records of `critical_batch_constant_lr`
(`CONSTANT_RESULTS`, seeds 0, 1, 2 at every N) ran this protocol (`constant_rate.study_run`:
the same warmup, grid, patience and cap; `comparable` checks each record's evaluation
steps and cap against it). They stopped at R@1 0.88, above the highest target here, so
their steps to 0.80-0.86 come from the same curves. `--constant-batches` runs them here
instead (`--quick`: its slices of the data).

**Targets** `TARGETS` 0.80-0.86: below every constant N's lowest peak (0.873;
`constant_rate.reuse_table`), the last stopping an arm's runs. **Measures**: steps and
training examples to each target, linearly interpolated between evaluations (examples:
the curve's steps mapped through each run's stages, `examples_at`; the noise arm's from its
logged decisions), each at the arm's or N's best rate among those every seed ran
(`constant_rate.best_by_n`). **The comparison**: each arm against the constant N with the
fewest steps and the one with the fewest examples, the ratio of the seeds' geometric means
with Welch's 95% interval on the logarithms (`intervals.ratio_interval`); resolved when it leaves out
1 (a difference's interval leaving out 0, as `docs/batch_size_study.md` uses the word).

The report (`summary.md`, `results.{json,csv}` with both arms' runs, `curves.png`): per target
each constant N's and each arm's steps and examples (mean, 95% t over the seeds), the
ratios to the best constants with their verdicts; each arm's runs by rate and batch path;
the constants' data seen and the targets below every peak; R@1 against steps and against
examples at each best rate.

Run (from the repository root; rerun the same command to go on):
  .venv/bin/python -m experiments.studies.batch_schedule --hours 3   # no run starts after 3 h
  .venv/bin/python -m experiments.studies.batch_schedule --hours 0   # the report from what finished
  .venv/bin/python -m experiments.studies.batch_schedule --quick     # CI: slices of the data
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments import RESULTS
from experiments.lib import constant_rate, intervals, sweep, target_steps
from experiments.lib.constant_rate import PATIENCE_EVALS, WARMUP_STEPS
from experiments.lib.rate_grid import first_rate_step, rate_step_of

STAGES = "512@0,2048@32,4096@64"  # the stage arm's config.train.batch_schedule
BATCH_MAX = 4096  # the noise arm's largest batch
NOISE_FACTOR = 1.0  # the noise arm doubles N when B_simple > this x N
NOISE_WINDOW_STEPS = 16  # steps whose noise scale one decision reads
LR_SCALING = "sqrt"  # the rate at batch N: the first stage's times sqrt(N / N_0)
SEEDS = (0, 1, 2)
TARGETS = (0.80, 0.82, 0.84, 0.86)  # validation R@1, mean of both directions; the last stops a run
CONSTANT_RESULTS = RESULTS / "critical_batch_constant_lr"  # the constant batches' committed records
DECISIONS = "batch/next_global_batch"  # a noise decision's batch after its step (metrics.jsonl)
CURVES = (*target_steps.CURVES, "train/global_batch", DECISIONS, "batch/noise_scale")  # and each decision's B_simple


def stage_list(schedule: str) -> list[tuple[int, int]]:
    """`[(step, N), ...]` of a stage schedule `"N@step,..."`: N for the steps after step."""
    return [(int(step), int(n)) for n, step in (part.split("@") for part in schedule.split(","))]


def examples_at(stages: Sequence[tuple[int, int]], steps) -> np.ndarray:
    """The training examples read by the steps up to each of `steps` under `stages`
    (`[(s_i, N_i), ...]`, N_i examples a step after step s_i)."""
    steps = np.asarray(steps, np.float64)
    ends = [s for s, _ in stages[1:]] + [math.inf]
    return sum(n * np.clip(np.minimum(steps, end) - s, 0, None) for (s, n), end in zip(stages, ends, strict=True))


def record_stages(record: Mapping[str, Any]) -> list[tuple[int, int]]:
    """A run's stages: a constant N's one, a stage schedule's, or the noise arm's from its
    logged decisions (a doubling after step s: the new N from step s + 1)."""
    schedule = record.get("schedule", "constant")
    if schedule == "constant":
        return [(0, record["batch_size"])]
    if schedule != "noise":
        return stage_list(schedule)
    stages = [(0, record["batch_size"])]
    for step, batch in record["curves"].get(DECISIONS, []):
        if int(batch) != stages[-1][1]:
            stages.append((int(step), int(batch)))
    return stages


def in_examples(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`records` with their validation curves against training examples instead of steps,
    so that `target_steps` / `constant_rate.best_by_n` read examples to a target."""
    keys = [f"eval/{m}" for m in target_steps.METRICS]
    converted = []
    for record in records:
        stages = record_stages(record)
        curves = {k: [[float(examples_at(stages, s)), v] for s, v in record["curves"][k]] for k in keys}
        converted.append({**record, "curves": {**record["curves"], **curves}})
    return converted


@dataclasses.dataclass(frozen=True)
class Arm:
    """One schedule: its name, `config.train.batch_schedule` (stages, or "noise" with the
    rule's factor, window and largest batch), the first batch and the rate's rule."""

    name: str
    schedule: str
    start: int
    lr_scaling: str = LR_SCALING
    batch_max: int = 0
    noise_factor: float = NOISE_FACTOR
    noise_window_steps: int = NOISE_WINDOW_STEPS

    @property
    def largest(self) -> int:
        """The largest batch the schedule can reach."""
        return self.batch_max if self.schedule == "noise" else max(n for _, n in stage_list(self.schedule))

    @property
    def patience(self) -> int:
        """Evaluations without a new best that stop a run: `PATIENCE_EVALS` at the first
        batch's cadence (validation every `eval_examples` / first batch steps), in examples
        while at that batch; longer after (the arms are validated `largest` / first batch
        times as often)."""
        return PATIENCE_EVALS * self.largest // self.start

    def stops(self, curve: np.ndarray, target: float) -> bool:
        """Whether a run of this arm with validation `curve` may stop: it reached `target`,
        or its last `patience` evaluations hold no new best (`constant_rate.finished`)."""
        return constant_rate.finished(curve, target, self.patience)

    def cap(self, max_epochs: float, train_size: int) -> int:
        """The run's cap in steps: the stages' step at `max_epochs` epochs of `train_size`
        pairs; the noise rule's at its first batch (the most steps it can need)."""
        budget = max_epochs * train_size
        if self.schedule == "noise":
            return math.ceil(budget / self.start)
        steps = np.arange(math.ceil(budget / self.start) + 1)
        return int(np.searchsorted(examples_at(stage_list(self.schedule), steps), budget))

    def run(self, start: int, rate_step: int, seed: int, *, train_size: int, max_epochs: float, eval_examples: int):
        """`constant_rate.study_run` at the schedule's largest batch (its cadence: validation
        every `eval_examples` / largest steps), from batch `start` with this schedule and
        rate rule, the rate step the first stage's; capped at `cap`."""
        plain = constant_rate.study_run(self.largest, rate_step, seed, train_size=train_size,
                                        max_epochs=max_epochs, eval_examples=eval_examples)  # fmt: skip
        cap = self.cap(max_epochs, train_size)
        overrides = {**plain.overrides, "train.global_batch_size": start, "train.num_train_steps": cap,
                     "train.batch_schedule": self.schedule, "optim.lr_scaling": self.lr_scaling}  # fmt: skip
        if self.schedule == "noise":
            overrides |= {"train.log_noise_scale": True, "train.batch_max": self.batch_max,
                          "train.batch_noise_factor": self.noise_factor,
                          "train.batch_noise_window_steps": self.noise_window_steps}  # fmt: skip
        tags = {**plain.tags, "batch_size": start, "max_steps": cap, "arm": self.name, "schedule": self.schedule,
                "lr_scaling": self.lr_scaling}  # fmt: skip
        return sweep.Run(f"{self.name}_n{start}_k{rate_step}_s{seed}", tags, overrides)

    def title(self) -> str:
        """The arm in a few words."""
        if self.schedule != "noise":
            return f"stages {self.schedule}"
        return (f"noise: {self.start:,} doubling to {self.batch_max:,} when B_simple > "
                f"{self.noise_factor:g} x N, every {self.noise_window_steps} steps")  # fmt: skip


def arms(args) -> tuple[Arm, Arm]:
    """The stage arm and the noise arm of `args` (both from the stages' first batch)."""
    start = stage_list(args.stages)[0][1]
    return (
        Arm("stages", args.stages, start, args.lr_scaling),
        Arm("noise", "noise", start, args.lr_scaling, args.batch_max, args.noise_factor, args.noise_window_steps),
    )


def measured(records: Sequence[Mapping[str, Any]], target: float) -> dict[str, dict[int, dict[str, Any]]]:
    """`{"steps": best_by_n, "examples": best_by_n of the curves in examples}` at `target`."""
    return {
        "steps": constant_rate.best_by_n(records, target),
        "examples": constant_rate.best_by_n(in_examples(records), target),
    }


def target_section(constants, by_arm: Mapping[Arm, Sequence[Mapping[str, Any]]], target: float) -> str:
    """One target's tables: each constant N's and each arm's best rate, steps and examples
    (thousands; mean ± 95% t over the seeds); then each arm's ratios to the constant with
    the fewest steps and to the one with the fewest examples (`intervals.ratio_cell`)."""
    constant = measured(constants, target)
    rows = []
    for n in sorted({r["batch_size"] for r in constants}):
        rows.append([f"constant N = {n:,}", *measure_cells(constant, n)])
    arm_best = {arm: measured(records, target) for arm, records in by_arm.items()}
    for arm, best in arm_best.items():
        rows.append([arm.title(), *(measure_cells(best, arm.start) if by_arm[arm] else ["-", "no run yet", "", "-"])])
    header = ["arm", "rate step k (steps; examples)", "steps", "examples (thousands)", "seeds"]
    text = f"\n## Validation R@1 {target:g}\n\n" + sweep.markdown_table(rows, header)
    if not all(constant.values()):
        return text + "\nNo constant N reached it with every seed.\n"
    fewest = {key: min(best, key=lambda n, best=best: best[n]["steps"]) for key, best in constant.items()}
    rows = []
    for arm, best in arm_best.items():
        cells = [arm.name]
        for key in ("steps", "examples"):
            entry = best[key].get(arm.start)
            ours = list(entry["by_seed"].values()) if entry else None
            theirs = list(constant[key][fewest[key]]["by_seed"].values())
            cells.append(intervals.ratio_cell(ours, theirs) if ours else "not reached" if by_arm[arm] else "no run yet")
        rows.append(cells)
    header = ["arm", f"steps / N = {fewest['steps']:,}'s (the fewest steps)",
              f"examples / N = {fewest['examples']:,}'s (the fewest examples)"]  # fmt: skip
    return text + "\nAgainst the best constant batch [95%]:\n\n" + sweep.markdown_table(rows, header)


def measure_cells(best: Mapping[str, Mapping[int, Mapping[str, Any]]], setting: int) -> list[str]:
    """The row cells of `setting` in `measured`'s tables: its rate steps, steps, examples
    (thousands) and seeds; `-` where it did not reach the target with every seed."""
    steps, examples = best["steps"].get(setting), best["examples"].get(setting)
    if steps is None or examples is None:
        return ["-", "not reached", "not reached", "-"]
    rates = f"{rate_step_of(steps['lr_factor'])}; {rate_step_of(examples['lr_factor'])}"
    thousands = [v / 1000 for v in examples["by_seed"].values()]
    return [rates, intervals.mean_and_interval(list(steps["by_seed"].values())),
            intervals.mean_and_interval(thousands, 1), steps["seeds"]]  # fmt: skip


def runs_table(arm: Arm, records: Sequence[Mapping[str, Any]], target: float) -> str:
    """An arm's runs at `target`: per rate step the steps (mean ± 95% t, seeds) and each
    seed's peak validation R@1 and, for the noise rule, its batch path (`record_stages`:
    N@step, N from the step after)."""
    reached = target_steps.reached_steps(records, target)
    rows = []
    for k in sorted({r["rate_step"] for r in records}):
        runs = sorted((r for r in records if r["rate_step"] == k), key=lambda r: r["seed"])
        by_seed = reached.get((arm.start, 2 ** (k / 2)), {})
        path = lambda r: ": " + ", ".join(f"{n:,}@{s}" for s, n in record_stages(r)) if arm.schedule == "noise" else ""  # noqa: E731
        paths = "; ".join(
            f"s{r['seed']}{path(r)} (peak {target_steps.validation_curve(r)[:, 1].max():.3f})" for r in runs
        )
        rows.append([k, intervals.mean_and_interval(list(by_seed.values())) + f" ({len(by_seed)})", paths])
    return f"\n### {arm.title()} ({len(records)} runs)\n\n" + sweep.markdown_table(
        rows,
        ["rate step k", f"steps to {target:g}", "each seed's peak R@1 (noise: its batches, N@the step after which)"],
    )


def comparable(constants: Sequence[Mapping[str, Any]], args) -> str:
    """Checks the constant records ran this protocol (each evaluation at a multiple of
    round(`eval_examples` / N) steps or the cap, the cap `max_epochs` epochs, every seed of
    `args.seeds`) and says so in a line; raises ValueError naming a record that did not."""
    for r in constants:
        n, steps = r["batch_size"], [s for s, _ in r["curves"][f"eval/{target_steps.METRICS[0]}"]]
        every, cap = max(1, round(args.eval_examples / n)), math.ceil(args.max_epochs * args.train_size / n)
        if r["max_steps"] != cap or any(s % every and s != cap for s in steps):
            raise ValueError(f"{r['name']}: not this protocol (evaluation every {every} steps, cap {cap}).")
    ns = sorted({r["batch_size"] for r in constants})
    missing = [n for n in ns if {r["seed"] for r in constants if r["batch_size"] == n} < set(args.seeds)]
    if missing:
        raise ValueError(f"the constant records lack a seed of {args.seeds} at N = {missing}.")
    return (
        f"The constant batches (N = {', '.join(f'{n:,}' for n in ns)}; {len(constants)} runs) ran this protocol: "
        f"{WARMUP_STEPS} warmup steps, a constant rate tuned on the sqrt(2) grid, validation every "
        f"round({args.eval_examples:,} / N) steps and a cap of {args.max_epochs:g} epochs (checked on every "
        f"record), patience {PATIENCE_EVALS} evaluations, seeds {', '.join(map(str, args.seeds))}."
    )


def summary(constants, by_arm: Mapping[Arm, Sequence[Mapping[str, Any]]], targets, args, source: str) -> str:
    """The markdown report (the module docstring's list)."""
    text = (
        f"# Batch size as a schedule on cmudict, constant rate after {WARMUP_STEPS} warmup steps\n\n"
        f"Arms from N = {arms(args)[0].start:,}, the rate step k the first batch's (1e-3 · 2^(k/2)), times "
        f"{args.lr_scaling}(N / N_0) at a later N ({args.lr_scaling} rule). Steps and examples: mean ± the 95% "
        "t-interval's half-width over the seeds at each arm's (each N's) best rate among those every seed ran, "
        "for each measure. Ratios: geometric means, Welch's 95% interval on the logs; resolved when it leaves "
        f"out 1. Constant batches: {source}. {comparable(constants, args)}\n"
    )
    for target in targets:
        text += target_section(constants, by_arm, target)
    text += f"\n## Each arm's runs (R@1 {targets[-1]:g})\n"
    for arm, records in by_arm.items():
        text += runs_table(arm, records, targets[-1]) if records else f"\n### {arm.title()}\n\nNo run finished yet.\n"
    return text + constant_rate.reuse_table(constants, targets, args.train_size)


def curves_figure(constants, by_arm: Mapping[Arm, Sequence[Mapping[str, Any]]], target: float) -> dict:
    """`curves`: validation R@1 against steps and against examples of every seed at each
    arm's best rate in steps at `target`, beside the constants at the arms' first and largest
    batches and those with the fewest steps and the fewest examples."""
    fig, axes = sweep.new_figure(f"validation R@1, each arm at its best rate for R@1 {target:g}", ncols=2)
    constant = measured(constants, target)
    ns = {arm.start for arm in by_arm} | {arm.largest for arm in by_arm}
    ns |= {min(best, key=lambda n, best=best: best[n]["steps"]) for best in constant.values() if best}
    groups = {f"constant N = {n:,}": (n, constant["steps"].get(n), constants) for n in sorted(ns)}
    groups |= {arm.name: (arm.start, measured(rs, target)["steps"].get(arm.start), rs) for arm, rs in by_arm.items()}
    for (label, (n, entry, records)), color in zip(groups.items(), sweep.colors(len(groups) + 1, "plasma")[:-1]):
        if entry is None:
            continue
        runs = [r for r in records if (r["batch_size"], r["lr_factor"]) == (n, entry["lr_factor"])]
        for i, (record, in_ex) in enumerate(zip(runs, in_examples(runs), strict=True)):
            for axis, curve in zip(axes, (record, in_ex), strict=True):
                xy = target_steps.validation_curve(curve)
                axis.plot(xy[:, 0], xy[:, 1], color=color, lw=1.5 if "arm" in record else 0.8,
                          label=f"{label}, k={rate_step_of(entry['lr_factor'])}" if i == 0 else None)  # fmt: skip
    for axis, x in zip(axes, ("steps", "training examples"), strict=True):
        axis.set(
            xlabel=x,
            ylabel="validation R@1 (mean of both directions)",
            xscale="log",
            ylim=(max(0.0, target - 0.36), None),
        )
        axis.axhline(target, color="grey", ls=":", lw=0.8)
    axes[0].legend(fontsize=7)
    return {"curves": fig}


def load_constants(args, base, run_args, grid_args) -> tuple[list[dict], str]:
    """`(the constant batches' records, where they come from)`: run here under the protocol
    (`constant_rate.run_stages` at `args.constant_batches` into `args.out`), or, with none
    given, the committed records of `args.constant_results`."""
    if not args.constant_batches:
        records = json.loads((args.constant_results / "results.json").read_text())
        return records, f"the committed records of `{args.constant_results.name}` (not rerun)"
    records, _ = constant_rate.run_stages(
        base, args.constant_batches, args.seeds, args.targets, args.out,
        make_run=functools.partial(constant_rate.study_run, **run_args), first_step=first_rate_step,
        grid_args=grid_args, most=args.max_tuning_rates, write_partial=lambda records: None,
    )  # fmt: skip
    return records, "run here under the same protocol"


def write_partial(records: Sequence[Mapping[str, Any]], out: Path) -> None:
    """`results.{json,csv}` of the runs finished so far (over the committed records of the
    same names; those of runs not visited yet kept)."""
    sweep.write_merged(records, out)


def run(args) -> dict[str, list[dict]]:
    """The constant batches (`load_constants`), then each arm's stages
    (`constant_rate.run_stages`; finished runs skipped), the figure and the summary.
    Returns the records by arm name (and "constant")."""
    base, run_args, grid_args = constant_rate.setup(args)
    grid_args = {**grid_args, "curve_keys": CURVES}
    constants, source = load_constants(args, base, run_args, grid_args)
    done = list(constants) if args.constant_batches else []  # the constants run here are this study's records
    by_arm = {}
    for arm in arms(args):
        stop_when = lambda workdir, arm=arm: arm.stops(constant_rate.workdir_curve(workdir), args.targets[-1])  # noqa: E731
        by_arm[arm], _ = constant_rate.run_stages(
            base, [arm.start], args.seeds, args.targets, args.out, make_run=functools.partial(arm.run, **run_args),
            first_step=first_rate_step, grid_args={**grid_args, "stop_when": stop_when}, most=args.max_tuning_rates,
            write_partial=lambda records, done=tuple(done): write_partial([*done, *records], args.out),
        )  # fmt: skip
        done += by_arm[arm]
    sweep.write_results(done, args.out)
    sweep.save(curves_figure(constants, by_arm, args.targets[-1]), args.out)
    (args.out / "summary.md").write_text(summary(constants, by_arm, args.targets, args, source))
    print(f"wrote {args.out}")
    return {"constant": constants, **{arm.name: records for arm, records in by_arm.items()}}


FULL = dict(
    stages=STAGES,
    batch_max=BATCH_MAX,
    noise_factor=NOISE_FACTOR,
    noise_window_steps=NOISE_WINDOW_STEPS,
    lr_scaling=LR_SCALING,
    constant_batches=[],
    constant_results=CONSTANT_RESULTS,
    seeds=list(SEEDS),
    targets=list(TARGETS),
    **constant_rate.PROTOCOL,
)
# --quick (`constant_rate.QUICK_PROTOCOL`, validation every 512 examples: the arms' every 4
# steps): stages 32 -> 128, the noise rule from 32 to 128 deciding every 2 steps, the
# constant N = 64 run here, 2 seeds.
QUICK = {
    **constant_rate.QUICK_PROTOCOL,
    "eval_examples": 512,
    "stages": "32@0,128@4",
    "batch_max": 128,
    "noise_factor": NOISE_FACTOR,
    "noise_window_steps": 2,
    "lr_scaling": LR_SCALING,
    "constant_batches": [64],
    "constant_results": CONSTANT_RESULTS,
    "seeds": [0, 1],
    "targets": [0.005, 0.01],
}


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--stages", help=f"the stage arm's schedule 'N@step,...' (default {STAGES})")
    parser.add_argument("--batch-max", type=int, help=f"the noise arm's largest batch (default {BATCH_MAX:,})")
    parser.add_argument("--noise-factor", type=float, help=f"double N when B_simple > this x N ({NOISE_FACTOR:g})")
    parser.add_argument("--noise-window-steps", type=int, help=f"steps per decision (default {NOISE_WINDOW_STEPS})")
    parser.add_argument("--lr-scaling", choices=("none", "linear", "sqrt"), help=f"default {LR_SCALING}")
    parser.add_argument("--constant-batches", type=sweep.int_list, help="run these constant N here (default: reuse)")
    parser.add_argument("--constant-results", type=Path, help="the constant records' folder (default: the study's)")
    constant_rate.add_options(parser)
    args = sweep.resolve(parser.parse_args(argv), "batch_schedule", FULL, QUICK)
    constant_rate.check_args(parser, args)
    try:
        stages = stage_list(args.stages)
    except ValueError:
        parser.error(f"--stages {args.stages!r}: give 'N@step,...', e.g. {STAGES}.")
    if stages[0][0] != 0 or args.batch_max < stages[0][1]:
        parser.error(f"--stages {args.stages} must start at step 0, and --batch-max {args.batch_max} be >= its N.")
    return run(args)


if __name__ == "__main__":
    main()
