#!/bin/bash
# One process per TPU VM worker of a pod slice: JAX detects the coordinator, the process
# count and the ids from the TPU metadata (--distributed) and drives every local chip.
# Needs the code and its .venv (with the jax[tpu] of the TPU) in ~/contrastive_jax on
# every worker, and a workdir all workers share (a Filestore NFS or gcsfuse mount).
# Usage: TPU_NAME=my-v5e-32 ZONE=us-west4-a launch/tpu_pod.sh
# A preempted worker gets SIGTERM: all save at one step and exit with status 143; run
# this script again (on the recreated slice) and the run resumes.
set -euo pipefail

gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="
  cd ~/contrastive_jax && .venv/bin/python -m contrastive_jax.main \
    --config=configs/clip_coco.py --workdir=/mnt/shared/runs/clip_coco --distributed"
