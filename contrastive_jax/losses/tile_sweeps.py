"""Sweeping the tiles: the double scan over row and column tiles, the ring that passes
each device's candidates on, and the two custom VJPs built on them.

* ``two_pass``: the streamed statistics (logsumexps, sums, best negatives); its
  backward pass sweeps the tiles again with the final logsumexps (8 N^2 D flops).
* ``one_pass``: a sum of per-row terms whose gradient is formed in the forward pass
  (6 N^2 D flops).

Each tile's math is :mod:`contrastive_jax.losses.tile_math`'s. A plan with a Pallas
``kernel`` sweeps each hop of ``two_pass`` in :mod:`~contrastive_jax.losses.pallas_tiles`'
fused kernels instead of the double scan; ``one_pass`` is XLA's only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from contrastive_jax.losses import pallas_tiles
from contrastive_jax.losses.tile_math import (
    accumulate_gradients,
    input_gradients,
    merge,
    row_objective,
    scaled_rows,
    stats_init,
    tile_logit_gradient,
    tile_logits,
    tile_stats,
    zero_gradients,
)


def _blocks(tree, size):
    """Splits every leaf's leading axis ``M`` into ``[M // size, size, ...]``."""
    return jax.tree.map(lambda a: a.reshape(a.shape[0] // size, size, *a.shape[1:]), tree)


def _unblock(tree):
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), tree)


def over_tiles(tile_fn, plan):
    """A sweep's hop in XLA: ``tile_fn`` over the tiles of ``plan`` (``_over_tiles``)."""
    return functools.partial(_over_tiles, tile_fn, plan)


def _two_pass_hop(tile_fn, pallas_hop, spec, plan, bias):
    """A two-pass sweep's hop: XLA's tiles of ``tile_fn`` (:func:`over_tiles`), or with a
    Pallas ``plan.kernel`` the fused kernels' ``pallas_hop`` (``pallas_tiles``)."""
    if plan.kernel == "xla":
        return over_tiles(tile_fn, plan)
    return functools.partial(pallas_hop, spec, plan, bias)


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
        row_of_tiles,
        _blocks(col_carry, plan.tile_cols),
        _blocks((x, rows, row_carry), plan.tile_rows),
    )
    return _unblock(row_carry), _unblock(col_carry)


def sweep(hop_fn, ring_axis, x, y, rows, cols, row_carry, col_carry):
    """Runs ``hop_fn`` over ``x`` against every device's ``y`` with ``ring_axis``.

    ``hop_fn(x, y, rows, cols, row_carry, col_carry) -> (row_carry, col_carry)`` sweeps
    one ``y`` (:func:`over_tiles`, or a Pallas kernel's
    :mod:`~contrastive_jax.losses.pallas_tiles`).
    With ``ring_axis``, ``y`` (with ``cols`` and ``col_carry``) travels the ring; the
    returned ``col_carry`` is back with its owner. Without it, ``y`` is swept once.
    """

    def hop(row_carry, travel):
        y, cols, col_carry = travel
        row_carry, col_carry = hop_fn(x, y, rows, cols, row_carry, col_carry)
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


# ---------------------------------------------------- two passes: statistics, then VJP


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def two_pass(spec, plan, ring_axis, x, y, rows, cols, params):
    """Streamed ``(row, column)`` :class:`Running` statistics of ``x`` against ``y``.

    With ``ring_axis``, ``y`` is this device's shard and the statistics span every
    device's shard; without it, the column statistics are over the local rows only.
    """
    return _two_pass_forward(spec, plan, ring_axis, x, y, rows, cols, params)[0]


def _two_pass_forward(spec, plan, ring_axis, x, y, rows, cols, params):
    temperature, bias = params

    def tile_fn(x_t, y_t, rows_t, cols_t, row_run, col_run):
        logits = tile_logits(x_t, y_t, bias, plan.matmul_dtype)
        row, col = tile_stats(spec, logits, rows_t, cols_t)
        return merge(row_run, row), merge(col_run, col)

    hop_fn = _two_pass_hop(tile_fn, pallas_tiles.stats_hop, spec, plan, bias)
    row, col = sweep(hop_fn, ring_axis, scaled_rows(x, temperature), y, rows, cols, *stats_init(spec, x, y, rows))
    # The backward pass needs the final logsumexps only (the sums are linear).
    finals = tuple(side._replace(best_negative=None, sums={}) for side in (row, col))
    return (row, col), (x, y, rows, cols, params, finals)


def _two_pass_backward(spec, plan, ring_axis, residuals, cotangents):
    x, y, rows, cols, params, (row_final, col_final) = residuals
    row_cot, col_cot = (cot._replace(best_negative=None) for cot in cotangents)
    temperature, bias = params
    x_scaled = scaled_rows(x, temperature)
    dx, dbias, dy = zero_gradients(x, y)

    def tile_fn(x_t, y_t, rows_t, cols_t, row_carry, col_carry):
        dx_t, dbias_t, row_final_t, row_cot_t = row_carry
        dy_t, col_final_t, col_cot_t = col_carry
        logits = tile_logits(x_t, y_t, bias, plan.matmul_dtype)
        logit_gradient = tile_logit_gradient(
            spec, logits, rows_t, cols_t, (row_final_t, col_final_t), (row_cot_t, col_cot_t)
        )
        dx_t, dbias_t, dy_t = accumulate_gradients(
            (dx_t, dbias_t, dy_t), logit_gradient, x_t, y_t, plan.matmul_dtype, bias is not None
        )
        return (dx_t, dbias_t, row_final_t, row_cot_t), (dy_t, col_final_t, col_cot_t)

    hop_fn = _two_pass_hop(tile_fn, pallas_tiles.gradient_hop, spec, plan, bias)
    (dx, dbias, *_), (dy, *_) = sweep(
        hop_fn,
        ring_axis,
        x_scaled,
        y,
        rows,
        cols,
        (dx, dbias, row_final, row_cot),
        (dy, col_final, col_cot),
    )
    return input_gradients(x, y, params, dx, dy, dbias)


two_pass.defvjp(_two_pass_forward, _two_pass_backward)


# ------------------------------------------------------ one pass: value and gradient


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def one_pass(spec, aux_spec, plan, ring_axis, x, y, rows, cols, params):
    """``(total, (per_row [B], row aux, column aux))`` with the gradient of ``total``.

    ``total = sum_i per_row_i``, ``per_row = row_objective`` over every tile of the row;
    the aux statistics (``aux_spec``) carry no gradient. With ``ring_axis`` the column
    aux is complete; without it, over the local rows only.
    """
    return _one_pass_forward(spec, aux_spec, plan, ring_axis, x, y, rows, cols, params)[0]


def _one_pass_forward(spec, aux_spec, plan, ring_axis, x, y, rows, cols, params):
    temperature, bias = params
    dx, dbias, dy = zero_gradients(x, y)
    row_aux, col_aux = stats_init(aux_spec, x, y, rows)

    def tile_fn(x_t, y_t, rows_t, cols_t, row_carry, col_carry):
        per_row, dx_t, dbias_t, row_aux_t = row_carry
        dy_t, col_aux_t = col_carry
        logits = tile_logits(x_t, y_t, bias, plan.matmul_dtype)
        tile_rows, vjp = jax.vjp(lambda s: row_objective(spec, s, rows_t, cols_t), logits)
        (logit_gradient,) = vjp(jnp.ones_like(tile_rows))
        dx_t, dbias_t, dy_t = accumulate_gradients(
            (dx_t, dbias_t, dy_t), logit_gradient, x_t, y_t, plan.matmul_dtype, bias is not None
        )
        row, col = tile_stats(aux_spec, logits, rows_t, cols_t)
        return (
            (per_row + tile_rows, dx_t, dbias_t, merge(row_aux_t, row)),
            (dy_t, merge(col_aux_t, col)),
        )

    (per_row, dx, dbias, row_aux), (dy, col_aux) = sweep(
        over_tiles(tile_fn, plan),
        ring_axis,
        scaled_rows(x, temperature),
        y,
        rows,
        cols,
        (jnp.zeros_like(dbias), dx, dbias, row_aux),
        (dy, col_aux),
    )
    gradients = input_gradients(x, y, params, dx, dy, dbias)
    return (jnp.sum(per_row), (per_row, row_aux, col_aux)), gradients


def _one_pass_backward(spec, aux_spec, plan, ring_axis, gradients, cotangents):
    g_total = cotangents[0]  # the aux outputs carry no gradient
    return jax.tree.map(lambda d: (g_total * d).astype(d.dtype), gradients)


one_pass.defvjp(_one_pass_forward, _one_pass_backward)
