#!/usr/bin/env bash
# Every row of the README's claims table in one command: the runs, the report.py merges, then the table's numbers.
#
#   bash reproduce.sh cpu   [--jobs N] [--only ROW,ROW] [--data DIR] [--out DIR]   # the README's scale, on CPUs
#   bash reproduce.sh gpu   [--jobs N] [--only ROW,ROW] [--data DIR] [--out DIR]   # the paper's scale, on one GPU
#   bash reproduce.sh smoke [--out DIR]                                            # every row on fake data, minutes
#   bash reproduce.sh --list [--only ROW,ROW]                                      # the rows and their CPU time
#   bash reproduce.sh cpu|gpu --dry-run [--only ROW,ROW] [--data DIR] [--out DIR]  # print the commands, run none
#
# A row runs its processes (one per seed and model group, --jobs at a time, one thread each), then merges them with
# report.py into out/<script>/<row's name>, once every run it merges is done (a run of another row, still running in
# another reproduce.sh, leaves the merge unmade and says so). A run whose folder holds .done is skipped; one that was
# stopped (Ctrl-C, SIGTERM, kill -9, a reboot) is resumed with --resume from its last checkpoint, so the reproduction
# can run in pieces across days and ends with the numbers of an uninterrupted one. --data DIR holds the datasets as
# torchvision and language.py read them: FashionMNIST/, MNIST/, glue/MRPC/ and frost/ (the six frost textures of
# github.com/hendrycks/robustness, ImageNet-C/create_c/; without them the robustness row leaves frost out) (cpu); also
# cifar-10-batches-py/, train_32x32.mat and test_32x32.mat (SVHN), glue/QQP/, imagenet/train/ (an ImageFolder),
# CIFAR-10-C/ where present (gpu). Without --data and --out: the repository's data/ and out/; a relative DIR given is
# taken from the folder reproduce.sh is called in.
[ -n "${BASH_VERSION:-}" ] || { echo "reproduce.sh: run it with bash (bash reproduce.sh ...), not sh" >&2; exit 2; }
set -euo pipefail
here=$PWD  # where it was called from: a relative --data or --out is taken from here, not from the repository
cd "$(dirname "$0")"
(( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 403 )) || {  # declare -A and wait -n (macOS ships bash 3.2)
  echo "reproduce.sh: needs bash >= 4.3, this is $BASH_VERSION (macOS: brew install bash, and run it with that)" >&2
  exit 2; }

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' reproduce.sh; exit 0; }  # the lines above
scale=${1:-}
shift || true
jobs="" only="" data=data out=out list="" dry=""
[ "$scale" = --list ] && { list=1; scale=cpu; }
case $scale in
  cpu | gpu | smoke) ;;
  -h | --help) usage ;;
  *) got=${scale:+ (got $scale)}
     echo "reproduce.sh: the scale comes first: bash reproduce.sh cpu|gpu|smoke [flags], --list or --help$got" >&2
     exit 2 ;;
esac
while [ $# -gt 0 ]; do
  if [[ $1 =~ ^--(jobs|only|data|out)$ ]] && [ $# -lt 2 ]; then echo "reproduce.sh: $1 needs a value" >&2; exit 2; fi
  case $1 in
    --list) list=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h | --help) usage ;;
    --jobs) jobs=$2; shift 2 ;;
    --only) only=",$2,"; shift 2 ;;
    --data) data=$2; [[ $data = /* ]] || data=$here/$data; shift 2 ;;
    --out) out=$2; [[ $out = /* ]] || out=$here/$out; shift 2 ;;
    *) echo "reproduce.sh: unknown argument $1 (usage: bash reproduce.sh cpu|gpu|smoke [--jobs N] [--only ROW,ROW]" \
            "[--data DIR] [--out DIR] [--dry-run], or --list [--only ROW,ROW])" >&2; exit 2 ;;
  esac
done
# one GPU: 4 runs at a time unless --jobs says otherwise. The GPU takes turns between processes, so runs that keep it
# busy gain nothing from sharing it (and lose nothing), while small ones gain: on an H200, 12 MRPC runs 6 at a time
# took 194 s for 912 s of their own timers; three of the authors' ViT at once, 47 ms/step each against 15-19 alone
[ "$scale" = gpu ] && jobs=${jobs:-4}
jobs=${jobs:-$(nproc 2> /dev/null || echo 2)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "reproduce.sh: --jobs must be an integer >= 1, got $jobs" >&2; exit 2; }
python=${PYTHON:-python}
export OMP_NUM_THREADS=1  # one thread per process: torch's threads spin against the other runs on a small machine

# What each scale appends to a script's commands (argparse keeps a flag's last value): nothing at the README's scale;
# at gpu the paper's sizes (the authors' ViT on all 60,000 Fashion-MNIST images); at smoke, fake data and models so
# small that every row takes seconds, and no figures per run (drawing them took a sixth of the smoke's CPU time): the
# rows' merges draw the same figures, and `python report.py FOLDER` a run's.
V="" F="" L="" P="" G="" S="" R="" big="10000 60000"
if [ "$scale" = gpu ]; then
  F="--n-train 60000 --n-test 10000 --depth 8 --heads 32 --dim-head 64"
elif [ "$scale" = smoke ]; then
  V="--dataset fake28 --n-train 60 --n-test 20 --n-sens 4 --steps 4 --eval-every 1 --batch-size 20 --depth 1 --heads 2
     --dim-head 8 --dim 16 --mlp-dim 16 --mlp-hidden 16 --no-figures" F=$V big="30 40"
  L="--task fake --n-sens 8 --sens-positions 4 --epochs 0.2 --eval-every 2 --depth 1 --dim 32 --heads 2 --mlp-dim 32
     --no-figures"
  P="--steps 20 --eval-every 10 --n-train 200 --n-test 50 --n-sens 20 --depth 1 --no-figures"
  G="--p 13 --epochs 20 --eval-every 10 --no-figures"
  S="--steps 20 --eval-every 10 --n-train 200 --n-test 50 --n-sens 20 --no-figures"
  R="$V --epochs 1 --n-corrupt 10 --n-sharp 10 --severities 1 --corruptions contrast gaussian_noise"
fi
fmnist="--dataset fashionmnist --data-dir $data"
# vision.py measures the sensitivity during training only where a number of the table reads it: at the last
# evaluation and at the two around each --match-acc crossing (the same numbers as measuring every evaluation, tested)
needed="--sens-during needed"

# -----------------------------------------------------------------------------
# the machinery: runs as background processes, at most $jobs at once; rows in turn

pids=() dirs=() failed=() row_dirs=()

run() {  # run NAME SCRIPT FLAGS...: the run folder out/<script>/NAME; skipped when done, resumed when stopped
  local name=$1 script=$2 folder="$out/${2%.py}/$1" how=started
  shift 2
  row_dirs+=("$folder")  # the row's CPU time is its runs' own (done before or now)
  [ -f "$folder/.done" ] && { echo "  $name: done before"; return; }
  if [ -z "$dry" ] && alive "$name"; then  # left by a reproduce.sh that was killed: it may be writing its folder
    echo "  $name: still running (pid $(cat "$out/logs/$name.pid")) from an earlier reproduce.sh; waiting for it"
    while alive "$name"; do collect; sleep 1; done  # then resumed below: a no-op if it finished
  fi
  if [ -z "$dry" ]; then  # a free slot (and the runs that have ended marked done)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done  # wait -n: until one of them ends
    collect
  fi
  if [ -f "$folder/metrics.json" ]; then
    set -- --resume "$folder"
    how=resumed
  else
    set -- "$@" --out-dir "$out" --run-name "$name" --save-every "$(save_every "$script")"
  fi
  [ -n "$dry" ] && { echo "  $name: would be $how: \$ $(printf '%q ' "$python" "$script" "$@")"; return; }
  [ $how = resumed ] || rm -rf "$folder"  # a start that died before its first write: nothing measured, nothing lost
  echo "  $name: $how"
  "$python" "$script" "$@" > "$out/logs/$name.log" 2>&1 &
  echo $! > "$out/logs/$name.pid"
  pids+=($!) dirs+=("$folder")
}

alive() {  # whether the run's process of an earlier reproduce.sh still runs (its pid, with its name in the command)
  local pid
  pid=$(cat "$out/logs/$1.pid" 2> /dev/null) && ps -p "$pid" -o args= 2> /dev/null | grep -qF -- "$1"
}

save_every() {  # a checkpoint every few minutes of a run (in its loop's unit), so that kill -9 loses little
  [ "$scale" = smoke ] && { echo 2; return; }
  case $1 in vision.py | robustness.py) echo 5 ;; grokking.py | parity.py) echo 1000 ;; *) echo 200 ;; esac
}

collect() {  # the runs that have ended, at once: a run that exits 0 is marked done. Not later: bash forgets a
  # child's exit status once one of its own later children gets the same pid, and a long reproduction's sleeps and
  # subshells go through every pid (32,768 on many systems) in about two hours, so `wait` then fails (exit 127)
  local i code running
  running=" $(jobs -rp | tr '\n' ' ') "
  for i in "${!pids[@]}"; do
    [[ $running == *" ${pids[$i]} "* ]] && continue
    code=0
    wait "${pids[$i]}" || code=$?
    if [ $code -eq 0 ] && [ -d "${dirs[$i]}" ]; then
      touch "${dirs[$i]}/.done"
    else
      [ $code -ne 0 ] || code="0, but it left no run folder"  # touch would fail, and set -e end everything
      echo "  $(basename "${dirs[$i]}"): FAILED (exit $code), see $out/logs/$(basename "${dirs[$i]}").log"
      failed+=("$(basename "${dirs[$i]}")")
    fi
    unset "pids[$i]" "dirs[$i]"
  done
}

reap() {  # wait for every run of the row to end
  collect
  while [ ${#pids[@]} -gt 0 ]; do
    wait -n || true  # until one of them ends (its exit status is still there for collect's wait)
    collect
  done
}

merge() {  # merge NAME SCRIPT FOLDER... [--vary FLAG...]: the row's merged folder, made anew from its runs
  local name=$1 script=$2 f missing=()
  shift 2
  local merging=("$python" report.py "$@" --out-dir "$out" --run-name "$name")
  [ -n "$dry" ] && { echo "  merge $name: \$ $(printf '%q ' "${merging[@]}")"; return; }
  reap
  rm -rf "${out:?}/$script/$name"  # derived from the runs alone: recomputed every time
  for f in "$@"; do [[ $f == --* ]] && break; [ -f "$f/.done" ] || missing+=("$(basename "$f")"); done
  if [ ${#missing[@]} -gt 0 ]; then  # merged, they would give claims over fewer seeds or models, and say nothing
    echo "  merge $name: not made, since these of its runs are not done: ${missing[*]} (run them: the same command" \
         "again, or --only the row that runs them)"
    failed+=("merge-$name")
    return
  fi
  "${merging[@]}" > "$out/logs/merge-$name.log" 2>&1 \
    || { echo "  merge $name: FAILED, see $out/logs/merge-$name.log"; failed+=("merge-$name"); }
}

stop() {  # Ctrl-C or SIGTERM: every run gets SIGTERM, keeps its metrics and checkpoint, and is resumed next time
  trap '' INT TERM
  echo "reproduce.sh: stopping ${#pids[@]} run(s); run the same command again to go on" >&2
  [ ${#pids[@]} -eq 0 ] || kill -TERM "${pids[@]}" 2> /dev/null || true  # some may have ended
  wait
  exit 130
}
trap stop INT TERM

need() {  # need PATH WHAT: false, with one line, when a dataset is missing (the row is skipped)
  [ -e "$data/$1" ] && return 0
  echo "  skipped: needs $2 at $data/$1"
  return 1
}

declare -A loads=()  # dataset -> "" once it loaded, else why not (each dataset checked once per reproduce.sh)
have() {  # have DATASET: true when vision.py can load it (torchvision downloads it now if missing), for TASK/SPLIT
  # (mrpc/paper, mrpc/glue, qqp/glue) when language.py can read its GLUE files, for frost when robustness.py can read
  # its textures; else one line, and the row (or frost) is skipped rather than each of its runs failing. At the smoke
  # scale and in --dry-run, true
  local why
  { [ "$scale" = smoke ] || [ -n "$dry" ]; } && return 0
  if [ -z "${loads[$1]+x}" ]; then
    why=$("$python" -c 'import os, sys, corruptions, glue, vision
name, data = sys.argv[1:]
try:
    if "/" in name:  # a GLUE task and split, read as language.py reads them
        task, split = name.split("/")
        for f in glue.SPLITS[task][split]:
            glue.read_tsv(os.path.join(data, "glue", task.upper(), f), task)
    elif name == "frost":  # the six textures of the release that frost is generated with
        corruptions.load_frost(os.path.join(data, "frost"))
    else:
        vision.load_dataset(name, data, "cpu")
except (OSError, ValueError) as e:
    sys.exit(str(e))' "$1" "$data" 2>&1) && loads[$1]="" || loads[$1]=$(tail -1 <<< "$why")
  fi
  [ -z "${loads[$1]}" ] && return 0
  echo "  skipped: $1: ${loads[$1]}"
  return 1
}

seeds="0 1 2"
[ "$scale" = smoke ] && seeds="0 1"  # two: every merge still has a standard error over seeds
per_seed() { local p s; for p in "$@"; do for s in $seeds; do echo "${p//%/$s}"; done; done; }  # % -> each seed
ROWS=()
row() { ROWS+=("$1|$2|$3"); }  # row ID CPU-MINUTES TITLE: in --list, and the order rows run in

# -----------------------------------------------------------------------------
# the rows, in the README's order; CPU minutes are on a 2-core machine, one thread per process

row synthetic 1 "Sec. 4.1, Fig. 3: one attention layer learns the lower-sensitivity feature"
do_synthetic() {
  run cases synthetic.py $S
}

row fig12 5 "Fig. 12: the same in three more settings per case"
do_fig12() {
  for s in $seeds; do run fig12-seed$s synthetic.py --fig12 --seeds $s $S; done
  merge fig12 synthetic $(per_seed "$out"/synthetic/fig12-seed%)
}

row vision3k 71 "Sec. 5: ViT vs MLPs and CNN on Fashion-MNIST, 900 SGD steps (3 seeds)"
do_vision3k() {
  have fashionmnist || return 0
  for s in $seeds; do
    run fmnist-3k-seed$s vision.py $fmnist --model vit vit-simple mlp mlp-sigmoid cnn --lr cnn=0.05 mlp-sigmoid=1.0 \
      vit-simple=0.1 --n-train 3000 --epochs 30 --eval-every 5 --depth 4 --heads 4 --dim-head 16 --sigma 0.1 1 --sweep \
      --mask patch scattered --match-acc 0.8 0.85 0.9 --n-sens 500 $needed --seeds $s $F
  done
  merge fmnist-3k vision $(per_seed "$out"/vision/fmnist-3k-seed%)
}

row converged 82.6 "Sec. 5 and App. A.2: the same, every model to train accuracy 0.99 (3 seeds)"
# One process per model and seed, named conv-<model>-seed<s>: the mechanism row merges the same ViT, ViT-simple, CNN
# and MLP runs (a model's numbers do not depend on what else its process trains), so the second row to run skips them.
converged="$fmnist --n-train 3000 --n-test 2000 --epochs 200 --eval-every 5 --until-acc 0.99 --patience 6 --depth 4
  --heads 4 --dim-head 16 --sigma 0.1 1 --sweep --mask patch global scattered --match-acc 0.9 0.95 0.99 --n-sens 500
  --flat-patches 0.01 $needed"
adam="--optimizer adam --lr 1e-3"  # the ViTs and CNNs: SGD at the paper's rates does not reach 0.99 in CPU time
conv_runs() {  # the converged row's five models for seed $1 (the MLPs at the paper's SGD rates)
  run conv-vit-seed$1 vision.py $converged --model vit $adam --seeds $1 $F
  run conv-vit-simple-seed$1 vision.py $converged --model vit-simple $adam --seeds $1 $F
  run conv-cnn-seed$1 vision.py $converged --model cnn $adam --seeds $1 $F
  run conv-mlp-seed$1 vision.py $converged --model mlp --seeds $1 $F
  run conv-mlp-sigmoid-seed$1 vision.py $converged --model mlp-sigmoid --seeds $1 $F
}
do_converged() {
  have fashionmnist || return 0
  for s in $seeds; do conv_runs $s; done
  merge converged-3seeds vision $(per_seed "$out"/vision/conv-{vit,vit-simple,cnn,mlp,mlp-sigmoid}-seed%) \
    --vary model optimizer lr
}

row vitsize 14.2 "Sec. 5: the authors' ViT size against ours (1 seed)"
do_vitsize() {
  have fashionmnist || return 0
  local c="$fmnist --n-train 1000 --epochs 200 --eval-every 10 --until-acc 0.99 --patience 6 --patch-size 7
    --sigma 0.1 1 --sweep --mask patch global --n-sens 100 $needed --seeds 0"
  local large="--depth 8 --heads 32 --dim-head 64"
  [ "$scale" = smoke ] && large="--depth 2 --heads 2 --dim-head 8"  # (smoke: still another size than the small one)
  run vit-d8h32 vision.py $c --model vit --optimizer adam --lr 1e-3 $V $large
  run vit-d4h4 vision.py $c --model vit --depth 4 --heads 4 --dim-head 16 --optimizer adam --lr 1e-3 $V
  run mlp vision.py $c --model mlp $V
  merge vit-size-d8h32 vision "$out"/vision/{vit-d8h32,mlp} --vary model depth heads dim-head optimizer lr
  merge vit-size-d4h4 vision "$out"/vision/{vit-d4h4,mlp} --vary model depth heads dim-head optimizer lr
  merge vit-size vision "$out"/vision/{vit-d8h32,vit-d4h4} --vary depth heads dim-head  # the two ViTs, paired
}

row datascale 51 "Sec. 5: the same with 10,000 and 60,000 images (3 seeds per size; needs vision3k)"
do_datascale() {
  have fashionmnist || return 0
  for n in $big; do for s in $seeds; do
    run fmnist-$n-seed$s vision.py $fmnist --model vit mlp mlp-sigmoid cnn --lr cnn=0.05 mlp-sigmoid=1.0 --steps 900 \
      --eval-every 100 --depth 4 --heads 4 --dim-head 16 --sigma 0.1 1 10 --n-sens 500 $needed --seeds $s $V \
      --n-train $n
  done; done
  merge fmnist-scale3 vision $(per_seed "$out"/vision/fmnist-3k-seed%) \
    $(for n in $big; do per_seed "$out"/vision/fmnist-$n-seed%; done) \
    --vary n-train steps epochs eval-every model lr sigma sweep mask match-acc
}

row mechanism 166 "Why the ViT differs: normalisation ablations, flat patches, the paper's SGD (3 seeds; SGD 1 seed)"
do_mechanism() {  # the converged row's runs (skipped if it ran), then the ablations of the same protocol
  have fashionmnist || return 0
  # the paper's SGD rates (ViT 0.1, CNN 0.005, constant) until train accuracy 0.99: the ViT's 95 epochs are the row's
  # longest run, so it starts first; the CNN needs momentum 0.9 (the paper does not say; the authors' code has none,
  # and without it the CNN stood at 0.89-0.93 from epoch 170 to 255): 60 epochs
  run sgd-vit-seed0 vision.py $converged --model vit --epochs 1000 --seeds 0 $F
  run sgd-cnn-momentum-seed0 vision.py $converged --model cnn --momentum 0.9 --epochs 1000 --seeds 0 $F
  for s in $seeds; do
    conv_runs $s
    run abl-vit-npn-seed$s vision.py $converged --model vit --no-patch-norm $adam --seeds $s $F
    run abl-mlp-pn-seed$s vision.py $converged --model mlp --input-patch-norm --seeds $s $F
    run abl-vit-nbn-seed$s vision.py $converged --model vit --no-block-norm $adam --seeds $s $F
    run abl-cnn-pn-seed$s vision.py $converged --model cnn --input-patch-norm $adam --seeds $s $F
  done
  local vary="--vary model optimizer lr no-patch-norm no-block-norm input-patch-norm"
  merge mechanism vision $(per_seed "$out"/vision/{conv-vit,abl-vit-npn,abl-vit-nbn,conv-vit-simple}-seed% \
    "$out"/vision/{conv-mlp,abl-mlp-pn,conv-cnn,abl-cnn-pn}-seed%) $vary
  merge mechanism-npn vision $(per_seed "$out"/vision/{abl-vit-npn,conv-mlp,abl-mlp-pn,conv-cnn,abl-cnn-pn}-seed%) $vary
  merge paper-sgd vision "$out"/vision/sgd-{vit,cnn-momentum}-seed0 $(per_seed "$out"/vision/conv-mlp-seed%) \
    --vary model epochs patience momentum
}

row mnist01 2.5 "App. A.1: ViT below the MLP on MNIST 0 vs 1 (3 seeds)"
do_mnist01() {
  have mnist01 || return 0
  local c="--dataset mnist01 --data-dir $data --model vit mlp --mlp-hidden 512 --batch-size 50 --n-train 2000
    --epochs 10 --eval-every 2 --depth 4 --heads 4 --dim-head 16 --sigma 1 3 --sweep --mask patch scattered
    --match-acc 0.99 --n-sens 500 $needed"
  [ "$scale" = gpu ] && c="$c --n-train 12665"  # every 0 and 1 of MNIST's training set
  for s in $seeds; do run mnist01-seed$s vision.py $c --seeds $s $V; done
  merge mnist01 vision $(per_seed "$out"/vision/mnist01-seed%)
}

row fig4 0 "Fig. 4: ViTs below ResNet, DenseNet, ConvMixer on CIFAR-10 and SVHN (gpu; 3 seeds)"
do_fig4() {
  [ "$scale" = cpu ] && { echo "  skipped: the paper's scale, bash reproduce.sh gpu"; return; }
  local models="vit vit-simple resnet18 densenet121 convmixer"
  [ "$scale" = smoke ] && models="vit vit-simple"  # the CNNs' sweep takes minutes on a CPU, even this small
  for set in cifar10 svhn; do
    [ "$scale" = smoke ] || { need "$([ $set = cifar10 ] && echo cifar-10-batches-py || echo train_32x32.mat)" \
      "$set (torchvision's files)" && have $set; } || continue  # have: readable (SVHN's .mat files need scipy)
    for s in $seeds; do
      run $set-fig4-seed$s vision.py --dataset $set --data-dir $data --model $models --sweep $needed --seeds $s $V
    done
    merge $set-fig4 vision $(per_seed "$out"/vision/$set-fig4-seed%)
  done
}

row imagenet 0 "Sec. 5: pretrained ViT-L/16 below ConvNeXt-Tiny on ImageNet images (gpu; nothing trained)"
do_imagenet() {  # torchvision's weights: downloaded on the first run (offline, imagenet.py says which file goes where)
  local c="--n-sens 500 --sens-positions 16 --sigma 0.1 1 --sweep"  # 16 of the 196 patches per image and sigma
  case $scale in
    cpu) echo "  skipped: the paper's scale, bash reproduce.sh gpu"; return ;;
    smoke)  # four random pictures in two classes, and the two architectures with random weights
      [ -n "$dry" ] || "$python" -c 'import os, sys, numpy as np; from PIL import Image
rng = np.random.default_rng(0)
for i in range(4):
    os.makedirs(f"{sys.argv[1]}/class{i % 2}", exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(f"{sys.argv[1]}/class{i % 2}/{i}.png")
' "$out/fake-imagenet"
      c="--imagenet-dir $out/fake-imagenet --random-weights --n-sens 2 --sens-positions 2 --sigma 10 100" ;;
    gpu)
      need imagenet/train "ImageNet's training images as an ImageFolder (one folder per class)" || return 0
      c="$c --imagenet-dir $data/imagenet/train" ;;
  esac
  run pretrained imagenet.py $c
}

row parity 178 "App. A.6: sensitivity during the parity plateau, then k (5 settings x 3 seeds)"
do_parity() {
  for st in 1 3 4 5 6; do for s in $seeds; do run s$st-seed$s parity.py --setting $st --seeds $s $P; done; done
  merge settings-3seeds parity $(for st in 1 3 4 5 6; do per_seed "$out"/parity/s$st-seed%; done) --vary setting
}

row grokking 58 "Sec. 7.3: sensitivity falls before test accuracy rises in grokking (3 seeds)"
do_grokking() {  # each run ends 1,000 epochs after it groks: every number the row reads is measured by then
  for s in $seeds; do run grok-seed$s grokking.py --seeds $s --stop-after-grok 1000 $G; done
  merge grokking-3seeds grokking $(per_seed "$out"/grokking/grok-seed%)
}

row mrpc 163.4 "Sec. 6, App. A.4: RoBERTa, ReLU-RoBERTa, GPT-2 and the LSTM on MRPC, the paper's split (3 seeds)"
do_mrpc() {
  [ "$scale" = smoke ] || { need glue/MRPC/msr_paraphrase_train.txt "GLUE MRPC (language.py --download)" \
    && have mrpc/paper; } || return 0
  # between initialisation and the end the headline sigma alone: its curve is the row's "from 17,968 examples on"
  local c="--data-dir $data/glue --task mrpc --fused --epochs 10 --n-sens 300 --sens-positions 8 --eval-every 188
    --sigma 3.872983346207417 2 --sens-during needed --align right left"
  for s in $seeds; do
    run mrpc-roberta-softmax-seed$s language.py $c --model roberta --attn softmax --seeds $s $L
    run mrpc-roberta-relu-seed$s language.py $c --model roberta --attn relu --seeds $s $L
    run mrpc-lstm-seed$s language.py $c --model lstm --seeds $s $L
    run mrpc-gpt2-softmax-seed$s language.py $c --model gpt2 --seeds $s $L
  done
  merge mrpc-paper-3seeds language \
    $(for m in roberta-softmax roberta-relu lstm gpt2-softmax; do per_seed "$out"/language/mrpc-$m-seed%; done) \
    --vary model attn
}

row mrpcglue 132.1 "Sec. 6: the same on GLUE's re-split of MRPC (3 seeds)"
do_mrpcglue() {
  [ "$scale" = smoke ] || { need glue/MRPC/train.tsv "GLUE MRPC (language.py --download)" && have mrpc/glue; } \
    || return 0
  # measured at initialisation and at the end only (--eval-every beyond the run's 1,150 steps): the row reads no curve
  local c="--data-dir $data/glue --task mrpc --split glue --fused --epochs 10 --n-sens 300 --sens-positions 8
    --eval-every 1000000 --sigma 3.872983346207417 2 --align right left"
  [ "$scale" = smoke ] && c="$c --split paper"  # the fake task has no splits
  for s in $seeds; do
    run mrpc-seed$s language.py $c --model roberta lstm --attn softmax relu --seeds $s $L
    run mrpc-gpt2-seed$s language.py $c --model gpt2 --attn softmax --seeds $s $L
  done
  merge mrpc-4models-3seeds language $(per_seed "$out"/language/mrpc-seed% "$out"/language/mrpc-gpt2-seed%) \
    --vary model attn
}

row qqp 0 "App. A.4: the same on QQP (gpu; 3 seeds)"
do_qqp() {
  [ "$scale" = cpu ] && { echo "  skipped: the paper's scale, bash reproduce.sh gpu"; return; }
  [ "$scale" = smoke ] || { need glue/QQP/train.tsv "GLUE QQP (language.py --download --task qqp)" \
    && have qqp/glue; } || return 0
  for s in $seeds; do
    run qqp-seed$s language.py --data-dir $data/glue --task qqp --model roberta gpt2 lstm --sigma 2 --seeds $s $L
  done
  merge qqp-3seeds language $(per_seed "$out"/language/qqp-seed%)
}

row robustness 27.5 "Sec. 7.1-7.2, Table 2: the regulariser, corruption accuracy, sharpness (3 seeds; gpu: Fig. 9 too)"
do_robustness() {
  local frost="" c
  if [ ! -d "$data/frost" ]; then echo "  note: no $data/frost (the six frost textures of" \
    "github.com/hendrycks/robustness, ImageNet-C/create_c/): corruption means over 14, not the README's 15"
  elif have frost; then frost="--frost-dir $data/frost"  # else one line: frost is left out, as without the folder
  fi
  c="$fmnist --model vit --n-train 3000 --eval-every 5 --depth 4 --heads 4 --dim-head 16 --patch-size 7 --sigma 1
    --n-corrupt 2000 --n-sens 2000 $needed $frost"
  if have fashionmnist; then
    for s in $seeds; do
      run rob-seed$s-va robustness.py $c --variants vanilla augment --epochs 20 --seeds $s $R
      run rob-seed$s-reg robustness.py $c --variants reg --lr 0.2 --epochs 40 --seeds $s $R
    done
    merge fmnist-rob robustness $(per_seed "$out"/robustness/rob-seed%-va "$out"/robustness/rob-seed%-reg) \
      --vary variants lr epochs
  fi
  # Fig. 9 at the paper's scale: its six models (ResNet-18, DenseNet-121, ViT-small, ViT-simple, ViT-small with noise
  # augmentation and with the regulariser) on CIFAR-10, CIFAR-10-C read from the release where present, else generated
  [ "$scale" = cpu ] && { echo "  Fig. 9 skipped: the paper's scale, bash reproduce.sh gpu"; return; }
  c="--dataset cifar10 --data-dir $data $needed $frost"
  if [ "$scale" = gpu ]; then
    { need cifar-10-batches-py "CIFAR-10 (torchvision's files), for Fig. 9" && have cifar10; } || return 0
    [ -d "$data/CIFAR-10-C" ] && c="$c --cifar10c-dir $data/CIFAR-10-C" \
      || echo "  note: no $data/CIFAR-10-C (https://zenodo.org/record/2535967), so Fig. 9's corruptions are generated"
  fi
  # (smoke: the two CNNs take most of a row's seconds, so one corruption and the fewest measurements)
  [ "$scale" = smoke ] && c="$R --corruptions contrast --steps 2 --sens-positions 2 --n-sharp 4 --sharp-reps 1"
  for s in $seeds; do run fig9-seed$s robustness.py --paper-fig9 $c --seeds $s; done
  merge fig9 robustness $(per_seed "$out"/robustness/fig9-seed%)
}

# -----------------------------------------------------------------------------
# the reproduction: the rows asked for, in order, each with its start, end and wall time; then the claims

ids=",$(for r in "${ROWS[@]}"; do printf '%s,' "${r%%|*}"; done)"
for id in ${only//,/ }; do
  [[ $ids == *",$id,"* ]] || { echo "reproduce.sh: --only $id: no such row (bash reproduce.sh --list)" >&2; exit 2; }
done
if [ -n "$only" ] && [ -z "${only//,/}" ]; then  # --only "" or --only ,: no row, which would run none and succeed
  echo "reproduce.sh: --only names no row (bash reproduce.sh --list)" >&2; exit 2
fi
if [ -n "$list" ]; then  # with --only: those rows alone, and their total
  total=0
  for r in "${ROWS[@]}"; do
    IFS='|' read -r id minutes title <<< "$r"
    [ -n "$only" ] && [[ $only != *",$id,"* ]] && continue
    printf "%-11s %6s min   %s\n" "$id" "$minutes" "$title"
    total=$(awk -v a="$total" -v b="$minutes" 'BEGIN { print a + b }')
  done
  echo "total: $total CPU-minutes at the cpu scale (one core; --jobs N divides the wall time by up to N)"
  exit 0
fi

# (torch found, not imported: an import costs seconds, and every run imports it anyway)
[ -n "$dry" ] || "$python" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('torch'))" 2> /dev/null || {
  echo "reproduce.sh: '$python' has no torch; activate the README's" \
    "environment (source .venv/bin/activate) or set PYTHON=/path/to/python" >&2; exit 2; }
[ -n "$dry" ] || mkdir -p "$out/logs"
declare -A counted=()  # run folders whose minutes a row has counted: a run two rows share counts for the first
cpu_minutes() {  # cpu=the CPU minutes the row's runs recorded (training, evaluations, final measurements; every
  # invocation). It sets a variable rather than printing: in a $(...) subshell `counted` would forget what it counted
  local f folders=()
  cpu=0
  for f in "${row_dirs[@]}"; do
    [ -f "$f/metrics.json" ] && [ -z "${counted[$f]:-}" ] && folders+=("$f") && counted[$f]=1
  done
  [ ${#folders[@]} -gt 0 ] || return 0
  cpu=$("$python" report.py --times "${folders[@]}" 2> /dev/null | tail -1 | sed -n 's/.*| total \([0-9.]*\) min$/\1/p') \
    || cpu="?"  # a folder it cannot read: the row's line says "CPU ? min", and the reproduction goes on
}

if [ -n "$dry" ]; then
  echo "reproduce.sh $scale --dry-run: the commands it would run (nothing is run or written), data $data, results $out"
else
  echo "reproduce.sh $scale: $jobs process$([ "$jobs" = 1 ] || echo es) at a time, data $data, results $out" \
    "($(date '+%F %T'))"
fi
start=$(date +%s) cpu_total=0
for r in "${ROWS[@]}"; do
  IFS='|' read -r id minutes title <<< "$r"
  [ -n "$only" ] && [[ $only != *",$id,"* ]] && continue
  t0=$(date +%s) row_dirs=()
  echo "[$id] $title | start $(date '+%T')"
  "do_$id"
  [ -n "$dry" ] && continue
  reap
  cpu_minutes
  cpu_total=$(awk -v a="$cpu_total" -v b="${cpu:-0}" 'BEGIN { print a + b }')
  echo "[$id] end $(date '+%T') | wall $(( $(date +%s) - t0 )) s | CPU ${cpu:-?} min (its runs' own timers)"
done
[ -n "$dry" ] && { echo "then: \$ $(printf '%q ' "$python" report.py --claims "$out")"; exit 0; }
echo "all rows: wall $(( $(date +%s) - start )) s | CPU $cpu_total min"
"$python" report.py --claims "$out" || failed+=("claims")
[ ${#failed[@]} -eq 0 ] || { echo "reproduce.sh: failed: ${failed[*]} (their logs are in $out/logs)" >&2; exit 1; }
