# python -m contrastive_jax.main --config=configs/dml_digits_xbm.py --workdir=runs/dml_digits_xbm
"""Cross-batch memory (XBM) for metric learning on the class-disjoint digits split.

XBM (Wang et al., CVPR 2020) needs a label-based loss, and cmudict has no class labels
(only word and pronunciation ids, which group a handful of pairs), so it runs on the
digits: `configs/dml_digits.py`'s multi-similarity loss, each anchor also compared
with the last M = 480 embeddings (10 batches) of earlier steps after 100 warm-up steps.
"""

from configs import dml_digits


def get_config():
    """dml_digits with a cross-batch memory."""
    config = dml_digits.get_config()
    config.loss.name = "xbm"  # A label-based loss over the batch and the memory.
    config.loss.xbm_loss = "multi_similarity"  # The base loss (losses.XBM_LOSSES).
    config.loss.xbm_memory_size = 480  # M: the last 10 global batches of 48.
    config.loss.xbm_warmup_steps = 100  # The memory joins after 100 steps.
    return config
