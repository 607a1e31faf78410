"""Released checkpoint files as a person meets them: a damaged file is one line naming it
(from `released.load` and from the command line, exit status 2), arrays of two models
fail at load, and open_clip's QuickGELU is taken from the checkpoint where open_clip says
it (real files written here: safetensors, torch pickles, big_vision `.npz`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from contrastive_jax.errors import ConfigError
from contrastive_jax.models import released

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VISION = {"layers": 1, "width": 128, "patch_size": 8, "image_size": 16}  # 64-wide heads, as released
TEXT = {"context_length": 8, "vocab_size": 50, "width": 128, "heads": 2, "layers": 1}


def _open_clip_model(quick_gelu=False, embed_dim=24, patch_size=8):
    """A random-weight open_clip CLIP (open_clip 3.3.0), tiny."""
    torch = pytest.importorskip("torch")
    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(0)
    vision = VISION | {"patch_size": patch_size}
    return open_clip.model.CLIP(embed_dim=embed_dim, vision_cfg=vision, text_cfg=TEXT, quick_gelu=quick_gelu).eval()


def _save_safetensors(state: dict, path) -> str:
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in state.items()}, str(path))
    return str(path)


def _truncated(path: str) -> str:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return path


@pytest.fixture
def damaged(tmp_path, request):
    """A checkpoint file of each format cut in half, or ("mixed") whole but holding two
    models' arrays (another model's `visual.proj`): its path."""
    kind = request.param
    if kind == "mixed":
        state = _open_clip_model().state_dict()
        state["visual.proj"] = _open_clip_model(embed_dim=32).state_dict()["visual.proj"]  # another embedding width
        return _save_safetensors(state, tmp_path / "mixed.safetensors")
    if kind == "npz":
        np.savez(tmp_path / "siglip.npz", **{"img/embedding/kernel": np.ones((4, 4, 3, 8), np.float32)})
        return _truncated(str(tmp_path / "siglip.npz"))
    state = _open_clip_model().state_dict()
    if kind == "safetensors":
        return _truncated(_save_safetensors(state, tmp_path / "open_clip_model.safetensors"))
    torch = pytest.importorskip("torch")
    torch.save(state, tmp_path / "open_clip_pytorch_model.bin")
    return _truncated(str(tmp_path / "open_clip_pytorch_model.bin"))


@pytest.mark.parametrize("damaged", ["safetensors", "bin", "npz"], indirect=True)
def test_a_truncated_checkpoint_is_one_line_naming_it(damaged):
    released.load.cache_clear()
    with pytest.raises(ConfigError) as error:
        released.load(damaged)
    message = str(error.value)
    assert message.startswith(f"{damaged} cannot be read (") and "download it again" in message
    assert "\n" not in message


@pytest.mark.e2e
@pytest.mark.parametrize("damaged", ["safetensors", "bin", "npz", "mixed"], indirect=True)
def test_the_fine_tune_command_says_it_in_one_line_with_exit_2(damaged, clip_merges, tmp_path):
    from contrastive_jax import write_records

    write_records.write("builtin:shapes", str(tmp_path / "pairs"), num_examples=40, image_size=16)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "contrastive_jax.main",
            "--config=configs/finetune_clip.py",
            f"--workdir={tmp_path / 'run'}",
            f"--config.model.init_from={damaged}",
            f"--config.data.records={tmp_path / 'pairs'}",
            f"--config.data.tokenizer={clip_merges}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    if damaged.endswith("mixed.safetensors"):
        assert line.startswith(f"error: {damaged}: the parameter img/head/kernel has shape (128, 32); ")
    else:
        assert line.startswith(f"error: {damaged} cannot be read (") and line.endswith("; download it again.")


@pytest.mark.parametrize("damaged", ["mixed"], indirect=True)
def test_arrays_of_two_models_fail_at_load_naming_the_file_and_the_array(damaged):
    path = damaged
    released.load.cache_clear()
    with pytest.raises(
        ConfigError, match=rf"^{path}: the parameter img/head/kernel has shape \(128, 32\); .* need \(128, 24\)"
    ):
        released.load(path)


def test_the_open_clip_layout_checks_shapes_against_the_settings():
    """A ViT-B/16's arrays in ViT-B/32 settings (here patches of 8 and 16 pixels) fail in
    `params_from`, naming the parameter, not at the first `apply`."""
    from contrastive_jax.models.released import open_clip_layout

    def arrays(patch_size):
        return {name: t.numpy() for name, t in _open_clip_model(patch_size=patch_size).state_dict().items()}

    settings = open_clip_layout.settings_from(arrays(16))
    with pytest.raises(
        ValueError, match=r"^the parameter img/embedding/kernel has shape \(8, 8, 3, 128\); .* \(16, 16, 3, 128\)"
    ):
        open_clip_layout.params_from(arrays(8), settings)


def _embeddings(model, variables):
    rng = np.random.default_rng(0)
    images = rng.random((2, 16, 16, 3), dtype=np.float32)
    tokens = np.array([[3, 7, 49, 0, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11, 49]], np.int32)
    return images, tokens, model.apply(variables, images, tokens)


def _open_clip_embeddings(reference, images, tokens):
    """open_clip's normalised embeddings of `_embeddings`' images and tokens."""
    import torch

    from contrastive_jax.models.released import open_clip_layout

    mean, std = np.array(open_clip_layout.OPENAI_MEAN), np.array(open_clip_layout.OPENAI_STD)
    with torch.no_grad():
        pixels = torch.from_numpy(((images - mean) / std).transpose(0, 3, 1, 2).astype(np.float32))
        want_a = reference.encode_image(pixels, normalize=True).numpy()
        want_b = reference.encode_text(torch.from_numpy(tokens.astype(np.int64)), normalize=True).numpy()
    return want_a, want_b


@pytest.mark.parametrize("where", ["config", "hf_cache_name", "quickgelu_name", "forced"])
def test_quick_gelu_is_taken_from_the_checkpoint_where_open_clip_says_it(tmp_path, where):
    reference = _open_clip_model(quick_gelu=True)
    folder = {
        "config": tmp_path,
        "hf_cache_name": tmp_path / "models--timm--vit_base_patch32_clip_224.openai" / "snapshots" / "abc",
        "quickgelu_name": tmp_path / "ViT-B-32-quickgelu",
        "forced": tmp_path,
    }[where]
    folder.mkdir(parents=True, exist_ok=True)
    path = _save_safetensors(reference.state_dict(), folder / "open_clip_model.safetensors")
    if where == "config":
        (folder / released.OPEN_CLIP_CONFIG).write_text(json.dumps({"model_cfg": {"quick_gelu": True}}))
    released.load.cache_clear()
    loaded = released.load(path, quick_gelu=where == "forced")
    assert loaded.settings.activation == "quick_gelu"
    images, tokens, out = _embeddings(loaded.model, {"params": loaded.params})
    want_a, want_b = _open_clip_embeddings(reference, images, tokens)
    np.testing.assert_allclose(out["za"], want_a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["zb"], want_b, rtol=1e-4, atol=1e-5)


def test_a_plain_checkpoint_and_a_config_without_quick_gelu_are_gelu(tmp_path):
    path = _save_safetensors(_open_clip_model().state_dict(), tmp_path / "open_clip_model.safetensors")
    released.load.cache_clear()
    assert released.load(path).settings.activation == "gelu"
    (tmp_path / released.OPEN_CLIP_CONFIG).write_text(json.dumps({"model_cfg": {"quick_gelu": False}}))
    assert not released.quick_gelu_from(path)
    (tmp_path / released.OPEN_CLIP_CONFIG).write_text("{not json")
    with pytest.raises(ConfigError, match="is not open_clip's JSON config"):
        released.quick_gelu_from(path)


def test_a_changed_open_clip_model_written_back_loads_into_open_clip_with_equal_embeddings(tmp_path):
    """Weights out: the loaded towers' parameters, moved as fine-tuning moves them, are
    written as open_clip's state_dict; open_clip 3.3.0 loads them (strict) and embeds as
    the Flax towers do."""
    import jax

    reference = _open_clip_model(embed_dim=24)  # skips without torch and open_clip
    from safetensors.torch import load_file

    loaded = released.load(_save_safetensors(_open_clip_model().state_dict(), tmp_path / "in.safetensors"))
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda p: p + 0.05 * rng.standard_normal(p.shape).astype(np.float32), loaded.params)
    released.save(str(tmp_path / "out.safetensors"), loaded.model, params)
    reference.load_state_dict(load_file(str(tmp_path / "out.safetensors")), strict=True)
    images, tokens, out = _embeddings(loaded.model, {"params": params})
    want_a, want_b = _open_clip_embeddings(reference, images, tokens)
    np.testing.assert_allclose(out["za"], want_a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["zb"], want_b, rtol=1e-4, atol=1e-5)
    assert 1 / float(out["temperature"]) == pytest.approx(reference.logit_scale.exp().item(), rel=1e-6)
    assert json.loads((tmp_path / released.OPEN_CLIP_CONFIG).read_text()) == {"model_cfg": {"quick_gelu": False}}
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / released.OPEN_CLIP_CONFIG).write_text(json.dumps({"preprocess_cfg": {"mean": [0.5]}}))
    quick = released.load(str(tmp_path / "in.safetensors"), quick_gelu=True)
    released.save(str(tmp_path / "quick" / "out.safetensors"), quick.model, quick.params)  # the activation kept
    assert released.load(str(tmp_path / "quick" / "out.safetensors")).settings.activation == "quick_gelu"
    assert json.loads((tmp_path / "quick" / released.OPEN_CLIP_CONFIG).read_text())["preprocess_cfg"] == {"mean": [0.5]}
    with pytest.raises(ConfigError, match=r"out\.bin: open_clip's layout is written as \.safetensors"):
        released.save(str(tmp_path / "out.bin"), loaded.model, params)


@pytest.mark.slow
def test_a_big_vision_model_written_back_reads_as_it_was(tmp_path):
    import jax
    import jax.numpy as jnp

    from contrastive_jax.models.released import big_vision_layout
    from contrastive_jax.models.transformer import TowerSettings

    tower = TowerSettings(width=32, depth=2, num_heads=2, mlp_dim=64)
    settings = big_vision_layout.Settings(
        image_size=16, patch_size=8, image=tower, context_length=6, vocab_size=40, text=tower, embed_dim=32
    )
    model = big_vision_layout.Model(settings)
    params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), jnp.zeros((1, 6), jnp.int32))["params"]
    path = str(tmp_path / "siglip.npz")
    released.save(path, model, params)
    with np.load(path) as npz:
        assert "params/t" in npz.files and npz["params/b"].shape == (1,)
        assert "params/img/MAPHead_0/probe" in npz.files and "params/txt/head/kernel" in npz.files
    loaded = released.load(path)
    assert loaded.settings == settings
    jax.tree.map(np.testing.assert_array_equal, loaded.params, jax.tree.map(np.asarray, params))
