"""The optimizer `config.optim` names (`OptimSettings`): a warmup, then a cosine or a constant rate;
masked weight decay, global-norm clipping; for fine-tuning, a frozen tower (LiT) and layer-wise learning-rate decay."""

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import optax

from contrastive_jax.errors import ConfigError

OPTIMIZERS = ("adamw", "lamb", "lars", "sgd")
SCHEDULES = ("cosine", "constant")
# The learning rate's factor at a global batch N / N_0 times the first stage's (`rate_factor`).
LR_SCALING = {"none": lambda ratio: 1.0, "linear": lambda ratio: ratio, "sqrt": math.sqrt}


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """The optimizer's settings as plain values, read from the config by
    `run_plan.build`: each field is `config.optim.<name>` (its comment in
    configs/default.py says what it does)."""

    name: str
    learning_rate: float
    warmup_steps: int
    end_learning_rate_factor: float
    weight_decay: float
    momentum: float
    grad_clip_norm: float
    frozen_tower: str = ""  # "a" or "b": that tower's parameters are not updated; "": none
    layer_decay: float = 1.0  # layer-wise learning-rate decay (`layer_decay_scales`); 1: off
    schedule: str = "cosine"  # after the warmup: "cosine" (to the end) or "constant" (the peak)
    lr_scaling: str = "none"  # the rate at another global batch (`rate_factor`)


def rate_factor(lr_scaling: str, batch: int, first_batch: int) -> float:
    """The learning rate's factor at a global batch `batch` (`config.optim.lr_scaling`,
    relative to the first stage's `first_batch`, `config.train.batch_schedule`): "linear"
    `batch / first_batch` (Goyal et al. 2017), "sqrt" its square root (Krizhevsky 2014;
    suits Adam), "none" 1. The step scales its update by it (the rate, warm-up included)."""
    return float(LR_SCALING[lr_scaling](batch / first_batch))


def weight_decay_mask(params) -> Any:
    """True for weight matrices and kernels; False for biases, norm scales, the temperature."""
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_schedule(optim: OptimSettings, num_train_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `optim.learning_rate` over `optim.warmup_steps`, then
    (`optim.schedule`) "cosine": a cosine decay to `learning_rate *
    end_learning_rate_factor` at `num_train_steps`; "constant": the peak rate for good,
    a schedule that does not depend on `num_train_steps` (steps-to-target studies:
    Shallue et al. 2018, McCandlish et al. 2018).

    Raises:
      ConfigError: an unknown `config.optim.schedule`.
    """
    if optim.schedule == "constant":
        warmup = optax.linear_schedule(0.0, optim.learning_rate, max(optim.warmup_steps, 1))
        return optax.join_schedules([warmup, optax.constant_schedule(optim.learning_rate)], [optim.warmup_steps])
    if optim.schedule != "cosine":
        raise ConfigError(f"config.optim.schedule={optim.schedule!r}; use one of {SCHEDULES}.")
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.learning_rate,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(num_train_steps, optim.warmup_steps + 1),
        end_value=optim.learning_rate * optim.end_learning_rate_factor,
    )


# A Transformer block's parameters (`transformer.Encoder`'s `encoderblock_<i>`, in every
# tower), and what comes before the first block.
_BLOCK = re.compile(r"^encoderblock_(\d+)$")
_EMBEDDINGS = frozenset({"embedding", "Conv_0", "Embed_0", "cls", "pos_embedding", "ln_pre"})


def layer_decay_scales(params, decay: float) -> Any:
    """Each parameter's learning-rate factor under layer-wise decay (BEiT's; ELECTRA's):
    in a top-level subtree with Transformer blocks 0..L-1 (a tower), block i's parameters
    get `decay ** (L - i)`, its embeddings (`_EMBEDDINGS`) `decay ** (L + 1)`; the rest
    (final norms, heads, the temperature) 1. A tree of floats shaped like `params`."""

    def depth(subtree) -> int:
        paths = jax.tree_util.tree_flatten_with_path(subtree)[0]
        blocks = {
            int(m.group(1)) for path, _ in paths for key in path if (m := _BLOCK.match(str(getattr(key, "key", ""))))
        }
        return len(blocks)

    depths = {name: depth(subtree) for name, subtree in params.items()}

    def scale(path, _):
        names = [str(getattr(key, "key", "")) for key in path]
        tower_depth = depths[names[0]]
        for name in names[1:]:
            if match := _BLOCK.match(name):
                return decay ** (tower_depth - int(match.group(1)))
        embeddings = tower_depth and len(names) > 1 and names[1] in _EMBEDDINGS
        return decay ** (tower_depth + 1) if embeddings else 1.0

    return jax.tree_util.tree_map_with_path(scale, params)


def _scale_by_layer(decay: float) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        scales = layer_decay_scales(updates, decay)
        return jax.tree.map(lambda u, s: u * s, updates, scales), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _freezing(tx: optax.GradientTransformation, towers: Mapping[str, tuple[str, ...]], frozen_tower: str):
    """`tx` on every parameter but those under `towers[frozen_tower]`'s top-level names,
    which are not updated (and get no optimizer state)."""
    if frozen_tower not in towers:
        raise ConfigError(f"config.optim.frozen_tower={frozen_tower!r}; use '', 'a' (LiT: the image tower) or 'b'.")
    frozen = set(towers[frozen_tower])

    def labels(params):
        if not frozen & set(params):
            raise ConfigError(
                f"config.optim.frozen_tower={frozen_tower!r}: the model has no parameters of its own for that tower "
                "(tied towers share one: set config.model.tie_towers=False)."
            )
        return {
            name: jax.tree.map(lambda _, frozen_here=name in frozen: "frozen" if frozen_here else "trained", sub)
            for name, sub in params.items()
        }

    return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


class Optimizer(NamedTuple):
    """An optimizer (`tx`) and the learning-rate schedule it follows (`schedule(step)`)."""

    tx: optax.GradientTransformation
    schedule: optax.Schedule


def make_optimizer(
    optim: OptimSettings, num_train_steps: int, towers: Mapping[str, tuple[str, ...]] | None = None
) -> Optimizer:
    """`Optimizer(tx, schedule)`: the optimizer `config.optim` names, with clipping, layer-wise
    decay and a frozen tower; `towers` maps "a" and "b" to the top-level parameter names
    of each tower (`two_tower.TwoTower.TOWER_PARAMS`, `released.TOWER_PARAMS`).

    Raises:
      ConfigError: an unknown `config.optim.name`, `schedule` or `frozen_tower`, or a `layer_decay`
        outside (0, 1].
    """
    schedule = make_schedule(optim, num_train_steps)
    if optim.lr_scaling not in LR_SCALING:
        raise ConfigError(f"config.optim.lr_scaling={optim.lr_scaling!r}; use one of {tuple(LR_SCALING)}.")
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
    if not 0 < optim.layer_decay <= 1:
        raise ConfigError(
            f"config.optim.layer_decay={optim.layer_decay}; use a value in (0, 1] (1: off; 0.75 is common)."
        )
    if optim.layer_decay < 1:
        tx = optax.chain(tx, _scale_by_layer(optim.layer_decay))
    if optim.grad_clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), tx)
    if optim.frozen_tower:
        tx = _freezing(tx, towers or {}, optim.frozen_tower)
    return Optimizer(tx, schedule)
