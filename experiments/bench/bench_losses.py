"""What the contrastive losses cost: time and memory, dense vs streamed, against a peak.

Run:  python -m experiments.bench.bench_losses            (full sweep; about 30 minutes on 2 CPU cores)
      python -m experiments.bench.bench_losses --quick    (small sweep, about a minute)
      python -m experiments.bench.bench_losses --sweep accelerator   (N = 16,384 and 65,536
                                                    at D = 512 on one GPU/TPU, a few minutes)

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
loss" ratio, default towers, 8 devices) is ``experiments/bench/bench_grad_cache.py``, which
builds the real step.

This module is the command line and the run; the points are ``bench_losses_grid.py``'s,
each measured in its own process by ``bench_losses_worker.py``, and
``bench_losses_report.py`` turns them into the targets, ``results.md`` and ``results.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from contrastive_jax.simulated_devices import device_count_env
from experiments import REPO, RESULTS
from experiments.bench import bench_losses_grid as grid
from experiments.bench import bench_losses_report as report
from experiments.bench import bench_losses_worker as worker

DEFAULT_OUT = RESULTS / "bench_losses"


def spawn(spec: dict, *, devices: int = 1, timeout_s: float = 1800, module: str = __spec__.name) -> dict:
    """Runs one point in a fresh Python process (so its peak RSS is the point's own):
    `python -m module --worker SPEC` (this module, or another benchmark with the same
    contract), which prints its result as the last line of JSON. A failure is
    `{"error": ...}`."""
    pythonpath = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, PYTHONPATH=pythonpath, TF_CPP_MIN_LOG_LEVEL="3")
    if devices > 1:  # simulated devices are CPU devices, whatever the default backend
        env = device_count_env(devices, env)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, "--worker", json.dumps(spec)],
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
    """The host's ``MemAvailable`` (``/proc/meminfo``) in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def torch_available() -> bool:
    """Whether PyTorch is installed (``pip install -e '.[bench]'``), for the reference."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def parsed(argv) -> argparse.Namespace:
    """The command line: see the module docstring and ``--help``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sweep, about a minute (--sweep quick)")
    parser.add_argument("--sweep", choices=sorted(grid.SWEEPS), default="full", help="which points (default full)")
    parser.add_argument("--out", type=Path, default=None, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument(
        "--max-memory-gib",
        type=float,
        default=None,
        help="skip points whose compiled memory exceeds this (default: 40%% "
        "of MemAvailable, or 80%% of the accelerator's memory)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def memory_limit(max_memory_gib: float | None, device: dict) -> int:
    """The compiled memory a point may use, in bytes: `max_memory_gib`, else 80% of the
    accelerator's memory, else 40% of the host's available memory."""
    if max_memory_gib:
        return int(max_memory_gib * 2**30)
    if device["device_memory_bytes"]:
        return int(0.8 * device["device_memory_bytes"])
    return int(0.4 * available_memory_bytes())


def measure_points(points: list[dict], *, max_memory: int, budget_s: float, platform_name: str) -> None:
    """Measures each of `points` in its own process, in place (its time, memory and
    GFLOP/s, or why it was skipped), printing a line per point."""
    started = time.perf_counter()
    for index, point in enumerate(points, 1):
        spec = point | {"max_memory_bytes": max_memory, "max_repeats": 5, "budget_s": budget_s}
        point.update(spawn(spec))
        if platform_name != "cpu":
            point.pop("peak_rss_bytes", None)  # host memory says nothing about the device
        if "seconds" in point:
            point["gflops"] = grid.useful_flops(point) / point["seconds"] / 1e9
            status = (
                f"{point['seconds']:.3f} s x{point['repeats']}, "
                f"{point['gflops']:.1f} GFLOP/s, temp {report.fmt_bytes(point.get('temp_bytes'))}, "
                f"RSS {report.fmt_bytes(point.get('peak_rss_bytes'))}"
            )
        else:
            status = point.get("skipped") or point.get("error")
        print(
            f"[{index}/{len(points)}] {point['loss']} N={point['n']} D={point['d']} "
            f"{grid.method(point)}: {status} ({time.perf_counter() - started:.0f} s elapsed)",
            flush=True,
        )


def measure_ring(ring_ns) -> dict[int, dict]:
    """`{N: per-device compiled memory of the all-gather and ring collectives, plain and
    chunked}` on `worker.RING_DEVICES` simulated devices, D = 256."""
    ring = {}
    for n in ring_ns:
        chunk = min(256, n // worker.RING_DEVICES)  # must divide each device's shard for the ring
        variants = {
            "all_gather": {},
            "all_gather chunked": {"chunk_size": chunk},
            "ring": {"collective": "ring"},
            "ring chunked": {"collective": "ring", "chunk_size": chunk},
        }
        ring[n] = spawn(
            {"worker": "ring", "n": n, "d": 256, "variants": variants, "execute": n == min(ring_ns)},
            devices=worker.RING_DEVICES,
        )
        summary = ring[n].get("error") or ", ".join(
            f"{k} {report.fmt_bytes(v['temp_bytes'])}" for k, v in ring[n].items() if isinstance(v, dict)
        )
        print(f"[ring] N={n} on {worker.RING_DEVICES} devices, per-device temp: {summary}", flush=True)
    return ring


def main(argv=None) -> None:
    """Command line: see the module docstring and ``--help``."""
    args = parsed(argv)
    if args.worker:
        print(json.dumps(worker.run_worker(json.loads(args.worker))))
        return

    mode = "quick" if args.quick else args.sweep
    sweep = grid.SWEEPS[mode]
    out = args.out or (DEFAULT_OUT if mode == "full" else DEFAULT_OUT / mode)
    out.mkdir(parents=True, exist_ok=True)
    with_torch = torch_available()
    peaks = [spawn({"worker": "peak", "n": sweep["peak_n"]})]
    if "error" in peaks[0]:
        raise SystemExit(f"[bench] the jnp.dot peak failed: {peaks[0]['error']}")
    device = peaks[0]
    max_memory = memory_limit(args.max_memory_gib, device)
    load = f"load average {os.getloadavg()[0]:.1f} at the start"
    print(
        f"[bench] {mode} sweep on {device['platform']} ({device['device_kind']}); {load}; "
        f"memory limit {report.fmt_bytes(max_memory)}; PyTorch reference: "
        f"{'yes' if with_torch else 'not installed, skipped'}",
        flush=True,
    )
    print(f"[bench] jnp.dot peak {device['gflops']:.1f} GFLOP/s", flush=True)

    points = grid.plan(sweep, with_torch)
    measure_points(points, max_memory=max_memory, budget_s=sweep["budget_s"], platform_name=device["platform"])
    ring = measure_ring(sweep["ring_ns"])
    peaks.append(spawn({"worker": "peak", "n": sweep["peak_n"]}))
    peak = max(p.get("gflops", 0.0) for p in peaks)
    load += f", {os.getloadavg()[0]:.1f} at the end"
    print(f"[bench] jnp.dot peak at the end {peaks[1].get('gflops', 0.0):.1f} GFLOP/s; {load}", flush=True)
    result = {
        "command": "python -m experiments.bench.bench_losses" + ("" if mode == "full" else f" --sweep {mode}"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {device['platform']} "
        f"({device['device_kind']}), Python {platform.python_version()}",
        "platform": device["platform"],
        "load": load,
        "peak_gflops": peak,
        "peak_matmul_n": sweep["peak_n"],
        "peaks": peaks,
        "temperature": worker.TEMPERATURE,
        "siglip_bias": worker.SIGLIP_BIAS,
        "points": points,
        "ring": ring,
    }
    write_results(out, result, report.evaluate_targets(points, peak, ring, device["platform"]))


def write_results(out: Path, result: dict, targets: list) -> None:
    """Writes `results.{json,md,png}` to `out`, the targets in the result, and prints the
    targets' verdicts."""
    result["targets"] = targets
    (out / "results.json").write_text(json.dumps(result, indent=1))
    report.write_markdown(out / "results.md", result)
    report.write_plot(out / "results.png", result)
    for target, measured, verdict in targets:
        print(f"[target] {verdict:6s} {target}: {measured}", flush=True)
    print(f"[bench] wrote {out}/results.{{json,md,png}}", flush=True)


if __name__ == "__main__":
    main()
