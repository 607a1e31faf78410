"""experiments/lib/tasks.py: each task's config (the splits, the towers, --quick's slices)
and the generated set written once, where the study's --data-dir says."""

import argparse
import os

from contrastive_jax.data import settings
from experiments.lib import tasks


def test_each_task_builds_its_config_from_its_module_and_overrides(tmp_path):
    args = argparse.Namespace(quick=False, data_dir=str(tmp_path))
    cmudict = tasks.base_config("cmudict", args)
    assert (cmudict.data.name, cmudict.data.train_split, cmudict.eval.split) == ("cmudict", "fit", "validation")
    assert cmudict.data.data_dir == str(tmp_path) and cmudict.data.records is None
    quick = tasks.base_config("cmudict", argparse.Namespace(quick=True, data_dir=None))
    assert (quick.data.train_split, quick.eval.split) == ("fit[:1024]", "validation[:256]")
    vit = tasks.base_config("shapes_vit", argparse.Namespace(quick=True, data_dir=str(tmp_path), pictures=40))
    assert (vit.model.encoder_a, vit.model.patch_size, vit.model.encoder_b) == ("vit_micro", 8, "text_cnn")
    assert (vit.data.image_size, vit.data.train_split, vit.eval.split) == (32, "train[:1024]", "validation[:64]")
    folder = tmp_path / f"shapes-v{settings.BUILTIN_VERSION}-32px-40"
    assert vit.data.records == str(folder) and (folder / "metadata.json").exists()
    cnn = tasks.base_config("shapes", argparse.Namespace(quick=False, data_dir=str(tmp_path), pictures=40))
    assert (cnn.model.encoder_a, cnn.model.cnn_features, cnn.eval.split) == ("cnn", (16, 32), "validation[:1000]")
    assert cnn.data.records == str(folder)


def test_the_generated_set_is_written_once(tmp_path):
    """A second call finds the set its folder names (the version, the size, the count)."""
    first = tasks.generated_records(str(tmp_path), 30)
    stamp = os.path.getmtime(os.path.join(first["data.records"], "metadata.json"))
    assert tasks.generated_records(str(tmp_path), 30) == first
    assert os.path.getmtime(os.path.join(first["data.records"], "metadata.json")) == stamp
    assert tasks.generated_records(str(tmp_path), 0) == {}  # a task on a built-in set
