"""The CLIP loss masking in-batch false negatives: reference values, sharded = single device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses, sharding
from contrastive_jax.sharding import compare_with_single_device
from contrastive_jax.losses import false_negatives


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


def test_mask_marks_shared_ids_but_not_the_own_pair():
    groups = jnp.array([[0, 0], [0, 1], [1, 2], [2, 2]])  # rows 0-1 share id 0, 2-3 id 2
    mask = false_negatives.false_negative_mask(groups, groups, jnp.arange(4))
    expected = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], bool)
    np.testing.assert_array_equal(mask, expected)


def test_equals_the_reference_and_clip_without_shared_ids():
    a, b = embeddings(12, 8, 0), embeddings(12, 8, 1)
    groups = jnp.stack([jnp.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9]), jnp.arange(12) % 7], axis=1)
    loss = false_negatives.clip_loss_masking_false_negatives(a, b, groups, temperature=0.1)
    assert float(loss) == pytest.approx(reference(a, b, groups, 0.1), rel=1e-5)
    distinct = jnp.stack([jnp.arange(12), jnp.arange(12)], axis=1)
    unmasked = false_negatives.clip_loss_masking_false_negatives(a, b, distinct, temperature=0.1)
    assert float(unmasked) == pytest.approx(float(losses.clip_loss(a, b, temperature=0.1)), rel=1e-6)
    assert float(loss) < float(unmasked)  # fewer negatives in the softmax


@pytest.mark.parametrize("num_devices", [2, 8])
def test_sharded_equals_single_device(num_devices):
    a, b = embeddings(32, 8, 2), embeddings(32, 8, 3)
    groups = jnp.stack([jnp.arange(32) // 2, jnp.arange(32) % 5], axis=1)
    single, sharded, grad_difference = compare_with_single_device(
        false_negatives.clip_loss_masking_false_negatives, (a, b, groups), {"temperature": 0.1},
        sharding.make_mesh(num_devices),
    )
    assert sharded == pytest.approx(single, rel=1e-5)
    assert grad_difference < 1e-6


def test_bad_groups_shape_is_rejected():
    a = embeddings(4, 8, 0)
    with pytest.raises(ValueError, match=r"groups must have shape \[B, K\] = \[4, K\]"):
        false_negatives.clip_loss_masking_false_negatives(a, a, jnp.arange(4), temperature=0.1)
