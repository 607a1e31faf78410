"""Every recipe with every large-batch tool (docs/training.md, "Recipes with the
large-batch tools"): one jitted step of each feature -- hard negatives, several
positives, extra negatives, groups, patch dropout, a mixture, a fixed bank of
negatives, distillation from a teacher -- taken with each tool --
gradient caching, FSDP, a streamed loss around the ring, a batch schedule's later stage,
the noise scale's per-device pass -- equals the same feature's plain step (the whole
batch in one pass, replicated parameters, dense logits, a constant batch): the loss and
the update, to float32 rounding, on 8 simulated devices.

SGD at rate 1 and no dropout, so an update is minus the gradient and two steps compare
exactly. The plain step of a feature is computed once (`reference_step`).
"""

import dataclasses
import shutil

import jax
import numpy as np
import pytest
from test_negatives_apart_training import EXACT_STEP

from contrastive_jax import losses, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline, settings
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import encoders
from contrastive_jax.training import run_plan

pytestmark = pytest.mark.usefixtures("two_block_vit_tiny")  # vit_tiny at 2 blocks: the steps compare per block

N, M = 16, 16  # the optimizer's batch; extra negatives and a stage's doubling

BASE = EXACT_STEP | {"train.global_batch_size": N, "mesh.fsdp_min_kib": 0}  # every parameter split under FSDP
FEATURES = {
    "hard_negatives": {},  # the batch's `negatives` (`with_feature`)
    "several_positives": {"loss.positives": "mean_log_prob"},  # with pairs sharing an index (`with_feature`)
    "extra_negatives": {"loss.extra_negatives": M},
    "groups": {"loss.group_size": 4},
    "patch_dropout": {
        "model.encoder_a": "vit_tiny",
        "model.encoder_b": "vit_tiny",
        "model.patch_size": 2,
        "model.patch_dropout": 0.5,
    },
    "mixture": {},  # the digits and a copy, 3 : 1 (`feature_config`)
    "negative_bank": {},  # 16 fixed negatives from a file, config.loss.negatives_from (`feature_config`)
    "distillation": {},  # a teacher run's softmaxes, config.loss.teacher (`feature_config`)
}
# tool -> (config fields, devices, fsdp, the optimizer's batch of the step compared)
TOOLS = {
    "gradient_caching": ({"train.micro_batch_size": 8}, 8, 1, N),
    "fsdp": ({"mesh.fsdp": 2}, 8, 2, N),
    "streamed": ({"loss.chunk_size": 2, "loss.collective": "ring"}, 8, 1, N),
    "batch_schedule": ({"train.batch_schedule": f"{N}@0,{2 * N}@1"}, 8, 1, 2 * N),
    "noise_scale": ({"train.log_noise_scale": True}, 8, 1, N),
}


@pytest.fixture(scope="module")
def base(load_config, digits_data_dir, tmp_path_factory):
    """`(config, {feature: its fields})` (a mixture's, a bank of negatives'); while the
    module runs, "vit_tiny" is a ViT of width 16 and 2 blocks (the real one's 12 blocks of
    192 take minutes to compile on 8 CPU devices; patch dropout's keys do not depend on
    the width)."""
    from subprocess_runs import tiny_fields

    config = override(load_config("default"), tiny_fields(digits_data_dir) | BASE)
    digits = settings.builtin_records("sklearn_digits", digits_data_dir)
    copy = shutil.copytree(digits, tmp_path_factory.mktemp("mixture") / "digits_b")
    mixture = {"data.records": (digits, str(copy)), "data.mixture_weights": (0.75, 0.25), "data.image_size": 8}
    bank = tmp_path_factory.mktemp("bank") / "negatives.npy"
    np.save(bank, np.random.default_rng(0).normal(size=(16, config.model.embed_dim)).astype(np.float32))
    teacher = str(tmp_path_factory.mktemp("teacher"))  # 24 wide, the student 16: the logits at any widths
    run_plan.train_and_evaluate(override(config, {"model.embed_dim": 24, "train.num_train_steps": 1}), teacher)
    added = {
        "mixture": mixture,
        "negative_bank": {"loss.negatives_from": str(bank)},
        "distillation": {"loss.teacher": teacher, "loss.distill_weight": 0.5},
    }
    with pytest.MonkeyPatch.context() as patch:
        small = lambda m, dtype, vocab: encoders.ViT(16, 2, 2, 32, m.patch_size, 0.0, dtype, m.remat, m.attention)  # noqa: E731
        patch.setitem(encoders.ENCODERS, "vit_tiny", small)
        yield config, added


def with_feature(feature, batch):
    """The batch of `feature`: hard negatives (each row's the next 2 rows' b inputs), or
    pairs sharing their index two by two (positives of each other)."""
    batch = dict(jax.device_get(batch))
    if feature == "hard_negatives":
        batch["negatives"] = np.stack([np.roll(batch["b"], -k, axis=0) for k in (1, 2)], axis=1)
    if feature == "several_positives":
        batch["index"] = np.arange(len(batch["index"]), dtype=batch["index"].dtype) // 2
    return batch


def one_step(config, feature, num_devices, fsdp, batch_size):
    """`(loss, update)` of one jitted step (the update: the parameters after less before)
    at an optimizer batch of `batch_size` (the trainer compiled for it, as the loop does for
    a schedule's stage)."""
    plan = run_plan.build(config, sharding.make_mesh(num_devices, fsdp=fsdp))
    extra = plan.trainer.loss_settings.extra_negatives
    data = dataclasses.replace(plan.data, global_batch_size=batch_size + extra)
    stream = input_pipeline.train_dataset(data)
    batch = with_feature(feature, next(iter(stream)))
    spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    init, abstract = plan.trainer.init_state(spec)
    step = plan.trainer.compile_step(abstract, spec, batch_size + extra)
    before = jax.device_get(init().params)
    after, metrics = step(init(), batch)
    return float(metrics["loss"]), jax.tree.map(np.subtract, jax.device_get(after.params), before)


def feature_config(base, feature, fields=()):
    config, added = base
    return override(config, FEATURES[feature] | added.get(feature, {}) | dict(fields))


_REFERENCES = {}


def reference_step(base, feature, num_devices, batch_size):
    """The feature's plain step (computed once per feature, devices and batch)."""
    key = (feature, num_devices, batch_size)
    if key not in _REFERENCES:
        _REFERENCES[key] = one_step(feature_config(base, feature), feature, num_devices, 1, batch_size)
    return _REFERENCES[key]


@pytest.mark.slow  # 40 cells, 2-10 s each on 2 cores (CI runs them; one cell: -k "groups-fsdp")
@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("feature", FEATURES)
def test_each_recipe_with_each_tool_is_its_plain_step(base, feature, tool):
    fields, num_devices, fsdp, batch_size = TOOLS[tool]
    want_loss, want_update = reference_step(base, feature, num_devices, batch_size)  # FSDP's: replicated
    config = feature_config(base, feature, fields)
    if tool == "batch_schedule":  # the stages reach the run: rows read N_s + M at each
        extra = config.loss.extra_negatives
        assert run_plan.build(config, sharding.make_mesh(8)).batch_schedule.batches == (N + extra, 2 * N + extra)
    loss, update = one_step(config, feature, num_devices, fsdp, batch_size)
    assert loss == pytest.approx(want_loss, rel=2e-5)
    scale = max(np.max(np.abs(u)) for u in jax.tree.leaves(want_update))  # float32 rounding of the update's
    for got, want in zip(jax.tree.leaves(update), jax.tree.leaves(want_update), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-4 * scale)


@pytest.mark.slow
def test_a_bank_is_a_negative_of_every_row(base):
    """The bank's rows join every row's a -> b softmax, over the devices as on one: the
    trainer's loss equals the kernel's with the bank as shared columns (normalised)."""
    config = feature_config(base, "negative_bank")
    trainer = run_plan.build(config, sharding.make_mesh(8)).trainer
    bank = losses.registry.negative_bank(config.loss.negatives_from)
    za, zb = (losses.l2_normalize(jax.random.normal(jax.random.key(seed), (N, bank.shape[1]))) for seed in (0, 1))
    loss, _, _ = trainer.global_loss({"za": za, "zb": zb}, {"temperature": np.float32(0.1)}, {})
    want = losses.clip_loss(za, zb, temperature=0.1, candidates=losses.Candidates(shared_columns=bank))
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert float(loss) != pytest.approx(float(losses.clip_loss(za, zb, temperature=0.1)), rel=1e-3)
    np.testing.assert_allclose(np.linalg.norm(bank, axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"negatives_from='.*missing.npy' cannot be read"),
        (np.zeros((16, 3), np.float32), r"holds \[16, 3\] embeddings; it must be \[M, 16\]"),
        (np.zeros((16,), np.float32), r"holds float32 \(16,\); it must be \[M, D\] floats"),
        (np.zeros((12, 16), np.float32), r"rows of config.loss.negatives_from=12 must be a multiple of the devices"),
    ],
)
def test_a_bad_bank_is_one_line_before_compiling(base, tmp_path, content, message):
    path = tmp_path / "missing.npy"
    if content is not None:
        np.save(path, content)
    config = override(base[0], {"loss.negatives_from": str(path)})
    with pytest.raises(ConfigError, match=message) as error:
        run_plan.build(config, sharding.make_mesh(8))
    assert "\n" not in str(error.value)


def test_a_momentum_encoders_keys_with_gradient_caching_are_the_whole_batchs(base):
    """MoCo's keys from the momentum encoder, embedded by each micro-batch's forward: the
    step with gradient caching is the whole batch's, loss and update."""
    fields = {"loss.name": "moco_queue", "loss.queue_size": 0, "loss.queue_momentum": 0.99}
    config = override(base[0], fields)
    want_loss, want_update = one_step(config, "moco", 8, 1, N)
    loss, update = one_step(override(config, {"train.micro_batch_size": 8}), "moco", 8, 1, N)
    assert loss == pytest.approx(want_loss, rel=2e-5)
    scale = max(np.max(np.abs(u)) for u in jax.tree.leaves(want_update))
    for got, want in zip(jax.tree.leaves(update), jax.tree.leaves(want_update), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-4 * scale)


@pytest.mark.slow  # CoCa compiled twice per tool on 8 devices (about 20 s each on 2 cores)
@pytest.mark.parametrize("tool", ["gradient_caching", "fsdp", "streamed"])
def test_cocas_captioning_term_with_each_tool_is_its_plain_step(load_config, shapes_data_dir, tool):
    """CoCa's caption term (`caption_nll`, `caption_tokens`, batched outputs of its
    decoder) goes through each tool as the contrastive loss does: the step equals CoCa's
    plain step, loss and update."""
    from test_recipes import TINY

    config = load_config("coca_shapes")
    config.data.data_dir = shapes_data_dir
    fields = TINY | EXACT_STEP | {"mesh.fsdp_min_kib": 0, "model.coca_queries": 5, "model.decoder_depth": 1}
    config = override(config, fields)
    tool_fields, num_devices, fsdp, batch_size = TOOLS[tool]
    key = ("coca", num_devices, batch_size)
    if key not in _REFERENCES:  # the plain step, once for the three tools
        _REFERENCES[key] = one_step(config, "coca", num_devices, 1, batch_size)
    want_loss, want_update = _REFERENCES[key]
    loss, update = one_step(override(config, tool_fields), "coca", num_devices, fsdp, batch_size)
    assert loss == pytest.approx(want_loss, rel=2e-5)
    scale = max(np.max(np.abs(u)) for u in jax.tree.leaves(want_update))
    for got, want in zip(jax.tree.leaves(update), jax.tree.leaves(want_update), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-4 * scale)
