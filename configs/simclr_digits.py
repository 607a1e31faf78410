# python -m contrastive_jax.main --config=configs/simclr_digits.py --workdir=runs/simclr_digits
"""SimCLR on the digits: two random augmentations of each image, NT-Xent, one shared CNN.

Evaluated by kNN and a linear probe on the test split's (unaugmented) embeddings.
"""

from configs import default


def get_config():
    """The default config turned into SimCLR: task "views", tied towers, NT-Xent."""
    config = default.get_config()
    config.data.task = "views"  # Two augmentations of one image.
    config.data.augment.crop_min_area = 0.6  # Random resized crops keep >= 60% of the image.
    config.data.augment.color_jitter = 0.4  # Brightness / contrast jitter.
    config.data.augment.noise_std = 0.1  # Pixel noise.
    config.model.encoder_a = "cnn"  # Small CNN on the whole 8x8 image.
    config.model.encoder_b = "cnn"  # Unused: the towers are tied.
    config.model.tie_towers = True  # One encoder and head embed both views.
    config.model.dropout_rate = 0.0  # The augmentations regularise.
    config.model.projection_hidden_dims = (128,)  # SimCLR's MLP projection head.
    config.loss.name = "ntxent"  # NT-Xent over the 2N views.
    config.loss.temperature = 0.2  # Fixed, as in SimCLR.
    config.loss.learn_temperature = False  # Keep the temperature fixed.
    config.train.num_train_steps = 1500  # ~270 epochs of 1,437 images at batch 256.
    return config
