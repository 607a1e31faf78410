"""The batch-size sweeps' figures and markdown summary, from the run records (see
`sweep.run_grid`), one line or row group per series (`"fixed epochs, sqrt"`, ...) when the
records have a `series` tag. The figures, by file name:

* `metric_vs_batch`: the final retrieval metric vs N, seed error bars;
* `loss_curves`: the first series' training loss per N (mean over seeds), with `log N`;
* `temperature_vs_batch`: the final learned temperature vs N (when recorded);
* `mi_bound`: the InfoNCE bound on the mutual information, `I >= log N - L`, against `log N`;
* `false_negatives_vs_batch`: the in-batch false-negative fraction vs N (when recorded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from experiments.lib import sweep


def _series(records: Sequence[dict]) -> list:
    """The records' series, in first-seen order ([None] for a sweep without series)."""
    return list(dict.fromkeys(r.get("series") for r in records))


def _metric_figure(records: Sequence[dict], metric: str, sizes: list[int], series: list):
    """`metric` against N, a line per series."""
    steps = sorted({r["steps"] for r in records})
    length = f"{steps[0]} steps" if len(steps) == 1 else f"fixed epochs: {steps[-1]} … {steps[0]} steps"
    if series != [None]:
        length = "per series"
    fig, ax = sweep.new_figure(f"Final {metric} vs global batch size ({length})")
    for name in series:
        sweep.errorbar(ax, records, "batch_size", metric, where=lambda r, s=name: r.get("series") == s, label=name)
    sweep.log_spaced_ticks(ax, sizes)
    ax.set(xlabel="global batch size N", ylabel=metric)
    if series != [None]:
        ax.legend(fontsize=7)
    return fig


def _loss_curves_figure(records: Sequence[dict], series: list):
    """The first series' training loss per N (mean over seeds), beside log N."""
    first = [r for r in records if r.get("series") == series[0]]
    title = "Training loss per batch size (mean over seeds)" + (f": {series[0]}" if series[0] else "")
    fig, ax = sweep.new_figure(title, width=6)
    first_sizes = sorted({r["batch_size"] for r in first})  # a series may skip the largest N
    for n, color in zip(first_sizes, sweep.colors(len(first_sizes))):
        steps, loss = sweep.mean_curve([r for r in first if r["batch_size"] == n], "train/loss")
        ax.plot(steps, loss, color=color, label=f"N={n}")
        ax.axhline(math.log(n), color=color, linestyle=":", linewidth=0.8)
    ax.set(xlabel="step", ylabel="CLIP loss (nats); dotted: log N", yscale="log")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _temperature_figure(records: Sequence[dict], sizes: list[int], series: list):
    """The final learned temperature against N, a line per series."""
    fig, ax = sweep.new_figure("Final learned temperature vs batch size")
    for name in series:
        sweep.errorbar(
            ax, records, "batch_size", "train/temperature", where=lambda r, s=name: r.get("series") == s, label=name
        )
    sweep.log_spaced_ticks(ax, sizes)
    if series != [None]:
        ax.legend(fontsize=7)
    ax.set(xlabel="global batch size N", ylabel="temperature T")
    return fig


def _mi_bound_figure(records: Sequence[dict], sizes: list[int], series: list):
    """InfoNCE's lower bound on the mutual information, log N - L, against its ceiling log N."""
    fig, ax = sweep.new_figure("InfoNCE mutual-information lower bound")
    bound = [
        dict(r, log_n=math.log(r["batch_size"]), bound=math.log(r["batch_size"]) - r["train/loss"]) for r in records
    ]
    for name in series:
        label = "log N − L (final training loss)" + (f": {name}" if name else "")
        sweep.errorbar(ax, bound, "log_n", "bound", where=lambda r, s=name: r.get("series") == s, label=label)
    log_n = np.log(sizes)
    ax.plot(log_n, log_n, "k--", linewidth=1, label="log N (the bound's ceiling)")
    ax.set(xlabel="log N (nats)", ylabel="I(a; b) ≥ (nats)")
    ax.legend(fontsize=7)
    return fig


def plot(records: Sequence[dict], metric: str) -> dict:
    """The figures (see the module docstring), by file name.

    Args:
      records: one per run: `batch_size`, `steps`, `metric`, `train/loss`, `curves`, and
        optionally `series`, `train/temperature`, `false_negative_fraction`.
      metric: the evaluation metric plotted against N (e.g. `"a_to_b/R@1"`).
    """
    sizes = sorted({r["batch_size"] for r in records})
    series = _series(records)
    figures = {
        "metric_vs_batch": _metric_figure(records, metric, sizes, series),
        "loss_curves": _loss_curves_figure(records, series),
    }
    if all("train/temperature" in r for r in records):
        figures["temperature_vs_batch"] = _temperature_figure(records, sizes, series)
    figures["mi_bound"] = _mi_bound_figure(records, sizes, series)
    if all("false_negative_fraction" in r for r in records):
        fig, ax = sweep.new_figure("In-batch false negatives vs batch size")
        sweep.errorbar(ax, records, "batch_size", "false_negative_fraction")
        sweep.log_spaced_ticks(ax, sizes)
        ax.set(xlabel="global batch size N", ylabel="rows with a same-spelling / -pronunciation row")
        figures["false_negatives_vs_batch"] = fig
    return figures


def summary(records: Sequence[dict], metric: str) -> str:
    """A markdown table: per series and batch size, the metric, loss, temperature and MI
    bound (and the false-negative fraction and the other direction's R@1 when recorded)."""
    series = _series(records)
    extra = [k for k in ("b_to_a/R@1", "false_negative_fraction") if k != metric and all(k in r for r in records)]
    rows = []
    for name in series:
        for n in sorted({r["batch_size"] for r in records if r.get("series") == name}):
            group = [r for r in records if r["batch_size"] == n and r.get("series") == name]
            bound = [dict(r, bound=math.log(n) - r["train/loss"]) for r in group]
            rows.append(
                ([name] if name else [])
                + [
                    n,
                    group[0]["steps"],
                    len(group),
                    sweep.mean_std(group, metric),
                    *[sweep.mean_std(group, k) for k in extra],
                    sweep.mean_std(group, "train/loss"),
                    sweep.mean_std(group, "train/temperature"),
                    f"{math.log(n):.3f}",
                    sweep.mean_std(bound, "bound"),
                ]
            )
    header = (["series"] if series != [None] else []) + [
        "N",
        "steps",
        "seeds",
        metric,
        *extra,
        "final loss L",
        "temperature",
        "log N",
        "log N − L",
    ]
    return sweep.markdown_table(rows, header)
