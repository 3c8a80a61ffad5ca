"""The suite's own setup: how many pytest-xdist workers `make test` (`-n auto`) starts where."""
import re
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


def test_the_suite_reports_the_hosts_speed_and_its_own_cpu_workers_included(tmp_path):
    """The summary's CPU, which counts the workers' (each test below spins 3 CPU s in one), and the host's loop:
    a slow run reads as the machine's hour or the suite's own growth (2026-11-30: 732 s, then 900 s an hour later)."""
    (tmp_path / "test_spin.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.mark.parametrize('i', range(2))\ndef test_spin(i):\n"
        "    started = time.process_time()\n    while time.process_time() - started < 3:\n        pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "tests.conftest", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)], cwd=conftest.ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = re.search(r"the suite: ([0-9]+) CPU s in ([0-9]+) s.*loop took ([0-9.]+) CPU s", done.stdout)
    assert said and float(said[1]) >= 6, done.stdout[-2000:]  # the workers' spin counted
    assert 0 < float(said[3]) < 60, done.stdout[-2000:]
