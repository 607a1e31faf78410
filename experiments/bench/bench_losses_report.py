"""What ``bench_losses.py``'s measured points say: the issue's targets met or missed,
``results.md`` and ``results.png``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from experiments import RESULTS
from experiments.bench.bench_losses_grid import method
from experiments.bench.bench_losses_worker import RING_DEVICES

GRAD_CACHE_RESULTS = RESULTS / "bench_grad_cache"


def fmt_seconds(seconds: float, decimals: int = 2) -> str:
    """``seconds`` to ``decimals`` places, or to 3 significant digits below 0.1 s (an
    accelerator's milliseconds)."""
    return f"{seconds:.{decimals}f}" if seconds >= 0.1 else f"{seconds:.3g}"


def fmt_bytes(value) -> str:
    """``value`` bytes in MiB (below 1 GiB) or GiB; ``"-"`` for None."""
    if value is None:
        return "-"
    return f"{value / 2**20:,.0f} MiB" if value < 2**30 else f"{value / 2**30:,.2f} GiB"


def _step_over_loss_target() -> tuple[str, str, str]:
    """The train-step target, from ``bench_grad_cache.py``'s results (it builds the step)."""
    target = "train step / the loss's own fwd+bwd, N=16,384, D=64 (default towers) <= 1.15"
    path = GRAD_CACHE_RESULTS / "results.json"
    points = json.loads(path.read_text()) if path.exists() else []
    step = next((p for p in points if p["global_batch"] == 16384 and p["method"] == "full"), None)
    if step is None:
        return target, "not measured: run python -m experiments.bench.bench_grad_cache --log2 14", "-"
    return (
        target,
        f"{step['step_over_loss']:.2f} ({step['step_seconds']:.2f} s vs "
        f"{step['loss_seconds']:.2f} s, experiments/bench/bench_grad_cache.py)",
        "met" if step["step_over_loss"] <= 1.15 else "missed",
    )


def _fastest(ok, loss, n, d, worker="jax", streamed=None):
    """The fastest of the measured points `ok` matching; ``streamed``: True (float32
    chunked), False (dense), None (either)."""
    matches = [
        p
        for p in ok
        if p["worker"] == worker
        and p["loss"] == loss
        and p["n"] == n
        and p["d"] == d
        and not p.get("matmul_dtype")
        and (streamed is None or (p.get("chunk") is not None) == streamed)
    ]
    return min(matches, key=lambda p: p["seconds"], default=None)


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def _peak_fraction_rows(ok, peak_gflops) -> list[tuple[str, str, str]]:
    """The streamed losses' useful GFLOP/s as a fraction of the ``jnp.dot`` peak."""
    rows = []
    for loss, d, ns, goal in [
        ("clip", 512, (8192, 16384), 0.70),
        ("clip", 64, (16384,), 0.50),
        ("siglip", 512, (8192,), 0.85),
    ]:
        for n in ns:
            point = _fastest(ok, loss, n, d, streamed=True)
            if point:
                fraction = point["gflops"] / peak_gflops
                rows.append(
                    (
                        f"streamed {loss} N={n:,} D={d}: useful 6N^2D / jnp.dot peak >= {goal:.0%}",
                        f"{fraction:.0%} ({method(point)}, {fmt_seconds(point['seconds'])} s)",
                        _verdict(fraction >= goal),
                    )
                )
    return rows


def _comparison_rows(ok) -> list[tuple[str, str, str]]:
    """Streamed against dense CLIP's time, and the PyTorch reference against ours."""
    rows = []
    for n, goal in [(16384, 1.0), (32768, 0.7)]:
        dense, stream = _fastest(ok, "clip", n, 512, streamed=False), _fastest(ok, "clip", n, 512, streamed=True)
        if dense and stream:
            ratio = stream["seconds"] / dense["seconds"]
            rows.append(
                (
                    f"clip N={n:,} D=512: streamed / dense time <= {goal}",
                    f"{ratio:.2f} ({fmt_seconds(stream['seconds'])} s {method(stream)} "
                    f"vs {fmt_seconds(dense['seconds'])} s)",
                    _verdict(ratio <= goal),
                )
            )
    for p in ok:
        ours = _fastest(ok, p["loss"], p["n"], p["d"], streamed=True) if p["worker"] == "torch" else None
        if ours:
            ratio = p["seconds"] / ours["seconds"]
            rows.append(
                (
                    f"torch {p['loss']} dense / ours streamed, N={p['n']:,} D={p['d']} >= 3",
                    f"{ratio:.2f} ({fmt_seconds(p['seconds'])} s vs {fmt_seconds(ours['seconds'])} s {method(ours)})",
                    _verdict(ratio >= 3),
                )
            )
    return rows


def _ring_rows(ring) -> list[tuple[str, str, str]]:
    """Per N: the ring's per-device memory against the all-gather's, and their values."""
    rows = []
    for n, entry in sorted(ring.items()):
        if "error" in entry:
            continue
        pairs = [("ring", "all_gather"), ("ring chunked", "all_gather chunked")]
        rows.append(
            (
                f"ring per-device memory <= all-gather (N={n:,}, like for like)",
                "; ".join(
                    f"{r} {fmt_bytes(entry[r]['temp_bytes'])} vs {g} {fmt_bytes(entry[g]['temp_bytes'])}"
                    for r, g in pairs
                ),
                _verdict(all(entry[r]["temp_bytes"] <= entry[g]["temp_bytes"] for r, g in pairs)),
            )
        )
        if "max_relative_difference" in entry:
            rows.append(
                (
                    f"ring equals all-gather (N={n:,}, value and gradients)",
                    f"max relative difference {entry['max_relative_difference']:.1e}",
                    _verdict(entry["max_relative_difference"] <= 1e-5),
                )
            )
    return rows


def evaluate_targets(points, peak_gflops, ring, platform: str = "cpu") -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows for the issue's loss-kernel targets.

    Args:
      points: the measured points (see ``bench_losses_grid``); those without ``seconds``
        (skipped or failed) are passed over.
      peak_gflops: the float32 ``jnp.dot`` peak the fractions are of.
      ring: N -> the ring worker's result (per-device temp bytes per collective).
      platform: where the points ran; the train-step row (read from
        ``bench_grad_cache.py``'s committed CPU results) only for ``"cpu"``.
    """
    ok = [p for p in points if "seconds" in p]
    rows = _peak_fraction_rows(ok, peak_gflops) + _comparison_rows(ok)
    if platform == "cpu":
        rows.append(_step_over_loss_target())
    big = max(
        (p for p in ok if p["loss"] == "clip" and p.get("chunk") is not None and "peak_rss_bytes" in p),
        key=lambda p: p["n"],
        default=None,
    )
    if big:
        rows.append(
            (
                f"clip N={big['n']:,} D={big['d']} streamed: peak RSS <= 2 GiB",
                f"{fmt_bytes(big['peak_rss_bytes'])} ({method(big)})",
                _verdict(big["peak_rss_bytes"] <= 2 * 2**30),
            )
        )
    return rows + _ring_rows(ring)


def write_markdown(path: Path, result: dict) -> None:
    """``results.md``: the points' table, the ring's per-device memory and the targets."""
    on_cpu = result["platform"] == "cpu"
    lines = [
        f"# Contrastive losses forward+backward on {result['machine']}",
        "",
        f"Command: `{result['command']}`; {result['load']}; jnp.dot peak "
        f"{result['peak_gflops']:.1f} GFLOP/s (float32 {result['peak_matmul_n']}^3 matmul, best "
        "of the start and end of the run). GFLOP/s counts the useful 6 N^2 D flops; streamed "
        "CLIP performs 8 N^2 D (its backward pass recomputes the logits), so its ceiling is "
        "75% of peak; SigLIP and InfoNCE stream in one pass (6 N^2 D).",
        "",
        "| loss | N | D | method | time (s) | repeats | GFLOP/s | % of peak | compiled temp | "
        + ("peak RSS | " if on_cpu else "")
        + "note |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if on_cpu else "") + "---|",
    ]
    for p in result["points"]:
        note = p.get("skipped") or p.get("error") or ("" if p.get("warm_up", True) else "no warm-up (slow call)")
        seconds = fmt_seconds(p["seconds"], decimals=3) if "seconds" in p else "-"
        gflops = f"{p['gflops']:.1f}" if "gflops" in p else "-"
        frac = f"{p['gflops'] / result['peak_gflops']:.0%}" if "gflops" in p else "-"
        rss = f"{fmt_bytes(p.get('peak_rss_bytes')) if 'seconds' in p else '-'} | " if on_cpu else ""
        lines.append(
            f"| {p['loss']} | {p['n']:,} | {p['d']} | {method(p)} | {seconds} | "
            f"{p.get('repeats', '-')} | {gflops} | {frac} | {fmt_bytes(p.get('temp_bytes'))} | "
            f"{rss}{note} |"
        )
    lines += [
        "",
        f"## {RING_DEVICES} simulated devices: per-device compiled temp memory "
        "(clip, D=256; chunked = chunk_size min(256, N / 8))",
        "",
        "| N | all_gather (dense) | all_gather chunked | ring | ring chunked | max rel. diff |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, entry in sorted(result["ring"].items(), key=lambda kv: int(kv[0])):
        if "error" in entry:
            lines.append(f"| {int(n):,} | {entry['error']} | | | | |")
            continue
        modes = ("all_gather", "all_gather chunked", "ring", "ring chunked")
        cells = [fmt_bytes(entry[k]["temp_bytes"]) for k in modes]
        diff = entry.get("max_relative_difference")
        lines.append(f"| {int(n):,} | " + " | ".join(cells) + f" | {'-' if diff is None else f'{diff:.1e}'} |")
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in result["targets"]]
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, result: dict) -> None:
    """``results.png``: clip_loss's time and compiled temp memory against N, a line per D
    and method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = {}
    for p in result["points"]:
        if "seconds" in p and p["loss"] == "clip":  # one line per D and method ("auto bf16", ...)
            name = re.sub(r" \(\w+\)", "", method(p))
            series.setdefault((p["d"], name), []).append(p)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, ((d, name), pts) in enumerate(sorted(series.items())):
        pts.sort(key=lambda p: p["n"])
        line = dict(
            linestyle="--" if name.endswith("dense") else "-",
            marker="o",
            color=colors[index % len(colors)],
            label=f"D={d} {name}",
        )
        ax_time.loglog([p["n"] for p in pts], [p["seconds"] for p in pts], **line)
        with_memory = [p for p in pts if p.get("temp_bytes")]
        if with_memory:
            ax_mem.loglog([p["n"] for p in with_memory], [p["temp_bytes"] / 2**20 for p in with_memory], **line)
    ax_time.set(xlabel="global batch N", ylabel="fwd+bwd seconds (median)", title="time")
    ax_mem.set(xlabel="global batch N", ylabel="XLA compiled temp (MiB)", title="memory")
    for ax in (ax_time, ax_mem):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xscale("log", base=2)
    ax_time.legend(fontsize=7)
    ax_mem.legend(fontsize=7)
    fig.suptitle(f"clip_loss forward+backward, {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
