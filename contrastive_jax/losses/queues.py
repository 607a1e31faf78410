"""Negatives from earlier batches: a MoCo queue and a cross-batch memory (XBM).

Both keep a ring buffer of the last ``K`` (queue) or ``M`` (memory) embeddings of the
global batch, written without gradient (:func:`enqueue`; after the loss, or before it
in XBM's two-term form), and score the local rows against it as extra candidates. The
buffer is an explicit argument, split over the devices like a batch: under
``axis_name`` each device passes its ``[K / devices, D]`` rows, and the candidates are
every device's rows (all-gathered, or passed around the ring with
``collective="ring"``). The logits against the buffer are ``[B, K]``; streamed
(``chunk_size``) they exist one ``c x c`` tile at a time, with the statistics and
gradients of the dense path (:mod:`~contrastive_jax.losses.logit_stats`).

* MoCo (He et al., CVPR 2020): ``logits_i = [q_i . k_i, q_i . queue] / T``, a
  ``1 + K``-way softmax whose class is the pair's own key. The keys come from the
  current encoder or an exponential moving average of it (:func:`momentum_update`).
* XBM (Wang et al., CVPR 2020; pytorch-metric-learning's ``CrossBatchMemory``): a
  label-based loss whose anchors are the local rows and whose candidates are the
  global batch (without the anchor itself) and the memory's filled slots; or, as the
  paper's code, the batch's loss plus ``lambda`` times a separate loss against the
  memory (``memory_weight``).

Shapes: ``B`` local batch, ``N`` global batch, ``D`` embedding dimension, ``K`` / ``M``
the buffer's rows over all devices.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp

from contrastive_jax.errors import check_multiple
from contrastive_jax.losses import _common, logit_stats
from contrastive_jax.losses.logit_stats import PairSpec, RowIds, Streaming
from contrastive_jax.losses.pairs import check_paired, local_ids, paired_logits
from contrastive_jax.losses.supcon import SUPCON, supcon_from_stats

# The label-based losses XBM extends to the memory (their per-anchor terms stream).
XBM_LOSSES = ("contrastive", "multi_similarity", "supcon")
_QUEUE = PairSpec(row_logsumexp=True)


def _buffer_ids(buffer: jax.Array, global_batch: int, axis_name) -> jax.Array:
    """Ids ``[K_local]`` of this device's buffer rows, distinct from the batch's ``[0, N)``."""
    return global_batch + _common.row_offset(buffer.shape[0], axis_name) + jnp.arange(buffer.shape[0])


def _check_buffer(buffer, name: str, dim: int) -> None:
    """Requires a ``[K, D]`` buffer as wide as the embeddings (``D = dim``), a
    ValueError naming it otherwise (static: also at trace time)."""
    _common.check_embeddings(buffer, name)
    if buffer.shape[1] != dim:
        raise ValueError(
            f"{name} has shape {tuple(buffer.shape)} but the embeddings have D = {dim}: it holds earlier "
            f"embeddings of the same width, so make it [{buffer.shape[0]}, {dim}]."
        )


def moco_queue_loss(
    queries: jax.Array,
    keys: jax.Array,
    queue: jax.Array,
    *,
    temperature,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
) -> jax.Array:
    """MoCo's InfoNCE against a queue of earlier keys: ``-log softmax([q.k+, q.queue]/T)_0``.

    Each query's candidates are its own key (the positive) and the ``K`` queued keys
    (negatives); the batch's other keys are not candidates. The queue gets no gradient::

        loss = 1/N sum_i -log( exp(q_i . k_i / T)
                               / (exp(q_i . k_i / T) + sum_m exp(q_i . queue_m / T)) )

    Args:
      queries: ``[B, D]`` L2-normalised.
      keys: ``[B, D]`` L2-normalised, row i the positive of ``queries[i]`` (from the
        momentum encoder they carry no gradient; from the current one they do).
      queue: ``[K_local, D]`` this device's rows of the queue (``[K, D]`` on one device).
      temperature: scalar > 0.
      axis_name: mesh axis of the batch and the queue, or None.
      chunk_size: None for the dense ``[B, K]`` logits against the queue, an int tile
        edge (it must divide K; K / devices with the ring) or ``"auto"``; changes the
        memory, not the result (details: :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).

    Returns:
      Scalar mean over the global batch.

    Raises:
      ValueError: ``queries`` and ``keys`` are not two ``[B, D]`` arrays of one shape,
        ``queue`` is not ``[K_local, D]``, ``temperature`` is not > 0, or ``axis_name``
        is not bound.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> queries = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> keys = jnp.array([[0.8, 0.6], [-0.6, 0.8], [0.28, 0.96]])
      >>> queue = jnp.array([[0.6, -0.8], [-0.8, 0.6]])  # earlier batches' keys
      >>> round(float(losses.moco_queue_loss(queries, keys, queue, temperature=0.1)), 4)
      0.0846

    References:
      K. He, H. Fan, Y. Wu, S. Xie, R. Girshick, `Momentum Contrast for Unsupervised
      Visual Representation Learning <https://arxiv.org/abs/1911.05722>`__, CVPR 2020.
    """
    check_paired(queries, keys, ("queries", "keys"), temperature, axis_name)
    _check_buffer(queue, "queue", queries.shape[1])
    global_batch = _common.global_batch_size(queries.shape[0], axis_name)
    stats = logit_stats.pair_stats(
        _QUEUE,
        queries,
        jax.lax.stop_gradient(queue),
        RowIds(local_ids(queries.shape[0], axis_name), None),
        RowIds(_buffer_ids(queue, global_batch, axis_name), None),
        temperature=temperature,
        axis_name=axis_name,
        streaming=Streaming(chunk_size, collective, matmul_dtype),
    )
    positive = paired_logits(queries, keys, temperature)
    return _common.global_mean(jnp.logaddexp(positive, stats.row_lse) - positive, axis_name)


def _contrastive_terms(margin):
    """The margin contrastive loss's pair terms on unit vectors (``d^2 = 2 - 2 s``)."""

    def terms(cosines, not_candidate, same_label):
        squared = jnp.maximum(2.0 - 2.0 * cosines, 0.0)
        negative = jnp.square(jax.nn.relu(margin - _common.safe_sqrt(squared)))
        cost = jnp.where(same_label, squared, negative)
        return {
            "cost": jnp.where(not_candidate, 0.0, cost),
            "count": (~not_candidate).astype(jnp.float32),
        }

    return terms


def _multi_similarity_terms(alpha, beta, base):
    """Multi-similarity's per-pair exponentials, summed per anchor (no pair mining)."""

    def terms(cosines, not_candidate, same_label):
        positives = same_label & ~not_candidate
        negatives = ~same_label & ~not_candidate
        return {
            "positive": jnp.where(positives, jnp.exp(-alpha * (cosines - base)), 0.0),
            "negative": jnp.where(negatives, jnp.exp(beta * (cosines - base)), 0.0),
        }

    return terms


def _memory_ids(memory: jax.Array, global_batch: int, axis_name, enqueued_at) -> jax.Array:
    """Ids ``[M_local]`` of this device's memory rows. Without ``enqueued_at``, distinct
    from the batch's; with it, the slot that :func:`enqueue` at ``enqueued_at`` gave
    global batch row ``k`` has id ``k``, so an anchor's own copy is no candidate."""
    ids = _buffer_ids(memory, global_batch, axis_name)
    if enqueued_at is None:
        return ids
    size = _common.global_batch_size(memory.shape[0], axis_name)
    position = (ids - global_batch - enqueued_at) % size
    return jnp.where(position < global_batch, position, ids)


def _check_memory_weight(memory_weight, enqueued_at) -> None:
    """``memory_weight``: None, or a Python number >= 0 with ``enqueued_at`` given;
    ``enqueued_at`` only with a ``memory_weight``."""
    if memory_weight is None:
        if enqueued_at is not None:
            raise ValueError(
                "xbm_loss's enqueued_at is read only with memory_weight (the paper's two-term form): "
                "pass memory_weight as well, or leave enqueued_at=None for the pooled form."
            )
        return
    if isinstance(memory_weight, bool) or not isinstance(memory_weight, numbers.Real) or not memory_weight >= 0:
        raise ValueError(
            f"xbm_loss's memory_weight must be None (batch and memory pooled in one loss) or a number "
            f"lambda >= 0 (loss(batch) + lambda loss(batch vs memory); 1.0 in the XBM paper's code), "
            f"got {memory_weight!r}."
        )
    if enqueued_at is None:
        raise ValueError(
            "xbm_loss with memory_weight needs enqueued_at: the paper's form scores a memory that "
            "already holds the batch, so call enqueue first and pass the pointer it wrote the batch "
            "at (its input pointer), which keeps each anchor's own copy out of its candidates."
        )


def xbm_loss(
    z: jax.Array,
    labels: jax.Array,
    memory: jax.Array,
    memory_labels: jax.Array,
    *,
    loss: str,
    temperature=None,
    margin: float | None = None,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    memory_weight: float | None = None,
    enqueued_at: jax.Array | int | None = None,
    axis_name=None,
    chunk_size: int | str | None = None,
    collective: str = "all_gather",
    matmul_dtype: str | None = None,
) -> jax.Array:
    """A label-based loss whose candidates are the global batch and a cross-batch memory.

    Each local row is an anchor. With ``memory_weight=None`` (the pooled form) its
    candidates are the other ``N - 1`` rows of the global batch and the memory's filled
    slots (``memory_labels >= 0``), one loss over them; with an empty memory it is the
    plain loss on the batch. With a number ``lambda`` (the XBM paper's code), the loss
    is ``L(anchors vs the other N - 1 rows) + lambda L(anchors vs the filled memory
    slots)``, two separate losses, the memory already holding the batch (enqueued at
    ``enqueued_at``) except each anchor's own copy. ``loss`` is one of ``XBM_LOSSES``:

    * ``"supcon"``: :func:`supcon_loss`'s formula over the candidates (``temperature``).
    * ``"contrastive"``: :func:`contrastive_loss` (``margin``), the anchor's mean over its
      candidates, distances ``sqrt(2 - 2 cos)`` of unit vectors.
    * ``"multi_similarity"``: :func:`multi_similarity_loss` without pair mining
      (``alpha``, ``beta``, ``base``).

    Args:
      z: ``[B, D]`` L2-normalised embeddings.
      labels: ``[B]`` int classes, >= 0.
      memory: ``[M_local, D]`` this device's memory rows (``[M, D]`` on one device).
      memory_labels: ``[M_local]`` their classes; -1 marks an empty slot (never a
        candidate). The memory gets no gradient.
      loss: the base loss, one of ``XBM_LOSSES``.
      temperature, margin, alpha, beta, base: the base loss's hyperparameters.
      memory_weight: None (pooled), or ``lambda >= 0`` (a Python number), the memory
        term's weight in the paper's two-term form.
      enqueued_at: with ``memory_weight`` only (then required): int scalar, the global
        memory row :func:`enqueue` wrote the batch's first row to (its input pointer).
      axis_name: mesh axis of the batch and the memory, or None.
      chunk_size: None for the dense logits, an int tile edge or ``"auto"``; the columns
        are the batch's and the memory's: ``chunk_size`` divides N + M (B + M / devices
        with the ring); with ``memory_weight``, both N and M (B and M / devices).
        Changes the memory, not the result (details:
        :mod:`contrastive_jax.losses.streaming`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with ``axis_name``.
      matmul_dtype: None (the embeddings' dtype) or ``"bfloat16"`` (mixed precision).

    Returns:
      Scalar over the anchors of the global batch (SupCon: those with a positive, per
      term).

    Raises:
      ValueError: ``loss`` is not one of ``XBM_LOSSES``, ``z`` is not ``[B, D]``,
        ``labels`` not ``[B]`` ints, ``memory`` not ``[M_local, D]``,
        ``memory_labels`` not ``[M_local]`` ints, the base loss's hyperparameter is
        missing or out of range, ``memory_weight`` and ``enqueued_at`` are not given
        together, or ``axis_name`` is not bound.

    Examples:
      An empty memory (every label -1) gives the plain loss on the batch:

      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> z = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
      >>> labels = jnp.array([0, 0, 1])
      >>> memory = jnp.array([[0.8, 0.6], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
      >>> memory_labels = jnp.array([0, 1, -1, -1])  # the last two slots are empty
      >>> round(float(losses.xbm_loss(z, labels, memory, memory_labels, loss="supcon", temperature=0.1)), 4)
      4.4096
      >>> empty = jnp.full(4, -1)
      >>> round(float(losses.xbm_loss(z, labels, memory, empty, loss="supcon", temperature=0.1)), 4)
      7.0014
      >>> round(float(losses.supcon_loss(z, labels, temperature=0.1)), 4)
      7.0014

    References:
      X. Wang, H. Zhang, W. Huang, M. R. Scott, `Cross-Batch Memory for Embedding
      Learning <https://arxiv.org/abs/1912.06798>`__, CVPR 2020.
    """
    if loss not in XBM_LOSSES:
        raise ValueError(f"xbm_loss's loss must be one of {XBM_LOSSES}, got {loss!r}.")
    _common.check_embeddings(z, "z")
    _common.check_labels(labels, z.shape[0])
    _check_buffer(memory, "memory", z.shape[1])
    _common.check_labels(memory_labels, memory.shape[0], "memory_labels")
    _common.check_axis_bound(axis_name)
    _check_memory_weight(memory_weight, enqueued_at)
    spec, temperature = _xbm_spec(loss, temperature, margin, alpha, beta, base)
    rows = RowIds(local_ids(z.shape[0], axis_name), labels)
    streaming = Streaming(chunk_size, collective, matmul_dtype)

    def over(candidates: jax.Array, cols: RowIds) -> jax.Array:
        """The base loss of the local anchors over ``candidates: [C_local, D]``."""
        stats = logit_stats.pair_stats(
            spec, z, candidates, rows, cols, temperature=temperature, axis_name=axis_name, streaming=streaming
        )
        sums = stats.row_sums
        if loss == "supcon":
            return supcon_from_stats(stats, axis_name)
        if loss == "contrastive":
            per_row = sums["cost"] / jnp.maximum(sums["count"], 1.0)
        else:
            per_row = jnp.log1p(sums["positive"]) / alpha + jnp.log1p(sums["negative"]) / beta
        return _common.global_mean(per_row, axis_name)

    global_batch = _common.global_batch_size(z.shape[0], axis_name)
    batch = RowIds(rows.index, labels, jnp.ones_like(labels, bool))
    remembered = RowIds(_memory_ids(memory, global_batch, axis_name, enqueued_at), memory_labels, memory_labels >= 0)
    memory = jax.lax.stop_gradient(memory).astype(z.dtype)
    if memory_weight is None:
        return over(jnp.concatenate([z, memory]), jax.tree.map(lambda x, y: jnp.concatenate([x, y]), batch, remembered))
    return over(z, batch) + memory_weight * over(memory, remembered)


def _xbm_spec(loss: str, temperature, margin, alpha: float, beta: float, base: float) -> tuple[PairSpec, Any]:
    """`(pair statistics, temperature)` of XBM's base `loss`, its arguments checked."""
    if loss == "supcon":
        _common.check_temperature(temperature)
        return SUPCON, temperature
    if loss == "contrastive":
        if margin is None:
            raise ValueError("xbm_loss with loss='contrastive' needs margin: pass margin > 0 (e.g. margin=1.0).")
        _common.check_positive(margin, "margin")
        return PairSpec(pair_terms=_contrastive_terms(margin)), 1.0
    return PairSpec(pair_terms=_multi_similarity_terms(alpha, beta, base)), 1.0


def _check_enqueued(buffers: Any, new: Any) -> None:
    """Requires ``new`` to have ``buffers``' structure, each leaf ``[B, ...]`` with its
    buffer's ``[K_local, ...]`` trailing shape (one B, one K), and integer rows for an
    integer buffer (labels)."""
    buffer_leaves, structure = jax.tree_util.tree_flatten_with_path(buffers)
    new_leaves, new_structure = jax.tree.flatten(new)
    if new_structure != structure:
        raise ValueError(f"enqueue's new must have the structure of buffers, {structure}, got {new_structure}.")
    first = jax.tree_util.keystr(buffer_leaves[0][0])
    local_rows, batch = jnp.shape(buffer_leaves[0][1])[0], jnp.shape(new_leaves[0])[0]
    for (path, buffer), rows in zip(buffer_leaves, new_leaves):
        name = jax.tree_util.keystr(path)
        if jnp.shape(buffer)[0] != local_rows:
            raise ValueError(
                f"buffers{name} has {jnp.shape(buffer)[0]} rows but buffers{first} {local_rows}: "
                "every buffer of one ring holds the same rows."
            )
        want = (batch, *jnp.shape(buffer)[1:])
        if jnp.shape(rows) != want:
            raise ValueError(
                f"enqueue's new{name} must have shape {want} (a row per example, as buffers{name} "
                f"{tuple(jnp.shape(buffer))}), got {tuple(jnp.shape(rows))}."
            )
        if jnp.issubdtype(buffer.dtype, jnp.integer) and not jnp.issubdtype(jnp.result_type(rows), jnp.integer):
            raise ValueError(
                f"enqueue's new{name} must be integers (labels) like buffers{name}, got dtype {jnp.result_type(rows)}."
            )


def enqueue(buffers: Any, pointer: jax.Array, new: Any, *, axis_name=None) -> tuple[Any, jax.Array]:
    """Writes the global batch's rows into ring buffers at ``pointer``, without gradient.

    Global buffer row ``pointer + k`` (mod ``K``) gets global batch row ``k``; the
    oldest rows are overwritten. Each device updates its own rows.

    Args:
      buffers: a pytree of ``[K_local, ...]`` arrays (this device's rows: the queue,
        the memory and its labels).
      pointer: int scalar, the global row the batch's first row goes to (replicated).
      new: a pytree like ``buffers`` of ``[B, ...]`` local batch rows, each leaf with
        its buffer's trailing shape (integers into an integer buffer).
      axis_name: mesh axis of the batch and the buffers, or None.

    Returns:
      ``(buffers, pointer)``: the updated rows, and ``(pointer + N) mod K``.

    Raises:
      ValueError: ``new`` does not have ``buffers``' structure and row shapes, the
        buffers differ in rows, or their ``K`` rows are not a multiple of N.

    Examples:
      A memory of 4 rows with its labels (-1: empty); the batch of 2 goes to rows 3
      and 0, wrapping:

      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> memory, memory_labels = jnp.zeros((4, 2)), jnp.full(4, -1)
      >>> batch, labels = jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([5, 7])
      >>> (memory, memory_labels), pointer = losses.enqueue((memory, memory_labels), 3, (batch, labels))
      >>> print(memory_labels)
      [ 7 -1 -1  5]
      >>> int(pointer)
      1

    References:
      K. He, H. Fan, Y. Wu, S. Xie, R. Girshick, `Momentum Contrast for Unsupervised
      Visual Representation Learning <https://arxiv.org/abs/1911.05722>`__, CVPR 2020
      (the queue).
    """
    _check_enqueued(buffers, new)
    local_rows, local_batch = jax.tree.leaves(buffers)[0].shape[0], jax.tree.leaves(new)[0].shape[0]
    devices = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    size, global_batch = local_rows * devices, local_batch * devices
    check_multiple(size, global_batch, "the buffer's rows", "the global batch")
    gathered = _common.gather_rows(jax.lax.stop_gradient(new), axis_name)
    position = (_common.row_offset(local_rows, axis_name) + jnp.arange(local_rows) - pointer) % size
    written = position < global_batch
    source = jnp.minimum(position, global_batch - 1)

    def write(buffer, rows):
        fresh = rows[source].astype(buffer.dtype)
        return jnp.where(written.reshape(-1, *[1] * (buffer.ndim - 1)), fresh, buffer)

    return jax.tree.map(write, buffers, gathered), (pointer + global_batch) % size


def momentum_update(ema_params: Any, params: Any, *, momentum: float) -> Any:
    """The momentum encoder's step: ``ema <- momentum * ema + (1 - momentum) * params``.

    Args:
      ema_params: a pytree, the momentum encoder's parameters.
      params: a pytree of the same structure, the current encoder's parameters.
      momentum: ``0 <= momentum <= 1`` (0.999 in MoCo; 1 freezes the momentum
        encoder); a Python number or a scalar array.

    Returns:
      The updated ``ema_params``.

    Raises:
      ValueError: ``momentum`` is a Python number outside ``[0, 1]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from contrastive_jax import losses
      >>> ema = losses.momentum_update({"w": jnp.array([1.0, 2.0])}, {"w": jnp.zeros(2)}, momentum=0.9)
      >>> print(ema["w"])
      [0.9 1.8]

    References:
      K. He, H. Fan, Y. Wu, S. Xie, R. Girshick, `Momentum Contrast for Unsupervised
      Visual Representation Learning <https://arxiv.org/abs/1911.05722>`__, CVPR 2020.
    """
    if isinstance(momentum, numbers.Real) and not 0 <= momentum <= 1:
        raise ValueError(
            f"momentum must be in [0, 1] (0.999 in MoCo; 1 freezes the momentum encoder), got {momentum!r}."
        )
    return jax.tree.map(lambda e, p: momentum * e + (1.0 - momentum) * p, ema_params, params)
