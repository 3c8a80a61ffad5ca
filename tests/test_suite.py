"""The suite's own setup: how many pytest-xdist workers `make test` (`-n auto`) starts where."""
import subprocess
import sys

import pytest

import eval as core
from tests import conftest


@pytest.mark.parametrize("cores, gpus, workers", [(2, 0, 3), (16, 0, 3), (1, 0, 0), (16, 1, 0), (2, 8, 0)])
def test_auto_workers_are_three_on_a_cpu_machine_of_two_cores_and_none_beside_gpus(monkeypatch, cores, gpus, workers):
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda _pid: set(range(cores)))
    monkeypatch.setattr(core, "machine_gpus", lambda: gpus)
    assert conftest.pytest_xdist_auto_num_workers(None) == workers


def test_tests_of_one_xdist_group_run_in_one_worker(tmp_path):
    """make test's workers keep a group together (the GPU tests; the device-code tests, which share one run of the
    check). pytest-xdist 3.8 marks a group by rewriting the test's node id, which pytest 9.2 no longer reads: there
    the groups are silently split (pytest-dev/pytest-xdist#1386), hence the Makefile's pytest<9.2."""
    if conftest.pytest_xdist_auto_num_workers(None) == 0:
        pytest.skip("make test runs its tests in one process on this machine (one core, or GPUs): no groups to keep")
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os\nimport pytest\n\n\n@pytest.mark.xdist_group('together')\n@pytest.mark.parametrize('i', "
            f"range(4))\ndef test_{name}(i):\n    with open('workers.txt', 'a') as f:\n"
            "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "."], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, f"one group ran in {sorted(set(workers))}"
