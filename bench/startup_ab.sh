#!/usr/bin/env bash
# Start-up of a 2-worker `expctl run` (CPU), two versions of expctl alternated N times: seconds
# from start to the workers' rendezvous (torch's agent logs it) and to exit.
#   git worktree add /tmp/old <commit>; bash bench/startup_ab.sh /tmp/old .    [N=5]
# Trees are searched first (PYTHONPATH); the cache starts empty, so the first pair is cold.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bash bench/startup_ab.sh TREE_A TREE_B   (N=5 pairs)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../.venv/bin/python}
a=$(cd "$1" && pwd); b=$(cd "$2" && pwd)
ov="model=resnet18 model.name=resnet50 data=synthetic data.shape=[3,32,32] data.num_samples=256
data.val_samples=0 optim=sgd sched=none data.batch_size=16 train.max_steps=2 train.log_every=1
train.max_epochs=1000 train.device=cpu launcher=local launcher.nproc=2"
work=$(mktemp -d); export EXPCTL_CACHE_DIR=$work/cache
for i in $(seq "${N:-5}"); do
  for tree in "$a" "$b"; do
    out=$(cd "$work" && LOGLEVEL=INFO PYTHONPATH=$tree "$py" "$here/timestamps.py" \
      "$py" -m expctl run $ov run.dir="$work/run-$i-$(basename "$tree")")
    rdzv=$(grep -m1 "Rendezvous complete" <<<"$out" | awk '{print $1}')
    end=$(tail -1 <<<"$out" | awk '{print $1}')
    echo "$tree  rendezvous ${rdzv:-?} s  exit $end s"
  done
done
rm -rf "$work"
