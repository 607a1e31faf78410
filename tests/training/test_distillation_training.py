"""Distillation in the train step (configs/recipes_distillation.py at tiny size): a teacher
run trained here (embeddings 24 wide, the student's 16), loaded from its workdir and
embedded in the step. The step's loss is the CLIP loss plus the distillation kernel of
the student's and the teacher's embeddings of the batch (logit form, and the embedding
form through the learned map to the teacher's width); the teacher's variables do not
move; a teacher that does not fit the run is one line before compiling."""

import jax
import numpy as np
import pytest
from test_recipes import TINY, one_step

from contrastive_jax import losses, run_dir, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import run_plan
from contrastive_jax.training.run_plan import build

pytestmark = pytest.mark.usefixtures("two_block_vit_tiny")  # vit_tiny at 2 blocks: the steps compare per block

TEACHER_DIM = 24


@pytest.fixture(scope="module")
def teacher_run(load_config, shapes_data_dir, tmp_path_factory):
    """A teacher's workdir: configs/clip_shapes.py at tiny size, 2 steps, embeddings 24 wide."""
    config = load_config("clip_shapes")
    config.data.data_dir = shapes_data_dir
    config = override(config, TINY | {"model.embed_dim": TEACHER_DIM})
    workdir = str(tmp_path_factory.mktemp("teacher"))
    run_plan.train_and_evaluate(config, workdir)
    return workdir


@pytest.fixture
def student(load_config, shapes_data_dir, teacher_run):
    """configs/recipes_distillation.py at tiny size, distilling from `teacher_run`."""
    config = load_config("recipes_distillation")
    config.data.data_dir = shapes_data_dir
    return override(config, TINY | {"loss.teacher": teacher_run})


def embeddings(model, variables, batch):
    out = model.apply(variables, batch["a"], batch["b"], train=False)
    return jax.device_get(out)


@pytest.mark.slow  # a teacher run, then a step on 8 devices (about 40 s each on 2 cores)
@pytest.mark.parametrize("form", ["logits", "mse"])
def test_the_step_adds_the_distillation_of_the_teachers_embeddings(student, form):
    config = override(student, {"loss.distill_form": form, "loss.distill_weight": 0.5})
    trainer, before, batch, metrics, after = one_step(config, 8)
    mine = embeddings(trainer.model, {"params": before.params}, batch)
    theirs = embeddings(trainer.loaded.teacher.model, trainer.loaded.teacher.variables, batch)
    if form == "logits":
        want = losses.distill_clip_loss(
            mine["za"],
            mine["zb"],
            theirs["za"],
            theirs["zb"],
            temperature=mine["temperature"],
            teacher_temperature=theirs["temperature"],
        )
    else:
        assert mine["za_to_teacher"].shape == theirs["za"].shape == (16, TEACHER_DIM)
        want = sum(losses.embedding_distill_loss(mine[f"{z}_to_teacher"], theirs[z]) for z in ("za", "zb")) / 2
    clip = losses.clip_loss(mine["za"], mine["zb"], temperature=mine["temperature"])
    assert float(metrics["distill_loss"]) == pytest.approx(float(want), rel=1e-5)
    assert float(metrics["loss"]) == pytest.approx(float(clip + 0.5 * want), rel=1e-5)
    for got, was in zip(jax.tree.leaves(after.teacher), jax.tree.leaves(before.teacher), strict=True):
        np.testing.assert_array_equal(got, was)
    assert float(metrics["grad_norm"]) > 0


@pytest.mark.slow  # a teacher run and a student run (about 1 minute on 2 cores)
def test_the_recipe_trains_from_its_config(student, tmp_path):
    run_plan.train_and_evaluate(override(student, {"loss.chunk_size": 8}), str(tmp_path))
    logged = [row for row in run_dir.read_metrics(str(tmp_path)) if "train/distill_loss" in row]
    assert [row["step"] for row in logged] == [1, 2]
    assert all(np.isfinite(row["train/distill_loss"]) for row in logged)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss.teacher": "/no/such/run"}, r"config.loss.teacher='/no/such/run' does not exist"),
        ({"loss.teacher": ""}, r"distill_weight=1.0 and config.loss.teacher empty: distillation needs both"),
        ({"loss.distill_form": "kl"}, r"distill_form='kl'; use one of \['logits', 'mse', 'cosine'\]"),
        ({"loss.caption_weight": -1.0}, r"config.loss.caption_weight=-1.0 must be >= 0"),
    ],
)
def test_bad_distillation_settings_are_one_line_before_compiling(load_config, shapes_data_dir, fields, message):
    config = load_config("recipes_distillation")
    config.data.data_dir = shapes_data_dir
    with pytest.raises(ConfigError, match=message) as error:
        build(override(config, TINY | fields), sharding.make_mesh(1))
    assert "\n" not in str(error.value)


@pytest.mark.slow  # a teacher run (about 40 s on 2 cores)
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"data.text_max_length": 16}, r"takes config.data.text_max_length = 32 and this run gives 16"),
        ({"loss.distill_weight": 0.0}, r"distill_weight=0.0 and config.loss.teacher set: distillation needs both"),
    ],
)
def test_a_teacher_that_does_not_fit_is_one_line_before_compiling(student, fields, message):
    with pytest.raises(ConfigError, match=message) as error:
        build(override(student, fields), sharding.make_mesh(1))
    assert "\n" not in str(error.value)


def released_clip(directory, embed_dim: int) -> str:
    """A random-weight open_clip CLIP (64 px, CLIP's vocabulary, embeddings `embed_dim`
    wide) saved as open_clip saves it."""
    torch = pytest.importorskip("torch")
    open_clip = pytest.importorskip("open_clip")
    from safetensors.torch import save_file

    torch.manual_seed(embed_dim)
    vision = {"layers": 1, "width": 64, "patch_size": 16, "image_size": 64}
    text = {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 1}
    model = open_clip.model.CLIP(embed_dim=embed_dim, vision_cfg=vision, text_cfg=text)
    path = directory / f"clip_{embed_dim}" / "open_clip_model.safetensors"
    path.parent.mkdir()
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, str(path))
    return str(path)


# The student on the released teacher's inputs: 64 px, CLIP's BPE at its 77 tokens.
RELEASED_INPUTS = {"data.image_size": 64, "data.text_max_length": 77}


@pytest.mark.e2e
def test_a_released_checkpoint_teaches_in_the_step(student, clip_merges, tmp_path):
    """An open_clip checkpoint as the teacher: its towers embed the batch in the step, and
    the step's distillation is the kernel's on their embeddings and learned temperature."""
    fields = RELEASED_INPUTS | {"loss.teacher": released_clip(tmp_path, 48), "data.tokenizer": clip_merges}
    trainer, before, batch, metrics, _ = one_step(override(student, fields), 8)
    mine = embeddings(trainer.model, {"params": before.params}, batch)
    theirs = embeddings(trainer.loaded.teacher.model, trainer.loaded.teacher.variables, batch)
    assert theirs["za"].shape == (16, 48) and float(theirs["temperature"]) == pytest.approx(
        0.07, rel=1e-6
    )  # open_clip init
    want = losses.distill_clip_loss(
        mine["za"],
        mine["zb"],
        theirs["za"],
        theirs["zb"],
        temperature=mine["temperature"],
        teacher_temperature=theirs["temperature"],
    )
    assert float(metrics["distill_loss"]) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.e2e
def test_embeddings_of_another_width_need_a_student_of_this_library(load_config, clip_merges, tmp_path):
    """A released student has no map to a teacher's width: the embedding forms are refused
    in one line, and the logit form, which takes any widths, is named as the fix."""
    fields = RELEASED_INPUTS | {
        "model.init_from": released_clip(tmp_path, 32),
        "model.embed_dim": 32,
        "data.tokenizer": clip_merges,
        "loss.teacher": released_clip(tmp_path, 48),
        "loss.distill_weight": 1.0,
        "loss.distill_form": "mse",
    }
    with pytest.raises(ConfigError, match=r"teacher's width 48 is not the released student's 32: use distill_form"):
        build(override(load_config("finetune_clip"), fields), sharding.make_mesh(1))


@pytest.mark.slow  # a teacher run (about 40 s on 2 cores)
def test_a_teacher_of_the_students_width_takes_its_embeddings_unmapped(student):
    """At equal widths the embedding forms compare the embeddings themselves: no map is
    built, and the trainer's loss over 8 devices is the kernel's on the global arrays."""
    config = override(student, {"model.embed_dim": TEACHER_DIM, "loss.distill_form": "cosine"})
    trainer = build(config, sharding.make_mesh(8)).trainer
    assert trainer.model.teacher_dim == 0
    za, zb, ta, tb = (losses.l2_normalize(jax.random.normal(jax.random.key(k), (16, TEACHER_DIM))) for k in range(4))
    batched = {"za": za, "zb": zb, "teacher_za": ta, "teacher_zb": tb}
    shared = {"temperature": np.float32(0.1), "teacher_temperature": np.float32(0.05)}
    loss, metrics, _ = trainer.global_loss(batched, shared, {})
    want = sum(losses.embedding_distill_loss(z, t, form="cosine") for z, t in ((za, ta), (zb, tb))) / 2
    assert float(metrics["distill_loss"]) == pytest.approx(float(want), rel=1e-5)
    assert float(loss) == pytest.approx(float(losses.clip_loss(za, zb, temperature=0.1) + want), rel=1e-5)
