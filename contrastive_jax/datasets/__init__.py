"""TFDS builders shipped with the package; importing this registers them with `tfds`."""

from contrastive_jax.datasets.cmudict import Cmudict
from contrastive_jax.datasets.sklearn_digits import SklearnDigits

__all__ = ["Cmudict", "SklearnDigits"]
