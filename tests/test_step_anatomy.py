"""tools/step_anatomy.py's summary on hand-made stamps: the step decomposes into the named waits."""
import subprocess
import sys

import pytest

from a2a.launch import SubmissionFailed
from tests.conftest import ROOT, reachable, v1_kernel_source
from tools.step_anatomy import summarise


def step(start, cloned, returned, synced, passed, device_ns=0.0, call=True):
    return {"call": call, "stamps": [start, cloned, returned, synced, passed], "device_ns": device_ns}


def test_summary_names_lag_waits_and_the_remainder():
    # rank 1 leaves the first barrier 20 µs after rank 0; its call's device time is 50 µs, rank 0's 60 µs
    rank0 = [step(0, 5_000, 15_000, 70_000, 100_000, 60_000), step(0, 5_000, 5_000, 6_000, 30_000, call=False)]
    rank1 = [step(20_000, 25_000, 30_000, 80_000, 100_000, 50_000), step(10_000, 15_000, 15_000, 16_000, 30_000,
                                                                         call=False)]
    summary = summarise([rank0, rank1])
    assert summary["step"] == 100.0 and summary["floor"] == 30.0 and summary["device"] == 60.0
    assert summary["start_lag"] == 20.0 and summary["call_host"] == 10.0 and summary["sync_wait"] == 55.0
    assert summary["barrier_wait"] == 30.0 and summary["step - floor - device"] == 10.0


@pytest.mark.parametrize("returned", [
    [[], []],  # the steps emptied (red team 33: `no median for empty data`, exit 114)
    "steps",
    [[step(0, 1, 2, 3, 4)], [step(0, 1, 2, 3, 4)]],  # no floor step
    [[step(0, 1, 2, 3, 4), step(0, 1, 2, 3, 4, call=False)], [step(0, 1, 2, 3, 4)]],  # ranks disagree
    [[step(0, 1, 2, 3, 4), {"call": False, "stamps": [0, 1, 2], "device_ns": 0.0}]],
    [[step(0, 1, 2, 3, "4"), step(0, 1, 2, 3, 4, call=False)]],
    [[step(0, 1, 2, 3, 4, device_ns=float("nan")), step(0, 1, 2, 3, 4, call=False)]],
], ids=["empty", "text", "no-floor", "ranks-disagree", "short-stamps", "text-stamp", "nan-device"])
def test_what_the_ranks_return_is_checked_before_the_summary(returned):
    """The steps come from the ranks, where the submission runs: any that do not fit are its failure (112)."""
    with pytest.raises(SubmissionFailed):
        summarise(returned)


EMPTIED = '''
from a2a import bench


def _measure(*args, **kwargs):
    return None


bench.measure = _measure
'''


def test_a_submission_that_empties_the_anatomy_fails_with_112(tmp_path):
    """A submission that replaces a2a.bench.measure in its ranks (red team 33): one line naming the shape it broke,
    exit 112, not the harness's 114."""
    path = reachable(tmp_path) / "emptied.py"
    path.write_text(v1_kernel_source("custom_kernel") + EMPTIED)
    done = subprocess.run([sys.executable, "-m", "tools.step_anatomy", str(path), "--world-size", "2", "--backend",
                           "gloo", "--cases", "benchmarks:0", "--iterations", "2", "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 112 and "do not fit the anatomy's shape" in done.stderr, done.stdout + done.stderr
    assert "internal error" not in done.stderr
