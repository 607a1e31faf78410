"""The trainer: `train_and_evaluate(config, workdir)`.

One pure `train_step` (forward on the global batch under `jit`, the loss inside
`jax.shard_map` over `sharding.DATA_AXIS` so it spans the global batch, optax update,
temperature clamp), jitted once with the state replicated, the batch split over a 1-D
data mesh, and the state donated. The state is created already sharded (`jax.eval_shape`
of the init function, then `jax.jit(init, out_shardings=...)`) or restored from the
newest checkpoint in `workdir` together with the input position.

Outputs in `workdir`: `checkpoints/<step>/`, `metrics.jsonl` (one JSON object per
logged step: training metrics and evaluations), `tensorboard/` event files,
`eval_results.json` (the final evaluation); files are written by process 0 only.

Nothing lost: a run resumes from its newest good checkpoint (state, input position and
RNG are all in it, so the resumed run reaches the uninterrupted run's parameters bit for
bit); SIGTERM finishes the current step, saves and raises `Preempted`; a corrupt
checkpoint is reported and skipped for the previous one; resuming with another seed,
batch or data, or onto another model, is refused with the fields that changed.
Multi-process runs (`distributed.initialize`) train on one global batch per step whatever
the number of processes (see `input_pipeline`).
"""

import difflib
import functools
import importlib.util
import json
import math
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tensorflow as tf
import tqdm
from absl import logging
from flax.training import train_state
from jax.sharding import PartitionSpec as P

from contrastive_jax import (
    checkpoint,
    distributed,
    evaluate,
    grad_cache,
    input_pipeline,
    losses,
    models,
    sharding,
)
from contrastive_jax.sharding import DATA_AXIS


class TrainState(train_state.TrainState):
    """Flax's TrainState plus BatchNorm statistics (`{}` for models without BatchNorm)."""

    batch_stats: Any = None


# name -> (per-device model outputs, per-device labels [B] or None, config.loss) -> the
# global-batch loss; called inside shard_map, so every loss spans the global batch.
def _streaming(loss_config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The memory-linear options of the softmax / sigmoid losses (see losses.streaming)."""
    return {"chunk_size": loss_config.chunk_size, "collective": loss_config.collective}


LOSSES: Mapping[str, Callable[[dict, Any, ml_collections.ConfigDict], jax.Array]] = {
    "clip": lambda o, y, c: losses.clip_loss(
        o["za"], o["zb"], temperature=o["temperature"], axis_name=DATA_AXIS, **_streaming(c)
    ),
    "infonce": lambda o, y, c: losses.infonce_loss(
        o["za"], o["zb"], temperature=o["temperature"], axis_name=DATA_AXIS, **_streaming(c)
    ),
    "ntxent": lambda o, y, c: losses.ntxent_loss(
        o["za"], o["zb"], temperature=o["temperature"], axis_name=DATA_AXIS, **_streaming(c)
    ),
    "siglip": lambda o, y, c: losses.siglip_loss(
        o["za"],
        o["zb"],
        temperature=o["temperature"],
        bias=o["bias"],
        axis_name=DATA_AXIS,
        **_streaming(c),
    ),
    "npairs": lambda o, y, c: losses.npairs_loss(o["za"], o["zb"], axis_name=DATA_AXIS),
    "supcon": lambda o, y, c: losses.supcon_loss(
        o["za"], y, temperature=o["temperature"], axis_name=DATA_AXIS, **_streaming(c)
    ),
    "contrastive": lambda o, y, c: losses.contrastive_loss(
        o["za"], y, margin=c.margin, axis_name=DATA_AXIS
    ),
    "triplet": lambda o, y, c: losses.triplet_loss(
        o["za"], y, margin=c.margin, mining=c.triplet_mining, axis_name=DATA_AXIS
    ),
    "multi_similarity": lambda o, y, c: losses.multi_similarity_loss(
        o["za"], y, axis_name=DATA_AXIS
    ),
    "softmax_ce": lambda o, y, c: jax.lax.pmean(
        losses.softmax_cross_entropy(o["logits"], y, label_smoothing=c.label_smoothing).mean(),
        DATA_AXIS,
    ),
    "proxy_nca": lambda o, y, c: jax.lax.pmean(
        losses.proxy_nca_loss(o["za"], y, o["proxies"], temperature=o["temperature"]).mean(),
        DATA_AXIS,
    ),
}
PAIR_LOSSES = ("clip", "infonce", "ntxent", "siglip", "npairs")  # need inputs a and b
CLASSIFIER_LOSSES = ("softmax_ce", "proxy_nca")  # need config.model.num_classes > 0
# Model outputs with a batch dimension (split over the mesh); the rest are replicated.
_BATCHED_OUTPUTS = ("za", "zb", "logits")

OPTIMIZERS = ("adamw", "lamb", "lars", "sgd")
# A resumed run continues the interrupted one only when these are unchanged: they fix
# the data order, the augmentations and the RNG (see input_pipeline).
RESUME_FIELDS = (
    "seed",
    "data.name",
    "data.train_split",
    "data.train_class_range",
    "data.task",
    "data.seed",
    "data.examples_per_class",
    "train.global_batch_size",
)
# Every config's fields are those of this file's get_config().
_REFERENCE_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "default.py"


class Preempted(Exception):
    """Training stopped at a SIGTERM after saving a checkpoint; rerun to resume."""


def _flatten(config: Mapping[str, Any], prefix: str = "config") -> dict[str, Any]:
    """`{"config.loss.temperature": 0.07, ...}` for a ConfigDict or a nested dict."""
    out = {}
    for key, value in config.items():
        if isinstance(value, (Mapping, ml_collections.ConfigDict)):
            out |= _flatten(value, f"{prefix}.{key}")
        else:
            out[f"{prefix}.{key}"] = value
    return out


def check_fields(config: ml_collections.ConfigDict, reference: ml_collections.ConfigDict) -> None:
    """Raises ValueError for a field `reference` does not have (a typo) or one it has and
    `config` lacks.

    Args:
      reference: the config whose fields are the valid ones (`configs/default.py`).
    """
    fields, known = _flatten(config), _flatten(reference)
    for name in fields:
        if name not in known:
            siblings = [k for k in known if k.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]]
            close = difflib.get_close_matches(name, siblings or list(known), n=1)
            hint = f"did you mean {close[0]}?" if close else f"the fields are {sorted(known)}."
            raise ValueError(f"{name} is not a config field (a typo?); {hint}")
    for name in known:
        if name not in fields:
            raise ValueError(
                f"{name} is missing from the config; add it ({_REFERENCE_CONFIG.name} sets "
                f"{name} = {known[name]!r})."
            )


def _reference_config() -> ml_collections.ConfigDict | None:
    """`configs/default.py`'s config, or None outside a source checkout."""
    if not _REFERENCE_CONFIG.exists():
        return None
    spec = importlib.util.spec_from_file_location("_reference_config", _REFERENCE_CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()

# config.train.micro_batch_method -> how a step is split into micro-batches.
MICRO_BATCH_METHODS = {
    "grad_cache": grad_cache.grad_cache_value_and_grad,
    "accumulate": grad_cache.accumulated_value_and_grad,
}


def validate_config(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
    """Raises ValueError naming the field and a fix for a config that cannot train.

    Runs before any data is read or anything compiled. `num_devices` defaults to all
    devices JAX sees.
    """
    num_devices = jax.device_count() if num_devices is None else num_devices
    reference = _reference_config()
    if reference is None:
        logging.warning("%s not found: config field names are not checked.", _REFERENCE_CONFIG)
    else:
        check_fields(config, reference)
    data, loss = config.data, config.loss
    input_pipeline.check_data_config(data)
    if loss.name not in LOSSES:
        raise ValueError(f"config.loss.name={loss.name!r}; use one of {sorted(LOSSES)}.")
    if loss.name in PAIR_LOSSES and data.task == "labeled":
        raise ValueError(
            f"config.loss.name={loss.name!r} needs paired inputs but config.data.task is "
            "'labeled'; use task 'pairs' or 'views', or a label loss."
        )
    if loss.name not in PAIR_LOSSES and input_pipeline.SOURCES[data.name].label_key is None:
        raise ValueError(
            f"config.loss.name={loss.name!r} needs labels but {data.name!r} has none; use "
            f"one of {PAIR_LOSSES}."
        )
    if (loss.name in CLASSIFIER_LOSSES) != (config.model.num_classes > 0):
        raise ValueError(
            f"config.model.num_classes={config.model.num_classes} with config.loss.name="
            f"{loss.name!r}: losses {CLASSIFIER_LOSSES} need a classifier head "
            "(num_classes = the number of training classes), the others need num_classes=0."
        )
    make_optimizer(config.optim, config.train.num_train_steps)  # checks the optimizer
    # Checks the encoders, compute dtype and temperature (building modules is cheap).
    models.create_model(config, text_vocab_size=input_pipeline.TEXT_VOCAB_SIZE)
    if config.train.num_train_steps < 1:
        raise ValueError(f"config.train.num_train_steps={config.train.num_train_steps} must be >= 1.")
    if config.train.log_every_steps < 1:
        raise ValueError(
            f"config.train.log_every_steps={config.train.log_every_steps} must be >= 1."
        )
    for group, field in (("eval", "every_steps"), ("checkpoint", "every_steps")):
        if config[group][field] < 0:
            raise ValueError(f"config.{group}.{field}={config[group][field]} must be >= 0 (0: at the end only).")
    sharding.check_batch_divides(
        config.train.global_batch_size, num_devices, "config.train.global_batch_size"
    )
    _check_chunk_size(loss, config.train.global_batch_size, num_devices)
    if config.train.micro_batch_size:
        if config.train.micro_batch_method not in MICRO_BATCH_METHODS:
            raise ValueError(
                f"config.train.micro_batch_method={config.train.micro_batch_method!r}; use "
                f"one of {sorted(MICRO_BATCH_METHODS)}."
            )
        grad_cache.check_micro_batches(
            config.train.global_batch_size, config.train.micro_batch_size, num_devices
        )
    input_pipeline.per_process_batch_size(config.train.global_batch_size, jax.process_count())


def _check_chunk_size(loss: ml_collections.ConfigDict, global_batch_size: int, num_devices: int):
    """A streamed loss's column blocks must tile its logits: N columns, N / devices with a ring."""
    chunk = loss.get("chunk_size")
    if not chunk:  # None or 0: dense logits
        return
    ring = loss.get("collective") == "ring"
    columns = global_batch_size // num_devices if ring else global_batch_size
    if chunk < 1 or columns % chunk:
        divisor = max(d for d in range(1, min(max(chunk, 1), columns) + 1) if columns % d == 0)
        raise ValueError(
            f"config.loss.chunk_size={chunk} does not divide the {columns} logit columns "
            f"{'each device holds with the ring' if ring else 'of the global batch'}; use a "
            f"divisor such as {divisor}, or None for dense logits."
        )


def prepare_workdir(workdir: str | os.PathLike | None) -> str:
    """Creates `workdir` if needed and returns its absolute path.

    Raises:
      ValueError: `workdir` is not given, or cannot be created or written.
    """
    if not workdir:
        raise ValueError(
            "No workdir: pass --workdir=DIR (created if missing) for checkpoints and metrics."
        )
    workdir = os.path.abspath(workdir)
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        raise ValueError(
            f"--workdir={workdir} cannot be created or written ({e.strerror or e}); pass a "
            "directory you can write to (on storage every process shares)."
        ) from e
    return workdir


def weight_decay_mask(params) -> Any:
    """True for weight matrices and kernels; False for biases, norm scales, the temperature."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(
    optim: ml_collections.ConfigDict, num_train_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer `config.optim` names, with warmup + cosine decay and clipping."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_train_steps, optim.warmup_steps + 1),
        end_value=optim.learning_rate * optim.end_learning_rate_factor,
    )
    wd, mask = optim.weight_decay, weight_decay_mask
    if optim.name == "adamw":
        tx = optax.adamw(schedule, b1=optim.momentum, weight_decay=wd, mask=mask)
    elif optim.name == "lamb":
        tx = optax.lamb(schedule, b1=optim.momentum, weight_decay=wd, mask=mask)
    elif optim.name == "lars":
        tx = optax.lars(
            schedule,
            weight_decay=wd,
            weight_decay_mask=mask,
            trust_ratio_mask=mask,
            momentum=optim.momentum,
        )
    elif optim.name == "sgd":
        tx = optax.chain(
            optax.add_decayed_weights(wd, mask=mask), optax.sgd(schedule, momentum=optim.momentum)
        )
    else:
        raise ValueError(f"config.optim.name={optim.name!r}; use one of {OPTIMIZERS}.")
    if optim.grad_clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), tx)
    return tx, schedule


def sharded_loss(
    outputs: dict[str, jax.Array],
    labels: jax.Array | None,
    *,
    loss_config: ml_collections.ConfigDict,
    mesh: jax.sharding.Mesh,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The configured loss over the global batch, and in-batch retrieval metrics.

    Args:
      outputs: the model's outputs for the global batch (`za`, `zb` [N, D], ...).
      labels: [N] int or None.

    Returns:
      The scalar loss and, for paired inputs, `losses.contrastive_metrics` scalars.
    """
    loss_fn = LOSSES[loss_config.name]
    specs = {k: P(DATA_AXIS) if k in _BATCHED_OUTPUTS else P() for k in outputs}

    def per_device(outputs, labels):
        loss = loss_fn(outputs, labels, loss_config)
        metrics = {}
        if "zb" in outputs:
            frozen = jax.lax.stop_gradient(outputs)
            metrics = losses.contrastive_metrics(
                frozen["za"],
                frozen["zb"],
                temperature=frozen["temperature"],
                axis_name=DATA_AXIS,
                chunk_size=loss_config.chunk_size,
            )
        return loss, metrics

    return jax.shard_map(
        per_device, mesh=mesh, in_specs=(specs, P(DATA_AXIS)), out_specs=P()
    )(outputs, labels)


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    loss_config: ml_collections.ConfigDict,
    mesh: jax.sharding.Mesh,
    schedule: optax.Schedule,
    seed: int,
    micro_batch_size: int = 0,
    micro_batch_method: str = "grad_cache",
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on a global batch (`a` [N, ...], optional `b`, `label` [N]).

    With `micro_batch_size` m > 0 the batch is embedded in N / m micro-batches:
    `micro_batch_method="grad_cache"` gives the exact full-batch gradient holding one
    micro-batch's activations at a time; `"accumulate"` averages the micro-batches'
    own losses (fewer negatives: a different objective). See `grad_cache`.

    Pure: dropout randomness is `fold_in(fold_in(key(seed), state.step), micro_index)`,
    so a resumed run repeats an uninterrupted one. Returns the new state and scalar
    metrics.
    """
    rng = jax.random.fold_in(jax.random.key(seed), state.step)

    def forward(params, inputs, micro_index):
        outputs, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats},
            inputs["a"],
            inputs.get("b"),
            train=True,
            rngs={"dropout": jax.random.fold_in(rng, micro_index)},
            mutable=["batch_stats"],
        )
        batched = {k: v for k, v in outputs.items() if k in _BATCHED_OUTPUTS}
        shared = {k: v for k, v in outputs.items() if k not in _BATCHED_OUTPUTS}
        return batched, shared, updates

    def loss_of_outputs(batched, shared, inputs):
        loss, metrics = sharded_loss(
            {**batched, **shared}, inputs.get("label"), loss_config=loss_config, mesh=mesh
        )
        return loss, dict(metrics, temperature=shared["temperature"])

    if micro_batch_size:
        value_and_grad = MICRO_BATCH_METHODS[micro_batch_method]
        (loss, metrics, updates), grads = value_and_grad(
            forward,
            loss_of_outputs,
            state.params,
            batch,
            num_micro_batches=batch["a"].shape[0] // micro_batch_size,
            num_shards=mesh.shape[DATA_AXIS],
        )
    else:

        def full_batch_loss(params):
            batched, shared, updates = forward(params, batch, 0)
            loss, metrics = loss_of_outputs(batched, shared, batch)
            return loss, (metrics, updates)

        (loss, (metrics, updates)), grads = jax.value_and_grad(full_batch_loss, has_aux=True)(
            state.params
        )
    learning_rate = schedule(state.step)
    state = state.apply_gradients(grads=grads, batch_stats=updates.get("batch_stats", {}))
    state = state.replace(params=models.clamp_temperature(state.params))
    metrics = dict(
        metrics,
        loss=loss,
        grad_norm=optax.tree.norm(grads),
        learning_rate=learning_rate,
    )
    return state, metrics


def create_train_state(
    config: ml_collections.ConfigDict,
    model: models.TwoTower,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    element_spec: Mapping[str, Any],
) -> tuple[Callable[[], TrainState], TrainState]:
    """The abstract (sharded) state and a function creating the real one on the mesh.

    Args:
      element_spec: the input pipeline's batch spec (shapes and dtypes of `a`, `b`).

    Returns:
      `(init, abstract_state)`: `init()` returns the initial state, replicated over the
      mesh; `abstract_state` holds `jax.ShapeDtypeStruct`s with shardings (the target
      for restoring a checkpoint onto this mesh).
    """
    dummy = {
        k: jnp.zeros((1, *spec.shape[1:]), spec.dtype.as_numpy_dtype)
        for k, spec in element_spec.items()
        if k in ("a", "b")
    }

    def init(rng):
        variables = model.init({"params": rng}, dummy["a"], dummy.get("b"), train=False)
        return TrainState.create(
            apply_fn=model.apply,
            params=variables["params"],
            tx=tx,
            batch_stats=variables.get("batch_stats", {}),
        )

    rng = jax.random.key(config.seed)
    shapes = jax.eval_shape(init, rng)
    shardings = jax.tree.map(lambda _: sharding.replicated(mesh), shapes)
    abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )
    return functools.partial(jax.jit(init, out_shardings=shardings), rng), abstract_state


class MetricWriter:
    """Scalars to `<workdir>/metrics.jsonl` and TensorBoard (process 0 only)."""

    def __init__(self, workdir: str, *, enabled: bool, start_step: int = 0):
        """Opens the files; `metrics.jsonl` keeps only the lines of steps <= `start_step`.

        Lines after the checkpoint a run resumes from were written by the interrupted
        run (the last one possibly cut off by a kill); they are dropped, since the
        resumed run logs those steps again, so the file holds each step once.
        """
        self._enabled = enabled
        if enabled:
            path = os.path.join(workdir, "metrics.jsonl")
            kept = []
            if os.path.exists(path):
                with open(path) as f:
                    kept = [
                        line for line in f
                        if line.endswith("\n") and json.loads(line)["step"] <= start_step
                    ]
            with open(f"{path}.tmp", "w") as f:
                f.writelines(kept)
            os.replace(f"{path}.tmp", path)
            self._jsonl = open(path, "a")
            self._summary = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Appends one JSON line `{"step": step, **scalars}` and the TensorBoard scalars."""
        if not self._enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        with self._summary.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self._summary.flush()

    def close(self) -> None:
        if self._enabled:
            self._jsonl.close()
            self._summary.close()


def _global_batch(batch: dict[str, np.ndarray], data_sharding) -> dict[str, jax.Array]:
    return {
        k: jax.make_array_from_process_local_data(data_sharding, v) for k, v in batch.items()
    }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains (resuming from `workdir` if it holds a checkpoint) and evaluates.

    Args:
      config: the experiment config (see configs/default.py).
      workdir: directory for checkpoints, metrics and evaluations; created if missing.

    Returns:
      The final evaluation metrics (also written to `<workdir>/eval_results.json`).

    Raises:
      ValueError: the config, the workdir or the checkpoint to resume from cannot be
        used (raised before compiling; the message names the field and a fix).
      FloatingPointError: the loss became non-finite; the message names the step and the
        last good checkpoint, which is left untouched.
      Preempted: SIGTERM arrived; the current step finished and was saved.
    """
    validate_config(config)
    workdir = prepare_workdir(workdir)
    tf.config.set_visible_devices([], "GPU")  # tf.data only; keep accelerators for JAX.
    mesh = sharding.make_mesh()
    num_steps = config.train.num_train_steps
    lead = jax.process_index() == 0

    ckpt = checkpoint.Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep
    )
    model = models.create_model(config, text_vocab_size=input_pipeline.TEXT_VOCAB_SIZE)
    tx, schedule = make_optimizer(config.optim, num_steps)
    try:
        start_step, ds, state, abstract_state = _start(ckpt, config, model, tx, mesh)
    except BaseException:  # refused or failed before training: release the manager
        ckpt.close()
        raise

    state_sharding = jax.tree.map(lambda s: s.sharding, abstract_state)
    data_sharding = sharding.data_sharding(mesh)
    step_fn = jax.jit(
        functools.partial(
            train_step,
            loss_config=config.loss,
            mesh=mesh,
            schedule=schedule,
            seed=config.seed,
            micro_batch_size=config.train.micro_batch_size,
            micro_batch_method=config.train.micro_batch_method,
        ),
        in_shardings=(state_sharding, data_sharding),
        out_shardings=(state_sharding, sharding.replicated(mesh)),
        donate_argnums=0,
    )
    # Evaluation runs whole in every process, on its own devices (the state is replicated).
    if jax.process_count() == 1:
        eval_mesh, local_state = mesh, lambda state: state
    else:
        eval_mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (DATA_AXIS,))
        local_state = lambda state: jax.tree.map(  # noqa: E731
            lambda x: jax.device_put(x.addressable_data(0), sharding.replicated(eval_mesh)), state
        )
    evaluator = evaluate.Evaluator(config, eval_mesh)
    writer = MetricWriter(workdir, enabled=lead, start_step=start_step)
    progress = tqdm.tqdm(
        total=num_steps, initial=start_step, desc="train", disable=not (lead and sys.stderr.isatty())
    )
    batches = ds.as_numpy_iterator()
    window: list[dict[str, float]] = []
    window_start = time.perf_counter()

    def record(step: int, metrics) -> None:
        """Fetches a finished step's metrics, stops on a non-finite loss, logs every k."""
        nonlocal window_start
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not math.isfinite(values["loss"]):
            last = ckpt.latest_step()
            where = f"step {last} in {ckpt.directory}" if last is not None else "none"
            raise FloatingPointError(
                f"Loss is {values['loss']} at step {step}; training stopped. Last good "
                f"checkpoint: {where} (left untouched). Lower config.optim.learning_rate "
                "or set config.optim.grad_clip_norm, then rerun to resume from it."
            )
        window.append(values)
        if step % config.train.log_every_steps == 0 or step == num_steps:
            elapsed = time.perf_counter() - window_start
            scalars = {f"train/{k}": float(np.mean([w[k] for w in window])) for k in window[0]}
            scalars["train/examples_per_second"] = (
                len(window) * config.train.global_batch_size / elapsed
            )
            writer.write(step, scalars)
            progress.set_postfix(loss=f"{scalars['train/loss']:.4f}")
            logging.info("step %d: %s", step, scalars)
            window.clear()
            window_start = time.perf_counter()

    def every(k: int, step: int) -> bool:
        return step == num_steps or (k > 0 and step % k == 0)

    results = {}
    pending = None  # (step, metrics) dispatched but not yet read
    preempted = False
    try:
        with distributed.Preemption() as preemption:
            for step in range(start_step + 1, num_steps + 1):
                state, metrics = step_fn(state, _global_batch(next(batches), data_sharding))
                if pending is not None:
                    record(*pending)  # step t-1's metrics, read after dispatching step t
                pending = (step, metrics)
                progress.update(1)
                preempted = preemption.reached(step)
                save = preempted or every(config.checkpoint.every_steps, step)
                run_eval = not preempted and every(config.eval.every_steps, step)
                if save or run_eval:
                    record(*pending)  # never save or evaluate a non-finite state
                    pending = None
                if save:
                    ckpt.save(step, state, _position(config, step))
                if preempted:
                    break
                if run_eval:
                    results = evaluator(local_state(state))
                    writer.write(step, {f"eval/{k}": v for k, v in results.items()})
                    logging.info("eval at step %d: %s", step, results)
        if start_step >= num_steps:  # already trained: evaluate the restored state
            results = evaluator(local_state(state))
    finally:  # also on errors: finish the saves already started, close the files
        progress.close()
        ckpt.close()
        writer.close()
    if preempted:
        raise Preempted(
            f"SIGTERM: stopped after step {step} and saved it in {ckpt.directory}; rerun the "
            "same command to resume."
        )
    if lead:
        evaluate.write_json(os.path.join(workdir, "eval_results.json"), num_steps, results)
    return results


def _start(ckpt, config, model, tx, mesh):
    """`(start_step, dataset, state, abstract_state)` to train from.

    The state is restored from the newest checkpoint that reads back intact (corrupt
    ones are reported and quarantined), or initialised when there is none.
    """
    while True:
        latest = ckpt.latest_step()
        try:
            position = None if latest is None else ckpt.restore_position(latest)
            start_step = 0 if position is None else _check_resume(position, config, latest)
            ds = input_pipeline.train_dataset(
                config,
                start_step=start_step,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
            )
            init, abstract_state = create_train_state(config, model, tx, mesh, ds.element_spec)
            if position is None:
                return start_step, ds, init(), abstract_state
            state = _restore_state(ckpt, latest, abstract_state, position, config)
            logging.info("Resumed from %s at step %d.", ckpt.directory, latest)
            return start_step, ds, state, abstract_state
        except checkpoint.CorruptCheckpointError as e:
            ckpt.quarantine(latest, e)


def _position(config: ml_collections.ConfigDict, next_step: int) -> dict[str, Any]:
    """The input position saved with a checkpoint: the pipeline restarts at `next_step`.

    The config is saved with it, to check that a resumed run continues the same stream
    (`RESUME_FIELDS`) and to name the fields that changed when the model did.
    """
    return {"next_step": next_step, "config": json.loads(config.to_json_best_effort())}


def _changed_fields(position: Mapping[str, Any], config: ml_collections.ConfigDict) -> dict:
    """`{field: (value in the checkpoint, value now)}` for the fields that differ."""
    saved = _flatten(position.get("config", {}))
    now = _flatten(json.loads(config.to_json_best_effort()))
    return {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}


def _check_resume(position: Mapping[str, Any], config: ml_collections.ConfigDict, step: int) -> int:
    """The step to resume from; ValueError when the run would not continue the saved one."""
    changed = _changed_fields(position, config)
    for name in RESUME_FIELDS:
        if f"config.{name}" in changed:
            before, now = changed[f"config.{name}"]
            raise ValueError(
                f"Cannot resume from checkpoint {step}: it was written with config.{name}="
                f"{before!r}, this run has {now!r}, so the data order and RNG would not "
                f"continue it. Set --config.{name}={before!r}, or use a new --workdir."
            )
    return position["next_step"]


def _restore_state(ckpt, step, abstract_state, position, config):
    """`ckpt.restore_state`, naming the changed config fields when the model changed."""
    try:
        return ckpt.restore_state(step, abstract_state)
    except checkpoint.IncompatibleCheckpointError as e:
        changed = {
            k: v for k, v in _changed_fields(position, config).items()
            if k.split(".")[1] in ("model", "loss", "optim", "data")
        }
        fields = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise checkpoint.IncompatibleCheckpointError(
            f"Cannot resume onto another model. {e}. Config fields changed since then: "
            f"{fields or 'none in model/loss/optim/data'}. Set them back to resume, or "
            "use a new --workdir to train the new model from scratch."
        ) from None
