"""Simulated CPU devices: the one place that writes XLA's host device count.

JAX-free on purpose: it must run before JAX starts (XLA reads ``XLA_FLAGS`` once, when
the first backend initialises), so the command line, the tests, the benchmarks' worker
processes, the sweep drivers and the Colab notebook import it before ``import jax``.
"""

import os
import re

_COUNT_FLAG = "--xla_force_host_platform_device_count"


def with_device_count(xla_flags: str, num_devices: int) -> str:
    """``xla_flags`` asking for ``num_devices`` CPU devices (any earlier count replaced)."""
    others = re.sub(rf"\s*{_COUNT_FLAG}=\S*", "", xla_flags).strip()
    return f"{others} {_COUNT_FLAG}={num_devices}".strip()


def device_count_env(num_devices: int, environ=os.environ) -> dict[str, str]:
    """A copy of ``environ`` for a child process that runs JAX on ``num_devices`` CPU devices."""
    return dict(environ, XLA_FLAGS=with_device_count(environ.get("XLA_FLAGS", ""), num_devices), JAX_PLATFORMS="cpu")


def simulate_cpu_devices(num_devices: int) -> None:
    """Asks XLA for ``num_devices`` CPU devices, unless ``XLA_FLAGS`` already sets a count.

    Call it before JAX starts (before its first use in the process); 1 or fewer: no-op.
    GPUs and TPUs are used as they are: the count applies to the CPU backend only.
    """
    xla_flags = os.environ.get("XLA_FLAGS", "")
    if num_devices > 1 and _COUNT_FLAG not in xla_flags:
        os.environ["XLA_FLAGS"] = with_device_count(xla_flags, num_devices)
