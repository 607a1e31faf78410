"""Zero-shot classification and all-captions retrieval on hand-computed cases, and both
tasks end to end on a run of the generated image-text set, as CLIP_benchmark JSON."""

import json

import numpy as np
import pytest

from contrastive_jax import benchmark
from contrastive_jax.data import input_pipeline
from contrastive_jax.evaluation import clip_benchmark


def unit(*angles_degrees):
    angles = np.radians(angles_degrees)
    return np.stack([np.cos(angles), np.sin(angles)], axis=1)


def test_zero_shot_classification_by_hand():
    """Classes at 0, 90 and 180 degrees; images at 10 (class 0), 80 (class 1), 100
    (labelled 2: nearest class 1, then class 2, 80 degrees away) and 170 (class 2)."""
    classes = unit(0, 90, 180)
    images = unit(10, 80, 100, 170)
    labels = np.array([0, 1, 2, 2])
    metrics = clip_benchmark.zero_shot_classification(images, classes, labels, ks=(1, 2))
    assert metrics["acc1"] == 0.75  # the image at 100 degrees goes to class 1
    assert metrics["acc2"] == 1.0  # its second guess is class 2
    assert metrics["mean_per_class_recall"] == pytest.approx((1 + 1 + 0.5) / 3)


def test_class_embeddings_average_the_prompts():
    prompts = {"a cat": unit(0)[0], "the cat": unit(90)[0], "a dog": unit(180)[0], "the dog": unit(180)[0]}
    embed = lambda texts: np.stack([prompts[t] for t in texts])  # noqa: E731
    got = clip_benchmark.class_embeddings(embed, ["cat", "dog"], ["a {}", "the {}"])
    np.testing.assert_allclose(got, unit(45, 180), atol=1e-12)


def test_retrieval_with_several_captions_per_image_by_hand():
    """Images at 0, 120, 240 degrees; image 0 has captions at 10 and 290 (the second
    nearer image 2), image 1 one caption at 115, image 2 two at 235 and 60 (the second
    as near images 0 and 1 as can be)."""
    images = unit(0, 120, 240)
    captions = unit(10, 290, 115, 235, 60)
    owner = np.array([0, 0, 1, 2, 2])
    metrics = clip_benchmark.retrieval(images, captions, owner, ks=(1, 2))
    # Text -> image: captions 10, 115, 235 find their image first; 290 ranks image 0
    # second (after 240); 60 ranks image 2 third (after 0 and 120).
    assert metrics["image_retrieval_recall@1"] == pytest.approx(3 / 5)
    assert metrics["image_retrieval_recall@2"] == pytest.approx(4 / 5)
    # Image -> text: each image's nearest caption is one of its own (10, 115, 235).
    assert metrics["text_retrieval_recall@1"] == 1.0


def test_retrieval_with_one_caption_each_is_plain_recall():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(50, 8))
    texts = images + rng.normal(size=(50, 8))
    metrics = clip_benchmark.retrieval(images, texts, np.arange(50), ks=(1,))
    scores = texts @ images.T
    assert metrics["image_retrieval_recall@1"] == np.mean(np.argmax(scores, axis=1) == np.arange(50))
    assert metrics["text_retrieval_recall@1"] == np.mean(np.argmax(scores, axis=0) == np.arange(50))


def test_class_names_come_from_the_record_set_unless_given(tmp_path, image_files_for_names):
    from contrastive_jax import write_records
    from contrastive_jax.data import records
    from contrastive_jax.errors import ConfigError

    metadata = write_records.write(f"csv:{image_files_for_names}", str(tmp_path / "named"))
    labels = records.RecordSet(metadata, "train").labels()
    assert clip_benchmark.classnames_for([], metadata, labels) == ["ant", "zebra"]  # sorted, label order
    assert clip_benchmark.classnames_for(["fourmi", "zèbre"], metadata, labels) == ["fourmi", "zèbre"]
    with pytest.raises(ConfigError, match=r"2 class names for labels up to 2"):
        clip_benchmark.classnames_for(["a", "b"], metadata, np.array([0, 2]))
    unnamed = records.Metadata(directory=str(tmp_path / "ids"), splits={}, fields=("image", "label"), num_classes=2)
    with pytest.raises(ConfigError, match=r"has none \(its labels were written as ids\); give --classnames"):
        clip_benchmark.classnames_for([], unnamed, labels)


@pytest.fixture
def image_files_for_names(tmp_path):
    """A CSV of two images labelled by name: its path."""
    from PIL import Image

    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / name)
    (tmp_path / "pairs.csv").write_text("image,caption,label\na.png,a zebra,zebra\nb.png,an ant,ant\n")
    return str(tmp_path / "pairs.csv")


def test_templates_inline_or_from_a_file(tmp_path):
    from contrastive_jax.errors import ConfigError

    assert clip_benchmark.read_templates("a {}.;a photo of a {}.", None) == ["a {}.", "a photo of a {}."]
    (tmp_path / "templates.txt").write_text("a photo of a {}.\n\n  itap of a {}.  \na {}; with a semicolon\n")
    got = clip_benchmark.read_templates("ignored", str(tmp_path / "templates.txt"))
    assert got == ["a photo of a {}.", "itap of a {}.", "a {}; with a semicolon"]
    with pytest.raises(ConfigError, match=r"the template 'a photo' has no \{\}"):
        clip_benchmark.read_templates("a photo", None)
    with pytest.raises(ConfigError, match=r"--templates-file=.*missing\.txt: No such file"):
        clip_benchmark.read_templates("{}", str(tmp_path / "missing.txt"))


@pytest.mark.e2e
def test_both_tasks_on_a_run_of_the_generated_image_text_set(load_config, shapes_data_dir, tmp_path):
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    fields = {  # CPU-sized towers: the small CNN for the pictures, one text layer
        "data.data_dir": shapes_data_dir,
        "model.encoder_a": "cnn",
        "model.cnn_features": (16, 32),
        "model.encoder_dim": 64,
        "model.text_num_layers": 1,
        "train.global_batch_size": 32,
        "train.num_train_steps": 4,
        "eval.every_steps": 0,
        "checkpoint.every_steps": 4,
    }
    workdir = str(tmp_path / "run")
    during_training = run_plan.train_and_evaluate(override(load_config("clip_shapes"), fields), workdir)
    out = tmp_path / "retrieval.json"
    assert benchmark.main([f"--workdir={workdir}", "--task=zeroshot_retrieval", f"--out={out}"]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "zeroshot_retrieval" and result["dataset"].endswith(":test")
    assert set(result["metrics"]) == {f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10)}
    for name, value in result["metrics"].items():  # the run's own evaluation, same state
        assert during_training[f"all_captions/{name}"] == pytest.approx(value, abs=1e-6), name
    kinds = tmp_path / "kinds.json"
    args = ["--task=zeroshot_classification", "--classnames=circle,square,triangle,cross,diamond"]
    assert (
        benchmark.main([f"--workdir={workdir}", *args, "--templates=a {}.;a picture with a {}.", f"--out={kinds}"]) == 0
    )
    metrics = json.loads(kinds.read_text())["metrics"]
    assert 0 <= metrics["acc1"] <= metrics["acc5"] == 1.0  # 5 classes: top-5 is every class
    # The record set's class names (the shapes' kinds) and a templates file: the same.
    (tmp_path / "templates.txt").write_text("a {}.\na picture with a {}.\n")
    from_data = tmp_path / "from_data.json"
    args = ["--task=zeroshot_classification", f"--templates-file={tmp_path / 'templates.txt'}", f"--out={from_data}"]
    assert benchmark.main([f"--workdir={workdir}", *args]) == 0
    assert json.loads(from_data.read_text())["metrics"] == metrics
    tokens, owner = input_pipeline.eval_captions(load_config_data(workdir), "test")
    assert len(tokens) == 4 * (owner.max() + 1)  # 4 captions per picture


def load_config_data(workdir):
    from contrastive_jax import trained

    return trained.load(workdir).data
