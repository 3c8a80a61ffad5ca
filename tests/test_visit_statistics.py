"""tools/visit_statistics.py: each statistic of a visit's steps, per saved run, and how far two runs are apart."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def _saved(folder, steps_by_round: dict) -> str:
    """A saved run of one entry on two shapes: {round: the steps of each of its visits}."""
    folder.mkdir()
    samples = [{"entry": "v1", "case": case, "round": r, "owner": sum(steps) / len(steps), "owner_steps_us": steps}
               for r, steps in steps_by_round.items() for case in (0, 1)]
    (folder / "results.json").write_text(json.dumps({"meta": {}, "entries": {}, "samples": samples}))
    return str(folder)


def _tool(*folders) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "a2a.cli", "visit-statistics", *folders], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_slow_step_moves_the_mean_and_not_the_median(tmp_path):
    steady = _saved(tmp_path / "one", {0: [100.0] * 5, 1: [100.0] * 5})
    tail = _saved(tmp_path / "two", {0: [100.0] * 4 + [600.0], 1: [100.0] * 4 + [600.0]})
    done = _tool(steady, tail)
    assert done.returncode == 0, done.stderr
    lines = {line.split("|")[2].strip(): [cell.strip() for cell in line.split("|")[3:6]]
             for line in done.stdout.splitlines()[2:]}
    assert lines["mean (ranks)"] == ["100", "200", "±33.3%"], done.stdout  # the mean of 4 x 100 and 600
    assert lines["median"] == ["100", "100", "±0.0%"], done.stdout
    assert lines["mean less slowest 20%"] == ["100", "100", "±0.0%"], done.stdout
    assert done.stdout.splitlines()[2].split("|")[2].strip() == "mean (ranks)"  # the ranking statistic first


def test_a_run_without_its_steps_is_refused_in_one_line(tmp_path):
    steady = _saved(tmp_path / "one", {0: [100.0] * 5})
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps({"samples": [{"entry": "v1", "case": 0, "round": 0,
                                                                             "owner": 100.0}]}))
    for folders in ((steady, str(tmp_path / "old")), (steady, str(tmp_path / "none")), (steady,)):
        done = _tool(*folders)
        assert done.returncode == 113 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
