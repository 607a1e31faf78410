"""The manual (`docs/`): its examples run, its commands parse, its API reference is whole.

- Every ```python block of a page runs: the blocks of one page in order, as one script,
  in a fresh process on 8 simulated CPU devices (set before JAX starts).
- Every command of the pages' ```bash blocks (and inline code) names `.venv/bin/`, and
  each Python command parses as `tests/test_cli.py` checks the README's (those already
  in the READMEs are left to it).
- Every public function and class of `losses`, `sharding` and `trainer` is documented:
  its module has an `automodule` in `docs/api.md` that lists members, and it has a
  docstring (autodoc leaves out members without one). Every module of the package is in
  `docs/api.md`; each public one (above its "Internals") with a table of its API.
- Figures the manual quotes are read from the committed result files they cite, and
  every `experiments/results/` path it cites exists.

The Sphinx build itself (`sphinx-build -W`, warnings and broken references are errors)
runs in CI (`.ci/run`), not here: it needs the `docs` extra.
"""

import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from subprocess_runs import ROOT
from test_cli import commands_in, readme_commands
from test_cli import test_readme_python_command_parses as check_python_command

from contrastive_jax.simulated_devices import device_count_env

DOCS = os.path.join(ROOT, "docs")
BUILD_COMMAND = ".venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html"
# The languages a page's code may be in (named, always); only `python` is code that runs.
FENCES = {"python", "bash", "text", "ipython", "console", "{toctree}", "{eval-rst}", "{include}"}
DOCUMENTED = ("contrastive_jax.losses", "contrastive_jax.sharding", "contrastive_jax.training.trainer")
OLD_PATHS = ("contrastive_jax.train", "contrastive_jax.released")  # aliases of moved modules, for a release


def pages() -> list[str]:
    """The manual's markdown pages and the README, relative to the repository root."""
    found = []
    for directory, subdirectories, files in os.walk(DOCS):
        subdirectories[:] = sorted(d for d in subdirectories if not d.startswith(("_", ".")))
        found += [os.path.relpath(os.path.join(directory, f), ROOT) for f in sorted(files) if f.endswith(".md")]
    return found + ["README.md"]


def read(page: str) -> str:
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def code_blocks(text: str) -> list[tuple[str, int, str]]:
    """`(language, line number, code)` of every fenced block of a page."""
    return [
        (m.group(1).strip(), text.count("\n", 0, m.start()) + 2, m.group(2))
        for m in re.finditer(r"^[ \t]*```([^\n`]*)\n(.*?)^[ \t]*```", text, re.S | re.M)
    ]


def python_script(page: str) -> str:
    """A page's ```python blocks, in order, as one script (each marked with its line)."""
    return "".join(
        f"# --- {page}, line {line}\n{code}\n"
        for language, line, code in code_blocks(read(page))
        if language == "python"
    )


def test_pages_use_known_code_languages():
    for page in pages():
        for language, line, _ in code_blocks(read(page)):
            assert language.split()[0] in FENCES, f"{page}:{line}: ```{language} (Python examples use ```python)"


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in pages() if python_script(p)])
def test_page_examples_run(page, tmp_path):
    script = tmp_path / "examples.py"
    script.write_text(python_script(page))
    env = device_count_env(8)  # before JAX starts: the child reads it at its first import
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    print(f"{page}: {time.perf_counter() - started:.1f} s")
    assert result.returncode == 0, f"{page}:\n{result.stderr[-4000:]}"


# --- commands -------------------------------------------------------------------------


def page_commands(*, inline: bool = True) -> list[tuple[str, str]]:
    """`(page, command)` for every command of the pages, parsed as the READMEs' are."""
    return [command for page in pages() for command in commands_in(page, read(page), inline=inline)]


def test_page_commands_use_the_virtual_environment():
    for page, command in page_commands():
        for word in re.findall(r"(?:^|\s)(\S*(?:python3?|pip|pytest|sphinx-build))(?=\s|$)", command):
            assert (
                word in (".venv/bin/python", ".venv/bin/pip", ".venv/bin/pytest", ".venv/bin/sphinx-build")
                or (word == "python3" and " -m venv .venv" in command)
                or word.startswith(("!pip", "%pip"))
            ), f"{page}: {command}"


def test_the_build_command_is_what_ci_runs():
    """The manual's build command, as the getting-started page gives it, runs in CI."""
    assert ("docs/getting_started.md", BUILD_COMMAND) in page_commands()
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert BUILD_COMMAND in f.read()
    with open(os.path.join(ROOT, ".gitignore")) as f:
        assert "docs/_build/" in f.read().split()


def _python_commands():
    in_readmes = {c for _, c in readme_commands(inline=False)}
    found, seen = [], set()
    for page, command in page_commands(inline=False):
        words = shlex.split(command.removeprefix("srun "))
        if command in in_readmes or command in seen or words[1:3] == ["-m", "venv"]:
            continue
        if words[0].endswith(("python", "python3")):
            seen.add(command)
            found.append(pytest.param(words, id=f"{page}: {command[:70]}"))
    return found


@pytest.mark.parametrize("words", _python_commands())
def test_page_python_command_parses(words):
    check_python_command(words)


# --- the API reference ----------------------------------------------------------------


def documented_modules(text: str | None = None) -> set[str]:
    """Modules with an `automodule` in `docs/api.md` (or `text`, a part of it) that
    documents their members."""
    text = read("docs/api.md") if text is None else text
    found = set()
    for m in re.finditer(r"^\.\. automodule:: (\S+)\n((?:[ \t]+:.*\n)*)", text, re.M):
        if ":no-members:" not in m.group(2):
            found.add(m.group(1))
    return found


def public_api(module_name: str) -> dict[str, object]:
    """`__all__`, or the functions and classes the module defines without a leading `_`."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return {name: getattr(module, name) for name in module.__all__}
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == module_name
    }


@pytest.mark.parametrize("module_name", DOCUMENTED)
def test_public_api_is_in_the_reference(module_name):
    assert module_name in documented_modules(), f"docs/api.md has no `.. automodule:: {module_name}`"
    api = public_api(module_name)
    assert api
    for name, value in api.items():
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{module_name}.{name} has no docstring: not in the reference"
        if inspect.isclass(value):
            for method_name, method in vars(value).items():
                if not method_name.startswith("_") and inspect.isfunction(method):
                    assert inspect.getdoc(method), f"{module_name}.{name}.{method_name} has no docstring"


def summary_tables() -> dict[str, set[str]]:
    """The names in `docs/api.md`'s `autosummary` tables, by the `currentmodule` above them."""
    tables, module, listing = {}, None, False
    for line in read("docs/api.md").splitlines():
        if m := re.fullmatch(r"\.\. currentmodule:: (\S+)", line):
            module, listing = m.group(1), False
        elif line.startswith(".. autosummary::"):
            listing = True
        elif listing and re.fullmatch(r"   [A-Za-z_]\w*", line):
            tables.setdefault(module, set()).add(line.strip())
        elif listing and line and not line.startswith("   "):
            listing = False
    return tables


def test_public_modules_have_a_table_of_their_api():
    """The reference is two parts: the public modules, each with a table of every public
    function and class with a docstring (autodoc documents no other; under its own module,
    or the module that defines a re-exported one), then the internals (modules a user does
    not call), documented without a table."""
    public_part, internals = read("docs/api.md").split("\n## Internals\n")
    public, tables = documented_modules(public_part), summary_tables()
    assert set(DOCUMENTED) <= public and documented_modules(internals)
    for module_name in sorted(public):
        api = public_api(module_name)
        assert module_name in tables, f"docs/api.md: {module_name} has no autosummary table"
        for name, value in api.items():
            if (inspect.isfunction(value) or inspect.isclass(value)) and inspect.getdoc(value):
                listed = tables[module_name] | tables.get(value.__module__, set())
                assert name in listed, f"docs/api.md: {module_name}.{name} is not in a summary table"


def test_every_package_module_is_in_the_reference():
    """A new module of the package gets its line in `docs/api.md` (`main` and `demo` are
    the command lines, documented as commands)."""
    text = read("docs/api.md")
    package = os.path.join(ROOT, "contrastive_jax")
    for directory, _, files in os.walk(package):
        for file in files:
            if not file.endswith(".py") or file.startswith("_") and file != "__init__.py":
                continue
            parts = os.path.relpath(os.path.join(directory, file), ROOT)[:-3].split(os.sep)
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if module in ("contrastive_jax", "contrastive_jax.main", "contrastive_jax.demo", *OLD_PATHS):
                continue
            assert f".. automodule:: {module}\n" in text, f"docs/api.md lacks {module}"


# --- the README: a front door ---------------------------------------------------------


def test_the_readme_is_short_and_its_links_and_figure_exist():
    text = read("README.md")
    assert len(text.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)#\s]+)\)", text)  # links and images, relative to the root
    assert any(t.endswith(".png") for t in targets) and any(t.startswith("docs/") for t in targets)
    for target in targets:
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), f"README.md: {target}"


# --- numbers in the manual come from committed result files ---------------------------

# (page, quoted figure, the committed file it is read from). A quote is matched with its
# whitespace collapsed, so rewrapping a page does not break it; each page but the README
# (whose table points to `experiments/results/` as a whole) also names its source file
# or that file's folder.
RESULTS = "experiments/results/"
H200_STEP = RESULTS + "bench_step/h200/step_rerun/results.md"
H200_ALL = RESULTS + "bench_step/h200/all_parts/results.md"
QUOTED_FIGURES = [
    ("README.md", "0.406 / 0.419", RESULTS + "default_run/README.md"),
    ("README.md", "(linear CCA on pixels: 0.117 / 0.122", RESULTS + "baselines/results.md"),
    ("README.md", "**0.903 / 0.946**", RESULTS + "cmudict_clip/eval_results.json"),
    ("README.md", "(TF-IDF + CCA: 0.603 / 0.603)", RESULTS + "baselines/results.md"),
    ("README.md", "**419 MiB**", RESULTS + "bench_losses/results.md"),
    (
        "README.md",
        "by 3.13× [1.91, 5.12] (4.09× [2.51, 6.67] with the plain loss)",
        RESULTS + "negatives_vs_noise/summary.md",
    ),
    ("README.md", "(to R@1 0.80: 0.51 [0.43, 0.62] of them at 8,192)", RESULTS + "negatives_vs_noise/summary.md"),
    ("README.md", "57 MiB vs 202 MiB", RESULTS + "bench_losses/results.md"),
    ("README.md", "**98%** / 77%", RESULTS + "bench_losses/results.md"),
    ("README.md", "411 s, 1.04× the loss alone", RESULTS + "bench_grad_cache/results.md"),
    ("README.md", "0.891 at N = 256, 0.899 at 1,024 and 0.896 at 4,096", RESULTS + "epoch_budget_study/summary.md"),
    ("README.md", "SogCLR reach 0.899 and a MoCo queue with EMA keys 0.902", RESULTS + "epoch_budget_study/summary.md"),
    ("docs/global_batch.md", "57 MiB against 202 MiB", RESULTS + "bench_losses/results.md"),
    ("docs/global_batch.md", "(121 → 34 MiB)", RESULTS + "bench_grad_cache/results.md"),
    ("docs/global_batch.md", "takes 411 s, 1.04× the loss alone", RESULTS + "bench_grad_cache/results.md"),
    ("docs/performance.md", "6.63 s at 2^15 and 411 s", RESULTS + "bench_grad_cache/results.md"),
    (
        "docs/performance.md",
        "| 262,144 | grad_cache | 8192 | 410.92 s | 396.32 s | 1.04 | 2.4 | 239 MiB | 9,218 MiB |",
        RESULTS + "bench_grad_cache/results.md",
    ),
    ("docs/performance.md", "streamed in tiles of 8,192 (624 MiB", RESULTS + "bench_losses/accelerator/results.md"),
    ("docs/performance.md", "1.53 s, its towers' forward and backward", RESULTS + "bench_step/cpu/results.md"),
    (
        "docs/performance.md",
        "0.378 s, its loss's 1.072 s, the optimizer's update 0.0097 s",
        RESULTS + "bench_step/cpu/results.md",
    ),
    ("docs/performance.md", "**step ÷ (towers + loss) = 1.06**", RESULTS + "bench_step/cpu/results.md"),
    ("docs/performance.md", "| contrastive_jax | 256 | 2,074 | 38% | 37.23 GiB |", H200_STEP),
    ("docs/performance.md", "| open_clip | 256 | 1,854 | 34% | 22.51 GiB |", H200_STEP),
    ("docs/performance.md", "| contrastive_jax | 872 (largest) | 2,118 | 39% | 122.21 GiB |", H200_STEP),
    ("docs/performance.md", "| open_clip | 1,584 (largest) | 2,130 | 40% | 128.38 GiB |", H200_STEP),
    ("docs/performance.md", "ours ÷ open_clip at the common batch **1.12**", H200_STEP),
    ("docs/performance.md", "the first\n  losses agree (5.6279 / 5.6286, bfloat16)", H200_STEP),
    ("docs/performance.md", "**step ÷ (towers + loss) = 1.00**", H200_STEP),
    ("docs/performance.md", "open_clip ran at 1,452 images/s at 256\n  (4.89 GiB) and 1,623", H200_ALL),
    ("docs/performance.md", "siglip-kernel **1.46** in time (0.0569 s against 0.0389 s)", H200_ALL),
    ("docs/performance.md", "Inf-CL **0.05** in time (0.0705 s against 1.5529 s)", H200_ALL),
    ("docs/performance.md", "(5.60085 / 5.59375, 3.34045 /\n  3.34033)", H200_ALL),
    ("docs/performance.md", "the record pipeline gives 7,150 images/s", H200_ALL),
    ("README.md", "at 1.12× open_clip's", H200_STEP),
    ("docs/performance.md", "5.8× and 4.1× ours streamed", RESULTS + "bench_losses/accelerator/results.md"),
    ("docs/performance.md", "in 817 and 689 MiB", RESULTS + "bench_losses/accelerator/results.md"),
    ("docs/training.md", "| 4 | 2 × 4 | 82.9 MiB | 0.252 |", RESULTS + "bench_fsdp/results.md"),
    ("docs/training.md", "| 8 | 1 × 8 | 41.9 MiB | 0.128 | 643.5 MiB | 1.28 |", RESULTS + "bench_fsdp/results.md"),
    (
        "docs/training.md",
        "with 0.84 [0.73, 0.96] of the examples of the best constant batch, at 2.56 [2.43, 2.69] times",
        RESULTS + "batch_schedule/summary.md",
    ),
    ("docs/experiments.md", "`cmudict_clip` | **0.903** | 0.996 | 0.998 |", RESULTS + "cmudict_clip/eval_results.json"),
    ("docs/experiments.md", "`cmudict_clip` | **0.946** | 0.996 | 0.998 |", RESULTS + "cmudict_clip/eval_results.json"),
    ("docs/experiments.md", "| 0.5 | 0.233 ± 0.012 | 4.085 | 1.735 |", RESULTS + "temperature_sweep/summary.md"),
    (
        "docs/batch_size_study.md",
        "R@1 0.882 (epochs 4–6) to 0.901 (epochs 32–40)",
        RESULTS + "negatives_vs_noise/plateau/constant_rate_n512.txt",
    ),
    (
        "docs/batch_size_study.md",
        "48 epochs add +0.0053 [+0.0030, +0.0078] test R@1 over 24 at the last checkpoint",
        RESULTS + "negatives_vs_noise/plateau/budget_24_epochs.md",
    ),
    (
        "docs/batch_size_study.md",
        "(8,192 − 512: −0.0016 [−0.0041, +0.0012] test R@1 at",
        RESULTS + "negatives_vs_noise/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(plain − fixed_k: +0.0291 [+0.0260, +0.0322], resolved)",
        RESULTS + "negatives_vs_noise/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "N = 64 took 10,542 steps and 256 took 1,703",
        RESULTS + "negatives_vs_noise_shapes_vit/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "1,024 took 967 at the one rate run so far",
        RESULTS + "negatives_vs_noise_shapes_vit/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "took 592, 760 and 995 steps",
        RESULTS + "negatives_vs_noise_shapes_vit/range_512_2048.md",
    ),
    ("docs/batch_size_study.md", "736, 853 and 980", RESULTS + "negatives_vs_noise_shapes_vit/range_512_2048.md"),
    (
        "docs/batch_size_study.md",
        "(48 − 24 epochs: +0.0046 [+0.0023, +0.0070] at the best",
        RESULTS + "negatives_vs_noise/plateau/budget_24_epochs.md",
    ),
    (
        "docs/batch_size_study.md",
        "(96 − 48 epochs: +0.0045 [+0.0020, +0.0069] test",
        RESULTS + "negatives_vs_noise/plateau/budget_48_epochs.md",
    ),
    (
        "docs/batch_size_study.md",
        "| CLIP | 1,024 | 3 | 0.899 ± 0.005 | 0.033 | 0.941 ± 0.005 | 0.041 | 0.037 | 4.2",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "EMA 0.99 | 256 | 3 | **0.902** ± 0.001 | 0.030 | **0.948** ± 0.005 | 0.034 | 0.017 |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| *control:* EMA 0.99, no queue | 256 | 3 | 0.885 ± 0.003 | 0.047 | 0.925 ± 0.004 | 0.057 | 0.031 |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| *control:* SigLIP, 22 epochs (653 steps) | 4,096 | 3 | 0.886 ± 0.006 | 0.046 | 0.927 ± 0.008 | 0.055 |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| *control:* SigLIP from T = 0.04 | 4,096 | 3 | 0.741 ± 0.043 | 0.191 | 0.772 ± 0.041 | 0.210 |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| queue K = 16,384, EMA 0.99 | 1,024 | 3 | **0.906** ± 0.001 | 0.026 | **0.951** ± 0.000 | 0.031 |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| EMA queue − CLIP, N = 1,024 | 3 vs 3 | +0.0068 [+0.0017, +0.0120] | +0.0094 [+0.0045, +0.0142] "
        "| +0.0055 [+0.0017, +0.0094] | +0.0086 [+0.0054, +0.0120] |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "+0.1454 [+0.1407, +0.1501] / +0.1545 [+0.1496, +0.1593]",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| CLIP 1,024 − CLIP 256 | 3 vs 3 | +0.0084 [+0.0037, +0.0130] | +0.0096 [+0.0053, +0.0138] |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| EMA queue − DCL, N = 256 | 3 vs 3 | +0.0035 [+0.0003, +0.0068] | +0.0123 [+0.0077, +0.0169] |",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    ("docs/batch_size_study.md", "(255,325 → 167,688 → 150,709)", RESULTS + "critical_batch_study/summary.md"),
    (
        "docs/batch_size_study.md",
        "B_crit = 1,203 ± 566, 1,674 ± 237, 3,154 ± 1,400",
        RESULTS + "critical_batch_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| DCL | 256 | 2 | 311 ± 30 | 380 ± 26 | 414 ± 23 | 535 ± 59 | 805 ± 158 | 0.897 ± 0.002 | 0.036 |",
        RESULTS + "critical_batch_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(4,096 − 2,048 over the queries spelling → pronunciation: −0.0173 [−0.0198, −0.0149];",
        RESULTS + "critical_batch_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| DCL | 1,024 | 4 | 92 ± 5 | 103 ± 4 | 116 ± 16 | 142 ± 12 | 188 ± 21 | 0.899 ± 0.002 | 0.033 |",
        RESULTS + "critical_batch_study/summary.md",
    ),
    ("docs/batch_size_study.md", "B_simple is 3,783–6,769", RESULTS + "critical_batch_study/summary.md"),
    (
        "docs/batch_size_study.md",
        "2,048 − 1,024 is −0.0036 [−0.0061, −0.0012], resolved,",
        RESULTS + "critical_batch_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "−0.0045 [−0.0126, +0.0035], not resolved, back",
        RESULTS + "critical_batch_study/summary.md",
    ),
    ("docs/batch_size_study.md", "+0.0027 [+0.0003, +0.0050], resolved,", RESULTS + "critical_batch_study/summary.md"),
    (
        "docs/batch_size_study.md",
        "+0.0047 [+0.0002, +0.0093] spelling → pronunciation and +0.0070 [+0.0022, +0.0117] back",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "0.854 image → caption and 0.902 back",
        RESULTS + "critical_batch_study_shapes/ceiling.json",
    ),
    ("docs/batch_size_study.md", "and 12,904–90,297 at", RESULTS + "critical_batch_study/summary.md"),
    (
        "docs/batch_size_study.md",
        "| 256 | 318 ± 80 | 407 ± 63 | 497 ± 39 | 711 ± 130 | 996 ± 244 |",
        RESULTS + "critical_batch_study_shapes/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "N = 256 ends at R@1 0.416 ± 0.041 image → caption and 0.428 ± 0.081 back, N = 1,024 at 0.062 ±",
        RESULTS + "critical_batch_study_shapes/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "0.130 and 0.064 ± 0.128",
        RESULTS + "critical_batch_study_shapes/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "−0.3540 [−0.3770, −0.3320] and −0.3640",
        RESULTS + "critical_batch_study_shapes/summary.md",
    ),
    *[  # the earlier sigmoid/softmax design's findings, one row per N
        ("docs/batch_size_study.md", quoted, RESULTS + "sigmoid_vs_softmax/summary.md")
        for quoted in (
            "| 64 | 6,750 | 0.853 ± 0.007 (k = 0) | 0.908 ± 0.002 (k = 3, T0 0.05, b0 −15) "
            "| +0.0551 [+0.0487, +0.0616] | +0.0546 [+0.0476, +0.0616] | +0.0557 [+0.0495, +0.0619] |",
            "| 128 | 3,375 | 0.881 ± 0.003 (k = 2) | 0.917 ± 0.001 (k = 4, T0 0.05, b0 −15) "
            "| +0.0356 [+0.0331, +0.0382] | +0.0335 [+0.0321, +0.0349] | +0.0378 [+0.0335, +0.0420] |",
            "| 256 | 1,688 | 0.899 ± 0.002 (k = 3) | 0.912 ± 0.002 (k = 3, T0 0.1, b0 −15) "
            "| +0.0127 [+0.0105, +0.0150] | +0.0116 [+0.0090, +0.0142] | +0.0139 [+0.0114, +0.0163] |",
            "| 512 | 844 | 0.907 ± 0.002 (k = 4) | 0.911 ± 0.001 (k = 3, T0 0.1, b0 −15) "
            "| +0.0039 [+0.0021, +0.0057] | +0.0031 [+0.0012, +0.0050] | +0.0048 [+0.0020, +0.0075] |",
            "| 1,024 | 422 | 0.908 ± 0.001 (k = 6) | 0.901 ± 0.005 (k = 5, T0 0.1, b0 −15) "
            "| −0.0070 [−0.0124, −0.0016] | −0.0066 [−0.0118, −0.0014] | −0.0074 [−0.0130, −0.0018] |",
        )
    ],
    (
        "docs/batch_size_study.md",
        "at 2,048 it gives 133 steps against 113 ± 14; at 16,384 73 against 85 ± 10",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    ("docs/batch_size_study.md", "(470 ± 137 → 188 ± 6, 2.5× fewer", RESULTS + "critical_batch_constant_lr/summary.md"),
    (
        "docs/batch_size_study.md",
        "89 ± 3 at 4,096, 88 ± 11 at 8,192, 85 ± 10 at 16,384",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "2,048 takes +28.2 [+16.9, +39.5] steps more than 16,384 (Welch 95% over the seeds, resolved)",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    ("docs/batch_size_study.md", "(4,096: +4.5 [−4.1, +13.1])", RESULTS + "critical_batch_constant_lr/summary.md"),
    (
        "docs/batch_size_study.md",
        "539 [489, 598] and 1,213 [1,044, 1,395]",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "49 [44, 57] at step 22, 4,001 [3,393, 4,872] at step 88",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    ("docs/batch_size_study.md", "is 0.70–3.09 times, not 4", RESULTS + "critical_batch_constant_lr/summary.md"),
    ("docs/batch_size_study.md", "bias² / |E g|² = 0.16–0.60", RESULTS + "critical_batch_constant_lr/summary.md"),
    ("docs/batch_size_study.md", "(0.883, 0.870, 0.884, 0.864 at k = 3", RESULTS + "sigmoid_vs_softmax/summary.md"),
    (
        "docs/batch_size_study.md",
        "| 64 | +0.0063 [+0.0015, +0.0112] |",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| 128 | −0.0003 [−0.0029, +0.0023] |",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| 256 | +0.0078 [+0.0055, +0.0102] |",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| 512 | −0.0002 [−0.0028, +0.0023] |",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| 1,024 | −0.0107 [−0.0177, −0.0038] |",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "initial temperature goes to 0.28 and its seed-0 validation R@1 from 0.844 to 0.887",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(0.871 at 0.14, 0.887 at 0.28)",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(0.897 → 0.902, 0.908 → 0.910)",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| −0.0065 [−0.0250, +0.0119] |",
        RESULTS + "sigmoid_vs_softmax/v2/step_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| −0.0058 [−0.0176, +0.0060] |",
        RESULTS + "sigmoid_vs_softmax/v2/step_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| −0.0065 [−0.0099, −0.0030] |",
        RESULTS + "sigmoid_vs_softmax/v2/step_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| −0.0011 [−0.0028, +0.0006] |",
        RESULTS + "sigmoid_vs_softmax/v2/step_matched/summary.md",
    ),
    (
        "docs/recipes.md",
        "+0.0063 [+0.0015, +0.0112] at N = 64 and −0.0107 [−0.0177, −0.0038] at 1,024",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/recipes.md",
        "SigLIP leads at no N (−0.0011 [−0.0028, +0.0006] at 1,024, not resolved)",
        RESULTS + "sigmoid_vs_softmax/v2/step_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "R@1 0.187 ± 0.025 at N = 16, 0.428 ± 0.003 at 1024",
        RESULTS + "batch_size_sweep/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "N = 1024, linear rate: 0.863 ± 0.002 against 0.831 ± 0.002 at 256",
        RESULTS + "batch_size_sweep_cmudict/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "CLIP 1,024 − CLIP 256: +0.0084 [+0.0037, +0.0130] test R@1",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "DCL 256 − CLIP 256: +0.0115 [+0.0071, +0.0159] test R@1",
        RESULTS + "critical_batch_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "2,157 [965, 4,460] | resolved (inside N = 512 … 16,384), but the estimate moves from 1,374 to 4,863",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "χ² = 314 on 4 degrees of freedom (p = 1.0e-66) | no: the interval above carries a between-N misfit of 18.7%",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| 2,048 takes +28.2 [+16.9, +39.5] steps more than 16,384; 4,096 +4.5 [−4.1, +13.1] |",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| S_512 − 2 S_1,024 = +95 [−41, +231] steps | not resolved |",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| N = 256's runs peak at 0.873–0.889 |",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(the 0.88 fit starts at 512); 0.80–0.86 lie below every N's peak",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| N = 16,384 reaches 0.88 after 12.9 epochs, each batch 15.2% of the split |",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(N = 256, k = 2, seed 0; 16,384, k = 9, seed 0)",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| B_simple 1,330 [782, 2,261], B_adam 4,239 [2,063, 8,711] |",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| SigLIP − CLIP +0.0551 [+0.0487, +0.0616] at N = 64, −0.0070 [−0.0124, −0.0016] at 1,024 |",
        RESULTS + "sigmoid_vs_softmax/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "untuned, 6,750 → 422 steps | 118 |",
        RESULTS + "sigmoid_vs_softmax/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "1. **B_crit at R@1 0.88 is 2,157 [965, 4,460]: resolved as this page uses the word",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "χ² = 314 on 4 degrees of freedom (p = 1.0e-66) against the seeds' errors of 1–7% per N",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "the seeds alone give [2,013, 2,296], too narrow",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "2,088 [329, 9,635] with inverse-variance weights (not resolved), 4,863 [708, inf] unweighted",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "2,373 [1,225, 4,335] on log residuals; without N = 512, 1,374 [819, 2,121]",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "without any other one N, 2,048–2,752",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(1,024 → 2,048: −38 [−64, −12])",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "B_crit 1,199 [622, 2,124] at 0.80 … 2,145 [356, 7,753] at 0.86",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(χ² 435–2,087 on 5 degrees of freedom)",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "B_simple is 1,330 [782, 2,261] and B_adam 4,239 [2,063, 8,711]",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "the runs' validation R@1 is 0.871–0.896",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "had fallen back from 0.882 to 0.871",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "reaches 0.88 after 12.9 epochs (8,192: 6.7;",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "is 15.2% of the 108,000 training pairs",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(6,750 at N = 64, 3,375 at N = 128, 1,688 at N = 256, 844 at N = 512, 422 at N = 1,024)",
        RESULTS + "sigmoid_vs_softmax/summary.md",
    ),
    ("docs/performance.md", "| 0.5 | 14.8 s | 0.365 |", RESULTS + "bench_patch_dropout/cpu_batch32/results.md"),
    ("docs/performance.md", "| 0.75 | 7.9 s | 0.195 |", RESULTS + "bench_patch_dropout/cpu_batch32/results.md"),
    ("docs/own_data.md", "0.96× at 64 px (2,167 against 2,261", RESULTS + "bench_input/mixture/results.md"),
    ("docs/own_data.md", "1.15× at 224 px (1,011 against 878)", RESULTS + "bench_input/mixture/results.md"),
    (
        "docs/batch_size_study.md",
        "8,102 [1,177, inf] fitted from N = 256, 4,089 [1,834, 12,017] from 512 and 2,547 [1,040, 6,788]",
        RESULTS + "critical_batch_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "stages: 1.28 [1.22, 1.35] × N = 16,384's steps, 1.48 [1.34, 1.64] × N = 1,024's examples",
        RESULTS + "batch_schedule/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "noise rule: 2.56 [2.43, 2.69] × the steps, 0.84 [0.73, 0.96] × the examples",
        RESULTS + "batch_schedule/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| stages 512 → 2,048 → 4,096 | 94 ± 5 | 1.28 [1.22, 1.35] | 203.6k ± 19.5k | 1.48 [1.34, 1.64] |",
        RESULTS + "batch_schedule/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "| noise rule | 187 ± 9 | 2.56 [2.43, 2.69] | 115.3k ± 18.7k | 0.84 [0.73, 0.96] |",
        RESULTS + "batch_schedule/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "constant N = 2,048 is (90 ± 8 steps, 184.0k examples)",
        RESULTS + "batch_schedule/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "more examples than N = 1,024 (137.5k ± 16.6k)",
        RESULTS + "batch_schedule/summary.md",
    ),
    ("docs/batch_size_study.md", "0.84 [0.78, 0.92] of N = 1,024's", RESULTS + "batch_schedule/summary.md"),
    ("docs/batch_size_study.md", "(0.90 [0.73, 1.11],", RESULTS + "batch_schedule/summary.md"),
    ("docs/batch_size_study.md", "0.86 [0.73, 1.01])", RESULTS + "batch_schedule/summary.md"),
    ("docs/batch_size_study.md", "Its steps are 2.25–2.56×", RESULTS + "batch_schedule/summary.md"),
    ("docs/batch_size_study.md", "after step 112–176", RESULTS + "batch_schedule/summary.md"),
    (
        "docs/batch_size_study.md",
        "(N = 512 takes 315 ± 153 steps and 161.3k ± 78.4k examples at 0.86)",
        RESULTS + "batch_schedule/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "the noise rule takes 0.84 [0.73, 0.96] of N = 1,024's examples at 0.86",
        RESULTS + "batch_schedule/summary.md",
    ),
    *[  # the negatives_vs_noise section and the findings table's rows
        ("docs/batch_size_study.md", quoted, RESULTS + "negatives_vs_noise/summary.md")
        for quoted in (
            "| 512 | 315 ± 153 | 314 ± 154 | 1.00 [0.63, 1.59], not resolved |",
            "| 1,024 | 134 ± 16 | 185 ± 51 | 1.37 [1.08, 1.75], resolved |",
            "| 2,048 | 90 ± 8 | 134 ± 21 | 1.49 [1.31, 1.69], resolved |",
            "| 4,096 | 78 ± 2 | 110 ± 7 | 1.41 [1.33, 1.49], resolved |",
            "| 8,192 | 76 ± 7 | 99 ± 8 | 1.30 [1.20, 1.41], resolved |",
            "3.13 [1.91, 5.12] with K = 512 fixed, against 4.09 [2.51, 6.67] with the plain loss",
            "at 0.80 the two factors are 2.09 [1.73, 2.52] and 2.57 [2.29, 2.89]",
            "the steps fall 3.13 [1.91, 5.12]× from 512 to 8,192, against 4.09 [2.51, 6.67]×",
            "fixed K takes 1.30 [1.20, 1.41]× the plain loss's steps at 8,192",
            "the 1.00 [0.63, 1.59] at N = 512 below is a reproducibility check",
            "the steps to R@1 0.86 fall by 4.09 [2.51, 6.67]× from N = 512 to 8,192",
            "alone cuts the steps by 3.13 [1.91, 5.12]×, and the negatives beyond 512 save a further "
            "1.30 [1.20, 1.41]×",
            "(to R@1 0.80, 0.51 [0.43, 0.62] of the steps at 8,192 negatives)",
            "B_crit = 1,350 [976, 1,668], resolved (inside N = 512 … 8,192)",
            "χ² = 3 on 3 degrees of freedom (p = 3.7e-01)",
            "1,801 [791, 3,801], with χ² = 103 on 3 (p = 3.1e-22)",
            "B_crit = 1,350 [976, 1,668], χ² = 3 on 3 (plain loss, same N: 1,801 [791, 3,801], χ² = 103 on 3)",
            "the fixed-K estimate is 1,175–1,486, and with each N left out 1,164–1,452",
            "661 [538, 763] at 0.80, 865 [759, 983] at 0.82, 1,023 [900, 1,140] at 0.84",
            "is 3.25–4.78 times that at 2,048, its interval holding 4 in 59 of 60",
            "bias² / |E g|² is −0.03 to +0.04, its interval holding 0 in 60 of 60",
            "B_simple is 1,015 [857, 1,202]",
            "B_adam, 3,548 [1,895, 6,642]",
            "(validation R@1 0.860–0.888)",
            "after 1.5 epochs at N = 512 and 7.5 at 8,192 (one batch is 7.6% of the split there)",
            "the fixed-N runs at 0.861–0.891",
            "fixed-N runs after 1.5–1.8 epochs",
            "| 512 | 139 ± 30 | 314 ± 154 | 914 [235, 3,546] | 0.0212 [0.00505, 0.0891] | 19.4 [8.69, 43.2] |",
            "| 1,024 | 183 ± 14 | 335 ± 101 | 619 [272, 1,409] | 0.0418 [0.0254, 0.0687] | 25.9 [17.2, 38.8] |",
            "| 2,048 | 225 ± 3 | 335 ± 47 | 214 [89, 515] | 0.23 [0.0815, 0.647] | 49.2 [36, 67.2] |",
            "| 4,096 | 256 ± 39 | 379 ± 55 | 254 [161, 403] | 0.34 [0.189, 0.614] | 86.6 [75.4, 99.5] |",
            "| 8,192 | 270 ± 42 | 372 ± 48 | 153 [39, 599] | 0.952 [0.23, 3.94] | 145 [128, 165] |",
            "the steps to R@1 0.80 at 512 negatives are 0.51 [0.43, 0.62] of those at 8,192",
            "at 0.82 0.62 [0.54, 0.72] and at 0.84 0.69 [0.60, 0.80], both resolved",
            "at 0.86, 0.83 [0.52, 1.33], not resolved",
            "B_simple at 512 negatives is 5.98 [1.73, 20.71] times that at 8,192 (B_adam 6.05 [1.85, 19.79])",
            "|E g|² at 512 is 0.02 [0.01, 0.08] of that at 8,192 and tr Σ 0.13 [0.06, 0.29]",
            "is 2.78–6.09, its interval holding 4 in 58 of 60 states",
            "steps at 512 negatives 0.51 [0.43, 0.62] of those at 8,192; B_simple 5.98 [1.73, 20.71]×",
        )
    ],
    (  # the answer paragraph: the knee, and the gain at the end of a fixed budget
        "docs/batch_size_study.md",
        "R@1 0.88, 2,048 takes +28.2 [+16.9, +39.5] steps more than 16,384; 4,096 +4.5 [−4.1, +13.1])",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "after 11 epochs CLIP at N = 1,024 leads 256 by +0.0084 [+0.0037, +0.0130] test R@1, and 4,096 − 1,024 is "
        "−0.0027 [−0.0076, +0.0023], not resolved, CLIP's runs 0.033–0.050 under the task's ceiling",
        RESULTS + "epoch_budget_study/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "N = 1,024's difference is −0.0011 [−0.0028, +0.0006], not resolved",
        RESULTS + "sigmoid_vs_softmax/v2/step_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "(−0.0107 [−0.0177, −0.0038]) is not resolved with twice the steps",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "initial temperature left at 0.07; v2 finds +0.0063 [+0.0015, +0.0112] on test",
        RESULTS + "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    ),
    (
        "docs/batch_size_study.md",
        "0.70–3.09 (4 in 2 of 56) and +0.16 to +0.60 (0 in 0 of 56)",
        RESULTS + "critical_batch_constant_lr/summary.md",
    ),
    (
        "docs/recipes.md",
        "N = 32,768, D = 64: 7.568 s on 2 CPU cores, 18 MiB of compiled temporaries, 387 MiB",
        RESULTS + "bench_losses/results.md",
    ),
    ("docs/recipes.md", "1.485 s against CLIP's 1.549 s at N = 16,384", RESULTS + "bench_losses/results.md"),
    (
        "docs/recipes.md",
        "+0.0551 [+0.0487, +0.0616] at N = 64 and -0.0070 [-0.0124, -0.0016]",
        RESULTS + "sigmoid_vs_softmax/summary.md",
    ),
    ("docs/recipes.md", "16.96 GiB at p = 0, 8.196 GiB at 0.5, 4.347 GiB", RESULTS + "bench_patch_dropout/results.md"),
    ("docs/recipes.md", "from 312 to 664 (2.128×) and 1,600", RESULTS + "bench_patch_dropout/results.md"),
    (
        "docs/recipes.md",
        "40.56 s at p = 0 and 14.81 s at 0.5 (0.365×)",
        RESULTS + "bench_patch_dropout/cpu_batch32/results.md",
    ),
    (
        "docs/recipes.md",
        "0.96× at 64 px (2,167 against 2,261 images/s) and 1.15× at 224 px (1,011 against 878)",
        RESULTS + "bench_input/mixture/results.md",
    ),
    (
        "docs/recipes.md",
        "1.52× its compiled temporaries (52 MiB against 34 MiB; the dense form's N × N matrices would need "
        "about 48 GiB) and 1.87× its time (86.7 s against 46.3 s",
        RESULTS + "bench_distillation/results.json",
    ),
    (
        "docs/recipes.md",
        "564.9 MiB of compiled memory against 418.6 MiB (1.35×; temporaries 1.37×) and 1.349 s a step against "
        "1.032 s (1.31×)",
        RESULTS + "bench_coca/results.md",
    ),
    (
        "docs/recipes.md",
        "at 256 tokens NaFlex holds 337.2 MiB against the square 256-px tower's 341.1 MiB (0.989×) and takes "
        "0.579 s a step against 0.552 s (1.049×); at 576 tokens, 993.3 MiB against the 384-px tower's 1,023.0 MiB "
        "(0.971×) and 1.587 s against 1.426 s (1.113×)",
        RESULTS + "bench_naflex/results.md",
    ),
    ("docs/use_a_trained_model.md", "**0.363** / 0.859 / 0.968", RESULTS + "zero_shot_shapes/summary.md"),
    ("docs/use_a_trained_model.md", "| 0.222 / 0.226 |", RESULTS + "zero_shot_shapes/summary.md"),
]


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d[\d,]*(?:\.\d+)?", text)


def _collapsed(text: str) -> str:
    return " ".join(text.split())


def _assert_from_source(page: str, quoted: str, source: str) -> None:
    """The page names `source` (or its folder), and every number in `quoted` is in the
    committed `source` to the quoted precision."""
    text = read(page)
    cited = page == "README.md" or source in text or os.path.dirname(source) + "/" in text
    assert cited, f"{page} quotes {quoted!r} without naming {source} (or its folder)"
    found = [float(n) for n in _numbers(read(source).replace(",", ""))]
    for number in _numbers(quoted.replace(",", "")):
        if number in ("1", "2", "4", "15"):  # the mesh's, the seeds' and the exponents' digits
            continue
        decimals = len(number.split(".")[1]) if "." in number else 0
        assert any(round(f, decimals) == float(number) for f in found), f"{number} of {page} not in {source}"


@pytest.mark.parametrize("page, quoted, source", QUOTED_FIGURES)
def test_quoted_figures_are_in_their_result_files(page, quoted, source):
    """Each quoted figure is on its page, and every number in it is in the committed file
    it comes from, to the quoted precision (change the file's number, or the page's, and
    this fails)."""
    assert _collapsed(quoted) in _collapsed(read(page)), f"{page} no longer quotes {quoted!r}"
    _assert_from_source(page, quoted, source)


# The batch-size study's findings table: each row's finding (its first words) and the
# summary its figure comes from; a row whose figure is "—" (under way) has none.
FINDINGS_SOURCES = {
    "Digits, fixed 500 steps": "batch_size_sweep/summary.md",
    "`cmudict`, 2 epochs": "batch_size_sweep_cmudict/summary.md",
    "11 epochs, where every N trains": "epoch_budget_study/summary.md",
    "Fewer negatives is another objective": "critical_batch_study/summary.md",
    "The critical batch, constant rate": "critical_batch_constant_lr/summary.md",
    "McCandlish's curve describes the steps": "critical_batch_constant_lr/summary.md",
    "A larger batch stops buying steps": "critical_batch_constant_lr/summary.md",
    "Steps fall faster than 1/N": "critical_batch_constant_lr/summary.md",
    "The 0.88 target and the small-N plateau": "critical_batch_constant_lr/summary.md",
    "Data reuse at large N": "critical_batch_constant_lr/summary.md",
    "The noise scale against B_crit": "critical_batch_constant_lr/summary.md",
    "Sigmoid against softmax, the earlier design": "sigmoid_vs_softmax/summary.md",
    "Negatives fixed (K = 512), batch grown": "negatives_vs_noise/summary.md",
    "With the negatives fixed, McCandlish's curve": "negatives_vs_noise/summary.md",
    "Batch fixed (N = 512), negatives grown": "negatives_vs_noise/summary.md",
    "Sigmoid against softmax, each tuned per N (v2), epoch-matched": "sigmoid_vs_softmax/v2/epoch_matched/summary.md",
    "Sigmoid against softmax, each tuned per N (v2), step-matched": "sigmoid_vs_softmax/v2/step_matched/summary.md",
    "Batch size as a schedule": "batch_schedule/summary.md",
}


def test_every_figure_of_the_findings_table_is_in_its_study_summary():
    """Each row of docs/batch_size_study.md's findings table with a figure has its source
    in FINDINGS_SOURCES, every number of that figure is in it, and each estimate with its
    interval ("+0.0084 [+0.0037, +0.0130]", "0.187 ± 0.025") is in it as written, not only
    its numbers apart (mutations, each red: the table's 1,015 made 1,016; its +0.0084 made
    +0.0085, a number found elsewhere in that summary); a row under way says so in its
    verdict."""
    page = "docs/batch_size_study.md"
    table = read(page).split("## The findings in one table")[1].split("\n## ")[0]
    rows = [line.strip("|").split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]  # past the header
    assert len(rows) >= len(FINDINGS_SOURCES)
    for finding, figure, verdict, _ in ([cell.strip() for cell in row] for row in rows):
        if figure == "—":
            assert verdict.startswith("under way"), f"{finding!r} has no figure and is not under way"
            continue
        source = [s for prefix, s in FINDINGS_SOURCES.items() if finding.startswith(prefix)]
        assert len(source) == 1, f"{finding!r}: no source (or several) in FINDINGS_SOURCES"
        _assert_from_source(page, figure, RESULTS + source[0])
        written = _collapsed(read(RESULTS + source[0])).replace("−", "-")
        for estimate in re.findall(r"[+−-]?[\d,.]*\d (?:\[[^\]]+\]|± [\d,.]*\d)", _collapsed(figure)):
            assert estimate.replace("−", "-") in written, f"{finding!r}: {estimate!r} not in {source[0]} as written"


def test_the_study_page_opens_with_its_answer_and_short_verdicts():
    """docs/batch_size_study.md answers its question in one paragraph before the findings
    table, each verdict of that table is at most 120 characters, and the superseded
    sigmoid/softmax design is the page's last section, an appendix."""
    text = read("docs/batch_size_study.md")
    opening = text.split("## The findings in one table")[0]
    assert opening.count("**The answer") == 1 and "## " not in opening
    table = text.split("## The findings in one table")[1].split("\n## ")[0]
    for row in (line.strip("|").split(" | ") for line in table.splitlines() if line.startswith("| ")):
        assert len(row[2].strip()) <= 120, f"verdict of {row[0].strip()!r}: {len(row[2].strip())} characters"
    assert text.split("\n## ")[-1].startswith("Appendix: sigmoid against softmax, the earlier design (v1)")


def _edge_cells(arm: str) -> dict[int, str]:
    """N → the "tuned at a grid's edge" cell of a sigmoid_vs_softmax v2 arm's summary."""
    text = read(RESULTS + f"sigmoid_vs_softmax/v2/{arm}/summary.md")
    table = text.split("## Test R@1 at each loss's tuned setting")[1].split("\n## ")[0]
    rows = [line.strip("|").split(" | ") for line in table.splitlines() if re.match(r"\| [\d,]+ \|", line)]
    return {int(row[0].strip().replace(",", "")): row[-1].strip() for row in rows}


def test_the_sigmoid_grid_edges_quoted_are_the_summaries():
    """The grid edges quoted on the study page and on recipes.md (CLIP's initial
    temperature at its grid's cap "in 6 of the 10 arm × N cells", CLIP's rate at its cap
    "at N = 64, 128 and 256" step-matched) are counted from the two arms' summaries."""
    epoch, step = _edge_cells("epoch_matched"), _edge_cells("step_matched")
    cells = [*epoch.values(), *step.values()]
    temperature = sum("CLIP temperature" in cell for cell in cells)
    rate = sorted(n for n, cell in step.items() if "CLIP rate" in cell)
    assert not any("CLIP rate" in cell for cell in epoch.values())
    for page in ("docs/batch_size_study.md", "docs/recipes.md"):
        text = _collapsed(read(page))
        assert f"in {temperature} of the {len(cells)} arm × N cells" in text, page
    rates = f"N = {rate[0]}, {rate[1]} and {rate[2]}"
    assert f"CLIP's tuned rate at its cap at {rates} in the step-matched arm" in _collapsed(read("docs/recipes.md"))


def test_the_schedule_saving_is_one_less_the_ratio():
    """The noise rule's saving in examples at R@1 0.86, "a saving of A–B%", is 1 less the
    bounds of its ratio to N = 1,024's examples in the committed summary."""
    summary = read(RESULTS + "batch_schedule/summary.md").split("## Validation R@1 0.86")[1]
    ratio = re.search(r"\| noise \| .*? \| [\d.]+ \[([\d.]+), ([\d.]+)\], resolved \|", summary)
    low, high = map(float, ratio.groups())
    assert f"(a saving of {round(100 * (1 - high))}–{round(100 * (1 - low))}%)" in read("docs/batch_size_study.md")


def test_every_cited_result_file_exists():
    for page in pages():
        for path in re.findall(r"experiments/results/[\w./-]+\.(?:md|json|csv|png)", read(page)):
            assert os.path.exists(os.path.join(ROOT, path)), f"{page} cites {path}"
