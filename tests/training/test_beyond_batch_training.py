"""The losses with state in the trainer: sharded steps equal one device's (state
included), gradient caching equals the whole batch, the pipeline's example indices and
the state's updates. Their config errors are in test_validation.py's BAD_COMBINATIONS
(and through the command line in test_cli.py)."""

import itertools

import chex
import jax
import numpy as np
import pytest

from contrastive_jax import sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline
from contrastive_jax.training.run_plan import build, data_settings

N = 64
STATE_FIELDS = {
    "sogclr": {"loss.name": "sogclr"},
    "moco_queue": {
        "loss.name": "moco_queue",
        "loss.queue_size": 4 * N,
        "loss.queue_momentum": 0.9,
        "loss.chunk_size": 16,
    },
    # MoCo v3: no queue, the batch's keys from the momentum encoder.
    "moco_batch_keys": {"loss.name": "moco_queue", "loss.queue_size": 0, "loss.queue_momentum": 0.9},
    "xbm": {
        "loss.name": "xbm",
        "data.task": "labeled",
        "data.examples_per_class": 8,
        "loss.xbm_memory_size": 2 * N,
        "loss.xbm_warmup_steps": 1,
    },
}


@pytest.fixture
def config(tiny_config):
    """The tiny config without augmentation or dropout (the indices are checked on
    pixels), no warmup, the default's schedule length."""
    deterministic = {
        "data.augment.noise_std": 0.0,
        "model.dropout_rate": 0.0,
        "train.global_batch_size": N,
        "train.num_train_steps": 1000,
        "optim.warmup_steps": 0,
    }
    return override(tiny_config, deterministic)


def run_steps(config, num_devices, num_steps=3, fsdp=1):
    """`(states after each step, losses, batches)`: `num_steps` jitted steps from the
    start on `num_devices` devices, `fsdp` of them splitting the parameters."""
    trainer = build(override(config, {"mesh.fsdp_min_kib": 0.0}), sharding.make_mesh(num_devices, fsdp=fsdp)).trainer
    ds = input_pipeline.train_dataset(data_settings(config))
    init, abstract = trainer.init_state(ds.element_spec)
    step = trainer.jit_train_step(abstract)
    state, states, values, batches = init(), [], [], []
    for batch in itertools.islice(ds, num_steps):
        state, metrics = step(state, batch)
        states.append(jax.device_get(state))
        values.append(float(metrics["loss"]))
        batches.append(batch)
    return states, values, batches


@pytest.mark.parametrize("name", sorted(STATE_FIELDS))
def test_sharded_steps_equal_one_device_with_the_state(config, name):
    """On a 2 x 4 mesh (the batch over both axes, parameters and the momentum encoder
    split over fsdp) the steps equal one device's, the state included."""
    config = override(config, STATE_FIELDS[name])
    (states_1, losses_1, _), (states_8, losses_8, _) = run_steps(config, 1), run_steps(config, 8, fsdp=4)
    np.testing.assert_allclose(losses_8, losses_1, rtol=1e-5)
    for state_1, state_8 in zip(states_1, states_8):
        chex.assert_trees_all_close(state_8.loss_state, state_1.loss_state, rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(states_8[-1].params, states_1[-1].params, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sogclr", "moco_queue"])
def test_grad_cache_equals_the_whole_batch_with_the_state(config, name):
    config = override(config, STATE_FIELDS[name] | {"loss.queue_momentum": 0.0})
    whole, whole_losses, _ = run_steps(config, 8, num_steps=2)
    cached, cached_losses, _ = run_steps(override(config, {"train.micro_batch_size": 16}), 8, num_steps=2)
    np.testing.assert_allclose(cached_losses, whole_losses, rtol=1e-5)
    chex.assert_trees_all_close(cached[-1].loss_state, whole[-1].loss_state, rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(cached[-1].params, whole[-1].params, rtol=1e-4, atol=1e-6)


def test_moco_without_a_queue_or_momentum_trains_as_clip(config):
    """K = 0 with the towers' own keys (no state at all) takes CLIP's steps; detached
    keys (`queue_stop_gradient`) the same first loss but other steps."""
    moco = override(config, {"loss.name": "moco_queue", "loss.queue_size": 0})
    (clip_states, clip_losses, _), (moco_states, moco_losses, _) = run_steps(config, 8), run_steps(moco, 8)
    assert moco_states[-1].loss_state == {}
    np.testing.assert_allclose(moco_losses, clip_losses, rtol=1e-5)
    chex.assert_trees_all_close(moco_states[-1].params, clip_states[-1].params, rtol=1e-4, atol=1e-6)
    detached_states, detached_losses, _ = run_steps(override(moco, {"loss.queue_stop_gradient": True}), 8)
    np.testing.assert_allclose(detached_losses[0], clip_losses[0], rtol=1e-5)
    with np.testing.assert_raises(AssertionError):
        chex.assert_trees_all_close(detached_states[-1].params, clip_states[-1].params, rtol=1e-4, atol=1e-6)


def test_the_pipeline_gives_each_example_its_index(config):
    """`index` is the example's row in the split: its pixels are the batch's."""
    data = data_settings(config)
    arrays = input_pipeline.eval_arrays(data, data.train_split)
    for step, batch in enumerate(itertools.islice(input_pipeline.train_dataset(data), 2)):
        np.testing.assert_array_equal(batch["a"], arrays["a"][batch["index"]], err_msg=f"step {step}")
        np.testing.assert_array_equal(batch["label"], arrays["label"][batch["index"]])


def test_sogclr_table_rows_are_the_visited_examples(config):
    states, _, batches = run_steps(override(config, STATE_FIELDS["sogclr"]), 8, num_steps=2)
    table = states[-1].loss_state["log_u"]
    visited = np.unique(np.concatenate([b["index"] for b in batches]))
    assert table.shape == (1437, 2)  # the digits' training split
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(table[:, 0])), visited)


def test_moco_queue_takes_the_momentum_encoders_keys(config):
    """After step s the queue's rows [s N, (s + 1) N) are that step's keys from the
    moving average of the towers (before its update), and the average moves by (1 - m)."""
    config = override(config, STATE_FIELDS["moco_queue"])
    states, _, batches = run_steps(config, 8, num_steps=2)
    trainer = build(config, sharding.make_mesh(1)).trainer
    before, after = states[0], states[1]
    keys = trainer.model.apply(
        {"params": before.loss_state["ema_params"], "batch_stats": {}},
        batches[1]["a"],
        batches[1]["b"],
        train=False,
    )
    np.testing.assert_allclose(after.loss_state["queue_b"][N : 2 * N], keys["zb"], atol=1e-5)
    np.testing.assert_allclose(after.loss_state["queue_a"][N : 2 * N], keys["za"], atol=1e-5)
    assert int(after.loss_state["pointer"]) == 2 * N
    chex.assert_trees_all_close(
        after.loss_state["ema_params"],
        jax.tree.map(lambda e, p: 0.9 * e + 0.1 * p, before.loss_state["ema_params"], after.params),
        rtol=1e-5,
        atol=1e-7,
    )


def test_xbm_memory_joins_after_the_warm_up(config):
    """Before `xbm_warmup_steps` the loss is the batch's alone; from then on the filled
    memory slots are candidates too."""
    config = override(config, STATE_FIELDS["xbm"] | {"loss.xbm_warmup_steps": 2})
    trainer = build(config, sharding.make_mesh(8)).trainer
    states, _, batches = run_steps(config, 8, num_steps=1)
    state = states[0].loss_state  # the memory holds step 0's embeddings
    outputs = trainer.model.apply({"params": states[0].params, "batch_stats": {}}, batches[0]["a"], None, train=False)
    batched = {"za": outputs["za"]}
    shared = {"temperature": outputs["temperature"]}
    data = {"label": batches[0]["label"]}

    global_loss = jax.jit(trainer.global_loss)  # one compile for the five calls

    def loss_at(step, loss_state=state):
        return float(global_loss(batched, shared, data, loss_state, np.int32(step))[0])

    empty = dict(state, labels=np.full_like(state["labels"], -1))
    assert loss_at(1) == loss_at(1, empty)
    assert loss_at(2) != pytest.approx(loss_at(2, empty), rel=1e-3)
    assert loss_at(2, empty) == pytest.approx(loss_at(1, empty), rel=1e-6)
