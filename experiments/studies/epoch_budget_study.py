"""How large must the batch be? cmudict at an epoch budget: the batch against the alternatives.

Every run trains `configs/cmudict_clip.py` (121,490 spelling / pronunciation pairs, two
1-D CNN towers, 8 simulated CPU devices, every loss over the global batch) for the same
number of epochs (`EPOCHS`: the largest N gets >= 300 steps), with the learning rate
scaled by sqrt(N / 256) from `BASE_LEARNING_RATE` and a warmup of `WARMUP_EPOCHS`
epochs, evaluating test R@1 both ways `EVALS` times along the run. The grid (`METHODS`):

* CLIP and SigLIP at N in `BATCH_SIZES`, each seed: does a larger batch win at a fixed
  number of epochs (SimCLR, Fig. 9), and where does the sigmoid loss stand (SigLIP)?
  The CLIP runs log the gradient noise scale `B_simple` (`config.train.log_noise_scale`,
  McCandlish et al. 2018): the batch beyond which more buys few fewer steps.
* at the smallest N, the negatives beyond the batch: DCL, SogCLR (per-example state), a
  MoCo queue of `QUEUE_SIZE` keys without and with a momentum (EMA) key encoder.
* the controls of the open verdicts: SigLIP at the largest N from a temperature suited to
  its few steps; EMA keys without a queue; the queue without EMA with detached keys.

Run (from the repository root; resumable: rerun the same command after a kill):
  .venv/bin/python -m experiments.studies.epoch_budget_study           # the grid, results committed
  .venv/bin/python -m experiments.studies.epoch_budget_study --hours 1  # no run starts after 1 h
  .venv/bin/python -m experiments.studies.epoch_budget_study --quick   # CI: slices of the data

Writes to `--out` (default `experiments/results/epoch_budget_study`): `results.{csv,json}`
(every run's tags, final metrics and curves), `final.json` (each run's per-query test
hits, from its last checkpoint while it is on disk: `query_hits`), `summary.md` (one row
per method and N; the differences, with a Welch interval over the seeds and a paired
bootstrap over the queries; the epoch and noise-scale tables) and the figures
`r1_vs_batch.png`, `r1_vs_epochs.png`, `r1_vs_training_time.png`, `noise_scale.png`.
Training time is the steps' own time (from the logged throughput; compilation, evaluation
and checkpoints left out; the first seed's, as a resumed grid runs its seeds in other
sessions).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from contrastive_jax.config_lib import load_config, override
from contrastive_jax.training import noise_scale
from experiments.lib import intervals, query_hits, sweep

TRAIN_PAIRS = 121_490  # cmudict's training split
EPOCHS = 11.0  # N = 4,096 gets ceil(11 * 121,490 / 4,096) = 327 steps
BATCH_SIZES = (256, 1024, 4096)
SMALL_BATCH = 256  # the alternatives' N
SEEDS = (0, 1, 2)
REFERENCE_BATCH = 256
BASE_LEARNING_RATE = 1e-3  # AdamW's peak at N = 256; x sqrt(N / 256) above
WARMUP_EPOCHS = 0.5
EVALS = 5  # test retrieval this many times per run, the last at the end
LOG_WINDOWS_PER_EVAL = 8  # training scalars logged this many times between evaluations
QUEUE_SIZE = 16_384  # MoCo keys per tower (a multiple of every N with a queue)
# SigLIP's initialisation: t' = log 10 (temperature 0.1), bias -10 (Zhai et al. 2023).
SIGLIP_TEMPERATURE, SIGLIP_BIAS = 0.1, -10.0
# The control at the largest N: SigLIP from the temperature the 11-epoch runs end at
# (CLIP at 4,096: 0.040; SigLIP at 1,024: 0.038), not one its few steps must travel to.
SIGLIP_FEW_STEPS = 0.04
METRICS = tuple(f"{d}/R@1" for d in query_hits.DIRECTIONS)
COLLAPSED_R1 = 0.1  # a run under this test R@1 has collapsed: left off the R@1-vs-N axis
DIFFERENCE_HEADER = ["method", "against", "seeds", *(f"{m} difference" for m in METRICS)]  # a comparisons table
CURVES = (
    "train/loss",
    "train/temperature",
    "train/examples_per_second",
    "train/noise_scale",
    f"train/{noise_scale.SMALL_KEY}",
    f"train/{noise_scale.BIG_KEY}",
    *(f"eval/{m}" for m in METRICS),
)


@dataclasses.dataclass(frozen=True)
class Method:
    """One line of the grid: a loss (config overrides) at some batch sizes and seeds."""

    label: str  # the legend's name
    overrides: Mapping[str, Any]
    batch_sizes: Sequence[int]
    seeds: Sequence[int]
    epochs_factor: float = 1.0  # the study's epochs times this (a control's longer budget)


def methods(batch_sizes: Sequence[int], small: int, seeds: Sequence[int], queue_size: int) -> list[Method]:
    """The grid: CLIP (logging the noise scale) and SigLIP at every N; at N = `small`, DCL
    and SogCLR; the queue with EMA keys (MoCo's) at `small` and the next N. The controls:
    SigLIP at the largest N started at the temperature the runs end at (`SIGLIP_FEW_STEPS`)
    and with twice the epochs; at `small`, EMA keys without a queue (MoCo v3's form), and
    the queue without EMA with keys from the towers, carrying their gradient or detached
    (MoCo's own m = 0). Every seed but the queues without EMA (they collapse): the first
    seed."""
    queue = {"loss.name": "moco_queue", "loss.queue_size": queue_size, "loss.chunk_size": "auto"}
    siglip = {"loss.name": "siglip", "loss.siglip_bias": SIGLIP_BIAS}
    return [
        Method("CLIP", {"loss.name": "clip", "train.log_noise_scale": True}, batch_sizes, seeds),
        Method("SigLIP", {**siglip, "loss.temperature": SIGLIP_TEMPERATURE}, batch_sizes, seeds),
        Method("DCL", {"loss.name": "dcl"}, [small], seeds),
        Method("SogCLR", {"loss.name": "sogclr", "loss.sogclr_gamma": 0.9}, [small], seeds),
        Method(f"queue K={queue_size:,}", {**queue, "loss.queue_momentum": 0.0}, [small], seeds[:1]),
        Method(
            f"queue K={queue_size:,}, EMA 0.99",
            {**queue, "loss.queue_momentum": 0.99},
            [small, *batch_sizes[1:2]],
            seeds,
        ),
        Method(
            f"SigLIP, T0 {SIGLIP_FEW_STEPS:g}",
            {**siglip, "loss.temperature": SIGLIP_FEW_STEPS},
            batch_sizes[-1:],
            seeds,
        ),
        Method("SigLIP, 2x epochs", {**siglip, "loss.temperature": SIGLIP_TEMPERATURE}, batch_sizes[-1:], seeds, 2.0),
        Method("EMA 0.99, no queue", {**queue, "loss.queue_size": 0, "loss.queue_momentum": 0.99}, [small], seeds),
        Method(
            f"queue K={queue_size:,}, detached keys",
            {**queue, "loss.queue_momentum": 0.0, "loss.queue_stop_gradient": True},
            [small],
            seeds[:1],
        ),
    ]


def learning_rate(n: int) -> float:
    """The sqrt rule: `BASE_LEARNING_RATE * sqrt(N / 256)`."""
    return BASE_LEARNING_RATE * math.sqrt(n / REFERENCE_BATCH)


def study_runs(grid: Sequence[Method], *, epochs: float, train_size: int, evals: int = EVALS) -> list[sweep.Run]:
    """One run per (method, N, seed), each `ceil(epochs * train_size / N)` steps, logging
    `LOG_WINDOWS_PER_EVAL` times per evaluation and checkpointing at the evaluations.
    The first seed's runs come first: a grid stopped early has every method once."""
    runs = []
    for method in grid:
        for n in method.batch_sizes:
            steps_per_epoch = train_size / n
            num_steps = math.ceil(epochs * method.epochs_factor * steps_per_epoch)
            # `evals` evaluations, the last at the end, each at a logging step
            log_every = math.ceil(math.ceil(num_steps / evals) / LOG_WINDOWS_PER_EVAL)
            eval_every = log_every * LOG_WINDOWS_PER_EVAL
            for seed in method.seeds:
                overrides = {
                    **sweep.run_overrides(
                        num_steps=num_steps, seed=seed, warmup_steps=round(WARMUP_EPOCHS * steps_per_epoch)
                    ),
                    "train.log_every_steps": log_every,
                    "eval.every_steps": eval_every,
                    "checkpoint.every_steps": eval_every,
                    "train.global_batch_size": n,
                    "optim.learning_rate": learning_rate(n),
                    **method.overrides,
                }
                name = method.label.lower().replace(" ", "_").replace(",", "").replace("=", "")
                runs.append(
                    sweep.Run(
                        name=f"{name}_batch{n:05d}_seed{seed}",
                        tags={
                            "method": method.label,
                            "batch_size": n,
                            "seed": seed,
                            "steps": num_steps,
                            "epochs": round(num_steps * n / train_size, 3),
                            "learning_rate": learning_rate(n),
                        },
                        overrides=overrides,
                    )
                )
    return sorted(runs, key=lambda r: r.tags["seed"])


def training_seconds(record: Mapping[str, Any]) -> dict[int, float]:
    """`{step: seconds}`: the steps' cumulative time at each logged step, from each logging
    window's throughput (`train/examples_per_second` x the window's steps)."""
    elapsed, previous, out = 0.0, 0, {}
    for step, examples_per_second in record["curves"]["train/examples_per_second"]:
        elapsed += (step - previous) * record["batch_size"] / examples_per_second
        out[int(step)], previous = elapsed, step
    return out


def with_time_axes(record: dict[str, Any], train_size: int, num_devices: int) -> dict[str, Any]:
    """The record plus `training_minutes`, `evals` (for each evaluation `[step, epoch,
    seconds, R@1 a->b, R@1 b->a]`) and, for runs that logged the noise scale,
    `noise_by_epoch` (`noise_by_epoch`)."""
    seconds = training_seconds(record)
    curves = record["curves"]
    evals = [
        [step, step * record["batch_size"] / train_size, seconds[step], a, b]  # evaluations log too
        for (step, a), (_, b) in zip(curves[f"eval/{METRICS[0]}"], curves[f"eval/{METRICS[1]}"], strict=True)
    ]
    out = dict(record, evals=evals, training_minutes=seconds[max(seconds)] / 60)
    if curves[f"train/{noise_scale.SMALL_KEY}"]:
        out["noise_by_epoch"] = noise_by_epoch(record, train_size, num_devices)
        out["noise_small_batch"] = record["batch_size"] // num_devices
    return out


def noise_by_epoch(record: Mapping[str, Any], train_size: int, num_devices: int) -> list[list[float]]:
    """McCandlish's estimate per epoch: `[epoch, |G_small|^2, |G_big|^2, |G|^2, tr(Sigma),
    B_simple]`, the logged windows ending in epoch e (`(e - 1, e]`, the last one partial)
    pooled. Where the noise swamps the signal the `|G|^2` estimate is <= 0 and
    `B_simple` is not resolved (NaN)."""
    n = record["batch_size"]
    windows: dict[int, list[tuple[float, float]]] = {}
    big = dict(map(tuple, record["curves"][f"train/{noise_scale.BIG_KEY}"]))
    for step, small in record["curves"][f"train/{noise_scale.SMALL_KEY}"]:
        windows.setdefault(math.ceil(step * n / train_size), []).append((small, big[step]))
    return [
        [epoch, *_estimate(*np.mean(norms, axis=0), n // num_devices, n)] for epoch, norms in sorted(windows.items())
    ]


def _estimate(small: float, big: float, b_small: int, b_big: int) -> list[float]:
    """`[|G_small|^2, |G_big|^2, |G|^2, tr(Sigma), B_simple (NaN where |G|^2 <= 0)]`."""
    estimate = noise_scale.estimate(small, big, b_small, b_big)
    b_simple = estimate.b_simple if estimate.g_squared > 0 else float("nan")
    return [float(small), float(big), estimate.g_squared, estimate.trace_sigma, b_simple]


def pooled_noise(group: Sequence[Mapping]) -> np.ndarray:
    """`noise_by_epoch` of the seeds of one N, their norms averaged before the estimate:
    `[epochs, 6]` (the columns of `noise_by_epoch`)."""
    n = group[0]["batch_size"]
    norms = np.mean([np.asarray(r["noise_by_epoch"])[:, :3] for r in group], axis=0)
    return np.asarray(
        [[epoch, *_estimate(small, big, group[0]["noise_small_batch"], n)] for epoch, small, big in norms]
    )


def _mean_evals(group: Sequence[Mapping]) -> np.ndarray:
    """The seeds' `evals` (`with_time_axes`): R@1 averaged over the seeds, the time axis
    the first seed's (a resumed grid runs its seeds in other sessions, at another pace)."""
    evals = np.mean([np.asarray(r["evals"], dtype=float) for r in group], axis=0)
    evals[:, 2] = np.asarray(_first_seed(group)["evals"], dtype=float)[:, 2]
    return evals


def _first_seed(group: Sequence[Mapping]) -> Mapping:
    """The run of the lowest seed in `group`."""
    return min(group, key=lambda r: r["seed"])


def _groups(records: Sequence[Mapping]) -> dict[tuple[str, int], list[Mapping]]:
    """Records by (method, N), in the grid's order."""
    groups: dict[tuple[str, int], list[Mapping]] = {}
    for r in records:
        groups.setdefault((r["method"], r["batch_size"]), []).append(r)
    return groups


def comparisons(groups: Mapping[tuple[str, int], Sequence]) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """The pairs of `(method, N)` groups the findings compare: CLIP at each N against CLIP
    at the next smaller N, then at each N every method against each one before it in the
    grid (CLIP first)."""
    clip_ns = sorted(n for label, n in groups if label == "CLIP")
    pairs = [(("CLIP", big), ("CLIP", small)) for small, big in zip(clip_ns, clip_ns[1:], strict=False)]
    keys = list(groups)
    for n in sorted({n for _, n in keys}):
        at_n = [key for key in keys if key[1] == n]
        pairs += [(x, y) for i, x in enumerate(at_n) for y in at_n[:i]]
    return pairs


def plot(records: Sequence[Mapping], batch_sizes: Sequence[int]) -> dict:
    """The four figures (see the module docstring)."""
    groups = _groups(records)
    labels = list(dict.fromkeys(r["method"] for r in records))
    figures = {}
    fig, axes = sweep.new_figure(
        f"test R@1 after {min(r['epochs'] for r in records):.3g} epochs at every N (a control: longer); bars: std "
        f"over seeds; runs under {COLLAPSED_R1:g} off the axis",
        ncols=2,
    )
    for ax, metric in zip(axes, METRICS, strict=True):
        for label, marker in zip(labels, itertools.cycle("osD^v<>phX*P"), strict=False):
            sweep.errorbar(
                ax,
                records,
                "batch_size",
                metric,
                where=lambda r, label=label: r["method"] == label,
                label=label,
                marker=marker,
                linestyle="-" if len({r["batch_size"] for r in records if r["method"] == label}) > 1 else "none",
            )
        # The axis spans the trained runs: a collapsed run (R@1 < 0.1) would stretch it to
        # 0 and flatten every difference discussed; it stays off the axis.
        trained = [r[metric] for r in records if r[metric] >= COLLAPSED_R1]
        ax.set(xlabel="global batch N", ylabel=f"test {metric}")
        if trained:
            ax.set_ylim(min(trained) - 0.01, max(trained) + 0.01)
        sweep.log_spaced_ticks(ax, batch_sizes)
    axes[0].legend(fontsize=7)
    figures["r1_vs_batch"] = fig
    for name, column, xlabel in (("r1_vs_epochs", 1, "epochs"), ("r1_vs_training_time", 2, "training minutes")):
        fig, ax = sweep.new_figure(
            f"test {METRICS[0]} along the runs (mean over seeds; time: the first seed's)", width=7
        )
        for ((label, n), group), color in zip(groups.items(), sweep.colors(len(groups), "tab20"), strict=True):
            evals = _mean_evals(group)
            x = evals[:, column] / (60 if column == 2 else 1)
            ax.plot(x, evals[:, 3], marker="o", markersize=3, color=color, label=f"{label}, N={n:,}")
        ax.set(xlabel=xlabel, ylabel=f"test {METRICS[0]}", xscale="log" if column == 2 else "linear")
        ax.legend(fontsize=6, ncols=2)
        figures[name] = fig
    noisy = {key: group for key, group in groups.items() if "noise_by_epoch" in group[0]}
    if noisy:
        fig, axes = sweep.new_figure("the gradient noise scale along the CLIP runs (per epoch, seeds pooled)", ncols=2)
        for ((label, n), group), color in zip(noisy.items(), sweep.colors(len(noisy) + 1, "plasma"), strict=False):
            rows = pooled_noise(group)
            axes[0].plot(rows[:, 0], rows[:, 4], color=color, marker="o", label=f"tr Σ, N={n:,}")
            resolved = rows[:, 3] > 0
            axes[0].plot(
                rows[resolved, 0], rows[resolved, 3], color=color, marker="x", linestyle="--", label=f"|G|², N={n:,}"
            )
            axes[1].plot(rows[:, 0], rows[:, 5], color=color, marker="o", label=f"{label}, N={n:,}")
            axes[1].axhline(n, color=color, linestyle=":", linewidth=1)
        axes[0].set(xlabel="epoch", ylabel="estimate (|G|² only where > 0)", yscale="log")
        axes[1].set(xlabel="epoch", ylabel="B_simple = tr Σ / |G|² (gaps: |G|² ≤ 0)", yscale="log")
        axes[0].legend(fontsize=6, ncols=2)
        axes[1].legend(fontsize=7)
        figures["noise_scale"] = fig
    return figures


def _gain_shrink_section(groups: Mapping[tuple[str, int], Sequence]) -> str:
    """For each method run at two N beside CLIP at both: its gain over CLIP at the smaller
    N less its gain at the larger, with the 95% Welch interval over the four groups' seeds
    (`intervals.welch_contrast`) and the verdict it allows."""
    rows = []
    for method in dict.fromkeys(label for label, _ in groups):
        ns = sorted(n for label, n in groups if label == method and ("CLIP", n) in groups)
        if method == "CLIP" or len(ns) < 2:
            continue
        for small, large in zip(ns, ns[1:], strict=False):
            keys = [(method, small), ("CLIP", small), (method, large), ("CLIP", large)]
            cells = []
            for metric in METRICS:
                contrast = intervals.welch_contrast([[r[metric] for r in groups[k]] for k in keys], [1, -1, -1, 1])
                cells.append(f"{intervals.difference_cell(*contrast)}, {intervals.verdict(*contrast[1:])}")
            rows.append([method, f"{small:,} → {large:,}", " / ".join(str(len(groups[k])) for k in keys), *cells])
    if not rows:
        return ""
    header = ["method", "N", "seeds", *(f"{m}: gain shrink [95%]" for m in METRICS)]
    return (
        "\n## Does the gain over CLIP shrink with N? (gain over CLIP at the smaller N) − (gain at the larger), "
        "95% Welch interval over the four groups' seeds\n\n" + sweep.markdown_table(rows, header)
    )


def _final_table(groups: Mapping[tuple, list], records: Sequence[Mapping], ceilings: Mapping[str, float]) -> str:
    """The title and the final table: per method and N, test R@1 both ways (mean ± 95%
    t-interval over the seeds, and its distance to the `ceilings`), loss, temperature."""
    rows = []
    for (label, n), group in groups.items():
        cells = []
        for direction, metric in zip(query_hits.DIRECTIONS, METRICS, strict=True):
            values, ceiling = [r[metric] for r in group], ceilings[direction]
            cells += [intervals.mean_and_interval(values, decimals=3), f"{ceiling - np.mean(values):.3f}"]
        rows.append(
            [
                label,
                f"{n:,}",
                group[0]["steps"],
                len(group),
                *cells,
                sweep.mean_std(group, "train/loss"),
                sweep.mean_std(group, "train/temperature"),
                f"{_first_seed(group)['training_minutes']:.2f}",
            ]
        )
    epochs = sorted({r["epochs"] for r in records})
    budget = [e for e in epochs if e < 1.5 * epochs[0]]  # the rest: a control's longer budget
    longer = "".join(f", {e:g}" for e in epochs[len(budget) :])
    text = f"# cmudict, the same epoch budget at every N ({budget[0]:g} to {budget[-1]:g} epochs: whole steps"
    text += f"; the longer controls{longer})\n\n" if longer else ")\n\n"
    text += (
        "Test R@1: mean ± the 95% t-interval over the seeds (the value alone for one seed); ceiling: the best "
        "R@1 any model can reach, identical queries ranking alike ("
        + ", ".join(f"{value:.3f} {direction}" for direction, value in ceilings.items())
        + "). Loss and temperature: mean ± std.\n\n"
    )
    header = ["method", "N", "steps", "seeds", f"test {METRICS[0]}", "ceiling - R@1", f"test {METRICS[1]}"]
    header += ["ceiling - R@1", "final loss", "temperature", "training min (first seed)"]
    return text + sweep.markdown_table(rows, header)


def _differences_section(groups: Mapping[tuple, list]) -> str:
    """The `comparisons`' differences of test R@1 with a Welch interval over the seeds."""
    text = (
        "\n## Differences of test R@1 (CLIP against the next smaller N; at each N every pair of methods): "
        "difference of the seed means [95% Welch interval over the seeds; n/a: one seed]\n\n"
    )
    comparison_rows = []
    for x, y in comparisons(groups):
        cells = []
        for metric in METRICS:
            interval = intervals.welch_interval([r[metric] for r in groups[x]], [r[metric] for r in groups[y]])
            cells.append(intervals.difference_cell(*interval))
        seeds = f"{len(groups[x])} vs {len(groups[y])}"
        comparison_rows.append([f"{x[0]}, N={x[1]:,}", f"{y[0]}, N={y[1]:,}", seeds, *cells])
    return text + sweep.markdown_table(comparison_rows, DIFFERENCE_HEADER)


def _evals_and_noise_sections(groups: Mapping[tuple, list]) -> str:
    """Test R@1 at each evaluation (mean over seeds), and B_simple per epoch where measured."""
    text = f"\n## test {METRICS[0]} at each evaluation (mean over seeds): epoch -> R@1 (the first seed's minutes)\n\n"
    eval_rows = []
    for (label, n), group in groups.items():
        evals = _mean_evals(group)
        eval_rows.append([label, f"{n:,}", *(f"{e:.1f}: {r:.3f} ({t / 60:.1f} min)" for _, e, t, r, _ in evals)])
    text += sweep.markdown_table(eval_rows, ["method", "N", *(f"eval {i + 1}" for i in range(len(eval_rows[0]) - 2))])
    noisy = {key: group for key, group in groups.items() if "noise_by_epoch" in group[0]}
    if noisy:
        text += "\n## The gradient noise scale B_simple per epoch (seeds pooled; -: |G|^2 <= 0, not resolved)\n\n"
        noise_rows = []
        for (label, n), group in noisy.items():
            rows = pooled_noise(group)
            noise_rows.append([label, f"{n:,}", *("-" if np.isnan(b) else f"{b:,.0f}" for b in rows[:, 5])])
            noise_rows.append(["", "tr Σ, \\|G\\|²", *(f"{t:.3g}, {g:.2g}" for g, t in rows[:, 3:5])])
        width = max(len(r) for r in noise_rows) - 2
        text += sweep.markdown_table(noise_rows, ["method", "N", *(f"epoch {e + 1}" for e in range(width))])
    return text


def summary(
    records: Sequence[Mapping], ceilings: Mapping[str, float], hits: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """`summary.md`: the final table (R@1 both ways: mean ± 95% t-interval over the seeds,
    and its distance to the `ceilings`, `metrics.paired_ceilings` of the test split), the
    differences the findings read (`comparisons`) with a Welch interval over the seeds and,
    where both sides have per-query `hits` (`query_hits.cached_hits`) of the same seeds, a
    paired bootstrap over the test queries; R@1 at each evaluation, and the noise scale."""
    groups = _groups(records)
    text = _final_table(groups, records, ceilings) + _differences_section(groups)
    text += _gain_shrink_section(groups) + _bootstrap_section(groups, hits or {})
    return text + _evals_and_noise_sections(groups)


def _bootstrap_section(groups: Mapping[tuple[str, int], Sequence[Mapping]], hits: Mapping[str, Mapping]) -> str:
    """The `comparisons` again, on the same queries: over the seeds both groups have
    `hits` for, the difference of the seed-mean hits with its 95% paired bootstrap over
    the test queries (`query_hits.seed_mean_difference`); a pair with no such seed is left
    out."""
    if not hits:
        return ""
    rows = []
    for x, y in comparisons(groups):
        by_seed = [{r["seed"]: r["name"] for r in groups[key] if r["name"] in hits} for key in (x, y)]
        seeds = sorted(by_seed[0].keys() & by_seed[1].keys())
        if not seeds:
            continue
        names, against = [by_seed[0][s] for s in seeds], [by_seed[1][s] for s in seeds]
        cells = [
            intervals.difference_cell(*query_hits.seed_mean_difference(hits, names, against, direction))
            for direction in query_hits.DIRECTIONS
        ]
        rows.append([f"{x[0]}, N={x[1]:,}", f"{y[0]}, N={y[1]:,}", ", ".join(map(str, seeds)), *cells])
    if not rows:
        return ""
    queries = len(next(iter(hits.values()))[query_hits.DIRECTIONS[0]])
    return (
        "\n## The same differences on the same queries: the seeds whose per-query hits were measured "
        f"(their checkpoints on disk), difference of the seed-mean R@1 [95% paired bootstrap over the {queries:,} "
        f"test queries, {intervals.BOOTSTRAP_RESAMPLES:,} resamples]\n\n"
        + sweep.markdown_table(rows, DIFFERENCE_HEADER)
    )


def test_ceilings(config) -> dict[str, float]:
    """`metrics.paired_ceilings` of `config`'s evaluation split (the test split)."""
    from contrastive_jax.data import input_pipeline, settings
    from contrastive_jax.evaluation import metrics
    from contrastive_jax.training import run_plan

    data = run_plan.data_settings(config)
    ids = input_pipeline.eval_arrays(data, config.eval.split)
    return metrics.paired_ceilings(ids, settings.open_metadata(data).match_keys)


def run(args) -> list[dict]:
    """Trains the grid (skipping finished runs), then writes results, figures and summary."""
    base = load_config("cmudict_clip")
    base.data.data_dir = args.data_dir
    if args.quick:
        base = override(base, QUICK_OVERRIDES)
    grid = methods(args.batch_sizes, args.batch_sizes[0], args.seeds, args.queue_size)
    runs = study_runs(grid, epochs=args.epochs, train_size=args.train_size, evals=args.evals)
    records = sweep.run_grid(base, runs, args.out, curve_keys=CURVES, deadline=sweep.deadline(args.hours))
    records = [with_time_axes(r, args.train_size, base.num_simulated_devices) for r in records]
    sweep.write_results(records, args.out)
    sweep.save(plot(records, args.batch_sizes), args.out)
    hits = query_hits.cached_hits([r["name"] for r in records], args.out, base.eval.split)
    (args.out / "summary.md").write_text(summary(records, test_ceilings(base), hits))
    print(f"wrote {args.out}")
    return records


FULL = dict(
    batch_sizes=list(BATCH_SIZES),
    seeds=list(SEEDS),
    epochs=EPOCHS,
    evals=EVALS,
    queue_size=QUEUE_SIZE,
    train_size=TRAIN_PAIRS,
)
# --quick: 1,024 training pairs, 512 test pairs, N = 64, one epoch: every method once.
QUICK = dict(batch_sizes=[64], seeds=[0], epochs=1.0, evals=2, queue_size=256, train_size=1024)
QUICK_OVERRIDES = {"data.train_split": "train[:1024]", "eval.split": "test[:512]"}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="CLIP / SigLIP's N; the first is the alternatives'")
    parser.add_argument("--epochs", type=float, help=f"epochs per run (default {EPOCHS:g})")
    parser.add_argument("--evals", type=int, help=f"evaluations per run (default {EVALS})")
    parser.add_argument("--queue-size", type=int, help=f"MoCo keys per tower (default {QUEUE_SIZE:,})")
    sweep.add_hours_option(parser)
    args = sweep.resolve(parser.parse_args(argv), "epoch_budget_study", FULL, QUICK)
    if args.steps is not None:
        parser.error("--steps: every run here trains a number of epochs; pass --epochs.")
    return run(args)


if __name__ == "__main__":
    main()
