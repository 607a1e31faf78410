"""big_vision's SigLIP / SigLIP 2 `.npz` layout (`two_towers.Model`: `img/...`, `txt/...`,
`t`, `b`; flat names joined with "/", with or without a leading `params/`) loaded into
Flax towers whose parameters carry big_vision's own names.

The image tower is big_vision's `vit` (a patch `embedding` Conv, a learned
`pos_embedding` [1, N, W], the `Transformer` encoder, `MAPHead_0` attention pooling --
SigLIP's `pool_type="map"`; `cls` token or mean pooling for other ViTs -- and a `head`
Dense only where the checkpoint has one: SigLIP's image embedding is the pooled width).
The text tower is big_vision's `text_transformer` (`Embed_0`, `pos_embedding`
[1, L, W], the bidirectional `Encoder_0`, the LAST token's features, a `head` Dense).
Both use tanh-approximated GELU and LayerNorm epsilon 1e-6 (Flax's). `t` is the log
inverse temperature (`log_inv_temperature` here) and `b` the logit bias (`logit_bias`).

Images are taken to [-1, 1] (`x * 2 - 1`), as SigLIP was trained. SigLIP 2's towers are
SigLIP's (its 256k-id vocabulary is read from the arrays); NaFlex checkpoints are not.
"""

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from contrastive_jax.models import transformer
from contrastive_jax.models.patch_dropout import PatchDropout
from contrastive_jax.models.released.base_model import ReleasedTwoTower, TwoTowerSettings, param_shapes
from contrastive_jax.models.transformer import TowerSettings
from contrastive_jax.models.two_tower import TEMPERATURE_PARAM

ACTIVATION = "gelu_tanh"  # big_vision's `nn.gelu`, approximate=True
LAYER_NORM_EPSILON = 1e-6  # flax.linen.LayerNorm's
POOL_TYPES = ("map", "tok", "gap")
# The top-level parameters' names in `Model` and in the checkpoint.
TOP_LEVEL = {TEMPERATURE_PARAM: "t", "logit_bias": "b"}
_SCANNED = re.compile(r"(^|/)encoderblock/")


@dataclasses.dataclass(frozen=True)
class Settings(TwoTowerSettings):
    """A big_vision two-tower model's architecture: images `[image_size, image_size, 3]`
    cut into `patch_size` patches, pooled by `pool_type` ("map": `MAPHead_0`, "tok": a
    `cls` token, "gap": the mean); texts of `context_length` ids below `vocab_size`;
    embeddings of `embed_dim`, through a `head` Dense on the image tower where
    `image_head` (else `embed_dim` is the image width) and on the text tower where
    `text_head`; whether a `logit_bias` (`b`) was learned."""

    pool_type: str = "map"
    image_head: bool = False
    text_head: bool = True
    logit_bias: bool = True


def read(path: str) -> dict[str, np.ndarray]:
    """A big_vision `.npz`'s arrays by their names less any `params/` prefix
    (`img/embedding/kernel` [P, P, 3, W], ...). A `scan=True` checkpoint's stacked
    `.../encoderblock/...` arrays `[depth, ...]` become `.../encoderblock_<i>/...`; an old
    text tower's second `txt/Encoder_0/pos_embedding` [1, L, W] is added to
    `txt/pos_embedding`, as big_vision's `text_transformer.load` does."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name.removeprefix("params/"): np.asarray(npz[name]) for name in npz.files}
    arrays = _unstacked(arrays)
    extra = arrays.pop("txt/Encoder_0/pos_embedding", None)
    if extra is not None:
        arrays["txt/pos_embedding"] = arrays["txt/pos_embedding"] + extra
    return arrays


def _unstacked(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`.../encoderblock/<rest>` [depth, ...] as `.../encoderblock_<i>/<rest>` [...]."""
    out = {}
    for name, array in arrays.items():
        if not _SCANNED.search(name):
            out[name] = array
            continue
        for index in range(array.shape[0]):
            out[_SCANNED.sub(rf"\1encoderblock_{index}/", name, count=1)] = array[index]
    return out


def _array(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in arrays:
        raise ValueError(
            f"{name} is not in the checkpoint: give a big_vision SigLIP / SigLIP 2 two-tower .npz "
            "(both towers, `t`; NaFlex checkpoints are not supported)."
        )
    return arrays[name]


def _tower(arrays: dict[str, np.ndarray], prefix: str) -> TowerSettings:
    """A tower's settings from its encoder's arrays: the heads from the attention's query
    kernel `[W, heads, head_dim]`, the depth from the `encoderblock_<i>` names."""
    block = f"{prefix}/encoderblock_0/"
    width, num_heads, _ = _array(arrays, f"{block}MultiHeadDotProductAttention_0/query/kernel").shape
    mlp_dim = _array(arrays, f"{block}MlpBlock_0/Dense_0/kernel").shape[1]
    pattern = re.compile(rf"{re.escape(prefix)}/encoderblock_(\d+)/")
    depth = 1 + max(int(m.group(1)) for name in arrays if (m := pattern.match(name)))
    return TowerSettings(width=width, depth=depth, num_heads=num_heads, mlp_dim=mlp_dim)


def settings_from(arrays: dict[str, np.ndarray]) -> Settings:
    """The architecture of a big_vision checkpoint's `arrays` (as `read` gives them),
    inferred from their shapes.

    Raises:
      ValueError: an array the inference needs is missing, or the towers' embedding
        widths differ.
    """
    image, text = _tower(arrays, "img/Transformer"), _tower(arrays, "txt/Encoder_0")
    patch_size = _array(arrays, "img/embedding/kernel").shape[0]
    grid = round(_array(arrays, "img/pos_embedding").shape[1] ** 0.5)
    pool_type = "map" if "img/MAPHead_0/probe" in arrays else "tok" if "img/cls" in arrays else "gap"
    image_head, text_head = "img/head/kernel" in arrays, "txt/head/kernel" in arrays
    image_dim = arrays["img/head/kernel"].shape[1] if image_head else image.width
    text_dim = arrays["txt/head/kernel"].shape[1] if text_head else text.width
    if image_dim != text_dim:
        raise ValueError(
            f"the image tower embeds {image_dim} features and the text tower {text_dim}: "
            "give a two-tower checkpoint whose towers share an embedding width."
        )
    return Settings(
        image_size=grid * patch_size,
        patch_size=patch_size,
        image=image,
        context_length=_array(arrays, "txt/pos_embedding").shape[1],
        vocab_size=_array(arrays, "txt/Embed_0/embedding").shape[0],
        text=text,
        embed_dim=image_dim,
        pool_type=pool_type,
        image_head=image_head,
        text_head=text_head,
        logit_bias="b" in arrays,
    )


def _posemb(module: nn.Module, length: int, width: int) -> jax.Array:
    """big_vision's learned position embedding `[1, length, width]`."""
    return module.param("pos_embedding", nn.initializers.normal(stddev=width**-0.5), (1, length, width))


class ImageTower(nn.Module):
    """big_vision's `vit`: `[B, H, W, 3]` pixels in [-1, 1] -> `[B, embed_dim]`.
    `drop_patches` (patch dropout) takes the patches after the position embedding and
    returns those kept; the pooling ("map", "gap", or a "tok" class token added after
    it) then reads the kept tokens only."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()

    @nn.compact
    def __call__(self, x, drop_patches=None):
        dtype = self.options.dtype
        s, p, width = self.settings, self.settings.patch_size, self.settings.image.width
        x = nn.Conv(width, (p, p), strides=(p, p), padding="VALID", dtype=dtype, name="embedding")(x)
        x = x.reshape(x.shape[0], -1, width)
        x = x + _posemb(self, x.shape[1], width).astype(x.dtype)
        if drop_patches is not None:
            x = drop_patches(x, num_prefix=0)
        if s.pool_type == "tok":
            cls = self.param("cls", nn.initializers.zeros, (1, 1, width)).astype(x.dtype)
            x = jnp.concatenate([jnp.tile(cls, (x.shape[0], 1, 1)), x], axis=1)
        x = transformer.encoder(s.image, ACTIVATION, LAYER_NORM_EPSILON, options=self.options, name="Transformer")(x)
        if s.pool_type == "map":
            pool = transformer.MAPHead(
                s.image.mlp_dim,
                s.image.num_heads,
                ACTIVATION,
                LAYER_NORM_EPSILON,
                dtype,
                self.options.attention,
                name="MAPHead_0",
            )
            x = pool(x)
        elif s.pool_type == "tok":
            x = x[:, 0]
        elif s.pool_type == "gap":
            x = x.mean(axis=1)
        else:
            raise ValueError(f"pool_type={s.pool_type!r}; use one of {POOL_TYPES}.")
        return nn.Dense(s.embed_dim, dtype=dtype, name="head")(x) if s.image_head else x


class TextTower(nn.Module):
    """big_vision's `text_transformer`: `[B, context_length]` ids -> `[B, embed_dim]`, read
    at the last position (SigLIP's texts are padded to the full length)."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()

    @nn.compact
    def __call__(self, tokens):
        s, dtype = self.settings, self.options.dtype
        if tokens.shape[-1] != s.context_length:
            raise ValueError(f"texts of {tokens.shape[-1]} ids; the released text tower takes {s.context_length}.")
        x = nn.Embed(s.vocab_size, s.text.width, dtype=dtype, name="Embed_0")(tokens)
        x = x + _posemb(self, s.context_length, s.text.width).astype(x.dtype)
        x = transformer.encoder(s.text, ACTIVATION, LAYER_NORM_EPSILON, options=self.options, name="Encoder_0")(x)
        return nn.Dense(s.embed_dim, dtype=dtype, name="head")(x[:, -1]) if s.text_head else x[:, -1]


class Model(ReleasedTwoTower):
    """A SigLIP with `two_tower.TwoTower`'s contract (`released`'s docstring): `a` images
    `[B, image_size, image_size, 3]` (uint8, or float in [0, 1]), `b` ids
    `[B, context_length]` -> `za`, `zb` `[B, embed_dim]` L2-normalised float32,
    `temperature` (`exp(-log_inv_temperature)`, big_vision's `1 / exp(t)`) and `bias`
    (`b`). `options` say how the towers compute (`transformer.TowerOptions`: the
    activations' dtype, rematerialisation, the attention kernel); parameters stay float32."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()
    patch_dropout: PatchDropout = PatchDropout()  # training only (`patch_dropout`)

    def towers(self):
        return ImageTower(self.settings, self.options), TextTower(self.settings, self.options)

    def normalize_pixels(self, pixels):
        return pixels * 2.0 - 1.0


def params_from(arrays: dict[str, np.ndarray], settings: Settings) -> dict:
    """The parameters of `Model(settings)` (numpy float32) from a big_vision checkpoint's
    `arrays` (as `read` gives them): big_vision's tree, unflattened, with `t` [1] as
    `log_inv_temperature` [] and `b` [1] as `logit_bias` [].

    Raises:
      ValueError: naming the first array the model needs that is missing or of another
        shape, or the first array the model has no place for.
    """
    arrays = dict(arrays)
    flat = {}
    for name, shape in sorted(param_shapes(Model(settings), settings).items()):
        source = TOP_LEVEL.get(name, name)
        array = np.asarray(_array(arrays, source), np.float32)
        arrays.pop(source)
        if name in TOP_LEVEL and array.size == 1:
            array = array.reshape(shape)
        if array.shape != shape:
            raise ValueError(
                f"{source} has shape {array.shape}; the towers inferred from the checkpoint need {shape}: "
                "the file mixes models (give one big_vision checkpoint, unchanged)."
            )
        flat[name] = array
    if arrays:
        raise ValueError(
            f"{sorted(arrays)[0]} (and {len(arrays) - 1} more) have no place in the towers inferred "
            f"({settings}); give a big_vision SigLIP / SigLIP 2 two-tower .npz (not NaFlex, not a training state)."
        )
    return traverse_util.unflatten_dict(flat, sep="/")


def arrays_from(params: dict) -> dict[str, np.ndarray]:
    """big_vision's arrays (float32, "/"-joined names, `t` and `b` of shape [1]) of the
    parameters of a `Model`: `params_from`'s inverse, for a trained or fine-tuned model."""
    arrays = {}
    for name, value in traverse_util.flatten_dict(params, sep="/").items():
        value = np.asarray(value, np.float32)
        arrays[TOP_LEVEL.get(name, name)] = value.reshape(1) if name in TOP_LEVEL else value
    return arrays


def write(path: str, params: dict, settings: Settings) -> None:
    """Writes the parameters of `Model(settings)` as a big_vision `.npz` (`params/<name>`,
    as big_vision's checkpoints name them), which `read` and big_vision's
    `two_towers.load` read back."""
    if not path.endswith(".npz"):
        raise ValueError(f"{path}: big_vision's layout is written as .npz.")
    np.savez(path, **{f"params/{name}": array for name, array in arrays_from(params).items()})
