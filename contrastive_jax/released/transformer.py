"""The Transformer pieces of the released CLIP and SigLIP towers, with big_vision's module
names (`Transformer/encoderblock_<i>/LayerNorm_0`, `MultiHeadDotProductAttention_0`,
`LayerNorm_1`, `MlpBlock_0/Dense_0|Dense_1`, `encoder_norm`; `MAPHead_0`), so that a
big_vision checkpoint is its own parameter tree and open_clip's names map onto it.

Where the released models differ, an option says so: the MLP's activation (big_vision's
tanh-approximated GELU, open_clip's exact GELU, OpenAI CLIP's `x * sigmoid(1.702 x)`), the
LayerNorm epsilon (Flax's 1e-6, PyTorch's 1e-5) and a causal attention mask (CLIP's text
tower). Shapes: `B` batch, `L` sequence length, `W` width.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class TowerSettings:
    """One Transformer tower: `width` W, `depth` blocks, `num_heads`, the MLP's `mlp_dim`."""

    width: int
    depth: int
    num_heads: int
    mlp_dim: int


ACTIVATIONS = {
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}


class MlpBlock(nn.Module):
    """Dense(mlp_dim) -> activation -> Dense(W). `[B, L, W]` -> `[B, L, W]`."""

    mlp_dim: int
    activation: str = "gelu_tanh"
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        y = ACTIVATIONS[self.activation](nn.Dense(self.mlp_dim, dtype=self.dtype)(x))
        return nn.Dense(x.shape[-1], dtype=self.dtype)(y)


class Encoder1DBlock(nn.Module):
    """Pre-LayerNorm self-attention and MLP, each added to the residual.
    `[B, L, W]` -> `[B, L, W]`; `mask` [B or 1, 1, L, L] bool (True: attend)."""

    mlp_dim: int
    num_heads: int
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, mask=None):
        y = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype)(x)
        y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype)(y, y, mask=mask)
        x = x + y
        y = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype)(x)
        return x + MlpBlock(self.mlp_dim, self.activation, self.dtype)(y)


class Encoder(nn.Module):
    """`depth` blocks (`encoderblock_<i>`), then a LayerNorm (`encoder_norm`).
    `[B, L, W]` -> `[B, L, W]`; `causal=True` lets position i attend to positions <= i."""

    depth: int
    mlp_dim: int
    num_heads: int
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-6
    causal: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], bool)) if self.causal else None
        for index in range(self.depth):
            block = Encoder1DBlock(
                self.mlp_dim,
                self.num_heads,
                self.activation,
                self.layer_norm_epsilon,
                self.dtype,
                name=f"encoderblock_{index}",
            )
            x = block(x, mask)
        return nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype, name="encoder_norm")(x)


class MAPHead(nn.Module):
    """Multihead attention pooling (SigLIP's image tower): a learned `probe` attends to
    the sequence, then a residual MLP. `[B, L, W]` -> `[B, W]`."""

    mlp_dim: int
    num_heads: int
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, x.shape[-1]))
        probe = jnp.tile(probe.astype(x.dtype), (x.shape[0], 1, 1))
        x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype)(probe, x)
        y = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype)(x)
        return (x + MlpBlock(self.mlp_dim, self.activation, self.dtype)(y))[:, 0]


def encoder(tower: TowerSettings, activation: str, layer_norm_epsilon: float, *, name: str, **options) -> Encoder:
    """The `Encoder` of `tower`'s size (`options`: `causal`, `dtype`)."""
    return Encoder(tower.depth, tower.mlp_dim, tower.num_heads, activation, layer_norm_epsilon, name=name, **options)
