"""The trainer: `train_and_evaluate(config, workdir)`.

One pure `train_step` (forward on the global batch under `jit`, the loss inside
`jax.shard_map` over `sharding.DATA_AXIS` so it spans the global batch, optax update,
temperature clamp), jitted once with the state replicated, the batch split over a 1-D
data mesh, and the state donated. The state is created already sharded (`jax.eval_shape`
of the init function, then `jax.jit(init, out_shardings=...)`) or restored from the
newest checkpoint in `workdir` together with the input position.

Outputs in `workdir`: `checkpoints/<step>/`, `metrics.jsonl` (one JSON object per
logged step: training metrics and evaluations), `tensorboard/` event files,
`eval_results.json` (the final evaluation).
"""

import functools
import json
import math
import os
import sys
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

from contrastive_jax import checkpoint, evaluate, input_pipeline, losses, models, sharding
from contrastive_jax.sharding import DATA_AXIS


class TrainState(train_state.TrainState):
    """Flax's TrainState plus BatchNorm statistics (`{}` for models without BatchNorm)."""

    batch_stats: Any = None


# name -> (per-device model outputs, per-device labels [B] or None, config.loss) -> the
# global-batch loss; called inside shard_map, so every loss spans the global batch.
LOSSES: Mapping[str, Callable[[dict, Any, ml_collections.ConfigDict], jax.Array]] = {
    "clip": lambda o, y, c: losses.clip_loss(
        o["za"], o["zb"], temperature=o["temperature"], axis_name=DATA_AXIS
    ),
    "infonce": lambda o, y, c: losses.infonce_loss(
        o["za"], o["zb"], temperature=o["temperature"], axis_name=DATA_AXIS
    ),
    "ntxent": lambda o, y, c: losses.ntxent_loss(
        o["za"], o["zb"], temperature=o["temperature"], axis_name=DATA_AXIS
    ),
    "siglip": lambda o, y, c: losses.siglip_loss(
        o["za"], o["zb"], temperature=o["temperature"], bias=o["bias"], axis_name=DATA_AXIS
    ),
    "npairs": lambda o, y, c: losses.npairs_loss(o["za"], o["zb"], axis_name=DATA_AXIS),
    "supcon": lambda o, y, c: losses.supcon_loss(
        o["za"], y, temperature=o["temperature"], axis_name=DATA_AXIS
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


def validate_config(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
    """Raises ValueError naming the field and a fix for a config that cannot train.

    Runs before any data is read or anything compiled. `num_devices` defaults to all
    devices JAX sees.
    """
    num_devices = jax.device_count() if num_devices is None else num_devices
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
    input_pipeline.per_process_batch_size(config.train.global_batch_size, jax.process_count())


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
                frozen["za"], frozen["zb"], temperature=frozen["temperature"], axis_name=DATA_AXIS
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
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on a global batch (`a` [N, ...], optional `b`, `label` [N]).

    Pure: dropout randomness is `fold_in(key(seed), state.step)`, so a resumed run
    repeats an uninterrupted one. Returns the new state and scalar metrics.
    """
    rng = jax.random.fold_in(jax.random.key(seed), state.step)

    def loss_fn(params):
        outputs, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats},
            batch["a"],
            batch.get("b"),
            train=True,
            rngs={"dropout": rng},
            mutable=["batch_stats"],
        )
        loss, metrics = sharded_loss(
            outputs, batch.get("label"), loss_config=loss_config, mesh=mesh
        )
        return loss, (metrics, updates, outputs["temperature"])

    (loss, (metrics, updates, temperature)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params
    )
    learning_rate = schedule(state.step)
    state = state.apply_gradients(grads=grads, batch_stats=updates.get("batch_stats", {}))
    state = state.replace(params=models.clamp_temperature(state.params))
    metrics = dict(
        metrics,
        loss=loss,
        temperature=temperature,
        grad_norm=optax.global_norm(grads),
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

    def __init__(self, workdir: str, *, enabled: bool):
        self._enabled = enabled
        if enabled:
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
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
      FloatingPointError: the loss became non-finite; the message names the step and the
        last good checkpoint, which is left untouched.
    """
    validate_config(config)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    tf.config.set_visible_devices([], "GPU")  # tf.data only; keep accelerators for JAX.
    mesh = sharding.make_mesh()
    num_steps = config.train.num_train_steps
    lead = jax.process_index() == 0

    ckpt = checkpoint.Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep
    )
    latest = ckpt.latest_step()
    start_step = 0
    if latest is not None:
        position = ckpt.restore_position(latest)
        start_step = position["next_step"]
        expected = _position(config, start_step)
        for key in ("seed", "global_batch_size"):
            if position[key] != expected[key]:
                logging.warning(
                    "Resuming with %s=%s but checkpoint %d was written with %s: the data "
                    "order will not continue the interrupted run.",
                    key, expected[key], latest, position[key],
                )
    ds = input_pipeline.train_dataset(
        config,
        start_step=start_step,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    model = models.create_model(config, text_vocab_size=input_pipeline.TEXT_VOCAB_SIZE)
    tx, schedule = make_optimizer(config.optim, num_steps)
    init, abstract_state = create_train_state(config, model, tx, mesh, ds.element_spec)
    if latest is None:
        state = init()
    else:
        state = ckpt.restore_state(latest, abstract_state)
        logging.info("Resumed from %s at step %d.", ckpt.directory, latest)

    state_sharding = jax.tree.map(lambda s: s.sharding, abstract_state)
    data_sharding = sharding.data_sharding(mesh)
    step_fn = jax.jit(
        functools.partial(
            train_step, loss_config=config.loss, mesh=mesh, schedule=schedule, seed=config.seed
        ),
        in_shardings=(state_sharding, data_sharding),
        out_shardings=(state_sharding, sharding.replicated(mesh)),
        donate_argnums=0,
    )
    evaluator = evaluate.Evaluator(config, mesh)
    writer = MetricWriter(workdir, enabled=lead)
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
    try:
        for step in range(start_step + 1, num_steps + 1):
            state, metrics = step_fn(state, _global_batch(next(batches), data_sharding))
            if pending is not None:
                record(*pending)  # step t-1's metrics, read after dispatching step t
            pending = (step, metrics)
            progress.update(1)
            save = every(config.checkpoint.every_steps, step)
            run_eval = every(config.eval.every_steps, step)
            if save or run_eval:
                record(*pending)  # never save or evaluate a non-finite state
                pending = None
            if save:
                ckpt.save(step, state, _position(config, step))
            if run_eval:
                results = evaluator(state)
                writer.write(step, {f"eval/{k}": v for k, v in results.items()})
                logging.info("eval at step %d: %s", step, results)
        if start_step >= num_steps:  # already trained: evaluate the restored state
            results = evaluator(state)
    finally:  # also on errors: finish the saves already started, close the files
        progress.close()
        ckpt.close()
        writer.close()
    if lead:
        evaluate.write_json(os.path.join(workdir, "eval_results.json"), num_steps, results)
    return results


def _position(config: ml_collections.ConfigDict, next_step: int) -> dict[str, int]:
    """The input position saved with a checkpoint: the pipeline restarts at `next_step`."""
    return {
        "next_step": next_step,
        "seed": config.data.seed,
        "global_batch_size": config.train.global_batch_size,
    }
