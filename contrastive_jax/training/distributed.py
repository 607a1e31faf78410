"""Multi-process runs (`jax.distributed`) and preemption (SIGTERM).

JAX's multi-controller runtime runs one process per host (TPU VM, GPU node, or several
processes on one machine); every process runs the same program on its own devices and
they meet in collectives. `initialize` starts it from explicit settings or JAX's own
detection (Cloud TPU, SLURM, Open MPI). On CPU, cross-process collectives use gloo
(`jax_cpu_collectives_implementation`, JAX's default), so a multi-process run works on
one machine without accelerators.

`ProcessWatchdog` stops every process, with one line naming the lost one and the command
that resumes, when another process of the run dies (SIGKILL, a crash, a lost host):
each process beats every second in the coordination service's key-value store, and a
process whose beat has not changed for `heartbeat_timeout_seconds` is lost. JAX's own
heartbeat (`jax.distributed.initialize(heartbeat_timeout_seconds=...)`) would also
notice, but it aborts every survivor with a fatal-error dump (after 100 s by default)
and has no hook in its public API; it is kept as a backstop, set later than ours.

`Preemption` turns SIGTERM (what a preempted VM or `scancel` sends) into a step at which
all processes stop together: in one process a signal handler sets a flag; across
processes JAX's preemption sync service (started by `jax.distributed.initialize`, which
catches SIGTERM itself) agrees on the first step every process can still reach. The
command line then exits with `PREEMPTED_EXIT_STATUS`, not 0, so that a scheduler restarts
the run rather than taking it as finished.

Which devices a process drives: all it sees, except where JAX's detection finds a
launcher that numbers the tasks of a host (SLURM's `SLURM_LOCALID`, Open MPI's local
rank): there JAX gives each process the one GPU of that number, also when the coordinator,
count and id are passed explicitly. So under SLURM, launch one task per GPU with every
GPU of the node visible to each task (`--ntasks-per-node=G --gpus-per-node=G`, as
`launch/slurm.sbatch` does); one task per node drives only its GPU 0 unless
`JAX_LOCAL_DEVICE_IDS=0,1,...` names them all. Cloud TPU and Kubernetes: all devices.
"""

import math
import os
import signal
import sys
import threading
import time

import jax
from absl import logging
from jax.experimental import multihost_utils

from contrastive_jax import compat
from contrastive_jax.errors import ConfigError


def initialize(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    auto_detect: bool = False,
    heartbeat_timeout_seconds: float = 30,
) -> None:
    """Starts `jax.distributed` when this is a multi-process run; must precede any JAX use.

    Args:
      coordinator_address: `host:port` of process 0 (any free port, the same for all).
      num_processes, process_id: the number of processes and this one's id in
        `[0, num_processes)`.
      auto_detect: with none of the above, let JAX detect them (Cloud TPU pod slices,
        SLURM `srun`, Open MPI `mpirun`).
      heartbeat_timeout_seconds: the `ProcessWatchdog`'s timeout; JAX's own heartbeat
        timeout, which aborts with a fatal-error dump, is set to
        `jax_heartbeat_timeout(heartbeat_timeout_seconds)`, later than the watchdog's.

    Raises:
      ConfigError: `heartbeat_timeout_seconds` < 2 (checked before anything starts).

    With no settings and `auto_detect=False` this is a single-process run and nothing
    is started.
    """
    if not heartbeat_timeout_seconds >= 2:
        raise ConfigError(
            f"--heartbeat_timeout_seconds={heartbeat_timeout_seconds}: must be at least 2 (the "
            "processes beat once a second); pass e.g. 30."
        )
    explicit = (coordinator_address, num_processes, process_id)
    if all(value is None for value in explicit) and not auto_detect:
        return
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=jax_heartbeat_timeout(heartbeat_timeout_seconds),
    )
    logging.info(
        "jax.distributed: process %d of %d, %d local of %d devices.",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def jax_heartbeat_timeout(heartbeat_timeout_seconds: float) -> int:
    """JAX's heartbeat timeout: its default (100 s), or 3x the watchdog's if that is later."""
    return max(100, math.ceil(3 * heartbeat_timeout_seconds))


# Exit status of a process stopped because another one was lost: a temporary failure.
LOST_PROCESS_EXIT_STATUS = os.EX_TEMPFAIL  # 75
# Exit status of a run stopped by SIGTERM after saving its checkpoint: 143, what a
# process killed by SIGTERM reports to a shell and what Kubernetes shows for it, so a
# SLURM script, a Job's podFailurePolicy or a JobSet's failurePolicy restarts the run
# (which resumes) instead of taking it as finished, as it would with 0.
PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM  # 143
_HEARTBEATS = "contrastive_jax/heartbeat/"  # + process id: a beat count, or _EXITED
_EXITED = "exited"


class ProcessWatchdog:
    """Exits this process when another process of a multi-process run is lost; a
    context manager around training (does nothing in a single-process run).

    A daemon thread beats every `interval_seconds` in the coordination service's
    key-value store and reads the others' beats. When a process's beat has not changed
    for `timeout_seconds`, or the service (in process 0) stops answering, it writes one
    line to stderr naming the lost process and the command to rerun, and exits the
    process with `LOST_PROCESS_EXIT_STATUS` at once (the main thread may be blocked
    in a collective that never returns). Checkpoints stay consistent: orbax finalizes
    a checkpoint by renaming it, so a save cut off here is left as a `*tmp*` directory
    that resuming ignores. Detection takes between `timeout_seconds` and
    `timeout_seconds + interval_seconds` after the lost process's last beat.

    Leaving the block, the process marks itself exited so the others do not report it.
    Leaving it with a `jax.errors.JaxRuntimeError` (what a collective raises when a
    peer's connection drops, e.g. gloo on CPU) first waits up to the timeout for a
    verdict, so a lost peer gives the one line rather than a traceback.
    """

    def __init__(self, *, timeout_seconds: float, command: str, interval_seconds: float = 1.0):
        self.timeout_seconds = timeout_seconds
        self.interval_seconds = interval_seconds
        self.command = command
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "ProcessWatchdog":
        if jax.process_count() > 1:
            self._client = compat.distributed_client()
            self._thread = threading.Thread(target=self._watch, name="ProcessWatchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._thread is None:
            return
        if isinstance(exc, jax.errors.JaxRuntimeError):  # maybe a peer died: let the thread see
            self._thread.join(self.timeout_seconds + 2 * self.interval_seconds)
        self._stop.set()
        self._thread.join()
        self._client.key_value_set(f"{_HEARTBEATS}{jax.process_index()}", _EXITED, allow_overwrite=True)

    def _watch(self) -> None:
        me, count = jax.process_index(), jax.process_count()
        # Per other process: its last beat seen and when it changed.
        seen = {p: (None, time.monotonic()) for p in range(count) if p != me}
        beat = 0
        while not self._stop.wait(self.interval_seconds):
            beat += 1
            try:
                self._client.key_value_set(f"{_HEARTBEATS}{me}", str(beat), allow_overwrite=True)
                beats = {
                    int(key.rsplit("/", 1)[-1]): value for key, value in self._client.key_value_dir_get(_HEARTBEATS)
                }
            except Exception as e:  # the service, in process 0, is gone
                first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
                self._stop_lost([0], f"its coordination service stopped answering: {first_line}")
            now = time.monotonic()
            for p, (last, _) in list(seen.items()):
                if beats.get(p) == _EXITED:
                    del seen[p]  # finished normally
                elif beats.get(p) != last:
                    seen[p] = (beats.get(p), now)
            lost = [p for p, (_, since) in seen.items() if now - since > self.timeout_seconds]
            if lost:
                self._stop_lost(lost, f"no heartbeat for {self.timeout_seconds:g} s")

    def _stop_lost(self, lost: list[int], why: str) -> None:
        """Writes the one line and exits the process (from the watchdog thread)."""
        names = " and ".join(str(p) for p in lost)
        sys.stdout.flush()
        sys.stderr.write(
            f"Lost process {names} of {jax.process_count()} ({why}); process "
            f"{jax.process_index()} stops with status {LOST_PROCESS_EXIT_STATUS}. The "
            f"checkpoints are intact: rerun all processes to resume, with I = 0 ... "
            f"{jax.process_count() - 1}: {self.command}\n"
        )
        sys.stderr.flush()
        os._exit(LOST_PROCESS_EXIT_STATUS)


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
