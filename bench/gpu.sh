#!/usr/bin/env bash
# What ran on the GPU machines (device tool), from the repository root:
#   carry: .whl (hydra-core, omegaconf, antlr4, submitit, shtab, PyYAML wheels), .data/fashion-mnist
#   bash bench/gpu.sh all       the whole GPU suite in one invocation: peak, ceiling, four workloads
#                               at 1/2/4 GPUs, one run per contender, where the wall time goes
#   bash bench/gpu.sh speed     fashion_speedrun recipes (3 runs each) and CUDA graphs with DDP
#   bash bench/gpu.sh scale-a   peak + compute-bound ResNet-50 and CIFAR-style ResNet-18, 1/2/4 GPUs
#   bash bench/gpu.sh scale-b   launch-bound ResNet-18 32x32 and the Fashion CNN, 1/2/4 GPUs (+ the
#                               static-batch ceiling), then the fashion_speedrun, 3 runs per recipe
#   bash bench/gpu.sh compile   eager vs torch.compile (default; reduce-overhead where launch-bound)
#   bash bench/gpu.sh fashion   the Fashion CNN at 1 and 4 GPUs, 3 runs per contender
#   bash bench/gpu.sh fprof     profiles of the Fashion CNN step, expctl and raw, 1 and 4 GPUs
#   bash bench/gpu.sh bn        reported vs saved-model accuracy (bench/bn_parity.py)
#   bash bench/gpu.sh images    JPEG folder vs GPU-resident synthetic, 1 GPU (16 cores) and 2 GPUs
#   bash bench/gpu.sh gpu-images  issue 25: JPEG folder (Pillow, nvJPEG, nvImageCodec, auto, torchvision)
#                               vs synthetic at 1/2/4 GPUs, 16 cores per GPU, CPU ms/img, validation
#                               (bench/gpu_images.py; ~20 runs: start it with `bg`, then `poll`);
#                               carry nvidia_nvimgcodec_cu13-*.whl in .whl for the nvimgcodec rows;
#                               IMG_GPUS="1 2 4", STEPS, ONLY="pillow nvjpeg", EXTRA="train.compile=true",
#                               SHAPES=imagenet (JPEGs of as many sizes as ImageNet's)
#   bash bench/gpu.sh feed-spy  issue 25: py-spy of the training process per thread, GPU busy %
#                               (DECODES="synthetic gpu", SPY_GIL=1: only threads holding the GIL,
#                               SHAPES=imagenet: JPEGs of as many sizes as ImageNet's, FAULTS=1: page
#                               faults and TLB shootdowns a second,
#                               VARIANTS="now before" (before: the package
#                               in $EXPCTL_BENCH_BEFORE), SPY=1, EXTRA=..., NPROCS="1 2 4": ranks,
#                               16 cores each; feed-spy.tgz, each run's train rows in it)
#   bash bench/gpu.sh sweep-spy issue 24: py-spy of a whole sweep (SETTINGS="quarter one"), driver, zygote and
#                               trials; import times and whether torch's folder has byte code
#   bash bench/gpu.sh threads   a 1-GPU run with torch's default intra-op threads (one per core) vs
#                               OMP_NUM_THREADS=16/4/1 (THREADS_SETS="all 16 4 1 all")
#   bash bench/gpu.sh overlap   issue 25: a decoder's img/s alone and beside a ResNet-50 step, in one process
#                               and in one per GPU at once (bench/decode_overlap.py; ONLY=decoders)
#   bash bench/gpu.sh trace     issue 25: torch.profiler traces of 12 ResNet-50 steps, NPROCS=4 every rank (TRACES="compiled:gpu
#                               eager:synthetic ..."), read per CUDA stream by bench/trace_gaps.py
#   bash bench/gpu.sh crop      issue 25: the device path's crop of a batch of 256, one roi_align per image size
#                               vs gpucrop.crop_resize, on four sizes and on ImageNet's many (bench/crop_bench.py)
#   bash bench/gpu.sh decode-race  torchvision's CUDA decode_jpeg vs expctl's decode: rounds where memory
#                               freed with reads still queued was overwritten (bench/decode_race.py)
#   bash bench/gpu.sh fsdp      issue 27: ~1B GPT expctl fsdp vs a raw FSDP2 loop (1/2/4 GPUs, eager and
#                               compiled), ~10B under ddp and fsdp, a 4 -> 2 GPU resume (bench/fsdp_bench.py)
#   bash bench/gpu.sh parity    the ResNet-50 rows of the harness (DDP: expctl vs raw), 1 and 4 GPUs
#   bash bench/gpu.sh sweep     16-trial sweeps (Fashion CNN, ResNet-18 32x32): serial on one GPU,
#                               one GPU per trial, four trials per GPU (bench/sweep_bench.py gpu);
#                               EPOCHS=N longer trials, SETTINGS=one,quarter a subset, WORKLOADS=...
# Tables go to stdout and to $OUT/*.md, raw figures to $OUT/*.json.
#   bash bench/gpu.sh bg all speed   start parts, one after the other, in their own process session: it outlives the call (the
#                               device tool keeps such processes while the machine is held), so one
#                               invocation can run longer than one call's 10 minutes; then, within
#                               30 s of each return (the machine's idle limit):
#   bash bench/gpu.sh poll all+speed 560   wait up to 560 s for it, print its log's tail, copy its files to $OUT
set -uo pipefail
case "${1:-}" in
bg)  # gpu.sh bg all speed: the parts one after the other, polled as "all+speed"
  shift; [ $# -ge 1 ] || { echo "usage: gpu.sh bg PART [PART ...]" >&2; exit 2; }
  p=$(IFS=+; echo "$*"); rm -rf "/tmp/bg-$p"; mkdir -p "/tmp/bg-$p"
  run=""; for q in "$@"; do run+="echo '=== part $q'; date; bash '$0' '$q'; "; done
  OUT=/tmp/bg-$p DEADLINE=${DEADLINE:-100000} setsid nohup bash -c \
    "($run) > /tmp/bg-$p/log 2>&1; echo \$? > /tmp/bg-$p/rc" < /dev/null > /dev/null 2>&1 &
  echo "started $p in the background: bash bench/gpu.sh poll $p SECONDS"; exit 0 ;;
poll)
  p=${2:?usage: gpu.sh poll PART SECONDS}; n=${3:-560}
  [ -d "/tmp/bg-$p" ] || { echo "no background $p on this machine (a fresh one?)" >&2; exit 2; }
  for ((i = 0; i < n; i += 5)); do [ -e "/tmp/bg-$p/rc" ] && break; sleep 5; done
  tail -c 6000 "/tmp/bg-$p/log"; cp -r "/tmp/bg-$p/." "${OUT:-/tmp/out}/" 2>/dev/null
  if [ -e "/tmp/bg-$p/rc" ]; then echo "== $p finished, exit $(cat "/tmp/bg-$p/rc")"; else echo "== $p still running"; fi
  exit 0 ;;
esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  --find-links .whl hydra-core omegaconf antlr4-python3-runtime submitit shtab \
  optuna alembic colorlog sqlalchemy greenlet mako || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench PYTHONUNBUFFERED=1 EXPCTL_BENCH_DATA=$PWD/.data/fashion-mnist
# The image ships torch without byte code and sets PYTHONDONTWRITEBYTECODE=1: each process compiles
# torch's Python source (~8 s of the 11 s `import torch._dynamo` there; py-spy, stop 40). pip writes
# that byte code when it installs a package; PYC=1 (the default since stop 40) writes it once here
# too, so that start-up figures are a pip install's. PYC=0: as the image is.
if [ "${PYC:-1}" = 1 ] && [ ! -e /tmp/pyc-done ]; then
  t=$(date +%s)
  python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    /tmp/site expctl bench $(ls -d .before .v-* 2>/dev/null) > /dev/null 2>&1
  touch /tmp/pyc-done; echo "byte code written (PYC=1) in $(( $(date +%s) - t )) s"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
nvidia-smi topo -m 2>/dev/null | head -8
python3 -c "import torch, sys, os; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'python', sys.version.split()[0], 'cpus', os.cpu_count())"
ngpu=$(nvidia-smi -L | wc -l)
counts=1; [ "$ngpu" -ge 2 ] && counts=1,2; [ "$ngpu" -ge 4 ] && counts=1,2,4
part=${1:-all}
case "$part" in
all)  # one invocation inside the device tool's 10 minutes: no row starts after 530 s
  python3 bench/harness.py --suite gpu --gpus $counts --deadline ${DEADLINE:-530} --out "$OUT/all.json" 2>&1 | tee "$OUT/all.md" ;;
speed)  # time to accuracy; where the launch-bound step and the multi-GPU start-up go
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 bench/speedrun.py --root .data/fashion-mnist --repeats 3 --raw 1 \
    --variant "width 24=model.width=24" --variant "width 24, 12 epochs=model.width=24 train.max_epochs=12" \
    2>&1 | tee "$OUT/speedrun.md"
  echo "== launch-bound ResNet-18 32x32, 1 GPU: static batch vs indexed batches (raw_ddp.py), the probe"
  w="--model resnet18 --shape 3x32x32 --samples 65536 --batch 512 --steps 200 --warmup 50 --precision bf16 --channels-last"
  for l in static tensor static tensor; do
    echo "$l $(CUDA_VISIBLE_DEVICES=0 python3 bench/raw_ddp.py $w --loader $l | tail -1)"; done 2>&1 | tee "$OUT/launch_gap.md"
  CUDA_VISIBLE_DEVICES=0 python3 bench/scaling_probe.py alone | tee -a "$OUT/launch_gap.md"
  for l in static tensor; do echo "-- profile, $l"; CUDA_VISIBLE_DEVICES=0 python3 bench/raw_ddp.py $w --loader $l --profile 20 2>&1 >/dev/null | tail -22; done | tee "$OUT/launch_profile.md"
  echo "== start-up, 2 GPUs: expctl (launcher=local) and torchrun, the launch-bound workload"
  ov="model=resnet18 data=synthetic data.shape=[3,32,32] data.num_samples=65536 data.val_samples=512 optim=sgd sched=none data.batch_size=512 train.precision=bf16 train.max_steps=200 train.log_every=50 train.max_epochs=1000"
  keys='Rendezvous complete|Starting worker|run /|done|exit|samples_per_s|Done waiting|workers finished|INFO run'
  (LOGLEVEL=INFO CUDA_VISIBLE_DEVICES=0,1 python3 bench/timestamps.py python3 -m expctl run $ov run.dir=/tmp/su-e launcher=local launcher.nproc=2 | grep -E "$keys"
   LOGLEVEL=INFO CUDA_VISIBLE_DEVICES=0,1 python3 bench/timestamps.py python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/raw_ddp.py $w --loader tensor | grep -E "$keys"
   head -1 /tmp/su-e/train.log) 2>&1 | cut -c1-220 | tee "$OUT/startup2.md"
  [ "$ngpu" -ge 2 ] && timeout 220 python3 bench/harness.py --suite gpu --gpus 1,2 --only launch --no-reference \
    --expctl-args "train.compile=true train.compile_mode=reduce-overhead" --out "$OUT/launch_cudagraphs.json" 2>&1 | tee "$OUT/launch_cudagraphs.md" ;;
scale-a)
  python3 bench/harness.py --suite gpu --gpus $counts --only compute,cifar --out "$OUT/scale_a.json" 2>&1 | tee "$OUT/scale_a.md" ;;
scale-b)
  python3 bench/harness.py --suite gpu --gpus $counts --only launch,fashion --out "$OUT/scale_b.json" 2>&1 | tee "$OUT/scale_b.md"
  echo "== fashion_speedrun, one GPU"
  # (measured on 2026-11-26 when the preset was batch 512: `preset` then was this `batch 512` row)
  CUDA_VISIBLE_DEVICES=0 python3 bench/speedrun.py --root .data/fashion-mnist --repeats ${SPEED_REPEATS:-3} \
    --variant "batch 512, lr 0.2=data.batch_size=512 optim.lr=0.2 sched.warmup_steps=120" \
    2>&1 | tee "$OUT/speedrun.md" ;;
compile)
  CUDA_VISIBLE_DEVICES=0 python3 bench/harness.py --suite compile --repeats 1 --out "$OUT/compile.json" 2>&1 | tee "$OUT/compile.md" ;;
final)  # the rest, in one call: compile on ResNet-50; CUDA graphs with DDP; repeats where noisy
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 bench/harness.py --suite compile --repeats 1 --only compute --out "$OUT/compile_compute.json" 2>&1 | tee "$OUT/compile_compute.md"
  CUDA_VISIBLE_DEVICES=0 timeout 80 python3 bench/speedrun.py --root .data/fashion-mnist --repeats 3 --raw 0 \
    2>&1 | tee "$OUT/speedrun1024.md"  # the preset (batch 1024; a --variant when measured)
  timeout 200 python3 bench/harness.py --suite gpu --gpus 2 --only launch --no-reference --expctl-args "train.compile=true train.compile_mode=reduce-overhead" --out "$OUT/launch_ddp_cudagraphs.json" 2>&1 | tee "$OUT/launch_ddp_cudagraphs.md"
  timeout 120 python3 bench/harness.py --suite gpu --gpus 4 --only cifar --no-reference --out "$OUT/cifar4.json" 2>&1 | tee "$OUT/cifar4.md"
  CUDA_VISIBLE_DEVICES=0 timeout 100 python3 bench/harness.py --suite gpu --gpus 1 --only launch --repeats 2 --out "$OUT/launch_repeats.json" 2>&1 | tee "$OUT/launch_repeats.md" ;;
fashion)  # the Fashion CNN at 1 and 4 GPUs, 3 runs per contender (one run each read 0.96 / 0.70)
  python3 bench/harness.py --suite gpu --gpus 1,4 --only fashion --repeats ${REPEATS:-3} --no-reference --out "$OUT/fashion.json" 2>&1 | tee "$OUT/fashion.md" ;;
fprof)  # where the Fashion CNN's step goes, expctl and the raw loop, 1 and 4 GPUs (profiler on)
  ov="model=cnn data=fashion_mnist data.root=$EXPCTL_BENCH_DATA optim=sgd optim.lr=0.05 optim.momentum=0.9 sched=none data.batch_size=512 train.precision=bf16 train.max_steps=200 train.log_every=50 train.val_every=1000 train.max_epochs=100000 checkpoint.every=1000000 imports=[step_profile] train.step=profiled"
  w="--model cnn --data fashion --root $EXPCTL_BENCH_DATA --batch 512 --steps 200 --warmup 60 --precision bf16 --channels-last --loader tensor --profile 20"
  for n in 1 4; do
    echo "== expctl, $n GPU(s)"
    python3 -m expctl run $ov run.dir=/tmp/fp$n $([ $n -gt 1 ] && echo launcher=local launcher.nproc=$n) 2>&1 | grep -v "^\s*$" | tail -30
    echo "== raw, $n GPU(s)"
    if [ $n -gt 1 ]; then python3 -m torch.distributed.run --standalone --nproc_per_node=$n bench/raw_ddp.py $w 2>&1 | tail -22
    else python3 bench/raw_ddp.py $w 2>&1 | tail -22; fi
  done 2>&1 | cut -c1-200 | tee "$OUT/fprof.md" ;;
bn)
  echo "== reported accuracy vs the saved model's, Fashion-MNIST ResNet-18, 240 steps"
  python3 bench/bn_parity.py --workers 1 2 --extra data.root=.data/fashion-mnist
  python3 bench/bn_parity.py --workers 2 --extra data.root=.data/fashion-mnist train.sync_batchnorm=true ;;
fsdp)  # issue 27: train.strategy=fsdp against a raw FSDP2 loop (bench/fsdp_bench.py); PARTS=speed,...
  python3 bench/fsdp_bench.py --gpus ${FSDP_GPUS:-$counts} ${PARTS:+--parts $PARTS} ${COMPILE_GPUS:+--compile-gpus $COMPILE_GPUS} \
    ${BIG:+--big-strategies $BIG} --out "$OUT/fsdp" ;;
parity)  # DDP unchanged: the compute-bound ResNet-50 rows of the harness (expctl vs raw DDP)
  python3 bench/harness.py --suite gpu --only compute --gpus ${PARITY_GPUS:-1,4} --out "$OUT/parity.json" \
    2>&1 | tee "$OUT/parity.md" ;;
sweep)  # issue 24: trials side by side on the GPUs
  for w in ${WORKLOADS:-fashion_cnn resnet18_32}; do
    echo "== 16 trials of $w: serial (1 GPU), 1 GPU each, 0.25 GPU each"
    python3 bench/sweep_bench.py gpu --workload "$w" --trials ${TRIALS:-16} ${EPOCHS:+--epochs $EPOCHS} \
      ${SETTINGS:+--settings $SETTINGS} --out "$OUT/sweep_$w${EPOCHS:+_e$EPOCHS}.json" | tee "$OUT/sweep_$w${EPOCHS:+_e$EPOCHS}.md"
  done ;;
images)
  echo "== issue 11: ResNet-50 from 20,000 JPEGs (bench/images_bench.py)"
  [ -d /tmp/jpegs/train ] || python3 bench/images_bench.py make --root /tmp/jpegs
  echo "-- 1 GPU, 16 cores (taskset 0-15)"
  CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 bench/images_bench.py run --root /tmp/jpegs --gpus 1 --steps ${STEPS:-80} --warmup 20 ${ONLY:+--only $ONLY} | tee "$OUT/images1.md"
  if [ "$ngpu" -ge 2 ]; then
    echo "-- 2 GPUs, all cores"
    python3 bench/images_bench.py run --root /tmp/jpegs --gpus 2 --steps ${STEPS:-80} --warmup 20 ${ONLY:+--only $ONLY} | tee "$OUT/images2.md"
  fi ;;
gpu-images)  # issue 25
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    --find-links .whl nvidia-nvimgcodec-cu13 2>/dev/null || echo "no nvidia-nvimgcodec-cu13 wheel in .whl: its rows will say so"
  python3 -c "from nvidia import nvimgcodec; print('nvImageCodec', nvimgcodec.__version__)" 2>&1 | tail -1
  jp=/tmp/jpegs25v${SHAPES:+-$SHAPES}  # SHAPES=imagenet: as many image sizes as ImageNet's
  [ -d $jp/train ] || python3 bench/gpu_images.py make --root $jp --val ${VAL:-5000} --shapes ${SHAPES:-four}
  python3 bench/gpu_images.py run --root $jp --gpus ${IMG_GPUS:-${counts//,/ }} --steps ${STEPS:-80} --warmup 20 \
    ${ONLY:+--only $ONLY} ${EXTRA:+--expctl-args "$EXTRA"} --out "$OUT/gpu_images${EXTRA:+_extra}.json" 2>&1 | tee "$OUT/gpu_images${EXTRA:+_extra}.md" ;;
feed-spy)  # issue 25: where a run's training process spends its time (py-spy per thread, GPU busy %)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/spy \
    --find-links .whl py-spy || exit 1
  jp=/tmp/jpegs25${SHAPES:+-$SHAPES}  # SHAPES=imagenet: as many image sizes as ImageNet's
  [ -d $jp/train ] || python3 bench/gpu_images.py make --root $jp --val 0 --shapes ${SHAPES:-four}
  mkdir -p /tmp/spyout
  for np in ${NPROCS:-1}; do for d in ${DECODES:-synthetic gpu}; do for n in ${VARIANTS:-now}; do
    r=/tmp/spy-$np-$d-$n; rm -rf $r; o=/tmp/spyout/$np-$d-$n; mkdir -p $o
    data="data=image_folder data.root=$jp data.val=null data.decode=$d"
    [ "$d" = synthetic ] && data="data=synthetic data.shape=[3,224,224] data.num_samples=3072 data.val_samples=256"
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader,nounits -lms 50 > $o/util.txt & u=$!
    code=$PWD; [ "$n" = before ] && code=$PWD/${EXPCTL_BENCH_BEFORE:-.before}  # an older package
    [ -d ".v-$n" ] && code=$PWD/.v-$n  # a variant of the package (made by hand, not committed)
    ranks=""; [ "$np" -gt 1 ] && ranks="launcher=local launcher.nproc=$np"
    PYTHONPATH=$code:$PYTHONPATH CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((np - 1))) taskset -c 0-$((16 * np - 1)) python3 -m expctl run \
      model=resnet50 optim=sgd optim.lr=0.1 sched=none $ranks \
      train.precision=bf16 data.batch_size=256 train.val_every=100000 train.max_epochs=100000 \
      train.limit_val_batches=1 checkpoint.every=1000000 $data train.max_steps=${SPY_STEPS:-468} \
      train.log_every=${SPY_EVERY:-13} ${EXTRA:-} run.dir=$r > $o/run.log 2>&1 & pid=$!
    for ((i = 0; i < 240; i++)); do grep -q '"step": 104,' $r/metrics.jsonl 2>/dev/null && break; sleep 0.5; done
    if [ -n "${FAULTS:-}" ]; then  # the training process's minor page faults and the host's TLB shootdowns, 8 s
      snap() { echo "$(awk '{print $10}' /proc/$pid/stat) $(awk '/TLB/ {for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i} END {print s}' /proc/interrupts)"; }
      a=$(snap); sleep 8; b=$(snap)
      echo "$a $b" | awk '{printf "minor page faults/s %.0f, TLB shootdowns/s %.0f\n", ($3 - $1) / 8, ($4 - $2) / 8}'
    fi
    if [ -n "${SPY:-}" ]; then
      # nonblocking (the processes are not paused), idle threads too: where each one waits
      /tmp/spy/bin/py-spy record -p $pid --subprocesses --threads --nonblocking --rate 100 -d 8 --format raw \
        $([ -n "${SPY_GIL:-}" ] && echo --gil || echo --idle) -o $o/spy.txt 2>&1 | tail -1
    fi
    wait $pid; echo "== $np GPU(s) $d $n exit $?"; kill $u; cp $r/metrics.jsonl $o/
    python3 -c "
import sys, collections; b = collections.defaultdict(list)
for x in open(sys.argv[1]):
    f = x.split(',')
    if len(f) == 3: b[f[1].strip()].append(float(f[2]))
print('GPU busy %', ' '.join(f'{k}:{sum(v) / len(v):.1f}' for k, v in sorted(b.items())))" $o/util.txt
    python3 -c "
import json,sys; from harness import trained_rate
rows=[json.loads(x) for x in open(sys.argv[1])]
print('img/s after step 104:', round(trained_rate(rows, 104)), ' rows:', ' '.join(str(round(r['perf/samples_per_s'])) for r in rows if 'train/loss' in r and r['step'] > 104))" $r/metrics.jsonl
  done; done; done
  tar czf $OUT/feed-spy.tgz -C /tmp/spyout . ;;
sweep-spy)  # issue 24: where a packed sweep's start goes (py-spy of the driver, zygote and trials)
  python3 -c "import sys; print('dont_write_bytecode', sys.dont_write_bytecode)"
  d=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  ls -d "$d/_dynamo/__pycache__" 2>&1 | tail -1; touch "$d/.w" 2>/dev/null && rm "$d/.w" && echo "torch's folder writable"
  for i in 1 2; do /usr/bin/time -f "import torch._dynamo: %e s" python3 -c "import torch._dynamo"; done
  command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/spy \
    --find-links .whl py-spy || exit 1
  for s in ${SETTINGS:-quarter}; do
    /tmp/spy/bin/py-spy record --subprocesses --nonblocking --idle --rate 50 --format raw -o "$OUT/sweep-spy-$s.txt" -- \
      python3 bench/sweep_bench.py gpu --workload ${WORKLOADS:-fashion_cnn} --trials ${TRIALS:-16} --settings $s \
      --out "$OUT/sweep-spy-$s.json" 2>&1 | tail -12
  done ;;
threads)  # a plain 1-GPU run on a many-core host: torch's intra-op threads (all cores) vs fewer
  for w in "experiment=default data.root=$PWD/.data/fashion-mnist" \
           "model=resnet18 data=synthetic data.shape=[3,32,32] data.num_classes=10 data.num_samples=16384 data.val_samples=1024 data.batch_size=256 train.max_epochs=3"; do
    for v in ${THREADS_SETS:-all 16 4 1 all}; do
      r=/tmp/th-$RANDOM; e=""; [ "$v" != all ] && e="OMP_NUM_THREADS=$v"
      t0=$(date +%s.%N); env $e CUDA_VISIBLE_DEVICES=0 python3 -m expctl run $w run.dir=$r > $r.log 2>&1 || tail -3 $r.log
      python3 -c "
import json, sys, statistics, time
wall = time.time() - float(sys.argv[4])
rows = [json.loads(x) for x in open(sys.argv[1] + '/metrics.jsonl')]
rate = [r['perf/samples_per_s'] for r in rows if 'perf/samples_per_s' in r][1:]
print(f'{sys.argv[3][:40]:40} threads={sys.argv[2]:>4}  wall {wall:6.1f} s  median samples/s {statistics.median(rate):9.0f}')
" $r $v "$w" $t0
    done
  done ;;
overlap)  # issue 25: decoding beside a training step, 1 process and one per GPU at once (16 cores each)
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site \
    --find-links .whl nvidia-nvimgcodec-cu13 2>/dev/null || echo "no nvidia-nvimgcodec-cu13 wheel in .whl"
  o="${ONLY:-nvjpeg,nvimgcodec hw,on_device gpu}"
  echo "-- 1 process, cores 0-15"; taskset -c 0-15 python3 bench/decode_overlap.py --only "$o" 2>&1 | grep -v Warning
  [ -n "${OVERLAP_COMPILE:-}" ] && { echo "-- 1 process, cores 0-15, torch.compile"
    taskset -c 0-15 python3 bench/decode_overlap.py --compile --only "$o" 2>&1 | grep -v Warning; }
  echo "-- $ngpu processes at once"; python3 bench/decode_overlap.py --procs $ngpu --only "$o" 2>&1 | grep -v Warning | sort ;;
trace)  # issue 25: a CUDA trace of 12 steps (torch.profiler, bench/trace_gaps.py): where the step stream idles; NPROCS=4: every rank's
  [ -d /tmp/jpegs25/train ] || python3 bench/gpu_images.py make --root /tmp/jpegs25 --val 0
  for c in ${TRACES:-compiled:synthetic compiled:gpu eager:synthetic eager:gpu}; do
    mode=${c%%:*}; d=${c#*:}; r=/tmp/tr-$mode-$d; rm -rf $r
    data="data=image_folder data.root=/tmp/jpegs25 data.val=null data.decode=$d"
    [ "$d" = synthetic ] && data="data=synthetic data.shape=[3,224,224] data.num_samples=3072 data.val_samples=256"
    comp=""; [ "$mode" = compiled ] && comp="train.compile=true"
    np=${NPROCS:-1}; ranks=""; [ "$np" -gt 1 ] && ranks="launcher=local launcher.nproc=$np"
    PROFILE_FROM=${TRACE_FROM:-200} PROFILE_STEPS=12 PROFILE_TRACE="$r.{rank}.json" \
      CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((np - 1))) taskset -c 0-$((16 * np - 1)) \
      python3 -m expctl run $ranks model=resnet50 optim=sgd optim.lr=0.1 sched=none imports=[step_profile] train.step=profiled \
      train.precision=bf16 data.batch_size=256 train.val_every=100000 train.max_epochs=100000 \
      train.limit_val_batches=1 checkpoint.every=1000000 $data train.max_steps=$(( ${TRACE_FROM:-200} + 60 )) \
      train.log_every=13 $comp ${EXTRA:-} run.dir=$r > $r.log 2>&1; echo "== $mode $d exit $?"
    grep "profiled window" $r.log
    python3 -c "
import json,sys; from harness import trained_rate
rows=[json.loads(x) for x in open(sys.argv[1])]
print('rows after step 104 (the profiled window inside):', ' '.join(str(round(r['perf/samples_per_s'])) for r in rows if 'train/loss' in r and r['step'] > 104))" $r/metrics.jsonl
    for ((k = 0; k < np; k++)); do
      echo "-- rank $k of $np"; python3 bench/trace_gaps.py $r.$k.json --steps 12 --top ${TOP:-10}
      gzip -c $r.$k.json > "$OUT/trace-$mode-$d-$np-$k.json.gz"
    done
  done ;;
crop)  # issue 25: the device path's crop of one batch, one roi_align per image size vs crop_resize, four sizes and ImageNet's many
  [ -d /tmp/jpegs25/train ] || python3 bench/gpu_images.py make --root /tmp/jpegs25 --val 0
  [ -d /tmp/jpegs25-imagenet/train ] || python3 bench/gpu_images.py make --root /tmp/jpegs25-imagenet --val 0 --shapes imagenet
  python3 bench/crop_bench.py --root /tmp/jpegs25 --root /tmp/jpegs25-imagenet | tee "$OUT/crop.md" ;;
decode-race)  # issue 25: does a batched GPU decode write memory that queued kernels still read?
  python3 bench/decode_race.py ;;
*) echo "unknown part: $part" >&2; exit 2 ;;
esac
