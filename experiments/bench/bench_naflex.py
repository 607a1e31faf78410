"""NaFlex (SigLIP 2): what the NaFlex image tower costs against the fixed-size one at the
same width -- each image at its aspect ratio padded to a budget of 256 or 576 tokens
(`models.naflex.ImageTower`), against square images of 224 px (196 patches), 256 px (256,
the same tokens as budget 256) and 384 px (576) (`big_vision_layout.ImageTower`) -- in
the image tower's train step: the MAP-pooled embedding, the CLIP loss against fixed text
embeddings, its gradient, on this machine's backend.

    python -m experiments.bench.bench_naflex          # a small ViT on the CPU (~2 minutes)
    python -m experiments.bench.bench_naflex --tiny   # toy sizes (a test)

For each tower: its compiled memory (`memory_fit.needed_bytes`: XLA's `memory_analysis`,
exact, independent of the load) and the step's median seconds (the towers called in
turns after a warm-up round, so that a change of load hits them alike:
`bench_grad_cache.time_in_turns`), each also as a ratio to the fixed tower of the same
tokens. The load average before and after is recorded: the machine may be shared. Writes
`results.json` and `results.md` to `--out` (default `experiments/results/bench_naflex/`;
`runs/bench_naflex_tiny/` with `--tiny`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS

RESULTS = ALL_RESULTS / "bench_naflex"
# (name, kind, tokens): "fixed" square images of sqrt(tokens) patches a side, "naflex" a budget.
TOWERS = (
    ("fixed_224px", "fixed", 196),
    ("fixed_256px", "fixed", 256),
    ("naflex_256", "naflex", 256),
    ("fixed_384px", "fixed", 576),
    ("naflex_576", "naflex", 576),
)
# A small ViT/16 (width, depth, heads, MLP, patch; SigLIP's MAP head) with a 16 x 16 position grid, or a toy one.
SMALL = {"vit": (192, 6, 3, 768, 16), "grid": 16, "embed_dim": 192}
TINY = {"vit": (32, 2, 2, 64, 4), "grid": 4, "embed_dim": 32, "scale": 1 / 16}
# Images' (height, width) in the batch, in turns: NaFlex fits each into the budget at its aspect ratio.
ASPECTS = ((480, 640), (640, 480), (512, 512), (300, 900), (1024, 576), (375, 500), (800, 600), (400, 1200))


def _settings(sizes: dict):
    """The big_vision settings both towers read (the text tower's, unused, the image's)."""
    from contrastive_jax.models.released import siglip2_layout
    from contrastive_jax.models.transformer import TowerSettings

    width, depth, heads, mlp, patch = sizes["vit"]
    tower = TowerSettings(width, depth, heads, mlp)
    grid = sizes["grid"]
    return siglip2_layout.Settings(grid * patch, patch, tower, 16, 100, tower, width, position_grid=grid)


def _images(sizes: dict, kind: str, tokens: int, batch: int):
    """A batch of the tower's inputs: uint8 squares [B, S, S, 3], or packed NaFlex images
    [B, 1 + tokens, P * P * 3] of `ASPECTS` (scaled by `sizes["scale"]` at toy sizes)."""
    import numpy as np
    from PIL import Image

    from contrastive_jax.data import naflex_images

    rng = np.random.default_rng(0)
    patch = sizes["vit"][4]
    if kind == "fixed":
        side = math.isqrt(tokens) * patch
        return rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8)
    packed = []
    for index in range(batch):
        height, width = (max(8, round(s * sizes.get("scale", 1.0))) for s in ASPECTS[index % len(ASPECTS)])
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        packed.append(naflex_images.packed_image(image, patch, tokens))
    return np.stack(packed)


def tower_step(sizes: dict, kind: str, tokens: int, batch: int):
    """`(step, params, inputs)`: the jitted `step(params, inputs) -> (loss, grads)` of the
    image tower `kind` at `tokens`, its parameters and a batch (`inputs["b"]` fixed text
    embeddings)."""
    import jax
    import jax.numpy as jnp

    from contrastive_jax import losses
    from contrastive_jax.models import naflex
    from contrastive_jax.models.released import big_vision_layout

    settings = _settings(sizes)
    tower = naflex.ImageTower(settings) if kind == "naflex" else big_vision_layout.ImageTower(settings)
    images = jnp.asarray(_images(sizes, kind, tokens, batch))
    texts = losses.l2_normalize(jax.random.normal(jax.random.key(1), (batch, sizes["embed_dim"])))

    def pixels(x):  # the fixed tower's inputs in [-1, 1], as big_vision_layout.Model gives them
        return x if kind == "naflex" else x.astype(jnp.float32) / 127.5 - 1.0

    params = tower.init(jax.random.key(0), pixels(images[:1]))["params"]

    def step(params, inputs):
        def loss_fn(p):
            z = losses.l2_normalize(tower.apply({"params": p}, pixels(inputs["a"])))
            return losses.clip_loss(z, inputs["b"], temperature=0.07)

        return jax.value_and_grad(loss_fn)(params)

    return jax.jit(step), params, {"a": images, "b": texts}


def measure(sizes: dict, batch: int, repeats: int) -> dict:
    """Per tower: its tokens, compiled bytes and median step seconds."""
    import jax

    from contrastive_jax.training import memory_fit
    from experiments.bench.bench_grad_cache import time_in_turns

    out, calls = {}, {}
    for name, kind, tokens in TOWERS:
        step, params, inputs = tower_step(sizes, kind, tokens, batch)
        compiled = step.lower(params, inputs).compile()
        out[name] = {"kind": kind, "tokens": tokens, "bytes": memory_fit.needed_bytes(compiled)}

        def call(compiled=compiled, params=params, inputs=inputs):
            return jax.block_until_ready(compiled(params, inputs))

        calls[name] = call
    for name, seconds in time_in_turns(calls, repeats=repeats, budget_s=math.inf).items():
        out[name]["step_seconds"] = seconds
    return out


def with_ratios(towers: dict) -> dict:
    """Each NaFlex tower's bytes and seconds as ratios to the fixed tower of its tokens."""
    fixed = {v["tokens"]: v for v in towers.values() if v["kind"] == "fixed"}
    for values in towers.values():
        base = fixed.get(values["tokens"])
        if values["kind"] == "naflex" and base is not None:
            for name in ("bytes", "step_seconds"):
                values[f"{name}_vs_fixed"] = values[name] / base[name]
    return towers


def report(results: dict) -> str:
    """`results.md`: a row per tower and the conditions."""
    lines = [
        "# NaFlex against the fixed-size image tower: the tower's train step",
        "",
        f"{results['model']}, batch {results['batch']}, {results['device']}; load average "
        f"{results['load_before']} before, {results['load_after']} after (a shared machine: the times are "
        "taken in turns, the memory is exact).",
        "",
        "| tower | tokens | memory (MiB) | x fixed, same tokens | step (s) | x fixed, same tokens |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in results["towers"].items():
        ratios = [f"{v[k]:.3f}" if k in v else "-" for k in ("bytes_vs_fixed", "step_seconds_vs_fixed")]
        cells = [name, str(v["tokens"]), f"{v['bytes'] / 2**20:.1f}", ratios[0], f"{v['step_seconds']:.3f}", ratios[1]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a test)")
    parser.add_argument("--batch", type=int, default=None, help="images a step (default 8; 4 with --tiny)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per tower (default 3; 1 with --tiny)")
    parser.add_argument("--out", default=None, help="the results' folder")
    args = parser.parse_args(argv)
    import jax

    sizes = TINY if args.tiny else SMALL
    out = pathlib.Path(args.out or (REPO / "runs" / "bench_naflex_tiny" if args.tiny else RESULTS))
    batch, repeats = args.batch or (4 if args.tiny else 8), args.repeats or (1 if args.tiny else 3)
    load_before = [round(x, 2) for x in os.getloadavg()]
    towers = with_ratios(measure(sizes, batch, repeats))
    width, depth, heads, mlp, patch = sizes["vit"]
    results = {
        "model": f"ViT/{patch} width {width}, depth {depth}, {heads} heads, MLP {mlp}, MAP head",
        "batch": batch,
        "device": f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores, {platform.node()}",
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "towers": towers,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
