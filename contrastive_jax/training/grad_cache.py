"""A global batch larger than memory: gradient caching, and plain accumulation beside it.

Gradient caching (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup") computes the exact full-batch gradient of a loss that couples
all examples (InfoNCE, CLIP, SupCon, ...) while holding the activations of only one
micro-batch at a time:

1. embed the global batch micro-batch by micro-batch, keeping only the embeddings;
2. compute the loss over all N embeddings at once (sharded, chunked or ring), and its
   gradient with respect to the embeddings -- the "cache";
3. re-run each micro-batch's forward pass and pull its slice of the cached embedding
   gradient back into parameter gradients (a vector-Jacobian product), summing them.

The result equals ``jax.grad`` of the loss on the whole batch, up to float rounding, for
encoders whose forward pass treats examples independently (no BatchNorm statistics
across the batch; with BatchNorm, statistics are per micro-batch).

Plain gradient accumulation is a different objective: each micro-batch's loss only
sees its own m examples (m - 1 negatives instead of N - 1), and the gradients are
averaged. It is kept here so the difference can be studied, not as a substitute.

Shapes: ``N`` global batch, ``K`` micro-batches, ``m = N / K`` examples per
micro-batch. Each micro-batch takes ``m / S`` rows from each of the ``S`` data shards,
so every device works on every micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from contrastive_jax.errors import check_divides, check_multiple

# forward(params, micro_batch, micro_index) -> (batched, shared, aux):
#   batched: pytree of [m, ...] per-example outputs (embeddings),
#   shared: pytree of outputs that do not depend on the examples (a learned temperature),
#   aux: pytree that is not differentiated (e.g. BatchNorm statistics).
Forward = Callable[[Any, Any, jax.Array], tuple[Any, Any, Any]]
# loss(batched [N, ...], shared, batch) -> (scalar loss, metrics)
EmbeddingLoss = Callable[[Any, Any, Any], tuple[jax.Array, Any]]


def check_micro_batches(global_batch_size: int, micro_batch_size: int, num_shards: int) -> int:
    """The number of micro-batches K; a ConfigError naming the fix if the sizes don't fit."""
    name = "config.train.micro_batch_size"
    check_divides(micro_batch_size, global_batch_size, name, "config.train.global_batch_size")
    check_multiple(micro_batch_size, num_shards, name, "the devices")  # each works on every micro-batch
    return global_batch_size // micro_batch_size


def split(x: jax.Array, num_micro_batches: int, num_shards: int) -> jax.Array:
    """``[N, ...] -> [K, m, ...]``; micro-batch k takes rows from every data shard."""
    rows_per_shard = x.shape[0] // num_shards
    x = x.reshape(num_shards, num_micro_batches, rows_per_shard // num_micro_batches, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape(num_micro_batches, -1, *x.shape[3:])


def merge(x: jax.Array, num_shards: int) -> jax.Array:
    """The inverse of :func:`split`: ``[K, m, ...] -> [N, ...]`` in the original order."""
    num_micro_batches, micro_batch_size = x.shape[:2]
    x = x.reshape(num_micro_batches, num_shards, micro_batch_size // num_shards, *x.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[3:])


def grad_cache_value_and_grad(
    forward: Forward,
    loss: EmbeddingLoss,
    params: Any,
    batch: Any,
    *,
    num_micro_batches: int,
    num_shards: int = 1,
) -> tuple[tuple[jax.Array, Any, Any], Any]:
    """The loss over the global batch and its exact parameter gradient, by GradCache.

    Args:
      forward: embeds one micro-batch (see ``Forward``); called 2K times.
      loss: the loss of all N embeddings (see ``EmbeddingLoss``), e.g. a sharded ``clip_loss``.
      params: the parameters to differentiate.
      batch: pytree of ``[N, ...]`` arrays (data-sharded over ``num_shards``).
      num_micro_batches: K; N must be divisible by K * num_shards.
      num_shards: the number of data shards (devices on the data axis).

    Returns:
      ``((loss, metrics, aux), grads)``; ``aux`` is the last micro-batch's.
    """
    micro = jax.tree.map(lambda x: split(x, num_micro_batches, num_shards), batch)
    indices = jnp.arange(num_micro_batches)

    def embed(_, inputs):
        micro_batch, index = inputs
        return None, forward(params, micro_batch, index)

    _, (batched, shared, aux) = jax.lax.scan(embed, None, (micro, indices))
    batched = jax.tree.map(lambda x: merge(x, num_shards), batched)
    shared, aux = jax.tree.map(lambda x: x[-1], (shared, aux))
    (value, metrics), (batched_grads, shared_grads) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        batched, shared, batch
    )
    # Every micro-batch recomputes the shared outputs from the same parameters, so each
    # takes 1/K of their gradient: the K contributions add up to it exactly.
    shared_grads = jax.tree.map(lambda g: g / num_micro_batches, shared_grads)
    micro_grads = jax.tree.map(lambda g: split(g, num_micro_batches, num_shards), batched_grads)

    def backprop(accumulated, inputs):
        micro_batch, index, cached = inputs
        _, pull_back = jax.vjp(lambda p: forward(p, micro_batch, index)[:2], params)
        (grads,) = pull_back((cached, shared_grads))
        return jax.tree.map(jnp.add, accumulated, grads), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(backprop, zeros, (micro, indices, micro_grads))
    return (value, metrics, aux), grads


def accumulated_value_and_grad(
    forward: Forward,
    loss: EmbeddingLoss,
    params: Any,
    batch: Any,
    *,
    num_micro_batches: int,
    num_shards: int = 1,
) -> tuple[tuple[jax.Array, Any, Any], Any]:
    """Plain gradient accumulation: the mean of K micro-batch losses and gradients.

    Not the full-batch loss: each micro-batch's loss compares its m examples only (see
    the module docstring). Same arguments and returns as
    :func:`grad_cache_value_and_grad`; ``metrics`` are averaged over micro-batches.
    """
    micro = jax.tree.map(lambda x: split(x, num_micro_batches, num_shards), batch)

    def micro_loss(p, micro_batch, index):
        batched, shared, aux = forward(p, micro_batch, index)
        value, metrics = loss(batched, shared, micro_batch)
        return value, (metrics, aux)

    def step(accumulated, inputs):
        micro_batch, index = inputs
        (value, (metrics, aux)), grads = jax.value_and_grad(micro_loss, has_aux=True)(params, micro_batch, index)
        return jax.tree.map(jnp.add, accumulated, grads), (value, metrics, aux)

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, (values, metrics, aux) = jax.lax.scan(step, zeros, (micro, jnp.arange(num_micro_batches)))
    mean = lambda tree: jax.tree.map(lambda x: jnp.mean(x, axis=0), tree)  # noqa: E731
    return (
        (jnp.mean(values), mean(metrics), jax.tree.map(lambda x: x[-1], aux)),
        jax.tree.map(lambda g: g / num_micro_batches, grads),
    )


# config.train.micro_batch_method -> how a step is split into micro-batches.
MICRO_BATCH_METHODS = {
    "grad_cache": grad_cache_value_and_grad,
    "accumulate": accumulated_value_and_grad,
}
