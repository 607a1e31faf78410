"""Sigmoid against softmax at small batch: SigLIP against CLIP at N = 64 … 1,024, each tuned per N.

Each loss is tuned per N on validation (its peak rate; SigLIP also its initial temperature
and bias), then the two are compared over fresh seeds with a 95% Welch interval.

The epoch-budget study found "SigLIP leads CLIP at 256 and lags at 4,096" with CLIP's
rate rule for both and SigLIP from its paper's start only; here each loss gets its own
tuning at each N. Every run trains `configs/cmudict_clip.py` (two 1-D CNN towers, the
loss over the global batch on 8 simulated CPU devices) on cmudict's `fit` split
(108,000 pairs) for the same `EPOCHS` epochs at every N and for both losses (the same
examples seen: at each N the two runs differ in their loss alone), AdamW with a warmup of
`WARMUP_EPOCHS` epochs and a cosine to 0 at the end, and evaluates R@1 both ways on
`validation` (13,490 pairs; the test split is never read) `EVALS` times along the run.
The measure: validation R@1 at the end, the mean of both directions.

Stages, N by N (a session cut short leaves whole N's with their comparison):

1. **tuning**, on the first seed, one axis at a time, each on a grid around a start:
   the three steps ``s - 1, s, s + 1``, then the neighbour beyond the best while the best
   is at the edge of the steps run and fewer than the axis's cap ran (`next_on_axis`):

   * the peak rate, for each loss: rate step k, ``1e-3 * 2 ** (k / 2)`` (the sqrt(2)
     grid `rate_grid` it shares with `critical_batch_constant_lr`, centred on the
     square-root rule `first_rate_step`), at most `MAX_RATES` rates; SigLIP at its paper's start
     (t' = log 10: temperature 0.1; bias -10; Zhai et al. 2023);
   * SigLIP's initial temperature at its tuned rate: ``0.1 * 2 ** -j`` (step j; 0 the
     paper's), at most `MAX_INIT_VALUES`;
   * SigLIP's initial bias at its tuned rate and temperature: ``-10 + 5 j``, at most
     `MAX_INIT_VALUES`.

   CLIP keeps its config's learned temperature from 0.07. The best is the highest final
   validation R@1; one pass, each axis at the others' tuned values.
2. **seeds**: both losses at their tuned setting on every other seed (by default 1-5,
   fresh: the tuning seed is left out of the comparison, so the loss with more settings
   tried gains nothing from picking its luckiest seed).

The report (`summary.md`, `results.{json,csv}`; `r1_vs_batch.png` once an N is
compared): per N each loss's tuned setting and its seed-0 grid, flagged where the tuned value is at the edge of the
steps run (the cap stopped the extension); final validation R@1 mean ± the 95%
t-interval over the seeds; SigLIP − CLIP with its 95% Welch interval and the verdict it
allows (`intervals.verdict`); one finding per N, its interval in the same sentence.
Every run's record is written as it finishes; the report is regenerated from whatever is
complete (an N whose tuning is unfinished shows its grid so far).

Run (from the repository root; rerun the same command to go on):
  .venv/bin/python -m experiments.studies.sigmoid_vs_softmax --hours 3   # no run starts after 3 h
  .venv/bin/python -m experiments.studies.sigmoid_vs_softmax --hours 0   # the report from what finished
  .venv/bin/python -m experiments.studies.sigmoid_vs_softmax --quick     # CI: slices of the data
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contrastive_jax.config_lib import load_config, override
from experiments.lib import intervals, rate_grid, sweep, target_steps

BATCH_SIZES = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2, 3, 4, 5)  # the first tunes; the others compare
EPOCHS = 4.0  # every N and both losses: N = 1,024 gets 422 steps, N = 64 6,750
WARMUP_EPOCHS = 0.25
EVALS = 4  # validation this many times along a run, the last at the end
LOSSES = ("clip", "siglip")
LABELS = {"clip": "CLIP", "siglip": "SigLIP"}
MAX_RATES = 5  # rate steps tuned per N and loss at most
MAX_INIT_VALUES = 4  # SigLIP's initial temperatures (and biases) tuned per N at most
CLIP_TEMPERATURE = 0.07  # CLIP's initial (learned) temperature: the config's
SIGLIP_TEMPERATURE, SIGLIP_BIAS = 0.1, -10.0  # SigLIP's paper: t' = log 10, b = -10
BIAS_STEP = 5.0  # bias step j: SIGLIP_BIAS + BIAS_STEP * j
# A run's time, from the calibration runs on the shared 2-core machine (load average 9-15:
# the constant-rate study's run and tests beside them): seed 0's first tuning run took
# 165 and 199 s at N = 64 (6,750 steps), 156 and 159 s at N = 1,024 (422 steps), so about
# this many seconds per epoch of `fit` (the steps, any N) and per run (compilation,
# evaluations, checkpoints): 180 s at 4 epochs.
SECONDS_PER_EPOCH = 40.0
SECONDS_PER_RUN_OVERHEAD = 20.0
AXES = {"clip": ("rate_step",), "siglip": ("rate_step", "temperature_step", "bias_step")}
AXIS_NAMES = {"rate_step": "rate", "temperature_step": "temperature", "bias_step": "bias"}


def temperature_init(step: int) -> float:
    """SigLIP's initial temperature at temperature step `step`: ``0.1 * 2 ** -step``."""
    return SIGLIP_TEMPERATURE * 2.0**-step


def bias_init(step: int) -> float:
    """SigLIP's initial bias at bias step `step`: ``-10 + 5 step``."""
    return SIGLIP_BIAS + BIAS_STEP * step


def start_setting(loss: str, n: int) -> dict[str, int]:
    """Where `loss`'s tuning at N = `n` starts: the square-root rule's rate step
    (`rate_grid.first_rate_step`), SigLIP at its paper's start."""
    return {axis: rate_grid.first_rate_step(n) if axis == "rate_step" else 0 for axis in AXES[loss]}


def study_run(loss: str, n: int, setting: Mapping[str, int], seed: int, *, epochs: float, train_size: int) -> sweep.Run:
    """The run of `loss` at N = `n` with `setting` (`{axis: step}`, `AXES[loss]`) and
    `seed`: `epochs` epochs of `train_size` pairs, a cosine after `WARMUP_EPOCHS`."""
    steps_per_epoch = train_size / n
    num_steps = math.ceil(epochs * steps_per_epoch)
    warmup = round(WARMUP_EPOCHS * steps_per_epoch)
    k = setting["rate_step"]
    tags = {"loss": loss, "batch_size": n, "rate_step": k, "learning_rate": rate_grid.learning_rate(k)}
    overrides = {
        **sweep.run_overrides(num_steps=num_steps, seed=seed, warmup_steps=warmup),
        "eval.every_steps": math.ceil(num_steps / EVALS),  # the last at the end: EVALS in all
        "train.global_batch_size": n,
        "optim.learning_rate": tags["learning_rate"],
        "loss.name": loss,
    }
    name = f"{loss}_n{n}_k{k}"
    if loss == "siglip":
        t, b = setting["temperature_step"], setting["bias_step"]
        tags |= {"temperature_step": t, "temperature_init": temperature_init(t)}
        tags |= {"bias_step": b, "bias_init": bias_init(b)}
        overrides |= {"loss.temperature": temperature_init(t), "loss.siglip_bias": bias_init(b)}
        name += f"_t{t}_b{b}"
    else:
        tags["temperature_init"] = CLIP_TEMPERATURE
        overrides["loss.temperature"] = CLIP_TEMPERATURE
    tags |= {"seed": seed, "steps": num_steps, "epochs": round(num_steps * n / train_size, 3)}
    return sweep.Run(f"{name}_s{seed}", tags, overrides)


def limited_run(loss: str, n: int, setting: Mapping[str, int], seed: int, limits: Mapping[str, Any]) -> sweep.Run:
    """`study_run` with the `epochs` and `train_size` of `limits`."""
    return study_run(loss, n, setting, seed, epochs=limits["epochs"], train_size=limits["train_size"])


def final_r1(record: Mapping[str, Any]) -> float:
    """The run's final validation R@1, the mean of both directions."""
    return float(np.mean([record[m] for m in target_steps.METRICS]))


def best_step(scores: Mapping[int, float]) -> int:
    """The step of the highest score (the smaller step on a tie)."""
    return max(sorted(scores), key=lambda step: scores[step])


def at_edge(scores: Mapping[int, float]) -> bool:
    """Whether the best (`best_step`) is the smallest or largest step run (of two or more)."""
    return len(scores) > 1 and best_step(scores) in (min(scores), max(scores))


def next_on_axis(scores: Mapping[int, float], start: int, most: int) -> int | None:
    """The step to run next on one axis, from the `scores` of the steps run (`{step:
    final R@1}`): the first of ``start - 1, start, start + 1`` not run, then the
    neighbour beyond the best while the best is at the edge of the steps run and fewer
    than `most` ran; None: the axis is tuned."""
    for step in (start - 1, start, start + 1):
        if step not in scores:
            return step
    if len(scores) >= most:
        return None
    return rate_grid.step_beyond_edge(scores, best_step(scores))


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Where one loss's tuning at one N stands (`plan`).

    Attributes:
      setting: `{axis: step}`: each tuned axis's best, the axis in progress at its start.
      scores: `{axis: {step: seed-0 final R@1}}` of the axes reached.
      edges: the tuned axes whose best is at the edge of the steps run.
      next_run: the run to train next; None when every axis is tuned.
    """

    setting: dict[str, int]
    scores: dict[str, dict[int, float]]
    edges: tuple[str, ...]
    next_run: sweep.Run | None

    @property
    def complete(self) -> bool:
        return self.next_run is None


def plan(records: Sequence[Mapping[str, Any]], loss: str, n: int, seed: int, limits: Mapping[str, Any]) -> Tuning:
    """`loss`'s tuning at N = `n` on `seed`, from the `records` finished: the axes of
    `AXES[loss]` in order, each at the others' current values (`next_on_axis`, capped at
    `limits["max_rates"]` rates and `limits["max_init_values"]` initial values), with the
    run to train next. `limits` also holds `study_run`'s `epochs` and `train_size`."""
    setting = start_setting(loss, n)
    mine = [r for r in records if r.get("loss") == loss and r["batch_size"] == n and r["seed"] == seed]
    scores, edges = {}, []
    for axis in AXES[loss]:
        same = lambda r, axis=axis: all(r.get(a) == v for a, v in setting.items() if a != axis)  # noqa: E731
        scores[axis] = {r[axis]: final_r1(r) for r in mine if same(r)}
        most = limits["max_rates"] if axis == "rate_step" else limits["max_init_values"]
        step = next_on_axis(scores[axis], setting[axis], most)
        if step is not None:
            return Tuning(setting, scores, tuple(edges), limited_run(loss, n, setting | {axis: step}, seed, limits))
        setting[axis] = best_step(scores[axis])
        edges += [axis] if at_edge(scores[axis]) else []
    return Tuning(setting, scores, tuple(edges), None)


def setting_words(loss: str, setting: Mapping[str, int]) -> str:
    """`"k=3 (0.0028), T0 0.05, b0 -5"`: a setting in the report's words."""
    k = setting["rate_step"]
    words = f"k={k} ({rate_grid.learning_rate(k):.2g})"
    if loss == "siglip":
        words += f", T0 {temperature_init(setting['temperature_step']):g}, b0 {bias_init(setting['bias_step']):g}"
    return words


def seed_records(records: Sequence[Mapping[str, Any]], run: sweep.Run, seeds: Sequence[int]) -> dict[int, dict]:
    """`{seed: record}` of the `records` on `seeds` with `run`'s setting (all its tags
    but the seed)."""
    same = lambda r: all(r.get(k) == v for k, v in run.tags.items() if k != "seed")  # noqa: E731
    return {r["seed"]: r for r in records if r["seed"] in seeds and same(r)}


def difference(clip: Sequence[float], siglip: Sequence[float]) -> tuple[float, float, float]:
    """SigLIP − CLIP over independent seeds: `intervals.welch_interval(siglip, clip)`."""
    return intervals.welch_interval(siglip, clip)


def finding(n: int, clip: Sequence[float], siglip: Sequence[float], edges: Sequence[str]) -> str:
    """The finding at N = `n` in one sentence, its 95% interval in it and the verdict
    `intervals.verdict` gives that interval; who leads only where it is resolved; the
    axes whose tuned value is at its grid's edge named (`edges`)."""
    diff, low, high = difference(clip, siglip)
    verdict = intervals.verdict(low, high)
    if verdict == "resolved":
        verdict += ", SigLIP ahead" if diff > 0 else ", CLIP ahead"
    edge = f"; tuned at its grid's edge: {', '.join(edges)}" if edges else ""
    return (
        f"At N = {n:,}, SigLIP − CLIP in final validation R@1 (mean of both directions) is "
        f"{intervals.difference_cell(diff, low, high)} (95% Welch interval, {len(siglip)} vs {len(clip)} seeds; "
        f"{verdict}{edge})."
    )


def comparison(records: Sequence[Mapping[str, Any]], n: int, limits: Mapping[str, Any]) -> dict[str, Any]:
    """At N = `n`: each loss's `Tuning` on the tuning seed and, once it is tuned, its
    records at the tuned setting on the other seeds: `{"tuning": {loss: Tuning}, "seeds": {loss:
    {seed: record}}, "edges": ["SigLIP rate", ...]}`."""
    seeds = limits["seeds"]
    tuning = {loss: plan(records, loss, n, seeds[0], limits) for loss in LOSSES}
    found, edges = {}, []
    for loss, tuned in tuning.items():
        edges += [f"{LABELS[loss]} {AXIS_NAMES[a]}" for a in tuned.edges]
        if tuned.complete:
            found[loss] = seed_records(records, limited_run(loss, n, tuned.setting, seeds[0], limits), seeds[1:])
    return {"tuning": tuning, "seeds": found, "edges": edges}


def _grid_cell(scores: Mapping[int, float], label: Callable[[int], str]) -> str:
    """`"k=1: 0.801, **k=2: 0.812**, k=3: 0.809"`: each step's R@1 (`label(step)`: its
    words), the best in bold."""
    if not scores:
        return "-"
    best = best_step(scores)
    cells = [f"{label(s)}: {scores[s]:.3f}" for s in sorted(scores)]
    return ", ".join(f"**{c}**" if s == best else c for s, c in zip(sorted(scores), cells, strict=True))


GRID_LABELS = {
    "rate_step": lambda k: f"k={k}",
    "temperature_step": lambda t: f"T0 {temperature_init(t):g}",
    "bias_step": lambda b: f"b0 {bias_init(b):g}",
}


def summary(records: Sequence[Mapping[str, Any]], limits: Mapping[str, Any]) -> str:
    """The markdown report (see the module docstring)."""
    seeds, epochs = limits["seeds"], limits["epochs"]
    ns = sorted({r["batch_size"] for r in records})
    text = (
        f"# Sigmoid (SigLIP) against softmax (CLIP) on cmudict, each tuned per N: {len(records)} runs\n\n"
        f"Every run: {epochs:g} epoch{'s' * (epochs != 1)} of `fit` ({limits['train_size']:,} pairs), cosine after "
        f"{WARMUP_EPOCHS:g} epochs of warmup; the measure is the final validation R@1, the mean of both "
        f"directions. Tuned on seed {seeds[0]}, compared on seeds {', '.join(map(str, seeds[1:]))}. Rate step k: "
        "peak rate 1e-3 · 2^(k/2); SigLIP's initial temperature T0 = 0.1 · 2^-j, bias b0 = -10 + 5 j.\n"
    )
    rows, findings, per_direction, grids = [], [], [], []
    for n in ns:
        found = comparison(records, n, limits)
        for loss, tuned in found["tuning"].items():
            cells = [_grid_cell(tuned.scores.get(a, {}), GRID_LABELS[a]) for a in AXES["siglip"]]
            status = "tuned" if tuned.complete else f"tuning ({AXIS_NAMES[_axis_in_progress(tuned)]})"
            edge = ", ".join(AXIS_NAMES[a] for a in tuned.edges) or "-"
            grids.append([f"{n:,}", LABELS[loss], *cells, status, edge])
        if len(found["seeds"]) < len(LOSSES) or not all(found["seeds"].values()):
            continue  # a loss still tuning, or not run on a comparison seed yet
        by_seed = {loss: found["seeds"][loss] for loss in LOSSES}
        values = {loss: [final_r1(r) for r in by_seed[loss].values()] for loss in LOSSES}
        cells = [setting_words(loss, found["tuning"][loss].setting) for loss in LOSSES]
        cells += [intervals.mean_and_interval(values[loss], decimals=3) for loss in LOSSES]
        diff = difference(values["clip"], values["siglip"])
        cells += [f"{len(values['clip'])} / {len(values['siglip'])}", intervals.difference_cell(*diff)]
        cells += [intervals.verdict(*diff[1:]), ", ".join(found["edges"]) or "-"]
        rows.append([f"{n:,}", *cells])
        if min(len(v) for v in values.values()) >= 2:
            findings.append(finding(n, values["clip"], values["siglip"], found["edges"]))
        for metric in target_steps.METRICS:
            diff = difference(*([r[metric] for r in by_seed[loss].values()] for loss in LOSSES))
            per_direction.append([f"{n:,}", metric, intervals.difference_cell(*diff), intervals.verdict(*diff[1:])])
    text += "\n## Findings\n\n" + ("".join(f"- {f}\n" for f in findings) or "None yet: no N has two seeds of both.\n")
    text += caveats(ns, limits)
    header = ["N", "CLIP setting", "SigLIP setting", "CLIP R@1", "SigLIP R@1", "seeds (CLIP / SigLIP)"]
    header += ["SigLIP − CLIP [95% Welch]", "verdict", "tuned at a grid's edge"]
    text += (
        "\n## Final validation R@1 at each loss's tuned setting\n\nR@1: mean ± the 95% t-interval over the "
        "seeds (the mean alone for one seed); the difference's interval is Welch's (n/a: one seed).\n\n"
    )
    text += sweep.markdown_table(rows, header) if rows else "No N has both losses tuned and a seed run yet.\n"
    if per_direction:
        text += "\n## SigLIP − CLIP per direction\n\n"
        text += sweep.markdown_table(per_direction, ["N", "direction", "SigLIP − CLIP [95% Welch]", "verdict"])
    text += (
        f"\n## The tuning on seed {seeds[0]}: final validation R@1 at each step run (bold: the best)\n\n"
        "Each axis at the others' tuned values, in the order rate, temperature, bias. Edge: the best is the "
        f"smallest or largest step run (the cap, {limits['max_rates']} rates or {limits['max_init_values']} "
        "initial values, stopped the extension).\n\n"
    )
    text += sweep.markdown_table(grids, ["N", "loss", "rate", "initial temperature", "initial bias", "status", "edge"])
    return text


def caveats(ns: Sequence[int], limits: Mapping[str, Any]) -> str:
    """What the comparison does not control yet, said beside its findings: one validation
    split for tuning and comparing, CLIP's temperature learned but not tuned, and the
    steps each N gets at a fixed number of epochs (`study_run`'s count)."""
    if not ns:
        return ""
    steps = ", ".join(f"{math.ceil(limits['epochs'] * limits['train_size'] / n):,} at N = {n:,}" for n in ns)
    return (
        "\n## What these findings do not control\n\n"
        "- Tuned and compared on the same validation split (the comparison's seeds are fresh, the split is "
        "not); the test split is not read.\n"
        "- CLIP's temperature is learned from 0.07 and not tuned; SigLIP's initial temperature and bias are.\n"
        f"- Every run trains {limits['epochs']:g} epochs, so a larger N takes fewer steps ({steps}): how each "
        "loss's R@1 moves with N is partly a step count; no step-matched run is here.\n"
    )


def _axis_in_progress(tuned: Tuning) -> str:
    """The axis `tuned.next_run` explores: the last one reached."""
    return list(tuned.scores)[-1]


def plot(records: Sequence[Mapping[str, Any]], limits: Mapping[str, Any]) -> dict:
    """`r1_vs_batch`: each loss's final validation R@1 at its tuned setting against N,
    mean over the seeds with the 95% t-interval (none before an N is compared)."""
    fig, ax = sweep.new_figure("final validation R@1 at each loss's tuned setting (95% t over seeds)", width=6)
    ns = sorted({r["batch_size"] for r in records})
    for loss, marker in zip(LOSSES, "os", strict=True):
        points = []
        for n in ns:
            values = [final_r1(r) for r in comparison(records, n, limits)["seeds"].get(loss, {}).values()]
            if values:
                half = intervals.t_interval(values) if len(values) > 1 else 0.0
                points.append((n, np.mean(values), half))
        if points:
            x, mean, half = zip(*points, strict=True)
            ax.errorbar(x, mean, yerr=half, capsize=3, marker=marker, label=LABELS[loss])
    if not ax.lines:
        return {}  # no N compared yet
    ax.set(xlabel="global batch N", ylabel="validation R@1 (mean of both directions)")
    sweep.log_spaced_ticks(ax, ns)
    ax.legend(fontsize=8)
    return {"r1_vs_batch": fig}


def write_partial(records: Mapping[str, Mapping[str, Any]], out: Path, limits: Mapping[str, Any]) -> list[dict]:
    """`results.{json,csv}`, `summary.md` and the figure of the runs finished so far:
    `records` (by name) over the committed records of the same names, the committed ones
    of runs not visited yet kept. Returns the records written."""
    merged = list((sweep.committed_records(out) | dict(records)).values())
    sweep.write_results(merged, out)
    sweep.save(plot(merged, limits), out)
    (out / "summary.md").write_text(summary(merged, limits))
    return merged


def run_counts(batch_sizes: Sequence[int], seeds: Sequence[int], max_rates: int, max_init_values: int) -> tuple:
    """`(fewest, most)` runs of the grid: per N and loss 3 to `max_rates` rates; SigLIP's
    temperature and bias 2 to `max_init_values - 1` new runs each (the start shared with
    the axis before); then each loss on every seed but the first."""
    fewest = 3 * len(LOSSES) + 2 * 2
    most = max_rates * len(LOSSES) + 2 * (max_init_values - 1)
    compared = len(LOSSES) * (len(seeds) - 1)
    return len(batch_sizes) * (fewest + compared), len(batch_sizes) * (most + compared)


def run_minutes(epochs: float, train_size: int) -> float:
    """A run's minutes on the 2-core machine (`SECONDS_PER_EPOCH`, scaled to `train_size`)."""
    return (SECONDS_PER_RUN_OVERHEAD + SECONDS_PER_EPOCH * epochs * train_size / target_steps.FIT_PAIRS) / 60


def run(args) -> list[dict]:
    """N by N: each loss's tuning on the first seed, then both at their tuned setting on
    every other seed (finished runs read back, not retrained); every run's record and the
    report written as it finishes."""
    base = override(
        load_config("cmudict_clip"),
        {**target_steps.SPLITS, **(target_steps.QUICK_OVERRIDES if args.quick else {}), "data.data_dir": args.data_dir},
    )
    limits = {k: getattr(args, k) for k in ("seeds", "epochs", "train_size", "max_rates", "max_init_values")}
    fewest, most = run_counts(args.batch_sizes, args.seeds, args.max_rates, args.max_init_values)
    minutes = run_minutes(args.epochs, args.train_size)
    print(
        f"The grid: {fewest}-{most} runs at about {minutes:.1f} min each, {fewest * minutes / 60:.1f}-"
        f"{most * minutes / 60:.1f} h in all (the finished ones are read back).",
        flush=True,
    )
    deadline = sweep.deadline(args.hours)
    records: dict[str, dict] = {}

    def train(run_: sweep.Run) -> dict | None:
        got = sweep.run_grid(base, [run_], args.out, curve_keys=target_steps.CURVES, deadline=deadline)
        if got:
            records[run_.name] = got[0]
            write_partial(records, args.out, limits)
        return got[0] if got else None

    for n in args.batch_sizes:
        for loss in LOSSES:
            while (tuning := plan(list(records.values()), loss, n, args.seeds[0], limits)).next_run is not None:
                if train(tuning.next_run) is None:
                    break
        tuned = {loss: plan(list(records.values()), loss, n, args.seeds[0], limits) for loss in LOSSES}
        if all(t.complete for t in tuned.values()):
            for seed in args.seeds[1:]:
                for loss in LOSSES:
                    train(limited_run(loss, n, tuned[loss].setting, seed, limits))
    written = write_partial(records, args.out, limits)
    print(f"wrote {args.out} ({len(written)} runs)")
    return written


FULL = dict(
    batch_sizes=list(BATCH_SIZES),
    seeds=list(SEEDS),
    epochs=EPOCHS,
    train_size=target_steps.FIT_PAIRS,
    max_rates=MAX_RATES,
    max_init_values=MAX_INIT_VALUES,
)
# --quick: 1,024 training pairs, 256 validation pairs (target_steps.QUICK_OVERRIDES), N = 64,
# one epoch, three steps per axis (no extension: its logic is tested on records), two
# comparison seeds.
QUICK = dict(batch_sizes=[64], seeds=[0, 1, 2], epochs=1.0, train_size=1024, max_rates=3, max_init_values=3)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="global batch sizes N")
    parser.add_argument("--epochs", type=float, help=f"epochs per run, every N and loss (default {EPOCHS:g})")
    parser.add_argument("--max-rates", type=int, help=f"rate steps tuned per N and loss at most (default {MAX_RATES})")
    parser.add_argument(
        "--max-init-values",
        type=int,
        help=f"SigLIP's initial temperatures, and biases, tuned per N at most (default {MAX_INIT_VALUES})",
    )
    sweep.add_hours_option(parser)
    args = sweep.resolve(parser.parse_args(argv), "sigmoid_vs_softmax", FULL, QUICK)
    if args.steps is not None:
        parser.error("--steps: every run here trains a number of epochs; pass --epochs.")
    if min(args.max_rates, args.max_init_values) < 3:
        parser.error("--max-rates and --max-init-values: 3 or more (each axis starts with three steps).")
    if len(args.seeds) < 2:
        parser.error(f"--seeds {args.seeds}: the first tunes, the others compare; give two or more.")
    return run(args)


if __name__ == "__main__":
    main()
