"""CLIP loss that does not push apart in-batch false negatives (dense reference).

In a paired dataset with repeated strings (cmudict: homophones share a pronunciation,
alternate pronunciations share a spelling) a batch can hold rows j != i whose pair is as
right for row i as its own: pushing them apart contradicts the data (identical inputs get
identical embeddings, so the loss cannot be lowered; it only adds gradient noise), and
the chance of it grows with N. `clip_loss_masking_false_negatives` leaves those columns
out of both softmaxes (their logits set to `_common.MASK_VALUE`); with no shared ids it
equals `clip_loss`.

Dense `[B, N]` logits: this is the specification to move into the streamed kernels (a
pair-statistics flag masking `same_label & ~same_id`, with labels `[B, K]` compared by
`any` over K), which keep memory linear in N.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import _common


def false_negative_mask(groups: jax.Array, all_groups: jax.Array, row_index: jax.Array) -> jax.Array:
    """`[B, N]` booleans: column j shares an id with row i and is not row i's own pair.

    Args:
      groups: `[B, K]` ints, this device's rows' ids (e.g. word id, pronunciation id).
      all_groups: `[N, K]` ints, every column's ids.
      row_index: `[B]` the rows' global indices (their own columns).
    """
    shared = jnp.any(groups[:, None, :] == all_groups[None, :, :], axis=-1)
    own = row_index[:, None] == jnp.arange(all_groups.shape[0])[None, :]
    return shared & ~own


def clip_loss_masking_false_negatives(
    a: jax.Array, b: jax.Array, groups: jax.Array, *, temperature, axis_name=None
) -> jax.Array:
    """Symmetric CLIP loss with same-id columns left out of both softmaxes.

    Args:
      a: `[B, D]` L2-normalised embeddings of modality A.
      b: `[B, D]` L2-normalised embeddings of modality B, row i paired with `a[i]`.
      groups: `[B, K]` int ids; rows sharing any of the K ids are false negatives of each
        other (cmudict: `word_id`, `pronunciation_id`).
      temperature: scalar > 0.
      axis_name: mesh axis to gather over (inside `shard_map`), or None.

    Returns:
      Scalar: `(InfoNCE(a -> b) + InfoNCE(b -> a)) / 2` over the global batch, each row's
      softmax over its own pair and the columns sharing no id with it.
    """
    _common.check_pair(a, b, "a", "b")
    _common.check_temperature(temperature)
    _common.check_axis_bound(axis_name)
    if groups.ndim != 2 or groups.shape[0] != a.shape[0]:
        raise ValueError(f"groups must have shape [B, K] = [{a.shape[0]}, K], got {groups.shape}.")
    a, b = _common.at_least_float32(a), _common.at_least_float32(b)
    local = a.shape[0]
    row_index = _common.row_offset(local, axis_name) + jnp.arange(local)
    if axis_name is None:
        all_a, all_b, all_groups = a, b, groups
    else:
        all_a, all_b, all_groups = (jax.lax.all_gather(x, axis_name, tiled=True) for x in (a, b, groups))
    mask = false_negative_mask(groups, all_groups, row_index)
    positive = jnp.sum(a * b, axis=1) / temperature
    per_row = 0.0
    for query, keys in ((a, all_b), (b, all_a)):
        logits = jnp.where(mask, _common.MASK_VALUE, query @ keys.T / temperature)
        per_row = per_row + 0.5 * (jax.nn.logsumexp(logits, axis=1) - positive)
    return _common.global_mean(per_row, axis_name)
