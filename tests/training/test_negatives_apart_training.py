"""The trainer's side of extra negatives and groups (`training.forward`): a step with
`config.loss.extra_negatives` takes the gradient of CLIP over the N gradient rows against
all N + M rows, written here by hand (the towers applied to each device's rows, the
extra rows under stop_gradient); `config.loss.group_size` reaches the kernel; the door
refuses what cannot run. (With every gradient path: tests/training/test_recipes_with_tools.py.)"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import run_plan
from contrastive_jax.training.run_plan import build, data_settings

N, M = 16, 16  # the optimizer's batch, the extra negatives


# Plain SGD at rate 1 (an update is minus the gradient), no dropout: two steps compare exactly.
EXACT_STEP = {
    "optim.name": "sgd",
    "optim.momentum": 0.0,
    "optim.learning_rate": 1.0,
    "optim.warmup_steps": 0,
    "optim.grad_clip_norm": 0.0,
    "optim.weight_decay": 0.0,
    "model.dropout_rate": 0.0,
}


@pytest.fixture
def config(tiny_config):
    """`EXACT_STEP` at N = 16."""
    return override(tiny_config, EXACT_STEP | {"train.global_batch_size": N})


def one_step(config, num_devices):
    """`(trainer, state before, batch, state after, metrics)` of one jitted step."""
    trainer = build(config, sharding.make_mesh(num_devices)).trainer
    ds = input_pipeline.train_dataset(data_settings(config))
    init, abstract = trainer.init_state(ds.element_spec)
    batch = next(iter(ds))
    before = jax.device_get(init())
    after, metrics = trainer.jit_train_step(abstract)(init(), batch)
    return trainer, before, batch, jax.device_get(after), jax.device_get(metrics)


def reference_loss(model, params, batch_stats, batch, num_devices):
    """CLIP over the gradient rows (each device's first N / d of its (N + M) / d rows,
    read from the global row index) against every row, the towers applied to the
    gradient rows and, under stop_gradient, to the extra rows."""
    rows = np.arange(N + M)
    queries = rows % ((N + M) // num_devices) < N // num_devices
    q, e = np.flatnonzero(queries), np.flatnonzero(~queries)

    def towers(params, index):
        return model.apply({"params": params, "batch_stats": batch_stats}, batch["a"][index], batch["b"][index])

    grad_rows, extra = towers(params, q), towers(jax.lax.stop_gradient(params), e)
    za = jnp.zeros((N + M, grad_rows["za"].shape[1])).at[q].set(grad_rows["za"]).at[e].set(extra["za"])
    zb = jnp.zeros_like(za).at[q].set(grad_rows["zb"]).at[e].set(extra["zb"])
    t = grad_rows["temperature"]
    a_to_b = -jax.nn.log_softmax(za[q] @ zb.T / t, axis=1)[np.arange(len(q)), q]
    b_to_a = -jax.nn.log_softmax(zb[q] @ za.T / t, axis=1)[np.arange(len(q)), q]
    return jnp.mean(0.5 * (a_to_b + b_to_a))


@pytest.mark.slow
@pytest.mark.parametrize("num_devices", [1, 8])
def test_a_step_with_extra_negatives_has_the_hand_computed_gradient(config, num_devices):
    config = override(config, {"loss.extra_negatives": M})
    trainer, before, batch, after, metrics = one_step(config, num_devices)
    assert batch["a"].shape[0] == N + M  # the stream reads N + M examples
    value, grads = jax.value_and_grad(reference_loss, argnums=1)(
        trainer.model, before.params, before.batch_stats, jax.device_get(batch), num_devices
    )
    assert float(metrics["loss"]) == pytest.approx(float(value), rel=1e-5)
    step = jax.tree.map(lambda new, old: old - new, after.params, before.params)  # SGD at rate 1
    for got, want in zip(jax.tree.leaves(step), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_group_size_reaches_the_kernel(config):
    trainer = build(override(config, {"loss.group_size": 4}), sharding.make_mesh(8)).trainer
    za, zb = (losses.l2_normalize(jax.random.normal(jax.random.key(seed), (N, 16))) for seed in (0, 1))
    loss, _, _ = trainer.global_loss({"za": za, "zb": zb}, {"temperature": jnp.float32(0.1)}, {})
    groups = losses.clip_loss(za, zb, temperature=0.1, candidates=losses.Candidates(group_size=4))
    assert float(loss) == pytest.approx(float(groups), rel=1e-6)
    assert float(loss) != pytest.approx(float(losses.clip_loss(za, zb, temperature=0.1)), rel=1e-3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss.extra_negatives": 8, "loss.name": "siglip"}, r"name='siglip', which cannot"),
        ({"loss.extra_negatives": -8}, "must be >= 0"),
        ({"loss.extra_negatives": 4}, r"multiple of the devices x micro-batches .* \(8\); use 8"),
        ({"loss.extra_negatives": 8, "train.micro_batch_size": 8}, r"devices x micro-batches .* \(16\); use 16"),
        ({"loss.extra_negatives": 8, "loss.group_size": 4}, "group_size fixes each row's candidates"),
        ({"loss.group_size": 4, "loss.name": "ntxent"}, r"group_size=4 with config.loss.name='ntxent', which cannot"),
        ({"loss.group_size": 5}, "group_size"),
    ],
)
def test_the_door_refuses_in_one_line(config, fields, message):
    with pytest.raises(ConfigError, match=message) as error:
        build(override(config, fields), sharding.make_mesh(8))
    assert "\n" not in str(error.value)


def test_a_run_with_extra_negatives_trains_and_logs_its_batches(config, tmp_path):
    """The loop runs the hook: three steps of N + M = 32 examples read (the stream's and
    the compiled step's batch), the loss finite."""
    fields = {"loss.extra_negatives": M, "train.num_train_steps": 3, "checkpoint.every_steps": 0}
    results = run_plan.train_and_evaluate(override(config, fields), str(tmp_path))
    assert results
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if "train/loss" in r]
    assert len(steps) == 3 and all(np.isfinite(r["train/loss"]) for r in steps)
    assert {r["train/global_batch"] for r in steps} == {N + M}  # the rows read a step
