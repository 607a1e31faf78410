"""The runs and the tuning of `sigmoid_vs_softmax`: each run's setting and length, the walk
along each axis, and the comparison's records at each N and arm (see the study's docstring).

A run is named and tagged by its loss, N, setting, seed and optimizer steps, not by its
arm: where both arms give an N the same steps (N = `STEP_MATCHED_N`), they share its runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments.lib import rate_grid, sweep, target_steps

BATCH_SIZES = (64, 128, 256, 512, 1024)
SEEDS = (0, 1, 2, 3, 4, 5)  # the first tunes; the others compare
EPOCHS = 4.0  # the epoch-matched arm: N = 1,024 gets 422 steps, N = 64 6,750
STEP_MATCHED_N = 512  # the step-matched arm: every N trains the steps this N gets at EPOCHS (844)
WARMUP_FRACTION = 1 / 16  # of a run's steps (a quarter epoch at 4 epochs)
EVALS = 4  # validation this many times along a run, the last at the end
TEST_SPLIT = "test"  # the seeds' final checkpoints are scored here, the tuning never
LOSSES = ("clip", "siglip")
LABELS = {"clip": "CLIP", "siglip": "SigLIP"}
ARMS = ("epochs", "steps")
ARM_FOLDERS = {"epochs": "epoch_matched", "steps": "step_matched"}
MAX_RATES = 5  # rate steps tuned per N and loss at most
MAX_INIT_VALUES = 4  # initial temperatures (either loss) and SigLIP's biases tuned per N at most
CLIP_TEMPERATURE = 0.07  # CLIP's initial (learned) temperature at step 0: the config's
SIGLIP_TEMPERATURE, SIGLIP_BIAS = 0.1, -10.0  # SigLIP's paper: t' = log 10, b = -10
BIAS_STEP = 5.0  # bias step j: SIGLIP_BIAS + BIAS_STEP * j
AXES = {"clip": ("rate_step", "temperature_step"), "siglip": ("rate_step", "temperature_step", "bias_step")}
AXIS_NAMES = {"rate_step": "rate", "temperature_step": "temperature", "bias_step": "bias"}


def temperature_init(loss: str, step: int) -> float:
    """`loss`'s initial temperature at temperature step `step`: ``T * 2 ** -step`` from its
    start T (CLIP's config, 0.07; SigLIP's paper, 0.1)."""
    return (CLIP_TEMPERATURE if loss == "clip" else SIGLIP_TEMPERATURE) * 2.0**-step


def bias_init(step: int) -> float:
    """SigLIP's initial bias at bias step `step`: ``-10 + 5 step``."""
    return SIGLIP_BIAS + BIAS_STEP * step


def start_setting(loss: str, n: int) -> dict[str, int]:
    """Where `loss`'s tuning at N = `n` starts: the square-root rule's rate step
    (`rate_grid.first_rate_step`), the temperature (and SigLIP's bias) at step 0."""
    return {axis: rate_grid.first_rate_step(n) if axis == "rate_step" else 0 for axis in AXES[loss]}


def arm_steps(arm: str, n: int, limits: Mapping[str, Any]) -> int:
    """The optimizer steps every run at N = `n` trains in `arm`: `"epochs"`, `limits["epochs"]`
    epochs of `limits["train_size"]` pairs; `"steps"`, `limits["matched_steps"]` at every N."""
    if arm == "steps":
        return limits["matched_steps"]
    return math.ceil(limits["epochs"] * limits["train_size"] / n)


def matched_steps(epochs: float, train_size: int, n: int = STEP_MATCHED_N) -> int:
    """The step-matched arm's steps: those N = `n` trains in `epochs` epochs of `train_size`."""
    return math.ceil(epochs * train_size / n)


def study_run(loss: str, n: int, setting: Mapping[str, int], seed: int, *, steps: int, train_size: int) -> sweep.Run:
    """The run of `loss` at N = `n` with `setting` (`{axis: step}`, `AXES[loss]`) and
    `seed`: `steps` optimizer steps (epochs: ``steps * n / train_size``), a warmup of
    `WARMUP_FRACTION` of them, then a cosine to 0 at the end."""
    k, t = setting["rate_step"], setting["temperature_step"]
    tags = {"loss": loss, "batch_size": n, "rate_step": k, "learning_rate": rate_grid.learning_rate(k)}
    tags |= {"temperature_step": t, "temperature_init": temperature_init(loss, t)}
    overrides = {
        **sweep.run_overrides(num_steps=steps, seed=seed, warmup_steps=round(WARMUP_FRACTION * steps)),
        "eval.every_steps": math.ceil(steps / EVALS),  # the last at the end: EVALS in all
        "train.global_batch_size": n,
        "optim.learning_rate": tags["learning_rate"],
        "loss.name": loss,
        "loss.temperature": tags["temperature_init"],
    }
    name = f"{loss}_n{n}_k{k}_t{t}"
    if loss == "siglip":
        b = setting["bias_step"]
        tags |= {"bias_step": b, "bias_init": bias_init(b)}
        overrides["loss.siglip_bias"] = bias_init(b)
        name += f"_b{b}"
    tags |= {"seed": seed, "steps": steps, "epochs": round(steps * n / train_size, 3)}
    return sweep.Run(f"{name}_{steps}st_s{seed}", tags, overrides)


def limited_run(loss: str, n: int, setting: Mapping[str, int], seed: int, steps: int, limits: Mapping) -> sweep.Run:
    """`study_run` of `steps` steps with the `train_size` of `limits`."""
    return study_run(loss, n, setting, seed, steps=steps, train_size=limits["train_size"])


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
    """Where one loss's tuning at one N and step count stands (`plan`).

    Attributes:
      setting: `{axis: step}`: each tuned axis's best, the axis in progress at its start.
      scores: `{axis: {step: seed-0 final validation R@1}}` of the axes reached.
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


def plan(records: Sequence[Mapping[str, Any]], loss: str, n: int, seed: int, steps: int, limits: Mapping) -> Tuning:
    """`loss`'s tuning at N = `n` and `steps` steps on `seed`, from the `records` finished
    (validation R@1 only): the axes of `AXES[loss]` in order, each at the others' current
    values (`next_on_axis`, capped at `limits["max_rates"]` rates and
    `limits["max_init_values"]` initial values), with the run to train next."""
    setting = start_setting(loss, n)
    mine = [r for r in records if (r.get("loss"), r["batch_size"], r["seed"], r["steps"]) == (loss, n, seed, steps)]
    scores, edges = {}, []
    for axis in AXES[loss]:
        same = lambda r, axis=axis: all(r.get(a) == v for a, v in setting.items() if a != axis)  # noqa: E731
        scores[axis] = {r[axis]: final_r1(r) for r in mine if same(r)}
        most = limits["max_rates"] if axis == "rate_step" else limits["max_init_values"]
        step = next_on_axis(scores[axis], setting[axis], most)
        if step is not None:
            run = limited_run(loss, n, setting | {axis: step}, seed, steps, limits)
            return Tuning(setting, scores, tuple(edges), run)
        setting[axis] = best_step(scores[axis])
        edges += [axis] if at_edge(scores[axis]) else []
    return Tuning(setting, scores, tuple(edges), None)


def setting_words(loss: str, setting: Mapping[str, int]) -> str:
    """`"k=3 (0.0028), T0 0.05, b0 -5"`: a setting in the report's words."""
    k = setting["rate_step"]
    words = f"k={k} ({rate_grid.learning_rate(k):.2g}), T0 {temperature_init(loss, setting['temperature_step']):g}"
    return words + (f", b0 {bias_init(setting['bias_step']):g}" if loss == "siglip" else "")


def seed_records(records: Sequence[Mapping[str, Any]], run: sweep.Run, seeds: Sequence[int]) -> dict[int, dict]:
    """`{seed: record}` of the `records` on `seeds` with `run`'s setting (all its tags
    but the seed)."""
    same = lambda r: all(r.get(k) == v for k, v in run.tags.items() if k != "seed")  # noqa: E731
    return {r["seed"]: r for r in records if r["seed"] in seeds and same(r)}


def comparison(records: Sequence[Mapping[str, Any]], n: int, steps: int, limits: Mapping) -> dict[str, Any]:
    """At N = `n` and `steps` steps: each loss's `Tuning` on the tuning seed and, once it is
    tuned, its records at the tuned setting on the other seeds: `{"tuning": {loss: Tuning},
    "seeds": {loss: {seed: record}}, "edges": ["SigLIP rate", ...]}`."""
    seeds = limits["seeds"]
    tuning = {loss: plan(records, loss, n, seeds[0], steps, limits) for loss in LOSSES}
    found, edges = {}, []
    for loss, tuned in tuning.items():
        edges += [f"{LABELS[loss]} {AXIS_NAMES[a]}" for a in tuned.edges]
        if tuned.complete:
            run = limited_run(loss, n, tuned.setting, seeds[0], steps, limits)
            found[loss] = seed_records(records, run, seeds[1:])
    return {"tuning": tuning, "seeds": found, "edges": edges}


def units(batch_sizes: Sequence[int], limits: Mapping[str, Any]) -> list[tuple[int, int, tuple[str, ...]]]:
    """`[(N, steps, arms), ...]`: each N and step count the arms train, N by N, with the
    arms that read it (both where the step-matched arm's steps are the epoch-matched's)."""
    found: dict[tuple[int, int], tuple[str, ...]] = {}
    for n in batch_sizes:
        for arm in ARMS:
            key = (n, arm_steps(arm, n, limits))
            found[key] = (*found.get(key, ()), arm)
    return [(n, steps, arms) for (n, steps), arms in found.items()]
