"""Hard negatives: each pair brings M negatives of the b side, and they join the global pool.

``hard_negatives`` ``[B, M, D]`` holds, for each of a device's B pairs, M embeddings of
the b side that are not its b (mined passages, captions of other images). They are
shared by every row of the global batch, as sentence-transformers'
MultipleNegativesRankingLoss shares them over devices, and as DPR (Karpukhin et al. 2020)
adds its BM25 negatives to the in-batch ones: with ``h_k`` the ``N M`` hard negatives of
all devices and ``s`` the logits,

* a -> b (CLIP's rows, InfoNCE): row i's softmax runs over the N b's and all ``N M``
  hard negatives, ``-log( exp(s_ii) / (sum_j exp(s_ij) + sum_k exp(a_i . h_k / T)) )``;
* b -> a (CLIP's columns): unchanged, each b against the N a's (a hard negative is no
  row of a softmax);
* SigLIP: every hard negative is a negative pair (label -1) of every row.

The hard negatives are extra columns: each device's ``[B + B M, D]`` columns are its b's
then its hard negatives, gathered or passed around the ring with the b's, with the
index -1 (no row's pair), so every form (dense, tiled, all-gathered, ring) computes the
same loss, exact over the global batch; the positive of row i is ``b_i`` by index, never
by position in the pool (sentence-transformers PR #3453 lined anchors up with other
rows' negatives by position). Which row brought a hard negative does not change the
loss: the pool is the same. The cost is that of ``N (1 + M)`` columns: a -> b logits
``N x N (1 + M)``, the columns' memory ``N (1 + M) D``.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from contrastive_jax import losses
  >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
  >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
  >>> hard = jnp.array([[[0.96, 0.28]], [[0.6, 0.8]], [[0.8, -0.6]]])  # [B, M, D], M = 1
  >>> pool = jnp.concatenate([b, hard[:, 0]])  # every row's candidates: 3 b's, 3 negatives
  >>> by_hand = -jnp.mean(jnp.diagonal(jax.nn.log_softmax(a @ pool.T / 0.1)[:, :3]))
  >>> loss = losses.infonce_loss(a, b, temperature=0.1, hard_negatives=hard)
  >>> round(float(loss), 4), round(float(by_hand), 4)
  (1.802, 1.802)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses.logit_stats import PairStats, RowIds


def check(hard_negatives, a, *, others: bool) -> None:
    """Raises ValueError unless ``hard_negatives`` (None or ``[B, M, D]`` floats matching
    ``a`` [B, D]) comes without ``others`` (group_size, query_rows or ids)."""
    if hard_negatives is None:
        return
    shape = jnp.shape(hard_negatives)
    if len(shape) != 3 or shape[0] != a.shape[0] or shape[2] != a.shape[1]:
        raise ValueError(f"hard_negatives must have shape [B, M, D] = [{a.shape[0]}, M, {a.shape[1]}], got {shape}.")
    if others:
        raise ValueError("hard_negatives take the plain loss: not with group_size, query_rows or ids.")


def pool(b: jax.Array, hard_negatives) -> jax.Array:
    """This device's columns ``[B + B M, D]``: its b's, then its hard negatives row by row
    (``b`` itself without hard negatives or with M = 0)."""
    if hard_negatives is None or hard_negatives.shape[1] == 0:
        return b
    return jnp.concatenate([b, hard_negatives.reshape(-1, b.shape[1]).astype(b.dtype)])


def columns(b: jax.Array, hard_negatives, ids: jax.Array) -> tuple[jax.Array, RowIds]:
    """:func:`pool`'s columns and their ids: ``ids`` [B] (global rows) for the b's, -1
    (no row's pair) for the hard negatives."""
    y = pool(b, hard_negatives)
    extra = jnp.full((y.shape[0] - b.shape[0],), -1, ids.dtype)
    return y, RowIds(jnp.concatenate([ids, extra]), None)


def own_columns(stats: PairStats, local_batch: int) -> PairStats:
    """The column statistics of this device's b's (the first ``local_batch`` columns),
    the hard negatives' dropped: the b -> a direction."""
    keep = lambda v: None if v is None else v[:local_batch]  # noqa: E731
    return stats._replace(col_lse=keep(stats.col_lse), col_best_negative=keep(stats.col_best_negative))
