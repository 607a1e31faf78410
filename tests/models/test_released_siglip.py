"""big_vision's SigLIP layout loads into the released towers: a random-weight Hugging Face
`SiglipModel` (torch on the CPU), written as a big_vision `.npz` by the inverse of
Hugging Face's `convert_siglip_to_hf.py` name mapping, embeds images and texts as it does."""

import re

import numpy as np
import pytest

from contrastive_jax.models import released
from contrastive_jax.models.released import big_vision_layout as layout
from contrastive_jax.models.transformer import TowerSettings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 32,
    "patch_size": 8,
}
# A text width unlike the image's, so that the head's two axes differ.
TEXT = {
    "vocab_size": 100,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 16,
    "projection_size": 32,
    "pad_token_id": 1,
    "bos_token_id": None,
    "eos_token_id": 1,  # SigLIP's
}


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    config = transformers.SiglipConfig(text_config=TEXT, vision_config=VISION)
    model = transformers.SiglipModel(config)
    with torch.no_grad():  # zero biases and unit LayerNorms would not test their mapping
        for name, tensor in model.named_parameters():
            if name.endswith("bias") or "norm" in name or name.startswith("logit"):
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model.eval()


# The inverse of Hugging Face's `convert_siglip_to_hf.py` name mapping: each helper pops a
# `SiglipModel` state dict's arrays (`state`) and writes them under big_vision's names (`out`).


def _dense(state, out, source, target):
    """A torch Linear's weight [out, in] -> a Dense kernel [in, out]."""
    out[f"{target}/kernel"] = state.pop(f"{source}.weight").T
    out[f"{target}/bias"] = state.pop(f"{source}.bias")


def _norm(state, out, source, target):
    out[f"{target}/scale"] = state.pop(f"{source}.weight")
    out[f"{target}/bias"] = state.pop(f"{source}.bias")


def _attention(out, weights, biases, target, num_heads):
    """`weights` {q, k, v, out: [W, W] torch Linear weights}, `biases` {...: [W]} -> Flax's
    q/k/v kernels `[W, heads, head_dim]`, biases `[heads, head_dim]`, out `[heads, head_dim, W]`."""
    width = weights["out"].shape[0]
    shape = (width, num_heads, width // num_heads)
    for short, name in (("q", "query"), ("k", "key"), ("v", "value")):
        out[f"{target}/{name}/kernel"] = weights[short].T.reshape(shape)
        out[f"{target}/{name}/bias"] = biases[short].reshape(shape[1:])
    out[f"{target}/out/kernel"] = weights["out"].T.reshape(shape[1], shape[2], width)
    out[f"{target}/out/bias"] = biases["out"]


def _encoder(state, out, source, target, num_heads, final_norm):
    """`<source>.layers.<i>.*` -> `<target>/encoderblock_<i>/*`; `final_norm` -> `encoder_norm`."""
    layers = {int(m.group(1)) for name in state if (m := re.match(rf"{source}\.layers\.(\d+)\.", name))}
    for index in sorted(layers):
        src, dst = f"{source}.layers.{index}", f"{target}/encoderblock_{index}"
        _norm(state, out, f"{src}.layer_norm1", f"{dst}/LayerNorm_0")
        _norm(state, out, f"{src}.layer_norm2", f"{dst}/LayerNorm_1")
        _dense(state, out, f"{src}.mlp.fc1", f"{dst}/MlpBlock_0/Dense_0")
        _dense(state, out, f"{src}.mlp.fc2", f"{dst}/MlpBlock_0/Dense_1")
        weights = {k: state.pop(f"{src}.self_attn.{k}_proj.weight") for k in ("q", "k", "v", "out")}
        biases = {k: state.pop(f"{src}.self_attn.{k}_proj.bias") for k in ("q", "k", "v", "out")}
        _attention(out, weights, biases, f"{dst}/MultiHeadDotProductAttention_0", num_heads)
    _norm(state, out, final_norm, f"{target}/encoder_norm")


def _image_arrays(state, out):
    """`vision_model.*` -> `img/*`: the patch Conv's OIHW -> HWIO, the position embedding
    [N, W] -> [1, N, W], the attention-pooling head's packed `in_proj` split into q, k, v."""
    v, heads = "vision_model", VISION["num_attention_heads"]
    out["img/embedding/kernel"] = state.pop(f"{v}.embeddings.patch_embedding.weight").transpose(2, 3, 1, 0)
    out["img/embedding/bias"] = state.pop(f"{v}.embeddings.patch_embedding.bias")
    out["img/pos_embedding"] = state.pop(f"{v}.embeddings.position_embedding.weight")[None]
    _encoder(state, out, f"{v}.encoder", "img/Transformer", heads, f"{v}.post_layernorm")
    out["img/MAPHead_0/probe"] = state.pop(f"{v}.head.probe")
    _norm(state, out, f"{v}.head.layernorm", "img/MAPHead_0/LayerNorm_0")
    _dense(state, out, f"{v}.head.mlp.fc1", "img/MAPHead_0/MlpBlock_0/Dense_0")
    _dense(state, out, f"{v}.head.mlp.fc2", "img/MAPHead_0/MlpBlock_0/Dense_1")
    packed_w, packed_b = state.pop(f"{v}.head.attention.in_proj_weight"), state.pop(f"{v}.head.attention.in_proj_bias")
    weights = dict(zip("qkv", np.split(packed_w, 3)), out=state.pop(f"{v}.head.attention.out_proj.weight"))
    biases = dict(zip("qkv", np.split(packed_b, 3)), out=state.pop(f"{v}.head.attention.out_proj.bias"))
    _attention(out, weights, biases, "img/MAPHead_0/MultiHeadDotProductAttention_0", heads)


def _big_vision_arrays(model) -> dict[str, np.ndarray]:
    """A `SiglipModel`'s weights under big_vision's names (`read`'s, less `params/`)."""
    state = {name: t.detach().numpy().astype(np.float32) for name, t in model.state_dict().items()}
    out = {}
    _image_arrays(state, out)
    t = "text_model"
    out["txt/Embed_0/embedding"] = state.pop(f"{t}.embeddings.token_embedding.weight")
    out["txt/pos_embedding"] = state.pop(f"{t}.embeddings.position_embedding.weight")[None]
    _encoder(state, out, f"{t}.encoder", "txt/Encoder_0", TEXT["num_attention_heads"], f"{t}.final_layer_norm")
    _dense(state, out, f"{t}.head", "txt/head")
    out["t"], out["b"] = state.pop("logit_scale"), state.pop("logit_bias")
    assert not [name for name in state if not name.endswith("position_ids")], sorted(state)
    return out


@pytest.fixture(scope="module")
def arrays(reference):
    return _big_vision_arrays(reference)


def _inputs():
    rng = np.random.default_rng(0)
    images = rng.random((3, 32, 32, 3), dtype=np.float32)
    tokens = rng.integers(0, TEXT["vocab_size"], (3, TEXT["max_position_embeddings"]))  # full length: no padding
    return images, tokens


def _normalized(features):
    features = getattr(features, "pooler_output", features).numpy()
    return features / np.linalg.norm(features, axis=-1, keepdims=True)


def _reference_embeddings(model, images, tokens):
    pixels = torch.from_numpy((images * 2 - 1).transpose(0, 3, 1, 2))
    with torch.no_grad():
        za = _normalized(model.get_image_features(pixel_values=pixels))
        zb = _normalized(model.get_text_features(input_ids=torch.from_numpy(tokens)))
    return za, zb


def _save(tmp_path, arrays, prefix="params/"):
    path = tmp_path / "siglip.npz"
    np.savez(path, **{f"{prefix}{name}": array for name, array in arrays.items()})
    return str(path)


def _load(path):
    arrays = layout.read(path)
    settings = layout.settings_from(arrays)
    return layout.Model(settings), {"params": layout.params_from(arrays, settings)}


def test_embeddings_equal_hugging_faces(tmp_path, reference, arrays):
    path = _save(tmp_path, arrays)
    model, variables = _load(path)
    assert released.load(path).settings == model.settings  # the package's entry point picks this layout
    images, tokens = _inputs()
    out = model.apply(variables, images, tokens.astype(np.int32))
    want_a, want_b = _reference_embeddings(reference, images, tokens)
    assert out["za"].dtype == out["zb"].dtype == np.float32
    np.testing.assert_allclose(out["za"], want_a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["zb"], want_b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(1 / out["temperature"], reference.logit_scale.exp().item(), rtol=1e-6)
    np.testing.assert_allclose(out["bias"], reference.logit_bias.item(), rtol=1e-6)
    assert out["temperature"].shape == out["bias"].shape == ()
    pixels = np.round(images * 255)
    uint8 = model.apply(variables, pixels.astype(np.uint8), "a", method=model.embed)
    np.testing.assert_allclose(uint8, model.apply(variables, pixels / 255, "a", method=model.embed), atol=1e-6)


def _flat(params):
    from flax import traverse_util

    return traverse_util.flatten_dict(params, sep="/")


def test_scan_stacked_arrays_load_to_the_same_params(tmp_path, arrays):
    stacked, blocks = {}, {}
    for name, array in arrays.items():
        if m := re.match(r"(.*)/encoderblock_(\d+)/(.*)", name):
            blocks.setdefault(f"{m.group(1)}/encoderblock/{m.group(3)}", {})[int(m.group(2))] = array
        else:
            stacked[name] = array
    for name, by_index in blocks.items():
        stacked[name] = np.stack([by_index[index] for index in range(len(by_index))])
    assert stacked["img/Transformer/encoderblock/LayerNorm_0/scale"].shape == (2, 32)
    read = layout.read(_save(tmp_path, stacked, prefix=""))  # and without the `params/` prefix
    settings = layout.settings_from(read)
    assert settings == layout.settings_from(arrays)
    got, want = _flat(layout.params_from(read, settings)), _flat(layout.params_from(arrays, settings))
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_doubled_text_position_embedding_is_summed(tmp_path, arrays):
    doubled = dict(arrays)
    extra = np.random.default_rng(1).normal(size=arrays["txt/pos_embedding"].shape).astype(np.float32)
    doubled["txt/pos_embedding"] = arrays["txt/pos_embedding"] - extra
    doubled["txt/Encoder_0/pos_embedding"] = extra
    read = layout.read(_save(tmp_path, doubled))
    assert "txt/Encoder_0/pos_embedding" not in read
    np.testing.assert_allclose(read["txt/pos_embedding"], arrays["txt/pos_embedding"], atol=1e-6)


def test_settings_are_inferred_from_the_arrays(arrays):
    assert layout.settings_from(arrays) == layout.Settings(
        image_size=32,
        patch_size=8,
        image=TowerSettings(width=32, depth=2, num_heads=4, mlp_dim=64),
        context_length=16,
        vocab_size=100,
        text=TowerSettings(width=48, depth=2, num_heads=4, mlp_dim=80),
        embed_dim=32,
        pool_type="map",
        image_head=False,
        text_head=True,
        logit_bias=True,
    )


def test_an_image_head_projects_the_pooled_features(tmp_path, reference, arrays):
    rng = np.random.default_rng(2)
    with_head = dict(arrays)
    with_head["img/head/kernel"] = rng.normal(size=(32, 32)).astype(np.float32) / 6
    with_head["img/head/bias"] = rng.normal(size=32).astype(np.float32) / 10
    model, variables = _load(_save(tmp_path, with_head))
    assert model.settings.image_head
    images, _ = _inputs()
    with torch.no_grad():
        pooled = reference.get_image_features(pixel_values=torch.from_numpy((images * 2 - 1).transpose(0, 3, 1, 2)))
    want = getattr(pooled, "pooler_output", pooled).numpy() @ with_head["img/head/kernel"] + with_head["img/head/bias"]
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    np.testing.assert_allclose(model.apply(variables, images, "a", method=model.embed), want, rtol=1e-4, atol=1e-5)


def test_a_missing_array_is_named(arrays):
    settings = layout.settings_from(arrays)
    missing = {k: v for k, v in arrays.items() if k != "txt/Encoder_0/encoderblock_1/MlpBlock_0/Dense_1/bias"}
    with pytest.raises(ValueError, match=r"txt/Encoder_0/encoderblock_1/MlpBlock_0/Dense_1/bias is not in"):
        layout.params_from(missing, settings)
    with pytest.raises(ValueError, match=r"^t is not in"):
        layout.params_from({k: v for k, v in arrays.items() if k != "t"}, settings)


def test_an_array_with_no_place_or_another_shape_is_named(arrays):
    settings = layout.settings_from(arrays)
    extra = {**arrays, "img/Transformer/encoderblock_0/ls_1": np.ones(32, np.float32)}
    with pytest.raises(ValueError, match=r"img/Transformer/encoderblock_0/ls_1 \(and 0 more\) have no place"):
        layout.params_from(extra, settings)
    reshaped = {**arrays, "txt/head/bias": np.zeros(31, np.float32)}
    with pytest.raises(ValueError, match=r"txt/head/bias has shape \(31,\)"):
        layout.params_from(reshaped, settings)
