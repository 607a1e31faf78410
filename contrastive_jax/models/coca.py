"""CoCa (Yu et al. 2022, "CoCa: Contrastive Captioners are Image-Text Foundation Models")
as open_clip 3.3.0 builds it (`open_clip.coca_model.CoCa`, config `coca_ViT-B-32`), in
flax.linen, with `two_tower.TwoTower`'s contract and a caption term:

- the image tower (`img`): open_clip's ViT stem and blocks, then attentional pooling
  (`AttentionalPooler`): `num_queries` learned queries attend to the image tokens; after
  `ln_post`, the first query's output through `head` is the contrastive embedding, the
  other `num_queries - 1` are the image tokens the decoder reads (open_clip's CoCa
  pooling; the paper pools the embedding with a query of its own);
- the unimodal text tower (`txt`): causal blocks over the tokens and a `cls` token
  appended after them; the `cls` position's features, normalised (`ln_final`) and
  projected (`head`), are the text embedding; the blocks' outputs at the tokens (not
  normalised) go to the decoder;
- the multimodal decoder (`dec`): per block (`encoderblock_<i>`, `DecoderBlock`), causal
  self-attention over the text features (`self`, a `transformer.Encoder1DBlock`) then
  cross-attention to the image tokens (`cross`, the same block with a `context`);
  `encoder_norm`, then `head` to vocabulary logits.

`CoCa.__call__(a, b)` returns `za`, `zb` [B, D] (L2-normalised float32), `temperature`
(`logit_scale`'s learned one; `bias` with a learned logit bias) and, with texts `b`
[B, L] (0 = padding), the caption loss's parts: `caption_nll` [B], the sum over the row's
predicted tokens (b[:, 1:], padding left out) of the next-token cross-entropy,
teacher-forced on b, and `caption_tokens` [B], how many tokens that row predicts; the
loss's global mean is `sum(caption_nll) / sum(caption_tokens)` (open_clip's `CoCaLoss`,
`CrossEntropyLoss(ignore_index=pad_id)`). Captions are decoded by `captioning` over
`image_tokens` and `next_token_logits`.

The text tower's padding mask is open_clip's as its released weights were trained
(`correct_cls_mask=False`: the key mask shifted by one, `cls_valid` first); `True` is
open_clip's corrected mask. Shapes: `B` batch, `L` tokens, `V` vocabulary, `D` embedding,
`W` width.
"""

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp
import optax

from contrastive_jax.embeddings import l2_normalize
from contrastive_jax.errors import check_divides
from contrastive_jax.models import logit_scale, patch_dropout, transformer
from contrastive_jax.models.patch_dropout import PatchDropout
from contrastive_jax.models.released.base_model import TwoTowerSettings
from contrastive_jax.models.transformer import TowerOptions, TowerSettings

PAD_ID = 0  # the padding id: never predicted, never a caption loss label


@dataclasses.dataclass(frozen=True)
class CocaSettings(TwoTowerSettings):
    """A CoCa's architecture: the two towers' (`TwoTowerSettings`: the `image` tower over
    `patch_size` patches, the `text` tower over `context_length` ids plus its `cls` token,
    embeddings of `embed_dim`, also the image tokens' width), `num_queries`
    attention-pooling queries with `pooler_heads` heads and the `decoder`'s blocks.
    `image_size` and `context_length` 0: the inputs' at init (a model built from the
    config). `activation` and `layer_norm_epsilon`: the blocks' (`transformer`);
    `pixel_mean` / `pixel_std`: how images in [0, 1] are normalised; `logit_bias`: a
    learned logit bias (SigLIP's)."""

    decoder: TowerSettings
    num_queries: int = 256
    pooler_heads: int = 8
    activation: str = "gelu"
    layer_norm_epsilon: float = 1e-5
    correct_cls_mask: bool = False
    pixel_mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    pixel_std: tuple[float, ...] = (1.0, 1.0, 1.0)
    logit_bias: bool = False

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> "CocaSettings":
        """The settings `dataclasses.asdict` wrote as JSON values (towers as dicts, tuples as lists)."""
        towers = {name: TowerSettings(**values[name]) for name in ("image", "text", "decoder")}
        tuples = {name: tuple(values[name]) for name in ("pixel_mean", "pixel_std")}
        return cls(**{**values, **towers, **tuples})


class AttentionalPooler(nn.Module):
    """open_clip's `AttentionalPooler`: `num_queries` learned queries (normalised by
    `ln_q`) attend, with `num_heads` heads, to tokens `[B, T, W]` (normalised before:
    open_clip's `ln_k`, the image encoder's final norm here). Returns `[B, num_queries, D]`."""

    embed_dim: int
    num_queries: int
    num_heads: int
    layer_norm_epsilon: float
    dtype: Any = jnp.float32
    attention: str = "auto"

    @nn.compact
    def __call__(self, x):
        query = self.param("query", nn.initializers.normal(1.0), (self.num_queries, self.embed_dim))
        query = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype, name="ln_q")(query)
        query = jnp.broadcast_to(query.astype(x.dtype), (x.shape[0], *query.shape))
        return transformer.attention_layer(self.num_heads, attention=self.attention, dtype=self.dtype)(query, x)


class ImageTower(nn.Module):
    """CoCa's image tower: pixels `[B, H, W, 3]` (normalised) -> the embedding `[B, D]`
    and the decoder's image tokens `[B, num_queries - 1, D]`. `drop_patches` (patch
    dropout) takes the tokens after the position embedding and returns those kept."""

    settings: CocaSettings
    options: TowerOptions = TowerOptions()
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x, drop_patches=None, train: bool = False):
        s, dtype, eps = self.settings, self.options.dtype, self.settings.layer_norm_epsilon
        for side in x.shape[1:3]:
            check_divides(s.patch_size, side, "config.model.patch_size", "the image size (config.data.image_size)")
        x = transformer.open_clip_patches(
            self, x, width=s.image.width, patch_size=s.patch_size, epsilon=eps, dtype=dtype, drop_patches=drop_patches
        )
        encoder = transformer.encoder(
            s.image, s.activation, eps, options=self.options, dropout_rate=self.dropout_rate, name="Transformer"
        )
        x = encoder(x, None, train)  # encoder_norm: the pooler's ln_k
        pool = AttentionalPooler(s.embed_dim, s.num_queries, s.pooler_heads, eps, dtype, self.options.attention)
        x = nn.LayerNorm(epsilon=eps, dtype=dtype, name="ln_post")(pool(x))
        return nn.Dense(s.embed_dim, use_bias=False, dtype=dtype, name="head")(x[:, 0]), x[:, 1:]


class TextTower(nn.Module):
    """CoCa's unimodal text tower: ids `[B, L]` (0 = padding) -> the embedding `[B, D]` (the
    appended `cls` token's features) and the token features `[B, L, W]` the decoder reads.
    Causal: position i's features depend on ids 0..i alone, so a prefix gives its own."""

    settings: CocaSettings
    options: TowerOptions = TowerOptions()
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, tokens, train: bool = False):
        s, dtype, eps = self.settings, self.options.dtype, self.settings.layer_norm_epsilon
        batch, length = tokens.shape
        x = nn.Embed(s.vocab_size, s.text.width, dtype=dtype)(tokens)
        cls = self.param("cls", nn.initializers.normal(0.01), (s.text.width,)).astype(x.dtype)
        x = jnp.concatenate([x, jnp.broadcast_to(cls, (batch, 1, s.text.width))], axis=1)
        positions = (s.context_length or length) + 1
        pos = self.param("pos_embedding", nn.initializers.normal(0.01), (positions, s.text.width))
        x = x + pos[None, : length + 1].astype(x.dtype)
        valid, cls_valid = tokens != PAD_ID, jnp.ones((batch, 1), bool)
        keys = jnp.concatenate([valid, cls_valid] if s.correct_cls_mask else [cls_valid, valid], axis=1)
        mask = jnp.broadcast_to(keys[:, None, None, :], (batch, 1, length + 1, length + 1))
        encoder = transformer.encoder(
            s.text,
            s.activation,
            eps,
            options=self.options,
            causal=True,
            dropout_rate=self.dropout_rate,
            final_norm=False,
            name="Encoder_0",
        )
        x = encoder(x.astype(dtype), mask, train)
        pooled = nn.LayerNorm(epsilon=eps, dtype=dtype, name="ln_final")(x[:, -1])
        return nn.Dense(s.embed_dim, use_bias=False, dtype=dtype, name="head")(pooled), x[:, :-1]


class DecoderBlock(nn.Module):
    """One block of CoCa's decoder: causal self-attention and MLP (`self`), then
    cross-attention to the image tokens `[B, S, D]` and MLP (`cross`), both
    `transformer.Encoder1DBlock`s of `settings.decoder`'s size (`[B, L, W]` -> `[B, L, W]`); one
    block for `remat` and layer-wise learning-rate decay (`encoderblock_<i>`)."""

    settings: CocaSettings
    options: TowerOptions = TowerOptions()
    dropout_rate: float = 0.0
    recompute_attention: bool = False

    @nn.compact
    def __call__(self, x, image_tokens, train: bool = False):
        s, options = self.settings, self.options
        common = (s.decoder.mlp_dim, s.decoder.num_heads, s.activation, s.layer_norm_epsilon, options.dtype)
        for name, causal, context in (("self", True, None), ("cross", False, image_tokens)):
            block = transformer.Encoder1DBlock(
                *common, self.dropout_rate, causal, options.attention, self.recompute_attention, name=name
            )
            x = block(x, None, train, context)
        return x


class MultimodalDecoder(nn.Module):
    """CoCa's multimodal decoder (open_clip's `MultimodalTransformer`): text features
    `[B, L, W]` and image tokens `[B, S, D]` -> next-token logits `[B, L, V]` (position i's
    predict id i + 1), through `DecoderBlock`s (`encoderblock_<i>`, `options.remat` applying
    to each), `encoder_norm` and `head`."""

    settings: CocaSettings
    options: TowerOptions = TowerOptions()
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, image_tokens, x, train: bool = False):
        s, options = self.settings, self.options
        for index, name in enumerate(transformer.remat_plan(options.remat, s.decoder.depth)):
            remat = transformer.REMAT_POLICIES[name]
            block = DecoderBlock
            if remat.policy is not None:
                block = nn.remat(block, policy=remat.policy, static_argnums=(3,))
            x = block(s, options, self.dropout_rate, remat.attention, name=f"encoderblock_{index}")(
                x, image_tokens, train
            )
        x = nn.LayerNorm(epsilon=s.layer_norm_epsilon, dtype=options.dtype, name="encoder_norm")(x)
        return nn.Dense(s.vocab_size, use_bias=False, dtype=options.dtype, name="head")(x)


def caption_nll(logits, labels):
    """The caption loss's parts of each row: logits `[B, L, V]` and the ids they predict
    `labels` `[B, L]` (0 = padding, not predicted) -> `(nll [B], tokens [B])` float32, the
    sum of the predicted ids' cross-entropies and how many ids were predicted."""
    valid = labels != PAD_ID
    nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return jnp.sum(jnp.where(valid, nll, 0.0), axis=-1), jnp.sum(valid, axis=-1).astype(jnp.float32)


class CoCa(nn.Module):
    """CoCa with `two_tower.TwoTower`'s contract (the module's docstring): `a` images
    `[B, H, W, 3]` (uint8, or float in [0, 1]; normalised by `settings.pixel_mean` /
    `pixel_std`), `b` ids `[B, L]` -> `za`, `zb`, `temperature` (and `bias` where
    `settings.logit_bias`, learned from `bias_init`), `caption_nll`, `caption_tokens`. `patch_keys` [B] (training only):
    the image tower drops `patch_dropout.rate` of each image's patches. `options` say how
    the towers compute; `dropout_rate`: dropout in every block while training."""

    # The parameters of each tower (`optim.frozen_tower`, layer decay); the decoder's
    # (`dec`) are neither's: they train with either tower frozen.
    TOWER_PARAMS: ClassVar[dict[str, tuple[str, ...]]] = {"a": ("img",), "b": ("txt",)}

    settings: CocaSettings
    options: TowerOptions = TowerOptions()
    patch_dropout: PatchDropout = PatchDropout()
    temperature_init: float = 0.07
    learn_temperature: bool = True
    bias_init: float | None = None
    dropout_rate: float = 0.0

    def setup(self):
        """The towers, the decoder, the temperature and (`settings.logit_bias`) the logit bias."""
        self.img = ImageTower(self.settings, self.options, self.dropout_rate)
        self.txt = TextTower(self.settings, self.options, self.dropout_rate)
        self.dec = MultimodalDecoder(self.settings, self.options, self.dropout_rate)
        self.temperature = logit_scale.temperature(self, self.temperature_init, self.learn_temperature)
        if self.settings.logit_bias:
            self.logit_bias = self.param("logit_bias", nn.initializers.constant(self.bias_init or 0.0), ())

    def __call__(self, a, b=None, *, train: bool = False, patch_keys=None):
        drop = patch_dropout.dropper(patch_keys if train else None, 0, self.patch_dropout.rate)
        pooled, image_tokens = self.img(self._pixels(a), drop, train)
        out = {"za": l2_normalize(pooled), "temperature": self.temperature}
        if b is not None:
            text, features = self.txt(b, train)
            out["zb"] = l2_normalize(text)
            logits = self.dec(image_tokens, features[:, :-1], train)
            out["caption_nll"], out["caption_tokens"] = caption_nll(logits, b[:, 1:])
        if self.settings.logit_bias:
            out["bias"] = self.logit_bias.astype(jnp.float32)
        return out

    def embed(self, x, side: str, *, train: bool = False):
        """One tower alone: images `[B, H, W, 3]` (`side="a"`) or ids `[B, L]` (`"b"`) ->
        `[B, D]` L2-normalised float32, the `za` or `zb` of `__call__`."""
        if side == "a":
            return l2_normalize(self.img(self._pixels(x), None, train)[0])
        if side == "b":
            return l2_normalize(self.txt(x, train)[0])
        raise ValueError(f"side={side!r}: use 'a' (images) or 'b' (texts).")

    def image_tokens(self, images):
        """The decoder's image tokens `[B, num_queries - 1, D]` of images `[B, H, W, 3]`."""
        return self.img(self._pixels(images))[1]

    def next_token_logits(self, image_tokens, tokens):
        """float32 logits `[B, L, V]` of the id after each position of `tokens` `[B, L]`,
        given `image_tokens` `[B, S, D]` (`image_tokens`); causal, so position i's depend
        on ids 0..i alone (decoding reads a fixed-length buffer)."""
        return self.dec(image_tokens, self.txt(tokens)[1]).astype(jnp.float32)

    def caption_logits(self, images, tokens):
        """Teacher-forced logits `[B, L - 1, V]` of ids `tokens[:, 1:]` given images
        `[B, H, W, 3]` and the ids before them (open_clip's `CoCa(...)["logits"]`)."""
        return self.next_token_logits(self.image_tokens(images), tokens)[:, :-1]

    def _pixels(self, images):
        """Images `[B, H, W, 3]` uint8 or float in [0, 1], normalised as the model was trained."""
        pixels = images.astype(jnp.float32) / 255.0 if images.dtype == jnp.uint8 else images.astype(jnp.float32)
        mean, std = jnp.asarray(self.settings.pixel_mean), jnp.asarray(self.settings.pixel_std)
        return (pixels - mean.reshape(1, 1, 1, -1)) / std.reshape(1, 1, 1, -1)
