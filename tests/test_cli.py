"""The command line as a person meets it, with real processes: one-line errors, quiet
logs and a summary, Ctrl-C that saves, and every command of the READMEs.

Mistakes found while parsing the flags are run as `python -m contrastive_jax.main`
(they exit before JAX or TensorFlow are imported, in well under a second). Mistakes found
later (the config checks, the workdir, a resume) are run by `forked_cli`: a server
process imports the slow modules once (JAX's backend is not started) and forks one child
per case, which runs the command line's entry point `main.run()` with that case's
arguments; each case is its own process with its own exit status and stderr.
"""

import functools
import io
import json
import logging
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from subprocess_runs import ROOT, tiny_fields, write_config
from test_validation import (
    ANOTHER_DATA_ORDER,
    ANOTHER_MODEL,
    BAD_COMBINATIONS,
    BAD_VALUES,
    bad_value_fields,
)

from contrastive_jax import console

# The environment of a person's shell: none of the settings tests/conftest.py makes.
USER_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "CONTRASTIVE_JAX_VERBOSE")
}


def cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    """`python -m contrastive_jax.main ARGS` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "contrastive_jax.main", *args],
        cwd=ROOT,
        env=env or USER_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(status, stdout, stderr, message, *, exit_status=2):
    """Exit status 2, nothing on stdout, and stderr exactly `error: ...` matching `message`."""
    assert (status, stdout) == (exit_status, ""), stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert re.search(message, lines[0]), lines[0]


def flag(field, value) -> str:
    """`--config.<field>=<value>` as typed on the command line."""
    text = ",".join(map(str, value)).join("()") if isinstance(value, tuple) else value
    return f"--config.{field}={text}"


# --- mistakes in the flags: found before JAX starts -----------------------------------

DEFAULT = "--config=configs/default.py"


@pytest.mark.parametrize(
    "args, message",
    [
        # The example: a typo'd field (it was an escaped string with a literal \n).
        (
            [DEFAULT, "--workdir=w", "--config.train.global_batch_sise=128"],
            r"^error: --config.train.global_batch_sise: configs/default.py has no field "
            r'\'global_batch_sise\'. Did you mean "global_batch_size" instead of "global_batch_sise"\?$',
        ),
        (
            [DEFAULT, "--workdir=w", "--config.trian.global_batch_size=128"],
            r'has no field \'trian\'. Did you mean "train" instead of "trian"\?',
        ),
        # A missing config file (it was "Failed loading config file config_config").
        (
            ["--config=config_config", "--workdir=w"],
            r"^error: --config=config_config: no such file \(in .*\); pass a config file such as "
            r"configs/default.py \(configs/ holds clip_coco.py, .*default.py, ",
        ),
        (["--config=configs", "--workdir=w", "--config.loss.temperature=0.1"], r"--config=configs: is a directory"),
        (
            ["--config=README.md", "--workdir=w"],
            r"--config=README.md: not a Python file \(.*line \d+\); a config file defines get_config\(\)",
        ),
        (
            [DEFAULT, "--workdir=w", "--config.train.global_batch_size=abc"],
            r"^error: flag --config.train.global_batch_size=abc: invalid literal for int\(\)",
        ),
        ([DEFAULT], r"^error: Missing --workdir: pass a directory .* e.g. --workdir=runs/default\.$"),
        (["--workdir=w"], r"^error: Missing --config: pass a config file, e.g. --config=configs/default.py\.$"),
        ([DEFAULT, "--wrkdir=w"], r"^error: Unknown command line flag 'wrkdir'. Did you mean: workdir \?$"),
        ([DEFAULT, "--workdir=w", "extra"], r"^error: Unexpected arguments \['extra'\]"),
        (
            [DEFAULT, "--workdir=w", "--num_processes=2", "--process_id=2"],
            r"--process_id must be below --num_processes",
        ),
        ([DEFAULT, "--workdir=w", "--num_processes=0"], r"--num_processes=0: 0 is not a positive integer"),
    ],
    ids=lambda value: " ".join(a for a in value if a != DEFAULT) if isinstance(value, list) else "",
)
def test_flag_mistake_is_one_line_and_exit_status_2(args, message):
    result = cli(*args)
    assert_one_line_error(result.returncode, result.stdout, result.stderr, message)


def test_verbose_shows_the_traceback_of_a_flag_mistake():
    result = cli(DEFAULT, "--workdir=w", "--config.train.global_batch_sise=128", "--verbose")
    assert result.returncode == 2
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.splitlines()[-1].startswith("error: --config.train.global_batch_sise:")


def test_a_variant_config_loads_by_absolute_path_from_another_directory(tmp_path):
    """`configs/cmudict_clip.py` imports `configs.default`: found from any directory."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "contrastive_jax.main",
            f"--config={ROOT}/configs/cmudict_clip.py",
            "--workdir=w",
            "--only_check_args",
        ],
        cwd=tmp_path,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


@pytest.mark.parametrize("error", ["RuntimeError", "ValueError"])  # ValueError: a flags.Error
def test_a_crash_in_a_config_file_keeps_its_traceback(tmp_path, error):
    config = tmp_path / "broken.py"
    config.write_text(f"def get_config():\n    raise {error}('bug in the config')\n")
    result = cli(f"--config={config}", "--workdir=w")
    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr
    assert f"{error}: bug in the config" in result.stderr
    assert "error: " not in result.stderr


# --- mistakes found later: forked from a server that imported the slow modules ---------

_FORK_SERVER = textwrap.dedent(
    """
    import json, os, sys, traceback
    from contrastive_jax import main
    from contrastive_jax.training import loop, run_plan, trainer  # the slow imports; JAX does not start

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # this case's process: `python -m contrastive_jax.main ARGS`
            for name, stream in (("stdout", 1), ("stderr", 2)):
                with open(request[name], "w") as f:
                    os.dup2(f.fileno(), stream)
            os.environ.update(request["env"])
            sys.argv = [main.__file__, *request["args"]]
            exec(request["setup"])
            try:
                main.run()
                status = 0
            except SystemExit as e:  # as the interpreter does: a message exits with 1
                if e.code is None or isinstance(e.code, int):
                    status = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    status = 1
            except BaseException:
                traceback.print_exc()
                status = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    """
)
# Run in every forked case: the train step must not be compiled for a mistake.
NO_COMPILE = "trainer.Trainer.jit_train_step = lambda *a: sys.exit('error: the train step was compiled')"


class ForkedCli:
    """Runs the command line's entry point in a fresh child of the server per case."""

    def __init__(self, directory):
        self._directory = directory
        self._server = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._runs = 0

    def __call__(self, *args, setup=NO_COMPILE, env=None, timeout=120):
        """`(exit status, stdout, stderr)` of one run with `args`."""
        self._runs += 1
        out, err = (os.path.join(self._directory, f"{self._runs}.{s}") for s in ("out", "err"))
        request = {"args": args, "setup": setup, "env": env or {}, "stdout": out, "stderr": err}
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        if not select.select([self._server.stdout], [], [], timeout)[0]:
            self.close()
            pytest.fail(f"no exit within {timeout} s: {args}")
        status = int(self._server.stdout.readline())
        with open(out) as o, open(err) as e:
            return status, o.read(), e.read()

    def close(self):
        if self._server.poll() is None:
            os.killpg(self._server.pid, signal.SIGKILL)
        self._server.wait()


@pytest.fixture(scope="module")
def forked_cli(tmp_path_factory):
    runner = ForkedCli(str(tmp_path_factory.mktemp("forked")))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def tiny_config_file(digits_data_dir, tmp_path_factory):
    """A config file: the default config shrunk (tests/subprocess_runs.tiny_fields)."""
    return write_config(tmp_path_factory.mktemp("config") / "tiny.py", tiny_fields(digits_data_dir))


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields, message",
    [
        pytest.param(fields, message, id=",".join(f"{k}={v}" for k, v in fields.items()))
        for fields, message in [(bad_value_fields(f, v), m) for f, v, m in BAD_VALUES]
        + BAD_COMBINATIONS
        + [
            (
                {"train.global_batch_size": 2048},  # checked when the data are opened
                r"config.train.global_batch_size=2048 is larger than the 1437 examples of split 'train'",
            ),
        ]
    ],
)
def test_bad_config_is_one_line_and_exit_status_2(forked_cli, tiny_config_file, tmp_path, fields, message):
    args = [f"--config={tiny_config_file}", f"--workdir={tmp_path / 'run'}"]
    status, stdout, stderr = forked_cli(*args, *(flag(k, v) for k, v in fields.items()))
    assert_one_line_error(status, stdout, stderr, message)


@pytest.mark.parametrize(
    "workdir, message",
    [
        (
            "a_file/run",
            r"--workdir=.*a_file/run cannot be created or written \(Not a directory\); "
            "pass a directory you can write to",
        ),
        ("", r"^error: Missing --workdir"),
    ],
)
def test_bad_workdir_is_one_line(forked_cli, tiny_config_file, tmp_path, workdir, message):
    (tmp_path / "a_file").write_text("")
    status, stdout, stderr = forked_cli(
        f"--config={tiny_config_file}", f"--workdir={tmp_path / workdir if workdir else ''}"
    )
    assert_one_line_error(status, stdout, stderr, message)


def test_a_step_that_does_not_fit_is_one_line_naming_the_figures(forked_cli, tiny_config_file, tmp_path):
    """A config that uses every fix already: one compile, and the batch is what is left.
    (tests/training/test_memory_fit.py checks the settings a message proposes.)"""
    every_fix = {
        "loss.collective": "ring",
        "loss.chunk_size": 8,
        "train.micro_batch_size": 32,
        "model.compute_dtype": "bfloat16",
        "mesh.fsdp": 2,
        "train.memory_limit_gib": 2**-20,  # 1 KiB
    }
    args = [f"--config={tiny_config_file}", f"--workdir={tmp_path}"]
    status, stdout, stderr = forked_cli(
        *args,
        *(flag(k, v) for k, v in every_fix.items()),
        setup="",  # compiling is allowed
    )
    assert_one_line_error(
        status,
        stdout,
        stderr,
        r"^error: The train step needs \d+\.\d KiB per device, the device has 1\.0 KiB "
        r"\(config.train.memory_limit_gib\); the config uses every fix already; lower "
        r"--config.train.global_batch_size\.$",
    )


@pytest.fixture(scope="module")
def trained_config(digits_data_dir, tmp_path_factory):
    """A config that continues the `trained` workdir's run (at step 2) to step 4."""
    return write_config(
        tmp_path_factory.mktemp("config") / "longer.py",
        tiny_fields(digits_data_dir, train__num_train_steps=4),
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            f,
            v,
            rf"^error: Cannot resume onto another model\. checkpoint 2 in .* holds a state of "
            rf"another structure.*{m}.*Set them back to resume, or use a new --workdir",
        )
        for f, v, m in ANOTHER_MODEL
    ]
    + [
        (
            f,
            v,
            rf"^error: Cannot resume from checkpoint 2: it was written with config\.{f}=.*Set "
            rf"--config\.{f}=.*, or use a new --workdir\.$",
        )
        for f, v in ANOTHER_DATA_ORDER
    ],
)
def test_resume_mismatch_is_one_line(forked_cli, trained, trained_config, field, value, message):
    before = sorted(os.listdir(os.path.join(trained, "checkpoints")))
    status, stdout, stderr = forked_cli(f"--config={trained_config}", f"--workdir={trained}", flag(field, value))
    assert_one_line_error(status, stdout, stderr, message)
    assert sorted(os.listdir(os.path.join(trained, "checkpoints"))) == before


def test_a_heartbeat_timeout_too_short_is_one_line(forked_cli, tiny_config_file, tmp_path):
    args = [f"--config={tiny_config_file}", f"--workdir={tmp_path}", "--heartbeat_timeout_seconds=1"]
    status, stdout, stderr = forked_cli(*args)
    message = r"^error: --heartbeat_timeout_seconds=1.0: must be at least 2 \(the processes beat once a second\)"
    assert_one_line_error(status, stdout, stderr, message)


def test_verbose_flag_and_variable_show_the_traceback(forked_cli, tiny_config_file, tmp_path):
    args = [f"--config={tiny_config_file}", f"--workdir={tmp_path}", "--config.loss.temperature=0"]
    for extra, env in (["--verbose"], {}), ([], {"CONTRASTIVE_JAX_VERBOSE": "1"}):
        status, _, stderr = forked_cli(*args, *extra, env=env)
        assert status == 2
        assert "Traceback (most recent call last):" in stderr
        assert "contrastive_jax.errors.ConfigError: config.loss.temperature=0.0" in stderr
        assert stderr.splitlines()[-1] == "error: config.loss.temperature=0.0 must be > 0 (e.g. 0.07)."


def test_a_crash_keeps_its_traceback(forked_cli, tiny_config_file, tmp_path):
    crash = "def boom(*a): raise RuntimeError('a bug')\ntrainer.Trainer.init_state = boom"
    status, stdout, stderr = forked_cli(f"--config={tiny_config_file}", f"--workdir={tmp_path}", setup=crash)
    assert (status, stdout) == (1, "")
    assert "Traceback (most recent call last):" in stderr
    assert stderr.rstrip().endswith("RuntimeError: a bug")


def test_non_finite_loss_is_one_line_naming_the_checkpoint(forked_cli, tiny_config_file, tmp_path):
    nan_loss = textwrap.dedent(
        """
        import dataclasses, jax, jax.numpy as jnp
        from contrastive_jax import losses
        def nan_loss(inputs, loss_config):
            return jax.lax.pmean(jnp.nan * inputs["za"].sum(), ("data", "fsdp")), {}
        losses.LOSSES["clip"] = dataclasses.replace(losses.LOSSES["clip"], fn=nan_loss)
        """
    )
    args = [f"--config={tiny_config_file}", f"--workdir={tmp_path}", "--config.train.num_train_steps=4"]
    status, stdout, stderr = forked_cli(*args, setup=nan_loss)
    assert_one_line_error(
        status,
        stdout,
        stderr.split("\n", 1)[1],  # after the run's first line
        r"^error: Loss is nan at step 1; training stopped. Last good checkpoint: none",
        exit_status=1,
    )


def test_ctrl_c_before_training_exits_without_a_traceback(forked_cli, tiny_config_file, tmp_path):
    interrupt = textwrap.dedent(
        """
        real_init_state = trainer.Trainer.init_state
        def init_state(*a):
            os.kill(os.getpid(), __import__("signal").SIGINT)
            return real_init_state(*a)
        trainer.Trainer.init_state = init_state
        """
    )
    args = [f"--config={tiny_config_file}", f"--workdir={tmp_path}"]
    status, stdout, stderr = forked_cli(*args, setup=interrupt)
    assert_one_line_error(
        status,
        stdout,
        stderr,
        r"^error: Interrupted \(Ctrl-C\). To resume, run: .*-m "
        rf"contrastive_jax.main --config={tiny_config_file} --workdir={tmp_path}$",
        exit_status=130,
    )


# --- a run: Ctrl-C saves, the printed command resumes; a few short lines, a summary ------

STEP_LINE = r"step (\d+): loss \d+\.\d{4}, [\d,]+ examples/s, ETA \w+ \(\d+% of 40\)"
EVAL_LINE = (
    r"eval at step (\d+): a_to_b/R@1 (0\.\d{3}), b_to_a/R@1 0\.\d{3}, retrieval/R@1 0\.\d{3}, "
    r"retrieval/MAP@R 0\.\d{3}, knn_top1 0\.\d{3}, linear_probe 0\.\d{3}"
)


def logged_steps(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [row["step"] for row in map(json.loads, f) if "train/loss" in row]


@pytest.mark.e2e
def test_ctrl_c_saves_the_printed_command_resumes_and_a_rerun_is_already_done(processes, digits_data_dir, tmp_path):
    """The default run's cadence (1,000 steps logged every 50, evaluated and saved every
    500: 20 step lines, 2 evaluations) on the tiny model: 40 steps logged every 2. Ctrl-C
    before step 3 saves step 3 and prints the command that resumes; that command trains
    to the end with a few short lines and a summary; run again, it is already done."""
    config = write_config(
        tmp_path / "run.py",
        tiny_fields(
            digits_data_dir,
            train__num_train_steps=40,
            train__log_every_steps=2,
            eval__every_steps=20,
            checkpoint__every_steps=20,
            eval__knn_k=1,
            eval__linear_probe=True,
        ),
    )
    workdir = str(tmp_path / "run")
    interrupted = processes.start(config, workdir, num_devices=8, fault="batch:3:SIGINT", stderr=subprocess.PIPE)
    status, stdout, stderr = processes.wait_apart(interrupted)
    assert (status, stdout) == (130, ""), stderr[-3000:]
    lines = stderr.splitlines()
    assert (
        "Ctrl-C: finishing the current step, then saving a checkpoint (press Ctrl-C again to abort at once)." in lines
    )
    assert lines[-2] == f"Ctrl-C: stopped after step 3 and saved it in {workdir}/checkpoints. To resume, run:"
    python = os.path.relpath(sys.executable, ROOT)  # as the run, started in ROOT, prints it
    python = sys.executable if python.startswith("..") else python  # a Python outside ROOT
    command = f"{python} -m contrastive_jax.main --config={config} --workdir={workdir}"
    assert lines[-1] == f"  {command}"
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3"]
    assert logged_steps(workdir) == [2]

    # The command as printed, in a person's shell (on a machine with a GPU: its CPU, as here).
    user_cpu = dict(USER_ENV, JAX_PLATFORMS="cpu")
    resumed = subprocess.run(shlex.split(command), cwd=ROOT, env=user_cpu, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = resumed.stderr.splitlines()
    run_line = "cpu: 8 devices, 1 process; global batch 64 (8 per device); 40 steps; "
    memory = r"step needs \d+\.\d KiB per device of \d+\.\d GiB; "  # the compiled step's
    assert re.fullmatch(re.escape(run_line) + memory + re.escape(f"workdir {workdir}"), lines[0])
    assert lines[1] == f"Resumed from {workdir}/checkpoints at step 3."
    assert re.fullmatch(r"step 4: loss \d+\.\d{4}", lines[2])  # its first step compiles: not timed
    steps = [int(m.group(1)) for line in lines if (m := re.fullmatch(STEP_LINE, line))]
    evals = [m for line in lines if (m := re.fullmatch(EVAL_LINE, line))]
    assert steps == list(range(6, 41, 2)) and [int(m.group(1)) for m in evals] == [20, 40]
    assert len(lines) == 3 + len(steps) + len(evals) <= 30, resumed.stderr  # nothing else
    assert max(map(len, lines[2:])) <= 150  # the metric lines
    assert logged_steps(workdir) == list(range(2, 41, 2))  # none twice
    with open(os.path.join(workdir, "eval_results.json")) as f:
        final = json.load(f)
    assert final["step"] == 40 and evals[-1].group(2) == f"{final['a_to_b/R@1']:.3f}"
    summary = resumed.stdout.splitlines()
    assert summary[0].startswith(f"{workdir}: trained to step 40 (this command: ")
    for name in ("a_to_b/R@1", "b_to_a/R@1", "retrieval/MAP@R", "knn_top1", "linear_probe"):
        assert re.search(rf"^  {re.escape(name)} +{final[name]:.4f}  \w", resumed.stdout, re.M), name
    for path in ("checkpoints/", "metrics.jsonl", "tensorboard/", "eval_results.json"):
        assert re.search(rf"^  \w+ +{re.escape(os.path.join(workdir, path))} ", resumed.stdout, re.M)
        assert os.path.exists(os.path.join(workdir, path))

    files = {p: os.stat(os.path.join(workdir, p)).st_mtime_ns for p in ("eval_results.json", "metrics.jsonl")}
    started = time.perf_counter()
    again = subprocess.run(shlex.split(command), cwd=ROOT, env=user_cpu, capture_output=True, text=True, timeout=120)
    print(f"rerun of a finished run: {time.perf_counter() - started:.1f} s")
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == [
        f"{run_line}workdir {workdir}",
        (  # nothing compiled
            f"Already done: {workdir} holds step 40 of 40 and its evaluation; nothing to train. "
            "Raise --config.train.num_train_steps to train longer, or use a new --workdir."
        ),
    ]
    assert again.stdout.splitlines()[2:] == summary[2:]  # the same table
    assert files == {p: os.stat(os.path.join(workdir, p)).st_mtime_ns for p in files}
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["20", "3", "40"]


def test_progress_lines_off_a_terminal(caplog):
    progress = console.Progress(total_steps=400, start_step=100, enabled=True)
    with caplog.at_level(logging.INFO):
        progress.log(110, {"train/loss": 5.0}, seconds_per_step=None)  # compiled: not timed
        progress.log(200, {"train/loss": 1.23456, "train/examples_per_second": 2560.0}, seconds_per_step=12.5)
    assert [r.getMessage() for r in caplog.records] == [
        "step 110: loss 5.0000",
        "step 200: loss 1.2346, 2,560 examples/s, ETA 41m40s (50% of 400)",  # 200 * 12.5 s
    ]


def test_progress_on_a_terminal_is_one_bar(monkeypatch, caplog):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    progress = console.Progress(total_steps=4, start_step=1, enabled=True)
    with caplog.at_level(logging.INFO):
        for step in (2, 3, 4):
            progress.step_done()
            progress.log(step, {"train/loss": 1.5, "train/examples_per_second": 1e3}, seconds_per_step=1.0)
        progress.message("eval at step 4: a_to_b/R@1 0.500")
        progress.close()
    shown = sys.stderr.getvalue()
    assert "train: 100%" in shown and "4/4" in shown and "loss 1.5000, 1,000 examples/s" in shown
    assert "eval at step 4: a_to_b/R@1 0.500\n" in shown
    assert not caplog.records  # no log lines beside the bar


# --- Ctrl-C ---------------------------------------------------------------------------


@pytest.mark.slow
def test_second_ctrl_c_aborts_at_once(processes, tiny_config_file, tmp_path):
    workdir = str(tmp_path / "run")
    aborted = processes.start(
        tiny_config_file, workdir, num_devices=8, fault="batch:3:SIGINT+SIGINT", stderr=subprocess.PIPE
    )
    status, stdout, stderr = processes.wait_apart(aborted)
    assert status == -signal.SIGINT, stderr[-3000:]
    assert stderr.splitlines()[-1] == "Ctrl-C again: aborting now, without saving."
    assert "3" not in os.listdir(os.path.join(workdir, "checkpoints"))
    assert max(logged_steps(workdir)) == 2  # step 3 never ran


# --- every command in the READMEs ---------------------------------------------------

READMES = ("README.md", "experiments/README.md")
# Values for the variables the READMEs' commands use (set by a loop or the cluster).
SHELL_VARIABLES = {"PORT": "12355", "i": "0", "SCRATCH": "/scratch", "TPU_NAME": "tpu", "ZONE": "zone"}


def commands_in(source: str, text: str, *, inline: bool = True) -> list[tuple[str, str]]:
    """`(source, command)` for every command in `text`'s ```bash blocks (and inline code
    running Python, pip, pytest or sphinx-build): continuation lines joined, `&&` chains
    split, variables filled in."""
    commands = []
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    in_text = re.findall(r"`((?:\S*python3?|\S*pip|\S*pytest|\S*sphinx-build) [^`]*)`", text)
    for block in blocks + (in_text if inline else []):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#.*", "", line).strip().strip('"&').strip()
            for part in line.split("&&"):
                part = re.sub(r"\$(\w+)", lambda m: SHELL_VARIABLES[m.group(1)], part).strip()
                if part and not part.startswith("#"):
                    commands.append((source, part))
    return commands


def readme_commands(*, inline: bool = True) -> list[tuple[str, str]]:
    """`(readme, command)` for every command of the READMEs (see `commands_in`)."""
    commands = []
    for readme in READMES:
        with open(os.path.join(ROOT, readme)) as f:
            commands += commands_in(readme, f.read(), inline=inline)
    return commands


def python_commands():
    """`(readme, arguments after the interpreter)` of every command that runs Python."""
    found = []
    for readme, command in readme_commands(inline=False):
        words = shlex.split(command.removeprefix("srun "))
        if any(w.endswith(("python", "python3")) for w in words[:1]) and words[1:3] != ["-m", "venv"]:
            found.append(pytest.param(words, id=f"{readme}: {command[:70]}"))
    return found


def test_readme_commands_use_the_virtual_environment():
    """After the set-up command nothing is activated: every command names `.venv/bin/`."""
    seen = set()
    for readme, command in readme_commands():
        for word in re.findall(r"(?:^|\s)(\S*(?:python3?|pip|pytest))(?=\s)", command):
            seen.add(word)
            assert word in (".venv/bin/python", ".venv/bin/pip", ".venv/bin/pytest") or (
                word == "python3" and " -m venv .venv" in command
            ), f"{readme}: {command}"
    assert {".venv/bin/python", ".venv/bin/pip", ".venv/bin/pytest", "python3"} <= seen


def test_readme_test_command_is_what_ci_runs():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line for line in f if line.startswith("python3 -m venv")][0].strip()
    test_command = [c for _, c in readme_commands() if "pytest" in c]
    assert test_command == [".venv/bin/pytest -n 2"]
    readme_setup = [line for line in open(os.path.join(ROOT, "README.md")) if "pytest -n 2" in line]
    assert readme_setup[0].strip() == ci.replace("install -q -e", "install -e")


@pytest.mark.parametrize("words", python_commands())
def test_readme_python_command_parses(words):
    """contrastive_jax.main: the flags and the config as written (`--only_check_args`);
    other modules and scripts: they exist, `--help` runs and lists every option used."""
    assert words[0] == ".venv/bin/python"
    if words[1:3] == ["-m", "contrastive_jax.main"]:
        result = cli(*words[3:], "--only_check_args")
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        return
    script = words[2].replace(".", os.sep) + ".py" if words[1] == "-m" else words[1]
    assert os.path.isfile(os.path.join(ROOT, script)), script
    status, usage, errors = help_of(*(words[1:3] if words[1] == "-m" else words[1:2]))
    assert status == 0, errors
    for option in [w.split("=")[0] for w in words if w.startswith("--")]:
        assert re.search(rf"(?<![\w-]){option}(?![\w-])", usage), option


@functools.cache
def help_of(*entry: str) -> tuple[int, str, str]:
    """`(exit status, stdout, stderr)` of `python ENTRY --help`, run once per entry point
    (the READMEs run several commands of one script)."""
    result = subprocess.run([sys.executable, *entry, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout, result.stderr


COMMANDS = ["main", "write_records", "benchmark", "use_trained", "demo"]
OLD_COMMANDS = {"trained": "use_trained"}  # a command's old path, kept for a release: the new one


def test_every_command_is_listed_and_on_absl_flags():
    """The `python -m` commands (modules that run `main` as a script) are those below, with
    the old paths kept for a release, and none parses its flags with argparse: one flag
    library, one `--help`."""
    package = os.path.join(ROOT, "contrastive_jax")
    commands = set()
    for name in os.listdir(package):
        text = open(os.path.join(package, name)).read() if name.endswith(".py") else ""
        assert "import argparse" not in text, name
        if 'if __name__ == "__main__":' in text:
            commands.add(name[:-3])
    assert commands == set(COMMANDS) | set(OLD_COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("old, new", OLD_COMMANDS.items())
def test_a_commands_old_path_runs_the_command_with_one_line_saying_so(old, new):
    status, usage, errors = help_of("-m", f"contrastive_jax.{old}")
    assert (status, usage) == help_of("-m", f"contrastive_jax.{new}")[:2]
    assert errors == (
        f"note: python -m contrastive_jax.{old} is now python -m contrastive_jax.{new}; "
        "the old path goes in the next release.\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("module", COMMANDS)
def test_every_command_help_parses_and_reads_as_one_sentence_first(module):
    """`--help` exits 0 with the usage line, then the command's description: the first
    paragraph of its docstring whole (`console.help_description`), one sentence with a
    verb first ("Trains ...", "Writes ..."), then its flags, each with its help."""
    import ast

    from contrastive_jax import console

    status, usage, errors = help_of("-m", f"contrastive_jax.{module}")
    assert (status, errors) == (0, "")
    with open(os.path.join(ROOT, "contrastive_jax", f"{module}.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()), clean=False)
    description = console.help_description(doc)
    first_line, blank, shown = usage.splitlines()[:3]
    assert first_line == f"usage: python -m contrastive_jax.{module} --flag=value ..." and blank == ""
    assert shown == description
    prose = re.sub(r"`[^`]*`|\([^)]*\)", "", description)  # code and asides may hold full stops
    assert re.fullmatch(r"[A-Z][a-z]+s [^.!?]*\.", prose), description
    listed = usage.split("\nflags:\n")[1].splitlines()
    assert listed and all(re.fullmatch(r"  --[\w-]+: \S.*", line) for line in listed), listed


@pytest.mark.slow
def test_readme_demo_runs_as_written():
    command = ".venv/bin/python -m contrastive_jax.demo"
    assert command in [c for _, c in readme_commands()]
    result = subprocess.run(
        [sys.executable, *shlex.split(command)[1:]],
        cwd=ROOT,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "batch_prototype_cross_entropy" in result.stdout  # the last loss


def test_demo_asked_for_more_devices_than_there_are_says_so_with_status_2(capsys):
    from contrastive_jax import demo

    assert demo.main(["--devices", "16"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: num_devices must be in [1, 8]") and "Traceback" not in error
