"""Is cross-entropy enough? Softmax CE vs pairwise metric losses on unseen classes.

Run (from the repository root):
  python -m experiments.studies.loss_comparison               # full comparison, results committed
  python -m experiments.studies.loss_comparison --quick       # CI: every loss, a few steps

Boudiaf et al. (ECCV 2020) show that the softmax cross-entropy of a classifier bounds
the pairwise losses of deep metric learning and matches them in practice. This trains
`--config` (default: `dml_digits`, classes 0-5 for training, retrieval among the unseen
6-9) with each loss in `--losses` (`softmax_ce` gets a 6-way classifier head and its
embedding is evaluated; the others train the embedding directly over the global batch,
m examples per class), several seeds, and compares leave-one-out Recall@1 and MAP@R on
the unseen classes. Writes to `--out`: `results.{csv,json}`, `summary.md` and

* `metrics_by_loss.png`: final Recall@1 and MAP@R per loss, seed error bars;
* `map_at_r_curves.png`: MAP@R on the unseen classes during training.

Resumable: rerun the same command; finished runs are skipped (see `experiments/lib/sweep.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contrastive_jax.config_lib import load_config, override
from experiments.lib import sweep

LOSSES = ("softmax_ce", "triplet", "multi_similarity", "supcon")
# Per-loss config fields: the classifier head of softmax CE (the training classes 0-5).
LOSS_OVERRIDES = {"softmax_ce": {"model.num_classes": 6}}
METRICS = ("retrieval/R@1", "retrieval/MAP@R")
FULL = dict(config="dml_digits", losses=list(LOSSES), seeds=[0, 1, 2], steps=600, evals=6)
QUICK = dict(config="dml_digits", losses=list(LOSSES), seeds=[0], steps=2, evals=1)


def make_runs(base, loss_names: Sequence[str], seeds: Sequence[int], *, steps: int, evals: int) -> list[sweep.Run]:
    """One run per (loss, seed), evaluated `evals` times."""
    return [
        sweep.Run(
            name=f"{name}_seed{seed}",
            tags={"loss": name, "seed": seed},
            overrides={
                **sweep.run_overrides(num_steps=steps, seed=seed, warmup_steps=base.optim.warmup_steps, evals=evals),
                "loss.name": name,
                **LOSS_OVERRIDES.get(name, {}),
            },
        )
        for name in loss_names
        for seed in seeds
    ]


def plot(records: Sequence[dict], loss_names: Sequence[str]) -> dict:
    """The two figures (see the module docstring), by file name."""
    figures = {}
    fig, axes = sweep.new_figure("Retrieval on unseen classes (digits 6-9)", ncols=len(METRICS), width=4.5)
    x = np.arange(len(loss_names))
    for ax, metric in zip(axes, METRICS):
        stats = [sweep.summarize([r for r in records if r["loss"] == name], "loss", metric) for name in loss_names]
        ax.bar(
            x,
            [s[1][0] for s in stats],
            yerr=[s[2][0] for s in stats],
            capsize=4,
            color=sweep.colors(len(loss_names), "tab10"),
        )
        ax.set_xticks(x, loss_names, rotation=20)
        ax.set(ylabel=metric, ylim=(min(s[1][0] for s in stats) * 0.9, None))
    figures["metrics_by_loss"] = fig

    key = f"eval/{METRICS[1]}"
    fig, ax = sweep.new_figure(f"{METRICS[1]} on unseen classes during training")
    for name in loss_names:
        steps, values = sweep.mean_curve([r for r in records if r["loss"] == name], key)
        ax.plot(steps, values, marker="o", label=name)
    ax.set(xlabel="step", ylabel=METRICS[1])
    ax.legend(fontsize=8)
    figures["map_at_r_curves"] = fig
    return figures


def summary(records: Sequence[dict], loss_names: Sequence[str]) -> str:
    """A markdown table: per loss, Recall@1 and MAP@R (mean ± std over seeds)."""
    rows = []
    for name in loss_names:
        group = [r for r in records if r["loss"] == name]
        rows.append([name, len(group), *(sweep.mean_std(group, m) for m in METRICS)])
    return sweep.markdown_table(rows, ["loss", "seeds", *METRICS])


def run(
    config: str,
    loss_names: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    *,
    steps: int,
    evals: int,
    data_dir: str | None = None,
) -> list[dict]:
    """Runs (or resumes) the comparison and writes its results, figures and summary to `out`."""
    base = override(load_config(config), {"data.data_dir": data_dir})
    runs = make_runs(base, loss_names, seeds, steps=steps, evals=evals)
    return sweep.run_sweep(
        base,
        runs,
        out,
        figures=lambda r: plot(r, loss_names),
        summary=lambda r: summary(r, loss_names),
        curve_keys=("train/loss", *(f"eval/{m}" for m in METRICS)),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring and `--help`."""
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", help="a labelled, class-disjoint config in configs/ (default: dml_digits)")
    parser.add_argument("--losses", type=lambda s: s.split(","), help=f"comma-separated, from {LOSSES}")
    parser.add_argument("--evals", type=int, help="evaluations per run (for the MAP@R curves)")
    args = sweep.resolve(parser.parse_args(argv), "loss_comparison", FULL, QUICK)
    run(args.config, args.losses, args.seeds, args.out, steps=args.steps, evals=args.evals, data_dir=args.data_dir)
    print(f"results in {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
