"""Running the trainer as real processes: tiny configs, free ports, fault injection.

A pytest plugin (tests/conftest.py's `pytest_plugins`): its `processes` fixture is
every test's without an import. Every process is started in its own session and killed
(with its children) when the `processes` fixture is torn down, so a failing test leaves
nothing running.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import numpy as np
import orbax.checkpoint as ocp
import pytest

from contrastive_jax.simulated_devices import device_count_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs contrastive_jax.main after arranging, from FAULT="<what>:<n>:<signal>", for this
# process to send itself <signal> at the n-th call of <what>: "batch" (before the step
# t = resume step + n is dispatched) or "save" (right after the n-th checkpoint save
# returned, while orbax is still writing it in the background). "SIGINT+SIGINT" sends
# two signals, one after the other.
_DRIVER = textwrap.dedent(
    """
    import os, signal
    from contrastive_jax.training import checkpoint, loop
    from contrastive_jax import main

    what, n, sig = os.environ["FAULT"].split(":")
    calls = {"n": 0}

    def send():
        for name in sig.split("+"):
            os.kill(os.getpid(), getattr(signal, name))

    def arm(owner, name, before):
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            calls["n"] += 1
            hit = calls["n"] == int(n)
            if hit and before:
                send()
            out = real(*args, **kwargs)
            if hit and not before:
                send()
            return out

        setattr(owner, name, wrapped)

    if what == "batch":
        arm(loop, "_global_batch", before=True)
    else:
        arm(checkpoint.Checkpointer, "save", before=False)
    main.run()
    """
)


def optimized_env(environ=os.environ) -> dict[str, str]:
    """`environ` for a child process that trains long: XLA's LLVM optimizations back on.
    conftest sets `--xla_backend_optimization_level=0`, which compiles the suite's many
    small programs fast (test_losses, test_streaming, test_train, test_losses_sharded:
    213 s against 445 s) but runs a long training twice as slow (the default config's
    run: 145 s against 75 s)."""
    flags = environ.get("XLA_FLAGS", "").replace("--xla_backend_optimization_level=0", "")
    return dict(environ, XLA_FLAGS=" ".join(flags.split()))


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_fields(data_dir: str, **overrides) -> dict:
    """`{"group.field": value}`: the default config shrunk to a few fast steps, then
    `overrides` (keys with the dot spelled as a double underscore: `train__num_train_steps`).
    """
    fields = {
        "data.data_dir": data_dir,
        "model.mlp_hidden_dims": (32,),
        "model.encoder_dim": 32,
        "model.embed_dim": 16,
        "train.global_batch_size": 64,
        "train.num_train_steps": 8,
        "train.log_every_steps": 1,
        "optim.warmup_steps": 2,
        "eval.every_steps": 0,
        "eval.linear_probe": False,
        "eval.knn_k": 0,
        "checkpoint.every_steps": 2,
        "checkpoint.max_to_keep": 10,
    }
    return fields | {k.replace("__", "."): v for k, v in overrides.items()}


def write_config(path, fields: dict) -> str:
    """Writes a config file: `configs/default.py` with `fields` overridden."""
    lines = "\n".join(f"    config.{k} = {v!r}" for k, v in fields.items())
    with open(path, "w") as f:
        f.write(
            f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom configs import default\n\n\n"
            f"def get_config():\n    config = default.get_config()\n{lines}\n    return config\n"
        )
    return str(path)


class Processes:
    """Starts trainer processes and guarantees they are gone at teardown."""

    def __init__(self):
        self._running: list[subprocess.Popen] = []

    def start(
        self,
        config: str,
        workdir: str,
        *,
        num_devices: int,
        flags=(),
        fault: str | None = None,
        stderr=subprocess.STDOUT,
    ) -> subprocess.Popen:
        """`python -m contrastive_jax.main` (or the fault driver) on `num_devices` CPU devices.

        Its stderr goes with its stdout, unless `stderr=subprocess.PIPE` (see `wait_apart`).
        """
        env = dict(device_count_env(num_devices), TF_CPP_MIN_LOG_LEVEL="3")
        entry = ["-m", "contrastive_jax.main"]
        if fault is not None:
            env["FAULT"] = fault
            entry = ["-c", _DRIVER]
        command = [sys.executable, *entry, f"--config={config}", f"--workdir={workdir}", *flags]
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        self._running.append(process)
        return process

    def wait(self, process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
        """The exit status and output of `process` (killed after `timeout` seconds)."""
        status, output, _ = self.wait_apart(process, timeout)
        return status, output

    def wait_apart(self, process: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str | None]:
        """The exit status, stdout and stderr (None if merged) of `process`."""
        try:
            output, errors = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(process)
            output, errors = process.communicate()
            pytest.fail(f"process timed out after {timeout} s:\n{output[-3000:]}\n{errors}")
        return process.returncode, output, errors

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILLs the process's whole session (it and any children)."""
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()

    def close(self) -> None:
        for process in self._running:
            self.kill(process)
            if process.stdout:
                process.stdout.close()


@pytest.fixture
def processes():
    """A `Processes`; whatever it started is killed at teardown, pass or fail."""
    launched = Processes()
    try:
        yield launched
    finally:
        launched.close()


def logged_losses(workdir: str) -> dict[int, float]:
    """`{step: train/loss}` from `<workdir>/metrics.jsonl`."""
    from contrastive_jax import run_dir  # not at import: the plugin loads before ml-collections may be installed

    return {row["step"]: row["train/loss"] for row in run_dir.read_metrics(workdir) if "train/loss" in row}


def resumed_from_steps(workdir: str) -> list[int]:
    """The step each resume of the run in `workdir` started from, in order (the
    `resumed_from_step` records the trainer writes to metrics.jsonl; none: never resumed)."""
    from contrastive_jax import run_dir

    return [row["resumed_from_step"] for row in run_dir.read_metrics(workdir) if "resumed_from_step" in row]


def checkpoint_steps(workdir: str) -> tuple[list[int], list[int]]:
    """`(complete, partial)`: the steps of the finalized checkpoints in
    `<workdir>/checkpoints` and of the writes cut off there (orbax's `<step>.*tmp*` dirs)."""
    directory = os.path.join(workdir, "checkpoints")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    complete = sorted(int(name) for name in names if name.isdigit())
    partial = sorted(int(name.split(".")[0]) for name in names if "tmp" in name)
    return complete, partial


def saved_params(workdir: str, step: int):
    """The parameters of checkpoint `step` in `workdir`, as NumPy arrays."""
    return saved_state(workdir, step)["params"]


def saved_state(workdir: str, step: int):
    """The whole train state of checkpoint `step` in `workdir` (parameters, optimizer
    and loss state), as a tree of NumPy arrays."""
    import jax

    path = os.path.join(workdir, "checkpoints", str(step), "state")
    checkpointer = ocp.StandardCheckpointer()
    try:  # closed, not left to the garbage collector with its threads
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # any saving topology
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
            checkpointer.metadata(path).item_metadata,
        )
        return jax.device_get(checkpointer.restore(path, target))
    finally:
        checkpointer.close()


def max_difference(tree_a, tree_b) -> float:
    """The largest absolute difference between corresponding leaves."""
    import jax

    assert jax.tree.structure(tree_a) == jax.tree.structure(tree_b)
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))
        for a, b in zip(jax.tree.leaves(tree_a), jax.tree.leaves(tree_b))
    )


def assert_bitwise_equal(tree_a, tree_b) -> None:
    """Same structure and the same bytes in every leaf."""
    import jax

    leaves_a, leaves_b = jax.tree.leaves(tree_a), jax.tree.leaves(tree_b)
    assert jax.tree.structure(tree_a) == jax.tree.structure(tree_b)
    for a, b in zip(leaves_a, leaves_b):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
