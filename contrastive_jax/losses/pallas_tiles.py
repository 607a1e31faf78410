"""One hop of the streamed sweep in fused Pallas kernels that never write the logits.

:mod:`~contrastive_jax.losses.tile_sweeps` sweeps ``x: [B, D]`` against each device's
``y: [M, D]`` (one hop; the ring makes several). With ``Streaming(kernel="pallas")``
a hop is two flash-attention-style kernels instead of XLA's double scan, one per side:
a grid over blocks of ``b`` rows (or ``c`` columns) of the side, each program looping
over the other side's blocks, forming the ``[b, c]`` logits in registers / VMEM and
folding them into that side's statistics (online logsumexps, sums of pair terms, best
negatives) or gradients, and writing only ``[B]`` / ``[M]`` statistics or ``[B, D]`` /
``[M, D]`` gradients. Each block's math is :mod:`~contrastive_jax.losses.tile_math`'s,
so every option a streamed loss takes is the kernel's too (masks of ids, label sets,
groups, pair terms, temperature and bias). A side nobody asked statistics of is not
swept.

The blocks are ``chunk_size`` rows by ``chunk_size`` columns; ``B`` and ``M`` need not
be multiples of it: the last block is padded and its padding left out of every
statistic (``tile_math``'s ``left_out``).

Cost against XLA's path: the forward pass forms the logits once per side asked for
(CLIP: twice), the backward pass twice (once for ``dx``, once for ``dy``), as the
flash-attention kernels do; one-pass losses (SigLIP, InfoNCE) take the two-pass form.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from contrastive_jax import compat
from contrastive_jax.losses.tile_math import (
    accumulate_gradients,
    merge,
    tile_logit_gradient,
    tile_logits,
    tile_stats,
)


def _interpret(kernel: str):
    if kernel != "pallas_interpret":
        return False
    from jax.experimental.pallas import tpu as pltpu  # interprets refs inside shard_map too

    return pltpu.InterpretParams()


def _pad(tree, size):
    """Every leaf's leading axis zero-padded to ``size``."""
    return jax.tree.map(lambda a: jnp.pad(a, [(0, size - a.shape[0])] + [(0, 0)] * (a.ndim - 1)), tree)


def _blocked(a, block):
    return pl.BlockSpec((block, *a.shape[1:]), lambda i, n=a.ndim: (i,) + (0,) * (n - 1))


def _whole(a):
    return pl.BlockSpec(a.shape, lambda i, n=a.ndim: (0,) * n)


def _kernel(step, own, block, sizes, trees, *refs):
    """One program: side ``own``'s block ``i`` against every block of the other side.

    ``refs``: the flattened ``(own side, other side, shared, init)`` inputs, then the
    outputs (``init``'s structure); ``step(rows, cols, shared, left_out, acc) -> acc``.
    """
    own_def, other_def, shared_def, acc_def = trees
    counts = [d.num_leaves for d in trees]
    starts = [sum(counts[:k]) for k in range(5)]
    own_refs, other_refs, shared_refs, init_refs, out_refs = (
        refs[starts[k] : starts[k] + counts[k]] if k < 4 else refs[starts[4] :] for k in range(5)
    )
    read = lambda d, rs: jax.tree.unflatten(d, [r[...] for r in rs])  # noqa: E731
    own_block, shared = read(own_def, own_refs), read(shared_def, shared_refs)
    own_at = pl.program_id(0) * block + jnp.arange(block)

    def body(j, acc):
        other_block = jax.tree.unflatten(other_def, [r[pl.ds(j * block, block)] for r in other_refs])
        other_at = j * block + jnp.arange(block)
        rows, cols = (own_block, other_block) if own == 0 else (other_block, own_block)
        row_at, col_at = (own_at, other_at) if own == 0 else (other_at, own_at)
        left_out = None
        if sizes[0] % block or sizes[1] % block:
            left_out = (row_at[:, None] >= sizes[0]) | (col_at[None, :] >= sizes[1])
        return step(rows, cols, shared, left_out, acc)

    # The first block outside the loop: the loop's carry then has the type a step
    # returns (inside shard_map, jax 0.7.2 types the refs' values as varying, a step's not).
    acc = body(0, read(acc_def, init_refs))
    acc = jax.lax.fori_loop(1, other_refs[0].shape[0] // block, body, acc)
    for ref, value in zip(out_refs, jax.tree.leaves(acc)):
        ref[...] = value


def _side_call(step, own, block, kernel, row_side, col_side, shared, init):
    """Runs ``step`` over side ``own`` (0: rows, 1: columns) of one hop in a Pallas call.

    ``row_side`` / ``col_side``: trees of ``[B, ...]`` / ``[M, ...]`` arrays, ``shared``
    of arrays every program reads whole, ``init``: ``[B or M, ...]`` accumulators.
    Returns ``init``'s structure, each accumulator folded over the other side.
    """
    sizes = (jax.tree.leaves(row_side)[0].shape[0], jax.tree.leaves(col_side)[0].shape[0])
    padded = tuple(-(-n // block) * block for n in sizes)
    row_side, col_side = _pad(row_side, padded[0]), _pad(col_side, padded[1])
    own_side, other_side = (row_side, col_side) if own == 0 else (col_side, row_side)
    inputs = (own_side, other_side, shared, _pad(init, padded[own]))
    varying = frozenset().union(*(compat.varying_axes(a) for a in jax.tree.leaves(inputs)))
    if varying:  # typed shard_map: the outputs vary as the most varying input does
        inputs = jax.tree.map(lambda a: compat.cast_varying(a, tuple(varying)), inputs)
    leaves, trees = zip(*(jax.tree.flatten(t) for t in inputs))
    out_leaves = leaves[3]
    out = pl.pallas_call(
        functools.partial(_kernel, step, own, block, sizes, trees),
        grid=(padded[own] // block,),
        in_specs=[*map(functools.partial(_blocked, block=block), leaves[0]), *map(_whole, leaves[1] + leaves[2])]
        + [_blocked(a, block) for a in out_leaves],
        out_specs=[_blocked(a, block) for a in out_leaves],
        out_shape=[compat.typed_like(a.shape, a.dtype, a) for a in out_leaves],
        interpret=_interpret(kernel),
    )(*leaves[0], *leaves[1], *leaves[2], *out_leaves)
    return jax.tree.map(lambda a: a[: sizes[own]], jax.tree.unflatten(trees[3], out))


def _shared(bias):
    return () if bias is None else (jnp.reshape(bias, (1,)),)


def _logits(x_t, y_t, shared, plan):
    return tile_logits(x_t, y_t, shared[0][0] if shared else None, plan.matmul_dtype)


def stats_hop(spec, plan, bias, x, y, rows, cols, row_run, col_run):
    """``(row_run, col_run)`` :class:`~contrastive_jax.losses.tile_math.Running` merged
    with the statistics of ``x: [B, D]`` against ``y: [M, D]`` (a sweep's hop)."""

    def step_for(own):
        def step(row_block, col_block, shared, left_out, acc):
            (x_t, rows_t), (y_t, cols_t) = row_block, col_block
            sides = tile_stats(spec, _logits(x_t, y_t, shared, plan), rows_t, cols_t, left_out)
            return merge(acc, sides[own])

        return step

    call = functools.partial(_side_call, block=plan.tile_rows, kernel=plan.kernel, shared=_shared(bias))
    row_run = call(step_for(0), 0, row_side=(x, rows), col_side=(y, cols), init=row_run)
    if jax.tree.leaves(col_run):
        col_run = call(step_for(1), 1, row_side=(x, rows), col_side=(y, cols), init=col_run)
    return row_run, col_run


def gradient_hop(spec, plan, bias, x, y, rows, cols, row_carry, col_carry):
    """The backward pass's hop: ``(dx, dbias, row_final, row_cot)`` and ``(dy,
    col_final, col_cot)`` with this hop's ``G y``, ``sum G`` and ``G^T x / T`` added."""
    dx, dbias, row_final, row_cot = row_carry
    dy, col_final, col_cot = col_carry
    with_bias = bias is not None

    def step_for(own):
        def step(row_block, col_block, shared, left_out, acc):
            (x_t, rows_t, row_final_t, row_cot_t), (y_t, cols_t, col_final_t, col_cot_t) = row_block, col_block
            logits = _logits(x_t, y_t, shared, plan)
            finals, cotangents = (row_final_t, col_final_t), (row_cot_t, col_cot_t)
            gradient = tile_logit_gradient(spec, logits, rows_t, cols_t, finals, cotangents, left_out)
            if own == 0:
                dx_t, dbias_t = acc
                dx_t, dbias_t, _ = accumulate_gradients(
                    (dx_t, dbias_t, 0.0), gradient, x_t, y_t, plan.matmul_dtype, with_bias
                )
                return dx_t, dbias_t
            return accumulate_gradients((0.0, 0.0, acc), gradient, x_t, y_t, plan.matmul_dtype, False)[2]

        return step

    row_side, col_side = (x, rows, row_final, row_cot), (y, cols, col_final, col_cot)
    call = functools.partial(_side_call, block=plan.tile_rows, kernel=plan.kernel, row_side=row_side, col_side=col_side)
    dx, dbias = call(step_for(0), 0, shared=_shared(bias), init=(dx, dbias))
    dy = call(step_for(1), 1, shared=_shared(bias), init=dy)
    return (dx, dbias, row_final, row_cot), (dy, col_final, col_cot)
