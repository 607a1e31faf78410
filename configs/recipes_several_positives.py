# python -m contrastive_jax.main --config=configs/recipes_several_positives.py --workdir=runs/recipes_several_positives
"""Several positives: CLIP on the generated image-text set (configs/clip_shapes.py) with 4
captions of each picture in a batch, the picture's 4 pairs counted as positives of each
other (SupCon's mean form over the positives, Khosla et al. 2020; UniCL, Yang et al.
2022) instead of as negatives. `loss.positives="log_sum"` takes MIL-NCE's log-sum form
(Miech et al. 2020); `loss.name="siglip"` labels the pairs +1.

The data side (`config.data.captions_per_image`, docs/own_data.md) gives each of a
picture's rows its `index`; with `config.loss.positives` set, the loss reads it as
`positive_ids` (docs/losses.md, "Several positives"). `loss.positives="own"` is refused
with k > 1. A picture's 4 rows hold one image embedding (the picture and its
augmentation repeated, no dropout here), and then the mean form equals plain CLIP on the
4 pairs, value and gradient: what changes is the batch (4 captions of 64 pictures, not 1
of 256); the log-sum form and SigLIP's change the loss too (docs/recipes.md). It goes
with gradient caching, FSDP, a streamed loss, a batch schedule and the noise scale, exact
(docs/training.md, "Recipes with the large-batch tools").
"""

from configs import clip_shapes


def get_config():
    """CLIP with an image's 4 captions in a batch as 4 positives."""
    config = clip_shapes.get_config()
    config.data.captions_per_image = 4  # k: each picture brings 4 of its captions (the shapes have 4).
    config.loss.name = "clip"  # "siglip": the pairs sharing a picture labelled +1.
    config.loss.positives = "mean_log_prob"  # Pairs sharing a picture are positives (SupCon's mean form).
    config.train.global_batch_size = 256  # N: 64 pictures x 4 captions.
    return config
