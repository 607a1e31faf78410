"""Fine-tuning: layer-wise learning-rate decay and a frozen tower (LiT) in the optimizer,
and a released checkpoint trained by the trainer (`config.model.init_from`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.models.released import TOWER_PARAMS, open_clip_layout
from contrastive_jax.models.transformer import TowerSettings
from contrastive_jax.training import optimizer

SGD = optimizer.OptimSettings("sgd", 0.1, 0, 1.0, 0.0, 0.0, 0.0)
TOWER = TowerSettings(width=64, depth=3, num_heads=1, mlp_dim=128)
SETTINGS = open_clip_layout.Settings(
    image_size=16, patch_size=8, image=TOWER, context_length=8, vocab_size=50, text=TOWER, embed_dim=16
)


def _params():
    model = open_clip_layout.Model(SETTINGS)
    tokens = jnp.ones((1, 8), jnp.int32)
    return model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), tokens)["params"]


def _sgd_updates(settings, params):
    tx, _ = optimizer.make_optimizer(settings, 10, TOWER_PARAMS)
    grads = jax.tree.map(jnp.ones_like, params)
    return tx.update(grads, tx.init(params), params)[0]


@pytest.mark.slow
def test_layer_decay_scales_blocks_embeddings_and_heads():
    decay = 0.5
    updates = _sgd_updates(_with(SGD, layer_decay=decay), _params())
    lr = -SGD.learning_rate
    for tower, blocks in (("img", "Transformer"), ("txt", "Encoder_0")):
        for index in range(3):  # block i of 3: decay ** (3 - i)
            kernel = updates[tower][blocks][f"encoderblock_{index}"]["MlpBlock_0"]["Dense_0"]["kernel"]
            np.testing.assert_allclose(kernel, lr * decay ** (3 - index), rtol=1e-6)
        np.testing.assert_allclose(updates[tower]["pos_embedding"], lr * decay**4, rtol=1e-6)
        np.testing.assert_allclose(updates[tower][blocks]["encoder_norm"]["scale"], lr, rtol=1e-6)
        np.testing.assert_allclose(updates[tower]["head"]["kernel"], lr, rtol=1e-6)
    np.testing.assert_allclose(updates["img"]["embedding"]["kernel"], lr * decay**4, rtol=1e-6)
    np.testing.assert_allclose(updates["txt"]["Embed_0"]["embedding"], lr * decay**4, rtol=1e-6)
    np.testing.assert_allclose(updates["log_inv_temperature"], lr, rtol=1e-6)


def _with(settings, **fields):
    import dataclasses

    return dataclasses.replace(settings, **fields)


@pytest.mark.slow
@pytest.mark.parametrize("side, frozen, trained", [("a", "img", "txt"), ("b", "txt", "img")])
def test_a_frozen_tower_is_not_updated_and_keeps_no_optimizer_state(side, frozen, trained):
    params = _params()
    adam = _with(SGD, name="adamw", frozen_tower=side, grad_clip_norm=1.0)
    tx, _ = optimizer.make_optimizer(adam, 10, TOWER_PARAMS)
    grads = jax.tree.map(jnp.ones_like, params)
    state = tx.init(params)
    updates, _ = tx.update(grads, state, params)
    assert all(np.all(leaf == 0) for leaf in jax.tree.leaves(updates[frozen]))
    assert all(np.all(leaf != 0) for leaf in jax.tree.leaves(updates[trained]["head"]))
    assert float(updates["log_inv_temperature"]) != 0.0
    moments = sum(leaf.size for leaf in jax.tree.leaves(state))
    tower_size = sum(leaf.size for leaf in jax.tree.leaves(params[frozen]))
    total = sum(leaf.size for leaf in jax.tree.leaves(params))
    assert moments <= 2 * (total - tower_size) + 8  # Adam's two moments of the trained part alone


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"frozen_tower": "c"}, "frozen_tower='c'"),
        ({"layer_decay": 0.0}, "layer_decay=0.0"),
        ({"layer_decay": 1.5}, "layer_decay=1.5"),
    ],
)
def test_bad_fine_tuning_settings_are_named(fields, message):
    with pytest.raises(ConfigError, match=message):
        optimizer.make_optimizer(_with(SGD, **fields), 10, TOWER_PARAMS)


def test_tied_towers_cannot_freeze_one():
    tx, _ = optimizer.make_optimizer(_with(SGD, frozen_tower="b"), 10, {"a": ("tower_a",), "b": ("tower_b",)})
    with pytest.raises(ConfigError, match="tie_towers"):
        tx.init({"tower_a": jnp.ones(2), "head_a": jnp.ones(2)})


def test_optax_reference_for_one_block():
    """A block's factor is optax's own scaled SGD step (not a re-derivation of the rule)."""
    params = _params()
    decay = 0.75
    updates = _sgd_updates(_with(SGD, layer_decay=decay), params)
    block = params["txt"]["Encoder_0"]["encoderblock_1"]
    sgd = optax.sgd(SGD.learning_rate * decay**2)
    want, _ = sgd.update(jax.tree.map(jnp.ones_like, block), sgd.init(block))
    got = updates["txt"]["Encoder_0"]["encoderblock_1"]
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6), got, want)


@pytest.mark.e2e
def test_a_released_clip_fine_tunes_with_its_image_tower_locked(load_config, shapes_data_dir, clip_merges, tmp_path):
    """A random-weight open_clip CLIP, saved as open_clip saves it, is fine-tuned on the
    generated image-text set through `configs/finetune_clip.py` (CLIP's BPE, gradient
    caching, layer decay, LiT); its image tower stays open_clip's, its text tower moves."""
    torch = pytest.importorskip("torch")
    open_clip = pytest.importorskip("open_clip")
    from safetensors.torch import save_file

    from contrastive_jax import trained, use_trained
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    torch.manual_seed(0)
    vision = {"layers": 2, "width": 64, "patch_size": 16, "image_size": 64}
    text = {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2}
    reference = open_clip.model.CLIP(embed_dim=32, vision_cfg=vision, text_cfg=text).eval()
    checkpoint = tmp_path / "open_clip_model.safetensors"
    save_file({name: t.contiguous() for name, t in reference.state_dict().items()}, str(checkpoint))
    fields = {
        "model.init_from": str(checkpoint),
        "model.embed_dim": 32,
        "data.name": "shapes",
        "data.data_dir": shapes_data_dir,
        "data.tokenizer": clip_merges,
        "data.image_size": 64,
        "data.num_workers": 0,
        "train.global_batch_size": 32,
        "train.micro_batch_size": 16,
        "train.num_train_steps": 3,
        "optim.warmup_steps": 1,
        "optim.learning_rate": 1e-3,
        "optim.frozen_tower": "a",
        "eval.every_steps": 0,
        "checkpoint.every_steps": 3,
    }
    workdir = str(tmp_path / "run")
    results = run_plan.train_and_evaluate(override(load_config("finetune_clip"), fields), workdir)
    assert np.isfinite(results["all_captions/image_retrieval_recall@1"])
    model = trained.load(workdir)
    images = np.random.default_rng(0).random((4, 64, 64, 3), dtype=np.float32)
    captions = ["a red circle.", "two blue squares at the top."]
    mean, std = np.array(open_clip_layout.OPENAI_MEAN), np.array(open_clip_layout.OPENAI_STD)
    with torch.no_grad():
        pixels = torch.from_numpy(((images - mean) / std).transpose(0, 3, 1, 2).astype(np.float32))
        want_a = reference.encode_image(pixels, normalize=True).numpy()
        want_b = reference.encode_text(open_clip.tokenize(captions), normalize=True).numpy()
    np.testing.assert_allclose(model.embed(images, "a"), want_a, rtol=1e-4, atol=1e-5)  # locked
    moved = np.abs(model.embed(model.tokenize(captions), "b") - want_b).max()
    assert moved > 1e-3  # trained
    # Weights out: the fine-tuned model, written as open_clip's state_dict, is open_clip's again.
    from safetensors.torch import load_file

    written = f"--out={tmp_path / 'fine_tuned.safetensors'}"
    assert use_trained.main([f"--workdir={workdir}", "--released", written]) == 0
    fine_tuned = open_clip.model.CLIP(embed_dim=32, vision_cfg=vision, text_cfg=text).eval()
    fine_tuned.load_state_dict(load_file(str(tmp_path / "fine_tuned.safetensors")), strict=True)
    with torch.no_grad():
        got_a = fine_tuned.encode_image(pixels, normalize=True).numpy()
        got_b = fine_tuned.encode_text(open_clip.tokenize(captions), normalize=True).numpy()
    np.testing.assert_allclose(got_a, model.embed(images, "a"), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_b, model.embed(model.tokenize(captions), "b"), rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_open_clip(tmp_path_factory):
    """A random-weight open_clip CLIP (64 px, CLIP's vocabulary) saved as `.safetensors`."""
    torch = pytest.importorskip("torch")
    open_clip = pytest.importorskip("open_clip")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    vision = {"layers": 1, "width": 64, "patch_size": 16, "image_size": 64}
    text = {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 1}
    model = open_clip.model.CLIP(embed_dim=32, vision_cfg=vision, text_cfg=text)
    path = tmp_path_factory.mktemp("released") / "open_clip_model.safetensors"
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, str(path))
    return str(path)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "fields, message",
    [
        ({"data.image_size": 32}, r"config\.data\.image_size=32; the released model .* takes 64"),
        ({"data.text_max_length": 64}, r"config\.data\.text_max_length=64; .* takes 77"),
        ({"model.embed_dim": 512}, r"config\.model\.embed_dim=512; .* takes 32"),
        ({"data.tokenizer": "bytes"}, r"gives 257 ids; the released text tower embeds 49408"),
        ({"loss.name": "siglip"}, r"needs a learned logit bias"),
        ({"model.init_from": "missing.safetensors"}, r"init_from='missing\.safetensors' does not exist"),
    ],
)
def test_a_config_that_does_not_fit_the_checkpoint_is_named_at_build(
    load_config, shapes_data_dir, clip_merges, tiny_open_clip, fields, message
):
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    base = {
        "model.init_from": tiny_open_clip,
        "model.embed_dim": 32,
        "data.name": "shapes",
        "data.data_dir": shapes_data_dir,
        "data.tokenizer": clip_merges,
        "data.image_size": 64,
        "train.global_batch_size": 32,
        "train.micro_batch_size": 16,
    }
    config = override(load_config("finetune_clip"), base | fields)
    with pytest.raises(ConfigError, match=message):
        run_plan.build(config)


@pytest.mark.e2e
def test_a_released_siglip_fine_tunes_from_its_temperature_and_bias(load_config, shapes_data_dir, tmp_path):
    """A random-weight SigLIP written in big_vision's layout (with t = log 5, b = -7) is
    fine-tuned through `configs/finetune_siglip.py` with its SentencePiece tokenization:
    the sigmoid loss starts from the checkpoint's temperature and bias, not the config's."""
    from flax import traverse_util

    from contrastive_jax import trained
    from contrastive_jax.config_lib import override
    from contrastive_jax.data import tokenizers
    from contrastive_jax.models.released import big_vision_layout
    from contrastive_jax.training import run_plan
    from tests.data.test_tokenizers import train_sentencepiece

    sentencepiece = train_sentencepiece(tmp_path, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    vocab_size = tokenizers.load(f"siglip:{sentencepiece}").vocab_size
    tower = TowerSettings(width=64, depth=1, num_heads=1, mlp_dim=128)
    settings = big_vision_layout.Settings(
        image_size=64, patch_size=16, image=tower, context_length=16, vocab_size=vocab_size, text=tower, embed_dim=64
    )
    model = big_vision_layout.Model(settings)
    params = model.init(jax.random.key(0), jnp.zeros((1, 64, 64, 3)), jnp.ones((1, 16), jnp.int32))["params"]
    arrays = traverse_util.flatten_dict(jax.device_get(params), sep="/")
    arrays["t"], arrays["b"] = np.full(1, np.log(5.0)), np.full(1, -7.0)
    del arrays["log_inv_temperature"], arrays["logit_bias"]
    checkpoint = tmp_path / "siglip.npz"
    np.savez(checkpoint, **{f"params/{name}": np.asarray(array) for name, array in arrays.items()})
    fields = {
        "model.init_from": str(checkpoint),
        "model.embed_dim": 64,
        "data.name": "shapes",
        "data.data_dir": shapes_data_dir,
        "data.tokenizer": f"siglip:{sentencepiece}",
        "data.text_max_length": 16,
        "data.image_size": 64,
        "data.num_workers": 0,
        "train.global_batch_size": 32,
        "train.micro_batch_size": 16,
        "train.num_train_steps": 2,
        "optim.warmup_steps": 1,
        "eval.every_steps": 0,
        "checkpoint.every_steps": 2,
    }
    workdir = str(tmp_path / "run")
    run_plan.train_and_evaluate(override(load_config("finetune_siglip"), fields), workdir)
    params = trained.load(workdir).variables["params"]
    assert float(params["logit_bias"]) == pytest.approx(-7.0, abs=0.01)  # the checkpoint's, moved a little
    assert float(params["log_inv_temperature"]) == pytest.approx(np.log(5.0), abs=0.01)
    assert float(params["logit_bias"]) != -7.0
