"""The launch recipes in launch/, each run in its environment simulated with real processes.

Each recipe's command line runs as real processes (`python -m contrastive_jax.main`,
flags parsed by main.py) with the environment its launcher would set: srun's SLURM_*
variables, a JobSet pod's JOB_COMPLETION_INDEX, a Cloud TPU VM's worker list. The
processes meet on 127.0.0.1 (gloo) and record what `jax.distributed.initialize` settled
on after JAX's own detection (coordinator, process count and id, and the GPUs each
process drives: `jax_cuda_visible_devices`, which CPU devices do not filter, so the
recorded setting is what is asserted), then stop before training.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap

import pytest
import yaml
from subprocess_runs import ROOT, free_port

from contrastive_jax.simulated_devices import device_count_env

LAUNCH = os.path.join(ROOT, "launch")

# `python -m contrastive_jax.main`, with `jax.distributed.initialize` replaced by one that
# calls it, prints what it settled on (a line "RECORD {json}") and ends the process.
# SIMULATE_CLOUD_TPU_VM=1: what JAX's cloud_tpu_init finds on a TPU VM (libtpu and chips).
_DRIVER = textwrap.dedent(
    """
    import json, os
    import jax
    from jax._src import clusters, distributed, xla_bridge
    from jax.experimental import multihost_utils
    from contrastive_jax import main

    if os.environ.get("SIMULATE_CLOUD_TPU_VM"):
        clusters.cluster.running_in_cloud_tpu_vm = True
        clusters.cloud_tpu_cluster.running_in_cloud_tpu_vm = True
    real_initialize = jax.distributed.initialize

    def initialize(**arguments):
        real_initialize(**arguments)
        state = distributed.global_state
        record = {
            "passed": {key: arguments.get(key) for key in ("coordinator_address", "num_processes", "process_id")},
            "coordinator_address": state.coordinator_address,
            "num_processes": state.num_processes,
            "process_id": state.process_id,
            "visible_devices": xla_bridge.CUDA_VISIBLE_DEVICES.value,
            "local_devices": jax.local_device_count(),
            "devices": jax.device_count(),
        }
        multihost_utils.sync_global_devices("recorded")
        print("RECORD " + json.dumps(record), flush=True)
        jax.distributed.shutdown()
        os._exit(0)

    jax.distributed.initialize = initialize
    main.run()
    """
)

# Variables of the machine running the tests that would change JAX's detection.
_DETECTED = ("SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_", "KUBERNETES_", "JAX_", "JOB_COMPLETION_INDEX")


def read(name: str) -> str:
    with open(os.path.join(LAUNCH, name)) as f:
        return f.read()


def main_args(command: str, environ: dict[str, str]) -> list[str]:
    """The arguments after `-m contrastive_jax.main` in a shell `command`, its variables
    expanded from `environ`."""
    words = shlex.split(re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: environ[m[1] or m[2]], command))
    return words[words.index("contrastive_jax.main") + 1 :]


def run_processes(args_and_envs: list[tuple[list[str], dict[str, str]]], num_devices: int = 1) -> list[dict]:
    """Runs the driver once per `(args, env)` at once; the records, in that order."""
    base = {k: v for k, v in device_count_env(num_devices).items() if not k.startswith(_DETECTED)}
    # CPU devices also on a machine with a GPU, where every simulated process would take
    # the one GPU (NCCL: "Duplicate GPU detected").
    base["JAX_PLATFORMS"] = "cpu"
    started = [
        subprocess.Popen(
            [sys.executable, "-c", _DRIVER, *args],
            cwd=ROOT,
            env=dict(base, TF_CPP_MIN_LOG_LEVEL="3", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for args, env in args_and_envs
    ]
    records = []
    try:
        for i, process in enumerate(started):
            output, _ = process.communicate(timeout=120)
            lines = [line for line in output.splitlines() if line.startswith("RECORD ")]
            assert process.returncode == 0 and lines, f"process {i} (status {process.returncode}):\n{output[-3000:]}"
            records.append(json.loads(lines[0].removeprefix("RECORD ")))
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return records


def driven_gpus(record: dict, gpus_on_host: int) -> list[int]:
    """The GPUs of its host a process drives: the ids JAX set, or all of them."""
    visible = record["visible_devices"]
    return list(range(gpus_on_host)) if visible == "all" else [int(i) for i in visible.split(",")]


def slurm_job_id_and_port() -> tuple[int, int]:
    """A SLURM_JOB_ID whose coordinator port (JAX: 61440 + id mod 4096) is free now."""
    for job_id in range(os.getpid() % 4096, os.getpid() % 4096 + 4096):
        port = 61440 + job_id % 4096
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return job_id, port
    pytest.fail("no free port in 61440-65535")


def test_the_docs_name_every_recipe_and_every_recipe_exists():
    with open(os.path.join(ROOT, "docs", "training.md")) as f:
        docs = f.read()
    named = set(re.findall(r"launch/[\w.]+", docs))
    assert named == {f"launch/{name}" for name in os.listdir(LAUNCH)}


def run_under_srun(command: str, tasks_per_node: int, nodes: int = 2, gpus_per_node: int = 2, **environ):
    """Runs the shell `command` (`... -m contrastive_jax.main ...`) as srun would in a job
    of `nodes` x `gpus_per_node` (`--gpus-per-node`): SLURM's variables, the hostlist
    compressed as SLURM writes it. Checks the process ids and count JAX settled on;
    returns the records and the coordinator port JAX derives from SLURM_JOB_ID."""
    job_id, port = slurm_job_id_and_port()
    runs = []
    for node in range(nodes):
        for local in range(tasks_per_node):
            env = {
                "SLURM_JOB_ID": str(job_id),
                "SLURM_NTASKS": str(nodes * tasks_per_node),
                "SLURM_PROCID": str(node * tasks_per_node + local),
                "SLURM_LOCALID": str(local),
                "SLURM_NODEID": str(node),
                "SLURM_STEP_NODELIST": "127.0.0.[1-2]",
                "SLURM_STEP_NUM_NODES": str(nodes),
                "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
                "SLURM_GPUS_ON_NODE": str(gpus_per_node),
                "SCRATCH": "/tmp/scratch",
                **environ,
            }
            runs.append((main_args(command, env), env))
    records = run_processes(runs)
    assert [r["process_id"] for r in records] == list(range(len(runs)))
    assert {r["num_processes"] for r in records} == {len(runs)}
    return records, port


def gpus_driven_per_node(records: list[dict], tasks_per_node: int, gpus_per_node: int = 2) -> list[list[int]]:
    """Per node, the GPUs its tasks drive, sorted (one GPU twice: two tasks drive it)."""
    return [
        sorted(gpu for record in records[start : start + tasks_per_node] for gpu in driven_gpus(record, gpus_per_node))
        for start in range(0, len(records), tasks_per_node)
    ]


@pytest.mark.slow
def test_slurm_recipe_drives_every_gpu_of_every_node_once():
    """launch/slurm.sbatch's srun line, scaled to 2 nodes x 2 GPUs with its tasks per GPU."""
    script = read("slurm.sbatch")
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.MULTILINE))
    assert "gpus-per-task" not in sbatch  # a task would see one GPU, not its SLURM_LOCALID's
    tasks_per_node = max(1, int(sbatch["ntasks-per-node"]) * 2 // int(sbatch["gpus-per-node"]))
    srun = re.search(r"^srun ((?:.*\\\n)*.*)", script, re.MULTILINE)[1].replace("\\\n", " ")
    records, port = run_under_srun(srun, tasks_per_node)
    assert {r["coordinator_address"] for r in records} == {f"127.0.0.1:{port}"}  # the first node
    assert gpus_driven_per_node(records, tasks_per_node) == [[0, 1], [0, 1]]


@pytest.mark.slow
def test_one_slurm_task_per_node_drives_gpu_0_only_unless_jax_local_device_ids_names_all():
    """What docs/training.md says of one task per node (explicit settings do not help)."""
    command = ".venv/bin/python -m contrastive_jax.main --config=configs/clip_coco.py --workdir=/tmp/w"
    explicit = f"{command} --coordinator_address=127.0.0.1:{free_port()} --num_processes=2 --process_id=$SLURM_PROCID"
    assert gpus_driven_per_node(run_under_srun(explicit, 1)[0], 1) == [[0], [0]]
    named, _ = run_under_srun(f"{command} --distributed", 1, JAX_LOCAL_DEVICE_IDS="0,1")
    assert gpus_driven_per_node(named, 1) == [[0, 1], [0, 1]]


@pytest.mark.slow
def test_jobset_recipe_names_pod_0_as_coordinator_and_each_pod_drives_all_its_gpus():
    """launch/jobset.yaml's command in 2 pods (JOB_COMPLETION_INDEX 0, 1), the
    coordinator's DNS name (pod 0's, as JobSet names it) standing for 127.0.0.1."""
    jobset = yaml.safe_load(read("jobset.yaml"))
    [job] = jobset["spec"]["replicatedJobs"]
    pods = job["template"]["spec"]
    [container] = pods["template"]["spec"]["containers"]
    assert pods["parallelism"] == pods["completions"] and pods["backoffLimit"] == 0
    assert pods["template"]["spec"]["restartPolicy"] == "Never"
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] > 0  # a status 143 restarts the set
    name = jobset["metadata"]["name"]
    args = main_args(container["command"][-1], {"JOB_COMPLETION_INDEX": "<I>"})
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in args)
    assert flags["coordinator_address"] == f"{name}-{job['name']}-0-0.{name}:12355"
    assert flags["num_processes"] == str(pods["parallelism"])
    assert flags["process_id"] == "<I>"

    address = f"127.0.0.1:{free_port()}"
    runs = []
    for index in range(2):
        env = {"JOB_COMPLETION_INDEX": str(index), "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
        args = main_args(container["command"][-1], env)
        args = [
            re.sub(r"^(--coordinator_address=).*", rf"\g<1>{address}", re.sub(r"^(--num_processes=).*", r"\g<1>2", a))
            for a in args
        ]
        runs.append((args, env))
    records = run_processes(runs, num_devices=2)

    assert [r["passed"] for r in records] == [
        {"coordinator_address": address, "num_processes": 2, "process_id": i} for i in range(2)
    ]
    assert [r["process_id"] for r in records] == [0, 1]
    assert {r["visible_devices"] for r in records} == {"all"}  # the pod's 8 GPUs each
    assert [(r["local_devices"], r["devices"]) for r in records] == [(2, 4)] * 2


@pytest.mark.slow
def test_tpu_pod_recipe_leaves_everything_to_jax_detection():
    """launch/tpu_pod.sh's command on 2 simulated TPU VM workers (the worker list and id
    as GKE sets them; a TPU VM of `gcloud ... --worker=all` gives the same from its
    metadata server)."""
    script = read("tpu_pod.sh")
    command = re.search(r'--command="(.*?)"', script, re.DOTALL)[1].replace("\\\n", " ")
    args = main_args(command.split("&&", 1)[1], {})
    assert "--distributed" in args and not any(a.startswith(("--process_id", "--coordinator")) for a in args)
    port = free_port()
    runs = [
        (
            args,
            {
                "SIMULATE_CLOUD_TPU_VM": "1",
                "TPU_SKIP_MDS_QUERY": "1",  # no metadata server: one slice's values instead
                "MEGASCALE_COORDINATOR_ADDRESS": "",
                "MEGASCALE_NUM_SLICES": "1",
                "MEGASCALE_SLICE_ID": "0",
                "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.2",
                "TPU_WORKER_ID": str(worker),
                "JAX_COORDINATOR_PORT": str(port),
            },
        )
        for worker in range(2)
    ]
    records = run_processes(runs, num_devices=2)

    assert [r["passed"] for r in records] == [dict.fromkeys(("coordinator_address", "num_processes", "process_id"))] * 2
    assert [(r["coordinator_address"], r["num_processes"], r["process_id"]) for r in records] == [
        (f"127.0.0.1:{port}", 2, 0),
        (f"127.0.0.1:{port}", 2, 1),
    ]
    assert {r["visible_devices"] for r in records} == {"all"}
