"""The check that a config feeds a released model's towers what they were built for."""

from contrastive_jax.errors import ConfigError


def check_inputs(
    settings,
    *,
    image_size: int | None,
    text_length: int,
    vocab_size: int,
    embed_dim: int,
    learned_bias: bool,
    max_num_patches: int = 0,
    patch_size: int | None = None,
) -> None:
    """That the config feeds the released towers what they were built for: the image
    size (or, for a SigLIP 2 NaFlex, NaFlex images of its `patch_size` within a budget
    `max_num_patches` > 0), caption length and tokenizer vocabulary of the inputs, the
    embedding width the loss is told (`embed_dim`) and, for SigLIP's loss
    (`learned_bias`), a learned bias.

    Raises:
      ConfigError: the first that differs, naming the config field and the value to set.
    """
    _check_naflex(settings, max_num_patches)
    images = ("config.model.patch_size", (patch_size, settings.patch_size))
    if not max_num_patches:
        images = ("config.data.image_size", (image_size, settings.image_size))
    wanted = {
        images[0]: images[1],
        "config.data.text_max_length": (text_length, settings.context_length),
        "config.model.embed_dim": (embed_dim, settings.embed_dim),
    }
    for field, (value, needed) in wanted.items():
        if value != needed:
            raise ConfigError(f"{field}={value}; the released model ({settings.__class__.__module__}) takes {needed}.")
    if vocab_size != settings.vocab_size:
        raise ConfigError(
            f"config.data.tokenizer gives {vocab_size} ids; the released text tower embeds {settings.vocab_size}: "
            "use the model's own tokenizer (CLIP: open_clip's bpe_simple_vocab_16e6.txt.gz; SigLIP: "
            "siglip:<its SentencePiece .model>)."
        )
    if learned_bias and not settings.logit_bias:
        raise ConfigError(
            "config.loss.name='siglip' needs a learned logit bias, which this released model has not: "
            "fine-tune it with config.loss.name='clip'."
        )


def _check_naflex(settings, max_num_patches: int) -> None:
    """ConfigError unless NaFlex images (`config.data.max_num_patches` > 0) go to a
    SigLIP 2 NaFlex's towers and square images to the others."""
    naflex = getattr(settings, "naflex", False)
    if naflex and not max_num_patches:
        raise ConfigError(
            f"config.data.max_num_patches=0; the released model ({settings.__class__.__module__}) is a SigLIP 2 "
            "NaFlex: set it to its token budget (e.g. 256) and config.data.image_size=None."
        )
    if max_num_patches and not naflex:
        raise ConfigError(
            f"config.data.max_num_patches={max_num_patches} needs SigLIP 2 NaFlex weights and the released model "
            f"({settings.__class__.__module__}) takes {settings.image_size}-pixel squares: set max_num_patches=0 and "
            f"config.data.image_size={settings.image_size}, or give a NaFlex checkpoint (transformers' "
            "google/siglip2-base-patch16-naflex model.safetensors)."
        )
