"""run_leaderboard.py on CPU: tables printed, CSV and JSON saved with their metadata."""
import json
import subprocess
import sys

import pandas as pd

from tests.conftest import ROOT


def test_leaderboard_saves_results_with_metadata(tmp_path):
    result = subprocess.run([sys.executable, "run_leaderboard.py", "--versions", "v1", "--cases", "benchmarks:0",
                             "--world-size", "2", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "published MI300X" in result.stdout and "1311" in result.stdout
    (folder,) = tmp_path.iterdir()
    frame = pd.read_csv(folder / "results.csv")
    assert {"version", "mean_us", "floor_mean_us", "device", "world_size", "date", "commit"} <= set(frame.columns)
    assert frame.loc[0, "status"] == "pass" and frame.loc[0, "mean_us"] > 0 and frame.loc[0, "world_size"] == 2
    meta = json.loads((folder / "results.json").read_text())["meta"]
    assert meta["backend"] == "gloo" and meta["commit"]
