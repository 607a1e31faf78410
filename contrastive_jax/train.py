"""The old path of `contrastive_jax.training.loop` (`train_and_evaluate`), kept for one
release: importing it warns and gives that module itself."""

import sys
import warnings

from contrastive_jax.training import loop

warnings.warn(
    "contrastive_jax.train moved to contrastive_jax.training.loop; this alias goes in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = loop
