"""Every loss with ``axis_name`` equals the single-device loss on the global batch, in
every way it can be called: ``jax.shard_map`` with ``check_vma`` True (via
``sharding.shard_loss``) and False, with the gradient taken outside or inside it,
``jax.pmap``, on 1, 2, 8 simulated devices and a 2 x 4 mesh whose batch spans both axes
(``axis_name=("data", "fsdp")``). A wrong label offset gives a plausible, wrong loss,
and a gradient off by the device count trains on quietly: these tests catch both.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from loss_cases import compare_with_single_device, loss_examples

from contrastive_jax import sharding
from contrastive_jax.sharding import BATCH_AXES

GLOBAL_BATCH = 32
DIM = 16
EXAMPLES = loss_examples(GLOBAL_BATCH, DIM)
TOLERANCE = 1e-5


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE, atol=TOLERANCE * 1e-2)


@pytest.mark.parametrize("num_devices, fsdp", [(1, 1), (2, 1), pytest.param(8, 1, marks=pytest.mark.compat), (8, 4)])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_shard_map_equals_single_device(name, num_devices, fsdp):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]
    single, sharded, grad_difference = compare_with_single_device(
        loss_fn, arrays, hyperparameters, sharding.make_mesh(num_devices, fsdp=fsdp)
    )
    _close(sharded, single)
    assert grad_difference <= TOLERANCE * 1e-1, grad_difference


def _scaled_loss(name):
    """``(loss(scale, *arrays, axis_name), single-device value, d/d scale)``: the first
    array times a replicated ``scale`` (1.0), which stands for a parameter."""
    loss_fn, arrays, hyperparameters = EXAMPLES[name]

    def loss(scale, *arrays, axis_name=None):
        return loss_fn(arrays[0] * scale, *arrays[1:], **hyperparameters, axis_name=axis_name)

    value, grad = jax.value_and_grad(loss)(1.0, *arrays)
    return loss, arrays, value, grad


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_calling_convention_on_a_two_axis_mesh(name):
    """On a 2 x 4 mesh with ``axis_name=("data", "fsdp")``, the value and the gradient
    w.r.t. a replicated parameter are the single device's:

    - ``check_vma=False``, gradient outside ``shard_map`` (JAX splits the replicated
      output's cotangent over the 8 devices and sums the parameter's);
    - ``check_vma=True``, gradient inside (typed: the parameter's gradient is summed);
    - ``check_vma=False``, gradient inside, then ``pmean`` (the ``pmap`` convention).
    """
    loss, arrays, value, grad = _scaled_loss(name)
    mesh = sharding.make_mesh(8, fsdp=4)
    rows = tuple(P(BATCH_AXES) for _ in arrays)

    def per_device(scale, *arrays):
        return loss(scale, *arrays, axis_name=BATCH_AXES)

    unchecked = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), *rows), out_specs=P(), check_vma=False)
    got_value, got_grad = jax.jit(jax.value_and_grad(unchecked))(1.0, *arrays)
    _close(got_value, value)
    _close(got_grad, grad)

    for check_vma, reduce in ((True, lambda g: g), (False, lambda g: jax.lax.pmean(g, BATCH_AXES))):
        inside = jax.shard_map(
            lambda scale, *arrays, reduce=reduce: reduce(jax.grad(per_device)(scale, *arrays)),
            mesh=mesh,
            in_specs=(P(), *rows),
            out_specs=P(),
            check_vma=check_vma,
        )
        _close(jax.jit(inside)(1.0, *arrays), grad)


@pytest.mark.compat
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_pmap_equals_single_device(name, num_devices=8):
    """Under ``pmap`` each device's gradient is that of its local loss, as for a
    per-example loss: the ``pmean`` of a replicated parameter's gradients is the single
    device's, and each device's rows get K times their share (K = 8 devices)."""
    loss, arrays, value, grad = _scaled_loss(name)
    loss_fn, _, hyperparameters = EXAMPLES[name]

    def per_device(*local_arrays):
        scale_grad = jax.lax.pmean(jax.grad(loss)(1.0, *local_arrays, axis_name="batch"), "batch")
        value, row_grads = jax.value_and_grad(loss_fn)(*local_arrays, **hyperparameters, axis_name="batch")
        return value, scale_grad, row_grads

    values, scale_grads, row_grads = jax.pmap(per_device, axis_name="batch", devices=jax.devices()[:num_devices])(
        *[x.reshape(num_devices, -1, *x.shape[1:]) for x in arrays]
    )  # queues split too
    single_rows = jax.grad(lambda x: loss_fn(x, *arrays[1:], **hyperparameters))(arrays[0])
    _close(values, np.full(num_devices, value))
    _close(scale_grads, np.full(num_devices, grad))
    _close(row_grads.reshape(single_rows.shape) / num_devices, single_rows)


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
    with pytest.raises(
        ValueError, match=r"argument 0's batch size=30 must be a multiple of the devices \(8\); use 24 or 32\."
    ):
        sharded(a[:30], b[:30], temperature=0.1)


def test_make_mesh_rejects_too_many_devices_and_an_fsdp_that_does_not_divide():
    with pytest.raises(ValueError, match="num_devices must be in"):
        sharding.make_mesh(jax.device_count() + 1)
    with pytest.raises(ValueError, match=r"config.mesh.fsdp=3 must divide the device count \(8\); use 2 or 4\."):
        sharding.make_mesh(8, fsdp=3)
    assert dict(sharding.make_mesh(8, fsdp=2).shape) == {"data": 4, "fsdp": 2}


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
