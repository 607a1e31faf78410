"""The tests' loss cases and helpers: one small example of every loss that takes
``axis_name`` (:func:`loss_examples`), its sharded and single-device values side by side
(:func:`compare_with_single_device`), float64 in a scope (:func:`enable_x64`, the
references' precision) and a kernel's value and gradients against a reference's
(:func:`assert_matches`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses
from contrastive_jax.sharding import shard_loss

# The ways a loss over N = 32 rows is computed, the same result each: name -> (devices or
# None for one, options): dense and tiled on one device; all-gathered, tiled and around
# the ring (4 rows a device) on 8.
MODES = {
    "dense": (None, {}),
    "tiled": (None, {"chunk_size": 4}),
    "8-all_gather": (8, {}),
    "8-all_gather-tiled": (8, {"chunk_size": 8}),
    "8-ring": (8, {"collective": "ring"}),
    "8-ring-tiled": (8, {"collective": "ring", "chunk_size": 2}),
}


def with_positive_ids(loss_fn, **options):
    """``loss_fn(a, b, ids, **hyperparameters)``: ``loss_fn`` with its ``positive_ids``
    positional, so that ``shard_loss`` splits them with the rows."""

    def fn(a, b, ids, **hyperparameters):
        return loss_fn(a, b, positive_ids=ids, **options, **hyperparameters)

    return fn


def with_hard_negatives(loss_fn):
    """``loss_fn(a, b, hard, **hyperparameters)``: ``loss_fn`` with its ``hard_negatives``
    positional, so that ``shard_loss`` splits them with their rows."""

    def fn(a, b, hard, *, chunk_size=None, collective="all_gather", **hyperparameters):
        candidates, streaming = losses.Candidates(extra_columns=hard), losses.Streaming(chunk_size, collective)
        return loss_fn(a, b, candidates=candidates, streaming=streaming, **hyperparameters)

    return fn


def loss_examples(global_batch: int, dim: int, seed: int = 0):
    """``{name: (loss_fn, arrays, hyperparameters)}`` for every loss taking ``axis_name``.

    Embeddings ``[N, D]`` are random unit vectors; labels ``[N]`` are sorted, so they
    are unevenly spread over devices (some devices see one class only). The positive
    ids ``[N, 2]`` are the labels and, on every third row, a second id (``-1``, padding,
    elsewhere); the groups (``group_size``) hold 8 rows; each pair has 2 hard negatives
    (``hard_negatives`` [N, 2, D], the queue's first 2N rows). The queue and
    the memory hold ``2N`` rows; the memory's last quarter is empty (label -1); for XBM's
    two-term form it holds the batch from row ``3N/2`` on (``enqueued_at``), wrapping.
    """
    key_a, key_b, key_labels, key_queue, key_memory = jax.random.split(jax.random.key(seed), 5)
    a = losses.l2_normalize(jax.random.normal(key_a, (global_batch, dim)))
    b = losses.l2_normalize(a + 0.5 * jax.random.normal(key_b, (global_batch, dim)))
    labels = jnp.sort(jax.random.randint(key_labels, (global_batch,), 0, 5))
    queue = losses.l2_normalize(jax.random.normal(key_queue, (2 * global_batch, dim)))
    memory_labels = jax.random.randint(key_memory, (2 * global_batch,), 0, 5)
    memory_labels = jnp.where(jnp.arange(2 * global_batch) % 4 == 3, -1, memory_labels)
    memory = (queue, memory_labels)
    # XBM's two-term form scores the memory after enqueue wrote the batch: here from row
    # 3N/2 on, wrapping around the end.
    pointer = 3 * global_batch // 2
    slots = (pointer + jnp.arange(global_batch)) % (2 * global_batch)
    enqueued = (queue.at[slots].set(a), memory_labels.at[slots].set(labels))
    rows = jnp.arange(global_batch)
    ids = jnp.stack([labels, jnp.where(rows % 3 == 0, rows % 4, -1)], axis=1)
    hard = queue.reshape(global_batch, 2, dim)
    return {
        "infonce": (losses.infonce_loss, (a, b), {"temperature": 0.1}),
        "clip": (losses.clip_loss, (a, b), {"temperature": 0.07}),
        "siglip": (losses.siglip_loss, (a, b), {"temperature": 0.1, "bias": -10.0}),
        "clip_positives_mean_log_prob": (with_positive_ids(losses.clip_loss), (a, b, ids), {"temperature": 0.07}),
        "clip_positives_log_sum": (
            with_positive_ids(losses.clip_loss, positives="log_sum"),
            (a, b, ids),
            {"temperature": 0.07},
        ),
        "infonce_positives_log_sum": (
            with_positive_ids(losses.infonce_loss, positives="log_sum"),
            (a, b, ids),
            {"temperature": 0.1},
        ),
        "siglip_positives": (
            with_positive_ids(losses.siglip_loss),
            (a, b, ids),
            {"temperature": 0.1, "bias": -10.0},
        ),
        # Groups of 8 rows: over 2 of 8 devices, 4 of 4, 8 of 2, a quarter of one.
        "clip_groups": (losses.clip_loss, (a, b), {"temperature": 0.07, "group_size": 8}),
        "siglip_groups": (losses.siglip_loss, (a, b), {"temperature": 0.1, "bias": -10.0, "group_size": 8}),
        "clip_hard_negatives": (with_hard_negatives(losses.clip_loss), (a, b, hard), {"temperature": 0.07}),
        "siglip_hard_negatives": (
            with_hard_negatives(losses.siglip_loss),
            (a, b, hard),
            {"temperature": 0.1, "bias": -10.0},
        ),
        "ntxent": (losses.ntxent_loss, (a, b), {"temperature": 0.2}),
        "npairs": (losses.npairs_loss, (a, b), {"l2_reg": 0.002}),
        "supcon": (losses.supcon_loss, (a, labels), {"temperature": 0.1}),
        "contrastive": (losses.contrastive_loss, (a, labels), {"margin": 1.0}),
        "triplet_batch_all": (losses.triplet_loss, (a, labels), {"margin": 0.2}),
        "triplet_batch_hard": (losses.triplet_loss, (a, labels), {"margin": 0.2, "mining": "batch_hard"}),
        "triplet_semi_hard": (losses.triplet_loss, (a, labels), {"margin": 0.2, "mining": "semi_hard"}),
        "multi_similarity": (losses.multi_similarity_loss, (a, labels), {"mining_margin": 0.1}),
        "dcl": (losses.dcl_loss, (a, b), {"temperature": 0.1}),
        "dclw": (losses.dcl_loss, (a, b), {"temperature": 0.1, "weight_sigma": 0.5}),
        "dclw_weight_gradient": (
            losses.dcl_loss,
            (a, b),
            {"temperature": 0.1, "weight_sigma": 0.5, "weight_gradient": True},
        ),
        "moco_queue": (losses.moco_queue_loss, (a, b, queue), {"temperature": 0.1}),
        "xbm_supcon": (losses.xbm_loss, (a, labels, *memory), {"loss": "supcon", "temperature": 0.1}),
        "xbm_contrastive": (losses.xbm_loss, (a, labels, *memory), {"loss": "contrastive", "margin": 1.0}),
        "xbm_multi_similarity": (losses.xbm_loss, (a, labels, *memory), {"loss": "multi_similarity"}),
        "xbm_supcon_weighted": (
            losses.xbm_loss,
            (a, labels, *enqueued),
            {"loss": "supcon", "temperature": 0.1, "memory_weight": 0.5, "enqueued_at": pointer},
        ),
        "batch_prototype_cross_entropy": (
            losses.batch_prototype_cross_entropy_loss,
            (a, labels),
            {"num_classes": 5, "temperature": 0.5},
        ),
    }


def compare_with_single_device(loss_fn, arrays, hyperparameters, mesh):
    """Single-device and sharded value of a loss, and the max gradient difference.

    Args:
      loss_fn: a loss taking `axis_name` (see `contrastive_jax.sharding.shard_loss`).
      arrays: its positional global arrays, the first `[N, D]`, e.g. `(a, b)` or
        `(z, labels)`.
      hyperparameters: its keyword arguments.
      mesh: the mesh the sharded call splits N over (all its batch axes).

    Returns:
      ``(single_value, sharded_value, max_abs_grad_difference)``, the gradient taken
      w.r.t. the first array.
    """
    sharded_fn = shard_loss(loss_fn, mesh)

    def single(x):
        return loss_fn(x, *arrays[1:], **hyperparameters)

    def sharded(x):
        return sharded_fn(x, *arrays[1:], **hyperparameters)

    single_value, single_grad = jax.jit(jax.value_and_grad(single))(arrays[0])
    sharded_value, sharded_grad = jax.jit(jax.value_and_grad(sharded))(arrays[0])
    return float(single_value), float(sharded_value), float(jnp.max(jnp.abs(single_grad - sharded_grad)))


def assert_matches(got, want):
    """``got`` and ``want``, each ``(value, gradients)``, agree: the value to 1e-5
    relative, each gradient to 2e-5 of its largest entry (float32 against float64)."""
    (value, grads), (want_value, want_grads) = got, want
    assert float(value) == pytest.approx(want_value, rel=1e-5)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * max(np.max(np.abs(w)), 1.0))


def enable_x64():
    """A context manager within which JAX computes in float64: ``jax.enable_x64(True)``,
    or on jax 0.7.2, which has none, ``jax.experimental.enable_x64()``."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)  # noqa: TID251
    from jax import experimental

    return experimental.enable_x64()  # noqa: TID251
