# python -m contrastive_jax.main --config=configs/finetune_siglip.py --workdir=runs/finetune_siglip
#   with --config.model.init_from=webli_en_b16_224_63724782.npz --config.data.records=data/my_pairs \
#     --config.data.tokenizer=siglip:cc_en.model
"""Fine-tune a released SigLIP or SigLIP 2 (big_vision's `.npz`; B/16, So400m, ...) on your
own image-text records with the global-batch streamed sigmoid loss, the checkpoint's
temperature and bias as the start. Needs an accelerator.

The checkpoint's image size and text length are the config's (`data.image_size`,
`data.text_max_length`: 224 and 64 for the B/16 224 px models); its SentencePiece model
is the tokenizer, used as big_vision does (`siglip:<file>`). `model.embed_dim` is the
model's width (768 for B/16, 1152 for So400m). finetune_clip.py says how to lock the image
tower (LiT) and hold a large batch on one TPU chip; the same fields apply here.
"""

from configs import finetune_clip


def get_config():
    """A released SigLIP, fine-tuned with the sigmoid loss on image-text records."""
    config = finetune_clip.get_config()
    config.data.text_max_length = 64  # SigLIP's text length.
    config.model.embed_dim = 768  # B/16's embedding width (So400m: 1152).
    config.loss.name = "siglip"  # Pairwise sigmoid loss, the checkpoint's bias.
    config.optim.weight_decay = 1e-4  # big_vision's SigLIP fine-tuning weight decay.
    return config
