"""One optimizer step at a huge global batch: gradient caching vs the whole batch at once,
each beside the loss's own forward and backward.

    python -m experiments.bench.bench_grad_cache             # 2^14 ... 2^18: over an hour on 2 cores
    python -m experiments.bench.bench_grad_cache --log2 14 15 # only these sizes (merged into results)
    python -m experiments.bench.bench_grad_cache --quick     # 2^10, whole and in micro-batches, half a minute

For each global batch N (and method), a fresh subprocess builds the default config's
model (two MLP towers on the digits' halves, CLIP loss with a learned temperature, D =
64) on 8 simulated devices, feeds random inputs of the default shape, and times one
jitted `Trainer.train_step`: with `micro_batch_size` (GradCache: embed in micro-batches,
exact full-batch loss streamed in tiles, then re-embed each micro-batch to pull the
cached embedding gradients back) or with the whole batch at once (`full`, the same
streamed loss). In the same subprocess, on the same mesh, it times the loss alone
(`Trainer.global_loss`'s value and gradients on N random embeddings): the step ÷ loss
ratio is what the step costs beyond the loss (the towers, the optimizer; the issue's
target for `full` at N = 2^14 is <= 1.15). Calls are timed in turns, step then loss,
after a warm-up round unless a call takes longer than `BUDGET_S` (then once, compiled
beforehand). The parent measures a float32 `jnp.dot` peak (`bench_losses`' worker) and
prints each step's time ÷ (6 N^2 D / peak), the loss's useful flops at that peak.

Per point also XLA's compiled memory (`memory_analysis()`: temp and argument bytes, per
device program) and the subprocess's peak RSS. Writes `results.json` and `results.md`
under `experiments/results/bench_grad_cache/`; points already there are kept unless
re-run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS
from experiments.bench import bench_losses

RESULTS = ALL_RESULTS / "bench_grad_cache"
NUM_DEVICES = 8
BUDGET_S = 30.0  # a call longer than this is timed once (no warm-up, no repeats)
REPEATS = 3


def time_in_turns(calls: dict, *, repeats: int = REPEATS, budget_s: float = BUDGET_S) -> dict:
    """Median seconds of each compiled call in `calls` (name -> fn), called in turns so
    that a change in the machine's load hits them alike. The first round is a warm-up,
    unless a call took longer than `budget_s`: then that round is the measurement."""
    first = {}
    for name, call in calls.items():
        start = time.perf_counter()
        call()
        first[name] = time.perf_counter() - start
    if max(first.values()) > budget_s:
        return first
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def built_run(global_batch: int, micro_batch: int, chunk_size: int):
    """The default config's `Trainer` at these sizes on `NUM_DEVICES` devices, and one
    batch's input spec (`{"a": ShapeDtypeStruct[N, ...], "b": ...}`)."""
    from configs import default
    from contrastive_jax import sharding
    from contrastive_jax.config_lib import override
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import run_plan
    from contrastive_jax.training.run_plan import data_settings

    config = default.get_config()
    run_plan.write_builtin_records(config)  # the digits, once: build writes nothing
    shapes_only = override(config, {"train.global_batch_size": NUM_DEVICES})
    spec = input_pipeline.train_dataset(data_settings(shapes_only)).element_spec  # the input shapes
    config = override(
        config,
        {
            "train.global_batch_size": global_batch,
            "train.micro_batch_size": micro_batch,
            "loss.chunk_size": chunk_size,
        },
    )
    return run_plan.build(config, sharding.make_mesh(NUM_DEVICES)).trainer, spec


def run_point(global_batch: int, micro_batch: int, chunk_size: int) -> dict:
    """Compiles and times one train step; returns its figures (runs in a subprocess)."""
    from contrastive_jax.simulated_devices import simulate_cpu_devices

    simulate_cpu_devices(NUM_DEVICES)
    import jax
    import numpy as np

    from contrastive_jax import sharding

    run, spec = built_run(global_batch, micro_batch, chunk_size)
    init, abstract = run.init_state(spec)
    rng = np.random.default_rng(0)
    batch = {key: rng.standard_normal((global_batch, *spec[key].shape[1:]), np.float32) for key in ("a", "b")}
    batch = jax.device_put(batch, sharding.data_sharding(run.mesh))
    step = run.jit_train_step(abstract)
    compile_start = time.perf_counter()
    compiled = step.lower(abstract, batch).compile()
    compile_seconds = time.perf_counter() - compile_start
    memory = compiled.memory_analysis()
    loss_and_grads, loss_inputs = _compiled_loss(run, global_batch, rng)
    state = [jax.block_until_ready(init())]
    losses = []

    def train_step():
        state[0], metrics = compiled(state[0], batch)
        losses.append(float(jax.block_until_ready(metrics["loss"])))

    def loss_only():
        jax.block_until_ready(loss_and_grads(*loss_inputs))

    seconds = time_in_turns({"step": train_step, "loss": loss_only})
    return {
        "global_batch": global_batch,
        "method": "grad_cache" if micro_batch else "full",
        "micro_batch": micro_batch,
        "chunk_size": chunk_size,
        "devices": NUM_DEVICES,
        "embed_dim": run.loss_settings.embed_dim,
        "loss": losses[0],
        "log_global_batch": float(np.log(global_batch)),
        "step_seconds": seconds["step"],
        "loss_seconds": seconds["loss"],
        "step_over_loss": seconds["step"] / seconds["loss"],
        "compile_seconds": compile_seconds,
        "compiled_temp_bytes": memory.temp_size_in_bytes,
        "compiled_argument_bytes": memory.argument_size_in_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _compiled_loss(run, global_batch: int, rng):
    """The step's loss alone (`Trainer.global_loss`: value and gradients wrt the
    embeddings and the temperature) on N random unit embeddings, compiled on the same
    mesh with the same sharding; returns `(compiled, inputs)`."""
    import jax
    import numpy as np

    from contrastive_jax import sharding

    dim = run.loss_settings.embed_dim
    embeddings = {}
    for key in ("za", "zb"):
        z = rng.standard_normal((global_batch, dim), np.float32)
        embeddings[key] = z / np.linalg.norm(z, axis=1, keepdims=True)
    embeddings = jax.device_put(embeddings, sharding.data_sharding(run.mesh))
    shared = {"temperature": np.float32(run.model.temperature_init)}

    def loss(batched, shared):
        return run.global_loss(batched, shared, {})[0]

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(embeddings, shared).compile()
    return compiled, (embeddings, shared)


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f} MiB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny batches, for CI")
    parser.add_argument(
        "--point", type=int, nargs=3, metavar=("N", "MICRO", "CHUNK"), help=argparse.SUPPRESS
    )  # internal: run one point, print JSON
    parser.add_argument(
        "--log2", type=int, nargs="+", default=[14, 15, 16, 17, 18], help="global batch sizes to run, as powers of two"
    )
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(run_point(*args.point)))
        return 0

    points = [(2**10, m, 128) for m in (0, 256)] if args.quick else planned_points(args.log2)
    results_file = args.out / "results.json"
    kept = json.loads(results_file.read_text()) if results_file.exists() else []
    peak = _matmul_peak(2048 if args.quick else 4096)
    load = f"load average {os.getloadavg()[0]:.1f} at the start"
    print(f"[bench] jnp.dot peak {peak['gflops']:.1f} GFLOP/s; {load}", flush=True)
    results = []
    for index, (global_batch, micro_batch, chunk) in enumerate(points, 1):
        point = measured_point(global_batch, micro_batch, chunk, peak["gflops"]) | {"load_average": load}
        results.append(point)
        print(
            f"[{index}/{len(points)}] N={global_batch:>7} {point['method']:<10} "
            f"step {point['step_seconds']:8.2f} s  loss {point['loss_seconds']:8.2f} s  "
            f"step/loss {point['step_over_loss']:5.2f}  "
            f"step/(6N^2D/peak) {point['step_over_matmul_limit']:5.2f}  "
            f"temp {_mib(point['compiled_temp_bytes']):>10}  "
            f"peak RSS {_mib(point['peak_rss_bytes']):>10}",
            flush=True,
        )
    rerun = {(p["global_batch"], p["method"]) for p in results}
    results += [p for p in kept if (p["global_batch"], p["method"]) not in rerun]
    results.sort(key=lambda p: (p["method"], p["global_batch"]))
    args.out.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(results, indent=1))
    lines = report_lines(results)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def planned_points(log2_sizes: list[int]) -> list[tuple[int, int, int]]:
    """`(global batch, micro-batch (0: the whole batch), loss chunk)` of each point: every
    size in micro-batches of 8,192, and the whole batch at once up to 2^16."""
    points = [(2**k, 8192, 512) for k in log2_sizes]
    return points + [(2**k, 0, 512) for k in log2_sizes if k <= 16]


def measured_point(global_batch: int, micro_batch: int, chunk: int, peak_gflops: float) -> dict:
    """`run_point`'s figures, measured in a fresh process, with the step's time against
    the loss's useful flops at the `jnp.dot` peak (`6 N^2 D / peak`)."""
    command = [sys.executable, "-m", __spec__.name, "--point", str(global_batch), str(micro_batch), str(chunk)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"point N={global_batch} micro={micro_batch} failed")
    point = json.loads(done.stdout.strip().splitlines()[-1])
    useful_seconds = 6.0 * global_batch**2 * point["embed_dim"] / (peak_gflops * 1e9)
    return point | {"peak_gflops": peak_gflops, "step_over_matmul_limit": point["step_seconds"] / useful_seconds}


def report_lines(results: list[dict]) -> list[str]:
    """`results.md`'s table: a row per point (the loss's columns `-` where not measured)."""
    lines = [
        "| global batch | method | micro-batch | step time | loss fwd+bwd | step ÷ loss | "
        "step ÷ (6N²D / peak) | compiled temp / device | peak RSS | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in results:
        ratios = (
            f"{p['loss_seconds']:.2f} s | {p['step_over_loss']:.2f} | {p['step_over_matmul_limit']:.1f}"
            if "loss_seconds" in p
            else "- | - | -"
        )
        lines.append(
            f"| {p['global_batch']:,} | {p['method']} | {p['micro_batch'] or '-'} | "
            f"{p['step_seconds']:.2f} s | {ratios} | {_mib(p['compiled_temp_bytes'])} | "
            f"{_mib(p['peak_rss_bytes'])} | {p.get('load_average', '-')} |"
        )
    return lines


def _matmul_peak(n: int) -> dict:
    """`bench_losses`' float32 `jnp.dot` peak (an n^3 matmul, one device, own process)."""
    peak = bench_losses.spawn({"worker": "peak", "n": n})
    if "error" in peak:
        raise SystemExit(f"[bench] the jnp.dot peak failed: {peak['error']}")
    return peak


if __name__ == "__main__":
    sys.exit(main())
