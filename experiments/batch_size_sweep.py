"""How the global batch (the number of negatives) changes what a contrastive model learns.

Run (from the repository root):
  python -m experiments.batch_size_sweep                 # full sweep, results committed
  python -m experiments.batch_size_sweep --quick         # CI: 2 batch sizes, a few steps
  python -m experiments.batch_size_sweep --epochs 50     # fixed epochs instead of steps

Trains `--config` (default: CLIP on the digits' top / bottom halves, learned temperature)
at each global batch size N, for a fixed number of steps (or epochs) and several seeds,
data parallel over all devices (8 simulated CPU devices on a CPU-only machine: the loss
all-gathers the embeddings, so every row sees all N - 1 negatives). The learning rate is
the config's at every N. Writes to `--out`: `results.{csv,json}`, `summary.md` and

* `metric_vs_batch.png`: the final retrieval metric (`--metric`) vs N, seed error bars;
* `loss_curves.png`: the training loss per N (mean over seeds), with `log N` for scale;
* `temperature_vs_batch.png`: the final learned temperature vs N;
* `mi_bound.png`: the InfoNCE bound on the mutual information, `I >= log N - L`, against
  `log N` (at most `log N`: a batch of N can certify at most log N nats).

Resumable: rerun the same command; finished runs are skipped (see `experiments/sweep.py`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contrastive_jax.config_lib import override
from experiments import sweep

FULL = dict(config="default", batch_sizes=[16, 32, 64, 128, 256, 512, 1024], seeds=[0, 1, 2],
            steps=500, metric="a_to_b/R@1")
QUICK = dict(config="default", batch_sizes=[16, 64], seeds=[0], steps=4, metric="a_to_b/R@1")


def make_runs(base, batch_sizes: Sequence[int], seeds: Sequence[int], *, steps: int | None = None,
              epochs: float | None = None, train_size: int | None = None) -> list[sweep.Run]:
    """One run per (batch size, seed): `steps` steps, or `ceil(epochs * train_size / N)`."""
    runs = []
    for n in batch_sizes:
        num_steps = steps if epochs is None else math.ceil(epochs * train_size / n)
        for seed in seeds:
            runs.append(sweep.Run(
                name=f"batch{n:05d}_seed{seed}",
                tags={"batch_size": n, "seed": seed, "steps": num_steps},
                overrides={
                    **sweep.run_overrides(num_steps=num_steps, seed=seed, warmup_steps=base.optim.warmup_steps),
                    "train.global_batch_size": n,
                },
            ))
    return runs


def plot(records: Sequence[dict], metric: str) -> dict:
    """The four figures (see the module docstring), by file name."""
    sizes = sorted({r["batch_size"] for r in records})
    figures = {}

    steps = sorted({r["steps"] for r in records})
    length = f"{steps[0]} steps" if len(steps) == 1 else f"fixed epochs: {steps[-1]} … {steps[0]} steps"
    fig, ax = sweep.new_figure(f"Final {metric} vs global batch size ({length})")
    sweep.errorbar(ax, records, "batch_size", metric)
    sweep.log_spaced_ticks(ax, sizes)
    ax.set(xlabel="global batch size N", ylabel=metric)
    figures["metric_vs_batch"] = fig

    fig, ax = sweep.new_figure("Training loss per batch size (mean over seeds)", width=6)
    for n, color in zip(sizes, sweep.colors(len(sizes))):
        steps, loss = sweep.mean_curve([r for r in records if r["batch_size"] == n], "train/loss")
        ax.plot(steps, loss, color=color, label=f"N={n}")
        ax.axhline(math.log(n), color=color, linestyle=":", linewidth=0.8)
    ax.set(xlabel="step", ylabel="CLIP loss (nats); dotted: log N", yscale="log")
    ax.legend(fontsize=7, ncol=2)
    figures["loss_curves"] = fig

    if all("train/temperature" in r for r in records):
        fig, ax = sweep.new_figure("Final learned temperature vs batch size")
        sweep.errorbar(ax, records, "batch_size", "train/temperature")
        sweep.log_spaced_ticks(ax, sizes)
        ax.set(xlabel="global batch size N", ylabel="temperature T")
        figures["temperature_vs_batch"] = fig

    fig, ax = sweep.new_figure("InfoNCE mutual-information lower bound")
    bound = [dict(r, log_n=math.log(r["batch_size"]), bound=math.log(r["batch_size"]) - r["train/loss"])
             for r in records]
    sweep.errorbar(ax, bound, "log_n", "bound", label="log N − L (final training loss)")
    log_n = np.log(sizes)
    ax.plot(log_n, log_n, "k--", linewidth=1, label="log N (the bound's ceiling)")
    ax.set(xlabel="log N (nats)", ylabel="I(top; bottom) ≥ (nats)")
    ax.legend(fontsize=8)
    figures["mi_bound"] = fig
    return figures


def summary(records: Sequence[dict], metric: str) -> str:
    """A markdown table: per batch size, the metric, loss, temperature and MI bound."""
    rows = []
    for n in sorted({r["batch_size"] for r in records}):
        group = [r for r in records if r["batch_size"] == n]
        bound = [dict(r, bound=math.log(n) - r["train/loss"]) for r in group]
        rows.append([n, group[0]["steps"], len(group), sweep.mean_std(group, metric),
                     sweep.mean_std(group, "train/loss"), sweep.mean_std(group, "train/temperature"),
                     f"{math.log(n):.3f}", sweep.mean_std(bound, "bound")])
    header = ["N", "steps", "seeds", metric, "final loss L", "temperature", "log N", "log N − L"]
    return sweep.markdown_table(rows, header)


def run(config: str, batch_sizes: Sequence[int], seeds: Sequence[int], out: Path, *, steps: int | None = None,
        epochs: float | None = None, metric: str = "a_to_b/R@1", data_dir: str | None = None,
        overrides: dict | None = None) -> list[dict]:
    """Runs (or resumes) the sweep and writes its results, figures and summary to `out`.

    Args:
      config: a name in `configs/`.
      steps / epochs: exactly one: the length of every run.
      overrides: extra config fields for every run (e.g. `{"eval.linear_probe": False}`).

    Returns:
      The run records (see `sweep.run_grid`).
    """
    if (steps is None) == (epochs is None):
        raise ValueError("give exactly one of steps and epochs")
    base = override(sweep.load_config(config), {"data.data_dir": data_dir, **(overrides or {})})
    train_size = None
    if epochs is not None:
        from contrastive_jax import input_pipeline

        train_size = len(input_pipeline.load_split(base.data, base.data.train_split)["image"])
    runs = make_runs(base, batch_sizes, seeds, steps=steps, epochs=epochs, train_size=train_size)
    return sweep.run_sweep(base, runs, out, figures=lambda r: plot(r, metric), summary=lambda r: summary(r, metric))


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring and `--help`."""
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", help="a name in configs/ (default: default)")
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="comma-separated global batch sizes")
    parser.add_argument("--epochs", type=float, help="fixed epochs per run instead of fixed --steps")
    parser.add_argument("--metric", help="the evaluation metric plotted against N")
    args = sweep.resolve(parser.parse_args(argv), "batch_size_sweep", FULL, QUICK)
    quick = {"eval.linear_probe": False} if args.quick else {}
    run(args.config, args.batch_sizes, args.seeds, args.out, steps=None if args.epochs else args.steps,
        epochs=args.epochs, metric=args.metric, data_dir=args.data_dir, overrides=quick)
    print(f"results in {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
