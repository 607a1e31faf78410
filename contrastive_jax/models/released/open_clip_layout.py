"""open_clip's CLIP `state_dict` layout (OpenAI CLIP's names: `visual.conv1.weight`,
`visual.transformer.resblocks.<i>.attn.in_proj_weight`, `token_embedding.weight`,
`text_projection`, `logit_scale`, ...) loaded into Flax towers.

The towers are open_clip's `VisionTransformer` (class token, `ln_pre`, pre-LayerNorm
blocks, `ln_post` on the class token, `proj`) and its CLIP text tower (causal attention,
`ln_final`, the end-of-text token's features -- the largest id of each row -- times
`text_projection`), with PyTorch's LayerNorm epsilon 1e-5. Parameters take the names of
`transformer` (big_vision's) under `img` and `txt`. What the arrays cannot say is
an argument of `settings_from`: the head width (64 in every released model) and the MLP
activation (`"quick_gelu"` for OpenAI's weights and open_clip's `-quickgelu` models,
`"gelu"` for the others).

Images are normalised with OpenAI's mean and standard deviation, as every open_clip model
but a few (whose preprocessing names another) was trained.
"""

import dataclasses
import json
import os

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from contrastive_jax.models import coca, transformer
from contrastive_jax.models.patch_dropout import PatchDropout
from contrastive_jax.models.released.base_model import (
    OPEN_CLIP_CONFIG,
    ReleasedTwoTower,
    TwoTowerSettings,
    param_shapes,
)
from contrastive_jax.models.transformer import TowerSettings

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's


@dataclasses.dataclass(frozen=True)
class Settings(TwoTowerSettings):
    """An open_clip CLIP's architecture: images `[image_size, image_size, 3]` cut into
    `patch_size` patches, texts of `context_length` ids below `vocab_size`, embeddings of
    `embed_dim`, the towers, the MLP `activation`, and whether a `logit_bias` was learned
    (SigLIP-trained open_clip models)."""

    activation: str = "gelu"
    logit_bias: bool = False


def read(path: str) -> dict[str, np.ndarray]:
    """A checkpoint's arrays by their open_clip names: `.safetensors` (the `safetensors`
    package, the `released` extra) or a torch pickle `.bin`/`.pt` (torch); a training
    checkpoint's `state_dict` entry and DataParallel's `module.` prefix are unwrapped."""
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        state = load_file(path)
    else:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        state = {name: tensor.float().numpy() for name, tensor in state.items()}
    return {name.removeprefix("module."): np.asarray(array) for name, array in state.items()}


def _tower(arrays, prefix: str, head_width: int) -> TowerSettings:
    width = arrays[f"{prefix}resblocks.0.ln_1.weight"].shape[0]
    blocks = f"{prefix}resblocks."
    depth = 1 + max(int(name[len(blocks) :].split(".")[0]) for name in arrays if name.startswith(blocks))
    mlp_dim = arrays[f"{prefix}resblocks.0.mlp.c_fc.weight"].shape[0]
    return TowerSettings(width, depth, max(width // head_width, 1), mlp_dim)


def settings_from(
    arrays: dict[str, np.ndarray], *, head_width: int = 64, activation: str = "gelu", pooler_heads: int = 8
) -> Settings | coca.CocaSettings:
    """The architecture of an open_clip checkpoint's `arrays`, inferred from their shapes
    (as open_clip's `build_model_from_openai_state_dict` does); `head_width` and
    `activation` are not in the arrays (see the module's docstring). A CoCa's arrays
    (`text_decoder.*`, `visual.attn_pool.*`) give `coca.CocaSettings` (`coca_settings_from`;
    `pooler_heads`: its attention pooling's heads, 8 in open_clip's CoCa configs).

    Raises:
      ValueError: an unknown activation; a CoCa's arrays without its decoder.
    """
    if activation not in transformer.ACTIVATIONS:
        raise ValueError(f"activation={activation!r}; use one of {sorted(transformer.ACTIVATIONS)}.")
    if any(name.startswith(COCA_PREFIXES) for name in arrays):
        return coca_settings_from(arrays, head_width=head_width, activation=activation, pooler_heads=pooler_heads)
    patch_size = arrays["visual.conv1.weight"].shape[-1]
    grid = round((arrays["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    return Settings(
        image_size=grid * patch_size,
        patch_size=patch_size,
        image=_tower(arrays, "visual.transformer.", head_width),
        context_length=arrays["positional_embedding"].shape[0],
        vocab_size=arrays["token_embedding.weight"].shape[0],
        text=_tower(arrays, "transformer.", head_width),
        embed_dim=arrays["text_projection"].shape[1],
        activation=activation,
        logit_bias="logit_bias" in arrays,
    )


# The arrays only a CoCa has: its text tower's class token, attention pooling, its decoder.
COCA_PREFIXES = ("text_decoder.", "visual.attn_pool.", "text.cls_emb")


def coca_settings_from(
    arrays: dict[str, np.ndarray], *, head_width: int = 64, activation: str = "gelu", pooler_heads: int = 8
) -> coca.CocaSettings:
    """The architecture of an open_clip CoCa checkpoint's `arrays` (`settings_from`'s
    arguments), with open_clip's LayerNorm epsilon and OpenAI's pixel normalisation.

    Raises:
      ValueError: the decoder's arrays (`text_decoder.*`) are missing, naming the fix.
    """
    if "text_decoder.text_projection" not in arrays:
        raise ValueError(
            "a CoCa checkpoint (visual.attn_pool.*, text.cls_emb) without its multimodal decoder (no text_decoder.* "
            "arrays): give open_clip's whole CoCa state_dict (e.g. coca_ViT-B-32's open_clip_model.safetensors)"
        )
    patch_size = arrays["visual.conv1.weight"].shape[-1]
    grid = round((arrays["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    return coca.CocaSettings(
        image_size=grid * patch_size,
        patch_size=patch_size,
        image=_tower(arrays, "visual.transformer.", head_width),
        context_length=arrays["text.positional_embedding"].shape[0] - 1,  # the class token's position after them
        vocab_size=arrays["text.token_embedding.weight"].shape[0],
        text=_tower(arrays, "text.transformer.", head_width),
        embed_dim=arrays["text.text_projection"].shape[1],
        decoder=_tower(arrays, "text_decoder.", head_width),
        num_queries=arrays["visual.attn_pool.query"].shape[0],
        pooler_heads=pooler_heads,
        activation=activation,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        pixel_mean=OPENAI_MEAN,
        pixel_std=OPENAI_STD,
        logit_bias="logit_bias" in arrays,
    )


class ImageTower(nn.Module):
    """open_clip's `VisionTransformer`: `[B, H, W, 3]` normalised pixels -> `[B, embed_dim]`.
    `drop_patches` (patch dropout) takes the tokens after the position embedding, the
    class token first, and returns those kept, as open_clip's `PatchDropout` does."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()

    @nn.compact
    def __call__(self, x, drop_patches=None):
        s, dtype = self.settings, self.options.dtype
        x = transformer.open_clip_patches(
            self,
            x,
            width=s.image.width,
            patch_size=s.patch_size,
            epsilon=LAYER_NORM_EPSILON,
            dtype=dtype,
            drop_patches=drop_patches,
        )
        # encoder_norm: ln_post
        x = transformer.encoder(s.image, s.activation, LAYER_NORM_EPSILON, options=self.options, name="Transformer")(x)
        return nn.Dense(s.embed_dim, use_bias=False, dtype=dtype, name="head")(x[:, 0])


class TextTower(nn.Module):
    """open_clip's CLIP text tower: `[B, context_length]` ids -> `[B, embed_dim]`, read at
    each row's largest id (the end-of-text token)."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()

    @nn.compact
    def __call__(self, tokens):
        s, dtype = self.settings, self.options.dtype
        x = nn.Embed(s.vocab_size, s.text.width, dtype=dtype)(tokens)
        x = x + self.param("pos_embedding", nn.initializers.normal(0.01), x.shape[1:])[None].astype(x.dtype)
        encoder = transformer.encoder(
            s.text, s.activation, LAYER_NORM_EPSILON, options=self.options, causal=True, name="Encoder_0"
        )
        x = encoder(x)  # encoder_norm: ln_final
        x = x[jnp.arange(x.shape[0]), jnp.argmax(tokens, axis=-1)]
        return nn.Dense(s.embed_dim, use_bias=False, dtype=dtype, name="head")(x)


class Model(ReleasedTwoTower):
    """A CLIP with `two_tower.TwoTower`'s contract (`released`'s docstring): `a` images
    `[B, image_size, image_size, 3]` (uint8, or float in [0, 1]), `b` ids
    `[B, context_length]` -> `za`, `zb` `[B, embed_dim]` normalised, `temperature`
    (`exp(-log_inv_temperature)`, open_clip's `1 / logit_scale.exp()`) and `bias`.
    `options` say how the towers compute (`transformer.TowerOptions`: the activations'
    dtype, rematerialisation, the attention kernel); parameters stay float32."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()
    patch_dropout: PatchDropout = PatchDropout()  # training only (`patch_dropout`)

    def towers(self):
        return ImageTower(self.settings, self.options), TextTower(self.settings, self.options)

    def normalize_pixels(self, pixels):
        mean, std = jnp.array(OPENAI_MEAN).reshape(1, 1, 1, 3), jnp.array(OPENAI_STD).reshape(1, 1, 1, 3)
        return (pixels - mean) / std


class CocaModel(coca.CoCa):
    """An open_clip CoCa (`coca.CoCa` of `coca_settings_from`'s settings): a class of its
    own, so that a run fine-tuned from one saves and rebuilds it as open_clip's
    (`released.describe`); a CoCa built from the config is a plain `coca.CoCa`."""


QKV = ("query", "key", "value")


def _norm_names(name: str, path: tuple[str, ...]):
    """`_names`' rows of a LayerNorm: torch's `weight` and `bias` as Flax's `scale` and `bias`."""
    return [(f"{name}weight", (*path, "scale"), "same", 0), (f"{name}bias", (*path, "bias"), "same", 0)]


def _attention_names(name: str, path: tuple[str, ...], heads: int, in_proj: str = "qkv_weight"):
    """`_names`' rows of an `nn.MultiheadAttention`: its `in_proj` packed (`in_proj="qkv_weight"`),
    or, where the keys' width is not the queries' ("head_weight"), one weight each."""
    weights = [(f"{name}in_proj_weight", path, "qkv_weight", heads)]
    if in_proj == "head_weight":
        weights = [(f"{name}{p}_proj_weight", (*path, n, "kernel"), "head_weight", heads) for p, n in zip("qkv", QKV)]
    return [
        *weights,
        (f"{name}in_proj_bias", path, "qkv_bias", heads),
        (f"{name}out_proj.weight", (*path, "out", "kernel"), "out_weight", heads),
        (f"{name}out_proj.bias", (*path, "out", "bias"), "same", 0),
    ]


def _block_names(block: str, at: tuple[str, ...], heads: int):
    """`_names`' rows of one residual attention block (`transformer.Encoder1DBlock`,
    or a cross-attention one, with a `context`: `_coca_names` adds its `LayerNorm_kv`)."""
    mlp = (*at, "MlpBlock_0")
    return [
        *_norm_names(f"{block}ln_1.", (*at, "LayerNorm_0")),
        *_attention_names(f"{block}attn.", (*at, "MultiHeadDotProductAttention_0"), heads),
        *_norm_names(f"{block}ln_2.", (*at, "LayerNorm_1")),
        (f"{block}mlp.c_fc.weight", (*mlp, "Dense_0", "kernel"), "linear", 0),
        (f"{block}mlp.c_fc.bias", (*mlp, "Dense_0", "bias"), "same", 0),
        (f"{block}mlp.c_proj.weight", (*mlp, "Dense_1", "kernel"), "linear", 0),
        (f"{block}mlp.c_proj.bias", (*mlp, "Dense_1", "bias"), "same", 0),
    ]


def _encoder_names(prefix: str, path: tuple[str, ...], tower: TowerSettings, final_norm: str | None):
    """`_names`' rows of one encoder: its blocks, then its final LayerNorm (None: none)."""
    for index in range(tower.depth):
        yield from _block_names(f"{prefix}resblocks.{index}.", (*path, f"encoderblock_{index}"), tower.num_heads)
    if final_norm is not None:
        yield from _norm_names(final_norm, (*path, "encoder_norm"))


def _names(settings: Settings) -> list[tuple[str, tuple[str, ...], str, int]]:
    """Every array of a classic open_clip CLIP of `settings`, as `(its name, its
    parameter's path in Model(settings), how it is stored, the attention heads)`. How:
    "same"; "linear" (a torch Linear's weight, transposed); "conv" (a Conv2d's weight
    `[O, I, H, W]` as `[H, W, I, O]`); "scalar" (a 0-d array); "qkv_weight" / "qkv_bias"
    (`nn.MultiheadAttention`'s packed `in_proj`: Flax's query, key and value under the
    path, kernels `[W, heads, head_dim]`); "head_weight" (one of `q_proj_weight`,
    `k_proj_weight`, `v_proj_weight` `[D, W]` as a kernel `[W, heads, head_dim]`);
    "out_weight" (`out_proj`'s weight as `[heads, head_dim, W]`)."""
    names = [
        ("visual.conv1.weight", ("img", "embedding", "kernel"), "conv", 0),
        ("visual.class_embedding", ("img", "cls"), "same", 0),
        ("visual.positional_embedding", ("img", "pos_embedding"), "same", 0),
        ("visual.ln_pre.weight", ("img", "ln_pre", "scale"), "same", 0),
        ("visual.ln_pre.bias", ("img", "ln_pre", "bias"), "same", 0),
        *_encoder_names("visual.transformer.", ("img", "Transformer"), settings.image, "visual.ln_post."),
        ("visual.proj", ("img", "head", "kernel"), "same", 0),
        ("token_embedding.weight", ("txt", "Embed_0", "embedding"), "same", 0),
        ("positional_embedding", ("txt", "pos_embedding"), "same", 0),
        *_encoder_names("transformer.", ("txt", "Encoder_0"), settings.text, "ln_final."),
        ("text_projection", ("txt", "head", "kernel"), "same", 0),
        ("logit_scale", ("log_inv_temperature",), "scalar", 0),
    ]
    return names + ([("logit_bias", ("logit_bias",), "scalar", 0)] if settings.logit_bias else [])


def _coca_names(settings: coca.CocaSettings) -> list[tuple[str, tuple[str, ...], str, int]]:
    """`_names` of an open_clip CoCa of `settings` (`CocaModel`'s parameters)."""
    pooler = "qkv_weight" if settings.image.width == settings.embed_dim else "head_weight"  # torch packs equal widths
    decoder = []
    for index in range(settings.decoder.depth):
        at, heads = ("dec", f"encoderblock_{index}"), settings.decoder.num_heads
        cross = f"text_decoder.cross_attn.{index}."
        decoder += [
            *_block_names(f"text_decoder.resblocks.{index}.", (*at, "self"), heads),
            *_block_names(cross, (*at, "cross"), heads),
            *_norm_names(f"{cross}ln_1_kv.", (*at, "cross", "LayerNorm_kv")),
        ]
    names = [
        ("visual.conv1.weight", ("img", "embedding", "kernel"), "conv", 0),
        ("visual.class_embedding", ("img", "cls"), "same", 0),
        ("visual.positional_embedding", ("img", "pos_embedding"), "same", 0),
        *_norm_names("visual.ln_pre.", ("img", "ln_pre")),
        *_encoder_names("visual.transformer.", ("img", "Transformer"), settings.image, "visual.attn_pool.ln_k."),
        ("visual.attn_pool.query", ("img", "AttentionalPooler_0", "query"), "same", 0),
        *_norm_names("visual.attn_pool.ln_q.", ("img", "AttentionalPooler_0", "ln_q")),
        *_attention_names(
            "visual.attn_pool.attn.",
            ("img", "AttentionalPooler_0", "MultiHeadDotProductAttention_0"),
            settings.pooler_heads,
            pooler,
        ),
        *_norm_names("visual.ln_post.", ("img", "ln_post")),
        ("visual.proj", ("img", "head", "kernel"), "same", 0),
        ("text.token_embedding.weight", ("txt", "Embed_0", "embedding"), "same", 0),
        ("text.cls_emb", ("txt", "cls"), "same", 0),
        ("text.positional_embedding", ("txt", "pos_embedding"), "same", 0),
        *_encoder_names("text.transformer.", ("txt", "Encoder_0"), settings.text, None),
        *_norm_names("text.ln_final.", ("txt", "ln_final")),
        ("text.text_projection", ("txt", "head", "kernel"), "same", 0),
        *decoder,
        *_norm_names("text_decoder.ln_final.", ("dec", "encoder_norm")),
        ("text_decoder.text_projection", ("dec", "head", "kernel"), "same", 0),
        ("logit_scale", ("log_inv_temperature",), "scalar", 0),
    ]
    return names + ([("logit_bias", ("logit_bias",), "scalar", 0)] if settings.logit_bias else [])


def model_for(settings: Settings | coca.CocaSettings):
    """The Flax model of `settings`: `Model` (a CLIP) or `CocaModel`."""
    return (
        CocaModel(settings, bias_init=-10.0 if settings.logit_bias else None) if _is_coca(settings) else Model(settings)
    )


def _is_coca(settings) -> bool:
    return isinstance(settings, coca.CocaSettings)


def _to_params(array: np.ndarray, how: str, heads: int) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """An open_clip array as `(path under its parameter's path, value)` pairs (`_names`)."""
    if how in ("qkv_weight", "qkv_bias"):
        width = array.shape[-1] if how == "qkv_weight" else array.shape[0] // 3
        head_shape = (heads, width // heads)
        parts = np.split(array, 3)
        if how == "qkv_weight":
            return [((name, "kernel"), part.T.reshape(width, *head_shape)) for name, part in zip(QKV, parts)]
        return [((name, "bias"), part.reshape(head_shape)) for name, part in zip(QKV, parts)]
    value = {
        "same": lambda: array,
        "linear": lambda: array.T,
        "conv": lambda: array.transpose(2, 3, 1, 0),
        "scalar": lambda: array.reshape(()),
        "out_weight": lambda: array.T.reshape(heads, array.shape[0] // heads, array.shape[0]),
        "head_weight": lambda: array.T.reshape(array.shape[1], heads, array.shape[0] // heads),
    }[how]()
    return [((), value)]


def _to_array(get, how: str) -> np.ndarray:
    """The open_clip array of a parameter (`get(path under its parameter's path)`): the
    inverse of `_to_params`."""
    if how == "qkv_weight":
        return np.concatenate([get((name, "kernel")).reshape(get((name, "kernel")).shape[0], -1).T for name in QKV])
    if how == "qkv_bias":
        return np.concatenate([get((name, "bias")).reshape(-1) for name in QKV])
    value = get(())
    return {
        "same": lambda: value,
        "linear": lambda: value.T,
        "conv": lambda: value.transpose(3, 2, 0, 1),
        "scalar": lambda: value.reshape(()),
        "out_weight": lambda: value.reshape(-1, value.shape[-1]).T,
        "head_weight": lambda: value.reshape(value.shape[0], -1).T,
    }[how]()


def params_from(arrays: dict[str, np.ndarray], settings: Settings) -> dict:
    """The parameters of `Model(settings)` from an open_clip checkpoint's `arrays`, each
    checked against the shape `Model(settings)` needs.

    Raises:
      KeyError: an array the towers need is missing (its name).
      ValueError: an array the towers have no place for (e.g. LayerScale's `ls_1`, an
        attention-pooling head), naming it: such a model is not a classic CLIP; or a
        parameter of another shape than the settings need (another model's arrays, e.g.
        a ViT-B/16's in ViT-B/32 settings), naming it.
    """
    arrays = {name: np.asarray(array, np.float32) for name, array in arrays.items() if name != "attn_mask"}
    flat = {}
    for name, path, how, heads in (_coca_names if _is_coca(settings) else _names)(settings):
        for under, value in _to_params(arrays.pop(name), how, heads):
            flat[(*path, *under)] = value
    if arrays:
        raise ValueError(
            f"{sorted(arrays)[0]} (and {len(arrays) - 1} more) have no place in a classic open_clip CLIP "
            "(LayerScale, attention pooling and timm or Hugging Face towers are not loaded)."
        )
    for name, shape in param_shapes(model_for(settings), settings).items():
        given = flat[tuple(name.split("/"))].shape
        if given != shape:
            raise ValueError(
                f"the parameter {name} has shape {given}; the towers the settings describe need {shape}: "
                "the arrays are another model's (give one checkpoint, unchanged, with the settings inferred from it)."
            )
    return traverse_util.unflatten_dict(flat)


def arrays_from(params: dict, settings: Settings) -> dict[str, np.ndarray]:
    """The open_clip `state_dict` arrays (float32, by open_clip's names) of the parameters
    of `Model(settings)`: `params_from`'s inverse, for a trained or fine-tuned model."""
    flat = {path: np.asarray(value, np.float32) for path, value in traverse_util.flatten_dict(params).items()}
    arrays = {}
    for name, path, how, _ in (_coca_names if _is_coca(settings) else _names)(settings):
        arrays[name] = np.ascontiguousarray(_to_array(lambda under, path=path: flat[(*path, *under)], how))
    return arrays


def write(path: str, params: dict, settings: Settings) -> None:
    """Writes the parameters of `Model(settings)` as open_clip's `state_dict` in the
    `.safetensors` file `path`: `open_clip.create_model(...)` with the same architecture
    loads it (`load_state_dict(safetensors.torch.load_file(path))`). The activation, which
    the arrays do not say, goes into `open_clip_config.json` beside it (`model_cfg.quick_gelu`,
    the file's other keys kept), where `released.load` and open_clip read it."""
    from safetensors.numpy import save_file

    if not path.endswith(".safetensors"):
        raise ValueError(f"{path}: open_clip's layout is written as .safetensors.")
    save_file(arrays_from(params, settings), path)
    config_path = os.path.join(os.path.dirname(os.path.abspath(path)), OPEN_CLIP_CONFIG)
    config = {}
    if os.path.exists(config_path):
        with open(config_path) as f:
            config = json.load(f)
    config.setdefault("model_cfg", {})["quick_gelu"] = settings.activation == "quick_gelu"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def is_checkpoint(path: str) -> bool:
    """Whether `path` names an open_clip checkpoint by its suffix."""
    return os.path.splitext(path)[1] in (".safetensors", ".bin", ".pt", ".pth")
