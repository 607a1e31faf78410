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

The package's face: `load`, `save`, `check_inputs` and the rest are defined in modules of
one job each -- `loading` (reading a checkpoint), `layouts` (a path's or a model's
layout, `describe`/`rebuild`, `save`), `input_checks` (the config against the towers),
`base_model` (what every layout's `Model` shares).
"""

from contrastive_jax.models.released.base_model import OPEN_CLIP_CONFIG, TOWER_PARAMS
from contrastive_jax.models.released.input_checks import check_inputs
from contrastive_jax.models.released.layouts import describe, rebuild, save
from contrastive_jax.models.released.loading import QUICK_GELU_MODELS, Released, load, quick_gelu_from

__all__ = [
    "load",
    "Released",
    "check_inputs",
    "save",
    "quick_gelu_from",
    "describe",
    "rebuild",
    "QUICK_GELU_MODELS",
    "OPEN_CLIP_CONFIG",
    "TOWER_PARAMS",
]
