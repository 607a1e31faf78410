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

from contrastive_jax import write_records
from contrastive_jax.data import images, records
from contrastive_jax.data.builtin import shapes, sklearn_digits
from contrastive_jax.errors import ConfigError


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
    write_records.write(f"csv:{table}", str(tmp_path / "out"), max_bad=0.5)
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
    write_records.write(f"jsonl:{table}", str(tmp_path / "out"), max_bad=0.5)
    check_round_trip(str(tmp_path / "out"), image_files, capsys, place="line")
    write_records.write(f"jsonl:{table}", str(tmp_path / "out"), split="test", max_bad=0.5)
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
    metadata = write_records.write(f"jsonl:{table}", str(tmp_path / "out"), max_bad=0.9)
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
    write_records.write(f"webdataset:{folder}", str(tmp_path / "out"), max_bad=0.5)
    metadata, examples = read_back(str(tmp_path / "out"))
    kept = [r for k, r in enumerate(ROWS) if k in KEPT]
    # .txt files hold the first caption only; .json files all of them.
    assert [e["captions"][0] for e in examples] == [captions[0] for _, captions, _ in kept]
    assert examples[1]["captions"] == ROWS[1][1] and examples[2]["captions"] == ROWS[3][1][:1]
    assert [e["image"] for e in examples] == [image_files[image[4:]] for image, _, _ in kept]
    assert [e["label"] for e in examples] == [label for _, _, label in kept] and metadata.source["skipped"] == 2


@pytest.mark.slow
def test_tfds_round_trip(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed")

    class TinyCaptions(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {
                "image": tfds.features.Image(shape=(6, 5, 3)),
                "captions": tfds.features.Sequence({"text": tfds.features.Text()}),
                "label": tfds.features.ClassLabel(names=["ant", "bee", "cat", "dog", "eel"]),
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
    assert metadata.class_names == ("ant", "bee", "cat", "dog", "eel")  # its names, in its order
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


@pytest.mark.slow
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


@pytest.mark.slow
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
        (["--source=lance:/x"], "is not a source"),
        (["--source=parquet:/x"], "no Parquet files there"),
        (["--source=folder:/x"], "no such folder"),
        (["--source=builtin:shapes", "--max-bad=2"], "0 <= --max-bad <= 1"),
        (["--source=builtin:shapes", "--num-examples=2"], "--num-examples >= 3"),
        (["--source=builtin:shapes", "--workers=0"], "--workers >= 1"),
        ([], "--source must be given (see --help)."),
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


# --- labels as names, the bad-input budget --------------------------------------------

NAMED = [("img/rgb.jpg", "zebra"), ("img/grey.png", "ant"), ("img/cmyk.jpg", "mole"), ("img/alpha.png", "ant")]
IDS = {"ant": 0, "mole": 1, "zebra": 2}  # sorted, as ImageFolder and ClassLabel number them


def named_table(tmp_path, kind: str, rows=NAMED, name="pairs") -> str:
    """A CSV or JSONL file of `rows` (image, label), a caption each: its path."""
    path = tmp_path / f"{name}.{kind}"
    if kind == "csv":
        lines = ["image,caption,label", *(f"{image},a picture of {label},{label}" for image, label in rows)]
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(
            "".join(json.dumps({"image": i, "caption": f"a {label}", "label": label}) + "\n" for i, label in rows)
        )
    return str(path)


def write_tar(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("kind", ["csv", "jsonl", "webdataset_cls", "webdataset_json"])
def test_class_names_are_numbered_in_sorted_order_and_kept(tmp_path, image_files, kind):
    if kind.startswith("webdataset"):
        (tmp_path / "wds").mkdir()
        members = {}
        for k, (image, label) in enumerate(NAMED):
            members[f"{k:04d}.jpg" if image.endswith(".jpg") else f"{k:04d}.png"] = image_files[image[4:]]
            if kind == "webdataset_cls":
                members[f"{k:04d}.txt"], members[f"{k:04d}.cls"] = f"a {label}".encode(), label.encode()
            else:
                members[f"{k:04d}.json"] = json.dumps({"caption": f"a {label}", "label": label}).encode()
        write_tar(tmp_path / "wds" / "00000.tar", members)
        spec = f"webdataset:{tmp_path / 'wds'}"
    else:
        spec = f"{kind}:{named_table(tmp_path, kind)}"
    metadata = write_records.write(spec, str(tmp_path / "out"))
    _, examples = read_back(str(tmp_path / "out"))
    assert metadata.class_names == ("ant", "mole", "zebra") and metadata.num_classes == 3
    assert [e["label"] for e in examples] == [IDS[label] for _, label in NAMED]
    assert [metadata.class_names[e["label"]] for e in examples] == [label for _, label in NAMED]
    assert records.read_metadata(tmp_path / "out").class_names == ("ant", "mole", "zebra")  # stored


def test_a_second_split_is_numbered_as_the_first_and_an_unseen_name_stops(tmp_path, image_files):
    write_records.write(f"csv:{named_table(tmp_path, 'csv')}", str(tmp_path / "out"))
    test_rows = [("img/rgb.jpg", "zebra"), ("img/grey.png", "mole")]  # sorted alone, zebra would be 1
    metadata = write_records.write(
        f"jsonl:{named_table(tmp_path, 'jsonl', test_rows, 'test')}", str(tmp_path / "out"), split="test"
    )
    _, examples = read_back(str(tmp_path / "out"), "test")
    assert [e["label"] for e in examples] == [IDS["zebra"], IDS["mole"]]
    assert metadata.class_names == ("ant", "mole", "zebra") and set(metadata.splits) == {"train", "test"}
    unseen = named_table(tmp_path, "csv", [("img/rgb.jpg", "zebra"), ("img/grey.png", "yak")], "unseen")
    with pytest.raises(ConfigError, match=r"^split 'validation': the label 'yak' .* is not a class of the record set"):
        write_records.write(f"csv:{unseen}", str(tmp_path / "out"), split="validation")
    assert set(records.read_metadata(tmp_path / "out").splits) == {"train", "test"}


def test_a_row_without_a_label_among_names_is_a_bad_row(tmp_path, image_files, capsys):
    table = tmp_path / "pairs.csv"
    table.write_text("image,caption,label\nimg/rgb.jpg,red,cat\nimg/grey.png,grey,\nimg/cmyk.jpg,cyan,dog\n")
    metadata = write_records.write(f"csv:{table}", str(tmp_path / "out"), max_bad=0.4)
    assert metadata.class_names == ("cat", "dog") and metadata.splits["train"].num_records == 2
    assert "row 2 (img/grey.png): the label is missing" in capsys.readouterr().err


def test_digits_are_ids_and_a_few_names_among_them_are_bad_rows(tmp_path, image_files, capsys):
    rows = [("img/rgb.jpg", "2"), ("img/grey.png", "0"), ("img/cmyk.jpg", "cat"), ("img/alpha.png", "7")]
    metadata = write_records.write(f"csv:{named_table(tmp_path, 'csv', rows)}", str(tmp_path / "out"), max_bad=0.25)
    _, examples = read_back(str(tmp_path / "out"))
    assert [e["label"] for e in examples] == [2, 0, 7] and metadata.class_names == () and metadata.num_classes == 8
    assert "row 3 (img/cmyk.jpg): the label 'cat' is not an int >= 0" in capsys.readouterr().err


def run_command(*arguments):
    return subprocess.run(
        [sys.executable, "-m", "contrastive_jax.write_records", *arguments], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_a_label_column_of_names_where_ids_are_wanted_stops_in_one_line(tmp_path, image_files):
    ids = named_table(tmp_path, "csv", [(image, str(k)) for k, (image, _) in enumerate(NAMED)], "ids")
    assert run_command(f"--source=csv:{ids}", f"--out={tmp_path / 'out'}").returncode == 0
    names = named_table(tmp_path, "csv")
    result = run_command(f"--source=csv:{names}", f"--out={tmp_path / 'out'}", "--split=test")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: split 'test': the label column holds names ('ant', 'mole', 'zebra', ...): 4 of 4 labels are not ints "
        f">= 0, and the record set in {tmp_path / 'out'} numbers its classes; give every row an int, or a class "
        "name (names are numbered in sorted order), or raise --max-bad to leave those rows out."
    ]
    assert set(records.read_metadata(tmp_path / "out").splits) == {"train"}
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith("test")]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_an_all_bad_table_prints_20_bad_rows_then_counts_and_stops_at_its_budget(tmp_path, image_files, workers):
    """200 bad rows with room for 100 (--max-bad=0.5): at most 20 are printed, then one line
    says the rest are counted (the count is shared by the writer processes); one worker
    stops at bad row 101, not 200; the whole output is at most 25 lines and exit 2."""
    table = named_table(tmp_path, "csv", [("img/corrupt.jpg", "cat")] * 200)
    shards = ["--shards=1"] if workers == 1 else ["--shards=2", "--workers=2"]
    result = run_command(f"--source=csv:{table}", f"--out={tmp_path / 'out'}", "--max-bad=0.5", *shards)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) <= 25, lines
    assert sum(line.startswith("skipped ") for line in lines) == 20
    assert sum(line.startswith("... more bad inputs") for line in lines) == 1
    if workers == 1:
        assert lines[-1].startswith("error: split 'train': 101 inputs bad so far, more than the 100 --max-bad allows")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


@pytest.mark.slow
def test_more_bad_inputs_than_max_bad_stop_and_keep_no_split(tmp_path, image_files):
    rows = [("img/rgb.jpg", "cat")] * 150 + [("img/corrupt.jpg", "cat")] * 2  # 2 of 152: 1.3%
    table = named_table(tmp_path, "csv", rows)
    result = run_command(f"--source=csv:{table}", f"--out={tmp_path / 'out'}", "--shards=2", "--workers=2")
    assert result.returncode == 2
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        "error: split 'train': 2 inputs bad so far, more than the 1 --max-bad allows; most (2): the image does not "
        f"decode. The first 2: {table} row 151 (img/corrupt.jpg): the image does not decode (cannot decode the image "
        f"(OSError: Truncated File Read)); {table} row 152 (img/corrupt.jpg): the image does not decode (cannot "
        "decode the image (OSError: Truncated File Read)). Nothing of split 'train' is kept; fix the inputs or raise "
        "--max-bad."
    ]
    assert not (tmp_path / "out" / records.METADATA_FILE).exists()
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # no shard, no progress file
    assert run_command(f"--source=csv:{table}", f"--out={tmp_path / 'out'}", "--max-bad=0.02").returncode == 0
    assert records.read_metadata(tmp_path / "out").splits["train"].num_records == 150
    # Written again with a stricter budget (its shards kept from the first write): the split is gone, not half there.
    write_records.write(f"csv:{table}", str(tmp_path / "out"), split="test", max_bad=0.02)
    with pytest.raises(ConfigError, match=r"^split 'train': 2 inputs bad so far"):
        write_records.write(f"csv:{table}", str(tmp_path / "out"))
    metadata = records.read_metadata(tmp_path / "out")
    assert set(metadata.splits) == {"test"} and set(metadata.source["splits"]) == {"test"}
    assert metadata.source["skipped"] == 2 and not [p for p in (tmp_path / "out").rglob("train*")]


# --- folders, Parquet, tables as streams -----------------------------------------------


def test_an_image_folder_round_trips_with_sidecar_captions(tmp_path, image_files):
    tree = {"tulip/a.jpg": "rgb.jpg", "tulip/deep/b.png": "grey.png", "10/c.jpg": "cmyk.jpg", "2/d.png": "alpha.png"}
    for name, image in tree.items():
        (tmp_path / "flowers" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "flowers" / name).write_bytes(image_files[image])
    (tmp_path / "flowers" / "notes.txt").write_text("not a class folder")
    metadata = write_records.write(f"folder:{tmp_path / 'flowers'}", str(tmp_path / "plain"))
    _, examples = read_back(str(tmp_path / "plain"))
    assert metadata.fields == ("image", "label") and metadata.class_names == ("10", "2", "tulip")  # ImageFolder's
    order = ["10/c.jpg", "2/d.png", "tulip/a.jpg", "tulip/deep/b.png"]
    assert [(e["image"], e["label"]) for e in examples] == [
        (image_files[tree[n]], k) for k, n in zip([0, 1, 2, 2], order)
    ]
    for name in order[1:]:
        (tmp_path / "flowers" / name).with_suffix(".txt").write_text(f"  a flower, {name}\n")
    metadata = write_records.write(f"folder:{tmp_path / 'flowers'}", str(tmp_path / "captioned"), max_bad=0.5)
    _, examples = read_back(str(tmp_path / "captioned"))
    assert metadata.fields == ("image", "captions", "label") and metadata.source["skipped"] == 1
    assert [e["captions"] for e in examples] == [[f"a flower, {name}"] for name in order[1:]]
    assert "10/c.jpg: no caption file c.txt beside it" in metadata.source["skipped_first"][0]


def test_parquet_with_bytes_structs_and_paths_round_trips(tmp_path, image_files):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rgb, grey = image_files["rgb.jpg"], image_files["grey.png"]
    # img2dataset's layout: the image bytes in `jpg`, a `caption`; split over two files and row groups.
    pq.write_table(
        pa.table({"jpg": [rgb, grey, rgb], "caption": ["red", "grey", "red again"], "label": ["b", "a", "b"]}),
        tmp_path / "part-0.parquet",
        row_group_size=2,
    )
    pq.write_table(pa.table({"jpg": [grey], "caption": ["grey again"], "label": ["c"]}), tmp_path / "part-1.parquet")
    metadata = write_records.write(f"parquet:{tmp_path}", str(tmp_path / "out"), shards=3)
    _, examples = read_back(str(tmp_path / "out"))
    assert metadata.class_names == ("a", "b", "c") and metadata.fields == ("image", "captions", "label")
    assert [(e["image"], e["captions"], e["label"]) for e in examples] == [
        (rgb, ["red"], 1),
        (grey, ["grey"], 0),
        (rgb, ["red again"], 1),
        (grey, ["grey again"], 2),
    ]
    # Hugging Face datasets' Image struct (bytes, or a path), a list of captions, named columns.
    (tmp_path / "hf").mkdir()
    structs = [{"bytes": rgb, "path": None}, {"bytes": None, "path": str(tmp_path / "img" / "grey.png")}]
    table = pa.table({"picture": structs, "texts": [["one", "two"], ["three"]], "y": [3, 0]})
    class_label = {"y": {"names": ["n0", "n1", "n2", "n3"], "_type": "ClassLabel"}}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": class_label}})})
    pq.write_table(table, tmp_path / "hf" / "train.parquet")
    metadata = write_records.write(
        f"parquet:{tmp_path / 'hf' / '*.parquet'}",
        str(tmp_path / "hf_out"),
        image_column="picture",
        caption_column="texts",
        label_column="y",
    )
    _, examples = read_back(str(tmp_path / "hf_out"))
    assert [(e["image"], e["captions"], e["label"]) for e in examples] == [
        (rgb, ["one", "two"], 3),
        (grey, ["three"], 0),
    ]
    assert metadata.class_names == ("n0", "n1", "n2", "n3") and "--image-column=picture" in metadata.source["command"]
    with pytest.raises(
        ConfigError, match=r"has no pixels column \(its columns: picture, texts, y\); name it with --image-column"
    ):
        write_records.write(f"parquet:{tmp_path / 'hf'}", str(tmp_path / "x"), image_column="pixels")


def test_tables_are_read_as_streams_from_their_index(tmp_path, image_files, monkeypatch):
    from contrastive_jax.data import sources
    from contrastive_jax.data.sources import tables

    monkeypatch.setattr(tables, "INDEX_EVERY", 4)
    rows = [(f"img/{['rgb.jpg', 'grey.png'][k % 2]}", f'caption {k}, "quoted"\nover two lines') for k in range(23)]
    rows[10] = ("img/none.jpg", "a missing image")
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows[:10], (), *rows[10:]])  # a blank row
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps({"image": i, "caption": c}) for i, c in rows) + "\n\n")
    for kind, where in (("csv", "row 12 (img/none.jpg)"), ("jsonl", "line 11 (img/none.jpg)")):
        source = sources.TableSource(str(tmp_path / f"pairs.{kind}"), "train", kind)
        assert source.num_examples("train") == 23 and len(source.offsets) == 6
        for start, stop in ((0, 23), (5, 9), (8, 8), (10, 11), (13, 23), (22, 30)):
            got = list(source.examples("train", start, stop))
            assert [e.where if isinstance(e, sources.BadInput) else e["captions"][0] for e in got] == [
                f"{source.path} {where}" if k == 10 else c for k, (_, c) in enumerate(rows) if start <= k < stop
            ], (kind, start, stop)
