"""The learned temperature every model owns (CLIP's "logit scale"), below the models that
share it (`two_tower`, `coca`): stored as `log_inv_temperature = log(1 / temperature)`
under `TEMPERATURE_PARAM`, which `two_tower.clamp_temperature` keeps at
`1 / temperature <= MAX_INV_TEMPERATURE` after each update (open_clip's clamp)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

MAX_INV_TEMPERATURE = 100.0
TEMPERATURE_PARAM = "log_inv_temperature"


def temperature(module: nn.Module, temperature_init: float, learn: bool) -> jax.Array:
    """The temperature, a float32 scalar, of `module` (called inside its `__call__`):
    `exp(-log_inv_temperature)`, the parameter `TEMPERATURE_PARAM` initialised at
    `log(1 / temperature_init)` when `learn`, else `temperature_init` fixed."""
    log_inv = math.log(1.0 / temperature_init)
    if learn:
        log_inv = module.param(TEMPERATURE_PARAM, nn.initializers.constant(log_inv), ())
    return jnp.exp(-jnp.asarray(log_inv, jnp.float32))
