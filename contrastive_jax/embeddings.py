"""What a model hands a loss: embeddings `[..., D]` in float32 or wider, scaled to unit
norm. Below both wings, so that models normalise their towers' outputs without importing
the losses, and the losses compute in the same precision."""

import jax
import jax.numpy as jnp


def at_least_float32(x: jax.Array) -> jax.Array:
    """``x`` in float32, or wider if it already is (bfloat16 -> float32; float64 kept)."""
    return jnp.asarray(x).astype(jnp.promote_types(jnp.result_type(x), jnp.float32))


def l2_normalize(x: jax.Array) -> jax.Array:
    """Rows of ``x: [..., D]`` scaled to unit norm, in float32 or wider (finite at 0)."""
    x = at_least_float32(x)
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-12))
