"""Statistics of the ``[B, M]`` logits of a loss, dense or streamed in cache-sized tiles.

The softmax- and sigmoid-family losses (:mod:`contrastive_jax.losses.softmax`,
:mod:`~contrastive_jax.losses.sigmoid`, :mod:`~contrastive_jax.losses.supcon`) each
reduce their logits ``s_ij = x_i . y_j / temperature (+ bias)`` to a few numbers per local
row ``i`` (and, for the symmetric CLIP loss, per column ``j``):

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
``row_lse + sum(row_sums)`` with its gradient in the same pass. The :class:`~contrastive_jax.losses.streaming.Streaming`
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

This module holds the entry points (:func:`pair_stats`, :func:`pair_total`: gathering,
tiling, the devices' column statistics); the options are in
:mod:`~contrastive_jax.losses.streaming`, one tile's math in
:mod:`~contrastive_jax.losses.tile_math`, the sweeps and their custom VJPs in
:mod:`~contrastive_jax.losses.tile_sweeps`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from contrastive_jax import compat
from contrastive_jax.errors import check_divides
from contrastive_jax.losses import _common
from contrastive_jax.losses.streaming import (
    PALLAS_BLOCK,
    Streaming,
    auto_chunk_size,
    divisor_at_most,
    resolve_kernel,
)
from contrastive_jax.losses.tile_math import (
    PairSpec,
    PairStats,
    Plan,
    RowIds,
    Running,
    row_objective,
    scaled_rows,
    tile_logits,
    tile_stats,
)
from contrastive_jax.losses.tile_sweeps import one_pass, two_pass


def _match_varying(tree, like, axis_name):
    """Marks ``tree`` as varying over ``axis_name`` when ``like`` is (shard_map typing).

    A replicated temperature gets a per-device gradient share inside the custom VJP;
    casting it to varying first lets JAX sum those shares over the devices.
    """
    if axis_name is None or not _common.is_varying(like, axis_name):
        return tree
    return jax.tree.map(lambda a: compat.cast_varying(a, axis_name), tree)


class _Setup(NamedTuple):
    y: jax.Array  # [M, D]: this device's shard with the ring, else the gathered N_y rows
    cols: RowIds
    params: tuple
    plan: Plan | None  # None: dense
    ring_axis: object
    matmul_dtype: jnp.dtype


def _setup(x, y, cols, temperature, bias, axis_name, streaming: Streaming) -> _Setup:
    """Checks the options, gathers ``y`` unless ring, and resolves the tiling."""
    streaming.check(axis_name)
    dtype = _common.at_least_float32(x[:1, :1]).dtype
    params = _match_varying(jax.tree.map(lambda p: jnp.asarray(p, dtype), (temperature, bias)), x, axis_name)
    ring = streaming.collective == "ring"
    if not ring:
        y, cols = jax.tree.map(lambda a: _common.gather_rows(a, axis_name), (y, cols))
    matmul_dtype = jnp.dtype(streaming.matmul_dtype or jnp.promote_types(x.dtype, y.dtype))
    plan = _plan(streaming, x.shape, y.shape[0], ring, matmul_dtype)
    return _Setup(y, cols, params, plan, axis_name if ring else None, matmul_dtype)


def _plan(streaming: Streaming, x_shape, num_columns: int, ring: bool, matmul_dtype) -> Plan | None:
    """The tiling of ``x: [B, D]`` against ``num_columns`` candidates (None: dense).

    XLA's tiles must divide the columns (``chunk_size`` is checked when the user asked
    for XLA's path); a Pallas kernel pads its last block, and a Pallas kernel that
    cannot compile here falls back to XLA's tiles of the largest divisor."""
    kernel = resolve_kernel(streaming.kernel)
    chunk = streaming.chunk_size
    if chunk == "auto":
        chunk = PALLAS_BLOCK if kernel != "xla" else auto_chunk_size(num_columns, x_shape[1])
    if chunk is None and ring:
        chunk = num_columns
    if chunk is None:
        return None
    if kernel != "xla":
        return Plan(chunk, chunk, matmul_dtype, kernel)
    if streaming.kernel == "xla":
        what = "the columns of each device's shard with collective='ring'" if ring else "the candidate columns (N)"
        check_divides(chunk, num_columns, "chunk_size", what)
    return Plan(divisor_at_most(x_shape[0], chunk), divisor_at_most(num_columns, chunk), matmul_dtype)


def _dense_logits(x, setup):
    """The whole ``[B, M]`` logits (JAX differentiates them)."""
    temperature, bias = setup.params
    return tile_logits(scaled_rows(x, temperature), setup.y, bias, setup.matmul_dtype)


def _columns_over_devices(col: Running, setup: _Setup, local_cols: int, axis_name) -> Running:
    """Completes all-gather column statistics (each device saw its own rows) and keeps
    this device's ``local_cols`` columns."""
    if setup.ring_axis is not None:
        return col
    if axis_name is not None:
        best_negative = col.best_negative
        if best_negative is not None:
            best_negative = jax.lax.pmax(jax.lax.stop_gradient(best_negative), axis_name)
        col = Running(
            lse=_common.logsumexp_over_devices(col.lse, axis_name),
            best_negative=best_negative,
            # One psum per sum: JAX 0.7.2 cannot transpose a single psum of several
            # operands when some (the positives' counts) do not depend on the inputs.
            sums={name: jax.lax.psum(s, axis_name) for name, s in col.sums.items()},
            positive_lse=_common.logsumexp_over_devices(col.positive_lse, axis_name),
        )
    start = _common.row_offset(local_cols, axis_name)
    return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, local_cols), col)


def _to_stats(row: Running, col: Running) -> PairStats:
    return PairStats(
        row.lse, col.lse, row.sums, row.best_negative, col.best_negative, row.positive_lse, col.positive_lse, col.sums
    )


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
      spec: which statistics (see :class:`~contrastive_jax.losses.tile_math.PairSpec`).
      x: ``[B, D]`` this device's rows.
      y: ``[B_y, D]`` this device's candidates. The candidates of every row are all
        devices' ``y`` (``N_y`` in all).
      rows: the ids of ``x``'s rows (``[B]``).
      cols: the ids of ``y``'s rows (``[B_y]``).
      temperature: scalar > 0.
      bias: scalar added to the logits, or None.
      axis_name: mesh axis of the global batch, or None.
      streaming: how to compute them (:class:`~contrastive_jax.losses.streaming.Streaming`); streamed statistics are
        differentiated in two passes (8 N^2 D flops).

    Returns:
      :class:`~contrastive_jax.losses.tile_math.PairStats`: ``row_lse: [B]``, ``col_lse: [B_y]`` (the logsumexp of each
      local candidate's column over all devices' rows), ``row_sums``: dict of ``[B]``,
      ``row_best_negative: [B]``, ``col_best_negative: [B_y]``, ``row_positive_lse: [B]``,
      ``col_positive_lse: [B_y]``, ``col_sums``: dict of ``[B_y]``.
    """
    local_cols = y.shape[0]
    setup = _setup(x, y, cols, temperature, bias, axis_name, streaming)
    if setup.plan is None:
        row, col = tile_stats(spec, _dense_logits(x, setup), rows, setup.cols)
    else:
        row, col = two_pass(spec, setup.plan, setup.ring_axis, x, setup.y, rows, setup.cols, setup.params)
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
      and the aux :class:`~contrastive_jax.losses.tile_math.PairStats`, both with gradients stopped.
    """
    if spec.col_logsumexp or spec.col_sums or spec.positive_logsumexp:
        raise ValueError("pair_total sums per-row terms; column statistics and positive_logsumexp need pair_stats.")
    aux_spec = aux_spec._replace(group_size=spec.group_size)
    local_cols = y.shape[0]
    setup = _setup(x, y, cols, temperature, bias, axis_name, streaming)
    if setup.plan is None:
        logits = _dense_logits(x, setup)
        per_row = row_objective(spec, logits, rows, setup.cols)
        row_aux, col_aux = tile_stats(aux_spec, logits, rows, setup.cols)
        total = jnp.sum(per_row)
    elif setup.plan.kernel != "xla" or (setup.ring_axis is not None and spec.row_logsumexp):
        # Two passes: the ring's row logsumexp spans devices; a Pallas kernel has no one-pass form.
        merged = aux_spec._replace(
            row_logsumexp=spec.row_logsumexp or aux_spec.row_logsumexp,
            pair_terms=spec.pair_terms,
            exclude_self=spec.exclude_self,
            exclude_shared_label=spec.exclude_shared_label,
            label_sets=spec.label_sets,
        )
        row_aux, col_aux = two_pass(merged, setup.plan, setup.ring_axis, x, setup.y, rows, setup.cols, setup.params)
        per_row = sum(row_aux.sums.values(), row_aux.lse if spec.row_logsumexp else 0.0)
        total = jnp.sum(per_row)
    else:
        # One pass: a stripe of whole rows when the row needs its normaliser.
        plan = setup.plan
        if spec.row_logsumexp:
            plan = plan._replace(tile_cols=setup.y.shape[0])
        total, (per_row, row_aux, col_aux) = one_pass(
            spec, aux_spec, plan, setup.ring_axis, x, setup.y, rows, setup.cols, setup.params
        )
    col_aux = _columns_over_devices(col_aux, setup, local_cols, axis_name)
    aux = jax.lax.stop_gradient(_to_stats(row_aux, col_aux))
    return total, jax.lax.stop_gradient(per_row), aux
