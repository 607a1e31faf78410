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
from contrastive_jax.models import patch_dropout, two_tower
from contrastive_jax.sharding import BATCH_AXES
from contrastive_jax.training import grad_cache, negative_inputs, negatives_apart, noise_scale, optimizer

# Model outputs with a batch dimension (split over the mesh); the rest are replicated.
BATCHED_OUTPUTS = ("za", "zb", "logits")


class TrainState(train_state.TrainState):
    """Flax's TrainState plus BatchNorm statistics (`{}` for models without BatchNorm)
    and the loss's state (`losses.LossState`; None for losses without one)."""

    batch_stats: Any = None
    loss_state: Any = None


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
    initial_params: Any = None  # a released checkpoint's parameters (numpy); None: initialised from `seed`

    def init_state(self, element_spec: Mapping[str, Any]) -> tuple[Callable[[], TrainState], TrainState]:
        """`(init, abstract_state)`: `init()` creates the initial state on the mesh;
        `abstract_state` holds its `jax.ShapeDtypeStruct` leaves with shardings (the
        target for restoring a checkpoint onto this mesh, whatever mesh wrote it).

        Parameters, optimizer moments and a momentum encoder's copy are split over the
        mesh's `fsdp` axis (`sharding.fsdp_shardings`; replicated when it has size 1);
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

        def init(rng, initial_params):
            variables = self.model.init({"params": rng}, dummy["a"], dummy.get("b"), train=False)
            params = variables["params"] if initial_params is None else initial_params
            loss_state = self.loss.state and self.loss.state.init(self.loss_settings, params, self.loss_table_size)
            return TrainState.create(
                apply_fn=self.model.apply,
                params=params,
                tx=self.optim.tx,
                batch_stats=variables.get("batch_stats", {}),
                loss_state=loss_state,
            )

        rng = jax.random.key(self.seed)
        shapes = jax.eval_shape(init, rng, self.initial_params)
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
        return functools.partial(jax.jit(init, out_shardings=shardings), rng, self.initial_params), abstract_state

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

    def train_step(
        self, state: TrainState, batch: dict[str, jax.Array], masked: bool | None = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer step on a global batch (`a` [N, ...], optional `b`, `label` [N]).

        With `config.train.micro_batch_size` m > 0 the batch is embedded in N / m
        micro-batches: method "grad_cache" gives the exact full-batch gradient holding
        one micro-batch's activations at a time; "accumulate" averages the
        micro-batches' own losses (fewer negatives: a different objective).

        Pure: dropout randomness is `fold_in(fold_in(key(seed), state.step), micro_index)`,
        so a resumed run repeats an uninterrupted one. Patch dropout (the model's
        `patch_dropout`) keeps the tokens of the keys `patch_dropout.row_keys(seed,
        state.step, global row)`, the same whatever the micro-batches and devices; with
        an `until_step`, a `lax.cond` runs the masked step before it, the unmasked one
        after (`masked`: that branch alone). A loss with state
        (`losses.LossState`) updates `state.loss_state` once, from the whole batch. Returns the new state and scalar
        metrics (`loss`, `grad_norm`, `learning_rate`, `temperature`, the loss's own).
        """
        if masked is None and self.model.patch_dropout.staged:
            return self._masked_until(state, batch)
        rng = jax.random.fold_in(jax.random.key(self.seed), state.step)
        batch = self._with_patch_keys(state.step, self._with_momentum_keys(state, batch), masked)

        def forward(params, inputs, micro_index):
            outputs, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats},
                inputs["a"],
                inputs.get("b"),
                train=True,
                rngs={"dropout": jax.random.fold_in(rng, micro_index)},
                mutable=["batch_stats"],
                patch_keys=inputs.get("patch_keys"),
            )
            batched = {k: v for k, v in outputs.items() if k in BATCHED_OUTPUTS}
            shared = {k: v for k, v in outputs.items() if k not in BATCHED_OUTPUTS}
            return batched, shared, updates

        def loss_of_outputs(batched, shared, inputs):
            loss, metrics, loss_state = self.global_loss(
                batched, shared, self.loss_data(inputs), state.loss_state, state.step
            )
            return loss, (metrics, loss_state)

        gradient = self.gradient
        if gradient.micro_batch_size:
            (loss, (metrics, loss_state), updates), grads = grad_cache.MICRO_BATCH_METHODS[gradient.micro_batch_method](
                forward,
                loss_of_outputs,
                state.params,
                batch,
                num_micro_batches=batch["a"].shape[0] // gradient.micro_batch_size,
                num_shards=sharding.batch_shards(self.mesh),
            )
        elif gradient.log_noise_scale:
            loss, metrics, updates, grads = self._noise_scale_value_and_grad(forward, state.params, batch)
            loss_state = state.loss_state
        else:

            def full_batch_loss(params):
                batched, shared, updates = negatives_apart.embed(forward, params, batch, self.loss_settings, self.mesh)
                variables = {"params": params, "batch_stats": state.batch_stats}
                batched = negative_inputs.embed(state.apply_fn, variables, batch, batched, rng)
                loss, aux = loss_of_outputs(batched, shared, batch)
                return loss, (aux, updates)

            (loss, ((metrics, loss_state), updates)), grads = jax.value_and_grad(full_batch_loss, has_aux=True)(
                state.params
            )
        state, learning_rate = self._apply_gradients(state, grads, batch["a"].shape[0], updates.get("batch_stats", {}))
        state = state.replace(params=two_tower.clamp_temperature(state.params))
        if self.loss.state is not None and self.loss.state.after_step is not None:
            loss_state = self.loss.state.after_step(loss_state, state.params, self.loss_settings)
        state = state.replace(loss_state=loss_state)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads), learning_rate=learning_rate)
        return state, metrics

    def _apply_gradients(self, state: TrainState, grads, global_batch: int, batch_stats) -> tuple[TrainState, Any]:
        """`(state after the optimizer's update, the learning rate it took)`: at a global
        batch of `global_batch` the update is scaled by `optimizer.rate_factor` (the rate's
        rule, `config.optim.lr_scaling`; the schedule and its warm-up count steps)."""
        factor = optimizer.rate_factor(self.gradient.lr_scaling, global_batch, self.global_batch_size)
        learning_rate = self.optim.schedule(state.step) * factor
        if factor == 1.0:
            return state.apply_gradients(grads=grads, batch_stats=batch_stats), learning_rate
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        updates = jax.tree.map(lambda u: u * jnp.asarray(factor, u.dtype), updates)
        params = optax.apply_updates(state.params, updates)
        state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, batch_stats=batch_stats)
        return state, learning_rate

    def _masked_until(self, state: TrainState, batch: dict[str, jax.Array]):
        """`train_step` with patch dropout before `patch_dropout.until_step`, every patch
        kept from it on (FLIP's unmasked tuning): one program, a `lax.cond` on the step."""
        masked_step, unmasked_step = (functools.partial(self.train_step, masked=m) for m in (True, False))
        return jax.lax.cond(state.step < self.model.patch_dropout.until_step, masked_step, unmasked_step, state, batch)

    def _with_patch_keys(self, step, batch: dict[str, jax.Array], masked: bool | None) -> dict[str, jax.Array]:
        """The batch with `patch_keys` [N] (`patch_dropout.row_keys` of the global rows at
        `step`) when the model drops patches in this step; else as it is."""
        if not self.model.patch_dropout.rate or masked is False:
            return batch
        return dict(batch, patch_keys=patch_dropout.row_keys(self.seed, step, batch["a"].shape[0]))

    def _noise_scale_value_and_grad(self, forward, params, batch):
        """`(loss, metrics, updates, grads)` of the global loss with each device's forward
        and backward pass in `shard_map`, so that its share of the gradient is seen before
        the sum: `metrics` add the noise scale's squared norms
        (`noise_scale.per_device_value_and_grad`). Dropout masks are drawn per device;
        BatchNorm statistics are the devices' mean."""

        def per_device(params, local_batch):
            def local_loss(p):
                batched, shared, updates = forward(p, local_batch, jax.lax.axis_index(BATCH_AXES))
                inputs = {**batched, **shared, **self.loss_data(local_batch)}
                loss, metrics = self.loss.fn(inputs, self.loss_settings)
                return loss, (dict(metrics, temperature=shared["temperature"]), updates)

            (loss, (metrics, updates)), grads, small, big = noise_scale.per_device_value_and_grad(
                local_loss, params, BATCH_AXES
            )
            metrics, updates = jax.lax.pmean((metrics, updates), BATCH_AXES)
            return loss, dict(metrics, **{noise_scale.SMALL_KEY: small, noise_scale.BIG_KEY: big}), updates, grads

        return jax.shard_map(per_device, mesh=self.mesh, in_specs=(P(), P(BATCH_AXES)), out_specs=P())(params, batch)

    def loss_data(self, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """The data fields the loss reads (see `losses.registry`) from a batch: `label`
        [N]; `groups` [N, K], the source's id keys stacked; `index` [N]; the momentum
        encoder's `key_za`, `key_zb` [N, D] when the batch holds them."""
        data = {k: batch[k] for k in ("key_za", "key_zb") if k in batch}
        if self.loss.labels:
            data["label"] = batch["label"]
        if self.loss.indices:
            data["index"] = batch["index"]
        if self.loss.groups:
            data["groups"] = jnp.stack([batch[key] for key in self.id_keys], axis=-1)
        return data

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
            inputs = {**batched, **shared, **data}
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

    def _with_momentum_keys(self, state: TrainState, batch: dict[str, jax.Array]):
        """The batch with `key_za`, `key_zb`: the momentum encoder's embeddings (no
        gradient, dropout off), when the loss state holds its parameters."""
        if not state.loss_state or "ema_params" not in state.loss_state:
            return batch
        keys = state.apply_fn(
            {"params": state.loss_state["ema_params"], "batch_stats": state.batch_stats},
            batch["a"],
            batch.get("b"),
            train=False,
        )
        return dict(batch, key_za=jax.lax.stop_gradient(keys["za"]), key_zb=jax.lax.stop_gradient(keys["zb"]))
