"""write_records: every source round-trips through real files; bad inputs are reported and
left out; a rerun keeps the finished shards; workers write the same shards."""

import csv
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from contrastive_jax import images, records, write_records
from contrastive_jax.config_lib import ConfigError
from contrastive_jax.datasets import shapes, sklearn_digits


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


def check_round_trip(directory, image_files, capsys, place="row"):
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
    assert f"{place} 3 (img/corrupt.jpg): the image does not decode" in reported
    assert f"{place} 5 (img/alpha.png): an empty caption" in reported


def test_csv_round_trip(tmp_path, image_files, capsys):
    table = tmp_path / "pairs.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "captions", "label"])  # captions: a JSON list
        writer.writerows([image, json.dumps(captions), label] for image, captions, label in ROWS)
    write_records.write(f"csv:{table}", str(tmp_path / "out"))
    check_round_trip(str(tmp_path / "out"), image_files, capsys)


def test_csv_with_caption_columns(tmp_path, image_files):
    table = tmp_path / "pairs.csv"
    absolute = tmp_path / "img" / "grey.png"
    table.write_text(f"image,caption,caption\nimg/rgb.jpg,a red picture,red\n{absolute},a grey one,grey\n")
    write_records.write(f"csv:{table}", str(tmp_path / "out"))
    metadata, examples = read_back(str(tmp_path / "out"))
    assert metadata.fields == ("image", "captions") and metadata.num_classes == 0
    assert [e["captions"] for e in examples] == [["a red picture", "red"], ["a grey one", "grey"]]
    assert examples[1]["image"] == image_files["grey.png"]  # an absolute path


def test_jsonl_round_trip_with_two_splits(tmp_path, image_files, capsys):
    table = tmp_path / "pairs.jsonl"
    table.write_text("".join(json.dumps({"image": i, "captions": c, "label": label}) + "\n" for i, c, label in ROWS))
    write_records.write(f"jsonl:{table}", str(tmp_path / "out"))
    check_round_trip(str(tmp_path / "out"), image_files, capsys, place="line")
    write_records.write(f"jsonl:{table}", str(tmp_path / "out"), split="test")
    metadata = records.read_metadata(str(tmp_path / "out"))
    assert {name: s.num_records for name, s in metadata.splits.items()} == {"train": 4, "test": 4}
    assert metadata.source["skipped"] == 4 and len(metadata.source["skipped_first"]) == 4
    assert {name: s["skipped"] for name, s in metadata.source["splits"].items()} == {"train": 2, "test": 2}
    assert "--split=test" in metadata.source["splits"]["test"]["command"]


def test_bad_rows_are_reported_and_left_out(tmp_path, image_files, capsys):
    table = tmp_path / "pairs.jsonl"
    lines = [
        {"image": "img/rgb.jpg", "caption": "kept", "label": 1},
        {"image": "img/rgb.jpg", "caption": "a label that is no int", "label": "cat"},
        {"image": "img/none.jpg", "caption": "a missing file", "label": 0},
        {"image": "img/grey.png", "captions": [], "label": 0},
        {"image": "img/grey.png", "captions": ["a", 3], "label": 0},
        {"image": "img/grey.png", "caption": "no label"},
        {"image": "img/grey.png", "caption": "a negative label", "label": -1},
    ]
    table.write_text("\n".join([*map(json.dumps, lines), "{not json", "", "[1, 2]"]) + "\n")  # 10 lines
    metadata = write_records.write(f"jsonl:{table}", str(tmp_path / "out"))
    _, examples = read_back(str(tmp_path / "out"))
    assert [(e["captions"], e["label"]) for e in examples] == [(["kept"], 1)]
    reported = capsys.readouterr().err
    for reason in (
        "line 2 (img/rgb.jpg): the label 'cat' is not an int",
        "line 3 (img/none.jpg): the image file is missing",
        "line 4 (img/grey.png): an empty caption",
        "line 5 (img/grey.png): a caption that is not text",
        "line 6 (img/grey.png): the label None is not an int >= 0",
        "line 7 (img/grey.png): the label -1 is not an int >= 0",
        "line 8: the line is not JSON",
        "line 10: the line is not a JSON object",
    ):
        assert reason in reported
        assert any(reason in kept for kept in metadata.source["skipped_first"])
    assert metadata.source["skipped"] == 8


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
                files = [(suffix, image_files[image[4:]]), caption_file, (".cls", str(label).encode())]
                if k % 2 == 0:  # img2dataset's metadata, without captions: the .txt file's caption is taken
                    files.append((".json", json.dumps({"url": "http://x", "status": "success"}).encode()))
                for name, data in files:
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
                "label": tfds.features.ClassLabel(num_classes=5),
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
    assert metadata.fields == ("image", "captions", "label") and metadata.num_classes == 5  # the ClassLabel's
    by_label = sorted(
        (e["captions"], e["label"], images.to_array(images.decode(e["image"], 3))[0, 0, 0]) for e in examples
    )
    assert by_label == sorted(([f"picture {i}", f"number {i}"], i % 4, 30 * i) for i in range(7))  # PNG: lossless
    np.testing.assert_array_equal(records.RecordSet(metadata, "train").labels(), [e["label"] for e in examples])
    write_records.write(
        "tfds:tiny_captions", str(tmp_path / "jpeg"), tfds_data_dir=str(tmp_path / "tfds"), encode="jpeg", shards=2
    )
    _, jpegs = read_back(str(tmp_path / "jpeg"))
    assert sorted(e["captions"] for e in jpegs) == sorted(e["captions"] for e in examples)
    for jpeg in jpegs:
        assert jpeg["image"][:2] == b"\xff\xd8"
        pixel = images.to_array(images.decode(jpeg["image"], 3))[0, 0, 0]
        assert abs(int(pixel) - 30 * int(jpeg["captions"][0].split()[1])) <= 2


def test_shapes_are_a_function_of_the_seed(tmp_path):
    first = write_records.write("builtin:shapes", str(tmp_path / "a"), num_examples=60, seed=3, image_size=32)
    write_records.write("builtin:shapes", str(tmp_path / "b"), num_examples=60, seed=3, image_size=32)
    write_records.write("builtin:shapes", str(tmp_path / "c"), num_examples=60, seed=4, image_size=32)
    assert {n: s.num_records for n, s in first.splits.items()} == {"train": 54, "validation": 3, "test": 3}
    assert (first.num_classes, first.source["seed"], first.source["image_size"]) == (len(shapes.KINDS), 3, 32)
    shard = first.splits["train"].shards[0]
    assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()
    assert (tmp_path / "a" / shard).read_bytes() != (tmp_path / "c" / shard).read_bytes()
    _, examples = read_back(str(tmp_path / "a"))
    for index, example in enumerate(examples[:10]):
        background, drawn = shapes.draw_shapes(3, index)
        assert example["label"] == shapes.KINDS.index(drawn[0].kind)
        captions = example["captions"]
        assert len(captions) == shapes.CAPTIONS_PER_PICTURE == len(set(captions))
        for shape in drawn:  # every caption names every shape's kind and colour; two its size and place
            assert all(shape.kind in c and shape.colour in c for c in captions)
            assert all(shape.size in c and shape.place[4:] in c for c in captions[:2])
        assert captions[1].startswith(shapes.COUNT_WORDS[len(drawn) - 1]) and background in captions[2]
        pixels = images.to_array(images.decode(example["image"], 3))
        centre = pixels[int((drawn[0].row + 0.5) * 32 / 3), int((drawn[0].column + 0.5) * 32 / 3)]
        np.testing.assert_allclose(centre, shapes.COLOURS[drawn[0].colour], atol=2)  # the shape is drawn there


def test_a_rerun_writes_only_the_missing_shards_and_workers_write_the_same(tmp_path):
    options = {"num_examples": 100, "seed": 0, "image_size": 16, "shards": 4}
    first = write_records.write("builtin:shapes", str(tmp_path / "one"), workers=1, **options)
    write_records.write("builtin:shapes", str(tmp_path / "two"), workers=2, **options)
    names = sorted(p.name for p in (tmp_path / "one").iterdir() if p.suffix == ".array_record")
    assert len(names) == 12
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert records.read_metadata(tmp_path / "two").splits == first.splits

    def rewritten(before):
        return [name for name in names if os.stat(tmp_path / "one" / name).st_mtime_ns != before[name]]

    before = {name: os.stat(tmp_path / "one" / name).st_mtime_ns for name in names}
    (tmp_path / "one" / names[1]).unlink()
    (tmp_path / "one" / f"{names[1]}.tmp").write_bytes(b"left by a killed writer")  # overwritten
    assert write_records.main(shlex.split(first.source["command"])[3:]) == 0  # the recorded command
    assert rewritten(before) == [names[1]]
    assert (tmp_path / "one" / names[1]).read_bytes() == (tmp_path / "two" / names[1]).read_bytes()
    assert records.read_metadata(tmp_path / "one") == first
    # The same names from another seed: no shard of the first is kept.
    write_records.write("builtin:shapes", str(tmp_path / "one"), workers=1, **(options | {"seed": 1}))
    assert len(rewritten(before)) == len(names)


def test_digits_workers_write_the_same_shards(tmp_path):
    one = write_records.write("builtin:sklearn_digits", str(tmp_path / "one"), shards=2)
    two = write_records.write("builtin:sklearn_digits", str(tmp_path / "two"), shards=2, workers=2)
    sizes = {"train": 1437, "test": 360, "disjoint_train": 1083, "disjoint_test": 714}
    assert {name: split.num_records for name, split in two.splits.items()} == sizes
    assert (two.fields, two.num_classes, two.image_channels) == (("image", "label"), 10, 1)
    for name in sizes:
        for shard in two.splits[name].shards:
            assert (tmp_path / "one" / shard).read_bytes() == (tmp_path / "two" / shard).read_bytes()
        np.testing.assert_array_equal(
            records.RecordSet(one, name).labels(), load_digits().target[sklearn_digits.split_indices()[name]]
        )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--source=csv:/no/such.csv"], "no such file"),
        (["--source=parquet:/x"], "is not a source"),
        (["--source=builtin:shapes", "--num-examples=2"], "--num-examples >= 3"),
        (["--source=builtin:shapes", "--workers=0"], "--workers >= 1"),
        ([], "the following arguments are required: --source"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(tmp_path, arguments, message):
    result = subprocess.run(
        [sys.executable, "-m", "contrastive_jax.write_records", *arguments, f"--out={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_tfds_without_tensorflow_datasets_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # `import` raises ImportError
    with pytest.raises(ConfigError, match=r"^--source=tfds:cifar10 needs .*pip install 'contrastive-jax\[tfds\]'"):
        write_records.write("tfds:cifar10", str(tmp_path / "out"))
