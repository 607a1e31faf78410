# python -m contrastive_jax.main --config=configs/recipes_hard_negatives.py --workdir=runs/recipes_hard_negatives
"""Retrieval with hard negatives (DPR's recipe, Karpukhin et al. 2020: in-batch negatives
and mined ones for each query): a table whose rows carry a `negatives` column, M texts
that are not the row's caption (other captions a retriever ranks high, a caption with
one fact changed), written as a record set once:

    python -m contrastive_jax.write_records --source=csv:pairs.csv --out=data/hard_negatives

(`pairs.csv`: columns `image`, `captions` and `negatives`, the last two JSON lists; a
JSONL or Parquet table works alike, docs/own_data.md.) The text tower embeds every row's
M negatives, and each image's softmax runs over the N captions of the global batch and
all N M hard negatives, gathered from every device (`losses.Candidates(extra_columns=...)`,
losses/candidates.py; docs/losses.md, "Hard negatives and a bank"). The model and optimizer
are configs/clip_shapes.py's. It goes with gradient caching (`--config.train.micro_batch_size`:
the cached representations include the negatives'), FSDP, a streamed loss, a batch
schedule and the noise scale, exact (docs/training.md, "Recipes with the large-batch tools").
"""

from configs import clip_shapes


def get_config():
    """Image-to-text retrieval trained with in-batch and hard negatives."""
    config = clip_shapes.get_config()
    config.data.records = "data/hard_negatives"  # A record set with a `negatives` column (above).
    config.loss.name = "infonce"  # DPR's one-way softmax, image -> texts ("clip" adds texts -> images).
    config.train.global_batch_size = 128  # N (DPR's batch); the pool is N (1 + M) texts.
    return config
