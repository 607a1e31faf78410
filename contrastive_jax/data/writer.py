"""Writes a source as a record set (`write`): its splits in shards, in parallel, resumable,
bad inputs left out and counted; and the built-in datasets' records (`write_builtin`),
which a run of a built-in dataset writes first.

The command `python -m contrastive_jax.write_records` calls `write`; its help (that
module's docstring) says what each source reads and how labels, bad inputs, shards and
reruns are handled. The sources themselves are in `sources`; the reader of what is
written is `records`.
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import io
import json
import multiprocessing
import os
import re
import shlex
import sys

import numpy as np

from contrastive_jax.data import records, settings
from contrastive_jax.data.sources import BadInput, ClassLabels, is_class_id, open_source
from contrastive_jax.errors import ConfigError

RECORDS_PER_SHARD = 10_000
MAX_REASONS_KEPT = 20
MAX_BAD = 0.01  # the share of a split's inputs that may be bad (--max-bad)
BAD_ROWS_SHOWN = 5  # the bad inputs a stopped command names
BAD_ROWS_PRINTED = 20  # the bad inputs printed as they are found; the rest are counted
_PROGRESS_DIR = ".progress"  # per finished shard: what the metadata needs of it, for a rerun


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """Records [start, stop) of a split, written to `path`; `key` says what they are (the
    source, its options and its class names), so a rerun keeps the shard only if it was
    written alike."""

    split: str
    start: int
    stop: int
    path: str
    key: str


class _TooManyBad(ConfigError):
    """More of a split's inputs are bad than `--max-bad` allows (the message says why)."""


class _BadInputsPrinted:
    """The bad inputs printed so far, counted across the writer processes: the first
    `BAD_ROWS_PRINTED` are printed as they are found, then one line says the rest are
    only counted (a shard of 10,000 rows with a wrong image column prints 21 lines)."""

    def __init__(self, context=multiprocessing):
        self._count = context.Value("i", 0)

    def report(self, bad: BadInput) -> None:
        with self._count.get_lock():
            count = self._count.value
            self._count.value += 1
        if count < BAD_ROWS_PRINTED:
            print(f"skipped {bad.where}: {bad.reason}", file=sys.stderr, flush=True)
        elif count == BAD_ROWS_PRINTED:
            note = f"... more bad inputs: counted, not printed (the first {BAD_ROWS_PRINTED} are above)"
            print(note, file=sys.stderr, flush=True)


def _progress_file(task: ShardTask) -> str:
    return os.path.join(os.path.dirname(task.path), _PROGRESS_DIR, os.path.basename(task.path) + ".json")


def _write_shard(source, task: ShardTask, max_bad: int, printed: _BadInputsPrinted) -> dict:
    """Writes one shard, reporting its bad inputs as they are found (`printed`); returns
    what the metadata needs of it (`num_records`, `labels` (ids), `skipped` [where,
    reason] pairs, `longest` text), kept from an earlier run when the shard is there and
    was written by the same task. Stops at its bad input `max_bad + 1`: the split is over
    its budget then, whatever the other shards hold (the caller removes what was written)."""
    progress = _progress_file(task)
    if os.path.exists(task.path) and os.path.exists(progress):
        with open(progress) as f:
            done = json.load(f)
        if done.pop("key", None) == task.key:
            return done | {"kept": True}
    labels, skipped, longest = [], [], 0

    def good_examples():
        nonlocal longest
        for example in source.examples(task.split, task.start, task.stop):
            if isinstance(example, BadInput):
                printed.report(example)
                skipped.append([example.where, example.reason])
                if len(skipped) > max_bad:
                    return
                continue
            if "label" in example:
                labels.append(example["label"])
            longest = max(longest, len(example.get("text", "").encode()), len(example.get("sequence", ())))
            yield example

    count = records.write_shard(task.path, good_examples())
    result = {"num_records": count, "labels": labels, "skipped": skipped, "longest": longest}
    if len(skipped) > max_bad:  # stopped: nothing to keep for a rerun
        return result
    os.makedirs(os.path.dirname(progress), exist_ok=True)
    with open(f"{progress}.tmp", "w") as f:
        json.dump(result | {"key": task.key}, f)
    os.replace(f"{progress}.tmp", progress)
    return result


_worker_args = None  # (source, max_bad, printed): `_write_shard`'s, in a writer process


def _set_worker_args(source, max_bad: int, printed: _BadInputsPrinted) -> None:
    global _worker_args
    _worker_args = source, max_bad, printed


def _write_shard_in_worker(numbered_task: tuple[int, ShardTask]) -> tuple[int, dict]:
    number, task = numbered_task
    source, max_bad, printed = _worker_args
    return number, _write_shard(source, task, max_bad, printed)


def _run(source, tasks: list[ShardTask], workers: int, max_bad: int) -> list[dict]:
    """Each task's `_write_shard` result, in order, written by `workers` processes (the
    source is sent to each once); prints a line per shard as it is done.

    Raises:
      _TooManyBad: more than `max_bad` inputs skipped (the shards not started are not
        written).
    """
    results: list[dict] = [{}] * len(tasks)

    def report(number: int, result: dict) -> None:
        results[number] = result
        kept = ", kept from an earlier run" if result.get("kept") else ""
        done = sum(bool(r) for r in results)
        print(
            f"[{done}/{len(tasks)}] {os.path.basename(tasks[number].path)}: {result['num_records']:,} records, "
            f"{len(result['skipped'])} skipped{kept}",
            file=sys.stderr,
            flush=True,
        )
        skipped = [bad for r in results if r for bad in r["skipped"]]
        if len(skipped) > max_bad:
            raise _TooManyBad(_too_many_bad(tasks[0].split, skipped, max_bad))

    if workers <= 1 or len(tasks) == 1:
        printed = _BadInputsPrinted()
        for number, task in enumerate(tasks):
            report(number, _write_shard(source, task, max_bad, printed))
        return results
    context = multiprocessing.get_context("spawn")
    # An executor, not a multiprocessing.Pool: a process that dies raises BrokenProcessPool
    # here (a Pool would start another and wait forever).
    with concurrent.futures.ProcessPoolExecutor(
        min(workers, len(tasks)),
        mp_context=context,
        initializer=_set_worker_args,
        initargs=(source, max_bad, _BadInputsPrinted(context)),
    ) as pool:
        futures = [pool.submit(_write_shard_in_worker, t) for t in enumerate(tasks)]
        try:
            for future in concurrent.futures.as_completed(futures):
                report(*future.result())
        except _TooManyBad:
            pool.shutdown(cancel_futures=True)
            raise
    return results


def _too_many_bad(split: str, skipped: list[list[str]], max_bad: int) -> str:
    """Why a split is stopped: how many inputs are bad, the most common cause (a reason
    less its details: quoted values, and what follows " (") and the first `BAD_ROWS_SHOWN`."""
    causes = collections.Counter(re.sub(r" ?'[^']*'", "", reason.split(" (")[0]) for _, reason in skipped)
    cause, count = causes.most_common(1)[0]
    first = "; ".join(f"{where}: {reason}" for where, reason in skipped[:BAD_ROWS_SHOWN])
    return (
        f"split {split!r}: {len(skipped):,} inputs bad so far, more than the {max_bad:,} --max-bad allows; "
        f"most ({count:,}): {cause}. The first {min(len(skipped), BAD_ROWS_SHOWN)}: {first}. Nothing of split "
        f"{split!r} is kept; fix the inputs or raise --max-bad."
    )


def _class_labels(source, split: str, existing: records.Metadata | None, max_bad: int) -> ClassLabels | None:
    """How split `split`'s labels are numbered (None: the source's labels are ids): by the
    names of the record set the split is added to; else, for a folder or a label column
    of mostly names, by the split's names, sorted; else they are ids.

    Raises:
      ConfigError: a name the record set does not have, or more than `max_bad` names
        where the labels are ids.
    """
    counts = source.label_counts(split)
    if counts is None:
        return None
    names = {str(value) for value in counts}
    named = [value for value in counts if not is_class_id(value)]
    total, named_count = sum(counts.values()), sum(counts[value] for value in named)
    if existing is not None and existing.class_names:
        unseen = sorted(names - set(existing.class_names))
        if unseen:
            raise ConfigError(
                f"split {split!r}: the label {unseen[0]!r} (and {len(unseen) - 1} more) is not a class of the record "
                f"set in {existing.directory}, whose {len(existing.class_names)} classes were named when it was "
                f"first written ({', '.join(existing.class_names[:5])}, ...); leave those rows out, or write them "
                "to another --out."
            )
        return ClassLabels(existing.class_names)
    ids_already = existing is not None and existing.num_classes > 0
    if not ids_already and (source.labels_are_names or 2 * named_count > total):
        return ClassLabels(tuple(sorted(names)))
    if named_count > max_bad:
        why = f"the record set in {existing.directory} numbers its classes" if ids_already else "most labels are ints"
        raise ConfigError(
            f"split {split!r}: the label column holds names ({', '.join(map(repr, sorted(named)[:5]))}, ...): "
            f"{named_count:,} of {total:,} labels are not ints >= 0, and {why}; give every row an int, or a "
            "class name (names are numbered in sorted order), or raise --max-bad to leave those rows out."
        )
    return ClassLabels()


def _command(spec: str, out: str, split: str, shards: int, workers: int, options: dict) -> str:
    """The command line that writes (or resumes writing) these splits."""
    split_flag = {} if spec.startswith("builtin:") else {"split": split}  # built-ins write all their splits
    flags = {"source": spec, "out": out, **split_flag, "shards": shards, "workers": workers, **options}
    words = [f"--{name.replace('_', '-')}={value}" for name, value in flags.items() if value is not None]
    return shlex.join(["python", "-m", "contrastive_jax.write_records", *words])


def _remove_split(name: str, tasks: list[ShardTask], existing: records.Metadata | None) -> None:
    """Leaves nothing of split `name` in its record set: its shards (whole or not), their
    progress files, its labels, and its entry in the metadata of an earlier write."""
    out = os.path.dirname(tasks[0].path)
    paths = [path for task in tasks for path in (task.path, f"{task.path}.tmp", _progress_file(task))]
    for path in [*paths, records.labels_file(out, name)]:
        if os.path.exists(path):
            os.remove(path)
    if existing is not None and name in existing.splits:
        summaries = {k: v for k, v in existing.source.get("splits", {}).items() if k != name}
        source = existing.source | _with_totals(summaries)
        records.write_metadata(
            dataclasses.replace(existing, splits={k: v for k, v in existing.splits.items() if k != name}, source=source)
        )


def _write_split(
    source, name: str, out: str, shards: int, workers: int, key: dict, existing: records.Metadata | None, max_bad: float
) -> tuple[records.Split, dict]:
    """Writes split `name` of `source` into `out` (its shards and labels): its `Split`,
    and a summary: the inputs `skipped` (a count and the first reasons), the labels'
    `num_classes` and `class_names`, and the `longest` text (bytes) or sequence.

    Raises:
      ConfigError: the labels cannot be numbered, or more than `max_bad` (a fraction) of
        the split's inputs are bad; then none of the split's shards are left in `out`.
    """
    size = source.num_examples(name)
    allowed = int(max_bad * size)
    class_labels = _class_labels(source, name, existing, allowed)
    if class_labels is not None:
        source = source.numbered(class_labels)
    class_names = (class_labels and class_labels.names) or tuple(source.info.get("class_names", ()))
    count = shards or max(1, -(-size // RECORDS_PER_SHARD))
    bounds = [size * k // count for k in range(count + 1)]
    tasks = [
        ShardTask(
            name,
            bounds[k],
            bounds[k + 1],
            os.path.join(out, records.shard_name(name, k, count)),
            json.dumps(key | {"split": name, "range": bounds[k : k + 2], "class_names": list(class_names)}),
        )
        for k in range(count)
    ]
    try:
        results = _run(source, tasks, workers, allowed)
    except _TooManyBad:
        _remove_split(name, tasks, existing)
        raise
    labels = [label for r in results for label in r["labels"]]
    if labels:
        np.save(records.labels_file(out, name), np.asarray(labels, np.int32))
    skipped = [f"{where}: {reason}" for r in results for where, reason in r["skipped"]]
    summary = {
        "skipped": len(skipped),
        "skipped_first": skipped[:MAX_REASONS_KEPT],
        "num_classes": len(class_names) or (max(labels) + 1 if labels else 0),
        "class_names": class_names,
        "longest": max(r["longest"] for r in results),
    }
    return records.Split(
        tuple(os.path.basename(t.path) for t in tasks), tuple(r["num_records"] for r in results)
    ), summary


def write(
    source_spec: str,
    out: str,
    *,
    split: str = "train",
    shards: int = 0,
    workers: int = 1,
    encode: str = "png",
    tfds_data_dir: str | None = None,
    num_examples: int = 10_000,
    seed: int = 0,
    image_size: int = 64,
    max_bad: float = MAX_BAD,
    image_column: str | None = None,
    caption_column: str | None = None,
    label_column: str | None = None,
) -> records.Metadata:
    """Writes the source `source_spec` as a record set in `out`, adding its split(s) to
    a set already there (the command `main` runs; see the module docstring).

    Args:
      source_spec: "csv:FILE", "jsonl:FILE", "parquet:FILES", "webdataset:FOLDER",
        "folder:DIR", "tfds:NAME" or "builtin:NAME".
      out: the record set's directory (created).
      split: the split written from a file or TFDS source (built-ins write all theirs).
      shards: shards per split; 0: one per `RECORDS_PER_SHARD` records.
      workers: processes writing shards at once.
      encode: "png" or "jpeg" (quality 95): how decoded images (TFDS, shapes) are stored.
      tfds_data_dir: TFDS's data_dir for "tfds:" sources.
      num_examples, seed, image_size: the generated set's ("builtin:shapes").
      max_bad: the share of a split's inputs that may be bad (left out); more stops
        the command and keeps none of the split.
      image_column, caption_column, label_column: a Parquet source's columns (None: the
        usual names).

    Returns:
      The metadata written (the set's splits: those already there and these).

    Raises:
      ConfigError: a bad argument, a source that is not there, labels that cannot be
        numbered, or more than `max_bad` bad inputs in a split.
    """
    if shards < 0 or workers < 1 or encode not in ("png", "jpeg") or not 0 <= max_bad <= 1:
        raise ConfigError(
            "need --shards >= 0, --workers >= 1, --encode=png|jpeg, 0 <= --max-bad <= 1; "
            f"got {shards}, {workers}, {encode}, {max_bad}."
        )
    options = {"encode": encode, "tfds_data_dir": tfds_data_dir}
    options |= {"num_examples": num_examples, "seed": seed, "image_size": image_size}
    source = open_source(source_spec, split=split, columns=(image_column, caption_column, label_column), **options)
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    existing = records.read_metadata(out) if os.path.exists(os.path.join(out, records.METADATA_FILE)) else None
    if existing and existing.fields != tuple(source.info["fields"]):
        raise ConfigError(
            f"{out} holds records with the fields {existing.fields}, these have {tuple(source.info['fields'])}; "
            "write them to another --out."
        )
    if existing and existing.num_negatives != source.info.get("num_negatives", 0):
        raise ConfigError(
            f"{out} holds records with {existing.num_negatives} hard negatives each, these have "
            f"{source.info.get('num_negatives', 0)}; write them to another --out."
        )
    what = {"spec": source_spec, **source.options}  # what decides the records (a rerun keeps shards alike)
    command = _command(source_spec, out, split, shards, workers, source.options | {"max_bad": max_bad})
    splits, summaries = (dict(existing.splits), dict(existing.source.get("splits", {}))) if existing else ({}, {})
    num_classes, class_names, longest = 0, (), 0
    for name in source.splits():
        splits[name], summary = _write_split(source, name, out, shards, workers, what, existing, max_bad)
        num_classes, longest = max(num_classes, summary.pop("num_classes")), max(longest, summary.pop("longest"))
        class_names = summary.pop("class_names") or class_names
        summaries[name] = {"command": command, **summary}
    info = {"num_classes": num_classes, "max_text_length": longest, **source.info, "class_names": class_names}
    metadata = _merged(existing, out, splits, info, {"command": command, **what, "splits": summaries})
    records.write_metadata(metadata)
    return metadata


def write_builtin(name: str, data_dir: str | None) -> str | None:
    """Writes the built-in dataset `name`'s records (`settings.BUILTIN`) under
    `data_dir` (`settings.builtin_records`) unless they are there: the step the
    training job runs before `run_plan.build`, which writes nothing. One process writes,
    the others wait on a file lock; the per-shard lines are not shown.

    Returns:
      The directory written, or None when the records were there already.
    """
    directory = settings.builtin_records(name, data_dir)
    metadata_file = os.path.join(directory, records.METADATA_FILE)
    if os.path.exists(metadata_file):
        return None
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if os.path.exists(metadata_file):  # another process wrote them meanwhile
            return None
        with contextlib.redirect_stderr(io.StringIO()):
            write(settings.BUILTIN[name], directory)
    return directory


def write_builtin_of(data: settings.DataSettings) -> str | None:
    """`write_builtin` of the built-in dataset `data` names, when it reads one (not
    `config.data.records`): the step a job or a benchmark runs before `run_plan.build`.

    Returns:
      The directory written, or None (own records, or the built-in ones there already).
    """
    if data.records is None and data.name in settings.BUILTIN:
        return write_builtin(data.name, data.data_dir)
    return None


def _merged(existing: records.Metadata | None, out: str, splits, info: dict, source: dict) -> records.Metadata:
    """The metadata of the splits already in `out` (`existing`) and those written now
    (`info`: what their source says of them): the largest of their class counts, image
    channels and lengths, the class names (the same in both, when named); `source`'s
    per-split skipped inputs summed."""

    def largest(field: str) -> int:
        return max(info.get(field, 0), getattr(existing, field) if existing else 0)

    return records.Metadata(
        directory=out,
        splits=splits,
        fields=tuple(info["fields"]),
        id_keys=tuple(info.get("id_keys", ())),
        match_keys=info.get("match_keys"),
        num_classes=largest("num_classes"),
        class_names=tuple(info["class_names"]) or (existing.class_names if existing else ()),
        image_channels=max(info.get("image_channels", 3), existing.image_channels if existing else 0),
        sequence_vocab_size=largest("sequence_vocab_size"),
        max_text_length=largest("max_text_length"),
        num_negatives=info.get("num_negatives", 0),
        source=source | _with_totals(source["splits"]),
    )


def _with_totals(summaries: dict) -> dict:
    """The metadata's `source` entries of the per-split `summaries`: them, the skipped
    inputs summed and the first reasons."""
    first = [reason for split in summaries.values() for reason in split["skipped_first"]]
    return {
        "splits": summaries,
        "skipped": sum(split["skipped"] for split in summaries.values()),
        "skipped_first": first[:MAX_REASONS_KEPT],
    }
