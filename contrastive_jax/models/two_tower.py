"""The two-tower model (flax.linen): projection heads on two encoders (`encoders.py`).

`TwoTower` puts a projection head on each encoder, L2-normalises
the embeddings in float32, and owns the learnable temperature (stored as
`log_inv_temperature = log(1 / temperature)`, CLIP's "logit scale") and SigLIP's bias.
`clamp_temperature` keeps `1 / temperature <= MAX_INV_TEMPERATURE` after each update
(open_clip's clamp of the logit scale).

`create_model(ModelSettings)` builds the model the settings name (`encoders.ENCODERS`
lists the encoders): a `TwoTower`, or with `decoder_depth` > 0 a `coca.CoCa` (a ViT image
tower, a text Transformer and a captioning decoder, with `TwoTower`'s contract).
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from contrastive_jax.embeddings import l2_normalize
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import coca, encoders, logit_scale, patch_dropout, transformer
from contrastive_jax.models.logit_scale import MAX_INV_TEMPERATURE, TEMPERATURE_PARAM
from contrastive_jax.models.patch_dropout import PatchDropout

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class ProjectionHead(nn.Module):
    """Dense-ReLU hidden layers then a linear map to the embedding. `[B, F]` -> `[B, D]`."""

    hidden_dims: Sequence[int]
    embed_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        for width in self.hidden_dims:
            x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
        return nn.Dense(self.embed_dim, dtype=self.dtype)(x)


class ClassifierHead(nn.Module):
    """Linear classifier whose weight rows double as class proxies.

    `[B, D]` -> logits `[B, C]` and proxies `[C, D]`.
    """

    num_classes: int

    @nn.compact
    def __call__(self, x):
        proxies = self.param("proxies", nn.initializers.lecun_normal(), (self.num_classes, x.shape[-1]))
        bias = self.param("bias", nn.initializers.zeros, (self.num_classes,))
        return x.astype(jnp.float32) @ proxies.T + bias[None, :], proxies


class TwoTower(nn.Module):
    """Two encoders with projection heads, normalised embeddings and a temperature.

    `tower_b=None` ties the towers: one encoder and head embed both inputs (SimCLR).
    The temperature is learned as `log_inv_temperature` (init `log(1 /
    temperature_init)`) unless `learn_temperature` is False; `bias_init` adds SigLIP's
    learnable logit bias; `num_classes > 0` adds a classifier on tower a's embedding;
    `teacher_dim > 0` a linear map of the embeddings to a teacher's width D_t
    (distillation's embedding form, `losses.weighted_terms`).

    Inputs `a`, `b`: images [B, H, W, C], uint8 (scaled to [0, 1] here) or float32 in
    [0, 1], or int32 tokens [B, L]. `patch_keys` [B] (`patch_dropout.row_keys`, the
    trainer's, training only): each ViT tower drops `patch_dropout.rate` of its patches
    by them; without them (evaluation, `trained`, exports) every patch is kept.

    Returns a dict: `za` [B, D] (and `zb` [B, D] when `b` is given), L2-normalised
    float32; `temperature` and (SigLIP) `bias` float32 scalars; `logits` [B, C] and
    `proxies` [C, D] with a classifier; `za_to_teacher` (`zb_to_teacher`) [B, D_t] with
    `teacher_dim`. `embed` runs one tower alone:
    `model.apply(variables, texts, "b", method=TwoTower.embed)`.
    """

    # The parameters of each tower (`optim.frozen_tower`, layer decay).
    TOWER_PARAMS: ClassVar[dict[str, tuple[str, ...]]] = {"a": ("tower_a", "head_a"), "b": ("tower_b", "head_b")}

    tower_a: nn.Module
    head_a: nn.Module
    tower_b: nn.Module | None = None
    head_b: nn.Module | None = None
    temperature_init: float = 0.07
    learn_temperature: bool = True
    bias_init: float | None = None
    num_classes: int = 0
    patch_dropout: PatchDropout = PatchDropout()
    teacher_dim: int = 0

    @nn.compact
    def __call__(self, a, b=None, *, train: bool = False, patch_keys=None):
        a, b = _scaled_pixels(a), _scaled_pixels(b)
        ya = self.head_a(self.tower_a(a, train=train, **self._patches(self.tower_a, patch_keys, 0, train)))
        out = {"za": l2_normalize(ya)}
        if b is not None:
            tower_b = self.tower_b or self.tower_a
            head_b = self.head_b or self.head_a
            out["zb"] = l2_normalize(head_b(tower_b(b, train=train, **self._patches(tower_b, patch_keys, 1, train))))
        out["temperature"] = logit_scale.temperature(self, self.temperature_init, self.learn_temperature)
        if self.bias_init is not None:
            out["bias"] = self.param("logit_bias", nn.initializers.constant(self.bias_init), ())
        if self.num_classes:
            out["logits"], out["proxies"] = ClassifierHead(self.num_classes)(ya)
        if self.teacher_dim:
            to_teacher = nn.Dense(self.teacher_dim, name="to_teacher")  # one map for both sides' shared space
            out.update({f"{z}_to_teacher": to_teacher(out[z]) for z in ("za", "zb") if z in out})
        return out

    def _patches(self, tower: nn.Module, keys, side: int, train: bool) -> dict:
        """The keyword that has ViT `tower` drop patches (training with `keys`), or none."""
        drop = patch_dropout.dropper(keys if train else None, side, self.patch_dropout.rate)
        return {"drop_patches": drop} if drop is not None and isinstance(tower, encoders.ViT) else {}

    def embed(self, x, side: str, *, train: bool = False):
        """One tower alone: `x` [B, ...] (tower `side`'s inputs, "a" or "b") -> its
        L2-normalised float32 embedding [B, D], the `za` or `zb` of `__call__`."""
        if side not in ("a", "b"):
            raise ValueError(f"side={side!r}: use 'a' (tower a) or 'b' (tower b).")
        tower, head = (
            (self.tower_a, self.head_a) if side == "a" else (self.tower_b or self.tower_a, self.head_b or self.head_a)
        )
        return l2_normalize(head(tower(_scaled_pixels(x), train=train)))


def _scaled_pixels(x):
    """uint8 images (the input pipeline's, unless colour augmentation made them float)
    as float32 in [0, 1]; anything else (float images, int32 tokens, None) as it is."""
    return x.astype(jnp.float32) / 255.0 if x is not None and x.dtype == jnp.uint8 else x


def clamp_temperature(params):
    """Clips every `log_inv_temperature` in a param tree to `log(MAX_INV_TEMPERATURE)`."""
    cap = math.log(MAX_INV_TEMPERATURE)

    def clamp(path, x):
        name = getattr(path[-1], "key", None)
        return jnp.minimum(x, cap) if name == TEMPERATURE_PARAM else x

    return jax.tree_util.tree_map_with_path(clamp, params)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The model's settings as plain values, read from the config by `run_plan.build`.
    Each field is `config.model.<name>` (its comment in configs/default.py says what it
    does), but for the logit scale's: `temperature_init`, `learn_temperature`
    (`config.loss.temperature`, `learn_temperature`) and `bias_init` (SigLIP's learned
    logit bias, `config.loss.siglip_bias`; None: no bias)."""

    encoder_a: str
    encoder_b: str
    tie_towers: bool
    mlp_hidden_dims: tuple[int, ...]
    cnn_features: tuple[int, ...]
    encoder_dim: int
    text_num_layers: int
    patch_size: int
    dropout_rate: float
    projection_hidden_dims: tuple[int, ...]
    embed_dim: int
    num_classes: int
    compute_dtype: str
    remat: str
    attention: str
    temperature_init: float
    learn_temperature: bool
    bias_init: float | None
    patch_dropout: float = 0.0  # the fraction of an image's patches dropped while training (FLIP)
    patch_dropout_until_step: int = 0  # dropped before this step, none after (unmasked tuning); 0: throughout
    init_from: str = ""  # a released checkpoint (`contrastive_jax.models.released`); "": the towers above
    quick_gelu: bool = False  # the released checkpoint uses OpenAI CLIP's activation
    decoder_depth: int = 0  # CoCa's multimodal decoder blocks (`coca`); 0: no decoder (`TwoTower`)
    coca_queries: int = 256  # CoCa's attention-pooling queries: the first pools the embedding, the rest the decoder's
    teacher_dim: int = 0  # D_t: the embeddings mapped to a teacher's width (distillation by embedding); 0: none


def tower_options(settings: ModelSettings) -> transformer.TowerOptions:
    """How the towers compute (`config.model.compute_dtype`, `remat`, `attention`).

    Raises:
      ConfigError: a name none of them takes.
    """
    if settings.compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(
            f"config.model.compute_dtype={settings.compute_dtype!r}; use one of {sorted(COMPUTE_DTYPES)}."
        )
    transformer.check_options(remat=settings.remat, attention=settings.attention)
    return transformer.TowerOptions(COMPUTE_DTYPES[settings.compute_dtype], settings.remat, settings.attention)


def create_model(settings: ModelSettings, *, text_vocab_size: int) -> TwoTower | coca.CoCa:
    """The `TwoTower` that `settings` describe, or with `decoder_depth` > 0 the `coca.CoCa`
    (`coca_of`).

    Args:
      settings: the model's settings (`trainer.model_settings` reads them from a config).
      text_vocab_size: token ids the text encoder embeds (the input pipeline's).

    Raises:
      ConfigError: an unknown encoder, compute dtype, remat policy or attention kernel,
        a temperature that is not > 0, or patch dropout out of range or without a ViT;
        a CoCa of other towers (`coca_of`).
    """
    m = settings
    dtype = tower_options(m).dtype

    def encoder(field):
        name = getattr(m, field)
        if name not in encoders.ENCODERS:
            raise ConfigError(
                f"config.model.{field}={name!r} is not an encoder; use one of {sorted(encoders.ENCODERS)}."
            )
        return encoders.ENCODERS[name](m, dtype, text_vocab_size)

    def head():
        return ProjectionHead(m.projection_hidden_dims, m.embed_dim, dtype)

    if not m.temperature_init > 0:
        raise ConfigError(f"config.loss.temperature={m.temperature_init} must be > 0 (e.g. 0.07).")
    if m.patch_dropout and not {m.encoder_a, m.encoder_b} & encoders.VIT_ENCODERS:
        raise ConfigError(
            f"config.model.patch_dropout={m.patch_dropout} drops a ViT's patches, and neither encoder is one "
            f"({m.encoder_a!r}, {m.encoder_b!r}): use one of {sorted(encoders.VIT_ENCODERS)}, or set it to 0."
        )
    if m.decoder_depth:
        return coca_of(m, text_vocab_size=text_vocab_size)
    return TwoTower(
        tower_a=encoder("encoder_a"),
        head_a=head(),
        tower_b=None if m.tie_towers else encoder("encoder_b"),
        head_b=None if m.tie_towers else head(),
        temperature_init=m.temperature_init,
        learn_temperature=m.learn_temperature,
        bias_init=m.bias_init,
        num_classes=m.num_classes,
        patch_dropout=patch_dropout_of(m),
        teacher_dim=m.teacher_dim,
    )


def patch_dropout_of(settings: ModelSettings) -> PatchDropout:
    """`config.model.patch_dropout` and `patch_dropout_until_step`, checked (a ConfigError)."""
    return PatchDropout(settings.patch_dropout, settings.patch_dropout_until_step)


def coca_of(settings: ModelSettings, *, text_vocab_size: int) -> coca.CoCa:
    """The `coca.CoCa` of `settings` (`decoder_depth` > 0): the image tower the ViT
    `encoder_a` names (its width, depth and heads; `patch_size`), attention pooling with
    `coca_queries` queries, the text tower and the decoder (`decoder_depth` blocks) of
    `text_transformer`'s width (`encoder_dim`) and heads, embeddings of `embed_dim`; the
    project's GELU (tanh) and LayerNorm epsilon; images in [0, 1] as they are.

    Raises:
      ConfigError: towers CoCa has not (`encoder_a` not a ViT, `encoder_b` not
        "text_transformer", tied towers), a classifier or a projection MLP, or fewer
        than 2 queries.
    """
    m, vits = settings, sorted(encoders.VIT_ENCODERS)
    if m.encoder_a not in encoders.VIT_ENCODERS or m.encoder_b != "text_transformer" or m.tie_towers:
        raise ConfigError(
            f"config.model.decoder_depth={m.decoder_depth} builds CoCa, a ViT and a text Transformer "
            f"(encoder_a={m.encoder_a!r}, encoder_b={m.encoder_b!r}, tie_towers={m.tie_towers}): set encoder_a to "
            f"one of {vits}, encoder_b='text_transformer' and tie_towers=False, or decoder_depth=0."
        )
    if m.num_classes or m.projection_hidden_dims or m.coca_queries < 2:
        raise ConfigError(
            f"config.model.decoder_depth={m.decoder_depth} builds CoCa, whose heads are linear and which pools with "
            f"queries (num_classes={m.num_classes}, projection_hidden_dims={m.projection_hidden_dims}, "
            f"coca_queries={m.coca_queries}): set num_classes=0, projection_hidden_dims=() and coca_queries >= 2."
        )
    options = tower_options(m)
    vit = encoders.ENCODERS[m.encoder_a](m, options.dtype, text_vocab_size)
    text = encoders.ENCODERS["text_transformer"](m, options.dtype, text_vocab_size)
    text_tower = transformer.TowerSettings(text.width, text.depth, text.num_heads, 4 * text.width)
    architecture = coca.CocaSettings(
        image_size=0,
        patch_size=m.patch_size,
        image=transformer.TowerSettings(vit.width, vit.depth, vit.num_heads, vit.mlp_dim),
        context_length=0,
        vocab_size=text_vocab_size,
        text=text_tower,
        embed_dim=m.embed_dim,
        decoder=dataclasses.replace(text_tower, depth=m.decoder_depth),
        num_queries=m.coca_queries,
        pooler_heads=max(m.embed_dim // 64, 1),
        activation="gelu_tanh",
        layer_norm_epsilon=1e-6,
        logit_bias=m.bias_init is not None,
    )
    return coca.CoCa(
        architecture,
        options,
        patch_dropout_of(m),
        temperature_init=m.temperature_init,
        learn_temperature=m.learn_temperature,
        bias_init=m.bias_init,
        dropout_rate=m.dropout_rate,
    )
