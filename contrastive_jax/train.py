"""The old path of the training loop's entry (`train_and_evaluate`, now in
`contrastive_jax.training.run_plan`), kept for one release: importing it warns and gives
that module itself."""

import sys
import warnings

from contrastive_jax.training import run_plan

warnings.warn(
    "contrastive_jax.train moved to contrastive_jax.training.run_plan; this alias goes in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = run_plan
