"""SigLIP 2 NaFlex in transformers' layout (`Siglip2Model.save_pretrained`: `model.safetensors`
with `config.json` beside it, as Hugging Face's `google/siglip2-base-patch16-naflex` holds
them) loaded into Flax towers with big_vision's parameter names.

The image tower is `models.naflex.ImageTower` (packed NaFlex images, `data.naflex_images`: each
image at its aspect ratio, up to `config.data.max_num_patches` patches); the text tower
is big_vision's (`big_vision_layout.TextTower`: SigLIP 2's text tower is SigLIP's, read at
the last position; transformers' `Siglip2TextModel` without an attention mask). Both
use tanh-approximated GELU (`gelu_pytorch_tanh`) and LayerNorm epsilon 1e-6, which
`config.json` must say. `logit_scale` is the log inverse temperature, `logit_bias` the
logit bias.

The arrays, as `read` gives them, are transformers' by name, but for each attention's
`q_proj`, `k_proj`, `v_proj` packed as one `qkv` (as torch's `nn.MultiheadAttention`
packs them), so that open_clip's conversions serve. The attention heads, which the arrays
do not say, are `config.json`'s (`num_attention_heads` of each tower).
"""

import dataclasses
import json
import os

import numpy as np
from flax import traverse_util

from contrastive_jax.errors import ConfigError
from contrastive_jax.models import naflex, transformer
from contrastive_jax.models.patch_dropout import PatchDropout
from contrastive_jax.models.released import big_vision_layout
from contrastive_jax.models.released.base_model import ReleasedTwoTower, param_shapes
from contrastive_jax.models.released.open_clip_layout import _to_array, _to_params
from contrastive_jax.models.transformer import TowerSettings

CONFIG = "config.json"  # transformers' config, beside the weights
PATCH_EMBEDDING = "vision_model.embeddings.patch_embedding.weight"
QKV = ("q_proj", "k_proj", "v_proj")
HIDDEN_ACT = "gelu_pytorch_tanh"  # big_vision's tanh-approximated GELU


@dataclasses.dataclass(frozen=True)
class Settings(big_vision_layout.Settings):
    """A SigLIP 2 NaFlex's architecture: big_vision's SigLIP settings (`image_size` the
    position grid's pixels, S x `patch_size`) with the position embedding's grid side
    `position_grid` S; the image tower takes NaFlex images of any budget."""

    position_grid: int = 16
    activation: str = big_vision_layout.ACTIVATION
    layer_norm_epsilon: float = big_vision_layout.LAYER_NORM_EPSILON
    naflex: bool = True  # the image tower takes packed NaFlex images (`released.check_inputs`)


def is_checkpoint(path: str) -> bool:
    """Whether the `.safetensors` file `path` holds a transformers SigLIP / SigLIP 2 (its
    vision tower's patch embedding), read from its header alone."""
    if not path.endswith(".safetensors"):
        return False
    from safetensors import safe_open

    try:
        with safe_open(path, "np") as f:
            return PATCH_EMBEDDING in f.keys()
    except Exception:  # noqa: BLE001  a damaged file: `loading` names it when it reads it
        return False


def read(path: str) -> dict[str, np.ndarray]:
    """The checkpoint's arrays by transformers' names, each attention's q, k, v packed as
    `<attention>.qkv.weight` [3 W, W] and `.qkv.bias` [3 W], with the towers' heads from
    `config.json` beside it as `config/vision_heads` and `config/text_heads` (0-d)."""
    from safetensors.numpy import load_file

    arrays = dict(load_file(path))
    for name in [n for n in arrays if n.endswith(".q_proj.weight") or n.endswith(".q_proj.bias")]:
        prefix, kind = name.rsplit(".q_proj.", 1)
        arrays[f"{prefix}.qkv.{kind}"] = np.concatenate([arrays.pop(f"{prefix}.{q}.{kind}") for q in QKV])
    return arrays | _config_arrays(os.path.join(os.path.dirname(os.path.abspath(path)), CONFIG))


def _config_arrays(path: str) -> dict[str, np.ndarray]:
    """`config.json`'s heads as arrays; a ConfigError for a missing config, one that is not
    a SigLIP 2 two-tower model's, or one whose activation or LayerNorm epsilon the towers
    do not have."""
    if not os.path.exists(path):
        raise ConfigError(f"{path} is missing: save the model with transformers' save_pretrained (its config.json)")
    with open(path) as f:
        config = json.load(f)
    if "vision_config" not in config or "text_config" not in config:
        raise ConfigError(f"{path} is not a two-tower Siglip2Model's config (vision_config and text_config)")
    towers = {"vision": config["vision_config"], "text": config["text_config"]}
    for name, tower in towers.items():
        act, eps = tower.get("hidden_act", HIDDEN_ACT), tower.get("layer_norm_eps", 1e-6)
        if act != HIDDEN_ACT or eps != big_vision_layout.LAYER_NORM_EPSILON:
            raise ConfigError(
                f"{path}: the {name} tower uses {act} and LayerNorm epsilon {eps}; SigLIP 2's use {HIDDEN_ACT}, 1e-6"
            )
    return {f"config/{name}_heads": np.asarray(tower["num_attention_heads"]) for name, tower in towers.items()}


def _tower(arrays: dict[str, np.ndarray], prefix: str, heads: int) -> TowerSettings:
    width = arrays[f"{prefix}encoder.layers.0.layer_norm1.weight"].shape[0]
    blocks = f"{prefix}encoder.layers."
    depth = 1 + max(int(name[len(blocks) :].split(".")[0]) for name in arrays if name.startswith(blocks))
    return TowerSettings(width, depth, heads, arrays[f"{blocks}0.mlp.fc1.weight"].shape[0])


def settings_from(arrays: dict[str, np.ndarray]) -> Settings:
    """The architecture of a SigLIP 2 NaFlex checkpoint's `arrays` (as `read` gives them).

    Raises:
      ValueError: a fixed-resolution SigLIP (a Conv2d patch embedding), naming the fix.
    """
    patch = arrays[PATCH_EMBEDDING]
    if patch.ndim != 2:
        raise ValueError(
            f"{PATCH_EMBEDDING} is a Conv2d {patch.shape}: a fixed-resolution SigLIP, not NaFlex; give a "
            "-naflex checkpoint (google/siglip2-base-patch16-naflex), or this model's big_vision .npz with "
            "config.data.max_num_patches=0 and its config.data.image_size"
        )
    patch_size = round((patch.shape[1] / 3) ** 0.5)
    grid = round(arrays["vision_model.embeddings.position_embedding.weight"].shape[0] ** 0.5)
    text_head = arrays["text_model.head.weight"]
    return Settings(
        image_size=grid * patch_size,
        patch_size=patch_size,
        image=_tower(arrays, "vision_model.", int(arrays["config/vision_heads"])),
        context_length=arrays["text_model.embeddings.position_embedding.weight"].shape[0],
        vocab_size=arrays["text_model.embeddings.token_embedding.weight"].shape[0],
        text=_tower(arrays, "text_model.", int(arrays["config/text_heads"])),
        embed_dim=text_head.shape[0],
        logit_bias="logit_bias" in arrays,
        position_grid=grid,
    )


def _encoder_names(prefix: str, path: tuple[str, ...], tower: TowerSettings, final_norm: str):
    """`_names`' rows of one transformers encoder, then its final LayerNorm."""
    heads = tower.num_heads
    for index in range(tower.depth):
        block, at = f"{prefix}encoder.layers.{index}.", (*path, f"encoderblock_{index}")
        attention, mlp = (*at, "MultiHeadDotProductAttention_0"), (*at, "MlpBlock_0")
        yield from _norm(f"{block}layer_norm1.", (*at, "LayerNorm_0"))
        yield from _attention(f"{block}self_attn.qkv.", f"{block}self_attn.out_proj.", attention, heads)
        yield from _norm(f"{block}layer_norm2.", (*at, "LayerNorm_1"))
        yield from _dense(f"{block}mlp.fc1.", (*mlp, "Dense_0"))
        yield from _dense(f"{block}mlp.fc2.", (*mlp, "Dense_1"))
    yield from _norm(final_norm, (*path, "encoder_norm"))


def _norm(name: str, path: tuple[str, ...]):
    yield (f"{name}weight", (*path, "scale"), "same", 0)
    yield (f"{name}bias", (*path, "bias"), "same", 0)


def _dense(name: str, path: tuple[str, ...]):
    yield (f"{name}weight", (*path, "kernel"), "linear", 0)
    yield (f"{name}bias", (*path, "bias"), "same", 0)


def _attention(qkv: str, out: str, path: tuple[str, ...], heads: int):
    yield (f"{qkv}weight", path, "qkv_weight", heads)
    yield (f"{qkv}bias", path, "qkv_bias", heads)
    yield (f"{out}weight", (*path, "out", "kernel"), "out_weight", heads)
    yield (f"{out}bias", (*path, "out", "bias"), "same", 0)


def _names(settings: Settings) -> list[tuple[str, tuple[str, ...], str, int]]:
    """Every array of a SigLIP 2 NaFlex of `settings` as `(its name as `read` gives it,
    its parameter's path in `Model(settings)`, how it is stored (open_clip_layout's
    `_names`), the attention heads)`; arrays whose shapes differ only by axes of size 1
    (the position embeddings, the scalars) are reshaped to the parameter's."""
    head = ("img", "MAPHead_0")
    heads = settings.image.num_heads
    names = [
        *_dense("vision_model.embeddings.patch_embedding.", ("img", "embedding")),
        ("vision_model.embeddings.position_embedding.weight", ("img", "pos_embedding"), "same", 0),
        *_encoder_names("vision_model.", ("img", "Transformer"), settings.image, "vision_model.post_layernorm."),
        ("vision_model.head.probe", (*head, "probe"), "same", 0),
        *_attention(
            "vision_model.head.attention.in_proj_",
            "vision_model.head.attention.out_proj.",
            (*head, "MultiHeadDotProductAttention_0"),
            heads,
        ),
        *_norm("vision_model.head.layernorm.", (*head, "LayerNorm_0")),
        *_dense("vision_model.head.mlp.fc1.", (*head, "MlpBlock_0", "Dense_0")),
        *_dense("vision_model.head.mlp.fc2.", (*head, "MlpBlock_0", "Dense_1")),
        ("text_model.embeddings.token_embedding.weight", ("txt", "Embed_0", "embedding"), "same", 0),
        ("text_model.embeddings.position_embedding.weight", ("txt", "pos_embedding"), "same", 0),
        *_encoder_names("text_model.", ("txt", "Encoder_0"), settings.text, "text_model.final_layer_norm."),
        *_dense("text_model.head.", ("txt", "head")),
        ("logit_scale", ("log_inv_temperature",), "same", 0),
    ]
    return names + ([("logit_bias", ("logit_bias",), "same", 0)] if settings.logit_bias else [])


class Model(ReleasedTwoTower):
    """A SigLIP 2 NaFlex with `two_tower.TwoTower`'s contract (`released`'s docstring) but
    for its images: `a` packed NaFlex images [B, 1 + L, P * P * 3] (`data.naflex_images`; uint8,
    or float in [0, 1]), `b` ids [B, context_length] -> `za`, `zb` [B, embed_dim]
    L2-normalised float32, `temperature` (`exp(-log_inv_temperature)`) and `bias`."""

    settings: Settings
    options: transformer.TowerOptions = transformer.TowerOptions()
    patch_dropout: PatchDropout = PatchDropout()  # refused by the NaFlex tower

    def towers(self):
        return naflex.ImageTower(self.settings, self.options), big_vision_layout.TextTower(self.settings, self.options)

    def _pixels(self, images):
        """Packed NaFlex images as they are: the tower reads their header and scales their patches."""
        return images


def _param_shapes(settings: Settings) -> dict[str, tuple[int, ...]]:
    """`Model(settings)`'s parameter shapes by "/"-joined name (one packed 1 x 1 image)."""
    patch = settings.patch_size**2 * 3
    return param_shapes(Model(settings), settings, images=np.zeros((1, 2, patch), np.uint8))


def params_from(arrays: dict[str, np.ndarray], settings: Settings) -> dict:
    """The parameters of `Model(settings)` (numpy float32) from a checkpoint's `arrays`
    (as `read` gives them), each checked against the shape the model needs.

    Raises:
      KeyError: an array the towers need is missing (its name).
      ValueError: an array of another shape, or one the towers have no place for, naming it.
    """
    arrays = {name: np.asarray(a, np.float32) for name, a in arrays.items() if not name.startswith("config/")}
    shapes, flat = _param_shapes(settings), {}
    for name, path, how, heads in _names(settings):
        for under, value in _to_params(arrays.pop(name), how, heads):
            shape = shapes["/".join((*path, *under))]
            if value.shape != shape and value.size == int(np.prod(shape)) and 1 in (*value.shape, *shape):
                value = value.reshape(shape)
            if value.shape != shape:
                raise ValueError(
                    f"{name} has shape {value.shape}; the towers inferred from the checkpoint need {shape}"
                )
            flat[(*path, *under)] = value
    if arrays:
        raise ValueError(f"{sorted(arrays)[0]} (and {len(arrays) - 1} more) have no place in a SigLIP 2 NaFlex")
    return traverse_util.unflatten_dict(flat)


def arrays_from(params: dict, settings: Settings) -> dict[str, np.ndarray]:
    """transformers' arrays (float32, its names and shapes) of the parameters of
    `Model(settings)`: `params_from`'s inverse, for a trained or fine-tuned model."""
    flat = {path: np.asarray(value, np.float32) for path, value in traverse_util.flatten_dict(params).items()}
    arrays = {}
    for name, path, how, _ in _names(settings):
        value = _to_array(lambda under, path=path: flat[(*path, *under)], how)
        if name.endswith(".qkv.weight") or name.endswith(".qkv.bias"):
            prefix, kind = name.rsplit(".qkv.", 1)
            arrays |= {f"{prefix}.{q}.{kind}": part for q, part in zip(QKV, np.split(value, 3))}
        else:
            arrays[name] = value.reshape(-1, value.shape[-1]) if name.endswith("position_embedding.weight") else value
    arrays["logit_scale"] = arrays["logit_scale"].reshape(1)
    if "logit_bias" in arrays:
        arrays["logit_bias"] = arrays["logit_bias"].reshape(1)
    return {name: np.ascontiguousarray(value) for name, value in arrays.items()}


def _tower_config(tower: TowerSettings) -> dict:
    """A tower's `config.json` entries."""
    return {
        "hidden_size": tower.width,
        "intermediate_size": tower.mlp_dim,
        "num_hidden_layers": tower.depth,
        "num_attention_heads": tower.num_heads,
        "hidden_act": HIDDEN_ACT,
        "layer_norm_eps": big_vision_layout.LAYER_NORM_EPSILON,
    }


def write(path: str, params: dict, settings: Settings) -> None:
    """Writes the parameters of `Model(settings)` as transformers' `model.safetensors`
    at `path` and its `config.json` beside it: `Siglip2Model.from_pretrained(folder)` loads them."""
    from safetensors.numpy import save_file

    if not path.endswith(".safetensors"):
        raise ValueError(f"{path}: transformers' layout is written as .safetensors.")
    save_file(arrays_from(params, settings), path, metadata={"format": "pt"})
    vision = _tower_config(settings.image) | {
        "patch_size": settings.patch_size,
        "num_patches": settings.position_grid**2,
    }
    text = _tower_config(settings.text) | {
        "vocab_size": settings.vocab_size,
        "max_position_embeddings": settings.context_length,
        "projection_size": settings.embed_dim,
    }
    config = {"architectures": ["Siglip2Model"], "model_type": "siglip2", "vision_config": vision, "text_config": text}
    with open(os.path.join(os.path.dirname(os.path.abspath(path)), CONFIG), "w") as f:
        json.dump(config, f, indent=2)
