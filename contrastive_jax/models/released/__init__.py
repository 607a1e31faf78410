"""Released CLIP and SigLIP checkpoints as starting points: open_clip's `state_dict` layout
(OpenAI CLIP's names; `.safetensors`, or `.bin`/`.pt` with torch) and big_vision's SigLIP /
SigLIP 2 `.npz` layout, loaded into Flax towers with the project's model contract.

Each layout module (`open_clip_layout`, `big_vision_layout`) gives:

* `read(path) -> dict[str, np.ndarray]`: the checkpoint's arrays by their own names;
* `settings_from(arrays) -> Settings`: the architecture, inferred from the arrays' shapes;
* `Model(settings)`: a Flax module with `two_tower.TwoTower`'s contract -- `__call__(a, b=None,
  *, train=False)` -> `{"za": [B, D], "zb": [B, D], "temperature": (), "bias": ()}` (bias
  with SigLIP only), `embed(x, side)` -> `[B, D]`; `a` images [B, H, W, 3] uint8 or float in
  [0, 1] (normalized inside as the released model was trained), `b` int32 token ids [B, L];
  embeddings L2-normalized float32; the image tower's parameters under `img`, the text
  tower's under `txt`, `log_inv_temperature` (CLIP's `logit_scale`, SigLIP's `t`) and
  `logit_bias` (SigLIP's `b`) at the top;
* `params_from(arrays, settings)`: the parameter tree of `Model(settings)`;
* `arrays_from(...)` and `write(path, params, settings)`: the way back, a trained or
  fine-tuned model's parameters as the layout's file (`save`).

**QuickGELU.** OpenAI's CLIP weights and the open_clip models trained like them use
OpenAI's `x * sigmoid(1.702 x)` in place of GELU; the arrays do not say it, and the
wrong activation gives plausible, wrong embeddings. `load` takes it from the checkpoint
where open_clip says it: `open_clip_config.json` beside the file (`model_cfg.quick_gelu`,
as the Hugging Face repositories hold it), else a path that names a `-quickgelu` model or
one of `QUICK_GELU_MODELS` (open_clip's own list of pretrained weights that need it:
OpenAI's, MetaCLIP's, Apple's DFN, LAION-400M's ViT-B/32); else GELU, unless
`quick_gelu=True` forces it.
"""

import dataclasses
import functools
import json
import os
from typing import Any

from contrastive_jax.errors import ConfigError
from contrastive_jax.models.released.two_tower import (  # noqa: F401  (re-exported)
    OPEN_CLIP_CONFIG,
    TOWER_PARAMS,
    param_shapes,
)

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


def _layout(path: str):
    from contrastive_jax.models.released import big_vision_layout, open_clip_layout

    if path.endswith(".npz"):
        return big_vision_layout
    if open_clip_layout.is_checkpoint(path):
        return open_clip_layout
    raise ConfigError(
        f"config.model.init_from={path!r}: not a released checkpoint; use big_vision's .npz (SigLIP) "
        "or open_clip's .safetensors / .bin (CLIP)."
    )


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
    layout = _layout(path)
    is_big_vision = layout.__name__.endswith("big_vision_layout")
    if quick_gelu and is_big_vision:
        raise ConfigError("config.model.quick_gelu=True is for open_clip checkpoints; SigLIP uses GELU: set it False.")
    arrays = _read(layout, path)
    options = {} if is_big_vision else {"activation": "quick_gelu" if quick_gelu or quick_gelu_from(path) else "gelu"}
    try:
        settings = layout.settings_from(arrays, **options)
        params = layout.params_from(arrays, settings)
    except (KeyError, ValueError) as e:
        problem = f"{e.args[0]} is not in the checkpoint" if isinstance(e, KeyError) else str(e)
        raise ConfigError(f"{path}: {problem}") from None
    return Released(layout.Model(settings), params, settings)


def save(path: str, model, params) -> None:
    """Writes a model of a released layout (`load`'s `model`, or a run's fine-tuned from
    it: `trained.load(workdir)`'s `model` and `variables["params"]`) back to that layout:
    open_clip's `state_dict` as `.safetensors` (open_clip loads it), big_vision's `.npz`.

    Raises:
      ConfigError: `model` is not a released layout's, or `path`'s suffix is not its.
    """
    layout = _layout_of(model)
    if layout is None:
        raise ConfigError(f"{type(model).__name__} is not a released layout's model; nothing to write to {path}.")
    try:
        layout.write(path, params, model.settings)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _layouts() -> dict[str, Any]:
    """The layout modules by their names."""
    from contrastive_jax.models.released import big_vision_layout, open_clip_layout

    return {"open_clip_layout": open_clip_layout, "big_vision_layout": big_vision_layout}


def _layout_of(model):
    """The layout module whose `Model` `model` is, or None."""
    return next((layout for layout in _layouts().values() if type(model) is layout.Model), None)


def describe(model) -> dict[str, Any] | None:
    """A released layout's model as JSON values, `{"layout": name, "settings": {...}}`
    (its architecture, `Settings`); None for a model of no released layout."""
    layout = _layout_of(model)
    if layout is None:
        return None
    return {"layout": layout.__name__.rsplit(".", 1)[-1], "settings": dataclasses.asdict(model.settings)}


def rebuild(description: dict[str, Any]):
    """The released layout's `Model` that `describe` described (default tower options)."""
    from contrastive_jax.models.transformer import TowerSettings

    layout = _layouts()[description["layout"]]
    values = dict(description["settings"])
    towers = {name: TowerSettings(**values[name]) for name in ("image", "text")}
    return layout.Model(layout.Settings(**{**values, **towers}))


def _read(layout, path: str) -> dict:
    """`layout.read(path)`; a file it cannot read is a ConfigError naming it."""
    try:
        return layout.read(path)
    except ImportError as e:
        raise ConfigError(f"reading {path} needs {e.name}: pip install {e.name}.") from None
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


def check_inputs(
    settings, *, image_size: int | None, text_length: int, vocab_size: int, embed_dim: int, learned_bias: bool
) -> None:
    """That the config feeds the released towers what they were built for: the image
    size, caption length and tokenizer vocabulary of the inputs, the embedding width the
    loss is told (`embed_dim`) and, for SigLIP's loss (`learned_bias`), a learned bias.

    Raises:
      ConfigError: the first that differs, naming the config field and the value to set.
    """
    wanted = {
        "config.data.image_size": (image_size, settings.image_size),
        "config.data.text_max_length": (text_length, settings.context_length),
        "config.model.embed_dim": (embed_dim, settings.embed_dim),
    }
    for field, (value, needed) in wanted.items():
        if value != needed:
            raise ConfigError(f"{field}={value}; the released model ({settings.__class__.__module__}) takes {needed}.")
    if vocab_size != settings.vocab_size:
        raise ConfigError(
            f"config.data.tokenizer gives {vocab_size} ids; the released text tower embeds {settings.vocab_size}: "
            "use the model's own tokenizer (CLIP: open_clip's bpe_simple_vocab_16e6.txt.gz; SigLIP: "
            "siglip:<its SentencePiece .model>)."
        )
    if learned_bias and not settings.logit_bias:
        raise ConfigError(
            "config.loss.name='siglip' needs a learned logit bias, which this released model has not: "
            "fine-tune it with config.loss.name='clip'."
        )
