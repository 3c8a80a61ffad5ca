#!/usr/bin/env bash
# One GPU call: the judge's latest eval.py on a GPU (human face, protocol face, the clock), world size 1.
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export A2A_NCCL_LIB=/nonexistent A2A_COMMIT=$(cat .gpucheck/commit)
o=${OUT:-/tmp/gpucheck}; mkdir -p $o
s() { local n=$1 l=$2; shift 2; local t0=$(date +%s); timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s" | tee -a $o/progress; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $o/gpu.txt 2>&1
s human_v9 150 python3 eval.py leaderboard v9 --world-size 1 --seed 4242 --cases benchmarks:0,4
s protocol_v8 170 python3 .gpucheck/protocol.py v8 $o
s clock 130 python3 run_leaderboard.py --versions v8,v9 --world-size 1 --no-problem-size --no-anchors --time-cap 30 --out $o/results
tail -40 $o/*.log | cut -c1-220
