"""tools/launch_floor.py on a CPU: the table and the lines under it from hand-made figures, the slowest-rank
reduction, the METH_FASTCALL extension driven with a recorder where the driver's launch goes, and the one skipped
line without a GPU."""
import ctypes
import subprocess
import sys

import pytest

from tests.conftest import ROOT, gpu_count
from tools import launch_floor

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_void_p)


def row(world_size: int, path: str, base: float, unheld: int = 0) -> dict:
    figures = {"enqueue": (base, base + 1), "call": (base + 5, base + 7), "held": (base / 2, base / 2 + 0.5)}
    return {"world_size": world_size, "path": path, "warm": {**figures, "unheld": 0},
            "step": {name: (low * 3, high * 3) for name, (low, high) in figures.items()} | {"unheld": unheld}}


def test_the_table_has_a_row_per_path_and_each_figure_as_p50_over_p90():
    text = launch_floor.table([row(1, "graph", 2.0), row(2, "handshake", 4.0)])
    lines = text.splitlines()
    assert lines[0].count("|") == 2 + 2 * len(launch_floor.FIGURES) + 1
    assert "enqueue µs, warm loop" in lines[0] and "held µs, timed step" in lines[0]
    assert lines[2] == ("| 1 | CUDA graph replay (`CUDAGraph.replay()`) | 2.0 / 3.0 | 7.0 / 9.0 | 1.0 / 1.5 | "
                        "6.0 / 9.0 | 21.0 / 27.0 | 3.0 / 4.5 |")
    assert lines[3].startswith("| 2 | handshake (a2a.probes, pybind11, one block) | 4.0 / 5.0 |")


def test_the_handshake_is_read_against_its_launch_path():
    lines = launch_floor.handshake_beyond_its_path([row(1, "pybind", 4.0), row(1, "handshake", 6.0),
                                                    row(2, "handshake", 6.0)])
    assert lines == ["world size 1: the handshake minus the pybind11 entry's empty kernel (p50 µs): warm loop "
                     "call +2.0 / held +1.0, timed step call +6.0 / held +3.0"]


def test_samples_the_spin_did_not_hold_are_named():
    lines = launch_floor.unheld_lines([row(1, "triton", 10.0, unheld=3), row(1, "graph", 2.0)])
    assert len(lines) == 1 and "Triton's launcher" in lines[0] and "3 step sample(s)" in lines[0]


def test_figures_are_the_slowest_ranks():
    fast = {"samples": {"enqueue": [1.0] * 5, "call": [2.0] * 5, "held": [1.0] * 5}, "unheld": 0}
    slow = {"samples": {"enqueue": [3.0] * 5, "call": [1.0] * 5, "held": [4.0] * 5}, "unheld": 2}
    warm = launch_floor._warm_figures([fast, slow])
    assert warm == {"enqueue": (3.0, 3.0), "call": (2.0, 2.0), "held": (4.0, 4.0), "unheld": 2}
    # timed steps pair up across ranks: per step the larger, then the quantiles
    step = launch_floor._step_figures([5000.0, 7000.0], [{"enqueue": [1.0, 9.0], "held": [2.0, 2.0], "unheld": 0},
                                                         {"enqueue": [3.0, 1.0], "held": [1.0, 5.0], "unheld": 1}])
    assert step["enqueue"][0] == 6.0 and step["held"][0] == 3.5 and step["call"][0] == 6.0 and step["unheld"] == 1


@pytest.fixture(scope="module")
def fastcall():
    return launch_floor.fastcall_extension()


def test_the_fastcall_entry_launches_what_it_was_set_up_with(fastcall):
    launches, device_calls, code = [], [], [0]

    def record(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        launches.append((function, gx, bx, shared, stream, params, extra))
        return code[0]

    launcher = LAUNCH(record)
    params = (ctypes.c_void_p * 1)()
    fastcall.setup(ctypes.cast(launcher, ctypes.c_void_p).value, 0x1234, ctypes.addressof(params), 32, 0, 0xAB0, 3,
                   lambda index: device_calls.append(("exchange", index)) or 0,
                   lambda previous: device_calls.append(("restore", previous)),
                   lambda index: device_calls.append(("stream", index)) or 0xCD0)
    assert fastcall.launch(("the step's data",)) is None  # called as custom_kernel is
    assert launches[-1] == (0x1234, 1, 32, 0, 0xAB0, ctypes.addressof(params), None) and not device_calls
    fastcall.launch_bound(("the step's data",))
    assert launches[-1][4] == 0xCD0 and device_calls == [("exchange", 3), ("stream", 3), ("restore", 0)]
    code[0] = 1
    with pytest.raises(RuntimeError, match="launch failed: error 1"):
        fastcall.launch_bound()
    assert device_calls[-1] == ("restore", 0)


@pytest.mark.skipif(gpu_count() > 0, reason="the skipped line is what a machine without a GPU prints")
def test_without_a_gpu_it_prints_one_skipped_line_and_succeeds():
    done = subprocess.run([sys.executable, "-m", "tools.launch_floor"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == ["skipped: the launch floor needs a GPU (this machine has none)"]


def test_bad_arguments_are_bad_input():
    done = subprocess.run([sys.executable, "-m", "tools.launch_floor", "--world-size", "one"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 113 and "--world-size one" in done.stderr
