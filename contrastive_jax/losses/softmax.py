"""The softmax-family contrastive losses over the global batch: InfoNCE, CLIP, NT-Xent,
N-pairs.

Every function here is written once, in the global view. With ``axis_name=None`` it is
the plain single-device loss. Inside ``jax.shard_map`` (or ``jax.pmap``) with
``axis_name`` set, each device holds ``B`` rows of an ``N``-row global batch: the
candidates are all-gathered over ``axis_name``, the local rows are scored against all
``N`` candidates with targets offset by ``axis_index * B``, and the result is the mean
over the global batch -- the same value on every device, and the same gradients as the
single-device loss on the concatenated batch.

InfoNCE and CLIP take ``candidates`` (:class:`~contrastive_jax.losses.Candidates`: whom
each row is compared with, which of them are positives) and ``streaming``
(:class:`~contrastive_jax.losses.Streaming`), which changes how the logits are computed,
not the result (see :mod:`contrastive_jax.losses.logit_stats`): ``chunk_size=None``
builds the ``[B, N]`` logits; an int streams cache-sized tiles with an online logsumexp (memory O(N D +
chunk_size^2)); ``collective="ring"`` passes the other side's shards around the devices
with ``ppermute`` instead of all-gathering them; ``matmul_dtype="bfloat16"`` is mixed
precision. Each loss is one per-row formula -- a row logsumexp minus a target logit --
over the statistics :mod:`~contrastive_jax.losses.logit_stats` returns in every mode.
``clip_loss`` and ``infonce_loss`` also return the in-batch metrics from those
statistics (``return_metrics=True``). The sigmoid loss is in
:mod:`~contrastive_jax.losses.sigmoid`, SupCon in :mod:`~contrastive_jax.losses.supcon`.

Embeddings are expected L2-normalised (the model owns normalisation), so similarities
are cosines in [-1, 1] and logits are ``cosine / temperature``. Temperature is
therefore required: at temperature 1 the best reachable InfoNCE loss is
``log(1 + (N - 1) e^-2)`` (see :func:`infonce_loss_floor`) and training stalls.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common, logit_stats, pairs
from contrastive_jax.losses import candidates as candidate_set
from contrastive_jax.losses import positives as several
from contrastive_jax.losses.candidates import Candidates, from_keywords
from contrastive_jax.losses.candidates import check as check_candidates
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming

# Softmax over each row's candidates; with the columns too (CLIP); without the row itself.
_ROWS = PairSpec(row_logsumexp=True)
_ROWS_AND_COLUMNS = PairSpec(row_logsumexp=True, col_logsumexp=True)
_ROWS_NOT_SELF = PairSpec(row_logsumexp=True, exclude_self=True)


def infonce_loss(
    queries: jax.Array,
    keys: jax.Array,
    *,
    temperature,
    candidates: Candidates | None = None,
    streaming: Streaming | None = None,
    axis_name=None,
    return_metrics: bool = False,
    **deprecated,
):
    """One-directional InfoNCE: the positive of query i is key i, all other keys negative.

    With ``s_ij = q_i . k_j`` over the N pairs of the global batch and temperature T::

        loss = 1/N sum_i -log( exp(s_ii / T) / sum_j exp(s_ij / T) )

    Row i of ``queries @ keys.T`` is a softmax over the N keys whose correct class is
    i (the labels are ``arange(N)``). Streamed, each stripe of rows holds whole rows
    of logits, so the gradient is formed in the forward pass (one pass, 6 N^2 D
    flops); with the ring, or several positives, a row spans tiles and two passes are
    needed.

    Args:
      queries: ``[B, D]`` L2-normalised embeddings.
      keys: ``[B, D]`` L2-normalised embeddings, row i paired with ``queries[i]``.
      temperature: scalar > 0 (a Python number or a traced, learnable array).
      candidates: whom each query is compared with (:class:`~contrastive_jax.losses.Candidates`:
        several positives, pairs left out, groups, query rows, extra key columns); None:
        the N keys of the global batch.
      streaming: how the logits are computed (:class:`~contrastive_jax.losses.Streaming`: tiles,
        the ring, the matmul's dtype); changes the memory, not the result. None: dense.
      axis_name: mesh axis to gather keys over, or None for a single device.
      return_metrics: also return :func:`~contrastive_jax.losses.pairs.contrastive_metrics` (queries as ``a``) from
        the loss's own statistics, without gradient and without more N^2 work.
      **deprecated: the keywords of the last release (``chunk_size``, ``collective``,
        ``matmul_dtype``, ``positive_ids``, ``positives``, ``group_size``, ``query_rows``,
        ``hard_negatives``), with a DeprecationWarning.

    Returns:
      Scalar: mean over the global batch's query rows of ``-log softmax(q_i . K / T)_i``
      (with several positives, the form's); with ``return_metrics``, ``(loss, metrics)``.

    Raises:
      ValueError: ``queries`` and ``keys`` are not two ``[B, D]`` arrays of one shape,
        ``temperature`` is not > 0, ``axis_name`` is not bound (outside shard_map), or
        ``candidates`` does not fit them (:func:`~contrastive_jax.losses.candidates.check`).

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> queries = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> keys = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> round(float(losses.infonce_loss(queries, keys, temperature=0.1)), 4)
      0.8776

    References:
      A. van den Oord, Y. Li, O. Vinyals, `Representation Learning with Contrastive
      Predictive Coding <https://arxiv.org/abs/1807.03748>`__, arXiv 2018.
    """
    candidates, streaming = from_keywords("infonce_loss", candidates, streaming, deprecated)
    pairs.check_paired(queries, keys, ("queries", "keys"), temperature, axis_name)
    c = check_candidates(candidates, queries, axis_name)
    return _softmax_pairs(queries, keys, temperature, c, streaming, axis_name, return_metrics, both_directions=False)


def _softmax_pairs(a, b, temperature, c: Candidates, streaming, axis_name, return_metrics, *, both_directions):
    """InfoNCE of ``a`` [B, D] against ``b`` and ``c``'s extra columns (with
    ``both_directions``, also of ``b`` against ``a``: CLIP), over ``c``'s query rows;
    with ``return_metrics``, ``(loss, metrics)``.

    One path for every candidate set: the statistics of the query rows (CLIP: every row,
    for the columns' softmaxes over all a's) against all columns, dense, tiled or around
    the ring. InfoNCE without several positives takes one pass (each stripe of rows
    holds its whole softmax); the rest two.
    """
    n = c.query_count(a.shape[0])
    rows = candidate_set.row_ids(c, a.shape[0], axis_name)
    y, cols = candidate_set.columns(c, b, rows)
    spec = candidate_set.spec(c, _ROWS_AND_COLUMNS if both_directions else _ROWS)
    positive = pairs.paired_logits(a[:n], b[:n], temperature)
    queries = jax.tree.map(lambda v: v[:n], rows)
    options = dict(temperature=temperature, axis_name=axis_name, streaming=streaming)
    first = lambda v: None if v is None else v[:n]  # noqa: E731
    if both_directions or c.positive_ids is not None:
        if c.positive_ids is not None:
            spec = several.softmax_spec(spec, c.positives)
        x, x_rows = (a, rows) if both_directions else (a[:n], queries)
        stats = logit_stats.pair_stats(spec._replace(best=return_metrics), x, y, x_rows, cols, **options)
        row_target, col_target = (
            (positive, positive) if c.positive_ids is None else map(first, several.targets(c.positives, stats))
        )
        per_row = stats.row_lse[:n] - row_target
        if both_directions:
            per_row = 0.5 * (per_row + stats.col_lse[:n] - col_target)
    else:
        aux_spec = pairs.METRICS._replace(row_logsumexp=False) if return_metrics else pairs.NO_METRICS
        total, row_lse, stats = logit_stats.pair_total(spec, a[:n], y, queries, cols, aux_spec=aux_spec, **options)
        stats = stats._replace(row_lse=row_lse)
        # The total spread evenly over the query rows: only its sum enters the mean.
        per_row = total / n - positive
    loss = _common.global_mean(per_row, axis_name)
    stats = stats._replace(
        row_lse=first(stats.row_lse),
        row_best_negative=first(stats.row_best_negative),
        col_best_negative=first(stats.col_best_negative),
    )
    metrics = lambda: pairs.retrieval_metrics(a[:n], y, stats, positive, temperature, axis_name)  # noqa: E731
    return pairs.with_metrics(loss, metrics, return_metrics)


def npairs_loss(anchors: jax.Array, positives: jax.Array, *, l2_reg: float = 0.0, axis_name=None) -> jax.Array:
    """Multi-class N-pair loss (Sohn 2016) on raw dot products.

    InfoNCE without normalisation or temperature: the scale of the logits is learned
    through the embeddings' norms, which is why Sohn adds ``l2_reg`` (0.002 in the
    paper) times the mean squared norm of both sides::

        loss = 1/N sum_i [ -log( exp(a_i . p_i) / sum_j exp(a_i . p_j) )
                           + 0.25 l2_reg (|a_i|^2 + |p_i|^2) ]

    Args:
      anchors: ``[B, D]`` embeddings (not normalised).
      positives: ``[B, D]``, row i the positive of ``anchors[i]``.
      l2_reg: weight ``lam`` of the norm penalty ``0.25 * lam * (|a_i|^2 + |p_i|^2)``
        averaged over rows, as in TensorFlow's ``npairs_loss`` (Sohn uses 0.002).
      axis_name: mesh axis to gather positives over, or None.

    Returns:
      Scalar mean over the global batch.

    Raises:
      ValueError: ``anchors`` and ``positives`` are not two ``[B, D]`` arrays of one
        shape, or ``axis_name`` is not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> anchors = jnp.array([[2.0, 0.0], [0.0, 2.0], [1.2, 1.6]])
      >>> positives = jnp.array([[1.6, 1.2], [-1.2, 1.6], [0.56, 1.92]])
      >>> round(float(losses.npairs_loss(anchors, positives, l2_reg=0.002)), 4)
      0.7056

    References:
      K. Sohn, `Improved Deep Metric Learning with Multi-class N-pair Loss Objective
      <https://papers.nips.cc/paper/2016/hash/6b180037abbebea991d8b1232f8a8ca9-Abstract.html>`__,
      NeurIPS 2016.
    """
    _common.check_pair(anchors, positives, "anchors", "positives")
    _common.check_axis_bound(axis_name)
    ids = RowIds(pairs.local_ids(anchors.shape[0], axis_name), None)
    stats = logit_stats.pair_stats(_ROWS, anchors, positives, ids, ids, temperature=1.0, axis_name=axis_name)
    per_row = stats.row_lse - pairs.paired_logits(anchors, positives, 1.0)
    if l2_reg:
        squared_norms = jnp.sum(jnp.square(_common.at_least_float32(anchors)), axis=1) + jnp.sum(
            jnp.square(_common.at_least_float32(positives)), axis=1
        )
        per_row = per_row + 0.25 * l2_reg * squared_norms
    return _common.global_mean(per_row, axis_name)


def clip_loss(
    a: jax.Array,
    b: jax.Array,
    *,
    temperature,
    candidates: Candidates | None = None,
    streaming: Streaming | None = None,
    axis_name=None,
    return_metrics: bool = False,
    **deprecated,
):
    """Symmetric CLIP / CLAP loss over the N x N similarity ``a @ b.T / temperature``.

    With ``s_ij = a_i . b_j`` over the N pairs of the global batch and temperature T::

        loss = 1/(2N) sum_i [ -log( exp(s_ii / T) / sum_j exp(s_ij / T) )
                              -log( exp(s_ii / T) / sum_j exp(s_ji / T) ) ]

    The labels are ``arange(N)``. The loss is the mean of two cross-entropies: softmax
    along rows (each ``a_i`` picks its ``b_i`` among all b's) and softmax along columns
    (each ``b_j`` picks its ``a_j`` among all a's). The two differ: a row softmax only
    pushes ``a_i`` away from the other b's, the column softmax pushes ``b_j`` away from
    the other a's, so one direction alone leaves the other modality's retrieval
    untrained. Swapping ``a`` and ``b`` leaves the loss unchanged. Streamed, both
    directions are folded into every tile, in two passes (8 N^2 D flops).

    Args:
      a: ``[B, D]`` L2-normalised embeddings of modality A.
      b: ``[B, D]`` L2-normalised embeddings of modality B, row i paired with ``a[i]``.
      temperature: scalar > 0.
      candidates: whom each row is compared with (:class:`~contrastive_jax.losses.Candidates`:
        several positives, pairs left out of both softmaxes, groups, query rows -- both
        directions' rows, each against all N columns of the other side -- and extra
        b-side columns, in the a -> b softmaxes only); None: the global batch's pairs.
      streaming: how the logits are computed (:class:`~contrastive_jax.losses.Streaming`: tiles,
        the ring, the matmul's dtype); changes the memory, not the result. None: dense.
      axis_name: mesh axis to gather both sides over, or None.
      return_metrics: also return :func:`~contrastive_jax.losses.pairs.contrastive_metrics` from the loss's own
        statistics, without gradient and without more N^2 work.
      **deprecated: the keywords of the last release (``chunk_size``, ``collective``,
        ``matmul_dtype``, ``false_negative_ids``, ``positive_ids``, ``positives``,
        ``group_size``, ``query_rows``, ``hard_negatives``), with a DeprecationWarning.

    Returns:
      Scalar: ``(InfoNCE(a -> b) + InfoNCE(b -> a)) / 2`` over the global batch (both
      directions from the row logsumexps of the local a's and the column logsumexps of
      the local b's); with ``return_metrics``, ``(loss, metrics)``.

    Raises:
      ValueError: ``a`` and ``b`` are not two ``[B, D]`` arrays of one shape,
        ``temperature`` is not > 0, ``axis_name`` is not bound, or ``candidates`` does
        not fit them (:func:`~contrastive_jax.losses.candidates.check`).

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> a = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> b = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> round(float(losses.clip_loss(a, b, temperature=0.1)), 4)
      0.8776
      >>> loss, metrics = losses.clip_loss(a, b, temperature=0.1, return_metrics=True)
      >>> round(float(metrics["accuracy_a_to_b"]), 4)
      0.3333
      >>> ids = jnp.array([0, 0, 1])  # pairs 0 and 1 share an id: positives of each other
      >>> round(float(losses.clip_loss(a, b, temperature=0.1, candidates=losses.Candidates(positive_ids=ids))), 4)
      3.5443
      >>> log_sum = losses.Candidates(positive_ids=ids, positives="log_sum")
      >>> round(float(losses.clip_loss(a, b, temperature=0.1, candidates=log_sum)), 4)
      0.8353

    References:
      A. Radford et al., `Learning Transferable Visual Models From Natural Language
      Supervision <https://arxiv.org/abs/2103.00020>`__, ICML 2021.
    """
    candidates, streaming = from_keywords("clip_loss", candidates, streaming, deprecated)
    pairs.check_paired(a, b, ("a", "b"), temperature, axis_name)
    c = check_candidates(candidates, a, axis_name)
    return _softmax_pairs(a, b, temperature, c, streaming, axis_name, return_metrics, both_directions=True)


def ntxent_loss(
    z1: jax.Array,
    z2: jax.Array,
    *,
    temperature,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
) -> jax.Array:
    """SimCLR NT-Xent loss over the 2N views of N examples.

    Each of the 2N views is an anchor whose positive is the other view of the same
    example; the other 2N - 2 views are negatives, and its own similarity is masked out.
    With the views ``v = [z1; z2]`` (``[2N, D]``) and ``pos(k)`` the other view of ``k``::

        loss = 1/(2N) sum_k -log( exp(v_k . v_pos(k) / T) / sum_{l != k} exp(v_k . v_l / T) )

    Args:
      z1: ``[B, D]`` L2-normalised embeddings of the first views.
      z2: ``[B, D]`` L2-normalised embeddings of the second views (row i: same example).
      temperature: scalar > 0 (SimCLR uses 0.1 - 0.5).
      axis_name: mesh axis to gather both views over, or None.
      chunk_size: None for the dense ``[2B, 2N]`` logits, an int tile edge (it must
        divide 2N; 2B with the ring) or ``"auto"``; changes the memory, not the result
        (details: :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).

    Returns:
      Scalar mean over the 2N anchors of the global batch.

    Raises:
      ValueError: ``z1`` and ``z2`` are not two ``[B, D]`` arrays of one shape,
        ``temperature`` is not > 0, or ``axis_name`` is not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z1 = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> z2 = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> round(float(losses.ntxent_loss(z1, z2, temperature=0.5)), 4)
      1.1841

    References:
      T. Chen, S. Kornblith, M. Norouzi, G. Hinton, `A Simple Framework for Contrastive
      Learning of Visual Representations <https://arxiv.org/abs/2002.05709>`__, ICML 2020.
    """
    pairs.check_paired(z1, z2, ("z1", "z2"), temperature, axis_name)
    local_batch = z1.shape[0]
    global_batch = local_batch * (1 if axis_name is None else jax.lax.axis_size(axis_name))
    local_rows = pairs.local_ids(local_batch, axis_name)
    views = jnp.concatenate([z1, z2])
    ids = RowIds(jnp.concatenate([local_rows, local_rows + global_batch]), None)
    total, _, _ = logit_stats.pair_total(
        _ROWS_NOT_SELF,
        views,
        views,
        ids,
        ids,
        temperature=temperature,
        axis_name=axis_name,
        streaming=Streaming(chunk_size, collective, matmul_dtype),
    )
    positive = pairs.paired_logits(views, jnp.concatenate([z2, z1]), temperature)
    return _common.global_mean(total / views.shape[0] - positive, axis_name)


def infonce_loss_floor(num_candidates: int, *, temperature: float = 1.0) -> float:
    """The smallest InfoNCE loss reachable with cosine similarities at ``temperature``.

    With logits ``cos / T`` the positive logit is at most ``1/T`` and each of the
    ``N - 1`` negatives at least ``-1/T``, so the loss is at least
    ``log(1 + (N - 1) exp(-2 / T))``. At T = 1 and N = 256 that is 3.6 nats out of
    ``log 256 = 5.5``: the temperature trap. (The bound is not quite reached: the best
    N <= D + 1 unit vectors can do is a regular simplex, negatives at cosine
    ``-1/(N-1)``, giving ``log(1 + (N - 1) exp(-N / ((N - 1) T)))``.)

    Args:
      num_candidates: N, the candidates of each row (the global batch).
      temperature: T > 0.

    Returns:
      The bound, a Python float in nats.

    Raises:
      ValueError: ``temperature`` is not > 0.

    Examples:
      >>> from contrastive_jax import losses
      >>> round(losses.infonce_loss_floor(256, temperature=1.0), 4)
      3.5698
      >>> round(losses.infonce_loss_floor(256, temperature=0.5), 4)
      1.7353

    References:
      F. Wang, H. Liu, `Understanding the Behaviour of Contrastive Loss
      <https://arxiv.org/abs/2012.09740>`__, CVPR 2021 (the temperature's role).
    """
    _common.check_temperature(temperature)
    return math.log1p((num_candidates - 1) * math.exp(-2.0 / temperature))
