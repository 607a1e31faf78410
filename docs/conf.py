"""Sphinx configuration of the contrastive_jax manual.

Build (from the repository root, after ``.venv/bin/pip install -e '.[docs]'``)::

    .venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

Warnings are errors (``-W``) and cross-references are checked (``nitpicky``). Nothing is
fetched at build time (no intersphinx); the notebook is rendered, not executed
(``tests/test_notebook.py`` executes it), and the pages' Python examples are executed by
``tests/test_docs.py``.
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The checkout's package (not another installed copy), and `configs` for the examples.
sys.path.insert(0, str(ROOT))
# Importing the package for autodoc must not start an accelerator or grab its memory.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

project = "contrastive_jax"
author = "The contrastive_jax authors"
copyright = "the contrastive_jax authors"

extensions = [
    "myst_nb",  # MyST markdown pages and the Colab notebook
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
root_doc = "index"

# --- MyST and the notebook ----------------------------------------------------------
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # tests/test_notebook.py runs it (40 steps, 1 and 8 devices)

# --- API reference ------------------------------------------------------------------
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# `Attributes:` as fields of the class, not a second description of each NamedTuple field.
napoleon_use_ivar = True
# The docstrings write code in single backticks (`x`), as in markdown: show it as code.
default_role = "literal"

# Broken cross-references are errors; types of other libraries cannot be resolved
# without intersphinx (no network at build time), so they are exempt.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        (
            r"(jax|jaxlib|jnp|flax|nn|optax|orbax|ocp|np|numpy|ml_collections|tf|"
            r"tensorflow|tfds|tensorflow_datasets|absl|chex|collections|typing|os|"
            r"pathlib|threading|dataclasses|enum|abc|concurrent|logging|io|types|PIL|grain)\..*"
        ),
    ),
    (
        r"py:class",
        (
            r"(Array|ArrayLike|Any|Callable|Mapping|Sequence|Iterable|Iterator|"
            r"PRNGKey|PathLike|NamedSharding|Mesh|ConfigDict|Schedule|"
            r"GradientTransformation|TrainState|Module|PyTree|np\.ndarray|"
            r"ndarray|float|int|str|bool|None|NoneType|tuple|list|dict|set|"
            r"frozenset|object|Exception|ValueError|RuntimeError|ArrayTree)"
        ),
    ),
    (r"py:class", r"Union\[.*"),  # `nn.Module | None` fields, as autodoc spells them
]

# --- HTML ---------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "contrastive_jax"
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
html_static_path = []


# --- cross-references ---------------------------------------------------------------
# The loss functions are documented once, under the name users call them by
# (`contrastive_jax.losses.clip_loss`); a docstring in a loss's defining module may name
# a sibling by its short name (:func:`infonce_loss_floor`): resolve it to that.
def _resolve_loss_names(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    name = node["reftarget"].rsplit(".", 1)[-1]
    domain = env.get_domain("py")
    target = f"contrastive_jax.losses.{name}"
    if target not in domain.objects:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, node, contnode)


def setup(app):
    app.connect("missing-reference", _resolve_loss_names)
