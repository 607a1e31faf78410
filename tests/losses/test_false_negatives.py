"""CLIP masking in-batch false negatives (`clip_loss(false_negative_ids=...)`): a NumPy
reference, dense = tiled = ring, sharded = single device, gradients against `jax.grad` of
a dense masked reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses, sharding
from contrastive_jax.losses import _common


def embeddings(n, d, seed):
    x = jax.random.normal(jax.random.key(seed), (n, d))
    return x / jnp.linalg.norm(x, axis=1, keepdims=True)


def reference(a, b, groups, temperature):
    """Per-row NumPy loop: each row's softmax over its own pair and the id-free columns."""
    a, b, groups = (np.asarray(x, np.float64) for x in (a, b, groups))
    n, total = len(a), 0.0
    for i in range(n):
        keep = [j for j in range(n) if j == i or not np.any(groups[j] == groups[i])]
        for query, keys in ((a[i], b), (b[i], a)):
            logits = keys[keep] @ query / temperature
            total += 0.5 * (np.log(np.sum(np.exp(logits))) - logits[keep.index(i)])
    return total / n


def dense_reference(a, b, groups, temperature):
    """The same loss in jnp on the whole [N, N] logits (for `jax.grad`)."""
    shared = jnp.any(groups[:, None, :] == groups[None, :, :], axis=-1)
    false_negatives = shared & ~jnp.eye(len(a), dtype=bool)
    positive = jnp.sum(a * b, axis=1) / temperature
    per_row = 0.0
    for query, keys in ((a, b), (b, a)):
        logits = jnp.where(false_negatives, _common.MASK_VALUE, query @ keys.T / temperature)
        per_row = per_row + 0.5 * (jax.nn.logsumexp(logits, axis=1) - positive)
    return jnp.mean(per_row)


@jax.jit
def dense_reference_grads(a, b):
    """The gradients of `dense_reference` on `GROUPS` at temperature 0.1, w.r.t. a and b."""
    return jax.grad(dense_reference, argnums=(0, 1))(a, b, GROUPS, 0.1)


def masked_clip(a, b, groups, **kwargs):
    return losses.clip_loss(a, b, false_negative_ids=groups, **kwargs)


# rows 0-1 share a word id, rows 10-11 too; id 1 of row i is i % 7 (pronunciations).
GROUPS = jnp.stack(
    [jnp.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9] * 2) + 10 * (jnp.arange(24) >= 12), jnp.arange(24) % 7], axis=1
)
STREAMING = {
    "dense": {},
    "tiled": {"chunk_size": 4},
    "tiled-bf16": {"chunk_size": 4, "matmul_dtype": "bfloat16"},
}


@pytest.mark.parametrize("streaming", list(STREAMING))
def test_equals_the_reference_in_value_and_gradient(streaming):
    a, b = embeddings(24, 8, 0), embeddings(24, 8, 1)
    options = STREAMING[streaming]
    tolerance = 2e-2 if "matmul_dtype" in options else 1e-5
    loss = jax.value_and_grad(lambda a, b: masked_clip(a, b, GROUPS, temperature=0.1, **options), argnums=(0, 1))
    value, grads = jax.jit(loss)(a, b)
    assert float(value) == pytest.approx(reference(a, b, GROUPS, 0.1), rel=tolerance)
    expected = dense_reference_grads(a, b)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, atol=tolerance * float(jnp.max(jnp.abs(want))))


def test_one_dimensional_ids_and_distinct_ids():
    a, b = embeddings(12, 8, 0), embeddings(12, 8, 1)
    words = jnp.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9])
    loss = masked_clip(a, b, words, temperature=0.1)
    assert float(loss) == pytest.approx(reference(a, b, words[:, None], 0.1), rel=1e-5)
    unmasked = masked_clip(a, b, jnp.arange(12), temperature=0.1)
    assert float(unmasked) == pytest.approx(float(losses.clip_loss(a, b, temperature=0.1)), rel=1e-6)
    assert float(loss) < float(unmasked)  # fewer negatives in the softmax


@pytest.mark.parametrize(
    "options",
    [{}, {"chunk_size": 3}, {"collective": "ring"}, {"collective": "ring", "chunk_size": 3}],
    ids=["all_gather", "all_gather-tiled", "ring", "ring-tiled"],
)
@pytest.mark.parametrize("num_devices", [2, 4])
def test_sharded_equals_the_single_device_reference(options, num_devices):
    a, b = embeddings(24, 8, 2), embeddings(24, 8, 3)
    sharded = sharding.shard_loss(masked_clip, sharding.make_mesh(num_devices))
    value, grads = jax.jit(
        jax.value_and_grad(lambda a, b: sharded(a, b, GROUPS, temperature=0.1, **options), argnums=(0, 1))
    )(a, b)
    assert float(value) == pytest.approx(reference(a, b, GROUPS, 0.1), rel=1e-5)
    expected = dense_reference_grads(a, b)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_bad_ids_are_rejected():
    a = embeddings(4, 8, 0)
    with pytest.raises(ValueError, match=r"false_negative_ids must be ints of shape \[B\] or \[B, K\] with B = 4"):
        masked_clip(a, a, jnp.arange(5), temperature=0.1)
    with pytest.raises(ValueError, match="false_negative_ids must be ints"):
        masked_clip(a, a, jnp.ones(4), temperature=0.1)
