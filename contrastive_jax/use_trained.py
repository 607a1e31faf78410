"""Uses a trained run's model from the command line: embeds a file with one tower, exports a
tower with `jax.export`, or writes a model started from a released checkpoint back in its
layout::

    python -m contrastive_jax.use_trained --workdir=runs/clip_shapes --side=b \\
        --inputs=captions.txt --out=captions.npy
    python -m contrastive_jax.use_trained --workdir=runs/clip_shapes --side=a --export --out=image_tower.jax

The model is `trained.load(workdir)`'s (`--step`: another checkpoint than the newest).
Inputs: a `.npy` array (images `[n, H, W, C]` uint8 or float in [0, 1], or token ids
`[n, L]` int32) or a `.txt` file of texts, one per line, tokenized as in training. The
embeddings are a `.npy` array `[n, D]` float32.
"""

import logging
import os
import sys

import numpy as np
from absl import flags

from contrastive_jax import console, trained
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import released


def read_inputs(path: str, model: trained.TrainedModel) -> np.ndarray:
    """A `.npy` array as it is, or a `.txt` file's lines tokenized as in training."""
    if path.endswith(".txt"):
        with open(path, encoding="utf-8") as f:
            return model.tokenize([line.rstrip("\n") for line in f])
    if path.endswith(".npy"):
        return np.load(path)
    raise ConfigError(f"--inputs={path}: use a .npy array or a .txt file of texts, one per line.")


def _quiet_abandoned_reads() -> None:
    """A damaged checkpoint fails its restore at the first bad read; orbax's other reads,
    still under way, end after its event loop has closed, each with a traceback (through
    `sys.unraisablehook`, or the `asyncio` logger's "exception was never retrieved": the
    command has no other asyncio). The damage is already one line, so the command drops
    those; anything else passes."""
    orbax = f"{os.sep}orbax{os.sep}"

    def unraisable_hook(unraisable) -> None:
        origin = getattr(getattr(unraisable.object, "cr_code", None), "co_filename", "")
        if str(unraisable.exc_value) != "Event loop is closed" and orbax not in origin:
            sys.__unraisablehook__(unraisable)

    sys.unraisablehook = unraisable_hook
    logging.getLogger("asyncio").addFilter(lambda record: "exception was never retrieved" not in record.getMessage())


def _flags() -> flags.FlagValues:
    """The command's flags (absl, on their own `FlagValues`)."""
    values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "the run's working directory", flag_values=values)
    flags.DEFINE_enum("side", None, trained.SIDES, "tower a or tower b (--inputs, --export)", flag_values=values)
    flags.DEFINE_integer("step", None, "the checkpoint (default: the newest)", flag_values=values)
    flags.DEFINE_string("inputs", None, "embed this .npy array or .txt file (one text a line)", flag_values=values)
    flags.DEFINE_bool("export", False, "export the tower with jax.export", flag_values=values)
    flags.DEFINE_bool("released", False, "write both towers in the released checkpoint's layout", flag_values=values)
    flags.DEFINE_string("out", None, "the .npy embeddings [n, D], exported tower, or checkpoint", flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    """The command line: embed a file with one tower of a trained run (`--inputs`),
    export the tower (`--export`), or write a model started from a released checkpoint
    back in its layout (`--released`: open_clip's `.safetensors`, big_vision's `.npz`)."""
    argv = sys.argv[1:] if argv is None else argv
    args = console.parse_flags(
        argv, _flags(), prog="python -m contrastive_jax.use_trained", doc=__doc__, required=("workdir", "out")
    )
    if [args.inputs is not None, args.export, args.released].count(True) != 1:
        console.exit_with_error("pass one of --inputs, --export or --released (see --help).", verbose=False)
    if args.side is None and not args.released:
        console.exit_with_error("--inputs and --export need --side=a or --side=b.", verbose=False)
    _quiet_abandoned_reads()
    try:
        model = trained.load(args.workdir, args.step)
        if args.released:
            released.save(args.out, model.model, model.variables["params"])
        elif args.export:
            with open(args.out, "wb") as f:
                f.write(model.export(args.side).serialize())
        else:
            np.save(args.out, model.embed(read_inputs(args.inputs, model), args.side))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    what = "the model" if args.released else f"tower {args.side}"
    print(f"{args.out}: {what} of {args.workdir} at step {model.step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
