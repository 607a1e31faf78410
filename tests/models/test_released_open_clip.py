"""open_clip's CLIP layout loads into the released towers: a random-weight open_clip
model (open_clip 3.3.0, torch on the CPU), saved as its `state_dict`, embeds images and
texts as open_clip does."""

import numpy as np
import pytest

from contrastive_jax.models.released import open_clip_layout
from contrastive_jax.models.transformer import TowerSettings

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")

VISION = {"layers": 2, "width": 64, "patch_size": 8, "image_size": 32, "head_width": 32}
TEXT = {"context_length": 16, "vocab_size": 100, "width": 96, "heads": 3, "layers": 3}  # head width 32, as VISION


def _reference(quick_gelu: bool, logit_bias: float | None = None):
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=24, vision_cfg=VISION, text_cfg=TEXT, quick_gelu=quick_gelu, init_logit_bias=logit_bias
    )
    with torch.no_grad():  # open_clip zero-initialises some biases: random ones test their mapping
        for name, tensor in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model.eval()


def _inputs():
    rng = np.random.default_rng(0)
    images = rng.random((3, 32, 32, 3), dtype=np.float32)
    tokens = np.zeros((3, 16), np.int64)
    for row, length in enumerate((16, 5, 9)):  # ends with the largest id, as CLIP's end-of-text
        tokens[row, :length] = rng.integers(1, 98, length)
        tokens[row, length - 1] = 99
    return images, tokens


def _reference_embeddings(model, images, tokens):
    mean, std = np.array(open_clip_layout.OPENAI_MEAN), np.array(open_clip_layout.OPENAI_STD)
    pixels = torch.from_numpy(((images - mean) / std).transpose(0, 3, 1, 2).astype(np.float32))
    with torch.no_grad():
        za = model.encode_image(pixels, normalize=True).numpy()
        zb = model.encode_text(torch.from_numpy(tokens), normalize=True).numpy()
    return za, zb


def _load(path, **options):
    arrays = open_clip_layout.read(str(path))
    settings = open_clip_layout.settings_from(arrays, **options)
    return open_clip_layout.Model(settings), {"params": open_clip_layout.params_from(arrays, settings)}


@pytest.mark.slow
@pytest.mark.parametrize("quick_gelu", [True, False], ids=["quick_gelu", "gelu"])
def test_embeddings_equal_open_clips(tmp_path, quick_gelu):
    reference = _reference(quick_gelu)
    torch.save(reference.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    model, variables = _load(
        tmp_path / "open_clip_pytorch_model.bin", head_width=32, activation="quick_gelu" if quick_gelu else "gelu"
    )
    images, tokens = _inputs()
    out = model.apply(variables, images, tokens.astype(np.int32))
    want_a, want_b = _reference_embeddings(reference, images, tokens)
    np.testing.assert_allclose(out["za"], want_a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["zb"], want_b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(1 / out["temperature"], reference.logit_scale.exp().item(), rtol=1e-6)
    uint8 = model.apply(variables, (images * 255).round().astype(np.uint8), method=model.embed, side="a")
    np.testing.assert_allclose(
        uint8, model.apply(variables, np.round(images * 255) / 255, "a", method=model.embed), atol=1e-6
    )


def test_safetensors_with_a_logit_bias(tmp_path):
    from safetensors.torch import save_file

    reference = _reference(quick_gelu=False, logit_bias=-10.0)
    save_file({name: t.contiguous() for name, t in reference.state_dict().items()}, tmp_path / "model.safetensors")
    model, variables = _load(tmp_path / "model.safetensors", head_width=32)
    images, tokens = _inputs()
    out = model.apply(variables, images, tokens.astype(np.int32))
    np.testing.assert_allclose(out["zb"], _reference_embeddings(reference, images, tokens)[1], rtol=1e-4, atol=1e-5)
    assert float(out["bias"]) == pytest.approx(reference.logit_bias.item())


def test_settings_are_inferred_from_the_arrays():
    arrays = {name: t.numpy() for name, t in _reference(quick_gelu=True).state_dict().items()}
    settings = open_clip_layout.settings_from(arrays, head_width=32, activation="quick_gelu")
    assert settings == open_clip_layout.Settings(
        image_size=32,
        patch_size=8,
        image=TowerSettings(width=64, depth=2, num_heads=2, mlp_dim=256),
        context_length=16,
        vocab_size=100,
        text=TowerSettings(width=96, depth=3, num_heads=3, mlp_dim=384),
        embed_dim=24,
        activation="quick_gelu",
    )


def test_an_array_with_no_place_is_named():
    arrays = {name: t.numpy() for name, t in _reference(quick_gelu=False).state_dict().items()}
    arrays["visual.transformer.resblocks.0.ls_1.gamma"] = np.ones(64, np.float32)
    settings = open_clip_layout.settings_from(arrays, head_width=32)
    with pytest.raises(ValueError, match=r"visual\.transformer\.resblocks\.0\.ls_1\.gamma"):
        open_clip_layout.params_from(arrays, settings)
