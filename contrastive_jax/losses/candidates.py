"""Whom each row of the global batch is compared with, and which of them are positives.

The field's recipes each change one thing of a pair loss: the set of candidates a row
of the global batch is scored against, and which of them count as its positives.
:class:`Candidates` holds them all, over the global batch, and the pair losses
(:func:`~contrastive_jax.losses.clip_loss`, :func:`~contrastive_jax.losses.infonce_loss`,
:func:`~contrastive_jax.losses.siglip_loss`) take it as one argument, so that every
combination goes through the same logit statistics (:mod:`~contrastive_jax.losses.logit_stats`:
dense, streamed in tiles, or around the ring) with one meaning:

* ``positive_ids`` ``[B]`` / ``[B, K]``: several positives. Pairs whose sets of ids meet
  are positives of each other (a negative id is padding and matches nothing); the
  form, ``positives``, is ``"mean_log_prob"`` (SupCon's L_out) or ``"log_sum"``
  (MIL-NCE), see :mod:`~contrastive_jax.losses.positives`.
* ``false_negative_ids`` ``[B]`` / ``[B, K]``: the pairs left out. Pairs j != i equal to
  pair i in any of the K keys are in-batch false negatives, out of row i's softmaxes.
* ``group_size`` K: groups. Each row's candidates are the K columns of its group (rows
  ``g K`` to ``g K + K - 1`` of the global batch); a column that belongs to no pair (a
  bank's) is a candidate of every group, a pair's extra column one of its pair's group.
* ``query_rows`` n: the rows that are queries. Only the first n of each device's rows
  are rows of the softmaxes (both of CLIP's directions); all B rows of every device are
  columns: the rest are negatives only (the trainer's ``config.loss.extra_negatives``).
* ``extra_columns`` ``[B, M, D]`` and ``shared_columns`` ``[E, D]``: more columns of the
  b side, no row's pair, candidates of every row (all devices' of them, gathered or
  passed around the ring with the b's): each pair's M hard negatives (in its pair's
  group), and columns that belong to no pair (a fixed bank's share: in every group). In
  CLIP they enter the a -> b softmaxes only (a column is no row of the b -> a softmax);
  in SigLIP each is a negative pair of every row.

Every field may be combined with every other but ``group_size`` with ``query_rows``
(groups fix each row's candidates at K, query rows add to them) and ``positive_ids`` with
``false_negative_ids`` (a pair sharing only a false-negative id would be a third kind).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from contrastive_jax import losses
  >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
  >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
  >>> hard = jnp.array([[[0.96, 0.28]], [[0.6, 0.8]], [[0.8, -0.6]]])  # [B, M, D], M = 1
  >>> pool = jnp.concatenate([b, hard[:, 0]])  # every row's candidates: 3 b's, 3 negatives
  >>> by_hand = -jnp.mean(jnp.diagonal(jax.nn.log_softmax(a @ pool.T / 0.1)[:, :3]))
  >>> loss = losses.infonce_loss(a, b, temperature=0.1, candidates=losses.Candidates(extra_columns=hard))
  >>> round(float(loss), 4), round(float(by_hand), 4)
  (1.802, 1.802)
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, pairs
from contrastive_jax.losses.positives import FORMS
from contrastive_jax.losses.streaming import Streaming
from contrastive_jax.losses.tile_math import PairSpec, RowIds


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Whom each row of the global batch is compared with (module docstring); a pytree
    whose arrays are this device's rows and whose ints and form are static.

    Attributes:
      positive_ids: ``[B]`` or ``[B, K]`` ints, or None: pairs sharing an id are positives.
      false_negative_ids: ``[B]`` or ``[B, K]`` ints, or None: pairs sharing a key are
        left out of each other's softmaxes.
      extra_columns: ``[B, M, D]``, each pair's M extra columns (hard negatives), or None.
      shared_columns: ``[E, D]``, this device's share of columns of no pair, or None.
      group_size: K dividing N, each row compared within its group; 0: all N.
      query_rows: n in [1, B]: only each device's first n rows are queries; None: all.
      positives: the form of several positives, one of ``FORMS``.
    """

    positive_ids: jax.Array | None = None
    false_negative_ids: jax.Array | None = None
    extra_columns: jax.Array | None = None
    shared_columns: jax.Array | None = None
    group_size: int = 0
    query_rows: int | None = None
    positives: str = "mean_log_prob"

    def query_count(self, local_batch: int) -> int:
        """n: the rows of this device that are queries."""
        return local_batch if self.query_rows is None else self.query_rows

    @property
    def ids(self) -> jax.Array | None:
        """The rows' labels the tiles compare (the positive ids or the false-negative keys)."""
        return self.false_negative_ids if self.positive_ids is None else self.positive_ids


jax.tree_util.register_dataclass(
    Candidates,
    data_fields=["positive_ids", "false_negative_ids", "extra_columns", "shared_columns"],
    meta_fields=["group_size", "query_rows", "positives"],
)


def check(candidates: Candidates | None, a: jax.Array, axis_name) -> Candidates:
    """``candidates`` (None: the plain loss) checked against this device's rows ``a``
    ``[B, D]``.

    Raises:
      ValueError: naming the field, for ids not ``[B]`` / ``[B, K]`` ints, extra columns
        not ``[B, M, D]`` / ``[E, D]``, ``group_size`` not dividing N, ``query_rows`` not
        in ``[1, B]``, an unknown form, or a pair of fields that cannot go together.
    """
    c = Candidates() if candidates is None else candidates
    local_batch, dim = a.shape
    for name in ("positive_ids", "false_negative_ids"):
        if getattr(c, name) is not None:
            pairs.check_ids(getattr(c, name), local_batch, name)
    if c.positives not in FORMS:
        raise ValueError(f"positives must be one of {FORMS}, got {c.positives!r}.")
    if c.positive_ids is not None and c.false_negative_ids is not None:
        raise ValueError(
            "pass positive_ids or false_negative_ids, not both: pairs sharing a positive id "
            "already count as positives, and a pair sharing only a false-negative id would "
            "need a third kind (masked, not a positive) that this loss does not define."
        )
    if c.extra_columns is not None and (
        jnp.ndim(c.extra_columns) != 3 or jnp.shape(c.extra_columns)[::2] != (local_batch, dim)
    ):
        raise ValueError(
            f"extra_columns must have shape [B, M, D] = [{local_batch}, M, {dim}], got {jnp.shape(c.extra_columns)}."
        )
    if c.shared_columns is not None and (jnp.ndim(c.shared_columns) != 2 or jnp.shape(c.shared_columns)[1] != dim):
        raise ValueError(f"shared_columns must have shape [E, D] = [E, {dim}], got {jnp.shape(c.shared_columns)}.")
    if c.query_rows is not None and not 0 < c.query_rows <= local_batch:
        raise ValueError(f"query_rows={c.query_rows} must be in [1, {local_batch}] (this device's rows).")
    num_rows = _common.global_batch_size(local_batch, axis_name)
    if c.group_size and (c.group_size < 0 or num_rows % c.group_size):
        raise ValueError(f"group_size={c.group_size} must divide the global batch N = {num_rows} (0: the whole batch).")
    if c.group_size and c.query_rows is not None:
        raise ValueError("pass group_size or query_rows, not both: groups fix the negatives, query rows add to them.")
    return c


def row_ids(c: Candidates, local_batch: int, axis_name) -> RowIds:
    """The ids of this device's ``local_batch`` rows: global indices and the labels the
    tiles compare."""
    return RowIds(pairs.local_ids(local_batch, axis_name), c.ids)


def columns(c: Candidates, b: jax.Array, rows: RowIds) -> tuple[jax.Array, RowIds]:
    """This device's columns ``[B + B M + E, D]``: its b's, each pair's extra columns, the
    shared ones; and their ids: the b's are the rows' pairs, an extra column no row's
    (index -1, a label no row has), in the group of the pair that brought it (-1, every
    group, for a shared column)."""
    pair_columns = None if c.extra_columns is None else c.extra_columns.reshape(-1, b.shape[1])
    added = [x.astype(b.dtype) for x in (pair_columns, c.shared_columns) if x is not None and x.shape[0]]
    if not added:
        return b, rows
    count = sum(x.shape[0] for x in added)
    owners = [rows.index]
    if pair_columns is not None:
        owners.append(jnp.repeat(rows.index, c.extra_columns.shape[1]))
    if c.shared_columns is not None:
        owners.append(jnp.full((c.shared_columns.shape[0],), -1, rows.index.dtype))
    label = rows.label
    if label is not None:
        nobody = jnp.full((count, *label.shape[1:]), jnp.iinfo(label.dtype).min, label.dtype)
        label = jnp.concatenate([label, nobody])
    index = jnp.concatenate([rows.index, jnp.full((count,), -1, rows.index.dtype)])
    return jnp.concatenate([b, *added]), RowIds(index, label, group=jnp.concatenate(owners))


def spec(c: Candidates, base: PairSpec) -> PairSpec:
    """``base`` with what ``c`` changes in the tiles: groups, false negatives left out,
    positive sets compared."""
    return base._replace(
        group_size=c.group_size or 0,
        exclude_shared_label=c.false_negative_ids is not None,
        label_sets=c.positive_ids is not None,
    )


def own_columns(stats, local_batch: int):
    """The column statistics of this device's b's (the first ``local_batch`` columns),
    the extra columns' dropped: the b -> a direction."""
    keep = lambda v: None if v is None else v[:local_batch]  # noqa: E731
    return stats._replace(col_lse=keep(stats.col_lse), col_best_negative=keep(stats.col_best_negative))


# The keyword arguments the pair losses took before `Candidates` and `Streaming`.
_CANDIDATE_KEYWORDS = {
    "positive_ids": "positive_ids",
    "false_negative_ids": "false_negative_ids",
    "hard_negatives": "extra_columns",
    "group_size": "group_size",
    "query_rows": "query_rows",
    "positives": "positives",
}
_STREAMING_KEYWORDS = ("chunk_size", "collective", "matmul_dtype")


def from_keywords(
    loss: str, candidates: Candidates | None, streaming: Streaming | None, keywords: dict
) -> tuple[Candidates | None, Streaming]:
    """``(candidates, streaming)`` with the old keyword arguments folded in (a
    DeprecationWarning names their replacement; they go in the next release).

    Raises:
      TypeError: an unknown keyword, or an old one beside the value that replaces it.
    """
    streaming = Streaming() if streaming is None else streaming
    if not keywords:
        return candidates, streaming
    unknown = sorted(set(keywords) - set(_CANDIDATE_KEYWORDS) - set(_STREAMING_KEYWORDS))
    if unknown:
        raise TypeError(f"{loss}() got unexpected keyword arguments {unknown}.")
    old_candidates = {_CANDIDATE_KEYWORDS[k]: v for k, v in keywords.items() if k in _CANDIDATE_KEYWORDS}
    old_streaming = {k: v for k, v in keywords.items() if k in _STREAMING_KEYWORDS}
    if (old_candidates and candidates is not None) or (old_streaming and streaming != Streaming()):
        raise TypeError(f"{loss}(): pass candidates= and streaming=, or the old keywords {sorted(keywords)}, not both.")
    warnings.warn(
        f"{loss}({', '.join(f'{k}=' for k in sorted(keywords))}) is deprecated: pass "
        "candidates=losses.Candidates(...) and streaming=losses.Streaming(...) (hard_negatives= is "
        "Candidates(extra_columns=...)).",
        DeprecationWarning,
        stacklevel=3,
    )
    if old_candidates.get("group_size") is None:
        old_candidates.pop("group_size", None)
    if old_candidates:
        candidates = Candidates(**old_candidates)
    return candidates, streaming._replace(**old_streaming)
