"""Several positives per row: the pairs of a batch that share an id count as positives.

``positive_ids`` (``[B]`` or ``[B, K]`` ints, one row per pair) names each pair's ids:
pairs i and j are positives of each other when they share any id (a row's K ids are a
set; a negative id, e.g. -1, is padding and matches nothing). The diagonal pair (i, i)
is always a positive. An image with five captions in one batch gives its five pairs the
image's id; pairs of one class share the class. Ids are compared over the global batch
(gathered with the embeddings, or carried around the ring with them).

The softmax losses offer two forms (``positives=``), each over all N columns in the
denominator (the positives included, as in both papers), with ``P(i)`` row i's
positives and ``s_ij`` the logits:

* ``"mean_log_prob"``: the mean over the positives of ``-log softmax``, SupCon's L_out
  (Khosla et al. 2020, eq. 2) and UniCL's (Yang et al. 2022)::

      loss_i = -1/|P(i)| sum_{p in P(i)} log( exp(s_ip) / sum_j exp(s_ij) )

* ``"log_sum"``: ``-log`` of the softmax mass of the positives together, MIL-NCE's
  (Miech et al. 2020), SupCon's L_in (eq. 3) less the constant ``log |P(i)|``::

      loss_i = -log( sum_{p in P(i)} exp(s_ip) / sum_j exp(s_ij) )

The mean form pulls every positive up; the log-sum form is content once the positives
together hold the mass, so it tolerates a noisy or weak positive (MIL-NCE's reason: not
every caption of a clip describes it). With all ids distinct both are the plain loss.
SigLIP labels every positive pair +1 (:mod:`~contrastive_jax.losses.sigmoid`).

Streamed, the softmax losses with several positives take two passes over the tiles (8
N^2 D flops, as CLIP; InfoNCE's plain one-pass form is 6 N^2 D). The metrics they return
(``return_metrics``) still score each row's own pair: another positive ranked first
counts as a miss. ``false_negative_ids`` (CLIP) compares its K ids key by key and
masks; ``positive_ids`` compares sets and counts: a loss takes one or the other.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, logit_stats, pairs
from contrastive_jax.losses.logit_stats import PairSpec, PairStats, RowIds

FORMS = ("mean_log_prob", "log_sum")


def _mean_terms(logits, same_id, same_label):
    """The mean form's per-pair terms: each positive's logit, and the positive indicator."""
    positives = same_id | same_label
    return {
        "positive_logits": jnp.where(positives, logits, 0.0),
        "num_positives": positives.astype(logits.dtype),
    }


def check(positive_ids, false_negative_ids, positives: str, batch_size: int) -> None:
    """Raises ValueError for an unknown form, ids not ``[B]`` / ``[B, K]`` ints, or both
    ``positive_ids`` and ``false_negative_ids``."""
    if positives not in FORMS:
        raise ValueError(f"positives must be one of {FORMS}, got {positives!r}.")
    if positive_ids is None:
        return
    pairs.check_ids(positive_ids, batch_size, "positive_ids")
    if false_negative_ids is not None:
        raise ValueError(
            "pass positive_ids or false_negative_ids, not both: pairs sharing a positive id "
            "already count as positives, and a pair sharing only a false-negative id would "
            "need a third kind (masked, not a positive) that this loss does not define."
        )


def softmax_spec(positives: str, *, columns: bool) -> PairSpec:
    """The statistics a softmax loss with several positives needs: the row (and with
    ``columns`` the column) logsumexps, and the form's positive statistics."""
    spec = PairSpec(row_logsumexp=True, col_logsumexp=columns, label_sets=True)
    if positives == "log_sum":
        return spec._replace(positive_logsumexp=True)
    return spec._replace(pair_terms=_mean_terms, col_sums=columns)


def targets(positives: str, stats: PairStats) -> tuple[jax.Array, jax.Array | None]:
    """What each row (``[B]``) and column (``[B_y]``, or None) subtracts from its
    logsumexp: the positives' logsumexp, or their mean logit."""
    if positives == "log_sum":
        return stats.row_positive_lse, stats.col_positive_lse

    def mean(sums):
        return None if not sums else sums["positive_logits"] / sums["num_positives"]

    return mean(stats.row_sums), mean(stats.col_sums)


def softmax_with_positives(
    a, b, positive_ids, positives, temperature, axis_name, streaming, return_metrics, *, columns
):
    """InfoNCE of ``a`` against ``b`` (and with ``columns`` of ``b`` against ``a``:
    CLIP) whose positives are the pairs sharing an id in ``positive_ids``, in the form
    ``positives`` (:mod:`~contrastive_jax.losses.positives`); two passes over the tiles."""
    ids = RowIds(pairs.local_ids(a.shape[0], axis_name), positive_ids)
    spec = softmax_spec(positives, columns=columns)._replace(best=return_metrics)
    stats = logit_stats.pair_stats(
        spec, a, b, ids, ids, temperature=temperature, axis_name=axis_name, streaming=streaming
    )
    row_target, col_target = targets(positives, stats)
    per_row = stats.row_lse - row_target
    if columns:
        per_row = 0.5 * (per_row + stats.col_lse - col_target)
    loss = _common.global_mean(per_row, axis_name)
    metrics = lambda: pairs.retrieval_metrics(  # noqa: E731
        a, b, stats, pairs.paired_logits(a, b, temperature), temperature, axis_name
    )
    return pairs.with_metrics(loss, metrics, return_metrics)
