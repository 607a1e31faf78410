"""Shared pieces of the loss kernels: argument checks and global-batch collectives.

Shape legend used across the package: ``B`` local batch (rows this device owns),
``N`` global batch (all devices), ``D`` embedding dimension, ``C`` classes.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from contrastive_jax import compat
from contrastive_jax.embeddings import at_least_float32, l2_normalize  # noqa: F401  (the kernels' names)

# Masked logits use a large finite negative rather than -inf, so that a row whose every
# candidate is masked still has a finite logsumexp and finite gradients.
MASK_VALUE = -1e9


# --------------------------------------------------------------------------- checks


def check_temperature(temperature, name: str = "temperature") -> None:
    """Rejects a missing or non-positive temperature given as a Python number.

    Traced temperatures (learnable, inside ``jit``) cannot be checked without a host
    round trip; the model keeps those positive by construction (log-space, clamped).
    """
    if temperature is None:
        raise ValueError(
            f"{name} is required: cosine similarities lie in [-1, 1], so without a "
            f"temperature the softmax cannot become peaked and training stalls. Pass "
            f"e.g. {name}=0.07, or a learnable one (see contrastive_jax.models.two_tower)."
        )
    check_positive(
        temperature,
        name,
        hint=f"logits are similarity / {name}; typical values are 0.05-0.2 for softmax losses, 0.1 for SigLIP.",
    )


def check_positive(value, name: str, hint: str = "") -> None:
    """Rejects a non-positive hyperparameter given as a Python number."""
    if isinstance(value, numbers.Real) and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}. {hint}".strip())


def check_embeddings(x, name: str) -> None:
    """Requires a rank-2 ``[B, D]`` embedding array."""
    if jnp.ndim(x) != 2:
        raise ValueError(f"{name} must have shape [B, D], got shape {jnp.shape(x)}.")


def check_pair(a, b, name_a: str, name_b: str) -> None:
    """Requires two ``[B, D]`` arrays of the same shape (row i of one pairs with row i)."""
    check_embeddings(a, name_a)
    check_embeddings(b, name_b)
    if jnp.shape(a) != jnp.shape(b):
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape [B, D] (row i of {name_a} "
            f"is paired with row i of {name_b}), got {jnp.shape(a)} and {jnp.shape(b)}."
        )


def check_labels(labels, batch_size: int, name: str = "labels") -> None:
    """Requires integer class labels of shape ``[batch_size]``."""
    if jnp.shape(labels) != (batch_size,):
        raise ValueError(
            f"{name} must have shape [{batch_size}] (one integer class per row), got shape {jnp.shape(labels)}."
        )
    if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        raise ValueError(f"{name} must be integers, got dtype {jnp.result_type(labels)}.")


def check_axis_bound(axis_name) -> None:
    """Raises a ValueError naming ``axis_name`` when it is not bound by shard_map/pmap."""
    if axis_name is None:
        return
    try:
        jax.lax.axis_index(axis_name)
    except NameError as e:
        raise ValueError(
            f"axis_name={axis_name!r} is not bound: call the loss inside jax.shard_map "
            f"(see contrastive_jax.sharding.shard_loss) or jax.pmap over that axis, or "
            f"pass axis_name=None for a single-device batch."
        ) from e


# ---------------------------------------------------------------------- collectives


def gather_rows(x: jax.Array, axis_name) -> jax.Array:
    """All-gathers ``x: [B, ...]`` over ``axis_name`` into ``[N, ...]`` (device order).

    Gradients flow back through the gather to each row's owner; nothing is rescaled.
    """
    if axis_name is None:
        return x
    return jax.lax.all_gather(x, axis_name, axis=0, tiled=True)


def logsumexp_over_devices(lse, axis_name):
    """The logsumexp over ``axis_name`` of each device's logsumexps ``lse: [M]`` (None stays
    None): the shift out of the gradient, the result differentiable in every ``lse``."""
    if lse is None:
        return None
    shift = jax.lax.pmax(jax.lax.stop_gradient(lse), axis_name)
    return shift + jnp.log(jax.lax.psum(jnp.exp(lse - shift), axis_name))


def global_batch_size(local_batch: int, axis_name) -> int:
    """N: ``local_batch`` rows on each device of ``axis_name`` (B without one)."""
    return local_batch * (1 if axis_name is None else jax.lax.axis_size(axis_name))


def row_offset(local_batch: int, axis_name) -> jax.Array | int:
    """Global index of this device's first row: ``axis_index * B``."""
    if axis_name is None:
        return 0
    return jax.lax.axis_index(axis_name) * local_batch


def is_varying(x: jax.Array, axis_name) -> bool:
    """Whether ``x`` is typed as varying over every axis of ``axis_name`` (a name or a
    tuple of names) by ``jax.shard_map``'s varying-axis checks (``check_vma=True``).

    False under ``pmap`` and ``check_vma=False``, where nothing is typed."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    return set(names) <= compat.varying_axes(x)


def _sum_loss_over_devices(x: jax.Array, axis_name) -> jax.Array:
    """Sum of a per-device loss share ``x`` over ``axis_name``, with exact gradients.

    Only for the final reduction of a loss: each device's share must already hold all
    of its dependence on other devices (through ``all_gather`` or ``psum``).

    Typed (``shard_map`` with ``check_vma=True``), ``psum``'s transpose is exact
    wherever the gradient is taken. Untyped (``check_vma=False``, ``pmap``) the loss
    cannot see whether the gradient is taken outside the ``shard_map`` (JAX splits a
    replicated output's cotangent over the K devices) or inside it per device (the
    ``pmap`` convention, followed by a ``pmean`` of the gradients): the two differ by
    exactly K for any per-device function. Untyped, the loss follows the convention of
    a per-example loss: the value is the global sum, and each device's gradient is that
    of K times its own share (the gradient of its "local loss"), so that both the
    gradient outside ``shard_map`` and the ``pmean`` of per-device gradients are exact.
    """
    if axis_name is None:
        return x
    total = jax.lax.psum(x, axis_name)
    if is_varying(x, axis_name):
        return total
    local_loss = jax.lax.axis_size(axis_name) * x
    return local_loss + jax.lax.stop_gradient(total - local_loss)


def global_mean(per_row: jax.Array, axis_name, weights: jax.Array | None = None) -> jax.Array:
    """Mean of ``per_row: [B]`` over the global batch, the same value on every device.

    With ``weights: [B]`` (constants, e.g. "this anchor has a positive"), a weighted
    mean over the global batch; 0 where the total weight is 0.
    """
    per_row = at_least_float32(per_row)
    if weights is None:
        weights = jnp.ones_like(per_row)
    weights = jax.lax.stop_gradient(weights.astype(per_row.dtype))
    total = _sum_loss_over_devices(jnp.sum(per_row * weights), axis_name)
    count = _sum_loss_over_devices(jnp.sum(weights), axis_name)
    return total / jnp.maximum(count, 1e-12)


# ---------------------------------------------------------------------- similarities


def similarity(x: jax.Array, y: jax.Array) -> jax.Array:
    """Dot products ``x @ y.T`` in at least float32 (embeddings may be bfloat16): ``[B, N]``."""
    dtype = jnp.promote_types(jnp.promote_types(x.dtype, y.dtype), jnp.float32)
    return jnp.matmul(x, y.T, preferred_element_type=dtype)


def squared_distances(x: jax.Array, y: jax.Array) -> jax.Array:
    """Squared Euclidean distances ``[B, N]`` between rows of ``x`` and ``y``, >= 0."""
    x, y = at_least_float32(x), at_least_float32(y)
    sq_x = jnp.sum(x * x, axis=-1)[:, None]
    sq_y = jnp.sum(y * y, axis=-1)[None, :]
    return jnp.maximum(sq_x + sq_y - 2.0 * similarity(x, y), 0.0)


def safe_sqrt(x: jax.Array) -> jax.Array:
    """``sqrt`` with a finite gradient at 0 (duplicate embeddings)."""
    return jnp.sqrt(jnp.maximum(x, 1e-12))
