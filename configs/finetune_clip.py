# python -m contrastive_jax.main --config=configs/finetune_clip.py --workdir=runs/finetune_clip
#   with --config.model.init_from=open_clip_model.safetensors --config.data.records=data/my_pairs \
#     --config.data.tokenizer=bpe_simple_vocab_16e6.txt.gz
"""Fine-tune a released open_clip CLIP (ViT-B/32 or B/16 layout) on your own image-text
records with the global-batch streamed CLIP loss. Needs an accelerator.

The three files: the checkpoint (`open_clip_model.safetensors` or
`open_clip_pytorch_model.bin` from the model's Hugging Face page; QuickGELU, which OpenAI's
weights and the `-quickgelu` models use, is read from the `open_clip_config.json` beside
it or the path's model name, else `--config.model.quick_gelu=True`), your records
(`python -m contrastive_jax.write_records`, docs/own_data.md) and CLIP's BPE vocabulary
(`bpe_simple_vocab_16e6.txt.gz`, shipped inside open_clip's wheel). The image tower is
trained with layer-wise learning-rate decay; `--config.optim.frozen_tower=a` locks it
instead (LiT, Zhai et al. 2022). The temperature starts at the checkpoint's.

One TPU chip (Colab) holds the 4,096 batch as micro-batches of 256 (gradient caching:
the loss is exact over all 4,096); on a larger slice, raise `micro_batch_size` or set it
to 0. On a CPU (to try the recipe) the run is one device, not eight simulated ones: eight
copies of a ViT-B/32's step do not fit a laptop's memory.
"""

import ml_collections

from configs import default


def get_config():
    """A released CLIP, fine-tuned contrastively on image-text records."""
    config = default.get_config()
    config.num_simulated_devices = 1  # On a CPU: one device (a released model's step is large).
    config.data.records = ml_collections.config_dict.placeholder(str)  # Your image-text records.
    config.data.task = "pairs"  # (image, one of its captions) pairs.
    config.data.image_size = 224  # The checkpoint's image size.
    config.data.text_max_length = 77  # CLIP's context length.
    config.data.tokenizer = ml_collections.config_dict.placeholder(str)  # CLIP's bpe_simple_vocab_16e6.txt.gz.
    config.data.num_workers = 4  # Decoding processes.
    config.data.augment.crop_min_area = 0.8  # Mild random resized crops.
    config.data.augment.noise_std = 0.0  # No pixel noise.
    config.model.init_from = ml_collections.config_dict.placeholder(str)  # The open_clip checkpoint.
    config.model.embed_dim = 512  # ViT-B/32 and B/16's embedding width.
    config.model.dropout_rate = 0.0  # The released towers have none.
    config.loss.name = "clip"  # Symmetric InfoNCE over the global batch.
    config.loss.chunk_size = "auto"  # Streamed: no [N, N] logits.
    config.optim.learning_rate = 1e-5  # Fine-tuning's small peak learning rate.
    config.optim.warmup_steps = 500  # Linear warmup.
    config.optim.weight_decay = 0.1  # open_clip's fine-tuning weight decay.
    config.optim.layer_decay = 0.75  # Layer-wise decay: earlier blocks move less.
    config.train.global_batch_size = 4096  # N.
    config.train.micro_batch_size = 256  # Gradient caching: 256 examples embedded at a time.
    config.train.num_train_steps = 5_000  # Steps.
    config.train.log_every_steps = 50  # Log every 50 steps.
    config.eval.split = "test"  # Your held-out split.
    config.eval.every_steps = 1_000  # Retrieval (all captions) every 1k steps.
    config.eval.linear_probe = False  # Retrieval metrics only.
    config.eval.knn_k = 0  # No kNN probe.
    config.checkpoint.every_steps = 1_000  # Save every 1k steps.
    return config
