"""The check that a config feeds a released model's towers what they were built for."""

from contrastive_jax.errors import ConfigError


def check_inputs(
    settings, *, image_size: int | None, text_length: int, vocab_size: int, embed_dim: int, learned_bias: bool
) -> None:
    """That the config feeds the released towers what they were built for: the image
    size, caption length and tokenizer vocabulary of the inputs, the embedding width the
    loss is told (`embed_dim`) and, for SigLIP's loss (`learned_bias`), a learned bias.

    Raises:
      ConfigError: the first that differs, naming the config field and the value to set.
    """
    wanted = {
        "config.data.image_size": (image_size, settings.image_size),
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
