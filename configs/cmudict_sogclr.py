# python -m contrastive_jax.main --config=configs/cmudict_sogclr.py --workdir=runs/cmudict_sogclr
"""SogCLR's global contrastive objective on the CMU Pronouncing Dictionary, small batch.

`configs/cmudict_clip.py` at N = 1,024 instead of 4,096, the same 20 epochs: SogCLR
(Yuan et al., ICML 2022) keeps, for every one of the 121,490 training pairs and each
direction, a moving average u of its negatives' mean exp(s / T) (the state, 0.9 MiB,
checkpointed), so the gradient estimates the objective over all training negatives
rather than the batch's. Compare with `--config.loss.name=clip` at the same N.
"""

from configs import cmudict_clip

GLOBAL_BATCH = 1024


def get_config():
    """cmudict_clip with SogCLR at N = 1,024."""
    config = cmudict_clip.get_config()
    config.loss.name = "sogclr"  # Global contrastive loss with per-example state u.
    config.loss.sogclr_gamma = 0.9  # Moving-average rate of u (the paper's).
    config.loss.sogclr_table_size = 0  # One row per training pair (the split's size).
    config.train.global_batch_size = GLOBAL_BATCH  # N: a small batch.
    config.train.num_train_steps = -(  # 20 epochs (2,373 steps).
        -cmudict_clip.EPOCHS * cmudict_clip.TRAIN_PAIRS // GLOBAL_BATCH
    )
    config.optim.learning_rate = 1.5e-3  # Half cmudict_clip's peak for a batch 4x smaller.
    config.optim.warmup_steps = 120  # About one epoch.
    config.checkpoint.every_steps = 400  # Save every 400 steps.
    return config
