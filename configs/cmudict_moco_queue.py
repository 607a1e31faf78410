# python -m contrastive_jax.main --config=configs/cmudict_moco_queue.py --workdir=runs/cmudict_moco_queue
"""A MoCo queue on the CMU Pronouncing Dictionary: 16 earlier batches as negatives.

`configs/cmudict_clip.py` with, for each tower, a queue of the last K = 65,536 keys
of the other tower (He et al., CVPR 2020): each spelling is scored against its own
pronunciation and the 65,536 queued ones, and back. The keys come from a momentum
encoder (an exponential moving average of the towers, m = 0.99: a run of 594 steps
is short for MoCo's 0.999). The queues are split over the devices (2 MiB per device
each) and streamed in tiles of 512.
"""

from configs import cmudict_clip


def get_config():
    """cmudict_clip with MoCo queues and a momentum encoder."""
    config = cmudict_clip.get_config()
    config.loss.name = "moco_queue"  # InfoNCE against a queue of earlier keys, both ways.
    config.loss.queue_size = 65536  # K = 16 global batches.
    config.loss.queue_momentum = 0.99  # Keys from the towers' moving average.
    config.loss.chunk_size = "auto"  # Stream the [B, K] logits in tiles.
    return config
