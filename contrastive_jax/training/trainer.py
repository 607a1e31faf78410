"""The train step: a `Trainer` creates the state on its mesh and owns the train step and
its jit (`init_state`, `jit_train_step`, `compile_step`, the raw `train_step`, the loss
over the global batch in `global_loss`).

`run_plan.build(config, mesh)` makes one, with what the loop needs besides the step (a
`run_plan.RunPlan`); tests and benchmarks call the raw `Trainer.train_step` directly.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses, sharding
from contrastive_jax.models import two_tower
from contrastive_jax.sharding import BATCH_AXES
from contrastive_jax.training import forward, grad_cache, noise_scale, optimizer


class TrainState(train_state.TrainState):
    """Flax's TrainState plus BatchNorm statistics (`{}` for models without BatchNorm)
    and the loss's state (`losses.LossState`; None for losses without one)."""

    batch_stats: Any = None
    loss_state: Any = None
    teacher: Any = None  # a distillation teacher's variables (`training.teacher`), frozen; None: none


def loss_inputs(batched: dict[str, Any], shared: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """What a loss's `fn` reads on one device: the model's outputs and the data fields, the
    extra rows' of both in one `extra`."""
    extra = {**batched.get("extra", {}), **data.get("extra", {})}
    return {**batched, **shared, **data, **({"extra": extra} if extra else {})}


@dataclasses.dataclass(frozen=True)
class GradientSettings:
    """How the step takes the gradient of the global loss (`config.train`'s fields, their
    comments in configs/default.py): in one pass (the default), in micro-batches
    (`micro_batch_size` > 0), or per device to log the noise scale (`log_noise_scale`);
    and how its update follows the global batch (`lr_scaling`, `config.optim.lr_scaling`)."""

    micro_batch_size: int = 0  # examples per micro-batch over all devices; 0: none
    micro_batch_method: str = "grad_cache"  # a name in grad_cache.MICRO_BATCH_METHODS
    log_noise_scale: bool = False  # the step also returns the noise scale's norms (noise_scale)
    lr_scaling: str = "none"  # the rate at a batch N: optimizer.rate_factor(lr_scaling, N, global_batch_size)

    @property
    def method(self) -> str:
        """How the gradient is taken, "full_batch", "noise_scale", or a name in
        `grad_cache.MICRO_BATCH_METHODS`."""
        if self.log_noise_scale:
            return "noise_scale"
        return self.micro_batch_method if self.micro_batch_size else "full_batch"


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedWeights:
    """Weights read from files before the run compiles (`run_plan.build`), both NumPy:
    a released checkpoint's parameters the student starts from, and the frozen teacher it
    distils from."""

    params: Any = None  # the student's initial parameters; None: initialised from the trainer's `seed`
    teacher: Any = None  # the distillation teacher (`teacher.Teacher`); None: no distillation


@dataclasses.dataclass(frozen=True, eq=False)
class Trainer:
    """The step of a run: its model, optimizer and loss on a mesh (`run_plan.build` checked
    them against each other and the mesh)."""

    mesh: jax.sharding.Mesh
    model: two_tower.TwoTower
    optim: optimizer.Optimizer  # the update (`tx`) and its learning-rate schedule
    loss: losses.Loss
    loss_settings: losses.LossSettings
    global_batch_size: int  # examples per step over all processes (a batch schedule's first stage)
    seed: int  # parameter init and dropout
    id_keys: tuple[str, ...]  # the dataset's id keys, stacked into `groups`
    gradient: GradientSettings = GradientSettings()
    loss_table_size: int = 0  # rows of a per-example loss state (SogCLR's); 0: none
    fsdp_min_bytes: int = 0  # arrays smaller than this stay replicated on the fsdp axis (sharding.fsdp_spec)
    loaded: LoadedWeights = LoadedWeights()  # a released checkpoint's parameters, a teacher

    def init_state(self, element_spec: Mapping[str, Any]) -> tuple[Callable[[], TrainState], TrainState]:
        """`(init, abstract_state)`: `init()` creates the initial state on the mesh;
        `abstract_state` holds its `jax.ShapeDtypeStruct` leaves with shardings (the
        target for restoring a checkpoint onto this mesh, whatever mesh wrote it).

        Parameters, optimizer moments, a momentum encoder's copy and a distillation
        teacher's variables (`TrainState.teacher`) are split over the mesh's `fsdp` axis
        (`sharding.fsdp_shardings`; replicated when it has size 1);
        the loss state's `LossState.sharded` rows over the batch axes.

        Args:
          element_spec: shapes and dtypes of the inputs `a` [B, ...] and optional `b`
            (the input pipeline's `element_spec`, or `jax.ShapeDtypeStruct` values).
        """
        dummy = {
            k: np.zeros((1, *spec.shape[1:]), np.dtype(spec.dtype))
            for k, spec in element_spec.items()
            if k in ("a", "b")
        }

        def init(rng, initial_params, teacher):
            variables = self.model.init({"params": rng}, dummy["a"], dummy.get("b"), train=False)
            params = variables["params"] if initial_params is None else initial_params
            loss_state = self.loss.state and self.loss.state.init(self.loss_settings, params, self.loss_table_size)
            return TrainState.create(
                apply_fn=self.model.apply,
                params=params,
                tx=self.optim.tx,
                batch_stats=variables.get("batch_stats", {}),
                loss_state=loss_state,
                teacher=teacher,
            )

        rng = jax.random.key(self.seed)
        teacher = None if self.loaded.teacher is None else self.loaded.teacher.variables
        shapes = jax.eval_shape(init, rng, self.loaded.params, teacher)
        shardings = sharding.fsdp_shardings(shapes, self.mesh, self.fsdp_min_bytes)
        if self.loss.state is not None:  # as `global_loss` takes it; a momentum encoder like the parameters
            inside, outside = self._split_params_like(shardings.loss_state)
            specs = self._loss_state_specs(inside)
            placed = lambda spec: NamedSharding(self.mesh, spec)  # noqa: E731
            inside = jax.tree.map(placed, specs, is_leaf=lambda x: isinstance(x, P))
            shardings = shardings.replace(loss_state={**inside, **outside})
        abstract_state = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
        )
        init = functools.partial(jax.jit(init, out_shardings=shardings), rng, self.loaded.params, teacher)
        return init, abstract_state

    def jit_train_step(self, abstract_state: TrainState) -> Callable:
        """`train_step` jitted for this mesh: the state placed as `abstract_state` says
        (and donated), the batch split over the batch axes."""
        state_sharding = jax.tree.map(lambda s: s.sharding, abstract_state)
        return jax.jit(
            self.train_step,
            in_shardings=(state_sharding, sharding.data_sharding(self.mesh)),
            out_shardings=(state_sharding, sharding.replicated(self.mesh)),
            donate_argnums=0,
        )

    def compile_step(
        self, abstract_state: TrainState, element_spec: Mapping[str, Any], global_batch: int | None = None
    ) -> jax.stages.Compiled:
        """`jit_train_step` compiled for a global batch of `global_batch` examples (None:
        `global_batch_size`) shaped as the input pipeline's `element_spec` says (the
        executable the loop runs for that batch; `memory_fit` reads its memory)."""
        size = self.global_batch_size if global_batch is None else global_batch
        batch = {
            k: jax.ShapeDtypeStruct((size, *v.shape[1:]), v.dtype, sharding=sharding.data_sharding(self.mesh))
            for k, v in element_spec.items()
        }
        return self.jit_train_step(abstract_state).lower(abstract_state, batch).compile()

    def train_step(self, state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer step on a global batch (`a` [N, ...], optional `b`, `label` [N], and
        the rows of `forward`: `negatives`, M extra rows after each device's).

        Pure: dropout randomness is `fold_in(fold_in(key(seed), state.step), micro_index)`,
        so a resumed run repeats an uninterrupted one. Every row is embedded by one
        `forward.Forward`, whichever way the gradient is taken (`GradientSettings.method`).
        A loss with state (`losses.LossState`) updates `state.loss_state` once, from the
        whole batch. Returns the new state and scalar metrics (`loss`, `grad_norm`,
        `learning_rate`, `temperature`, the loss's own).
        """
        embed, batch = forward.of_step(
            state,
            batch,
            self.model,
            seed=self.seed,
            extra_rows=self.loss_settings.extra_negatives,
            num_shards=sharding.batch_shards(self.mesh),
            key_params=self._key_encoder(state.loss_state),
            teacher=None if self.loaded.teacher is None else self.loaded.teacher.model,
        )
        (loss, metrics, loss_state, updates), grads = self._value_and_grad(embed, state, batch)
        state, learning_rate = self._apply_gradients(state, grads, batch["a"].shape[0], updates.get("batch_stats", {}))
        state = state.replace(params=two_tower.clamp_temperature(state.params))
        if self.loss.state is not None and self.loss.state.after_step is not None:
            loss_state = self.loss.state.after_step(loss_state, state.params, self.loss_settings)
        state = state.replace(loss_state=loss_state)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads), learning_rate=learning_rate)
        return state, metrics

    def _value_and_grad(self, embed: forward.Forward, state: TrainState, batch: dict[str, Any]):
        """`((loss, metrics, loss state, model updates), grads)` of the global loss of the rows
        `embed` embeds, taken as `self.gradient.method` says: in one pass; in micro-batches
        (`grad_cache.MICRO_BATCH_METHODS`); or per device, for the noise scale's norms."""

        def loss_of_outputs(batched, shared, inputs):
            loss, metrics, loss_state = self.global_loss(
                batched, shared, self.loss_data(inputs), state.loss_state, state.step
            )
            return loss, (metrics, loss_state)

        method = self.gradient.method
        if method == "noise_scale":
            loss, metrics, updates, grads = self._noise_scale_value_and_grad(embed, state.params, batch)
            return (loss, metrics, state.loss_state, updates), grads
        if method == "full_batch":

            def full_batch_loss(params):
                batched, shared, updates = embed(params, batch, 0)
                loss, (metrics, loss_state) = loss_of_outputs(batched, shared, batch)
                return loss, (metrics, loss_state, updates)

            (loss, (metrics, loss_state, updates)), grads = jax.value_and_grad(full_batch_loss, has_aux=True)(
                state.params
            )
            return (loss, metrics, loss_state, updates), grads
        (loss, (metrics, loss_state), updates), grads = grad_cache.MICRO_BATCH_METHODS[method](
            embed,
            loss_of_outputs,
            state.params,
            batch,
            num_micro_batches=batch["a"].shape[0] // self.gradient.micro_batch_size,
            num_shards=sharding.batch_shards(self.mesh),
        )
        return (loss, metrics, loss_state, updates), grads

    def _apply_gradients(self, state: TrainState, grads, global_batch: int, batch_stats) -> tuple[TrainState, Any]:
        """`(state after the optimizer's update, the learning rate it took)`: at a global
        batch of `global_batch` the update is scaled by `optimizer.rate_factor` (the rate's
        rule, `config.optim.lr_scaling`; the schedule and its warm-up count steps)."""
        first = self.global_batch_size - self.loss_settings.extra_negatives  # the first stage's optimizer batch
        factor = optimizer.rate_factor(self.gradient.lr_scaling, global_batch, first)
        learning_rate = self.optim.schedule(state.step) * factor
        if factor == 1.0:
            return state.apply_gradients(grads=grads, batch_stats=batch_stats), learning_rate
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        updates = jax.tree.map(lambda u: u * jnp.asarray(factor, u.dtype), updates)
        params = optax.apply_updates(state.params, updates)
        state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, batch_stats=batch_stats)
        return state, learning_rate

    def _noise_scale_value_and_grad(self, embed: forward.Forward, params, batch):
        """`(loss, metrics, updates, grads)` of the global loss with each device's forward
        and backward pass in `shard_map`, so that its share of the gradient is seen before
        the sum: `metrics` add the noise scale's squared norms
        (`noise_scale.per_device_value_and_grad`). Dropout masks are drawn per device;
        BatchNorm statistics are the devices' mean."""

        def per_device(params, local_batch):
            def local_loss(p):
                batched, shared, updates = embed(p, local_batch, jax.lax.axis_index(BATCH_AXES))
                inputs = loss_inputs(batched, shared, self.loss_data(local_batch))
                loss, metrics = self.loss.fn(inputs, self.loss_settings)
                return loss, (dict(metrics, temperature=shared["temperature"]), updates)

            (loss, (metrics, updates)), grads, small, big = noise_scale.per_device_value_and_grad(
                local_loss, params, BATCH_AXES
            )
            metrics, updates = jax.lax.pmean((metrics, updates), BATCH_AXES)
            return loss, dict(metrics, **{noise_scale.SMALL_KEY: small, noise_scale.BIG_KEY: big}), updates, grads

        return jax.shard_map(per_device, mesh=self.mesh, in_specs=(P(), P(BATCH_AXES)), out_specs=P())(params, batch)

    def loss_data(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The data fields the loss reads (see `losses.registry`) from a batch as
        `forward.layout` leaves it: `label` [N]; `groups` [N, K], the source's id keys
        stacked; `index` [N]; and the same of its extra rows, in `extra`."""
        data = {}
        if self.loss.labels:
            data["label"] = batch["label"]
        if self.loss.indices or self.loss_settings.positives != losses.OWN_PAIR:  # an image's pairs share it
            data["index"] = batch["index"]
        if self.loss.groups:
            data["groups"] = jnp.stack([batch[key] for key in self.id_keys], axis=-1)
        if "extra" in batch and data:
            data["extra"] = self.loss_data(batch["extra"])
        return data

    def _key_encoder(self, loss_state: dict[str, Any] | None):
        """The parameters of an encoder the loss state keeps (its `LossState.params_like`
        entry: a momentum encoder, whose keys `forward` embeds), or None."""
        _, params_like = self._split_params_like(loss_state)
        return next(iter(params_like.values()), None)

    def global_loss(
        self,
        batched: dict[str, jax.Array],
        shared: dict[str, jax.Array],
        data: dict[str, jax.Array],
        loss_state: dict[str, Any] | None = None,
        step: jax.Array | int = 0,
    ) -> tuple[jax.Array, dict[str, jax.Array], dict[str, Any] | None]:
        """The configured loss over the global batch: the one place the trainer wraps
        its loss in `jax.shard_map` (over `BATCH_AXES`: every loss spans all devices).

        Args:
          batched: model outputs split over the batch axes (`za`, `zb` [N, D], `logits`
            [N, C]).
          shared: replicated model outputs (`temperature`, `bias`, `proxies` [C, D]).
          data: the data fields the loss reads (`loss_data`), each [N, ...].
          loss_state: the loss's state (`TrainState.loss_state`; None without one).
            Its `LossState.sharded` rows enter split over the batch axes, the rest
            replicated; its `LossState.params_like` entries (a momentum encoder), which
            the loss does not read, stay outside where they are.
          step: the state's step count, before this update.

        Returns:
          `(loss, metrics, new loss state)`: the metrics are the loss's own plus
          `temperature`; the state is None without one.
        """
        inside, outside = self._split_params_like(loss_state)
        specs = self._loss_state_specs(inside)

        def per_device(batched, shared, data, loss_state, step):
            inputs = loss_inputs(batched, shared, data)
            if self.loss.state is None:
                loss, metrics = self.loss.fn(inputs, self.loss_settings)
            else:
                inputs = {**inputs, "state": loss_state, "step": step}
                loss, metrics, loss_state = self.loss.fn(inputs, self.loss_settings)
            return loss, dict(metrics, temperature=shared["temperature"]), loss_state

        rows = P(BATCH_AXES)
        loss, metrics, inside = jax.shard_map(
            per_device,
            mesh=self.mesh,
            in_specs=(rows, P(), rows, specs, P()),
            out_specs=(P(), P(), specs),
        )(batched, shared, data, inside, step)
        return loss, metrics, None if loss_state is None else {**inside, **outside}

    def _split_params_like(self, loss_state: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """`(the entries the loss reads, its `LossState.params_like` entries)` of `loss_state`
        (`(None, {})` without a state)."""
        if loss_state is None:
            return None, {}
        params_like = self.loss.state.params_like if self.loss.state else frozenset()
        inside = {k: v for k, v in loss_state.items() if k not in params_like}
        return inside, {k: v for k, v in loss_state.items() if k in params_like}

    def _loss_state_specs(self, loss_state: dict[str, Any] | None) -> dict[str, Any] | None:
        """PartitionSpecs of the loss state's leaves inside `global_loss`: rows over the
        batch axes for the `LossState.sharded` names, replicated for the rest."""
        if loss_state is None:
            return None
        return {
            name: jax.tree.map(lambda _, rows=name in self.loss.state.sharded: P(BATCH_AXES) if rows else P(), value)
            for name, value in loss_state.items()
        }
