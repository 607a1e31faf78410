"""Evaluation: the metrics of embeddings as pure NumPy functions (`metrics`), the field's
benchmarks (`clip_benchmark`: zero-shot classification, retrieval over every caption),
and the in-loop `evaluator.Evaluator` that embeds with the current state.

Below the trainer: nothing here imports `training`.
"""
