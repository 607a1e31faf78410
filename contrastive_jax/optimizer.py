"""The optimizer `config.optim` names (`OptimSettings`): warmup + cosine schedule, masked weight decay,
global-norm clipping."""

import dataclasses
from typing import Any

import jax
import optax

from contrastive_jax.config_lib import ConfigError

OPTIMIZERS = ("adamw", "lamb", "lars", "sgd")


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """The optimizer's settings as plain values, read from the config by
    `trainer.build`: each field is `config.optim.<name>` (its comment in
    configs/default.py says what it does)."""

    name: str
    learning_rate: float
    warmup_steps: int
    end_learning_rate_factor: float
    weight_decay: float
    momentum: float
    grad_clip_norm: float


def weight_decay_mask(params) -> Any:
    """True for weight matrices and kernels; False for biases, norm scales, the temperature."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_schedule(optim: OptimSettings, num_train_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `optim.learning_rate`, then cosine decay to
    `learning_rate * end_learning_rate_factor` at `num_train_steps`."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_train_steps, optim.warmup_steps + 1),
        end_value=optim.learning_rate * optim.end_learning_rate_factor,
    )


def make_optimizer(optim: OptimSettings, num_train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """`(tx, schedule)`: the optimizer `config.optim` names, with clipping.

    Raises:
      ConfigError: an unknown `config.optim.name`.
    """
    schedule = make_schedule(optim, num_train_steps)
    wd, mask = optim.weight_decay, weight_decay_mask
    if optim.name == "adamw":
        tx = optax.adamw(schedule, b1=optim.momentum, weight_decay=wd, mask=mask)
    elif optim.name == "lamb":
        tx = optax.lamb(schedule, b1=optim.momentum, weight_decay=wd, mask=mask)
    elif optim.name == "lars":
        tx = optax.lars(
            schedule,
            weight_decay=wd,
            weight_decay_mask=mask,
            trust_ratio_mask=mask,
            momentum=optim.momentum,
        )
    elif optim.name == "sgd":
        tx = optax.chain(optax.add_decayed_weights(wd, mask=mask), optax.sgd(schedule, momentum=optim.momentum))
    else:
        raise ConfigError(f"config.optim.name={optim.name!r}; use one of {OPTIMIZERS}.")
    if optim.grad_clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), tx)
    return tx, schedule
