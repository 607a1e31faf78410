"""Test configuration: 8 simulated CPU devices, set before JAX is imported.

The folders are the map: `tests/<wing>/` tests the package's wing `contrastive_jax/<wing>/`
(data, models, losses, training, evaluation), `tests/experiments/` the experiments, and the
files at the top the commands and what every wing uses (`tests/test_layout.py` checks that
each test file imports what its folder names). `loss_cases` and `subprocess_runs` are the
tests' shared helpers; the repository's root is importable (`configs`, `experiments`).
"""

import importlib.util
import os
import subprocess
import sys
import tempfile

from contrastive_jax.simulated_devices import with_device_count  # noqa: E402  (JAX-free)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # configs/ and experiments/ are imported from the repository's root
    sys.path.insert(0, ROOT)

# The tests' programs are tiny and compiled once each: compile them fast (LLVM at -O0, and
# XLA's older CPU code generator, which compiles in about two thirds of the time of its
# fusion emitters: test_losses and test_false_negatives 56 -> 38 s, test_streaming and
# test_train 115 -> 96 s, run after one another); the child processes the tests start
# inherit the flags, so their results compare alike.
_FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)


def _flags_xla_accepts(flags: tuple[str, ...]) -> str:
    """The `flags` this XLA knows, space-separated: XLA aborts a process on a flag it does
    not know, and newer XLAs dropped the older CPU code generator and its switch (jax 0.11).
    A child process starts JAX's CPU backend with them (one probe when all are known); the
    answer is kept in the environment for the workers and the processes the tests start."""
    known = os.environ.get("CONTRASTIVE_JAX_TEST_XLA_FLAGS")
    if known is None:

        def starts(xla_flags: str) -> bool:
            env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
            probe = [sys.executable, "-c", "import jax; jax.devices()"]
            return subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0

        everything = " ".join(flags)
        known = everything if starts(everything) else " ".join(flag for flag in flags if starts(flag))
        os.environ["CONTRASTIVE_JAX_TEST_XLA_FLAGS"] = known
    return known


os.environ["XLA_FLAGS"] = with_device_count(f"{os.environ.get('XLA_FLAGS', '')} {_flags_xla_accepts(_FAST_COMPILE)}", 8)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# NumPy's linear algebra on one thread (set before NumPy loads): beside the workers' XLA
# threads OpenBLAS's own spin, and an SVD of 256 x 64 took 0.45 s instead of 1.5 ms.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session's workers and every process the tests
# start, holding every program however fast it compiled: the CLI and resume tests compile
# the same tiny train step dozens of times, and the loss tests the same float64 references
# (caching all of them took the suite from 335 s to 302 s, cold, one run after the other).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "contrastive_jax_test_jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

import pytest  # noqa: E402

pytest_plugins = ["subprocess_runs"]  # its `processes` fixture, for every test file


def _prepared(name: str, tmp_path_factory) -> str:
    """A `config.data.data_dir` holding the built-in dataset `name`'s records, written
    once per test session: under pytest-xdist the first worker to ask writes them in the
    session's shared temp directory (the others wait on the writer's file lock). Tests
    read them and must not write to them."""
    from contrastive_jax import write_records

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above each worker's own
    data_dir = str(root / "records")
    write_records.write_builtin(name, data_dir)
    return data_dir


@pytest.fixture(scope="session")
def digits_data_dir(tmp_path_factory):
    """A data_dir holding `sklearn_digits`' records, written once per test session."""
    return _prepared("sklearn_digits", tmp_path_factory)


@pytest.fixture(scope="session")
def load_config():
    """`load_config("default")` -> `configs/default.py`'s `get_config()`."""
    from contrastive_jax.config_lib import load_config

    return load_config


@pytest.fixture
def tiny_config(load_config, digits_data_dir):
    """The tests' one tiny config: the default config shrunk to a few fast steps on the
    digits (`subprocess_runs.tiny_fields`); a file needing other cadences overrides them."""
    from subprocess_runs import tiny_fields

    from contrastive_jax.config_lib import override

    return override(load_config("default"), tiny_fields(digits_data_dir))


@pytest.fixture(scope="session")
def cmudict_data_dir(tmp_path_factory):
    """A data_dir holding `cmudict`'s records, written once per test session."""
    return _prepared("cmudict", tmp_path_factory)


@pytest.fixture(scope="session")
def shapes_data_dir(tmp_path_factory):
    """A data_dir holding the generated `shapes` set's records (10,000 pictures at 64 px),
    written once per test session (~4 s)."""
    return _prepared("shapes", tmp_path_factory)


@pytest.fixture(scope="session")
def trained(load_config, digits_data_dir, tmp_path_factory):
    """A workdir holding checkpoint 2 of the tiny config (`subprocess_runs.tiny_fields`);
    tests resume from it but must not change it (copy it first)."""
    from subprocess_runs import tiny_fields

    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    workdir = str(tmp_path_factory.mktemp("trained"))
    fields = tiny_fields(digits_data_dir, train__num_train_steps=2)
    run_plan.train_and_evaluate(override(load_config("default"), fields), workdir)
    return workdir


def pytest_collection_modifyitems(items):
    """The end-to-end runs (15-60 s each, when selected) first: under pytest-xdist they
    then spread over the workers instead of leaving one worker busy at the end."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)  # stable: else in file order


@pytest.fixture(scope="session")
def clip_merges():
    """open_clip's copy of OpenAI's merges file, found without importing open_clip."""
    for package in ("regex", "ftfy"):
        pytest.importorskip(package, reason="the released extra is not installed")
    spec = importlib.util.find_spec("open_clip")
    if spec is None:
        pytest.skip("open_clip (the reference extra) is not installed")
    return os.path.join(spec.submodule_search_locations[0], "bpe_simple_vocab_16e6.txt.gz")


@pytest.fixture(scope="module")
def two_block_vit_tiny():
    """`vit_tiny` at 2 Transformer blocks instead of 12 (its width, heads and MLP as they
    are), for the modules that use it (`pytestmark = pytest.mark.usefixtures(...)`): what
    they test (a step's rows, masks, gradient paths) is per block, and 2 blocks compile
    several times faster. Module-scoped, so that the module's own fixtures (a trained
    teacher) see it too; a saved run rebuilt in the module gets it as well."""
    from contrastive_jax.models import encoders

    twelve_blocks = encoders.ENCODERS["vit_tiny"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(encoders.ENCODERS, "vit_tiny", lambda *args: twelve_blocks(*args).clone(depth=2))
        yield
