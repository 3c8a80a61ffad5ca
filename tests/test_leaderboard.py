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
                             "--world-size", "2", "--problem-size-cases", "tests:0", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    # the problem's own size in the same run: 8 ranks (gloo processes here), apart from the timed rows
    assert "World size 8, the problem's size: the official tests, 8 ranks on the CPU (gloo)" in result.stdout
    assert "| v1_torch_sort | 1 of 1" in result.stdout
    assert "published MI300X" in result.stdout and "1311" in result.stdout
    assert "skipped v2_p2p: it builds GPU code" in result.stdout
    assert ("skipped the anchors, the floors (empty submission, handshake) and the SOL-here model: they time GPUs "
            "(this run is gloo, world size 2)") in result.stdout
    (folder,) = tmp_path.iterdir()
    frame = pd.read_csv(folder / "results.csv")
    assert {"version", "kind", "mean_us", "p50_us", "p90_us", "device_mean_us", "device_p90_us", "floor_mean_us",
            "sol_mi300x_us", "device", "world_size", "date", "commit"} <= set(frame.columns)
    assert list(frame.version) == ["v1_torch_sort"]
    assert frame.loc[0, "status"] == "pass" and frame.loc[0, "mean_us"] > 0 and frame.loc[0, "world_size"] == 2
    assert frame.loc[0, "best_us"] <= frame.loc[0, "p50_us"] <= frame.loc[0, "p90_us"]
    assert frame.loc[0, "sol_mi300x_us"] == 6.33
    meta = json.loads((folder / "results.json").read_text())["meta"]
    assert meta["backend"] == "gloo" and meta["commit"] and meta["placement"] == "2 ranks on the CPU (gloo)"
    checks = pd.read_csv(folder / "checks.csv")
    assert list(checks.status) == ["pass"] and list(checks.world_size) == [8]
    assert (folder / "leaderboard.png").read_bytes()[:8] == PNG
    assert "Device-side mean per shape (CPU µs)" in (folder / "table.md").read_text()


def _synthetic_frame() -> pd.DataFrame:
    rows = []
    for shape, scale in (("E=8 k=2 H=6144 T=16", 1.0), ("E=64 k=6 H=2048 T=32", 1.5),
                         ("E=256 k=8 H=7168 T=256", 3.0)):
        for version, kind, device in (("v1_torch_sort", "version", 900), ("v2_p2p", "version", 150),
                                      ("nccl_a2a_x2", "anchor", 60), ("empty_submission", "empty", 12),
                                      ("handshake", "handshake", 16)):
            rows.append({"version": version, "kind": kind, "shape": shape, "status": "pass", "error": "",
                         "mean_us": scale * (device + 90), "p50_us": scale * (device + 85),
                         "p90_us": scale * (device + 99), "device_mean_us": scale * device,
                         "device_p50_us": scale * device * 0.95, "device_p90_us": scale * device * 1.2,
                         "floor_mean_us": 80.0, "sol_routed_us": scale * 20, "sol_dedup_us": scale * 12,
                         "sol_mi300x_us": scale * 6, "mark_us": scale * 28, "mark_empty_us": scale * 24})
    return pd.DataFrame(rows)


META = {"device": "test", "world_size": 2, "placement": "2 ranks on 2 GPUs, one each", "backend": "nccl",
        "mode": "benchmark", "date": "2026-11-22", "commit": "abc", "skipped": []}


def test_pictures_at_a_glance_and_per_shape(tmp_path):
    frame = _synthetic_frame()
    glance = plots.leaderboard_png(frame, META, tmp_path / "p.png", {"v1": 1311, "v2": 517}, geomean)
    shapes = plots.shapes_png(frame, META, tmp_path / "s.png")
    assert glance.read_bytes()[:8] == PNG and glance.stat().st_size > 20_000
    assert shapes.read_bytes()[:8] == PNG and shapes.stat().st_size > 20_000


def test_tables_show_quantiles_the_mark_and_both_floor_rows():
    import run_leaderboard

    text = run_leaderboard.tables(_synthetic_frame(), META)
    summary = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| empty " in summary["empty_submission"] and "| handshake " in summary["handshake"]
    # v2: device geomean of 150, 225, 450 with p90 at 1.2x; its mark (SOL here + handshake) geomean is that of 28,
    # 42, 84, and the old mark's (SOL here + empty) that of 24, 36, 72
    assert f"{geomean([150, 225, 450]) * 1.2:.1f}" in summary["v2_p2p"]
    assert f"{geomean([150, 225, 450]) / geomean([28, 42, 84]):.1f}" in summary["v2_p2p"]
    assert f"{geomean([150, 225, 450]) / geomean([24, 36, 72]):.1f}" in summary["v2_p2p"]
    assert f"Mark geomean (SOL here, dedup, plus the handshake's device-side time, per shape): " \
           f"{geomean([28, 42, 84]):.1f} µs." in text
    assert f"plus the empty submission's device-side time; kept beside the mark for one release): " \
           f"{geomean([24, 36, 72]):.1f} µs." in text
    assert "150.0 / 142.5 / 180.0" in text  # v2's device mean / p50 / p90 on the first shape


def _fake_gpu_plan(world_size: int, shared: bool):
    from types import SimpleNamespace

    return SimpleNamespace(versions=[], skipped=[], backend="nccl", world_size=world_size, case_args=[{}],
                           task={"description": ""}, meta={"shared_gpus": shared},
                           meta_for=lambda mode: {"mode": mode, "placement": "test"})


def test_floors_run_at_every_world_size_on_gpus_and_anchors_only_with_peers(monkeypatch):
    """The empty and handshake rows need no peer on its own GPU: world size 1 and shared GPUs get them (and only
    them); with peers on their own GPUs every entry runs, and the SOL figures are measured."""
    import run_leaderboard
    from a2a import anchors, sol

    asked = []
    monkeypatch.setattr(anchors, "run", lambda cases, ws, progress, entries: asked.append(tuple(entries)) or [])
    monkeypatch.setattr(sol, "measure", lambda ws, meta: asked.append("sol") or None)
    for world_size, shared in ((1, False), (8, True)):
        asked.clear()
        _, meta, _ = run_leaderboard.run(_fake_gpu_plan(world_size, shared), "benchmark", progress=lambda _: None)
        assert asked == [anchors.FLOORS] and "skipped the all-to-all anchors and the SOL-here model" in meta["skipped"][-1]
    asked.clear()
    run_leaderboard.run(_fake_gpu_plan(2, False), "benchmark", progress=lambda _: None)
    assert asked == [tuple(anchors.ANCHORS), "sol"]
    asked.clear()
    run_leaderboard.run(_fake_gpu_plan(2, False), "benchmark", anchors=False, progress=lambda _: None)
    assert asked == [anchors.FLOORS, "sol"]
