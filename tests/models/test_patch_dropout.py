"""Patch dropout (FLIP; open_clip's `patch_dropout`): open_clip's count and class token,
off at evaluation and export, the kept tokens a pure function of (seed, step, global row)
(resume, 8 devices and micro-batches keep the same ones), the released layouts' towers,
the compiled step's memory, and the FLIP config end to end."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import encoders, patch_dropout, saved_model, two_tower
from contrastive_jax.models.released import big_vision_layout, open_clip_layout
from contrastive_jax.models.transformer import TowerSettings
from contrastive_jax.training import run_plan

pytestmark = pytest.mark.usefixtures("two_block_vit_tiny")  # 2 blocks: the drops are per block

# A ViT on the digits (8 x 8 pixels: 16 patches of 2 x 2), no dropout (the steps compare exactly).
VIT_FIELDS = {
    "model.encoder_a": "vit_tiny",
    "model.encoder_b": "vit_tiny",
    "model.patch_size": 2,
    "model.dropout_rate": 0.0,
    "train.global_batch_size": 32,
    "optim.name": "sgd",
    "optim.momentum": 0.0,
    "optim.learning_rate": 0.5,
    "optim.warmup_steps": 0,
    "optim.weight_decay": 0.0,
}


@pytest.fixture
def vit_config(tiny_config):
    return override(tiny_config, VIT_FIELDS | {"model.patch_dropout": 0.5})


def test_a_row_keeps_open_clips_count_its_class_token_and_its_own_patches():
    x = jnp.arange(3 * 17, dtype=jnp.float32).reshape(3, 17, 1)  # a class token and 16 patches per row
    kept = patch_dropout.drop_patches(x, patch_dropout.row_keys(0, 0, 3), rate=0.75, num_prefix=1)
    assert kept.shape == (3, 1 + 4, 1)  # max(1, int(16 * 0.25))
    np.testing.assert_array_equal(kept[:, 0], x[:, 0])
    for row in range(3):
        patches = np.asarray(kept[row, 1:, 0])
        assert set(patches) <= set(np.asarray(x[row, 1:, 0])) and list(patches) == sorted(set(patches))
    assert [patch_dropout.num_kept(196, p) for p in (0.0, 0.5, 0.75, 0.999)] == [196, 98, 49, 1]


def test_the_kept_patches_are_a_function_of_seed_step_and_row_alone():
    """Resume and any split of the batch keep the same tokens: row r's patches depend on
    (seed, step, r), not on the batch's size; another step or seed keeps others."""
    kept = lambda seed, step, rows: patch_dropout.kept_indices(patch_dropout.row_keys(seed, step, rows), 64, 0.5)  # noqa: E731
    np.testing.assert_array_equal(kept(0, 7, 8), kept(0, 7, 32)[:8])
    np.testing.assert_array_equal(kept(0, 7, 8), kept(0, 7, 8))
    assert not np.array_equal(kept(0, 7, 8), kept(0, 8, 8))
    assert not np.array_equal(kept(0, 7, 8), kept(1, 7, 8))
    assert len({tuple(row) for row in np.asarray(kept(0, 7, 32))}) == 32  # each row its own


def model_and_variables(config, rate):
    settings = dataclasses.replace(run_plan.model_settings(config), patch_dropout=rate)
    model = two_tower.create_model(settings, text_vocab_size=0)
    images = jax.random.uniform(jax.random.key(1), (4, 8, 8, 1))
    return model, model.init(jax.random.key(0), images, images), images, settings


@pytest.mark.slow
def test_nothing_is_dropped_at_evaluation_in_embed_or_in_an_export(vit_config):
    model, variables, images, settings = model_and_variables(vit_config, 0.5)
    plain, _, _, _ = model_and_variables(vit_config, 0.0)
    keys = patch_dropout.row_keys(0, 3, 4)
    unmasked = plain.apply(variables, images, images)
    chex.assert_trees_all_equal(model.apply(variables, images, images, patch_keys=keys), unmasked)
    chex.assert_trees_all_equal(model.apply(variables, images, images, train=True), unmasked)
    np.testing.assert_array_equal(model.apply(variables, images, "a", method="embed"), unmasked["za"])
    description = saved_model.describe(settings, model, text_vocab_size=0, tokenizer="bytes", text_max_length=8)
    exported = saved_model.rebuild(description)
    np.testing.assert_array_equal(exported.apply(variables, images, "a", method="embed"), unmasked["za"])
    trained = model.apply(variables, images, images, train=True, patch_keys=keys)
    assert not np.allclose(trained["za"], unmasked["za"]) and not np.allclose(trained["zb"], unmasked["zb"])
    assert not np.allclose(trained["za"], trained["zb"])  # the two towers keep other patches


def spied(seen, rate=0.5):
    """A `drop_patches` that records the tokens and class tokens it is given."""

    def drop(x, *, num_prefix):
        seen.append((x.shape[1], num_prefix))
        return patch_dropout.drop_patches(x, patch_dropout.row_keys(0, 0, x.shape[0]), rate=rate, num_prefix=num_prefix)

    return drop


def test_the_projects_vit_drops_after_its_position_embedding_keeping_its_class_token():
    vit = encoders.ViT(16, 1, 2, 32, 2)
    images = jax.random.uniform(jax.random.key(1), (4, 8, 8, 1))
    variables = vit.init(jax.random.key(0), images)
    seen = []
    vit.apply(variables, images, train=True, drop_patches=spied(seen))
    assert seen == [(1 + 16, 1)]


TOWER = TowerSettings(width=16, depth=1, num_heads=2, mlp_dim=32)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, settings, expected",
    [
        (open_clip_layout, open_clip_layout.Settings(16, 4, TOWER, 8, 50, TOWER, 8), (1 + 16, 1)),  # class token
        (big_vision_layout, big_vision_layout.Settings(16, 4, TOWER, 8, 50, TOWER, 16), (16, 0)),  # MAP head
        (big_vision_layout, big_vision_layout.Settings(16, 4, TOWER, 8, 50, TOWER, 16, pool_type="tok"), (16, 0)),
    ],
)
def test_the_released_layouts_drop_patches_while_training_only(layout, settings, expected):
    """open_clip's tower keeps its class token (dropped after the position embedding, as its
    PatchDropout); SigLIP's has none, its MAP head (or a class token added after) reads the
    kept patches."""
    model = layout.Model(settings, patch_dropout=patch_dropout.PatchDropout(0.5))
    images, texts = jax.random.uniform(jax.random.key(1), (4, 16, 16, 3)), jnp.ones((4, 8), jnp.int32)
    variables = model.init(jax.random.key(0), images, texts)
    keys = patch_dropout.row_keys(0, 0, 4)
    unmasked = model.apply(variables, images, texts)
    chex.assert_trees_all_equal(model.apply(variables, images, texts, patch_keys=keys), unmasked)
    trained = model.apply(variables, images, texts, train=True, patch_keys=keys)
    assert not np.allclose(trained["za"], unmasked["za"])
    np.testing.assert_array_equal(trained["zb"], unmasked["zb"])
    seen = []
    model.apply(variables, images, method=lambda m, x: m.img(m._pixels(x), drop_patches=spied(seen)))
    assert seen == [expected]


def sgd_steps(config, mesh, num_steps=2):
    """Parameters and losses after `num_steps` steps on the digits' first batch."""
    trainer = run_plan.build(config, mesh).trainer
    ds = input_pipeline.train_dataset(run_plan.data_settings(config))
    init, abstract = trainer.init_state(ds.element_spec)
    state, batch = init(), next(iter(ds))
    step = jax.jit(
        trainer.train_step,
        in_shardings=(jax.tree.map(lambda s: s.sharding, abstract), sharding.data_sharding(mesh)),
    )
    losses = []
    for _ in range(num_steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return jax.device_get(state.params), losses


@pytest.mark.slow
def test_eight_devices_and_micro_batches_keep_the_single_device_steps_tokens(vit_config):
    one, unmasked = (
        sgd_steps(vit_config, sharding.make_mesh(1)),
        sgd_steps(override(vit_config, {"model.patch_dropout": 0.0}), sharding.make_mesh(1)),
    )
    eight = sgd_steps(vit_config, sharding.make_mesh(8))
    micro = sgd_steps(override(vit_config, {"train.micro_batch_size": 16}), sharding.make_mesh(8))
    for other in (eight, micro):
        np.testing.assert_allclose(other[1], one[1], rtol=1e-5)
        chex.assert_trees_all_close(other[0], one[0], rtol=1e-4, atol=1e-6)
    assert abs(one[1][0] - unmasked[1][0]) > 1e-4


@pytest.mark.slow
def test_the_unmasked_tuning_steps_keep_every_patch(vit_config):
    """With `patch_dropout_until_step` 1, the first step is the masked one's, the second
    the unmasked one's from the state after it."""
    tuned = sgd_steps(override(vit_config, {"model.patch_dropout_until_step": 1}), sharding.make_mesh(1))
    masked_params, masked_losses = sgd_steps(vit_config, sharding.make_mesh(1), num_steps=1)
    assert tuned[1][0] == pytest.approx(masked_losses[0], rel=1e-6)
    unmasked = override(vit_config, {"model.patch_dropout": 0.0})
    trainer = run_plan.build(unmasked, sharding.make_mesh(1)).trainer
    ds = input_pipeline.train_dataset(run_plan.data_settings(unmasked))
    init, _ = trainer.init_state(ds.element_spec)
    state = init().replace(params=masked_params, step=1)
    _, metrics = jax.jit(trainer.train_step)(state, next(iter(ds)))
    assert tuned[1][1] == pytest.approx(float(metrics["loss"]), rel=1e-5)


def compiled_bytes(config):
    trainer = run_plan.build(config, sharding.make_mesh(1)).trainer
    spec = input_pipeline.train_dataset(run_plan.data_settings(config)).element_spec
    _, abstract = trainer.init_state(spec)
    return trainer.compile_step(abstract, spec).memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_the_compiled_step_holds_the_kept_tokens_only(vit_config):
    """The memory check compiles the step it runs: at 0.5 its activations are those of
    half the patches; with an unmasked tuning stage the step needs the unmasked memory."""
    fields = {"model.patch_size": 1, "train.global_batch_size": 64}  # 64 patches of 8 x 8
    at = {p: compiled_bytes(override(vit_config, fields | {"model.patch_dropout": p})) for p in (0.0, 0.5)}
    tuned = compiled_bytes(override(vit_config, fields | {"model.patch_dropout_until_step": 5}))
    assert at[0.5] < 0.7 * at[0.0], at
    assert at[0.0] * 0.9 < tuned < at[0.0] * 2, (tuned, at)  # both stages' branches: 1.6x at 2 blocks


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"model.patch_dropout": 1.0}, "config.model.patch_dropout=1.0"),
        ({"model.patch_dropout": -0.1}, "config.model.patch_dropout=-0.1"),
        ({"model.patch_dropout_until_step": -1}, "config.model.patch_dropout_until_step=-1"),
        ({"model.encoder_a": "mlp", "model.encoder_b": "mlp"}, "neither encoder is one"),
    ],
)
def test_a_bad_patch_dropout_is_one_config_error(vit_config, fields, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        run_plan.build(override(vit_config, fields), sharding.make_mesh(1))


@pytest.mark.slow
def test_the_flip_config_trains_masked_then_unmasked_end_to_end(load_config, shapes_data_dir, tmp_path):
    config = override(
        load_config("flip_clip"),
        {
            "data.data_dir": shapes_data_dir,
            "model.encoder_a": "vit_tiny",
            "model.text_num_layers": 1,
            "model.encoder_dim": 32,
            "train.global_batch_size": 16,
            "train.num_train_steps": 4,
            "model.patch_dropout_until_step": 2,
            "eval.every_steps": 0,
        },
    )
    results = run_plan.train_and_evaluate(config, str(tmp_path))
    assert all(np.isfinite(v) for v in results.values() if isinstance(v, float)), results
