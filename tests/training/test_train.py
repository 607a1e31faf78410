"""The trainer: sharded step = single-device step, resume = uninterrupted, failures; the
compiled step does the loss's N^2 work only, and the ring gathers no global batch."""

import ast
import dataclasses
import inspect
import itertools
import json
import math
import os
import re
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from subprocess_runs import checkpoint_steps, saved_state

from contrastive_jax import losses, run_dir, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import batch_numbering, input_pipeline
from contrastive_jax.errors import ConfigError
from contrastive_jax.sharding import BATCH_AXES
from contrastive_jax.training import checkpoint, loop, optimizer, resume, run_plan
from contrastive_jax.training import trainer as trainer_module
from contrastive_jax.training.run_plan import build, data_settings, optim_settings


@pytest.fixture
def config(tiny_config):
    """The tiny config, 12 steps: a log every 2, a checkpoint every 4 (the last 3 kept),
    the kNN probe on."""
    cadences = {
        "train.num_train_steps": 12,
        "train.log_every_steps": 2,
        "checkpoint.every_steps": 4,
        "checkpoint.max_to_keep": 3,
        "eval.knn_k": 1,
    }
    return override(tiny_config, cadences)


def make_state_and_batch(config, mesh):
    """`(trainer, initial state, abstract state, first batch)` on `mesh`."""
    trainer = build(config, mesh).trainer
    ds = input_pipeline.train_dataset(data_settings(config))
    init, abstract = trainer.init_state(ds.element_spec)
    return trainer, init(), abstract, next(iter(ds))


def sgd_steps(config, num_devices, num_steps=2):
    """Parameters and per-step metrics after `num_steps` plain SGD steps on one batch."""
    config = override(
        config,
        {
            "optim.name": "sgd",
            "optim.momentum": 0.0,
            "optim.learning_rate": 0.5,
            "optim.warmup_steps": 0,
            "optim.grad_clip_norm": 0.0,
            "optim.weight_decay": 0.0,
        },
    )
    trainer, state, abstract, batch = make_state_and_batch(config, sharding.make_mesh(num_devices))
    chex.clear_trace_counter()

    @chex.assert_max_traces(n=1)
    def traced_once(state, batch):
        return trainer.train_step(state, batch)

    step = jax.jit(
        traced_once,
        in_shardings=(jax.tree.map(lambda s: s.sharding, abstract), sharding.data_sharding(trainer.mesh)),
        donate_argnums=0,
    )
    history = []
    for _ in range(num_steps):  # the second call must not retrace
        state, metrics = step(state, batch)
        history.append(jax.device_get(metrics))
    return jax.device_get(state.params), history


def assert_same_steps(single, sharded):
    """Same gradient norm at every step, same parameters after them, same loss."""
    (params_1, history_1), (params_8, history_8) = single, sharded
    for metrics_1, metrics_8 in zip(history_1, history_8, strict=True):
        assert metrics_8["loss"] == pytest.approx(metrics_1["loss"], rel=1e-5)
        assert metrics_8["grad_norm"] == pytest.approx(metrics_1["grad_norm"], rel=1e-4)
        assert metrics_8["accuracy_a_to_b"] == metrics_1["accuracy_a_to_b"]
    chex.assert_trees_all_close(params_8, params_1, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_training_needs_no_tensorflow(digits_data_dir, tmp_path):
    """The default job trains, evaluates and logs with TensorFlow made unimportable
    (`sys.modules["tensorflow"] = None`), so a machine without it can train."""
    from subprocess_runs import tiny_fields, write_config

    config = write_config(tmp_path / "tiny.py", tiny_fields(digits_data_dir, train__num_train_steps=2))
    code = (
        "import sys; sys.modules['tensorflow'] = None; sys.modules['tensorflow_datasets'] = None; "
        f"sys.argv = ['main', '--config={config}', '--workdir={tmp_path / 'run'}']; "
        "from contrastive_jax import main; main.run()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=240)
    assert (tmp_path / "run" / "eval_results.json").exists() and (tmp_path / "run" / "tensorboard").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        {"loss.name": "siglip", "train.micro_batch_size": 32},  # bias, micro-batches
        {"loss.name": "moco_queue", "loss.queue_size": 128, "loss.queue_momentum": 0.9},  # state, EMA
    ],
)
def test_only_build_reads_the_config(config, tmp_path, monkeypatch, fields):
    """`run_plan.build` is the one door: a whole run (state, steps, a save, a resume, the
    evaluation) after it, with every ConfigDict made unreadable, reads plain values only."""
    config = override(config, fields | {"train.num_train_steps": 4, "checkpoint.every_steps": 2})
    plan = build(config, sharding.make_mesh(8))

    def unreadable(self, name):
        raise AssertionError(f"config field {name!r} read after run_plan.build")

    monkeypatch.setattr(ml_collections.ConfigDict, "__getattr__", unreadable)
    monkeypatch.setattr(ml_collections.ConfigDict, "__getitem__", unreadable)
    loop.run_loop(plan, str(tmp_path))
    longer = dataclasses.replace(plan.loop_settings, num_train_steps=6)
    results = loop.run_loop(dataclasses.replace(plan, loop_settings=longer), str(tmp_path))
    assert results and run_dir.read_metrics(str(tmp_path))[-1]["step"] == 6


@pytest.mark.compat
@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_sharded_steps_equal_single_device_steps(config, loss):
    config = override(config, {"loss.name": loss})
    assert_same_steps(sgd_steps(config, 1), sgd_steps(config, 8))


@pytest.mark.slow
def test_sharded_step_comparison_sees_a_gradient_scaled_by_the_device_count(config, monkeypatch):
    """The comparison above fails for the classic bug: gradients scaled by the number of
    devices (or its inverse) on 8 devices, while the loss value is unchanged."""
    single = sgd_steps(config, 1)
    clip = losses.LOSSES["clip"]
    for factor in (8, 1 / 8):

        def scaled_gradient(inputs, settings, factor=factor):
            loss, metrics = clip.fn(inputs, settings)
            scale = factor ** (jax.lax.axis_size(BATCH_AXES) > 1)
            return jax.lax.stop_gradient(loss) + scale * (loss - jax.lax.stop_gradient(loss)), metrics

        monkeypatch.setitem(losses.LOSSES, "clip", dataclasses.replace(clip, fn=scaled_gradient))
        with pytest.raises(AssertionError):
            assert_same_steps(single, sgd_steps(config, 8))


def random_outputs(num_examples, num_classes=5, dim=16, seed=0):
    """Every model output and labels, as the registry's functions receive them."""
    keys = jax.random.split(jax.random.key(seed), 5)
    za = losses.l2_normalize(jax.random.normal(keys[0], (num_examples, dim)))
    outputs = {
        "za": za,
        "zb": losses.l2_normalize(za + jax.random.normal(keys[1], (num_examples, dim))),
        "logits": jax.random.normal(keys[2], (num_examples, num_classes)),
        "proxies": jax.random.normal(keys[3], (num_classes, dim)),
        "temperature": jnp.float32(0.1),
        "bias": jnp.float32(-2.0),
    }
    labels = jnp.sort(jax.random.randint(keys[4], (num_examples,), 0, num_classes))
    # pairs 2k, 2k + 1 share a word id; every 7th shares a pronunciation id
    groups = jnp.stack([jnp.arange(num_examples) // 2, jnp.arange(num_examples) % 7], axis=1)
    # pairs 4k to 4k + 3 share an index (an image's captions: the several-positives losses)
    return outputs, {"label": labels, "groups": groups, "index": jnp.arange(num_examples) // 4}


# One of each kind runs by default (the library's sharded tests cover the kernels); all with -m slow.
DEFAULT_REGISTRY_CHECKS = ("siglip", "supcon", "focal", "cosface", "clip_masking_false_negatives")


@pytest.mark.parametrize(
    "name",
    [
        name if name in DEFAULT_REGISTRY_CHECKS else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(n for n, loss in losses.LOSSES.items() if loss.state is None)
    ],
)  # the losses with state: tests/test_beyond_batch_training.py
def test_every_registered_loss_spans_the_global_batch_and_reads_only_its_inputs(config, name):
    """Value and gradients on a 2 x 4 mesh equal 1 device; the function gets only the
    outputs its entry declares (reading another raises KeyError), and the temperature
    (which every model has; the trainer logs it)."""
    loss = losses.LOSSES[name]
    all_outputs, all_data = random_outputs(64)
    outputs = {k: v for k, v in all_outputs.items() if k in loss.inputs | {"temperature"}}
    data = {k: v for k, v in all_data.items() if k in loss.inputs}
    results = []
    for num_devices, fsdp in ((1, 1), (8, 4)):  # the 2 x 4 mesh: the batch over both axes
        trainer = dataclasses.replace(build(config, sharding.make_mesh(num_devices, fsdp=fsdp)).trainer, loss=loss)

        def value(outputs, trainer=trainer):
            batched = {k: v for k, v in outputs.items() if k in ("za", "zb", "logits")}
            shared = {k: v for k, v in outputs.items() if k not in batched}
            return trainer.global_loss(batched, shared, data)[0]

        results.append(jax.jit(jax.value_and_grad(value))(outputs))
    (value_1, grads_1), (value_8, grads_8) = jax.device_get(results)
    assert np.isfinite(value_1) and float(value_8) == pytest.approx(float(value_1), rel=1e-5)
    chex.assert_trees_all_close(grads_8, grads_1, rtol=1e-4, atol=1e-6)


def test_step_metrics_match_the_loss_library(config):
    trainer, state, _, batch = make_state_and_batch(config, sharding.make_mesh(8))
    outputs = state.apply_fn(
        {"params": state.params, "batch_stats": state.batch_stats},
        batch["a"],
        batch["b"],
        train=True,
        rngs={"dropout": jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 0), 0)},
    )
    expected = losses.clip_loss(outputs["za"], outputs["zb"], temperature=outputs["temperature"])
    new_state, metrics = jax.jit(trainer.train_step)(state, batch)
    assert float(metrics["loss"]) == pytest.approx(float(expected), rel=1e-5)
    # The in-batch metrics come from the loss's own statistics, and equal the library's.
    in_batch = losses.contrastive_metrics(outputs["za"], outputs["zb"], temperature=outputs["temperature"])
    for key, value in in_batch.items():
        assert float(metrics[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-6), key
    assert float(metrics["temperature"]) == pytest.approx(0.07, rel=1e-5)
    assert float(metrics["learning_rate"]) == 0.0  # warmup starts at 0
    assert int(new_state.step) == 1


def test_step_clamps_the_temperature(config):
    trainer, state, _, batch = make_state_and_batch(config, sharding.make_mesh(8))
    params = dict(state.params, log_inv_temperature=jnp.float32(10.0))
    state, _ = jax.jit(trainer.train_step)(state.replace(params=params), batch)
    assert float(state.params["log_inv_temperature"]) == pytest.approx(math.log(100))


@pytest.mark.parametrize("name", optimizer.OPTIMIZERS)
def test_weight_decay_skips_biases_and_temperature(config, name):
    config = override(config, {"optim.name": name, "optim.warmup_steps": 0, "optim.weight_decay": 0.1})
    tx, _ = optimizer.make_optimizer(optim_settings(config), 10)
    params = {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2), "log_inv_temperature": jnp.float32(2.0)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    assert np.all(np.asarray(updates["kernel"]) < 0)  # decayed towards 0
    np.testing.assert_array_equal(updates["bias"], 0.0)
    assert float(updates["log_inv_temperature"]) == 0.0


# Golden rates (peak 0.01, warmup 4 steps, 20 steps): the warmup's line, then the peak
# for good ("constant", whatever the run's length) or a cosine to 0 at step 20.
SCHEDULE_STEPS = (0, 2, 4, 10, 20, 1000)
GOLDEN_RATES = {
    "constant": (0.0, 0.005, 0.01, 0.01, 0.01, 0.01),
    "cosine": (0.0, 0.005, 0.01, 0.01 * (1 + math.cos(math.pi * 6 / 16)) / 2, 0.0, 0.0),
}


@pytest.mark.parametrize("schedule", sorted(GOLDEN_RATES))
def test_schedule_golden_rates(config, schedule):
    config = override(config, {"optim.schedule": schedule, "optim.learning_rate": 0.01, "optim.warmup_steps": 4})
    rates = optimizer.make_schedule(optim_settings(config), 20)
    np.testing.assert_allclose([float(rates(step)) for step in SCHEDULE_STEPS], GOLDEN_RATES[schedule], atol=1e-9)
    longer = optimizer.make_schedule(optim_settings(config), 200)
    assert (float(longer(10)) == float(rates(10))) == (schedule == "constant")  # only "constant" ignores the length


def test_constant_schedule_without_warmup_starts_at_the_peak(config):
    config = override(config, {"optim.schedule": "constant", "optim.learning_rate": 0.01, "optim.warmup_steps": 0})
    assert float(optimizer.make_schedule(optim_settings(config), 20)(0)) == pytest.approx(0.01)


def test_unknown_schedule_is_one_clear_error(config):
    config = override(config, {"optim.schedule": "linear"})
    with pytest.raises(ConfigError, match=r"config.optim.schedule='linear'; use one of \('cosine', 'constant'\)"):
        optimizer.make_optimizer(optim_settings(config), 10)


# A plain run, and a loss whose state is split over the devices (MoCo's queues, pointer
# and momentum encoder): the resumed run ends bitwise where the straight one does.
QUEUE = {"loss.name": "moco_queue", "loss.queue_size": 256, "loss.queue_momentum": 0.9, "loss.chunk_size": 32}


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("fields", [{}, QUEUE], ids=["clip", "moco_queue"])
def test_resume_reaches_the_uninterrupted_parameters(config, tmp_path, monkeypatch, fields):
    config = override(config, fields)
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    results = run_plan.train_and_evaluate(config, straight)
    logged = [m["train/loss"] for m in run_dir.read_metrics(straight) if "train/loss" in m]
    assert len(logged) == 6
    assert fields or logged[-1] < logged[0] - 2  # learning (the queue's loss rises as it fills)
    assert {"a_to_b/R@1", "b_to_a/R@10", "knn_top1", "collapse/effective_rank"} <= set(results)

    real_global_batch = loop._global_batch
    calls = {"n": 0}

    def counted(batch, data_sharding, crash_at=None):
        calls["n"] += 1
        if calls["n"] == crash_at:
            raise RuntimeError("simulated crash")
        return real_global_batch(batch, data_sharding)

    monkeypatch.setattr(loop, "_global_batch", lambda *args: counted(*args, crash_at=10))
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_plan.train_and_evaluate(config, resumed)
    assert checkpoint_steps(resumed)[0][-1] == 8
    calls["n"] = 0
    monkeypatch.setattr(loop, "_global_batch", counted)
    assert run_plan.train_and_evaluate(config, resumed) == results
    assert calls["n"] == 4  # steps 9-12: resumed from checkpoint 8, not retrained

    chex.assert_trees_all_equal(saved_state(straight, 12), saved_state(resumed, 12))
    assert bool(fields) == ("ema_params" in (saved_state(resumed, 12).get("loss_state") or {}))
    losses_straight = {m["step"]: m["train/loss"] for m in run_dir.read_metrics(straight) if "train/loss" in m}
    losses_resumed = {m["step"]: m["train/loss"] for m in run_dir.read_metrics(resumed) if "train/loss" in m}
    assert losses_resumed[12] == losses_straight[12] and losses_resumed[10] == losses_straight[10]
    assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["12", "4", "8"]
    with open(os.path.join(resumed, "eval_results.json")) as f:
        assert json.load(f)["step"] == 12


@pytest.mark.slow
def test_resume_onto_a_different_mesh(config, tmp_path, monkeypatch):
    """A run that crashed with its parameters split 4 ways (a 2 x 4 mesh) resumes data
    parallel from its checkpoint and ends where a straight data-parallel run does."""
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    run_plan.train_and_evaluate(config, straight)
    real_global_batch, calls = loop._global_batch, {"n": 0}

    def crash_at_10(batch, data_sharding):
        calls["n"] += 1
        if calls["n"] == 10:
            raise RuntimeError("simulated crash")
        return real_global_batch(batch, data_sharding)

    monkeypatch.setattr(loop, "_global_batch", crash_at_10)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_plan.train_and_evaluate(override(config, FSDP_FIELDS | {"mesh.fsdp": 4}), resumed)
    monkeypatch.setattr(loop, "_global_batch", real_global_batch)
    run_plan.train_and_evaluate(config, resumed)
    want, got = saved_state(straight, 12), saved_state(resumed, 12)
    chex.assert_trees_all_close(got["params"], want["params"], rtol=1e-4, atol=1e-6)
    resumed_losses = {m["step"]: m["train/loss"] for m in run_dir.read_metrics(resumed) if "train/loss" in m}
    straight_losses = {m["step"]: m["train/loss"] for m in run_dir.read_metrics(straight) if "train/loss" in m}
    assert resumed_losses[12] == pytest.approx(straight_losses[12], rel=1e-5)


@pytest.mark.compat
def test_checkpoint_restores_onto_a_different_mesh(config, tmp_path):
    """Saved split over a 2 x 4 mesh (parameters over fsdp), restored whole onto 2
    devices, and back onto 8 split 4 x 2."""
    config = override(config, FSDP_FIELDS)
    _, state8, _, _ = make_state_and_batch(config, sharding.make_mesh(8, fsdp=4))
    ckpt = checkpoint.Checkpointer(tmp_path, max_to_keep=1)
    try:
        run_config = build(config, sharding.make_mesh(8, fsdp=4)).run_config
        ckpt.save(3, state8, batch_numbering.position(run_config, 3))
        ckpt.wait()
        for num_devices, fsdp in ((2, 1), (8, 2)):
            _, _, abstract, _ = make_state_and_batch(config, sharding.make_mesh(num_devices, fsdp=fsdp))
            step, restored = resume.restore_latest(ckpt, run_config, abstract)
            assert step == 3 and ckpt.restore_position(3)["next_step"] == 3
            chex.assert_trees_all_equal(*jax.device_get([(s.params, s.opt_state) for s in (restored, state8)]))
            kernel = restored.params["tower_a"]["Dense_0"]["kernel"]
            assert kernel.sharding.mesh.devices.size == num_devices
            assert kernel.addressable_shards[0].data.size == kernel.size // fsdp
    finally:
        ckpt.close()


FSDP_FIELDS = {"mesh.fsdp_min_kib": 0.0}  # the tiny towers' arrays are all split


def test_fsdp_splits_parameters_and_optimizer_state(config):
    """With fsdp = 4 every array of the state with a dimension 4 divides is split along
    its largest such dimension, the optimizer's moments like their parameters; the rest
    (scalars, the temperature) are whole on every device."""
    _, state, abstract, _ = make_state_and_batch(override(config, FSDP_FIELDS), sharding.make_mesh(8, fsdp=4))
    split = 0
    for leaf, shape in zip(jax.tree.leaves(state), jax.tree.leaves(abstract), strict=True):
        divisible = [d for d, length in enumerate(leaf.shape) if length % 4 == 0]
        local = leaf.addressable_shards[0].data.shape
        assert leaf.sharding == shape.sharding
        if divisible:
            d = max(divisible, key=lambda d: (leaf.shape[d], -d))
            assert local == tuple(n // 4 if i == d else n for i, n in enumerate(leaf.shape)), (leaf.shape, local)
            split += 1
        else:
            assert local == leaf.shape
    assert split == 3 * (len(jax.tree.leaves(state.params)) - 1)  # params, mu, nu; all but the temperature
    mu = state.opt_state[1][0].mu  # clip_by_global_norm, then adamw's scale_by_adam
    assert jax.tree.map(lambda x: x.sharding, mu) == jax.tree.map(lambda x: x.sharding, state.params)


def test_fsdp_parameters_below_the_size_threshold_stay_whole(config):
    _, state, _, _ = make_state_and_batch(config, sharding.make_mesh(8, fsdp=4))  # 64 KiB: all tiny
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(state))


def adam_steps(config, num_devices, fsdp, num_steps=3):
    """Per-step losses and the parameters after `num_steps` jitted AdamW steps."""
    trainer, state, abstract, _ = make_state_and_batch(config, sharding.make_mesh(num_devices, fsdp=fsdp))
    step = trainer.jit_train_step(abstract)
    ds = input_pipeline.train_dataset(data_settings(config))
    history = []
    for batch in itertools.islice(ds, num_steps):
        state, metrics = step(state, batch)
        history.append(float(metrics["loss"]))
    return history, jax.device_get(state.params)


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_fsdp_steps_equal_data_parallel_steps(config, loss):
    """AdamW steps with the parameters and moments split 4 ways (a 2 x 4 mesh) equal the
    replicated 8-device steps: the same losses and parameters to float round-off."""
    config = override(config, FSDP_FIELDS | {"loss.name": loss})
    (losses_dp, params_dp), (losses_fsdp, params_fsdp) = adam_steps(config, 8, 1), adam_steps(config, 8, 4)
    np.testing.assert_allclose(losses_fsdp, losses_dp, rtol=1e-5)
    chex.assert_trees_all_close(params_fsdp, params_dp, rtol=1e-4, atol=1e-6)


def test_non_finite_loss_stops_and_names_the_last_checkpoint(config, tmp_path, monkeypatch):
    workdir = str(tmp_path)
    run_plan.train_and_evaluate(override(config, {"train.num_train_steps": 4}), workdir)

    def nan_loss(inputs, loss_config):
        return jax.lax.pmean(jnp.nan * inputs["za"].sum(), BATCH_AXES), {}

    clip = losses.LOSSES["clip"]
    monkeypatch.setitem(losses.LOSSES, "clip", dataclasses.replace(clip, fn=nan_loss))
    with pytest.raises(FloatingPointError, match=r"at step 5.*Last good checkpoint: step 4"):
        run_plan.train_and_evaluate(override(config, {"train.num_train_steps": 8}), workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]


# Compiled-HLO checks: N = 96 (12 rows per device, tiles of 24 columns), so that no
# array of the tiny towers (`config`: widths 16 and 32) has a dimension among the
# logits' (12, 24, 96): a matrix with both dimensions among them is a block of logits
# or of their gradient.
NUM_DEVICES = 8
N = 96
LOGIT_DIMS = {N // NUM_DEVICES, 24, N}
# One HLO instruction with an array result: `%name = f32[12,96]{1,0} op(%x, %y), ...`.
_INSTRUCTION = re.compile(r"%([\w.-]+) = \w+\[([\d,]*)\]\S* ([\w-]+)\(([^)]*)\)")


def compiled_step(config):
    """The jitted train step of `config` at N = 96 on 8 devices, compiled for abstract
    inputs (`build(config, mesh).trainer.jit_train_step(...).lower(...).compile()`)."""
    config = override(config, {"train.global_batch_size": N})
    run = build(config, sharding.make_mesh(NUM_DEVICES)).trainer
    spec = input_pipeline.train_dataset(data_settings(config)).element_spec
    _, abstract = run.init_state(spec)
    return run.compile_step(abstract, {k: spec[k] for k in ("a", "b")})


def compiled_loss_gradient(config):
    """The configured loss's value and gradient (wrt `za`, `zb` and the scalars) alone,
    on N embeddings, compiled like the step."""
    config = override(config, {"train.global_batch_size": N})
    run = build(config, sharding.make_mesh(NUM_DEVICES)).trainer
    dim = config.model.embed_dim
    batched = {
        key: jax.ShapeDtypeStruct((N, dim), np.float32, sharding=sharding.data_sharding(run.mesh))
        for key in ("za", "zb")
    }
    scalars = {"temperature"} | (run.loss.inputs & {"bias"})
    shared = {key: jax.ShapeDtypeStruct((), np.float32) for key in scalars}

    def loss(batched, shared):
        return run.global_loss(batched, shared, {})[0]

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(batched, shared).compile()


def instructions(compiled, opcode):
    """`(result dims, [operand dims])` of every `opcode` instruction in the compiled HLO
    (operands with array results; instruction names are unique in a module)."""
    parsed = _INSTRUCTION.findall(compiled.as_text())
    dims = {name: tuple(int(d) for d in shape.split(",") if d) for name, shape, _, _ in parsed}
    return [
        (dims[name], [dims[o] for o in re.findall(r"%([\w.-]+)", operands) if o in dims])
        for name, _, op, operands in parsed
        if op == opcode
    ]


def logit_dots(compiled):
    """How many dot instructions read or write a block of logits (N^2 work each)."""
    is_logits = lambda dims: len(dims) == 2 and set(dims) <= LOGIT_DIMS  # noqa: E731
    return sum(
        any(is_logits(dims) for dims in [result, *operands]) for result, operands in instructions(compiled, "dot")
    )


@pytest.mark.parametrize("name", ["clip", "siglip"])
@pytest.mark.parametrize("chunk_size", [None, 24])
def test_step_does_the_losss_n2_work_only(config, name, chunk_size):
    """The step's logit matmuls are the loss's own forward and backward: the metrics
    come from its statistics, not from another pass."""
    config = override(config, {"loss.name": name, "loss.chunk_size": chunk_size})
    own = logit_dots(compiled_loss_gradient(config))
    assert own >= 2  # the logits and at least one gradient product
    step = compiled_step(config)
    assert logit_dots(step) == own
    # Top-1 from a masked max: no argmax (a variadic value-and-index reduce, which XLA's
    # CPU backend runs at a fraction of a max's speed) over the logits.
    assert not re.findall(r"= \(f32\[[\d,]*\][^)]*, s32\[[\d,]*\][^)]*\) reduce\(", step.as_text())


@pytest.mark.parametrize("micro_batch_size", [48])
def test_grad_cached_step_pays_for_the_loss_once(config, micro_batch_size):
    """Gradient caching embeds twice but computes the streamed loss's forward and
    backward once."""
    config = override(
        config,
        {
            "loss.chunk_size": 24,
            "train.micro_batch_size": micro_batch_size,
        },
    )
    assert logit_dots(compiled_step(config)) == logit_dots(compiled_loss_gradient(config))


def gathers_of_the_global_batch(compiled):
    """The all-gathers whose result has N rows."""
    return [result for result, _ in instructions(compiled, "all-gather") if result and result[0] == N]


def test_ring_step_gathers_no_global_batch_and_needs_less_memory(config):
    config = override(config, {"model.embed_dim": 256})  # the gathered [N, D] dominates
    ring = compiled_step(override(config, {"loss.collective": "ring"}))
    gathered = compiled_step(config)
    assert gathers_of_the_global_batch(gathered)  # the check sees the all-gather mode's
    assert gathers_of_the_global_batch(ring) == []
    ring_bytes = ring.memory_analysis().temp_size_in_bytes
    gathered_bytes = gathered.memory_analysis().temp_size_in_bytes
    assert ring_bytes < gathered_bytes


def test_build_writes_no_record_set_and_names_the_command_that_does(tiny_config, tmp_path):
    """The config check reads no data and writes none: absent built-in records are one
    line giving the command that writes them."""
    config = override(tiny_config, {"data.data_dir": str(tmp_path / "data")})
    with pytest.raises(
        ConfigError,
        match=r"records are not written yet .*contrastive_jax.write_records --source=builtin:sklearn_digits --out=",
    ):
        build(config)
    assert list(tmp_path.rglob("*")) == []


def test_the_job_writes_the_builtin_records_first_and_says_so_in_one_line(tiny_config, tmp_path, caplog):
    fields = {"data.data_dir": str(tmp_path / "data"), "train.num_train_steps": 1, "train.log_every_steps": 1}
    with caplog.at_level("INFO"):
        run_plan.train_and_evaluate(override(tiny_config, fields), str(tmp_path / "run"))
    written = tmp_path / "data" / "sklearn_digits-v2"
    assert (written / "metadata.json").exists()
    lines = [r.getMessage() for r in caplog.records if "built-in" in r.getMessage()]
    assert lines == [f"Wrote the built-in dataset sklearn_digits's records to {written} (once: later runs read them)."]


def test_the_trainer_holds_only_what_its_own_methods_read():
    """The step's `Trainer` keeps at most 12 fields, each read by one of its methods: what
    the loop, the guard or the checkpoints need besides the step is the run plan's."""
    source = ast.parse(inspect.getsource(trainer_module.Trainer))
    read = {
        node.attr
        for node in ast.walk(source)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    fields = {field.name for field in dataclasses.fields(trainer_module.Trainer)}
    assert len(fields) <= 12 and fields <= read, sorted(fields - read)
