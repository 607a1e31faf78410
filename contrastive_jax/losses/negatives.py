"""The negatives apart from the batch: groups of K rows, and query rows.

A larger global batch brings two things at once: more negatives per row and a gradient
averaged over more examples (less noise). Two options of the softmax losses move one
without the other:

* ``group_size=K`` (CLIP, InfoNCE, SigLIP): the global batch of N pairs is cut into the
  N / K groups of K consecutive global rows (rows ``g K`` to ``g K + K - 1``), and each
  row's softmax (or SigLIP's sum) runs over its own group's K columns only. The loss is
  the mean over all N rows, the mean of the groups' losses: the negatives stay K while
  the batch grows. Exact whatever K is to the local batch B (a group inside a device or
  across K / B of them): the columns of other groups are masked in each tile (by the
  rows' global indices, which travel with the columns, gathered or around the ring), so
  memory and the options (dense, tiled, ring) are the whole-batch loss's, and so is the
  compute (B N D per device: the masked tiles are still multiplied).
* ``query_rows=n`` (CLIP, InfoNCE): only the first n of each device's B rows are
  queries (rows of a softmax, in both of CLIP's directions); all B rows of every device
  are columns. The loss is the mean over the N = n x devices query rows, each against
  all N + M columns: the negatives grow while the batch stays. Each direction is the
  first n rows of one side against every row of the other, so the logits cost
  ``2 n (N + M) D`` per device (one pass each, not CLIP's (N + M)^2). The gradient is
  the loss's: the other rows, as negatives, get theirs too; embed them under
  ``jax.lax.stop_gradient`` to spend no backward pass on them (the trainer's
  ``config.loss.extra_negatives`` does, see :mod:`contrastive_jax.training.negatives_apart`).
"""

from __future__ import annotations

from contrastive_jax.losses import _common, logit_stats, pairs
from contrastive_jax.losses import hard_negatives as hard
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming

# Each query row's softmax over every column.
_ROWS = PairSpec(row_logsumexp=True)


def check(local_batch: int, axis_name, *, group_size, query_rows, ids_given: bool) -> int:
    """Raises ValueError unless ``group_size`` (None, 0, or K dividing the global batch)
    and ``query_rows`` (None or 1 to B) are valid, alone and without ids; returns K (0:
    the whole batch)."""
    if query_rows is not None and not 0 < query_rows <= local_batch:
        raise ValueError(f"query_rows={query_rows} must be in [1, {local_batch}] (this device's rows).")
    num_rows = _common.global_batch_size(local_batch, axis_name)
    if group_size and (group_size < 0 or num_rows % group_size):
        raise ValueError(f"group_size={group_size} must divide the global batch N = {num_rows} (0: the whole batch).")
    if (group_size or query_rows is not None) and ids_given:
        raise ValueError("group_size and query_rows take the plain loss: not with positive_ids or false_negative_ids.")
    if group_size and query_rows is not None:
        raise ValueError("pass group_size or query_rows, not both: groups fix the negatives, query rows add to them.")
    return group_size or 0


def queries_against_all(
    spec: PairSpec, x, y, query_rows, *, temperature, axis_name, streaming, aux_spec, hard_negatives=None
):
    """``pair_total`` of the first ``query_rows`` rows of ``x`` [B, D] (all of them when
    None) against every device's ``y`` [B, D] (and ``hard_negatives`` [B, M, D]: see
    :mod:`~contrastive_jax.losses.hard_negatives`), ids by global row; and the query
    rows' pair logits ``[n]`` against their own ``y`` rows: ``(total, row_lse, aux,
    positive)``."""
    ids = pairs.local_ids(x.shape[0], axis_name)
    n = x.shape[0] if query_rows is None else query_rows
    columns, column_ids = hard.columns(y, hard_negatives, ids)
    total, row_lse, aux = logit_stats.pair_total(
        spec,
        x[:n],
        columns,
        RowIds(ids[:n], None),
        column_ids,
        temperature=temperature,
        axis_name=axis_name,
        streaming=streaming,
        aux_spec=aux_spec,
    )
    return total, row_lse, aux, pairs.paired_logits(x[:n], y[:n], temperature)


def clip_with_queries(a, b, query_rows: int, temperature, axis_name, streaming: Streaming, return_metrics: bool):
    """CLIP whose rows are the first ``query_rows`` of each device's pairs, each against
    every column: the mean of InfoNCE(a -> b) and InfoNCE(b -> a) over the query rows,
    in two one-pass sweeps; with ``return_metrics``, ``(loss, metrics)``."""
    aux_spec = pairs.METRICS._replace(row_logsumexp=False) if return_metrics else pairs.NO_METRICS
    options = dict(temperature=temperature, axis_name=axis_name, streaming=streaming, aux_spec=aux_spec)
    total_ab, lse_ab, aux_ab, positive = queries_against_all(_ROWS, a, b, query_rows, **options)
    total_ba, _, aux_ba, _ = queries_against_all(_ROWS, b, a, query_rows, **options)
    loss = _common.global_mean(0.5 * (total_ab + total_ba) / query_rows - positive, axis_name)

    def metrics():
        stats = aux_ab._replace(row_lse=lse_ab, col_best_negative=aux_ba.row_best_negative)
        return pairs.retrieval_metrics(a[:query_rows], b, stats, positive, temperature, axis_name)

    return pairs.with_metrics(loss, metrics, return_metrics)
