#!/usr/bin/env bash
# The GPU items of reproduce.sh within a fixed wall-time budget: for a lent GPU machine whose minutes are few.
#
#   bash tools/gpu_check.sh [BUDGET_S] [RESULTS_DIR] [bench] [tests] [smoke] [ROW:JOBS ...]   # datasets in ./data
#
# (defaults: 540 s, the repository's out/gpu_check, bench tests mnist01:3 mrpc:6 vision3k:3)
# In order: the machine (GPU, driver, torch); with `bench`, bench.py's estimator and language figures on the GPU, alone
# on it (the estimator's efficiency and its speed-up over the authors' per-draw loop); then, side by side on the one
# GPU: with `tests` the CUDA tests (tests/test_gpu.py); with `smoke` every row of `reproduce.sh smoke` on the GPU (fake
# data and tiny models: each script's every path of the reproduction on CUDA, a minute or two); and the rows of
# `reproduce.sh gpu` given (each as ROW:JOBS, the row and its --jobs), each stopped with SIGTERM when the budget ends: a
# stopped run keeps its metrics and checkpoint, and `bash reproduce.sh gpu --only ROW` resumes it later. A run folder
# of out/ carried to the machine is skipped when done and resumed when not (without its checkpoint, which is too large
# to come back: its unfinished model restarts), so `vision3k:1` alone with the folders of the lends before goes on with
# the next seed (about 11-12 min of an H200 each). Everything it measured, without checkpoints, is packed into
# RESULTS_DIR.tgz: one log per step in RESULTS_DIR, and the run folders and logs of out/ (a machine lent for minutes may
# give back few files).
[ -n "${BASH_VERSION:-}" ] || {
  echo "gpu_check.sh: run it with bash (bash tools/gpu_check.sh ...), not sh" >&2; exit 2; }
set -uo pipefail
if [[ ${1:-} =~ ^(-h|--help)$ ]]; then  # the lines above
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0
fi
budget=${1:-540} res=${2:-out/gpu_check}
# a RESULTS_DIR given is taken from the folder it was called in, as reproduce.sh takes --out; the default is in the
# repository
[ -z "${2:-}" ] || [[ $res == /* ]] || res=$PWD/$res
cd "$(dirname "$0")/.."
shift 2 2> /dev/null || shift $#
[ $# -gt 0 ] || set -- bench tests mnist01:3 mrpc:6 vision3k:3
bench="" tests="" smoke="" rows=()
for step in "$@"; do
  if [ "$step" = bench ]; then bench=1
  elif [ "$step" = tests ]; then tests=1
  elif [ "$step" = smoke ]; then smoke=1
  elif [[ $step =~ ^[a-z0-9]+:[1-9][0-9]*$ ]]; then rows+=("$step")
  else echo "gpu_check.sh: a step is bench, tests, smoke or ROW:JOBS (a row of reproduce.sh and its --jobs)," \
            "got $step" >&2
    exit 2
  fi
done
python=${PYTHON:-python3}
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: BUDGET_S must be a whole number of seconds" >&2; exit 2; }
"$python" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('torch'))" 2> /dev/null || {
  echo "gpu_check.sh: '$python' has no torch; set PYTHON=/path/to/python (the README's environment)" >&2; exit 2; }
if [ ${#rows[@]} -gt 0 ]; then  # a row that reproduce.sh does not have: said now, not in its log minutes later
  names=""
  for spec in "${rows[@]}"; do names+="${spec%:*},"; done
  bash reproduce.sh --list --only "${names%,}" > /dev/null || exit 2
fi
mkdir -p "$res"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
log() { echo "$(date '+%T') +$(($(date +%s) - start)) s: $*" | tee -a "$res/steps.log"; }  # shown and kept

log "machine"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name())"
  echo "cpus $(nproc)"
} > "$res/machine.txt" 2>&1
cat "$res/machine.txt"

# torchvision extracts the .gz files on first use: once here, not by six runs at once over each other
log "extracting the datasets"
for d in fashionmnist:FashionMNIST mnist01:MNIST; do  # those carried
  [ -d "data/${d#*:}" ] || continue
  "$python" -c "import vision; vision.load_dataset('${d%:*}', 'data', 'cpu')" >> "$res/data.log" 2>&1
  log "${d%:*}: exit $?"
done

# the estimator alone on the GPU: its figures are ratios timed in one process, but a busy GPU would blur them
if [ -n "$bench" ]; then
  log "bench.py --only estimator,language"
  timeout -k 10 $(($(left) / 4)) "$python" bench.py --device cuda --only estimator,language --out "$res/bench.json" \
    > "$res/bench.log" 2>&1
  log "bench: exit $?"
fi

# the rows, side by side, each with its own reproduce.sh (one log each); stopped 45 s before the budget ends
end=$(($(left) - 45))
in_background() {  # in_background NAME ARGS...: bash reproduce.sh ARGS until the budget ends, into $res/NAME.log
  local name=$1
  shift
  (
    t0=$(date +%s)
    PYTHON=$python timeout -k 20 "$end" bash reproduce.sh "$@" > "$res/$name.log" 2>&1
    log "$name: exit $? after $(($(date +%s) - t0)) s; $(grep -c ': FAILED' "$res/$name.log") run(s) failed"
  ) &
}
if [ "$end" -lt 30 ]; then
  log "no time left for the rows and the tests"
else
  log "rows and tests, $end s"
  for spec in "${rows[@]}"; do
    row=${spec%:*} jobs=${spec#*:}
    in_background "$row" gpu --only "$row" --jobs "$jobs"
  done
  # smoke: its own out folder, inside the packed one (its claims differ from the CPU's stored ones); 4 runs at a time,
  # as reproduce.sh gpu: one per core (16) would take the CPU that the rows' launch-bound steps need
  [ -z "$smoke" ] || in_background smoke smoke --jobs 4 --out "$res/smoke"
  # (pyproject already gives -q: a second would hide the summary line, "3 passed")
  if [ -n "$tests" ]; then  # beside a row, they slow its launch-bound steps (the ViT: 21 ms/step against 14)
    timeout -k 10 "$end" "$python" -m pytest -p no:cacheprovider tests/test_gpu.py > "$res/test_gpu.log" 2>&1
    log "test_gpu: exit $?"
  fi
fi
wait
log "packing"
tar czf "$res.tgz" --exclude='*.pt' "$res" $(ls -d out/vision out/language out/logs 2> /dev/null)
