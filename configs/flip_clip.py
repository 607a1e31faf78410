# python -m contrastive_jax.main --config=configs/flip_clip.py --workdir=runs/flip_clip
"""FLIP (Li et al. 2023, "Scaling Language-Image Pre-training via Masking") on the
generated image-text set: CLIP (configs/clip_shapes.py) with half of each picture's
patches dropped while training, so the image tower runs on 32 of its 64 patches, then a
short unmasked tuning at the end with every patch kept, as FLIP's recipe does.

Patch dropout is never applied at evaluation, in `contrastive_jax.trained` or in an
export. What it saves in step time and memory: experiments/bench/bench_patch_dropout.py
(docs/performance.md).
"""

from configs import clip_shapes


def get_config():
    """CLIP with patch dropout, then unmasked tuning (FLIP)."""
    config = clip_shapes.get_config()
    config.model.patch_dropout = 0.5  # Drop half of each picture's patches while training.
    config.model.patch_dropout_until_step = 1_800  # The last 200 of 2,000 steps (10%) tune unmasked.
    return config
