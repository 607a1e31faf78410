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

from contrastive_jax import released
from contrastive_jax.config_lib import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """A checkpoint file of each format, cut in half: its path."""
    kind = request.param
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
@pytest.mark.parametrize("damaged", ["safetensors", "bin", "npz"], indirect=True)
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
    assert line.startswith(f"error: {damaged} cannot be read (") and line.endswith("; download it again.")


def test_arrays_of_two_models_fail_at_load_naming_the_file_and_the_array(tmp_path):
    state = _open_clip_model().state_dict()
    state["visual.proj"] = _open_clip_model(embed_dim=32).state_dict()["visual.proj"]  # another embedding width
    path = _save_safetensors(state, tmp_path / "mixed.safetensors")
    released.load.cache_clear()
    with pytest.raises(
        ConfigError, match=rf"^{path}: the parameter img/head/kernel has shape \(128, 32\); .* need \(128, 24\)"
    ):
        released.load(path)


def test_the_open_clip_layout_checks_shapes_against_the_settings():
    """A ViT-B/16's arrays in ViT-B/32 settings (here patches of 8 and 16 pixels) fail in
    `params_from`, naming the parameter, not at the first `apply`."""
    from contrastive_jax.released import open_clip_layout

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


@pytest.mark.parametrize("where", ["config", "hf_cache_name", "quickgelu_name", "forced"])
def test_quick_gelu_is_taken_from_the_checkpoint_where_open_clip_says_it(tmp_path, where):
    torch = pytest.importorskip("torch")
    from contrastive_jax.released import open_clip_layout

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
    mean, std = np.array(open_clip_layout.OPENAI_MEAN), np.array(open_clip_layout.OPENAI_STD)
    with torch.no_grad():
        pixels = torch.from_numpy(((images - mean) / std).transpose(0, 3, 1, 2).astype(np.float32))
        want_a = reference.encode_image(pixels, normalize=True).numpy()
        want_b = reference.encode_text(torch.from_numpy(tokens.astype(np.int64)), normalize=True).numpy()
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
