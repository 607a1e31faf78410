"""A mixture of record sets through the trainer: each set's epochs logged at the logging
steps (`train/epoch/<set>`), and a resumed run logging what an uninterrupted one does."""

import shutil

import pytest

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from contrastive_jax.data import settings
from contrastive_jax.training import loop, run_plan


@pytest.fixture
def mixed(tiny_config, digits_data_dir, tmp_path):
    """The tiny config on the digits and a copy of them named digits_b, 0.75 / 0.25."""
    digits = settings.builtin_records("sklearn_digits", digits_data_dir)
    copy = shutil.copytree(digits, tmp_path / "digits_b")
    fields = {
        "data.records": (digits, str(copy)),
        "data.mixture_weights": (0.75, 0.25),
        "data.image_size": 8,
        "train.num_train_steps": 4,
        "train.log_every_steps": 2,
    }
    return override(tiny_config, fields)


def logged(workdir, key):
    return {m["step"]: m[key] for m in run_dir.read_metrics(workdir) if key in m}


@pytest.mark.slow
def test_each_sets_epochs_are_logged_and_resumed(mixed, tmp_path, monkeypatch):
    """Logged every 2 steps: 64 rows a step, 3 of each 4 from the digits (1,437), 1 from
    the copy. Killed before step 4 (resumes from 2): the same losses and epochs."""
    straight = str(tmp_path / "straight")
    run_plan.train_and_evaluate(mixed, straight)
    assert logged(straight, "train/epoch/sklearn_digits-v2") == {2: 96 / 1437, 4: 192 / 1437}
    assert logged(straight, "train/epoch/digits_b") == {2: 32 / 1437, 4: 64 / 1437}
    real, calls = loop._global_batch, []

    def crash_before_step_4(batch, data_sharding):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("simulated crash")
        return real(batch, data_sharding)

    resumed = str(tmp_path / "resumed")
    monkeypatch.setattr(loop, "_global_batch", crash_before_step_4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_plan.train_and_evaluate(mixed, resumed)
    monkeypatch.setattr(loop, "_global_batch", real)
    run_plan.train_and_evaluate(mixed, resumed)
    for key in ("train/loss", "train/epoch/sklearn_digits-v2", "train/epoch/digits_b"):
        assert logged(resumed, key) == logged(straight, key)
