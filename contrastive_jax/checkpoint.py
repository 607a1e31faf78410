"""Checkpoints of the train state together with the input position (orbax-checkpoint).

Each checkpoint `<workdir>/checkpoints/<step>/` holds two items:

* `state`: the train state (parameters, optimizer state, BatchNorm statistics, step),
  saved with `StandardSave`. It is restored onto whatever mesh the caller's abstract
  state names, so a checkpoint written on 8 devices restores on 1 (or 4, ...).
* `data`: the input position as JSON (`{"next_step": s, "seed": ..., ...}`). The input
  pipeline is a pure function of (seed, step), so the step is the whole position.

Saves are asynchronous (training continues while the files are written); keep-last-k is
orbax's `max_to_keep`; a checkpoint only becomes visible once complete, so a crash
mid-write leaves the previous ones intact.
"""

import os
from typing import Any

import orbax.checkpoint as ocp


class Checkpointer:
    """Saves and restores `{"state", "data"}` checkpoints under `directory`."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int):
        if max_to_keep < 1:
            raise ValueError(
                f"config.checkpoint.max_to_keep={max_to_keep} must be >= 1 to keep a "
                "checkpoint to resume from."
            )
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
            item_names=("state", "data"),
        )

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, position: dict[str, Any]) -> None:
        """Starts writing checkpoint `step` (returns before the write finishes)."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(position)
            ),
            force=True,
        )

    def restore_position(self, step: int) -> dict[str, Any]:
        """The input position saved with checkpoint `step`."""
        return self._manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))[
            "data"
        ]

    def restore_state(self, step: int, abstract_state: Any) -> Any:
        """Checkpoint `step`'s state, laid out as `abstract_state` says.

        Args:
          abstract_state: a pytree of `jax.ShapeDtypeStruct` with `sharding` set (e.g.
            `jax.eval_shape` of the init function plus the target shardings).
        """
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        return self._manager.restore(step, args=args)["state"]

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are written."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self._manager.close()
