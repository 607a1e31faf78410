"""A bad loss: stop, or roll back to the newest checkpoint and skip the batches (exactly,
recorded, so a kill during it resumes bitwise); too many rollbacks stop the run."""

import json
import os
import signal

import numpy as np
import pytest
from subprocess_runs import (
    assert_bitwise_equal,
    resumed_from_steps,
    saved_params,
    tiny_fields,
    write_config,
)

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from contrastive_jax.data import batch_numbering
from contrastive_jax.training import loss_guard, run_plan
from contrastive_jax.training.run_plan import guard_settings

STEPS = 8  # checkpoints every 2 steps (tiny_fields)
# The batch step 6 reads is NaN: rolled back to checkpoint 4 (step 5 undone), skipping
# the batches of the next 2 steps, 5 and 6.
ROLLBACK = {
    "train.on_bad_loss": "rollback",
    "train.inject_nan_at_batches": (6,),
    "train.rollback_skip_batches": 2,
}
RECORD = {"bad_step": 6, "reason": "Loss is nan", "restored_step": 4, "skipped_batches": [5, 6]}


def rollbacks(workdir):
    with open(os.path.join(workdir, run_dir.ROLLBACKS)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def rolled_back(load_config, digits_data_dir, tmp_path_factory):
    """An uninterrupted run that rolled back once (`ROLLBACK`); its workdir is kept."""
    workdir = str(tmp_path_factory.mktemp("rolled_back"))
    config = override(load_config("default"), tiny_fields(digits_data_dir) | ROLLBACK)
    run_plan.train_and_evaluate(config, workdir)
    return workdir


@pytest.mark.slow
def test_a_nan_batch_rolls_back_and_skips_exactly_the_recorded_batches(
    rolled_back, load_config, digits_data_dir, tmp_path
):
    assert rollbacks(rolled_back) == [RECORD]
    records = run_dir.read_metrics(rolled_back)
    [rollback] = [r for r in records if "rollback/bad_step" in r]
    assert rollback == {
        "step": 4,
        "rollback/bad_step": 6,
        "rollback/first_skipped_batch": 5,
        "rollback/skipped_batches": 2,
    }
    losses = [r["step"] for r in records if "train/loss" in r]
    assert losses == list(range(1, STEPS + 1))  # the undone step 5's line was dropped
    # The same parameters as a run that never saw the NaN and skips batches 5 and 6.
    skipping = str(tmp_path / "skipping")
    os.makedirs(skipping)
    with open(os.path.join(skipping, run_dir.ROLLBACKS), "w") as f:
        json.dump([RECORD], f)
    config = override(load_config("default"), tiny_fields(digits_data_dir))
    run_plan.train_and_evaluate(config, skipping)
    assert_bitwise_equal(saved_params(skipping, STEPS), saved_params(rolled_back, STEPS))


@pytest.mark.slow
def test_a_kill_after_a_rollback_resumes_bitwise_and_skips_the_same_batches(
    processes,
    rolled_back,
    digits_data_dir,
    tmp_path,
):
    workdir = str(tmp_path / "run")
    config = write_config(tmp_path / "tiny.py", tiny_fields(digits_data_dir) | ROLLBACK)
    # Batches dispatched: steps 1-7, then (rolled back to 4) step 5; killed before step 6.
    status, output = processes.wait(processes.start(config, workdir, num_devices=8, fault="batch:9:SIGKILL"))
    assert status == -signal.SIGKILL, output[-3000:]
    line = (
        "Rollback: Loss is nan at step 6; restored step 4 and skipping 2 batches (5-6); "
        "rollback 1 of at most 3 within 1000 steps."
    )
    assert line in output.splitlines(), output[-3000:]
    status, output = processes.wait(processes.start(config, workdir, num_devices=8))
    assert status == 0, output[-3000:]
    assert "Rollback" not in output  # the rerun skipped the recorded batches: no NaN
    assert resumed_from_steps(workdir) == [4] and rollbacks(workdir) == [RECORD]
    assert_bitwise_equal(saved_params(workdir, STEPS), saved_params(rolled_back, STEPS))
    assert [r for r in run_dir.read_metrics(workdir) if "rollback/bad_step" in r] == [
        r for r in run_dir.read_metrics(rolled_back) if "rollback/bad_step" in r
    ]


def test_too_many_rollbacks_stop_naming_the_bad_steps(load_config, digits_data_dir, tmp_path):
    fields = (
        tiny_fields(digits_data_dir)
        | ROLLBACK
        | {
            "train.inject_nan_at_batches": (3, 7),  # 7: step 5's batch after skipping 3 and 4
            "train.max_rollbacks": 1,
        }
    )
    workdir = str(tmp_path)
    with pytest.raises(
        FloatingPointError,
        match=r"^Loss is nan at step 5, after 1 rollback within 1000 steps \(bad steps 3, 5\); "
        r"training stopped \(config.train.max_rollbacks=1\). Last good checkpoint: step 4 in ",
    ):
        run_plan.train_and_evaluate(override(load_config("default"), fields), workdir)
    assert rollbacks(workdir) == [
        {"bad_step": 3, "reason": "Loss is nan", "restored_step": 2, "skipped_batches": [3, 4]}
    ]


def test_batch_numbers_leave_out_the_skipped_ones():
    numbers = [batch_numbering.batch_number(step, {3, 4, 9}) for step in range(1, 9)]
    assert numbers == [1, 2, 5, 6, 7, 8, 10, 11]
    assert batch_numbering.batch_number(7, set()) == 7


def test_the_batches_after_a_step_skip_reopening_the_stream_and_turn_the_injected_to_nan(tiny_config):
    """Step 2 onwards with batches 3 and 4 skipped and 5 injected: batches 2, 5 (NaN), 6,
    as the plain stream from batch 1 holds them; the skipped set is read as it grows."""
    skipped = {3, 4}
    numbering = batch_numbering.BatchNumbering(run_plan.data_settings(tiny_config), skipped, nan_batches=(5,))
    plain = iter(numbering.stream_after(0))  # batches 1, 2, 3, ... (1 is not skipped)
    plain = [next(plain) for _ in range(7)]
    assert numbering.first_batch(1) == 2 and numbering.first_batch(2) == 5
    batches = numbering.batches_after(1)
    got = [next(batches) for _ in range(3)]
    for batch, number in zip(got, (2, 5, 6), strict=True):
        for key, value in plain[number - 1].items():
            if number == 5 and value.dtype.kind == "f":
                assert np.isnan(batch[key]).all(), key
            else:
                np.testing.assert_array_equal(batch[key], value)
    skipped.add(7)  # a rollback skips batch 7 now: step 5 reads batch 8, the stream reopened
    assert numbering.first_batch(4) == 8
    np.testing.assert_array_equal(next(batches)["a"], next(iter(numbering.stream_after(4)))["a"])
    saved = batch_numbering.position({"seed": 0}, 6)
    assert batch_numbering.resumed_step(saved) == 6 and saved["config"] == {"seed": 0}


def guard(load_config, tmp_path, **fields):
    config = override(load_config("default"), {f"train.{k}": v for k, v in fields.items()})
    return loss_guard.LossGuard(guard_settings(config), str(tmp_path), lead=True)


def test_a_spike_is_a_loss_above_k_times_the_running_median(load_config, tmp_path):
    watch = guard(load_config, tmp_path, loss_spike_factor=2.0, loss_spike_window_steps=3)
    # Judged once 3 losses are in the window: 2.1 < 2 x 1.1 and 2.0 < 2 x 1.2 pass.
    for step, loss in enumerate([1.0, 1.2, 1.1, 2.1, 2.0], start=1):
        watch.check(step, {"loss": loss, "grad_norm": 1.0})
    spike = r"^Loss is 4.1, above 2 x the median 2 of the last 3 steps, at step 6$"
    with pytest.raises(loss_guard.BadLoss, match=spike):
        watch.check(6, {"loss": 4.1, "grad_norm": 1.0})  # the median of 1.1, 2.1, 2.0
    # A resumed guard judges as this one does: the window is saved with the checkpoint.
    resumed = guard(load_config, tmp_path, loss_spike_factor=2.0, loss_spike_window_steps=3)
    resumed.restore(watch.saved())
    with pytest.raises(loss_guard.BadLoss):
        resumed.check(6, {"loss": 4.1, "grad_norm": 1.0})
    resumed.check(6, {"loss": 3.9, "grad_norm": 1.0})
    off = guard(load_config, tmp_path, loss_spike_window_steps=1)  # factor 0: no spikes
    off.check(1, {"loss": 1.0, "grad_norm": 1.0})
    off.check(2, {"loss": 100.0, "grad_norm": 1.0})
    with pytest.raises(loss_guard.BadLoss, match=r"^Gradient norm is inf at step 3$"):
        off.check(3, {"loss": 1.0, "grad_norm": float("inf")})
