#!/usr/bin/env bash
# One GPU session in as few device minutes as possible: build every extension once (in parallel), then run the named
# steps, each with its own time limit and log, and pack logs, results/ and traces/ into one archive.
#
#   tools/gpu_session.sh DIR STEP...          run the steps now; logs under DIR/logs
#   tools/gpu_session.sh DIR start STEP...    run them detached (they outlive this command) and return at once
#   steps: build | tests[:K_EXPRESSION] | sol | leaderboard:VERSIONS[:OPTIONS] | trace:VERSION:CASES | sweep:VERSION |
#          diff:A:B | anatomy:VERSION | wait (until a detached run is done) | pack:DEST (DEST/session.tgz: logs,
#          results/, traces/)
#
# DIR must outlive one device command (the device tool empties $OUT before each, and re-syncs the repository copy,
# which removes files a step wrote into results/ or traces/ there): every output goes under DIR; use a fixed path
# such as /tmp/a2a_session, and `pack:$OUT` in the last command. The device machine returns at most 8 files, hence
# the single archive.
set -uo pipefail
out=$(realpath -m "$1"); shift
cd "$(dirname "$0")/.."
mkdir -p "$out/logs" "$out/results" "$out/traces"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=python3
bundle_path="$PWD:$PWD/problems/all2all:$PWD/reference/all2all:$PWD/reference"

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name: start $(date +%T)" | tee -a "$out/logs/session.log"
  timeout -k 10 "$limit" "$@" > "$out/logs/$name.log" 2>&1
  local code=$?
  echo "== $name: exit $code at $(date +%T)" | tee -a "$out/logs/session.log"
  tail -n 4 "$out/logs/$name.log" | sed 's/^/   /' | tee -a "$out/logs/session.log"
}

build() {  # every load_inline extension, timed and trace builds, in parallel
  local pids=()
  for file in submissions/all2all/v*.py; do
    grep -q load_inline "$file" || continue
    local module=$(basename "$file" .py)
    for trace in 0 1; do
      [ "$trace" = 1 ] && ! grep -q A2A_TRACE "$file" && continue
      (cd submissions/all2all && A2A_TRACE=$trace PYTHONPATH="$bundle_path" $py -c "import $module") \
        > "$out/logs/build_${module}_trace$trace.log" 2>&1 &
      pids+=($!)
    done
  done
  PYTHONPATH="$bundle_path" $py -c "from a2a import probes; probes.extension()" > "$out/logs/build_probes.log" 2>&1 &
  pids+=($!)
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return $failed
}

run_steps() {
  for item in "$@"; do
    IFS=: read -r kind a b <<< "$item"
    case "$kind" in
      build) step build 600 "$0" "$out" _build ;;
      _build) build ;;
      tests) step "tests" 900 $py -m pytest -q -rs tests/test_gpu.py ${a:+-k "$a"} ;;
      sol) step sol 300 $py -m a2a.sol --out "$out/results" ;;
      leaderboard) step "leaderboard_${a//,/-}" 900 $py run_leaderboard.py --versions "$a" --out "$out/results" $b ;;
      trace) step "trace_${a}_${b//[:,]/-}" 400 $py eval.py trace "$a" --cases "$b" --out "$out/traces" ;;
      sweep) step "sweep_$a" 600 $py tools/sweep_launch.py "$a" --out "$out/results" ;;
      diff) step "diff_${a}_$b" 600 $py diff.py "$a" "$b" --out "$out/results" ;;
      anatomy) step "anatomy_$a" 600 $py tools/step_anatomy.py "$a" --cases benchmarks --out "$out/results" ;;
      pack) mkdir -p "$a"; tar czf "$a/session.tgz" -C "$out" logs results traces; ls -la "$a" ;;
      wait) while [ -e "$out/.running" ]; do sleep 2; done; cat "$out/logs/session.log" ;;
      *) echo "unknown step $item" | tee -a "$out/logs/session.log" ;;
    esac
  done
}

if [ "${1:-}" = start ]; then
  shift
  touch "$out/.running"
  setsid bash -c '"$0" "$1" "${@:2}"; rm -f "$1/.running"' "$0" "$out" "$@" > "$out/logs/background.log" 2>&1 \
    < /dev/null &
  echo "started detached: $*"
  exit 0
fi
run_steps "$@"
