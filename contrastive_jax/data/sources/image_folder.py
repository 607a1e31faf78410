"""An image folder as torchvision's `ImageFolder` reads it (`folder:DIR`): the class
folders' names are the labels, a `.txt` beside an image its caption."""

import collections
import os
from collections.abc import Iterator

from contrastive_jax.data.sources.file_source import IMAGE_SUFFIXES, BadInput, FileSource, caption_example, read_bytes
from contrastive_jax.errors import ConfigError


class FolderSource(FileSource):
    """An image folder as torchvision's `ImageFolder` reads it: `DIR/<class name>/<image>`
    (any depth under the class folder); an image's caption, when any image has one, is the
    text of the `.txt` file beside it with the same stem. The labels are the folder names,
    always names (a folder `3` is the name "3")."""

    labels_are_names = True

    def __init__(self, folder: str, split: str):
        if not os.path.isdir(folder):
            raise ConfigError(f"--source=folder:{folder}: no such folder; give the folder of the class folders.")
        self.folder, self.split_name, self.options = os.path.abspath(folder), split, {}
        self.inputs: list[tuple[str, str, str]] = []  # (image path, class name, caption path)
        for name in sorted(os.listdir(folder)):
            for directory, _, files in sorted(os.walk(os.path.join(self.folder, name))):
                for file in sorted(files):
                    stem, suffix = os.path.splitext(file)
                    if suffix.lower() in IMAGE_SUFFIXES:
                        path = os.path.join(directory, file)
                        self.inputs.append((path, name, os.path.join(directory, f"{stem}.txt")))
        if not self.inputs:
            raise ConfigError(
                f"--source=folder:{folder}: no images in class folders there ({', '.join(IMAGE_SUFFIXES)} "
                "files in DIR/<class name>/)."
            )
        self.labels = collections.Counter(name for _, name, _ in self.inputs)
        self.size, self.has_label = len(self.inputs), True
        self.has_captions = any(os.path.exists(caption) for _, _, caption in self.inputs)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        for path, name, caption_file in self.inputs[start:stop]:
            captions = None
            if self.has_captions:
                text = read_bytes(caption_file)
                if text is None:
                    yield BadInput(path, f"no caption file {os.path.basename(caption_file)} beside it")
                    continue
                captions = [text.decode("utf-8", "replace").strip()]
            yield caption_example(read_bytes(path), captions, name, path, labels=self.class_labels)
