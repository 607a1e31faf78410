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

**Where the device shares fail**: with in-batch negatives the shares are not independent
small-batch gradients. A row's push on its hard negatives lands on the devices that own
those negatives, so the shares are anti-correlated (the mean pairwise inner product of
8 shares was -0.41 ``|G_big|^2`` at N = 256 in the batch-size study), and the same
decomposition reports "noise" even for a full-data gradient. For contrastive losses use
`replicates` instead: R independent global batches, each with its own negatives.

**Replicates** (`replicates`, `compare`): R gradients `g_r`, each of one independent
global batch of B examples. Unbiased, for any loss: ``|E g|^2`` from the mean of
``<g_r, g_s>`` over r != s, and ``tr Cov(g)`` from their spread
(``sum_r |g_r - mean|^2 / (R - 1)``). For a per-example loss ``tr Cov(g) = tr(Sigma) / B``; a contrastive objective
changes with B (its negatives), so `compare` measures at N and N / 4: the variance
ratio (4 when the noise scales as 1/B) and the objective's bias ``|E g_{N/4} - E g_N|^2``,
reported apart (McCandlish's model assumes there is none).
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
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


class Replicates(NamedTuple):
    """Unbiased moments of R independent gradients at one batch size."""

    mean_sq_norm: float  # |E g|^2: the mean of <g_r, g_s> over the pairs r != s
    trace_cov: float  # tr Cov(g): sum_r |g_r - mean|^2 / (R - 1)
    count: int  # R


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _pair_moments(gram: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(|E g|^2, tr Cov(g))` as U-statistics over the pairs of distinct replicates, each
    replicate k taken `counts[..., k]` times (a bootstrap draw; all ones: the sample).

    Args:
      gram: [R, R] the replicates' inner products.
      counts: [..., R] how often each replicate is drawn (summing to R).
    """
    off = gram - np.diag(np.diag(gram))
    pair_sum = np.einsum("...k,kl,...l->...", counts, off, counts)  # pairs of distinct replicates
    pairs = counts.sum(-1) ** 2 - np.sum(counts**2, -1)
    pairs = np.where(pairs == 0, np.nan, pairs)  # one replicate drawn R times: no pair
    # tr Cov = the mean over those pairs of |g_k - g_l|^2 / 2
    spread = np.sum(counts * np.diag(gram) * (counts.sum(-1, keepdims=True) - counts), -1) - pair_sum
    return pair_sum / pairs, spread / pairs


def replicates(grads: Sequence[Any]) -> tuple[Replicates, np.ndarray]:
    """`(moments, mean gradient)` of R >= 2 gradients (pytrees), each of an independent batch."""
    flat = np.stack([_flat(g) for g in grads])  # [R, P]
    count = len(flat)
    if count < 2:
        raise ValueError(f"need 2 or more independent gradients, got {count}.")
    mean_sq, trace_cov = _pair_moments(flat @ flat.T, np.ones(count))
    return Replicates(float(mean_sq), float(trace_cov), count), flat.mean(axis=0)


def _statistics(gram: np.ndarray, big: int, n: int, counts_big: np.ndarray, counts_small: np.ndarray) -> dict:
    """`compare`'s quantities from the joint [R_big + R_small]^2 Gram matrix (the big
    batch's replicates first) and each side's draw counts ([..., R_big], [..., R_small])."""
    big_sq, big_cov = _pair_moments(gram[:big, :big], counts_big)
    small_sq, small_cov = _pair_moments(gram[big:, big:], counts_small)
    cross = np.einsum("...k,kl,...l->...", counts_big, gram[:big, big:], counts_small) / (
        counts_big.sum(-1) * counts_small.sum(-1)
    )
    bias = small_sq + big_sq - 2 * cross  # |E g_{n/4} - E g_n|^2, unbiased
    return {
        "g_squared": big_sq,
        "trace_sigma": n * big_cov,
        "b_simple": n * big_cov / big_sq,
        "variance_ratio": small_cov / big_cov,
        "bias_squared": bias,
        "bias_over_g": bias / big_sq,
    }


def compare(
    at_n: Sequence[Any], at_quarter: Sequence[Any], n: int, *, resamples: int = 0, seed: int = 0
) -> dict[str, float]:
    """The replicate noise scale at batch `n` from R gradients at `n` (`at_n`) and R at
    `n / 4` (`at_quarter`), each of an independent global batch (disjoint examples: the
    estimator assumes independence, and batches that share examples bias it).

    Args:
      at_n: R >= 2 gradient pytrees, one per independent batch of `n` examples.
      at_quarter: R' >= 2 at `n / 4`.
      n: the larger batch.
      resamples: with > 0, a bootstrap over the replicates (each side's resampled with
        replacement, the pair statistics over distinct replicates only, so a draw's
        duplicates add no spurious signal) gives each quantity's 95% percentile interval
        (a draw of one replicate over and over has no pairs: left out).
      seed: the bootstrap's seed.

    Returns:
      `g_squared` (``|E g_n|^2``), `trace_sigma` (n tr Cov(g_n), per example), `b_simple`
      (their ratio), `variance_ratio` (tr Cov(g_{n/4}) / tr Cov(g_n): 4 when the noise
      scales as 1/B), `bias_squared` (``|E g_{n/4} - E g_n|^2``, unbiased: the
      objective's change with the batch size, which is not noise) and `bias_over_g`
      (bias_squared / g_squared); with `resamples`, `<quantity>_interval`: `[low, high]`.
    """
    flat = np.stack([_flat(g) for g in (*at_n, *at_quarter)])
    big, small = len(at_n), len(at_quarter)
    if min(big, small) < 2:
        raise ValueError(f"need 2 or more independent gradients, got {min(big, small)}.")
    gram = flat @ flat.T
    point = {k: float(v) for k, v in _statistics(gram, big, n, np.ones(big), np.ones(small)).items()}
    if resamples:
        rng = np.random.default_rng(seed)
        draws = [rng.multinomial(r, np.full(r, 1 / r), size=resamples) for r in (big, small)]  # [resamples, R]
        spread = _statistics(gram, big, n, *draws)
        for key, values in spread.items():
            point[f"{key}_interval"] = [float(q) for q in np.nanquantile(values, [0.025, 0.975])]
    return point


def adam_preconditioned(grads: Any, opt_state: Any, *, b2: float = 0.999, eps: float = 1e-8) -> Any:
    """`grads` divided elementwise by Adam's denominator ``sqrt(v_hat) + eps`` in
    `opt_state` (the step's own scale: the noise scale of the preconditioned gradient is
    the one an Adam step feels). `b2` and `eps` are `optax.adamw`'s defaults, which
    `optimizer.make_optimizer` uses.

    Args:
      grads: a gradient pytree shaped like the parameters.
      opt_state: an optax state holding one `ScaleByAdamState` (AdamW's; its `nu`
        shaped like `grads`, its `count` the steps taken, >= 1).
    """
    adam = optax.tree_utils.tree_get(opt_state, "ScaleByAdamState")
    correction = 1 - b2 ** int(adam.count)
    return jax.tree.map(lambda g, v: np.asarray(g) / (np.sqrt(np.asarray(v) / correction) + eps), grads, adam.nu)
