"""One small example of every loss that takes `axis_name`: the inputs the demo prints
and the sharded-equals-single-device tests check."""

import jax
import jax.numpy as jnp

from contrastive_jax.losses._common import l2_normalize
from contrastive_jax.losses.beyond_batch import dcl_loss
from contrastive_jax.losses.contrastive import (
    clip_loss,
    infonce_loss,
    npairs_loss,
    ntxent_loss,
    siglip_loss,
    supcon_loss,
)
from contrastive_jax.losses.memory import moco_queue_loss, xbm_loss
from contrastive_jax.losses.metric import (
    batch_prototype_cross_entropy_loss,
    contrastive_loss,
    multi_similarity_loss,
    triplet_loss,
)


def loss_examples(global_batch: int, dim: int, seed: int = 0):
    """``{name: (loss_fn, arrays, hyperparameters)}`` for every loss taking ``axis_name``.

    Embeddings ``[N, D]`` are random unit vectors; labels ``[N]`` are sorted, so they
    are unevenly spread over devices (some devices see one class only). The queue and
    the memory hold ``2N`` rows; the memory's last quarter is empty (label -1); for XBM's
    two-term form it holds the batch from row ``3N/2`` on (``enqueued_at``), wrapping.
    """
    key_a, key_b, key_labels, key_queue, key_memory = jax.random.split(jax.random.key(seed), 5)
    a = l2_normalize(jax.random.normal(key_a, (global_batch, dim)))
    b = l2_normalize(a + 0.5 * jax.random.normal(key_b, (global_batch, dim)))
    labels = jnp.sort(jax.random.randint(key_labels, (global_batch,), 0, 5))
    queue = l2_normalize(jax.random.normal(key_queue, (2 * global_batch, dim)))
    memory_labels = jax.random.randint(key_memory, (2 * global_batch,), 0, 5)
    memory_labels = jnp.where(jnp.arange(2 * global_batch) % 4 == 3, -1, memory_labels)
    memory = (queue, memory_labels)
    # XBM's two-term form scores the memory after enqueue wrote the batch: here from row
    # 3N/2 on, wrapping around the end.
    pointer = 3 * global_batch // 2
    slots = (pointer + jnp.arange(global_batch)) % (2 * global_batch)
    enqueued = (queue.at[slots].set(a), memory_labels.at[slots].set(labels))
    return {
        "infonce": (infonce_loss, (a, b), {"temperature": 0.1}),
        "clip": (clip_loss, (a, b), {"temperature": 0.07}),
        "siglip": (siglip_loss, (a, b), {"temperature": 0.1, "bias": -10.0}),
        "ntxent": (ntxent_loss, (a, b), {"temperature": 0.2}),
        "npairs": (npairs_loss, (a, b), {"l2_reg": 0.002}),
        "supcon": (supcon_loss, (a, labels), {"temperature": 0.1}),
        "contrastive": (contrastive_loss, (a, labels), {"margin": 1.0}),
        "triplet_batch_all": (triplet_loss, (a, labels), {"margin": 0.2}),
        "triplet_batch_hard": (
            triplet_loss,
            (a, labels),
            {"margin": 0.2, "mining": "batch_hard"},
        ),
        "triplet_semi_hard": (
            triplet_loss,
            (a, labels),
            {"margin": 0.2, "mining": "semi_hard"},
        ),
        "multi_similarity": (multi_similarity_loss, (a, labels), {"mining_margin": 0.1}),
        "dcl": (dcl_loss, (a, b), {"temperature": 0.1}),
        "dclw": (dcl_loss, (a, b), {"temperature": 0.1, "weight_sigma": 0.5}),
        "dclw_weight_gradient": (
            dcl_loss,
            (a, b),
            {"temperature": 0.1, "weight_sigma": 0.5, "weight_gradient": True},
        ),
        "moco_queue": (moco_queue_loss, (a, b, queue), {"temperature": 0.1}),
        "xbm_supcon": (xbm_loss, (a, labels, *memory), {"loss": "supcon", "temperature": 0.1}),
        "xbm_contrastive": (xbm_loss, (a, labels, *memory), {"loss": "contrastive", "margin": 1.0}),
        "xbm_multi_similarity": (xbm_loss, (a, labels, *memory), {"loss": "multi_similarity"}),
        "xbm_supcon_weighted": (
            xbm_loss,
            (a, labels, *enqueued),
            {"loss": "supcon", "temperature": 0.1, "memory_weight": 0.5, "enqueued_at": pointer},
        ),
        "batch_prototype_cross_entropy": (
            batch_prototype_cross_entropy_loss,
            (a, labels),
            {"num_classes": 5, "temperature": 0.5},
        ),
    }
