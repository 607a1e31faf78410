"""Label-based metric-learning losses over the global batch.

Each local row (anchor) is compared with all ``N`` rows of the global batch, gathered
over ``axis_name``; pairs of a row with itself are excluded. Memory stays O(N^2) per
device: triplet mining that needs a ``[N, N]`` table per anchor processes anchors in
blocks (``jax.lax.map``, rematerialised in the backward pass) rather than building the
O(N^3) triplet tensor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common
from contrastive_jax.losses.classification import softmax_cross_entropy

TRIPLET_MINING = ("batch_all", "batch_hard", "semi_hard")

# Elements of one anchor block's [block, N, N] triplet table in triplet mining.
_TRIPLET_BLOCK_ELEMENTS = 2**24

# Stands in for an infinite distance or similarity in masked min/max (finite, so that
# gradients through jnp.where stay finite).
_FAR = 1e30


def _pair_masks(labels, labels_global, axis_name):
    """``positives, negatives: [B, N]`` booleans; a row is never its own positive."""
    local_batch = labels.shape[0]
    self_cols = _common.row_offset(local_batch, axis_name) + jnp.arange(local_batch)
    not_self = jnp.arange(labels_global.shape[0])[None, :] != self_cols[:, None]
    same = labels[:, None] == labels_global[None, :]
    return same & not_self, ~same


def _check_labeled(z, labels, axis_name) -> None:
    _common.check_embeddings(z, "z")
    _common.check_labels(labels, z.shape[0])
    _common.check_axis_bound(axis_name)


def contrastive_loss(z: jax.Array, labels: jax.Array, *, margin: float, axis_name=None) -> jax.Array:
    """Pairwise margin contrastive loss (Hadsell et al. 2006).

    For each ordered pair (i, j), i != j, with Euclidean distance d: ``d^2`` if the
    labels match, ``max(0, margin - d)^2`` otherwise.

    Args:
      z: ``[B, D]`` embeddings.
      labels: ``[B]`` integer classes.
      margin: > 0, distance beyond which negatives cost nothing.
      axis_name: mesh axis to gather over, or None.

    Returns:
      Scalar mean over all ``N (N - 1)`` ordered pairs of the global batch.

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``margin`` not > 0, or
        ``axis_name`` not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> round(float(losses.contrastive_loss(z, labels, margin=1.0)), 4)
      0.7154

    References:
      R. Hadsell, S. Chopra, Y. LeCun, `Dimensionality Reduction by Learning an
      Invariant Mapping <https://doi.org/10.1109/CVPR.2006.100>`__, CVPR 2006.
    """
    _check_labeled(z, labels, axis_name)
    _common.check_positive(margin, "margin")
    z_global = _common.gather_rows(z, axis_name)
    labels_global = _common.gather_rows(labels, axis_name)
    positives, negatives = _pair_masks(labels, labels_global, axis_name)
    squared = _common.squared_distances(z, z_global)
    negative_cost = jnp.square(jax.nn.relu(margin - _common.safe_sqrt(squared)))
    pair_cost = jnp.where(positives, squared, 0.0) + jnp.where(negatives, negative_cost, 0.0)
    per_row = jnp.sum(pair_cost, axis=1) / max(z_global.shape[0] - 1, 1)
    return _common.global_mean(per_row, axis_name)


def _per_anchor_blocks(fn, *rows):
    """Applies ``fn`` to each anchor's rows ``[N]``, in blocks bounded in memory.

    ``fn`` is rematerialised (``jax.checkpoint``) so that the backward pass recomputes
    each block's ``[block, N, N]`` table instead of saving every block's: without it the
    gradient holds all N of them, O(N^3).
    """
    num_candidates = rows[0].shape[1]
    block = max(1, min(rows[0].shape[0], _TRIPLET_BLOCK_ELEMENTS // num_candidates**2))
    return jax.lax.map(jax.checkpoint(lambda r: fn(*r)), rows, batch_size=block)


def _batch_all(distances, positives, negatives, margin):
    """Sum and count of the active (> 0) triplet losses of one anchor."""
    losses = jax.nn.relu(distances[:, None] - distances[None, :] + margin)
    losses = jnp.where(positives[:, None] & negatives[None, :], losses, 0.0)
    return jnp.sum(losses), jnp.sum(losses > 1e-16)


def _semi_hard(distances, positives, negatives, margin):
    """Sum and count of one anchor's semi-hard triplet losses, one per positive.

    The negative for positive p is the closest negative farther than p; when there is
    none, the farthest negative (FaceNet; TensorFlow Addons' convention).
    """
    farther = negatives[None, :] & (distances[None, :] > distances[:, None])
    closest_farther = jnp.min(jnp.where(farther, distances[None, :], _FAR), axis=1)
    farthest = jnp.max(jnp.where(negatives, distances, -_FAR))
    chosen = jnp.where(jnp.any(farther, axis=1), closest_farther, farthest)
    valid = positives & jnp.any(negatives)
    losses = jnp.where(valid, jax.nn.relu(distances - chosen + margin), 0.0)
    return jnp.sum(losses), jnp.sum(valid)


def triplet_loss(
    z: jax.Array,
    labels: jax.Array,
    *,
    margin: float,
    mining: str = "batch_all",
    squared: bool = True,
    axis_name=None,
) -> jax.Array:
    """Triplet margin loss ``max(0, d(a, p) - d(a, n) + margin)`` with in-batch mining.

    For an anchor ``a``, a positive ``p`` (same label, not ``a``) and a negative ``n``
    (another label) of the global batch, with ``d`` the (squared) Euclidean distance::

        loss(a, p, n) = max(0, d(a, p) - d(a, n) + margin)

    averaged over the triplets ``mining`` selects.

    Args:
      z: ``[B, D]`` embeddings (anchors are the local rows; positives and negatives
        come from the global batch).
      labels: ``[B]`` integer classes.
      margin: > 0.
      mining: ``"batch_all"``: every valid triplet, averaged over the active ones
        (loss > 0); ``"batch_hard"``: per anchor the farthest positive and closest
        negative (Hermans et al. 2017), averaged over anchors with both;
        ``"semi_hard"``: per (anchor, positive) the closest negative farther than the
        positive, else the farthest negative (Schroff et al. 2015), averaged over
        positive pairs.
      squared: distances are squared Euclidean (True) or Euclidean.
      axis_name: mesh axis to gather over, or None.

    Returns:
      Scalar over the global batch (0 when no triplet is valid).

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``margin`` not > 0, ``mining``
        not one of ``TRIPLET_MINING``, or
        ``axis_name`` not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> round(float(losses.triplet_loss(z, labels, margin=0.2)), 4)
      1.6
      >>> round(float(losses.triplet_loss(z, labels, margin=0.2, mining="batch_hard")), 4)
      1.6

    References:
      F. Schroff, D. Kalenichenko, J. Philbin, `FaceNet: A Unified Embedding for Face
      Recognition and Clustering <https://arxiv.org/abs/1503.03832>`__, CVPR 2015
      (semi-hard mining).

      A. Hermans, L. Beyer, B. Leibe, `In Defense of the Triplet Loss for Person
      Re-Identification <https://arxiv.org/abs/1703.07737>`__, arXiv 2017 (batch-hard
      mining).
    """
    _check_labeled(z, labels, axis_name)
    _common.check_positive(margin, "margin")
    if mining not in TRIPLET_MINING:
        raise ValueError(f"mining must be one of {TRIPLET_MINING}, got {mining!r}.")
    z_global = _common.gather_rows(z, axis_name)
    labels_global = _common.gather_rows(labels, axis_name)
    positives, negatives = _pair_masks(labels, labels_global, axis_name)
    distances = _common.squared_distances(z, z_global)
    if not squared:
        distances = _common.safe_sqrt(distances)
    if mining == "batch_hard":
        hardest_positive = jnp.max(jnp.where(positives, distances, -_FAR), axis=1)
        hardest_negative = jnp.min(jnp.where(negatives, distances, _FAR), axis=1)
        valid = jnp.any(positives, axis=1) & jnp.any(negatives, axis=1)
        per_anchor = jnp.where(valid, jax.nn.relu(hardest_positive - hardest_negative + margin), 0.0)
        return _common.global_mean(per_anchor, axis_name, weights=valid)
    per_anchor_fn = _batch_all if mining == "batch_all" else _semi_hard
    sums, counts = _per_anchor_blocks(lambda d, p, n: per_anchor_fn(d, p, n, margin), distances, positives, negatives)
    return _common.global_mean(sums / jnp.maximum(counts, 1), axis_name, weights=counts)


def _log1p_sum_exp(x: jax.Array, mask: jax.Array) -> jax.Array:
    """``log(1 + sum_{mask} exp(x))`` along the last axis, stable; 0 when nothing is kept."""
    x = jnp.where(mask, x, _common.MASK_VALUE)
    return jax.nn.logsumexp(jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1), axis=1)


def multi_similarity_loss(
    z: jax.Array,
    labels: jax.Array,
    *,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    mining_margin: float | None = None,
    axis_name=None,
) -> jax.Array:
    """Multi-similarity loss (Wang et al. 2019) on cosine similarities S.

    Per anchor i: ``1/alpha log(1 + sum_{p} exp(-alpha (S_ip - base)))
    + 1/beta log(1 + sum_{n} exp(beta (S_in - base)))``.

    Args:
      z: ``[B, D]`` L2-normalised embeddings.
      labels: ``[B]`` integer classes.
      alpha: positive scale.
      beta: negative scale.
      base: similarity margin lambda.
      mining_margin: None keeps every pair; epsilon (0.1 in the paper) keeps negatives
        with ``S_in + eps > min_p S_ip`` and positives with ``S_ip - eps < max_n S_in``.
      axis_name: mesh axis to gather over, or None.

    Returns:
      Scalar mean over the anchors of the global batch.

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``alpha`` or ``beta`` not > 0,
        or
        ``axis_name`` not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> round(float(losses.multi_similarity_loss(z, labels)), 4)
      0.6711

    References:
      X. Wang, X. Han, W. Huang, D. Dong, M. R. Scott, `Multi-Similarity Loss with
      General Pair Weighting for Deep Metric Learning <https://arxiv.org/abs/1904.06627>`__,
      CVPR 2019.
    """
    _check_labeled(z, labels, axis_name)
    for name, value in (("alpha", alpha), ("beta", beta)):
        _common.check_positive(value, name)
    z_global = _common.gather_rows(z, axis_name)
    labels_global = _common.gather_rows(labels, axis_name)
    positives, negatives = _pair_masks(labels, labels_global, axis_name)
    sims = _common.similarity(z, z_global)
    if mining_margin is not None:
        hardest_positive = jnp.min(jnp.where(positives, sims, _FAR), axis=1, keepdims=True)
        hardest_negative = jnp.max(jnp.where(negatives, sims, -_FAR), axis=1, keepdims=True)
        negatives = negatives & (sims + mining_margin > hardest_positive)
        positives = positives & (sims - mining_margin < hardest_negative)
    per_row = (
        _log1p_sum_exp(-alpha * (sims - base), positives) / alpha
        + _log1p_sum_exp(beta * (sims - base), negatives) / beta
    )
    return _common.global_mean(per_row, axis_name)


def batch_prototype_cross_entropy_loss(
    z: jax.Array, labels: jax.Array, *, num_classes: int, temperature, axis_name=None
) -> jax.Array:
    """Softmax cross-entropy against class prototypes built from the global batch.

    Each class's prototype is its features summed over the global batch and divided by
    N (the class mean weighted by the class's share of the batch), and every row is
    classified among the C prototypes::

        c_k  = 1/N sum_{j: y_j = k} z_j                      (row i included)
        loss = 1/N sum_i -log softmax_k(z_i . c_k / temperature)[y_i]

    Expanded, a pull of same-class pairs plus a log-sum-exp over classes::

        loss = -1/(temperature N^2) sum_i sum_{j: y_j = y_i} z_i . z_j
               + 1/N sum_i log sum_k exp(1/(temperature N) sum_{j: y_j = k} z_i . z_j)

    Gradients flow through the prototypes as well as the rows. The same classifier,
    ``theta_k = c_k / lambda``, appears in the derivation of the pairwise cross-entropy
    (PCE) of Boudiaf et al. (ECCV 2020), but this is not their PCE: here the scale is a
    free hyperparameter and the loss has no other terms. Being the cross-entropy of one
    particular linear classifier, it is never below the cross-entropy of the best linear
    classifier on the same features, whereas their PCE is a lower bound on the
    cross-entropy.

    Args:
      z: ``[B, D]`` features.
      labels: ``[B]`` integer classes in ``[0, num_classes)``.
      num_classes: C, the number of classes.
      temperature: > 0, divides the logits ``z_i . c_k``.
      axis_name: mesh axis whose batch the prototypes span, or None.

    Returns:
      Scalar mean over the global batch.

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints, ``temperature`` not > 0,
        or
        ``axis_name`` not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> round(float(losses.batch_prototype_cross_entropy_loss(z, labels, num_classes=2, temperature=0.5)), 4)
      0.6776

    References:
      M. Boudiaf, J. Rony, I. M. Ziko, E. Granger, M. Pedersoli, P. Piantanida, I. Ben
      Ayed, `A Unifying Mutual Information View of Metric Learning: Cross-Entropy vs.
      Pairwise Losses <https://arxiv.org/abs/2003.08983>`__, ECCV 2020 (the same
      classifier, in the derivation of their pairwise cross-entropy).
    """
    _check_labeled(z, labels, axis_name)
    _common.check_temperature(temperature)
    z32 = _common.at_least_float32(z)
    class_sums = jax.ops.segment_sum(z32, labels, num_segments=num_classes)
    global_batch = z.shape[0]
    if axis_name is not None:
        class_sums = jax.lax.psum(class_sums, axis_name)
        global_batch = global_batch * jax.lax.axis_size(axis_name)
    prototypes = class_sums / global_batch
    logits = _common.similarity(z32, prototypes) / temperature
    return _common.global_mean(softmax_cross_entropy(logits, labels), axis_name)
