"""The gradient noise scale: where a larger batch stops buying fewer steps.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", Appendix A): a
batch larger than about ``B_simple = tr(Sigma) / |G|^2`` buys few fewer steps, where
``G`` is the true gradient and ``Sigma`` the per-example gradient covariance. Both come
from squared gradient norms at two batch sizes, each averaged over steps before the
ratio (`estimate`)::

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

A data-parallel step has both for the price of one more norm (`per_device_value_and_grad`):
the big batch is the global one (N rows), the small batches are the devices' shares
(B = N / K rows), and device d's gradient is its rows' share of the global loss's
gradient, ``g_d`` (the sum over devices is the global gradient), scaled by K to a mean
over its B rows. Each row is still scored against all N columns, so the small-batch
gradient sees the global negatives: the estimate measures the gradient's noise, not the
bias of fewer negatives (Chen et al., NeurIPS 2022).

With `config.train.log_noise_scale` the train step returns the two squared norms
(`noise_small_sq_norm`, `noise_big_sq_norm`); the loop averages them over each logging
window and logs `train/noise_scale`, `B_simple` from those means.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from contrastive_jax import compat

SMALL_KEY, BIG_KEY = "noise_small_sq_norm", "noise_big_sq_norm"  # the step's metric names


class NoiseScale(NamedTuple):
    """McCandlish et al.'s unbiased estimates from averaged squared gradient norms."""

    g_squared: float  # |G|^2
    trace_sigma: float  # tr(Sigma), per example
    b_simple: float  # tr(Sigma) / |G|^2


def estimate(small_sq_norm: float, big_sq_norm: float, b_small: int, b_big: int) -> NoiseScale:
    """``B_simple`` from the mean squared gradient norms at batch sizes ``b_small < b_big``."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}.")
    g_squared = (b_big * big_sq_norm - b_small * small_sq_norm) / (b_big - b_small)
    trace_sigma = (small_sq_norm - big_sq_norm) / (1 / b_small - 1 / b_big)
    return NoiseScale(g_squared, trace_sigma, trace_sigma / g_squared)


def per_device_value_and_grad(
    loss_fn, params: Any, axis_name: str
) -> tuple[tuple[Any, Any], Any, jax.Array, jax.Array]:
    """``jax.value_and_grad(loss_fn, has_aux=True)`` inside ``shard_map``, plus the noise
    scale's squared norms.

    Args:
      loss_fn: ``params -> (loss, aux)`` for this device's rows; the loss is the global
        one (the same on every device, e.g. a ``pmean`` of the rows' losses).
      params: the replicated parameters.
      axis_name: the data axis, K devices of B rows each.

    Returns:
      ``((loss, aux), grads, small_sq_norm, big_sq_norm)``: ``grads`` the global
      gradient (replicated), ``small_sq_norm`` the mean over devices of ``|K g_d|^2``
      (device d's share of the gradient as a mean over its B rows), ``big_sq_norm``
      ``|grads|^2``.
    """
    local_params = jax.tree.map(lambda p: compat.cast_varying(p, axis_name), params)
    (loss, aux), local_grads = jax.value_and_grad(loss_fn, has_aux=True)(local_params)
    num_devices = jax.lax.axis_size(axis_name)
    grads = jax.lax.psum(local_grads, axis_name)
    small = jax.lax.pmean(jnp.square(optax.tree.norm(local_grads)), axis_name) * num_devices**2
    return (loss, aux), grads, small, jnp.square(optax.tree.norm(grads))


def window_b_simple(windows: list[dict[str, float]], global_batch_size: int, num_devices: int) -> float:
    """``B_simple`` from the steps' squared norms (`SMALL_KEY`, `BIG_KEY`) averaged over ``windows``."""
    small = sum(w[SMALL_KEY] for w in windows) / len(windows)
    big = sum(w[BIG_KEY] for w in windows) / len(windows)
    return estimate(small, big, global_batch_size // num_devices, global_batch_size).b_simple
