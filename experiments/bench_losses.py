"""What the contrastive losses cost: time and memory, dense vs streamed, against a peak.

Run:  python experiments/bench_losses.py            (full sweep; about 30 minutes on 2 CPU cores)
      python experiments/bench_losses.py --quick    (small sweep, about a minute)

Times forward+backward (the value and the gradients of both sides) of ``clip_loss``,
``siglip_loss`` and ``infonce_loss`` for N in a sweep and D in {64, 512}: dense
(``chunk_size=None``), streamed (``chunk_size="auto"`` and fixed tiles), and streamed with
bfloat16 matmuls (``matmul_dtype="bfloat16"``); when PyTorch is importable (``pip install
-e '.[bench]'``), an open_clip-style ``ClipLoss`` (local loss) and SigLIP loss on the
same inputs. ``sogclr_loss`` (with its table's update) runs at the siglip/infonce sizes,
and ``moco_queue_loss`` (with the enqueue) against a queue of K = 16 N keys (the full
sweep: N = 4,096, K = 65,536, D = 64), dense and ``"auto"``; its useful flops are the
queue's ``4 N K D`` (the queue has no gradient). Each point runs in a fresh subprocess,
which reports the median time over
repeats after a warm-up call, XLA's compiled ``memory_analysis()`` temp bytes, the
process's peak RSS (CPU only), and the achieved GFLOP/s counting the useful ``6 N^2 D``
flops, also as a fraction of a float32 ``jnp.dot`` peak measured in the same run. Points
whose compiled memory exceeds ``--max-memory-gib`` are skipped with a note.

It runs unchanged on a GPU or TPU backend (JAX's default platform; RSS columns are
skipped there); the ring table always uses 8 simulated CPU devices and compares their
per-device compiled memory for the all-gather and ring collectives. Writes
``results.json``, ``results.md`` and ``results.png`` to ``--out``.

The whole train step beside the loss's own forward and backward (the "train step ÷
loss" ratio, default towers, 8 devices) is ``experiments/bench_grad_cache.py``, which
builds the real step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from contrastive_jax.simulated_devices import device_count_env

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "experiments" / "results" / "bench_losses"
GRAD_CACHE_RESULTS = REPO / "experiments" / "results" / "bench_grad_cache"
TEMPERATURE = 0.07
SIGLIP_BIAS = -10.0
RING_DEVICES = 8
LOSSES = ("clip", "siglip", "infonce", "sogclr", "moco_queue")
TORCH_LOSSES = ("clip", "siglip")  # the ones with an open_clip reference
QUEUE_D = 64  # the queue's points: D = 64, K = 16 N (the N = 4,096, K = 65,536)

# Which points each sweep runs. clip: every N up to max_n_by_d[D] with the methods
# below (the largest N streamed only); siglip and infonce at other_ns; torch wherever
# its dense N x N logits fit.
SWEEPS = {
    "quick": dict(
        ns=[1024, 2048],
        ds=[64],
        chunks=["auto", 256],
        big_n=2048,
        max_n_by_d={64: 2048},
        other_ns=[2048],
        bf16=True,
        ring_ns=[1024],
        queue_ns=[1024],
        peak_n=2048,
        budget_s=2.0,
    ),
    "full": dict(
        ns=[4096, 8192, 16384, 32768, 65536],
        ds=[64, 512],
        chunks=["auto", 256],
        big_n=32768,
        max_n_by_d={64: 65536, 512: 16384},
        other_ns=[8192, 16384],
        bf16=True,
        ring_ns=[8192, 32768, 65536],
        queue_ns=[4096],
        peak_n=4096,
        budget_s=20.0,
    ),
}


# ------------------------------------------------------------------ worker (subprocess)


def _useful_flops(point: dict) -> float:
    """One N x N x D product forward, its two transposes backward; the queue's N x K x D
    product forward and the queries' gradient (the queue has none)."""
    n, d = point["n"], point["d"]
    if point["loss"] == "moco_queue":
        return 4.0 * n * point["queue"] * d
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
    seconds, repeats, _ = _time_calls(lambda: matmul(x).block_until_ready(), max_repeats=5, budget_s=10.0)
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    return {
        "gflops": 2.0 * n**3 / seconds / 1e9,
        "seconds": seconds,
        "repeats": repeats,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_memory_bytes": (stats or {}).get("bytes_limit"),
    }


def _inputs(n: int, d: int):
    """The same L2-normalised ``[N, D]`` pair for every framework (numpy, float32)."""
    import numpy as np

    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(2))
    b = a + 1.5 * b  # correlated pairs, as in training
    return tuple(x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b))


def _jax_loss(spec: dict):
    """``loss(a, b) -> (value, state)``: the loss of a spec's point with its state's
    update (SogCLR's table of N examples, all visited; the queue of ``spec["queue"]``
    random keys, enqueued), so that the timing includes it."""
    import jax
    import jax.numpy as jnp

    from contrastive_jax import losses

    name, n, d = spec["loss"], spec["n"], spec["d"]
    options = dict(temperature=TEMPERATURE, chunk_size=spec["chunk"], matmul_dtype=spec.get("matmul_dtype"))
    if name == "sogclr":
        table = jnp.zeros((n, 2), jnp.float32)  # visited before: the moving average runs
        return lambda a, b: losses.sogclr_loss(a, b, jnp.arange(n), table, **options)
    if name == "moco_queue":
        queue = losses.l2_normalize(jax.random.normal(jax.random.key(2), (spec["queue"], d)))

        def moco(a, b):
            value = losses.moco_queue_loss(a, b, queue, **options)
            return value, losses.enqueue(queue, jnp.int32(0), b)

        return moco
    fn = {"clip": losses.clip_loss, "siglip": losses.siglip_loss, "infonce": losses.infonce_loss}[name]
    extra = {"bias": SIGLIP_BIAS} if name == "siglip" else {}
    return lambda a, b: (fn(a, b, **options, **extra), None)


def _worker_jax(spec: dict) -> dict:
    import jax

    from contrastive_jax.losses import logit_stats

    n, d, chunk = spec["n"], spec["d"], spec["chunk"]
    loss = _jax_loss(spec)
    shape = jax.ShapeDtypeStruct((n, d), jax.numpy.float32)
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)).lower(shape, shape).compile()
    memory = compiled.memory_analysis()
    total = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
    result = {"temp_bytes": memory.temp_size_in_bytes, "compiled_total_bytes": total}
    if chunk == "auto":
        result["resolved_chunk"] = logit_stats.auto_chunk_size(spec.get("queue", n), d)
    if total > spec["max_memory_bytes"]:
        return result | {
            "skipped": f"needs {total / 2**30:.1f} GiB compiled > limit {spec['max_memory_bytes'] / 2**30:.1f} GiB"
        }
    a, b = (jax.device_put(x) for x in _inputs(n, d))
    seconds, repeats, warmed = _time_calls(
        lambda: jax.block_until_ready(compiled(a, b)),
        max_repeats=spec["max_repeats"],
        budget_s=spec["budget_s"],
    )
    return result | {"seconds": seconds, "repeats": repeats, "warm_up": warmed, "value": float(compiled(a, b)[0][0])}


def _worker_torch(spec: dict) -> dict:
    """open_clip's ``ClipLoss`` (local loss, one device) or ``SigLipLoss``, dense."""
    import torch
    import torch.nn.functional as F

    n, d = spec["n"], spec["d"]
    if 5 * n * n * 4 > spec["max_memory_bytes"]:
        return {"skipped": "estimated N x N logits and gradients exceed the memory limit"}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.from_numpy(x).to(device).requires_grad_(True) for x in _inputs(n, d))
    labels = torch.arange(n, device=device)
    scale = 1.0 / TEMPERATURE

    def clip():  # open_clip ClipLoss.forward with world_size 1
        logits_per_image = scale * a @ b.T
        logits_per_text = scale * b @ a.T
        return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2

    def siglip():  # open_clip SigLipLoss._loss with world_size 1
        logits = scale * a @ b.T + SIGLIP_BIAS
        signs = 2 * torch.eye(n, device=device) - 1
        return -F.logsigmoid(signs * logits).sum() / n

    loss_fn = {"clip": clip, "siglip": siglip}[spec["loss"]]

    def step():
        a.grad = b.grad = None
        value = loss_fn()
        value.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return value

    seconds, repeats, warmed = _time_calls(step, max_repeats=spec["max_repeats"], budget_s=spec["budget_s"])
    return {
        "seconds": seconds,
        "repeats": repeats,
        "warm_up": warmed,
        "value": float(loss_fn().detach()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


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
        fn = jax.jit(
            jax.value_and_grad(
                lambda a, b, kw=kwargs: sharding.shard_loss(losses.clip_loss, mesh)(
                    a, b, temperature=TEMPERATURE, **kw
                ),
                argnums=(0, 1),
            )
        )
        compiled = fn.lower(shape, shape).compile()
        memory = compiled.memory_analysis()
        out[name] = {"temp_bytes": memory.temp_size_in_bytes, "argument_bytes": memory.argument_size_in_bytes}
        if spec["execute"]:
            keys = jax.random.split(jax.random.key(1))
            a, b = (
                jax.device_put(losses._common.l2_normalize(jax.random.normal(k, (n, d))), sharding.data_sharding(mesh))
                for k in keys
            )
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
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    if devices > 1:  # simulated devices are CPU devices, whatever the default backend
        env = device_count_env(devices, env)
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
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
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def plan(sweep: dict, with_torch: bool) -> list[dict]:
    """The points of a sweep: clip over N and D; siglip, infonce and sogclr at
    ``other_ns``; the MoCo queue (K = 16 N, D = 64) at ``queue_ns``, dense and auto."""
    points = []
    for n in sweep["queue_ns"]:
        point = {"worker": "jax", "loss": "moco_queue", "n": n, "d": QUEUE_D, "queue": 16 * n}
        points += [point | {"chunk": None}, point | {"chunk": "auto"}]
    for d in sweep["ds"]:
        for loss in (loss for loss in LOSSES if loss != "moco_queue"):
            ns = sweep["ns"] if loss == "clip" else sweep["other_ns"]
            for n in (n for n in ns if n <= sweep["max_n_by_d"][d]):
                point = {"worker": "jax", "loss": loss, "n": n, "d": d}
                if n < sweep["big_n"]:
                    points.append(point | {"chunk": None})
                points += [
                    point | {"chunk": c} for c in sweep["chunks"] if c == "auto" or (c < n and n < sweep["big_n"])
                ]
                if sweep["bf16"]:
                    points.append(point | {"chunk": "auto", "matmul_dtype": "bfloat16"})
                if with_torch and loss in TORCH_LOSSES:
                    points.append({"worker": "torch", "loss": loss, "n": n, "d": d})
    return points


def method(point: dict) -> str:
    if point["worker"] == "torch":
        return "torch dense"
    chunk = point["chunk"]
    name = "dense" if chunk is None else f"chunk {chunk}"
    if chunk == "auto":
        name = f"auto ({point.get('resolved_chunk') or 'dense'})"
    queue = f" K={point['queue']:,}" if "queue" in point else ""
    return name + (" bf16" if point.get("matmul_dtype") else "") + queue


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


def _step_over_loss_target() -> tuple[str, str, str]:
    """The train-step target, from ``bench_grad_cache.py``'s results (it builds the step)."""
    target = "train step / the loss's own fwd+bwd, N=16,384, D=64 (default towers) <= 1.15"
    path = GRAD_CACHE_RESULTS / "results.json"
    points = json.loads(path.read_text()) if path.exists() else []
    step = next((p for p in points if p["global_batch"] == 16384 and p["method"] == "full"), None)
    if step is None:
        return target, "not measured: run experiments/bench_grad_cache.py --log2 14", "-"
    return (
        target,
        f"{step['step_over_loss']:.2f} ({step['step_seconds']:.2f} s vs "
        f"{step['loss_seconds']:.2f} s, experiments/bench_grad_cache.py)",
        "met" if step["step_over_loss"] <= 1.15 else "missed",
    )


def evaluate_targets(points, peak_gflops, ring) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows for the issue's loss-kernel targets."""
    ok = [p for p in points if "seconds" in p]

    def find(loss, n, d, worker="jax", streamed=None):
        """The fastest matching point; ``streamed``: True (float32 chunked), False (dense)."""
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

    def fraction(point):
        return point["gflops"] / peak_gflops

    def verdict(met):
        return "met" if met else "missed"

    rows = []
    for loss, d, ns, goal in [
        ("clip", 512, (8192, 16384), 0.70),
        ("clip", 64, (16384,), 0.50),
        ("siglip", 512, (8192,), 0.85),
    ]:
        for n in ns:
            point = find(loss, n, d, streamed=True)
            if point:
                rows.append(
                    (
                        f"streamed {loss} N={n:,} D={d}: useful 6N^2D / jnp.dot peak >= {goal:.0%}",
                        f"{fraction(point):.0%} ({method(point)}, {point['seconds']:.2f} s)",
                        verdict(fraction(point) >= goal),
                    )
                )
    for n, goal in [(16384, 1.0), (32768, 0.7)]:
        dense, stream = find("clip", n, 512, streamed=False), find("clip", n, 512, streamed=True)
        if dense and stream:
            ratio = stream["seconds"] / dense["seconds"]
            rows.append(
                (
                    f"clip N={n:,} D=512: streamed / dense time <= {goal}",
                    f"{ratio:.2f} ({stream['seconds']:.2f} s {method(stream)} vs {dense['seconds']:.2f} s)",
                    verdict(ratio <= goal),
                )
            )
    for p in ok:
        if p["worker"] == "torch":
            ours = find(p["loss"], p["n"], p["d"], streamed=True)
            if ours:
                ratio = p["seconds"] / ours["seconds"]
                rows.append(
                    (
                        f"torch {p['loss']} dense / ours streamed, N={p['n']:,} D={p['d']} >= 3",
                        f"{ratio:.2f} ({p['seconds']:.2f} s vs {ours['seconds']:.2f} s {method(ours)})",
                        verdict(ratio >= 3),
                    )
                )
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
                verdict(big["peak_rss_bytes"] <= 2 * 2**30),
            )
        )
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
                verdict(all(entry[r]["temp_bytes"] <= entry[g]["temp_bytes"] for r, g in pairs)),
            )
        )
        if "max_relative_difference" in entry:
            rows.append(
                (
                    f"ring equals all-gather (N={n:,}, value and gradients)",
                    f"max relative difference {entry['max_relative_difference']:.1e}",
                    verdict(entry["max_relative_difference"] <= 1e-5),
                )
            )
    return rows


def write_markdown(path: Path, result: dict) -> None:
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
        seconds = f"{p['seconds']:.3f}" if "seconds" in p else "-"
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sweep, about a minute")
    parser.add_argument("--out", type=Path, default=None, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument(
        "--max-memory-gib",
        type=float,
        default=None,
        help="skip points whose compiled memory exceeds this (default: 40%% "
        "of MemAvailable, or 80%% of the accelerator's memory)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return

    mode = "quick" if args.quick else "full"
    sweep = SWEEPS[mode]
    out = args.out or (DEFAULT_OUT / "quick" if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    with_torch = torch_available()
    peaks = [spawn({"worker": "peak", "n": sweep["peak_n"]})]
    if "error" in peaks[0]:
        raise SystemExit(f"[bench] the jnp.dot peak failed: {peaks[0]['error']}")
    device = peaks[0]
    if args.max_memory_gib:
        max_memory = int(args.max_memory_gib * 2**30)
    elif device["device_memory_bytes"]:
        max_memory = int(0.8 * device["device_memory_bytes"])
    else:
        max_memory = int(0.4 * available_memory_bytes())
    load = f"load average {os.getloadavg()[0]:.1f} at the start"
    print(
        f"[bench] {mode} sweep on {device['platform']} ({device['device_kind']}); {load}; "
        f"memory limit {fmt_bytes(max_memory)}; PyTorch reference: "
        f"{'yes' if with_torch else 'not installed, skipped'}",
        flush=True,
    )
    print(f"[bench] jnp.dot peak {device['gflops']:.1f} GFLOP/s", flush=True)

    points = plan(sweep, with_torch)
    started = time.perf_counter()
    for index, point in enumerate(points, 1):
        spec = point | {"max_memory_bytes": max_memory, "max_repeats": 5, "budget_s": sweep["budget_s"]}
        point.update(spawn(spec))
        if device["platform"] != "cpu":
            point.pop("peak_rss_bytes", None)  # host memory says nothing about the device
        if "seconds" in point:
            point["gflops"] = _useful_flops(point) / point["seconds"] / 1e9
            status = (
                f"{point['seconds']:.3f} s x{point['repeats']}, "
                f"{point['gflops']:.1f} GFLOP/s, temp {fmt_bytes(point.get('temp_bytes'))}, "
                f"RSS {fmt_bytes(point.get('peak_rss_bytes'))}"
            )
        else:
            status = point.get("skipped") or point.get("error")
        print(
            f"[{index}/{len(points)}] {point['loss']} N={point['n']} D={point['d']} "
            f"{method(point)}: {status} ({time.perf_counter() - started:.0f} s elapsed)",
            flush=True,
        )

    ring = {}
    for n in sweep["ring_ns"]:
        chunk = min(256, n // RING_DEVICES)  # must divide each device's shard for the ring
        variants = {
            "all_gather": {},
            "all_gather chunked": {"chunk_size": chunk},
            "ring": {"collective": "ring"},
            "ring chunked": {"collective": "ring", "chunk_size": chunk},
        }
        ring[n] = spawn(
            {"worker": "ring", "n": n, "d": 256, "variants": variants, "execute": n == min(sweep["ring_ns"])},
            devices=RING_DEVICES,
        )
        summary = ring[n].get("error") or ", ".join(
            f"{k} {fmt_bytes(v['temp_bytes'])}" for k, v in ring[n].items() if isinstance(v, dict)
        )
        print(f"[ring] N={n} on {RING_DEVICES} devices, per-device temp: {summary}", flush=True)

    peaks.append(spawn({"worker": "peak", "n": sweep["peak_n"]}))
    peak = max(p.get("gflops", 0.0) for p in peaks)
    load += f", {os.getloadavg()[0]:.1f} at the end"
    print(f"[bench] jnp.dot peak at the end {peaks[1].get('gflops', 0.0):.1f} GFLOP/s; {load}", flush=True)
    result = {
        "command": "python experiments/bench_losses.py" + (" --quick" if args.quick else ""),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {device['platform']} "
        f"({device['device_kind']}), Python {platform.python_version()}",
        "platform": device["platform"],
        "load": load,
        "peak_gflops": peak,
        "peak_matmul_n": sweep["peak_n"],
        "peaks": peaks,
        "temperature": TEMPERATURE,
        "siglip_bias": SIGLIP_BIAS,
        "points": points,
        "ring": ring,
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
