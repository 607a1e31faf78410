# python -m contrastive_jax.main --config=configs/dml_digits.py --workdir=runs/dml_digits
"""Deep metric learning on the class-disjoint digits split: train on 0-5, retrieve 6-9.

Multi-similarity loss by default; compare (Boudiaf et al. 2020: is cross-entropy enough?):
  --config.loss.name=softmax_ce --config.model.num_classes=6
  --config.loss.name=triplet
  --config.loss.name=supcon
Evaluated by leave-one-out Recall@K, MAP@R and R-precision among the unseen classes.
"""

from configs import default


def get_config():
    """The default config turned into metric learning on unseen classes."""
    config = default.get_config()
    config.data.task = "labeled"  # Images with labels, m per class per batch.
    config.data.train_split = "disjoint_train"  # Classes 0-5 (1,083 images).
    config.data.examples_per_class = 8  # m: 6 classes x 8 per batch of 48.
    config.data.augment.noise_std = 0.05  # Light pixel noise.
    config.model.encoder_a = "mlp"  # MLP on the whole 8x8 image.
    config.model.embed_dim = 32  # Embedding width.
    config.loss.name = "multi_similarity"  # Or "softmax_ce" (+ num_classes=6), "triplet", ...
    config.loss.temperature = 0.1  # For "supcon" / "proxy_nca" (learned); unused otherwise.
    config.train.global_batch_size = 48  # 6 classes x 8 examples; 6 per device on 8.
    config.train.num_train_steps = 1000  # ~44 epochs of the 1,083 training images.
    config.optim.learning_rate = 1e-3  # Peak learning rate.
    config.eval.split = "disjoint_test"  # Retrieval among the unseen classes 6-9.
    config.eval.linear_probe = False  # Classes are disjoint: retrieval metrics only.
    return config
