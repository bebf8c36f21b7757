#!/usr/bin/env bash
# Where did expctl's ResNet-50 DDP rate go (0.89x raw at 2300385, 1.00x at 9fbd75f)?
# Here (CPU machine): put the packages of the commits to compare in .bisect/ (ignored), then
# carry it to the GPU machine with the wheels:
#   bash bench/bisect_parity.sh pack 9fbd75f a64d253 9fd9035 c0af702 2300385
#   device: carry [".whl", ".bisect"], command: bash bench/bisect_parity.sh run 2
# `run GPUS` alternates the commits twice through harness.py's compute row (expctl vs raw, one
# run each) and prints one line per run: commit, expctl img/s, raw img/s.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
pack)
  shift; rm -rf .bisect; mkdir -p .bisect
  for c in "$@"; do
    mkdir -p ".bisect/$c" && git archive "$c" expctl bench pyproject.toml | tar -x -C ".bisect/$c"
  done; du -sh .bisect ;;
run)
  n=${2:-2}
  python3 -m pip install -q --no-index --no-deps --target /tmp/site --find-links .whl hydra-core \
    omegaconf antlr4-python3-runtime submitit shtab > /dev/null 2>&1 || exit 1
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
  nvidia-smi -L | head -1
  for round in 1 2; do
    for d in .bisect/*/; do
      c=$(basename "$d")
      (cd "$d" && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 bench/harness.py --suite gpu \
        --only compute --gpus "$n" --no-reference 2>&1 | grep " x$n " | sed "s/^/$c round $round: /")
    done
  done ;;
*) echo "usage: bisect_parity.sh pack COMMIT... | run GPUS" >&2; exit 2 ;;
esac
