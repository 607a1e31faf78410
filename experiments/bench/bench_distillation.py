"""What distillation from a teacher costs beside the CLIP loss it is added to: the streamed
logit form (`losses.distill_clip_loss`) against the streamed `clip_loss` at the same N, D
and tiles, forward and backward (the student's gradients), on this machine's backend.

Run:  python -m experiments.bench.bench_distillation            (N = 65,536, D = 64: ~5 minutes on 2 CPU cores)
      python -m experiments.bench.bench_distillation --n 4096   (a quick check)

Both are compiled once; memory is XLA's `memory_analysis()` of each compiled function
(temporaries: what the loss holds beyond its inputs and outputs, exact), and also of the
dense distillation's where it fits in `--max-dense-gib` (its N x N logits and their
gradients). Time: the two run in alternating turns, the best of `--turns` for each, so
that load from other processes falls on both. Writes `results.json` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from experiments import RESULTS

DEFAULT_OUT = RESULTS / "bench_distillation"
TEMPERATURE, TEACHER_TEMPERATURE = 0.07, 0.05


def _inputs(n: int, d: int, teacher_d: int):
    """`(a, b, teacher_a, teacher_b)`: L2-normalised float32, pairs correlated."""
    import jax
    import jax.numpy as jnp

    from contrastive_jax import losses

    keys = jax.random.split(jax.random.key(0), 4)
    a = losses.l2_normalize(jax.random.normal(keys[0], (n, d)))
    b = losses.l2_normalize(a + 1.5 * jax.random.normal(keys[1], (n, d)))
    ta = losses.l2_normalize(jax.random.normal(keys[2], (n, teacher_d)))
    tb = losses.l2_normalize(ta + 1.0 * jax.random.normal(keys[3], (n, teacher_d)))
    return tuple(jnp.asarray(x) for x in (a, b, ta, tb))


def _compiled(chunk, inputs):
    """`{name: compiled value_and_grad over (a, b)}` of the CLIP and distillation losses,
    each taking all four `inputs` as arguments (a teacher closed over would be a constant
    that XLA folds at compile time)."""
    import jax

    from contrastive_jax import losses

    streaming = losses.Streaming(chunk_size=chunk)

    def clip(a, b, ta, tb):
        del ta, tb
        return losses.clip_loss(a, b, temperature=TEMPERATURE, streaming=streaming)

    def distill(a, b, ta, tb):
        return losses.distill_clip_loss(
            a, b, ta, tb, temperature=TEMPERATURE, teacher_temperature=TEACHER_TEMPERATURE, streaming=streaming
        )

    return {
        name: jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*inputs).compile()
        for name, fn in (("clip", clip), ("distill", distill))
    }


def _memory(compiled) -> dict:
    analysis = compiled.memory_analysis()
    temp = int(analysis.temp_size_in_bytes)
    return {"temp_bytes": temp, "temp_mib": round(temp / 2**20), "argument_bytes": int(analysis.argument_size_in_bytes)}


def run(n: int, d: int, teacher_d: int, chunk: int, turns: int, max_dense_gib: float) -> dict:
    """The figures of one run (see the module docstring)."""
    import jax

    inputs = _inputs(n, d, teacher_d)
    compiled = _compiled(chunk, inputs)
    result = {name: _memory(fn) for name, fn in compiled.items()}
    dense_bytes = 3 * 4 * n * n  # the two logit matrices and the gradient's, float32
    if dense_bytes <= max_dense_gib * 2**30:
        result["distill_dense"] = _memory(_compiled(None, inputs)["distill"])
    else:
        result["distill_dense"] = {"skipped": f"its N x N matrices need about {dense_bytes / 2**30:.0f} GiB"}
        result["distill_dense"]["gib"] = round(dense_bytes / 2**30)
    seconds = {name: [] for name in compiled}
    for _ in range(turns):
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*inputs))
            seconds[name].append(time.perf_counter() - start)
    for name in compiled:
        result[name] |= {"seconds": min(seconds[name]), "all_seconds": seconds[name]}
    result["ratios"] = {
        "temp_bytes": result["distill"]["temp_bytes"] / result["clip"]["temp_bytes"],
        "seconds": result["distill"]["seconds"] / result["clip"]["seconds"],
    }
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=65_536, help="the global batch N")
    parser.add_argument("--d", type=int, default=64, help="the student's width D")
    parser.add_argument("--teacher-d", type=int, default=64, help="the teacher's width D_t")
    parser.add_argument("--chunk", type=int, default=512, help="the tile edge (CPU's 'auto' at D = 64)")
    parser.add_argument("--turns", type=int, default=2, help="alternating timed turns; the best of each")
    parser.add_argument("--max-dense-gib", type=float, default=4.0, help="compile the dense form up to this size")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    import jax

    load_before = os.getloadavg()[0]
    result = run(args.n, args.d, args.teacher_d, args.chunk, args.turns, args.max_dense_gib)
    result |= {
        "command": f"python -m experiments.bench.bench_distillation --n {args.n} --d {args.d} --teacher-d "
        f"{args.teacher_d} --chunk {args.chunk} --turns {args.turns}",
        "n": args.n,
        "d": args.d,
        "teacher_d": args.teacher_d,
        "chunk": args.chunk,
        "platform": jax.devices()[0].platform,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "jax": jax.__version__,
        "load_1min": {"before": load_before, "after": os.getloadavg()[0]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratios"]))
    return result


if __name__ == "__main__":
    main()
