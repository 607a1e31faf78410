"""The data mesh and the one place where a loss is wrapped in ``jax.shard_map``.

contrastive_jax is data parallel: a 1-D mesh whose single axis, ``DATA_AXIS``, splits
the global batch. Losses take ``axis_name=DATA_AXIS`` and span the global batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.config_lib import ConfigError

DATA_AXIS = "data"


def make_mesh(num_devices: int | None = None) -> jax.sharding.Mesh:
    """A 1-D mesh over the first ``num_devices`` devices (all by default).

    The axis is ``Auto`` (``jax.make_mesh`` now defaults to ``Explicit``), so arrays
    sharded on it work with plain ``jax.jit`` and ``NamedSharding``.
    """
    available = jax.device_count()
    num_devices = available if num_devices is None else num_devices
    if not 1 <= num_devices <= available:
        raise ConfigError(
            f"num_devices must be in [1, {available}] (the devices JAX sees), got "
            f"{num_devices}. On CPU, simulate more with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing JAX."
        )
    return jax.make_mesh(
        (num_devices,),
        (DATA_AXIS,),
        axis_types=(jax.sharding.AxisType.Auto,),
        devices=jax.devices()[:num_devices],
    )


def data_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Sharding of a batch array: leading (batch) axis split over ``DATA_AXIS``."""
    return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Sharding of an array every device holds whole (parameters, scalars)."""
    return NamedSharding(mesh, P())


def check_batch_divides(global_batch_size: int, num_devices: int, name: str = "the batch size") -> None:
    """Raises a ConfigError when the global batch does not split evenly over devices.

    `name` says what the number is, e.g. "config.train.global_batch_size".
    """
    if global_batch_size % num_devices:
        lower = global_batch_size - global_batch_size % num_devices
        raise ConfigError(
            f"{name} is {global_batch_size}, which does not divide over {num_devices} devices; "
            f"use a multiple of {num_devices} (e.g. {lower or num_devices} or "
            f"{lower + num_devices})."
        )


def shard_loss(loss_fn: Callable, mesh: jax.sharding.Mesh, *, replicated_argnums: tuple[int, ...] = ()) -> Callable:
    """Wraps a loss so it is called on global arrays whose dim 0 is split over the mesh.

    ``shard_loss(losses.clip_loss, mesh)(a, b, temperature=0.07)`` takes ``a, b:
    [N, D]`` (already sharded or not), runs ``clip_loss(..., axis_name=DATA_AXIS)`` on
    each device's ``[N / devices, D]`` rows inside ``jax.shard_map``, and returns the
    global-batch loss (a pytree of replicated outputs). It is differentiable and jits.

    Args:
      loss_fn: a loss taking ``axis_name``.
      mesh: a mesh with a ``DATA_AXIS`` axis (see :func:`make_mesh`).
      replicated_argnums: positional arguments every device gets whole (e.g. proxies).

    Returns:
      ``fn(*arrays, **hyperparameters)``. Array-valued hyperparameters (a learnable
      temperature) are passed in replicated; other values are closed over.
    """
    num_devices = mesh.shape[DATA_AXIS]

    @functools.wraps(loss_fn)
    def sharded(*arrays, **hyperparameters):
        for index, array in enumerate(arrays):
            if index not in replicated_argnums:
                check_batch_divides(np.shape(array)[0], num_devices, f"argument {index}'s batch size")
        array_kwargs = {k: v for k, v in hyperparameters.items() if isinstance(v, (jax.Array, np.ndarray))}
        static_kwargs = {k: v for k, v in hyperparameters.items() if k not in array_kwargs}

        def per_device(arrays, array_kwargs):
            return loss_fn(*arrays, **array_kwargs, **static_kwargs, axis_name=DATA_AXIS)

        in_specs = (
            tuple(P() if i in replicated_argnums else P(DATA_AXIS) for i in range(len(arrays))),
            P(),
        )
        return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=P())(tuple(arrays), array_kwargs)

    return sharded


def compare_with_single_device(loss_fn, arrays, hyperparameters, mesh):
    """Single-device and sharded value of a loss, and the max gradient difference.

    Args:
      loss_fn: a loss taking `axis_name` (see `shard_loss`).
      arrays: its positional global arrays, the first `[N, D]`, e.g. `(a, b)` or
        `(z, labels)`.
      hyperparameters: its keyword arguments.
      mesh: the 1-D data mesh the sharded call splits N over.

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
