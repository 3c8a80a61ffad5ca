"""v13 on a CPU: its tiles of rows across ranks and programs under Triton's interpreter (tools/interpret_ranks.py:
the kernel itself, one thread a program, heaps in host memory), full and partial tiles, and calls run free."""

import pytest

from tests.conftest import ROOT, interpret_ranks
from tools import check_device

V13 = ROOT / "submissions" / "all2all" / "v13_row_tiles.py"


def test_every_benchmark_shape_gets_a_tile_of_several_rows_in_32_values_a_thread():
    """The plan: R rows of the hidden size's power of two, at most 32 values a thread of the launch's threads, and
    2 to 8 rows a tile on every benchmark shape."""
    module = check_device.triton_module(V13)
    for shape in check_device.benchmark_shapes():
        found = module.constants(**shape, world_size=8, trace=False, hip=False)
        rows, width = found["R_BLOCK"], found["H_BLOCK"]
        assert rows & (rows - 1) == 0 and 2 <= rows <= 8, (shape, rows)
        assert rows * width <= 32 * module.LAUNCH_SHAPE[1], (shape, rows, width)


@pytest.mark.parametrize("args", [
    pytest.param(("--shape", "64,6,2048,32", "--world-size", "4", "--seed", "1234"), marks=pytest.mark.full),
    ("--shape", "128,4,2880,16", "--world-size", "4", "--programs", "3", "--seed", "9"),
    ("--shape", "6,2,256,8", "--world-size", "3", "--programs", "3", "--seed", "11"),
], ids=["one-program-many-tiles", "partial-tiles", "short-rows"])
def test_ranks_of_v13_give_the_closed_form_under_the_interpreter(args):
    """Every output right and every expert's row count right (a tile's row counted twice or lost would show), no
    wait given up: one program a rank walking 16 tiles of 8 rows; three programs whose shares end mid-tile; a
    hidden size of 256 (8 rows a tile)."""
    code, ranks, stderr = interpret_ranks("v13", *args, "--calls", "2")
    assert code == 0 and ranks, (code, ranks, stderr[-2000:])
    assert all(rank["right"] and rank["counts_right"] and not rank["gave_up"] and not rank["error"]
               for rank in ranks), ranks


@pytest.mark.full  # v14's own test runs free every time (make test-full runs v13's)
def test_calls_run_free_do_not_give_up():
    """Ranks that send each other nothing meet only through the count words; a rank runs a call ahead of its peers.
    v13 keeps the words by call parity (its plan entry). The same command gave up in v10 in 2 of 3 runs on the
    2-core CPU machine (2026-11-28), naming 'the row count from rank 0'."""
    code, ranks, stderr = interpret_ranks("v13", "--local", "--calls", "30", "--world-size", "3", "--programs", "2",
                                     "--shape", "6,2,256,8")
    assert code == 0 and len(ranks) == 3, (code, ranks, stderr[-2000:])
    assert all(rank["right"] and not rank["gave_up"] for rank in ranks), ranks
