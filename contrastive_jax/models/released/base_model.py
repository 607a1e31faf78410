"""What every released model shares: `two_tower.TwoTower`'s contract over an image tower
(`img`) and a text tower (`txt`), the learned temperature and bias (`released`'s
docstring). A layout's `Model` gives its towers and its pixel normalisation."""

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from contrastive_jax.embeddings import l2_normalize
from contrastive_jax.models import patch_dropout
from contrastive_jax.models.logit_scale import TEMPERATURE_PARAM
from contrastive_jax.models.transformer import TowerSettings

# The parameters of each tower (`optim.frozen_tower`, layer decay).
TOWER_PARAMS = {"a": ("img",), "b": ("txt",)}
OPEN_CLIP_CONFIG = "open_clip_config.json"  # beside open_clip's weights on Hugging Face


@dataclasses.dataclass(frozen=True)
class TwoTowerSettings:
    """What every released model's architecture has: images `[image_size, image_size, 3]`
    cut into `patch_size` patches, texts of `context_length` ids below `vocab_size`, the
    two towers and the embeddings' width `embed_dim`. The check against the config
    (`released.check_inputs`) reads these."""

    image_size: int
    patch_size: int
    image: TowerSettings
    context_length: int
    vocab_size: int
    text: TowerSettings
    embed_dim: int


class ReleasedTwoTower(nn.Module):
    """Base of the layouts' `Model`s, which define `settings` (with `logit_bias`),
    `patch_dropout` (`patch_dropout.PatchDropout`), `towers()` -> `(image tower, text
    tower)` and `normalize_pixels`; the image tower takes `drop_patches`
    (`patch_dropout.dropper`'s) and applies it after its position embedding."""

    TOWER_PARAMS: ClassVar[dict[str, tuple[str, ...]]] = TOWER_PARAMS

    def towers(self) -> tuple[nn.Module, nn.Module]:
        """The image tower (`[B, H, W, 3]` -> `[B, D]`) and the text tower (`[B, L]` -> `[B, D]`)."""
        raise NotImplementedError

    def normalize_pixels(self, pixels):
        """Images `[B, H, W, 3]` float in [0, 1] as the released model was trained on them."""
        raise NotImplementedError

    def setup(self):
        """The two towers, the log inverse temperature and (SigLIP) the logit bias."""
        self.img, self.txt = self.towers()
        self.log_inv_temperature = self.param(TEMPERATURE_PARAM, nn.initializers.constant(math.log(10.0)), ())
        if self.settings.logit_bias:
            self.logit_bias = self.param("logit_bias", nn.initializers.constant(-10.0), ())

    def __call__(self, a, b=None, *, train: bool = False, patch_keys=None):
        """`two_tower.TwoTower`'s: training with `patch_keys` [B], the image tower drops
        `patch_dropout.rate` of each image's patches (`patch_dropout`)."""
        drop = patch_dropout.dropper(patch_keys if train else None, 0, self.patch_dropout.rate)
        out = {"za": l2_normalize(self.img(self._pixels(a), drop_patches=drop))}
        if b is not None:
            out["zb"] = self.embed(b, "b")
        out["temperature"] = jnp.exp(-self.log_inv_temperature.astype(jnp.float32))
        if self.settings.logit_bias:
            out["bias"] = self.logit_bias.astype(jnp.float32)
        return out

    def embed(self, x, side: str, *, train: bool = False):
        """One tower alone: images `[B, H, W, 3]` uint8 or float in [0, 1] (`side="a"`) or
        ids `[B, L]` (`"b"`) -> `[B, D]` L2-normalised float32."""
        if side == "a":
            return l2_normalize(self.img(self._pixels(x)))
        if side == "b":
            return l2_normalize(self.txt(x))
        raise ValueError(f"side={side!r}: use 'a' (images) or 'b' (texts).")

    def _pixels(self, images):
        """Images `[B, H, W, 3]` uint8 or float in [0, 1], normalised as the model was trained."""
        pixels = images.astype(jnp.float32) / 255.0 if images.dtype == jnp.uint8 else images.astype(jnp.float32)
        return self.normalize_pixels(pixels)


def param_shapes(model, settings, *, images=None) -> dict[str, tuple[int, ...]]:
    """`model`'s parameter shapes by "/"-joined name, for inputs of `settings`' image size
    (or `images` [1, ...], the image tower's input) and text length (abstract: nothing is
    computed); what each layout's `params_from` checks the checkpoint's arrays against."""
    import jax
    import jax.numpy as jnp
    from flax import traverse_util

    if images is None:
        images = jnp.zeros((1, settings.image_size, settings.image_size, 3), jnp.float32)
    texts = jnp.zeros((1, settings.context_length), jnp.int32)
    tree = jax.eval_shape(model.init, jax.random.key(0), images, texts)["params"]
    return {name: leaf.shape for name, leaf in traverse_util.flatten_dict(tree, sep="/").items()}
