"""The trainer's side of hard negatives (`training.forward`): a step whose
batch holds `negatives` [N, M, ...] takes the gradient of the loss with the b tower's
embeddings of them in the a -> b pool, written here by hand (the towers and
`TwoTower.embed` applied to the global batch, the kernel on one device); a batch
without them is the plain step, bit for bit; the door refuses what cannot take them."""

import csv
import json

import jax
import numpy as np
import pytest
from PIL import Image
from test_negatives_apart_training import config  # noqa: F401  (the fixture: SGD at rate 1, no dropout)

from contrastive_jax import losses, sharding, write_records
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline, records
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import run_plan
from contrastive_jax.training.run_plan import build, data_settings

M = 2  # hard negatives a row; the batch is the fixture's N = 16


def with_negatives(batch, count):
    """The batch with `negatives` [N, count, ...]: row i's are the b's of rows i + 1, ...,
    i + count (other pairs' b inputs, as a mined negative is some other item)."""
    b = np.asarray(batch["b"])
    negatives = [np.roll(b, -k, axis=0)[:, None] for k in range(1, count + 1)]
    return dict(batch, negatives=np.concatenate([b[:, None][:, :0], *negatives], axis=1))


def one_step(config, num_devices, count):
    """`(trainer, state before, batch, state after, metrics)` of one jitted step whose
    batch holds `count` negatives a row (None: no `negatives`)."""
    trainer = build(config, sharding.make_mesh(num_devices)).trainer
    ds = input_pipeline.train_dataset(data_settings(config))
    init, abstract = trainer.init_state(ds.element_spec)
    batch = jax.device_get(next(iter(ds)))
    if count is not None:
        batch = with_negatives(batch, count)
    before = jax.device_get(init())
    after, metrics = trainer.jit_train_step(abstract)(init(), batch)
    return trainer, before, batch, jax.device_get(after), jax.device_get(metrics)


def reference_loss(model, params, batch_stats, batch, kernel, extra):
    """The loss on one device: the towers on the global batch, `embed(..., "b")` on the
    N M negatives, the kernel with `hard_negatives` [N, M, D]."""
    variables = {"params": params, "batch_stats": batch_stats}
    outputs = model.apply(variables, batch["a"], batch["b"])
    negatives = batch["negatives"]
    z = model.apply(variables, negatives.reshape(-1, *negatives.shape[2:]), "b", method="embed")
    hard = z.reshape(*negatives.shape[:2], -1)
    return kernel(
        outputs["za"],
        outputs["zb"],
        temperature=outputs["temperature"],
        candidates=losses.Candidates(extra_columns=hard),
        **{k: outputs[k] for k in extra},
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "num_devices"),
    [("clip", 1), ("clip", 8), ("siglip", 8)],
)
def test_a_step_with_hard_negatives_has_the_hand_computed_gradient(config, name, num_devices):
    trainer, before, batch, after, metrics = one_step(override(config, {"loss.name": name}), num_devices, M)
    kernel, extra = {"clip": (losses.clip_loss, ()), "siglip": (losses.siglip_loss, ("bias",))}[name]
    value, grads = jax.value_and_grad(reference_loss, argnums=1)(
        trainer.model, before.params, before.batch_stats, batch, kernel, extra
    )
    assert float(metrics["loss"]) == pytest.approx(float(value), rel=1e-5)
    step = jax.tree.map(lambda new, old: old - new, after.params, before.params)  # SGD at rate 1
    for got, want in zip(jax.tree.leaves(step), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_without_negatives_the_step_is_the_plain_one(config):
    """No `negatives` and M = 0 give the same step, bit for bit."""
    results = [one_step(config, 8, count)[3:] for count in (None, 0)]
    want = jax.tree.leaves((results[0][0].params, results[0][1]))
    for got, expected in zip(jax.tree.leaves((results[1][0].params, results[1][1])), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_the_door_refuses_a_loss_that_cannot_take_them(config):
    settings = run_plan.loss_settings(config)
    with pytest.raises(ConfigError, match=r"name='ntxent', which cannot take them: use one of \['clip', "):
        losses.check_candidates(
            "ntxent",
            losses.LOSSES["ntxent"],
            settings,
            global_batch_size=16,
            num_devices=8,
            micro_batches=1,
            has_negatives=True,
            captions_per_image=1,
        )


def write_table(tmp_path, kind, rows):
    """A CSV, JSONL or Parquet table of (image, captions, negatives) rows, 8 coloured PNGs."""
    (tmp_path / "img").mkdir(exist_ok=True)
    for k in range(8):
        Image.new("RGB", (16, 16), (30 * k, 200 - 20 * k, 90)).save(tmp_path / "img" / f"{k}.png")
    table = tmp_path / f"pairs.{kind}"
    if kind == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        columns = dict(zip(("image", "captions", "negatives"), map(list, zip(*rows))))
        pq.write_table(pa.table(columns), table, row_group_size=16)  # three row groups
    elif kind == "csv":
        with open(table, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image", "captions", "negatives"])  # two JSON lists
            writer.writerows(
                [image, json.dumps(captions), json.dumps(negatives)] for image, captions, negatives in rows
            )
    else:
        lines = [json.dumps({"image": i, "captions": c, "negatives": n}) for i, c, n in rows]
        table.write_text("\n".join(lines) + "\n")
    return table


def negatives_row(k):
    return (f"img/{k % 8}.png", [f"picture {k}"], [f"not picture {k}", f"nor {k + 1}"])


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_a_tables_negatives_reach_the_batch_and_the_step(config, tmp_path, kind):
    """`negatives` in a CSV (a JSON list), JSONL or Parquet (a list column) table: written to the records (a row
    with another count left out), read back as tokens [N, M, L] in each row's order, and
    trained on by clip; refused for a loss that cannot take them."""
    rows = [negatives_row(k) for k in range(40)]
    rows[5] = (rows[5][0], rows[5][1], ["only one"])
    write_records.write(f"{kind}:{write_table(tmp_path, kind, rows)}", str(tmp_path / "out"), max_bad=0.1)
    metadata = records.read_metadata(str(tmp_path / "out"))
    assert metadata.fields == ("image", "captions", "negatives") and metadata.splits["train"].num_records == 39
    assert metadata.num_negatives == M
    fields = {"data.records": str(tmp_path / "out"), "data.task": "pairs", "data.image_size": 16}
    config = override(config, fields | {"data.text_max_length": 16, "eval.split": "train"})
    trainer, before, batch, after, metrics = one_step(config, 8, None)
    kept = [row for k, row in enumerate(rows) if k != 5]
    want = [kept[i][2] for i in np.asarray(batch["index"])]
    tokenizer = input_pipeline.training_sources(data_settings(config))[0].tokenizer
    np.testing.assert_array_equal(batch["negatives"], [tokenizer.encode_batch(n, 16) for n in want])
    assert np.isfinite(metrics["loss"])
    with pytest.raises(ConfigError, match="cannot take them"):
        build(override(config, {"loss.name": "ntxent"}), sharding.make_mesh(8))


def test_a_split_with_another_count_of_negatives_is_not_added_to_a_record_set(tmp_path):
    """Every record of a set holds the same M: a split with another M (or none) goes to
    another folder, refused in one line before a record is written."""
    write_records.write(
        f"csv:{write_table(tmp_path, 'csv', [negatives_row(k) for k in range(8)])}", str(tmp_path / "out")
    )
    fewer = [(image, captions, negatives[:1]) for image, captions, negatives in map(negatives_row, range(8))]
    with pytest.raises(ConfigError, match=r"holds records with 2 hard negatives each, these have 1; write them"):
        write_records.write(f"jsonl:{write_table(tmp_path, 'jsonl', fewer)}", str(tmp_path / "out"), split="test")
    assert sorted(records.read_metadata(str(tmp_path / "out")).splits) == ["train"]


COLOURS = [(30 * k, 200 - 20 * k, 90) for k in range(8)]


def write_image_table(tmp_path, rows):
    """A CSV of images alone (no captions): (image, negatives) rows of 8 solid-colour PNGs'
    paths, so a crop or flip of any of them is that colour."""
    (tmp_path / "img").mkdir(exist_ok=True)
    for k, colour in enumerate(COLOURS):
        Image.new("RGB", (16, 16), colour).save(tmp_path / "img" / f"{k}.png")
    with open(tmp_path / "images.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "negatives"])
        writer.writerows([f"img/{k}.png", json.dumps([f"img/{n}.png" for n in negatives])] for k, negatives in rows)
    return tmp_path / "images.csv"


@pytest.mark.parametrize("jitter", [0.0, 0.4])
def test_an_image_sets_negatives_are_images_of_the_second_view(config, tmp_path, jitter):
    """In a table without captions (an image-image set, task "views"), `negatives` are
    image paths: written as the images' bytes (a missing one leaves its row out), read
    back as [N, M, H, W, C] pictures in each row's order (cropped and jittered as the
    row's b view: float32 with colour jitter), and trained on by clip; task "pairs" on
    them is refused in one line."""
    rows = [(k % 8, [(k + 1) % 8, (k + 3) % 8]) for k in range(40)]
    rows[7] = (rows[7][0], [1, 99])  # img/99.png does not exist
    write_records.write(f"csv:{write_image_table(tmp_path, rows)}", str(tmp_path / "out"), max_bad=0.1)
    metadata = records.read_metadata(str(tmp_path / "out"))
    assert metadata.fields == ("image", "negatives") and metadata.num_negatives == M
    assert metadata.splits["train"].num_records == 39
    fields = {"data.records": str(tmp_path / "out"), "data.task": "views", "data.image_size": 16}
    fields |= {"data.augment.color_jitter": jitter, "data.augment.noise_std": 0.0, "eval.split": "train"}
    config = override(config, fields)
    trainer, before, batch, after, metrics = one_step(config, 8, None)
    assert batch["negatives"].shape == (16, M, 16, 16, 3)
    assert batch["negatives"].dtype == (np.float32 if jitter else np.uint8)
    if not jitter:
        kept = [row for k, row in enumerate(rows) if k != 7]
        want = [[COLOURS[n] for n in kept[i][1]] for i in np.asarray(batch["index"])]
        np.testing.assert_array_equal(
            batch["negatives"], np.broadcast_to(np.array(want)[:, :, None, None], (16, M, 16, 16, 3))
        )
    assert np.isfinite(metrics["loss"])
    with pytest.raises(ConfigError, match=r"hard negatives are images: .* need config.data.task='views', not 'pairs'"):
        build(override(config, {"data.task": "pairs"}), sharding.make_mesh(8))
