"""The encoders (flax.linen): each maps a batch `[B, ...]` to features `[B, F]`.

Images: `MLP` (flattened), `SmallCNN`, `ResNet` (18 / 50), `ViT`; text (token ids
`[B, L]`, 0 = padding): `TextCNN` (1-D convolutions as `Conv1D` matmuls),
`TextTransformer` (both on `transformer.Encoder`, the released towers' blocks too).
Each takes `train` (dropout, BatchNorm statistics). `ENCODERS` maps
the names `config.model.encoder_a` / `encoder_b` take to constructors.
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from contrastive_jax.errors import check_divides
from contrastive_jax.models import transformer


class MLP(nn.Module):
    """Flattens `[B, ...]` and applies Dense-GELU(-Dropout) layers, then a linear layer.

    Returns `[B, out_dim]`.
    """

    hidden_dims: Sequence[int]
    out_dim: int
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, train: bool = False):
        x = x.reshape(x.shape[0], -1).astype(self.dtype)
        for width in self.hidden_dims:
            x = nn.gelu(nn.Dense(width, dtype=self.dtype)(x))
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return nn.Dense(self.out_dim, dtype=self.dtype)(x)


class SmallCNN(nn.Module):
    """Conv3x3-GELU stages (2x2 max pool between stages while the image is >= 4 pixels),
    global average pooling and a linear layer. `[B, H, W, C]` -> `[B, out_dim]`."""

    features: Sequence[int]
    out_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, train: bool = False):
        del train
        x = x.astype(self.dtype)
        for i, width in enumerate(self.features):
            if i and min(x.shape[1:3]) >= 4:
                x = nn.max_pool(x, (2, 2), strides=(2, 2))
            x = nn.gelu(nn.Conv(width, (3, 3), dtype=self.dtype)(x))
        return nn.Dense(self.out_dim, dtype=self.dtype)(jnp.mean(x, axis=(1, 2)))


class BasicBlock(nn.Module):
    filters: int
    strides: int
    norm: Callable
    conv: Callable

    @nn.compact
    def __call__(self, x):
        residual = x
        y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), (self.strides, self.strides))(x)))
        y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters, (3, 3))(y))
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), (self.strides, self.strides))(residual)
            residual = self.norm()(residual)
        return nn.relu(residual + y)


class BottleneckBlock(nn.Module):
    filters: int
    strides: int
    norm: Callable
    conv: Callable

    @nn.compact
    def __call__(self, x):
        residual = x
        y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
        y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), (self.strides, self.strides))(y)))
        y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters * 4, (1, 1))(y))
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), (self.strides, self.strides))(residual)
            residual = self.norm()(residual)
        return nn.relu(residual + y)


class ResNet(nn.Module):
    """ResNet v1.5 with BatchNorm (statistics over the global batch under `jit`).

    Images of at most 64 pixels get the CIFAR stem (3x3 conv, no max pool).
    `[B, H, W, C]` -> `[B, 512]` (basic blocks) or `[B, 2048]` (bottlenecks).
    """

    stage_sizes: Sequence[int]
    block: type[nn.Module]
    num_filters: int = 64
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, train: bool = False):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, dtype=self.dtype)
        x = x.astype(self.dtype)
        if max(x.shape[1:3]) <= 64:
            x = nn.relu(norm()(conv(self.num_filters, (3, 3))(x)))
        else:
            x = nn.relu(norm()(conv(self.num_filters, (7, 7), (2, 2))(x)))
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, num_blocks in enumerate(self.stage_sizes):
            for j in range(num_blocks):
                strides = 2 if i > 0 and j == 0 else 1
                x = self.block(self.num_filters * 2**i, strides, norm, conv)(x)
        return jnp.mean(x, axis=(1, 2))


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al. 2021) with a class token.

    `[B, H, W, C]` -> `[B, width]`, H and W multiples of `patch_size`. The blocks are
    `transformer.Encoder`'s (`remat`, `attention`: its options). `drop_patches`
    (`patch_dropout.dropper`'s, training with patch dropout) takes the tokens `[B, 1 + P,
    width]` after the position embedding and returns those kept, the class token first.
    """

    width: int
    depth: int
    num_heads: int
    mlp_dim: int
    patch_size: int
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32
    remat: str = "none"
    attention: str = "auto"

    @nn.compact
    def __call__(self, x, *, train: bool = False, drop_patches: Callable | None = None):
        p = self.patch_size
        for side in x.shape[1:3]:
            check_divides(p, side, "config.model.patch_size", "the image size (config.data.image_size)")
        x = nn.Conv(self.width, (p, p), strides=(p, p), dtype=self.dtype)(x.astype(self.dtype))
        x = x.reshape(x.shape[0], -1, self.width)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, self.width))
        x = jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)).astype(self.dtype), x], axis=1)
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, *x.shape[1:]))
        x = x + pos.astype(self.dtype)
        if drop_patches is not None:
            x = drop_patches(x, num_prefix=1)
        x = _encoder(self, self.depth, self.mlp_dim, self.num_heads)(x, None, train)
        return x[:, 0]


class TextTransformer(nn.Module):
    """Bidirectional Transformer over tokens (0 = padding), mean-pooled over real tokens.

    `[B, L]` int -> `[B, width]`. The blocks are `transformer.Encoder`'s (`remat`,
    `attention`: its options).
    """

    vocab_size: int
    width: int
    depth: int
    num_heads: int
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32
    remat: str = "none"
    attention: str = "auto"

    @nn.compact
    def __call__(self, tokens, *, train: bool = False):
        valid = tokens > 0
        x = nn.Embed(self.vocab_size, self.width, dtype=self.dtype)(tokens)
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, *x.shape[1:]))
        x = x + pos.astype(self.dtype)
        x = _encoder(self, self.depth, 4 * self.width, self.num_heads)(x, nn.make_attention_mask(valid, valid), train)
        weights = valid.astype(x.dtype)[..., None]
        return jnp.sum(x * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1)


def _encoder(tower: ViT | TextTransformer, depth: int, mlp_dim: int, num_heads: int) -> transformer.Encoder:
    """The pre-LayerNorm blocks and final LayerNorm of one of the project's Transformer
    towers (tanh GELU, Flax's LayerNorm epsilon), with the tower's options."""
    return transformer.encoder(
        transformer.TowerSettings(tower.width, depth, num_heads, mlp_dim),
        "gelu_tanh",
        1e-6,
        name="Transformer",
        options=transformer.TowerOptions(tower.dtype, tower.remat, tower.attention),
        dropout_rate=tower.dropout_rate,
    )


class Conv1D(nn.Module):
    """A 'SAME' 1-D convolution written as one matmul over `kernel_size` shifted copies
    of the input (im2col): `[B, L, C]` -> `[B, L, features]`, the same numbers as
    `nn.Conv` with the same `kernel` `[k, C, features]` and `bias`.

    Why not `nn.Conv`: XLA's CPU backend computes a convolution's kernel gradient inside
    a loop (gradient caching's scan over micro-batches) with a slow generic emitter,
    65x slower than the same gradient outside one (0.91 s vs 14 ms for 512 x 28 x 64
    here; jax-ml/jax#12868, open); a matmul is fast in both places.
    """

    features: int
    kernel_size: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        k, length = self.kernel_size, x.shape[1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (k, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        left = (k - 1) // 2  # 'SAME': as nn.Conv pads
        padded = jnp.pad(x, ((0, 0), (left, k - 1 - left), (0, 0)))
        shifted = jnp.concatenate([padded[:, i : i + length] for i in range(k)], axis=-1)
        kernel, bias = kernel.astype(self.dtype), bias.astype(self.dtype)
        return shifted.astype(self.dtype) @ kernel.reshape(-1, self.features) + bias[None, None, :]


class TextCNN(nn.Module):
    """1-D convolutions over token embeddings (0 = padding), mean- and max-pooled over
    the real tokens. Fast on CPUs, for short sequences (spellings, phonemes).

    Embedding of width `features[0]`, then per width a 'SAME' convolution of
    `kernel_size` and GELU (residual when the width is unchanged); padding positions are
    zeroed before every convolution, so the output does not depend on how far a
    sequence is padded. `[B, L]` int -> `[B, out_dim]`.
    """

    vocab_size: int
    features: Sequence[int]
    out_dim: int
    kernel_size: int = 3
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens, *, train: bool = False):
        del train
        valid = (tokens > 0)[..., None]  # [B, L, 1]
        x = nn.Embed(self.vocab_size, self.features[0], dtype=self.dtype)(tokens)
        for width in self.features:
            y = nn.gelu(Conv1D(width, self.kernel_size, dtype=self.dtype)(x * valid))
            x = x + y if y.shape == x.shape else y
        x = x * valid
        count = jnp.maximum(jnp.sum(valid, axis=1), 1).astype(x.dtype)  # [B, 1]
        mean = jnp.sum(x, axis=1) / count
        largest = jnp.max(jnp.where(valid, x, jnp.finfo(x.dtype).min), axis=1)
        largest = jnp.where(jnp.any(valid, axis=1), largest, 0)  # an all-padding row
        return nn.Dense(self.out_dim, dtype=self.dtype)(jnp.concatenate([mean, largest], -1))


# The encoders built of Transformer blocks (`config.model.remat` and `attention` apply).
TRANSFORMER_ENCODERS = frozenset({"vit_micro", "vit_tiny", "vit_small", "vit_base", "text_transformer"})
# The `ViT`s (`config.model.patch_dropout` drops their patches).
VIT_ENCODERS = frozenset({"vit_micro", "vit_tiny", "vit_small", "vit_base"})


def _vit(width, depth, num_heads, mlp_dim):
    return lambda m, dtype, vocab: ViT(
        width, depth, num_heads, mlp_dim, m.patch_size, m.dropout_rate, dtype, m.remat, m.attention
    )


# name -> (two_tower.ModelSettings, compute dtype, text vocabulary size) -> encoder.
ENCODERS: Mapping[str, Callable[[Any, Any, int], nn.Module]] = {
    "mlp": lambda m, dtype, vocab: MLP(m.mlp_hidden_dims, m.encoder_dim, m.dropout_rate, dtype),
    "cnn": lambda m, dtype, vocab: SmallCNN(m.cnn_features, m.encoder_dim, dtype),
    "resnet18": lambda m, dtype, vocab: ResNet((2, 2, 2, 2), BasicBlock, dtype=dtype),
    "resnet50": lambda m, dtype, vocab: ResNet((3, 4, 6, 3), BottleneckBlock, dtype=dtype),
    "vit_micro": _vit(64, 2, 2, 256),  # CPU-sized: the studies' image tower on 32 px pictures (8 px patches)
    "vit_tiny": _vit(192, 12, 3, 768),
    "vit_small": _vit(384, 12, 6, 1536),
    "vit_base": _vit(768, 12, 12, 3072),
    "text_cnn": lambda m, dtype, vocab: TextCNN(vocab, m.cnn_features, m.encoder_dim, dtype=dtype),
    "text_transformer": lambda m, dtype, vocab: TextTransformer(
        vocab,
        m.encoder_dim,
        m.text_num_layers,
        max(m.encoder_dim // 64, 1),
        m.dropout_rate,
        dtype,
        m.remat,
        m.attention,
    ),
}
