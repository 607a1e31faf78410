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
import os

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from contrastive_jax import released, transformer
from contrastive_jax.released.two_tower import ReleasedTwoTower, TwoTowerSettings
from contrastive_jax.transformer import TowerSettings

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


def settings_from(arrays: dict[str, np.ndarray], *, head_width: int = 64, activation: str = "gelu") -> Settings:
    """The architecture of an open_clip checkpoint's `arrays`, inferred from their shapes
    (as open_clip's `build_model_from_openai_state_dict` does); `head_width` and
    `activation` are not in the arrays (see the module's docstring)."""
    if activation not in transformer.ACTIVATIONS:
        raise ValueError(f"activation={activation!r}; use one of {sorted(transformer.ACTIVATIONS)}.")
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


class ImageTower(nn.Module):
    """open_clip's `VisionTransformer`: `[B, H, W, 3]` normalised pixels -> `[B, embed_dim]`."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()

    @nn.compact
    def __call__(self, x):
        s, p, dtype = self.settings, self.settings.patch_size, self.options.dtype
        x = nn.Conv(
            s.image.width, (p, p), strides=(p, p), padding="VALID", use_bias=False, dtype=dtype, name="embedding"
        )(x)
        x = x.reshape(x.shape[0], -1, s.image.width)
        cls = self.param("cls", nn.initializers.zeros, (s.image.width,)).astype(x.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, s.image.width)), x], axis=1)
        x = x + self.param("pos_embedding", nn.initializers.normal(0.02), x.shape[1:])[None].astype(x.dtype)
        x = nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, dtype=dtype, name="ln_pre")(x)
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
    """A CLIP with `models.TwoTower`'s contract (`released`'s docstring): `a` images
    `[B, image_size, image_size, 3]` (uint8, or float in [0, 1]), `b` ids
    `[B, context_length]` -> `za`, `zb` `[B, embed_dim]` normalised, `temperature`
    (`exp(-log_inv_temperature)`, open_clip's `1 / logit_scale.exp()`) and `bias`.
    `options` say how the towers compute (`transformer.TowerOptions`: the activations'
    dtype, rematerialisation, the attention kernel); parameters stay float32."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()

    def towers(self):
        return ImageTower(self.settings, self.options), TextTower(self.settings, self.options)

    def normalize_pixels(self, pixels):
        mean, std = jnp.array(OPENAI_MEAN).reshape(1, 1, 1, 3), jnp.array(OPENAI_STD).reshape(1, 1, 1, 3)
        return (pixels - mean) / std


def _attention(arrays, prefix: str, num_heads: int) -> dict:
    """`nn.MultiheadAttention`'s packed `in_proj` and `out_proj` as Flax's
    `MultiHeadDotProductAttention` (`[W, heads, head_dim]` kernels)."""
    in_weight, in_bias = arrays.pop(f"{prefix}in_proj_weight"), arrays.pop(f"{prefix}in_proj_bias")
    width = in_weight.shape[1]
    shape = (width, num_heads, width // num_heads)
    out = {}
    for index, name in enumerate(("query", "key", "value")):
        rows = slice(index * width, (index + 1) * width)
        out[name] = {"kernel": in_weight[rows].T.reshape(shape), "bias": in_bias[rows].reshape(shape[1:])}
    out_weight = arrays.pop(f"{prefix}out_proj.weight")
    out["out"] = {
        "kernel": out_weight.T.reshape(shape[1], shape[2], width),
        "bias": arrays.pop(f"{prefix}out_proj.bias"),
    }
    return out


def _layer_norm(arrays, prefix: str) -> dict:
    return {"scale": arrays.pop(f"{prefix}weight"), "bias": arrays.pop(f"{prefix}bias")}


def _dense(arrays, prefix: str) -> dict:
    return {"kernel": arrays.pop(f"{prefix}weight").T, "bias": arrays.pop(f"{prefix}bias")}


def _encoder_params(arrays, prefix: str, tower: TowerSettings, final_norm: str) -> dict:
    params = {}
    for index in range(tower.depth):
        block = f"{prefix}resblocks.{index}."
        params[f"encoderblock_{index}"] = {
            "LayerNorm_0": _layer_norm(arrays, f"{block}ln_1."),
            "MultiHeadDotProductAttention_0": _attention(arrays, f"{block}attn.", tower.num_heads),
            "LayerNorm_1": _layer_norm(arrays, f"{block}ln_2."),
            "MlpBlock_0": {
                "Dense_0": _dense(arrays, f"{block}mlp.c_fc."),
                "Dense_1": _dense(arrays, f"{block}mlp.c_proj."),
            },
        }
    params["encoder_norm"] = _layer_norm(arrays, final_norm)
    return params


def params_from(arrays: dict[str, np.ndarray], settings: Settings) -> dict:
    """The parameters of `Model(settings)` from an open_clip checkpoint's `arrays`, each
    checked against the shape `Model(settings)` needs.

    Raises:
      ValueError: an array the towers have no place for (e.g. LayerScale's `ls_1`, an
        attention-pooling head), naming it: such a model is not a classic CLIP; or a
        parameter of another shape than the settings need (another model's arrays, e.g.
        a ViT-B/16's in ViT-B/32 settings), naming it.
    """
    arrays = {name: np.asarray(array, np.float32) for name, array in arrays.items() if name != "attn_mask"}
    img = {
        "embedding": {"kernel": arrays.pop("visual.conv1.weight").transpose(2, 3, 1, 0)},
        "cls": arrays.pop("visual.class_embedding"),
        "pos_embedding": arrays.pop("visual.positional_embedding"),
        "ln_pre": _layer_norm(arrays, "visual.ln_pre."),
        "Transformer": _encoder_params(arrays, "visual.transformer.", settings.image, "visual.ln_post."),
        "head": {"kernel": arrays.pop("visual.proj")},
    }
    txt = {
        "Embed_0": {"embedding": arrays.pop("token_embedding.weight")},
        "pos_embedding": arrays.pop("positional_embedding"),
        "Encoder_0": _encoder_params(arrays, "transformer.", settings.text, "ln_final."),
        "head": {"kernel": arrays.pop("text_projection")},
    }
    params = {"img": img, "txt": txt, "log_inv_temperature": arrays.pop("logit_scale").reshape(())}
    if settings.logit_bias:
        params["logit_bias"] = arrays.pop("logit_bias").reshape(())
    if arrays:
        raise ValueError(
            f"{sorted(arrays)[0]} (and {len(arrays) - 1} more) have no place in a classic open_clip CLIP "
            "(LayerScale, attention pooling and timm or Hugging Face towers are not loaded)."
        )
    given = traverse_util.flatten_dict(params, sep="/")
    for name, shape in released.param_shapes(Model(settings), settings).items():
        if given[name].shape != shape:
            raise ValueError(
                f"the parameter {name} has shape {given[name].shape}; the towers the settings describe need {shape}: "
                "the arrays are another model's (give one checkpoint, unchanged, with the settings inferred from it)."
            )
    return params


def is_checkpoint(path: str) -> bool:
    """Whether `path` names an open_clip checkpoint by its suffix."""
    return os.path.splitext(path)[1] in (".safetensors", ".bin", ".pt", ".pth")
