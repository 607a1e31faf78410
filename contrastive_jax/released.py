"""The old path of `contrastive_jax.models.released` (`load`, `save`, the open_clip and
big_vision layouts), kept for one release: importing it warns and gives that package
itself."""

import sys
import warnings

from contrastive_jax.models import released

warnings.warn(
    "contrastive_jax.released moved to contrastive_jax.models.released; this alias goes in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = released
