"""Multi-process training: 2 processes x 4 CPU devices (gloo, 127.0.0.1) = 1 x 8."""

import os

import pytest
from subprocess_runs import (  # noqa: F401  (processes: a fixture)
    apply_fields,
    free_port,
    logged_losses,
    max_difference,
    processes,
    saved_params,
    tiny_fields,
    write_config,
)

from contrastive_jax import train


def launch(processes, config, workdir, num_processes=2, fault=None):  # noqa: F811
    """Starts `num_processes` trainer processes of 8 / num_processes CPU devices each."""
    address = f"127.0.0.1:{free_port()}"
    return [
        processes.start(
            config,
            workdir,
            num_devices=8 // num_processes,
            flags=(
                f"--coordinator_address={address}",
                f"--num_processes={num_processes}",
                f"--process_id={i}",
            ),
            fault=fault,
        )
        for i in range(num_processes)
    ]


def test_two_processes_train_like_one(processes, load_config, digits_data_dir, tmp_path):  # noqa: F811
    fields = tiny_fields(digits_data_dir, train__num_train_steps=4, checkpoint__every_steps=4)
    workdir = str(tmp_path / "two")
    launched = launch(processes, write_config(tmp_path / "tiny.py", fields), workdir)
    reference = str(tmp_path / "one")  # meanwhile, here: one process, 8 devices
    train.train_and_evaluate(apply_fields(load_config("default"), fields), reference)

    outputs = [processes.wait(p) for p in launched]
    for rank, (status, output) in enumerate(outputs):
        assert status == 0, f"process {rank}:\n{output[-4000:]}"
    assert "step 4:" in outputs[0][1] and "step 4:" not in outputs[1][1]  # process 0 logs
    assert sorted(os.listdir(workdir)) == sorted(os.listdir(reference))
    assert logged_losses(workdir) == pytest.approx(logged_losses(reference), rel=1e-6)
    # Equal up to the order of float additions: gloo sums across processes in its own order.
    assert max_difference(saved_params(workdir, 4), saved_params(reference, 4)) < 1e-6
