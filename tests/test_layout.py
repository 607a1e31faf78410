"""The house rules, checked on the source: the config read at one door, short functions,
one wording per rule, the tests' folders mirroring the wings, and an import
graph without a circle."""

import ast
import functools
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "contrastive_jax"
MODULES = sorted(path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py"))
MAX_FUNCTION_LINES = 60  # the body, its docstring left out


def test_no_module_below_the_door_imports_ml_collections():
    """Only the door (`run_plan.build`, its checks and `config_lib`, and `run_plan`'s
    `train_and_evaluate`) and what stands above it (the training command) know the
    config's type."""
    importers = {
        str(path)
        for path in MODULES
        if re.search(r"^\s*(import ml_collections|from ml_collections)", (PACKAGE / path).read_text(), re.MULTILINE)
    }
    door = {"config_lib.py", "training/config_checks.py", "training/run_plan.py", "main.py"}
    assert importers <= door, importers


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
    experiments = sorted((ROOT / "experiments").rglob("*.py"))  # the same cap, no exceptions
    assert [f for path in [*(PACKAGE / m for m in MODULES), *experiments] for f in _long_functions(path)] == []


# Wordings the divisibility rules used before `errors.check_multiple` / `check_divides`.
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
    assert found == [], f"{wording!r} in {found}: use errors.check_multiple / check_divides"


def _imported_names(path: pathlib.Path) -> set[str]:
    """The modules (and `module.name`s) a file imports, from its source."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_tests_folders_are_the_map():
    """`tests/<wing>/` holds the tests of the package's wing `<wing>` and `tests/experiments/`
    those of experiments/: each wing has its folder, and each test file there imports from
    what its folder names (a file put in the wrong folder fails)."""
    folders = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == {*WINGS, "experiments"}
    misplaced = []
    for folder in folders:
        tested = "experiments" if folder == "experiments" else f"contrastive_jax.{folder}"
        for path in (ROOT / "tests" / folder).rglob("test_*.py"):
            if not any(name == tested or name.startswith(f"{tested}.") for name in _imported_names(path)):
                misplaced.append(str(path.relative_to(ROOT)))
    assert misplaced == []


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
    folders = [ROOT / "experiments", *(EXPERIMENTS / f for f in EXPERIMENT_FOLDERS), PACKAGE, ROOT / "configs"]
    clashes = [p for folder in folders for p in folder.glob("*.py") if p.stem in sys.stdlib_module_names]
    assert not clashes, f"rename these, they hide standard-library modules: {clashes}"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """`{module: the package's modules it imports}` over contrastive_jax, from the source
    (`ast`): imports inside functions (lazy ones) count; `from package import module` is
    an edge to the module, `from module import name` to the module; the empty top
    package is left out."""
    paths = {_module_name(PACKAGE / path): PACKAGE / path for path in MODULES}
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                module = ".".join(base + [node.module or ""]).strip(".") if node.level else node.module
                imported |= {f"{module}.{a.name}" if f"{module}.{a.name}" in paths else module for a in node.names}
        graph[name] = {m for m in imported if m in paths and m not in (name, "contrastive_jax")}
    return graph


def circles_and_floors(graph: dict[str, set[str]]) -> tuple[list[list[str]], list[str]]:
    """`(the circles: each a strongly connected set of modules, sorted; the longest chain
    of imports, top floor first)`; a circle counts as one floor."""
    index, low, stack, components = {}, {}, [], []

    def connect(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    owner = {node: tuple(c) for c in components for node in c}

    @functools.cache
    def chain(component):
        below = {owner[m] for node in component for m in graph[node]} - {component}
        return (component[0], *max((chain(c) for c in below), key=len, default=()))

    return [c for c in components if len(c) > 1], list(max((chain(c) for c in set(owner.values())), key=len))


def test_the_import_graph_has_no_circle():
    """No module imports, even lazily, one that imports it back: every import goes down a
    floor. `data_sources` -> `write_records` -> `record_inputs` -> `images` ->
    `data_sources` was one (writing a built-in dataset from the config check)."""
    circles, floors = circles_and_floors(import_graph())
    short = [name.removeprefix("contrastive_jax.") for name in floors]
    assert circles == [], f"import circles: {circles}; {len(floors)} floors: {' -> '.join(short)}"


WINGS = ("data", "models", "losses", "training", "evaluation")  # the packages by job
MAX_FLOORS = 9
ALIASES = {"contrastive_jax.train", "contrastive_jax.released"}  # old public paths, kept for a release


def room(module: str) -> str:
    """The room a module is in: its wing (`contrastive_jax.data.records` -> `data`), or
    itself for a module at the top (`contrastive_jax.console` -> `console`)."""
    return module.removeprefix("contrastive_jax.").split(".")[0]


def rooms_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`import_graph` with each wing as one room: `{room: the other rooms it imports}`."""
    rooms = {}
    for module, imported in graph.items():
        rooms.setdefault(room(module), set()).update(room(other) for other in imported if room(other) != room(module))
    return rooms


def test_the_wings_import_down_and_the_house_has_at_most_9_floors():
    """Counted with each wing one room (its modules' own floors are its business, as
    `losses`' are): no wing imports one that imports it back (the in-loop evaluator once
    sat above the trainer: evaluate -> benchmark -> trained -> trainer), and the longest
    chain of rooms, from a command down to `errors`, is at most 9 long."""
    graph = import_graph()
    assert {room(m) for m in graph if m.count(".") > 1} == set(WINGS)
    circles, floors = circles_and_floors(rooms_graph(graph))
    assert circles == [], f"wings importing each other: {circles}"
    assert len(floors) <= MAX_FLOORS, f"{len(floors)} floors: {' -> '.join(floors)}"


def test_the_manual_draws_the_floors_as_they_are():
    """docs/training.md's map of the house (`floor N  room room/ ...`) puts each room on
    its floor: one above the highest room it imports."""
    graph = rooms_graph(import_graph())

    @functools.cache
    def floor(name):
        return 1 + max((floor(other) for other in graph[name]), default=0)

    drawn = {}
    for line in (ROOT / "docs" / "training.md").read_text().splitlines():
        if match := re.match(r"floor (\d)  (.*)", line):
            drawn |= {word.rstrip("/"): int(match[1]) for word in re.sub(r"\([^)]*\)", "", match[2]).split()}
    assert drawn == {name: floor(name) for name in graph if name != "contrastive_jax"}


def test_the_evaluation_wing_is_below_the_trainer_and_data_below_models():
    rooms = rooms_graph(import_graph())
    below = lambda name: rooms[name] | {m for r in rooms[name] for m in below(r)}  # noqa: E731
    assert "training" not in below("evaluation") and "trained" not in below("evaluation")
    assert not below("data") & {"models", "losses", "training", "evaluation"}


def test_nothing_imports_an_old_path():
    """The aliases of moved public modules are for users' code: the package, its tests and
    experiments import the new paths."""
    users = [ROOT / "contrastive_jax", ROOT / "tests", ROOT / "experiments", ROOT / "configs"]
    names = r"(train|released)\b"
    imports = rf"from contrastive_jax import [^\n]*\b{names}|(from|import) contrastive_jax\.{names}"
    pattern = re.compile(rf"^\s*({imports})", re.M)
    found = [
        str(path.relative_to(ROOT))
        for folder in users
        for path in folder.rglob("*.py")
        if path.name not in ("train.py", "released.py", "test_layout.py") and pattern.search(path.read_text())
    ]
    assert found == []


def test_an_old_path_is_the_moved_module_itself():
    import contrastive_jax.models.released as released
    import contrastive_jax.training.run_plan as run_plan

    with pytest.warns(DeprecationWarning, match="contrastive_jax.training.run_plan"):
        sys.modules.pop("contrastive_jax.train", None)
        from contrastive_jax import train
    with pytest.warns(DeprecationWarning, match="contrastive_jax.models.released"):
        sys.modules.pop("contrastive_jax.released", None)
        import contrastive_jax.released as old_released
    assert train is run_plan and callable(train.train_and_evaluate) and old_released is released


def test_the_graph_reader_finds_a_circle_and_the_floors():
    circles, floors = circles_and_floors({"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()})
    assert circles == [["b", "c"]] and floors == ["a", "b", "d"]


def test_models_import_nothing_from_the_losses():
    """A model normalises its embeddings with `embeddings.l2_normalize`, below both
    wings; the models once imported the whole losses package for it."""
    graph = import_graph()
    imports = {m: {i for i in graph[m] if room(i) == "losses"} for m in graph if room(m) == "models"}
    assert {m: i for m, i in imports.items() if i} == {}


def test_no_two_package_modules_share_a_file_name():
    """One file per name (`__init__.py` aside): `models/two_tower.py` and
    `models/released/two_tower.py` were two."""
    names = [path.name for path in MODULES if path.name != "__init__.py"]
    assert sorted({name for name in names if names.count(name) > 1}) == []


EXPERIMENTS = ROOT / "experiments"
EXPERIMENT_FOLDERS = ("lib", "studies", "bench")  # what the studies share, the studies, the benchmarks
# The wings' modules (besides their faces, the `__init__`s) that docs/*.md shows a user's own
# script importing: with the package's top-level modules and the faces, the door experiments/
# goes through. `x.*`: the modules of package x.
PUBLIC_WING_MODULES = {
    "data.builtin.*",  # the built-in datasets
    "data.input_pipeline",  # the train and evaluation datasets
    "data.records",  # a record set, read
    "data.settings",  # DataSettings, Augment
    "evaluation.metrics",  # the retrieval metrics
    "models.released.open_clip_layout",  # open_clip's checkpoints and their Settings
    "models.transformer",  # TowerSettings
    "training.checkpoint",  # a run's state, restored
    "training.loop",  # run_loop, Preempted
    "training.memory_fit",  # the largest batch that fits
    "training.noise_scale",  # the gradient noise scale
    "training.run_plan",  # build, data_settings, RunPlan
}
# Experiments that measure the package's internals on purpose, with why; the benchmark
# workers (`bench/*_worker.py`, run in a fresh process per measurement) are too.
INTERNALS = {
    "bench/bench_input.py": "times the image decoder and augmenter (data.images) without the pipeline",
    "bench/bench_naflex.py": "times the NaFlex image tower (models.naflex) against the fixed one without a dataset",
    "bench/bench_patch_dropout.py": "times the image tower's step (models.two_tower, patch_dropout) without a dataset",
    "lib/replicates.py": "the gradient of the step's own loss at a checkpoint (the trainer's split of the outputs)",
}


def _is_package_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _outside_the_door(path: pathlib.Path) -> set[str]:
    """The package's modules `path` imports that are neither at the top, nor a wing's face
    (a package), nor in `PUBLIC_WING_MODULES`."""
    outside = set()
    for name in _imported_names(path):
        inner = name.removeprefix("contrastive_jax.")
        if inner == name or not _is_package_module(name) or "." not in inner:
            continue  # not the package's, an attribute, or a top-level module
        public = inner in PUBLIC_WING_MODULES or f"{inner.rpartition('.')[0]}.*" in PUBLIC_WING_MODULES
        if not (public or (ROOT / name.replace(".", "/") / "__init__.py").is_file()):
            outside.add(inner)
    return outside


def test_experiments_import_the_package_s_public_door():
    """experiments/ is a user of the package: its modules import the top-level modules, the
    wings' faces and `PUBLIC_WING_MODULES`; the workers and `INTERNALS` measure more."""
    found = {}
    for path in EXPERIMENTS.rglob("*.py"):
        name = str(path.relative_to(EXPERIMENTS))
        if not (path.name.endswith("_worker.py") or name in INTERNALS) and (outside := _outside_the_door(path)):
            found[name] = sorted(outside)
    assert found == {}, f"import these through the public door, or name the experiment as an internal one: {found}"
    assert all((EXPERIMENTS / name).is_file() and _outside_the_door(EXPERIMENTS / name) for name in INTERNALS)


def test_the_door_rule_finds_an_internal_import(tmp_path):
    planted = tmp_path / "study.py"
    planted.write_text(
        "from contrastive_jax.training import loop, resume\nfrom contrastive_jax.data.builtin import shapes\n"
    )
    assert _outside_the_door(planted) == {"training.resume"}


def test_experiments_has_its_three_folders_and_a_study_imports_no_other_study():
    """`lib/` what the studies share, `studies/` the studies, `bench/` the benchmarks (and
    `results/`); a study imports `experiments.lib` and its own parts (`<study>_grid`,
    `<study>_report`), never another study: what two share goes to lib/."""
    folders = {path.name for path in EXPERIMENTS.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == {*EXPERIMENT_FOLDERS, "results"}
    assert [p.name for p in EXPERIMENTS.glob("*.py")] == ["__init__.py"]
    studies = {path.stem for path in (EXPERIMENTS / "studies").glob("*.py")} - {"__init__"}
    crossing = {}
    for study in studies:
        imported = {
            name.split(".")[2]
            for name in _imported_names(EXPERIMENTS / "studies" / f"{study}.py")
            if name.startswith("experiments.studies.") and name.split(".")[2] in studies
        }
        if others := {other for other in imported if not other.startswith(f"{study}_")}:
            crossing[study] = sorted(others)
    assert crossing == {}
    lib = [p for p in (EXPERIMENTS / "lib").glob("*.py") if "experiments.studies" in str(_imported_names(p))]
    assert lib == [], "lib/ imports no study"


def test_the_experiments_tests_mirror_its_folders():
    """`tests/experiments/<folder>/` tests `experiments/<folder>/`: each test file there
    imports from it."""
    tests = ROOT / "tests" / "experiments"
    assert {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(EXPERIMENT_FOLDERS)
    assert [p.name for p in tests.glob("test_*.py")] == []
    misplaced = [
        str(path.relative_to(tests))
        for folder in EXPERIMENT_FOLDERS
        for path in (tests / folder).glob("test_*.py")
        if not any(name.startswith(f"experiments.{folder}") for name in _imported_names(path))
    ]
    assert misplaced == []
