"""Patch dropout (FLIP): what dropping 0, 50 and 75% of the patches saves in the image
tower's train step -- a ViT-B/16 at 224 px (196 patches), its projection to 512, the CLIP
loss against fixed text embeddings, AdamW, bfloat16 activations -- measured side by side
in one run.

    python -m experiments.bench.bench_patch_dropout                # timing and memory (a quiet machine)
    python -m experiments.bench.bench_patch_dropout --memory-only  # compiled memory alone (any load)
    python -m experiments.bench.bench_patch_dropout --tiny         # toy sizes on a CPU (a test)

For each rate: the step's median seconds (the rates' steps called in turns, so that a
change of load hits them alike: `bench_grad_cache.time_in_turns`), its compiled memory
per device (`memory_fit.needed_bytes`, XLA's `memory_analysis`, independent of the load)
at `--batch` and half of it, and the largest batch that fits `--memory-gib` (memory is
affine in the batch: `bench_step_worker.largest_batch`), each as a ratio to rate 0. The
goals (issue 54): at 0.5, step time <= 0.6x and the largest batch >= 1.7x. Writes
`results.json` and `results.md` to `--out` (default
`experiments/results/bench_patch_dropout/`; `runs/bench_patch_dropout_tiny/` with `--tiny`).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS

RESULTS = ALL_RESULTS / "bench_patch_dropout"
RATES = (0.0, 0.5, 0.75)
# ViT-B/16 at 224 px (width, depth, heads, MLP, patch, image), or a toy one.
FULL = {"vit": (768, 12, 12, 3072, 16), "image_size": 224, "embed_dim": 512}
TINY = {"vit": (32, 2, 2, 64, 4), "image_size": 16, "embed_dim": 16}
H100_GIB = 78.0  # an H100's memory as JAX's allocator sees it


def image_step(sizes: dict, rate: float, batch: int, seed: int = 0):
    """`(step, state, inputs)`: the jitted train step of the image tower at `rate`
    (`step(state, inputs) -> (state, loss)`), its initial state and a random batch."""
    import jax
    import jax.numpy as jnp
    import optax

    from contrastive_jax import losses
    from contrastive_jax.models import encoders, patch_dropout, two_tower

    width, depth, heads, mlp, patch = sizes["vit"]
    vit = encoders.ViT(width, depth, heads, mlp, patch, dtype=jnp.bfloat16)
    head = two_tower.ProjectionHead((), sizes["embed_dim"], jnp.bfloat16)
    model = two_tower.TwoTower(vit, head, patch_dropout=patch_dropout.PatchDropout(rate))
    images = jax.random.uniform(jax.random.key(seed), (batch, sizes["image_size"], sizes["image_size"], 3))
    texts = jax.random.normal(jax.random.key(seed + 1), (batch, sizes["embed_dim"]))
    texts = texts / jnp.linalg.norm(texts, axis=-1, keepdims=True)
    params = model.init(jax.random.key(seed), images[:1])["params"]
    tx = optax.adamw(1e-4, weight_decay=0.05)

    def step(state, inputs):
        params, opt_state, count = state
        keys = patch_dropout.row_keys(seed, count, inputs["a"].shape[0])

        def loss_fn(p):
            out = model.apply({"params": p}, inputs["a"], train=True, patch_keys=keys)
            return losses.clip_loss(out["za"], inputs["b"], temperature=out["temperature"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, count + 1), loss

    state = (params, tx.init(params), jnp.zeros((), jnp.int32))
    return jax.jit(step, donate_argnums=0), state, {"a": images, "b": texts}


def compiled_bytes(sizes: dict, rate: float, batch: int) -> int:
    """The step's compiled memory per device at `batch` (compiled, not run)."""
    from contrastive_jax.training import memory_fit

    step, state, inputs = image_step(sizes, rate, batch)
    return memory_fit.needed_bytes(step.lower(state, inputs).compile())


def memory(sizes: dict, batch: int, budget_gib: float) -> dict:
    """Per rate: compiled bytes at `batch` and `batch // 2`, and the largest batch (a
    multiple of 8) whose memory fits `budget_gib`."""
    from experiments.bench.bench_step_worker import largest_batch

    out = {}
    for rate in RATES:
        full, half = compiled_bytes(sizes, rate, batch), compiled_bytes(sizes, rate, batch // 2)
        largest = largest_batch(full, half, batch, int(budget_gib * 2**30))
        out[str(rate)] = {"bytes": full, "bytes_half_batch": half, "largest_batch": largest}
    return out


def timing(sizes: dict, batch: int, repeats: int) -> dict:
    """Per rate: the median seconds of a step at `batch`, the rates called in turns after
    a warm-up round, each step compiled before (its compile is not timed)."""
    import jax

    from experiments.bench.bench_grad_cache import time_in_turns

    calls = {}
    for rate in RATES:
        step, state, inputs = image_step(sizes, rate, batch)
        step = step.lower(state, inputs).compile()
        holder = {"state": state}

        def call(step=step, holder=holder, inputs=inputs):
            holder["state"], loss = step(holder["state"], inputs)
            return jax.block_until_ready(loss)

        calls[str(rate)] = call
    seconds = time_in_turns(calls, repeats=repeats, budget_s=math.inf)  # a warm-up round, however long
    return {rate: {"step_seconds": value} for rate, value in seconds.items()}


def with_ratios(results: dict) -> dict:
    """Each rate's step time, memory and largest batch as a ratio to rate 0's."""
    base = results["rates"]["0.0"]
    for values in results["rates"].values():
        for name in ("step_seconds", "bytes", "largest_batch"):
            if name in values and name in base:
                values[f"{name}_ratio"] = values[name] / base[name]
    return results


def report(results: dict) -> str:
    """`results.md`: a row per rate, the goals at 0.5 and the conditions."""
    lines = [
        "# Patch dropout: the image tower's train step",
        "",
        f"{results['model']}, batch {results['batch']} ({results['device']}); largest batch within "
        f"{results['budget_gib']} GiB from the compiled memory at two batches.",
        *(["Memory only (`--memory-only`): not timed."] if "step_seconds" not in results["rates"]["0.0"] else []),
        "",
        "| rate | patches kept | step (s) | x rate 0 | memory (GiB) | x rate 0 | largest batch | x rate 0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rate, v in results["rates"].items():
        cells = [rate, str(v["patches_kept"])]
        for name, scale in (("step_seconds", 1), ("bytes", 2**30), ("largest_batch", 1)):
            value = v.get(name)
            cells += ["-", "-"] if value is None else [f"{value / scale:.4g}", f"{v[f'{name}_ratio']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    goals = results["rates"].get("0.5", {})
    measured = {
        k: "not measured" if k not in goals else f"{goals[k]:.2f}x"
        for k in ("step_seconds_ratio", "largest_batch_ratio")
    }
    lines += [
        "",
        f"Goals at 0.5: step time <= 0.6x (measured: {measured['step_seconds_ratio']}), "
        f"largest batch >= 1.7x (measured: {measured['largest_batch_ratio']}).",
    ]
    return "\n".join(lines) + "\n"


def run(sizes: dict, *, batch: int, repeats: int, budget_gib: float, memory_only: bool) -> dict:
    """Every measurement, as `results.json` holds it."""
    import jax

    from contrastive_jax.models import patch_dropout

    patches = (sizes["image_size"] // sizes["vit"][4]) ** 2
    rates = {str(r): {"patches_kept": patch_dropout.num_kept(patches, r) if r else patches} for r in RATES}
    for rate, values in memory(sizes, batch, budget_gib).items():
        rates[rate].update(values)
    if not memory_only:
        for rate, values in timing(sizes, batch, repeats).items():
            rates[rate].update(values)
    model = "ViT-%d/%d (width %d, depth %d)" % (sizes["image_size"], sizes["vit"][4], *sizes["vit"][:2])
    device = f"{jax.devices()[0].device_kind}, {platform.node()}"
    return with_ratios({"model": model, "batch": batch, "budget_gib": budget_gib, "device": device, "rates": rates})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a test)")
    parser.add_argument("--memory-only", action="store_true", help="compiled memory alone, no timing")
    parser.add_argument("--batch", type=int, default=None, help="global batch (default 64; 8 with --tiny)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per rate (default 5; 2 with --tiny)")
    parser.add_argument("--memory-gib", type=float, default=H100_GIB, help="the budget of the largest batch")
    parser.add_argument("--out", default=None, help="the results' folder")
    args = parser.parse_args(argv)
    sizes = TINY if args.tiny else FULL
    out = pathlib.Path(args.out or (REPO / "runs" / "bench_patch_dropout_tiny" if args.tiny else RESULTS))
    batch, repeats = args.batch or (8 if args.tiny else 64), args.repeats or (2 if args.tiny else 5)
    budget = 0.01 if args.tiny and args.memory_gib == H100_GIB else args.memory_gib
    results = run(sizes, batch=batch, repeats=repeats, budget_gib=budget, memory_only=args.memory_only)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
