"""The built-in datasets' records: scikit-learn's digits, the CMU Pronouncing Dictionary
and the generated image-text set (`write_records --source=builtin:NAME`).

Each module gives `SPLITS`-style split names through `num_examples(split)`, the records
of a range of a split through `examples(split, start, stop)` (dicts of `records.FIELDS`
and id keys), and what the metadata says of the set in `INFO`.
"""
