"""Every config: documented, valid, and builds its pipeline and model (real-data configs on
the generated `shapes` records in place of their datasets); the digits configs train and
evaluate."""

import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from subprocess_runs import ROOT, optimized_env

from contrastive_jax import losses, run_dir, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline, settings
from contrastive_jax.training import run_plan
from contrastive_jax.training.run_plan import data_settings

CONFIGS = sorted(p.stem for p in (pathlib.Path(__file__).parent.parent / "configs").glob("*.py"))
DIGITS_CONFIGS = ("default", "simclr_digits", "dml_digits", "dml_digits_xbm")
REAL_DATA_CONFIGS = ("simclr_cifar10", "clip_coco", "siglip_coco", "dml_cub_ce")
SHAPES_CONFIGS = ("clip_shapes", "flip_clip", "recipes_several_positives", "coca_shapes")
DATA_DIR_FIXTURES = {"sklearn_digits": "digits_data_dir", "cmudict": "cmudict_data_dir", "shapes": "shapes_data_dir"}
CMUDICT_CONFIGS = ("cmudict_clip", "cmudict_dcl", "cmudict_sogclr", "cmudict_moco_queue")
# Start from a released checkpoint, which the tests write: built and run in test_finetune.
FINETUNE_CONFIGS = ("finetune_clip", "finetune_siglip", "finetune_siglip2_naflex")
# Read record sets the tests write (a table with hard negatives, two sets mixed): built and
# run in test_recipes.
RECORDS_CONFIGS = ("recipes_hard_negatives", "recipes_mixture")
# Distil from a teacher run the tests train: built and run in training/test_distillation_training.
TEACHER_CONFIGS = ("recipes_distillation",)
BUILT_HERE = sorted(set(CONFIGS) - set(FINETUNE_CONFIGS) - set(RECORDS_CONFIGS) - set(TEACHER_CONFIGS))


def test_the_expected_configs_exist():
    groups = DIGITS_CONFIGS + REAL_DATA_CONFIGS + CMUDICT_CONFIGS + SHAPES_CONFIGS + FINETUNE_CONFIGS
    groups += RECORDS_CONFIGS + TEACHER_CONFIGS
    assert set(CONFIGS) == set(groups)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_starts_with_its_command_and_comments_every_field(name):
    source = (pathlib.Path(__file__).parent.parent / "configs" / f"{name}.py").read_text()
    first = source.splitlines()[0]
    assert first == (f"# python -m contrastive_jax.main --config=configs/{name}.py --workdir=runs/{name}")
    assignments = [
        line
        for line in source.splitlines()
        if re.match(r"\s+(config|data|aug|model|loss|optim|train|ev|ckpt)(\.\w+)+ = ", line)
        and "ConfigDict()" not in line
    ]
    assert assignments
    uncommented = [line for line in assignments if "#" not in line]
    assert not uncommented


def load_on_local_data(load_config, request, name):
    """Config `name` reading records written in this session: its built-in dataset's, or
    for a real-data config the generated `shapes` set's (images with captions and labels)."""
    config = load_config(name)
    if name in REAL_DATA_CONFIGS:
        config.data.records = settings.builtin_records("shapes", request.getfixturevalue("shapes_data_dir"))
        config.data.train_split = "train+validation"  # the shapes' splits (joined, as COCO's are)
        config.eval.split = "test"
        config.eval.class_range = None  # the shapes' 5 labels are all "seen" classes
    else:
        config.data.data_dir = request.getfixturevalue(DATA_DIR_FIXTURES[config.data.name])
    return config


@pytest.mark.parametrize("name", BUILT_HERE)
def test_config_is_locked_and_valid_on_1_and_8_devices(load_config, request, name):
    config = load_on_local_data(load_config, request, name)
    assert config.is_locked  # a misspelled field raises
    run_plan.build(config, sharding.make_mesh(8))
    run_plan.build(config, sharding.make_mesh(1))


def abstract_train_step(config, batch):
    """Traces one train step on `batch`'s shapes without computing (jax.eval_shape)."""
    mesh = sharding.make_mesh()
    run = run_plan.build(config, mesh).trainer
    _, abstract_state = run.init_state(batch)
    global_batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding.data_sharding(mesh)) for k, v in batch.items()
    }
    return jax.eval_shape(run.train_step, abstract_state, global_batch)


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_DATA_CONFIGS + SHAPES_CONFIGS)
def test_image_config_builds_pipeline_and_model_on_generated_records(load_config, request, name):
    config = load_on_local_data(load_config, request, name)
    config.train.global_batch_size = 8
    config.data.examples_per_class = 2  # 4 of the shapes' 5 classes
    data = data_settings(config)
    batch = next(iter(input_pipeline.train_dataset(data)))
    evaluation = input_pipeline.eval_arrays(data, config.eval.split, class_range=config.eval.class_range)
    size = config.data.image_size or 64  # the shapes' native size
    assert batch["a"].shape == (8, size, size, 3)
    assert evaluation["a"].shape[1:] == batch["a"].shape[1:]
    if config.data.task == "pairs":
        assert batch["b"].shape == (8, config.data.text_max_length)
        assert batch["b"].dtype == np.int32 and 0 < batch["b"].max() < 257  # byte tokens
    if config.data.task == "labeled":
        lo, hi = config.data.train_class_range
        assert np.all((batch["label"] >= lo) & (batch["label"] < hi))
    state, metrics = abstract_train_step(config, batch)
    assert metrics["loss"].shape == () and metrics["loss"].dtype == jnp.float32
    assert state.step.shape == ()


def test_every_classifier_loss_traces_a_step_of_dml_digits(load_config, digits_data_dir):
    """The classifier losses of the registry fit the model's classifier head."""
    config = override(
        load_config("dml_digits"),
        {
            "data.data_dir": digits_data_dir,
            "model.num_classes": 6,
        },
    )
    batch = next(iter(input_pipeline.train_dataset(data_settings(config))))
    names = sorted(name for name, loss in losses.LOSSES.items() if loss.classifier)
    assert {"softmax_ce", "focal", "bce", "proxy_nca", "cosface", "arcface"} <= set(names)
    for name in names:
        _, metrics = abstract_train_step(override(config, {"loss.name": name}), batch)
        assert metrics["loss"].shape == (), name


@pytest.mark.slow
@pytest.mark.parametrize("name", DIGITS_CONFIGS)
def test_digits_config_trains_and_evaluates(load_config, digits_data_dir, tmp_path, name):
    config = load_config(name)
    config.data.data_dir = digits_data_dir
    config.train.num_train_steps = 2
    config.train.log_every_steps = 1
    config.eval.linear_probe = False
    results = run_plan.train_and_evaluate(config, str(tmp_path))
    expected = {"a_to_b/R@1", "b_to_a/R@1"} if name == "default" else {"retrieval/MAP@R"}
    assert expected <= set(results)
    assert all(np.isfinite(v) for v in results.values())


# -m slow: the epoch-budget study's --quick run (default suite) trains cmudict_clip with
# each of these losses; the configs' own fields are traced by the locked-and-valid test.
@pytest.mark.slow
@pytest.mark.parametrize("name", CMUDICT_CONFIGS)
def test_cmudict_config_trains_and_evaluates(load_config, cmudict_data_dir, tmp_path, name):
    config = load_config(name)
    config.data.data_dir = cmudict_data_dir
    config.data.train_split = "test"  # the small split trains and evaluates fast
    config.eval.split = "test"
    config.train.global_batch_size = 256
    config.train.num_train_steps = 2
    config.train.log_every_steps = 1
    results = run_plan.train_and_evaluate(config, str(tmp_path))
    # Retrieval both ways, homophones / alternates as answers.
    assert {"a_to_b/R@1", "a_to_b/R@10", "b_to_a/R@1"} <= set(results)
    assert all(np.isfinite(v) for v in results.values())


def _unset_plain_fields(config, prefix=""):
    """The fields of `config` holding a plain None: the command line cannot set those
    (ml_collections overrides a field by its type; a placeholder carries one)."""
    for key in config.keys():
        field = config._fields[key]
        if isinstance(field, ml_collections.ConfigDict):
            yield from _unset_plain_fields(field, f"{prefix}{key}.")
        elif field is None:
            yield prefix + key


@pytest.mark.parametrize("name", CONFIGS)
def test_every_unset_field_can_be_set_on_the_command_line(load_config, name):
    assert list(_unset_plain_fields(load_config(name))) == []


@pytest.mark.slow
def test_default_config_reaches_the_retrieval_target(digits_data_dir, tmp_path):
    """The README target: test R@1 >= 0.20 top -> bottom (chance 1/360, linear CCA ~0.13),
    by the README's main command (on the session's records), compiled as a user's is."""
    command = [sys.executable, "-m", "contrastive_jax.main", "--config=configs/default.py", f"--workdir={tmp_path}"]
    command.append(f"--config.data.data_dir={digits_data_dir}")
    done = subprocess.run(command, cwd=ROOT, env=optimized_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert run_dir.read_eval_results(tmp_path)["a_to_b/R@1"] >= 0.20


def test_the_manual_lists_every_config():
    """docs/training.md's table has a row for each config, and its count is theirs."""
    page = (pathlib.Path(__file__).parent.parent / "docs" / "training.md").read_text()
    assert f"All {len(CONFIGS)} configs." in page
    assert sorted(re.findall(r"^\| `configs/(\w+)\.py` \|", page, re.M)) == CONFIGS
