# python -m contrastive_jax.main --config=configs/siglip_coco.py --workdir=runs/siglip_coco
"""SigLIP (Zhai et al. 2023) on COCO Captions: clip_coco.py with the pairwise sigmoid
loss, 1/temperature initialised at 10 and the logit bias at -10."""

from configs import clip_coco


def get_config():
    """clip_coco with the sigmoid loss."""
    config = clip_coco.get_config()
    config.loss.name = "siglip"  # Pairwise sigmoid loss.
    config.loss.temperature = 0.1  # SigLIP's initial 1/temperature = 10.
    config.loss.siglip_bias = -10.0  # SigLIP's initial logit bias.
    return config
