"""The built-in datasets' records: scikit-learn's digits, the CMU Pronouncing Dictionary
and the generated image-text set (`write_records --source=builtin:NAME`).

`sklearn_digits` and `cmudict` give their split names (`SPLITS`), each split's size
(`num_examples(split)`), the records of a range of a split (`examples(split, start,
stop)`: dicts of `records.FIELDS` and id keys) and what the metadata says of the set
(`INFO`); `shapes.Shapes` gives the same for a generated set of a size and seed.
"""
