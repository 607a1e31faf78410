"""A trained run's model, the library: its parameters restored from the checkpoint, inputs
embedded with either tower alone, a tower exported with `jax.export` (the command line is
`use_trained`).

`load(workdir)` rebuilds the run's model from the settings saved beside its newest
checkpoint (or `step`: `saved_model`; the data it trained on are not needed) and reads
the parameters and BatchNorm statistics alone. A run saved before those settings were
kept is rebuilt from its config, which needs its data where the config says. Inputs: a
`.npy` array (images `[n, H, W, C]` uint8 or float in [0, 1], or token ids `[n, L]`
int32) or a `.txt` file of texts, one per line, tokenized as in training
(`config.data.tokenizer`, `text_max_length`). An exported tower is a
serialized `jax.export.Exported` with the weights inside and a symbolic batch size:
`jax.export.deserialize(data).call(x)` embeds `x` (images as float32 in [0, 1], texts as
int32 token ids) in any process, without this package. A damaged newest checkpoint (a file truncated or
gone) gives way to the one before it, with one line on stderr.
"""

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax import export as jax_export  # a submodule to import on jax 0.7.2

from contrastive_jax import config_lib, run_dir
from contrastive_jax.data import input_pipeline, settings, tokenizers
from contrastive_jax.errors import ConfigError
from contrastive_jax.evaluation import padded_chunks
from contrastive_jax.models import captioning, saved_model
from contrastive_jax.training import checkpoint

SIDES = ("a", "b")


@dataclasses.dataclass(frozen=True)
class Captions:
    """Captions of n images (`TrainedModel.caption`): `ids` `[n, T]` int32 (the prompt
    first, padding after the caption's end), `scores` `[n]` float32 (the summed log
    probabilities of the generated ids) and `texts` (the run's tokenizer's decoding of
    `ids`; None where the tokenizer has none)."""

    ids: np.ndarray
    scores: np.ndarray
    texts: list[str] | None


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A run's model and its restored variables.

    Attributes:
      model: the `two_tower.TwoTower` (or a released model: `contrastive_jax.models.released`).
      variables: `{"params", "batch_stats"}` as host (NumPy) arrays.
      inputs: each side's input shape (without the batch) and dtype, `{"a": (shape,
        dtype), "b": ...}` (the input pipeline's).
      tokenizer: how texts were tokenized: `{"spec", "text_max_length", "files"}`
        (`saved_model`: the tokenizer's files and their sha256).
      step: the checkpoint's step.
      embed_dim: the embeddings' width D.
      config: the run's config as JSON (saved with the checkpoint).
    """

    model: Any
    variables: dict[str, Any]
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]]
    tokenizer: dict[str, Any]
    step: int
    embed_dim: int
    config: dict[str, Any]

    @property
    def data(self) -> settings.DataSettings:
        """The run's data settings (`config.data`), to read its data (`benchmark`)."""
        from contrastive_jax.training import run_plan

        return run_plan.data_settings(config_lib.from_json(self.config))

    def embed(self, inputs: np.ndarray, side: str, *, batch_size: int = 256) -> np.ndarray:
        """Tower `side`'s L2-normalised embeddings `[n, D]` float32 of `inputs` `[n, ...]`.

        The inputs go in chunks of `batch_size`, or of the power of two above n when n is
        smaller, the last chunk padded with zeros: one compile per chunk width, not one
        per n (a zero-shot classifier embeds each class's prompts in turn).
        """
        inputs = self.check_inputs(inputs, side)
        embed = self._towers[side]
        width = min(batch_size, 1 << max(len(inputs) - 1, 0).bit_length())
        embeddings = padded_chunks.map_padded_chunks(lambda x: embed(self.variables, x), (inputs,), width)
        return np.zeros((0, self.embed_dim), np.float32) if embeddings is None else embeddings

    @functools.cached_property
    def _towers(self) -> dict[str, Callable]:
        """Each side's jitted `(variables, x) -> embeddings`, compiled once per input shape
        for every call."""
        return {side: jax.jit(lambda v, x, side=side: self.model.apply(v, x, side, method="embed")) for side in SIDES}

    def tokenize(self, texts: list[str]) -> np.ndarray:
        """`texts` as the run's token ids `[n, config.data.text_max_length]` int32.

        Raises:
          ConfigError: the tokenizer's file is gone, or is not the one the run trained with.
        """
        for path, digest in self.tokenizer["files"].items():
            if not os.path.isfile(path) or saved_model.file_hash(path) != digest:
                problem = "is missing" if not os.path.isfile(path) else "is not the file the run trained with"
                raise ConfigError(
                    f"the run's tokenizer {path} {problem} (sha256 {digest[:12]}...); put that file back, "
                    "or give token ids as a .npy array."
                )
        return tokenizers.load(self.tokenizer["spec"]).encode_batch(texts, self.tokenizer["text_max_length"])

    def check_inputs(self, inputs: np.ndarray, side: str) -> np.ndarray:
        """`inputs` as tower `side` takes them; a ConfigError naming the shape it needs."""
        if side not in SIDES:
            raise ConfigError(f"--side={side!r}: use 'a' (tower a) or 'b' (tower b).")
        shape, dtype = self.inputs[side]
        inputs = np.asarray(inputs)
        if inputs.shape[1:] != shape:
            raise ConfigError(
                f"inputs of shape {inputs.shape[1:]} per example; tower {side} takes {shape} "
                f"({np.dtype(dtype).name}), as in training."
            )
        tokens = np.issubdtype(dtype, np.signedinteger)
        if tokens != np.issubdtype(inputs.dtype, np.signedinteger):
            needs = "token ids (int32)" if tokens else "images (uint8, or float in [0, 1])"
            raise ConfigError(f"inputs of dtype {inputs.dtype}; tower {side} takes {needs}.")
        return inputs

    def export(self, side: str) -> jax_export.Exported:
        """Tower `side` as a `jax.export.Exported`: the weights inside, any batch size;
        images as float32 in [0, 1], texts as int32 token ids."""
        shape, dtype = self.inputs[side]
        dtype = dtype if np.issubdtype(dtype, np.signedinteger) else np.dtype(np.float32)
        (batch,) = jax_export.symbolic_shape("batch")
        embed, variables = self._towers[side], self.tower_variables(side)
        return jax_export.export(jax.jit(lambda x: embed(variables, x)))(jax.ShapeDtypeStruct((batch, *shape), dtype))

    def caption(
        self,
        images: np.ndarray,
        *,
        max_length: int,
        method: str = "greedy",
        beam_size: int = 4,
        prompt: str | list[int] | None = None,
        batch_size: int = 64,
    ) -> Captions:
        """Captions of `images` `[n, H, W, C]` (as tower a takes them) by a captioning model
        (CoCa: `config.model.decoder_depth` > 0, or an open_clip CoCa checkpoint), decoded
        in jitted JAX (`models.captioning`): `method` "greedy" or "beam" (`beam_size`),
        `max_length` ids with the prompt. `prompt`: the text (or ids) each caption starts
        with; None: the tokenizer's start-of-text id (CLIP's BPE). Images go in chunks of
        `batch_size` (`embed`'s).

        Raises:
          ConfigError: a model without a text decoder, `max_length` beyond its texts, no
            prompt where the tokenizer has no start id, or a method it does not know.
        """
        captioner, prompt_ids, end_id = self._captioner(max_length, method, beam_size, prompt)
        images = self.check_inputs(images, "a")
        prompts = np.broadcast_to(prompt_ids, (len(images), len(prompt_ids)))
        width = min(batch_size, 1 << max(len(images) - 1, 0).bit_length())
        ids, scores = padded_chunks.map_padded_chunks(
            lambda x, p: captioner(self.variables, x, p), (images, prompts), width
        )
        tokenizer = tokenizers.load(self.tokenizer["spec"])
        texts = [tokenizer.decode(row) for row in ids]
        return Captions(ids, scores, None if any(text is None for text in texts) else texts)

    def export_captioner(self, *, max_length: int, method: str = "greedy", beam_size: int = 4, prompt=None):
        """`caption` as a `jax.export.Exported`: images `[batch, H, W, C]` float32 in [0, 1]
        -> `(ids [batch, T] int32, scores [batch] float32)`, the weights (image tower, text
        tower and decoder) and the prompt inside, any batch size (`caption`'s arguments)."""
        captioner, prompt_ids, _ = self._captioner(max_length, method, beam_size, prompt)
        shape, _ = self.inputs["a"]
        (batch,) = jax_export.symbolic_shape("batch")
        variables = self.variables

        def caption(images):
            prompts = jax.numpy.broadcast_to(
                jax.numpy.asarray(prompt_ids, np.int32), (images.shape[0], len(prompt_ids))
            )
            return captioner(variables, images, prompts)

        return jax_export.export(jax.jit(caption))(jax.ShapeDtypeStruct((batch, *shape), np.float32))

    def _captioner(self, max_length: int, method: str, beam_size: int, prompt):
        """`(the jitted captioner, the prompt's ids, the end id)` of `caption`'s arguments, checked."""
        if not hasattr(self.model, "next_token_logits"):
            raise ConfigError(
                f"the run's model ({type(self.model).__name__}) has no text decoder to caption with: train one with "
                "config.model.decoder_depth > 0, or fine-tune an open_clip CoCa checkpoint."
            )
        longest = self.variables["params"]["txt"]["pos_embedding"].shape[0] - 1
        tokenizer = tokenizers.load(self.tokenizer["spec"])
        start, end_id = tokenizer.text_ends()
        if isinstance(prompt, str):  # its ids, the end and padding left out (CLIP's BPE adds its start)
            prompt = np.trim_zeros(tokenizer.encode(prompt, max(max_length, 1)), "b").tolist()
        ids = list(start) if prompt is None else list(prompt)
        ids = [int(i) for i in ids[: len(ids) - 1 if ids and ids[-1] == end_id else len(ids)]]
        if not ids or not len(ids) < max_length <= longest:
            raise ConfigError(
                f"max_length={max_length} with a prompt of {len(ids)} ids: give a prompt (the tokenizer "
                f"{self.tokenizer['spec']!r} starts a text with {list(start)}) and a max_length above its length, "
                f"at most the model's {longest} ids."
            )
        options = {"method": method, "beam_size": beam_size, "end_id": end_id, "buffer_length": longest}
        return captioning.captioner(self.model, max_length=max_length, **options), ids, end_id

    def tower_variables(self, side: str) -> dict[str, Any]:
        """The variables tower `side` embeds with: its own (`model.TOWER_PARAMS[side]`;
        tower a's where the towers are tied) and the scalars at the top, without the
        other tower's."""
        towers = self.model.TOWER_PARAMS
        own = towers[side] if any(name in self.variables["params"] for name in towers[side]) else towers["a"]
        return {
            collection: {k: v for k, v in tree.items() if k in own or not isinstance(v, Mapping)}
            for collection, tree in self.variables.items()
        }


def load(workdir: str, step: int | None = None) -> TrainedModel:
    """The model of the run in `workdir`, restored from checkpoint `step` (the newest).

    A damaged newest checkpoint (a file truncated or gone, a fingerprint that does not
    match) gives way to the one before it, with one line on stderr saying so.

    Raises:
      ConfigError: no such checkpoint; checkpoint `step`, or every checkpoint, damaged
        (one line naming it); or one saved before the model's settings were kept beside
        it, whose data are no longer where its config says.
    """
    directory = os.path.join(os.path.abspath(workdir), run_dir.CHECKPOINTS)
    if not os.path.isdir(directory):
        raise ConfigError(
            f"--workdir={workdir} holds no checkpoints ({directory} is missing); train a run there first."
        )
    ckpt = checkpoint.Checkpointer(directory, max_to_keep=1_000_000)
    try:
        if step is not None and step not in ckpt.steps() or not ckpt.steps():
            raise ConfigError(f"--step={step}: no such checkpoint in {directory}; use one of {ckpt.steps()}.")
        newest_first = [step] if step is not None else sorted(ckpt.steps(), reverse=True)
        for candidate, before in zip(newest_first, [*newest_first[1:], None]):
            try:
                return _restored(ckpt, candidate)
            except checkpoint.CorruptCheckpointError as e:
                damage = _damage(ckpt, candidate, e)
                if before is None:
                    raise ConfigError(damage + ("." if step is not None else "; no checkpoint before it.")) from None
                print(f"warning: {damage}; using checkpoint {before}, the one before.", file=sys.stderr)
    finally:
        ckpt.close()


def _damage(ckpt: checkpoint.Checkpointer, step: int, error: checkpoint.CorruptCheckpointError) -> str:
    """One line for a damaged checkpoint: its folder and what of it cannot be read (the
    reader's own detail left out where it runs over lines)."""
    what = str(error).removeprefix(f"checkpoint {step} in {ckpt.directory}").lstrip(": ")
    if "\n" in what or len(what) > 200:
        what = what.split(" (")[0]
    return f"checkpoint {os.path.join(ckpt.directory, str(step))} is damaged: {what.rstrip('.')}"


def _restored(ckpt: checkpoint.Checkpointer, step: int) -> TrainedModel:
    """Checkpoint `step` of `ckpt` as a `TrainedModel`."""
    config = ckpt.restore_position(step)["config"]
    description = ckpt.restore_model(step)
    if description is None:
        model, description, variables = _rebuilt_from_data(ckpt, step, config)
    else:
        model, variables = saved_model.restore(ckpt, step, description)
    variables = jax.device_get({"params": variables["params"], "batch_stats": variables.get("batch_stats", {})})
    inputs = saved_model.inputs(description)
    return TrainedModel(model, variables, inputs, description["tokenizer"], step, description["embed_dim"], config)


def _rebuilt_from_data(ckpt: checkpoint.Checkpointer, step: int, config: dict[str, Any]):
    """`(model, its settings, variables)` of a checkpoint saved without the model's
    settings: the run built again from its config (`run_plan.build`), which reads its data."""
    from contrastive_jax.training import run_plan  # the door: the saved config is read there

    try:
        run = run_plan.build(config_lib.from_json(config))
        element_spec = input_pipeline.train_dataset(run.data).element_spec
    except ConfigError as e:
        raise ConfigError(
            f"checkpoint {step} in {ckpt.directory} was saved before the model's settings were kept beside it, "
            f"so loading it needs the data it trained on, and: {e}"
        ) from None
    _, abstract_state = run.trainer.init_state(element_spec)
    state = ckpt.restore_state(step, abstract_state)
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    return run.trainer.model, saved_model.with_inputs(run.saved_model, element_spec), variables


if __name__ == "__main__":  # the command's old path, kept for a release: the command is use_trained
    import runpy

    print(
        "note: python -m contrastive_jax.trained is now python -m contrastive_jax.use_trained; "
        "the old path goes in the next release.",
        file=sys.stderr,
    )
    runpy.run_module("contrastive_jax.use_trained", run_name="__main__", alter_sys=True)
