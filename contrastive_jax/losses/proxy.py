"""Proxy and normalised-softmax losses: one learnable vector per class.

These compare each example with class proxies (weights), not with other examples, so
they need no collective: they return per-example losses ``[B]``; average them over the
global batch yourself (``jax.lax.pmean`` under ``shard_map``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common
from contrastive_jax.losses.classification import softmax_cross_entropy


def _check_proxies(z, labels, proxies, name) -> None:
    _common.check_embeddings(z, "z")
    _common.check_labels(labels, z.shape[0])
    _common.check_embeddings(proxies, name)
    if proxies.shape[1] != z.shape[1]:
        raise ValueError(f"{name} must have shape [C, {z.shape[1]}] (one D-dim vector per class), got {proxies.shape}.")


def proxy_nca_loss(z: jax.Array, labels: jax.Array, proxies: jax.Array, *, temperature) -> jax.Array:
    """Proxy-NCA (Movshovitz-Attias et al. 2017) in its ProxyNCA++ form (Teh et al. 2020).

    Softmax cross-entropy over ``-|z_n - p_n|^2 / temperature`` where ``z_n`` and the
    proxies ``p_n`` are L2-normalised; the softmax runs over all C proxies.

    Args:
      z: ``[B, D]`` embeddings.
      labels: ``[B]`` integer classes in ``[0, C)``.
      proxies: ``[C, D]`` learnable class proxies.
      temperature: scalar > 0 (ProxyNCA++ uses 1/9).

    Returns:
      ``[B]`` per-example losses.
    """
    _check_proxies(z, labels, proxies, "proxies")
    _common.check_temperature(temperature)
    distances = _common.squared_distances(_common.l2_normalize(z), _common.l2_normalize(proxies))
    return softmax_cross_entropy(-distances / temperature, labels)


def _margin_softmax(z, labels, weights, scale, target_logit_fn) -> jax.Array:
    """CE over ``scale * cos(z, w_c)`` with the true class's cosine replaced."""
    cosines = _common.similarity(_common.l2_normalize(z), _common.l2_normalize(weights))
    true_class = jax.nn.one_hot(labels, weights.shape[0], dtype=bool)
    logits = jnp.where(true_class, target_logit_fn(cosines), cosines)
    return softmax_cross_entropy(scale * logits, labels)


def cosface_loss(z: jax.Array, labels: jax.Array, weights: jax.Array, *, scale: float, margin: float) -> jax.Array:
    """CosFace / large-margin cosine loss (Wang et al. 2018): target logit ``s (cos - m)``.

    Args:
      z: ``[B, D]`` embeddings (normalised inside).
      labels: ``[B]`` classes.
      weights: ``[C, D]`` class weights (normalised inside).
      scale: s > 0 (e.g. 30-64).
      margin: m (e.g. 0.35).

    Returns:
      ``[B]`` per-example losses.
    """
    _check_proxies(z, labels, weights, "weights")
    _common.check_positive(scale, "scale")
    return _margin_softmax(z, labels, weights, scale, lambda cos: cos - margin)


def arcface_loss(z: jax.Array, labels: jax.Array, weights: jax.Array, *, scale: float, margin: float) -> jax.Array:
    """ArcFace / additive angular margin loss (Deng et al. 2019): target ``s cos(theta + m)``.

    Where ``theta + m`` would pass pi the target logit continues linearly as
    ``cos(theta) - m sin(m)`` (the reference implementation), keeping it monotonic.

    Args:
      z: ``[B, D]`` embeddings (normalised inside).
      labels: ``[B]`` classes.
      weights: ``[C, D]`` class weights (normalised inside).
      scale: s > 0 (e.g. 64).
      margin: m in radians (e.g. 0.5).

    Returns:
      ``[B]`` per-example losses.
    """
    _check_proxies(z, labels, weights, "weights")
    _common.check_positive(scale, "scale")

    def target_logit(cos):
        sin = _common.safe_sqrt(1.0 - jnp.square(cos))
        cos_plus_margin = cos * jnp.cos(margin) - sin * jnp.sin(margin)
        return jnp.where(cos > jnp.cos(jnp.pi - margin), cos_plus_margin, cos - margin * jnp.sin(margin))

    return _margin_softmax(z, labels, weights, scale, target_logit)
