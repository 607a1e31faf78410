# python -m contrastive_jax.main --config=configs/simclr_cifar10.py --workdir=runs/simclr_cifar10
"""SimCLR (Chen et al. 2020) on CIFAR-10 with a ResNet-18 (CIFAR stem). An accelerator
is advisable. CIFAR-10 as a record set, written once (the TFDS download needs the
network and `pip install 'contrastive-jax[tfds]'`):

    for split in train test; do
      python -m contrastive_jax.write_records --source=tfds:cifar10 --split=$split --out=data/cifar10
    done
"""

from configs import default


def get_config():
    """SimCLR's CIFAR-10 recipe: LARS, batch 512, NT-Xent at temperature 0.5."""
    config = default.get_config()
    config.data.records = "data/cifar10"  # The record set written above.
    config.data.num_workers = 2  # Decoding processes.
    config.data.task = "views"  # Two augmentations of one image.
    config.data.augment.crop_min_area = 0.08  # SimCLR's random resized crop.
    config.data.augment.flip = True  # Horizontal flips.
    config.data.augment.color_jitter = 0.5  # Colour distortion strength.
    config.data.augment.noise_std = 0.0  # No pixel noise.
    config.model.encoder_a = "resnet18"  # ResNet-18 with the CIFAR stem.
    config.model.encoder_b = "resnet18"  # Unused: the towers are tied.
    config.model.tie_towers = True  # One encoder and head embed both views.
    config.model.dropout_rate = 0.0  # No dropout in a ResNet.
    config.model.projection_hidden_dims = (2048,)  # SimCLR's projection MLP.
    config.model.embed_dim = 128  # Projection output.
    config.model.compute_dtype = "bfloat16"  # bfloat16 activations, float32 loss.
    config.loss.name = "ntxent"  # NT-Xent over the 2N views.
    config.loss.temperature = 0.5  # SimCLR's CIFAR temperature.
    config.loss.learn_temperature = False  # Fixed.
    config.optim.name = "lars"  # LARS, as in SimCLR.
    config.optim.learning_rate = 0.6  # 0.3 x batch / 256.
    config.optim.warmup_steps = 980  # 10 epochs.
    config.optim.weight_decay = 1e-6  # SimCLR's weight decay.
    config.optim.grad_clip_norm = 0.0  # No clipping.
    config.train.global_batch_size = 512  # N.
    config.train.num_train_steps = 97_600  # 1,000 epochs of 50,000 images.
    config.train.log_every_steps = 100  # Log every 100 steps.
    config.eval.every_steps = 5_000  # kNN / linear probe every 5k steps.
    config.eval.knn_k = 200  # kNN with 200 neighbours.
    config.checkpoint.every_steps = 5_000  # Save every 5k steps.
    return config
