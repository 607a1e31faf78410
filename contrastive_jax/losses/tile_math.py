"""One tile's math: the logits of ``[b]`` rows against ``[c]`` columns, the statistics
a loss needs from them, and their gradient.

Both the dense path (one tile holding every column) and the streamed sweeps
(:mod:`contrastive_jax.losses.tile_sweeps`) evaluate these functions, so each loss's
math is written once. Shapes: ``x [B, D]`` rows, ``y [M, D]`` candidate columns, tiles
``[b, c]``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common


class PairSpec(NamedTuple):
    """Which statistics a loss needs from its logits (static, hashable).

    Attributes:
      row_logsumexp: compute ``row_lse: [B]``.
      col_logsumexp: compute ``col_lse`` for this device's ``y`` rows.
      exclude_self: leave pairs with equal ids (a row with itself) out of the softmax.
      exclude_shared_label: leave pairs with equal labels but different ids (another
        example sharing a class, or any of ``K`` group ids for labels ``[B, K]``) out
        of the softmax: in-batch false negatives.
      pair_terms: ``fn(logits, same_id, same_label) -> dict name -> [B, c]`` of
        elementwise terms, each summed over the row into ``row_sums[name]``
        (``same_label`` is None without labels). Must be elementwise in the columns.
      best: compute ``row_best_negative`` and ``col_best_negative`` (the largest logit
        of each row and column other than the own pair's, equal ids).
      label_sets: labels ``[B, K]`` are sets: two rows share a label when any of their
        non-negative ids are equal (a negative id is padding and matches nothing).
        Otherwise the K ids are K keys, compared position by position.
      positive_logsumexp: with each side's logsumexp, also the logsumexp over its
        positives, the pairs with equal ids or a shared label (``positive_lse``).
      col_sums: also sum the pair terms over each column into ``col_sums[name]``.
      group_size: K > 0: a row's candidates are the columns of its group, the K
        consecutive global indices ``index // K`` equal to its own; the others are left
        out of every statistic (softmaxes, pair terms, positives, best negatives).
    """

    row_logsumexp: bool = False
    col_logsumexp: bool = False
    exclude_self: bool = False
    exclude_shared_label: bool = False
    pair_terms: Callable | None = None
    best: bool = False
    label_sets: bool = False
    positive_logsumexp: bool = False
    col_sums: bool = False
    group_size: int = 0


class PairStats(NamedTuple):
    """Statistics of the global logits (fields None, or ``{}``, when not requested)."""

    row_lse: jax.Array | None  # [B]
    col_lse: jax.Array | None  # [B_y], one per local row of y
    row_sums: dict[str, jax.Array]  # each [B]
    row_best_negative: jax.Array | None  # [B]: the row's largest logit but its own pair's
    col_best_negative: jax.Array | None  # [B_y]: the same for each local column
    row_positive_lse: jax.Array | None = None  # [B]: logsumexp over the row's positives
    col_positive_lse: jax.Array | None = None  # [B_y]
    col_sums: dict[str, jax.Array] | None = None  # each [B_y]


class RowIds(NamedTuple):
    """Who the rows of one side are: global indices, optional labels and validity."""

    index: jax.Array  # [B] int; equal indices on the two sides = the same example
    # [B] int class labels, or [B, K] int group ids (equal when any of the K is), or None
    label: jax.Array | None
    # [B] bool or None (all valid): False marks a column that is no candidate (an empty
    # memory slot); every row treats it as it treats its own column (``same_id``).
    valid: jax.Array | None = None
    # [B] int or None (``index``): the global row whose group (``PairSpec.group_size``)
    # the column is in; -1: every group's (a column that belongs to no pair).
    group: jax.Array | None = None


class Running(NamedTuple):
    """One side's (rows' or columns') statistics over the tiles seen so far."""

    lse: jax.Array | None
    best_negative: jax.Array | None
    sums: dict[str, jax.Array]
    positive_lse: jax.Array | None = None


class Plan(NamedTuple):
    """Static tiling of a streamed computation."""

    tile_rows: int
    tile_cols: int
    matmul_dtype: jnp.dtype
    # "xla": the double scan over tiles; "pallas" / "pallas_interpret": the Pallas
    # kernels of :mod:`~contrastive_jax.losses.pallas_tiles`, whose blocks are the tiles.
    kernel: str = "xla"


def scaled_rows(x, temperature) -> jax.Array:
    """``x / temperature`` in float32 (or wider): the temperature folded into the rows."""
    return _common.at_least_float32(x) / temperature


def _product(a, b, contract: int, dtype) -> jax.Array:
    """``a`` contracted over axis ``contract`` with ``b``'s axis 0 (the other axis of
    ``b`` when ``contract`` is 1 and ``b`` is ``[c, D]``), ``dtype`` operands, float32
    accumulation."""
    accumulate = jnp.promote_types(dtype, jnp.float32)
    return jax.lax.dot_general(
        a.astype(dtype),
        b.astype(dtype),
        (((contract,), (0,)), ((), ())),
        preferred_element_type=accumulate,
    )


def tile_logits(x_scaled, y, bias, dtype) -> jax.Array:
    """Logits ``[b, c]``: ``(x / T) . y (+ bias)`` from ``dtype`` operands, in float32."""
    accumulate = jnp.promote_types(dtype, jnp.float32)
    logits = jax.lax.dot_general(
        x_scaled.astype(dtype),
        y.astype(dtype),
        (((1,), (1,)), ((), ())),
        preferred_element_type=accumulate,
    )
    return logits if bias is None else logits + bias


def _tile_masks(spec, rows: RowIds, cols: RowIds, left_out=None):
    """``same_id, same_label, other_group: [b, c]`` booleans (``same_label`` None
    without labels, ``other_group`` None without ``spec.group_size`` and ``left_out``).

    ``left_out: [b, c]`` bool or None: pairs left out of every statistic as another
    group's are (the padding of a Pallas block past the last row or column)."""
    same_id = rows.index[:, None] == cols.index[None, :]
    if cols.valid is not None:
        same_id = same_id | ~cols.valid[None, :]
    same_label = None
    if rows.label is not None and spec.label_sets:
        row_ids = rows.label.reshape(rows.label.shape[0], 1, -1, 1)  # [b, 1, K, 1]
        shared = (row_ids == cols.label.reshape(1, cols.label.shape[0], 1, -1)) & (row_ids >= 0)
        same_label = jnp.any(shared, axis=(2, 3))
    elif rows.label is not None:
        same_label = rows.label[:, None] == cols.label[None, :]
        if same_label.ndim == 3:  # [b, c, K] group ids: equal when any id is
            same_label = jnp.any(same_label, axis=-1)
    other_group = None
    if spec.group_size:
        col_group = cols.index if cols.group is None else cols.group
        other_group = rows.index[:, None] // spec.group_size != col_group[None, :] // spec.group_size
        if cols.group is not None:
            other_group = other_group & (col_group[None, :] >= 0)
    return same_id, same_label, _either(other_group, left_out)


def _either(mask, other):
    """``mask | other`` where either may be None (None: all False)."""
    return other if mask is None else mask if other is None else mask | other


def _softmax_logits(spec, logits, same_id, same_label, other_group):
    """The logits the softmaxes see: excluded pairs (see :class:`PairSpec`) masked."""
    excluded = _either(same_id if spec.exclude_self else None, other_group)
    if spec.exclude_shared_label:
        excluded = _either(excluded, same_label & ~same_id)
    return logits if excluded is None else jnp.where(excluded, _common.MASK_VALUE, logits)


def _pair_terms(spec, logits, same_id, same_label, other_group) -> dict:
    if spec.pair_terms is None:
        return {}
    terms = dict(spec.pair_terms(logits, same_id, same_label))
    return terms if other_group is None else {name: jnp.where(other_group, 0.0, t) for name, t in terms.items()}


def _positive_logits(spec, logits, same_id, same_label, other_group):
    """The logits the positives' softmax sees (None without ``spec.positive_logsumexp``)."""
    if not spec.positive_logsumexp:
        return None
    positives = same_id if same_label is None else same_id | same_label
    if other_group is not None:
        positives = positives & ~other_group
    return jnp.where(positives, logits, _common.MASK_VALUE)


def _side(softmax_logits, positive_logits, negative_logits, terms, axis, *, lse: bool, sums: bool) -> Running:
    """One side's statistics of a tile, reducing over ``axis`` (1: rows, 0: columns);
    ``positive_logits`` and ``negative_logits`` are None when not asked for."""
    logsumexp = functools.partial(jax.nn.logsumexp, axis=axis)
    return Running(
        lse=logsumexp(softmax_logits) if lse else None,
        best_negative=None if negative_logits is None else jnp.max(negative_logits, axis=axis),
        sums={name: jnp.sum(t, axis=axis) for name, t in terms.items()} if sums else {},
        positive_lse=logsumexp(positive_logits) if lse and positive_logits is not None else None,
    )


def tile_stats(spec, logits, rows, cols, left_out=None) -> tuple[Running, Running]:
    """The row and column statistics of one tile of logits ``[b, c]`` (``left_out``:
    as ``_tile_masks``)."""
    masks = _tile_masks(spec, rows, cols, left_out)
    softmax_logits = _softmax_logits(spec, logits, *masks)
    positive_logits = _positive_logits(spec, logits, *masks)
    terms = _pair_terms(spec, logits, *masks)
    negative_logits = jnp.where(_either(masks[0], masks[2]), -jnp.inf, logits) if spec.best else None
    row = _side(softmax_logits, positive_logits, negative_logits, terms, 1, lse=spec.row_logsumexp, sums=True)
    col = _side(softmax_logits, positive_logits, negative_logits, terms, 0, lse=spec.col_logsumexp, sums=spec.col_sums)
    return row, col


def merge(a: Running, b: Running) -> Running:
    """The statistics of two disjoint sets of candidates combined."""
    return Running(
        lse=None if a.lse is None else jnp.logaddexp(a.lse, b.lse),
        best_negative=None if a.best_negative is None else jnp.maximum(a.best_negative, b.best_negative),
        sums={name: a.sums[name] + b.sums[name] for name in a.sums},
        positive_lse=None if a.positive_lse is None else jnp.logaddexp(a.positive_lse, b.positive_lse),
    )


def row_objective(spec, logits, rows, cols) -> jax.Array:
    """Per-row ``[b]``: the row's logsumexp (the tile must hold the whole row) plus the
    row sums of its pair terms -- what :func:`~contrastive_jax.losses.logit_stats.pair_total` adds up."""
    masks = _tile_masks(spec, rows, cols)
    total = sum(jnp.sum(t, axis=1) for t in _pair_terms(spec, logits, *masks).values())
    if spec.row_logsumexp:
        total = total + jax.nn.logsumexp(_softmax_logits(spec, logits, *masks), axis=1)
    return total


def _side_surrogate(softmax_logits, positive_logits, terms, final: Running, cotangent: Running, axis) -> jax.Array:
    """``sum g . stats`` of one side, with the final logsumexps as constants: its
    gradient in the logits is that of the side's statistics, contracted with ``g``."""
    along = (lambda v: v[:, None]) if axis == 1 else (lambda v: v[None, :])  # noqa: E731
    total = 0.0
    if cotangent.lse is not None:
        total += jnp.sum(along(cotangent.lse) * jnp.exp(softmax_logits - along(final.lse)))
    if cotangent.positive_lse is not None:
        total += jnp.sum(along(cotangent.positive_lse) * jnp.exp(positive_logits - along(final.positive_lse)))
    for name, g in cotangent.sums.items():
        total += jnp.sum(along(g) * terms[name])
    return total


def tile_logit_gradient(spec, logits, rows, cols, finals, cotangents, left_out=None) -> jax.Array:
    """``G: [b, c]``, the derivative of ``sum g . stats`` in the tile's logits.

    The derivative of ``g_i logsumexp_j(s_ij)`` in ``s_ij`` is ``g_i`` times the softmax
    weight ``exp(s_ij - row_lse_i)``; ``finals = (row, col)`` :class:`Running` hold the
    final logsumexps (constants), so each tile's share is exact without the others;
    ``cotangents = (row, col)`` :class:`Running` the ``g`` of each statistic;
    ``left_out`` as ``_tile_masks``.
    """
    masks = _tile_masks(spec, rows, cols, left_out)

    def surrogate(logits):
        softmax_logits = _softmax_logits(spec, logits, *masks)
        positive_logits = _positive_logits(spec, logits, *masks)
        terms = _pair_terms(spec, logits, *masks)
        return sum(
            _side_surrogate(softmax_logits, positive_logits, terms, final, cotangent, axis)
            for final, cotangent, axis in zip(finals, cotangents, (1, 0))
        )

    return jax.grad(surrogate)(logits)


def accumulate_gradients(grads, logit_gradient, x_scaled, y, dtype, with_bias):
    """Adds one tile's ``G y`` (rows), ``G^T x / T`` (columns) and ``sum G`` (bias)."""
    dx, dbias, dy = grads
    dx = dx + _product(logit_gradient, y, 1, dtype)
    dy = dy + _product(logit_gradient, x_scaled, 0, dtype)
    if with_bias:
        dbias = dbias + jnp.sum(logit_gradient, axis=1)
    return dx, dbias, dy


def input_gradients(x, y, params, dx_unscaled, dy, dbias_rows):
    """The custom VJPs' gradients from the accumulated ``G y``, ``G^T x / T``, ``sum G``.

    ``d/dx = G y / T``; the logits are linear in ``1 / T``, so ``d/dT = -(1/T) sum_i
    x_i . d/dx_i`` needs no pass over the tiles.
    """
    temperature, bias = params
    dx = dx_unscaled / temperature
    d_temperature = -jnp.sum(_common.at_least_float32(x) * dx) / temperature
    d_bias = None if bias is None else jnp.sum(dbias_rows)
    return dx.astype(x.dtype), dy.astype(y.dtype), None, None, (d_temperature, d_bias)


def _running_init(like, *, lse: bool, best: bool, positive: bool, sum_names=()) -> Running:
    """Empty statistics, one per row of ``like`` (typed like it inside shard_map)."""
    dtype = _common.at_least_float32(like[:1, 0]).dtype
    fill = lambda value, dt=dtype: jnp.full_like(like[:, 0], value, dt)  # noqa: E731
    return Running(
        lse=fill(-jnp.inf) if lse else None,
        best_negative=fill(-jnp.inf) if best else None,
        sums={name: fill(0.0) for name in sum_names},
        positive_lse=fill(-jnp.inf) if lse and positive else None,
    )


def _pair_term_names(spec, rows) -> tuple[str, ...]:
    if spec.pair_terms is None:
        return ()
    logits = jax.ShapeDtypeStruct((1, 1), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, 1), jnp.bool_)
    return tuple(jax.eval_shape(spec.pair_terms, logits, mask, None if rows.label is None else mask))


def stats_init(spec, x, y, rows) -> tuple[Running, Running]:
    names = _pair_term_names(spec, rows)
    init = functools.partial(_running_init, best=spec.best, positive=spec.positive_logsumexp)
    return (
        init(x, lse=spec.row_logsumexp, sum_names=names),
        init(y, lse=spec.col_logsumexp, sum_names=names if spec.col_sums else ()),
    )


def zero_gradients(x, y):
    """``(G y [B, D], sum G [B], G^T x / T [M, D])`` accumulators in float32 or wider."""
    dtype = _common.at_least_float32(x[:1, :1]).dtype
    return jnp.zeros_like(x, dtype), jnp.zeros_like(x[:, 0], dtype), jnp.zeros_like(y, dtype)
