"""The data a run reads: the settings and their checks (`settings`), the record sets on
disk (`records`), the inputs written as records (`sources`, `writer`, the built-in sets
in `builtin/`), and the pipeline that reads them back as global batches
(`input_pipeline`, through `reader`, `images`, `tokenizers` and `stateless_random`).

Nothing here starts JAX or imports a model, a loss or the trainer.
"""
