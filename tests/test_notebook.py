"""experiments/colab_tpu.ipynb runs headless (nbclient) on 1 and on 8 simulated CPU devices.

The assertions read what the notebook measured (its `notebook_results.json`): what its
first cell installed and kept, the devices it found, the sharded-vs-one-device loss
check, the short training run, and the one-chip memory figures and large-batch run.

Marked slow (about 50 s a run): CI runs it in a venv built from `constraints/minimum.txt`
like Colab's TPU runtime (jax 0.7.2, no TensorFlow, no ml-collections), where the first
notebook run must install what is missing, CPU-only, without touching jax or numpy; run
it on the newest versions with `pytest -m slow tests/test_notebook.py`. Nothing needs
TensorFlow: the notebook writes the built-in datasets' records in this module's own
data_dir, and in the Colab-like venv TensorFlow is still absent after both runs.
"""

import importlib.metadata
import importlib.util
import json
import os
import pathlib

import nbclient
import nbformat
import numpy as np
import pytest

from contrastive_jax.simulated_devices import with_device_count

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "colab_tpu.ipynb"
# What the environment had before any notebook ran (the first run installs what is missing).
STACK_BEFORE = {d: importlib.metadata.version(d) for d in ("jax", "jaxlib", "numpy")}
TENSORFLOW_BEFORE = importlib.util.find_spec("tensorflow") is not None
ML_COLLECTIONS_BEFORE = importlib.util.find_spec("ml_collections") is not None


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One data_dir for the module's runs: the first run writes the datasets' records."""
    return str(tmp_path_factory.mktemp("notebook_records"))


def execute(devices, tmp_path_factory, data_dir):
    """``(device count, notebook outputs, notebook_results.json)`` of one quick run."""
    out = tmp_path_factory.mktemp("notebook")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CONTRASTIVE_JAX_NOTEBOOK_QUICK", "1")
        env.setenv("CONTRASTIVE_JAX_NOTEBOOK_OUT", str(out))
        env.setenv("CONTRASTIVE_JAX_DATA_DIR", data_dir)
        env.setenv("XLA_FLAGS", with_device_count(os.environ.get("XLA_FLAGS", ""), devices))
        nbclient.NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    return devices, outputs, json.loads((out / "notebook_results.json").read_text())


def check_installs_only_what_is_missing_and_keeps_the_stack(executed):
    devices, outputs, results = executed
    setup = results["setup"]
    for distribution, version in STACK_BEFORE.items():
        assert setup["kept"][distribution] == version == importlib.metadata.version(distribution)
    if devices == 1 and not ML_COLLECTIONS_BEFORE:  # the first run in a Colab-TPU-like venv
        assert "ml-collections" in setup["installed"] and setup["install_seconds"] > 0
    assert not any(name.startswith("tensorflow") for name in setup["installed"])
    if not TENSORFLOW_BEFORE:  # nothing installed it
        assert importlib.util.find_spec("tensorflow") is None
    text = "".join(o.get("text", "") for o in outputs)
    installed = ", ".join(setup["installed"]) or "nothing"
    assert f"installed: {installed}" in text


def check_finds_the_devices(executed):
    devices, outputs, results = executed
    assert (results["backend"], results["device_count"], results["process_count"]) == ("cpu", devices, 1)
    assert f"found {devices} CPU device(s)" in "".join(o.get("text", "") for o in outputs)


def check_sharded_loss_equals_one_device(executed):
    devices, _, results = executed
    check = results["sharded_check"]
    assert check["devices"] == devices and check["global_batch"] == 16 * devices
    assert np.isfinite(check["single_device_loss"]) and check["single_device_loss"] > 0
    assert check["sharded_loss"] == pytest.approx(check["single_device_loss"], rel=1e-6)
    assert check["max_abs_grad_difference"] < 1e-6


def check_short_training_learns(executed):
    _, outputs, results = executed
    run = results["train"]
    assert run["global_batch_size"] == 256
    assert run["steps"] == list(range(2, run["num_train_steps"] + 1, 2))  # logged every 40 // 20 steps
    first, last = np.mean(run["loss"][:3]), np.mean(run["loss"][-3:])
    assert last < first - 0.5, (first, last)  # nats; it starts near 6.3
    assert run["eval"]["a_to_b/R@1"] > 5 / 360 and run["eval"]["b_to_a/R@1"] > 5 / 360  # 5 x chance (1/360) in 40 steps
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the loss curve, inline


def check_one_chip_memory_and_large_batch(executed):
    devices, _, results = executed
    memory = results["memory"]
    # Dense: the [N, N] logits and their gradient, 16 GiB each at N = 65,536.
    assert memory["dense_gib"] > 2 * memory["global_batch"] ** 2 * 4 / 2**30 * 0.99
    # Streamed: O(N D + chunk^2): the two 16 MiB inputs, their gradients and a few 16 MiB tiles.
    assert memory["streamed_gib"] < 0.25 and memory["streamed_gib"] * 100 < memory["dense_gib"]
    large = results["large_batch"]
    assert (large["global_batch_size"], large["micro_batch_size"], large["num_train_steps"]) == (1024, 256, 4)
    assert len(large["loss"]) == 4 and all(np.isfinite(large["loss"]))
    assert large["loss"][-1] < large["loss"][0]  # 4 steps of sqrt-scaled AdamW: the loss goes down
    assert 0 <= large["eval"]["a_to_b/R@1"] <= 1


# One test per device count, so that each runs the notebook once (also under pytest-xdist,
# whose workers would each run a shared fixture again); the 1-device run comes first.
@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 8], ids=["1-device", "8-devices"])
def test_notebook_runs_all_on(devices, tmp_path_factory, data_dir):
    executed = execute(devices, tmp_path_factory, data_dir)
    check_installs_only_what_is_missing_and_keeps_the_stack(executed)
    check_finds_the_devices(executed)
    check_sharded_loss_equals_one_device(executed)
    check_short_training_learns(executed)
    check_one_chip_memory_and_large_batch(executed)
