"""The losses the trainer can train with (`config.loss.name`), and what each one reads.

Each entry is a `Loss`: a function of one device's inputs (model outputs and data
fields) and `config.loss`, called inside `jax.shard_map` over `sharding.DATA_AXIS` so that it spans
the global batch, and the set of inputs it reads. The trainer derives its checks from
the inputs (a pair loss needs task "pairs" or "views", a label loss a dataset with
labels, a grouping loss a dataset with id keys, a classifier loss
`config.model.num_classes > 0`, "bias" makes the model learn SigLIP's logit bias), so
adding a loss touches this file only.

Model outputs (see `models.TwoTower`): `za`, `zb` [B, D] L2-normalised; `logits` [B, C]
(classifier head); `temperature`, `bias` scalars and `proxies` [C, D] (replicated).
From the data: `label` [B] int; `groups` [B, K] int, the dataset's id keys
(`input_pipeline.Source.id_keys`: cmudict's word and pronunciation ids), which mark
in-batch false negatives for "clip_masking_false_negatives".

The pair losses "clip", "infonce" and "siglip" also return the in-batch retrieval
metrics (`losses.contrastive_metrics`) from their own statistics, so a train step does
no N^2 work beyond the loss's forward and backward; "ntxent" and "npairs" log no pair
metrics (their statistics are not the a -> b ones, and computing them would cost another
N^2 pass each step). Evaluation (`evaluate.py`) measures retrieval for every loss.

Not registered: `batch_prototype_cross_entropy_loss` needs the number of training
classes, which label-only losses do not configure.
"""

import dataclasses
from collections.abc import Callable, Mapping

import jax
import ml_collections

from contrastive_jax.config_lib import ConfigError
from contrastive_jax.losses.classification import (
    binary_cross_entropy,
    focal_loss,
    softmax_cross_entropy,
)
from contrastive_jax.losses.contrastive import (
    clip_loss,
    infonce_loss,
    npairs_loss,
    ntxent_loss,
    siglip_loss,
    supcon_loss,
)
from contrastive_jax.losses.metric import contrastive_loss, multi_similarity_loss, triplet_loss
from contrastive_jax.losses.proxy import arcface_loss, cosface_loss, proxy_nca_loss
from contrastive_jax.sharding import DATA_AXIS

Outputs = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]
# (one device's model outputs and data fields, config.loss) -> (global loss, metrics).
LossFn = Callable[[Outputs, ml_collections.ConfigDict], tuple[jax.Array, Metrics]]
CLASSIFIER_OUTPUTS = frozenset({"logits", "proxies"})


@dataclasses.dataclass(frozen=True)
class Loss:
    """A trainable loss.

    Attributes:
      fn: returns the scalar loss over the global batch (the same on every device) and
        scalar metrics.
      inputs: the model outputs and data fields (`label`, `groups`) that `fn` reads.
    """

    fn: LossFn
    inputs: frozenset[str]

    @property
    def pairs(self) -> bool:
        """Compares `za` with `zb`: needs two inputs per example."""
        return "zb" in self.inputs

    @property
    def labels(self) -> bool:
        """Needs a dataset with labels."""
        return "label" in self.inputs

    @property
    def groups(self) -> bool:
        """Needs a dataset with id keys (`groups`)."""
        return "groups" in self.inputs

    @property
    def classifier(self) -> bool:
        """Needs the classifier head (`config.model.num_classes > 0`)."""
        return bool(self.inputs & CLASSIFIER_OUTPUTS)

    @property
    def learned_bias(self) -> bool:
        """The model learns a logit bias (SigLIP's)."""
        return "bias" in self.inputs


def _streamed_pair_loss(loss_fn, metrics: bool = True, **extra: str) -> Loss:
    """A softmax / sigmoid pair loss with its streaming options; `extra` maps its
    keyword arguments to the inputs passed to them (SigLIP's `bias="bias"`). With
    `metrics`, the loss returns the in-batch retrieval metrics
    (`losses.contrastive_metrics`) from its own statistics (`return_metrics=True`): no
    N^2 work beyond the loss's forward and backward."""

    def fn(o, c):
        result = loss_fn(
            o["za"],
            o["zb"],
            temperature=o["temperature"],
            axis_name=DATA_AXIS,
            chunk_size=c.chunk_size,
            collective=c.collective,
            **{argument: o[name] for argument, name in extra.items()},
            **({"return_metrics": True} if metrics else {}),
        )
        return result if metrics else (result, {})

    return Loss(fn, frozenset({"za", "zb", "temperature", *extra.values()}))


def _label_loss(value_fn, *outputs: str) -> Loss:
    """A loss spanning the global batch by itself (`axis_name`), on `za` and labels:
    `value_fn(o, y, c)` with `y = o["label"]`."""
    return Loss(lambda o, c: (value_fn(o, o["label"], c), {}), frozenset({"za", "label", *outputs}))


def _per_example_loss(value_fn, *outputs: str) -> Loss:
    """The global-batch mean of per-example losses `value_fn(o, y, c)` [B]."""
    return Loss(
        lambda o, c: (jax.lax.pmean(value_fn(o, o["label"], c).mean(), DATA_AXIS), {}),
        frozenset({"label", *outputs}),
    )


LOSSES: Mapping[str, Loss] = {
    "clip": _streamed_pair_loss(clip_loss),
    # CLIP with in-batch false negatives (pairs sharing a group id) out of the softmaxes.
    "clip_masking_false_negatives": _streamed_pair_loss(clip_loss, false_negative_ids="groups"),
    "infonce": _streamed_pair_loss(infonce_loss),
    # No in-batch retrieval metrics: NT-Xent's statistics are over its 2N x 2N views
    # matrix, not the a -> b logits, and any other source is another N^2 pass per step.
    "ntxent": _streamed_pair_loss(ntxent_loss, metrics=False),
    "siglip": _streamed_pair_loss(siglip_loss, bias="bias"),
    "npairs": Loss(  # no in-batch metrics, as NT-Xent: they would be another N^2 pass
        lambda o, c: (npairs_loss(o["za"], o["zb"], axis_name=DATA_AXIS), {}),
        frozenset({"za", "zb"}),
    ),
    "supcon": _label_loss(
        lambda o, y, c: supcon_loss(
            o["za"], y, temperature=o["temperature"], axis_name=DATA_AXIS,
            chunk_size=c.chunk_size, collective=c.collective,
        ),
        "temperature",
    ),
    "contrastive": _label_loss(
        lambda o, y, c: contrastive_loss(o["za"], y, margin=c.margin, axis_name=DATA_AXIS)
    ),
    "triplet": _label_loss(
        lambda o, y, c: triplet_loss(
            o["za"], y, margin=c.margin, mining=c.triplet_mining, axis_name=DATA_AXIS
        )
    ),
    "multi_similarity": _label_loss(
        lambda o, y, c: multi_similarity_loss(o["za"], y, axis_name=DATA_AXIS)
    ),
    "softmax_ce": _per_example_loss(
        lambda o, y, c: softmax_cross_entropy(o["logits"], y, label_smoothing=c.label_smoothing),
        "logits",
    ),
    "focal": _per_example_loss(
        lambda o, y, c: focal_loss(o["logits"], y, gamma=c.focal_gamma), "logits"
    ),
    "bce": _per_example_loss(  # one-vs-all: summed over the C classes
        lambda o, y, c: binary_cross_entropy(
            o["logits"], jax.nn.one_hot(y, o["logits"].shape[-1])
        ).sum(-1),
        "logits",
    ),
    "proxy_nca": _per_example_loss(
        lambda o, y, c: proxy_nca_loss(o["za"], y, o["proxies"], temperature=o["temperature"]),
        "za", "proxies", "temperature",
    ),
    "cosface": _per_example_loss(  # scale s = 1 / temperature
        lambda o, y, c: cosface_loss(
            o["za"], y, o["proxies"], scale=1 / o["temperature"], margin=c.margin
        ),
        "za", "proxies", "temperature",
    ),
    "arcface": _per_example_loss(  # scale s = 1 / temperature; margin in radians
        lambda o, y, c: arcface_loss(
            o["za"], y, o["proxies"], scale=1 / o["temperature"], margin=c.margin
        ),
        "za", "proxies", "temperature",
    ),
}


def get(name: str) -> Loss:
    """`LOSSES[name]`; ConfigError listing the names when there is none."""
    if name not in LOSSES:
        raise ConfigError(f"config.loss.name={name!r}; use one of {sorted(LOSSES)}.")
    return LOSSES[name]
