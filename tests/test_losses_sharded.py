"""Every loss with ``axis_name`` equals the single-device loss on the global batch.

Values and gradients, under ``jax.shard_map`` (via ``sharding.shard_loss``) and under
``jax.pmap``, on 1, 2, 4 and 8 simulated devices. A wrong label offset gives a
plausible, wrong loss: these tests are what catches it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import sharding
from contrastive_jax.losses.examples import loss_examples
from contrastive_jax.sharding import compare_with_single_device

GLOBAL_BATCH = 32
DIM = 16
EXAMPLES = loss_examples(GLOBAL_BATCH, DIM)
TOLERANCE = 1e-5


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE, atol=TOLERANCE * 1e-2)


@pytest.mark.parametrize("num_devices", [1, 2, pytest.param(8, marks=pytest.mark.compat)])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_shard_map_equals_single_device(name, num_devices):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]
    single, sharded, grad_difference = compare_with_single_device(
        loss_fn, arrays, hyperparameters, sharding.make_mesh(num_devices)
    )
    _close(sharded, single)
    assert grad_difference <= TOLERANCE * 1e-1, grad_difference


@pytest.mark.compat
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_pmap_equals_single_device(name, num_devices=8):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]

    def local_loss(*local_arrays):
        return loss_fn(*local_arrays, **hyperparameters, axis_name="batch")

    values, grads = jax.pmap(jax.value_and_grad(local_loss), axis_name="batch", devices=jax.devices()[:num_devices])(
        *[x.reshape(num_devices, -1, *x.shape[1:]) for x in arrays]
    )  # queues split too
    single, single_grad = jax.jit(jax.value_and_grad(lambda x: loss_fn(x, *arrays[1:], **hyperparameters)))(arrays[0])
    _close(values, np.full(num_devices, single))
    _close(grads.reshape(single_grad.shape), single_grad)


@pytest.mark.compat
def test_all_gradients_of_a_two_sided_loss_match():
    """Gradients w.r.t. both sides and a learnable temperature flow through the gather."""
    loss_fn, (a, b), _ = EXAMPLES["clip"]
    mesh = sharding.make_mesh(8)
    temperature = jnp.asarray(0.07)
    single = jax.grad(lambda a, b, t: loss_fn(a, b, temperature=t), argnums=(0, 1, 2))
    sharded_fn = sharding.shard_loss(loss_fn, mesh)
    sharded = jax.grad(lambda a, b, t: sharded_fn(a, b, temperature=t), argnums=(0, 1, 2))
    for got, want in zip(jax.jit(sharded)(a, b, temperature), single(a, b, temperature)):
        _close(got, want)


def test_uneven_labels_really_are_uneven():
    """The label-based cases put different class mixes on different devices."""
    labels = np.asarray(EXAMPLES["supcon"][1][1]).reshape(8, -1)
    per_device_classes = {tuple(np.unique(row)) for row in labels}
    assert len(per_device_classes) > 1
    assert any(len(classes) == 1 for classes in per_device_classes)


def test_shard_loss_on_sharded_global_arrays_with_replicated_argument():
    """shard_loss accepts arrays already placed with the data sharding."""
    from contrastive_jax import losses

    mesh = sharding.make_mesh(4)
    _, (a, b), _ = EXAMPLES["clip"]
    a_sharded = jax.device_put(a, sharding.data_sharding(mesh))
    value = jax.jit(lambda a, b: sharding.shard_loss(losses.clip_loss, mesh)(a, b, temperature=0.1))(a_sharded, b)
    _close(value, losses.clip_loss(a, b, temperature=0.1))


def test_batch_that_does_not_divide_over_devices_is_rejected():
    from contrastive_jax import losses

    _, (a, b), _ = EXAMPLES["clip"]
    sharded = sharding.shard_loss(losses.clip_loss, sharding.make_mesh(8))
    with pytest.raises(ValueError, match="does not divide over 8 devices; use a multiple of 8"):
        sharded(a[:30], b[:30], temperature=0.1)


def test_make_mesh_rejects_too_many_devices():
    with pytest.raises(ValueError, match="num_devices must be in"):
        sharding.make_mesh(jax.device_count() + 1)


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_contrastive_metrics_sharded_equal_single_device(chunk_size):
    from contrastive_jax import losses

    _, (a, b), _ = EXAMPLES["clip"]
    want = losses.contrastive_metrics(a, b, temperature=0.1)
    got = jax.jit(
        lambda a, b: sharding.shard_loss(losses.contrastive_metrics, sharding.make_mesh(8))(
            a, b, temperature=0.1, chunk_size=chunk_size
        )
    )(a, b)
    for key in want:
        _close(got[key], want[key])
