"""A run of a loss with state, killed (SIGKILL mid-run and during a checkpoint write)
and resumed, ends bitwise where an uninterrupted run does: parameters, optimizer state
and the loss's state (SogCLR's table; the MoCo queues, pointer and momentum encoder)."""

import signal

import pytest
from subprocess_runs import (
    assert_bitwise_equal,
    logged_losses,
    resumed_from_steps,
    saved_state,
    tiny_fields,
    write_config,
)

from contrastive_jax.config_lib import override
from contrastive_jax.training import run_plan

STEPS = 8  # checkpoints every 2 steps (tiny_fields)
STATE_FIELDS = {
    "sogclr": {"loss__name": "sogclr"},
    "moco_queue": {
        "loss__name": "moco_queue",
        "loss__queue_size": 256,
        "loss__queue_momentum": 0.9,
        "loss__chunk_size": 32,
    },
}


# -m slow (45 s each): the default suite resumes the queue's state in process
# (test_train.py::test_resume_reaches_the_uninterrupted_parameters) and SIGKILLs a plain
# run (test_preemption.py); here both at once, for the queue and SogCLR's table.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["moco_queue", "sogclr"])
def test_sigkill_and_resume_is_bitwise_with_the_loss_state(
    processes,
    load_config,
    digits_data_dir,
    tmp_path,
    name,
):
    fields = tiny_fields(digits_data_dir, **STATE_FIELDS[name])
    reference = str(tmp_path / "reference")
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)
    workdir = str(tmp_path / "run")
    config = write_config(tmp_path / "tiny.py", fields)
    for fault in ("save:2:SIGKILL", "batch:3:SIGKILL"):  # writing checkpoint 4; step 5
        status, output = processes.wait(processes.start(config, workdir, num_devices=8, fault=fault))
        assert status == -signal.SIGKILL, output[-3000:]
    status, output = processes.wait(processes.start(config, workdir, num_devices=8))
    assert status == 0, output[-3000:]
    # From 2, not from the partial 4; then from 2 or 4 (the second kill may land before
    # checkpoint 4's write finished).
    assert resumed_from_steps(workdir)[0] == 2 and len(resumed_from_steps(workdir)) == 2
    state, want = saved_state(workdir, STEPS), saved_state(reference, STEPS)
    assert set(state["loss_state"]) == set(want["loss_state"]) and want["loss_state"]
    assert_bitwise_equal(state, want)
    assert logged_losses(workdir) == logged_losses(reference)
