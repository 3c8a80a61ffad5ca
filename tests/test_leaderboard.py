"""run_leaderboard.py on CPU: tables printed, CSV, JSON and the picture saved with their metadata; the picture with
anchors and SOL lines from synthetic rows."""
import json
import subprocess
import sys

import pandas as pd

from a2a import plots
from a2a.rows import geomean
from tests.conftest import ROOT

PNG = b"\x89PNG\r\n\x1a\n"


def test_leaderboard_saves_results_with_metadata(tmp_path):
    result = subprocess.run([sys.executable, "run_leaderboard.py", "--versions", "v1,v2", "--cases", "benchmarks:0",
                             "--world-size", "2", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "published MI300X" in result.stdout and "1311" in result.stdout
    assert "skipped v2_p2p: it builds GPU code" in result.stdout
    assert "skipped the anchors and the SOL-here model: they need at least 2 GPUs" in result.stdout
    (folder,) = tmp_path.iterdir()
    frame = pd.read_csv(folder / "results.csv")
    assert {"version", "kind", "mean_us", "device_mean_us", "floor_mean_us", "sol_mi300x_us", "device", "world_size",
            "date", "commit"} <= set(frame.columns)
    assert list(frame.version) == ["v1_torch_sort"]
    assert frame.loc[0, "status"] == "pass" and frame.loc[0, "mean_us"] > 0 and frame.loc[0, "world_size"] == 2
    assert frame.loc[0, "sol_mi300x_us"] == 6.33
    meta = json.loads((folder / "results.json").read_text())["meta"]
    assert meta["backend"] == "gloo" and meta["commit"]
    assert (folder / "leaderboard.png").read_bytes()[:8] == PNG
    assert "Device-side mean per shape (CPU µs)" in (folder / "table.md").read_text()


def test_picture_with_anchors_and_speed_of_light(tmp_path):
    rows = []
    for shape, scale in (("E=8 k=2 H=6144 T=16", 1.0), ("E=256 k=8 H=7168 T=256", 3.0)):
        for version, kind, device in (("v1_torch_sort", "version", 900), ("v2_p2p", "version", 150),
                                      ("nccl_a2a_x2", "anchor", 60)):
            rows.append({"version": version, "kind": kind, "shape": shape, "status": "pass",
                         "mean_us": scale * (device + 90), "device_mean_us": scale * device, "floor_mean_us": 80.0,
                         "sol_routed_us": scale * 20, "sol_dedup_us": scale * 12, "sol_mi300x_us": scale * 6})
    meta = {"device": "test", "world_size": 2, "backend": "nccl", "mode": "benchmark", "date": "2026-11-22",
            "commit": "abc"}
    path = plots.leaderboard_png(pd.DataFrame(rows), meta, tmp_path / "p.png", {"v1": 1311, "v2": 517},
                                 geomean)
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 20_000
