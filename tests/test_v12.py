"""v12's LL words on a CPU: which shapes take the LL path, the heap it needs, and the packing its kernel does (run by
Triton's interpreter: the device helpers themselves, not a copy) and its reader for tests undoes."""
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tools import check_device

V12 = ROOT / "submissions" / "all2all" / "v12_ll_rows.py"


@pytest.fixture(scope="module")
def v12():
    return check_device.triton_module(V12)


def test_the_two_smallest_benchmark_shapes_take_the_ll_path_and_double_their_rows(v12):
    shapes = check_device.benchmark_shapes()
    chosen = [v12.constants(**shape, world_size=8, trace=False, hip=False)["LL"] for shape in shapes]
    assert chosen == [True, True, False, False, False], list(zip(shapes, chosen))
    plain, ll = (v12.heap_layout(8, 16, 6144, 2, ll) for ll in (False, True))
    assert ll["COMB_Y"] - ll["DISP_X"] == 2 * (plain["COMB_Y"] - plain["DISP_X"])
    assert not v12.low_latency(16, 2, 6147)  # an odd hidden size has no pairs of values


def test_ll_rows_read_back_what_was_packed(v12):
    """ll_rows (dispatched()'s reader) on words packed as the kernel packs them: (epoch << 32) | two fp16 values."""
    x = torch.randn(3, 8, dtype=torch.float16)
    words = (torch.tensor(77, dtype=torch.int64) << 32) | (x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF)
    assert torch.equal(v12.ll_rows(words.view(torch.int32)).view(torch.int16), x.view(torch.int16))


ROUND_TRIP = r"""
import sys
import torch
import triton
import triton.language as tl
from a2a.plan import resolve_version
from tools import check_device

v12 = check_device.triton_module(resolve_version("v12"))


@triton.jit
def round_trip(x_ptr, words_ptr, back_ptr, epoch, PAIRS: tl.constexpr):
    pairs = tl.arange(0, PAIRS)
    words = v12._ll(tl.load(tl.cast(x_ptr, tl.pointer_type(tl.int32)) + pairs), epoch)
    tl.store(words_ptr + pairs, words)
    low, high = v12._halves(words)
    tl.store(tl.cast(back_ptr, tl.pointer_type(tl.int32)) + pairs,
             v12._pair(low.to(tl.float16), high.to(tl.float16)))


x = torch.randn(64, dtype=torch.float16) * 1000
x[:6] = torch.tensor([-0.0, float("inf"), float("-inf"), -65504.0, 6e-8, float("nan")], dtype=torch.float16)
words, back = torch.zeros(32, dtype=torch.int64), torch.zeros(64, dtype=torch.float16)
round_trip[(1,)](x, words, back, 123456, PAIRS=32)
print(torch.equal(back.view(torch.int16), x.view(torch.int16)), bool(((words >> 32) == 123456).all()),
      torch.equal(words & 0xFFFFFFFF, x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF))
"""


def test_an_ll_word_carries_the_epoch_and_gives_back_both_fp16_values_bit_for_bit():
    """_ll, _halves and _pair as the kernel calls them, under Triton's interpreter: every fp16 bit pattern (signed
    zero, infinities, the largest negative, a subnormal, NaN) comes back as it went, the epoch in the high half."""
    done = subprocess.run([sys.executable, "-c", ROUND_TRIP], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "True"], done.stdout + done.stderr[-2000:]
