"""The towers: the project's two-tower model and its settings (`two_tower`), its encoders
(`encoders`), the one Transformer they and the released layouts share (`transformer`),
released CLIP / SigLIP checkpoints (`released/`), and the settings saved beside a
checkpoint that rebuild a trained model without its data (`saved_model`).
"""
