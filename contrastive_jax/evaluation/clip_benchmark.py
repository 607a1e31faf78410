"""The field's benchmarks as pure functions of embeddings, reported as CLIP_benchmark's
JSON (github.com/LAION-AI/CLIP_benchmark); `python -m contrastive_jax.benchmark` runs
them on a trained run.

- **Zero-shot classification**: each class's embedding is the mean of its prompts'
  (every template filled with the class name), L2-normalised (CLIP's prompt ensemble);
  an image's prediction is the class of highest cosine. `acc1`, `acc5` (top-k
  accuracy) and `mean_per_class_recall`, as CLIP_benchmark names them.
- **Retrieval** with all captions (the 5-captions-per-image protocol of COCO and
  Flickr30k): `image_retrieval_recall@k`, each caption's image among the k images
  nearest to it; `text_retrieval_recall@k`, at least one of an image's captions among
  the k captions nearest to it. The in-loop evaluation (`evaluator.Evaluator`) reports
  it too when the data has several captions per image.
"""

from collections.abc import Callable, Sequence

import numpy as np

from contrastive_jax.data import records
from contrastive_jax.errors import ConfigError


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
