"""Several positives per row: the pairs of a batch that share an id count as positives.

``Candidates(positive_ids=...)`` (``[B]`` or ``[B, K]`` ints, one row per pair) names each pair's ids:
pairs i and j are positives of each other when they share any id (a row's K ids are a
set; a negative id, e.g. -1, is padding and matches nothing). The diagonal pair (i, i)
is always a positive. An image with five captions in one batch gives its five pairs the
image's id; pairs of one class share the class. Ids are compared over the global batch
(gathered with the embeddings, or carried around the ring with them).

The softmax losses offer two forms (``Candidates(positives=...)``,
``config.loss.positives``), each over all N columns in the denominator (the positives
included, as in both papers), with ``P(i)`` row i's positives and ``s_ij`` the logits:

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
counts as a miss. ``false_negative_ids`` compares its K ids key by key and masks;
``positive_ids`` compares sets and counts: a loss takes one or the other
(:mod:`~contrastive_jax.losses.candidates`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.tile_math import PairSpec, PairStats

FORMS = ("mean_log_prob", "log_sum")


def _mean_terms(logits, same_id, same_label):
    """The mean form's per-pair terms: each positive's logit, and the positive indicator."""
    positives = same_id | same_label
    return {
        "positive_logits": jnp.where(positives, logits, 0.0),
        "num_positives": positives.astype(logits.dtype),
    }


def softmax_spec(spec: PairSpec, positives: str) -> PairSpec:
    """``spec`` (a softmax loss's statistics) with the form ``positives``' statistics of
    the positives: their logsumexp, or their summed logits and count (by column too when
    ``spec`` asks for the columns' logsumexps)."""
    if positives == "log_sum":
        return spec._replace(positive_logsumexp=True)
    return spec._replace(pair_terms=_mean_terms, col_sums=spec.col_logsumexp)


def targets(positives: str, stats: PairStats) -> tuple[jax.Array, jax.Array | None]:
    """What each row (``[B]``) and column (``[B_y]``, or None) subtracts from its
    logsumexp: the positives' logsumexp, or their mean logit."""
    if positives == "log_sum":
        return stats.row_positive_lse, stats.col_positive_lse

    def mean(sums):
        return None if not sums else sums["positive_logits"] / sums["num_positives"]

    return mean(stats.row_sums), mean(stats.col_sums)
