"""CPU-sized towers for the generated image-text set (`data.builtin.shapes`), as config
overrides: the small CNN for the pictures, the byte-level 1-D CNN for the captions
(`zero_shot_shapes` trains them; `critical_batch_study --task shapes` narrows them)."""

TOWERS = {
    "model.encoder_a": "cnn",
    "model.encoder_b": "text_cnn",
    "model.cnn_features": (32, 64),
    "model.encoder_dim": 128,
    "model.embed_dim": 64,
    "eval.batch_size": 500,
}
