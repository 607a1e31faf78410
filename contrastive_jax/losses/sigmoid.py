"""The sigmoid-family contrastive loss over the global batch: SigLIP.

Written once in the global view, as the softmax losses
(:mod:`~contrastive_jax.losses.softmax`): ``axis_name`` spans the global batch,
``candidates`` says whom each row is compared with
(:mod:`~contrastive_jax.losses.candidates`), and ``streaming`` changes how the logits are
computed, not the result. The loss is a sum of per-pair log-sigmoids over the statistics
:mod:`~contrastive_jax.losses.logit_stats` returns, with no normaliser, so streamed its
gradient is formed in the forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, logit_stats, pairs
from contrastive_jax.losses import candidates as candidate_set
from contrastive_jax.losses.candidates import Candidates, from_keywords
from contrastive_jax.losses.candidates import check as check_candidates
from contrastive_jax.losses.logit_stats import PairSpec, Streaming


def _sigmoid_terms(logits, same_id, same_label):
    """SigLIP's per-pair term ``log sigmoid(z_ij * logit_ij)``, z = +1 on the diagonal
    and, with positive ids (``same_label``), on every pair sharing one."""
    positives = same_id if same_label is None else same_id | same_label
    return {"log_sigmoid": jax.nn.log_sigmoid(jnp.where(positives, logits, -logits))}


_SIGLIP = PairSpec(pair_terms=_sigmoid_terms)  # positive ids compared as sets: `candidates.spec`


def siglip_loss(
    a: jax.Array,
    b: jax.Array,
    *,
    temperature,
    bias,
    candidates: Candidates | None = None,
    streaming: Streaming | None = None,
    axis_name=None,
    return_metrics: bool = False,
    **deprecated,
):
    """SigLIP pairwise sigmoid loss (Zhai et al. 2023).

    Every pair (i, j) is an independent binary problem with logit
    ``a_i . b_j / temperature + bias`` and label ``z_ij`` = +1 if i == j (or, with
    several positives, if pairs i and j share an id) else -1::

        loss = -1/N sum_i sum_j log sigmoid(z_ij (a_i . b_j / temperature + bias))

    There is no normaliser, so streamed the gradient is formed in the forward pass
    (one pass, 6 N^2 D flops), with the ring too.

    Args:
      a: ``[B, D]`` L2-normalised embeddings.
      b: ``[B, D]`` L2-normalised embeddings, row i paired with ``a[i]``.
      temperature: scalar > 0 (SigLIP initialises 1/temperature = 10).
      bias: scalar (SigLIP initialises -10 so the many negatives start near 0 loss).
      candidates: whom each row is compared with (:class:`~contrastive_jax.losses.Candidates`):
        pairs sharing a positive id labelled +1 as the diagonal is (siglip-kernel's
        multi-positive SigLIP), each row's sum within its group, each extra column a
        negative pair (label -1) of every row; None: the global batch's pairs. Not
        ``query_rows`` (a sum over pairs has no rows that are only negatives) nor
        ``false_negative_ids`` (no softmax to leave them out of: pass them as positives).
      streaming: how the logits are computed (:class:`~contrastive_jax.losses.Streaming`);
        changes the memory, not the result. None: dense.
      axis_name: mesh axis to gather ``b`` over, or None.
      return_metrics: also return :func:`~contrastive_jax.losses.pairs.contrastive_metrics` (logits without the
        bias) from the same tiles, without gradient and without another matmul (it
        adds one logsumexp per tile).
      **deprecated: the keywords of the last release (``chunk_size``, ``collective``,
        ``matmul_dtype``, ``positive_ids``, ``group_size``, ``hard_negatives``), with a
        DeprecationWarning.

    Returns:
      Scalar: ``-sum_j log sigmoid(z_ij * logit_ij)``, summed over all columns and
      averaged over the N rows; with ``return_metrics``, ``(loss, metrics)``.

    Raises:
      ValueError: ``a`` and ``b`` are not two ``[B, D]`` arrays of one shape,
        ``temperature`` is not > 0, ``axis_name`` is not bound, or ``candidates`` does
        not fit them.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> round(float(losses.siglip_loss(a, b, temperature=0.1, bias=-10.0)), 4)
      2.121
      >>> ids = losses.Candidates(positive_ids=jnp.array([0, 0, 1]))  # (0, 1) and (1, 0) labelled +1
      >>> round(float(losses.siglip_loss(a, b, temperature=0.1, bias=-10.0, candidates=ids)), 4)
      8.7877

    References:
      X. Zhai, B. Mustafa, A. Kolesnikov, L. Beyer, `Sigmoid Loss for Language Image
      Pre-Training <https://arxiv.org/abs/2303.15343>`__, ICCV 2023.
    """
    candidates, streaming = from_keywords("siglip_loss", candidates, streaming, deprecated)
    pairs.check_paired(a, b, ("a", "b"), temperature, axis_name)
    c = check_candidates(candidates, a, axis_name)
    if c.query_rows is not None or c.false_negative_ids is not None:
        raise ValueError(
            "siglip_loss takes no query_rows (its sum runs over pairs, not query rows) and no "
            "false_negative_ids (no softmax to leave a pair out of: pass them as positive_ids, labelled +1)."
        )
    rows = candidate_set.row_ids(c, a.shape[0], axis_name)
    columns, column_ids = candidate_set.columns(c, b, rows)
    total, _, aux = logit_stats.pair_total(
        candidate_set.spec(c, _SIGLIP),
        a,
        columns,
        rows,
        column_ids,
        temperature=temperature,
        bias=bias,
        axis_name=axis_name,
        streaming=streaming,
        aux_spec=pairs.METRICS if return_metrics else pairs.NO_METRICS,
    )
    loss = _common.global_mean(jnp.full((a.shape[0],), -total / a.shape[0]), axis_name)

    def metrics():
        own = candidate_set.own_columns(aux, a.shape[0])  # the b's columns
        without_bias = own._replace(
            row_lse=own.row_lse - bias,
            row_best_negative=own.row_best_negative - bias,
            col_best_negative=own.col_best_negative - bias,
        )
        positive = pairs.paired_logits(a, b, temperature)
        return pairs.retrieval_metrics(a, columns, without_bias, positive, temperature, axis_name)

    return pairs.with_metrics(loss, metrics, return_metrics)
