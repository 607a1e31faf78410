# python -m contrastive_jax.main --config=configs/clip_coco.py --workdir=runs/clip_coco
"""CLIP (Radford et al. 2021) on COCO Captions: a ViT-S/16 image tower and a byte-level
Transformer text tower, image-text retrieval on the 5k Karpathy test split. Needs an
accelerator, and COCO as a record set, written once (the TFDS download needs the network
and `pip install 'contrastive-jax[tfds]'`; ~20 GB of JPEGs as they are):

    for split in train restval test; do
      python -m contrastive_jax.write_records --source=tfds:coco_captions --split=$split \
          --encode=jpeg --out=data/coco_captions
    done

Images are read from disk and decoded per step (at 128 px), so memory does not grow with
the dataset; each image keeps its 5 captions and one is drawn per visit.
"""

from configs import default


def get_config():
    """Image-text contrastive training with the symmetric InfoNCE (CLIP) loss."""
    config = default.get_config()
    config.data.records = "data/coco_captions"  # The record set written above.
    config.data.task = "pairs"  # (image, one of its captions) pairs.
    config.data.train_split = "train+restval"  # Karpathy train (113k images).
    config.data.image_size = 128  # Crops resized to 128 px.
    config.data.text_max_length = 64  # Bytes per caption.
    config.data.num_workers = 4  # Decoding processes.
    config.data.augment.crop_min_area = 0.5  # Mild random resized crops.
    config.data.augment.noise_std = 0.0  # No pixel noise.
    config.model.encoder_a = "vit_small"  # ViT-S.
    config.model.patch_size = 16  # ViT-S/16 (8 x 8 patches at 128 px).
    config.model.encoder_b = "text_transformer"  # Byte-level text Transformer.
    config.model.encoder_dim = 512  # Text Transformer width.
    config.model.text_num_layers = 6  # Text Transformer depth.
    config.model.dropout_rate = 0.0  # No dropout.
    config.model.embed_dim = 512  # Joint embedding width.
    config.model.compute_dtype = "bfloat16"  # bfloat16 activations, float32 loss.
    config.loss.name = "clip"  # Symmetric InfoNCE over the global batch.
    config.optim.learning_rate = 5e-4  # Peak learning rate.
    config.optim.warmup_steps = 2_000  # Linear warmup.
    config.optim.weight_decay = 0.2  # CLIP's weight decay.
    config.train.global_batch_size = 1024  # N.
    config.train.num_train_steps = 30_000  # ~270 epochs of 113k pairs.
    config.train.log_every_steps = 100  # Log every 100 steps.
    config.eval.split = "test"  # Karpathy test (5k images).
    config.eval.every_steps = 5_000  # Image-text retrieval every 5k steps.
    config.checkpoint.every_steps = 5_000  # Save every 5k steps.
    return config
