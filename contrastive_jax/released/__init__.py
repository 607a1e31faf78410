"""Released CLIP and SigLIP checkpoints as starting points: open_clip's `state_dict` layout
(OpenAI CLIP's names; `.safetensors`, or `.bin`/`.pt` with torch) and big_vision's SigLIP /
SigLIP 2 `.npz` layout, loaded into Flax towers with the project's model contract.

Each layout module (`open_clip_layout`, `big_vision_layout`) gives:

* `read(path) -> dict[str, np.ndarray]`: the checkpoint's arrays by their own names;
* `settings_from(arrays) -> Settings`: the architecture, inferred from the arrays' shapes;
* `Model(settings)`: a Flax module with `models.TwoTower`'s contract -- `__call__(a, b=None,
  *, train=False)` -> `{"za": [B, D], "zb": [B, D], "temperature": (), "bias": ()}` (bias
  with SigLIP only), `embed(x, side)` -> `[B, D]`; `a` images [B, H, W, 3] uint8 or float in
  [0, 1] (normalized inside as the released model was trained), `b` int32 token ids [B, L];
  embeddings L2-normalized float32; the image tower's parameters under `img`, the text
  tower's under `txt`, `log_inv_temperature` (CLIP's `logit_scale`, SigLIP's `t`) and
  `logit_bias` (SigLIP's `b`) at the top;
* `params_from(arrays, settings)`: the parameter tree of `Model(settings)`.
"""

import dataclasses
import functools
import os
from typing import Any

from contrastive_jax.config_lib import ConfigError
from contrastive_jax.released.two_tower import TOWER_PARAMS  # noqa: F401  (re-exported)


@dataclasses.dataclass(frozen=True, eq=False)
class Released:
    """A released checkpoint, loaded: the Flax `model`, its `params` (numpy) and the
    architecture `settings` inferred from the file."""

    model: Any
    params: Any
    settings: Any


def _layout(path: str):
    from contrastive_jax.released import big_vision_layout, open_clip_layout

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
    `.pt`), read once per process; `quick_gelu` selects OpenAI CLIP's activation (open_clip
    only: OpenAI's weights and the `-quickgelu` models).

    Raises:
      ConfigError: a missing file, or one of neither layout.
    """
    if not os.path.exists(path):
        raise ConfigError(f"config.model.init_from={path!r} does not exist; give a released checkpoint's path.")
    layout = _layout(path)
    arrays = layout.read(path)
    options = {"activation": "quick_gelu"} if quick_gelu else {}
    if quick_gelu and layout.__name__.endswith("big_vision_layout"):
        raise ConfigError("config.model.quick_gelu=True is for open_clip checkpoints; SigLIP uses GELU: set it False.")
    settings = layout.settings_from(arrays, **options)
    return Released(layout.Model(settings), layout.params_from(arrays, settings), settings)


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
