"""The NaFlex image tower (SigLIP 2, Tschannen et al. 2025): a ViT over a variable number
of patches per image, up to a token budget, each image at its own aspect ratio.

Its input is `data.naflex_images`'s packed array `a` [B, 1 + L, P * P * C] (L the budget): row 0
of each image its patch grid (rows, cols), then its rows * cols patches and padding. The
patches are embedded by a Dense layer (a Conv of stride P on the flattened patch), the
learned position embedding of a fixed S x S grid is resized to each image's grid
(`resized_position_embeddings`: bilinear with antialiasing, transformers'
`Siglip2VisionEmbeddings.resize_positional_embeddings`), and the padding tokens are
masked out as keys in every block's attention and in the MAP head's pooling, so an
image's embedding does not depend on the budget it is padded to.

Parameters carry big_vision's names (`embedding`, `pos_embedding`, `Transformer`,
`MAPHead_0`), as `released.big_vision_layout.ImageTower`'s. Shapes: `B` images, `L`
tokens (the budget), `W` width, `S` the position grid's side.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from contrastive_jax.data.naflex_images import HEADER_BASE, HEADER_ROWS
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import transformer


def grid_of(a: jax.Array) -> jax.Array:
    """int32 [B, 2]: each image's patch grid (rows, cols) from the header of the packed
    array `a` [B, 1 + L, P * P * C] (uint8, or float holding the same integers), at
    least 1 x 1 (an all-zero array, an initialisation's dummy, is a 1 x 1 image)."""
    digits = jnp.round(a[:, 0, :4].astype(jnp.float32)).astype(jnp.int32)
    return jnp.maximum(digits[:, 0::2] + HEADER_BASE * digits[:, 1::2], 1)


def valid_tokens(grid: jax.Array, length: int) -> jax.Array:
    """bool [B, L]: which of `length` tokens are an image's patches (the first rows * cols
    of `grid` [B, 2]), the rest padding."""
    return jnp.arange(length)[None, :] < (grid[:, 0] * grid[:, 1])[:, None]


def resized_position_embeddings(pos: jax.Array, grid: jax.Array, length: int) -> jax.Array:
    """The position embedding `pos` [S, S, W] resized to each image's `grid` [B, 2]
    (rows, cols) and laid out as its `length` tokens [B, L, W] in raster order, the
    padding tokens taking the first position's: `F.interpolate(mode="bilinear",
    align_corners=False, antialias=True)` per image, written as one weight matrix per
    axis (a triangle filter widened by the downscaling factor, renormalised), as
    transformers' `Siglip2VisionEmbeddings.resize_positional_embeddings` computes it."""
    side = pos.shape[0]
    sizes = grid.astype(jnp.float32)[:, None, :]  # [B, 1, 2]
    token = jnp.arange(length, dtype=jnp.float32)[None, :, None]  # [1, L, 1]
    row = jnp.floor(token / sizes[..., 1:])
    index = jnp.concatenate([row, token - row * sizes[..., 1:]], axis=-1)  # [B, L, 2]
    index = index * (token < sizes[..., :1] * sizes[..., 1:])
    scale = side / sizes  # [B, 1, 2]
    center = (index + 0.5) * scale - 0.5
    source = jnp.arange(side, dtype=jnp.float32).reshape(1, 1, 1, side)
    support = jnp.maximum(scale, 1.0)[..., None]
    weights = jnp.maximum(1.0 - jnp.abs(source - center[..., None]) / support, 0.0)  # [B, L, 2, S]
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    both = (weights[..., 0, :, None] * weights[..., 1, None, :]).reshape(*weights.shape[:2], side * side)
    flat = pos.reshape(side * side, -1).astype(jnp.float32)
    return jnp.matmul(both, flat, precision=jax.lax.Precision.HIGHEST)


def pixels_of(patches: jax.Array) -> jax.Array:
    """float32 patches in [-1, 1] (SigLIP's inputs) of uint8 patches, or float ones in [0, 1]."""
    scaled = patches.astype(jnp.float32) / 255.0 if patches.dtype == jnp.uint8 else patches.astype(jnp.float32)
    return scaled * 2.0 - 1.0


class ImageTower(nn.Module):
    """SigLIP 2's NaFlex ViT: packed images `a` [B, 1 + L, P * P * C] -> `[B, W]`, the MAP
    head's pooling of the image's own tokens.

    `settings` give `image` (`transformer.TowerSettings`), `position_grid` S and the
    released model's activation and LayerNorm epsilon (`activation`,
    `layer_norm_epsilon`); `options` how it computes (`transformer.TowerOptions`).
    """

    settings: Any
    options: transformer.TowerOptions = transformer.TowerOptions()

    @nn.compact
    def __call__(self, a, drop_patches=None):
        if drop_patches is not None:
            raise ConfigError(
                "config.model.patch_dropout drops a fixed number of patches per image and NaFlex images have "
                "their own number: set config.model.patch_dropout=0 (or lower config.data.max_num_patches)."
            )
        s, dtype = self.settings, self.options.dtype
        width, side = s.image.width, s.position_grid
        grid, patches = grid_of(a), a[:, HEADER_ROWS:]
        length = patches.shape[1]
        x = nn.Dense(width, dtype=dtype, name="embedding")(pixels_of(patches).astype(dtype))
        pos = self.param("pos_embedding", nn.initializers.normal(stddev=width**-0.5), (side * side, width))
        x = x + resized_position_embeddings(pos.reshape(side, side, width), grid, length).astype(x.dtype)
        valid = valid_tokens(grid, length)
        keys = valid[:, None, None, :]  # [B, 1, 1, L]: every query attends to the image's own tokens
        encoder = transformer.encoder(
            s.image, s.activation, s.layer_norm_epsilon, options=self.options, name="Transformer"
        )
        x = encoder(x, keys)
        pool = transformer.MAPHead(
            s.image.mlp_dim,
            s.image.num_heads,
            s.activation,
            s.layer_norm_epsilon,
            dtype,
            self.options.attention,
            name="MAPHead_0",
        )
        return pool(x, keys)
