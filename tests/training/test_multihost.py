"""Multi-process training: 2 processes x 4 CPU devices (gloo, 127.0.0.1) = 1 x 8."""

import json
import os
import re
import signal
import time

import pytest
from subprocess_runs import (
    checkpoint_steps,
    free_port,
    logged_losses,
    max_difference,
    resumed_from_steps,
    saved_params,
    tiny_fields,
    write_config,
)

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import distributed, run_plan


def launch(processes, config, workdir, faults=(None, None), flags=()):
    """Starts `len(faults)` trainer processes of 8 / len(faults) CPU devices each, process
    i with `faults[i]` (see `subprocess_runs._DRIVER`; None: none) and `flags`."""
    address = f"127.0.0.1:{free_port()}"
    return [
        processes.start(
            config,
            workdir,
            num_devices=8 // len(faults),
            flags=(
                f"--coordinator_address={address}",
                f"--num_processes={len(faults)}",
                f"--process_id={i}",
                *flags,
            ),
            fault=fault,
        )
        for i, fault in enumerate(faults)
    ]


@pytest.mark.e2e
def test_two_processes_train_like_one(processes, load_config, digits_data_dir, tmp_path):
    fields = tiny_fields(digits_data_dir, train__num_train_steps=4, checkpoint__every_steps=4)
    workdir = str(tmp_path / "two")
    launched = launch(processes, write_config(tmp_path / "tiny.py", fields), workdir)
    reference = str(tmp_path / "one")  # meanwhile, here: one process, 8 devices
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)

    outputs = [processes.wait(p) for p in launched]
    for rank, (status, output) in enumerate(outputs):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    assert "step 4:" in outputs[0][1] and "step 4:" not in outputs[1][1]  # process 0 logs
    assert sorted(os.listdir(workdir)) == sorted(os.listdir(reference))
    assert logged_losses(workdir) == pytest.approx(logged_losses(reference), rel=1e-6)
    # Equal up to the order of float additions: gloo sums across processes in its own order.
    assert max_difference(saved_params(workdir, 4), saved_params(reference, 4)) < 1e-6


@pytest.mark.e2e
def test_two_processes_train_like_one_across_a_change_of_batch(processes, load_config, digits_data_dir, tmp_path):
    """A batch schedule of 32 then 64 from step 2 (each process reads half of each stage's
    batch, from the examples before it): 2 x 4 logs and ends where 1 x 8 does."""
    fields = tiny_fields(
        digits_data_dir,
        train__num_train_steps=4,
        checkpoint__every_steps=4,
        train__global_batch_size=32,
        train__batch_schedule="32@0,64@2",
    )
    workdir = str(tmp_path / "two")
    launched = launch(processes, write_config(tmp_path / "tiny.py", fields), workdir)
    reference = str(tmp_path / "one")
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)
    for rank, (status, output) in enumerate(processes.wait(p) for p in launched):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    batches = {m["step"]: m["train/global_batch"] for m in run_dir.read_metrics(workdir) if "train/global_batch" in m}
    assert batches == {1: 32, 2: 32, 3: 64, 4: 64}
    assert logged_losses(workdir) == pytest.approx(logged_losses(reference), rel=1e-6)
    assert max_difference(saved_params(workdir, 4), saved_params(reference, 4)) < 1e-6


def wait_for_training(workdir, launched, timeout=300):
    """Blocks until process 0 has logged a training step (or a process has exited)."""
    deadline = time.monotonic() + timeout
    metrics = os.path.join(workdir, "metrics.jsonl")
    while time.monotonic() < deadline:
        if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            return
        if any(p.poll() is not None for p in launched):
            return
        time.sleep(0.2)
    pytest.fail("no training step logged")


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_at_one_step_and_resumes(
    processes,
    load_config,
    digits_data_dir,
    tmp_path,
):
    fields = tiny_fields(digits_data_dir, train__num_train_steps=40, checkpoint__every_steps=0)
    config = write_config(tmp_path / "tiny.py", fields)
    workdir = str(tmp_path / "two")
    launched = launch(processes, config, workdir)
    wait_for_training(workdir, launched)
    launched[1].send_signal(signal.SIGTERM)  # only process 1 is preempted
    outputs = [processes.wait(p) for p in launched]
    for rank, (status, output) in enumerate(outputs):  # both: preempted, to be restarted
        assert status == distributed.PREEMPTED_EXIT_STATUS, f"process {rank}:\n{output[-4000:]}"
    stopped = int(re.search(r"Stopped after step (\d+) with the other", outputs[0][1]).group(1))
    assert f"Stopped after step {stopped} with the other" in outputs[1][1]  # the same in both
    assert stopped < 40 and os.listdir(os.path.join(workdir, "checkpoints")) == [str(stopped)]

    for rank, (status, output) in enumerate(processes.wait(p) for p in launch(processes, config, workdir)):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    assert resumed_from_steps(workdir) == [stopped]
    reference = str(tmp_path / "one")
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)
    assert max_difference(saved_params(workdir, 40), saved_params(reference, 40)) < 1e-5


@pytest.mark.slow
def test_both_processes_killed_then_resumed(processes, load_config, digits_data_dir, tmp_path):
    fields = tiny_fields(digits_data_dir)
    config = write_config(tmp_path / "tiny.py", fields)
    workdir = str(tmp_path / "two")
    newest = []  # the newest complete checkpoint after each kill that left one
    for fault in ("batch:4:SIGKILL", "save:2:SIGKILL"):  # mid-run, then during a write
        statuses = [processes.wait(p)[0] for p in launch(processes, config, workdir, (fault, fault))]
        # One is killed first; the other, under load not yet at its fault, may be aborted
        # by the coordination service that lost its peer (SIGABRT): a dead process either way.
        assert -signal.SIGKILL in statuses and set(statuses) <= {-signal.SIGKILL, -signal.SIGABRT}, statuses
        newest += checkpoint_steps(workdir)[0][-1:]
    for rank, (status, output) in enumerate(processes.wait(p) for p in launch(processes, config, workdir)):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    # The write of checkpoint 2 is done when the second save starts: 2 at least was left.
    assert resumed_from_steps(workdir) == newest and newest[-1] >= 2
    reference = str(tmp_path / "one")
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)
    assert max_difference(saved_params(workdir, 8), saved_params(reference, 8)) < 1e-6


HEARTBEAT_TIMEOUT = 6  # seconds; short to keep the test short (the default is 30)


@pytest.mark.slow  # 50 s: waits out the heartbeat timeout
def test_a_lost_process_stops_the_others_with_one_line_and_all_resume(
    processes,
    load_config,
    digits_data_dir,
    tmp_path,
):
    fields = tiny_fields(digits_data_dir)
    config = write_config(tmp_path / "tiny.py", fields)
    workdir = str(tmp_path / "two")
    flags = (f"--heartbeat_timeout_seconds={HEARTBEAT_TIMEOUT}",)
    # Process 1 dies (SIGKILL) before step 5: after checkpoint 4 was started.
    survivor, victim = launch(processes, config, workdir, (None, "batch:5:SIGKILL"), flags)
    assert processes.wait(victim)[0] == -signal.SIGKILL
    died = time.monotonic()
    status, output = processes.wait(survivor)
    noticed = time.monotonic() - died
    assert status == distributed.LOST_PROCESS_EXIT_STATUS, output[-4000:]
    # Within the timeout after its last beat (<= 1 s before it died), plus the exit.
    assert HEARTBEAT_TIMEOUT - 1.5 < noticed < HEARTBEAT_TIMEOUT + 8, noticed
    [line] = [line for line in output.splitlines() if "Lost process" in line]
    assert line.startswith(f"Lost process 1 of 2 (no heartbeat for {HEARTBEAT_TIMEOUT} s)")
    rerun = (
        f" -m contrastive_jax.main --config={config} --workdir={workdir} --coordinator_"
        f"address=127.0.0.1:PORT --num_processes=2 '--process_id=<I>' {flags[0]}"
    )
    assert re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line).endswith(rerun), line
    assert "Traceback" not in output and "Fatal" not in output, output[-4000:]

    complete, partial = checkpoint_steps(workdir)
    assert complete[-1] in (2, 4) and set(partial) <= {4}, (complete, partial)
    for rank, (status, output) in enumerate(processes.wait(p) for p in launch(processes, config, workdir, flags=flags)):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
        assert "corrupt" not in output
    assert resumed_from_steps(workdir) == [complete[-1]]  # the newest complete checkpoint
    reference = str(tmp_path / "one")
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)
    assert max_difference(saved_params(workdir, 8), saved_params(reference, 8)) < 1e-6


def test_a_heartbeat_timeout_under_two_seconds_is_refused():
    with pytest.raises(ConfigError, match="--heartbeat_timeout_seconds=1: must be at least 2"):
        distributed.initialize(heartbeat_timeout_seconds=1)


@pytest.mark.slow
def test_ctrl_c_to_one_process_stops_both_at_one_step_saving_once_and_both_resume(
    processes,
    digits_data_dir,
    tmp_path,
):
    fields = tiny_fields(digits_data_dir, checkpoint__every_steps=0)  # saves at the end only
    config = write_config(tmp_path / "tiny.py", fields)
    workdir = str(tmp_path / "two")
    # Process 1 gets SIGINT (what Ctrl-C sends) before its step 3; process 0 gets nothing.
    launched = launch(processes, config, workdir, faults=(None, "batch:3:SIGINT"))
    (status_0, output_0), (status_1, output_1) = [processes.wait(p) for p in launched]
    assert status_1 == 130, output_1[-4000:]  # 128 + SIGINT: the Ctrl-C'd process
    assert status_0 == distributed.PREEMPTED_EXIT_STATUS, output_0[-4000:]  # stopped, not interrupted
    line = r"Stopped after step (\d+) with the other processes \(a SIGTERM or Ctrl-C reached one"
    stopped = int(re.search(line, output_1).group(1))
    assert int(re.search(line, output_0).group(1)) == stopped, output_0[-4000:]
    assert 3 <= stopped < 8
    assert checkpoint_steps(workdir) == ([stopped], [])  # one save, complete
    rerun = "--num_processes=2 '--process_id=<I>'"  # the command for every process
    assert output_0.rstrip().endswith(rerun) and output_1.rstrip().endswith(rerun)

    resumed = [processes.wait(p) for p in launch(processes, config, workdir)]
    for rank, (status, output) in enumerate(resumed):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    assert resumed_from_steps(workdir) == [stopped]
    assert checkpoint_steps(workdir)[0] == [stopped, 8]


@pytest.mark.slow
def test_two_processes_roll_back_together_like_one(
    processes,
    load_config,
    digits_data_dir,
    tmp_path,
):
    """A NaN batch: both processes restore checkpoint 4, skip the same batches, go on."""
    fields = tiny_fields(
        digits_data_dir,
        train__on_bad_loss="rollback",
        train__inject_nan_at_batches=(6,),
        train__rollback_skip_batches=2,
    )
    workdir = str(tmp_path / "two")
    launched = launch(processes, write_config(tmp_path / "tiny.py", fields), workdir)
    for rank, (status, output) in enumerate(processes.wait(p) for p in launched):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    with open(os.path.join(workdir, "rollbacks.json")) as f:
        assert [r["skipped_batches"] for r in json.load(f)] == [[5, 6]]
    reference = str(tmp_path / "one")
    run_plan.train_and_evaluate(override(load_config("default"), fields), reference)
    assert logged_losses(workdir) == pytest.approx(logged_losses(reference), rel=1e-6)
    assert max_difference(saved_params(workdir, 8), saved_params(reference, 8)) < 1e-6
