"""The one forward of a train step: every row the loss reads, embedded in one place.

Beside its N pairs (`a`, optional `b`), a step's batch may bring rows of other kinds. Each
is embedded here, by the same `Forward`, in every gradient path (the whole batch,
gradient caching's two passes, the noise scale's per-device passes, every stage of a
batch schedule, sharded parameters), so that a feature never needs a path of its own:

- **hard negatives**, `negatives` [N, M, ...]: M inputs of the b side for each pair (the
  records' `negatives`), embedded by the b tower (`TwoTower.embed(..., "b")`, training,
  with the gradient: they are candidates of the loss like any b) into `hard_negatives`
  [N, M, D]. No patches are dropped from them and their BatchNorm statistics are not kept.
- **extra rows**, `config.loss.extra_negatives` = M: the stream reads N + M examples a
  step, the last M / d of each device's rows only negatives. `layout` puts them apart
  (`batch["extra"]`, every field with rows), and `Forward` embeds them with the parameters
  under `jax.lax.stop_gradient` (no backward pass is spent on them; dropout from their own
  key; their BatchNorm statistics not kept) into `extra` (`za`, `zb`, their
  `hard_negatives`). The loss takes the batch's rows as its queries and every row as a
  candidate (`losses.registry.pair_candidates`).
- **a momentum encoder's keys**: when the loss state holds the encoder's parameters
  (`ema_params`, MoCo's), the towers at those parameters, dropout off, no gradient:
  `key_za`, `key_zb` [N, D].
- **a teacher's embeddings** (distillation, `training.teacher`): the batch's pairs
  embedded by the frozen teacher at its variables (`TrainState.teacher`), dropout off, no
  gradient: `teacher_za`, `teacher_zb` [N, D_t] and its `teacher_temperature`. Not the
  extra rows': the distillation compares the batch's pairs.
- **patch dropout's keys**, `patch_keys` [N + M] (`patch_dropout.row_keys` of the global
  rows, added by `layout`), so that a row keeps the same patches whatever the devices
  and micro-batches; with `patch_dropout.until_step`, a `lax.cond` on the step drops
  them before it and keeps every patch from it on (FLIP's unmasked tuning).

Dropout keys: the batch's `fold_in(step key, micro_index)`, as without any of these; the
extra rows' and the hard negatives' fold `EXTRA_STREAM` and `NEGATIVES_STREAM` into it.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from contrastive_jax.models import patch_dropout

# Model outputs with rows (split over the mesh); the rest are replicated.
BATCHED_OUTPUTS = (
    *("za", "zb", "logits", "hard_negatives", "key_za", "key_zb", "extra"),
    *("teacher_za", "teacher_zb", "za_to_teacher", "zb_to_teacher", "caption_nll", "caption_tokens"),
)
# The dropout streams folded into a micro-batch's key for the extra rows and the hard negatives.
EXTRA_STREAM, NEGATIVES_STREAM = 1, 2


def split_rows(x: jax.Array, num_shards: int, last_rows: int) -> tuple[jax.Array, jax.Array]:
    """`x` [d (n + m), ...] into each shard's first n rows [d n, ...] and its last m =
    `last_rows` [d m, ...]."""
    blocks = x.reshape(num_shards, -1, *x.shape[1:])
    kept, extra = blocks[:, : blocks.shape[1] - last_rows], blocks[:, blocks.shape[1] - last_rows :]
    return tuple(b.reshape(-1, *x.shape[1:]) for b in (kept, extra))


def join_rows(first: jax.Array, last: jax.Array, num_shards: int) -> jax.Array:
    """`split_rows`' inverse: each shard's rows of `first`, then its rows of `last`."""
    blocks = [v.reshape(num_shards, -1, *v.shape[1:]) for v in (first, last)]
    return jnp.concatenate(blocks, axis=1).reshape(-1, *first.shape[1:])


def layout(
    batch: dict[str, jax.Array], *, extra_rows: int, num_shards: int, patch_seed: int | None, step
) -> dict[str, jax.Array]:
    """The step's batch as `Forward` takes it: with `patch_keys` [rows] of the global rows at
    `step` (`patch_dropout.row_keys`; `patch_seed` None: no patches dropped), and the last
    `extra_rows / num_shards` rows of each shard apart, every field with rows, in
    `batch["extra"]` (`extra_rows` M over all shards; 0: none)."""
    rows = batch["a"].shape[0]
    if patch_seed is not None:
        batch = dict(batch, patch_keys=patch_dropout.row_keys(patch_seed, step, rows))
    if not extra_rows:
        return batch
    parts = {k: split_rows(v, num_shards, extra_rows // num_shards) for k, v in batch.items() if v.shape[:1] == (rows,)}
    return {**batch, **{k: v[0] for k, v in parts.items()}, "extra": {k: v[1] for k, v in parts.items()}}


@dataclasses.dataclass(frozen=True)
class Forward:
    """`forward(params, inputs, micro_index) -> (batched, shared, updates)`: every row of
    `inputs` (a batch as `layout` leaves it, or a micro-batch of one) embedded, training.

    Attributes:
      apply_fn: the model's `apply` (`TrainState.apply_fn`).
      batch_stats: the model's BatchNorm statistics (`{}` without).
      rng: the step's dropout key.
      key_params: a momentum encoder's parameters (`key_za`, `key_zb`), or None.
      drop_patches: whether this step drops patches (a traced bool before and after
        `patch_dropout.until_step`; True: wherever `inputs` hold `patch_keys`).
      teacher_apply: a distillation teacher's `apply` (`teacher.Teacher.model`), or None.
      teacher_variables: its variables (`TrainState.teacher`).
    """

    apply_fn: Callable
    batch_stats: Any
    rng: jax.Array
    key_params: Any = None
    drop_patches: Any = True
    teacher_apply: Callable | None = None
    teacher_variables: Any = None

    def __call__(self, params, inputs: dict[str, Any], micro_index) -> tuple[dict, dict, dict]:
        rng = jax.random.fold_in(self.rng, micro_index)
        batched, shared, updates = self._embed(params, inputs, rng)
        if self.teacher_apply is not None:
            taught = self.teacher_apply(self.teacher_variables, inputs["a"], inputs["b"], train=False)
            taught = jax.lax.stop_gradient(taught)
            batched.update(teacher_za=taught["za"], teacher_zb=taught["zb"])
            shared["teacher_temperature"] = taught["temperature"]
        if "extra" in inputs:
            # The parameters stopped, not the outputs: no tangent enters the pass, none is kept.
            extra_rng = jax.random.fold_in(rng, EXTRA_STREAM)
            batched["extra"], _, _ = self._embed(jax.lax.stop_gradient(params), inputs["extra"], extra_rng)
        return batched, shared, updates

    def _embed(self, params, inputs: dict[str, Any], rng) -> tuple[dict, dict, dict]:
        """The towers on `a`, `b`; the b tower on `negatives`; the momentum encoder's keys."""
        variables = {"params": params, "batch_stats": self.batch_stats}

        def towers(patch_keys):
            return self.apply_fn(
                variables,
                inputs["a"],
                inputs.get("b"),
                train=True,
                rngs={"dropout": rng},
                mutable=["batch_stats"],
                patch_keys=patch_keys,
            )

        keys = inputs.get("patch_keys")
        if keys is None or self.drop_patches is True:
            outputs, updates = towers(keys)
        else:
            outputs, updates = jax.lax.cond(self.drop_patches, towers, lambda _: towers(None), keys)
        batched = {k: v for k, v in outputs.items() if k in BATCHED_OUTPUTS}
        shared = {k: v for k, v in outputs.items() if k not in BATCHED_OUTPUTS}
        negatives = inputs.get("negatives")
        if negatives is not None and negatives.shape[1]:
            rows, count = negatives.shape[:2]
            z, _ = self.apply_fn(
                variables,
                negatives.reshape(rows * count, *negatives.shape[2:]),
                "b",
                train=True,
                rngs={"dropout": jax.random.fold_in(rng, NEGATIVES_STREAM)},
                mutable=["batch_stats"],
                method="embed",
            )
            batched["hard_negatives"] = z.reshape(rows, count, -1)
        if self.key_params is not None:
            key_variables = {"params": self.key_params, "batch_stats": self.batch_stats}
            key_outputs = self.apply_fn(key_variables, inputs["a"], inputs.get("b"), train=False)
            batched["key_za"] = jax.lax.stop_gradient(key_outputs["za"])
            batched["key_zb"] = jax.lax.stop_gradient(key_outputs["zb"])
        return batched, shared, updates


def of_step(
    state, batch: dict[str, jax.Array], model, *, seed: int, extra_rows: int, num_shards: int, key_params, teacher=None
):
    """`(Forward, batch)` of a train step at `state` (a `TrainState`): the step's dropout
    key, its patches dropped or not (`model.patch_dropout`), the batch laid out (`layout`).

    Args:
      state: the state before the step.
      batch: the global batch as the stream reads it.
      model: the towers (`two_tower.TwoTower`).
      seed: the run's seed (dropout and patch keys).
      extra_rows: M, the rows each step reads beside its batch (over all shards).
      num_shards: the devices the batch is split over.
      key_params: a momentum encoder's parameters, or None.
      teacher: a distillation teacher's model (its variables are `state.teacher`), or None.
    """
    patches = model.patch_dropout
    batch = layout(
        batch,
        extra_rows=extra_rows,
        num_shards=num_shards,
        patch_seed=seed if patches.rate else None,
        step=state.step,
    )
    embed = Forward(
        state.apply_fn,
        state.batch_stats,
        jax.random.fold_in(jax.random.key(seed), state.step),
        key_params=key_params,
        drop_patches=not patches.staged or state.step < patches.until_step,
        teacher_apply=None if teacher is None else teacher.apply,
        teacher_variables=state.teacher,
    )
    return embed, batch
