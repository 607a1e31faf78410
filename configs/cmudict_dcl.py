# python -m contrastive_jax.main --config=configs/cmudict_dcl.py --workdir=runs/cmudict_dcl
"""Decoupled contrastive learning (DCL) on the CMU Pronouncing Dictionary.

`configs/cmudict_clip.py` with the positive left out of both softmaxes' denominators
(Yeh et al., ECCV 2022); `--config.loss.dcl_weight_sigma=0.5` gives DCLW.
"""

from configs import cmudict_clip


def get_config():
    """cmudict_clip with the DCL loss."""
    config = cmudict_clip.get_config()
    config.loss.name = "dcl"  # Decoupled contrastive loss, symmetric.
    config.loss.dcl_weight_sigma = None  # None: DCL; 0.5: DCLW's positive weighting.
    return config
