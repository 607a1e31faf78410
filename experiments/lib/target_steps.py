"""Steps to a validation target: the measure the critical-batch studies share
(`critical_batch_study`, `critical_batch_constant_lr`, and `sigmoid_vs_softmax`'s
splits).

Every study here trains `configs/cmudict_clip.py` on cmudict's `fit` split (`FIT_PAIRS`
pairs: `train` less the words whose hash puts them in `validation`) and evaluates R@1
both ways on `validation` (the test split is read by the final tables alone). A run's
validation curve is the mean of both directions (`validation_curve`); its steps to a
target are the first step it reaches it, linearly interpolated between evaluations
(`steps_to_target`); each N's best rate is the one with the fewest mean steps among the
rates run with every seed that N has (`best_runs`), and `plot` draws those steps
against N beside the chosen rates' curves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments.lib import intervals, query_hits, sweep

FIT_PAIRS = 108_000  # cmudict's `fit` split
SPLITS = {"data.train_split": "fit", "eval.split": "validation"}
QUICK_OVERRIDES = {"data.train_split": "fit[:1024]", "eval.split": "validation[:256]"}  # --quick: slices of both
METRICS = tuple(f"{d}/R@1" for d in query_hits.DIRECTIONS)
CURVES = ("train/loss", "train/temperature", "train/examples_per_second", *(f"eval/{m}" for m in METRICS))


def is_clip(record: Mapping[str, Any]) -> bool:
    """Whether the run trained CLIP (the grid) rather than the DCL control."""
    return record.get("loss", "clip") == "clip"


def validation_curve(record: Mapping[str, Any]) -> np.ndarray:
    """`[[step, R@1], ...]`: the run's validation R@1, the mean of both directions."""
    a, b = (np.asarray(record["curves"][f"eval/{m}"], np.float64) for m in METRICS)
    return np.column_stack([a[:, 0], (a[:, 1] + b[:, 1]) / 2])


def steps_to_target(curve: np.ndarray, target: float) -> float | None:
    """The first step at which `curve` ([[step, value], ...], from step 0 at value 0)
    reaches `target`, linearly interpolated between its points; None if it never does."""
    steps = np.concatenate([[0.0], curve[:, 0]])
    values = np.concatenate([[0.0], curve[:, 1]])
    above = np.flatnonzero(values >= target)
    if not len(above):
        return None
    i = above[0]
    fraction = (target - values[i - 1]) / (values[i] - values[i - 1])
    return float(steps[i - 1] + fraction * (steps[i] - steps[i - 1]))


def reached_steps(
    records: Sequence[Mapping[str, Any]], target: float, *, clip: bool = True, by: str = "batch_size"
) -> dict[tuple[int, float], dict[int, float | None]]:
    """`{(N, factor): {seed: steps to target or None}}` over the CLIP runs (`clip=False`:
    the DCL control's); N is the records' field `by` (a study whose setting is not the
    batch, e.g. the negatives, passes its own)."""
    reached: dict[tuple[int, float], dict[int, float | None]] = {}
    for record in (r for r in records if is_clip(r) == clip):
        key = (record[by], record["lr_factor"])
        reached.setdefault(key, {})[record["seed"]] = steps_to_target(validation_curve(record), target)
    return reached


def best_runs(records: Sequence[Mapping[str, Any]], target: float, by: str = "batch_size") -> dict[int, dict[str, Any]]:
    """Per N, the learning rate whose CLIP runs reach `target` in the fewest steps, mean
    over seeds, among the rates run with every seed that N has (means over the same
    seeds); a rate that misses in a seed is out: `{N: {"lr_factor", "steps", "seeds",
    "std", "interval", "by_seed", "edge"}}` (`interval`: the 95% t-interval's half-width;
    `edge`: the factor is the grid's smallest or largest); N: the records' field `by`."""
    reached = reached_steps(records, target, by=by)
    factors = sorted({factor for _, factor in reached})
    seeds_at = {}
    for (n, _), by_seed in reached.items():
        seeds_at[n] = max(seeds_at.get(n, 0), len(by_seed))
    best = {}
    for (n, factor), by_seed in sorted(reached.items()):
        if None in by_seed.values() or len(by_seed) < seeds_at[n]:
            continue
        steps = list(by_seed.values())
        mean = float(np.mean(steps))
        if n not in best or mean < best[n]["steps"]:
            best[n] = {
                "lr_factor": factor,
                "steps": mean,
                "seeds": len(steps),
                "std": float(np.std(steps)),
                "interval": intervals.t_interval(steps),
                "by_seed": by_seed,
            }
    for entry in best.values():
        entry["edge"] = entry["lr_factor"] in (factors[0], factors[-1]) and len(factors) > 1
    return best


def error_bars(best: Mapping[int, Mapping[str, Any]], ns: Sequence[int]) -> list[float]:
    """The half-widths of `best_runs`' 95% t-intervals at `ns`, 0 where one seed gives none."""
    return [0.0 if math.isnan(best[n]["interval"]) else best[n]["interval"] for n in ns]


def steps_by_seed(best: Mapping[int, Mapping[str, Any]]) -> dict[int, list[float]]:
    """`best_runs`' steps per seed at each N: `{N: [k_N] steps to the target}`, the input
    of `critical_batch_fit`."""
    return {n: list(entry["by_seed"].values()) for n, entry in best.items()}


def plot(
    records: Sequence[Mapping[str, Any]],
    targets: Sequence[float],
    train_size: int,
    floor: float,
    rates: Mapping[int, float],
) -> dict:
    """`steps_to_target`: the best steps to each target against N (log-log, 95% intervals
    over seeds), with the perfect-scaling line from the smallest N; and the validation
    curves of every seed at each N's chosen factor (`rates`: `{N: f}`) against epochs of
    `train_size` pairs, from R@1 `floor` up."""
    records = [r for r in records if is_clip(r)]
    fig, axes = sweep.new_figure("steps to a validation R@1 target, learning rate tuned per N", ncols=2)
    batch_sizes = sorted({r["batch_size"] for r in records})
    for target, color in zip(targets, sweep.colors(len(targets), "viridis"), strict=True):
        best = best_runs(records, target)
        if not best:
            continue
        ns = sorted(best)
        steps = [best[n]["steps"] for n in ns]
        errors = error_bars(best, ns)
        axes[0].errorbar(ns, steps, yerr=errors, marker="o", capsize=3, color=color, label=f"R@1 {target:.2f}")
        axes[0].plot(ns, [steps[0] * ns[0] / n for n in ns], ls=":", color=color)
    axes[0].set(xlabel="global batch N", ylabel="steps (dotted: perfect scaling)", yscale="log")
    sweep.log_spaced_ticks(axes[0], batch_sizes)
    axes[0].legend(fontsize=7)
    for n, color in zip(batch_sizes, sweep.colors(len(batch_sizes), "plasma"), strict=True):
        runs = [r for r in records if (r["batch_size"], r["lr_factor"]) == (n, rates[n])]
        for i, record in enumerate(sorted(runs, key=lambda r: r["seed"])):
            curve = validation_curve(record)
            label = f"N={n:,}, f={rates[n]:g} ({len(runs)} seeds)" if i == 0 else None
            axes[1].plot(curve[:, 0] * n / train_size, curve[:, 1], color=color, lw=1, label=label)
    axes[1].set(xlabel="epochs", ylabel="validation R@1 (mean of both directions)", ylim=(floor, None))
    axes[1].legend(fontsize=7)
    return {"steps_to_target": fig}
