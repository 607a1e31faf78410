"""Patch dropout (FLIP, Li et al. 2023, "Scaling Language-Image Pre-training via
Masking"; open_clip's `patch_dropout`): while training, each image keeps a random
`max(1, int(P * (1 - rate)))` of its P patch tokens (after the position embedding; a
class token is always kept), so the image tower's blocks run on fewer tokens.

Which tokens a row keeps is a pure function of `(seed, step, global row)` (`row_keys`):
a resumed run, a sharded one and a micro-batched (gradient caching) one keep the same
tokens as an uninterrupted, single-device, whole-batch step. Nothing is dropped without
keys: evaluation, `trained` and exports embed every patch.

Shapes: `N` global batch, `B` rows, `L` tokens, `W` width.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError

# Folded into the seed's key before the step: the patches' stream, apart from dropout's
# `fold_in(fold_in(key(seed), step), micro_index)` ("patc" in ASCII).
STREAM = 0x70617463


@dataclasses.dataclass(frozen=True)
class PatchDropout:
    """`rate`: the fraction of patch tokens dropped per image while training
    (`config.model.patch_dropout`, 0: none); `until_step`: patches are dropped in the
    steps before it, every patch kept from it on (FLIP's unmasked tuning;
    `config.model.patch_dropout_until_step`, 0: dropped throughout)."""

    rate: float = 0.0
    until_step: int = 0

    @property
    def staged(self) -> bool:
        """Whether patches are dropped in the first steps only (then unmasked tuning)."""
        return self.rate > 0 and self.until_step > 0

    def __post_init__(self):
        if not 0.0 <= self.rate < 1.0:
            raise ConfigError(
                f"config.model.patch_dropout={self.rate} must be in [0, 1): the fraction of patches dropped (e.g. 0.5)."
            )
        if self.until_step < 0:
            raise ConfigError(
                f"config.model.patch_dropout_until_step={self.until_step} must be >= 0 "
                "(the step unmasked tuning starts at; 0: patches dropped throughout)."
            )


def num_kept(num_patches: int, rate: float) -> int:
    """The patches an image keeps: open_clip's `max(1, int(num_patches * (1 - rate)))`."""
    return max(1, int(num_patches * (1.0 - rate)))


def row_keys(seed: int, step: jax.Array | int, num_rows: int) -> jax.Array:
    """The keys of the global batch's rows `[N]`: row r of step `step` gets
    `fold_in(fold_in(fold_in(key(seed), STREAM), step), r)`. No micro-batch index: a
    micro-batched step keeps the whole step's tokens."""
    step_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), STREAM), step)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(step_key, jnp.arange(num_rows, dtype=jnp.uint32))


def side_keys(keys: jax.Array, side: int) -> jax.Array:
    """Keys `[B]` for tower `side` (0: a, 1: b), so that two image towers (or one tied
    tower applied to both sides) keep different patches of a row."""
    return keys if side == 0 else jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, side)


def kept_indices(keys: jax.Array, num_patches: int, rate: float) -> jax.Array:
    """The patches each row keeps, ascending: `[B, num_kept]` int32, the `num_kept`
    largest of P uniform draws from each row's key."""
    noise = jax.vmap(lambda key: jax.random.uniform(key, (num_patches,)))(keys)
    return jnp.sort(jax.lax.top_k(noise, num_kept(num_patches, rate))[1], axis=-1)


def drop_patches(x: jax.Array, keys: jax.Array, *, rate: float, num_prefix: int) -> jax.Array:
    """The tokens `x` `[B, L, W]` keep: the first `num_prefix` (a class token) and
    `num_kept(L - num_prefix, rate)` of the patches after them, by row (`kept_indices`).
    Returns `[B, num_prefix + num_kept, W]`."""
    prefix, patches = x[:, :num_prefix], x[:, num_prefix:]
    keep = kept_indices(keys, patches.shape[1], rate)
    return jnp.concatenate([prefix, jnp.take_along_axis(patches, keep[..., None], axis=1)], axis=1)


def dropper(keys: jax.Array | None, side: int, rate: float) -> Callable | None:
    """What an image tower applies to its tokens after the position embedding (its
    `drop_patches`): `drop_patches` with tower `side`'s keys (`side_keys`) and `rate`;
    None (every token kept) without keys or at rate 0."""
    if keys is None or rate == 0.0:
        return None
    return functools.partial(drop_patches, keys=side_keys(keys, side), rate=rate)
