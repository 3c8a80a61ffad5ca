#!/usr/bin/env bash
# Two of #38's attacks on a GPU (world size 1): Event.elapsed_time divided by 100 at import, and zeros in every
# third timed call; against plain v1 in the same call.
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export A2A_NCCL_LIB=/nonexistent A2A_COMMIT=$(cat .gpucheck/commit)
o=${OUT:-/tmp/gpucheck}; mkdir -p $o; h=/tmp/hostile; mkdir -p $h
v1=submissions/all2all/v1_torch_sort.py
sed 's/^def custom_kernel(/def _v1_kernel(/' $v1 > $h/base.py
{ cat $h/base.py; cat <<'PY'

import torch
_real_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _real_elapsed(self, end) / 100


def custom_kernel(data):
    return _v1_kernel(data)
PY
} > $h/event_div100.py
{ cat $h/base.py; cat <<'PY'

import torch
_calls = [0]


def custom_kernel(data):
    _calls[0] += 1
    out = _v1_kernel(data)
    return torch.zeros_like(out) if _calls[0] > 1 and _calls[0] % 3 == 0 else out
PY
} > $h/zeros_third.py
s() { local n=$1 l=$2; shift 2; local t0=$(date +%s); timeout -k 5 $l "$@" > $o/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s" | tee -a $o/progress; }
for mode in benchmark leaderboard; do
  s v1_$mode 60 python3 eval.py $mode v1 --world-size 1 --cases benchmarks:0,4 --seed 99
  s event_$mode 60 python3 eval.py $mode $h/event_div100.py --world-size 1 --cases benchmarks:0,4 --seed 99
  s zeros_$mode 60 python3 eval.py $mode $h/zeros_third.py --world-size 1 --cases benchmarks:0,4 --seed 99
done
for f in $o/*.log; do echo "== $f"; grep -E "^\|  |geomean|void|error|fail" $f | cut -c1-230 | head -8; done
