"""Statistics of the ``[B, M]`` logits of a loss, dense or streamed in cache-sized tiles.

The softmax- and sigmoid-family losses in :mod:`contrastive_jax.losses.contrastive`
each reduce their logits ``s_ij = x_i . y_j / temperature (+ bias)`` to a few numbers
per local row ``i`` (and, for the symmetric CLIP loss, per column ``j``):

* ``row_lse[i]``: logsumexp over the row's candidates (optionally without the row's own
  column, for losses whose anchors are also candidates);
* ``col_lse[j]``: logsumexp over the column, for each of this device's ``y`` rows;
* ``row_sums[name][i]``: sums over the row of named elementwise pair terms (SupCon's
  positive logits, SigLIP's log-sigmoids);
* ``row_best_negative[i]`` / ``col_best_negative[j]``: the largest logit of the row
  (column) among its candidates other than its own pair, for the in-batch retrieval
  metrics (top-1 is right when the pair's own logit beats it). A masked max, not an
  argmax: XLA's CPU argmax (a variadic reduce) costs about twice a D=64 tile's matmul.

:func:`pair_stats` computes them; :func:`pair_total` computes the sum over the rows of
``row_lse + sum(row_sums)`` with its gradient in the same pass. The :class:`Streaming`
options choose how, with the same numbers:

* dense (``chunk_size=None``): the whole ``[B, M]`` block at once, differentiated by JAX
  -- O(B M) memory.
* tiled (``chunk_size=c``): a double ``jax.lax.scan`` over tiles of at most ``c`` rows by
  ``c`` columns, so each tile's elementwise work stays in cache. Per-row statistics
  are carried along a row of tiles, per-column ones down a column of tiles, and
  logsumexps merge with ``logaddexp`` (an online max-and-sum). Memory O(N D + c^2).

  - Two passes (:func:`pair_stats`): a ``jax.custom_vjp`` keeps only the inputs and
    the logsumexps; the backward pass recomputes each tile's logits ``S`` and its
    logit gradient ``G`` (``g_row * softmax_row + g_col * softmax_col + g_terms *
    d terms``), then ``dx += G y``, ``dy += G^T x / T``: 8 N^2 D flops. This is what
    CLIP needs: both directions' normalisers are known only after every tile.
  - One pass (:func:`pair_total`): when the loss is a sum of per-row terms whose tile
    holds all of each row's normaliser (SigLIP: none; InfoNCE: a stripe of ``c`` whole
    rows, O(c N) memory), the forward pass already knows ``G`` and accumulates the
    gradients: 6 N^2 D flops.
    The backward pass only scales them by the incoming cotangent.
* ring (``collective="ring"`` under ``axis_name``): nothing is gathered. Each device's
  ``y`` shard (with its ids and per-column carry) travels around the devices with
  ``jax.lax.ppermute`` (D - 1 hops), each visit swept tile by tile; the per-column
  carry (statistics, or a gradient accumulator) returns to the shard's owner in one
  last hop.

The matmuls take ``matmul_dtype`` operands (``"bfloat16"`` for mixed precision) and
accumulate in float32; logits, logsumexps and gradient sums are float32 (or wider).
Both the dense and the streamed forms evaluate the same per-tile functions, so each
loss's math is written once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from contrastive_jax import compat
from contrastive_jax.losses import _common

COLLECTIVES = ("all_gather", "ring")
MATMUL_DTYPES = (None, "bfloat16", "float32")
# Tile edge chunk_size="auto" aims for, by platform: on CPU a float32 [512, 512] tile
# (1 MiB) stays in a core's L2 cache with room for the operands (measured best at
# D=64 on a 2-core EPYC); accelerators want larger matmuls to fill their units.
AUTO_TILE = {"cpu": 512, "gpu": 2048, "tpu": 2048}


class Streaming(NamedTuple):
    """How a loss computes its logits; the result does not depend on it (to round-off).

    Attributes:
      chunk_size: None for the dense ``[B, N]`` logits; an int ``c`` streams tiles of
        up to ``c`` rows by ``c`` columns (``c`` must divide the candidate columns, or
        each device's shard with the ring); ``"auto"``: see :func:`auto_chunk_size`.
      collective: ``"all_gather"``, or ``"ring"`` with an ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).
    """

    chunk_size: int | str | None = None
    collective: str = "all_gather"
    matmul_dtype: str | None = None

    def check(self, axis_name) -> None:
        """Rejects unknown options, or ``"ring"`` without a device axis."""
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {COLLECTIVES}, got {self.collective!r}.")
        if self.collective == "ring" and axis_name is None:
            raise ValueError(
                "collective='ring' passes shards between devices and needs axis_name (call "
                "the loss inside jax.shard_map, e.g. contrastive_jax.sharding.shard_loss); "
                "on a single device use collective='all_gather' (the default)."
            )
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(
                f"matmul_dtype must be one of {MATMUL_DTYPES}, got {self.matmul_dtype!r}."
            )
        chunk = self.chunk_size
        if chunk is not None and chunk != "auto" and (
            not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1
        ):
            raise ValueError(f"chunk_size must be a positive int, 'auto' or None, got {chunk!r}.")


STREAMING_ARGS_DOC = """chunk_size: None for the dense ``[B, N]`` logits; an int ``c`` streams tiles of
        up to ``c`` rows by ``c`` columns, O(N D + c^2) memory (one-pass InfoNCE and
        NT-Xent: stripes of ``c`` whole rows, O(N D + c N)), the same result (``c``
        must divide N, or B with the ring); ``"auto"`` picks ``c`` from N, D and the
        device (:func:`contrastive_jax.losses.logit_stats.auto_chunk_size`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``: pass
        the candidates' shards around the devices instead of gathering them.
      matmul_dtype: None computes similarities in the embeddings' dtype;
        ``"bfloat16"`` casts the matmul operands to bfloat16 and accumulates in
        float32 (logits, logsumexps and gradient sums stay float32)."""


def document_streaming(fn: Callable) -> Callable:
    """Fills ``{streaming_args}`` in ``fn``'s docstring with the :class:`Streaming` options."""
    fn.__doc__ = fn.__doc__.replace("{streaming_args}", STREAMING_ARGS_DOC)
    return fn


def divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (>= 1)."""
    return max(d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0)


def check_divides(chunk_size: int, num_columns: int, what: str) -> None:
    """Requires ``chunk_size`` to divide ``num_columns``; the message names a divisor."""
    if num_columns % chunk_size:
        raise ValueError(
            f"chunk_size={chunk_size} must divide the {num_columns} candidate columns "
            f"({what}); use a divisor such as chunk_size="
            f"{divisor_at_most(num_columns, chunk_size)}, or chunk_size=None for the dense "
            f"loss."
        )


def auto_chunk_size(num_columns: int, dim: int, platform: str | None = None) -> int | None:
    """The tile edge ``chunk_size="auto"`` uses for ``num_columns`` candidates of width ``dim``.

    The largest divisor of ``num_columns`` at most ``AUTO_TILE[platform]`` (CPU 512,
    doubled for ``dim > 256`` where the tile's matmul dominates and larger matmuls run
    faster; GPU/TPU 2048; ``platform`` defaults to ``jax.devices()[0].platform``).
    None (dense) when all columns fit in one tile: one tile is the dense computation.
    """
    platform = platform or jax.devices()[0].platform
    target = AUTO_TILE.get(platform, AUTO_TILE["gpu"])
    if platform == "cpu" and dim > 256:
        target *= 2
    if num_columns <= target:
        return None
    return divisor_at_most(num_columns, target)


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
    """

    row_logsumexp: bool = False
    col_logsumexp: bool = False
    exclude_self: bool = False
    exclude_shared_label: bool = False
    pair_terms: Callable | None = None
    best: bool = False


class PairStats(NamedTuple):
    """Statistics of the global logits (fields None, or ``{}``, when not requested)."""

    row_lse: jax.Array | None  # [B]
    col_lse: jax.Array | None  # [B_y], one per local row of y
    row_sums: dict[str, jax.Array]  # each [B]
    row_best_negative: jax.Array | None  # [B]: the row's largest logit but its own pair's
    col_best_negative: jax.Array | None  # [B_y]: the same for each local column


class RowIds(NamedTuple):
    """Who the rows of one side are: global indices and optional labels."""

    index: jax.Array  # [B] int; equal indices on the two sides = the same example
    # [B] int class labels, or [B, K] int group ids (equal when any of the K is), or None
    label: jax.Array | None


class _Running(NamedTuple):
    """One side's (rows' or columns') statistics over the tiles seen so far."""

    lse: jax.Array | None
    best_negative: jax.Array | None
    sums: dict[str, jax.Array]


class _Plan(NamedTuple):
    """Static tiling of a streamed computation."""

    tile_rows: int
    tile_cols: int
    matmul_dtype: jnp.dtype


# ------------------------------------------------------------------ one tile's math


def _scaled_rows(x, temperature) -> jax.Array:
    """``x / temperature`` in float32 (or wider): the temperature folded into the rows."""
    return _common.at_least_float32(x) / temperature


def _product(a, b, contract: int, dtype) -> jax.Array:
    """``a`` contracted over axis ``contract`` with ``b``'s axis 0 (the other axis of
    ``b`` when ``contract`` is 1 and ``b`` is ``[c, D]``), ``dtype`` operands, float32
    accumulation."""
    accumulate = jnp.promote_types(dtype, jnp.float32)
    return jax.lax.dot_general(
        a.astype(dtype), b.astype(dtype), (((contract,), (0,)), ((), ())),
        preferred_element_type=accumulate,
    )


def _tile_logits(x_scaled, y, bias, dtype) -> jax.Array:
    """Logits ``[b, c]``: ``(x / T) . y (+ bias)`` from ``dtype`` operands, in float32."""
    accumulate = jnp.promote_types(dtype, jnp.float32)
    logits = jax.lax.dot_general(
        x_scaled.astype(dtype), y.astype(dtype), (((1,), (1,)), ((), ())),
        preferred_element_type=accumulate,
    )
    return logits if bias is None else logits + bias


def _tile_masks(rows: RowIds, cols: RowIds):
    """``same_id, same_label: [b, c]`` booleans (``same_label`` None without labels)."""
    same_id = rows.index[:, None] == cols.index[None, :]
    same_label = None
    if rows.label is not None:
        same_label = rows.label[:, None] == cols.label[None, :]
        if same_label.ndim == 3:  # [b, c, K] group ids: equal when any id is
            same_label = jnp.any(same_label, axis=-1)
    return same_id, same_label


def _softmax_logits(spec, logits, same_id, same_label):
    """The logits the softmaxes see: excluded pairs (see :class:`PairSpec`) masked."""
    excluded = same_id if spec.exclude_self else None
    if spec.exclude_shared_label:
        false_negatives = same_label & ~same_id
        excluded = false_negatives if excluded is None else excluded | false_negatives
    return logits if excluded is None else jnp.where(excluded, _common.MASK_VALUE, logits)


def _pair_terms(spec, logits, same_id, same_label) -> dict:
    return {} if spec.pair_terms is None else dict(spec.pair_terms(logits, same_id, same_label))


def _side(softmax_logits, negative_logits, axis, *, lse: bool, sums) -> _Running:
    """One side's statistics of a tile, reducing over ``axis`` (1: rows, 0: columns);
    ``negative_logits`` is None without ``spec.best``."""
    return _Running(
        lse=jax.nn.logsumexp(softmax_logits, axis=axis) if lse else None,
        best_negative=None if negative_logits is None else jnp.max(negative_logits, axis=axis),
        sums=sums,
    )


def _tile_stats(spec, logits, rows, cols) -> tuple[_Running, _Running]:
    """The row and column statistics of one tile of logits ``[b, c]``."""
    same_id, same_label = _tile_masks(rows, cols)
    softmax_logits = _softmax_logits(spec, logits, same_id, same_label)
    terms = _pair_terms(spec, logits, same_id, same_label)
    negative_logits = jnp.where(same_id, -jnp.inf, logits) if spec.best else None
    row = _side(softmax_logits, negative_logits, 1, lse=spec.row_logsumexp,
                sums={name: jnp.sum(t, axis=1) for name, t in terms.items()})
    col = _side(softmax_logits, negative_logits, 0, lse=spec.col_logsumexp, sums={})
    return row, col


def _merge(a: _Running, b: _Running) -> _Running:
    """The statistics of two disjoint sets of candidates combined."""
    return _Running(
        lse=None if a.lse is None else jnp.logaddexp(a.lse, b.lse),
        best_negative=None if a.best_negative is None else jnp.maximum(a.best_negative, b.best_negative),
        sums={name: a.sums[name] + b.sums[name] for name in a.sums},
    )


def _row_objective(spec, logits, rows, cols) -> jax.Array:
    """Per-row ``[b]``: the row's logsumexp (the tile must hold the whole row) plus the
    row sums of its pair terms -- what :func:`pair_total` adds up."""
    same_id, same_label = _tile_masks(rows, cols)
    total = sum(jnp.sum(t, axis=1) for t in _pair_terms(spec, logits, same_id, same_label).values())
    if spec.row_logsumexp:
        total = total + jax.nn.logsumexp(_softmax_logits(spec, logits, same_id, same_label), axis=1)
    return total


def _logit_gradient(spec, logits, rows, cols, lse, cotangents) -> jax.Array:
    """``G: [b, c]``, the derivative of ``sum g . stats`` in the tile's logits.

    The derivative of ``g_i logsumexp_j(s_ij)`` in ``s_ij`` is ``g_i`` times the softmax
    weight ``exp(s_ij - row_lse_i)``; ``lse = (row_lse [b], col_lse [c])`` holds the
    final logsumexps (constants), so each tile's share is exact without the others.
    """
    row_lse, col_lse = lse
    g_row, g_col, g_sums = cotangents
    same_id, same_label = _tile_masks(rows, cols)

    def surrogate(logits):
        softmax_logits = _softmax_logits(spec, logits, same_id, same_label)
        total = 0.0
        if spec.row_logsumexp:
            total += jnp.sum(g_row[:, None] * jnp.exp(softmax_logits - row_lse[:, None]))
        if spec.col_logsumexp:
            total += jnp.sum(g_col[None, :] * jnp.exp(softmax_logits - col_lse[None, :]))
        for name, term in _pair_terms(spec, logits, same_id, same_label).items():
            total += jnp.sum(g_sums[name][:, None] * term)
        return total

    return jax.grad(surrogate)(logits)


def _accumulate_gradients(grads, logit_gradient, x_scaled, y, dtype, with_bias):
    """Adds one tile's ``G y`` (rows), ``G^T x / T`` (columns) and ``sum G`` (bias)."""
    dx, dbias, dy = grads
    dx = dx + _product(logit_gradient, y, 1, dtype)
    dy = dy + _product(logit_gradient, x_scaled, 0, dtype)
    if with_bias:
        dbias = dbias + jnp.sum(logit_gradient, axis=1)
    return dx, dbias, dy


def _input_gradients(x, y, params, dx_unscaled, dy, dbias_rows):
    """The custom VJPs' gradients from the accumulated ``G y``, ``G^T x / T``, ``sum G``.

    ``d/dx = G y / T``; the logits are linear in ``1 / T``, so ``d/dT = -(1/T) sum_i
    x_i . d/dx_i`` needs no pass over the tiles.
    """
    temperature, bias = params
    dx = dx_unscaled / temperature
    d_temperature = -jnp.sum(_common.at_least_float32(x) * dx) / temperature
    d_bias = None if bias is None else jnp.sum(dbias_rows)
    return dx.astype(x.dtype), dy.astype(y.dtype), None, None, (d_temperature, d_bias)


# ----------------------------------------------------------------- sweeping the tiles


def _blocks(tree, size):
    """Splits every leaf's leading axis ``M`` into ``[M // size, size, ...]``."""
    return jax.tree.map(lambda a: a.reshape(a.shape[0] // size, size, *a.shape[1:]), tree)


def _unblock(tree):
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), tree)


def _over_tiles(tile_fn, plan, x, y, rows, cols, row_carry, col_carry):
    """Runs ``tile_fn`` over every tile of ``x: [B, D]`` against ``y: [M, D]``.

    ``tile_fn(x_t, y_t, rows_t, cols_t, row_carry_t, col_carry_t) -> (row_carry_t,
    col_carry_t)``; ``row_carry`` has a leading axis ``B`` (one entry per row),
    ``col_carry`` a leading axis ``M``. Row tiles are the outer loop.
    """

    def row_of_tiles(col_carry, row_block):
        x_t, rows_t, row_carry_t = row_block

        def tile(row_carry_t, col_block):
            y_t, cols_t, col_carry_t = col_block
            return tile_fn(x_t, y_t, rows_t, cols_t, row_carry_t, col_carry_t)

        col_block = _blocks((y, cols), plan.tile_cols) + (col_carry,)
        row_carry_t, col_carry = jax.lax.scan(tile, row_carry_t, col_block)
        return col_carry, row_carry_t

    col_carry, row_carry = jax.lax.scan(
        row_of_tiles, _blocks(col_carry, plan.tile_cols),
        _blocks((x, rows, row_carry), plan.tile_rows),
    )
    return _unblock(row_carry), _unblock(col_carry)


def _sweep(tile_fn, plan, ring_axis, x, y, rows, cols, row_carry, col_carry):
    """:func:`_over_tiles` against every device's ``y`` with ``ring_axis``.

    With ``ring_axis``, ``y`` (with ``cols`` and ``col_carry``) travels the ring; the
    returned ``col_carry`` is back with its owner. Without it, ``y`` is swept once.
    """

    def hop(row_carry, travel):
        y, cols, col_carry = travel
        row_carry, col_carry = _over_tiles(tile_fn, plan, x, y, rows, cols, row_carry, col_carry)
        return row_carry, (y, cols, col_carry)

    carry = (row_carry, (y, cols, col_carry))
    if ring_axis is not None:

        def visit_and_pass_on(_, carry):
            row_carry, travel = hop(*carry)
            return row_carry, _hop(travel, ring_axis)

        hops = jax.lax.axis_size(ring_axis) - 1
        carry = jax.lax.fori_loop(0, hops, visit_and_pass_on, carry)
    row_carry, (_, _, col_carry) = hop(*carry)
    return row_carry, col_carry if ring_axis is None else _hop(col_carry, ring_axis)


def _hop(tree, axis_name):
    """Sends ``tree`` to the next device on the ring over ``axis_name``."""
    size = jax.lax.axis_size(axis_name)
    return jax.lax.ppermute(tree, axis_name, [(i, (i + 1) % size) for i in range(size)])


def _running_init(like, *, lse: bool, best: bool, sum_names=()) -> _Running:
    """Empty statistics, one per row of ``like`` (typed like it inside shard_map)."""
    dtype = _common.at_least_float32(like[:1, 0]).dtype
    fill = lambda value, dt=dtype: jnp.full_like(like[:, 0], value, dt)  # noqa: E731
    return _Running(
        lse=fill(-jnp.inf) if lse else None,
        best_negative=fill(-jnp.inf) if best else None,
        sums={name: fill(0.0) for name in sum_names},
    )


def _pair_term_names(spec, rows) -> tuple[str, ...]:
    if spec.pair_terms is None:
        return ()
    logits = jax.ShapeDtypeStruct((1, 1), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, 1), jnp.bool_)
    return tuple(jax.eval_shape(spec.pair_terms, logits, mask, None if rows.label is None else mask))


def _stats_init(spec, x, y, rows) -> tuple[_Running, _Running]:
    return (
        _running_init(x, lse=spec.row_logsumexp, best=spec.best,
                      sum_names=_pair_term_names(spec, rows)),
        _running_init(y, lse=spec.col_logsumexp, best=spec.best),
    )


def _zero_gradients(x, y):
    """``(G y [B, D], sum G [B], G^T x / T [M, D])`` accumulators in float32 or wider."""
    dtype = _common.at_least_float32(x[:1, :1]).dtype
    return jnp.zeros_like(x, dtype), jnp.zeros_like(x[:, 0], dtype), jnp.zeros_like(y, dtype)


# ---------------------------------------------------- two passes: statistics, then VJP


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _two_pass(spec, plan, ring_axis, x, y, rows, cols, params):
    """Streamed ``(row, column)`` :class:`_Running` statistics of ``x`` against ``y``.

    With ``ring_axis``, ``y`` is this device's shard and the statistics span every
    device's shard; without it, the column statistics are over the local rows only.
    """
    return _two_pass_forward(spec, plan, ring_axis, x, y, rows, cols, params)[0]


def _two_pass_forward(spec, plan, ring_axis, x, y, rows, cols, params):
    temperature, bias = params

    def tile_fn(x_t, y_t, rows_t, cols_t, row_run, col_run):
        logits = _tile_logits(x_t, y_t, bias, plan.matmul_dtype)
        row, col = _tile_stats(spec, logits, rows_t, cols_t)
        return _merge(row_run, row), _merge(col_run, col)

    row, col = _sweep(tile_fn, plan, ring_axis, _scaled_rows(x, temperature), y, rows, cols,
                      *_stats_init(spec, x, y, rows))
    return (row, col), (x, y, rows, cols, params, row.lse, col.lse)


def _two_pass_backward(spec, plan, ring_axis, residuals, cotangents):
    x, y, rows, cols, params, row_lse, col_lse = residuals
    row_cot, col_cot = cotangents
    temperature, bias = params
    x_scaled = _scaled_rows(x, temperature)
    dx, dbias, dy = _zero_gradients(x, y)

    def tile_fn(x_t, y_t, rows_t, cols_t, row_carry, col_carry):
        dx_t, dbias_t, row_lse_t, g_row, g_sums = row_carry
        dy_t, col_lse_t, g_col = col_carry
        logits = _tile_logits(x_t, y_t, bias, plan.matmul_dtype)
        logit_gradient = _logit_gradient(
            spec, logits, rows_t, cols_t, (row_lse_t, col_lse_t), (g_row, g_col, g_sums)
        )
        dx_t, dbias_t, dy_t = _accumulate_gradients(
            (dx_t, dbias_t, dy_t), logit_gradient, x_t, y_t, plan.matmul_dtype, bias is not None
        )
        return (dx_t, dbias_t, row_lse_t, g_row, g_sums), (dy_t, col_lse_t, g_col)

    (dx, dbias, *_), (dy, *_) = _sweep(
        tile_fn, plan, ring_axis, x_scaled, y, rows, cols,
        (dx, dbias, row_lse, row_cot.lse, row_cot.sums), (dy, col_lse, col_cot.lse),
    )
    return _input_gradients(x, y, params, dx, dy, dbias)


_two_pass.defvjp(_two_pass_forward, _two_pass_backward)


# ------------------------------------------------------ one pass: value and gradient


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _one_pass(spec, aux_spec, plan, ring_axis, x, y, rows, cols, params):
    """``(total, (per_row [B], row aux, column aux))`` with the gradient of ``total``.

    ``total = sum_i per_row_i``, ``per_row = _row_objective`` over every tile of the row;
    the aux statistics (``aux_spec``) carry no gradient. With ``ring_axis`` the column
    aux is complete; without it, over the local rows only.
    """
    return _one_pass_forward(spec, aux_spec, plan, ring_axis, x, y, rows, cols, params)[0]


def _one_pass_forward(spec, aux_spec, plan, ring_axis, x, y, rows, cols, params):
    temperature, bias = params
    dx, dbias, dy = _zero_gradients(x, y)
    row_aux, col_aux = _stats_init(aux_spec, x, y, rows)

    def tile_fn(x_t, y_t, rows_t, cols_t, row_carry, col_carry):
        per_row, dx_t, dbias_t, row_aux_t = row_carry
        dy_t, col_aux_t = col_carry
        logits = _tile_logits(x_t, y_t, bias, plan.matmul_dtype)
        tile_rows, vjp = jax.vjp(lambda s: _row_objective(spec, s, rows_t, cols_t), logits)
        (logit_gradient,) = vjp(jnp.ones_like(tile_rows))
        dx_t, dbias_t, dy_t = _accumulate_gradients(
            (dx_t, dbias_t, dy_t), logit_gradient, x_t, y_t, plan.matmul_dtype, bias is not None
        )
        row, col = _tile_stats(aux_spec, logits, rows_t, cols_t)
        return (
            (per_row + tile_rows, dx_t, dbias_t, _merge(row_aux_t, row)),
            (dy_t, _merge(col_aux_t, col)),
        )

    (per_row, dx, dbias, row_aux), (dy, col_aux) = _sweep(
        tile_fn, plan, ring_axis, _scaled_rows(x, temperature), y, rows, cols,
        (jnp.zeros_like(dbias), dx, dbias, row_aux), (dy, col_aux),
    )
    gradients = _input_gradients(x, y, params, dx, dy, dbias)
    return (jnp.sum(per_row), (per_row, row_aux, col_aux)), gradients


def _one_pass_backward(spec, aux_spec, plan, ring_axis, gradients, cotangents):
    g_total = cotangents[0]  # the aux outputs carry no gradient
    return jax.tree.map(lambda d: (g_total * d).astype(d.dtype), gradients)


_one_pass.defvjp(_one_pass_forward, _one_pass_backward)


# ------------------------------------------------------------------------ entry points


def _match_varying(tree, like, axis_name):
    """Marks ``tree`` as varying over ``axis_name`` when ``like`` is (shard_map typing).

    A replicated temperature gets a per-device gradient share inside the custom VJP;
    casting it to varying first lets JAX sum those shares over the devices.
    """
    if axis_name is None or axis_name not in compat.varying_axes(like):
        return tree
    return jax.tree.map(
        lambda a: a if axis_name in compat.varying_axes(a) else compat.cast_varying(a, axis_name),
        tree,
    )


class _Setup(NamedTuple):
    y: jax.Array  # [M, D]: this device's shard with the ring, else the gathered N_y rows
    cols: RowIds
    params: tuple
    plan: _Plan | None  # None: dense
    ring_axis: object
    matmul_dtype: jnp.dtype


def _setup(x, y, cols, temperature, bias, axis_name, streaming: Streaming) -> _Setup:
    """Checks the options, gathers ``y`` unless ring, and resolves the tiling."""
    streaming.check(axis_name)
    dtype = _common.at_least_float32(x[:1, :1]).dtype
    params = _match_varying(
        jax.tree.map(lambda p: jnp.asarray(p, dtype), (temperature, bias)), x, axis_name
    )
    ring = streaming.collective == "ring"
    if not ring:
        y, cols = jax.tree.map(lambda a: _common.gather_rows(a, axis_name), (y, cols))
    num_columns = y.shape[0]
    chunk = streaming.chunk_size
    if chunk == "auto":
        chunk = auto_chunk_size(num_columns, x.shape[1])
    if chunk is None and ring:
        chunk = num_columns
    if chunk is not None:
        what = ("each device's shard B_y with collective='ring'" if ring
                else "the gathered global batch N_y")
        check_divides(chunk, num_columns, what)
    matmul_dtype = jnp.dtype(streaming.matmul_dtype or jnp.promote_types(x.dtype, y.dtype))
    plan = None if chunk is None else _Plan(divisor_at_most(x.shape[0], chunk), chunk, matmul_dtype)
    return _Setup(y, cols, params, plan, axis_name if ring else None, matmul_dtype)


def _dense_logits(x, setup):
    """The whole ``[B, M]`` logits (JAX differentiates them)."""
    temperature, bias = setup.params
    return _tile_logits(_scaled_rows(x, temperature), setup.y, bias, setup.matmul_dtype)


def _columns_over_devices(col: _Running, setup: _Setup, local_cols: int, axis_name) -> _Running:
    """Completes all-gather column statistics (each device saw its own rows) and keeps
    this device's ``local_cols`` columns."""
    if setup.ring_axis is not None:
        return col
    if axis_name is not None:
        lse = col.lse
        if lse is not None:
            shift = jax.lax.pmax(jax.lax.stop_gradient(lse), axis_name)
            lse = shift + jnp.log(jax.lax.psum(jnp.exp(lse - shift), axis_name))
        best_negative = col.best_negative
        if best_negative is not None:
            best_negative = jax.lax.pmax(jax.lax.stop_gradient(best_negative), axis_name)
        col = col._replace(lse=lse, best_negative=best_negative)
    start = _common.row_offset(local_cols, axis_name)
    return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, local_cols), col)


def _to_stats(row: _Running, col: _Running) -> PairStats:
    return PairStats(row.lse, col.lse, row.sums, row.best_negative, col.best_negative)


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
    streaming: Streaming = Streaming(),
) -> PairStats:
    """Statistics of the logits of the local rows against the global candidates.

    Args:
      spec: which statistics (see :class:`PairSpec`).
      x: ``[B, D]`` this device's rows.
      y: ``[B_y, D]`` this device's candidates. The candidates of every row are all
        devices' ``y`` (``N_y`` in all).
      rows: the ids of ``x``'s rows (``[B]``).
      cols: the ids of ``y``'s rows (``[B_y]``).
      temperature: scalar > 0.
      bias: scalar added to the logits, or None.
      axis_name: mesh axis of the global batch, or None.
      streaming: how to compute them (:class:`Streaming`); streamed statistics are
        differentiated in two passes (8 N^2 D flops).

    Returns:
      :class:`PairStats`: ``row_lse: [B]``, ``col_lse: [B_y]`` (the logsumexp of each
      local candidate's column over all devices' rows), ``row_sums``: dict of ``[B]``,
      ``row_best_negative: [B]``, ``col_best_negative: [B_y]``.
    """
    local_cols = y.shape[0]
    setup = _setup(x, y, cols, temperature, bias, axis_name, streaming)
    if setup.plan is None:
        row, col = _tile_stats(spec, _dense_logits(x, setup), rows, setup.cols)
    else:
        row, col = _two_pass(spec, setup.plan, setup.ring_axis, x, setup.y, rows, setup.cols,
                             setup.params)
    return _to_stats(row, _columns_over_devices(col, setup, local_cols, axis_name))


def pair_total(
    spec: PairSpec,
    x: jax.Array,
    y: jax.Array,
    rows: RowIds,
    cols: RowIds,
    *,
    temperature,
    bias=None,
    axis_name=None,
    streaming: Streaming = Streaming(),
    aux_spec: PairSpec = PairSpec(),
) -> tuple[jax.Array, jax.Array, PairStats]:
    """``sum_i (row_lse_i + sum_k row_sums[k]_i)`` over the local rows, in one pass.

    Streamed, the gradient is formed in the forward pass (6 N^2 D flops): SigLIP's
    pair terms need no normaliser, and an InfoNCE row stripe holds its whole row. With
    the ring a row's logsumexp spans devices, so ``spec.row_logsumexp`` there falls back
    to :func:`pair_stats`' two passes. ``spec`` must not ask for ``col_logsumexp``.

    Args:
      spec, x, y, rows, cols, temperature, bias, axis_name, streaming: as
        :func:`pair_stats`.
      aux_spec: statistics to return alongside, from the same logits, without gradient.

    Returns:
      ``(total, per_row, aux)``: the scalar (differentiable), its per-row terms ``[B]``
      and the aux :class:`PairStats`, both with gradients stopped.
    """
    if spec.col_logsumexp:
        raise ValueError("pair_total sums per-row terms; col_logsumexp needs pair_stats.")
    local_cols = y.shape[0]
    setup = _setup(x, y, cols, temperature, bias, axis_name, streaming)
    if setup.plan is None:
        logits = _dense_logits(x, setup)
        per_row = _row_objective(spec, logits, rows, setup.cols)
        row_aux, col_aux = _tile_stats(aux_spec, logits, rows, setup.cols)
        total = jnp.sum(per_row)
    elif setup.ring_axis is not None and spec.row_logsumexp:
        merged = aux_spec._replace(row_logsumexp=True, pair_terms=spec.pair_terms,
                                   exclude_self=spec.exclude_self,
                                   exclude_shared_label=spec.exclude_shared_label)
        row_aux, col_aux = _two_pass(merged, setup.plan, setup.ring_axis, x, setup.y, rows,
                                     setup.cols, setup.params)
        per_row = row_aux.lse + sum(row_aux.sums.values())
        total = jnp.sum(per_row)
    else:
        # One pass: a stripe of whole rows when the row needs its normaliser.
        plan = setup.plan
        if spec.row_logsumexp:
            plan = plan._replace(tile_cols=setup.y.shape[0])
        total, (per_row, row_aux, col_aux) = _one_pass(
            spec, aux_spec, plan, setup.ring_axis, x, setup.y, rows, setup.cols, setup.params
        )
    col_aux = _columns_over_devices(col_aux, setup, local_cols, axis_name)
    aux = jax.lax.stop_gradient(_to_stats(row_aux, col_aux))
    return total, jax.lax.stop_gradient(per_row), aux
