"""The trainer: sharded step = single-device step, resume = uninterrupted, failures."""

import functools
import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from contrastive_jax import checkpoint, input_pipeline, losses, models, sharding, train


@pytest.fixture
def config(load_config, digits_data_dir):
    """A tiny version of the default config: small MLPs, a few steps."""
    config = load_config("default")
    config.data.data_dir = digits_data_dir
    config.model.mlp_hidden_dims = (32,)
    config.model.encoder_dim = 32
    config.model.embed_dim = 16
    config.train.global_batch_size = 64
    config.train.num_train_steps = 12
    config.train.log_every_steps = 2
    config.optim.warmup_steps = 2
    config.eval.every_steps = 0
    config.eval.linear_probe = False
    config.checkpoint.every_steps = 4
    return config


def make_state_and_batch(config, mesh):
    ds = input_pipeline.train_dataset(config)
    model = models.create_model(config, text_vocab_size=input_pipeline.TEXT_VOCAB_SIZE)
    tx, schedule = train.make_optimizer(config.optim, config.train.num_train_steps)
    init, abstract = train.create_train_state(config, model, tx, mesh, ds.element_spec)
    batch = next(ds.as_numpy_iterator())
    step = functools.partial(
        train.train_step, loss_config=config.loss, mesh=mesh, schedule=schedule, seed=config.seed
    )
    return init(), abstract, batch, step


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_sharded_step_equals_single_device_step(config, loss):
    config.loss.name = loss
    results = []
    for num_devices in (1, 8):
        mesh = sharding.make_mesh(num_devices)
        state, abstract, batch, step = make_state_and_batch(config, mesh)
        state_sharding = jax.tree.map(lambda s: s.sharding, abstract)
        chex.clear_trace_counter()

        @chex.assert_max_traces(n=1)
        def traced_once(state, batch, step=step):
            return step(state, batch)

        step = jax.jit(
            traced_once,
            in_shardings=(state_sharding, sharding.data_sharding(mesh)),
            donate_argnums=0,
        )
        for _ in range(2):  # the second call must not retrace
            state, metrics = step(state, batch)
        results.append((jax.device_get(state.params), jax.device_get(metrics)))
    (params_1, metrics_1), (params_8, metrics_8) = results
    assert metrics_1["loss"] == pytest.approx(metrics_8["loss"], rel=1e-5)
    assert metrics_1["accuracy_a_to_b"] == metrics_8["accuracy_a_to_b"]
    chex.assert_trees_all_close(params_1, params_8, rtol=1e-4, atol=1e-6)


def test_step_metrics_match_the_loss_library(config):
    mesh = sharding.make_mesh(8)
    state, _, batch, step = make_state_and_batch(config, mesh)
    outputs = state.apply_fn(
        {"params": state.params, "batch_stats": state.batch_stats},
        batch["a"], batch["b"], train=True, rngs={"dropout": jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 0), 0)},
    )
    expected = losses.clip_loss(outputs["za"], outputs["zb"], temperature=outputs["temperature"])
    new_state, metrics = jax.jit(step)(state, batch)
    assert float(metrics["loss"]) == pytest.approx(float(expected), rel=1e-5)
    assert float(metrics["temperature"]) == pytest.approx(0.07, rel=1e-5)
    assert float(metrics["learning_rate"]) == 0.0  # warmup starts at 0
    assert int(new_state.step) == 1


def test_step_clamps_the_temperature(config):
    mesh = sharding.make_mesh(8)
    state, _, batch, step = make_state_and_batch(config, mesh)
    params = dict(state.params, log_inv_temperature=jnp.float32(10.0))
    state, _ = jax.jit(step)(state.replace(params=params), batch)
    assert float(state.params["log_inv_temperature"]) == pytest.approx(math.log(100))


@pytest.mark.parametrize("name", train.OPTIMIZERS)
def test_weight_decay_skips_biases_and_temperature(config, name):
    config.optim.name = name
    config.optim.warmup_steps = 0
    config.optim.weight_decay = 0.1
    tx, _ = train.make_optimizer(config.optim, 10)
    params = {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2), "log_inv_temperature": jnp.float32(2.0)}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    assert np.all(np.asarray(updates["kernel"]) < 0)  # decayed towards 0
    np.testing.assert_array_equal(updates["bias"], 0.0)
    assert float(updates["log_inv_temperature"]) == 0.0


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def final_params(workdir, step):
    state = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return state["params"]


def test_resume_reaches_the_uninterrupted_parameters(config, tmp_path, monkeypatch):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    results = train.train_and_evaluate(config, straight)
    logged = [m["train/loss"] for m in read_metrics(straight) if "train/loss" in m]
    assert len(logged) == 6 and logged[-1] < logged[0] - 2  # learning
    assert {"a_to_b/R@1", "b_to_a/R@10", "knn_top1", "collapse/effective_rank"} <= set(results)

    calls = {"n": 0}
    real_global_batch = train._global_batch

    def crash_at_step_10(batch, data_sharding):
        calls["n"] += 1
        if calls["n"] == 10:
            raise RuntimeError("simulated crash")
        return real_global_batch(batch, data_sharding)

    monkeypatch.setattr(train, "_global_batch", crash_at_step_10)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train_and_evaluate(config, resumed)
    assert checkpoint.Checkpointer(os.path.join(resumed, "checkpoints"), max_to_keep=3).latest_step() == 8
    monkeypatch.setattr(train, "_global_batch", real_global_batch)
    assert train.train_and_evaluate(config, resumed) == results

    chex.assert_trees_all_equal(final_params(straight, 12), final_params(resumed, 12))
    losses_straight = {m["step"]: m["train/loss"] for m in read_metrics(straight) if "train/loss" in m}
    losses_resumed = {m["step"]: m["train/loss"] for m in read_metrics(resumed) if "train/loss" in m}
    assert losses_resumed[12] == losses_straight[12] and losses_resumed[10] == losses_straight[10]
    assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["12", "4", "8"]
    with open(os.path.join(resumed, "eval_results.json")) as f:
        assert json.load(f)["step"] == 12


def test_checkpoint_restores_onto_a_different_device_count(config, tmp_path):
    state8, abstract8, _, _ = make_state_and_batch(config, sharding.make_mesh(8))
    ckpt = checkpoint.Checkpointer(tmp_path, max_to_keep=1)
    ckpt.save(3, state8, {"next_step": 3})
    ckpt.wait()
    mesh2 = sharding.make_mesh(2)
    _, abstract2, _, _ = make_state_and_batch(config, mesh2)
    restored = ckpt.restore_state(3, abstract2)
    assert ckpt.restore_position(3) == {"next_step": 3}
    chex.assert_trees_all_equal(jax.device_get(restored.params), jax.device_get(state8.params))
    leaf = jax.tree.leaves(restored.params)[0]
    assert leaf.sharding.mesh.devices.size == 2
    ckpt.close()


def test_non_finite_loss_stops_and_names_the_last_checkpoint(config, tmp_path, monkeypatch):
    workdir = str(tmp_path)
    config.train.num_train_steps = 4
    train.train_and_evaluate(config, workdir)
    config.train.num_train_steps = 8
    nan_loss = lambda o, y, c: jax.lax.pmean(jnp.nan * o["za"].sum(), sharding.DATA_AXIS)  # noqa: E731
    monkeypatch.setitem(train.LOSSES, "clip", nan_loss)
    with pytest.raises(FloatingPointError, match=r"at step 5.*Last good checkpoint: step 4"):
        train.train_and_evaluate(config, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]
