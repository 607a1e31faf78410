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
    proxies ``p_n`` are L2-normalised; the softmax runs over all C proxies::

        loss_i = -log( exp(-|z_i - p_{y_i}|^2 / T) / sum_c exp(-|z_i - p_c|^2 / T) )

    Args:
      z: ``[B, D]`` embeddings.
      labels: ``[B]`` integer classes in ``[0, C)``.
      proxies: ``[C, D]`` learnable class proxies.
      temperature: scalar > 0 (ProxyNCA++ uses 1/9).

    Returns:
      ``[B]`` per-example losses.

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``proxies``
        not ``[C, D]``, or ``temperature`` not > 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> proxies = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # [C, D], one per class
      >>> [round(x, 4) for x in losses.proxy_nca_loss(z, labels, proxies, temperature=0.25).tolist()]
      [0.0003, 8.0003, 0.1839]

    References:
      Y. Movshovitz-Attias, A. Toshev, T. K. Leung, S. Ioffe, S. Singh, `No Fuss
      Distance Metric Learning using Proxies <https://arxiv.org/abs/1703.07464>`__,
      ICCV 2017.

      E. W. Teh, T. DeVries, G. W. Taylor, `ProxyNCA++: Revisiting and Revitalizing
      Proxy Neighborhood Component Analysis <https://arxiv.org/abs/2004.01113>`__,
      ECCV 2020.
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

    With ``cos_c`` the cosine of ``z_i`` and class ``c``'s weight::

        loss_i = -log( exp(s (cos_{y_i} - m)) / (exp(s (cos_{y_i} - m)) + sum_{c != y_i} exp(s cos_c)) )

    Args:
      z: ``[B, D]`` embeddings (normalised inside).
      labels: ``[B]`` classes.
      weights: ``[C, D]`` class weights (normalised inside).
      scale: s > 0 (e.g. 30-64).
      margin: m (e.g. 0.35).

    Returns:
      ``[B]`` per-example losses.

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``weights``
        not ``[C, D]``, or ``scale`` not > 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> proxies = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # [C, D], one per class
      >>> [round(x, 4) for x in losses.cosface_loss(z, labels, proxies, scale=10.0, margin=0.35).tolist()]
      [0.0015, 13.5, 1.7014]

    References:
      H. Wang et al., `CosFace: Large Margin Cosine Loss for Deep Face Recognition
      <https://arxiv.org/abs/1801.09414>`__, CVPR 2018.
    """
    _check_proxies(z, labels, weights, "weights")
    _common.check_positive(scale, "scale")
    return _margin_softmax(z, labels, weights, scale, lambda cos: cos - margin)


def arcface_loss(z: jax.Array, labels: jax.Array, weights: jax.Array, *, scale: float, margin: float) -> jax.Array:
    """ArcFace / additive angular margin loss (Deng et al. 2019): target ``s cos(theta + m)``.

    With ``theta_c`` the angle between ``z_i`` and class ``c``'s weight::

        loss_i = -log( exp(s cos(theta_{y_i} + m))
                       / (exp(s cos(theta_{y_i} + m)) + sum_{c != y_i} exp(s cos theta_c)) )

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

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``weights``
        not ``[C, D]``, or ``scale`` not > 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> proxies = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # [C, D], one per class
      >>> [round(x, 4) for x in losses.arcface_loss(z, labels, proxies, scale=10.0, margin=0.5).tolist()]
      [0.0002, 14.7943, 2.0011]

    References:
      J. Deng, J. Guo, N. Xue, S. Zafeiriou, `ArcFace: Additive Angular Margin Loss for
      Deep Face Recognition <https://arxiv.org/abs/1801.07698>`__, CVPR 2019.
    """
    _check_proxies(z, labels, weights, "weights")
    _common.check_positive(scale, "scale")

    def target_logit(cos):
        sin = _common.safe_sqrt(1.0 - jnp.square(cos))
        cos_plus_margin = cos * jnp.cos(margin) - sin * jnp.sin(margin)
        return jnp.where(cos > jnp.cos(jnp.pi - margin), cos_plus_margin, cos - margin * jnp.sin(margin))

    return _margin_softmax(z, labels, weights, scale, target_logit)
