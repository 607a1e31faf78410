"""Gradient caching gives the full-batch gradient; plain accumulation does not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses, sharding
from contrastive_jax.training import grad_cache
from contrastive_jax.training.run_plan import data_settings

NUM_DEVICES = 8
GLOBAL_BATCH = 64
IN_DIM, EMBED_DIM = 12, 6

# Each kernel: (za [B, D], zb [B, D], labels [B], *, temperature, axis_name) -> loss.
KERNELS = {
    "clip": lambda za, zb, y, **kw: losses.clip_loss(za, zb, **kw),
    "ntxent": lambda za, zb, y, **kw: losses.ntxent_loss(za, zb, **kw),
    "supcon": lambda za, zb, y, **kw: losses.supcon_loss(za, y, **kw),
}


def _forward(params, batch, index):
    """Two tanh-linear towers, L2-normalised, and a learned temperature (index unused)."""
    del index
    za = losses.l2_normalize(jnp.tanh(batch["a"] @ params["wa"]))
    zb = losses.l2_normalize(jnp.tanh(batch["b"] @ params["wb"]))
    return {"za": za, "zb": zb}, {"temperature": jnp.exp(-params["log_scale"])}, {}


def _loss(name, mesh):
    sharded = sharding.shard_loss(KERNELS[name], mesh)

    def loss(outputs, shared, batch):
        value = sharded(outputs["za"], outputs["zb"], batch["label"], temperature=shared["temperature"])
        return value, {}

    return loss


def _problem(seed=0):
    keys = jax.random.split(jax.random.key(seed), 5)
    params = {
        "wa": jax.random.normal(keys[0], (IN_DIM, EMBED_DIM)),
        "wb": jax.random.normal(keys[1], (IN_DIM, EMBED_DIM)),
        "log_scale": jnp.log(1 / 0.1),
    }
    a = jax.random.normal(keys[2], (GLOBAL_BATCH, IN_DIM))
    batch = {
        "a": a,
        "b": a + 0.3 * jax.random.normal(keys[3], a.shape),
        "label": jax.random.randint(keys[4], (GLOBAL_BATCH,), 0, 6),
    }
    return params, batch


def _full_batch(name, mesh, params, batch):
    loss = _loss(name, mesh)

    def value(p):
        batched, shared, _ = _forward(p, batch, 0)
        return loss(batched, shared, batch)[0]

    return jax.jit(jax.value_and_grad(value))(params)


def test_split_and_merge_are_inverse_and_spread_over_shards():
    x = jnp.arange(48)
    micro = grad_cache.split(x, 3, 4)  # 4 shards of 12 rows, 3 micro-batches of 16
    assert micro.shape == (3, 16)
    np.testing.assert_array_equal(micro[0], [0, 1, 2, 3, 12, 13, 14, 15, 24, 25, 26, 27, 36, 37, 38, 39])
    np.testing.assert_array_equal(grad_cache.merge(micro, 4), x)


@pytest.mark.compat
@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("num_micro_batches", [2, 4])
def test_grad_cache_equals_full_batch_gradient_on_8_devices(name, num_micro_batches):
    mesh = sharding.make_mesh(NUM_DEVICES)
    params, batch = _problem()
    batch = jax.device_put(batch, sharding.data_sharding(mesh))
    want_value, want_grads = _full_batch(name, mesh, params, batch)
    (value, _, _), grads = jax.jit(
        lambda p, b: grad_cache.grad_cache_value_and_grad(
            _forward, _loss(name, mesh), p, b, num_micro_batches=num_micro_batches, num_shards=NUM_DEVICES
        )
    )(params, batch)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for key in params:
        np.testing.assert_allclose(grads[key], want_grads[key], rtol=2e-5, atol=1e-6, err_msg=key)


def test_plain_accumulation_is_a_different_loss():
    """Each micro-batch sees fewer negatives: a lower loss and a different gradient."""
    mesh = sharding.make_mesh(NUM_DEVICES)
    params, batch = _problem()
    want_value, want_grads = _full_batch("clip", mesh, params, batch)
    (value, _, _), grads = jax.jit(
        lambda p, b: grad_cache.accumulated_value_and_grad(
            _forward, _loss("clip", mesh), p, b, num_micro_batches=4, num_shards=NUM_DEVICES
        )
    )(params, batch)
    assert float(value) < float(want_value) - 0.5  # log 16 vs log 64 negatives, roughly
    assert not np.allclose(grads["wa"], want_grads["wa"], rtol=1e-2)
    # With one micro-batch, accumulation is the full-batch loss.
    (one, _, _), one_grads = grad_cache.accumulated_value_and_grad(
        _forward, _loss("clip", mesh), params, batch, num_micro_batches=1, num_shards=NUM_DEVICES
    )
    np.testing.assert_allclose(one, want_value, rtol=1e-6)
    np.testing.assert_allclose(one_grads["wa"], want_grads["wa"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "micro_batch_size, match",
    [
        (24, r"=24 must divide .* use 16 or 32\.$"),
        (0, r"=0 must divide .* use 1\.$"),
        (4, r"=4 must be a multiple of the devices"),
    ],
)
def test_micro_batch_sizes_that_do_not_fit_are_rejected(micro_batch_size, match):
    with pytest.raises(ValueError, match=match):
        grad_cache.check_micro_batches(64, micro_batch_size, 8)


def _train_step_result(config, micro_batch_size, method="grad_cache"):
    from contrastive_jax.config_lib import override
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import run_plan

    config = override(
        config,
        {
            "train.micro_batch_size": micro_batch_size,
            "train.micro_batch_method": method,
        },
    )
    run = run_plan.build(config, sharding.make_mesh(NUM_DEVICES)).trainer
    ds = input_pipeline.train_dataset(data_settings(config))
    init, _ = run.init_state(ds.element_spec)
    batch = jax.device_put(next(iter(ds)), sharding.data_sharding(run.mesh))
    state, metrics = jax.jit(run.train_step)(init(), batch)
    return jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.compat
@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_train_step_with_grad_cache_equals_the_full_batch_step(load_config, digits_data_dir, loss):
    config = load_config("default")
    config.data.data_dir = digits_data_dir
    config.loss.name = loss
    config.model.dropout_rate = 0.0  # micro-batches draw their own dropout masks
    config.model.mlp_hidden_dims = (32,)
    config.train.global_batch_size = 64
    config.optim.warmup_steps = 0
    config.optim.name = "sgd"  # parameter change = learning rate x gradient (Adam's first
    config.optim.learning_rate = 1.0  # step would amplify float noise in tiny gradients)
    config.optim.grad_clip_norm = 0.0
    config.optim.weight_decay = 0.0
    params, metrics = _train_step_result(config, 0)
    cached_params, cached_metrics = _train_step_result(config, 16)
    assert cached_metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-6)
    assert cached_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), cached_params, params)
    _, accumulated_metrics = _train_step_result(config, 16, "accumulate")
    # Each micro-batch scores 16 columns, not 64: a different (lower) loss.
    assert accumulated_metrics["loss"] < metrics["loss"] - 1e-3


def _bench_module():
    """`experiments/bench/bench_grad_cache.py`, imported."""
    from experiments.bench import bench_grad_cache

    return bench_grad_cache


def test_benchmark_times_calls_in_turns_and_once_when_slow():
    bench_grad_cache = _bench_module()
    calls = []
    seconds = bench_grad_cache.time_in_turns(
        {"step": lambda: calls.append("step"), "loss": lambda: calls.append("loss")}, repeats=2
    )
    assert calls == ["step", "loss"] * 3  # a warm-up round, then two timed rounds
    assert set(seconds) == {"step", "loss"}
    calls.clear()
    bench_grad_cache.time_in_turns({"step": lambda: calls.append("step")}, budget_s=-1.0)
    assert calls == ["step"]  # slower than the budget: the first call is the measurement


@pytest.mark.slow
def test_quick_benchmark_reports_the_step_beside_the_loss(tmp_path):
    import json

    bench_grad_cache = _bench_module()
    bench_grad_cache.main(["--quick", "--out", str(tmp_path)])
    points = json.loads((tmp_path / "results.json").read_text())
    assert {(p["global_batch"], p["method"]) for p in points} == {(1024, m) for m in ("full", "grad_cache")}
    for p in points:  # the step includes the loss, so it takes longer than the loss alone
        assert p["step_over_loss"] > 1 and p["step_over_matmul_limit"] > 0
    assert "step ÷ loss" in (tmp_path / "results.md").read_text()
