"""The trainer's side of `losses.negatives`: the config's `group_size` and
`extra_negatives` checked at the door, and the extra negatives' forward pass.

`config.loss.group_size` = K cuts the global batch into groups of K consecutive rows,
each row's softmax within its group: the negatives stay K while N grows.

`config.loss.extra_negatives` = M adds M rows that are only negatives: the negatives
grow to N + M while the optimizer's batch stays N. The data stream reads N + M examples
a step (`run_plan.data_settings`); on each of the d devices the first n = N / d rows
are the gradient rows, the last m = M / d only negatives. `embed` runs the towers on
the gradient rows as usual and on the extra rows in a second forward pass with the
parameters under `jax.lax.stop_gradient` (no backward pass is spent on them; dropout
from its own key; their BatchNorm statistics are not kept), and joins the embeddings
back in that order. The loss (`query_rows = n`, set by `losses.registry`) takes the
gradient rows as the softmaxes' rows and every row as a column, and is the mean over
the N gradient rows. Cost over the plain step at N: a forward pass over M more
examples (no backward), CLIP's logits `N (N + M)` per direction (the plain step's `N^2`
serve both), N + M embeddings gathered.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from contrastive_jax import losses, sharding
from contrastive_jax.errors import ConfigError, check_multiple


def check(
    name: str,
    loss: losses.Loss,
    settings: losses.LossSettings,
    *,
    global_batch_size: int,
    num_devices: int,
    plain_step: bool,
) -> None:
    """`group_size` divides the global batch and `extra_negatives` the devices, each for
    the loss `name` only if it takes it (`losses.Loss.options`); extra negatives need a
    `plain_step`: the whole batch in one pass (no micro-batches, no per-device
    noise-scale pass), the same N every step (no batch schedule).

    Raises:
      ConfigError: naming the field and a fix.
    """
    size, extra = settings.group_size, settings.extra_negatives
    if size and "group_size" not in loss.options:
        takes = losses.registry.taking("group_size")
        raise ConfigError(f"config.loss.group_size={size} with config.loss.name={name!r}: use one of {takes}, or 0.")
    if size:
        check_multiple(global_batch_size, size, "config.train.global_batch_size", "config.loss.group_size")
    if not extra:
        return
    if extra < 0 or "extra_negatives" not in loss.options:
        takes = losses.registry.taking("extra_negatives")
        raise ConfigError(
            f"config.loss.extra_negatives={extra} with config.loss.name={name!r}: use one of {takes} "
            "(a loss whose rows can be queries), or 0."
        )
    check_multiple(extra, num_devices, "config.loss.extra_negatives", "the devices")
    if size or not plain_step:
        raise ConfigError(
            f"config.loss.extra_negatives={extra} embeds its rows in a pass of their own, beside a "
            "constant batch's: set config.loss.group_size=0, config.train.micro_batch_size=0, "
            "config.train.log_noise_scale=False and config.train.batch_schedule='constant', or extra_negatives=0."
        )


def _split(x: jax.Array, num_shards: int, extra_rows: int) -> tuple[jax.Array, jax.Array]:
    """`x` [d (n + m), ...] into each shard's first n rows [d n, ...] and last m [d m, ...]."""
    blocks = x.reshape(num_shards, -1, *x.shape[1:])
    gradient_rows, extra = blocks[:, : blocks.shape[1] - extra_rows], blocks[:, blocks.shape[1] - extra_rows :]
    return tuple(b.reshape(-1, *x.shape[1:]) for b in (gradient_rows, extra))


def _join(gradient_rows: jax.Array, extra: jax.Array, num_shards: int) -> jax.Array:
    """`_split`'s inverse: each shard's gradient rows, then its extra rows."""
    blocks = [v.reshape(num_shards, -1, *v.shape[1:]) for v in (gradient_rows, extra)]
    return jnp.concatenate(blocks, axis=1).reshape(-1, *gradient_rows.shape[1:])


def embed(forward: Callable, params: Any, batch: dict[str, jax.Array], settings: losses.LossSettings, mesh):
    """`forward(params, batch, 0)`'s `(batched, shared, updates)`, the last
    `settings.extra_negatives / shards` rows of each of the `mesh`'s batch shards
    embedded with the parameters under `stop_gradient` (`forward(..., 1)`: its own
    dropout key). Without extra negatives: `forward` as is.

    Args:
      forward: the trainer's `(params, inputs, micro_index) -> (batched outputs [rows,
        ...], shared outputs, updates)`.
      params: the parameters the gradient is taken of.
      batch: the global batch, N + M rows in each of its arrays.
      settings: the loss's settings (`extra_negatives`: M, over all shards).
      mesh: the mesh the batch is split over (`sharding.batch_shards`).
    """
    if not settings.extra_negatives:
        return forward(params, batch, 0)
    num_shards = sharding.batch_shards(mesh)
    extra_rows = settings.extra_negatives // num_shards
    rows = batch["a"].shape[0]
    parts = {k: _split(v, num_shards, extra_rows) for k, v in batch.items() if v.shape[:1] == (rows,)}
    batched, shared, updates = forward(params, {k: v[0] for k, v in parts.items()}, 0)
    # The parameters stopped, not the outputs: no tangent enters the pass, none is kept.
    extra, _, _ = forward(jax.lax.stop_gradient(params), {k: v[1] for k, v in parts.items()}, 1)
    batched = {k: _join(v, extra[k], num_shards) for k, v in batched.items()}
    return batched, shared, updates
