"""The losses the trainer can train with (`config.loss.name`), and what each one reads.

Each entry is a `Loss`: a function of one device's inputs (model outputs and data
fields) and the `LossSettings` (`config.loss`'s values), called inside `jax.shard_map`
over `sharding.BATCH_AXES` so that it spans the global batch, and the set of inputs it
reads. The trainer derives its checks from
the inputs (a pair loss needs task "pairs" or "views", a label loss a dataset with
labels, a grouping loss a dataset with id keys, a classifier loss
`config.model.num_classes > 0`, "bias" makes the model learn SigLIP's logit bias), so
adding a loss touches this file only.

The inputs are those of `loss_types` (model outputs and data fields); `groups` are the
dataset's id keys (`records.Metadata.id_keys`: cmudict's word and pronunciation ids),
which mark in-batch false negatives for "clip_masking_false_negatives".

The pair losses "clip", "infonce" and "siglip" also return the in-batch retrieval
metrics (`losses.contrastive_metrics`) from their own statistics, so a train step does
no N^2 work beyond the loss's forward and backward; "ntxent" and "npairs" log no pair
metrics (their statistics are not the a -> b ones, and computing them would cost another
N^2 pass each step). Evaluation (`evaluation/`) measures retrieval for every loss.

Losses with state (`Loss.state`: "sogclr", "moco_queue", "xbm") keep arrays across
steps in `TrainState.loss_state` (checkpointed with the parameters): their `fn` also
reads `state` (this device's part of it: rows of the `LossState.sharded` leaves, the
others whole) and `step`, and returns the new state as a third value. "sogclr" reads
`index` [B], each example's row in the training split (`input_pipeline.train_dataset`).

"clip" and "infonce" take `group_size` (softmaxes within groups of K consecutive rows
of the global batch) and `extra_negatives` (rows that are only negatives, embedded
without gradient by `training.negatives_apart`), "siglip" `group_size`
(`losses.negatives`; `Loss.options`); the door refuses them for the other losses. The
three also take `hard_negatives` (`losses.hard_negatives`): when the outputs hold
`hard_negatives` [B, M, D] (the b tower's embeddings of a batch's `negatives`), they
join the a -> b pool.

Several positives (`losses.positives`): "clip_several_positives" (SupCon's mean form),
"clip_several_positives_log_sum" (MIL-NCE's log-sum form) and "siglip_several_positives"
read `index` [B] as `positive_ids`, so the k rows of one image that
`config.data.captions_per_image = k` puts in a batch (each with the image's index) are
positives of each other; with all indices distinct each is its plain loss. They take the
option "positive_ids"; the door refuses k > 1 with a loss that does not (its k pairs of
an image would be negatives of each other).

Not registered: `batch_prototype_cross_entropy_loss` needs the number of training
classes, which label-only losses do not configure.
"""

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError, check_multiple
from contrastive_jax.losses._common import l2_normalize
from contrastive_jax.losses.beyond_batch import dcl_loss, sogclr_init_state, sogclr_loss
from contrastive_jax.losses.classification import (
    binary_cross_entropy,
    focal_loss,
    softmax_cross_entropy,
)
from contrastive_jax.losses.loss_types import Loss, LossSettings, LossState
from contrastive_jax.losses.metric import contrastive_loss, multi_similarity_loss, triplet_loss
from contrastive_jax.losses.proxy import arcface_loss, cosface_loss, proxy_nca_loss
from contrastive_jax.losses.queues import (
    XBM_LOSSES,
    enqueue,
    moco_queue_loss,
    momentum_update,
    xbm_loss,
)
from contrastive_jax.losses.sigmoid import siglip_loss
from contrastive_jax.losses.softmax import clip_loss, infonce_loss, npairs_loss, ntxent_loss
from contrastive_jax.losses.supcon import supcon_loss
from contrastive_jax.sharding import BATCH_AXES


def _streaming(c: LossSettings) -> dict[str, Any]:
    """The global batch's axis and the loss's streaming and precision options, as keywords."""
    return {
        "axis_name": BATCH_AXES,
        "chunk_size": c.chunk_size,
        "collective": c.collective,
        "matmul_dtype": c.matmul_dtype,
    }


def _negatives(o, c: LossSettings, options: frozenset[str]) -> dict[str, Any]:
    """The `losses.negatives` keywords of a loss taking `options`: `group_size`, and
    `query_rows` (each device's rows less its share of `extra_negatives`, the last rows:
    `training.negatives_apart` puts them there) when there are extra negatives; and
    `hard_negatives` [B, M, D] when the outputs `o` hold them."""
    keywords = {"group_size": c.group_size} if "group_size" in options else {}
    if "hard_negatives" in options and "hard_negatives" in o:
        keywords["hard_negatives"] = o["hard_negatives"]
    if "extra_negatives" in options and c.extra_negatives:
        keywords["query_rows"] = o["za"].shape[0] - c.extra_negatives // jax.lax.axis_size(BATCH_AXES)
    return keywords


def _streamed_pair_loss(loss_fn, metrics: bool = True, options: frozenset[str] = frozenset(), **extra: str) -> Loss:
    """A softmax / sigmoid pair loss with its streaming options; `extra` maps its
    keyword arguments to the inputs passed to them (SigLIP's `bias="bias"`); `options`
    names the `losses.negatives` settings it takes. With
    `metrics`, the loss returns the in-batch retrieval metrics
    (`losses.contrastive_metrics`) from its own statistics (`return_metrics=True`): no
    N^2 work beyond the loss's forward and backward."""

    def fn(o, c):
        result = loss_fn(
            o["za"],
            o["zb"],
            temperature=o["temperature"],
            **_streaming(c),
            **{argument: o[name] for argument, name in extra.items()},
            **({"return_metrics": True} if metrics else {}),
            **_negatives(o, c, options),
        )
        return result if metrics else (result, {})

    return Loss(fn, frozenset({"za", "zb", "temperature", *extra.values()}), options=options)


def _label_loss(value_fn, *outputs: str) -> Loss:
    """A loss spanning the global batch by itself (`axis_name`), on `za` and labels:
    `value_fn(o, y, c)` with `y = o["label"]`."""
    return Loss(lambda o, c: (value_fn(o, o["label"], c), {}), frozenset({"za", "label", *outputs}))


def _per_example_loss(value_fn, *outputs: str) -> Loss:
    """The global-batch mean of per-example losses `value_fn(o, y, c)` [B]."""
    return Loss(
        lambda o, c: (jax.lax.pmean(value_fn(o, o["label"], c).mean(), BATCH_AXES), {}),
        frozenset({"label", *outputs}),
    )


def _check_sogclr(c: LossSettings, global_batch_size: int, micro_batch_size: int) -> None:
    del global_batch_size, micro_batch_size
    if not 0 < c.sogclr_gamma <= 1:
        raise ConfigError(f"config.loss.sogclr_gamma={c.sogclr_gamma} must be in (0, 1] (0.9 in the paper).")


def _sogclr(o, c):
    loss, log_u = sogclr_loss(
        o["za"],
        o["zb"],
        o["index"],
        o["state"]["log_u"],
        temperature=o["temperature"],
        gamma=c.sogclr_gamma,
        **_streaming(c),
    )
    return loss, {}, {"log_u": log_u}


def _random_rows(c: LossSettings, rows: int, salt: int) -> jax.Array:
    """`[rows, embed_dim]` random unit vectors: a queue's first entries (MoCo's)."""
    key = jax.random.fold_in(jax.random.key(c.seed), salt)
    return l2_normalize(jax.random.normal(key, (rows, c.embed_dim)))


def _moco_init(c: LossSettings, params, num_examples):
    del num_examples
    state = {}
    if c.queue_size:
        state = {
            "queue_a": _random_rows(c, c.queue_size, 1),
            "queue_b": _random_rows(c, c.queue_size, 2),
            "pointer": jnp.zeros((), jnp.int32),
        }
    if c.queue_momentum > 0:
        state["ema_params"] = params
    return state


def _check_moco(c: LossSettings, global_batch_size: int, micro_batch_size: int) -> None:
    if c.queue_size < 0:
        raise ConfigError(
            f"config.loss.queue_size={c.queue_size} must be 0 (no queue: the global batch's keys, "
            "MoCo v3) or a positive multiple of config.train.global_batch_size."
        )
    if c.queue_size:
        check_multiple(c.queue_size, global_batch_size, "config.loss.queue_size", "config.train.global_batch_size")
    momentum = c.queue_momentum
    if not 0 <= momentum < 1:
        raise ConfigError(
            f"config.loss.queue_momentum={momentum} must be in [0, 1): 0 takes the keys from "
            "the current encoder, m (0.999 in MoCo) from its moving average."
        )
    if momentum > 0 and micro_batch_size:
        raise ConfigError(
            f"config.loss.queue_momentum={momentum} embeds the keys with the momentum encoder "
            "over the whole batch, which micro-batches cannot split; set "
            "config.train.micro_batch_size=0 or config.loss.queue_momentum=0."
        )


def _moco(o, c):
    """Symmetric: a's queries against b's keys, and b's against a's. Keys come from the
    momentum encoder (`key_za`, `key_zb`, no gradient) when the state holds one, else from
    the towers, carrying a gradient unless `queue_stop_gradient`. With a queue (K > 0)
    each query's candidates are its key and the queue (MoCo v1, v2); with K = 0, the
    global batch's keys (MoCo v3; with the towers' keys and their gradient, CLIP)."""
    state = o["state"]
    keys_a, keys_b = o.get("key_za", o["za"]), o.get("key_zb", o["zb"])
    if c.queue_stop_gradient:
        keys_a, keys_b = jax.lax.stop_gradient(keys_a), jax.lax.stop_gradient(keys_b)
    streaming = dict(temperature=o["temperature"], **_streaming(c))
    if not c.queue_size:
        loss = 0.5 * (infonce_loss(o["za"], keys_b, **streaming) + infonce_loss(o["zb"], keys_a, **streaming))
        return loss, {}, state
    loss = 0.5 * (
        moco_queue_loss(o["za"], keys_b, state["queue_b"], **streaming)
        + moco_queue_loss(o["zb"], keys_a, state["queue_a"], **streaming)
    )
    (queue_a, queue_b), pointer = enqueue(
        (state["queue_a"], state["queue_b"]),
        state["pointer"],
        (keys_a, keys_b),
        axis_name=BATCH_AXES,
    )
    return loss, {}, dict(state, queue_a=queue_a, queue_b=queue_b, pointer=pointer)


def _moco_after_step(state, params, c):
    if "ema_params" not in state:
        return state
    ema = momentum_update(state["ema_params"], params, momentum=c.queue_momentum)
    return dict(state, ema_params=ema)


def _xbm_init(c: LossSettings, params, num_examples):
    del params, num_examples
    return {
        "memory": jnp.zeros((c.xbm_memory_size, c.embed_dim)),
        "labels": jnp.full((c.xbm_memory_size,), -1, jnp.int32),  # -1: empty
        "pointer": jnp.zeros((), jnp.int32),
    }


def _check_xbm(c: LossSettings, global_batch_size: int, micro_batch_size: int) -> None:
    del micro_batch_size
    if c.xbm_loss not in XBM_LOSSES:
        raise ConfigError(
            f"config.loss.xbm_loss={c.xbm_loss!r} is not a label-based loss the "
            f"memory can extend; use one of {list(XBM_LOSSES)} (triplet mining needs every "
            "candidate per anchor at once and does not stream)."
        )
    memory_size = "config.loss.xbm_memory_size"
    check_multiple(c.xbm_memory_size, global_batch_size, memory_size, "config.train.global_batch_size")
    if c.xbm_warmup_steps < 0:
        raise ConfigError(f"config.loss.xbm_warmup_steps={c.xbm_warmup_steps} must be >= 0.")
    weight = c.xbm_memory_weight
    if weight is not None and not weight >= 0:
        raise ConfigError(
            f"config.loss.xbm_memory_weight={weight} must be None (batch and memory pooled in one "
            "loss) or >= 0 (the paper's loss(batch) + weight * loss(batch vs memory); 1.0 there)."
        )


def _xbm(o, c):
    """The memory joins the candidates after `xbm_warmup_steps` steps; it is filled
    from the first step on. Pooled (`xbm_memory_weight` None), the loss scores the
    memory before the batch is enqueued; in the paper's two-term form, after."""
    state = o["state"]
    (memory, labels), pointer = enqueue(
        (state["memory"], state["labels"]),
        state["pointer"],
        (o["za"], o["label"]),
        axis_name=BATCH_AXES,
    )
    pooled = c.xbm_memory_weight is None
    scored, scored_labels = (state["memory"], state["labels"]) if pooled else (memory, labels)
    loss = xbm_loss(
        o["za"],
        o["label"],
        scored,
        jnp.where(o["step"] >= c.xbm_warmup_steps, scored_labels, -1),
        loss=c.xbm_loss,
        temperature=o["temperature"],
        margin=c.margin,
        memory_weight=c.xbm_memory_weight,
        enqueued_at=None if pooled else state["pointer"],
        **_streaming(c),
    )
    return loss, {}, {"memory": memory, "labels": labels, "pointer": pointer}


_SOFTMAX_OPTIONS = frozenset({"group_size", "extra_negatives", "hard_negatives"})
# The pairs sharing an `index` (an image's k captions, config.data.captions_per_image) are positives.
_POSITIVES = frozenset({"positive_ids"})
LOSSES: Mapping[str, Loss] = {
    # group_size: softmaxes within groups of K rows; extra_negatives: rows that are only
    # negatives (losses.negatives, training.negatives_apart); hard_negatives: each pair's
    # M negatives of the b side in the a -> b pool (losses.hard_negatives).
    "clip": _streamed_pair_loss(clip_loss, options=_SOFTMAX_OPTIONS),
    # CLIP with in-batch false negatives (pairs sharing a group id) out of the softmaxes.
    "clip_masking_false_negatives": _streamed_pair_loss(clip_loss, false_negative_ids="groups"),
    "infonce": _streamed_pair_loss(infonce_loss, options=_SOFTMAX_OPTIONS),
    # No in-batch retrieval metrics: NT-Xent's statistics are over its 2N x 2N views
    # matrix, not the a -> b logits, and any other source is another N^2 pass per step.
    "ntxent": _streamed_pair_loss(ntxent_loss, metrics=False),
    "siglip": _streamed_pair_loss(siglip_loss, options=frozenset({"group_size", "hard_negatives"}), bias="bias"),
    # Several positives (losses.positives): the pairs of one image, by their `index`.
    "clip_several_positives": _streamed_pair_loss(clip_loss, options=_POSITIVES, positive_ids="index"),
    "clip_several_positives_log_sum": _streamed_pair_loss(
        functools.partial(clip_loss, positives="log_sum"), options=_POSITIVES, positive_ids="index"
    ),
    "siglip_several_positives": _streamed_pair_loss(siglip_loss, options=_POSITIVES, bias="bias", positive_ids="index"),
    "npairs": Loss(  # no in-batch metrics, as NT-Xent: they would be another N^2 pass
        lambda o, c: (npairs_loss(o["za"], o["zb"], axis_name=BATCH_AXES), {}),
        frozenset({"za", "zb"}),
    ),
    # Decoupled contrastive learning: the positive out of both softmaxes' denominators.
    "dcl": Loss(
        lambda o, c: (
            dcl_loss(
                o["za"],
                o["zb"],
                temperature=o["temperature"],
                weight_sigma=c.dcl_weight_sigma,
                weight_gradient=c.dcl_weight_gradient,
                **_streaming(c),
            ),
            {},
        ),
        frozenset({"za", "zb", "temperature"}),
    ),
    # SogCLR: state log u [examples, 2], replicated.
    "sogclr": Loss(
        _sogclr,
        frozenset({"za", "zb", "temperature", "index"}),
        LossState(
            init=lambda c, params, num_examples: {"log_u": sogclr_init_state(num_examples)},
            sharded=frozenset(),
            check=_check_sogclr,
        ),
    ),
    # MoCo queues of both towers' keys [K, D], split over the devices, and a pointer (none
    # when K = 0); the momentum encoder's parameters when config.loss.queue_momentum > 0.
    "moco_queue": Loss(
        _moco,
        frozenset({"za", "zb", "temperature"}),
        LossState(
            init=_moco_init,
            sharded=frozenset({"queue_a", "queue_b"}),
            check=_check_moco,
            after_step=_moco_after_step,
            params_like=frozenset({"ema_params"}),
        ),
    ),
    # Cross-batch memory [M, D] with labels [M], split over the devices; a pointer.
    "xbm": Loss(
        _xbm,
        frozenset({"za", "label", "temperature"}),
        LossState(init=_xbm_init, sharded=frozenset({"memory", "labels"}), check=_check_xbm),
    ),
    "supcon": _label_loss(
        lambda o, y, c: supcon_loss(
            o["za"],
            y,
            temperature=o["temperature"],
            axis_name=BATCH_AXES,
            chunk_size=c.chunk_size,
            collective=c.collective,
        ),
        "temperature",
    ),
    "contrastive": _label_loss(lambda o, y, c: contrastive_loss(o["za"], y, margin=c.margin, axis_name=BATCH_AXES)),
    "triplet": _label_loss(
        lambda o, y, c: triplet_loss(o["za"], y, margin=c.margin, mining=c.triplet_mining, axis_name=BATCH_AXES)
    ),
    "multi_similarity": _label_loss(lambda o, y, c: multi_similarity_loss(o["za"], y, axis_name=BATCH_AXES)),
    "softmax_ce": _per_example_loss(
        lambda o, y, c: softmax_cross_entropy(o["logits"], y, label_smoothing=c.label_smoothing),
        "logits",
    ),
    "focal": _per_example_loss(lambda o, y, c: focal_loss(o["logits"], y, gamma=c.focal_gamma), "logits"),
    "bce": _per_example_loss(  # one-vs-all: summed over the C classes
        lambda o, y, c: binary_cross_entropy(o["logits"], jax.nn.one_hot(y, o["logits"].shape[-1])).sum(-1),
        "logits",
    ),
    "proxy_nca": _per_example_loss(
        lambda o, y, c: proxy_nca_loss(o["za"], y, o["proxies"], temperature=o["temperature"]),
        "za",
        "proxies",
        "temperature",
    ),
    "cosface": _per_example_loss(  # scale s = 1 / temperature
        lambda o, y, c: cosface_loss(o["za"], y, o["proxies"], scale=1 / o["temperature"], margin=c.margin),
        "za",
        "proxies",
        "temperature",
    ),
    "arcface": _per_example_loss(  # scale s = 1 / temperature; margin in radians
        lambda o, y, c: arcface_loss(o["za"], y, o["proxies"], scale=1 / o["temperature"], margin=c.margin),
        "za",
        "proxies",
        "temperature",
    ),
}


def get(name: str) -> Loss:
    """`LOSSES[name]`; ConfigError listing the names when there is none."""
    if name not in LOSSES:
        raise ConfigError(f"config.loss.name={name!r}; use one of {sorted(LOSSES)}.")
    return LOSSES[name]


def taking(option: str) -> list[str]:
    """The names of the losses that take `option` (`Loss.options`), sorted: what a
    refusal of `option` for another loss offers instead."""
    return sorted(k for k, v in LOSSES.items() if option in v.options)
