"""Small batches, global objectives: decoupled contrastive learning and SogCLR.

Both drop the positive from the softmax's denominator (the "negative-positive
coupling" of InfoNCE, whose gradient shrinks as the positive wins), and both are
symmetric two-tower losses over the ``N x N`` logits ``s_ij / T = a_i . b_j / T``
of the global batch, streamed like :func:`~contrastive_jax.losses.clip_loss` (the
same :mod:`~contrastive_jax.losses.logit_stats` statistics: each row's and each
column's logsumexp over the ``N - 1`` negatives).

* DCL (Yeh et al., ECCV 2022): ``L_i = -s_ii / T + log sum_{j != i} exp(s_ij / T)``.
* SogCLR (Yuan et al., ICML 2022): the global contrastive objective, whose negatives
  are the whole training set, estimated with a small batch and a per-example moving
  average ``u_i`` of ``g_i = mean_{j != i} exp(s_ij / T)``. It keeps state: the
  table ``u`` of every training example, one column per direction (a -> b rows,
  b -> a columns), passed in and returned.

Shapes: ``B`` local batch, ``N`` global batch, ``D`` embedding dimension, ``n`` the
number of training examples (rows of SogCLR's table).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.losses import _common, logit_stats
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming
from contrastive_jax.losses.pairs import check_paired, local_ids, paired_logits

# Both directions' logsumexps over the negatives only: the pair's own logit left out.
_NEGATIVES_BOTH_WAYS = PairSpec(row_logsumexp=True, col_logsumexp=True, exclude_self=True)


def _negative_logsumexps(a, b, temperature, axis_name, streaming) -> tuple[jax.Array, jax.Array]:
    """``(row_lse [B], col_lse [B])``: ``log sum_{j != i} exp(s_ij / T)`` for the local
    a's (rows) and the local b's (columns), over the global batch."""
    ids = RowIds(local_ids(a.shape[0], axis_name), None)
    stats = logit_stats.pair_stats(
        _NEGATIVES_BOTH_WAYS,
        a,
        b,
        ids,
        ids,
        temperature=temperature,
        axis_name=axis_name,
        streaming=streaming,
    )
    return stats.row_lse, stats.col_lse


def _check_global_batch(loss_name: str, a, axis_name) -> int:
    """N, the global batch of ``a: [B, D]``; a ValueError below 2 pairs."""
    global_batch = _common.global_batch_size(a.shape[0], axis_name)
    if global_batch < 2:
        raise ValueError(
            f"{loss_name} got a global batch of {global_batch} pair, but a contrastive loss needs >= 2 "
            "examples (each pair's negatives are the other pairs): pass a batch of at least 2."
        )
    return global_batch


def dcl_loss(
    a: jax.Array,
    b: jax.Array,
    *,
    temperature,
    weight_sigma: float | None = None,
    weight_gradient: bool = False,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
) -> jax.Array:
    """Decoupled contrastive loss (DCL; DCLW with ``weight_sigma``), symmetric.

    With ``s_ij = a_i . b_j`` over the N pairs of the global batch::

        loss = 1/(2N) sum_i [ -2 w_i s_ii / T + log sum_{j != i} exp(s_ij / T)
                                             + log sum_{j != i} exp(s_ji / T) ]

    the a -> b rows and the b -> a columns averaged (as :func:`clip_loss`). DCLW weights
    the positive by ``w_i = 2 - exp(s_ii / sigma) / mean_k exp(s_kk / sigma)`` (``2 -
    N softmax_k(s_kk / sigma)_i``) over the global batch, on the cosines; DCL has
    ``w_i = 1``.

    This is the two-tower form: the negatives are the other tower's ``N - 1`` rows (the
    paper's SimCLR-style form also counts the same view's ``N - 1`` other rows). By
    default DCLW's weight carries no gradient (``sg(w_i)``, as lightly's current
    ``negative_mises_fisher_weights``); ``weight_gradient=True`` lets it flow, the
    form of the DCL authors' PyTorch code and lightly's ``DCLWLoss`` before it detached
    the weight (``w_i`` differentiated through every ``s_kk``).

    Args:
      a: ``[B, D]`` L2-normalised embeddings of modality A (or the first views).
      b: ``[B, D]`` L2-normalised embeddings, row i paired with ``a[i]``.
      temperature: scalar > 0.
      weight_sigma: None (DCL), or DCLW's sigma > 0 (0.5 in the paper).
      weight_gradient: DCLW only: False stops the weight's gradient, True lets it flow
        (the reference code's form).
      axis_name: mesh axis of the global batch, or None.
      chunk_size: None for the dense ``[B, N]`` logits, an int tile edge (it must divide
        N; the local B with the ring) or ``"auto"``; changes the memory, not the result
        (details: :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).

    Returns:
      Scalar mean over the global batch and both directions.

    Raises:
      ValueError: ``a`` and ``b`` are not two ``[B, D]`` arrays of one shape, the
        global batch has fewer than 2 pairs, ``temperature`` or ``weight_sigma`` is not
        > 0, ``weight_gradient`` is not a bool or is True without ``weight_sigma``, or
        ``axis_name`` is not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> round(float(losses.dcl_loss(a, b, temperature=0.1)), 4)
      -1.1106
      >>> round(float(losses.dcl_loss(a, b, temperature=0.1, weight_sigma=0.5)), 4)
      -1.025

    References:
      C.-H. Yeh, C.-Y. Hong, Y.-C. Hsu, T.-L. Liu, Y. Chen, Y. LeCun, `Decoupled
      Contrastive Learning <https://arxiv.org/abs/2110.06848>`__, ECCV 2022.
    """
    check_paired(a, b, ("a", "b"), temperature, axis_name)
    _check_global_batch("dcl_loss", a, axis_name)
    if not isinstance(weight_gradient, bool):
        raise ValueError(
            f"dcl_loss's weight_gradient must be a bool (False: DCLW's weight without gradient; True: "
            f"the gradient flows through it, as in the reference code), got {weight_gradient!r}."
        )
    if weight_gradient and weight_sigma is None:
        raise ValueError(
            "dcl_loss's weight_gradient=True needs DCLW's weighting: pass weight_sigma (0.5 in the "
            "paper), or leave weight_gradient=False for DCL (whose positive has no weight)."
        )
    row_lse, col_lse = _negative_logsumexps(
        a, b, temperature, axis_name, Streaming(chunk_size, collective, matmul_dtype)
    )
    positive = paired_logits(a, b, temperature)
    if weight_sigma is not None:
        _common.check_positive(weight_sigma, "weight_sigma")
        cosine = paired_logits(a, b, 1.0)
        if not weight_gradient:
            cosine = jax.lax.stop_gradient(cosine)
        scaled = jnp.exp(cosine / weight_sigma)
        mean = jnp.mean(scaled) if axis_name is None else jax.lax.pmean(jnp.mean(scaled), axis_name)
        positive = (2.0 - scaled / mean) * positive
    return _common.global_mean(0.5 * (row_lse + col_lse) - positive, axis_name)


def sogclr_init_state(num_examples: int) -> jax.Array:
    """SogCLR's table for ``num_examples`` training examples: ``[n, 2]`` float32, all ``-inf``.

    ``-inf`` is "never visited". It holds ``log u`` (see :func:`sogclr_loss`); a finite
    entry, 0 included, is a visited example's, so a table of zeros (LibAUC's ``u = 0``
    start) reads as every example visited with ``u = 1``.

    Args:
      num_examples: n, the training set's size (one row per example).

    Returns:
      ``[n, 2]`` float32, column 0 the a -> b direction, column 1 b -> a.

    Examples:
      >>> from contrastive_jax import losses
      >>> print(losses.sogclr_init_state(2))
      [[-inf -inf]
       [-inf -inf]]

    References:
      Z. Yuan, Y. Wu, Z.-H. Qiu, X. Du, L. Zhang, D. Zhou, T. Yang, `Provable Stochastic
      Optimization for Global Contrastive Learning: Small Batch Does Not Harm
      Performance <https://arxiv.org/abs/2202.12387>`__, ICML 2022.
    """
    return jnp.full((num_examples, 2), -jnp.inf, jnp.float32)


def _gather_replicated(tree, axis_name):
    """Every device's rows ``[N, ...]`` of ``tree``'s ``[B, ...]`` leaves, typed as
    replicated over ``axis_name`` (a ``psum`` of zeros but the local rows: exact)."""
    if axis_name is None:
        return tree
    devices, offset = jax.lax.axis_size(axis_name), _common.row_offset(1, axis_name)

    def gather(x):
        placed = jnp.zeros((devices, *x.shape), x.dtype).at[offset].set(x)
        return jax.lax.psum(placed, axis_name).reshape(-1, *x.shape[1:])

    return jax.tree.map(gather, tree)


def _last_occurrences(index: jax.Array) -> jax.Array:
    """``[N]`` bool: True where ``index[k]`` does not occur again after ``k``."""
    order = jnp.argsort(index, stable=True)
    in_order = index[order]
    last = jnp.append(in_order[1:] != in_order[:-1], True)
    return jnp.zeros_like(last).at[order].set(last)


def _check_sogclr_state(batch: int, index, log_u, gamma) -> None:
    """Raises ValueError unless ``index`` is ``[batch]`` int (in ``[0, n)`` where it is
    concrete), ``log_u`` an ``[n, 2]`` float table and ``gamma`` (a Python number) in (0, 1]."""
    if index is None or jnp.shape(index) != (batch,) or not jnp.issubdtype(jnp.result_type(index), jnp.integer):
        raise ValueError(
            f"sogclr_loss needs index: the [{batch}] int dataset index of each pair "
            f"(its row of the state table), got {None if index is None else jnp.shape(index)}."
        )
    if jnp.ndim(log_u) != 2 or jnp.shape(log_u)[1] != 2 or not jnp.issubdtype(jnp.result_type(log_u), jnp.floating):
        raise ValueError(
            f"log_u must be the [n, 2] float table of sogclr_init_state(n), got shape {jnp.shape(log_u)} "
            f"and dtype {jnp.result_type(log_u)}."
        )
    if isinstance(gamma, numbers.Real) and not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1] (0.9 in the paper), got {gamma!r}.")
    if isinstance(index, jax.core.Tracer):
        return
    rows, values = jnp.shape(log_u)[0], np.asarray(index)
    outside = values[(values < 0) | (values >= rows)]
    if outside.size:
        raise ValueError(
            f"index must lie in [0, {rows}) (the rows of log_u), got {outside[0]}: give each pair its "
            "position in the dataset, and make the table as large as the dataset (sogclr_init_state)."
        )


def sogclr_loss(
    a: jax.Array,
    b: jax.Array,
    index: jax.Array,
    log_u: jax.Array,
    *,
    temperature,
    gamma: float = 0.9,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """SogCLR's global contrastive loss (two modalities), and its updated state.

    For example ``i`` (its dataset index ``index[i]``) and each direction, with the
    pair's ``N - 1`` negatives ``j``: ``g_i = mean_j exp(s_ij / T)``; the moving average
    ``u_i <- (1 - gamma) u_i + gamma g_i`` (``gamma = 1`` on the example's first
    visit); the gradient is that of ``mean_j sg(exp(s_ij / T) / u_i) s_ij / T -
    s_ii / T`` (the positive is not in the denominator), the two directions averaged.
    The value is the estimate ``log u_i - s_ii / T`` of the global objective, averaged
    alike (with ``gamma = 1`` it is DCL's value minus ``log(N - 1)``, with DCL's
    gradient).

    The table holds ``log u``, so no shift is needed for stability (LibAUC keeps ``u``
    beside a running maximum ``b`` of the logits, ``u e^b`` being ``exp(log u)`` here).
    ``-inf`` marks an example never visited; any finite entry is a visited example's
    ``log u``: a table of zeros (LibAUC starts ``u`` at 0) means ``u = 1`` everywhere,
    not "unvisited" (start from :func:`sogclr_init_state`). A bug of LibAUC's
    two-modality ``GCLoss_v2`` (not of the one-modality ``GCLoss_v1``): on several
    devices it takes each device's positives from the diagonal of its local ``[B, N]``
    block (right on the first device only); here they are the pair's own. As in v1,
    ``u`` averages ``exp(s_ij / T)`` and the positive's weight is 1 (v2 averages
    ``exp((s_ij - s_ii) / T)``, the positive's logit inside: the same objective, another
    estimate; its surrogate weights are unnormalised, a gradient scale).

    Args:
      a: ``[B, D]`` L2-normalised embeddings of modality A.
      b: ``[B, D]`` L2-normalised embeddings, row i paired with ``a[i]``.
      index: ``[B]`` int dataset index of each pair, ``0 <= index < n``: a ValueError
        where it is concrete; traced (under jit), an index outside reads as a first
        visit and is not written, so no other example's row changes.
      log_u: ``[n, 2]`` float, the table (replicated; :func:`sogclr_init_state`),
        column 0 the a -> b direction, column 1 b -> a.
      temperature: scalar > 0.
      gamma: the moving average's rate in (0, 1] (0.9 in the paper): a Python number
        (checked) or a scalar array (e.g. a schedule's value, traced under jit).
      axis_name: mesh axis of the global batch, or None.
      chunk_size: None for the dense ``[B, N]`` logits, an int tile edge (it must divide
        N; the local B with the ring) or ``"auto"``; changes the memory, not the result
        (details: :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).

    Returns:
      ``(loss, log_u)``: the scalar over the global batch, and the table with the
      batch's rows updated (an index twice in a batch: its last occurrence is kept).
      The table carries no gradient.

    Raises:
      ValueError: ``a`` and ``b`` are not two ``[B, D]`` arrays of one shape, the
        global batch has fewer than 2 pairs, ``index`` is not ``[B]`` ints (or, where
        concrete, lies outside ``[0, n)``), ``log_u`` is not an ``[n, 2]`` float table,
        ``temperature`` is not > 0, ``gamma`` not in (0, 1], or ``axis_name`` is not
        bound.

    Examples:
      On the first visit (``gamma = 1`` in effect) the value is DCL's minus
      ``log(N - 1)``:

      >>> import math
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> index = jnp.array([0, 1, 2])  # the pairs' rows of the table
      >>> loss, log_u = losses.sogclr_loss(a, b, index, losses.sogclr_init_state(5), temperature=0.1)
      >>> round(float(loss), 4)
      -1.8037
      >>> round(float(losses.dcl_loss(a, b, temperature=0.1)) - math.log(2), 4)
      -1.8037
      >>> print(jnp.isfinite(log_u).all(axis=1))  # rows 3 and 4 not visited yet
      [ True  True  True False False]

    References:
      Z. Yuan, Y. Wu, Z.-H. Qiu, X. Du, L. Zhang, D. Zhou, T. Yang, `Provable Stochastic
      Optimization for Global Contrastive Learning: Small Batch Does Not Harm
      Performance <https://arxiv.org/abs/2202.12387>`__, ICML 2022.
    """
    check_paired(a, b, ("a", "b"), temperature, axis_name)
    global_batch = _check_global_batch("sogclr_loss", a, axis_name)
    _check_sogclr_state(a.shape[0], index, log_u, gamma)
    lse = jnp.stack(
        _negative_logsumexps(a, b, temperature, axis_name, Streaming(chunk_size, collective, matmul_dtype)),
        axis=1,
    )  # [B, 2]
    log_u = jax.lax.stop_gradient(log_u)
    log_g = jax.lax.stop_gradient(lse) - math.log(global_batch - 1)
    # A traced index outside [0, n) goes to row n: read as unvisited, dropped on write
    # (JAX would wrap -1 to the last row even with mode="fill" / "drop").
    row = jnp.where((index >= 0) & (index < log_u.shape[0]), index, log_u.shape[0])
    old = log_u.at[row].get(mode="fill", fill_value=-jnp.inf)
    # log1p(-1) = -inf: at gamma = 1 the old average drops out.
    new = jnp.where(jnp.isfinite(old), jnp.logaddexp(old + jnp.log1p(-gamma), log_g + jnp.log(gamma)), log_g)
    # d/ds_ij of ratio * lse is exp(s_ij / T) / u / (N - 1): SogCLR's weighted negatives.
    ratio = jnp.exp(log_g - new)
    per_direction = new + ratio * (lse - jax.lax.stop_gradient(lse))
    loss = _common.global_mean(jnp.mean(per_direction, axis=1) - paired_logits(a, b, temperature), axis_name)
    all_rows, all_new = _gather_replicated((row, new), axis_name)
    rows = jnp.where(_last_occurrences(all_rows), all_rows, log_u.shape[0])
    return loss, log_u.at[rows].set(all_new, mode="drop")
