"""experiments/colab_tpu.ipynb runs headless (nbclient) on 8 simulated CPU devices.

The assertions read what the notebook measured (its `notebook_results.json`): the devices
it found, the sharded-vs-one-device loss check, and the short training run's loss curve
and retrieval metrics.
"""

import json
import pathlib

import jax
import nbclient
import nbformat
import numpy as np
import pytest

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "colab_tpu.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory, digits_data_dir):
    """``(notebook outputs, notebook_results.json)`` of one quick run."""
    out = tmp_path_factory.mktemp("notebook")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CONTRASTIVE_JAX_NOTEBOOK_QUICK", "1")
        env.setenv("CONTRASTIVE_JAX_NOTEBOOK_OUT", str(out))
        env.setenv("CONTRASTIVE_JAX_DATA_DIR", digits_data_dir)
        nbclient.NotebookClient(
            notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    return outputs, json.loads((out / "notebook_results.json").read_text())


def test_notebook_finds_the_devices_and_installs_nothing_here(executed):
    outputs, results = executed
    assert (results["backend"], results["device_count"], results["process_count"]) == ("cpu", jax.device_count(), 1)
    text = "".join(o.get("text", "") for o in outputs)
    assert f"found {jax.device_count()} CPU device(s)" in text
    assert "installed: nothing" in text  # every dependency is importable in the test venv


def test_notebook_sharded_loss_equals_one_device(executed):
    check = executed[1]["sharded_check"]
    assert check["devices"] == jax.device_count() and check["global_batch"] == 16 * jax.device_count()
    assert np.isfinite(check["single_device_loss"]) and check["single_device_loss"] > 0
    assert check["sharded_loss"] == pytest.approx(check["single_device_loss"], rel=1e-6)
    assert check["max_abs_grad_difference"] < 1e-6


def test_notebook_short_training_learns(executed):
    outputs, results = executed
    run = results["train"]
    assert run["global_batch_size"] == 256
    assert run["steps"] == list(range(2, run["num_train_steps"] + 1, 2))  # logged every 40 // 20 steps
    first, last = np.mean(run["loss"][:3]), np.mean(run["loss"][-3:])
    assert last < first - 0.5, (first, last)  # nats; it starts near 6.3
    assert run["eval"]["a_to_b/R@1"] > 10 / 360 and run["eval"]["b_to_a/R@1"] > 10 / 360  # chance: 1/360
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the loss curve, inline
