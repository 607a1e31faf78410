#!/usr/bin/env bash
# bench_step on a lent GPU machine, whose Python lacks some packages and has no network.
#
#   bash experiments/bench/bench_step_gpu.sh download   # here (with network): the wheels into .whl/ (git-ignored)
#   bash experiments/bench/bench_step_gpu.sh run [OUT [OPTION ...]]
#       # there: install them offline, then the benchmark (results into OUT, default
#       # experiments/results/bench_step; OPTIONs to bench_step, e.g. --parts remat --minutes 7)
#
# The wheels are those docs/performance.md lists: open_clip and its pure-Python needs, the
# fused losses (Inf-CL, siglip-kernel), grain, ArrayRecord and ml-collections, for the GPU
# machine's CPython 3.12 on x86_64. Carry .whl/ to the machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
WHEELS=(open_clip_torch==3.3.0 ftfy wcwidth inf-cl==1.2.1 siglip-kernel==0.1.2 grain array-record ml-collections
  portpicker importlib-resources)

case "${1:-}" in
  download)
    .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .whl "${WHEELS[@]}"
    du -sh .whl
    ;;
  run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,temperature.gpu --format=csv
    python3 -m experiments.bench.bench_step --out "${2:-experiments/results/bench_step}" "${@:3}"
    ;;
  *)
    echo "usage: bash experiments/bench/bench_step_gpu.sh download | run [OUT [OPTION ...]]" >&2
    exit 2
    ;;
esac
