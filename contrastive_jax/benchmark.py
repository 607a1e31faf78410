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
from collections.abc import Sequence

from absl import flags

from contrastive_jax import console, trained
from contrastive_jax.data import input_pipeline, settings
from contrastive_jax.errors import ConfigError
from contrastive_jax.evaluation import clip_benchmark

TASKS = ("zeroshot_classification", "zeroshot_retrieval")


def run(workdir: str, task: str, split: str, classnames: Sequence[str] = (), templates: Sequence[str] = ("{}",)):
    """`task` on `split` of the run in `workdir` (its newest checkpoint): the report.
    Zero-shot classification takes `classnames` in label order, or the record set's."""
    if task not in TASKS:
        raise ConfigError(f"--task={task!r}: use one of {TASKS}.")
    model = trained.load(workdir)
    images = input_pipeline.eval_arrays(model.data, split)
    if task == "zeroshot_classification" and "label" not in images:
        raise ConfigError(f"zero-shot classification needs labels and split {split!r} has none.")
    image_embeddings = model.embed(images["a"], "a")
    if task == "zeroshot_retrieval":
        tokens, text_image = input_pipeline.eval_captions(model.data, split)
        metrics = clip_benchmark.retrieval(image_embeddings, model.embed(tokens, "b"), text_image)
    else:
        names = clip_benchmark.classnames_for(classnames, settings.open_metadata(model.data), images["label"])
        embed_texts = lambda texts: model.embed(model.tokenize(texts), "b")  # noqa: E731
        classes = clip_benchmark.class_embeddings(embed_texts, names, templates)
        metrics = clip_benchmark.zero_shot_classification(image_embeddings, classes, images["label"])
    return clip_benchmark.report(f"{model.data.display_name}:{split}", f"{workdir}@{model.step}", task, metrics)


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
        templates = clip_benchmark.read_templates(args.templates, args["templates-file"].value)
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
