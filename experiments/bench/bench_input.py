"""The input pipeline's throughput and its cost at scale, against the limit and tf.data.

    python -m experiments.bench.bench_input            # about 15 minutes on 2 cores
    python -m experiments.bench.bench_input --quick    # a smaller run (a minute or two)
    python -m experiments.bench.bench_input --mixture-only   # mixed / single-set rate alone

Throughput, images/s to 224 x 224 and to 64 x 64 after JPEG decode + random resized crop
(scale 0.08-1) + flip, from JPEGs of 256-500 px a side (generated `shapes` pictures with
a texture, quality 90):

* `limit`: the same decode and augmentation (`images.decode`, `images.augmented`) in a
  tight loop over in-memory JPEG bytes on both cores (two processes), no pipeline;
  `limit_full_decode` the same without the DCT-domain downscaling (PIL's `draft`);
* `pipeline`: `input_pipeline.train_dataset` on a record set of those JPEGs (written by
  `write_records` from a CSV), 2 grain workers, image-text pairs (a caption drawn and
  tokenized per row);
* `mixed`: the pipeline on a mixture of two record sets (the set and a copy of it, in
  another directory, weights 0.7 / 0.3), timed alternately with `pipeline`:
  `mixed_over_single` is the cost of the mixing alone (goal >= 0.95; `--mixture-only`
  measures only this);
* `tf_data`: the tf.data pipeline this replaced, on the same JPEG bytes in memory:
  `tf.io.decode_jpeg`, `tf.image.stateless_sample_distorted_bounding_box` + resize +
  flip (the old `input_pipeline._augment`), AUTOTUNE parallelism (needs the tfds extra).

Scale: a 0.5 GB and an 8 GB record set (the same JPEGs repeated), each read by a fresh
process (2 workers, 224 px): seconds from the start of the process to the first batch,
and the peak resident memory of the process and its workers after 40 batches.

In training (`--training`): the share of step time the loop waited for input
(`train/input_wait_share`, logged every logging step) in `configs/cmudict_clip.py` and
in `configs/clip_shapes.py` (ViT-Ti and text-Transformer towers on the generated set),
each run for a few hundred steps on 8 simulated devices.

Writes `experiments/results/bench_input/results.json` and `results.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import multiprocessing
import os
import pathlib
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS

RESULTS = ALL_RESULTS / "bench_input"
BATCH = 64
SIZES = (224, 64)
MIN_AREA = 0.08


def source_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """`count` JPEGs of 256-500 px a side: generated shapes on a textured background."""
    from PIL import Image, ImageFilter

    from contrastive_jax.data.builtin import shapes

    rng = np.random.default_rng(seed)
    out = []
    for index in range(count):
        width, height = rng.integers(256, 501, size=2)
        background, drawn = shapes.draw_shapes(seed, index)
        picture = np.asarray(shapes.picture(background, drawn, 512).resize((width, height)), np.float32)
        texture = rng.normal(0, 25, (height, width, 1)).astype(np.float32)
        image = Image.fromarray(np.clip(picture + texture, 0, 255).astype(np.uint8)).filter(ImageFilter.SMOOTH)
        encoded = io.BytesIO()
        image.save(encoded, "JPEG", quality=90)
        out.append(encoded.getvalue())
    return out


def _augment_all(args) -> int:
    """One process of the limit: decode + augment each JPEG; returns the count."""
    jpegs, size, draft = args
    from contrastive_jax.data import images
    from contrastive_jax.data.settings import Augment

    aug = Augment(crop_min_area=MIN_AREA, flip=True, color_jitter=0.0, noise_std=0.0)
    rng = np.random.default_rng(0)
    for encoded in jpegs:
        image = images.decode(encoded, 3, size if draft else None)
        images.augmented(image, size, aug, rng.uniform(size=images.NUM_DRAWS))
    return len(jpegs)


def limit(jpegs: list[bytes], size: int, draft: bool = True) -> float:
    """Images/s of decode + augmentation in a tight loop on two processes."""
    halves = [(jpegs[0::2], size, draft), (jpegs[1::2], size, draft)]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_augment_all, [(j[:4], s, d) for j, s, d in halves])  # imports, warm-up
        start = time.perf_counter()
        count = sum(pool.map(_augment_all, halves))
    return count / (time.perf_counter() - start)


def write_record_set(jpegs: list[bytes], folder: pathlib.Path) -> tuple[str, float]:
    """The JPEGs as files and a CSV, written as records by `write_records` (2 workers):
    (the record set's directory, images/s of the writer)."""
    from contrastive_jax import write_records

    (folder / "img").mkdir(parents=True, exist_ok=True)
    lines = ["image,caption"]
    for k, encoded in enumerate(jpegs):
        (folder / "img" / f"{k}.jpg").write_bytes(encoded)
        lines.append(f"img/{k}.jpg,picture number {k}")
    (folder / "pairs.csv").write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    write_records.write(f"csv:{folder / 'pairs.csv'}", str(folder / "records"), workers=2, shards=8)
    return str(folder / "records"), len(jpegs) / (time.perf_counter() - start)


def _settings(records_dir: str, size: int, workers: int = 2):
    from contrastive_jax.data.settings import Augment, DataSettings

    return DataSettings(
        name=None, records=records_dir, task="pairs", global_batch_size=BATCH, data_dir=None,
        train_split="train", train_class_range=None, seed=0, image_size=size, text_max_length=32,
        tokenizer="bytes", examples_per_class=1, num_workers=workers, prefetch_batches=2, on_bad_record="stop",
        augment=Augment(crop_min_area=MIN_AREA, flip=True, color_jitter=0.0, noise_std=0.0),
    )  # fmt: skip


def _images_per_second(batches, num_batches: int) -> float:
    """Images/s of `num_batches` batches of `batches` (an iterator), after 4 of warm-up."""
    for _ in range(4):
        next(batches)
    start = time.perf_counter()
    for _ in range(num_batches):
        next(batches)
    return num_batches * BATCH / (time.perf_counter() - start)


def pipeline(records_dir: str, size: int, num_batches: int, workers: int = 2) -> float:
    """Images/s of the grain pipeline (`workers` processes), after 4 batches of warm-up."""
    from contrastive_jax.data import input_pipeline

    batches = iter(input_pipeline.train_dataset(_settings(records_dir, size, workers)))
    return _images_per_second(batches, num_batches)


def mixture_rates(records_dir: str, size: int, num_batches: int, workers: int = 2, rounds: int = 2) -> dict:
    """Images/s of `pipeline` and of the pipeline on a mixture of the record set and a copy
    of it (`<records_dir>_b`, weights 0.7 / 0.3), each the median of `rounds` runs taken
    alternately (the machine's load shared), and their ratio, `mixed_over_single`."""
    from contrastive_jax.data import input_pipeline

    copy = f"{records_dir}_b"
    if not os.path.exists(copy):
        shutil.copytree(records_dir, copy)
    single = _settings(records_dir, size, workers)
    mixed = dataclasses.replace(single, mixture_records=(records_dir, copy), mixture_weights=(0.7, 0.3))
    rates = {"pipeline": [], "mixed": []}
    for _ in range(rounds):
        for name, data in (("pipeline", single), ("mixed", mixed)):
            rates[name].append(_images_per_second(iter(input_pipeline.train_dataset(data)), num_batches))
    out = {name: float(np.median(values)) for name, values in rates.items()}
    return out | {"mixed_over_single": out["mixed"] / out["pipeline"]}


def tf_data(jpegs: list[bytes], size: int, num_batches: int) -> float | None:
    """Images/s of tf.data's decode + the old augmentation, AUTOTUNE; None without TF."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    tf.config.set_visible_devices([], "GPU")

    def augment(encoded, index):
        image = tf.cast(tf.io.decode_jpeg(encoded, channels=3), tf.float32) / 255.0
        seeds = tf.random.experimental.stateless_split(tf.stack([tf.constant(0, tf.int64), index]), 2)
        begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image), bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seeds[0],
            min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(MIN_AREA, 1.0),
            use_image_if_no_bounding_boxes=True,
        )  # fmt: skip
        image = tf.image.resize(tf.slice(image, begin, crop), [size, size], antialias=True)
        return tf.image.stateless_random_flip_left_right(image, seeds[1])

    dataset = tf.data.Dataset.from_tensor_slices(jpegs).enumerate().repeat()
    dataset = dataset.map(lambda i, e: augment(e, i), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = iter(dataset.batch(BATCH).prefetch(2))
    return _images_per_second(batches, num_batches)


def repeated_record_set(jpegs: list[bytes], folder: pathlib.Path, gigabytes: float) -> str:
    """A record set of `gigabytes` of the JPEGs repeated (with captions), written directly."""
    from contrastive_jax.data import records

    per = sum(map(len, jpegs)) / len(jpegs)
    count = int(gigabytes * 2**30 / per)
    shards, sizes = [], []
    for k, start in enumerate(range(0, count, 20_000)):
        stop = min(count, start + 20_000)
        name = records.shard_name("train", k, -(-count // 20_000))
        examples = ({"image": jpegs[i % len(jpegs)], "captions": [f"picture {i}"]} for i in range(start, stop))
        sizes.append(records.write_shard(str(folder / name), examples))
        shards.append(name)
    split = records.Split(tuple(shards), tuple(sizes))
    records.write_metadata(records.Metadata(str(folder), {"train": split}, ("image", "captions")))
    return str(folder)


def scale_probe(records_dir: str, num_batches: int) -> None:
    """(In a fresh process.) Prints JSON: seconds to the first batch, peak RSS (MiB)."""
    started = time.perf_counter()
    from contrastive_jax.data import input_pipeline

    batches = iter(input_pipeline.train_dataset(_settings(records_dir, 224)))
    next(batches)
    first = time.perf_counter() - started
    for _ in range(num_batches):
        next(batches)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = _children_rss_mib()
    print(json.dumps({"seconds_to_first_batch": first, "peak_rss_mib": own, "workers_rss_mib": workers}))


def _children_rss_mib() -> float:
    """The resident memory of this process's live children (grain's workers), MiB."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                status = pathlib.Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields.get("PPid", "0").strip()) == os.getpid():
                total += int(fields["VmHWM"].split()[0]) / 1024
    return total


def scale(jpegs: list[bytes], folder: pathlib.Path, sizes_gb: tuple[float, ...], num_batches: int) -> dict:
    out = {}
    for gigabytes in sizes_gb:
        directory = folder / f"set_{gigabytes}gb"
        directory.mkdir(parents=True, exist_ok=True)
        repeated_record_set(jpegs, directory, gigabytes)
        on_disk = sum(f.stat().st_size for f in directory.iterdir()) / 2**30
        code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from experiments.bench import bench_input; "
        code += f"bench_input.scale_probe({str(directory)!r}, {num_batches})"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        out[f"{gigabytes} GB"] = json.loads(result.stdout.strip().splitlines()[-1]) | {"gib_on_disk": on_disk}
        for f in directory.iterdir():  # 8 GB: not kept
            f.unlink()
        print(f"scale {gigabytes} GB: {out[f'{gigabytes} GB']}", flush=True)
    return out


TRAINING_RUNS = {  # config -> overrides: a few hundred steps, logged every 25
    "cmudict_clip": ["--config.train.num_train_steps=300", "--config.eval.every_steps=0"],
    "clip_shapes": ["--config.train.num_train_steps=100", "--config.eval.every_steps=0"],
}


def training(folder: pathlib.Path) -> dict:
    """Each `TRAINING_RUNS` run's input-wait shares (every logging step but the first)."""
    from contrastive_jax import run_dir

    out = {}
    for config, overrides in TRAINING_RUNS.items():
        workdir = folder / config
        command = [sys.executable, "-m", "contrastive_jax.main", f"--config=configs/{config}.py"]
        command += [f"--workdir={workdir}", "--config.train.log_every_steps=25", *overrides]
        started = time.perf_counter()
        subprocess.run(command, cwd=REPO, check=True, capture_output=True)
        lines = run_dir.read_metrics(workdir)
        shares = [line["train/input_wait_share"] for line in lines if "train/input_wait_share" in line]
        speed = [line["train/examples_per_second"] for line in lines if "train/examples_per_second" in line]
        out[config] = {
            "input_wait_share_mean": float(np.mean(shares)),
            "input_wait_share_max": float(np.max(shares)),
            "examples_per_second": float(np.median(speed)),
            "seconds": time.perf_counter() - started,
        }
        print(f"training {config}: {out[config]}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer images and batches, 0.1 / 0.5 GB sets")
    parser.add_argument("--training", action="store_true", help="also the input-wait share of two training runs")
    parser.add_argument("--mixture-only", action="store_true", help="only the mixed / single-set rate")
    args = parser.parse_args()
    num_images, num_batches = (256, 8) if args.quick else (1024, 40)
    sizes_gb = (0.1, 0.5) if args.quick else (0.5, 8.0)
    jpegs = source_jpegs(num_images)
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": os.getloadavg()},
        "source": {"images": num_images, "mean_kib": sum(map(len, jpegs)) / len(jpegs) / 1024, "batch": BATCH},
        "throughput": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        records_dir, written = write_record_set(jpegs, pathlib.Path(tmp))
        results["writer_images_per_second"] = written
        for size in SIZES:
            row = mixture_rates(records_dir, size, num_batches)
            print(f"{size} px, mixture: {json.dumps(row)}", flush=True)
            if args.mixture_only:
                results["throughput"][f"{size}px"] = row
                continue
            row |= {
                "limit": limit(jpegs, size),
                "limit_full_decode": limit(jpegs, size, draft=False),
                "tf_data": tf_data(jpegs, size, num_batches),
            }
            row["pipeline_over_limit"] = row["pipeline"] / row["limit"]
            row["pipeline_over_tf_data"] = row["tf_data"] and row["pipeline"] / row["tf_data"]
            results["throughput"][f"{size}px"] = row
            print(f"{size} px: {json.dumps(row)}", flush=True)
        if not args.mixture_only:
            results["scale"] = scale(jpegs, pathlib.Path(tmp), sizes_gb, num_batches)
        if args.training:
            results["training"] = training(pathlib.Path(tmp))
    out = RESULTS / ("quick" if args.quick else "") / ("mixture" if args.mixture_only else "")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(report(results))
    print(report(results))


def report(results: dict) -> str:
    lines = [
        "# Input pipeline: throughput and scale",
        "",
        f"{results['source']['images']} JPEGs of 256-500 px (mean {results['source']['mean_kib']:.0f} KiB), "
        f"batches of {results['source']['batch']}, {results['machine']['cpus']} CPUs "
        f"(load before: {results['machine']['load_before'][0]:.2f}).",
        "",
    ]
    rows = results["throughput"]
    if all("limit" in row for row in rows.values()):
        lines += _throughput_table(rows)
    lines += ["| output | pipeline (one set) | mixed (two sets, 0.7 / 0.3) | mixed / one set |", "|---|---|---|---|"]
    for size, row in rows.items():
        lines.append(f"| {size} | {row['pipeline']:.0f} | {row['mixed']:.0f} | {row['mixed_over_single']:.2f} |")
    lines += ["", f"Writer (`write_records`, csv, 2 workers): {results['writer_images_per_second']:.0f} images/s.", ""]
    if "scale" in results:
        lines += [
            "| record set | on disk | first batch (s) | peak RSS, trainer (MiB) | workers (MiB) |",
            "|---|---|---|---|---|",
        ]
        for name, row in results["scale"].items():
            lines.append(
                f"| {name} | {row['gib_on_disk']:.2f} GiB | {row['seconds_to_first_batch']:.2f} | "
                f"{row['peak_rss_mib']:.0f} | {row['workers_rss_mib']:.0f} |"
            )
    if "training" in results:
        lines += ["", "| training run | input wait, mean | max | examples/s |", "|---|---|---|---|"]
        for name, row in results["training"].items():
            lines.append(
                f"| `configs/{name}.py` | {row['input_wait_share_mean']:.1%} | {row['input_wait_share_max']:.1%} "
                f"| {row['examples_per_second']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def _throughput_table(rows: dict) -> list[str]:
    """The table of each output size's rates: the limit, the pipeline, tf.data."""
    lines = [
        "| output | limit (2 procs) | limit, full decode | pipeline (2 workers) | tf.data | pipeline / limit |"
        " pipeline / tf.data |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, row in rows.items():
        tf_cell = f"{row['tf_data']:.0f}" if row["tf_data"] else "n/a"
        ratio = f"{row['pipeline_over_tf_data']:.2f}" if row["tf_data"] else "n/a"
        lines.append(
            f"| {size} | {row['limit']:.0f} | {row['limit_full_decode']:.0f} | {row['pipeline']:.0f} | {tf_cell} "
            f"| {row['pipeline_over_limit']:.2f} | {ratio} |"
        )
    return [*lines, ""]


if __name__ == "__main__":
    main()
