"""write_records: every source round-trips through real files; bad inputs are reported and
left out; a rerun keeps the finished shards; workers write the same shards."""

import csv
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from contrastive_jax import images, records, write_records
from contrastive_jax.datasets import shapes


def encoded(mode: str, colour, image_format: str, size=(20, 16)) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, colour).save(out, image_format)
    return out.getvalue()


def read_back(directory, split="train"):
    """(metadata, the split's decoded records)."""
    metadata = records.read_metadata(directory)
    split_records = records.RecordSet(metadata, split)
    return metadata, [records.decode(r) for r in split_records.read_many(range(len(split_records)))]


@pytest.fixture
def image_files(tmp_path):
    """Image files of every kind the writer meets: name -> bytes (written in tmp_path/img)."""
    files = {
        "rgb.jpg": encoded("RGB", (200, 30, 30), "JPEG"),
        "grey.png": encoded("L", 90, "PNG"),
        "cmyk.jpg": encoded("CMYK", (0, 120, 200, 0), "JPEG"),
        "alpha.png": encoded("RGBA", (10, 200, 10, 128), "PNG"),
        "corrupt.jpg": encoded("RGB", (1, 2, 3), "JPEG")[:60],  # truncated
    }
    (tmp_path / "img").mkdir()
    for name, data in files.items():
        (tmp_path / "img" / name).write_bytes(data)
    return files


ROWS = [  # (image, captions, label); the corrupt image and the empty caption are left out
    ("img/rgb.jpg", ["a red picture", "red"], 0),
    ("img/grey.png", ["a grey one"], 1),
    ("img/corrupt.jpg", ["broken"], 2),
    ("img/cmyk.jpg", ["cyan, stored as CMYK", "cyan"], 2),
    ("img/alpha.png", [""], 0),
    ("img/alpha.png", ["green with alpha"], 0),
]
KEPT = [0, 1, 3, 5]


def check_round_trip(directory, image_files, capsys):
    metadata, examples = read_back(directory)
    assert metadata.fields == ("image", "captions", "label") and metadata.num_classes == 3
    assert [e["captions"] for e in examples] == [ROWS[k][1] for k in KEPT]
    assert [e["label"] for e in examples] == [ROWS[k][2] for k in KEPT]
    assert [e["image"] for e in examples] == [image_files[ROWS[k][0][4:]] for k in KEPT]  # bytes as they were
    np.testing.assert_array_equal(records.RecordSet(metadata, "train").labels(), [ROWS[k][2] for k in KEPT])
    for e in examples:  # every kept image decodes to RGB
        assert images.to_array(images.decode(e["image"], 3)).shape == (16, 20, 3)
    assert metadata.source["skipped"] == 2
    reported = capsys.readouterr().err
    assert "row 3 (img/corrupt.jpg): the image does not decode" in reported
    assert "row 5 (img/alpha.png): an empty caption" in reported


def test_csv_round_trip(tmp_path, image_files, capsys):
    table = tmp_path / "pairs.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "captions", "label"])  # captions: a JSON list
        writer.writerows([image, json.dumps(captions), label] for image, captions, label in ROWS)
    write_records.write(f"csv:{table}", str(tmp_path / "out"))
    check_round_trip(str(tmp_path / "out"), image_files, capsys)


def test_csv_with_one_caption_column(tmp_path, image_files):
    table = tmp_path / "pairs.csv"
    table.write_text("image,caption\nimg/rgb.jpg,a red picture\nimg/grey.png,a grey one\n")
    write_records.write(f"csv:{table}", str(tmp_path / "out"))
    metadata, examples = read_back(str(tmp_path / "out"))
    assert metadata.fields == ("image", "captions") and [e["captions"] for e in examples] == [
        ["a red picture"],
        ["a grey one"],
    ]


def test_jsonl_round_trip_with_two_splits(tmp_path, image_files, capsys):
    table = tmp_path / "pairs.jsonl"
    table.write_text("".join(json.dumps({"image": i, "captions": c, "label": label}) + "\n" for i, c, label in ROWS))
    write_records.write(f"jsonl:{table}", str(tmp_path / "out"))
    check_round_trip(str(tmp_path / "out"), image_files, capsys)
    write_records.write(f"jsonl:{table}", str(tmp_path / "out"), split="test")
    metadata = records.read_metadata(str(tmp_path / "out"))
    assert {name: s.num_records for name, s in metadata.splits.items()} == {"train": 4, "test": 4}


def test_webdataset_round_trip(tmp_path, image_files, capsys):
    folder = tmp_path / "wds"
    folder.mkdir()
    for shard, rows in enumerate((ROWS[:3], ROWS[3:])):
        with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
            for k, (image, captions, label) in enumerate(rows):
                key = f"{shard:05d}{k:04d}"
                caption_file = (
                    (".json", json.dumps({"captions": captions}).encode()) if k % 2 else (".txt", captions[0].encode())
                )
                suffix = os.path.splitext(image)[1]
                for name, data in ((suffix, image_files[image[4:]]), caption_file, (".cls", str(label).encode())):
                    info = tarfile.TarInfo(key + name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    write_records.write(f"webdataset:{folder}", str(tmp_path / "out"))
    metadata, examples = read_back(str(tmp_path / "out"))
    kept = [r for k, r in enumerate(ROWS) if k in KEPT]
    # .txt files hold the first caption only; .json files all of them.
    assert [e["captions"][0] for e in examples] == [captions[0] for _, captions, _ in kept]
    assert examples[1]["captions"] == ROWS[1][1] and examples[2]["captions"] == ROWS[3][1][:1]
    assert [e["image"] for e in examples] == [image_files[image[4:]] for image, _, _ in kept]
    assert [e["label"] for e in examples] == [label for _, _, label in kept] and metadata.source["skipped"] == 2


def test_tfds_round_trip(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed")

    class TinyCaptions(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {
                "image": tfds.features.Image(shape=(6, 5, 3)),
                "captions": tfds.features.Sequence({"text": tfds.features.Text()}),
                "label": tfds.features.ClassLabel(num_classes=4),
            }
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(7):
                pixels = np.full((6, 5, 3), 30 * i, np.uint8)
                yield i, {"image": pixels, "captions": {"text": [f"picture {i}", f"number {i}"]}, "label": i % 4}

    TinyCaptions(data_dir=str(tmp_path / "tfds")).download_and_prepare()
    write_records.write("tfds:tiny_captions", str(tmp_path / "out"), tfds_data_dir=str(tmp_path / "tfds"))
    metadata, examples = read_back(str(tmp_path / "out"))
    assert metadata.fields == ("image", "captions", "label")
    by_label = sorted(
        (e["captions"], e["label"], images.to_array(images.decode(e["image"], 3))[0, 0, 0]) for e in examples
    )
    assert by_label == sorted(([f"picture {i}", f"number {i}"], i % 4, 30 * i) for i in range(7))  # PNG: lossless


def test_shapes_are_a_function_of_the_seed(tmp_path):
    first = write_records.write("builtin:shapes", str(tmp_path / "a"), num_examples=60, seed=3, image_size=32)
    write_records.write("builtin:shapes", str(tmp_path / "b"), num_examples=60, seed=3, image_size=32)
    write_records.write("builtin:shapes", str(tmp_path / "c"), num_examples=60, seed=4, image_size=32)
    assert {n: s.num_records for n, s in first.splits.items()} == {"train": 54, "validation": 3, "test": 3}
    shard = first.splits["train"].shards[0]
    assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()
    assert (tmp_path / "a" / shard).read_bytes() != (tmp_path / "c" / shard).read_bytes()
    _, examples = read_back(str(tmp_path / "a"))
    for index, example in enumerate(examples[:10]):
        background, drawn = shapes.draw_shapes(3, index)
        assert example["label"] == shapes.KINDS.index(drawn[0].kind)
        for shape in drawn:  # every caption names every shape's kind and colour
            assert all(shape.kind in c and shape.colour in c for c in example["captions"])
        assert background in example["captions"][2]
        pixels = images.to_array(images.decode(example["image"], 3))
        centre = pixels[int((drawn[0].row + 0.5) * 32 / 3), int((drawn[0].column + 0.5) * 32 / 3)]
        np.testing.assert_allclose(centre, shapes.COLOURS[drawn[0].colour], atol=2)  # the shape is drawn there


def test_a_rerun_writes_only_the_missing_shards_and_workers_write_the_same(tmp_path):
    options = {"num_examples": 100, "seed": 0, "image_size": 16, "shards": 4}
    write_records.write("builtin:shapes", str(tmp_path / "one"), workers=1, **options)
    write_records.write("builtin:shapes", str(tmp_path / "two"), workers=2, **options)
    names = sorted(p.name for p in (tmp_path / "one").iterdir() if p.suffix == ".array_record")
    assert len(names) == 12
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    before = {name: os.stat(tmp_path / "one" / name).st_mtime_ns for name in names}
    (tmp_path / "one" / names[1]).unlink()
    write_records.write("builtin:shapes", str(tmp_path / "one"), workers=1, **options)
    rewritten = [name for name in names if os.stat(tmp_path / "one" / name).st_mtime_ns != before[name]]
    assert rewritten == [names[1]]
    assert (tmp_path / "one" / names[1]).read_bytes() == (tmp_path / "two" / names[1]).read_bytes()


@pytest.mark.parametrize(
    "argument, message",
    [
        ("--source=csv:/no/such.csv", "no such file"),
        ("--source=parquet:/x", "is not a source"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(tmp_path, argument, message):
    result = subprocess.run(
        [sys.executable, "-m", "contrastive_jax.write_records", argument, f"--out={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
