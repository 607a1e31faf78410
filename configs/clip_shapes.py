# python -m contrastive_jax.main --config=configs/clip_shapes.py --workdir=runs/clip_shapes
"""CLIP on the generated image-text set (`shapes`: 1-3 coloured shapes per picture, with
captions that name their counts, kinds, colours, sizes and positions): a ViT-tiny image
tower and a byte-level Transformer text tower, image-text retrieval on its test split.

The set is written on first use (10,000 pictures at 64 px, from a seed, ~1 minute);
for a larger one, write it yourself and point `config.data.records` at it:

    python -m contrastive_jax.write_records --source=builtin:shapes --num-examples=1000000 \\
        --image-size=128 --encode=jpeg --workers=8 --out=data/shapes_1m
"""

from configs import default


def get_config():
    """Image-text contrastive training on generated pictures."""
    config = default.get_config()
    config.data.name = "shapes"  # The generated image-text set (data/settings.py: BUILTIN).
    config.data.task = "pairs"  # (image, one of its captions) pairs.
    config.data.image_size = 64  # The pictures' size.
    config.data.text_max_length = 96  # Bytes per caption.
    config.data.augment.noise_std = 0.0  # No pixel noise.
    config.data.num_workers = 1  # One decoding process beside the trainer.
    config.model.encoder_a = "vit_tiny"  # ViT-Ti.
    config.model.patch_size = 8  # 8 x 8 patches of 64 px.
    config.model.encoder_b = "text_transformer"  # Byte-level Transformer.
    config.model.encoder_dim = 192  # Text Transformer width.
    config.model.text_num_layers = 4  # Text Transformer depth.
    config.model.dropout_rate = 0.0  # No dropout.
    config.model.embed_dim = 128  # Joint embedding width.
    config.loss.name = "clip"  # Symmetric InfoNCE over the global batch.
    config.optim.learning_rate = 1e-3  # Peak learning rate.
    config.optim.weight_decay = 0.05  # Decoupled weight decay.
    config.train.global_batch_size = 256  # N.
    config.train.num_train_steps = 2_000  # ~57 epochs of 9,000 pictures.
    config.train.log_every_steps = 100  # Log every 100 steps.
    config.eval.every_steps = 1_000  # Retrieval every 1k steps.
    config.eval.linear_probe = False  # Retrieval metrics only.
    config.eval.knn_k = 0  # No kNN probe.
    return config
