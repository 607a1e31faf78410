"""Per-row statistics of a ``[B, M]`` logits matrix without holding the matrix.

The softmax- and sigmoid-family losses in :mod:`contrastive_jax.losses.contrastive`
each reduce their logits ``s_ij = x_i . y_j / temperature (+ bias)`` to a few numbers
per local row ``i`` (and, for the symmetric CLIP loss, per column ``j``):

* ``row_lse[i]``: logsumexp over the row's candidates (optionally without the row's own
  column, for losses whose anchors are also candidates);
* ``col_lse[j]``: logsumexp over the column, for each of this device's ``y`` rows;
* ``row_sums[k][i]``: sums over the row of elementwise pair terms (SupCon's positive
  logits, SigLIP's log-sigmoids).

:func:`pair_stats` computes these in three ways that give the same numbers:

* dense (``chunk_size=None``): the whole ``[B, N]`` block at once, differentiated by
  JAX -- O(B N) memory;
* chunked: a ``jax.lax.scan`` over column blocks of ``chunk_size``, combining each
  block's logsumexps into a running one (``logaddexp``, i.e. an online max-and-sum),
  inside a ``jax.custom_vjp`` whose residuals are only the inputs and the logsumexps.
  The backward pass recomputes each block and takes the gradient of a surrogate whose
  derivative in the logits is ``g_row * softmax_row + g_col * softmax_col + g_terms *
  d terms``, so memory is O(N D + B chunk_size);
* ring (``collective="ring"`` under ``axis_name``): nothing is gathered. Each device's
  ``y`` shard (with its ids, labels and running column logsumexp) travels around the
  devices with ``jax.lax.ppermute`` (D - 1 hops), each visit folded into the local rows'
  running statistics; the backward pass runs the ring again, the shard carrying its
  gradient accumulator, which one last hop returns to the shard's owner.

Both the dense and the streamed forms evaluate the same :func:`_block_stats`, so each
loss's math is written once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common

COLLECTIVES = ("all_gather", "ring")


class PairSpec(NamedTuple):
    """Which per-row statistics a loss needs from its logits (static, hashable).

    Attributes:
      row_logsumexp: compute ``row_lse: [B]``.
      col_logsumexp: compute ``col_lse`` for this device's ``y`` rows.
      exclude_self: leave pairs with equal ids (a row with itself) out of the softmax.
      pair_terms: ``fn(logits, same_id, same_label) -> tuple of [B, c]`` elementwise
        terms, each summed over the row into ``row_sums`` (``same_label`` is None
        without labels). Must be elementwise in the columns.
    """

    row_logsumexp: bool = False
    col_logsumexp: bool = False
    exclude_self: bool = False
    pair_terms: Callable | None = None


class PairStats(NamedTuple):
    """Per-row statistics of the global logits (fields None when not requested)."""

    row_lse: jax.Array | None  # [B]
    col_lse: jax.Array | None  # [B_y], one per local row of y
    row_sums: tuple[jax.Array, ...]  # each [B]


class RowIds(NamedTuple):
    """Who the rows of one side are: global indices and optional class labels."""

    index: jax.Array  # [B] int; equal indices on the two sides = the same example
    label: jax.Array | None  # [B] int, or None


# ------------------------------------------------------------------ one block's math


def _block_logits(x, y, params) -> jax.Array:
    """Logits ``[B, c]``: ``x . y / temperature (+ bias)`` in at least float32."""
    temperature, bias = params
    logits = _common.similarity(x, y) / temperature
    return logits if bias is None else logits + bias


def _block_masks(rows: RowIds, cols: RowIds):
    """``same_id, same_label: [B, c]`` booleans (``same_label`` None without labels)."""
    same_id = rows.index[:, None] == cols.index[None, :]
    same_label = None if rows.label is None else rows.label[:, None] == cols.label[None, :]
    return same_id, same_label


def _softmax_logits(spec, logits, same_id):
    return jnp.where(same_id, _common.MASK_VALUE, logits) if spec.exclude_self else logits


def _pair_terms(spec, logits, same_id, same_label) -> tuple:
    return () if spec.pair_terms is None else tuple(spec.pair_terms(logits, same_id, same_label))


def _block_stats(spec, x, y, rows, cols, params) -> PairStats:
    """The statistics of ``x: [B, D]`` against one block of columns ``y: [c, D]``.

    ``col_lse: [c]`` is over the rows of ``x`` only (a partial logsumexp).
    """
    logits = _block_logits(x, y, params)
    same_id, same_label = _block_masks(rows, cols)
    softmax_logits = _softmax_logits(spec, logits, same_id)
    return PairStats(
        row_lse=jax.nn.logsumexp(softmax_logits, axis=1) if spec.row_logsumexp else None,
        col_lse=jax.nn.logsumexp(softmax_logits, axis=0) if spec.col_logsumexp else None,
        row_sums=tuple(jnp.sum(t, axis=1) for t in _pair_terms(spec, logits, same_id, same_label)),
    )


def _block_surrogate(spec, x, y, rows, cols, params, lse, cotangents) -> jax.Array:
    """Scalar whose gradient in ``(x, y, params)`` is one block's share of the VJP.

    The derivative of ``g_i exp(s_ij - row_lse_i)`` in ``s_ij`` is the cotangent times
    the softmax weight, which is the derivative of the logsumexp; ``lse = (row_lse [B],
    col_lse [c])`` holds the final logsumexps (constants), so each block's gradient is
    exact without the others.
    """
    row_lse, col_lse = lse
    g = cotangents
    logits = _block_logits(x, y, params)
    same_id, same_label = _block_masks(rows, cols)
    softmax_logits = _softmax_logits(spec, logits, same_id)
    total = 0.0
    if spec.row_logsumexp:
        total += jnp.sum(g.row_lse[:, None] * jnp.exp(softmax_logits - row_lse[:, None]))
    if spec.col_logsumexp:
        total += jnp.sum(g.col_lse[None, :] * jnp.exp(softmax_logits - col_lse[None, :]))
    for g_sum, term in zip(g.row_sums, _pair_terms(spec, logits, same_id, same_label)):
        total += jnp.sum(g_sum[:, None] * term)
    return total


# ----------------------------------------------------------- streaming over blocks


def _blocks(tree, chunk):
    """Splits every leaf's leading axis ``M`` into ``[M // chunk, chunk, ...]``."""
    return jax.tree.map(lambda a: a.reshape(a.shape[0] // chunk, chunk, *a.shape[1:]), tree)


def _unblock(tree):
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), tree)


def _scan_forward(spec, chunk, x, y, rows, cols, params, carry):
    """Folds the columns ``y: [M, D]`` into the running row statistics ``carry``.

    Returns the new carry and the columns' logsumexps over the rows of ``x``: ``[M]``.
    """

    def step(carry, block):
        y_block, cols_block = block
        stats = _block_stats(spec, x, y_block, rows, cols_block, params)
        row_lse = None if carry.row_lse is None else jnp.logaddexp(carry.row_lse, stats.row_lse)
        row_sums = tuple(a + b for a, b in zip(carry.row_sums, stats.row_sums))
        return carry._replace(row_lse=row_lse, row_sums=row_sums), stats.col_lse

    carry, col_lse = jax.lax.scan(step, carry, _blocks((y, cols), chunk))
    return carry, None if col_lse is None else _unblock(col_lse)


def _scan_backward(spec, chunk, x, y, rows, cols, params, lse, cotangents, grads):
    """Adds the columns' share of ``(d/dx, d/dparams)`` to ``grads``; returns ``d/dy``.

    ``lse = (row_lse [B], col_lse [M])``; ``cotangents`` is a :class:`PairStats` whose
    ``col_lse`` is ``[M]`` like the columns.
    """
    grad_fn = jax.grad(functools.partial(_block_surrogate, spec), argnums=(0, 1, 4))

    def step(grads, block):
        y_block, cols_block, col_lse, g_col = block
        dx, dy, dparams = grad_fn(
            x, y_block, rows, cols_block, params, (lse[0], col_lse),
            cotangents._replace(col_lse=g_col),
        )
        grads = jax.tree.map(lambda acc, d: acc + d.astype(acc.dtype), grads, (dx, dparams))
        return grads, dy.astype(grads[0].dtype)

    blocks = _blocks((y, cols, lse[1], cotangents.col_lse), chunk)
    grads, dy = jax.lax.scan(step, grads, blocks)
    return grads, _unblock(dy)


def _ring(hop, state, travel, axis_name):
    """Calls ``hop(state, travel) -> (state, travel)`` on every device's ``travel``.

    ``travel`` moves one device along the ring (``ppermute``) between calls: D - 1 hops,
    none without ``axis_name``. The ``travel`` returned belongs to the next device, one
    :func:`_hop` away from home.
    """
    if axis_name is None:
        return hop(state, travel)

    def body(_, carry):
        state, travel = hop(*carry)
        return state, _hop(travel, axis_name)

    carry = jax.lax.fori_loop(0, jax.lax.axis_size(axis_name) - 1, body, (state, travel))
    return hop(*carry)


def _hop(tree, axis_name):
    """Sends ``tree`` to the next device on the ring over ``axis_name``."""
    size = jax.lax.axis_size(axis_name)
    return jax.lax.ppermute(tree, axis_name, [(i, (i + 1) % size) for i in range(size)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _streamed(spec, chunk, ring_axis, x, y, rows, cols, params) -> PairStats:
    """Streamed :class:`PairStats` of ``x: [B, D]`` against ``y: [M, D]``.

    With ``ring_axis``, ``y`` is this device's shard and the statistics span every
    device's shard (``col_lse: [M]`` complete); without it, ``col_lse`` is over the
    local rows only.
    """
    return _streamed_forward(spec, chunk, ring_axis, x, y, rows, cols, params)[0]


def _streamed_forward(spec, chunk, ring_axis, x, y, rows, cols, params):
    # full_like/zeros_like keep x's varying-axis type, which loop carries need.
    dtype = _accumulator_dtype(x)
    per_row = lambda fill: jnp.full_like(x[:, 0], fill, dtype)  # noqa: E731
    carry = PairStats(
        row_lse=per_row(-jnp.inf) if spec.row_logsumexp else None,
        col_lse=None,
        row_sums=tuple(per_row(0.0) for _ in range(_num_pair_terms(spec, rows))),
    )
    col_lse = jnp.full_like(y[:, 0], -jnp.inf, dtype) if spec.col_logsumexp else None

    def hop(carry, travel):
        y, cols, col_lse = travel
        carry, block_col_lse = _scan_forward(spec, chunk, x, y, rows, cols, params, carry)
        if col_lse is not None:
            col_lse = jnp.logaddexp(col_lse, block_col_lse)
        return carry, (y, cols, col_lse)

    carry, (_, _, col_lse) = _ring(hop, carry, (y, cols, col_lse), ring_axis)
    if ring_axis is not None and col_lse is not None:
        col_lse = _hop(col_lse, ring_axis)
    stats = carry._replace(col_lse=col_lse)
    return stats, (x, y, rows, cols, params, stats.row_lse, stats.col_lse)


def _accumulator_dtype(x) -> jnp.dtype:
    """Logits and sums in float32, or wider when the embeddings are (bfloat16 -> float32)."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _num_pair_terms(spec, rows) -> int:
    if spec.pair_terms is None:
        return 0
    logits = jax.ShapeDtypeStruct((1, 1), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, 1), jnp.bool_)
    return len(jax.eval_shape(spec.pair_terms, logits, mask, None if rows.label is None else mask))


def _streamed_backward(spec, chunk, ring_axis, residuals, cotangents):
    x, y, rows, cols, params, row_lse, col_lse = residuals
    dtype = _accumulator_dtype(x)
    grads = (jnp.zeros_like(x, dtype), jax.tree.map(jnp.zeros_like, params))

    def hop(grads, travel):
        y, cols, col_lse, g_col, dy = travel
        grads, block_dy = _scan_backward(
            spec, chunk, x, y, rows, cols, params, (row_lse, col_lse),
            cotangents._replace(col_lse=g_col), grads,
        )
        return grads, (y, cols, col_lse, g_col, dy + block_dy)

    travel = (y, cols, col_lse, cotangents.col_lse, jnp.zeros_like(y, dtype))
    (dx, dparams), (*_, dy) = _ring(hop, grads, travel, ring_axis)
    if ring_axis is not None:
        dy = _hop(dy, ring_axis)
    return dx.astype(x.dtype), dy.astype(y.dtype), None, None, dparams


_streamed.defvjp(_streamed_forward, _streamed_backward)


# ------------------------------------------------------------------------ entry point


def check_collective(collective: str, axis_name) -> None:
    """Rejects an unknown collective, or ``"ring"`` without a device axis."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}.")
    if collective == "ring" and axis_name is None:
        raise ValueError(
            "collective='ring' passes shards between devices and needs axis_name (call "
            "the loss inside jax.shard_map, e.g. contrastive_jax.sharding.shard_loss); "
            "on a single device use collective='all_gather' (the default)."
        )


def _check_chunk(chunk_size: int, num_columns: int, what: str) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}.")
    if num_columns % chunk_size:
        divisor = max(d for d in range(1, min(chunk_size, num_columns) + 1) if num_columns % d == 0)
        raise ValueError(
            f"chunk_size={chunk_size} must divide the {num_columns} candidate columns "
            f"({what}); use a divisor such as chunk_size={divisor}, or chunk_size=None "
            f"for the dense loss."
        )


def _match_varying(tree, like, axis_name):
    """Marks ``tree`` as varying over ``axis_name`` when ``like`` is (shard_map typing).

    A replicated temperature gets a per-device gradient share inside the custom VJP;
    casting it to varying first lets JAX sum those shares over the devices.
    """
    if axis_name is None or axis_name not in _common._varying_axes(like):
        return tree
    return jax.tree.map(
        lambda a: a
        if axis_name in _common._varying_axes(a)
        else jax.lax.pcast(a, axis_name, to="varying"),
        tree,
    )


def _logsumexp_over_devices(partial: jax.Array, axis_name) -> jax.Array:
    """``log sum_devices exp(partial)`` elementwise, the same on every device."""
    if axis_name is None:
        return partial
    shift = jax.lax.pmax(jax.lax.stop_gradient(partial), axis_name)
    return shift + jnp.log(jax.lax.psum(jnp.exp(partial - shift), axis_name))


def pair_stats(
    spec: PairSpec,
    x: jax.Array,
    y: jax.Array,
    rows: RowIds,
    cols: RowIds,
    *,
    temperature,
    bias=None,
    axis_name=None,
    chunk_size: int | None = None,
    collective: str = "all_gather",
) -> PairStats:
    """Per-row statistics of the logits of the local rows against the global candidates.

    Args:
      spec: which statistics (see :class:`PairSpec`).
      x: ``[B, D]`` this device's rows; ``rows``: their ids ``[B]``.
      y: ``[B_y, D]`` this device's candidates; ``cols``: their ids ``[B_y]``. The
        candidates of every row are all devices' ``y`` (``N_y`` in all).
      temperature: scalar > 0; bias: scalar added to the logits, or None.
      axis_name: mesh axis of the global batch, or None.
      chunk_size: None for the dense ``[B, N_y]`` logits; an int streams column blocks of
        that size (it must divide ``N_y``, or ``B_y`` with the ring).
      collective: ``"all_gather"`` gathers the candidates; ``"ring"`` passes them
        around the devices and never holds them all.

    Returns:
      :class:`PairStats`: ``row_lse: [B]``, ``col_lse: [B_y]`` (the logsumexp of each
      local candidate's column over all devices' rows), ``row_sums``: tuple of ``[B]``.
    """
    check_collective(collective, axis_name)
    dtype = _accumulator_dtype(x)
    params = jax.tree.map(lambda p: jnp.asarray(p, dtype), (temperature, bias))
    params = _match_varying(params, x, axis_name)
    local_cols = y.shape[0]
    if collective == "ring":
        chunk = local_cols if chunk_size is None else chunk_size
        _check_chunk(chunk, local_cols, "each device's shard B_y with collective='ring'")
        return _streamed(spec, chunk, axis_name, x, y, rows, cols, params)

    y, cols = jax.tree.map(lambda a: _common.gather_rows(a, axis_name), (y, cols))
    if chunk_size is None:
        stats = _block_stats(spec, x, y, rows, cols, params)
    else:
        _check_chunk(chunk_size, y.shape[0], "the gathered global batch N_y")
        stats = _streamed(spec, chunk_size, None, x, y, rows, cols, params)
    if stats.col_lse is None:
        return stats
    col_lse = _logsumexp_over_devices(stats.col_lse, axis_name)
    start = _common.row_offset(local_cols, axis_name)
    return stats._replace(col_lse=jax.lax.dynamic_slice_in_dim(col_lse, start, local_cols))
