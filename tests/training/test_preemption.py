"""Nothing lost: SIGKILL, SIGTERM and corrupt checkpoints, with real processes.

The reference is an uninterrupted in-process run (1 process, 8 devices); interrupted
runs are `python -m contrastive_jax.main` processes on 8 devices that send themselves a
signal at a chosen point (see `subprocess_runs._DRIVER`), then rerun the same command.
"""

import glob
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from subprocess_runs import (
    assert_bitwise_equal,
    checkpoint_steps,
    logged_losses,
    resumed_from_steps,
    saved_params,
    tiny_fields,
    write_config,
)

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from contrastive_jax.training import checkpoint, distributed, run_plan

STEPS = 8  # checkpoints every 2 steps (tiny_fields)


@pytest.fixture(scope="module")
def reference(load_config, digits_data_dir, tmp_path_factory):
    """An uninterrupted run's workdir (kept; copy it before changing it)."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    run_plan.train_and_evaluate(override(load_config("default"), tiny_fields(digits_data_dir)), workdir)
    return workdir


def losses_once(workdir):
    """`{step: loss}`, checking that every step was logged once (resumes drop the rest)."""
    steps = [row["step"] for row in run_dir.read_metrics(workdir) if "train/loss" in row]
    assert steps == sorted(set(steps)), steps
    return logged_losses(workdir)


def run_until_done(processes, config, workdir, faults):
    """Runs the trainer once per fault (each must stop it), then once to the end.

    Returns `(fault, status, output, (complete, partial))` per fault, the last two the
    `checkpoint_steps` the stopped run left. Checks that every rerun resumed from the
    newest complete checkpoint the run before it left, never from a partial write.
    """
    reports = []
    for fault in faults:
        status, output = processes.wait(processes.start(config, workdir, num_devices=8, fault=fault))
        reports.append((fault, status, output, checkpoint_steps(workdir)))
    status, output = processes.wait(processes.start(config, workdir, num_devices=8))
    assert status == 0, output[-4000:]
    newest = [complete[-1] for *_, (complete, _) in reports if complete]
    assert resumed_from_steps(workdir) == newest
    return reports


@pytest.mark.e2e
def test_sigkill_mid_write_and_sigterm_then_resume_is_bitwise_identical(
    processes,
    reference,
    digits_data_dir,
    tmp_path,
):
    workdir = str(tmp_path / "run")
    config = write_config(tmp_path / "tiny.py", tiny_fields(digits_data_dir))
    reports = run_until_done(
        processes,
        config,
        workdir,
        faults=[
            "save:2:SIGKILL",  # killed while checkpoint 4 is being written
            "batch:2:SIGTERM",  # preempted during step 2 after resuming
        ],
    )
    (_, killed, output, after_kill), (_, preempted, preempt_output, after_sigterm) = reports
    assert killed == -signal.SIGKILL, output[-3000:]
    assert after_kill == ([2], [4])  # checkpoint 4 was cut off mid-write
    assert preempted == distributed.PREEMPTED_EXIT_STATUS == 143, preempt_output[-3000:]
    assert "SIGTERM: stopped after step" in preempt_output
    assert after_sigterm[0] == [2, 4]  # resumed at 2, stopped after step 4 and saved it
    # The reruns resumed from 2, not from the partial 4, then from the SIGTERM's 4.
    assert resumed_from_steps(workdir) == [2, 4] and resumed_from_steps(reference) == []
    assert_bitwise_equal(saved_params(workdir, STEPS), saved_params(reference, STEPS))
    assert losses_once(workdir) == losses_once(reference)
    with open(os.path.join(workdir, "eval_results.json")) as f:
        assert json.load(f)["step"] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize(
    "faults",
    [
        ["batch:1:SIGKILL", "batch:3:SIGKILL", "batch:2:SIGKILL"],  # first step; mid-run twice
        ["save:1:SIGKILL", "save:3:SIGKILL"],  # during the first and the last writes
        ["batch:3:SIGTERM", "batch:1:SIGTERM", "save:1:SIGKILL"],  # preempted, then killed
    ],
)
def test_more_kill_points_resume_bitwise(processes, reference, digits_data_dir, tmp_path, faults):
    workdir = str(tmp_path / "run")
    config = write_config(tmp_path / "tiny.py", tiny_fields(digits_data_dir))
    for fault, status, output, _ in run_until_done(processes, config, workdir, faults):
        expected = distributed.PREEMPTED_EXIT_STATUS if fault.endswith("SIGTERM") else -signal.SIGKILL
        assert status == expected, f"{fault}:\n{output[-3000:]}"
    assert_bitwise_equal(saved_params(workdir, STEPS), saved_params(reference, STEPS))
    assert losses_once(workdir) == losses_once(reference)


@pytest.mark.slow
def test_sigkill_at_random_times_resumes_bitwise(
    processes,
    load_config,
    digits_data_dir,
    tmp_path,
):
    """External SIGKILLs at random moments of training, saving and evaluating."""
    fields = tiny_fields(digits_data_dir, train__num_train_steps=16, eval__every_steps=5)
    workdir = str(tmp_path / "run")
    config = write_config(tmp_path / "tiny.py", fields)
    metrics = os.path.join(workdir, "metrics.jsonl")
    rng = random.Random(0)
    kills = 0
    complete = set()  # every complete checkpoint a run could have resumed from
    for _ in range(6):
        complete |= set(checkpoint_steps(workdir)[0])
        logged = os.path.getsize(metrics) if os.path.exists(metrics) else 0
        process = processes.start(config, workdir, num_devices=8)
        while process.poll() is None and not (os.path.exists(metrics) and os.path.getsize(metrics) > logged):
            time.sleep(0.05)  # until this run has written to the metrics
        time.sleep(rng.uniform(0, 1.5))
        if process.poll() is not None:  # it trained to the end before the kill
            break
        processes.kill(process)
        kills += 1
    newest = max(checkpoint_steps(workdir)[0], default=None)
    resumes_before = resumed_from_steps(workdir)
    # Done: the last step's checkpoint is complete and its evaluation written (the kill may
    # have come after both, before the process exited; after the evaluation alone, the
    # checkpoint still being written, the rerun resumes from the one before and trains).
    done = newest == 16 and (run_dir.read_eval_results(workdir) or {}).get("step") == 16
    status, output = processes.wait(processes.start(config, workdir, num_devices=8))
    assert status == 0, output[-3000:]
    assert kills >= 1
    # Every resume started at a complete checkpoint, the last one at the newest; after a
    # run that was done, the last command has nothing to train and resumes nothing.
    resumes = resumed_from_steps(workdir)
    assert set(resumes) <= complete | {newest} and resumes == sorted(resumes)
    if done:
        assert "nothing to train" in output and resumes == resumes_before
    else:
        assert resumes[-1:] == ([newest] if newest is not None else [])
    straight = str(tmp_path / "straight")
    run_plan.train_and_evaluate(override(load_config("default"), fields), straight)
    assert_bitwise_equal(saved_params(workdir, 16), saved_params(straight, 16))
    assert losses_once(workdir) == losses_once(straight)


# --- corrupt checkpoints --------------------------------------------------------------


def array_files(step_dir):
    """The files holding the state's array data (orbax OCDBT `d/` files)."""
    pattern = os.path.join(step_dir, "state", "**", "d", "*")
    files = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
    assert files
    return files


def truncate_array_data(step_dir):
    for path in array_files(step_dir):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)


def flip_a_byte(step_dir):
    for path in array_files(step_dir):
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))


def delete_the_state(step_dir):
    shutil.rmtree(os.path.join(step_dir, "state"))


def garble_the_position(step_dir):
    path = glob.glob(os.path.join(step_dir, "data", "*"))[0]
    with open(path, "w") as f:
        f.write('{"next_st')


def wrong_fingerprint(step_dir):
    """Stands in for silent corruption: data orbax reads fine but that changed."""
    path = glob.glob(os.path.join(step_dir, "integrity", "*"))[0]
    with open(path) as f:
        integrity = json.load(f)
    integrity["fingerprint"][3] += 1
    with open(path, "w") as f:
        json.dump(integrity, f)


@pytest.mark.compat
@pytest.mark.parametrize(
    "corrupt",
    [
        truncate_array_data,
        flip_a_byte,
        delete_the_state,
        pytest.param(garble_the_position, marks=pytest.mark.slow),
        wrong_fingerprint,
    ],
)
def test_corrupt_latest_checkpoint_is_reported_and_skipped(
    reference, load_config, digits_data_dir, tmp_path, caplog, corrupt
):
    workdir = str(tmp_path / "run")
    shutil.copytree(reference, workdir)
    corrupt(os.path.join(workdir, "checkpoints", str(STEPS)))
    config = override(load_config("default"), tiny_fields(digits_data_dir))
    with caplog.at_level(logging.ERROR):
        run_plan.train_and_evaluate(config, workdir)
    assert f"Skipping corrupt checkpoint {STEPS} in" in caplog.text
    moved = glob.glob(os.path.join(workdir, "checkpoints.corrupt", f"{STEPS}-*"))
    assert len(moved) == 1
    # Resumed from the previous checkpoint and redid the last steps exactly.
    assert resumed_from_steps(workdir) == [STEPS - 2]
    assert_bitwise_equal(saved_params(workdir, STEPS), saved_params(reference, STEPS))


# 64 leaves split over a 4 x 2 mesh (each leaf's sum ends in an all-reduce), fingerprinted
# 30 times in a fresh process: launched all at once, XLA's CPU backend deadlocked at a
# rendezvous and aborted the process at its timeout (40 s unless XLA_FLAGS set another), 3
# times in 3; one at a time they take about 3 s.
_FINGERPRINT_SPLIT_LEAVES = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from contrastive_jax.training import checkpoint
mesh = jax.make_mesh((4, 2), ("data", "fsdp"))
leaves = [
    jax.device_put(jnp.arange(64 * (i % 5 + 1), dtype=jnp.float32).reshape(-1, 8),
                   NamedSharding(mesh, P("fsdp" if i % 2 else "data")))
    for i in range(64)
]
for _ in range(30):
    checkpoint.fingerprint(leaves)
print("done")
"""


@pytest.mark.slow
def test_fingerprint_of_many_split_leaves_does_not_deadlock():
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # XLA_FLAGS (8 devices): tests/conftest.py
    result = subprocess.run(
        [sys.executable, "-c", _FINGERPRINT_SPLIT_LEAVES], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-2000:]


def test_fingerprint_sees_every_single_bit_flip():
    tree = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "step": jnp.int32(7)}
    base = checkpoint.fingerprint(tree)
    raw = np.asarray(tree["w"]).view(np.uint8).reshape(-1).copy()
    for byte in range(raw.size):
        for bit in (0, 7):
            flipped = raw.copy()
            flipped[byte] ^= 1 << bit
            changed = dict(tree, w=jnp.asarray(flipped.view(np.float32).reshape(3, 4)))
            assert checkpoint.fingerprint(changed)[1] != base[1]
    swapped = dict(tree, w=tree["w"][::-1])
    assert checkpoint.fingerprint(swapped)[1] != base[1]
    assert jax.tree.leaves(tree)[0].shape == ()  # leaves in jax.tree order: "step", "w"
