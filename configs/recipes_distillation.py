# python -m contrastive_jax.main --config=configs/recipes_distillation.py --workdir=runs/recipes_distillation
"""Distillation from a teacher (open_clip's `DistillClipLoss`; TinyCLIP, Wu et al. 2023;
MobileCLIP, Vasu et al. 2024): a smaller student trained on the CLIP loss plus the
cross-entropy of its softmaxes over the global batch against a frozen teacher's, both
directions. The teacher is a trained run (or a released checkpoint's path); train it
first with configs/clip_shapes.py:

    python -m contrastive_jax.main --config=configs/clip_shapes.py --workdir=runs/clip_shapes

Each step embeds the batch with the teacher too, without gradient (training/forward.py),
and the distillation loss is streamed like the CLIP loss (`config.loss.chunk_size`,
`collective`): neither N x N matrix is held. It goes with gradient caching, FSDP (the
teacher's variables split like the student's), a batch schedule and the noise scale
(docs/training.md, "Recipes with the large-batch tools"). `loss.distill_form = "mse"` or
"cosine" pulls each embedding to the teacher's instead, through a learned map where the
widths differ (docs/recipes.md, "Distillation from a teacher").
"""

from configs import clip_shapes


def get_config():
    """A half-width student distilled from configs/clip_shapes.py's run."""
    config = clip_shapes.get_config()
    config.model.encoder_dim = 96  # Text Transformer width: half the teacher's.
    config.model.text_num_layers = 2  # Text Transformer depth: half the teacher's.
    config.model.embed_dim = 64  # Joint embedding width: half the teacher's (the logit form takes any).
    config.loss.teacher = "runs/clip_shapes"  # The teacher: configs/clip_shapes.py's run (above).
    config.loss.distill_weight = 1.0  # open_clip's weight: CLIP loss + distillation, equally.
    config.loss.distill_form = "logits"  # The softmaxes over the global batch, rows and columns.
    return config
