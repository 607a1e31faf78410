"""The one Transformer of every tower here: the released CLIP and SigLIP towers and the
project's own `ViT` and `TextTransformer` (`encoders`). big_vision's module names
(`Transformer/encoderblock_<i>/LayerNorm_0`, `MultiHeadDotProductAttention_0`,
`LayerNorm_1`, `MlpBlock_0/Dense_0|Dense_1`, `encoder_norm`; `MAPHead_0`), so that a
big_vision checkpoint is its own parameter tree and open_clip's names map onto it.

Where the released models differ, an option says so: the MLP's activation (big_vision's
tanh-approximated GELU, open_clip's exact GELU, OpenAI CLIP's `x * sigmoid(1.702 x)`), the
LayerNorm epsilon (Flax's 1e-6, PyTorch's 1e-5) and a causal attention mask (CLIP's text
tower). What changes memory and time but not the numbers is an option too: what each
block recomputes in the backward pass (`remat`: a `REMAT_POLICIES` name for every block,
or one per run of blocks, `remat_plan`) and the attention kernel (`attention`:
`jax.nn.dot_product_attention`, cuDNN's fused attention on a GPU with 16-bit
activations, XLA's elsewhere). Shapes: `B` batch, `L` sequence length, `W` width.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TowerSettings:
    """One Transformer tower: `width` W, `depth` blocks, `num_heads`, the MLP's `mlp_dim`."""

    width: int
    depth: int
    num_heads: int
    mlp_dim: int


# The MLP's activation, each recomputed from its input in the backward pass
# (`jax.checkpoint`), as PyTorch's GELU does: differentiated as written, exact GELU keeps
# three [B, L, mlp_dim] arrays beside its input (its erf, erf's derivative, its output),
# the largest activations of a block (measured: experiments/bench/bench_step_memory.py).
ACTIVATIONS = {
    "gelu_tanh": jax.checkpoint(lambda x: nn.gelu(x, approximate=True)),
    "gelu": jax.checkpoint(lambda x: nn.gelu(x, approximate=False)),
    "quick_gelu": jax.checkpoint(lambda x: x * jax.nn.sigmoid(1.702 * x)),
}


@dataclasses.dataclass(frozen=True)
class BlockRemat:
    """What one block recomputes in the backward pass instead of keeping it from the
    forward: `policy`, the block rematerialised with this `jax.checkpoint_policies`
    entry (what it keeps; None: not rematerialised), and `attention`, XLA's attention
    recomputing its [B, heads, L, L] scores and probabilities from the queries and keys
    (as cuDNN's fused kernel and PyTorch's SDPA do; the fused kernels need nothing)."""

    policy: Any = None
    attention: bool = False


# `config.model.remat`: what each Transformer block keeps from its forward pass for the
# backward one, the rest recomputed; from the least recomputed to the most.
REMAT_POLICIES = {
    "none": BlockRemat(),  # every activation kept, XLA's attention probabilities too
    # every activation kept but XLA's attention's scores and probabilities (2 or 3 arrays of
    # [B, heads, L, L] per block): one more Q K^T and softmax per block in the backward pass
    "attention": BlockRemat(attention=True),
    # the matmuls without batch dimensions (the Dense layers' outputs) kept; attention's
    # scores and probabilities, the norms and the activations recomputed
    "dots": BlockRemat(jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    "full": BlockRemat(jax.checkpoint_policies.nothing_saveable),  # only each block's input kept
}
_REMAT_FORMS = (
    f"use one of {list(REMAT_POLICIES)} for every block, or one per run of blocks from the "
    "first, each but the last with its count: e.g. 'full:6,none' (blocks 0-5 full, the rest none)"
)


def remat_plan(remat: str, depth: int) -> tuple[str, ...]:
    """The `REMAT_POLICIES` name of each of `depth` blocks that `remat` gives: one name for
    every block ("dots"), or comma-separated runs from the first block, `name:count`, the
    last without a count taking the blocks left ("full:4,dots:4,none": blocks 0-3 full,
    4-7 dots, the rest none). A tower shallower than the counts takes the runs' first
    blocks (two towers of different depths share the setting).

    >>> remat_plan("full:2,attention", 4)
    ('full', 'full', 'attention', 'attention')

    Raises:
      ConfigError: a name that is not a policy, a count that is not a positive integer,
        or a count on the last run or missing from another; one line naming the field.
    """
    plan = []
    runs = [run.strip() for run in remat.split(",")]
    for index, run in enumerate(runs):
        name, colon, count = run.partition(":")
        last = index == len(runs) - 1
        if name not in REMAT_POLICIES or bool(colon) == last or (colon and not (count.isdigit() and int(count) > 0)):
            raise ConfigError(f"config.model.remat={remat!r}; {_REMAT_FORMS}.")
        plan += [name] * (int(count) if colon else max(depth - len(plan), 0))
    return tuple(plan[:depth])


# `config.model.attention`: which kernel computes attention (`jax.nn.dot_product_attention`).
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")


def check_options(*, remat: str, attention: str) -> None:
    """That `remat` is a remat setting (`remat_plan`) and `attention` an implementation.

    Raises:
      ConfigError: naming the config field and the values it takes.
    """
    remat_plan(remat, 0)
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ConfigError(f"config.model.attention={attention!r}; use one of {list(ATTENTION_IMPLEMENTATIONS)}.")


def _implementation(query, attention: str) -> str:
    """The kernel `attention` names for `query` [B, L, heads, head_dim]; "auto": cuDNN's
    fused attention on a GPU where it applies (16-bit inputs, a head width that is a
    multiple of 8 and at most 128), XLA's elsewhere."""
    if attention != "auto":
        return attention
    head_dim = query.shape[-1]
    fused = query.dtype in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if fused and jax.default_backend() == "gpu" else "xla"


def attention_at_even_lengths(query, key, value, bias=None, mask=None, *, is_causal=False, implementation="cudnn"):
    """`jax.nn.dot_product_attention` of `query` [B, Lq, heads, head_dim] over `key`,
    `value` [B, Lk, heads, head_dim] (`bias`, `mask` [B or 1, heads or 1, Lq, Lk]) with
    an odd `Lq` or `Lk` padded by one row to an even length: the padded keys left out
    through `key_value_seq_lengths`, the padded queries' rows dropped, so the numbers are
    unpadded attention's (but for a query that attends to no key, a padding token's,
    which no tower reads: whatever the kernel gives it). cuDNN's training kernel takes
    even lengths only, and JAX hands it a bias even where none is given, so without this
    it refuses ViT-B/16's 197 tokens and CLIP's 77 whenever it is differentiated (seen
    on an H200, jax 0.11.2). Returns [B, Lq, heads, head_dim]."""
    length_q, length_k = query.shape[1], key.shape[1]
    pad_q, pad_k = length_q % 2, length_k % 2
    if not (pad_q or pad_k):
        return jax.nn.dot_product_attention(
            query, key, value, bias, mask, is_causal=is_causal, implementation=implementation
        )

    def padded(array, axis, length, pad):  # an axis of size 1 (broadcast) stays as it is
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, pad if array.shape[axis] == length else 0)
        return jnp.pad(array, widths)

    query = padded(query, 1, length_q, pad_q)
    key, value = padded(key, 1, length_k, pad_k), padded(value, 1, length_k, pad_k)
    if bias is not None:
        bias = padded(padded(bias, -2, length_q, pad_q), -1, length_k, pad_k)
    if mask is not None:
        mask = padded(padded(mask, -2, length_q, pad_q), -1, length_k, pad_k)
    batch = query.shape[0]
    out = jax.nn.dot_product_attention(
        query,
        key,
        value,
        bias,
        mask,
        is_causal=is_causal,
        query_seq_lengths=jnp.full((batch,), length_q, jnp.int32),
        key_value_seq_lengths=jnp.full((batch,), length_k, jnp.int32),
        implementation=implementation,
    )
    return out[:, :length_q]


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    attention: str = "auto",
    is_causal: bool = False,
    recompute: bool = False,
    dropout_rng=None,
    dropout_rate: float = 0.0,
    deterministic: bool = True,
    dtype=None,
    precision=None,
):
    """Flax's `attention_fn` contract through `jax.nn.dot_product_attention`, the fused
    kernel `attention` names (`_implementation`). `query` [B, Lq, heads, head_dim],
    `key`, `value` [B, Lk, heads, head_dim], `mask` [B or 1, heads or 1, Lq, Lk] bool or
    0/1 (True: attend), `is_causal`: position i attends to positions <= i as well.
    `recompute`: XLA's kernel keeps no scores or probabilities for the backward pass,
    which recomputes them from `query` and `key` (a fused kernel keeps none anyway).
    Returns [B, Lq, heads, head_dim].

    With dropout on the attention weights (training with `dropout_rate` > 0), Flax's own
    attention computes them, as no fused kernel drops weights.
    """
    if dropout_rate > 0.0 and not deterministic:
        if is_causal:
            causal = nn.make_causal_mask(jnp.ones(query.shape[:2], bool))
            mask = causal if mask is None else nn.combine_masks(mask, causal)
        return nn.dot_product_attention(
            query,
            key,
            value,
            bias,
            mask,
            dropout_rng=dropout_rng,
            dropout_rate=dropout_rate,
            deterministic=False,
            dtype=dtype,
            precision=precision,
        )
    mask = None if mask is None else mask.astype(bool)  # Flax's masks may be 0/1 floats
    xla = functools.partial(jax.nn.dot_product_attention, is_causal=is_causal, implementation="xla")
    if recompute:
        xla = jax.checkpoint(xla)  # only its inputs kept: scores and probabilities recomputed
    if _implementation(query, attention) == "xla":
        return xla(query, key, value, bias, mask)
    try:
        return attention_at_even_lengths(query, key, value, bias, mask, is_causal=is_causal)
    except (ValueError, NotImplementedError):
        if attention == "cudnn":
            raise
        return xla(query, key, value, bias, mask)  # "auto": XLA's where cuDNN refuses these shapes (the same numbers)


def attention_layer(
    num_heads: int,
    *,
    attention: str,
    dtype,
    causal: bool = False,
    recompute: bool = False,
    dropout_rate: float = 0.0,
    deterministic: bool = True,
    name: str | None = None,
):
    """Flax's `MultiHeadDotProductAttention` (its parameter names and shapes:
    `query`/`key`/`value` `[W, heads, head_dim]`, `out` `[heads, head_dim, W]`) with
    `dot_product_attention` as its kernel (`recompute`: its probabilities recomputed in
    the backward pass)."""
    attention_fn = functools.partial(dot_product_attention, attention=attention, is_causal=causal, recompute=recompute)
    return nn.MultiHeadDotProductAttention(
        num_heads=num_heads,
        dtype=dtype,
        dropout_rate=dropout_rate,
        deterministic=deterministic,
        attention_fn=attention_fn,
        name=name,
    )


# Flax's LayerNorm recomputed from its input in the backward pass: differentiated as
# written, it keeps two float32 [B, L, W] arrays (its centred input and a square or its
# normalised output) where its input alone will do, whatever the activations' dtype.
LayerNorm = nn.remat(nn.LayerNorm)


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
    """Pre-LayerNorm self-attention and MLP, each added to the residual (after dropout
    when training with `dropout_rate` > 0). `[B, L, W]` -> `[B, L, W]`; `mask`
    [B or 1, 1, L, L] bool (True: attend); `causal`: position i attends to positions <= i;
    `recompute_attention`: the attention's probabilities recomputed in the backward pass.
    With `context` [B, S, W'] the attention is cross-attention from `x` to the context,
    normalised by a LayerNorm of its own (`LayerNorm_kv`; `mask` then [.., L, S]): open_clip's
    `ResidualAttentionBlock(is_cross_attention=True)`, in CoCa's decoder."""

    mlp_dim: int
    num_heads: int
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-6
    dtype: Any = jnp.float32
    dropout_rate: float = 0.0
    causal: bool = False
    attention: str = "auto"
    recompute_attention: bool = False

    @nn.compact
    def __call__(self, x, mask=None, train: bool = False, context=None):
        dropout = nn.Dropout(self.dropout_rate, deterministic=not train)
        y = LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype, name="LayerNorm_0")(x)
        keys = (
            y
            if context is None
            else LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype, name="LayerNorm_kv")(context)
        )
        attend = attention_layer(
            self.num_heads,
            attention=self.attention,
            dtype=self.dtype,
            causal=self.causal,
            recompute=self.recompute_attention,
            dropout_rate=self.dropout_rate,
            deterministic=not train,
        )
        x = x + dropout(attend(y, keys, mask=mask))
        y = LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype, name="LayerNorm_1")(x)
        return x + dropout(MlpBlock(self.mlp_dim, self.activation, self.dtype)(y))


class Encoder(nn.Module):
    """`depth` blocks (`encoderblock_<i>`), then a LayerNorm (`encoder_norm`).
    `[B, L, W]` -> `[B, L, W]`; `mask` [B or 1, 1, L, L] bool (True: attend); `causal=True`
    lets position i attend to positions <= i. `remat` says what each block recomputes in
    the backward pass (`remat_plan`: a `REMAT_POLICIES` name, or one per run of blocks),
    `attention` their kernel; neither changes the parameters or the numbers, only the
    memory and the time. `final_norm=False` leaves the LayerNorm out (CoCa's text tower
    normalises its class token alone and hands the decoder the blocks' output)."""

    depth: int
    mlp_dim: int
    num_heads: int
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-6
    causal: bool = False
    dtype: Any = jnp.float32
    dropout_rate: float = 0.0
    remat: str = "none"
    attention: str = "auto"
    final_norm: bool = True

    @nn.compact
    def __call__(self, x, mask=None, train: bool = False):
        for index, name in enumerate(remat_plan(self.remat, self.depth)):
            remat = REMAT_POLICIES[name]
            block_type = Encoder1DBlock
            if remat.policy is not None:
                block_type = nn.remat(Encoder1DBlock, policy=remat.policy, static_argnums=(3,))
            block = block_type(
                self.mlp_dim,
                self.num_heads,
                self.activation,
                self.layer_norm_epsilon,
                self.dtype,
                self.dropout_rate,
                self.causal,
                self.attention,
                remat.attention,
                name=f"encoderblock_{index}",
            )
            x = block(x, mask, train)
        if not self.final_norm:
            return x
        return nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype, name="encoder_norm")(x)


class MAPHead(nn.Module):
    """Multihead attention pooling (SigLIP's image tower): a learned `probe` attends to
    the sequence, then a residual MLP. `[B, L, W]` -> `[B, W]`; `mask` [B or 1, 1, 1, L]
    bool (True: attend; NaFlex's padding tokens False), None: every token."""

    mlp_dim: int
    num_heads: int
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-6
    dtype: Any = jnp.float32
    attention: str = "auto"

    @nn.compact
    def __call__(self, x, mask=None):
        probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, x.shape[-1]))
        probe = jnp.tile(probe.astype(x.dtype), (x.shape[0], 1, 1))
        x = attention_layer(self.num_heads, attention=self.attention, dtype=self.dtype)(probe, x, mask=mask)
        y = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype)(x)
        return (x + MlpBlock(self.mlp_dim, self.activation, self.dtype)(y))[:, 0]


def open_clip_patches(module: nn.Module, x, *, width: int, patch_size: int, epsilon: float, dtype, drop_patches=None):
    """open_clip's ViT stem, the parameters made in `module` (called inside its compact
    `__call__`): `[B, H, W, 3]` pixels cut into `patch_size` patches (`embedding`, a
    Conv without bias), a class token `cls` first, the learned `pos_embedding` (its
    length the input's), `drop_patches` (patch dropout: the tokens kept, the class
    token first) and `ln_pre`. Returns `[B, 1 + P, width]` (fewer with `drop_patches`)."""
    p = patch_size
    x = nn.Conv(width, (p, p), strides=(p, p), padding="VALID", use_bias=False, dtype=dtype, name="embedding")(x)
    x = x.reshape(x.shape[0], -1, width)
    cls = module.param("cls", nn.initializers.zeros, (width,)).astype(x.dtype)
    x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, width)), x], axis=1)
    x = x + module.param("pos_embedding", nn.initializers.normal(0.02), x.shape[1:])[None].astype(x.dtype)
    if drop_patches is not None:
        x = drop_patches(x, num_prefix=1)
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, name="ln_pre")(x)


@dataclasses.dataclass(frozen=True)
class TowerOptions:
    """How a tower computes, not what: the activations' `dtype` (parameters stay
    float32), what each block recomputes in the backward pass `remat` (`remat_plan`) and the
    `attention` kernel (`ATTENTION_IMPLEMENTATIONS`). None of them changes the parameters."""

    dtype: Any = jnp.float32
    remat: str = "none"
    attention: str = "auto"


def encoder(
    tower: TowerSettings,
    activation: str,
    layer_norm_epsilon: float,
    *,
    name: str,
    options: TowerOptions = TowerOptions(),
    causal: bool = False,
    dropout_rate: float = 0.0,
    final_norm: bool = True,
) -> Encoder:
    """The `Encoder` of `tower`'s size, computing as `options` say (dropout on the
    attention weights and the residual branches when training with `dropout_rate` > 0;
    `final_norm=False`: without its last LayerNorm)."""
    return Encoder(
        tower.depth,
        tower.mlp_dim,
        tower.num_heads,
        activation,
        layer_norm_epsilon,
        causal,
        options.dtype,
        dropout_rate,
        remat=options.remat,
        attention=options.attention,
        final_norm=final_norm,
        name=name,
    )
