# python -m contrastive_jax.main --config=configs/coca_shapes.py --workdir=runs/coca_shapes
"""CoCa (Yu et al. 2022, "CoCa: Contrastive Captioners are Image-Text Foundation Models",
as open_clip builds it; models/coca.py) on the generated image-text set: `clip_shapes.py`'s
ViT-tiny image tower pooled by attention, its byte-level text Transformer as the
unimodal text tower, and a multimodal decoder that learns to caption the pictures: the
contrastive loss plus twice the teacher-forced next-byte cross-entropy (open_clip's
CoCa weights). A trained run captions pictures with `trained.load(workdir).caption(...)`
(docs/recipes.md, "CoCa").
"""

from configs import clip_shapes


def get_config():
    """CoCa on generated pictures: contrastive and captioning losses together."""
    config = clip_shapes.get_config()
    config.model.decoder_depth = 2  # The multimodal decoder's blocks (open_clip's coca_ViT-B-32: 12).
    config.model.coca_queries = 65  # Pooling queries: 1 for the embedding, 64 image tokens for the decoder.
    config.model.embed_dim = 192  # The text Transformer's width, as open_clip's CoCa has them equal.
    config.loss.caption_weight = 2.0  # The captioning term's weight (open_clip's --coca-caption-loss-weight).
    return config
