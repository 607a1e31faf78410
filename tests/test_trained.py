"""Using a trained model: parameters restored alone, a tower embedding inputs alone (the
model's own `za` / `zb`), the command line, and a tower exported with `jax.export` and
run in a fresh process."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from subprocess_runs import saved_state

from contrastive_jax import input_pipeline, run_dir
from contrastive_jax import trained as trained_model_lib


@pytest.fixture(scope="module")
def model(trained):
    """The session's tiny trained run (tests/conftest.py), restored."""
    return trained_model_lib.load(trained)


@pytest.fixture(scope="module")
def test_pairs(model):
    arrays = input_pipeline.eval_arrays(model.data, "test")
    return arrays["a"][:40], arrays["b"][:40]


def test_restores_the_checkpoints_parameters(trained, model):
    step = run_dir.read_eval_results(trained)["step"]
    saved = saved_state(trained, step)
    assert model.step == step
    jax.tree.map(np.testing.assert_array_equal, model.variables["params"], saved["params"])


def test_each_tower_alone_gives_the_models_embeddings(model, test_pairs):
    a, b = test_pairs
    both = model.model.apply(model.variables, a, b)
    np.testing.assert_allclose(model.embed(a, "a", batch_size=16), both["za"], atol=1e-6)
    np.testing.assert_allclose(model.embed(b, "b"), both["zb"], atol=1e-6)
    assert not np.allclose(model.embed(a, "b"), both["za"], atol=1e-3)  # the two towers differ


def test_inputs_of_another_shape_are_refused(model, test_pairs):
    with pytest.raises(ValueError, match=r"inputs of shape \(3, 8, 1\) per example; tower a takes \(4, 8, 1\)"):
        model.embed(test_pairs[0][:, :3], "a")


def test_the_command_line_embeds_a_file(trained, model, test_pairs, tmp_path):
    np.save(tmp_path / "b.npy", test_pairs[1])
    out = tmp_path / "zb.npy"
    args = [f"--workdir={trained}", "--side=b", f"--inputs={tmp_path / 'b.npy'}", f"--out={out}"]
    assert trained_model_lib.main(args) == 0
    np.testing.assert_allclose(np.load(out), model.embed(test_pairs[1], "b"), atol=1e-6)


def test_a_workdir_without_checkpoints_is_one_line(tmp_path, capsys):
    args = [f"--workdir={tmp_path}", "--side=a", "--inputs=x.npy", f"--out={tmp_path / 'z.npy'}"]
    assert trained_model_lib.main(args) == 2
    assert capsys.readouterr().err.startswith(f"error: --workdir={tmp_path} holds no checkpoints")


def test_released_layout_only_for_a_model_started_from_one_and_side_only_for_towers(trained, tmp_path, capsys):
    out = f"--out={tmp_path / 'model.safetensors'}"
    assert trained_model_lib.main([f"--workdir={trained}", "--released", out]) == 2
    assert capsys.readouterr().err.startswith("error: TwoTower is not a released layout's model")
    with pytest.raises(SystemExit) as exit_:
        trained_model_lib.main([f"--workdir={trained}", "--export", out])
    assert exit_.value.code == 2 and "--inputs and --export need --side=a or --side=b" in capsys.readouterr().err


def test_an_exported_tower_runs_in_a_fresh_process(trained, model, test_pairs, tmp_path):
    """Serialized with its weights, reloaded without contrastive_jax in another process,
    at another batch size than any before: the same embeddings."""
    path = tmp_path / "tower_a.jax"
    assert trained_model_lib.main([f"--workdir={trained}", "--side=a", "--export", f"--out={path}"]) == 0
    np.save(tmp_path / "a.npy", test_pairs[0][:7] / np.float32(255))
    code = (
        "import sys, numpy as np; from jax import export; assert 'contrastive_jax' not in sys.modules; "
        f"exported = export.deserialize(bytearray(open({str(path)!r}, 'rb').read())); "
        f"np.save({str(tmp_path / 'za.npy')!r}, np.asarray(exported.call(np.load({str(tmp_path / 'a.npy')!r}))))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    np.testing.assert_allclose(np.load(tmp_path / "za.npy"), model.embed(test_pairs[0][:7], "a"), atol=1e-6)
    assert json.dumps(model.inputs["a"][0]) == "[4, 8, 1]"
