#!/usr/bin/env bash
# What ran on the GPU machine (device tool, nvidia-h100-x2), from the repository root:
#   carry: .whl (hydra-core, omegaconf, antlr4, submitit, shtab wheels), .data (Fashion-MNIST .gz)
#   bash bench/gpu.sh bn     reported vs saved-model accuracy (bench/bn_parity.py)
#   bash bench/gpu.sh images JPEG folder vs GPU-resident synthetic, 1 GPU (16 cores) and 2 GPUs
# Prints the harness table (1 and 2 GPUs), the speedrun (expctl and raw) and a profile summary.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  --find-links .whl hydra-core omegaconf antlr4-python3-runtime submitit shtab PyYAML || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench PYTHONUNBUFFERED=1 EXPCTL_BENCH_DATA=$PWD/.data
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
python3 -c "import torch, sys; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'python', sys.version.split()[0])"
part=${1:-all}
if [ "$part" = bn ]; then
  echo "== reported accuracy vs the saved model's, Fashion-MNIST ResNet-18, 240 steps"
  python3 bench/bn_parity.py --workers 1 2 --extra data.root=.data/fashion-mnist
  python3 bench/bn_parity.py --workers 2 --extra data.root=.data/fashion-mnist train.sync_batchnorm=true
  exit
fi
if [ "$part" = images ]; then
  echo "== issue 11: ResNet-50 from 20,000 JPEGs (bench/images_bench.py)"
  [ -d /tmp/jpegs/train ] || python3 bench/images_bench.py make --root /tmp/jpegs
  echo "-- 1 GPU, 16 cores (taskset 0-15)"
  CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 bench/images_bench.py run --root /tmp/jpegs --gpus 1 --steps ${STEPS:-80} --warmup 20 ${ONLY:+--only $ONLY} | tee "$OUT/images1.md"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    echo "-- 2 GPUs, all cores"
    python3 bench/images_bench.py run --root /tmp/jpegs --gpus 2 --steps ${STEPS:-80} --warmup 20 ${ONLY:+--only $ONLY} | tee "$OUT/images2.md"
  fi
  exit
fi
if [ "$part" = all ] || [ "$part" = speedrun ]; then
  echo "== speedrun: expctl (x2) then raw (x2), one GPU"
  for i in 1 2; do
    CUDA_VISIBLE_DEVICES=0 python3 -m expctl run experiment=fashion_speedrun data.root=.data run.dir=/tmp/speed$i >"$OUT/speed$i.log" 2>&1
    python3 -c "import json; r=json.load(open('/tmp/speed$i/result.json')); print('expctl', {k: r[k] for k in ('val/acc', 'time/train_s')})"
    CUDA_VISIBLE_DEVICES=0 python3 bench/raw_speedrun.py --root .data
  done
fi
if [ "$part" = all ] || [ "$part" = harness ]; then
  echo "== harness"
  python3 bench/harness.py --suite gpu --repeats ${REPEATS:-3} --out "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log" | grep -v Warning
fi
