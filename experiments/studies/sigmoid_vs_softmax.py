"""Sigmoid against softmax at small batch: SigLIP against CLIP at N = 64 … 1,024, each tuned per N,
in two arms: epoch-matched and step-matched.

The epoch-budget study found "SigLIP leads CLIP at 256 and lags at 4,096" with CLIP's
rate rule for both and SigLIP from its paper's start only; here each loss gets its own
tuning at each N. Every run trains `configs/cmudict_clip.py` (two 1-D CNN towers, the
loss over the global batch on 8 simulated CPU devices) on cmudict's `fit` split
(108,000 pairs), AdamW with a warmup of a sixteenth of its steps and a cosine to 0 at
the end, evaluating R@1 both ways on `validation` (13,490 pairs) `EVALS` times along the
run. Two arms, each N in both:

* **epoch-matched**: `EPOCHS` epochs at every N (6,750 steps at N = 64 … 422 at 1,024);
* **step-matched**: every N trains `matched_steps` steps, the steps N = `STEP_MATCHED_N`
  gets at `EPOCHS` epochs (844: twice N = 1,024's 422), so N = 64 sees half an epoch and
  N = 1,024 eight. At N = 512 the arms' runs are the same runs, trained once.

Stages, N by N and arm by arm (a session cut short leaves whole N's):

1. **tuning**, on the first seed, by the final validation R@1 (the test split is never
   read here), one axis at a time, each on a grid around a start: the three steps
   ``s - 1, s, s + 1``, then the neighbour beyond the best while the best is at the edge
   of the steps run and fewer than the axis's cap ran (`next_on_axis`):

   * the peak rate, for each loss: rate step k, ``1e-3 * 2 ** (k / 2)`` (the sqrt(2)
     grid `rate_grid`, centred on the square-root rule `first_rate_step`), at most
     `MAX_RATES` rates; CLIP from its config's temperature 0.07, SigLIP at its paper's
     start (t' = log 10: temperature 0.1; bias -10; Zhai et al. 2023);
   * each loss's initial (learned) temperature at its tuned rate: ``T * 2 ** -j`` (T 0.07
     for CLIP, 0.1 for SigLIP; step j), at most `MAX_INIT_VALUES`;
   * SigLIP's initial bias at its tuned rate and temperature: ``-10 + 5 j``, at most
     `MAX_INIT_VALUES`.
2. **seeds**: both losses at their tuned setting on every other seed (by default 1-5,
   fresh: the tuning seed is left out of the comparison), each run's final checkpoint
   then scored on the test split (`TEST_SPLIT`), R@1 per query both ways
   (`query_hits.cached_hits`, cached in `final.json`, computed at the end of the run
   while its checkpoint is on disk).

The report (`results.{json,csv}`, `final.json`; per arm `epoch_matched/` and
`step_matched/`: `summary.md`, `r1_vs_batch.png`): per N each loss's tuned setting and its
seed-0 validation grid, flagged where the tuned value is at the edge of the steps run;
test R@1 mean ± the 95% t-interval over the seeds; SigLIP − CLIP in test R@1 (the mean of
both directions) with a 95% interval over the seeds and the test queries
(`query_hits.seeds_and_queries`) and its verdict (`intervals.verdict`);
one finding per N. Every run's record is written as it finishes; the report is
regenerated from whatever is complete.

Run (from the repository root; rerun the same command to go on):
  .venv/bin/python -m experiments.studies.sigmoid_vs_softmax --hours 3   # no run starts after 3 h
  .venv/bin/python -m experiments.studies.sigmoid_vs_softmax --hours 0   # the report from what finished
  .venv/bin/python -m experiments.studies.sigmoid_vs_softmax --quick     # CI: slices of the data
The results go to `experiments/results/sigmoid_vs_softmax/v2/`; the folder above holds the
earlier design's (tuned and compared on validation, CLIP's temperature untuned, one arm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.lib import intervals, query_hits, sweep, target_steps, tasks
from experiments.studies import sigmoid_vs_softmax_grid as grid

# A run's time, from the calibration runs on the shared 2-core machine (load average 9-15:
# the constant-rate study's run and tests beside them): seed 0's first tuning run took
# 165 and 199 s at N = 64 (6,750 steps), 156 and 159 s at N = 1,024 (422 steps), so about
# this many seconds per epoch of `fit` (the steps, any N) and per run (compilation,
# evaluations, checkpoints, the test split's hits): 180 s at 4 epochs.
SECONDS_PER_EPOCH = 40.0
SECONDS_PER_RUN_OVERHEAD = 20.0
RESULTS_NAME = "sigmoid_vs_softmax/v2"  # the earlier design's results are in the folder above


def unit_counts(seeds: Sequence[int], max_rates: int, max_init_values: int) -> tuple[int, int]:
    """`(fewest, most)` runs at one N and step count: per loss 3 to `max_rates` rates, then 2
    to `max_init_values - 1` new runs per other axis (the start shared with the axis
    before: CLIP's temperature, SigLIP's temperature and bias); then each loss on every
    seed but the first."""
    axes = sum(len(grid.AXES[loss]) - 1 for loss in grid.LOSSES)
    compared = len(grid.LOSSES) * (len(seeds) - 1)
    fewest = 3 * len(grid.LOSSES) + 2 * axes + compared
    return fewest, max_rates * len(grid.LOSSES) + (max_init_values - 1) * axes + compared


def budget(batch_sizes: Sequence[int], limits: Mapping[str, Any]) -> tuple[int, int, float, float]:
    """`(fewest runs, most runs, fewest hours, most hours)` of the study: `unit_counts` at
    every N and step count of `grid.units` (a shared one counted once), each run's time
    `run_minutes` at its epochs."""
    fewest, most = unit_counts(limits["seeds"], limits["max_rates"], limits["max_init_values"])
    minutes = [run_minutes(steps * n / limits["train_size"]) for n, steps, _ in grid.units(batch_sizes, limits)]
    return fewest * len(minutes), most * len(minutes), fewest * sum(minutes) / 60, most * sum(minutes) / 60


def run_minutes(epochs: float) -> float:
    """A run's minutes on the 2-core machine at `epochs` epochs of `fit` (`SECONDS_PER_EPOCH`)."""
    return (SECONDS_PER_RUN_OVERHEAD + SECONDS_PER_EPOCH * epochs) / 60


# The report: per arm, `<arm folder>/summary.md` and `r1_vs_batch.png`.

MEASURE = "final test R@1 (mean of both directions)"


def tested(found: Mapping[str, Any], hits: Mapping[str, Mapping]) -> dict[str, list[str]] | None:
    """`{loss: [run names]}`: each loss's comparison runs (`grid.comparison`'s seeds) with
    test hits; None while a loss has none."""
    runs = {
        loss: [r["name"] for r in found["seeds"].get(loss, {}).values() if r["name"] in hits] for loss in grid.LOSSES
    }
    return runs if all(runs.values()) else None


def finding(n: int, difference: Sequence[float], counts: Sequence[int], queries: int, edges: Sequence[str]) -> str:
    """The finding at N = `n` in one sentence: SigLIP − CLIP `difference` (`(difference,
    low, high)`, `query_hits.seeds_and_queries`), the seeds (`counts`: CLIP's, SigLIP's) and `queries`
    behind it, the verdict (`intervals.verdict`; who leads only where resolved), the axes
    tuned at their grid's edge (`edges`)."""
    verdict = intervals.verdict(*difference[1:])
    if verdict == "resolved":
        verdict += ", SigLIP ahead" if difference[0] > 0 else ", CLIP ahead"
    edge = f"; tuned at its grid's edge: {', '.join(edges)}" if edges else ""
    return (
        f"At N = {n:,}, SigLIP − CLIP in {MEASURE} is {intervals.difference_cell(*difference)} (95% over "
        f"{counts[1]} vs {counts[0]} seeds and {queries:,} test queries; {verdict}{edge})."
    )


def _compared(records, hits, limits, arm) -> list[tuple[int, dict, dict[str, list[str]]]]:
    """`[(N, grid.comparison, {loss: names with hits}), ...]` of the N whose both losses
    have a comparison seed with test hits in `arm`."""
    compared = []
    for n in sorted({r["batch_size"] for r in records}):
        found = grid.comparison(records, n, grid.arm_steps(arm, n, limits), limits)
        runs = tested(found, hits)
        if runs is not None:
            compared.append((n, found, runs))
    return compared


def _rows(records, hits, limits, arm) -> tuple[list, list, list]:
    """`(findings, table rows, per-direction rows)` of `arm`'s compared N."""
    findings, rows, per_direction = [], [], []
    for n, found, runs in _compared(records, hits, limits, arm):
        scores = {loss: [query_hits.query_scores(hits[name]) for name in runs[loss]] for loss in grid.LOSSES}
        both = query_hits.seeds_and_queries(scores["siglip"], scores["clip"])
        seeds_only = intervals.welch_interval(*([float(s.mean()) for s in scores[loss]] for loss in ("siglip", "clip")))
        counts = [len(runs[loss]) for loss in grid.LOSSES]
        cells = [grid.setting_words(loss, found["tuning"][loss].setting) for loss in grid.LOSSES]
        cells += [intervals.mean_and_interval([float(s.mean()) for s in scores[loss]], 3) for loss in grid.LOSSES]
        cells += [
            " / ".join(map(str, counts)),
            intervals.difference_cell(*both),
            intervals.difference_cell(*seeds_only),
        ]
        rows.append([f"{n:,}", *cells, intervals.verdict(*both[1:]), ", ".join(found["edges"]) or "-"])
        if min(counts) >= 2:
            findings.append(finding(n, both, counts, len(scores["clip"][0]), found["edges"]))
        for direction in query_hits.DIRECTIONS:
            per = [
                [query_hits.query_scores(hits[name], direction) for name in runs[loss]] for loss in ("siglip", "clip")
            ]
            diff = query_hits.seeds_and_queries(*per)
            per_direction.append([f"{n:,}", direction, intervals.difference_cell(*diff), intervals.verdict(*diff[1:])])
    return findings, rows, per_direction


def _grid_cell(scores: Mapping[int, float], label) -> str:
    """`"k=1: 0.801, **k=2: 0.812**, k=3: 0.809"`: each step's validation R@1 (`label(step)`:
    its words), the best in bold."""
    if not scores:
        return "-"
    best = grid.best_step(scores)
    cells = [f"{label(s)}: {scores[s]:.3f}" for s in sorted(scores)]
    return ", ".join(f"**{c}**" if s == best else c for s, c in zip(sorted(scores), cells, strict=True))


def _tuning_rows(records, limits, arm) -> list[list[str]]:
    """Per N and loss of `arm`: each axis's seed-0 grid, the status, the edges."""
    labels = {
        "rate_step": lambda loss: lambda k: f"k={k}",
        "temperature_step": lambda loss: lambda t: f"T0 {grid.temperature_init(loss, t):g}",
        "bias_step": lambda loss: lambda b: f"b0 {grid.bias_init(b):g}",
    }
    rows = []
    for n in sorted({r["batch_size"] for r in records}):
        found = grid.comparison(records, n, grid.arm_steps(arm, n, limits), limits)
        for loss, tuned in found["tuning"].items():
            cells = [_grid_cell(tuned.scores.get(a, {}), labels[a](loss)) for a in grid.AXES["siglip"]]
            status = "tuned" if tuned.complete else f"tuning ({grid.AXIS_NAMES[list(tuned.scores)[-1]]})"
            edge = ", ".join(grid.AXIS_NAMES[a] for a in tuned.edges) or "-"
            rows.append([f"{n:,}", grid.LABELS[loss], *cells, status, edge])
    return rows


def summary(records: Sequence[Mapping[str, Any]], hits: Mapping[str, Mapping], limits: Mapping, arm: str) -> str:
    """`arm`'s markdown report (see the study's docstring)."""
    seeds = limits["seeds"]
    arm_runs = [r for r in records if r["steps"] == grid.arm_steps(arm, r["batch_size"], limits)]
    findings, rows, per_direction = _rows(records, hits, limits, arm)
    text = (
        f"# Sigmoid (SigLIP) against softmax (CLIP) on cmudict, {grid.ARM_FOLDERS[arm].replace('_', '-')}: "
        f"{len(arm_runs)} runs\n\n{_budget(arm, limits)} Each loss tuned per N on seed {seeds[0]} by its final "
        f"validation R@1; compared on seeds {', '.join(map(str, seeds[1:]))} by the {MEASURE} of their final "
        f"checkpoints on `{limits['test_split']}`. Rate step k: peak rate 1e-3 · 2^(k/2); initial temperature "
        "T0 = 0.07 · 2^-j (CLIP) or 0.1 · 2^-j (SigLIP); SigLIP's bias b0 = -10 + 5 j.\n"
    )
    text += "\n## Findings\n\n" + ("".join(f"- {f}\n" for f in findings) or "None yet: no N has two seeds of both.\n")
    text += caveats(arm, sorted({r["batch_size"] for r in arm_runs}), limits)
    header = ["N", "CLIP setting", "SigLIP setting", "CLIP test R@1", "SigLIP test R@1", "seeds (CLIP / SigLIP)"]
    header += ["SigLIP − CLIP [95%, seeds + queries]", "[95%, seeds only]", "verdict", "tuned at a grid's edge"]
    text += (
        "\n## Test R@1 at each loss's tuned setting\n\nR@1: mean ± the 95% t-interval over the seeds. SigLIP − "
        "CLIP: Welch's interval over the seeds and the paired bootstrap over the test queries (of the seed-mean "
        "hits), their half-widths added in quadrature; Welch's alone beside it.\n\n"
    )
    text += sweep.markdown_table(rows, header) if rows else "No N has both losses tuned and a seed tested yet.\n"
    if per_direction:
        text += "\n## SigLIP − CLIP per direction (test)\n\n"
        text += sweep.markdown_table(
            per_direction, ["N", "direction", "SigLIP − CLIP [95%, seeds + queries]", "verdict"]
        )
    text += (
        f"\n## The tuning on seed {seeds[0]}: final validation R@1 at each step run (bold: the best)\n\n"
        "Each axis at the others' tuned values, in the order rate, temperature, bias. Edge: the best is the "
        f"smallest or largest step run (the cap, {limits['max_rates']} rates or {limits['max_init_values']} "
        "initial values, stopped the extension).\n\n"
    )
    header = ["N", "loss", "rate", "initial temperature", "initial bias", "status", "edge"]
    return text + sweep.markdown_table(_tuning_rows(records, limits, arm), header)


def _budget(arm: str, limits: Mapping[str, Any]) -> str:
    """The arm's training budget in one sentence."""
    pairs = f"`fit` ({limits['train_size']:,} pairs)"
    if arm == "epochs":
        return f"Every run: {_epochs(limits['epochs'])} of {pairs}, so a larger N takes fewer steps."
    return f"Every run: {limits['matched_steps']:,} optimizer steps on {pairs}, so a larger N sees more examples."


def _epochs(epochs: float) -> str:
    """`"0.5 epochs"`, `"1 epoch"`: a number of epochs to 2 significant digits."""
    return f"{epochs:.2g} epoch" + "s" * (f"{epochs:.2g}" != "1")


def caveats(arm: str, ns: Sequence[int], limits: Mapping[str, Any]) -> str:
    """What `arm`'s findings control and what they do not, said beside them."""
    if not ns:
        return ""
    steps = {n: grid.arm_steps(arm, n, limits) for n in ns}
    budget = ", ".join(f"{steps[n]:,} steps ({_epochs(steps[n] * n / limits['train_size'])}) at N = {n:,}" for n in ns)
    other = "step-matched" if arm == "epochs" else "epoch-matched"
    return (
        "\n## What these findings control, and what they do not\n\n"
        "- Tuned on validation, compared on test: the tuning reads validation only, the comparison's seeds are "
        "fresh and scored once on the test split.\n"
        "- Both losses' initial temperatures are tuned on the same kind of grid (a factor 2 a step, at the "
        "loss's tuned rate); SigLIP also tunes its bias, which CLIP does not have.\n"
        f"- The budget: {budget}; the cosine spans each run. The {other} arm is the other half of the design.\n"
        "- The interval carries the seeds and the test queries; it is conditional on the one tuning seed and "
        "on the grids' caps (an edge is flagged).\n"
    )


def plot(records: Sequence[Mapping[str, Any]], hits: Mapping[str, Mapping], limits: Mapping, arm: str) -> dict:
    """`r1_vs_batch`: each loss's test R@1 at its tuned setting against N in `arm`, mean over
    the seeds with the 95% t-interval (none before an N is compared)."""
    fig, ax = sweep.new_figure(f"test R@1 at each loss's tuned setting, {arm} matched (95% t)", width=6)
    compared = _compared(records, hits, limits, arm)
    for loss, marker in zip(grid.LOSSES, "os", strict=True):
        points = []
        for n, _, runs in compared:
            values = [float(query_hits.query_scores(hits[name]).mean()) for name in runs[loss]]
            points.append((n, np.mean(values), intervals.t_interval(values) if len(values) > 1 else 0.0))
        if points:
            x, mean, half = zip(*points, strict=True)
            ax.errorbar(x, mean, yerr=half, capsize=3, marker=marker, label=grid.LABELS[loss])
    if not ax.lines:
        return {}
    ax.set(xlabel="global batch N", ylabel="test R@1 (mean of both directions)")
    sweep.log_spaced_ticks(ax, [n for n, _, _ in compared])
    ax.legend(fontsize=8)
    return {"r1_vs_batch": fig}


def write_partial(records: Mapping[str, Mapping], hits: Mapping[str, Mapping], out: Path, limits: Mapping) -> list:
    """`results.{json,csv}` of the runs finished so far (`records`, by name, over the
    committed records of the same names, those not visited yet kept), and each arm's
    `summary.md` and figure in `out/<arm folder>/`. Returns the records written."""
    merged = sweep.write_merged(records.values(), out)
    for arm in grid.ARMS:
        folder = out / grid.ARM_FOLDERS[arm]
        folder.mkdir(parents=True, exist_ok=True)
        sweep.save(plot(merged, hits, limits, arm), folder)
        (folder / "summary.md").write_text(summary(merged, hits, limits, arm))
    return merged


class _Trainer:
    """Trains the study's runs one at a time, scoring the comparison's on the test split,
    and rewrites the report after each run trained now (not after those read back from an
    earlier stretch: `run` writes it once at the end)."""

    def __init__(self, base, args, limits):
        self.base, self.args, self.limits = base, args, limits
        self.deadline = sweep.deadline(args.hours)
        self.records: dict[str, dict] = {}
        self.hits = query_hits.cached_hits([], args.out, limits["test_split"])
        self.earlier = set(sweep.committed_records(args.out))

    def __call__(self, run: sweep.Run, *, test: bool = False) -> dict | None:
        """`run` trained (or read back); with `test`, its final checkpoint's test hits."""
        got = sweep.run_grid(self.base, [run], self.args.out, curve_keys=target_steps.CURVES, deadline=self.deadline)
        if not got:
            return None
        self.records[run.name] = got[0]
        if test and run.name not in self.hits:  # hits cached by an earlier stretch are already read
            self.hits = query_hits.cached_hits([run.name], self.args.out, self.limits["test_split"])
        if run.name not in self.earlier:
            write_partial(self.records, self.hits, self.args.out, self.limits)
        return got[0]

    def unit(self, n: int, steps: int) -> None:
        """N = `n` at `steps` steps: each loss's tuning, then both on every other seed."""
        seeds = self.limits["seeds"]
        for loss in grid.LOSSES:
            while (tuning := grid.plan(list(self.records.values()), loss, n, seeds[0], steps, self.limits)).next_run:
                if self(tuning.next_run) is None:
                    break
        tuned = {
            loss: grid.plan(list(self.records.values()), loss, n, seeds[0], steps, self.limits) for loss in grid.LOSSES
        }
        if all(t.complete for t in tuned.values()):
            for seed in seeds[1:]:
                for loss in grid.LOSSES:
                    self(grid.limited_run(loss, n, tuned[loss].setting, seed, steps, self.limits), test=True)


def run(args) -> list[dict]:
    """N by N and arm by arm: each loss's tuning on the first seed, then both at their tuned
    setting on every other seed, scored on the test split (finished runs read back, not
    retrained); every run's record and the report written as it finishes."""
    base = tasks.base_config("cmudict", args)
    keys = ("seeds", "epochs", "train_size", "max_rates", "max_init_values", "matched_steps", "test_split")
    limits = {k: getattr(args, k) for k in keys}
    fewest, most, low, high = budget(args.batch_sizes, limits)
    print(
        f"The grid: {fewest}-{most} runs, about {low:.1f}-{high:.1f} h (the finished ones are read back).", flush=True
    )
    trainer = _Trainer(base, args, limits)
    for n, steps, _ in grid.units(args.batch_sizes, limits):
        trainer.unit(n, steps)
    written = write_partial(trainer.records, trainer.hits, args.out, limits)
    print(f"wrote {args.out} ({len(written)} runs)")
    return written


FULL = dict(
    batch_sizes=list(grid.BATCH_SIZES),
    seeds=list(grid.SEEDS),
    epochs=grid.EPOCHS,
    train_size=target_steps.FIT_PAIRS,
    max_rates=grid.MAX_RATES,
    max_init_values=grid.MAX_INIT_VALUES,
    test_split=grid.TEST_SPLIT,
)
# --quick: 1,024 training pairs, 256 validation pairs (target_steps.QUICK_OVERRIDES) and
# 256 test pairs, N = 64, one epoch (16 steps) against 8 steps, three steps per axis (no
# extension: its logic is tested on records), two comparison seeds.
QUICK = dict(
    batch_sizes=[64],
    seeds=[0, 1, 2],
    epochs=1.0,
    train_size=1024,
    max_rates=3,
    max_init_values=3,
    matched_steps=8,
    test_split="test[:256]",
)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="global batch sizes N")
    parser.add_argument("--epochs", type=float, help=f"the epoch-matched arm's epochs (default {grid.EPOCHS:g})")
    parser.add_argument(
        "--matched-steps",
        type=int,
        help=f"the step-matched arm's steps at every N (default: N = {grid.STEP_MATCHED_N}'s at --epochs)",
    )
    parser.add_argument(
        "--max-rates", type=int, help=f"rate steps tuned per N and loss at most (default {grid.MAX_RATES})"
    )
    parser.add_argument(
        "--max-init-values",
        type=int,
        help=f"initial temperatures (and SigLIP's biases) tuned per N at most (default {grid.MAX_INIT_VALUES})",
    )
    sweep.add_hours_option(parser)
    args = sweep.resolve(parser.parse_args(argv), RESULTS_NAME, FULL, QUICK)
    if args.steps is not None:
        parser.error("--steps: the arms set their own steps; pass --epochs or --matched-steps.")
    if min(args.max_rates, args.max_init_values) < 3:
        parser.error("--max-rates and --max-init-values: 3 or more (each axis starts with three steps).")
    if len(args.seeds) < 2:
        parser.error(f"--seeds {args.seeds}: the first tunes, the others compare; give two or more.")
    if args.matched_steps is None:
        args.matched_steps = grid.matched_steps(args.epochs, args.train_size)
    return run(args)


if __name__ == "__main__":
    main()
