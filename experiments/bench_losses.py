"""What the contrastive losses cost on this machine: time and memory, dense vs streamed.

Run:  python experiments/bench_losses.py            (full sweep; tens of minutes on CPU)
      python experiments/bench_losses.py --quick    (small sweep, about a minute)

For N in a sweep and D in {256, 512}, times forward+backward of ``clip_loss`` (values and
gradients of both sides) dense (``chunk_size=None``) and streamed (several chunk sizes),
and, when PyTorch is installed, an open_clip-style reference. Each point runs in a fresh
subprocess, which reports: the median time over repeats after a warm-up call, XLA's
compiled ``memory_analysis()`` temp bytes, the process's peak RSS, and the achieved
GFLOP/s counting the useful ``6 N^2 D`` flops (one N x N x D product forward, two
backward), also as a fraction of a ``jnp.dot`` peak measured in the same run. Points
whose compiled memory exceeds ``--max-memory-gib`` are skipped with a note, not run.
On 8 simulated devices it compares the per-device compiled memory of the all-gather and
ring collectives. Writes ``results.json``, ``results.md`` and ``results.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "experiments" / "results" / "bench_losses"
TEMPERATURE = 0.07
RING_DEVICES = 8

# (N values, D values, chunk sizes, chunk sizes at N >= big_n, big_n); the largest points
# run one streamed configuration only, so the full sweep fits in about 30 minutes on 2 cores.
SWEEPS = {
    "quick": dict(ns=[1024, 2048, 4096], ds=[256], chunks=[256, 1024], big_chunks=[256],
                  big_n=4096, max_n_by_d={256: 4096}, ring_ns=[1024, 4096]),
    "full": dict(ns=[1024, 2048, 4096, 8192, 16384, 32768, 65536], ds=[256, 512],
                 chunks=[256, 1024], big_chunks=[256], big_n=32768,
                 max_n_by_d={256: 65536, 512: 16384}, ring_ns=[8192, 32768, 65536]),
}


# ------------------------------------------------------------------ worker (subprocess)


def _useful_flops(n: int, d: int) -> float:
    """One N x N x D product forward, its two transposes backward."""
    return 6.0 * n * n * d


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _time_calls(fn, *, max_repeats: int, budget_s: float) -> tuple[float, int, bool]:
    """Median seconds of ``fn()`` after one warm-up call (skipped when a call is slow).

    A call longer than ``budget_s`` is its own warm-up (compilation is already done) and
    is timed once, so the largest points cost one run.
    """
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    if first > budget_s:
        return first, 1, False
    repeats = max(1, min(max_repeats, int(budget_s / max(first, 1e-6))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), repeats, True


def _worker_peak(spec: dict) -> dict:
    import jax
    import jax.numpy as jnp

    n = spec["n"]
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    matmul = jax.jit(lambda x: x @ x).lower(x).compile()
    seconds, repeats, _ = _time_calls(
        lambda: matmul(x).block_until_ready(), max_repeats=5, budget_s=10.0
    )
    return {"gflops": 2.0 * n**3 / seconds / 1e9, "seconds": seconds, "repeats": repeats}


def _worker_jax(spec: dict) -> dict:
    import jax

    from contrastive_jax import losses

    n, d, chunk = spec["n"], spec["d"], spec["chunk"]

    def loss(a, b):
        return losses.clip_loss(a, b, temperature=TEMPERATURE, chunk_size=chunk)

    shape = jax.ShapeDtypeStruct((n, d), jax.numpy.float32)
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(shape, shape).compile()
    memory = compiled.memory_analysis()
    total = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
    result = {"temp_bytes": memory.temp_size_in_bytes, "compiled_total_bytes": total}
    if total > spec["max_memory_bytes"]:
        return result | {
            "skipped": f"needs {total / 2**30:.1f} GiB compiled > limit "
            f"{spec['max_memory_bytes'] / 2**30:.1f} GiB"
        }
    keys = jax.random.split(jax.random.key(1))
    a, b = (losses._common.l2_normalize(jax.random.normal(k, (n, d))) for k in keys)
    seconds, repeats, warmed = _time_calls(
        lambda: jax.block_until_ready(compiled(a, b)),
        max_repeats=spec["max_repeats"],
        budget_s=spec["budget_s"],
    )
    return result | {"seconds": seconds, "repeats": repeats, "warm_up": warmed,
                     "loss": float(compiled(a, b)[0])}


def _worker_torch(spec: dict) -> dict:
    import torch

    n, d = spec["n"], spec["d"]
    if 2 * n * n * 4 * 3 > spec["max_memory_bytes"]:
        return {"skipped": "estimated N x N logits and gradients exceed the memory limit"}
    generator = torch.Generator().manual_seed(1)
    a = torch.nn.functional.normalize(torch.randn(n, d, generator=generator), dim=1)
    b = torch.nn.functional.normalize(torch.randn(n, d, generator=generator), dim=1)
    a.requires_grad_(True)
    b.requires_grad_(True)
    labels = torch.arange(n)

    def step():  # open_clip's ClipLoss on one device
        a.grad = b.grad = None
        logits = a @ b.T / TEMPERATURE
        loss = (torch.nn.functional.cross_entropy(logits, labels)
                + torch.nn.functional.cross_entropy(logits.T, labels)) / 2
        loss.backward()

    seconds, repeats, warmed = _time_calls(
        step, max_repeats=spec["max_repeats"], budget_s=spec["budget_s"]
    )
    return {"seconds": seconds, "repeats": repeats, "warm_up": warmed}


def _worker_ring(spec: dict) -> dict:
    """Per-device compiled memory of clip_loss's gradient on 8 simulated devices."""
    import jax
    import numpy as np

    from contrastive_jax import losses, sharding

    n, d = spec["n"], spec["d"]
    mesh = sharding.make_mesh(RING_DEVICES)
    shape = jax.ShapeDtypeStruct((n, d), jax.numpy.float32, sharding=sharding.data_sharding(mesh))
    out = {}
    values = {}
    for name, kwargs in spec["variants"].items():
        fn = jax.jit(jax.value_and_grad(
            lambda a, b, kw=kwargs: sharding.shard_loss(losses.clip_loss, mesh)(
                a, b, temperature=TEMPERATURE, **kw), argnums=(0, 1)))
        compiled = fn.lower(shape, shape).compile()
        memory = compiled.memory_analysis()
        out[name] = {"temp_bytes": memory.temp_size_in_bytes,
                     "argument_bytes": memory.argument_size_in_bytes}
        if spec["execute"]:
            keys = jax.random.split(jax.random.key(1))
            a, b = (jax.device_put(losses._common.l2_normalize(jax.random.normal(k, (n, d))),
                                   sharding.data_sharding(mesh)) for k in keys)
            values[name] = jax.tree.map(np.asarray, compiled(a, b))
    if values:
        reference = values["all_gather"]
        out["max_relative_difference"] = max(
            float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
            for v in values.values()
            for x, y in zip(jax.tree.leaves(v), jax.tree.leaves(reference))
        )
    return out


WORKERS = {"peak": _worker_peak, "jax": _worker_jax, "torch": _worker_torch, "ring": _worker_ring}


def run_worker(spec: dict) -> dict:
    result = WORKERS[spec["worker"]](spec)
    return result | {"peak_rss_bytes": _peak_rss_bytes()}


# ------------------------------------------------------------------- driver (parent)


def spawn(spec: dict, *, devices: int = 1, timeout_s: float = 1800) -> dict:
    """Runs one point in a fresh Python process (so its peak RSS is the point's own)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            capture_output=True, text=True, env=env, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        tail = [line for line in lines if "Error" in line][-1:] or lines[-1:] or ["?"]
        killed = " (killed: out of memory?)" if proc.returncode < 0 else ""
        return {"error": f"exit {proc.returncode}{killed}: {tail[0][:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def available_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def plan(sweep: dict, with_torch: bool) -> list[dict]:
    points = []
    for d in sweep["ds"]:
        for n in sweep["ns"]:
            if n > sweep["max_n_by_d"][d]:
                continue
            chunks = sweep["big_chunks"] if n >= sweep["big_n"] else sweep["chunks"]
            points.append({"worker": "jax", "n": n, "d": d, "chunk": None})
            points += [{"worker": "jax", "n": n, "d": d, "chunk": c} for c in chunks if c < n]
            if with_torch:
                points.append({"worker": "torch", "n": n, "d": d})
    return points


def method(point: dict) -> str:
    if point["worker"] == "torch":
        return "torch dense"
    return "dense" if point["chunk"] is None else f"chunk {point['chunk']}"


def slope(xs, ys) -> float | None:
    """Least-squares slope of log(y) against log(x)."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y and y > 0]
    if len(pairs) < 2:
        return None
    mean_x = sum(p[0] for p in pairs) / len(pairs)
    mean_y = sum(p[1] for p in pairs) / len(pairs)
    sxx = sum((p[0] - mean_x) ** 2 for p in pairs)
    return sum((p[0] - mean_x) * (p[1] - mean_y) for p in pairs) / sxx


def fmt_bytes(value) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:,.0f} MiB" if value < 2**30 else f"{value / 2**30:,.2f} GiB"


def evaluate_targets(points, peak_gflops, ring) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows for the issue's targets."""
    ok = [p for p in points if "seconds" in p]

    def find(n, d, chunk):
        return next((p for p in ok if p["n"] == n and p["d"] == d and p.get("chunk") == chunk
                     and p["worker"] == "jax"), None)

    def chunked(n, d):
        candidates = [p for p in ok if p["worker"] == "jax" and p["n"] == n and p["d"] == d
                      and p["chunk"] is not None]
        return min(candidates, key=lambda p: p["seconds"], default=None)

    rows = []
    big = chunked(65536, 256)
    rows.append(("clip_loss N=65,536 D=256 fwd+bwd, peak RSS <= 2 GiB",
                 f"{fmt_bytes(big['peak_rss_bytes'])} ({method(big)}, {big['seconds']:.0f} s)"
                 if big else "not run",
                 "met" if big and big["peak_rss_bytes"] <= 2**30 * 2 else "missed"))
    dense, stream = find(16384, 512, None), chunked(16384, 512)
    if dense and stream:
        ratio = dense["temp_bytes"] / max(stream["temp_bytes"], 1)
        rows.append(("N=16,384 D=512: chunked time <= dense",
                     f"{stream['seconds']:.2f} s ({method(stream)}) vs dense {dense['seconds']:.2f} s",
                     "met" if stream["seconds"] <= dense["seconds"] else "missed"))
        rows.append(("N=16,384 D=512: chunked temp <= dense / 20",
                     f"{fmt_bytes(stream['temp_bytes'])} vs {fmt_bytes(dense['temp_bytes'])} "
                     f"(1/{ratio:.0f})", "met" if ratio >= 20 else "missed"))
    fractions = [(p["gflops"] / peak_gflops, p) for p in ok
                 if p["worker"] == "jax" and p["chunk"] is not None and p["n"] >= 4096]
    if fractions:
        best, best_point = max(fractions, key=lambda f: f[0])
        median = statistics.median(f for f, _ in fractions)
        rows.append(("chunked throughput >= 60% of jnp.dot peak (useful flops, N >= 4,096)",
                     f"best {best:.0%} (N={best_point['n']}, D={best_point['d']}, "
                     f"{method(best_point)}); median {median:.0%}; peak {peak_gflops:.0f} GFLOP/s",
                     "met" if best >= 0.6 else "missed"))
    for d in sorted({p["d"] for p in ok}):
        chunk = min(p["chunk"] for p in ok if p["chunk"] is not None)
        series = sorted((p for p in ok if p["worker"] == "jax" and p["d"] == d
                         and p["chunk"] == chunk), key=lambda p: p["n"])
        timed = [p for p in series if p["n"] >= 4096]
        t_slope = slope([p["n"] for p in timed], [p["seconds"] for p in timed])
        m_slope = slope([p["n"] for p in series], [p["temp_bytes"] for p in series])
        r_slope = slope([p["n"] for p in series], [p["peak_rss_bytes"] for p in series])
        if t_slope is not None:
            rows.append((f"D={d}, chunk {chunk}: time slope 2 +- 0.15 (N >= 4,096)",
                         f"{t_slope:.2f}", "met" if abs(t_slope - 2) <= 0.15 else "missed"))
        if m_slope is not None:
            rows.append((f"D={d}, chunk {chunk}: memory slope <= 1.1",
                         f"compiled temp {m_slope:.2f} (peak RSS {r_slope:.2f})",
                         "met" if m_slope <= 1.1 else "missed"))
    for n, entry in sorted(ring.items()):
        if "error" in entry:
            continue
        pairs = [("ring", "all_gather"), ("ring chunked", "all_gather chunked")]
        rows.append((f"ring per-device memory <= all-gather (N={n:,}, like for like)",
                     "; ".join(f"{r} {fmt_bytes(entry[r]['temp_bytes'])} vs {g} "
                               f"{fmt_bytes(entry[g]['temp_bytes'])}" for r, g in pairs),
                     "met" if all(entry[r]["temp_bytes"] <= entry[g]["temp_bytes"]
                                  for r, g in pairs) else "missed"))
        if "max_relative_difference" in entry:
            rows.append((f"ring equals all-gather (N={n:,}, value and gradients)",
                         f"max relative difference {entry['max_relative_difference']:.1e}",
                         "met" if entry["max_relative_difference"] <= 1e-5 else "missed"))
    return rows


def write_markdown(path: Path, result: dict) -> None:
    lines = [
        f"# clip_loss forward+backward on {result['machine']}",
        "",
        f"Command: `{result['command']}`; jnp.dot peak {result['peak_gflops']:.1f} GFLOP/s "
        f"(float32 {result['peak_matmul_n']}^3 matmul, best of the start and end of the run). "
        "GFLOP/s counts the useful 6 N^2 D flops; the streamed loss performs 8 N^2 D "
        "(its backward pass recomputes the logits), so its ceiling is 75% of peak.",
        "",
        "| N | D | method | time (s) | repeats | GFLOP/s | % of peak | compiled temp | peak RSS | note |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in result["points"]:
        note = p.get("skipped") or p.get("error") or ("" if p.get("warm_up", True) else "no warm-up (slow call)")
        seconds = f"{p['seconds']:.3f}" if "seconds" in p else "-"
        gflops = f"{p['gflops']:.1f}" if "gflops" in p else "-"
        frac = f"{p['gflops'] / result['peak_gflops']:.0%}" if "gflops" in p else "-"
        lines.append(
            f"| {p['n']:,} | {p['d']} | {method(p)} | {seconds} | {p.get('repeats', '-')} | "
            f"{gflops} | {frac} | {fmt_bytes(p.get('temp_bytes'))} | "
            f"{fmt_bytes(p.get('peak_rss_bytes')) if 'seconds' in p else '-'} | {note} |"
        )
    lines += ["", f"## {RING_DEVICES} simulated devices: per-device compiled temp memory "
              "(D=256; chunked = chunk_size min(256, N / 8))", "",
              "| N | all_gather (dense) | all_gather chunked | ring | ring chunked | max rel. diff |",
              "|---:|---:|---:|---:|---:|---:|"]
    for n, entry in sorted(result["ring"].items(), key=lambda kv: int(kv[0])):
        if "error" in entry:
            lines.append(f"| {int(n):,} | {entry['error']} | | | | |")
            continue
        cells = [fmt_bytes(entry[k]["temp_bytes"]) for k in ("all_gather", "all_gather chunked", "ring", "ring chunked")]
        diff = entry.get("max_relative_difference")
        lines.append(f"| {int(n):,} | " + " | ".join(cells) + f" | {'-' if diff is None else f'{diff:.1e}'} |")
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in result["targets"]]
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = {}
    for p in result["points"]:
        if "seconds" in p:
            series.setdefault((p["d"], method(p)), []).append(p)
    for (d, name), pts in sorted(series.items()):
        pts.sort(key=lambda p: p["n"])
        ns = [p["n"] for p in pts]
        style = "--" if name.endswith("dense") else "-"
        ax_time.loglog(ns, [p["seconds"] for p in pts], style, marker="o", label=f"D={d} {name}")
        if "temp_bytes" in pts[0]:
            ax_mem.loglog(ns, [p["temp_bytes"] / 2**20 for p in pts], style, marker="o",
                          label=f"D={d} {name}")
    ax_time.set(xlabel="global batch N", ylabel="fwd+bwd seconds (median)", title="time")
    ax_mem.set(xlabel="global batch N", ylabel="XLA compiled temp (MiB)", title="memory")
    for ax in (ax_time, ax_mem):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xscale("log", base=2)
    ax_time.legend(fontsize=7)
    fig.suptitle(f"clip_loss forward+backward, {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sweep, about a minute")
    parser.add_argument("--out", type=Path, default=None, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--max-memory-gib", type=float, default=None,
                        help="skip points whose compiled memory exceeds this (default: 40%% "
                        "of MemAvailable)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return

    mode = "quick" if args.quick else "full"
    sweep = SWEEPS[mode]
    out = args.out or (DEFAULT_OUT / "quick" if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    max_memory = int((args.max_memory_gib * 2**30) if args.max_memory_gib
                     else 0.4 * available_memory_bytes())
    budget_s = 3.0 if args.quick else 20.0
    peak_n = 2048 if args.quick else 4096
    with_torch = torch_available()
    print(f"[bench] {mode} sweep; memory limit {fmt_bytes(max_memory)}; "
          f"PyTorch reference: {'yes' if with_torch else 'not installed, skipped'}", flush=True)
    peaks = [spawn({"worker": "peak", "n": peak_n})]
    print(f"[bench] jnp.dot peak {peaks[0]['gflops']:.1f} GFLOP/s", flush=True)

    points = plan(sweep, with_torch)
    started = time.perf_counter()
    for index, point in enumerate(points, 1):
        spec = point | {"max_memory_bytes": max_memory, "max_repeats": 5, "budget_s": budget_s}
        point.update(spawn(spec))
        if "seconds" in point:
            point["gflops"] = _useful_flops(point["n"], point["d"]) / point["seconds"] / 1e9
            status = (f"{point['seconds']:.3f} s x{point['repeats']}, "
                      f"{point['gflops']:.1f} GFLOP/s, temp {fmt_bytes(point.get('temp_bytes'))}, "
                      f"RSS {fmt_bytes(point['peak_rss_bytes'])}")
        else:
            status = point.get("skipped") or point.get("error")
        print(f"[{index}/{len(points)}] N={point['n']} D={point['d']} {method(point)}: {status} "
              f"({time.perf_counter() - started:.0f} s elapsed)", flush=True)

    ring = {}
    for n in sweep["ring_ns"]:
        chunk = min(256, n // RING_DEVICES)  # must divide each device's shard for the ring
        variants = {"all_gather": {}, "all_gather chunked": {"chunk_size": chunk},
                    "ring": {"collective": "ring"},
                    "ring chunked": {"collective": "ring", "chunk_size": chunk}}
        ring[n] = spawn({"worker": "ring", "n": n, "d": 256, "variants": variants,
                         "execute": n == min(sweep["ring_ns"])}, devices=RING_DEVICES)
        summary = ring[n].get("error") or ", ".join(
            f"{k} {fmt_bytes(v['temp_bytes'])}" for k, v in ring[n].items() if isinstance(v, dict))
        print(f"[ring] N={n} on {RING_DEVICES} devices, per-device temp: {summary}", flush=True)

    peaks.append(spawn({"worker": "peak", "n": peak_n}))
    peak = max(p["gflops"] for p in peaks)
    print(f"[bench] jnp.dot peak at the end {peaks[1]['gflops']:.1f} GFLOP/s", flush=True)
    result = {
        "command": "python experiments/bench_losses.py" + (" --quick" if args.quick else ""),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
        "peak_gflops": peak, "peak_matmul_n": peak_n, "peaks": peaks,
        "temperature": TEMPERATURE, "points": points, "ring": ring,
    }
    result["targets"] = evaluate_targets(points, peak, ring)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    write_markdown(out / "results.md", result)
    write_plot(out / "results.png", result)
    for target, measured, verdict in result["targets"]:
        print(f"[target] {verdict:6s} {target}: {measured}", flush=True)
    print(f"[bench] wrote {out}/results.{{json,md,png}}", flush=True)


if __name__ == "__main__":
    main()
