"""v12 on a CPU: which shapes take the LL path, the heap it needs, the packing its kernel does (run by Triton's
interpreter: the device helpers themselves, not a copy) and its reader for tests undoes; and two ranks of it under
the interpreter (tools/interpret_ranks.py), calls run free among them."""
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, interpret_ranks
from tools import check_device

V12 = ROOT / "submissions" / "all2all" / "v12_ll_rows.py"


@pytest.fixture(scope="module")
def v12():
    return check_device.triton_module(V12)


def test_the_two_smallest_benchmark_shapes_take_the_ll_path_and_double_their_rows(v12):
    shapes = check_device.benchmark_shapes()
    chosen = [v12.constants(**shape, world_size=8, trace=False, hip=False)["LL"] for shape in shapes]
    assert chosen == [True, True, False, False, False], list(zip(shapes, chosen))
    ll, plain = v12.heap_layout(8, 16, 6144, 2), v12.heap_layout(8, 16, 2 * v12.LL_MAX_BYTES // (16 * 2 * 2), 2)
    assert ll["COMB_Y"] - ll["DISP_X"] == 2 * 8 * 16 * 6144 * 2  # a row's 6144 fp16 values in 8-byte words, 2 a word
    assert plain["COMB_Y"] - plain["DISP_X"] == 8 * 16 * (2 * v12.LL_MAX_BYTES // (16 * 2 * 2)) * 2
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


@pytest.mark.parametrize("shape", ["8,2,256,8", pytest.param("8,2,8192,64", marks=pytest.mark.full)],
                         ids=["ll-path", "v11-path"])
def test_two_ranks_of_v12_give_the_closed_form_under_the_interpreter(shape):
    """Both of v12's paths across two ranks (threads, heaps in host memory), three calls: every output right, no
    wait given up."""
    code, ranks, stderr = interpret_ranks("v12", "--shape", shape, "--calls", "3")
    assert code == 0 and len(ranks) == 2, (code, ranks, stderr[-2000:])
    assert all(rank["right"] and rank["counts_right"] and not rank["gave_up"] and not rank["error"]
               for rank in ranks), ranks


def test_ranks_of_several_programs_each_give_the_closed_form_under_the_interpreter():
    """Three ranks of three programs each, one thread a program (receiver program q reads each source's program q,
    a rank's programs finish a call before its next one starts), on a record shorter than a program (hidden 256),
    two calls: every output and every expert's row count right (a program that did all its rank's work would count
    each row three times), no wait given up."""
    code, ranks, stderr = interpret_ranks("v12", "--shape", "6,2,256,8", "--world-size", "3", "--programs", "3",
                                     "--calls", "2", "--seed", "11")
    assert code == 0 and len(ranks) == 3, (code, ranks, stderr[-2000:])
    assert all(rank["right"] and rank["counts_right"] and not rank["gave_up"] and not rank["error"]
               for rank in ranks), ranks


@pytest.mark.full  # v14's own test runs free every time; this one keeps what v12 mended (make test-full)
def test_calls_run_free_give_up_in_v11_and_not_in_v12():
    """Ranks that send each other nothing meet only through the range words: rank 0 runs a call ahead and, in v11,
    stores its next word where rank 1 has not yet read this call's, so both wait until they give up. v12 keeps the
    words by call parity (its WORKLOG plan entry). v11 is frozen: this is what the tool sees, and what v12 mends."""
    code, ranks, stderr = interpret_ranks("v12", "--local", "--calls", "10")
    assert code == 0 and all(rank["right"] and not rank["gave_up"] for rank in ranks), (ranks, stderr[-2000:])
    code, ranks, stderr = interpret_ranks("v11", "--local", "--calls", "10", "--give-up-s", "2")
    assert code == 1 and any("waiting for the row count from rank" in (rank["gave_up"] or "") for rank in ranks), \
        (code, ranks, stderr[-2000:])


def test_the_interpreter_tool_refuses_what_it_cannot_run(tmp_path):
    """Bad input, and a file that only names Triton (red team 33: v1 with the comment `# TRITON_KERNELS` ended in a
    raw traceback, exit 1): one line each."""
    named = tmp_path / "named.py"
    named.write_text(ROOT.joinpath("submissions/all2all/v1_torch_sort.py").read_text() + "# TRITON_KERNELS\n")
    broken = tmp_path / "broken.py"
    broken.write_text("# TRITON_KERNELS\nraise RuntimeError('at import\\x1b[2J')\n")
    for args, exit_code in ((["v1"], 113), (["v12", "--shape", "8,2"], 113), (["v12", "--world-size", "3"], 113),
                            (["v12", "--programs", "0"], 113), ([str(named)], 113), ([str(broken)], 112)):
        code, ranks, stderr = interpret_ranks(*args)
        assert code == exit_code and not ranks and len(stderr.strip().splitlines()) == 1, (args, code, stderr)
        assert "Traceback" not in stderr and "\x1b" not in stderr
