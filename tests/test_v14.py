"""v14 on a CPU: its own-rank rows kept inside the program that routed them, under Triton's interpreter across ranks
(tools/interpret_ranks.py), and its compiled code at world size 1, where no flag is left."""
import re

import pytest

from tests.conftest import ROOT, interpret_ranks
from tools import check_device

V14 = ROOT / "submissions" / "all2all" / "v14_self_rows.py"
MISSING = check_device.missing_tools()


@pytest.mark.parametrize("args", [
    ("--shape", "64,6,256,8", "--world-size", "1", "--programs", "3", "--seed", "5"),
    pytest.param(("--shape", "64,6,512,32", "--world-size", "4", "--seed", "1234"), marks=pytest.mark.full),
    ("--shape", "6,2,256,8", "--world-size", "3", "--programs", "3", "--seed", "11"),
    pytest.param(("--shape", "8,2,256,16", "--world-size", "2", "--programs", "5", "--seed", "3"),
                 marks=pytest.mark.full),
], ids=["alone-three-programs", "four-ranks", "three-ranks-three-programs", "more-programs-than-some-ranks-tokens"])
def test_ranks_of_v14_give_the_closed_form_under_the_interpreter(args):
    """Every output and every expert's row count right, no wait given up: a token's own-rank row is reduced by the
    program that sent and received it, whichever program that is (a token reduced by another program would read a
    row nobody has stored yet, and no flag would say so)."""
    code, ranks, stderr = interpret_ranks("v14", *args, "--calls", "2")
    assert code == 0 and ranks, (code, ranks, stderr[-2000:])
    assert all(rank["right"] and rank["counts_right"] and not rank["gave_up"] and not rank["error"]
               for rank in ranks), ranks


def test_calls_run_free_do_not_give_up():
    """Ranks that send each other nothing meet only through their range words, and a rank runs a call ahead of its
    peers. v14 keeps the words by call parity (its plan entry); v11, which does not, gave up here under the same
    command (2026-11-29: 'waiting for the row count from rank 1 (call 7)')."""
    code, ranks, stderr = interpret_ranks("v14", "--local", "--calls", "30", "--world-size", "3", "--programs", "2",
                                     "--shape", "6,2,256,8")
    assert code == 0 and len(ranks) == 3, (code, ranks, stderr[-2000:])
    assert all(rank["right"] and not rank["gave_up"] for rank in ranks), ranks


SYSTEM_SCOPE_PTX = re.compile(r"\b(?:fence|membar|atom|red|ld|st)\.[\w.]*sys\b")


@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} ({check_device.INSTALL_HINT})")
@pytest.mark.parametrize("target", ["sm_90", *check_device.AMD_TARGETS])
def test_alone_it_compiles_no_flag_and_with_peers_it_does(target):
    """At world size 1 the kernel holds no system-scope release, acquire or poll on any target, only its two
    drained barriers (AMD); at world size 8 it publishes and waits as v11 does. A copy that compiled its waits or
    releases for the own rank would show them at world size 1."""
    module = check_device.triton_module(V14)
    shape = check_device.benchmark_shapes()[0]
    for world_size in (1, 8):
        build = check_device.triton_compile(module, "all2all_kernel", target, shape, False, world_size=world_size)
        if target.startswith("sm_"):
            found = len(SYSTEM_SCOPE_PTX.findall(build.asm["ptx"]))
        else:
            counts = check_device.memory_model(build.asm["amdgcn"])
            found = counts["release"] + counts["acquire"] + counts["poll"]
            assert counts["drain"] >= 2, counts
        assert (found == 0) == (world_size == 1), (world_size, found)
