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


def _saved_entries(folder, entries: dict) -> str:
    """A saved run of several entries: {entry: {round: (the cases it visited, the steps of each visit)}}."""
    folder.mkdir()
    samples = [{"entry": entry, "case": case, "round": r, "owner": steps[0], "owner_steps_us": steps}
               for entry, by_round in entries.items() for r, (cases, steps) in by_round.items() for case in cases]
    (folder / "results.json").write_text(json.dumps({"meta": {}, "entries": {}, "samples": samples}))
    return str(folder)


def test_an_entry_name_from_a_file_is_shown_escaped(tmp_path):
    """Red team 39: an entry named with ESC and CR reached the terminal raw (a cleared screen, a forged row)."""
    name = "v1\x1b[2J\x1b[31mFAKE\rrow|x"
    runs = [_saved_entries(tmp_path / run, {name: {0: ((0, 1), [100.0] * 3)}}) for run in ("one", "two")]
    done = _tool(*runs)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\\x1b[2J" in done.stdout, done.stdout


def test_figures_out_of_range_and_runs_without_a_whole_round_are_refused_in_one_line(tmp_path):
    """Red team 39: steps of the largest double overflowed a mean, and a run in which no entry visited every shape
    in one round gave no figures: both ended in a traceback."""
    steady = _saved(tmp_path / "one", {0: [100.0] * 5})
    largest = _saved_entries(tmp_path / "largest", {"v1": {0: ((0, 1), [1.7976931348623157e308] * 2)}})
    scattered = _saved_entries(tmp_path / "scattered", {"a": {0: ((0,), [100.0])}, "b": {0: ((1,), [100.0])}})
    # red team 53: one shape visited twice in a round counted as a visit of each
    twice = _saved_entries(tmp_path / "twice", {"a": {0: ((0, 0), [100.0])}, "b": {0: ((1,), [100.0])}})
    for folder, says in ((largest, "a visit's step 1.7976931348623157e+308 is not a time from 0.001 to 1e+09"),
                         (scattered, "no entry has a round with a visit of each of its 2 shapes"),
                         (twice, "no entry has a round with a visit of each of its 2 shapes")):
        done = _tool(steady, folder)
        assert done.returncode == 113 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def test_an_entry_missing_from_a_run_is_left_out_with_a_line(tmp_path):
    """An entry with no whole round in one of the runs is named on a line of its own, the others tabled."""
    both = {"v1": {0: ((0, 1), [100.0] * 3)}}
    one = _saved_entries(tmp_path / "one", {**both, "v2\x1b": {0: ((0, 1), [100.0] * 3)}})
    two = _saved_entries(tmp_path / "two", {**both, "v2\x1b": {0: ((0,), [100.0] * 3)}})
    done = _tool(one, two)
    assert done.returncode == 0, done.stderr
    assert "| v1 " in done.stdout and "| v2" not in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1] == "left out, without a round of every shape in every run: v2\\x1b"
    alone = _saved_entries(tmp_path / "alone", {"v3": {0: ((0, 1), [100.0] * 3)}})
    done = _tool(one, alone)
    assert done.returncode == 113 and "no entry has a round of every shape in every run" in done.stderr, done.stderr
