# python -m contrastive_jax.main --config=configs/recipes_mixture.py --workdir=runs/recipes_mixture
"""A two-source mixture (open_clip's `--train-data a::b --train-data-upsampling-factors`,
big_vision's data mixtures): CLIP (configs/clip_shapes.py) on two record sets, each
batch drawn 70 / 30 from them by grain's mixing (data/mixture.py). Each set is read in
epochs of its own, logged as `train/epoch/<set>`; evaluation reads the first set's split.
Here two generated sets, written once (another seed, and the second at 128 px, resized
to 64 as the first is read):

    python -m contrastive_jax.write_records --source=builtin:shapes --seed=1 --out=data/shapes_a
    python -m contrastive_jax.write_records --source=builtin:shapes --seed=2 --num-examples=2000 \\
        --image-size=128 --out=data/shapes_b

Sets that cannot mix (task, image channels, tokenizer, id keys) are refused in one line.
"""

from configs import clip_shapes


def get_config():
    """CLIP on two record sets mixed 0.7 / 0.3."""
    config = clip_shapes.get_config()
    config.data.records = "data/shapes_a,data/shapes_b"  # The two sets (written above).
    config.data.mixture_weights = (0.7, 0.3)  # A batch's share of each set.
    return config
