"""launch.parallel_launch: results per rank; a failing rank is named; a hanging one is killed in time, with what
it started."""
import subprocess
import time

import pytest

from launch import LaunchError, parallel_launch
from tests.conftest import wait_until_gone


def _rank_and_size(rank, world_size, offset):
    import torch.distributed as dist

    return rank + offset, world_size, dist.get_rank()


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise KeyError("planted")
    return rank


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


def test_a_hanging_rank_is_killed(process_token, monkeypatch):
    monkeypatch.setenv("A2A_TEST_TOKEN", process_token)  # every rank and what it starts carries it
    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"rank 0 - watchdog: .* \(rank 0 in _hang_on_rank_zero\)"):
        parallel_launch(2, _hang_on_rank_zero, backend="gloo", timeout_s=5)
    assert time.monotonic() - started < 30
    assert not wait_until_gone(process_token, 10), "a rank or its child outlived the launch"
