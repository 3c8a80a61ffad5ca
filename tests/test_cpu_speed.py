"""tools/cpu_speed.py: the host's speed CPU by CPU, run for real on this machine's CPUs (small blocks), its folder,
its bad input, and no spinner or fresh process left behind."""
import json
import os
import subprocess
import sys

from eval import EXIT_BAD_INPUT
from tests.conftest import ROOT, saved_in, wait_until_gone


def _run(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "a2a.cli", "cpu-speed", "--out", str(tmp_path), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def test_every_cpu_is_measured_and_the_run_leaves_nothing_running(tmp_path, process_token):
    result = _run(tmp_path, "--passes", "2", "--fresh", "2", "--iterations", "20", "--repeats", "2",
                  env={"A2A_TEST_TOKEN": process_token})
    assert result.returncode == 0, result.stderr[-2000:]
    assert not wait_until_gone(process_token, 20), "a spinner or a fresh process outlived the run"
    (folder,) = saved_in(tmp_path)
    found = json.loads((folder / "cpu_speed.json").read_text())
    cpus = sorted(os.sched_getaffinity(0))
    assert found["cpus"] == cpus and all(len(found["by_cpu"][str(c)]) == 2 for c in cpus)
    assert all(v > 0 for runs in found["by_cpu"].values() for v in runs)
    fresh = list(found["fresh"].values())
    assert fresh and all(len(runs) == 2 and all(v > 0 for v in runs) for runs in fresh), found["fresh"]
    if len(cpus) > 1:
        assert found["loaded"] and all(v > 0 for v in found["loaded"].values()), found["loaded"]
    text = (folder / "cpu_speed.md").read_text()
    assert text.startswith("# Host speed by CPU") and "| CPU |" in text.replace("   ", " ").replace("  ", " ")


def test_bad_settings_are_refused_before_any_work(tmp_path):
    for option in ("--passes", "--iterations", "--repeats"):
        result = _run(tmp_path, option, "0")
        assert result.returncode == EXIT_BAD_INPUT and f"{option} must be at least 1" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not saved_in(tmp_path)
