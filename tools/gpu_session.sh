#!/usr/bin/env bash
# One GPU session in as few device minutes as possible: build every extension once (in parallel), then run the named
# steps (each a command of a2a/cli.py's COMMANDS), each with its own time limit and log, and pack logs, results/ and
# traces/ into one archive.
#
#   tools/gpu_session.sh DIR STEP...          run the steps now; logs under DIR/logs
#   tools/gpu_session.sh DIR start STEP...    run them detached (they outlive this command) and return at once
#   tools/gpu_session.sh DIR check STEP...    only check the step list (113 on a bad one), touching nothing: run it
#                                             here before a device call (a refused list lost a call's minutes)
#   steps: cold:VERSIONS (each version's first case on an empty extension cache, or Triton cache for a Triton
#          version, all ranks importing at once, as on the leaderboard; run it first on a fresh machine) |
#          build[:FILES] (every extension not built yet, timed and trace builds, in parallel; FILES: comma-separated
#          submission files, default every version) |
#          tests[:K_EXPRESSION] (the whole GPU file) | test_gpu (`make test-gpu`: the GPU file less `full`) | sol |
#          leaderboard:VERSIONS[:OPTIONS] | trace:VERSION:CASES | sweep:VERSION |
#          eval:MODE:VERSION[:OPTIONS] (the human face, e.g. eval:leaderboard:v9:--world-size 4 --cases benchmarks:0) |
#          env (this machine: GPUs, driver, compilers, CUDA, torch, Triton, NCCL, into logs/env.log) |
#          diff:A:B | anatomy:VERSION | ideas:SCRATCH[:SETS] (tools/compare_ideas.py against v5; IDEAS_BLOCK) |
#          nccl (tools/build_nccl.sh: NCCL 2.30+ for ranks sharing a GPU; NCCL_SRC names a source archive) |
#          sm_share:WORLD[:PERCENTS] (tools/sm_share.py) |
#          runner:VERSIONS[:OPTIONS] (gpu-mode's own evaluator beside ours, tools/runner_face.py; carry build/runner) |
#          cpus (tools/cpu_speed.py: the host's speed CPU by CPU, about 30 s; before choosing A2A_PIN_CPUS and
#          A2A_PIN_OWNER_CPU) |
#          set:A2A_NAME=VALUE (exported to the steps after it, and named in their logs' names; an empty VALUE unsets it:
#          e.g. set:A2A_STEP_ANATOMY=1 set:A2A_OWNER_GPU=next) |
#          wait[:SECONDS] (until a detached run is done, or at most SECONDS) | pack:DEST
#          (DEST/session.tgz: logs, results/, traces/)
#
# Poll a detached run with a bounded wait and pack in the same command, well inside the call's limit:
#   tools/gpu_session.sh DIR wait:520 pack:$OUT
# A command killed at the call's limit never packs, and a machine can be gone by the next call (2026-11-28: a
# world-size-4 run of 10 minutes came back with nothing).
#
# DIR must outlive one device command (the device tool empties $OUT before each, and re-syncs the repository copy,
# which removes files a step wrote into results/ or traces/ there): every output goes under DIR; use a fixed path
# such as /tmp/a2a_session, and `pack:$OUT` in the last command. The device machine returns at most 8 files, hence
# the single archive.
# Export A2A_COMMIT=<the commit being measured> in the device command: the tree travels with a stale .git, so
# without it results are labelled with an older commit and '-dirty' (seen 2026-11-22: 07249e2-dirty for 630334a).
set -uo pipefail
KNOWN="set cold build _build _cold tests test_gpu sol leaderboard eval env trace sweep diff anatomy ideas nccl sm_share runner cpus pack wait start"
if [ $# -lt 2 ] || [ -z "$1" ]; then
  echo "usage: tools/gpu_session.sh DIR [start|check] STEP... (a folder for logs and a step at least)" >&2; exit 113
fi
checking=; [ "$2" = check ] && checking=1
for item in "${@:$((2 + ${checking:-0}))}"; do  # every step known before anything runs (README's exit codes: 113 for bad input)
  case " $KNOWN " in *" ${item%%:*} "*) ;; *) echo "tools/gpu_session.sh: unknown step '$item'" >&2; exit 113 ;; esac
  if [[ "$item" == wait:* && ! "$item" =~ ^wait:[1-9][0-9]*$ ]]; then
    echo "tools/gpu_session.sh: '$item': wait takes a number of seconds (wait:520)" >&2; exit 113
  fi
  if [[ "$item" == set:* && ! "$item" =~ ^set:A2A_[A-Z0-9_]+= ]]; then
    echo "tools/gpu_session.sh: '$item' sets no A2A_ variable (set:A2A_NAME=VALUE)" >&2; exit 113
  fi
done
if [ -n "$checking" ]; then
  # A `tests:` expression's every `or` term (the whole of one with parentheses) must select a test (2026-11-28:
  # `free_running` selected none, unseen among the 22 the other terms did). Collecting needs no GPU.
  collect=python3; [ -x "$(dirname "$0")/../.venv/bin/python" ] && collect="$(dirname "$0")/../.venv/bin/python"
  for item in "${@:3}"; do
    [[ "$item" == tests:* ]] || continue
    expression=${item#tests:}
    while read -r term; do
      [ -n "$term" ] || continue
      selected=$(cd "$(dirname "$0")/.." && "$collect" -m pytest --collect-only -q -p no:cacheprovider \
                 tests/test_gpu.py -k "$term" 2>/dev/null | grep -c '::')
      if [ "$selected" -eq 0 ]; then
        echo "tools/gpu_session.sh: '$item': '$term' selects no test of tests/test_gpu.py" >&2; exit 113
      fi
    done <<< "$(if [[ "$expression" == *[\(\)]* ]]; then echo "$expression"; else sed 's/ or /\n/g' <<< "$expression"; fi)"
  done
  echo "tools/gpu_session.sh: ${*:3} (every step known)"; exit 0
fi
out=$(realpath -m "$1"); shift
cd "$(dirname "$0")/.."
# A machine lent again may keep an earlier session's DIR (seen 2026-11-27: its logs and results went into the next
# session's archive). A DIR first used more than 4 hours ago (a session is 3) is moved aside, not packed.
if [ -e "$out/.first_used" ] && [ -n "$(find "$out/.first_used" -mmin +240)" ]; then
  aside="$out.earlier.$(date -r "$out/.first_used" +%Y%m%d%H%M%S)"
  mv "$out" "$aside" && echo "$out was an earlier session's (first used $(date -r "$aside/.first_used")): moved to $aside"
fi
mkdir -p "$out/logs" "$out/results" "$out/traces"
[ -e "$out/.first_used" ] || touch "$out/.first_used"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# One extension cache and one Triton cache for the session, under DIR: empty on a fresh machine, so `cold` measures
# real cold starts and everything after reuses their builds.
export TORCH_EXTENSIONS_DIR="$out/extensions" TRITON_CACHE_DIR="$out/triton"
py=python3

tag=""  # the set: variables in force, in the steps' log names
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1$tag limit=$2 n=2; shift 2
  while [ -e "$out/logs/$name.log" ]; do name=${name%_run[0-9]*}_run$n; n=$((n + 1)); done  # a rerun keeps the first's log
  echo "== $name: start $(date +%T)" | tee -a "$out/logs/session.log"
  timeout -k 10 "$limit" "$@" > "$out/logs/$name.log" 2>&1
  local code=$?
  echo "== $name: exit $code at $(date +%T)" | tee -a "$out/logs/session.log"
  tail -n 4 "$out/logs/$name.log" | sed 's/^/   /' | tee -a "$out/logs/session.log"
}

build() {  # load_inline extensions, timed and trace builds, in parallel (a2a.plan.prebuild); $1: files or empty
  $py - "${1:-}" <<'PY'
import sys
from pathlib import Path
from a2a import plan
versions = [Path(f).resolve() for f in sys.argv[1].split(",") if f] or plan.list_versions()
failures = plan.prebuild(versions)
print("\n".join(failures) or "built every extension")
sys.exit(1 if failures else 0)
PY
}

cold() {  # cold VERSION: its first official test on an empty extension cache, every rank importing at once
  local file=$(ls submissions/all2all/"$1"_*.py) name
  name=$(grep -o 'name="a2a_[a-z0-9_]*"' "$file" | head -1 | cut -d'"' -f2)
  if [ -n "$name" ] && [ -e "$TORCH_EXTENSIONS_DIR/$name" ]; then echo "not a cold start: $name is already built"; return 1; fi
  if [ -z "$name" ] && [ -n "$(ls -A "$TRITON_CACHE_DIR" 2>/dev/null)" ]; then
    echo "not a cold start: Triton's cache ($TRITON_CACHE_DIR) is not empty"; return 1; fi
  $py -m a2a.cli eval test "$1" --cases tests:0
}

run_steps() {
  for item in "$@"; do
    IFS=: read -r kind a b <<< "$item"
    case "$kind" in
      set) local var=${item#set:}; local value=${var#*=}; var=${var%%=*}
           if [ -n "$value" ]; then export "$var=$value"; else unset "$var"; fi
           tag=$(env | grep -E '^A2A_' | grep -v '^A2A_COMMIT=' | sort | sed 's/^A2A_/_/; s/=/-/' | tr -c 'A-Za-z0-9_\n-' '-' | tr -d '\n')
           echo "== set $var=$value" | tee -a "$out/logs/session.log" ;;
      build) step build 600 "$0" "$out" "_build:$a" ;;
      _build) build "$a" ;;
      cold) for v in ${a//,/ }; do step "cold_$v" 300 "$0" "$out" "_cold:$v"; done ;;
      _cold) cold "$a" ;;
      # the whole suite at world size 8 on one H100 at 8% takes about 27 min (2026-11-24): more than a lent machine
      # holds with its start and the build, so there it runs in two parts by K (docs/sharing.md, the GPU suite)
      tests) step "tests" 2400 $py -m pytest -q -rsP --durations=20 tests/test_gpu.py ${a:+-k "$a"} ;;
      test_gpu) step "test_gpu" 1200 $py -m pytest -q -rsP --durations=20 -m "not full" tests/test_gpu.py ;;
      sol) step sol 300 $py -m a2a.cli sol --out "$out/results" ;;
      # every version with anchors at world size 4 and the world-size-8 checks after it: more than 900 s is possible
      leaderboard) step "leaderboard_${a//,/-}" 1500 $py -m a2a.cli leaderboard --versions "$a" --out "$out/results" $b ;;
      eval) IFS=: read -r _ mode version options <<< "$item"
            step "eval_${mode}_${version}_$(echo "$options" | tr -c 'a-z0-9' '-' | cut -c1-40)" 600 \
              $py -m a2a.cli eval "$mode" "$version" $options ;;
      env) { nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1; uname -r
             for cc in "$(command -v c++)" "$(command -v g++)" /opt/gcc/bin/g++; do [ -x "$cc" ] && echo "$cc: $($cc --version | head -1)"; done
             nvcc --version | tail -2; "$py" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "triton", triton.__version__)'
             # the host's shape: which cores are near which GPU (a rank's host work is part of every timed step)
             lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA)'; nvidia-smi topo -m
           } > "$out/logs/env.log" 2>&1; cat "$out/logs/env.log" ;;
      trace) step "trace_$(basename "$a" .py)_${b//[:,]/-}" 400 \
               $py -m a2a.cli eval trace "$a" --cases "$b" --out "$out/traces" ;;
      sweep) step "sweep_$a" 600 $py -m a2a.cli sweep "$a" --out "$out/results" ;;
      diff) step "diff_${a}_$b" 600 $py -m a2a.cli diff "$a" "$b" --out "$out/results" ;;
      anatomy) step "anatomy_$a" 600 $py -m a2a.cli anatomy "$a" --cases benchmarks --out "$out/results" ;;
      ideas) step "ideas_$(basename "$a" .py)" 900 $py -m a2a.cli ideas "$a" --sets "$b" --iterations 100 \
               --block "${IDEAS_BLOCK:-1}" --out "$out/results" ;;
      nccl) step nccl 900 tools/build_nccl.sh ;;
      runner) step "runner_face_${a//,/-}" 1800 $py -m a2a.cli runner-face --versions "$a" --out "$out/results" $b ;;
      cpus) step cpus 300 $py -m a2a.cli cpu-speed --out "$out/results" ;;
      sm_share) step "sm_share_$a" 1500 $py -m a2a.cli sm-share --world-size "$a" ${b:+--percents "$b"} --out "$out/results" ;;
      pack) mkdir -p "$a"; tar czf "$a/session.tgz" -C "$out" logs results traces; ls -la "$a" ;;
      wait) local until=$((SECONDS + ${a:-1000000}))
            while [ -e "$out/.running" ] && [ $SECONDS -lt $until ]; do sleep 2; done
            [ -e "$out/.running" ] && echo "== still running after ${a}s (wait:$a): packing what is done"
            cat "$out/logs/session.log" ;;
      *) echo "unknown step $item" | tee -a "$out/logs/session.log"; return 113 ;;
    esac
  done
}

if [ "${1:-}" = start ]; then
  shift
  # NOTES: a detached run works from its own copy of the tree. The device tool re-syncs the repository's copy at
  # every call, and a rank importing meanwhile failed (2026-11-29: "cannot import name 'probes' from 'a2a'" in
  # round 5 of a clock run, at the moment the polling call began).
  rm -rf "$out/tree" && mkdir "$out/tree" &&
    tar -C . --exclude=./.git --exclude=./results --exclude=./traces --exclude=./.venv -cf - . | tar -C "$out/tree" -xf - ||
    { echo "tools/gpu_session.sh: could not copy the tree into $out/tree" >&2; exit 114; }
  touch "$out/.running"
  setsid bash -c '"$0" "$1" "${@:2}"; rm -f "$1/.running"' "$out/tree/tools/gpu_session.sh" "$out" "$@" \
    > "$out/logs/background.log" 2>&1 < /dev/null &
  echo "started detached: $*"
  exit 0
fi
run_steps "$@"
