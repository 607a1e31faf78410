"""Multi-process runs (`jax.distributed`) and preemption (SIGTERM).

JAX's multi-controller runtime runs one process per host (TPU VM, GPU node, or several
processes on one machine); every process runs the same program on its own devices and
they meet in collectives. `initialize` starts it from explicit settings or JAX's own
detection (Cloud TPU, SLURM, Open MPI). On CPU, cross-process collectives use gloo
(`jax_cpu_collectives_implementation`, JAX's default), so a multi-process run works on
one machine without accelerators.

`Preemption` turns SIGTERM (what a preempted VM or `scancel` sends) into a step at which
all processes stop together: in one process a signal handler sets a flag; across
processes JAX's preemption sync service (started by `jax.distributed.initialize`, which
catches SIGTERM itself) agrees on the first step every process can still reach.
"""

import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils


def initialize(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    auto_detect: bool = False,
) -> None:
    """Starts `jax.distributed` when this is a multi-process run; must precede any JAX use.

    Args:
      coordinator_address: `host:port` of process 0 (any free port, the same for all).
      num_processes, process_id: the number of processes and this one's id in
        `[0, num_processes)`.
      auto_detect: with none of the above, let JAX detect them (Cloud TPU pod slices,
        SLURM `srun`, Open MPI `mpirun`).

    With no settings and `auto_detect=False` this is a single-process run and nothing
    is started.
    """
    explicit = (coordinator_address, num_processes, process_id)
    if all(value is None for value in explicit) and not auto_detect:
        return
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    logging.info(
        "jax.distributed: process %d of %d, %d local of %d devices.",
        jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(),
    )


class Preemption:
    """Tells the training loop when to stop for a SIGTERM; a context manager.

    `reached(step)` must be called after every step by every process; it returns True
    at the same step in all of them once any process got SIGTERM (the current step in
    one process; the sync service's agreed step across processes). Inside the `with`
    block of a single-process run, SIGTERM no longer kills the process; the previous
    handler is restored on exit.
    """

    def __init__(self):
        self._requested = threading.Event()
        self._previous = None

    def __enter__(self) -> "Preemption":
        if jax.process_count() > 1:  # jax.distributed's preemption notifier has SIGTERM
            return self
        if threading.current_thread() is not threading.main_thread():
            logging.warning("Not in the main thread: SIGTERM will not save a checkpoint.")
            return self
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_sigterm(self, signum, frame) -> None:
        logging.warning("SIGTERM: finishing the current step, then saving a checkpoint.")
        self._requested.set()

    def reached(self, step: int) -> bool:
        """Whether training should save and stop after `step`."""
        if jax.process_count() > 1:
            return multihost_utils.reached_preemption_sync_point(step)
        return self._requested.is_set()
