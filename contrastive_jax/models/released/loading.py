"""Reading a released checkpoint: `load` (the file's layout, its arrays, the architecture
they make and the Flax model), with QuickGELU taken from the checkpoint where open_clip
says it (`quick_gelu_from`, `QUICK_GELU_MODELS`) and a damaged or foreign file as one
line naming it."""

import dataclasses
import functools
import json
import os
from typing import Any

from contrastive_jax.errors import ConfigError
from contrastive_jax.models.released.base_model import OPEN_CLIP_CONFIG
from contrastive_jax.models.released.layouts import layout_for_path

# The Hugging Face repositories of the classic-ViT open_clip weights that need QuickGELU
# (open_clip 3.3.0's `pretrained` registry, `quick_gelu=True`), as a path names them.
QUICK_GELU_MODELS = (
    "vit_base_patch32_clip_224.openai",
    "vit_base_patch16_clip_224.openai",
    "vit_large_patch14_clip_224.openai",
    "vit_large_patch14_clip_336.openai",
    "vit_base_patch32_clip_224.laion400m_e31",
    "vit_base_patch32_clip_224.laion400m_e32",
    "vit_base_patch32_clip_224.metaclip_400m",
    "vit_base_patch32_clip_224.metaclip_2pt5b",
    "vit_base_patch16_clip_224.metaclip_400m",
    "vit_base_patch16_clip_224.metaclip_2pt5b",
    "vit_large_patch14_clip_224.metaclip_400m",
    "vit_large_patch14_clip_224.metaclip_2pt5b",
    "vit_huge_patch14_clip_224.metaclip_2pt5b",
    "vit_huge_patch14_clip_224.metaclip2_worldwide",
    "vit_gigantic_patch14_clip_224.metaclip_2pt5b",
    "DFN2B-CLIP-ViT-B-16",
    "DFN2B-CLIP-ViT-L-14",
    "DFN5B-CLIP-ViT-H-14",
    "DFN5B-CLIP-ViT-H-14-378",
)


@dataclasses.dataclass(frozen=True, eq=False)
class Released:
    """A released checkpoint, loaded: the Flax `model`, its `params` (numpy) and the
    architecture `settings` inferred from the file."""

    model: Any
    params: Any
    settings: Any


@functools.lru_cache(maxsize=2)
def load(path: str, *, quick_gelu: bool = False) -> Released:
    """The released model in `path` (big_vision `.npz`; open_clip `.safetensors`, `.bin`,
    `.pt`), read once per process; its arrays' shapes are checked against the towers
    (the layout's `params_from`).

    open_clip's activation is taken from the checkpoint (`quick_gelu_from`); `quick_gelu`
    forces OpenAI CLIP's. The models that need it: OpenAI's weights (`ViT-B-32`,
    `ViT-B-16`, `ViT-L-14`, `ViT-L-14-336` `openai`), open_clip's `-quickgelu` models,
    MetaCLIP's, Apple's DFN and LAION-400M's ViT-B/32 (`QUICK_GELU_MODELS`).

    Raises:
      ConfigError: one line naming `path`: a missing file, one of neither layout, one
        that cannot be read (truncated, or not what its suffix says), or arrays that do
        not make one model of the layout (a missing array, one of another shape).
    """
    if not os.path.exists(path):
        raise ConfigError(f"config.model.init_from={path!r} does not exist; give a released checkpoint's path.")
    layout = layout_for_path(path)
    is_open_clip = layout.__name__.endswith("open_clip_layout")
    if quick_gelu and not is_open_clip:
        raise ConfigError("config.model.quick_gelu=True is for open_clip checkpoints; SigLIP uses GELU: set it False.")
    arrays = _read(layout, path)
    options = {"activation": "quick_gelu" if quick_gelu or quick_gelu_from(path) else "gelu"} if is_open_clip else {}
    try:
        settings = layout.settings_from(arrays, **options)
        params = layout.params_from(arrays, settings)
    except (KeyError, ValueError) as e:
        problem = f"{e.args[0]} is not in the checkpoint" if isinstance(e, KeyError) else str(e)
        raise ConfigError(f"{path}: {problem}") from None
    return Released(layout.model_for(settings) if is_open_clip else layout.Model(settings), params, settings)


def _read(layout, path: str) -> dict:
    """`layout.read(path)`; a file it cannot read is a ConfigError naming it."""
    try:
        return layout.read(path)
    except ImportError as e:
        raise ConfigError(f"reading {path} needs {e.name}: pip install {e.name}.") from None
    except ConfigError:  # a layout's own message (transformers' config.json beside the weights)
        raise
    except Exception as e:  # noqa: BLE001  safetensors', torch's and zipfile's errors for a damaged file
        detail = (str(e).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"{path} cannot be read ({type(e).__name__}: {detail}): it is truncated or not the file its "
            "suffix says; download it again."
        ) from None


def quick_gelu_from(path: str) -> bool:
    """Whether open_clip says the checkpoint `path` uses QuickGELU: `open_clip_config.json`
    beside it (`model_cfg.quick_gelu`), else a path naming a `-quickgelu` model or one of
    `QUICK_GELU_MODELS` (as Hugging Face's cache, `models--timm--<name>`, holds them)."""
    config = os.path.join(os.path.dirname(os.path.abspath(path)), OPEN_CLIP_CONFIG)
    if os.path.exists(config):
        try:
            with open(config) as f:
                model_cfg = json.load(f).get("model_cfg", {})
        except (OSError, ValueError, AttributeError) as e:
            raise ConfigError(f"{config} is not open_clip's JSON config ({e}).") from None
        if "quick_gelu" in model_cfg:
            return bool(model_cfg["quick_gelu"])
    named = os.path.abspath(path).lower()
    return "quickgelu" in named or any(model.lower() in named for model in QUICK_GELU_MODELS)
