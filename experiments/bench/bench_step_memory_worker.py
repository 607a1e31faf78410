"""One variant of ``bench_step_memory.py``, in the fresh process that compiles it.

``bench_step_memory`` starts ``python -m experiments.bench.bench_step_memory --worker SPEC``
per variant, with ``XLA_FLAGS`` dumping the optimized HLO and its buffers' live ranges to
``spec["dump"]``; ``run_worker(spec)`` compiles the project's ViT-B/16 train step (the
benchmark's open_clip checkpoint and records, ``bench_step_worker.finetune_config``: AdamW,
the global-batch CLIP loss streamed) at ``spec["batch"]``, ``spec["dtype"]`` activations and
``spec["remat"]``, compiles nothing else, and returns:

* ``memory``: XLA's ``memory_analysis()`` (argument, output, alias, temp bytes) and
  ``memory_fit.needed_bytes``;
* ``peak``: the values live at the compiled step's peak (``bench_step_memory_hlo``), summed
  by kind and per Transformer block, and the largest groups by kind, dtype and shape;
* ``residuals``: what JAX's autodiff keeps for the towers' backward pass (the leaves of
  ``jax.vjp``'s closure, traced abstractly: no compiler, no scheduler), the parameters apart.

``spec["keep"]`` undoes fixes, to measure what each saved: "activation", the MLP's
activation differentiated as written (``transformer.ACTIVATIONS`` not checkpointed);
"layer_norm", Flax's LayerNorm differentiated as written (``transformer.LayerNorm`` not
rematerialised). Both: the towers as of commit f875b18.
"""

from __future__ import annotations

import collections
import math
import pathlib

from experiments.bench import bench_step_memory_hlo as hlo
from experiments.bench.bench_step_worker import finetune_config

# How many of the largest (kind, dtype, shape) groups a variant reports.
LARGEST_GROUPS = 15


def _undo(fixes: list[str]) -> None:
    """The towers without `fixes` ("activation", "layer_norm"), in this process."""
    import flax.linen as nn
    import jax

    from contrastive_jax.models import transformer

    if "activation" in fixes:  # as they were before being checkpointed
        transformer.ACTIVATIONS.update(
            {
                "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
                "gelu": lambda x: nn.gelu(x, approximate=False),
                "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
            }
        )
    if "layer_norm" in fixes:
        transformer.LayerNorm = nn.LayerNorm


def _trainer(spec: dict):
    """`(trainer, abstract state, element_spec)` of the step `spec` describes."""
    from contrastive_jax import sharding
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import run_plan

    _undo(spec.get("keep", []))
    fields = {"model.compute_dtype": spec["dtype"], "model.attention": "xla"}
    config = finetune_config(spec, spec["batch"], **fields)
    trainer = run_plan.build(config, sharding.make_mesh()).trainer
    element_spec = input_pipeline.train_dataset(run_plan.data_settings(config)).element_spec
    _, abstract = trainer.init_state(element_spec)
    return trainer, abstract, element_spec


def residuals(trainer, abstract, element_spec) -> dict:
    """What autodiff keeps for the towers' backward pass at the step's batch: bytes of the
    `jax.vjp` closure's leaves that are not parameters, in all and the largest groups by
    dtype and shape (as the step runs the towers: training mode, dropout drawn)."""
    import jax

    batch = {
        k: jax.ShapeDtypeStruct((trainer.global_batch_size, *v.shape[1:]), v.dtype)
        for k, v in element_spec.items()
        if k in ("a", "b")
    }

    def towers(params, batch):
        outputs, _ = abstract.apply_fn(
            {"params": params, "batch_stats": abstract.batch_stats},
            batch["a"],
            batch.get("b"),
            train=True,
            rngs={"dropout": jax.random.key(0)},
            mutable=["batch_stats"],
        )
        return outputs["za"], outputs["zb"]

    closure = jax.eval_shape(lambda p, b: jax.vjp(lambda q: towers(q, b), p)[1], abstract.params, batch)
    params = {(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(abstract.params)}
    groups = collections.Counter()
    for leaf in jax.tree.leaves(closure):
        if (leaf.shape, leaf.dtype) not in params:
            groups[(str(leaf.dtype), tuple(leaf.shape))] += math.prod(leaf.shape) * leaf.dtype.itemsize
    largest = [
        {"dtype": dtype, "shape": list(shape), "bytes": size}
        for (dtype, shape), size in groups.most_common(LARGEST_GROUPS)
    ]
    return {"bytes": sum(groups.values()), "largest": largest}


def run_worker(spec: dict) -> dict:
    """Compiles the variant `spec` describes; its memory, its peak's buffers, its residuals."""
    import jax

    from contrastive_jax.training import memory_fit

    jax.config.update("jax_enable_compilation_cache", False)  # an executable from the cache dumps no live ranges

    trainer, abstract, element_spec = _trainer(spec)
    compiled = trainer.compile_step(abstract, element_spec)
    m = compiled.memory_analysis()
    memory = {
        "argument": m.argument_size_in_bytes,
        "output": m.output_size_in_bytes,
        "alias": m.alias_size_in_bytes,
        "temp": m.temp_size_in_bytes,
        "needed": memory_fit.needed_bytes(compiled),
    }
    hlo_file, live_file = hlo.dump_files(pathlib.Path(spec["dump"]))
    rows = hlo.peak_buffers(hlo_file.read_text(), live_file.read_text())
    blocks = collections.Counter()
    for row in rows:
        if row["block"]:
            blocks[row["block"]] += row["bytes"]
    peak = {
        "bytes": sum(row["bytes"] for row in rows),
        "by_kind": hlo.by_kind(rows),
        "by_block": dict(sorted(blocks.items(), key=lambda kv: (kv[0].split()[0], int(kv[0].split()[1])))),
        "largest": hlo.grouped(rows)[:LARGEST_GROUPS],
    }
    return {"memory": memory, "peak": peak, "residuals": residuals(trainer, abstract, element_spec)}
