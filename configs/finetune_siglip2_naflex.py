# python -m contrastive_jax.main --config=configs/finetune_siglip2_naflex.py --workdir=runs/finetune_siglip2_naflex
#   with --config.model.init_from=siglip2-base-patch16-naflex/model.safetensors --config.data.records=data/my_pairs \
#     --config.data.tokenizer=siglip2:siglip2-base-patch16-naflex/tokenizer.model
"""Fine-tune a released SigLIP 2 NaFlex (transformers' `google/siglip2-base-patch16-naflex`:
its `model.safetensors` with the `config.json` beside it) on your own image-text records,
each image at its own aspect ratio: resized so that its grid of 16-pixel patches keeps the
aspect within a budget of `data.max_num_patches` tokens (256 here, as the checkpoint's
processor; SigLIP 2 trained at 256 to 1024), padded to the budget and masked. The
sigmoid loss, the checkpoint's temperature and bias as the start. Needs an accelerator.

The tokenizer is SigLIP 2's Gemma SentencePiece model (`tokenizer.model` in the same
repository) as big_vision tokenizes it (`siglip2:<file>`); the text length is 64.
finetune_clip.py says how to lock the image tower (LiT) and hold a large batch on one
TPU chip; the same fields apply here.
"""

from configs import finetune_siglip


def get_config():
    """A released SigLIP 2 NaFlex, fine-tuned with the sigmoid loss on native-aspect images."""
    config = finetune_siglip.get_config()
    config.data.image_size = None  # No square resize: each image keeps its aspect ratio.
    config.data.max_num_patches = 256  # NaFlex's token budget (576 or 1024: more detail, more compute).
    config.data.augment.crop_min_area = 1.0  # No crops: the whole image at its aspect ratio.
    config.data.augment.flip = True  # Random horizontal flips.
    config.model.patch_size = 16  # The checkpoint's patch size (B/16).
    return config
