"""Gradient replicates at a checkpoint, for the replicate noise scale
(`contrastive_jax.training.noise_scale.compare`): `count` gradients of the global-batch
loss, each of its own global batch (its own negatives; with extra negatives, its own
extra rows), at one saved state of a run;
and that state at a step the run did not keep (`replayed`).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from contrastive_jax.config_lib import override


def gradients(
    config, workdir: str, n: int, count: int, *, step: int | None = None, start_step: int = 0, queries: int = 0
) -> tuple[list[Any], Any]:
    """`(grads, state)`: `count` gradients of the global-batch loss at the checkpoint of
    `step` in `workdir` (None: the newest), each of an independent global batch of `n`
    examples (steps `start_step`, `start_step + 1`, ... of a stream of that batch size:
    disjoint examples within an epoch, each batch its own negatives), and that state.
    With `config.loss.extra_negatives` M, each batch reads n + M examples, the last M / d
    of each device's rows embedded without gradient (`training.forward`, as the
    trainer does): the gradient is the n rows' loss against all n + M columns. With
    `queries` q (0: n), only the first q / d of each device's n / d gradient rows are the
    loss's queries; every row stays a column, the n gradient rows with their gradient:
    the gradient of q examples' losses against the batch's own columns."""
    import jax

    from contrastive_jax import run_dir, sharding
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import checkpoint, forward, run_plan

    plan = run_plan.build(override(config, {"train.global_batch_size": n, "train.micro_batch_size": 0}))
    run = plan.trainer
    stream = input_pipeline.train_dataset(plan.data, start_step=start_step)
    _, abstract = run.init_state(stream.element_spec)
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, run_dir.CHECKPOINTS), max_to_keep=1_000)
    try:
        state = ckpt.restore_state(ckpt.latest_step() if step is None else step, abstract)
    finally:
        ckpt.close()

    shards, extra_rows = sharding.batch_shards(run.mesh), run.loss_settings.extra_negatives
    others = (n - queries) // shards if queries else 0  # each shard's gradient rows that are no query

    def embed(params, inputs):
        variables = {"params": params, "batch_stats": state.batch_stats}
        outputs = state.apply_fn(variables, inputs["a"], inputs.get("b"), train=False)
        return {k: v for k, v in outputs.items() if k in forward.BATCHED_OUTPUTS}, outputs

    def fewer_queries(rows: dict) -> dict:
        """The last `others` of each shard's gradient rows moved to the front of its extra rows."""
        if not others:
            return rows
        extra = rows.pop("extra", None)
        for name in list(rows):
            rows[name], moved = forward.split_rows(rows[name], shards, others)
            joined = moved if extra is None else forward.join_rows(moved, extra[name], shards)
            rows.setdefault("extra", {})[name] = joined
        return rows

    def loss(params, batch):
        batch = forward.layout(batch, extra_rows=extra_rows, num_shards=shards, patch_seed=None, step=0)
        batched, outputs = embed(params, batch)
        if "extra" in batch:  # the parameters stopped: no gradient through the extra rows
            batched["extra"], _ = embed(jax.lax.stop_gradient(params), batch["extra"])
        shared = {k: v for k, v in outputs.items() if k not in forward.BATCHED_OUTPUTS}
        batched, data = fewer_queries(batched), fewer_queries(run.loss_data(batch))
        return run.global_loss(batched, shared, data, state.loss_state, state.step)[0]

    grad = jax.jit(jax.grad(loss))
    grads = []
    for batch, _ in zip(stream, range(count), strict=False):
        batch = jax.device_put(dict(batch), sharding.data_sharding(run.mesh))
        grads.append(jax.device_get(grad(state.params, batch)))
    return grads, state


def kept_steps(workdir: str) -> list[int]:
    """The steps of the checkpoints a run kept in `workdir`, oldest first."""
    from contrastive_jax import run_dir
    from contrastive_jax.training import checkpoint

    ckpt = checkpoint.Checkpointer(os.path.join(workdir, run_dir.CHECKPOINTS), max_to_keep=1_000)
    try:
        return list(ckpt.steps())
    finally:
        ckpt.close()


def replayed(config, workdir: str, step: int, scratch: str) -> str:
    """A workdir holding the checkpoint of `step` of the run of `config` in `workdir`:
    `workdir` itself where the run kept that step; else `scratch` (empty), into which the
    run's newest checkpoint before `step` is copied (none: the run's start) and trained on
    to `step` (`run_plan.train_and_evaluate`, as the run's own segments resume). Under a
    constant rate a step's state does not depend on where the run stopped, and the stream
    is seeded by position, so this is the run's own state at `step`.

    Raises:
      ValueError: `config`'s schedule depends on the run's length (not "constant").
    """
    from contrastive_jax import run_dir
    from contrastive_jax.training import run_plan

    if config.optim.schedule != "constant":
        raise ValueError(f"replaying needs config.optim.schedule='constant', not {config.optim.schedule!r}.")
    kept = kept_steps(workdir)
    if step in kept:
        return workdir
    if before := [s for s in kept if s < step]:
        name = os.path.join(run_dir.CHECKPOINTS, str(before[-1]))
        shutil.copytree(os.path.join(workdir, name), os.path.join(scratch, name))
    run_plan.train_and_evaluate(override(config, {"train.num_train_steps": step}), scratch)
    return scratch
