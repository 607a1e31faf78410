"""Evaluates a trained run as the field reports it: zero-shot classification from class
names and prompt templates, and image-text retrieval over every caption, written as
CLIP_benchmark's JSON (github.com/LAION-AI/CLIP_benchmark)::

    python -m contrastive_jax.benchmark --workdir=runs/clip_shapes --task=zeroshot_retrieval --out=retrieval.json
    python -m contrastive_jax.benchmark --workdir=runs/clip_shapes --task=zeroshot_classification \\
        --templates="a {}.;a picture with a {}." --out=kinds.json

Tower a embeds the images and tower b the texts (the image-text configs' order).

- **Zero-shot classification**: each class's embedding is the mean of its prompts'
  (every template filled with the class name), L2-normalised (CLIP's prompt ensemble);
  an image's prediction is the class of highest cosine. `acc1`, `acc5` (top-k
  accuracy) and `mean_per_class_recall`, as CLIP_benchmark names them. The class names
  are the record set's (`class_names` in its metadata, kept when the labels were written
  as names), or `--classnames` in label order; the templates are `--templates`
  (`;`-separated) or `--templates-file` (one a line).
- **Retrieval** with all captions (the 5-captions-per-image protocol of COCO and
  Flickr30k): `image_retrieval_recall@k`, each caption's image among the k images
  nearest to it; `text_retrieval_recall@k`, at least one of an image's captions among
  the k captions nearest to it.
"""

import json
import sys
from collections.abc import Callable, Sequence

import numpy as np
from absl import flags

from contrastive_jax import console, data_sources, input_pipeline, records
from contrastive_jax.config_lib import ConfigError

TASKS = ("zeroshot_classification", "zeroshot_retrieval")


def class_embeddings(
    embed_texts: Callable[[list[str]], np.ndarray], classnames: Sequence[str], templates: Sequence[str]
) -> np.ndarray:
    """`[C, D]`: per class, the L2-normalised mean of `embed_texts` of its prompts
    (`template.format(name)` for each template)."""
    rows = []
    for name in classnames:
        prompts = embed_texts([template.format(name) for template in templates])  # [T, D]
        mean = prompts.mean(axis=0)
        rows.append(mean / np.linalg.norm(mean))
    return np.stack(rows)


def zero_shot_classification(
    image_embeddings: np.ndarray, class_embeddings: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """Top-k accuracy (`acc1`, `acc5`) and `mean_per_class_recall` of `image_embeddings`
    [n, D] classified by cosine to `class_embeddings` [C, D], against `labels` [n]."""
    scores = image_embeddings @ class_embeddings.T  # [n, C]
    ranked = np.argsort(-scores, axis=1, kind="stable")
    metrics = {f"acc{k}": float(np.mean(np.any(ranked[:, :k] == labels[:, None], axis=1))) for k in ks}
    top1 = ranked[:, 0]
    recalls = [np.mean(top1[labels == c] == c) for c in np.unique(labels)]
    metrics["mean_per_class_recall"] = float(np.mean(recalls))
    return metrics


def retrieval(
    image_embeddings: np.ndarray, text_embeddings: np.ndarray, text_image: np.ndarray, ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """Recall@k both ways for images [n, D] and captions [m, D], caption j describing
    image `text_image[j]` (several captions per image)."""
    scores = text_embeddings @ image_embeddings.T  # [m, n]
    # Text -> image: the rank of each caption's own image.
    own = scores[np.arange(len(text_image)), text_image]
    image_rank = np.sum(scores > own[:, None], axis=1)  # images scored above it
    # Image -> text: the best rank among the image's captions.
    by_image = scores.T  # [n, m]
    text_rank = np.full(len(image_embeddings), np.iinfo(np.int64).max)
    for j, image in enumerate(text_image):
        above = np.sum(by_image[image] > by_image[image, j])
        text_rank[image] = min(text_rank[image], above)
    metrics = {}
    for k in ks:
        metrics[f"image_retrieval_recall@{k}"] = float(np.mean(image_rank < k))
        metrics[f"text_retrieval_recall@{k}"] = float(np.mean(text_rank < k))
    return metrics


def report(dataset: str, model: str, task: str, metrics: dict[str, float]) -> dict:
    """A CLIP_benchmark result record."""
    return {"dataset": dataset, "model": model, "pretrained": model, "task": task, "metrics": metrics, "language": "en"}


def classnames_for(given: Sequence[str], metadata: records.Metadata, labels: np.ndarray) -> list[str]:
    """The class names zero-shot classification prompts with, in label order: `given`
    (`--classnames`), else the record set's `metadata.class_names`.

    Raises:
      ConfigError: no names either way, or fewer names than the `labels` [n] need.
    """
    names = list(given) or list(metadata.class_names)
    if not names:
        raise ConfigError(
            f"zero-shot classification needs class names and the record set {metadata.directory} has none (its "
            "labels were written as ids); give --classnames=NAME,NAME,... in label order."
        )
    if len(names) <= int(labels.max()):
        raise ConfigError(f"{len(names)} class names for labels up to {int(labels.max())}; give one name per class.")
    return names


def read_templates(inline: str, path: str | None) -> list[str]:
    """The prompt templates: the lines of the file `path` (blank ones left out) when
    given, else `inline` split at ';'. Each has a `{}` for the class name.

    Raises:
      ConfigError: the file cannot be read, or a template has no `{}`.
    """
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                templates = [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise ConfigError(f"--templates-file={path}: {e.strerror}.") from None
    else:
        templates = [template for template in inline.split(";") if template]
    for template in templates:
        if "{}" not in template:
            raise ConfigError(f"the template {template!r} has no {{}} where the class name goes.")
    return templates


def run(workdir: str, task: str, split: str, classnames: Sequence[str] = (), templates: Sequence[str] = ("{}",)):
    """`task` on `split` of the run in `workdir` (its newest checkpoint): the report.
    Zero-shot classification takes `classnames` in label order, or the record set's."""
    from contrastive_jax import trained

    if task not in TASKS:
        raise ConfigError(f"--task={task!r}: use one of {TASKS}.")
    model = trained.load(workdir)
    images = input_pipeline.eval_arrays(model.data, split)
    if task == "zeroshot_classification" and "label" not in images:
        raise ConfigError(f"zero-shot classification needs labels and split {split!r} has none.")
    image_embeddings = model.embed(images["a"], "a")
    if task == "zeroshot_retrieval":
        tokens, text_image = input_pipeline.eval_captions(model.data, split)
        metrics = retrieval(image_embeddings, model.embed(tokens, "b"), text_image)
    else:
        names = classnames_for(classnames, data_sources.open_metadata(model.data), images["label"])
        classes = class_embeddings(lambda texts: model.embed(model.tokenize(texts), "b"), names, templates)
        metrics = zero_shot_classification(image_embeddings, classes, images["label"])
    return report(f"{model.data.display_name}:{split}", f"{workdir}@{model.step}", task, metrics)


def _flags() -> flags.FlagValues:
    """The command's flags (absl, on their own `FlagValues`)."""
    values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "the run's working directory (its newest checkpoint)", flag_values=values)
    flags.DEFINE_enum("task", None, TASKS, "what is measured", flag_values=values)
    flags.DEFINE_string("split", "test", "the split evaluated", flag_values=values)
    flags.DEFINE_string(
        "classnames", "", "class names, comma-separated, in label order (default: the record set's)", flag_values=values
    )
    flags.DEFINE_string("templates", "{}", "prompt templates, ';'-separated, '{}' for the name", flag_values=values)
    flags.DEFINE_string("templates-file", None, "prompt templates, one a line (or --templates)", flag_values=values)
    flags.DEFINE_string("out", None, "the JSON report", flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    """The command line: one task on one split, its report written as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    args = console.parse_flags(
        argv, _flags(), prog="python -m contrastive_jax.benchmark", doc=__doc__, required=("workdir", "task", "out")
    )
    classnames = [name.strip() for name in args.classnames.split(",") if name.strip()]
    try:
        templates = read_templates(args.templates, args["templates-file"].value)
        result = run(args.workdir, args.task, args.split, classnames, templates)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result["metrics"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
