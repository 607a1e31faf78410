"""Distillation from a frozen teacher over the global batch: the logit form (open_clip's
``DistillClipLoss``, TinyCLIP's and MobileCLIP's) and the embedding form
(sentence-transformers' ``MSELoss``).

The logit form matches the student's softmaxes over the global batch to the teacher's,
along the rows and the columns, so it needs the teacher's ``N x N`` logits as well as the
student's. Written once in the global view like the other pair losses
(:mod:`~contrastive_jax.losses.softmax`), it is exact over the global batch, and with
``streaming`` it never holds either matrix: each tile of both is formed, reduced to
per-row and per-column statistics (two logsumexps and the teacher-weighted mean of the
student's logits), and dropped; the backward pass forms the tiles again. Memory is
``O(N (D + D_t) + c^2)`` for tiles of edge ``c``, against ``O(N^2)`` dense.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from contrastive_jax.errors import check_divides
from contrastive_jax.losses import _common
from contrastive_jax.losses.streaming import Streaming, auto_chunk_size, divisor_at_most
from contrastive_jax.losses.tile_math import Plan, accumulate_gradients, scaled_rows
from contrastive_jax.losses.tile_sweeps import over_tiles, sweep

#: The forms of `embedding_distill_loss`.
EMBEDDING_FORMS = ("mse", "cosine")
# An empty running logsumexp: finite, so that merging two empty ones stays finite.
_EMPTY = -1e30


class Softmaxes(NamedTuple):
    """One side's (rows' or columns') statistics of a student and a teacher logit matrix.

    ``student_lse``, ``teacher_lse``: the logsumexps of the student's and the teacher's
    logits; ``expected``: the student's logits averaged under the teacher's softmax,
    ``sum_j softmax(t)_j s_j``. Each ``[B]``; the cross-entropy of the student's softmax
    against the teacher's is ``student_lse - expected``.
    """

    student_lse: jax.Array
    teacher_lse: jax.Array
    expected: jax.Array


def _tile_softmaxes(student, teacher, axis: int) -> Softmaxes:
    """`Softmaxes` of the logits `student`, `teacher` [b, c] along `axis` (1: rows)."""
    teacher_lse = jax.nn.logsumexp(teacher, axis=axis)
    weights = jnp.exp(teacher - jnp.expand_dims(teacher_lse, axis))
    return Softmaxes(jax.nn.logsumexp(student, axis=axis), teacher_lse, jnp.sum(weights * student, axis=axis))


def _merge(a: Softmaxes, b: Softmaxes) -> Softmaxes:
    """The statistics of two disjoint sets of columns (or rows), from each set's."""
    teacher_lse = jnp.logaddexp(a.teacher_lse, b.teacher_lse)
    expected = jnp.exp(a.teacher_lse - teacher_lse) * a.expected + jnp.exp(b.teacher_lse - teacher_lse) * b.expected
    return Softmaxes(jnp.logaddexp(a.student_lse, b.student_lse), teacher_lse, expected)


def _empty(like) -> Softmaxes:
    """Statistics of no logits, one per row of `like` [M, ...]."""
    fill = jnp.full_like(like[:, 0], _EMPTY, jnp.promote_types(like.dtype, jnp.float32))
    return Softmaxes(fill, fill, jnp.zeros_like(fill))


def _tile_logits(x_t, y_t, dtype):
    """The student's and the teacher's logits [b, c] of one tile (rows `x_t`, columns
    `y_t`: each a (student, teacher) pair of arrays, the rows already / temperature)."""
    contract = (((1,), (1,)), ((), ()))
    accumulate = jnp.promote_types(dtype, jnp.float32)
    return tuple(
        jax.lax.dot_general(x.astype(dtype), y.astype(dtype), contract, preferred_element_type=accumulate)
        for x, y in zip(x_t, y_t)
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _streamed(plan, ring_axis, x, y):
    """`(row, column)` `Softmaxes` of the rows `x` against the columns `y`, in tiles.

    `x` = (student rows / T [B, D], teacher rows / T_t [B, D_t]), `y` = (student columns
    [M, D], teacher columns [M, D_t]). With `ring_axis`, `y` is this device's shard and
    both sides' statistics span every device's; without it, the columns' statistics are
    over the local rows only. Differentiable in the student's arrays (the teacher's get
    no gradient).
    """
    return _streamed_forward(plan, ring_axis, x, y)[0]


def _streamed_forward(plan, ring_axis, x, y):
    def tile_fn(x_t, y_t, rows_t, cols_t, row_run, col_run):
        student, teacher = _tile_logits(x_t, y_t, plan.matmul_dtype)
        row, col = _tile_softmaxes(student, teacher, 1), _tile_softmaxes(student, teacher, 0)
        return _merge(row_run, row), _merge(col_run, col)

    row, col = sweep(over_tiles(tile_fn, plan), ring_axis, x, y, None, None, _empty(x[0]), _empty(y[0]))
    return (row, col), (x, y, row, col)


def _streamed_backward(plan, ring_axis, residuals, cotangents):
    """Per tile, the logits' gradient ``g_lse q + g_expected p`` of each side (q the
    student's softmax, p the teacher's, along that side), then ``G y`` and ``G^T x``."""
    x, y, row_final, col_final = residuals
    row_cot, col_cot = cotangents

    def tile_fn(x_t, y_t, rows_t, cols_t, row_carry, col_carry):
        dx_t, row_final_t, row_cot_t = row_carry
        dy_t, col_final_t, col_cot_t = col_carry
        student, teacher = _tile_logits(x_t, y_t, plan.matmul_dtype)
        gradient = 0.0
        for final, cot, axis in ((row_final_t, row_cot_t, 1), (col_final_t, col_cot_t, 0)):
            side = lambda v, axis=axis: jnp.expand_dims(v, axis)  # noqa: E731
            gradient = gradient + side(cot.student_lse) * jnp.exp(student - side(final.student_lse))
            gradient = gradient + side(cot.expected) * jnp.exp(teacher - side(final.teacher_lse))
        dx_t, _, dy_t = accumulate_gradients((dx_t, None, dy_t), gradient, x_t[0], y_t[0], plan.matmul_dtype, False)
        return (dx_t, row_final_t, row_cot_t), (dy_t, col_final_t, col_cot_t)

    accumulate = jnp.promote_types(x[0].dtype, jnp.float32)
    dx, dy = jnp.zeros_like(x[0], accumulate), jnp.zeros_like(y[0], accumulate)
    (dx, *_), (dy, *_) = sweep(
        over_tiles(tile_fn, plan), ring_axis, x, y, None, None, (dx, row_final, row_cot), (dy, col_final, col_cot)
    )
    # The teacher's arrays get no gradient.
    return (dx.astype(x[0].dtype), jnp.zeros_like(x[1])), (dy.astype(y[0].dtype), jnp.zeros_like(y[1]))


_streamed.defvjp(_streamed_forward, _streamed_backward)


def _columns_over_devices(col: Softmaxes, local_cols: int, axis_name) -> Softmaxes:
    """Completes all-gathered columns' statistics (each device saw its own rows) and keeps
    this device's `local_cols` columns."""
    if axis_name is not None:
        teacher_lse = _common.logsumexp_over_devices(col.teacher_lse, axis_name)
        share = jnp.exp(col.teacher_lse - teacher_lse)  # each device's rows' share of the teacher's softmax
        col = Softmaxes(
            _common.logsumexp_over_devices(col.student_lse, axis_name),
            teacher_lse,
            jax.lax.psum(share * col.expected, axis_name),
        )
    start = _common.row_offset(local_cols, axis_name)
    return jax.tree.map(lambda v: jax.lax.dynamic_slice_in_dim(v, start, local_cols), col)


def _statistics(x, y, axis_name, streaming: Streaming) -> tuple[Softmaxes, Softmaxes]:
    """The rows' and this device's columns' `Softmaxes` over the global batch (`x`, `y`
    as in `_streamed`, each device's rows)."""
    streaming.check(axis_name)
    local_cols = y[0].shape[0]
    ring = streaming.collective == "ring" and axis_name is not None
    if not ring:
        y = jax.tree.map(lambda v: _common.gather_rows(v, axis_name), y)
    chunk = streaming.chunk_size
    if chunk == "auto":
        chunk = auto_chunk_size(y[0].shape[0], x[0].shape[1] + x[1].shape[1])
    if chunk is None and ring:
        chunk = local_cols
    dtype = jnp.dtype(streaming.matmul_dtype or jnp.promote_types(x[0].dtype, y[0].dtype))
    if chunk is None:
        student, teacher = _tile_logits(x, y, dtype)
        row, col = _tile_softmaxes(student, teacher, 1), _tile_softmaxes(student, teacher, 0)
    else:
        what = "the columns of each device's shard with collective='ring'" if ring else "the candidate columns (N)"
        check_divides(chunk, y[0].shape[0], "chunk_size", what)
        plan = Plan(divisor_at_most(x[0].shape[0], chunk), chunk, dtype)
        row, col = _streamed(plan, axis_name if ring else None, x, y)
    return row, col if ring else _columns_over_devices(col, local_cols, axis_name)


def distill_clip_loss(
    a: jax.Array,
    b: jax.Array,
    teacher_a: jax.Array,
    teacher_b: jax.Array,
    *,
    temperature,
    teacher_temperature,
    streaming: Streaming | None = None,
    axis_name=None,
) -> jax.Array:
    """The student's softmaxes over the global batch matched to a frozen teacher's, in
    both directions (open_clip's ``DistillClipLoss``; TinyCLIP, MobileCLIP).

    With the student's logits ``s_ij = a_i . b_j / T`` and the teacher's ``t_ij =
    ta_i . tb_j / T_t`` over the N pairs of the global batch::

        loss = 1/2 [ 1/N sum_i CE(softmax_j t_ij, softmax_j s_ij)
                   + 1/N sum_j CE(softmax_i t_ij, softmax_i s_ij) ]

    with ``CE(p, q) = -sum p log q``: each row's (and each column's) cross-entropy is
    ``logsumexp(s) - sum softmax(t) s``, so only per-row and per-column statistics are
    kept, and ``streaming`` forms the ``N x N`` logits of both in tiles (``chunk_size``),
    or passes the columns around a ring (``collective="ring"``): the same result to
    round-off. The teacher gets no gradient; the student's embeddings and temperature
    do: ``d loss / d s_ij = (q_ij - p_ij) / 2N`` per side (q the student's softmax, p
    the teacher's).

    Args:
      a, b: ``[B, D]`` the student's L2-normalised embeddings, row i a pair.
      teacher_a, teacher_b: ``[B, D_t]`` the teacher's embeddings of the same pairs
        (any width ``D_t``).
      temperature: the student's, scalar > 0 (learnable).
      teacher_temperature: the teacher's, scalar > 0 (its own learned one).
      streaming: how the logits are formed (:class:`~contrastive_jax.losses.Streaming`);
        None: dense.
      axis_name: the global batch's mesh axis inside ``jax.shard_map``, or None.

    Returns:
      The scalar loss over the global batch, the same on every device.

    >>> import jax, jax.numpy as jnp
    >>> a = b = jnp.eye(3)
    >>> # A teacher that agrees with the student: its cross-entropy is the softmax's entropy.
    >>> round(float(distill_clip_loss(a, b, a, b, temperature=1.0, teacher_temperature=1.0)), 4)
    0.9753
    """
    _common.check_pair(a, b, "a", "b")
    _common.check_pair(teacher_a, teacher_b, "teacher_a", "teacher_b")
    if teacher_a.shape[0] != a.shape[0]:
        raise ValueError(
            f"teacher_a has {teacher_a.shape[0]} rows and a {a.shape[0]}: the teacher embeds the same pairs."
        )
    _common.check_temperature(temperature)
    _common.check_temperature(teacher_temperature, "teacher_temperature")
    teacher_a, teacher_b, teacher_temperature = jax.lax.stop_gradient((teacher_a, teacher_b, teacher_temperature))
    x = (scaled_rows(a, temperature), scaled_rows(teacher_a, teacher_temperature))
    row, col = _statistics(x, (b, teacher_b), axis_name, streaming or Streaming())
    rows = _common.global_mean(row.student_lse - row.expected, axis_name)
    columns = _common.global_mean(col.student_lse - col.expected, axis_name)
    return (rows + columns) / 2


def embedding_distill_loss(student: jax.Array, teacher: jax.Array, *, form: str = "mse", axis_name=None) -> jax.Array:
    """The student's embeddings pulled to a frozen teacher's, row by row, over the global
    batch (sentence-transformers' ``MSELoss``; the cosine form of TinyBERT-style
    distillation). No other row enters, so it needs no collective but the mean.

    ``form="mse"``: ``1/N sum_i mean_k (s_ik - t_ik)^2``; ``"cosine"``: ``1/N sum_i
    (1 - cos(s_i, t_i))``.

    Args:
      student: ``[B, D_t]`` the student's embeddings, mapped to the teacher's width
        where the widths differ (a learned projection, ``TwoTower.teacher_dim``).
      teacher: ``[B, D_t]`` the teacher's embeddings of the same rows (no gradient).
      form: one of ``EMBEDDING_FORMS``.
      axis_name: the global batch's mesh axis inside ``jax.shard_map``, or None.

    >>> import jax.numpy as jnp
    >>> float(embedding_distill_loss(jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 1.0]])))
    1.0
    """
    if form not in EMBEDDING_FORMS:
        raise ValueError(f"form={form!r}; use one of {EMBEDDING_FORMS}.")
    _common.check_pair(student, teacher, "student", "teacher")
    student, teacher = _common.at_least_float32(student), jax.lax.stop_gradient(_common.at_least_float32(teacher))
    if form == "mse":
        per_row = jnp.mean(jnp.square(student - teacher), axis=-1)
    else:
        per_row = 1.0 - jnp.sum(_common.l2_normalize(student) * _common.l2_normalize(teacher), axis=-1)
    return _common.global_mean(per_row, axis_name)
