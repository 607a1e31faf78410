"""Batch size as a schedule (issue 55): the stream counts examples, a change of batch
neither repeats nor skips one, runs resume bitwise at and between changes and for the
"noise" rule, each stage's step compiles once, the memory check sees the largest batch,
and the learning rate follows `config.optim.lr_scaling`."""

import itertools
import math
import os

import chex
import jax
import numpy as np
import pytest
from subprocess_runs import checkpoint_steps, saved_state

from contrastive_jax import run_dir, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import batch_numbering, input_pipeline
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import batch_schedule, loop, noise_scale, optimizer, run_plan
from contrastive_jax.training import trainer as trainer_module
from contrastive_jax.training.run_plan import build, data_settings

STAGES = "32@0,64@4,128@6"  # steps 1-4: 32, 5-6: 64, 7-12: 128
REAL_GLOBAL_BATCH = loop._global_batch


@pytest.fixture
def config(tiny_config):
    """The tiny config from a batch of 32, 12 steps, a log every step, a checkpoint every 4."""
    fields = {
        "train.global_batch_size": 32,
        "train.num_train_steps": 12,
        "train.log_every_steps": 1,
        "checkpoint.every_steps": 4,
    }
    return override(tiny_config, fields)


def stream(config, stages, num_steps, process_index=0, process_count=1):
    """The first `num_steps` batches of `BatchNumbering` under `stages` (this process's rows)."""
    numbering = batch_numbering.BatchNumbering(
        data_settings(config), (), stages=stages, process_index=process_index, process_count=process_count
    )
    return list(itertools.islice(numbering.batches_after(0), num_steps))


def test_stage_stream_is_the_constant_stream_cut_differently(config):
    """Batches of 256, then 512 over an epoch's end (1,437 examples): the same rows, in
    order, as 24 constant batches of 64 (inputs, augmentation noise, example ids), the
    first epoch a permutation of the split; two processes read the halves of each."""
    stages = batch_numbering.Stages(((0, 256), (2, 512)))
    staged = stream(config, stages, 4)
    assert [len(b["index"]) for b in staged] == [256, 256, 512, 512]
    constant = stream(override(config, {"train.global_batch_size": 64}), None, 24)
    for key in staged[0]:
        np.testing.assert_array_equal(
            np.concatenate([b[key] for b in staged]), np.concatenate([b[key] for b in constant])
        )
    seen = np.concatenate([b["index"] for b in staged])
    split = input_pipeline.train_split_size(data_settings(config))
    assert sorted(seen[:split]) == list(range(split))  # none repeated or skipped in the epoch
    halves = [stream(config, stages, 4, p, 2) for p in range(2)]
    for whole, first, second in zip(staged, *halves):
        np.testing.assert_array_equal(whole["a"], np.concatenate([first["a"], second["a"]]))


def test_stages_count_examples():
    stages = batch_numbering.Stages(((0, 32), (4, 64), (6, 128)))
    assert [stages.batch_after(s) for s in range(8)] == [32] * 4 + [64] * 2 + [128] * 2
    assert [stages.examples_before(s) for s in (0, 4, 5, 6, 8)] == [0, 128, 192, 256, 512]
    assert stages.then(8, 256).stages[-1] == (8, 256)


def norms(b_simple, batch, shards=8):
    """The step metrics whose noise scale at `batch` over `shards` is `b_simple` (|G|^2 = 1)."""
    small, big = batch // shards, batch
    trace = b_simple  # tr(Sigma) with |G|^2 = 1
    return {noise_scale.SMALL_KEY: 1 + trace / small, noise_scale.BIG_KEY: 1 + trace / big}


def test_noise_rule_doubles_past_the_factor_holds_below_and_at_the_cap():
    settings = batch_schedule.parse("noise", 64, noise_factor=2.0, noise_window_steps=2, batch_max=256)
    schedule = batch_schedule.BatchSchedule(settings, batch_shards=8)
    assert settings.batches == (64, 128, 256) and settings.largest == 256
    decisions = []
    for step, b_simple in enumerate([200, 200, 100, 300, 1000, 1000, 1000, 1000], start=1):
        decision = schedule.observe(step, norms(b_simple, schedule.batch_after(step - 1)))
        decisions.append(decision and (decision.next_batch, decision.reason))
    assert decisions == [
        None,
        (128, "B_simple > 2 x 64"),  # 200 > 128
        None,
        (128, "B_simple <= 2 x 128"),  # the window's mean: 200 <= 256
        None,
        (256, "B_simple > 2 x 128"),
        None,
        (256, "at config.train.batch_max=256"),  # 1000 > 512, but 512 is past the cap
    ]
    assert schedule.stages.stages == ((0, 64), (2, 128), (6, 256))
    lost = {noise_scale.SMALL_KEY: 100.0, noise_scale.BIG_KEY: 1.0}  # 256 |G_256|^2 < 32 |G_32|^2: |G|^2 < 0
    assert schedule.observe(9, lost) is None
    assert schedule.observe(10, lost).reason == "|G|^2 estimate <= 0: no signal in the window"


def test_noise_rule_resumes_its_window_and_stages():
    """A schedule restored from a checkpoint's position mid-window decides as the one that
    went on (the window's norms are saved, not only the stages)."""
    settings = batch_schedule.parse("noise", 64, noise_factor=1.0, noise_window_steps=3, batch_max=1024)
    straight, resumed = (batch_schedule.BatchSchedule(settings, 8) for _ in range(2))
    values = [norms(b, 64) for b in (30, 300, 90, 500, 700, 10, 900, 900, 900)]
    for step, v in enumerate(values[:4], start=1):
        straight.observe(step, v)
    resumed.restore(straight.saved())
    for step, v in enumerate(values[4:], start=5):
        assert straight.observe(step, v) == resumed.observe(step, v)
    assert straight.saved() == resumed.saved() and len(straight.stages.stages) > 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"train.batch_schedule": "64@2,128@4"}, r"must start with config.train.global_batch_size at step 0"),
        ({"train.batch_schedule": "32@0,36@4"}, r"reaches a global batch of 36, which must be a multiple of 8"),
        ({"train.batch_schedule": "32@0,4096@4"}, r"reaches a global batch of 4096, more than the 1437 examples"),
        ({"train.batch_schedule": "32@0,64@x"}, r"is not a schedule; use 'constant', 'noise' or stages"),
        ({"train.batch_schedule": "noise", "train.batch_max": 128}, r"set config.train.log_noise_scale=True"),
        ({"train.batch_schedule": "noise"}, r"reaches a global batch of 4096, more .*; lower config.train.batch_max"),
        (
            {"train.batch_schedule": "32@0,64@4", "train.on_bad_loss": "rollback"},
            r"needs config.train.on_bad_loss='stop'",
        ),
        (
            {"train.batch_schedule": "32@0,64@3", "loss.name": "moco_queue", "loss.queue_size": 128},
            r"the stage 64@3 must start after a multiple of 64 examples, not 96",
        ),
        (
            {"train.batch_schedule": "32@0,256@4", "loss.name": "moco_queue", "loss.queue_size": 128},
            r"reaches a global batch of 256: config.loss.queue_size=128 must be a multiple",
        ),
        ({"optim.lr_scaling": "square"}, r"config.optim.lr_scaling='square'; use one of"),
    ],
)
def test_a_schedule_that_cannot_run_is_one_line(config, fields, message):
    with pytest.raises(ConfigError, match=message) as refused:
        build(override(config, fields), sharding.make_mesh(8))
    assert "\n" not in str(refused.value)


def test_the_first_stage_sets_the_global_batch_and_extra_rows_join_each_stage(config):
    """`--config.train.batch_schedule=64@0,128@4` alone: the run's batch is 64, then 128;
    with 16 extra negatives each stage reads 16 rows more."""
    plan = build(override(config, {"train.batch_schedule": "64@0,128@4"}), sharding.make_mesh(8))
    assert plan.trainer.global_batch_size == 64 and plan.batch_schedule.batches == (64, 128)
    fields = {"train.batch_schedule": "64@0,128@4", "loss.extra_negatives": 16}
    plan = build(override(config, fields), sharding.make_mesh(8))
    assert plan.batch_schedule.batches == (80, 144) and plan.batch_schedule.optimizer_batches == (64, 128)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
def test_the_lr_rule_scales_the_step_by_the_batch_ratio(config, rule):
    """Plain SGD at its peak rate from one state on one batch of 64: a run whose first
    stage is 32 steps with the rate times 2, sqrt(2) or 1 (the update and the logged rate)."""
    sgd = {"optim.name": "sgd", "optim.momentum": 0.0, "optim.weight_decay": 0.0, "optim.grad_clip_norm": 0.0}
    sgd |= {"optim.schedule": "constant", "optim.warmup_steps": 0}
    sgd |= {"model.dropout_rate": 0.0, "loss.learn_temperature": False}
    mesh = sharding.make_mesh(8)
    base = build(override(config, sgd | {"train.global_batch_size": 64}), mesh).trainer
    scaled = build(override(config, sgd | {"optim.lr_scaling": rule}), mesh).trainer
    ds = input_pipeline.train_dataset(data_settings(override(config, {"train.global_batch_size": 64})), start_step=1)
    batch = {k: np.asarray(v) for k, v in next(iter(ds)).items()}
    init, _ = base.init_state(ds.element_spec)
    state = init()
    steps = [jax.jit(t.train_step)(state, batch) for t in (base, scaled)]
    factor = {"linear": 2.0, "sqrt": math.sqrt(2.0), "none": 1.0}[rule]
    assert optimizer.rate_factor(rule, 64, 32) == factor
    assert float(steps[1][1]["learning_rate"]) == pytest.approx(factor * float(steps[0][1]["learning_rate"]))
    assert float(steps[0][1]["learning_rate"]) == pytest.approx(config.optim.learning_rate)
    flat = lambda params: np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)])  # noqa: E731
    moved = [flat(s.params) - flat(state.params) for s, _ in steps]
    assert np.abs(moved[0]).max() > 1e-4
    np.testing.assert_allclose(moved[1], factor * moved[0], rtol=1e-3, atol=1e-7)


def logged(workdir, key):
    return {m["step"]: m[key] for m in run_dir.read_metrics(workdir) if key in m}


def crash_at(monkeypatch, call):
    """Makes the loop's `call`-th batch raise (a kill before that step)."""
    calls = {"n": 0}

    def counted(batch, data_sharding):
        calls["n"] += 1
        if calls["n"] == call:
            raise RuntimeError("simulated crash")
        return REAL_GLOBAL_BATCH(batch, data_sharding)

    monkeypatch.setattr(loop, "_global_batch", counted)


@pytest.mark.slow
def test_stages_train_and_resume_bitwise_at_a_change_and_mid_stage(config, tmp_path, monkeypatch):
    """32, 64, 128 with the sqrt rule: each batch's step compiled once (the largest first,
    for the memory check); killed after step 5 (resumes from 4, where 64 starts) and
    after step 9 (from 8, mid-128): both end bitwise where the straight run does."""
    config = override(config, {"train.batch_schedule": STAGES, "optim.lr_scaling": "sqrt"})
    compiled = []
    real_compile = trainer_module.Trainer.compile_step
    monkeypatch.setattr(
        trainer_module.Trainer,
        "compile_step",
        lambda self, *a: compiled.append(a[2] if len(a) > 2 else None) or real_compile(self, *a),
    )
    straight = str(tmp_path / "straight")
    run_plan.train_and_evaluate(config, straight)
    assert compiled == [128, 32, 64]
    batches = logged(straight, "train/global_batch")
    assert [batches[s] for s in range(1, 13)] == [32] * 4 + [64] * 2 + [128] * 6
    schedule = optimizer.make_schedule(run_plan.optim_settings(config), 12)
    rates = logged(straight, "train/learning_rate")
    for step in range(1, 13):  # the warm-up counts steps; the rate times sqrt(N / 32)
        assert rates[step] == pytest.approx(float(schedule(step - 1)) * math.sqrt(batches[step] / 32), rel=1e-5)
    for name, crash in (("at_change", 6), ("mid_stage", 10)):
        resumed = str(tmp_path / name)
        crash_at(monkeypatch, crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_plan.train_and_evaluate(config, resumed)
        monkeypatch.setattr(loop, "_global_batch", REAL_GLOBAL_BATCH)
        run_plan.train_and_evaluate(config, resumed)
        assert run_dir.read_metrics(resumed)[0]["step"] == 1
        chex.assert_trees_all_equal(saved_state(straight, 12), saved_state(resumed, 12))
        assert logged(resumed, "train/loss") == logged(straight, "train/loss")


@pytest.mark.slow
def test_noise_rule_decides_logs_and_resumes_to_the_same_decisions(config, tmp_path, monkeypatch, caplog):
    """Doubles after steps 2 and 4 (any measured noise scale passes a factor of 1e-6),
    then holds at batch_max; checkpoints every 3 steps land mid-window. Killed before
    step 5 (resumes from 3, its window's norms saved) and before step 8: the same
    decisions and the straight run's state, bitwise."""
    fields = {
        "train.batch_schedule": "noise",
        "train.log_noise_scale": True,
        "train.batch_noise_window_steps": 2,
        "train.batch_noise_factor": 1e-6,
        "train.batch_max": 128,
        "checkpoint.every_steps": 3,
        "train.num_train_steps": 9,
    }
    config = override(config, fields)
    straight = str(tmp_path / "straight")
    with caplog.at_level("INFO"):
        run_plan.train_and_evaluate(config, straight)
    decisions = logged(straight, "batch/next_global_batch")
    assert decisions == {2: 64, 4: 128, 6: 128, 8: 128}
    lines = [m for m in caplog.messages if m.startswith("Batch schedule after step")]
    assert len(lines) == 4 and "the global batch doubles to 64 (B_simple > 1e-06 x 32)." in lines[0]
    assert lines[3].endswith("the global batch stays 128 (at config.train.batch_max=128).")
    assert logged(straight, "train/global_batch") == {1: 32, 2: 32, 3: 64, 4: 64, **{s: 128 for s in range(5, 10)}}
    for crash in (5, 8):
        resumed = str(tmp_path / f"crash_{crash}")
        crash_at(monkeypatch, crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_plan.train_and_evaluate(config, resumed)
        monkeypatch.setattr(loop, "_global_batch", REAL_GLOBAL_BATCH)
        run_plan.train_and_evaluate(config, resumed)
        assert checkpoint_steps(resumed)[0][-1] == 9
        assert logged(resumed, "batch/next_global_batch") == decisions
        assert logged(resumed, "batch/noise_scale") == logged(straight, "batch/noise_scale")
        chex.assert_trees_all_equal(saved_state(straight, 9), saved_state(resumed, 9))


@pytest.mark.slow
def test_the_memory_check_refuses_an_unreachable_last_stage_before_step_1(config, tmp_path, monkeypatch):
    """32 fits in 0.95 MiB a device; the last stage's 1,024 does not: refused in one line
    naming the schedule, before any batch is read."""
    fields = {"train.batch_schedule": "32@0,1024@4", "train.memory_limit_gib": 0.95 / 1024}
    crash_at(monkeypatch, 1)  # a step would raise
    workdir = str(tmp_path / "run")
    with pytest.raises(ConfigError) as refused:
        run_plan.train_and_evaluate(override(config, fields), workdir)
    message = str(refused.value)
    assert message.startswith("The train step at the schedule's largest batch (1,024) needs"), message
    assert "\n" not in message and not os.path.exists(os.path.join(workdir, "metrics.jsonl"))


@pytest.mark.slow
def test_grad_cache_and_fsdp_take_every_stage(config, tmp_path):
    """32 then 64 from step 2, in micro-batches of 16 with the parameters split 2 ways:
    the plain data-parallel run's losses and parameters (grad_cache is exact; no dropout,
    whose masks are drawn per micro-batch)."""
    fields = {"train.batch_schedule": "32@0,64@2", "train.num_train_steps": 4, "model.dropout_rate": 0.0}
    config = override(config, fields)
    plain, cached = str(tmp_path / "plain"), str(tmp_path / "cached")
    run_plan.train_and_evaluate(config, plain)
    run_plan.train_and_evaluate(override(config, {"train.micro_batch_size": 16, "mesh.fsdp": 2}), cached)
    assert logged(cached, "train/global_batch") == {1: 32, 2: 32, 3: 64, 4: 64}
    assert logged(cached, "train/loss") == pytest.approx(logged(plain, "train/loss"), rel=1e-5)
    chex.assert_trees_all_close(saved_state(cached, 4)["params"], saved_state(plain, 4)["params"], atol=2e-6)


@pytest.mark.slow
def test_a_queue_goes_on_across_a_change_and_resumes_bitwise(config, tmp_path, monkeypatch):
    """MoCo's queue of 128 keys under 32 then 64 from step 4 (128 examples in: the pointer
    at a multiple of 64): killed before step 7, resumed from 4, bitwise the straight run."""
    queue = {"loss.name": "moco_queue", "loss.queue_size": 128, "loss.queue_momentum": 0.9, "loss.chunk_size": 32}
    config = override(config, queue | {"train.batch_schedule": "32@0,64@4", "train.num_train_steps": 8})
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    run_plan.train_and_evaluate(config, straight)
    assert all(np.isfinite(v) for v in logged(straight, "train/loss").values())
    crash_at(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_plan.train_and_evaluate(config, resumed)
    monkeypatch.setattr(loop, "_global_batch", REAL_GLOBAL_BATCH)
    run_plan.train_and_evaluate(config, resumed)
    chex.assert_trees_all_equal(saved_state(straight, 8), saved_state(resumed, 8))
