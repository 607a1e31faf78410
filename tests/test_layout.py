"""The house rules, checked on the source: the config read at one door, short functions,
one wording per rule, and every module's tests findable from conftest's map."""

import ast
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "contrastive_jax"
MODULES = sorted(path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py"))
MAX_FUNCTION_LINES = 60  # the body, its docstring left out


def test_no_module_below_the_door_imports_ml_collections():
    """Only the door (`trainer.build`, its checks and `config_lib`) and what stands above
    it (the loop's entry, the command line) know the config's type."""
    importers = {
        str(path)
        for path in MODULES
        if re.search(r"^\s*(import ml_collections|from ml_collections)", (PACKAGE / path).read_text(), re.MULTILINE)
    }
    assert importers <= {"config_lib.py", "config_checks.py", "trainer.py", "train.py", "main.py", "cli.py"}, importers


def _long_functions(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            docstring = body[0] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
            lines = (
                node.end_lineno - node.lineno + 1 - (docstring.end_lineno - docstring.lineno + 1 if docstring else 0)
            )
            if lines > MAX_FUNCTION_LINES:
                yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)"


def test_no_function_is_over_60_lines():
    assert [f for path in MODULES for f in _long_functions(PACKAGE / path)] == []


# Wordings the divisibility rules used before `config_lib.check_multiple` / `check_divides`.
OLD_WORDINGS = [
    "does not divide over",
    "is not a multiple of",
    "must be a positive multiple",
    "must be a positive divisor",
    "does not divide the",
    "use a multiple of",
]


@pytest.mark.parametrize("wording", OLD_WORDINGS)
def test_one_wording_per_rule(wording):
    """A multiple or a divisor is checked by one helper each, with one message."""
    found = [str(path) for path in MODULES if wording in (PACKAGE / path).read_text()]
    assert found == [], f"{wording!r} in {found}: use config_lib.check_multiple / check_divides"


def test_every_module_is_in_the_test_map():
    """tests/conftest.py's docstring says where each module is tested."""
    text = (ROOT / "tests" / "conftest.py").read_text()
    listed = text[: text.index('"""', 3)]
    missing = []
    for path in MODULES:
        name = path.with_suffix("").as_posix()
        if name.endswith("__init__"):
            continue
        directory = name.split("/")[0] + "/*"
        if not re.search(rf"(?<![\w/]){re.escape(name.split('/')[-1])}(?![\w])", listed) and directory not in listed:
            missing.append(name)
    assert missing == []


def test_a_loss_module_is_not_named_after_a_loss_it_does_not_define():
    """`losses/contrastive.py` once held every loss but `contrastive_loss`: a module named
    after a loss of the package defines it."""
    import contrastive_jax.losses as losses

    for path in (PACKAGE / "losses").glob("*.py"):
        loss_name = f"{path.stem}_loss"
        if hasattr(losses, loss_name):
            defined = {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}
            assert loss_name in defined, f"losses/{path.name} is named after {loss_name}, defined elsewhere"


def test_no_script_folder_module_hides_a_standard_library_module():
    # A script run as `python experiments/x.py` has experiments/ first on sys.path: an
    # experiments/statistics.py made the benchmark workers' `import statistics` fail.
    folders = [ROOT / "experiments", ROOT / "contrastive_jax", ROOT / "configs"]
    clashes = [p for folder in folders for p in folder.glob("*.py") if p.stem in sys.stdlib_module_names]
    assert not clashes, f"rename these, they hide standard-library modules: {clashes}"
