"""CoCa (`models.coca`): open_clip 3.3.0's CoCa, a random-weight tiny one saved as its
`state_dict`, loads here and gives open_clip's embeddings and caption logits; the
caption loss's parts equal a float64 reference; the decoder is causal; a checkpoint
without its decoder is refused in one line."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.models import coca, encoders, released, two_tower
from contrastive_jax.models.released import open_clip_layout
from contrastive_jax.models.transformer import TowerSettings

pytestmark = pytest.mark.usefixtures("two_block_vit_tiny")  # vit_tiny at 2 blocks: the steps compare per block

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")

VOCAB, CONTEXT = 64, 12
SOT, EOT = VOCAB - 2, VOCAB - 1  # as CLIP's BPE puts them, the vocabulary's last two


def open_clip_coca(vision_width: int = 96, correct_cls_mask: bool = False):
    """A tiny open_clip CoCa: head width 32 in every tower (the loader's `head_width`),
    the image tokens' width (`embed_dim`) the decoder's, as open_clip needs; attention
    pooling with 2 heads over 96-wide (separate q/k/v weights) or 64-wide (packed) tokens;
    the text tower's padding mask open_clip's legacy one or, `correct_cls_mask`, its fix."""
    torch.manual_seed(0)
    text = {"context_length": CONTEXT, "vocab_size": VOCAB, "width": 64, "heads": 2, "layers": 2}
    model = open_clip.coca_model.CoCa(
        embed_dim=64,
        multimodal_cfg={**text, "layers": 2},
        text_cfg={**text, "embed_cls": True, "output_tokens": True},
        vision_cfg={
            "image_size": 32,
            "layers": 2,
            "width": vision_width,
            "patch_size": 8,
            "head_width": 32,
            "attentional_pool": True,
            "attn_pooler_heads": 2,
            "attn_pooler_queries": 9,
            "output_tokens": True,
        },
    )
    model.text.correct_cls_mask = correct_cls_mask  # the tower's option, which CLIPTextCfg does not pass on
    with torch.no_grad():  # open_clip zero-initialises some biases: random ones test their mapping
        # (and leaves the decoder's projection as torch.empty made it: garbage, NaN at times)
        model.text_decoder.text_projection.normal_(std=64**-0.5)
        for name, tensor in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model.eval()


def inputs():
    rng = np.random.default_rng(0)
    images = rng.random((3, 32, 32, 3), dtype=np.float32)
    tokens = np.zeros((3, CONTEXT), np.int64)
    for row, length in enumerate((CONTEXT, 5, 9)):
        tokens[row, :length] = rng.integers(1, SOT, length)
        tokens[row, 0], tokens[row, length - 1] = SOT, EOT
    return images, tokens


def torch_pixels(images):
    mean, std = np.array(open_clip_layout.OPENAI_MEAN), np.array(open_clip_layout.OPENAI_STD)
    return torch.from_numpy(((images - mean) / std).transpose(0, 3, 1, 2).astype(np.float32))


def loaded(tmp_path, reference, **settings):
    """`(model, variables)` of open_clip's `reference` saved and loaded here (`settings`
    replaced: what the arrays do not say)."""
    path = tmp_path / "open_clip_model.safetensors"
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in reference.state_dict().items()}, path)
    arrays = open_clip_layout.read(str(path))
    found = dataclasses.replace(open_clip_layout.settings_from(arrays, head_width=32, pooler_heads=2), **settings)
    return open_clip_layout.model_for(found), {"params": open_clip_layout.params_from(arrays, found)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "vision_width, correct_cls_mask", [(96, False), (64, True)], ids=["pooler_kv_apart", "pooler_packed_mask_fixed"]
)
def test_embeddings_and_caption_logits_equal_open_clips(tmp_path, vision_width, correct_cls_mask):
    reference = open_clip_coca(vision_width, correct_cls_mask)
    model, variables = loaded(tmp_path, reference, correct_cls_mask=correct_cls_mask)
    assert isinstance(model, coca.CoCa) and model.settings.decoder.depth == 2
    images, tokens = inputs()
    out = model.apply(variables, images, tokens.astype(np.int32))
    logits = model.apply(variables, images, tokens.astype(np.int32), method="caption_logits")
    with torch.no_grad():
        want = reference(torch_pixels(images), torch.from_numpy(tokens))
    np.testing.assert_allclose(out["za"], want["image_features"].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["zb"], want["text_features"].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits, want["logits"].numpy(), rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(logits))
    np.testing.assert_allclose(1 / out["temperature"], want["logit_scale"].item(), rtol=1e-6)
    # open_clip's CoCaLoss caption term: the mean over the predicted (non-padding) tokens
    caption = open_clip.loss.CoCaLoss(caption_loss_weight=1.0, clip_loss_weight=0.0)
    _, want_caption = caption(None, None, want["logits"], want["labels"], want["logit_scale"])
    got = np.sum(out["caption_nll"]) / np.sum(out["caption_tokens"])
    np.testing.assert_allclose(got, want_caption.item(), rtol=1e-5)
    np.testing.assert_array_equal(out["caption_tokens"], [CONTEXT - 1, 4, 8])


@pytest.mark.slow
def test_the_coca_config_trains_at_tiny_size_and_its_run_captions(load_config, request, tmp_path):
    """Two steps and the evaluation of `configs/coca_shapes.py` at the recipes' tiny size
    (`test_recipes.TINY`, a one-block decoder, 5 pooling queries), the caption term in
    its loss; the run, loaded from its checkpoint, captions pictures from a prompt, and
    its exported captioner gives the same ids."""
    from test_recipes import tiny

    from contrastive_jax import run_dir, trained
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import run_plan

    config = tiny(load_config, request, "coca_shapes", **{"model.decoder_depth": 1, "model.coca_queries": 5})
    workdir = str(tmp_path / "run")
    results = run_plan.train_and_evaluate(config, workdir)
    assert results and all(np.isfinite(v) for v in results.values())
    logged = [m for m in run_dir.read_metrics(workdir) if "train/loss" in m]
    assert [m["step"] for m in logged] == [1, 2] and all(np.isfinite(m["train/loss"]) for m in logged)
    assert all(m["train/caption_loss"] > 0 for m in logged)  # next-byte cross-entropy: ~log 257 at first
    run = trained.load(workdir)
    assert isinstance(run.model, coca.CoCa) and run.model.settings.decoder.depth == 1
    images = input_pipeline.eval_arrays(run_plan.data_settings(config), "test")["a"][:3]
    captions = run.caption(images, max_length=12, prompt="a ", method="beam", beam_size=2)
    assert captions.ids.shape == (3, 12) and all(text.startswith("a ") for text in captions.texts)
    exported = run.export_captioner(max_length=12, prompt="a ", method="beam", beam_size=2)
    ids, _ = exported.call(images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images)
    np.testing.assert_array_equal(ids, captions.ids)


def test_a_coca_checkpoint_without_its_decoder_is_refused_in_one_line(tmp_path):
    from safetensors.torch import save_file

    state = {n: t.contiguous() for n, t in open_clip_coca().state_dict().items() if not n.startswith("text_decoder.")}
    save_file(state, tmp_path / "coca_no_decoder.safetensors")
    with pytest.raises(ConfigError) as error:
        released.load(str(tmp_path / "coca_no_decoder.safetensors"))
    message = str(error.value)
    assert "\n" not in message and "coca_no_decoder.safetensors" in message
    assert "without its multimodal decoder (no text_decoder.*" in message and "give open_clip's whole CoCa" in message


def test_a_released_coca_is_described_and_rebuilt(tmp_path):
    model, _ = loaded(tmp_path, open_clip_coca())
    description = json.loads(json.dumps(released.describe(model)))
    assert description["layout"] == "open_clip_layout"
    rebuilt = released.rebuild(description)
    assert type(rebuilt) is open_clip_layout.CocaModel and rebuilt.settings == model.settings


def test_decoder_depth_builds_coca_of_a_vit_and_a_text_transformer_only():
    fields = {
        **{"encoder_a": "vit_tiny", "encoder_b": "text_transformer", "tie_towers": False, "mlp_hidden_dims": ()},
        **{"cnn_features": (), "encoder_dim": 32, "text_num_layers": 1, "patch_size": 8, "dropout_rate": 0.0},
        **{"projection_hidden_dims": (), "embed_dim": 16, "num_classes": 0, "compute_dtype": "float32"},
        **{"remat": "none", "attention": "auto", "temperature_init": 0.07, "learn_temperature": True},
        **{"bias_init": None, "decoder_depth": 2, "coca_queries": 5},
    }
    model = two_tower.create_model(two_tower.ModelSettings(**fields), text_vocab_size=257)
    assert isinstance(model, coca.CoCa) and model.settings.decoder == TowerSettings(32, 2, 1, 128)
    vit = encoders.ENCODERS["vit_tiny"](two_tower.ModelSettings(**fields), None, 257)  # ViT-Ti (2 blocks here)
    assert model.settings.image == TowerSettings(vit.width, vit.depth, vit.num_heads, vit.mlp_dim)
    assert vit.width == 192 and model.settings.num_queries == 5
    for wrong in ({"encoder_a": "cnn"}, {"encoder_b": "text_cnn"}, {"coca_queries": 1}, {"num_classes": 3}):
        with pytest.raises(ConfigError, match="config.model.decoder_depth=2 builds CoCa") as error:
            two_tower.create_model(two_tower.ModelSettings(**{**fields, **wrong}), text_vocab_size=257)
        assert "\n" not in str(error.value)


def test_a_decoder_block_is_one_block_for_layer_decay(tmp_path):
    """Its self- and cross-attention share block i's learning-rate factor (`encoderblock_<i>`)."""
    from contrastive_jax.training import optimizer

    _, variables = loaded(tmp_path, open_clip_coca())
    scales = optimizer.layer_decay_scales(variables["params"], 0.5)["dec"]
    for index, want in enumerate((0.25, 0.5)):  # depth 2: block i gets 0.5 ** (2 - i)
        block = jax.tree.leaves(scales[f"encoderblock_{index}"])
        assert set(block) == {want} and len(block) == 2 * 16 + 2  # two blocks of 16 arrays, the cross LayerNorm_kv
    assert set(jax.tree.leaves(scales["head"])) == {1.0}


@pytest.mark.slow
def test_a_released_coca_fine_tunes_and_its_run_captions(load_config, request, tmp_path):
    """`model.init_from` an open_clip CoCa (byte vocabulary, head width 64 as `load`
    takes it): two steps with the caption term, then the run, loaded from its checkpoint
    (rebuilt as `open_clip_layout.CocaModel`), captions."""
    from safetensors.torch import save_file
    from test_recipes import tiny

    from contrastive_jax import run_dir, trained
    from contrastive_jax.training import run_plan

    torch.manual_seed(0)
    text = {"context_length": 32, "vocab_size": 257, "width": 64, "heads": 1, "layers": 1}
    vision = {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8, "head_width": 64}
    reference = open_clip.coca_model.CoCa(
        embed_dim=64,
        multimodal_cfg=text,
        text_cfg={**text, "embed_cls": True, "output_tokens": True},
        vision_cfg={**vision, "attentional_pool": True, "attn_pooler_queries": 5, "output_tokens": True},
    )
    with torch.no_grad():
        reference.text_decoder.text_projection.normal_(std=64**-0.5)  # torch.empty otherwise
    path = tmp_path / "coca.safetensors"
    save_file({name: t.contiguous() for name, t in reference.state_dict().items()}, path)
    fields = {"model.init_from": str(path), "model.embed_dim": 64}
    config = tiny(load_config, request, "coca_shapes", **fields)
    workdir = str(tmp_path / "run")
    assert run_plan.train_and_evaluate(config, workdir)
    logged = [m for m in run_dir.read_metrics(workdir) if "train/caption_loss" in m]
    assert len(logged) == 2 and all(np.isfinite(m["train/caption_loss"]) for m in logged)
    run = trained.load(workdir)
    assert type(run.model) is open_clip_layout.CocaModel and run.model.settings.num_queries == 5
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    captions = run.caption(images, max_length=8, prompt="a")
    assert captions.ids.shape == (2, 8) and all(text.startswith("a") for text in captions.texts)
