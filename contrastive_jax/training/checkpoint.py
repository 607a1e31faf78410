"""Checkpoints of the train state together with the input position (orbax-checkpoint).

Each checkpoint `<workdir>/checkpoints/<step>/` holds three items:

* `state`: the train state (parameters, optimizer state, BatchNorm statistics, step),
  saved with `StandardSave`. It is restored onto whatever mesh the caller's abstract
  state names, so a checkpoint written on 8 devices restores on 1 (or 4, ...).
* `data`: the input position as JSON, `{"next_step": s, "config": {...}}` (see
  `data.batch_numbering.position`). The input pipeline is a pure function of (config, step), so the step is
  the whole position; the config is kept to check that a resumed run continues the same
  stream (`resume.RESUME_FIELDS`) and to name the fields that changed when the model did.
* `integrity`: a fingerprint of every state leaf (a position-weighted sum of its bytes)
  and the leaves' paths, computed before the save and checked after every restore.
* `model` (runs saved since the model's settings were kept): the model's settings as
  JSON (`saved_model`), so that `restore_variables` and `trained.load` rebuild the
  model and read its parameters without the data the run trained on.

Saves are asynchronous (training continues while the files are written); keep-last-k is
orbax's `max_to_keep`. Orbax writes into a temporary directory and renames it when
complete, so a process killed mid-write leaves the previous checkpoints intact and the
partial one invisible. A finalized checkpoint whose files were later damaged (truncated,
deleted, bit rot) fails to restore or fails the fingerprint: `restore_state` raises
`CorruptCheckpointError` and `quarantine` moves it to `<directory>.corrupt/` so the
previous one is used; a corrupt checkpoint is never loaded. Restoring onto a state of
another structure (a different model or optimizer) raises `IncompatibleCheckpointError`
before reading any array.

Which checkpoint a run resumes from, and whether it may, is `resume.py`'s.

Every process calls every method (orbax coordinates multi-process saves; process 0
writes the shared files); the directory must be on storage all processes share.
"""

import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from contrastive_jax.errors import ConfigError


class CorruptCheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not match its fingerprint."""


class IncompatibleCheckpointError(ConfigError):
    """A checkpoint whose state has another structure than the one being restored."""


def _path_name(path) -> str:
    """`params/Dense_0/kernel` for a pytree key path (attribute, dict or sequence keys)."""
    names = (getattr(k, "name", getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return "/".join(str(n) for n in names)


def _layout(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """`{leaf path: (shape, dtype)}` of a pytree of arrays or array metadata."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_path_name(p): (tuple(x.shape), jnp.dtype(x.dtype).name) for p, x in leaves}


@jax.jit
def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    """The uint32 sum of an array's bytes, each weighted by an odd function of its index.

    Changes when any byte changes (single bit flips always) or when bytes are moved. One
    compile per leaf shape, dtype and sharding (a tower's layers share theirs: jitting the
    whole tree compiled every leaf of every new tree again, seconds per checkpoint).
    """
    data = jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(-1).astype(jnp.uint32)
    weights = jnp.arange(data.size, dtype=jnp.uint32) * jnp.uint32(2654435761) | 1
    return jnp.sum(data * weights, dtype=jnp.uint32)


def fingerprint(tree) -> list[int]:
    """One integer per leaf of a pytree of arrays; see `_leaf_fingerprint`.

    One leaf at a time, each waited for before the next is started: a split leaf's sum
    ends in an all-reduce, and on XLA's CPU backend (simulated devices) independent
    collective programs in flight together can deadlock, one program's share on a device
    waiting for partners whose threads wait inside another program; XLA aborts the process
    after 40 s ("Termination timeout for `all reduce`"). Launched all at once, the leaves
    aborted one CI run, 4 of about 150 runs of test_train's save-and-restore on three
    meshes, and 3 of 3 runs of test_preemption's 64 leaves fingerprinted 30 times.
    """
    return [int(jax.device_get(_leaf_fingerprint(x))) for x in jax.tree.leaves(tree)]


class Checkpointer:
    """Saves and restores `{"state", "data", "integrity"}` checkpoints under `directory`."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int):
        if max_to_keep < 1:
            raise ConfigError(
                f"config.checkpoint.max_to_keep={max_to_keep} must be >= 1 to keep a checkpoint to resume from."
            )
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "data": ocp.JsonCheckpointHandler(),
                "integrity": ocp.JsonCheckpointHandler(),
                "model": ocp.JsonCheckpointHandler(),
            },
        )

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, position: dict[str, Any], model: dict[str, Any] | None = None) -> None:
        """Starts writing checkpoint `step` (returns before the write finishes), with the
        model's settings `model` (`saved_model`) when given."""
        paths = [_path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
        items = {
            "state": ocp.args.StandardSave(state),
            "data": ocp.args.JsonSave(position),
            "integrity": ocp.args.JsonSave({"fingerprint": fingerprint(state), "paths": paths}),
        }
        if model is not None:
            items["model"] = ocp.args.JsonSave(model)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def _restore_json(self, step: int, item: str) -> dict[str, Any]:
        try:
            args = ocp.args.Composite(**{item: ocp.args.JsonRestore()})
            value = self._manager.restore(step, args=args)[item]
        except Exception as e:  # any read or parse failure of a finalized checkpoint
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory}: cannot read its {item!r} item ({type(e).__name__}: {e})"
            ) from e
        if not isinstance(value, dict):
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory}: its {item!r} item is not a JSON object."
            )
        return value

    def restore_position(self, step: int) -> dict[str, Any]:
        """The input position saved with checkpoint `step`.

        Raises:
          CorruptCheckpointError: the position cannot be read.
        """
        return self._restore_json(step, "data")

    def restore_model(self, step: int) -> dict[str, Any] | None:
        """The model's settings saved with checkpoint `step`; None for a checkpoint saved
        without them (before they were kept).

        Raises:
          CorruptCheckpointError: they are there but cannot be read.
        """
        if not os.path.isdir(os.path.join(self.directory, str(step), "model")):
            return None
        return self._restore_json(step, "model")

    def restore_variables(self, step: int, abstract_variables: dict[str, Any]) -> dict[str, Any]:
        """Parts of checkpoint `step`'s state alone, verified (the optimizer's moments
        and the loss's state are not read): `{"params": ..., "batch_stats": ...}` on the
        default device.

        Args:
          abstract_variables: `{name: tree}` of `jax.ShapeDtypeStruct` for some of the
            state's fields (e.g. `jax.eval_shape` of the model's init).

        Raises:
          IncompatibleCheckpointError: the saved fields have other leaves, shapes or
            dtypes.
          CorruptCheckpointError: they cannot be read or do not match the fingerprint;
            or the checkpoint was saved without its leaves' paths (before they were kept).
        """
        saved = self._state_layout(step)
        wanted = _layout(abstract_variables)
        self._check_layout(step, {k: v for k, v in saved.items() if k.split("/")[0] in abstract_variables}, wanted)
        integrity = self._restore_json(step, "integrity")
        if "paths" not in integrity:
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory} has no leaf paths to verify parts of its state by."
            )
        try:
            path = os.path.join(self.directory, str(step), "state")
            restored = ocp.PyTreeCheckpointer().restore(
                path,
                args=ocp.args.PyTreeRestore(
                    item=abstract_variables,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_variables),
                    partial_restore=True,
                ),
            )
        except Exception as e:  # truncated or missing files, undecodable chunks
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory}: cannot read its state ({type(e).__name__}: {e})"
            ) from e
        self._check_fingerprint(step, restored, dict(zip(integrity["paths"], integrity["fingerprint"])))
        return restored

    def _state_layout(self, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
        try:
            return _layout(self._manager.item_metadata(step)["state"])
        except Exception as e:
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory}: cannot read its state metadata ({type(e).__name__}: {e})"
            ) from e

    def _check_layout(self, step: int, saved_layout: dict, wanted: dict) -> None:
        if saved_layout != wanted:
            differences = [
                f"{name}: {saved_layout.get(name, 'absent')} in the checkpoint, {wanted.get(name, 'absent')} now"
                for name in sorted(set(saved_layout) | set(wanted))
                if saved_layout.get(name) != wanted.get(name)
            ]
            raise IncompatibleCheckpointError(
                f"checkpoint {step} in {self.directory} holds a state of another structure "
                f"(shape, dtype): {'; '.join(differences[:5])}"
                + (f"; and {len(differences) - 5} more" if len(differences) > 5 else "")
            )

    def _check_fingerprint(self, step: int, state: Any, expected: list[int] | dict[str, int] | None) -> None:
        """Raises CorruptCheckpointError unless `state`'s leaves match the fingerprints
        saved: `expected` in leaf order, or by leaf path (for a part of the state)."""
        names = [_path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
        if isinstance(expected, dict):
            expected = [expected.get(name) for name in names]
        actual = fingerprint(state)
        if actual != expected:
            bad = [n for n, a, e in zip(names, actual, expected or []) if a != e]
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory}: the state read back does not match "
                f"the fingerprint saved with it (leaves {bad[:5] or 'all'})"
            )

    def restore_state(self, step: int, abstract_state: Any) -> Any:
        """Checkpoint `step`'s state, laid out as `abstract_state` says, verified.

        Args:
          abstract_state: a pytree of `jax.ShapeDtypeStruct` with `sharding` set (e.g.
            `jax.eval_shape` of the init function plus the target shardings).

        Raises:
          IncompatibleCheckpointError: the checkpoint's state has other leaves, shapes
            or dtypes than `abstract_state` (checked before reading any array).
          CorruptCheckpointError: the state cannot be read or does not match the
            fingerprint saved with it.
        """
        self._check_layout(step, self._state_layout(step), _layout(abstract_state))
        expected = self._restore_json(step, "integrity").get("fingerprint")
        try:
            args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
            state = self._manager.restore(step, args=args)["state"]
        except Exception as e:  # truncated or missing files, undecodable chunks
            raise CorruptCheckpointError(
                f"checkpoint {step} in {self.directory}: cannot read its state ({type(e).__name__}: {e})"
            ) from e
        self._check_fingerprint(step, state, expected)
        return state

    def quarantine(self, step: int, error: Exception) -> str:
        """Reports a corrupt checkpoint and moves it out of the way; returns its new path.

        The checkpoint goes to `<directory>.corrupt/<step>-<time>` (kept for
        inspection), so the previous checkpoint becomes the latest and the step can be
        saved again.
        """
        destination = os.path.join(f"{self.directory}.corrupt", f"{step}-{int(time.time())}")
        logging.error(
            "Skipping corrupt %s; moved to %s. Resuming from the previous checkpoint.",
            error,
            destination,
        )
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            shutil.move(os.path.join(self.directory, str(step)), destination)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self._manager.reload()
        return destination

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are written."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self._manager.close()
