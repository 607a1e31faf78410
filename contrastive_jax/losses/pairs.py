"""What the paired losses share: the global ids of a device's rows, the pairs' own
logits, the input checks, and the in-batch retrieval metrics.

``a`` [B, D] and ``b`` [B, D] are a device's rows of the global batch of N pairs (row i
of ``a`` paired with row i of ``b``), L2-normalised; ``axis_name`` is the mesh axis the
global batch is split over, or None on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, logit_stats
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming

# What the in-batch metrics read: the row logsumexps and each row's and column's largest
# logit other than its own pair's.
METRICS = PairSpec(row_logsumexp=True, best=True)
NO_METRICS = PairSpec()


def local_ids(local_batch: int, axis_name) -> jax.Array:
    """Global indices ``[B]`` of this device's rows."""
    return _common.row_offset(local_batch, axis_name) + jnp.arange(local_batch)


def paired_logits(x: jax.Array, y: jax.Array, temperature) -> jax.Array:
    """Logits ``[B]`` of the local pairs ``x_i . y_i / temperature`` (the targets)."""
    return jnp.sum(_common.at_least_float32(x) * _common.at_least_float32(y), axis=1) / temperature


def check_ids(ids: jax.Array, batch_size: int, name: str) -> None:
    """Raises ValueError unless ``ids`` (argument ``name``) are ints ``[B]`` or ``[B, K]``."""
    if ids.ndim not in (1, 2) or ids.shape[0] != batch_size or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(
            f"{name} must be ints of shape [B] or [B, K] with B = {batch_size} "
            f"(one row per pair), got {ids.dtype} {ids.shape}."
        )


def with_metrics(loss, metrics, return_metrics: bool):
    """``(loss, metrics())`` with ``return_metrics``, else ``loss`` (``metrics`` not run)."""
    return (loss, metrics()) if return_metrics else loss


def check_paired(a, b, names, temperature, axis_name) -> None:
    """Raises ValueError unless ``a``, ``b`` are a batch of pairs (names ``names``), the
    temperature is > 0 and ``axis_name`` is bound."""
    _common.check_pair(a, b, *names)
    _common.check_temperature(temperature)
    _common.check_axis_bound(axis_name)


def _row_logit_totals(x: jax.Array, y: jax.Array, temperature, axis_name) -> jax.Array:
    """``sum_j x_i . y_j / temperature`` over the global ``y``: ``[B]``, O(N D) work."""
    y_sum = jnp.sum(_common.at_least_float32(y), axis=0)
    if axis_name is not None:
        y_sum = jax.lax.psum(y_sum, axis_name)
    return _common.at_least_float32(x) @ y_sum / temperature


def retrieval_metrics(a, b, stats, positive, temperature, axis_name) -> dict[str, jax.Array]:
    """The metrics of :func:`contrastive_metrics` from a loss's statistics (``row_lse`` of ``a @ b.T / T``,
    ``row_best_negative``, ``col_best_negative``) and its positive logits ``[B]``: no N^2
    work. ``b`` holds every column (more rows than ``a`` with query rows). Top-1 is right
    when the pair's logit beats every other candidate's (a tie counts as wrong)."""
    a, b, stats, positive, temperature = jax.lax.stop_gradient((a, b, stats, positive, temperature))
    num_columns = _common.global_batch_size(b.shape[0], axis_name)
    negative = (_row_logit_totals(a, b, temperature, axis_name) - positive) / max(num_columns - 1, 1)
    mean = lambda x: _common.global_mean(x, axis_name)  # noqa: E731
    return {
        "accuracy_a_to_b": mean((positive > stats.row_best_negative).astype(positive.dtype)),
        "accuracy_b_to_a": mean((positive > stats.col_best_negative).astype(positive.dtype)),
        "positive_logit": mean(positive),
        "negative_logit": mean(negative),
        "logsumexp": mean(stats.row_lse),
    }


def contrastive_metrics(
    a: jax.Array,
    b: jax.Array,
    *,
    temperature,
    axis_name=None,
    chunk_size: int | str | None = None,
) -> dict[str, jax.Array]:
    """In-batch diagnostics of a paired batch, for training logs (no gradients).

    The paired losses return the same dict from their own statistics with
    ``return_metrics=True``; this function costs a pass over the N x N logits of its own.

    Args:
      a: ``[B, D]`` L2-normalised embeddings.
      b: ``[B, D]`` L2-normalised embeddings, row i paired with ``a[i]``.
      temperature: scalar > 0.
      axis_name: mesh axis to gather over, or None.
      chunk_size: None scores all N columns at once; an int streams tiles of that size
        (memory ``chunk_size^2`` instead of ``B x N``); ``"auto"`` as for the losses.

    Returns:
      Scalars over the global batch: ``accuracy_a_to_b`` and ``accuracy_b_to_a``
      (top-1 in-batch retrieval), ``positive_logit`` and ``negative_logit`` (mean of
      the diagonal and off-diagonal logits), ``logsumexp`` (mean row logsumexp).

    Raises:
      ValueError: ``a`` and ``b`` are not two ``[B, D]`` arrays of one shape,
        ``temperature`` is not > 0, or ``axis_name`` is not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> metrics = losses.contrastive_metrics(a, b, temperature=0.1)
      >>> {name: round(float(value), 4) for name, value in metrics.items()}
      {'accuracy_a_to_b': 0.3333, 'accuracy_b_to_a': 0.3333, 'positive_logit': 8.4533,
       'negative_logit': 4.1333, 'logsumexp': 9.3309}

    References:
      A. Radford et al., `Learning Transferable Visual Models From Natural Language
      Supervision <https://arxiv.org/abs/2103.00020>`__, ICML 2021 (in-batch retrieval).
    """
    check_paired(a, b, ("a", "b"), temperature, axis_name)
    a, b, temperature = jax.lax.stop_gradient((a, b, temperature))
    ids = RowIds(local_ids(a.shape[0], axis_name), None)
    stats = logit_stats.pair_stats(
        METRICS,
        a,
        b,
        ids,
        ids,
        temperature=temperature,
        axis_name=axis_name,
        streaming=Streaming(chunk_size),
    )
    positive = paired_logits(a, b, temperature)
    return retrieval_metrics(a, b, stats, positive, temperature, axis_name)
