"""The sigmoid-family contrastive loss over the global batch: SigLIP.

Written once in the global view, as the softmax losses
(:mod:`~contrastive_jax.losses.softmax`): ``axis_name`` spans the global batch, and
``chunk_size``, ``collective`` and ``matmul_dtype`` change how the logits are computed,
not the result. The loss is a sum of per-pair log-sigmoids over the statistics
:mod:`~contrastive_jax.losses.logit_stats` returns, with no normaliser, so streamed its
gradient is formed in the forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, logit_stats, negatives, pairs
from contrastive_jax.losses import hard_negatives as hard
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming


def _sigmoid_terms(logits, same_id, same_label):
    """SigLIP's per-pair term ``log sigmoid(z_ij * logit_ij)``, z = +1 on the diagonal
    and, with positive ids (``same_label``), on every pair sharing one."""
    positives = same_id if same_label is None else same_id | same_label
    return {"log_sigmoid": jax.nn.log_sigmoid(jnp.where(positives, logits, -logits))}


_SIGLIP = PairSpec(pair_terms=_sigmoid_terms, label_sets=True)


def siglip_loss(
    a: jax.Array,
    b: jax.Array,
    *,
    temperature,
    bias,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
    return_metrics: bool = False,
    positive_ids: jax.Array | None = None,
    group_size: int | None = None,
    hard_negatives: jax.Array | None = None,
):
    """SigLIP pairwise sigmoid loss (Zhai et al. 2023).

    Every pair (i, j) is an independent binary problem with logit
    ``a_i . b_j / temperature + bias`` and label ``z_ij`` = +1 if i == j (or, with
    ``positive_ids``, if pairs i and j share an id) else -1::

        loss = -1/N sum_i sum_j log sigmoid(z_ij (a_i . b_j / temperature + bias))

    There is no normaliser, so streamed the gradient is formed in the forward pass
    (one pass, 6 N^2 D flops), with the ring too.

    Args:
      a: ``[B, D]`` L2-normalised embeddings.
      b: ``[B, D]`` L2-normalised embeddings, row i paired with ``a[i]``.
      temperature: scalar > 0 (SigLIP initialises 1/temperature = 10).
      bias: scalar (SigLIP initialises -10 so the many negatives start near 0 loss).
      axis_name: mesh axis to gather ``b`` over, or None.
      chunk_size: None for the dense ``[B, N]`` logits, an int tile edge (it must divide
        N; the local B with the ring) or ``"auto"``; changes the memory, not the result
        (details: :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).
      return_metrics: also return :func:`~contrastive_jax.losses.pairs.contrastive_metrics` (logits without the
        bias) from the same tiles, without gradient and without another matmul (it
        adds one logsumexp per tile).
      positive_ids: ``[B]`` or ``[B, K]`` int ids of this device's pairs, or None.
        Pairs whose sets of ids meet (a negative id is padding) are positives, labelled
        +1 as the diagonal is (siglip-kernel's multi-positive SigLIP); compared over
        the global batch. With all ids distinct the loss is the plain one.
      group_size: K dividing N: each row's sum runs over its group's K columns (rows
        ``g K`` to ``g K + K - 1`` of the global batch); None or 0: all N
        (:mod:`~contrastive_jax.losses.negatives`).
      hard_negatives: ``[B, M, D]``: M more b's of each pair, every one a negative pair
        (label -1) of every row, all devices' N M of them summed in each row
        (:mod:`~contrastive_jax.losses.hard_negatives`), or None.

    Returns:
      Scalar: ``-sum_j log sigmoid(z_ij * logit_ij)``, summed over all N columns and
      averaged over the N rows; with ``return_metrics``, ``(loss, metrics)``.

    Raises:
      ValueError: ``a`` and ``b`` are not two ``[B, D]`` arrays of one shape,
        ``temperature`` is not > 0, ``axis_name`` is not bound, or ``positive_ids``
        is not ``[B]`` or ``[B, K]`` ints.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> round(float(losses.siglip_loss(a, b, temperature=0.1, bias=-10.0)), 4)
      2.121
      >>> ids = jnp.array([0, 0, 1])  # pairs 0 and 1 share an id: (0, 1) and (1, 0) labelled +1
      >>> round(float(losses.siglip_loss(a, b, temperature=0.1, bias=-10.0, positive_ids=ids)), 4)
      8.7877

    References:
      X. Zhai, B. Mustafa, A. Kolesnikov, L. Beyer, `Sigmoid Loss for Language Image
      Pre-Training <https://arxiv.org/abs/2303.15343>`__, ICCV 2023.
    """
    pairs.check_paired(a, b, ("a", "b"), temperature, axis_name)
    if positive_ids is not None:
        pairs.check_ids(positive_ids, a.shape[0], "positive_ids")
    ids_given = positive_ids is not None
    group_size = negatives.check(a.shape[0], axis_name, group_size=group_size, query_rows=None, ids_given=ids_given)
    hard.check(hard_negatives, a, others=bool(group_size) or ids_given)
    ids = RowIds(pairs.local_ids(a.shape[0], axis_name), positive_ids)
    columns, column_ids = hard.columns(b, hard_negatives, ids.index)
    total, _, aux = logit_stats.pair_total(
        _SIGLIP._replace(group_size=group_size),
        a,
        columns,
        ids,
        column_ids._replace(label=positive_ids),
        temperature=temperature,
        bias=bias,
        axis_name=axis_name,
        streaming=Streaming(chunk_size, collective, matmul_dtype),
        aux_spec=pairs.METRICS if return_metrics else pairs.NO_METRICS,
    )
    loss = _common.global_mean(jnp.full((a.shape[0],), -total / a.shape[0]), axis_name)

    def metrics():
        own = hard.own_columns(aux, a.shape[0])  # the b's columns
        without_bias = own._replace(
            row_lse=own.row_lse - bias,
            row_best_negative=own.row_best_negative - bias,
            col_best_negative=own.col_best_negative - bias,
        )
        positive = pairs.paired_logits(a, b, temperature)
        return pairs.retrieval_metrics(a, columns, without_bias, positive, temperature, axis_name)

    return pairs.with_metrics(loss, metrics, return_metrics)
