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

The pair losses "clip", "infonce", "siglip" (and "clip_masking_false_negatives") read
their candidates (`losses.Candidates`) from one device's outputs and data, in one place
(`pair_candidates`): the batch's rows and the extra rows (`extra`, embedded without
gradient by `training.forward`; the batch's rows are the queries), each row's
`hard_negatives` [B, M, D] (the b tower's embeddings of a batch's `negatives`) and the
device's share of a fixed bank (`negative_bank`) as extra columns, the
groups (`group_size`), and with `config.loss.positives` a form, the `index` [B] as
positive ids (the k rows of an image that `config.data.captions_per_image = k` puts in
a batch share it). `Loss.options` names the candidates each takes; the door
(`loss_types.check_candidates`) refuses the others. The last release's names for a form
of several positives are `DEPRECATED_NAMES`, read as today's by `run_plan.settled`.

Not registered: `batch_prototype_cross_entropy_loss` needs the number of training
classes, which label-only losses do not configure.
"""

import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.errors import ConfigError, check_multiple
from contrastive_jax.losses._common import l2_normalize
from contrastive_jax.losses.beyond_batch import dcl_loss, sogclr_init_state, sogclr_loss
from contrastive_jax.losses.candidates import Candidates
from contrastive_jax.losses.classification import (
    binary_cross_entropy,
    focal_loss,
    softmax_cross_entropy,
)
from contrastive_jax.losses.loss_types import OWN_PAIR, Loss, LossSettings, LossState
from contrastive_jax.losses.metric import contrastive_loss, multi_similarity_loss, triplet_loss
from contrastive_jax.losses.positives import FORMS
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
from contrastive_jax.losses.streaming import Streaming
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


def _rows(o, name: str) -> jax.Array | None:
    """One device's rows of `name`: the batch's, then (when the step embedded them) the
    extra rows' (`o["extra"]`, `training.forward`); None when there is none."""
    rows, extra = o.get(name), o.get("extra", {}).get(name)
    return rows if extra is None or rows is None else jnp.concatenate([rows, extra])


@functools.lru_cache(maxsize=4)
def negative_bank(path: str) -> np.ndarray | None:
    """The fixed bank of negatives in the ``.npy`` file ``path`` (`config.loss.negatives_from`):
    ``[M, D]`` float32, each row L2-normalised; None for ``""``.

    Raises:
      ConfigError: the file cannot be read, or does not hold ``[M, D]`` floats.
    """
    if not path:
        return None
    field = f"config.loss.negatives_from={path!r}"
    try:
        bank = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{field} cannot be read ({e}); give a .npy file of [M, D] embeddings, or ''.") from None
    if bank.ndim != 2 or not np.issubdtype(bank.dtype, np.floating) or not bank.shape[0]:
        raise ConfigError(f"{field} holds {bank.dtype} {bank.shape}; it must be [M, D] floats.")
    bank = bank.astype(np.float32)
    return bank / np.maximum(np.linalg.norm(bank, axis=1, keepdims=True), 1e-12)


def _bank_share(path: str) -> jax.Array | None:
    """This device's rows of the fixed bank of negatives in `path` (`negative_bank`)."""
    bank = negative_bank(path)
    if bank is None:
        return None
    share = bank.shape[0] // jax.lax.axis_size(BATCH_AXES)
    return jax.lax.dynamic_slice_in_dim(jnp.asarray(bank), jax.lax.axis_index(BATCH_AXES) * share, share)


def pair_candidates(o, c: LossSettings, positive_ids: str | None = None, false_negative_ids: str | None = None):
    """`(a [B, D], b [B, D], losses.Candidates)` of a pair loss from one device's outputs
    and data `o`: the batch's rows and the extra rows (queries: the batch's), the ids the
    loss reads (`positive_ids` when `c.positives` is a form, `false_negative_ids`), each
    row's hard negatives and the bank's share as extra columns, the groups."""
    extra = o.get("extra")
    several = positive_ids is not None and c.positives != OWN_PAIR
    candidates = Candidates(
        positive_ids=_rows(o, positive_ids) if several else None,
        false_negative_ids=None if false_negative_ids is None else _rows(o, false_negative_ids),
        extra_columns=_rows(o, "hard_negatives"),
        shared_columns=_bank_share(c.negatives_from),
        group_size=c.group_size,
        query_rows=o["za"].shape[0] if extra else None,
        positives=c.positives if several else "mean_log_prob",
    )
    return _rows(o, "za"), _rows(o, "zb"), candidates


def check_candidates(
    name: str,
    loss: Loss,
    settings: LossSettings,
    *,
    global_batch_size: int,
    num_devices: int,
    micro_batches: int,
    has_negatives: bool,
    captions_per_image: int,
) -> None:
    """The candidates `settings` give each row (`losses.Candidates`: several positives,
    groups, extra rows, a bank) and the data's (`has_negatives`: the records' hard
    negatives; `captions_per_image` k) fit the loss `name`, the optimizer's
    `global_batch_size`, the `num_devices` devices and the `micro_batches` a step is
    embedded in. Any of them goes with any gradient path;
    what is refused is refused for its mathematics.

    Raises:
      ConfigError: naming the field and a fix.
    """
    _check_options(name, loss, settings, has_negatives)
    if settings.positives not in (OWN_PAIR, *FORMS):
        raise ConfigError(f"config.loss.positives={settings.positives!r}; use one of {[OWN_PAIR, *FORMS]}.")
    if captions_per_image > 1 and settings.positives == OWN_PAIR:
        raise ConfigError(
            f"config.data.captions_per_image={captions_per_image} puts an image's captions in a batch as pairs that "
            "config.loss.positives='own' counts as negatives of each other; set config.loss.positives to one of "
            f"{list(FORMS)}, or captions_per_image=1."
        )
    if settings.extra_negatives < 0 or settings.group_size < 0:
        raise ConfigError("config.loss.extra_negatives and config.loss.group_size must be >= 0.")
    if settings.extra_negatives and settings.group_size:
        raise ConfigError(
            "config.loss.group_size fixes each row's candidates at its group's K and config.loss.extra_negatives "
            "adds to them: set one of them to 0."
        )
    if settings.extra_negatives:
        field, over = "config.loss.extra_negatives", "the devices x micro-batches (each embeds its share)"
        check_multiple(settings.extra_negatives, num_devices * micro_batches, field, over)
    if settings.group_size:
        field = "config.train.global_batch_size"
        check_multiple(global_batch_size, settings.group_size, field, "config.loss.group_size")
    _check_bank(settings, num_devices)


def _check_options(name: str, loss: Loss, settings: LossSettings, has_negatives: bool) -> None:
    """ConfigError unless the loss `name` takes each candidate the settings and the data
    ask for (`Loss.options`)."""
    extra = settings.extra_negatives
    asked = {  # option: (what asks for it, the other fix, whether it is asked for)
        "positive_ids": (f"config.loss.positives={settings.positives!r}", "or 'own'", settings.positives != OWN_PAIR),
        "group_size": (f"config.loss.group_size={settings.group_size}", "or 0", bool(settings.group_size)),
        "query_rows": (f"config.loss.extra_negatives={extra}", "or 0", bool(extra)),
        "extra_columns": ("the records' hard negatives (`negatives`)", "or records without them", has_negatives),
    }
    if settings.negatives_from:
        asked["extra_columns"] = (f"config.loss.negatives_from={settings.negatives_from!r}", "or ''", True)
    for option, (what, other_fix, given) in asked.items():
        if given and option not in loss.options:
            raise ConfigError(
                f"{what} with config.loss.name={name!r}, which cannot take them: use one of {taking(option)}, "
                f"{other_fix}."
            )


def _check_bank(settings: LossSettings, num_devices: int) -> None:
    """ConfigError unless the bank of negatives (`negative_bank`) is [M, embed_dim], M
    split over the devices (in whole tiles of an integer `chunk_size`)."""
    bank = negative_bank(settings.negatives_from)
    if bank is None:
        return
    if bank.shape[1] != settings.embed_dim:
        raise ConfigError(
            f"config.loss.negatives_from={settings.negatives_from!r} holds [{bank.shape[0]}, {bank.shape[1]}] "
            f"embeddings; it must be [M, {settings.embed_dim}] (D = config.model.embed_dim)."
        )
    tile = settings.chunk_size if isinstance(settings.chunk_size, int) else 1  # its columns in whole tiles
    factor = num_devices * tile if settings.collective == "ring" else math.lcm(num_devices, tile)
    over = "the devices" + (" and config.loss.chunk_size" if tile > 1 else "")
    check_multiple(bank.shape[0], factor, "the rows of config.loss.negatives_from", over)


def _pair_loss(loss_fn, metrics: bool = True, options: frozenset[str] = frozenset(), **reads: str) -> Loss:
    """A softmax / sigmoid pair loss over `losses.Candidates` (`pair_candidates`): `options`
    names the candidates it takes, `reads` maps its other keyword arguments to the
    inputs passed to them (SigLIP's `bias="bias"`) and `positive_ids` /
    `false_negative_ids` to the data it reads as ids. With `metrics`, the loss returns
    the in-batch retrieval metrics (`losses.contrastive_metrics`) from its own statistics
    (`return_metrics=True`): no N^2 work beyond the loss's forward and backward."""
    id_reads = {k: reads.pop(k) for k in ("positive_ids", "false_negative_ids") if k in reads}

    def fn(o, c):
        a, b, candidates = pair_candidates(o, c, **id_reads)
        result = loss_fn(
            a,
            b,
            temperature=o["temperature"],
            candidates=candidates,
            streaming=Streaming(c.chunk_size, c.collective, c.matmul_dtype, c.kernel),
            axis_name=BATCH_AXES,
            **{argument: o[name] for argument, name in reads.items()},
            **({"return_metrics": True} if metrics else {}),
        )
        return result if metrics else (result, {})

    # The positive ids are read with config.loss.positives only (`Trainer.loss_data`).
    inputs = {"za", "zb", "temperature", *reads.values(), *(v for k, v in id_reads.items() if k != "positive_ids")}
    return Loss(fn, frozenset(inputs), options=options)


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
    del micro_batch_size  # the momentum encoder embeds each micro-batch (training.forward)
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


def _moco(o, c):
    """Symmetric: a's queries against b's keys, and b's against a's. Keys come from the
    momentum encoder (`key_za`, `key_zb`, no gradient) when the state holds one, else from
    the towers, carrying a gradient unless `queue_stop_gradient`. With a queue (K > 0)
    each query's candidates are its key and the queue (MoCo v1, v2); with K = 0, the
    global batch's keys (MoCo v3; with the towers' keys and their gradient, CLIP)."""
    state = o["state"]
    keys_a, keys_b = o.get("key_za", o["za"]), o.get("key_zb", o["zb"])  # training.forward embeds them
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


# The candidates (`losses.Candidates`) each pair loss takes: several positives (the pairs
# sharing an `index`, config.loss.positives), groups (config.loss.group_size), query rows
# (config.loss.extra_negatives), extra columns (a batch's `negatives`, config.loss.negatives_from).
_SOFTMAX_OPTIONS = frozenset({"positive_ids", "group_size", "query_rows", "extra_columns"})
LOSSES: Mapping[str, Loss] = {
    "clip": _pair_loss(clip_loss, options=_SOFTMAX_OPTIONS, positive_ids="index"),
    # CLIP with in-batch false negatives (pairs sharing a group id) out of the softmaxes.
    "clip_masking_false_negatives": _pair_loss(
        clip_loss, options=_SOFTMAX_OPTIONS - {"positive_ids"}, false_negative_ids="groups"
    ),
    "infonce": _pair_loss(infonce_loss, options=_SOFTMAX_OPTIONS, positive_ids="index"),
    # No in-batch retrieval metrics: NT-Xent's statistics are over its 2N x 2N views
    # matrix, not the a -> b logits, and any other source is another N^2 pass per step.
    "ntxent": Loss(
        lambda o, c: (ntxent_loss(o["za"], o["zb"], temperature=o["temperature"], **_streaming(c)), {}),
        frozenset({"za", "zb", "temperature"}),
    ),
    "siglip": _pair_loss(siglip_loss, options=_SOFTMAX_OPTIONS - {"query_rows"}, bias="bias", positive_ids="index"),
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


# The names of the last release that named a form of several positives: (loss, config.loss.positives).
DEPRECATED_NAMES = {
    "clip_several_positives": ("clip", "mean_log_prob"),
    "clip_several_positives_log_sum": ("clip", "log_sum"),
    "siglip_several_positives": ("siglip", "mean_log_prob"),
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
