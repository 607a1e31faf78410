"""What the trainer needs of configs besides `configs/*.py`: dotted overrides, loading
`configs/<name>.py` by name, and a config back from its JSON form (a user's mistake is
`errors.ConfigError`).

Configs come locked from `get_config()` (`configs/default.py` ends with
`config.lock()`), so ml_collections itself rejects a misspelled field, with a "did you
mean", whether it is set in Python, on the command line or through `override`.
Importing this module does not start JAX (the sweep drivers override fields before
they choose the number of simulated devices).
"""

import dataclasses
import importlib
import pathlib
import sys
from collections.abc import Mapping, Set
from typing import Any

import ml_collections

from contrastive_jax.errors import ConfigError


def group_values(settings_type: type, group: ml_collections.ConfigDict, *, besides: Set[str] = frozenset()) -> dict:
    """`{field: group[field]}` for the fields of the dataclass `settings_type` not in
    `besides`: what a plain-values settings class (`LossSettings`, `DataSettings`, ...)
    copies from its config group as it is."""
    return {f.name: group[f.name] for f in dataclasses.fields(settings_type) if f.name not in besides}


def override(config: ml_collections.ConfigDict, fields: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A locked copy of `config` with dotted fields set: `{"loss.temperature": 0.1}`.

    Raises:
      KeyError: a field the config does not have (ml_collections' message, with a "did
        you mean").
      TypeError: a value of another type than the field's.
    """
    config = config.copy_and_resolve_references()
    config.lock()
    config.update_from_flattened_dict(dict(fields))
    return config


CONFIGS_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"  # the repository's configs/


def load_config(name: str) -> ml_collections.ConfigDict:
    """`configs/<name>.py`'s `get_config()`, from the repository's configs directory (its
    variants import their base: `from configs import default`, so the repository root
    goes on `sys.path`).

    Raises:
      ConfigError: there is no `configs/<name>.py`.
    """
    path = CONFIGS_DIR / f"{name}.py"
    if not path.exists():
        known = sorted(p.stem for p in CONFIGS_DIR.glob("*.py"))
        raise ConfigError(f"No config {name!r}: configs/{name}.py does not exist; use one of {known}.")
    if str(CONFIGS_DIR.parent) not in sys.path:
        sys.path.insert(0, str(CONFIGS_DIR.parent))
    return importlib.import_module(f"configs.{name}").get_config()


def from_json(values: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A locked config from its JSON form (`RunPlan.run_config`, saved with each
    checkpoint); lists become tuples, as the configs write them."""

    def tuples(value):
        if isinstance(value, dict):
            return {k: tuples(v) for k, v in value.items()}
        return tuple(tuples(v) for v in value) if isinstance(value, list) else value

    config = ml_collections.ConfigDict(tuples(dict(values)))
    config.lock()
    return config
