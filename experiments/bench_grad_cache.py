"""One optimizer step at a huge global batch: gradient caching vs the whole batch at once.

    python experiments/bench_grad_cache.py             # 2^14 ... 2^18: an hour on 2 cores
    python experiments/bench_grad_cache.py --log2 14 15 # only these sizes (merged into results)
    python experiments/bench_grad_cache.py --quick     # 2^10 ... 2^11, about a minute

For each global batch N (and method), a fresh subprocess builds the default config's
model (two MLP towers on the digits' halves, CLIP loss with a learned temperature) on 8
simulated devices, feeds random inputs of the default shape, and runs one jitted
`Trainer.train_step`: with `micro_batch_size` (GradCache: embed in micro-batches, exact
full-batch loss streamed in column chunks, then re-embed each micro-batch to pull the
cached embedding gradients back) or with the whole batch at once (`full`, the same
chunked loss). Per point: the step's wall time (compiled beforehand), XLA's compiled
memory (`memory_analysis()`: temp and argument bytes, per device program) and the
subprocess's peak RSS. Writes `results.json` and `results.md` under
`experiments/results/bench_grad_cache/`; points already there are kept unless re-run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results" / "bench_grad_cache"
NUM_DEVICES = 8


def run_point(global_batch: int, micro_batch: int, chunk_size: int) -> dict:
    """Compiles and times one train step; returns its figures (runs in a subprocess)."""
    sys.path.insert(0, str(ROOT))
    from contrastive_jax.main import simulate_cpu_devices

    simulate_cpu_devices(NUM_DEVICES)
    import jax
    import numpy as np

    from configs import default
    from contrastive_jax import input_pipeline, sharding, trainer
    from contrastive_jax.config_lib import override

    config = default.get_config()
    shapes_only = override(config, {"train.global_batch_size": NUM_DEVICES})
    spec = input_pipeline.train_dataset(shapes_only).element_spec  # the input shapes
    config = override(config, {
        "train.global_batch_size": global_batch,
        "train.micro_batch_size": micro_batch,
        "loss.chunk_size": chunk_size,
    })
    run = trainer.build(config, sharding.make_mesh(NUM_DEVICES))
    init, abstract = run.init_state(spec)
    rng = np.random.default_rng(0)
    batch = {
        key: rng.standard_normal((global_batch, *spec[key].shape[1:]), np.float32)
        for key in ("a", "b")
    }
    batch = jax.device_put(batch, sharding.data_sharding(run.mesh))
    step = run.jit_train_step(abstract)
    compile_start = time.perf_counter()
    compiled = step.lower(abstract, batch).compile()
    compile_seconds = time.perf_counter() - compile_start
    memory = compiled.memory_analysis()
    state = jax.block_until_ready(init())
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    loss = float(jax.block_until_ready(metrics["loss"]))
    step_seconds = time.perf_counter() - start
    return {
        "global_batch": global_batch,
        "method": "grad_cache" if micro_batch else "full",
        "micro_batch": micro_batch,
        "chunk_size": chunk_size,
        "devices": NUM_DEVICES,
        "loss": loss,
        "log_global_batch": float(np.log(global_batch)),
        "step_seconds": step_seconds,
        "compile_seconds": compile_seconds,
        "compiled_temp_bytes": memory.temp_size_in_bytes,
        "compiled_argument_bytes": memory.argument_size_in_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f} MiB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny batches, for CI")
    parser.add_argument("--point", type=int, nargs=3, metavar=("N", "MICRO", "CHUNK"),
                        help=argparse.SUPPRESS)  # internal: run one point, print JSON
    parser.add_argument("--log2", type=int, nargs="+", default=[14, 15, 16, 17, 18],
                        help="global batch sizes to run, as powers of two")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(run_point(*args.point)))
        return 0

    if args.quick:
        points = [(n, m, 128) for n in (2**10, 2**11) for m in (0, 256)]
    else:
        points = [(2**k, 8192, 512) for k in args.log2]
        points += [(2**k, 0, 512) for k in args.log2 if k <= 16]  # the whole batch at once
    results_file = args.out / "results.json"
    kept = json.loads(results_file.read_text()) if results_file.exists() else []
    results = []
    for index, (global_batch, micro_batch, chunk) in enumerate(points, 1):
        command = [sys.executable, __file__, "--point", str(global_batch), str(micro_batch), str(chunk)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"point N={global_batch} micro={micro_batch} failed")
        point = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(point)
        print(
            f"[{index}/{len(points)}] N={global_batch:>7} {point['method']:<10} "
            f"step {point['step_seconds']:8.1f} s  temp {_mib(point['compiled_temp_bytes']):>10}  "
            f"peak RSS {_mib(point['peak_rss_bytes']):>10}",
            flush=True,
        )
    rerun = {(p["global_batch"], p["method"]) for p in results}
    results += [p for p in kept if (p["global_batch"], p["method"]) not in rerun]
    results.sort(key=lambda p: (p["method"], p["global_batch"]))
    args.out.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(results, indent=1))
    lines = [
        "| global batch | method | micro-batch | step time | compiled temp / device | peak RSS |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for p in results:
        lines.append(
            f"| {p['global_batch']:,} | {p['method']} | {p['micro_batch'] or '-'} | "
            f"{p['step_seconds']:.1f} s | {_mib(p['compiled_temp_bytes'])} | "
            f"{_mib(p['peak_rss_bytes'])} |"
        )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
