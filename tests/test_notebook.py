"""experiments/colab_tpu.ipynb executes headless (nbclient) with its quick settings."""

import os
import pathlib

import nbclient
import nbformat

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "colab_tpu.ipynb"


def test_colab_notebook_runs_on_cpu(tmp_path, digits_data_dir, monkeypatch):
    monkeypatch.setenv("CONTRASTIVE_JAX_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("CONTRASTIVE_JAX_NOTEBOOK_OUT", str(tmp_path / "sweep"))
    monkeypatch.setenv("CONTRASTIVE_JAX_DATA_DIR", digits_data_dir)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "accelerator: CPU" in text and "8 devices" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4  # the four figures, inline
    assert (tmp_path / "sweep" / "results.csv").exists()
    assert os.environ["CONTRASTIVE_JAX_NOTEBOOK_QUICK"] == "1"
