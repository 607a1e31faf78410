"""The supervised contrastive loss (SupCon) over the global batch, and its statistics'
spec, shared with the cross-batch memory (:mod:`~contrastive_jax.losses.queues`).

Written once in the global view: ``axis_name`` spans the global batch (embeddings and
labels gathered), and ``chunk_size`` / ``collective`` / ``matmul_dtype`` change how the
logits are computed, not the result (:mod:`~contrastive_jax.losses.logit_stats`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, logit_stats, pairs
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming


def _positive_terms(logits, same_id, same_label):
    """SupCon's per-pair terms: the logit of each positive, and the positive indicator."""
    positives = same_label & ~same_id
    return {
        "positive_logits": jnp.where(positives, logits, 0.0),
        "num_positives": positives.astype(jnp.float32),
    }


SUPCON = PairSpec(row_logsumexp=True, exclude_self=True, pair_terms=_positive_terms)


def supcon_loss(
    z: jax.Array,
    labels: jax.Array,
    *,
    temperature,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
) -> jax.Array:
    """Supervised contrastive loss (Khosla et al. 2020, L_out), several positives per anchor.

    For anchor i with positives P(i) = {p != i : labels[p] == labels[i]}:
    ``-1/|P(i)| sum_p log( exp(s_ip / T) / sum_{a != i} exp(s_ia / T) )``. For several
    views per example, concatenate the views and repeat the labels.

    Args:
      z: ``[B, D]`` L2-normalised embeddings.
      labels: ``[B]`` integer classes.
      temperature: scalar > 0.
      axis_name: mesh axis to gather embeddings and labels over, or None.
      chunk_size: None for the dense ``[B, N]`` logits, an int tile edge (it must divide
        N; the local B with the ring) or ``"auto"``; changes the memory, not the result
        (details: :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).

    Returns:
      Scalar mean over the anchors of the global batch that have at least one positive
      (anchors without one are skipped; 0 if none has).

    Raises:
      ValueError: ``z`` is not ``[B, D]``, ``labels`` not ``[B]`` ints,
        ``temperature`` not > 0, or ``axis_name`` not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])  # anchor 2 has no positive: skipped
      >>> round(float(losses.supcon_loss(z, labels, temperature=0.1)), 4)
      7.0014

    References:
      P. Khosla et al., `Supervised Contrastive Learning
      <https://arxiv.org/abs/2004.11362>`__, NeurIPS 2020.
    """
    _common.check_embeddings(z, "z")
    _common.check_labels(labels, z.shape[0])
    _common.check_temperature(temperature)
    _common.check_axis_bound(axis_name)
    ids = RowIds(pairs.local_ids(z.shape[0], axis_name), labels)
    stats = logit_stats.pair_stats(
        SUPCON,
        z,
        z,
        ids,
        ids,
        temperature=temperature,
        axis_name=axis_name,
        streaming=Streaming(chunk_size, collective, matmul_dtype),
    )
    return supcon_from_stats(stats, axis_name)


def supcon_from_stats(stats: logit_stats.PairStats, axis_name) -> jax.Array:
    """SupCon's global mean from the statistics of its ``SUPCON`` spec (shared with the
    cross-batch memory, whose candidates are the batch and the memory)."""
    num_positives = stats.row_sums["num_positives"]
    per_row = stats.row_lse - stats.row_sums["positive_logits"] / jnp.maximum(num_positives, 1.0)
    return _common.global_mean(per_row, axis_name, weights=num_positives > 0)
