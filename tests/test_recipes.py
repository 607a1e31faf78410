"""The recipes of `docs/recipes.md`: each recipe's config trains a few steps at tiny size
(the towers, batch and steps shrunk; on the generated `shapes` records, or tables written
here); an image's captions reach the losses as positives with `config.loss.positives`; a
batch of several captions per image is refused where they would count as negatives.
The figures the page quotes are checked with every page's, in tests/test_docs.py."""

import csv
import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from test_configs import RECORDS_CONFIGS, load_on_local_data

from contrastive_jax import losses, run_dir, sharding, write_records
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline, mixture, records, settings
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import run_plan
from contrastive_jax.training.run_plan import build, data_settings

pytestmark = pytest.mark.usefixtures("two_block_vit_tiny")  # vit_tiny at 2 blocks: the steps compare per block

# Every recipe at tiny size: the recipe's loss, optimizer and data fields, small towers (vit_tiny at
# 2 blocks: pytestmark).
TINY = {
    "data.image_size": 32,
    "data.text_max_length": 32,
    "data.num_workers": 0,
    "model.encoder_a": "vit_tiny",
    "model.patch_size": 8,  # 16 patches of 32 px
    "model.encoder_dim": 32,
    "model.text_num_layers": 1,
    "model.embed_dim": 16,
    "model.compute_dtype": "float32",
    "train.global_batch_size": 16,
    "train.num_train_steps": 2,
    "train.log_every_steps": 1,
    "optim.warmup_steps": 1,
    "eval.every_steps": 0,
    "eval.linear_probe": False,
    "eval.knn_k": 0,
    "checkpoint.every_steps": 2,
}
# The losses that read positive ids, and the forms of config.loss.positives.
SEVERAL_POSITIVES = ("clip", "infonce", "siglip")
FORMS = ("mean_log_prob", "log_sum")


def tiny(load_config, request, name, **fields):
    """Config `name` at tiny size on the `shapes` records (`test_configs.load_on_local_data`)."""
    return override(load_on_local_data(load_config, request, name), TINY | fields)


def one_step(config, num_devices):
    """`(trainer, state before, batch, metrics, state after)` of one jitted step on the
    stream's first batch."""
    trainer = build(config, sharding.make_mesh(num_devices)).trainer
    ds = input_pipeline.train_dataset(data_settings(config))
    init, abstract = trainer.init_state(ds.element_spec)
    batch = jax.device_get(next(iter(ds)))
    before = jax.device_get(init())
    after, metrics = trainer.jit_train_step(abstract)(init(), batch)
    return trainer, before, batch, jax.device_get(metrics), jax.device_get(after)


def kernel_call(name, za, zb, temperature, bias, *, positive_ids=None, form="mean_log_prob"):
    """The loss library's kernel behind registry entry `name` (with `positive_ids` in the
    form `form`), on one device."""
    candidates = None if positive_ids is None else losses.Candidates(positive_ids=positive_ids, positives=form)
    if name == "siglip":
        return losses.siglip_loss(za, zb, temperature=temperature, bias=bias, candidates=candidates)
    kernel = losses.infonce_loss if name == "infonce" else losses.clip_loss
    return kernel(za, zb, temperature=temperature, candidates=candidates)


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", SEVERAL_POSITIVES)
def test_the_losses_pass_the_index_as_positive_ids_over_the_global_batch(tiny_config, name, form):
    """On 8 devices, each loss with `config.loss.positives` is its kernel on one device
    with `index` as `positive_ids` in that form (ids shared by rows on different devices),
    which is not the plain loss."""
    if name == "siglip" and form == "log_sum":
        pytest.skip("SigLIP has one form: every positive pair labelled +1")
    keys = jax.random.split(jax.random.key(0), 2)
    za = losses.l2_normalize(jax.random.normal(keys[0], (32, 8)))
    zb = losses.l2_normalize(za + jax.random.normal(keys[1], (32, 8)))
    index = (np.arange(32) * 5) % 12  # row r and r + 12 share an id
    trainer = build(override(tiny_config, {"loss.name": name, "loss.positives": form}), sharding.make_mesh(8)).trainer
    shared = {"temperature": np.float32(0.2), "bias": np.float32(-2.0)}
    got = trainer.global_loss({"za": za, "zb": zb}, shared, {"index": index})[0]
    want = kernel_call(name, za, zb, **shared, positive_ids=index, form=form)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert abs(float(want) - float(kernel_call(name, za, zb, **shared))) > 1e-3


def test_the_mean_form_is_clip_when_an_images_rows_are_one_embedding():
    """With the k rows of an image holding one image embedding (the image and its
    augmentation repeated, no dropout), SupCon's mean form is plain CLIP, value and
    gradient; the log-sum form and SigLIP's +1 labels are not."""
    keys = jax.random.split(jax.random.key(1), 2)
    za = jnp.repeat(losses.l2_normalize(jax.random.normal(keys[0], (4, 8))), 4, axis=0)  # 4 images x 4 rows
    zb = losses.l2_normalize(jax.random.normal(keys[1], (16, 8)))
    by_image = losses.Candidates(positive_ids=np.repeat(np.arange(4), 4))

    def value(images, zb, candidates=None):
        return losses.clip_loss(jnp.repeat(images, 4, axis=0), zb, temperature=0.1, candidates=candidates)

    images = za[::4]
    mean, plain = (jax.value_and_grad(value, argnums=(0, 1)) for _ in range(2))
    (v_mean, g_mean), (v_plain, g_plain) = mean(images, zb, by_image), plain(images, zb)
    assert float(v_mean) == pytest.approx(float(v_plain), rel=1e-6)
    for got, want in zip(g_mean, g_plain):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    log_sum = value(images, zb, dataclasses.replace(by_image, positives="log_sum"))
    siglip = losses.siglip_loss(za, zb, temperature=0.1, bias=-2.0, candidates=by_image)
    assert abs(float(log_sum) - float(v_plain)) > 1e-2
    assert abs(float(siglip) - float(losses.siglip_loss(za, zb, temperature=0.1, bias=-2.0))) > 1e-2


@pytest.mark.slow
def test_a_step_with_4_captions_a_picture_has_the_kernels_loss(load_config, request):
    """4 captions a picture (N = 16: 4 pictures) through the trainer on 8 devices: the
    step's loss is the log-sum kernel's with the pictures' indices as `positive_ids`,
    computed on one device from the towers' outputs."""
    fields = {"loss.positives": "log_sum", "model.encoder_a": "cnn", "model.cnn_features": (8,)}
    config = tiny(load_config, request, "recipes_several_positives", **fields)
    trainer, before, batch, metrics, _ = one_step(config, 8)
    index = batch["index"]
    assert len(set(index)) == 4 and (index.reshape(4, 4) == index[::4, None]).all()
    outputs = trainer.model.apply({"params": before.params, "batch_stats": before.batch_stats}, batch["a"], batch["b"])
    za, zb, temperature = outputs["za"], outputs["zb"], outputs["temperature"]
    want = kernel_call("clip", za, zb, temperature, None, positive_ids=index, form="log_sum")
    assert float(metrics["loss"]) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("name", SEVERAL_POSITIVES)
def test_several_captions_need_positives_that_are_not_the_own_pair(load_config, request, name):
    """k > 1 captions a picture with `config.loss.positives="own"` would count a picture's
    pairs as negatives of each other: refused in one line; a loss that reads no positive
    ids is refused a form, naming those that do."""
    config = tiny(load_config, request, "recipes_several_positives", **{"loss.name": name, "loss.positives": "own"})
    with pytest.raises(ConfigError, match=r"captions_per_image=4 .*config\.loss\.positives='own' counts") as error:
        build(config, sharding.make_mesh(8))
    assert "\n" not in str(error.value)
    build(override(config, {"data.captions_per_image": 1}), sharding.make_mesh(8))  # one caption: any loss
    other = override(config, {"loss.name": "dcl", "loss.positives": "mean_log_prob"})
    with pytest.raises(ConfigError, match=r"loss\.name='dcl', which cannot take them") as error:
        build(other, sharding.make_mesh(8))
    assert f"use one of {sorted(SEVERAL_POSITIVES)}" in str(error.value) and "\n" not in str(error.value)
    assert sorted(k for k, v in losses.LOSSES.items() if "positive_ids" in v.options) == sorted(SEVERAL_POSITIVES)


@pytest.mark.parametrize("old", sorted(losses.registry.DEPRECATED_NAMES))
def test_the_old_names_of_several_positives_build_with_a_warning(tiny_config, old):
    """The last release's loss names are today's loss with `config.loss.positives`."""
    with pytest.warns(DeprecationWarning, match=rf"loss.name='{old}' is deprecated"):
        trainer = build(override(tiny_config, {"loss.name": old}), sharding.make_mesh(8)).trainer
    loss, form = losses.registry.DEPRECATED_NAMES[old]
    assert trainer.loss is losses.LOSSES[loss] and trainer.loss_settings.positives == form


def test_lit_on_the_generated_set_locks_a_random_image_tower(load_config, request):
    """LiT's flag without a released tower (`clip_shapes` with `optim.frozen_tower=a`): a
    step leaves every parameter of the image tower as initialised and moves the text
    tower's (the mechanics of the recipe, not the recipe: docs/recipes.md)."""
    fields = {"optim.frozen_tower": "a", "optim.warmup_steps": 0, "model.encoder_a": "cnn", "model.cnn_features": (8,)}
    trainer, before, _, metrics, after = one_step(tiny(load_config, request, "clip_shapes", **fields), 8)
    assert np.isfinite(metrics["loss"])
    frozen = {name for name in before.params if name.endswith("_a")}
    assert frozen and set(before.params) - frozen
    for name in before.params:
        moved = [
            np.abs(x - y).max()
            for x, y in zip(jax.tree.leaves(after.params[name]), jax.tree.leaves(before.params[name]))
        ]
        assert (max(moved) == 0) == (name in frozen), name


def write_negatives_table(directory, num=48, m=2):
    """A CSV of `num` rows over 8 solid-colour PNGs: captions naming the row, and `m`
    negatives naming other rows."""
    (directory / "img").mkdir(parents=True)
    for k in range(8):
        Image.new("RGB", (16, 16), (30 * k, 200 - 20 * k, 90)).save(directory / "img" / f"{k}.png")
    with open(directory / "pairs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "captions", "negatives"])
        for k in range(num):
            negatives = [f"picture {(k + j) % num}" for j in range(1, m + 1)]
            writer.writerow([f"img/{k % 8}.png", json.dumps([f"picture {k}"]), json.dumps(negatives)])
    out = str(directory / "hard_negatives")
    write_records.write(f"csv:{directory / 'pairs.csv'}", out)
    return out


def recipe_data(name, shapes_data_dir, tmp_path):
    """The fields pointing recipe `name` at data written here, where it reads a record set."""
    if name == "recipes_hard_negatives":
        out = write_negatives_table(tmp_path / "table")
        return {"data.records": out, "eval.split": "train", "data.image_size": 16}
    if name == "recipes_mixture":
        shapes = settings.builtin_records("shapes", shapes_data_dir)
        copy = shutil.copytree(shapes, tmp_path / "shapes_b")
        return {"data.records": f"{shapes},{copy}"}
    return {}


RECIPES = (
    "clip_coco",
    "siglip_coco",
    "flip_clip",
    "recipes_several_positives",
    "recipes_hard_negatives",
    "recipes_mixture",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_at_tiny_size(load_config, request, shapes_data_dir, tmp_path, name):
    """Two steps and the evaluation of each recipe's config (FLIP's: one masked step, one
    unmasked); a mixture logs both sets' epochs, the hard-negative records hold their M = 2."""
    if name in RECORDS_CONFIGS:
        config = override(load_config(name), TINY | recipe_data(name, shapes_data_dir, tmp_path))
    else:
        config = tiny(load_config, request, name)
    if name == "flip_clip":
        config = override(config, {"model.patch_dropout_until_step": 1})  # step 0 masked, step 1 not
    workdir = str(tmp_path / "run")
    results = run_plan.train_and_evaluate(config, workdir)
    assert results and all(np.isfinite(v) for v in results.values())
    logged = [m for m in run_dir.read_metrics(workdir) if "train/loss" in m]
    assert [m["step"] for m in logged] == [1, 2] and all(np.isfinite(m["train/loss"]) for m in logged)
    if name == "recipes_mixture":
        sets = [mixture.source_name(d) for d in config.data.records.split(",")]
        epochs = {k for m in run_dir.read_metrics(workdir) for k in m if k.startswith("train/epoch/")}
        assert epochs == {f"train/epoch/{s}" for s in sets} and sets[1] == "shapes_b"
    if name == "recipes_hard_negatives":
        assert records.read_metadata(config.data.records).num_negatives == 2
