"""a2a.launch.parallel_launch: results per rank; a failing rank is named; a hanging one is killed in time, with what
it started."""
import multiprocessing.resource_tracker
import re
import subprocess
import time

import pytest

from a2a.launch import LaunchError, parallel_launch
from tests.conftest import wait_until_gone


def _rank_and_size(rank, world_size, offset):
    import torch.distributed as dist

    return rank + offset, world_size, dist.get_rank()


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise KeyError("planted")
    return rank


def _fail_with_a_collective_in_flight(rank, world_size):
    """Rank 0 starts a collective its peer never joins, then fails: tearing its group down waits for that collective,
    as an NCCL rank's does when its peers are still inside one (seen in the GPU suite's group of 8)."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        dist.all_reduce(torch.ones(1), async_op=True)
        raise ValueError("rank zero's own failure")
    time.sleep(3600)


def _hang_on_rank_zero(rank, world_size):
    if rank == 0:
        subprocess.Popen(["sleep", "1000"])
        time.sleep(3600)
    return rank


def test_results_come_back_in_rank_order():
    assert parallel_launch(3, _rank_and_size, 10, backend="gloo") == [(10, 3, 0), (11, 3, 1), (12, 3, 2)]


def test_a_failing_rank_is_named():
    with pytest.raises(LaunchError, match="rank 1 - KeyError: 'planted'"):
        parallel_launch(2, _fail_on_rank_one, backend="gloo")


@pytest.mark.early("waits")
def test_a_failing_rank_is_named_even_when_its_teardown_would_wait_for_its_peers(monkeypatch):
    """The failure reaches the owner before the rank tears its group down, so the owner ends the case after its
    grace for failed peers, naming the failure, instead of waiting for the watchdog with no cause to give. (The
    owner is this process: its grace is shortened from 10 s to 2, which the test waits out.)"""
    import eval as core

    monkeypatch.setattr(core, "FAILED_PEER_GRACE_S", 2.0)
    started = time.monotonic()
    with pytest.raises(LaunchError, match="rank 0 - ValueError: rank zero's own failure"):
        parallel_launch(2, _fail_with_a_collective_in_flight, backend="gloo", timeout_s=120)
    assert time.monotonic() - started < core.FAILED_PEER_GRACE_S + 60


@pytest.mark.early("waits")
def test_a_hanging_rank_is_killed_after_saying_where(process_token, monkeypatch, capfd):
    # multiprocessing's tracker is this test process's own helper, started by its first pool and kept for its life:
    # started before the token (the first pool of a parallel worker may be this test's), it does not carry it.
    multiprocessing.resource_tracker.ensure_running()
    monkeypatch.setenv("A2A_TEST_TOKEN", process_token)  # every rank and what it starts carries it
    started = time.monotonic()
    # The ranks import torch within the case's limit: on a loaded machine (parallel test workers) that alone took
    # more than 5 s, and the watchdog then found them idle, before the hang.
    with pytest.raises(LaunchError, match=r"rank 0 - watchdog: .* \(rank 0 in _hang_on_rank_zero\)"):
        parallel_launch(2, _hang_on_rank_zero, backend="gloo", timeout_s=10)
    assert time.monotonic() - started < 30
    assert not wait_until_gone(process_token, 10), "a rank or its child outlived the launch"
    # Before the kill, the stuck rank said where it stood: its own stack, under a header naming it.
    stderr = capfd.readouterr().err
    said = stderr[stderr.index("[rank0] its stack when the watchdog fired"):]
    assert re.search(r'File ".*test_launch\.py", line \d+ in _hang_on_rank_zero', said), stderr[-2000:]


def _measured(rank, world_size):
    """a2a.bench.measure on gloo: two labels and the floor in mirrored turns, then a run stopped by after_step."""
    import torch

    from a2a import bench

    calls = {"a": 0, "b": 0}

    def counting(label):
        def call(data):
            calls[label] += 1
            return data[0] * (1 + rank)
        return call

    data = (torch.ones(4),)
    mirrored = bench.measure({"a": counting("a"), "b": counting("b"), "floor": None}, data, rank,
                            ["a", "b", "b", "a", "floor"], device_clock=True, call_clock=True)
    warm_and_timed = dict(calls)
    outputs = []
    stopped = bench.measure({"a": counting("a")}, data, rank, ["a"] * 10, warmup=0,
                           before_step=lambda _label: (torch.full((4,), 2.0),),
                           after_step=lambda step: outputs.append(step.output.tolist()) or len(outputs) == 3)
    return warm_and_timed, {k: [len(v.host_ns), len(v.device_ns), len(v.call_ns)] for k, v in mirrored.items()}, \
        len(stopped["a"].host_ns), outputs, mirrored["a"].device_ns


def test_the_one_measuring_loop_warms_up_follows_its_schedule_and_stops_when_told():
    results = parallel_launch(2, _measured, backend="gloo")
    from a2a import bench

    for rank, (calls, lengths, stopped_after, outputs, _) in enumerate(results):
        assert calls == {"a": bench.WARMUP_CALLS + 2, "b": bench.WARMUP_CALLS + 2}  # warm-up, then its 2 steps
        assert lengths == {"a": [2, 2, 2], "b": [2, 2, 2], "floor": [1, 0, 0]}  # the floor has no call to clock
        assert stopped_after == 3 and outputs == [[2.0 * (1 + rank)] * 4] * 3  # before_step's input, stop at 3
    assert results[0][4] == results[1][4], "device times are the slowest rank's, the same on every rank"


def test_no_rank_loop_but_the_measuring_loop_wraps_timed_step():
    """a2a.bench.measure is the only caller of a2a.bench.timed_step in the toolkit."""
    import re

    from tests.conftest import ROOT

    callers = []
    for path in [*ROOT.glob("*.py"), *ROOT.glob("a2a/*.py"), *ROOT.glob("tools/*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\btimed_step\(", line) and not line.lstrip().startswith("def "):
                callers.append(f"{path.name}:{number}")
    assert len(callers) == 1 and callers[0].startswith("bench.py:"), callers


def test_one_line_per_distinct_error_naming_every_rank_it_hit():
    import eval as core

    killed = core.RankFailure("watchdog: case 'x' did not finish in 8 s; rank(s) 0, 2 did not return and were killed")
    results = [core.RankResult(False, killed), core.RankResult(False, core.RankFailure("ValueError: planted")),
               core.RankResult(False, killed), core.RankResult(True, None)]
    lines = core.rank_failures(results).split(" | ")
    assert lines == ["ranks 0, 2 - " + killed.message, "rank 1 - ValueError: planted"], lines


def test_a_copy_of_the_environment_never_carries_another_threads_spawn_settings(monkeypatch):
    """A thread starting a run from a copy of os.environ while another spawns ranks with MPS and NCCL settings (the
    GPU suite's runs beside its group of 8) gets the environment before or after, never the spawn's."""
    import threading

    import eval as core

    monkeypatch.delenv("A2A_SPAWN_ONLY", raising=False)
    inside, leave = threading.Event(), threading.Event()

    def spawning():
        with core.environment_with({"A2A_SPAWN_ONLY": "1"}):
            inside.set()
            leave.wait(5)

    spawner = threading.Thread(target=spawning)
    spawner.start()
    inside.wait(5)
    copies = []
    copier = threading.Thread(target=lambda: copies.append(core.environ_with({"A2A_OWN": "1"})))
    copier.start()
    copier.join(0.5)
    assert copies == [], "a copy was taken while another thread had os.environ changed"
    leave.set()
    spawner.join()
    copier.join(5)
    assert copies and "A2A_SPAWN_ONLY" not in copies[0] and copies[0]["A2A_OWN"] == "1", copies
