"""The built-in datasets as a source (`builtin:NAME`): a module of
`contrastive_jax.data.builtin`, all its splits."""

import importlib

BUILTIN = ("sklearn_digits", "cmudict", "shapes")


class BuiltinSource:
    """A built-in dataset module of `contrastive_jax.data.builtin` (all its splits); holds the
    module's name, so it pickles to the writer's processes."""

    def __init__(self, name: str):
        self.name, self.options = name, {}

    @property
    def module(self):
        return importlib.import_module(f"contrastive_jax.data.builtin.{self.name}")

    def splits(self) -> tuple[str, ...]:
        return self.module.SPLITS

    @property
    def info(self) -> dict:
        return self.module.INFO

    def num_examples(self, split: str) -> int:
        return self.module.num_examples(split)

    def label_counts(self, split: str) -> None:
        """None: the labels are the dataset's class ids."""
        return None

    def examples(self, split: str, start: int, stop: int):
        return self.module.examples(split, start, stop)
