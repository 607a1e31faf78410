"""The device mesh, how arrays are placed on it, and the one place where a loss is
wrapped in ``jax.shard_map``.

The trainer's mesh has two axes: ``DATA_AXIS`` splits the batch only, ``FSDP_AXIS``
splits the batch *and* the parameters and optimizer state (fully sharded data
parallel: each device keeps 1/fsdp of every large weight and XLA gathers a layer's
weights where they are used). The global batch spans both (``BATCH_AXES``), so every
loss is called with ``axis_name=BATCH_AXES`` and spans all devices.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.errors import ConfigError, check_divides, check_multiple

DATA_AXIS = "data"  # splits the batch only
FSDP_AXIS = "fsdp"  # splits the batch and the parameters (fully sharded data parallel)
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)  # the trainer's batch spans both; losses take this axis_name


def make_mesh(num_devices: int | None = None, *, fsdp: int = 1) -> jax.sharding.Mesh:
    """The ``(DATA_AXIS, FSDP_AXIS)`` mesh of the first ``num_devices`` devices (all by
    default), ``num_devices / fsdp`` by ``fsdp``.

    The axes are ``Auto`` (``jax.make_mesh`` now defaults to ``Explicit``), so arrays
    sharded on them work with plain ``jax.jit`` and ``NamedSharding``.
    """
    available = jax.device_count()
    num_devices = available if num_devices is None else num_devices
    if not 1 <= num_devices <= available:
        raise ConfigError(
            f"num_devices must be in [1, {available}] (the devices JAX sees), got "
            f"{num_devices}. On CPU, simulate more with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing JAX."
        )
    check_divides(fsdp, num_devices, "config.mesh.fsdp", "the device count")
    return jax.make_mesh(
        (num_devices // fsdp, fsdp),
        BATCH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
        devices=jax.devices()[:num_devices],
    )


def batch_axes(mesh: jax.sharding.Mesh) -> tuple[str, ...]:
    """The axes of ``mesh`` a batch is split over: ``BATCH_AXES`` where the mesh has
    them, else all of its axes (a mesh of your own)."""
    present = tuple(name for name in BATCH_AXES if name in mesh.axis_names)
    return present or tuple(mesh.axis_names)


def batch_shards(mesh: jax.sharding.Mesh) -> int:
    """How many pieces a batch is split into on ``mesh`` (devices on its batch axes)."""
    return math.prod(mesh.shape[name] for name in batch_axes(mesh))


def data_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Sharding of a batch array: leading (batch) axis split over the batch axes."""
    return NamedSharding(mesh, P(batch_axes(mesh)))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Sharding of an array every device holds whole (scalars, small state)."""
    return NamedSharding(mesh, P())


def fsdp_spec(shape: Sequence[int], fsdp: int, itemsize: int, min_bytes: int) -> P:
    """Where an array of ``shape`` goes on the ``FSDP_AXIS`` of size ``fsdp``: its
    largest dimension that ``fsdp`` divides is split (big_vision's and nanodo's rule);
    arrays below ``min_bytes``, and those no dimension of which divides, are replicated."""
    size_bytes = math.prod(shape) * itemsize
    divisible = [d for d, length in enumerate(shape) if length % fsdp == 0]
    if fsdp == 1 or size_bytes < min_bytes or not divisible:
        return P()
    split = max(divisible, key=lambda d: (shape[d], -d))
    return P(*(FSDP_AXIS if d == split else None for d in range(len(shape))))


def fsdp_shardings(tree, mesh: jax.sharding.Mesh, min_bytes: int):
    """``NamedSharding`` of every leaf of ``tree`` (arrays or ``jax.ShapeDtypeStruct``)
    by `fsdp_spec`: parameters, their optimizer moments (the same shapes, so the same
    split) and the momentum encoder's copy."""
    fsdp = mesh.shape.get(FSDP_AXIS, 1)
    return jax.tree.map(
        lambda x: NamedSharding(mesh, fsdp_spec(x.shape, fsdp, np.dtype(x.dtype).itemsize, min_bytes)), tree
    )


def shard_loss(
    loss_fn: Callable,
    mesh: jax.sharding.Mesh,
    *,
    axis_name: str | tuple[str, ...] | None = None,
    replicated_argnums: tuple[int, ...] = (),
) -> Callable:
    """Wraps a loss so it is called on global arrays whose dim 0 is split over the mesh.

    ``shard_loss(losses.clip_loss, mesh)(a, b, temperature=0.07)`` takes ``a, b:
    [N, D]`` (already sharded or not), runs ``clip_loss(..., axis_name=...)`` on each
    device's ``[N / devices, D]`` rows inside ``jax.shard_map``, and returns the
    global-batch loss (a pytree of replicated outputs). It is differentiable and jits.

    Args:
      loss_fn: a loss taking ``axis_name``.
      mesh: any mesh, e.g. :func:`make_mesh`'s.
      axis_name: the mesh axes the batch is split over, a name or a tuple (default
        :func:`batch_axes`: ``BATCH_AXES`` on this module's meshes, else all axes).
      replicated_argnums: positional arguments every device gets whole (e.g. proxies).

    Returns:
      ``fn(*arrays, **hyperparameters)``. Array-valued hyperparameters (a learnable
      temperature) are passed in replicated; a hyperparameter that is a pytree holding
      arrays (``losses.Candidates``: ids, extra columns) is split by rows, as the arrays
      are; other values are closed over.
    """
    axis_name = batch_axes(mesh) if axis_name is None else axis_name
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    num_shards = math.prod(mesh.shape[name] for name in names)

    @functools.wraps(loss_fn)
    def sharded(*arrays, **hyperparameters):
        for index, array in enumerate(arrays):
            if index not in replicated_argnums:
                check_multiple(np.shape(array)[0], num_shards, f"argument {index}'s batch size", "the devices")
        is_array = lambda v: isinstance(v, (jax.Array, np.ndarray))  # noqa: E731
        array_kwargs = {k: v for k, v in hyperparameters.items() if is_array(v)}
        row_kwargs = {
            k: v for k, v in hyperparameters.items() if not is_array(v) and any(map(is_array, jax.tree.leaves(v)))
        }
        static_kwargs = {k: v for k, v in hyperparameters.items() if k not in array_kwargs and k not in row_kwargs}

        def per_device(arrays, array_kwargs, row_kwargs):
            return loss_fn(*arrays, **array_kwargs, **row_kwargs, **static_kwargs, axis_name=axis_name)

        in_specs = (
            tuple(P() if i in replicated_argnums else P(names) for i in range(len(arrays))),
            P(),
            P(names),
        )
        return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=P())(
            tuple(arrays), array_kwargs, row_kwargs
        )

    return sharded
