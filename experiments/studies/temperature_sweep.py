"""The temperature of a cosine-similarity contrastive loss: fixed values, and learned.

Run (from the repository root):
  python -m experiments.studies.temperature_sweep              # full sweep, results committed
  python -m experiments.studies.temperature_sweep --quick      # CI: T = 1 and learned, a few steps

Trains `--config` (default: CLIP on the digits' halves) at global batch N with the
temperature fixed at each `--temperatures` value, and learned (log-parametrised,
clamped to 1/T <= 100) from each `--learned-from` value. Cosine logits lie in
[-1/T, 1/T], so at T = 1 no embedding can push the loss below
`losses.infonce_loss_floor(N, temperature=1)` = log(1 + (N - 1) e^-2) (3.6 nats at
N = 256, against log N = 5.5 at chance): training stalls there. Writes to `--out`:
`results.{csv,json}`, `summary.md` and

* `metric_vs_temperature.png`: the final retrieval metric vs the fixed temperature, and
  the learned runs (marked at their initial temperature);
* `loss_curves.png`: the training loss per temperature with each one's floor (dashed);
* `loss_vs_floor.png`: the final loss vs T beside the floor `log(1 + (N - 1) e^(-2/T))`;
* `learned_temperature.png`: the learned temperature during training.

Resumable: rerun the same command; finished runs are skipped (see `experiments/lib/sweep.py`).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contrastive_jax.config_lib import load_config, override
from experiments.lib import sweep

FULL = dict(
    config="default",
    temperatures=[0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
    learned_from=[0.07, 1.0],
    seeds=[0, 1],
    steps=400,
    batch_size=256,
    metric="a_to_b/R@1",
)
QUICK = dict(
    config="default", temperatures=[1.0], learned_from=[0.07], seeds=[0], steps=4, batch_size=64, metric="a_to_b/R@1"
)


def make_runs(
    base,
    temperatures: Sequence[float],
    learned_from: Sequence[float],
    seeds: Sequence[int],
    *,
    steps: int,
    batch_size: int,
) -> list[sweep.Run]:
    """One run per (fixed temperature or learned initial temperature, seed)."""
    settings = [(t, False) for t in temperatures] + [(t, True) for t in learned_from]
    return [
        sweep.Run(
            name=f"T{t:g}_{'learned' if learned else 'fixed'}_seed{seed}",
            tags={"temperature": t, "learned": learned, "seed": seed, "batch_size": batch_size},
            overrides={
                **sweep.run_overrides(num_steps=steps, seed=seed, warmup_steps=base.optim.warmup_steps),
                "train.global_batch_size": batch_size,
                "loss.temperature": t,
                "loss.learn_temperature": learned,
            },
        )
        for t, learned in settings
        for seed in seeds
    ]


def loss_floor(batch_size: int, temperature: float) -> float:
    """The InfoNCE floor at `temperature` (both directions of CLIP share it)."""
    from contrastive_jax import losses

    return losses.infonce_loss_floor(batch_size, temperature=temperature)


def plot(records: Sequence[dict], metric: str) -> dict:
    """The four figures (see the module docstring), by file name."""
    n = records[0]["batch_size"]
    fixed = [r for r in records if not r["learned"]]
    learned = [r for r in records if r["learned"]]
    temps = sorted({r["temperature"] for r in records})
    figures = {}

    fig, ax = sweep.new_figure(f"Final {metric} vs temperature (N={n})")
    if fixed:
        sweep.errorbar(ax, fixed, "temperature", metric, label="fixed T")
    if learned:
        sweep.errorbar(ax, learned, "temperature", metric, label="learned, from T", linestyle="none")
        for t0 in sorted({r["temperature"] for r in learned}):
            group = [r for r in learned if r["temperature"] == t0]
            ax.annotate(
                f"→ T={np.mean([r['train/temperature'] for r in group]):.3f}",
                (t0, np.mean([r[metric] for r in group])),
                textcoords="offset points",
                xytext=(8, 6),
                fontsize=8,
            )
    ax.set_xscale("log")
    ax.set(xlabel="temperature T", ylabel=metric)
    ax.legend(fontsize=8)
    figures["metric_vs_temperature"] = fig

    fig, ax = sweep.new_figure(f"Training loss per temperature (N={n}); dashed: floor", width=6)
    fixed_temps = sorted({r["temperature"] for r in fixed})
    for t, color in zip(fixed_temps, sweep.colors(len(fixed_temps), "plasma")):
        steps, loss = sweep.mean_curve([r for r in fixed if r["temperature"] == t], "train/loss")
        ax.plot(steps, loss, color=color, label=f"T={t:g}")
        ax.axhline(loss_floor(n, t), color=color, linestyle="--", linewidth=0.8)
    for t0, style in zip(sorted({r["temperature"] for r in learned}), itertools.cycle(["-", ":", "-."])):
        steps, loss = sweep.mean_curve([r for r in learned if r["temperature"] == t0], "train/loss")
        ax.plot(steps, loss, color="k", linestyle=style, label=f"learned from {t0:g}")
    ax.axhline(math.log(n), color="grey", linewidth=0.8, label="log N (chance)")
    ax.set(xlabel="step", ylabel="CLIP loss (nats)", ylim=(-0.1, math.log(n) + 1))
    ax.legend(fontsize=7, ncol=2)
    figures["loss_curves"] = fig

    fig, ax = sweep.new_figure(f"Final training loss and the floor (N={n})")
    grid = np.geomspace(min(temps), max(temps), 100)
    ax.plot(grid, [loss_floor(n, t) for t in grid], "k--", label="floor log(1+(N−1)e^(−2/T))")
    if fixed:
        sweep.errorbar(ax, fixed, "temperature", "train/loss", label="final loss, fixed T")
    ax.axhline(math.log(n), color="grey", linewidth=0.8, label="log N")
    ax.set_xscale("log")
    ax.set(xlabel="temperature T", ylabel="nats")
    ax.legend(fontsize=8)
    figures["loss_vs_floor"] = fig

    if learned:
        fig, ax = sweep.new_figure("Learned temperature during training")
        for t0 in sorted({r["temperature"] for r in learned}):
            steps, temp = sweep.mean_curve([r for r in learned if r["temperature"] == t0], "train/temperature")
            ax.plot(steps, temp, label=f"from {t0:g}")
        ax.set(xlabel="step", ylabel="temperature T", yscale="log")
        ax.legend(fontsize=8)
        figures["learned_temperature"] = fig
    return figures


def summary(records: Sequence[dict], metric: str) -> str:
    """A markdown table: per setting, the metric, final loss, floor and final temperature."""
    n = records[0]["batch_size"]
    rows = []
    for t, learned in sorted({(r["temperature"], r["learned"]) for r in records}, key=lambda k: (k[1], k[0])):
        group = [r for r in records if r["temperature"] == t and r["learned"] == learned]
        rows.append(
            [
                "learned, from" if learned else "fixed",
                t,
                len(group),
                sweep.mean_std(group, metric),
                sweep.mean_std(group, "train/loss"),
                f"{loss_floor(n, t):.3f}" if not learned else "",
                sweep.mean_std(group, "train/temperature"),
            ]
        )
    header = ["temperature", "T (initial if learned)", "seeds", metric, "final loss", "floor (fixed T)", "final T"]
    return f"N = {n}, log N = {math.log(n):.3f}\n\n" + sweep.markdown_table(rows, header)


def run(
    config: str,
    temperatures: Sequence[float],
    learned_from: Sequence[float],
    seeds: Sequence[int],
    out: Path,
    *,
    steps: int,
    batch_size: int,
    metric: str = "a_to_b/R@1",
    data_dir: str | None = None,
    overrides: dict | None = None,
) -> list[dict]:
    """Runs (or resumes) the sweep and writes its results, figures and summary to `out`."""
    base = override(load_config(config), {"data.data_dir": data_dir, **(overrides or {})})
    runs = make_runs(base, temperatures, learned_from, seeds, steps=steps, batch_size=batch_size)
    return sweep.run_sweep(base, runs, out, figures=lambda r: plot(r, metric), summary=lambda r: summary(r, metric))


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring and `--help`."""
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", help="a name in configs/ with a softmax loss (default: default)")
    parser.add_argument("--temperatures", type=sweep.float_list, help="fixed temperatures, comma-separated")
    parser.add_argument("--learned-from", type=sweep.float_list, help="initial values of learned temperatures")
    parser.add_argument("--batch-size", type=int, help="global batch size N")
    parser.add_argument("--metric", help="the evaluation metric plotted")
    args = sweep.resolve(parser.parse_args(argv), "temperature_sweep", FULL, QUICK)
    quick = {"eval.linear_probe": False} if args.quick else {}
    run(
        args.config,
        args.temperatures,
        args.learned_from,
        args.seeds,
        args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        metric=args.metric,
        data_dir=args.data_dir,
        overrides=quick,
    )
    print(f"results in {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
