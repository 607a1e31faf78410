"""A run as one call, and what it is made of: the config read once into a `RunPlan`.

`train_and_evaluate(config, workdir)` writes a built-in dataset's records if the config
reads one (`write_builtin_records`), has `build` read the config into a `RunPlan` and
runs the loop on it (`loop.run_loop`). `build` checks the config while it assembles the
step (`trainer.Trainer`: model, optimizer, loss from `losses.registry`) and the plain
values the loop, the guard, the evaluation and the checkpoints need besides it.

Everything in `build` is cheap until a step is traced: it reads no data and compiles
nothing, so a config that cannot train fails first, with a `ConfigError` naming the
field and a fix. Tests and benchmarks call `build` and the raw `Trainer.train_step`.
"""

import dataclasses
import json
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
from absl import logging

from contrastive_jax import config_lib, losses, sharding
from contrastive_jax.config_lib import group_values, override
from contrastive_jax.data import settings, writer
from contrastive_jax.errors import ConfigError
from contrastive_jax.evaluation import evaluator
from contrastive_jax.models import released, saved_model, two_tower
from contrastive_jax.training import batch_schedule, config_checks, loop, loss_guard, optimizer, teacher
from contrastive_jax.training.trainer import GradientSettings, LoadedWeights, Trainer


@dataclasses.dataclass(frozen=True, eq=False)
class RunPlan:
    """A run as `build` checked it: the step (`trainer`) and the plain values the loop,
    the guard, the evaluation and the checkpoints read besides it."""

    trainer: Trainer
    data: settings.DataSettings  # what the input pipeline reads
    guard: loss_guard.GuardSettings  # what judges a step's loss
    loop_settings: loop.LoopSettings  # the cadences: steps, logs, saves, evaluations
    eval_settings: evaluator.EvalSettings  # what an evaluation computes, on which split
    run_config: dict[str, Any]  # the config as JSON, saved with each checkpoint (resume)
    match_keys: tuple[str, str] | None  # paired retrieval's id keys (records.Metadata)
    compute_dtype: str  # the model's activations, a name in two_tower.COMPUTE_DTYPES
    memory_limit_gib: float | None  # one device's memory; None: the device's own (memory_fit)
    saved_model: dict[str, Any] | None  # the model's settings as JSON (saved_model.describe), less the inputs
    batch_schedule: batch_schedule.ScheduleSettings  # each step's global batch (config.train.batch_schedule)

    def variant(self, fields: Mapping[str, Any]) -> "RunPlan":
        """This run with the config `fields` overridden (the memory check's candidates),
        on a mesh with the `mesh.fsdp` they name."""
        mesh, fsdp = self.trainer.mesh, fields.get("mesh.fsdp")
        config = override(config_lib.from_json(self.run_config), fields)
        return build(config, mesh if fsdp is None else sharding.make_mesh(mesh.size, fsdp=fsdp))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains (resuming from `workdir` if it holds a checkpoint) and evaluates.

    The config is read once, by `build`; the run then uses the plain values it returns
    (`loop.run_loop`). A built-in dataset's records are written first, once, where the
    config says (`write_builtin_records`; one line says so). Before the first step the
    train step is compiled (the executable the loop runs) and its memory per device
    checked against the device's (`memory_fit`). Logs a first line (backend, devices,
    batch, the step's memory per device), a short line per logging step, a line per
    rollback (`loss_guard`) and the headline metrics of each evaluation (`console`). A
    run that already reached `config.train.num_train_steps` and holds its evaluation
    returns that evaluation without compiling, training or evaluating again.

    Args:
      config: the experiment config (see configs/default.py).
      workdir: directory for checkpoints, metrics and evaluations; created if missing.

    Returns:
      The final evaluation metrics (also written to `<workdir>/eval_results.json`).

    Raises:
      ConfigError: the config, the workdir or the checkpoint to resume from cannot be
        used (raised before compiling; the message names the field and a fix), or the
        train step does not fit in the device's memory (the message names settings that
        fit).
      FloatingPointError: the loss became non-finite or spiked and
        `config.train.on_bad_loss` is "stop", or it rolled back too often; the message
        names the step(s) and the last good checkpoint, which is left untouched.
      loop.Preempted: SIGTERM arrived; the current step finished and was saved.
    """
    write_builtin_records(config)
    return loop.run_loop(build(config), workdir)


def write_builtin_records(config: ml_collections.ConfigDict) -> str | None:
    """Writes the records of the built-in dataset `config.data` names, when it reads one
    (not `config.data.records`) and they are not there yet; one line says so. The step a
    job, a study or a benchmark runs before `build`, which writes nothing.

    Returns:
      The directory written, or None (own records, or the built-in ones there already).
    """
    data = data_settings(config)
    written = writer.write_builtin_of(data)
    if written:
        logging.info("Wrote the built-in dataset %s's records to %s (once: later runs read them).", data.name, written)
    return written


# --------------------------------------------------------------- the door: the config read


def data_settings(config: ml_collections.ConfigDict) -> settings.DataSettings:
    """`config.data` (and the global batch size) as the input pipeline's plain values."""
    data = config.data
    besides = {"global_batch_size", "augment", "train_class_range", "records", "mixture_records", "mixture_weights"}
    besides |= {"captions_per_image", "max_num_patches", "patch_size"}
    sets = tuple(data.records.split(",") if isinstance(data.records, str) else data.records or ())
    weights = tuple(data.get("mixture_weights", ()))  # a run saved before mixtures has none
    return settings.DataSettings(
        **group_values(settings.DataSettings, data, besides=besides),
        records=sets[0] if sets else None,  # a mixture's first set: evaluation reads its splits
        mixture_records=sets if len(sets) > 1 or weights else (),
        mixture_weights=weights,
        captions_per_image=data.get("captions_per_image", 1),  # a run saved before it has none
        max_num_patches=data.get("max_num_patches", 0),  # NaFlex's budget; a run saved before it has none
        patch_size=config.model.patch_size,
        # The rows read a step; a run saved before extra negatives (`TrainedModel.data`) has none.
        global_batch_size=config.train.global_batch_size + config.loss.get("extra_negatives", 0),
        train_class_range=_optional_tuple(data.train_class_range),
        augment=settings.Augment(**data.augment.to_dict()),
    )


def guard_settings(config: ml_collections.ConfigDict) -> loss_guard.GuardSettings:
    """`config.train`'s bad-loss fields as `loss_guard.LossGuard`'s plain values."""
    own = group_values(loss_guard.GuardSettings, config.train, besides={"inject_nan_at_batches"})
    return loss_guard.GuardSettings(**own, inject_nan_at_batches=tuple(config.train.inject_nan_at_batches))


def loss_settings(config: ml_collections.ConfigDict) -> losses.LossSettings:
    """`config.loss` (and the seed and embedding width) as the loss's plain values."""
    own = group_values(losses.LossSettings, config.loss, besides={"seed", "embed_dim"})
    return losses.LossSettings(**own, seed=config.seed, embed_dim=config.model.embed_dim)


def settled(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with what one field says of another written out: the global batch a batch
    schedule's stages start with (`config.train.global_batch_size`), and a loss name of the
    last release that named a form of several positives (`losses.registry.DEPRECATED_NAMES`)
    as today's name and `config.loss.positives` (a DeprecationWarning says so)."""
    first = batch_schedule.first_stage(config.train.batch_schedule)
    if first is not None and first != config.train.global_batch_size:
        config = override(config, {"train.global_batch_size": first})
    name = config.loss.name
    if name not in losses.registry.DEPRECATED_NAMES:
        return config
    loss, form = losses.registry.DEPRECATED_NAMES[name]
    warnings.warn(
        f"config.loss.name={name!r} is deprecated: use config.loss.name={loss!r} and config.loss.positives={form!r}.",
        DeprecationWarning,
        stacklevel=2,
    )
    return override(config, {"loss.name": loss, "loss.positives": form})


def model_settings(config: ml_collections.ConfigDict, *, learned_bias: bool = False) -> two_tower.ModelSettings:
    """`config.model` and the loss's temperature (and SigLIP's bias when `learned_bias`)."""
    logit_scale = {"temperature_init", "learn_temperature", "bias_init", "teacher_dim"}
    m = group_values(two_tower.ModelSettings, config.model, besides=logit_scale)
    return two_tower.ModelSettings(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in m.items()},
        temperature_init=config.loss.temperature,
        learn_temperature=config.loss.learn_temperature,
        bias_init=config.loss.siglip_bias if learned_bias else None,
    )


def schedule_settings(config: ml_collections.ConfigDict) -> batch_schedule.ScheduleSettings:
    """`config.train.batch_schedule` and its noise rule's fields, read (`batch_schedule.parse`)."""
    train = config.train
    return batch_schedule.parse(
        train.batch_schedule,
        train.global_batch_size,
        extra_rows=config.loss.extra_negatives,
        noise_factor=train.batch_noise_factor,
        noise_window_steps=train.batch_noise_window_steps,
        batch_max=train.batch_max,
    )


def optim_settings(config: ml_collections.ConfigDict) -> optimizer.OptimSettings:
    """`config.optim` as the optimizer's plain values."""
    return optimizer.OptimSettings(**group_values(optimizer.OptimSettings, config.optim))


def loop_settings(config: ml_collections.ConfigDict) -> loop.LoopSettings:
    """The loop's cadences (`config.train`, `config.checkpoint`, `config.eval`)."""
    return loop.LoopSettings(
        num_train_steps=config.train.num_train_steps,
        log_every_steps=config.train.log_every_steps,
        checkpoint_every_steps=config.checkpoint.every_steps,
        checkpoint_max_to_keep=config.checkpoint.max_to_keep,
        eval_every_steps=config.eval.every_steps,
    )


def eval_settings(config: ml_collections.ConfigDict) -> evaluator.EvalSettings:
    """`config.eval`'s evaluation (its cadence is the loop's) as the evaluator's plain values."""
    ev = config.eval
    return evaluator.EvalSettings(
        split=ev.split,
        class_range=_optional_tuple(ev.class_range),
        batch_size=ev.batch_size,
        recall_ks=tuple(ev.recall_ks),
        knn_k=ev.knn_k,
        linear_probe=ev.linear_probe,
    )


def _optional_tuple(value):
    return None if value is None else tuple(value)


def build(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None) -> RunPlan:
    """The `RunPlan` of `config` on `mesh` (by default all devices, `config.mesh.fsdp`
    of them splitting the parameters), checking each part as it is built.

    The one place the config is read: everything below it takes the plain values read
    here (`data_settings`, `loss_settings`, `model_settings`, ...). Cheap: reads no data
    and compiles nothing, so a config that cannot train fails here, first.
    (`Trainer.init_state` needs the input shapes; the data are opened after the
    checkpoint to resume from is known.)

    Raises:
      ConfigError: a field with a bad or inconsistent value; the message names it and a fix.
    """
    config = settled(config)
    mesh = sharding.make_mesh(fsdp=config.mesh.fsdp) if mesh is None else mesh
    train = config.train
    loss = losses.registry.get(config.loss.name)
    data, guard, loss_config = data_settings(config), guard_settings(config), loss_settings(config)
    loss_table_size, metadata = config_checks.check(config, loss, sharding.batch_shards(mesh), data, guard, loss_config)
    schedule = schedule_settings(config)
    config_checks.check_batch_schedule(config, schedule, loss, loss_config, sharding.batch_shards(mesh), data)
    text_vocab_size = settings.text_vocab_size(data, metadata)
    distiller = _teacher(config, loss_config, data, text_vocab_size)
    loss = losses.with_terms(loss, loss_config)
    towers = model_settings(config, learned_bias=loss.learned_bias)
    if distiller and loss_config.distill_form != "logits" and distiller.embed_dim != towers.embed_dim:
        if towers.init_from:
            raise ConfigError(
                f"config.loss.distill_form={loss_config.distill_form!r} compares embeddings, and the teacher's "
                f"width {distiller.embed_dim} is not the released student's {towers.embed_dim}: use "
                "distill_form='logits', which compares the softmaxes over the batch at any widths."
            )
        towers = dataclasses.replace(towers, teacher_dim=distiller.embed_dim)  # a learned map to its width
    model, initial_params = _model(towers, data, text_vocab_size)
    step = Trainer(
        mesh,
        model,
        optimizer.make_optimizer(optim_settings(config), train.num_train_steps, model.TOWER_PARAMS),
        loss,
        loss_config,
        global_batch_size=train.global_batch_size + config.loss.extra_negatives,  # the data batch's rows
        seed=config.seed,
        id_keys=metadata.id_keys,
        gradient=GradientSettings(
            train.micro_batch_size, train.micro_batch_method, train.log_noise_scale, config.optim.lr_scaling
        ),
        loss_table_size=loss_table_size,
        fsdp_min_bytes=int(config.mesh.fsdp_min_kib * 1024),
        loaded=LoadedWeights(initial_params, distiller),
    )
    return RunPlan(
        step,
        data,
        guard,
        loop_settings(config),
        eval_settings(config),
        run_config=json.loads(config.to_json_best_effort()),
        match_keys=metadata.match_keys,
        compute_dtype=config.model.compute_dtype,
        memory_limit_gib=train.memory_limit_gib,
        saved_model=saved_model.describe(
            towers,
            model,
            text_vocab_size=text_vocab_size,
            tokenizer=data.tokenizer,
            text_max_length=data.text_max_length,
        ),
        batch_schedule=schedule,
    )


def _teacher(
    config: ml_collections.ConfigDict, loss: losses.LossSettings, data: settings.DataSettings, text_vocab_size: int
) -> teacher.Teacher | None:
    """The distillation teacher `config.loss.teacher` names, checked against the run (None: none)."""
    path = config.loss.teacher
    losses.weighted_terms.check_weights(loss, has_teacher=bool(path))
    if not path:
        return None
    if config.data.task == "labeled":
        raise ConfigError(
            "config.loss.teacher distils the pairs' logits or embeddings, and config.data.task is 'labeled': "
            "use task 'pairs' or 'views'."
        )
    return teacher.load(path, data, text_vocab_size=text_vocab_size)


def _model(towers: two_tower.ModelSettings, data: settings.DataSettings, text_vocab_size: int):
    """`(model, initial_params)`: the towers `towers` describe, initialised from the
    seed (`initial_params` None), or a released checkpoint checked against the inputs."""
    if not towers.init_from:
        if data.max_num_patches:
            raise ConfigError(
                f"config.data.max_num_patches={data.max_num_patches} feeds a released SigLIP 2 NaFlex "
                "(config.model.init_from); the project's own encoders take square images: set it to 0."
            )
        return two_tower.create_model(towers, text_vocab_size=text_vocab_size), None
    options = two_tower.tower_options(towers)
    loaded = released.load(towers.init_from, quick_gelu=towers.quick_gelu)
    released.check_inputs(
        loaded.settings,
        image_size=data.image_size,
        text_length=data.text_max_length,
        vocab_size=text_vocab_size,
        embed_dim=towers.embed_dim,
        learned_bias=towers.bias_init is not None,
        max_num_patches=data.max_num_patches,
        patch_size=towers.patch_size,
    )
    return loaded.model.clone(options=options, patch_dropout=two_tower.patch_dropout_of(towers)), loaded.params
