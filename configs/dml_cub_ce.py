# python -m contrastive_jax.main --config=configs/dml_cub_ce.py --workdir=runs/dml_cub_ce
"""Metric learning on CUB-200-2011 with plain cross-entropy (Boudiaf et al. 2020, "A
unifying mutual information view of metric learning: cross-entropy vs. pairwise losses"):
a ResNet-50 with a linear classifier and label smoothing on classes 0-99, retrieval
among the unseen classes 100-199 (Recall@K, MAP@R). Needs an accelerator, and CUB as a
record set, written once (the TFDS download needs the network and
`pip install 'contrastive-jax[tfds]'`):

    for split in train test; do
      python -m contrastive_jax.write_records --source=tfds:caltech_birds2011 --split=$split \
          --encode=jpeg --out=data/cub
    done
"""

from configs import default


def get_config():
    """Softmax cross-entropy with label smoothing on the first 100 CUB classes."""
    config = default.get_config()
    config.data.records = "data/cub"  # The record set written above.
    config.data.num_workers = 2  # Decoding processes.
    config.data.task = "labeled"  # Images with labels.
    config.data.train_split = "train+test"  # All images; classes split below.
    config.data.train_class_range = (0, 100)  # Train on classes 0-99.
    config.data.image_size = 224  # Crops resized to 224 px.
    config.data.examples_per_class = 2  # m: 64 classes x 2 per batch of 128.
    config.data.augment.crop_min_area = 0.16  # Random resized crops.
    config.data.augment.flip = True  # Horizontal flips.
    config.data.augment.noise_std = 0.0  # No pixel noise.
    config.model.encoder_a = "resnet50"  # ResNet-50 (from scratch: no pretrained weights).
    config.model.dropout_rate = 0.0  # No dropout.
    config.model.embed_dim = 512  # Embedding width.
    config.model.num_classes = 100  # Classifier over the training classes.
    config.model.compute_dtype = "bfloat16"  # bfloat16 activations, float32 loss.
    config.loss.name = "softmax_ce"  # Cross-entropy on the classifier's logits.
    config.loss.label_smoothing = 0.1  # Boudiaf et al.'s label smoothing.
    config.optim.learning_rate = 1e-4  # Peak learning rate (Adam family).
    config.optim.weight_decay = 5e-4  # Weight decay.
    config.optim.warmup_steps = 500  # Linear warmup.
    config.train.global_batch_size = 128  # N.
    config.train.num_train_steps = 10_000  # ~220 epochs of 5,864 images.
    config.train.log_every_steps = 100  # Log every 100 steps.
    config.eval.split = "train+test"  # Evaluated among ...
    config.eval.class_range = (100, 200)  # ... the unseen classes 100-199.
    config.eval.every_steps = 2_000  # Retrieval every 2k steps.
    config.eval.linear_probe = False  # Classes are disjoint: retrieval metrics only.
    config.checkpoint.every_steps = 2_000  # Save every 2k steps.
    return config
