"""Bad input gets one clear error naming the field and a fix, before anything compiles."""

import os
import re
import shutil

import pytest
from absl import flags
from ml_collections import config_flags
from subprocess_runs import ROOT

from contrastive_jax import run_dir, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import checkpoint, run_plan, trainer


@pytest.fixture
def config(tiny_config):
    return tiny_config


def build(config):
    """`run_plan.build` on all 8 devices."""
    return run_plan.build(config, sharding.make_mesh())


# (field, value, message): one bad config value and the error naming it and a fix.
# tests/test_cli.py runs each through the command line too.
BAD_VALUES = [
    # A global batch that does not divide over the devices or the micro-batches.
    (
        "train.global_batch_size",
        100,
        r"config.train.global_batch_size=100 must be a multiple of the devices \(8\); use 96 or 104\.$",
    ),
    (
        "train.micro_batch_size",
        24,
        r"config.train.micro_batch_size=24 must divide config.train.global_batch_size \(64\); use 16 or 32\.$",
    ),
    (
        "train.micro_batch_size",
        4,
        r"config.train.micro_batch_size=4 must be a multiple of the devices \(8\); use 8\.$",
    ),
    # Unknown names list the valid ones.
    ("loss.name", "clipp", r"config.loss.name='clipp'; use one of \['arcface', 'bce', 'clip', "),
    ("model.encoder_a", "vit", r"config.model.encoder_a='vit'.*\['cnn', "),
    (
        "data.name",
        "mnist_typo",
        r"config.data.name='mnist_typo' is not a built-in dataset; use one of \[.*config.data.records=DIR",
    ),
    (
        "data.on_bad_record",
        "ignore",
        r"config.data.on_bad_record='ignore' is not a policy; use one of \('stop', 'skip'\)",
    ),
    ("data.tokenizer", "gpt2", r"config.data.tokenizer='gpt2' is not a tokenizer; use 'bytes', a SentencePiece"),
    ("optim.name", "adam", r"config.optim.name='adam'; use one of \('adamw', "),
    ("data.task", "pair", r"config.data.task='pair' is not a task; use one of \('pairs', "),
    ("train.micro_batch_method", "cache", r"config.train.micro_batch_method='cache'; use one of"),
    ("train.on_bad_loss", "rolback", r"config.train.on_bad_loss='rolback'; use one of \('stop', 'rollback'\)"),
    # Values out of range.
    # A split the record set lacks, found at build (before anything compiles).
    (
        "eval.split",
        "vali",
        r"has no split 'vali'; it has \['disjoint_test', .* \(set config.data.train_split / config.eval.split",
    ),
    ("eval.split", "test[2:", r"split 'test\[2:' is not NAME, NAME\+NAME or NAME\[start:stop\]"),
    ("loss.temperature", 0.0, r"config.loss.temperature=0.0 must be > 0"),
    ("loss.temperature", -0.1, r"config.loss.temperature=-0.1 must be > 0"),
    (
        "loss.chunk_size",
        48,
        r"config.loss.chunk_size=48 must divide the logit columns \(N\) \(64\); use 32 or 64\.$",
    ),
    ("loss.chunk_size", -8, r"config.loss.chunk_size=-8 must be a positive int, 'auto' or None"),
    ("loss.chunk_size", "big", r"config.loss.chunk_size='big' must be a positive int, 'auto' or None"),
    ("train.num_train_steps", 0, r"config.train.num_train_steps=0 must be >= 1"),
    ("train.max_rollbacks", 0, r"config.train.max_rollbacks=0 must be >= 1"),
    (
        "train.loss_spike_factor",
        0.5,
        r"config.train.loss_spike_factor=0.5 must be > 1 \(a spike is a loss above that many times the running median\), or 0",
    ),
    # Inconsistent choices.
    ("loss.name", "softmax_ce", r"num_classes=0 with config.loss.name='softmax_ce'"),
]


def bad_value_fields(field, value) -> dict:
    """The fields a `BAD_VALUES` case sets (a micro-batch method needs micro-batches)."""
    needs = {"train.micro_batch_method": {"train.micro_batch_size": 32}}
    return needs.get(field, {}) | {field: value}


@pytest.mark.parametrize("field, value, message", BAD_VALUES)
def test_bad_value_names_the_field_and_a_fix(config, field, value, message):
    with pytest.raises(ConfigError, match=message):
        build(override(config, bad_value_fields(field, value)))


# (fields, message): settings that do not fit together. tests/test_cli.py runs them too.
BAD_COMBINATIONS = [
    (
        {"loss.name": "dcl", "loss.dcl_weight_gradient": True},
        r"config.loss.dcl_weight_gradient=True needs DCLW's weight: set config.loss.dcl_weight_sigma",
    ),
    (
        {"loss.name": "xbm", "data.task": "labeled", "loss.xbm_memory_weight": -1.0},
        r"config.loss.xbm_memory_weight",
    ),
    # chunk 16 divides N = 64 but not the ring's 64 / 8 = 8 columns per device.
    (
        {"loss.collective": "ring", "loss.chunk_size": 16},
        r"config.loss.chunk_size=16 must divide the logit columns each device holds with the ring \(8\); use 8\.$",
    ),
    ({"data.task": "labeled"}, r"config.loss.name='clip' needs paired inputs but config.data.task is 'labeled'"),
    (
        {"loss.name": "clip_masking_false_negatives"},
        r"masks in-batch false negatives by the dataset's grouping ids, but 'sklearn_digits' has none; use 'clip', or a dataset with ids \(e.g. 'cmudict', or records written with id keys\)",
    ),
    # The losses with state (negatives beyond the batch).
    (
        {"loss.name": "moco_queue", "loss.queue_size": 1000},
        r"config.loss.queue_size=1000 must be a multiple of config.train.global_batch_size \(64\); use 960 or 1024\.$",
    ),
    (
        {"loss.name": "sogclr", "loss.sogclr_table_size": 1000},
        r"config.loss.sogclr_table_size=1000 is smaller than the 1437 examples of split 'train': every example needs its row. Use 0 \(the split's size\) or at least 1437",
    ),
    ({"loss.name": "sogclr", "loss.sogclr_gamma": 0.0}, r"config.loss.sogclr_gamma=0.0 must be in \(0, 1\]"),
    (
        {"loss.name": "xbm", "data.task": "labeled", "loss.xbm_loss": "triplet"},
        r"config.loss.xbm_loss='triplet' is not a label-based loss the memory can extend; use one of \['contrastive', 'multi_similarity', 'supcon'\]",
    ),
    (
        {"loss.name": "xbm", "data.task": "labeled", "loss.xbm_memory_size": 100},
        r"config.loss.xbm_memory_size=100 must be a multiple of config.train.global_batch_size \(64\); use 64 or 128\.$",
    ),
    (
        {"loss.name": "sogclr", "train.micro_batch_size": 16, "train.micro_batch_method": "accumulate"},
        r"config.loss.name='sogclr' updates its state once per step, from the whole batch; config.train.micro_batch_method='accumulate'",
    ),
    (
        {"loss.name": "moco_queue", "loss.queue_size": -64},
        r"config.loss.queue_size=-64 must be 0 \(no queue: the global batch's keys, MoCo v3\) or a positive multiple",
    ),
]


@pytest.mark.parametrize("fields, message", BAD_COMBINATIONS)
def test_settings_that_do_not_fit_together_are_rejected(config, fields, message):
    with pytest.raises(ConfigError, match=message):
        build(override(config, fields))


def test_ring_chunk_size_that_divides_the_per_device_columns_builds(config):
    build(override(config, {"loss.collective": "ring", "loss.chunk_size": 4}))


def test_chunk_size_auto_is_a_config_value_the_trainer_takes(load_config, digits_data_dir):
    config = load_config("default")  # typed fields, as on the command line
    config.data.data_dir = digits_data_dir
    for collective in ("all_gather", "ring"):
        config.loss.chunk_size = "auto"  # chosen from N, D and the device when traced
        config.loss.collective = collective
        assert build(config).trainer.loss_settings.chunk_size == "auto"


def test_misspelled_field_is_rejected_with_a_suggestion(config, tmp_path):
    """The configs are locked: ml_collections rejects a typo in Python, in `override`
    and on the command line, with a suggestion."""
    suggestion = 'Did you mean "temperature" instead of "temprature"'
    with pytest.raises(AttributeError, match=suggestion):
        config.loss.temprature = 0.1
    with pytest.raises(KeyError, match=suggestion):
        override(config, {"loss.temprature": 0.1})
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values)
    path = os.path.join(ROOT, "configs", "default.py")
    with pytest.raises(flags.UnrecognizedFlagError, match="temprature"):
        values(["main", f"--config={path}", "--config.loss.temprature=0.1"])


def test_missing_workdir(config):
    for missing in (None, ""):
        with pytest.raises(ConfigError, match=r"No workdir: pass --workdir=DIR"):
            run_dir.prepare(missing)


def test_workdir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(
        ConfigError,
        match=r"--workdir=.*a_file/run cannot be created or written \(Not a directory\); pass a directory you can write to",
    ):
        run_dir.prepare(str(blocker / "run"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_workdir(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"cannot be created or written \(Permission denied\)"):
            run_dir.prepare(str(tmp_path))
    finally:
        tmp_path.chmod(0o700)


def test_bad_workdir_fails_before_any_work(config, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setattr(trainer.Trainer, "init_state", None)  # would fail if reached
    with pytest.raises(ConfigError, match="cannot be created"):
        run_plan.train_and_evaluate(config, str(blocker / "run"))


# --- resuming onto a checkpoint that does not fit -----------------------------------


# (field, value, message): a change of the model on resume, and the change the error names.
ANOTHER_MODEL = [
    ("model.embed_dim", 32, r"config.model.embed_dim: 16 -> 32"),
    ("model.mlp_hidden_dims", (32, 32), r"config.model.mlp_hidden_dims: \[32\] -> \[32, 32\]"),
    ("optim.name", "sgd", r"config.optim.name: 'adamw' -> 'sgd'"),
]


@pytest.mark.parametrize("field, value, message", ANOTHER_MODEL)
def test_resume_onto_another_model_is_refused(trained, config, field, value, message):
    config = override(config, {field: value, "train.num_train_steps": 4})
    with pytest.raises(checkpoint.IncompatibleCheckpointError) as error:
        run_plan.train_and_evaluate(config, trained)
    text = str(error.value)
    assert "Cannot resume onto another model. checkpoint 2 in" in text
    assert "holds a state of another structure" in text
    assert "Set them back to resume, or use a new --workdir" in text
    assert re.search(message, text), text
    assert isinstance(error.value, ConfigError)


# (field, value): a change of the data stream or RNG on resume.
ANOTHER_DATA_ORDER = [("data.seed", 1), ("seed", 3), ("train.global_batch_size", 32), ("data.task", "views")]


@pytest.mark.parametrize("field, value", ANOTHER_DATA_ORDER)
def test_resume_with_another_data_order_is_refused(trained, config, field, value):
    config = override(config, {field: value, "train.num_train_steps": 4})
    with pytest.raises(
        ConfigError,
        match=rf"Cannot resume from checkpoint 2: it was written with config.{field}=.*so the data order and RNG would not continue it. Set --config.{field}=.*, or use a new --workdir",
    ):
        run_plan.train_and_evaluate(config, trained)


def test_resume_with_more_steps_is_allowed(trained, config, tmp_path):
    """Fields that do not change the state or the stream may change (here: the length)."""
    workdir = str(tmp_path / "run")
    shutil.copytree(trained, workdir)
    config.train.num_train_steps = 3
    run_plan.train_and_evaluate(config, workdir)
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "3"))
