"""The rules a config must follow before anything is read or compiled, each checked once.

`check` runs them all, in the order `run_plan.build` needs them (counts, data, the bad-loss
settings, the loss's inputs, the batch over devices and processes, the streaming tiles,
micro-batches, the loss's state), raising one `ConfigError` that names the field and a
fix. The rules of one part live with it (`settings.check_data_config`,
`loss_guard.check_config`, `grad_cache.check_micro_batches`, `errors.check_multiple` and `check_divides`,
a loss's `LossState.check`); this module says which apply and when.
"""

import math

import jax
import ml_collections

from contrastive_jax import losses
from contrastive_jax.data import records, settings
from contrastive_jax.errors import ConfigError, check_divides, check_multiple
from contrastive_jax.losses.streaming import KERNELS, MATMUL_DTYPES
from contrastive_jax.training import batch_schedule, grad_cache, loss_guard

# Count fields and their least value (every_steps 0: only at the end).
_COUNTS = {
    "train.num_train_steps": 1,
    "train.log_every_steps": 1,
    "eval.every_steps": 0,
    "checkpoint.every_steps": 0,
    "train.loss_spike_window_steps": 1,
    "train.rollback_skip_batches": 1,
    "train.max_rollbacks": 1,
    "train.rollback_window_steps": 1,
    "data.examples_per_class": 1,
}


def check(
    config: ml_collections.ConfigDict,
    loss: losses.Loss,
    num_devices: int,
    data: settings.DataSettings,
    guard: loss_guard.GuardSettings,
    loss_settings: losses.LossSettings,
) -> tuple[int, records.Metadata]:
    """Checks `config` for `loss` on `num_devices` devices, with the data, bad-loss and
    loss settings `run_plan.build` read from it; returns the rows of the loss's per-example
    state table (0 without one) and the record set's metadata.

    Raises:
      ConfigError: a field with a bad or inconsistent value; the message names it and a fix.
    """
    train = config.train
    for name, least in _COUNTS.items():
        group, field = name.split(".")
        if config[group][field] < least:
            raise ConfigError(f"config.{name}={config[group][field]} must be >= {least}.")
    metadata = settings.check_data_config(data)
    metadata.split(records.parse_split(config.eval.split)[0])  # evaluated at the end: checked before compiling
    loss_guard.check_config(guard)
    _check_loss_inputs(loss, config, data, metadata)
    check_multiple(train.global_batch_size, num_devices, "config.train.global_batch_size", "the devices")
    settings.per_process_batch_size(train.global_batch_size, jax.process_count())
    losses.check_candidates(
        config.loss.name,
        loss,
        loss_settings,
        global_batch_size=train.global_batch_size,
        num_devices=num_devices,
        micro_batches=train.global_batch_size // train.micro_batch_size if train.micro_batch_size else 1,
        has_negatives=metadata.has("negatives"),
        captions_per_image=data.captions_per_image,
    )
    _check_chunk_size(config.loss, train.global_batch_size + config.loss.extra_negatives, num_devices)
    if config.loss.kernel not in KERNELS:
        raise ConfigError(f"config.loss.kernel={config.loss.kernel!r}; use one of {KERNELS}.")
    if config.loss.matmul_dtype not in MATMUL_DTYPES:
        raise ConfigError(f"config.loss.matmul_dtype={config.loss.matmul_dtype!r}; use one of {MATMUL_DTYPES}.")
    if config.loss.dcl_weight_gradient and config.loss.dcl_weight_sigma is None:
        raise ConfigError(
            "config.loss.dcl_weight_gradient=True needs DCLW's weight: set config.loss.dcl_weight_sigma "
            "(0.5 in the paper), or dcl_weight_gradient=False."
        )
    if train.micro_batch_size:
        if train.micro_batch_method not in grad_cache.MICRO_BATCH_METHODS:
            raise ConfigError(
                f"config.train.micro_batch_method={train.micro_batch_method!r}; use "
                f"one of {sorted(grad_cache.MICRO_BATCH_METHODS)}."
            )
        grad_cache.check_micro_batches(train.global_batch_size, train.micro_batch_size, num_devices)
    if train.log_noise_scale:
        _check_noise_scale(loss, train, num_devices)
    return _check_loss_state(loss, loss_settings, config, data), metadata


def check_batch_schedule(
    config: ml_collections.ConfigDict,
    schedule: batch_schedule.ScheduleSettings,
    loss: losses.Loss,
    loss_settings: losses.LossSettings,
    num_devices: int,
    data: settings.DataSettings,
) -> None:
    """Every global batch `config.train.batch_schedule` reaches divides as the first one
    must (over the devices, the processes, the micro-batches, whole classes, the loss's
    tiles) and, but for "labeled" batches, holds no more than the training split;
    "noise" measures the noise scale; a loss with state takes each batch, each stage
    starting where its queue's pointer is a multiple of its batch.

    Raises:
      ConfigError: naming the field and a fix.
    """
    train, text = config.train, config.train.batch_schedule
    parts = {"the devices": num_devices, "the processes": jax.process_count()}
    parts["config.train.micro_batch_size"] = train.micro_batch_size or 1
    parts["config.data.examples_per_class"] = config.data.examples_per_class if config.data.task == "labeled" else 1
    parts["config.data.captions_per_image"] = data.captions_per_image  # an image's rows in one batch
    parts["config.loss.group_size"] = loss_settings.group_size or 1  # whole groups
    chunk = config.loss.chunk_size
    if isinstance(chunk, int) and not isinstance(chunk, bool):
        parts["config.loss.chunk_size"] = chunk * (num_devices if config.loss.collective == "ring" else 1)
    unit = math.lcm(*parts.values())
    unit_is = ", ".join(name for name, value in parts.items() if value > 1)
    batch_schedule.check(schedule, text, unit=unit, unit_is=unit_is, on_bad_loss=train.on_bad_loss)
    if schedule.kind != "constant" and data.task != "labeled":
        from contrastive_jax.data import input_pipeline  # reads the split's size

        if schedule.largest > (examples := input_pipeline.train_split_size(data)):
            raise ConfigError(
                f"config.train.batch_schedule={text!r} reaches a global batch of {schedule.largest}, more than "
                f"the {examples} examples of split {data.train_split!r} (a batch would repeat examples); lower "
                f"{'config.train.batch_max' if schedule.kind == 'noise' else 'its stages'}."
            )
    if schedule.kind == "noise" and not train.log_noise_scale:
        raise ConfigError(
            f"config.train.batch_schedule={text!r} follows the measured noise scale: set "
            "config.train.log_noise_scale=True."
        )
    if loss.state is None or schedule.kind == "constant":
        return
    for first_step, n in schedule.stages.stages:
        try:
            loss.state.check(loss_settings, n, train.micro_batch_size)
        except ConfigError as e:
            raise ConfigError(f"config.train.batch_schedule={text!r} reaches a global batch of {n}: {e}") from None
        if schedule.stages.examples_before(first_step) % n:
            raise ConfigError(
                f"config.train.batch_schedule={text!r}: config.loss.name={config.loss.name!r} keeps a state "
                f"filled a batch at a time; the stage {n}@{first_step} must start after a multiple of {n} "
                f"examples, not {schedule.stages.examples_before(first_step)}: move it."
            )


def _check_noise_scale(loss: losses.Loss, train: ml_collections.ConfigDict, num_devices: int) -> None:
    """The noise scale compares each device's share of the gradient with the sum: it needs
    two devices or more, the whole batch in one pass and a loss without state."""
    if num_devices < 2:
        raise ConfigError(
            "config.train.log_noise_scale=True needs 2 or more devices on the data axis (it compares "
            f"each device's gradient with their sum), not {num_devices}; set --config.num_simulated_devices=8 on CPU."
        )
    if train.micro_batch_size or loss.state is not None:
        raise ConfigError(
            "config.train.log_noise_scale=True needs config.train.micro_batch_size=0 and a loss without state "
            f"(not micro_batch_size={train.micro_batch_size} with this loss); turn one of them off."
        )


def _check_loss_state(
    loss: losses.Loss,
    loss_settings: losses.LossSettings,
    config: ml_collections.ConfigDict,
    data: settings.DataSettings,
) -> int:
    """A loss with state: its own checks, one state update per step, and a per-example
    table (`config.loss.sogclr_table_size`; 0: the training split's size) that holds
    every example. Returns the table's rows (0 without one)."""
    if loss.state is None:
        return 0
    loss.state.check(loss_settings, config.train.global_batch_size, config.train.micro_batch_size)
    name = config.loss.name
    if config.train.micro_batch_size and config.train.micro_batch_method != "grad_cache":
        raise ConfigError(
            f"config.loss.name={name!r} updates its state once per step, from the whole "
            f"batch; config.train.micro_batch_method={config.train.micro_batch_method!r} "
            "computes a loss per micro-batch. Use 'grad_cache' (the exact full-batch loss)."
        )
    if not loss.indices:
        return 0
    from contrastive_jax.data import input_pipeline  # reads the labels for a class range

    examples = input_pipeline.train_split_size(data)
    table = config.loss.sogclr_table_size or examples
    if table < examples:
        raise ConfigError(
            f"config.loss.sogclr_table_size={table} is smaller than the {examples} examples "
            f"of split {config.data.train_split!r}: every example needs its row. Use 0 (the "
            f"split's size) or at least {examples}."
        )
    return table


def _check_loss_inputs(
    loss: losses.Loss, config: ml_collections.ConfigDict, data: settings.DataSettings, metadata: records.Metadata
) -> None:
    """The data and the model give the loss what it reads (`loss.inputs`)."""
    name, task = config.loss.name, config.data.task
    if loss.pairs and task == "labeled":
        raise ConfigError(
            f"config.loss.name={name!r} needs paired inputs but config.data.task is "
            "'labeled'; use task 'pairs' or 'views', or a label loss."
        )
    if loss.labels and not metadata.has("label"):
        pair_losses = sorted(k for k, v in losses.LOSSES.items() if not v.labels)
        raise ConfigError(
            f"config.loss.name={name!r} needs labels but {data.display_name!r} has none; use one of {pair_losses}."
        )
    if loss.groups and not metadata.id_keys:
        raise ConfigError(
            f"config.loss.name={name!r} masks in-batch false negatives by the dataset's "
            f"grouping ids, but {data.display_name!r} has none; use 'clip', or a dataset "
            "with ids (e.g. 'cmudict', or records written with id keys)."
        )
    if loss.classifier != (config.model.num_classes > 0):
        classifier_losses = sorted(k for k, v in losses.LOSSES.items() if v.classifier)
        raise ConfigError(
            f"config.model.num_classes={config.model.num_classes} with config.loss.name="
            f"{name!r}: losses {classifier_losses} need a classifier head (num_classes = "
            "the number of training classes), the others need num_classes=0."
        )


def _check_chunk_size(loss: ml_collections.ConfigDict, global_batch_size: int, num_devices: int):
    """A streamed loss's tiles must tile its logits: N columns, N / devices with a ring.
    `"auto"` picks a divisor itself (`losses.logit_stats.auto_chunk_size`); a Pallas
    `config.loss.kernel` takes any block edge."""
    chunk = loss.chunk_size
    if chunk is None or chunk == "auto":
        return
    ring = loss.collective == "ring"
    columns = global_batch_size // num_devices if ring else global_batch_size
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise ConfigError(f"config.loss.chunk_size={chunk!r} must be a positive int, 'auto' or None.")
    if loss.kernel != "xla":  # a Pallas kernel pads its last block; its fallback tiles by a divisor
        return
    what = "the logit columns each device holds with the ring" if ring else "the logit columns (N)"
    check_divides(chunk, columns, "config.loss.chunk_size", what)
