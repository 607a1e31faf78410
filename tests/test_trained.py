"""Using a trained model: parameters restored alone, a tower embedding inputs alone (the
model's own `za` / `zb`), the command line, and a tower exported with `jax.export` and
run in a fresh process."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from subprocess_runs import saved_state

from contrastive_jax import run_dir, use_trained
from contrastive_jax import trained as trained_model_lib
from contrastive_jax.data import input_pipeline
from contrastive_jax.errors import ConfigError


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
    assert use_trained.main(args) == 0
    np.testing.assert_allclose(np.load(out), model.embed(test_pairs[1], "b"), atol=1e-6)


def test_a_workdir_without_checkpoints_is_one_line(tmp_path, capsys):
    args = [f"--workdir={tmp_path}", "--side=a", "--inputs=x.npy", f"--out={tmp_path / 'z.npy'}"]
    assert use_trained.main(args) == 2
    assert capsys.readouterr().err.startswith(f"error: --workdir={tmp_path} holds no checkpoints")


def test_released_layout_only_for_a_model_started_from_one_and_side_only_for_towers(trained, tmp_path, capsys):
    out = f"--out={tmp_path / 'model.safetensors'}"
    assert use_trained.main([f"--workdir={trained}", "--released", out]) == 2
    assert capsys.readouterr().err.startswith("error: TwoTower is not a released layout's model")
    with pytest.raises(SystemExit) as exit_:
        use_trained.main([f"--workdir={trained}", "--export", out])
    assert exit_.value.code == 2 and "--inputs and --export need --side=a or --side=b" in capsys.readouterr().err


def test_an_exported_tower_runs_in_a_fresh_process(trained, model, test_pairs, tmp_path):
    """Serialized with its weights, reloaded without contrastive_jax in another process,
    at another batch size than any before: the same embeddings."""
    path = tmp_path / "tower_a.jax"
    assert use_trained.main([f"--workdir={trained}", "--side=a", "--export", f"--out={path}"]) == 0
    np.save(tmp_path / "a.npy", test_pairs[0][:7] / np.float32(255))
    code = (
        "import sys, numpy as np; from jax import export; assert 'contrastive_jax' not in sys.modules; "
        f"exported = export.deserialize(bytearray(open({str(path)!r}, 'rb').read())); "
        f"np.save({str(tmp_path / 'za.npy')!r}, np.asarray(exported.call(np.load({str(tmp_path / 'a.npy')!r}))))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    np.testing.assert_allclose(np.load(tmp_path / "za.npy"), model.embed(test_pairs[0][:7], "a"), atol=1e-6)
    assert json.dumps(model.inputs["a"][0]) == "[4, 8, 1]"


def _nbytes(tree) -> int:
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def run_without_data(load_config, digits_data_dir, tmp_path_factory):
    """`(workdir, model, b)`: a run trained on its own copy of the digits' records, its
    model loaded and tower b's test inputs `b` read while the records were there; then
    the records deleted."""
    from subprocess_runs import tiny_fields

    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    root = tmp_path_factory.mktemp("moved")
    data_dir = shutil.copytree(digits_data_dir, root / "records")
    fields = tiny_fields(str(data_dir), train__num_train_steps=2, model__mlp_hidden_dims=(256, 256))
    workdir = str(root / "run")
    run_plan.train_and_evaluate(override(load_config("default"), fields), workdir)
    model = trained_model_lib.load(workdir)
    b = input_pipeline.eval_arrays(model.data, "test")["b"][:20]
    shutil.rmtree(data_dir)
    return workdir, model, b


def test_embeds_and_exports_with_the_record_set_deleted(run_without_data, tmp_path):
    """The model is rebuilt from the settings saved beside its checkpoint: the training
    data are not read."""
    workdir, model, b = run_without_data
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "zb.npy"
    assert use_trained.main([f"--workdir={workdir}", "--side=b", f"--inputs={tmp_path / 'b.npy'}", f"--out={out}"]) == 0
    np.testing.assert_allclose(np.load(out), model.embed(b, "b"), atol=1e-6)
    exported = tmp_path / "tower_b.jax"
    assert use_trained.main([f"--workdir={workdir}", "--side=b", "--export", f"--out={exported}"]) == 0


def test_an_export_holds_one_towers_parameters(run_without_data, tmp_path):
    """The exported tower's file is the size of its own parameters, not of both towers'."""
    workdir, model, _ = run_without_data
    path = tmp_path / "tower_a.jax"
    assert use_trained.main([f"--workdir={workdir}", "--side=a", "--export", f"--out={path}"]) == 0
    own, both = _nbytes(model.tower_variables("a")), _nbytes(model.variables)
    print(f"export {path.stat().st_size:,} B; tower a's parameters {own:,} B; both towers' {both:,} B")
    assert own < both * 0.6
    assert own <= path.stat().st_size < own * 1.1


def test_the_parameters_read_alone_are_verified_against_their_fingerprints(trained, tmp_path):
    workdir = shutil.copytree(trained, tmp_path / "run")
    [path] = (workdir / run_dir.CHECKPOINTS).glob("*/integrity/metadata")
    integrity = json.loads(path.read_text())
    leaf = integrity["paths"].index("params/tower_b/Dense_0/kernel")
    integrity["fingerprint"][leaf] += 1
    path.write_text(json.dumps(integrity))
    with pytest.raises(ConfigError, match=r"is damaged: .* fingerprint .*leaves \['params/tower_b/Dense_0/kernel'\]"):
        trained_model_lib.load(str(workdir))


def test_a_run_saved_without_the_models_settings_is_rebuilt_from_its_data(trained, model, tmp_path):
    workdir = shutil.copytree(trained, tmp_path / "run")
    [saved] = (workdir / run_dir.CHECKPOINTS).glob("*/model")
    shutil.rmtree(saved)
    old = trained_model_lib.load(str(workdir))
    assert old.inputs == model.inputs and old.tokenizer == model.tokenizer
    jax.tree.map(np.testing.assert_array_equal, old.variables, model.variables)


def test_a_run_saved_without_the_models_settings_and_its_data_gone_is_one_line(run_without_data, tmp_path, capsys):
    workdir = shutil.copytree(run_without_data[0], tmp_path / "run")
    [saved] = (workdir / run_dir.CHECKPOINTS).glob("*/model")
    shutil.rmtree(saved)
    assert use_trained.main([f"--workdir={workdir}", "--side=a", "--export", f"--out={tmp_path / 'a.jax'}"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(
        r"error: checkpoint 2 in .* was saved before the model's settings were kept beside it, so loading it needs "
        r"the data it trained on, and: config.data.name='sklearn_digits': its records are not written yet .*",
        line,
    )


def _damaged_run(trained, tmp_path, *, older_checkpoint: bool):
    """`(workdir, its checkpoints' folder)`: a copy of the trained run whose checkpoint 2
    has every data file of its state (orbax's arrays) cut to 100 bytes (not only the
    largest: in one full suite, beside a study, the checkpoint read whole with its
    largest file cut, so that file held nothing the command reads); with `older_checkpoint`, an
    intact copy of it saved as checkpoint 1 before it."""
    workdir = shutil.copytree(trained, tmp_path / "run")
    checkpoints = workdir / run_dir.CHECKPOINTS
    if older_checkpoint:
        shutil.copytree(checkpoints / "2", checkpoints / "1")
    data_files = [path for path in (checkpoints / "2" / "state").rglob("d/*") if path.is_file()]
    assert data_files
    for path in data_files:
        os.truncate(path, 100)
    return workdir, checkpoints


def _command(*args) -> subprocess.CompletedProcess:
    """`python -m contrastive_jax.use_trained ARGS` in a fresh process, which prints what
    a person sees (orbax's abandoned reads end there, after the failure)."""
    command = [sys.executable, "-m", "contrastive_jax.use_trained", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu")
    )


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_gives_way_to_the_one_before_with_one_line(trained, model, tmp_path):
    workdir, checkpoints = _damaged_run(trained, tmp_path, older_checkpoint=True)
    result = _command(f"--workdir={workdir}", "--side=a", "--export", f"--out={tmp_path / 'a.jax'}")
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = result.stderr.splitlines()
    damaged = re.escape(f"checkpoint {checkpoints / '2'} is damaged: cannot read its state")
    assert re.fullmatch(rf"warning: {damaged}[\w ]*; using checkpoint 1, the one before\.", line)
    assert result.stdout.strip().endswith("at step 1")


@pytest.mark.slow
def test_a_damaged_checkpoint_with_none_before_it_is_one_line_naming_it(trained, tmp_path):
    workdir, checkpoints = _damaged_run(trained, tmp_path, older_checkpoint=False)
    result = _command(f"--workdir={workdir}", "--side=a", "--export", f"--out={tmp_path / 'a.jax'}")
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    damaged = re.escape(f"checkpoint {checkpoints / '2'} is damaged: cannot read its state")
    assert re.fullmatch(rf"error: {damaged}[\w ]*; no checkpoint before it\.", line)
