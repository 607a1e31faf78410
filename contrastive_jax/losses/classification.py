"""Per-example classification losses: softmax cross-entropy, sigmoid BCE, focal loss.

Softmax cross-entropy, label smoothing and sigmoid BCE are optax's, behind our argument
checks and float32 promotion; the softmax focal loss is ours (optax has the sigmoid one).

These are per-example (no reduction): average them yourself, over the global batch
under ``shard_map`` with ``jax.lax.pmean``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from contrastive_jax.losses._common import MASK_VALUE, at_least_float32


def _check_logits_labels(logits, labels) -> None:
    if jnp.ndim(logits) < 1:
        raise ValueError(f"logits must have shape [..., C], got shape {jnp.shape(logits)}.")
    if jnp.shape(labels) != jnp.shape(logits)[:-1]:
        raise ValueError(
            f"labels must have shape {jnp.shape(logits)[:-1]} (logits' shape without the "
            f"class axis), got {jnp.shape(labels)}."
        )
    if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        raise ValueError(f"labels must be integer class indices, got {jnp.result_type(labels)}.")


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array, *, label_smoothing: float = 0.0) -> jax.Array:
    """Softmax cross-entropy with integer labels, per example.

    With the target ``t = (1 - s) onehot(y) + s / C`` (``t = onehot(y)`` without
    smoothing)::

        loss = -sum_c t_c log softmax(logits)_c

    Args:
      logits: ``[B, C]`` (any leading shape ``[..., C]``) unnormalised scores.
      labels: ``[B]`` integer class indices in ``[0, C)``.
      label_smoothing: the target is ``(1 - s) * onehot + s / C``.

    Returns:
      ``[B]`` losses, computed in float32 (or wider). The gradient w.r.t. ``logits`` is
      ``softmax(logits) - target``.

    Raises:
      ValueError: ``labels`` are not integers of ``logits``' shape without its last
        axis, or ``label_smoothing`` is not in ``[0, 1)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> logits = jnp.array([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
      >>> labels = jnp.array([0, 2])
      >>> [round(x, 4) for x in losses.softmax_cross_entropy(logits, labels).tolist()]
      [0.4076, 0.0949]
      >>> [round(x, 4) for x in losses.softmax_cross_entropy(logits, labels, label_smoothing=0.1).tolist()]
      [0.5076, 0.2949]

    References:
      C. Szegedy, V. Vanhoucke, S. Ioffe, J. Shlens, Z. Wojna, `Rethinking the
      Inception Architecture for Computer Vision <https://arxiv.org/abs/1512.00567>`__,
      CVPR 2016 (label smoothing).
    """
    _check_logits_labels(logits, labels)
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
    logits = at_least_float32(logits)
    if label_smoothing == 0.0:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    targets = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    return optax.softmax_cross_entropy(logits, optax.smooth_labels(targets, label_smoothing))


def binary_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Sigmoid binary cross-entropy, per element.

    Args:
      logits: ``[...]`` unnormalised scores.
      labels: ``[...]`` targets in ``[0, 1]`` (same shape as ``logits``).

    Returns:
      ``[...]`` losses ``-(y log sigmoid(x) + (1 - y) log sigmoid(-x))`` in float32.

    Raises:
      ValueError: ``logits`` and ``labels`` differ in shape.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> logits = jnp.array([0.0, 2.0, -1.0])
      >>> labels = jnp.array([1.0, 0.0, 0.0])
      >>> [round(x, 4) for x in losses.binary_cross_entropy(logits, labels).tolist()]
      [0.6931, 2.1269, 0.3133]

    References:
      `Cross-entropy <https://en.wikipedia.org/wiki/Cross-entropy>`__, Wikipedia.
    """
    if jnp.shape(logits) != jnp.shape(labels):
        raise ValueError(
            f"logits and labels must have the same shape, got {jnp.shape(logits)} and {jnp.shape(labels)}."
        )
    logits = at_least_float32(logits)
    return optax.sigmoid_binary_cross_entropy(logits, labels.astype(logits.dtype))


def focal_loss(
    logits: jax.Array,
    labels: jax.Array,
    *,
    gamma: float = 2.0,
    alpha: float | jax.Array | None = None,
) -> jax.Array:
    """Softmax focal loss (Lin et al. 2017), per example.

    ``-alpha_y (1 - p_y)^gamma log p_y``; ``gamma = 0`` and ``alpha = None`` give the
    softmax cross-entropy. The modulating factor is computed in log space,
    ``(1 - p_y)^gamma = exp(gamma * log sum_{k != y} p_k)``, so that its gradient stays
    finite for confident rows (``p_y`` rounding to 1), where ``(1 - p_y)^gamma`` has an
    infinite derivative for ``gamma < 1``.

    Args:
      logits: ``[B, C]`` unnormalised scores.
      labels: ``[B]`` integer class indices.
      gamma: focusing parameter, >= 0.
      alpha: None, a scalar weight, or ``[C]`` per-class weights.

    Returns:
      ``[B]`` losses in float32.

    Raises:
      ValueError: ``labels`` are not integers of ``logits``' shape without its last
        axis, or ``gamma`` is negative.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> logits = jnp.array([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
      >>> labels = jnp.array([0, 2])
      >>> [round(x, 4) for x in losses.focal_loss(logits, labels, gamma=2.0).tolist()]
      [0.0457, 0.0008]
      >>> [round(x, 4) for x in losses.focal_loss(logits, labels, gamma=0.0).tolist()]  # cross-entropy
      [0.4076, 0.0949]

    References:
      T.-Y. Lin, P. Goyal, R. Girshick, K. He, P. Dollár, `Focal Loss for Dense Object
      Detection <https://arxiv.org/abs/1708.02002>`__, ICCV 2017.
    """
    _check_logits_labels(logits, labels)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}.")
    log_probs = jax.nn.log_softmax(at_least_float32(logits), axis=-1)
    is_true = jax.nn.one_hot(labels, logits.shape[-1], dtype=bool)
    log_p_true = jnp.sum(jnp.where(is_true, log_probs, 0.0), axis=-1)
    log_p_other = jax.nn.logsumexp(jnp.where(is_true, MASK_VALUE, log_probs), axis=-1)
    loss = -jnp.exp(gamma * log_p_other) * log_p_true
    if alpha is not None:
        alpha = jnp.asarray(alpha, loss.dtype)
        loss = loss * (alpha[labels] if alpha.ndim == 1 else alpha)
    return loss
