"""contrastive_jax.losses: contrastive and metric-learning losses over the global batch.

Arrays are positional, hyperparameters keyword-only; every kernel is a pure ``jnp``
function that jits. Losses that compare examples with each other take ``axis_name``:
inside ``jax.shard_map`` or ``jax.pmap`` over that axis they span the global batch.

Each loss's docstring gives its formula, its arguments' shapes, an example that runs as
a doctest (``pytest`` collects this package's modules with ``--doctest-modules``), and
the paper it comes from.
"""

from contrastive_jax.embeddings import l2_normalize
from contrastive_jax.losses.beyond_batch import dcl_loss, sogclr_init_state, sogclr_loss
from contrastive_jax.losses.candidates import Candidates
from contrastive_jax.losses.classification import (
    binary_cross_entropy,
    focal_loss,
    softmax_cross_entropy,
)
from contrastive_jax.losses.distillation import distill_clip_loss, embedding_distill_loss
from contrastive_jax.losses.loss_types import OWN_PAIR, Loss, LossSettings, LossState
from contrastive_jax.losses.metric import (
    TRIPLET_MINING,
    batch_prototype_cross_entropy_loss,
    contrastive_loss,
    multi_similarity_loss,
    triplet_loss,
)
from contrastive_jax.losses.pairs import contrastive_metrics
from contrastive_jax.losses.proxy import arcface_loss, cosface_loss, proxy_nca_loss
from contrastive_jax.losses.queues import (
    XBM_LOSSES,
    enqueue,
    moco_queue_loss,
    momentum_update,
    xbm_loss,
)
from contrastive_jax.losses.registry import LOSSES, check_candidates
from contrastive_jax.losses.sigmoid import siglip_loss
from contrastive_jax.losses.softmax import (
    clip_loss,
    infonce_loss,
    infonce_loss_floor,
    npairs_loss,
    ntxent_loss,
)
from contrastive_jax.losses.streaming import Streaming
from contrastive_jax.losses.supcon import supcon_loss
from contrastive_jax.losses.weighted_terms import with_terms

__all__ = [
    "Candidates",
    "LOSSES",
    "Loss",
    "LossSettings",
    "LossState",
    "OWN_PAIR",
    "Streaming",
    "TRIPLET_MINING",
    "XBM_LOSSES",
    "arcface_loss",
    "batch_prototype_cross_entropy_loss",
    "binary_cross_entropy",
    "check_candidates",
    "clip_loss",
    "contrastive_loss",
    "contrastive_metrics",
    "cosface_loss",
    "dcl_loss",
    "distill_clip_loss",
    "embedding_distill_loss",
    "enqueue",
    "focal_loss",
    "infonce_loss",
    "infonce_loss_floor",
    "l2_normalize",
    "moco_queue_loss",
    "momentum_update",
    "multi_similarity_loss",
    "npairs_loss",
    "ntxent_loss",
    "proxy_nca_loss",
    "siglip_loss",
    "softmax_cross_entropy",
    "sogclr_init_state",
    "sogclr_loss",
    "supcon_loss",
    "triplet_loss",
    "with_terms",
    "xbm_loss",
]
