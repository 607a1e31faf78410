"""Fully sharded data parallel (`config.mesh.fsdp`): per-device state memory, step time
and the same losses as data parallel.

    python -m experiments.bench.bench_fsdp            # ViT-S/8 + text Transformer, 8 simulated devices
    python -m experiments.bench.bench_fsdp --quick    # the tiny default towers, seconds

On 8 simulated CPU devices, the CLIP config of the generated image-text set
(`configs/clip_shapes.py`) with a ViT-S image tower (22M parameters with the text
tower; AdamW: two moments per parameter) is built on a (8 / k) x k mesh for
k = `fsdp` in 1, 2, 4, 8, and its train step compiled at the same global batch. For
each k it records:

- the state's bytes per device (parameters + optimizer moments + step, from the
  shardings `Trainer.init_state` chose: exact) and XLA's compiled
  `memory_analysis()` (argument bytes: the state and the batch; temporaries), per
  device program;
- the step's median time over `REPEATS` steps after one warm-up, ÷ the k = 1 step
  (the simulated devices share the host's cores, so this is the cost of the extra
  collectives and the layout, not a speed-up);
- `--steps` steps (20) of training on the same random batches at k = 1 and k = 4: the
  largest relative difference between their losses.

Writes `results.json` and `results.md` under `experiments/results/bench_fsdp/`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS

RESULTS = ALL_RESULTS / "bench_fsdp"
NUM_DEVICES = 8
REPEATS = 3
FSDP_SIZES = (1, 2, 4, 8)


def bench_config(quick: bool):
    """The benchmarked config: clip_shapes with a ViT-S tower (or the default's tiny
    MLPs with `quick`), every array of at least 64 KiB split; its built-in records
    written if absent (`run_plan.build` writes nothing)."""
    from contrastive_jax.config_lib import load_config, override
    from contrastive_jax.training import run_plan

    if quick:
        config = override(load_config("default"), {"train.global_batch_size": 64, "mesh.fsdp_min_kib": 0.0})
    else:
        config = override(
            load_config("clip_shapes"),
            {
                "model.encoder_a": "vit_small",
                "model.encoder_dim": 384,
                "train.global_batch_size": 64,
                "data.data_dir": str(REPO / "runs" / "data"),
            },
        )
    run_plan.write_builtin_records(config)
    return config


def random_batches(element_spec, global_batch: int, count: int, seed: int = 0) -> list[dict]:
    """`count` batches of random inputs with the pipeline's shapes and dtypes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        batch = {}
        for key, spec in element_spec.items():
            shape = (global_batch, *spec.shape[1:])
            if np.issubdtype(spec.dtype, np.floating):
                batch[key] = rng.random(shape, dtype=np.float32).astype(spec.dtype)
            else:
                batch[key] = rng.integers(0, 200 if key == "b" else 256, shape).astype(spec.dtype)
        batches.append(batch)
    return batches


def state_bytes_per_device(abstract_state) -> int:
    """Bytes of the state one device holds, from each leaf's sharding."""
    import jax
    import numpy as np

    return sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(abstract_state)
    )


def run_point(config, fsdp: int, batches: list[dict]) -> tuple[dict, list[float]]:
    """Memory, step time and the losses of `batches` on a mesh with `fsdp` devices per group."""
    import jax

    from contrastive_jax import sharding
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training.run_plan import build, data_settings

    trainer = build(config, sharding.make_mesh(NUM_DEVICES, fsdp=fsdp)).trainer
    element_spec = input_pipeline.train_dataset(data_settings(config)).element_spec
    init, abstract = trainer.init_state(element_spec)
    compiled = trainer.compile_step(abstract, element_spec)
    memory = compiled.memory_analysis()
    place = sharding.data_sharding(trainer.mesh)
    placed = [{k: jax.device_put(v, place) for k, v in b.items()} for b in batches]
    state, losses, times = init(), [], []
    for batch in placed:
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        losses.append(float(metrics["loss"]))  # waits for the step
        times.append(time.perf_counter() - start)
    point = {
        "fsdp": fsdp,
        "mesh": dict(trainer.mesh.shape),
        "parameters": sum(x.size for x in jax.tree.leaves(abstract.params)),
        "state_bytes_per_device": state_bytes_per_device(abstract),
        "argument_bytes": memory.argument_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "step_seconds": statistics.median(times[1 : 1 + REPEATS]),
    }
    return point, losses


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:.1f}"


def report(results: dict) -> str:
    """The results as a Markdown table."""
    points = results["points"]
    base = points[0]
    lines = [
        f"# FSDP on {NUM_DEVICES} simulated devices: {results['model']}",
        "",
        f"{base['parameters'] / 1e6:.1f}M parameters, AdamW, global batch {results['global_batch']}; "
        f"load average before: {results['load_average']}.",
        "",
        "| fsdp | mesh | state / device (MiB) | ÷ fsdp = 1 | XLA arguments (MiB) | XLA temporaries (MiB) "
        "| step (s) | ÷ fsdp = 1 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p['fsdp']} | {p['mesh']['data']} x {p['mesh']['fsdp']} | {_mib(p['state_bytes_per_device'])} | "
            f"{p['state_bytes_per_device'] / base['state_bytes_per_device']:.3f} | {_mib(p['argument_bytes'])} | "
            f"{_mib(p['temp_bytes'])} | {p['step_seconds']:.3f} | {p['step_seconds'] / base['step_seconds']:.2f} |"
        )
    same = results["same_losses"]
    lines += [
        "",
        f"{same['steps']} steps on the same random batches, fsdp = 1 vs 4: largest relative loss "
        f"difference {same['max_relative_difference']:.2e} (losses {same['first_loss']:.4f} → "
        f"{same['last_loss']:.4f}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default config's tiny towers")
    parser.add_argument("--steps", type=int, default=20, help="steps of the fsdp = 1 vs 4 comparison")
    args = parser.parse_args(argv)
    from contrastive_jax.simulated_devices import simulate_cpu_devices

    simulate_cpu_devices(NUM_DEVICES)
    import os

    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training.run_plan import data_settings

    config = bench_config(args.quick)
    load = os.getloadavg()[0]
    element_spec = input_pipeline.train_dataset(data_settings(config)).element_spec
    count = max(args.steps, 1 + REPEATS)
    batches = random_batches(element_spec, config.train.global_batch_size, count)
    points, losses = [], {}
    for fsdp in FSDP_SIZES:
        point, losses[fsdp] = run_point(config, fsdp, batches if fsdp in (1, 4) else batches[: 1 + REPEATS])
        points.append(point)
        print(json.dumps(point), flush=True)
    differences = [abs(a - b) / abs(a) for a, b in zip(losses[1][: args.steps], losses[4][: args.steps], strict=True)]
    results = {
        "model": "default MLP towers" if args.quick else "clip_shapes, ViT-S/8 image tower, 384-wide text Transformer",
        "global_batch": config.train.global_batch_size,
        "load_average": round(load, 2),
        "points": points,
        "same_losses": {
            "steps": args.steps,
            "max_relative_difference": max(differences),
            "first_loss": losses[1][0],
            "last_loss": losses[1][args.steps - 1],
        },
    }
    text = report(results)
    print(text)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (RESULTS / "results.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
