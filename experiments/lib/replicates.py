"""Gradient replicates at a checkpoint, for the replicate noise scale
(`contrastive_jax.training.noise_scale.compare`): `count` gradients of the global-batch
loss, each of its own global batch (its own negatives; with extra negatives, its own
extra rows), at one saved state of a run;
and that state at a step the run did not keep (`replayed`).
"""

from __future__ import annotations

import dataclasses
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
    of each device's rows embedded without gradient (`negatives_apart.embed`, as the
    trainer does): the gradient is the n rows' loss against all n + M columns. With
    `queries` q (0: n), only the first q / d of each device's n / d gradient rows are the
    loss's queries; every row stays a column, the n gradient rows with their gradient:
    the gradient of q examples' losses against the batch's own columns."""
    import jax

    from contrastive_jax import run_dir, sharding
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import checkpoint, negatives_apart, run_plan, trainer

    plan = run_plan.build(override(config, {"train.global_batch_size": n, "train.micro_batch_size": 0}))
    run = plan.trainer
    stream = input_pipeline.train_dataset(plan.data, start_step=start_step)
    _, abstract = run.init_state(stream.element_spec)
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, run_dir.CHECKPOINTS), max_to_keep=1_000)
    try:
        state = ckpt.restore_state(ckpt.latest_step() if step is None else step, abstract)
    finally:
        ckpt.close()

    def forward(params, inputs, _):
        variables = {"params": params, "batch_stats": state.batch_stats}
        outputs = state.apply_fn(variables, inputs["a"], inputs.get("b"), train=False)
        batched = {k: v for k, v in outputs.items() if k in trainer.BATCHED_OUTPUTS}
        shared = {k: v for k, v in outputs.items() if k not in trainer.BATCHED_OUTPUTS}
        return batched, shared, {}

    # The loss with q queries: the rows past them counted with the extra rows (as queries, not in embed).
    settings = dataclasses.replace(run.loss_settings, extra_negatives=run.loss_settings.extra_negatives + n - queries)
    scored = dataclasses.replace(run, loss_settings=settings) if queries else run

    def loss(params, batch):
        batched, shared, _ = negatives_apart.embed(forward, params, batch, run.loss_settings, run.mesh)
        return scored.global_loss(batched, shared, run.loss_data(batch), state.loss_state, state.step)[0]

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
