"""A TFDS dataset's split (`tfds:NAME`), its images encoded as PNG or JPEG; TensorFlow
Datasets is imported here only."""

import io
from collections.abc import Iterator, Sequence

import numpy as np

from contrastive_jax.data.sources.file_source import BadInput
from contrastive_jax.errors import ConfigError


class TfdsSource:
    """A TFDS dataset's split, its images encoded as `image_format` (TensorFlow, only here)."""

    def __init__(self, name: str, split: str, data_dir: str | None, image_format: str):
        try:
            import tensorflow_datasets as tfds
        except ImportError:
            raise ConfigError(
                f"--source=tfds:{name} needs TensorFlow Datasets: pip install 'contrastive-jax[tfds]'."
            ) from None
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except Exception as e:  # DatasetNotFoundError, or a bad name / config
            raise ConfigError(f"--source=tfds:{name}: {str(e).splitlines()[0]}") from None
        builder.download_and_prepare()
        if split not in builder.info.splits or "image" not in builder.info.features:
            raise ConfigError(
                f"--source=tfds:{name} needs an `image` feature and --split={split!r}; it has the features "
                f"{sorted(builder.info.features.keys())} and the splits {sorted(builder.info.splits)}."
            )
        self.name, self.split_name, self.data_dir, self.image_format = name, split, data_dir, image_format
        self.options = {"tfds_data_dir": data_dir, "encode": image_format}
        self.size = builder.info.splits[split].num_examples
        features = builder.info.features
        self.has_label = "label" in features
        self.caption_path = next(
            (path for path in (("captions", "text"), ("caption",), ("text",)) if _has_feature(features, path)), None
        )
        self.channels = features["image"].shape[-1]
        self.num_classes = getattr(features["label"], "num_classes", None) if self.has_label else None
        names = list(getattr(features["label"], "names", None) or []) if self.num_classes else []
        self.class_names = tuple(names) if names != [str(i) for i in range(len(names))] else ()  # not "0", "1", ...

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        fields = ("image", *(("captions",) if self.caption_path else ()), *(("label",) if self.has_label else ()))
        known = {"num_classes": self.num_classes, "class_names": self.class_names} if self.num_classes else {}
        return {"fields": fields, "image_channels": 1 if self.channels == 1 else 3, **known}

    def num_examples(self, split: str) -> int:
        return self.size

    def label_counts(self, split: str) -> None:
        """None: the labels are TFDS's class ids."""
        return None

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        import tensorflow_datasets as tfds

        dataset = tfds.load(self.name, split=f"{split}[{start}:{stop}]", data_dir=self.data_dir, shuffle_files=False)
        for number, example in enumerate(tfds.as_numpy(dataset), start):
            pixels = example["image"]
            out = {"image": _encode(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, self.image_format)}
            if self.caption_path:
                captions = example
                for key in self.caption_path:
                    captions = captions[key]
                captions = [captions] if isinstance(captions, bytes) else list(captions)
                out["captions"] = [c.decode("utf-8") for c in captions]
                if not out["captions"] or not all(c.strip() for c in out["captions"]):
                    yield BadInput(f"tfds:{self.name} {split} example {number}", "an empty caption")
                    continue
            if self.has_label:
                out["label"] = int(example["label"])
            yield out


def _encode(pixels: np.ndarray, image_format: str) -> bytes:
    """uint8 [H, W] or [H, W, 3] pixels as PNG (lossless) or JPEG (quality 95) bytes."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG" if image_format == "jpeg" else "PNG", quality=95)
    return out.getvalue()


def _has_feature(features, path: Sequence[str]) -> bool:
    for key in path:
        if not hasattr(features, "keys") or key not in features.keys():
            return False
        features = features[key]
        features = getattr(features, "feature", features)  # Sequence -> its element
    return True
