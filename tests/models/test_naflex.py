"""SigLIP 2 NaFlex: a random-weight transformers `Siglip2Model` (torch on the CPU), saved with
`save_pretrained`, loads through `released.load` and embeds images of several aspect ratios
in one batch (each resized within the budget, its position embedding up- or down-sampled)
and texts as transformers does; the padding changes nothing; the way back loads in
transformers; what is not NaFlex, or over the budget, is one ConfigError line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from contrastive_jax.data import naflex_images as naflex_data
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import naflex, released
from contrastive_jax.models.patch_dropout import PatchDropout
from tests.models.test_released_siglip import TEXT as SIGLIP_TEXT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PATCH, BUDGET = 4, 24
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_patches": 16,  # a 4 x 4 position grid, resized to each image's
    "patch_size": PATCH,
}
# SigLIP's text tower of test_released_siglip (a width unlike the image's), with the vocabulary
# of the tests' SentencePiece model (tests/data/test_tokenizers.py).
TEXT = SIGLIP_TEXT | {"vocab_size": 60}
# (height, width): taller, wider, square, very wide, small: grids of 6 x 3, 4 x 6, 4 x 4, 2 x 12, 4 x 6
SIZES = ((40, 20), (17, 33), (64, 64), (9, 50), (8, 12))


def _images(seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)) for size in SIZES]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """`(transformers' model, its model.safetensors)`, every parameter random."""
    torch.manual_seed(0)
    config = transformers.Siglip2Config(text_config=TEXT, vision_config=VISION)
    model = transformers.Siglip2Model(config)
    with torch.no_grad():  # zero biases and unit LayerNorms would not test their mapping
        for name, tensor in model.named_parameters():
            if name.endswith("bias") or "norm" in name or name.startswith("logit"):
                tensor.add_(0.1 * torch.randn_like(tensor))
    folder = tmp_path_factory.mktemp("siglip2_naflex")
    model.save_pretrained(folder)
    return model.eval(), str(folder / "model.safetensors")


def _reference(model, images, budget=BUDGET):
    """transformers' image embeddings (before normalisation) of PIL `images`, and its
    processor's inputs."""
    processor = transformers.Siglip2ImageProcessorPil(patch_size=PATCH, max_num_patches=budget)
    inputs = processor(images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.vision_model(
            pixel_values=inputs["pixel_values"],
            pixel_attention_mask=inputs["pixel_attention_mask"],
            spatial_shapes=inputs["spatial_shapes"],
        )
    return out.pooler_output.numpy(), inputs


def _embed_images(loaded, packed):
    return np.asarray(loaded.model.apply({"params": loaded.params}, jnp.asarray(packed), method=lambda m, x: m.img(x)))


@pytest.mark.slow
def test_image_and_text_embeddings_equal_transformers(checkpoint):
    model, path = checkpoint
    loaded = released.load(path)
    assert (loaded.settings.position_grid, loaded.settings.image.num_heads, loaded.settings.text.width) == (4, 4, 48)
    images = _images()
    packed = np.stack([naflex_data.packed_image(image, PATCH, BUDGET) for image in images])
    expected, inputs = _reference(model, images)
    np.testing.assert_array_equal(naflex_data.grid_of(packed), inputs["spatial_shapes"].numpy())
    np.testing.assert_allclose(_embed_images(loaded, packed), expected, atol=1e-5, rtol=0)
    ids = np.random.default_rng(1).integers(2, 60, (3, 16)).astype(np.int32)
    with torch.no_grad():
        text = model.text_model(input_ids=torch.from_numpy(ids).long()).pooler_output.numpy()
    out = loaded.model.apply({"params": loaded.params}, jnp.asarray(packed[:3]), jnp.asarray(ids))
    np.testing.assert_allclose(out["zb"], text / np.linalg.norm(text, axis=-1, keepdims=True), atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["za"][0] @ out["za"][0], 1.0, rtol=1e-6)
    np.testing.assert_allclose(out["temperature"], np.exp(-model.logit_scale.item()), rtol=1e-6)
    np.testing.assert_allclose(out["bias"], model.logit_bias.item(), rtol=1e-6)


@pytest.mark.slow
def test_the_padding_changes_no_embedding(checkpoint):
    """An image's embedding is the same padded to 24 tokens or to 64, and whatever the
    padding tokens hold: they are masked in every block's attention and in the pooling."""
    loaded = released.load(checkpoint[1])
    image = _images()[0]
    short = naflex_data.packed_image(image, PATCH, BUDGET)
    rows, cols = naflex_data.grid_of(short)
    assert rows * cols == 18
    long = naflex_data.pack(short[1 : 1 + 18], (rows, cols), 64)
    noisy = long.copy()
    noisy[1 + 18 :] = np.random.default_rng(0).integers(0, 256, noisy[1 + 18 :].shape, dtype=np.uint8)
    embedded = [_embed_images(loaded, packed[None])[0] for packed in (short, long, noisy)]
    np.testing.assert_allclose(embedded[1], embedded[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(embedded[2], embedded[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("grid", [(4, 4), (16, 16), (3, 40), (1, 1), (25, 7)])
def test_position_embeddings_resize_as_torch_interpolate(grid):
    pos = np.random.default_rng(0).normal(size=(16, 16, 8)).astype(np.float32)
    rows, cols = grid
    resized = naflex.resized_position_embeddings(jnp.asarray(pos), jnp.asarray([grid], jnp.int32), rows * cols + 3)
    source = torch.from_numpy(pos).permute(2, 0, 1)[None]
    expected = torch.nn.functional.interpolate(source, size=grid, mode="bilinear", align_corners=False, antialias=True)
    expected = expected[0].reshape(8, rows * cols).T.numpy()
    np.testing.assert_allclose(resized[0, : rows * cols], expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(resized[0, rows * cols :], np.broadcast_to(expected[0], (3, 8)), atol=1e-5, rtol=0)


def test_written_back_transformers_loads_the_same_model(checkpoint, tmp_path):
    model, path = checkpoint
    loaded = released.load(path)
    released.save(str(tmp_path / "model.safetensors"), loaded.model, loaded.params)
    again = transformers.Siglip2Model.from_pretrained(tmp_path).eval()
    for name, tensor in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[name].numpy(), tensor.numpy(), err_msg=name)


def test_an_image_over_the_budget_is_named():
    patches = np.zeros((30, PATCH * PATCH * 3), np.uint8)
    with pytest.raises(ConfigError, match=r"5 x 6 = 30 patches is over the budget config\.data\.max_num_patches=24"):
        naflex_data.pack(patches, (5, 6), BUDGET)


def test_a_fixed_resolution_siglip_is_not_naflex(tmp_path):
    vision = {k: v for k, v in VISION.items() if k != "num_patches"} | {"image_size": 16}
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=TEXT, vision_config=vision))
    model.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"a fixed-resolution SigLIP, not NaFlex; give a -naflex checkpoint"):
        released.load(str(tmp_path / "model.safetensors"))


def test_a_checkpoint_without_its_config_is_named(checkpoint, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(open(checkpoint[1], "rb").read())
    with pytest.raises(
        ConfigError, match=r"config\.json is missing: save the model with transformers' save_pretrained"
    ):
        released.load(str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "siglip2_vision_model"}))
    with pytest.raises(ConfigError, match=r"is not a two-tower Siglip2Model's config"):
        released.load(str(tmp_path / "model.safetensors"))


def test_patch_dropout_is_refused_before_compiling(checkpoint):
    loaded = released.load(checkpoint[1])
    model = loaded.model.clone(patch_dropout=PatchDropout(0.5))
    packed = jnp.zeros((2, 1 + BUDGET, PATCH * PATCH * 3), jnp.uint8)
    keys = jax.random.split(jax.random.key(0), 2)
    with pytest.raises(ConfigError, match=r"set config\.model\.patch_dropout=0"):
        jax.eval_shape(lambda: model.apply({"params": loaded.params}, packed, train=True, patch_keys=keys))


def _run_fields(checkpoint_path, tmp_path):
    """A tiny fine-tuning run of configs/finetune_siglip2_naflex.py on native-aspect images."""
    from tests.data.test_naflex_pipeline import SIZES as SET_SIZES
    from tests.data.test_naflex_pipeline import write_set
    from tests.data.test_tokenizers import train_sentencepiece

    sentencepiece = train_sentencepiece(tmp_path, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    return {
        "model.init_from": checkpoint_path,
        "model.embed_dim": TEXT["projection_size"],
        "model.patch_size": PATCH,
        "data.records": write_set(tmp_path / "records", SET_SIZES * 3),
        "data.tokenizer": f"siglip2:{sentencepiece}",
        "data.text_max_length": TEXT["max_position_embeddings"],
        "data.max_num_patches": BUDGET,
        "data.num_workers": 0,
        "train.global_batch_size": 16,
        "train.micro_batch_size": 8,
        "train.num_train_steps": 2,
        "optim.warmup_steps": 1,
        "eval.every_steps": 2,  # retrieval on the NaFlex images
        "eval.split": "train",
        "checkpoint.every_steps": 2,
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"data.max_num_patches": 0}, r"max_num_patches=0; .* is a SigLIP 2 NaFlex: set it to its token budget"),
        ({"model.init_from": ""}, r"max_num_patches=24 feeds a released SigLIP 2 NaFlex .* set it to 0"),
        ({"model.patch_size": 16}, r"config\.model\.patch_size=16; the released model .* takes 4"),
    ],
)
def test_a_config_that_does_not_fit_naflex_is_named_at_build(load_config, checkpoint, tmp_path, fields, message):
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    config = override(load_config("finetune_siglip2_naflex"), _run_fields(checkpoint[1], tmp_path) | fields)
    if fields.get("data.max_num_patches") == 0:
        config.data.image_size = 16
    with pytest.raises(ConfigError, match=message):
        run_plan.build(config)


def test_square_weights_refuse_naflex_images():
    from contrastive_jax.models.released import big_vision_layout, check_inputs
    from contrastive_jax.models.transformer import TowerSettings

    tower = TowerSettings(32, 1, 2, 64)
    square = big_vision_layout.Settings(224, 16, tower, 16, 60, tower, 32)
    with pytest.raises(
        ConfigError, match=r"max_num_patches=256 needs SigLIP 2 NaFlex weights .*config\.data\.image_size=224"
    ):
        check_inputs(
            square, image_size=None, text_length=16, vocab_size=60, embed_dim=32, learned_bias=True, max_num_patches=256
        )


@pytest.mark.e2e
def test_the_naflex_config_fine_tunes_a_released_siglip2(load_config, checkpoint, tmp_path):
    """configs/finetune_siglip2_naflex.py trains two steps from the transformers checkpoint
    on 18 images of six aspect ratios; the run's model is the NaFlex layout's, its bias the
    checkpoint's moved a little, and it embeds packed images as the loaded model does."""
    from contrastive_jax import run_dir, trained
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    model, path = checkpoint
    workdir = str(tmp_path / "run")
    run_plan.train_and_evaluate(override(load_config("finetune_siglip2_naflex"), _run_fields(path, tmp_path)), workdir)
    run = trained.load(workdir)
    assert 0 <= run_dir.read_eval_results(workdir)["a_to_b/R@1"] <= 1  # evaluated on the NaFlex images
    assert type(run.model) is type(released.load(path).model)
    bias = float(run.variables["params"]["logit_bias"])
    assert bias == pytest.approx(model.logit_bias.item(), abs=0.01) and bias != pytest.approx(
        model.logit_bias.item(), abs=1e-7
    )
    packed = np.stack([naflex_data.packed_image(image, PATCH, BUDGET) for image in _images()])
    z = run.embed(packed, "a")
    assert z.shape == (len(SIZES), TEXT["projection_size"]) and np.isfinite(z).all()
