#!/usr/bin/env bash
# Trials packed too tightly on one GPU (issue 24): 4 ResNet-50 trials of ~50 GB each share a GPU
# (sweep.gpus_per_trial=0.25); those that run out of memory fail with one line naming
# sweep.gpus_per_trial, the others train, the sweep goes on. From the repository root, on a
# GPU machine (device tool: carry .whl), after bench/gpu.sh's set-up lines.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  --find-links .whl hydra-core omegaconf antlr4-python3-runtime submitit shtab \
  optuna alembic colorlog sqlalchemy greenlet mako || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
cd "$(mktemp -d)"
python3 -m expctl run -m model=resnet50 data=synthetic 'data.shape=[3,224,224]' data.num_classes=10 \
  data.num_samples=2048 data.val_samples=256 data.batch_size=32,600,640,680 train.precision=32 train.max_epochs=1 \
  sched=none sweep.gpus_per_trial=0.25
echo "exit $?"
for f in runs/*/trial_*/output.log; do echo "== $f"; tail -3 "$f"; done
