"""CoCa's cost beside CLIP's: the train step of `configs/coca_shapes.py` (CLIP's towers,
attention pooling, a 2-block captioning decoder, the caption term in the loss) against
`configs/clip_shapes.py`, both at their own sizes (ViT-Ti/8 at 64 px, a 4-block byte-level
text Transformer, 96-byte captions) and one global batch, on one CPU device.

    python -m experiments.bench.bench_coca           # the configs' sizes, batch 32
    python -m experiments.bench.bench_coca --tiny    # toy sizes (a test)

For each: the parameters, the compiled step's memory (`memory_fit.needed_bytes`, XLA's
`memory_analysis`: arguments, outputs, temporaries and code, less what is donated; its
temporaries apart) and its median seconds (the two steps called in turns so that a
change of load hits both: `bench_grad_cache.time_in_turns`), with CoCa's ratios to
CLIP's. Random pixels and bytes: the cost does not depend on them. Writes `results.json`
and `results.md` to `--out` (default `experiments/results/bench_coca/`).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform

from experiments import RESULTS as ALL_RESULTS

RESULTS = ALL_RESULTS / "bench_coca"
CONFIGS = ("clip_shapes", "coca_shapes")
# Toy sizes: 16 px pictures (4 patches), 16 bytes, a one-block text tower and decoder.
TINY = {
    "data.image_size": 16,
    "data.text_max_length": 16,
    "model.encoder_dim": 32,
    "model.text_num_layers": 1,
    "model.embed_dim": 32,
    "model.coca_queries": 5,
}


def built_step(name: str, batch: int, tiny: bool, data_dir: str | None):
    """`(compiled step, state, batch, parameters)` of config `name`'s train step at
    `batch`, on one device, with random inputs (the shapes' records, which the config
    checks, in `data_dir`, or written once where the config says)."""
    import jax
    import numpy as np

    from contrastive_jax import config_lib, sharding
    from contrastive_jax.training import run_plan

    fields = {
        "train.global_batch_size": batch,
        "data.num_workers": 0,
        "data.data_dir": data_dir,
        **(TINY if tiny else {}),
    }
    if name == "clip_shapes":
        fields.pop("model.coca_queries", None)
    config = config_lib.override(config_lib.load_config(name), fields)
    run_plan.write_builtin_records(config)  # the shapes, once: build writes nothing
    trainer = run_plan.build(config, sharding.make_mesh(1)).trainer
    size, length = config.data.image_size, config.data.text_max_length
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 257, (batch, length)).astype(np.int32)
    tokens[:, length // 2 :] = np.where(rng.random((batch, 1)) < 0.5, 0, tokens[:, length // 2 :])  # some padded
    inputs = {"a": rng.integers(0, 256, (batch, size, size, 3)).astype(np.uint8), "b": tokens}
    spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in inputs.items()}
    init, abstract = trainer.init_state(spec)
    inputs = jax.device_put(inputs, sharding.data_sharding(trainer.mesh))
    compiled = trainer.jit_train_step(abstract).lower(abstract, inputs).compile()
    state = jax.block_until_ready(init())
    parameters = sum(x.size for x in jax.tree.leaves(state.params))
    return compiled, state, inputs, parameters


def measure(batch: int, tiny: bool, repeats: int, data_dir: str | None = None) -> dict:
    """Each config's figures and CoCa's ratios to CLIP's."""
    import jax

    from contrastive_jax.training import memory_fit
    from experiments.bench.bench_grad_cache import time_in_turns

    steps, figures = {}, {}
    for name in CONFIGS:
        compiled, state, inputs, parameters = built_step(name, batch, tiny, data_dir)
        steps[name] = (compiled, [state], inputs)
        memory = compiled.memory_analysis()
        figures[name] = {
            "parameters": int(parameters),
            "bytes": int(memory_fit.needed_bytes(compiled)),
            "temp_bytes": int(memory.temp_size_in_bytes),
        }

    def call(name):
        compiled, state, inputs = steps[name]

        def step():
            state[0], metrics = compiled(state[0], inputs)
            figures[name]["loss"] = float(jax.block_until_ready(metrics["loss"]))

        return step

    seconds = time_in_turns({name: call(name) for name in CONFIGS}, repeats=repeats)
    for name in CONFIGS:
        figures[name]["step_seconds"] = seconds[name]
    clip, coca = figures["clip_shapes"], figures["coca_shapes"]
    ratios = {key: coca[key] / clip[key] for key in ("parameters", "bytes", "temp_bytes", "step_seconds")}
    return {"batch": batch, "tiny": tiny, "configs": figures, "coca_over_clip": ratios, "machine": platform.node()}


def report(results: dict) -> str:
    """The results as a markdown table."""
    lines = [
        f"# CoCa's train step beside CLIP's (batch {results['batch']}, one CPU device)",
        "",
        "| config | parameters | compiled memory | of it temporaries | step |",
        "|---|---|---|---|---|",
    ]
    for name, f in results["configs"].items():
        lines.append(
            f"| `{name}` | {f['parameters']:,} | {f['bytes'] / 2**20:,.1f} MiB | {f['temp_bytes'] / 2**20:,.1f} MiB "
            f"| {f['step_seconds']:.3f} s |"
        )
    r = results["coca_over_clip"]
    lines += [
        "",
        f"CoCa ÷ CLIP: parameters {r['parameters']:.2f}×, compiled memory {r['bytes']:.2f}×, "
        f"temporaries {r['temp_bytes']:.2f}×, step time {r['step_seconds']:.2f}×.",
        "",
        "Measured by `python -m experiments.bench.bench_coca` on a shared 2-core CPU (median of "
        "the steps called in turns; the memory is XLA's compiled figure, independent of the load).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="the global batch of both steps")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of the two steps")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a test)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="where results.json and results.md go")
    parser.add_argument("--data-dir", default=None, help="the shapes' records' directory (default: the config's)")
    args = parser.parse_args(argv)
    results = measure(args.batch, args.tiny, args.repeats, args.data_dir)
    assert all(math.isfinite(f["loss"]) for f in results["configs"].values())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
