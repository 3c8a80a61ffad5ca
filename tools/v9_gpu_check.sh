#!/usr/bin/env bash
# v9's first GPU session (issue #39), one device command of at most 8 minutes on one GPU, in priority order:
#   cpu_tests         v9's and the launch floor's CPU tests, built with this machine's Python and torch
#   tests             the 9 official tests at world size 1 (each its own group: the entry unbound and rebound), the
#                     first on empty extension and Triton caches (a cold start)
#   launch_floor      tools/launch_floor.py at world sizes 1 and 2 (2 is skipped where ranks cannot share the GPU)
#   diff              v8 against v9 on the judge's clock (4 rounds of fresh processes, 4 steps of each kind per
#                     visit, the benchmark shapes): call time, held device time, leaderboard-style
#   leaderboard_mode  a fresh input, hence a fresh cfg object, every call, each output checked
#   sweep             launch shapes of v9 (configure() rebinds the native entry), outputs bit-identical
# Each step has its own time limit and all share one deadline (BUDGET_S, default 460 s); a step that no longer fits
# is skipped and says so. Logs and results land in $OUT/v9_gpu_check.tgz, the step summary in $OUT/summary.log.
#
#   OUT=/folder A2A_COMMIT=<commit> bash tools/v9_gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to the folder that comes back}
work=$(mktemp -d /tmp/a2a_v9.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/logs" "$work/results"
mkdir -m 1777 "$work/extensions" "$work/triton"  # ranks may run under another uid (eval's sandbox): theirs too
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_EXTENSIONS_DIR="$work/extensions" TRITON_CACHE_DIR="$work/triton"  # empty: the first case builds
deadline=$(($(date +%s) + ${BUDGET_S:-460}))
summary="$work/logs/summary.log"

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 left code
  shift 2
  left=$((deadline - $(date +%s) - 20))  # 20 s kept for the kill grace and the archive
  if [ "$left" -lt 30 ]; then
    echo "== $name: skipped, ${left} s left of the budget" | tee -a "$summary"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name: start $(date +%T), limit ${limit} s: $*" | tee -a "$summary"
  timeout -k 10 "$limit" "$@" > "$work/logs/$name.log" 2>&1
  code=$?
  echo "== $name: exit $code at $(date +%T)" | tee -a "$summary"
  tail -n 20 "$work/logs/$name.log" | sed 's/^/   /' | tee -a "$summary"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$summary" 2>&1
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__)' >> "$summary" 2>&1
# Its own extension cache: a build folder made by this user would refuse the ranks' uid its lock file.
step cpu_tests 90 env TORCH_EXTENSIONS_DIR="$work/cpu_extensions" python3 -m pytest -q tests/test_v9.py \
  tests/test_launch_floor.py
step tests 200 python3 eval.py test v9 --world-size 1
step launch_floor 200 python3 -m tools.launch_floor --world-size 1,2 --out "$work/results"
step diff 200 python3 diff.py v8 v9 --world-size 1 --rounds 4 --steps 4 --out "$work/results"
step leaderboard_mode 120 python3 eval.py leaderboard v9 --world-size 1 --cases benchmarks
step sweep 100 python3 -m tools.sweep_launch v9 --world-size 1 --cases benchmarks:0 --iterations 5 \
  --out "$work/results"
tar czf "$out/v9_gpu_check.tgz" -C "$work" logs results
cp "$summary" "$out/summary.log"
