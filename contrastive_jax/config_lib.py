"""What the trainer needs of configs besides `configs/*.py`: the error for a user's
mistake, and dotted overrides.

Configs come locked from `get_config()` (`configs/default.py` ends with
`config.lock()`), so ml_collections itself rejects a misspelled field, with a "did you
mean", whether it is set in Python, on the command line or through `override`.
Importing this module does not start JAX (the sweep drivers override fields before
they choose the number of simulated devices).
"""

import dataclasses
from collections.abc import Mapping, Set
from typing import Any

import ml_collections


class ConfigError(ValueError):
    """A config, flag or workdir that cannot train; the one-line message names the field
    and a fix."""


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
