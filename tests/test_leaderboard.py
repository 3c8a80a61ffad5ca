"""run_leaderboard.py on CPU: tables printed, CSV, JSON and the pictures saved with their metadata and intervals; the
tables and pictures with anchors, SOL, ties and a fallback from synthetic rows; which entries a GPU run times."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from a2a import cli, clock, plots
from a2a import plan as planning
from a2a import intervals as iv
from a2a.rows import geomean
from tests.conftest import ROOT, saved_in

PNG = b"\x89PNG\r\n\x1a\n"


def test_leaderboard_saves_results_with_metadata_and_intervals(tmp_path, capsys):
    # Two rounds, the fewest an interval takes: each round more is two fresh ranks (about 4 CPU seconds on 2 cores).
    cpus = sorted(os.sched_getaffinity(0))[-2:]  # the run's conditions are its results' (A2A_PIN_CPUS among them)
    result = subprocess.run([sys.executable, "run_leaderboard.py", "--versions", "v1,v2", "--cases", "benchmarks:0",
                             "--world-size", "2", "--problem-size-cases", "tests:0", "--min-rounds", "2",
                             "--max-rounds", "2", "--steps", "2", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900,
                            env=dict(os.environ, A2A_PIN_CPUS=",".join(map(str, cpus))))
    assert result.returncode == 0, result.stderr[-2000:]
    # the problem's own size in the same run: 8 ranks (gloo processes here), apart from the timed rows
    assert "World size 8, the problem's size: the official tests, 8 ranks on the CPU (gloo)" in result.stdout
    assert "| v1_torch_sort | 1 of 1" in result.stdout
    assert "published MI300X" in result.stdout and "1311" in result.stdout
    assert "skipped v2_p2p: it builds GPU code" in result.stdout
    assert ("skipped the anchors, the floors (empty submission, handshake) and the SOL-here model: they time GPUs "
            "(this run is gloo, world size 2)") in result.stdout
    (folder,) = saved_in(tmp_path)
    frame = pd.read_csv(folder / "results.csv")
    assert {"version", "kind", "mean_us", "low_us", "high_us", "device_mean_us", "device_low_us", "device_high_us",
            "rounds", "stopped", "sol_mi300x_us", "device", "world_size", "date", "commit"} <= set(frame.columns)
    assert list(frame.version) == ["v1_torch_sort"]
    row = frame.loc[0]
    assert row["status"] == "pass" and row["world_size"] == 2 and row["rounds"] == 2
    assert row["low_us"] < row["mean_us"] < row["high_us"] and row["device_low_us"] < row["device_mean_us"]
    assert row["stopped"].startswith("2 rounds")
    saved = json.loads((folder / "results.json").read_text())
    meta = saved["meta"]
    assert meta["backend"] == "gloo" and meta["commit"] and meta["placement"] == "2 ranks on the CPU (gloo)"
    assert len(meta["round_seeds"]) == 2 and meta["clock_seed"] is not None and meta["rounds"] == 2
    assert meta["settings"]["pinned_cpus"] == cpus
    assert {s["round"] for s in saved["samples"]} == {0, 1}
    assert saved["entries"]["v1_torch_sort"]["call"]["rounds"] == 2
    checks = pd.read_csv(folder / "checks.csv")
    assert list(checks.status) == ["pass"] and list(checks.world_size) == [8]
    assert (folder / "leaderboard.png").read_bytes()[:8] == PNG
    assert "the owner's step (ranks) per shape (CPU µs, [95%])" in (folder / "table.md").read_text()
    _compare_with_a_slower_copy(folder, tmp_path / "compared", capsys)


def _compare_with_a_slower_copy(folder, out, capsys):
    """--compare on a saved run and a copy whose owner's figure for v1 is 20% higher: the spread shows it, and each
    bad input is refused before a folder is made."""
    import run_leaderboard

    import eval as core

    slower = folder.with_name(folder.name + "-slower")
    slower.mkdir()
    saved = json.loads((folder / "results.json").read_text())
    saved["entries"]["v1_torch_sort"]["owner"]["center"] *= 1.2
    (slower / "results.json").write_text(json.dumps(saved))
    capsys.readouterr()
    assert run_leaderboard.main(["--compare", str(folder), str(slower), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "| v1_torch_sort " in line}
    assert "-9.1% / +9.1%" in rows["the owner's step (ranks)"]  # 1.2 around the median of 1 and 1.2
    assert "-0.0% / +0.0%" in rows["call time (the rank's events, idle stream)"]
    (made,) = out.iterdir()
    # the runs' world size, then this checkout's commit (here the saved run's)
    assert made.name.endswith(f"_ws{saved['meta']['world_size']}_compare_" + saved["meta"]["commit"])
    assert (made / "table.md").read_text().strip() in text
    saved["partial"] = "cut"
    (slower / "results.json").write_text(json.dumps(saved))
    for folders, says in (([folder], "at least two"), ([folder, slower], "a partial results.json"),
                          ([folder, out], "no readable results.json")):
        with pytest.raises(core.UserError, match=says):
            run_leaderboard.compare(folders, out / "refused")
    assert not (out / "refused").exists()


def _saved(folder: Path, entries, meta) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"entries": entries, "meta": meta}))
    return folder


def test_compare_refuses_what_is_not_a_saved_run_and_names_its_folder_itself(tmp_path, capsys):
    """Red team 31: --compare read whatever a folder held. A FIFO hung it, a link to /dev/zero ran memory out, a
    zero or string center, a missing bound, deep nesting or a 400-digit number ended it with 114 (red team 32: 100 000
    entries ran for minutes); a saved run's date
    or commit named the compare's folder outside --out; its device's escape sequences were printed raw. Each is bad
    input now (113, one line, nothing written), the folder is named from this checkout, and text is escaped."""
    import run_leaderboard

    import eval as core

    figure = {"center": 10.0, "low": 9.0, "high": 11.0, "rounds": 3}
    good = _saved(tmp_path / "good", {"v1": {"owner": figure}}, {"device": "D", "commit": "c"})
    out = tmp_path / "out"
    hostile = {"zero center": {"v1": {"owner": {**figure, "center": 0}}},
               "string center": {"v1": {"owner": {**figure, "center": "fast"}}},
               "no high": {"v1": {"owner": {"center": 1.0, "low": 0.5}}}, "entry an int": {"v1": 7},
               "huge number": {"v1": {"owner": {**figure, "high": 10 ** 400}}}}
    for why, entries in hostile.items():
        folder = _saved(tmp_path / why.replace(" ", "_"), entries, {})
        if why == "zero center":  # no positive center: no figure, so no entry timed in both runs
            with pytest.raises(core.UserError, match="no entry was timed in every run"):
                run_leaderboard.compare([good, folder], out)
            continue
        with pytest.raises(core.UserError, match="not an interval of numbers|not a run's entry"):
            run_leaderboard.compare([good, folder], out)
    many = _saved(tmp_path / "many", {f"e{n}": {"owner": figure} for n in range(501)}, {})
    with pytest.raises(core.UserError, match="501 entries, more than the 500"):
        run_leaderboard.compare([good, many], out)
    shapes = _saved(tmp_path / "shapes", {"empty": {"kind": "empty"}, "v1": {"owner": figure}}, {})
    saved = json.loads((Path(shapes) / "results.json").read_text())  # red team 38: 8000 shapes' samples, 312 s
    saved["samples"] = [{"entry": e, "case": c, "round": 0, "owner": 1.0} for e in ("empty", "v1")
                        for c in range(8000)]
    (Path(shapes) / "results.json").write_text(json.dumps(saved))
    with pytest.raises(core.UserError, match="samples of 8000 shapes, more than the 100"):
        run_leaderboard.compare([good, shapes], out)
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "results.json").write_text("[" * 200_000)
    fifo, zero = tmp_path / "fifo", tmp_path / "zero"
    fifo.mkdir()
    os.mkfifo(fifo / "results.json")
    zero.mkdir()
    (zero / "results.json").symlink_to("/dev/zero")
    for folder in (deep, fifo, zero):
        with pytest.raises(core.UserError, match="no readable results.json"):
            run_leaderboard.compare([good, folder], out)
    assert not out.exists()
    planted = _saved(tmp_path / "planted", {"v1": {"owner": figure}},
                     {"date": str(tmp_path / "elsewhere"), "commit": "../../../elsewhere2",
                      "device": "\x1b[2J\x1b[Hall agree"})
    capsys.readouterr()
    assert run_leaderboard.compare([good, planted], out) == 0
    (made,) = out.iterdir()
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\\x1b[2J" in shown and "\x1b" not in (made / "table.md").read_text()
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "elsewhere2").exists()
    assert made.name.endswith("_ws-unknown_compare_" + planning.commit()), made.name


SHAPES = (("E=8 k=2 H=6144 T=16", 1.0), ("E=64 k=6 H=2048 T=32", 1.5), ("E=256 k=8 H=7168 T=256", 3.0))
ENTRIES = (("v1_torch_sort", "version", 900), ("v2_p2p", "version", 150), ("v3_fused_combine", "version", 155),
           ("nccl_a2a_x2", "anchor", 60), ("empty_submission", "empty", 12), ("handshake", "handshake", 16))


def _synthetic() -> tuple[pd.DataFrame, dict]:
    rows = []
    for shape, scale in SHAPES:
        for version, kind, device in ENTRIES:
            rows.append({"version": version, "kind": kind, "shape": shape, "status": "pass", "error": "",
                         "rounds": 8, "stopped": "targets met at round 8",
                         "hold": "sync fallback" if version == "v1_torch_sort" else "held",
                         "mean_us": scale * (device + 90), "low_us": scale * (device + 80),
                         "high_us": scale * (device + 100), "device_mean_us": scale * device,
                         "device_low_us": scale * device * 0.95, "device_high_us": scale * device * 1.05,
                         "held_mean_us": scale * device / 2, "held_low_us": scale * device / 2.05,
                         "held_high_us": scale * device / 1.95, "sol_routed_us": scale * 20,
                         "sol_dedup_us": scale * 12, "sol_mi300x_us": scale * 6, "mark_us": scale * 28})
    summary = {}
    for version, kind, device in ENTRIES:
        center = geomean([device * scale for _, scale in SHAPES])
        summary[version] = {"kind": kind, "intervals": {
            "call": iv.Interval(center, center * 0.95, center * 1.05, 8),
            "held": iv.Interval(center / 2, center / 2.05, center / 1.95, 8),
            "owner": iv.Interval(center + 90, center + 80, center + 100, 8)}}
    for metric in clock.METRICS:
        for name, (rank, ties) in iv.ranks_with_ties({n: s["intervals"][metric] for n, s in summary.items()}).items():
            summary[name].setdefault("ranks", {})[metric] = {"rank": rank, "ties": ties}
    return pd.DataFrame(rows), summary


META = {"device": "test", "world_size": 2, "placement": "2 ranks on 2 GPUs, one each", "backend": "nccl",
        "mode": "benchmark", "date": "2026-11-22", "commit": "abc", "skipped": [], "clocks": "GPU clocks not locked",
        "throttled_visits": 1, "rounds": 8, "wall_s": 100, "clock_seed": 7, "guards": "test",
        "spread": {"owner": {"round": 0.1, "pool": 0.15, "visit": 0.09, "steps": 0.03, "entries": 3, "rounds": 8},
                   "held": {"round": 0.02, "pool": 0.04, "entries": 3, "rounds": 8}}}


def test_pictures_at_a_glance_and_per_shape(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    frame, summary = _synthetic()
    glance = plots.leaderboard_png(frame, META, summary, tmp_path / "p.png", {"v1": 1311, "v2": 517})
    drawn = []
    bar = Axes.bar
    monkeypatch.setattr(Axes, "bar", lambda ax, x, height, *args, **kw: drawn.append(height) or bar(ax, x, height,
                                                                                                     *args, **kw))
    shapes = plots.shapes_png(frame, META, tmp_path / "s.png")
    assert glance.read_bytes()[:8] == PNG and glance.stat().st_size > 20_000
    assert shapes.read_bytes()[:8] == PNG and shapes.stat().st_size > 20_000
    # per shape, the owner's step (red team 52: a rank's forged call time was the only figure drawn)
    assert sorted(drawn) == sorted(frame["mean_us"]), (drawn, list(frame["mean_us"]))


def test_tables_show_intervals_ties_the_mark_and_a_sync_fallback():
    import run_leaderboard

    frame, summary = _synthetic()
    text = run_leaderboard.tables(frame, META, summary)
    lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    v2 = geomean([150 * s for _, s in SHAPES])
    assert f"{v2:.1f} [{v2 * 0.95:.1f}, {v2 * 1.05:.1f}]" in lines["v2_p2p"]
    # v2 (150) and v3 (155) overlap: tied, each naming the other; v1 is alone and last
    assert "(tied: v3_fused_combine)" in lines["v2_p2p"] and "(tied: v2_p2p)" in lines["v3_fused_combine"]
    assert "tied" not in lines["v1_torch_sort"] and "(sync fallback: call time)" in lines["v1_torch_sort"]
    assert f"{v2 / geomean([28 * s for _, s in SHAPES]):.1f}" in lines["v2_p2p"]  # call / mark
    assert f"Mark geomean (SOL here, dedup, plus the handshake's call time, per shape): " \
           f"{geomean([28 * s for _, s in SHAPES]):.1f} µs." in text
    assert "throttled visits left out: 1" in text and "GPU clocks not locked" in text
    assert ("each visit's own): owner's step 0.100, 0.150 and 0.090 (its steps' own 0.030); held 0.020 and 0.040"
            in text), text
    assert "150.0 [142.5, 157.5]" in text  # v2's call time on the first shape, in the per-shape table
    # only the judge's own figure ranks: a rank's call and held figures are its word (red team 51: a forged 1 µs
    # ranked first in a `rank (call)` column)
    assert "rank (owner)" in text and "rank (call)" not in text and "rank (held)" not in text, text


def test_a_ranks_words_open_no_cell_of_their_own_in_the_table():
    """Red team 23: a failed entry's error holding `|` and a row's text made extra cells beside its own."""
    import run_leaderboard

    frame, summary = _synthetic()
    forged = "boom | v1_torch_sort | version | 1.0 [FORGED] |"
    frame.loc[frame.version == "v2_p2p", ["status", "error"]] = ["fail", forged]
    text = run_leaderboard.tables(frame, META, summary)
    line = next(line for line in text.splitlines() if line.startswith("| v2_p2p"))
    header = next(line for line in text.splitlines() if line.startswith("| entry"))
    cells = lambda row: len(re.findall(r"(?<!\\)\|", row))  # noqa: E731  (the unescaped ones)
    assert cells(line) == cells(header), (header, line)
    assert "boom \\| v1_torch_sort \\| version" in line, line


def _fake_gpu_plan(world_size: int, shared: bool):
    from types import SimpleNamespace

    return SimpleNamespace(versions=[], skipped=[], backend="nccl", world_size=world_size, case_args=[{}],
                           task={"description": ""}, meta={"shared_gpus": shared},
                           meta_for=lambda mode: {"mode": mode, "placement": "test"})


def test_floors_run_at_every_world_size_on_gpus_and_anchors_only_with_peers():
    """The empty and handshake rows need no peer on its own GPU: world size 1 and shared GPUs get them (and only
    them); with peers on their own GPUs every entry runs."""
    import run_leaderboard
    from a2a import anchors

    for world_size, shared in ((1, False), (8, True)):
        entries, skipped = run_leaderboard.entries_of(_fake_gpu_plan(world_size, shared), anchors=True)
        assert [e.name for e in entries] == list(anchors.FLOORS)
        assert "skipped the all-to-all anchors and the SOL-here model" in skipped[-1]
    entries, skipped = run_leaderboard.entries_of(_fake_gpu_plan(2, False), anchors=True)
    assert [e.name for e in entries] == list(anchors.ANCHORS) and not skipped
    entries, _ = run_leaderboard.entries_of(_fake_gpu_plan(2, False), anchors=False)
    assert [e.name for e in entries] == list(anchors.FLOORS)


def test_a_version_with_no_gpu_work_is_void():
    """Held device time within a kernel's worth of the empty submission's: no GPU work made the output."""
    import run_leaderboard

    frame = pd.DataFrame([{"version": "fast", "kind": "version", "shape": "s", "held_mean_us": 1.5, "status": "pass",
                           "error": ""},
                          {"version": "empty_submission", "kind": "empty", "shape": "s", "held_mean_us": 1.3,
                           "status": "pass", "error": ""},
                          {"version": "real", "kind": "version", "shape": "s", "held_mean_us": 9.0, "status": "pass",
                           "error": ""}])
    run = type("R", (), {"failed": {}})()
    run_leaderboard.void_below_floor(frame, run)
    assert list(frame.status) == ["fail", "pass", "pass"] and frame.loc[0, "error"].startswith("void: its held")
    assert list(run.failed) == ["fast"]
    assert not math.isnan(frame.loc[2, "held_mean_us"])


def test_a_run_folders_name_fits_a_file_system_with_room_for_its_repeats(tmp_path):
    """A diff of two 100-byte stems on an H100 named a 254-byte folder, and its same-day repeat's '-2' passed 255
    (red team 38, from the code): the mode is cut to fit 200 and told apart by its hash; a short name is unchanged."""
    from a2a import plan as planning

    meta = {**META, "device": "NVIDIA H100 80GB HBM3", "world_size": 8, "commit": "abcdef1-dirty"}
    names = {planning.run_folder(tmp_path, {**meta, "mode": f"diff_{a * 100}_vs_{'b' * 100}"}).name for a in "ac"}
    assert len(names) == 2 and all(len(name) <= planning.FOLDER_NAME_CHARS for name in names), names
    for name in names:
        assert planning.new_folder(tmp_path / name).is_dir() and planning.new_folder(tmp_path / name).is_dir()
    short = planning.run_folder(tmp_path, {**meta, "mode": "benchmark"}).name
    assert short == "2026-11-22_nvidia-h100-80gb-hbm3_ws8_benchmark_abcdef1-dirty", short


def test_a_compare_of_runs_with_long_devices_and_world_sizes_names_a_folder_that_fits(tmp_path, capsys):
    """Red team 39: two saved runs whose device and world size were 200 characters each named the compare's folder
    420 bytes long (114, nothing saved): every part is cut, not only the mode, each told apart by its hash."""
    import run_leaderboard

    figure = {"center": 10.0, "low": 9.0, "high": 11.0, "rounds": 3}
    meta = {"device": "D" * 200, "world_size": "1" * 200, "commit": "c" * 200}
    runs = [_saved(tmp_path / name, {"v1": {"owner": figure}}, meta) for name in ("a", "b")]
    assert run_leaderboard.compare(runs, tmp_path / "out") == 0
    (made,) = (tmp_path / "out").iterdir()
    assert len(made.name) <= planning.FOLDER_NAME_CHARS and (made / "table.md").exists(), made.name
    names = {planning.run_folder(tmp_path, {**META, "device": "D" * 100 + end, "mode": "compare"}).name
             for end in "xy"}
    assert len(names) == 2 and all(len(name) <= planning.FOLDER_NAME_CHARS for name in names), names


def test_a_second_run_of_the_same_name_gets_its_own_folder(tmp_path):
    """Same day, device and commit: the second run saves into <name>-2, the third into <name>-3, and the first
    run's files stay as they were; runs racing for one name each get a folder of their own."""
    import threading

    from a2a import cli
    from a2a import plan as planning

    first = cli.save_run(tmp_path, META, lambda folder: (folder / "table.md").write_text("first\n"))
    second = cli.save_run(tmp_path, META, lambda folder: (folder / "table.md").write_text("second\n"))
    assert second == first.with_name(first.name + "-2") and (second / "table.md").read_text() == "second\n"
    assert [p.name for p in first.iterdir()] == ["table.md"] and (first / "table.md").read_text() == "first\n"
    assert planning.new_folder(first) == first.with_name(first.name + "-3")
    start, made = threading.Barrier(8), []
    raced = tmp_path / "raced"

    def claim():
        start.wait()
        made.append(planning.new_folder(raced))
    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.name for p in made) == sorted(["raced"] + [f"raced-{n}" for n in range(2, 9)])


def test_each_entry_s_rows_are_saved_apart(tmp_path):
    """results.csv is written one entry at a time: an entry whose rows cannot be rendered is named in the
    problems and costs no other entry its rows; a message with a lone surrogate is saved, escaped. results.json is
    replaced whole (the partial one by the final one)."""
    import run_leaderboard

    class Unprintable:
        def __str__(self):
            raise ValueError("a message that cannot be rendered")
        __repr__ = __str__

    row = {"kind": "version", "shape": "s", "status": "fail", "mean_us": 1.0}
    frame = pd.DataFrame([{**row, "version": "hostile", "error": Unprintable()},
                          {**row, "version": "surrogate", "error": "bad \udcff byte"},
                          {**row, "version": "v1_torch_sort", "status": "pass", "error": ""}])
    files = cli.RunFiles(tmp_path, META)
    run_leaderboard.save_rows(files, frame, META)
    saved = pd.read_csv(files.folder / "results.csv", keep_default_na=False)
    assert list(saved.version) == ["surrogate", "v1_torch_sort"] and list(saved.status) == ["fail", "pass"]
    assert saved.error[0] == "bad \\udcff byte" and (saved.commit == "abc").all()
    assert len(files.problems) == 1 and files.problems[0].startswith("hostile's rows in results.csv not saved: "
                                                                     "ValueError: a message that cannot be rendered")
    files.write_text("results.json", json.dumps({"partial": "clock only"}))
    files.write_text("results.json", json.dumps({"rows": 2}))
    assert json.loads((files.folder / "results.json").read_text()) == {"rows": 2}
    assert sorted(p.name for p in files.folder.iterdir()) == ["results.csv", "results.json"]


def test_the_spread_line_says_whether_ranks_were_pinned():
    """The spread's line names the pinning the run had (the #49 experiment compares runs with and without it), and
    says nothing of it for a run saved before it was recorded."""
    import run_leaderboard

    spread = {"owner": {"round": 0.03, "pool": 0.156}}
    lines = {str(pinned): run_leaderboard._spread_line({"spread": spread, "settings": {"pinned_cpus": pinned}})[0]
             for pinned in ([31], [], None)}
    assert "owner's step 0.030 and 0.156" in lines["None"] and "pinn" not in lines["None"]
    assert lines["[]"].endswith("(no rank pinned)")
    assert "A2A_PIN_CPUS=31" in lines["[31]"]
    owner = run_leaderboard._spread_line({"spread": spread, "settings": {"pinned_cpus": [], "owner_cpu": 5}})[0]
    assert owner.endswith("(no rank pinned; the owner on CPU 5 while it visits, A2A_PIN_OWNER_CPU=5)"), owner


def test_a_stability_run_keeps_each_runs_samples_and_spread(tmp_path, monkeypatch, capsys):
    """Each run of `--stability` keeps its visits' samples and the split of its spread (round, pool) in results.json,
    so that where a run-to-run gap comes from can be worked out after the device is gone (twenty-fifth session: the
    world-size-4 runs kept only their geomeans). The clock here is synthetic: one entry's figures move with the run."""
    import dataclasses

    import run_leaderboard
    from a2a import plan as planning

    plan = planning.make_plan(["v1"], "benchmarks:0,1", 2, "gloo")
    made = []

    def fake_time_entries(plan, entries, settings, progress):
        scale = 1.0 + 0.1 * len(made)
        entries = list(entries) + [clock.Entry("other", "empty")]  # a spread's split takes two entries
        samples = {(e.name, i): {r: {"owner": scale * (100 + 10 * n + i + r), "held": 5.0 + n + r / 10}
                                 for r in range(3)}
                   for n, e in enumerate(entries) for i in range(len(plan.case_args))}
        made.append(settings.order)
        return clock.Run(entries, plan.case_args, samples, {}, {}, set(), [1, 2, 3], 7, [], 0, "test", 1.0, 3,
                         [], [], [], [])

    monkeypatch.setattr(clock, "time_entries", fake_time_entries)
    settings = dataclasses.replace(clock.Settings(), targets=())
    assert run_leaderboard.stability(plan, settings, 2, False, tmp_path, progress=lambda _: None) == 0
    assert made[-1] == tuple(reversed(made[0])) and len(made) == 3
    saved = json.loads(next(tmp_path.glob("*/results.json")).read_text())
    names = list(made[0]) + ["other"]
    for number, run in enumerate(saved["runs"]):
        assert {(s["entry"], s["case"], s["round"]) for s in run["samples"]} == \
            {(n, i, r) for n in names for i in range(2) for r in range(3)}
        first = next(s for s in run["samples"] if (s["entry"], s["case"], s["round"]) == (names[0], 1, 2))
        assert first["owner"] == pytest.approx((1.0 + 0.1 * number) * 103)
        assert set(run["spread"]) == {"owner", "held"} and run["spread"]["owner"]["rounds"] == 3
    capsys.readouterr()


def _live_pipes(row: str) -> int:
    """The `|` of a GitHub table row that end cells: those not escaped by a backslash (itself not escaped)."""
    count, escaped = 0, False
    for char in row:
        count += char == "|" and not escaped
        escaped = char == "\\" and not escaped
    return count


HOSTILE_NAMES = {"v2_p2p": "z | version | 1.0 [0.9, 1.1] | 1 | forged |", "v3_fused_combine": "m$\\frac{$"}


def test_entry_names_and_a_ranks_words_stay_in_their_cells_and_their_pictures(tmp_path):
    """Entries named with `|` and mathtext (red team 35: a file name's `|` forged a row's cells, `$\\frac{$` ended
    the pictures and the run with 114) and an error holding `\\|` (it ended its cell early): every row of every
    table has its header's cells, and both pictures are drawn."""
    import run_leaderboard

    frame, summary = _synthetic()
    frame["version"] = frame["version"].replace(HOSTILE_NAMES)
    summary = {HOSTILE_NAMES.get(name, name): value for name, value in summary.items()}
    for value in summary.values():
        for rank in value.get("ranks", {}).values():
            rank["ties"] = [HOSTILE_NAMES.get(name, name) for name in rank["ties"]]
    frame.loc[frame.version == "v1_torch_sort", ["status", "error"]] = ["fail", "boom \\| yes \\| forged \\| rank 1"]
    text = run_leaderboard.tables(frame, META, summary)
    header = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        header = header or line
        assert _live_pipes(line) == _live_pipes(header), (header, line)
    assert "z \\| version \\| 1.0" in text and "boom \\\\\\| yes" in text, text
    assert plots.leaderboard_png(frame, META, summary, tmp_path / "p.png", {}).read_bytes()[:8] == PNG
    assert plots.shapes_png(frame, META, tmp_path / "s.png").read_bytes()[:8] == PNG


def test_a_long_path_makes_no_giant_picture(tmp_path):
    """Red team 38: an entry named by a 3236-character path drew a picture of 23664 x 11095 pixels; its name is cut
    to its end under the bars."""
    import struct

    frame, summary = _synthetic()
    name = "/" + "deep/" * 646 + "mine.py"
    frame["version"] = frame["version"].replace({"v1_torch_sort": name})
    summary = {name if key == "v1_torch_sort" else key: value for key, value in summary.items()}
    for path in (plots.leaderboard_png(frame, META, summary, tmp_path / "p.png", {}),
                 plots.shapes_png(frame, META, tmp_path / "s.png")):
        width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the PNG header's size
        assert width < 4000 and height < 4000, (path.name, width, height)


def _drifting_run(drift: float, rounds: int = 6) -> dict:
    """A saved run's entries and samples: the empty submission at 400 µs and v1 at 1.1x it in every round, round r
    of the run scaled by (1 + 0.05 r) and the whole run by `drift` (a floor that moves with the machine)."""
    samples = []
    for entry, factor in (("empty_submission", 1.0), ("v1_torch_sort", 1.1)):
        for r in range(rounds):
            for case in range(2):
                samples.append({"entry": entry, "case": case, "round": r,
                                "owner": 400.0 * factor * drift * (1 + 0.05 * r) * (1 + case)})
    figure = {"center": 440.0 * drift, "low": 430.0 * drift, "high": 450.0 * drift}
    return {"entries": {"empty_submission": {"kind": "empty", "owner": figure},
                        "v1_torch_sort": {"kind": "version", "owner": {k: v * 1.1 for k, v in figure.items()}}},
            "meta": {"device": "test", "placement": "1 rank on 1 GPU", "world_size": 1, "commit": "abc"},
            "samples": samples}


def test_compare_sets_the_owners_step_over_its_rounds_floor_beside_it(tmp_path, capsys):
    """Two saved runs, the second 10% slower throughout (twenty-eighth session: the floors of a world-size-1 pair
    moved 8-10% and took every entry with them): the owner's step spreads ±4.8% between them, its ratio to the
    round's own empty submission (derived from the samples of a run saved without it) not at all."""
    import run_leaderboard

    folders = []
    for index, drift in enumerate((1.0, 1.1)):
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(_drifting_run(drift)))
        folders.append(folder)
    assert run_leaderboard.main(["--compare", *map(str, folders), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "| v1_torch_sort " in line}
    assert "-4.8% / +4.8%" in rows["the owner's step (ranks)"], text
    ratio = rows["the owner's step over its round's empty submission (a ratio)"]
    assert "1.100 / 1.100" in ratio and "-0.0% / +0.0%" in ratio, ratio


def test_compare_refuses_figures_out_of_range_and_samples_past_its_bounds(tmp_path):
    """Red team 39: a saved run's figures of the largest double overflowed a geomean over 80 shapes (114), and
    300 000 entry names in the samples (beside one in `entries`) ran --compare for a day. A figure out of
    SAVED_FIGURE_RANGE, more entries or rounds in the samples than a compare takes: bad input, one line."""
    import sys

    import run_leaderboard

    import eval as core

    good = tmp_path / "good"
    good.mkdir()
    (good / "results.json").write_text(json.dumps(_drifting_run(1.0)))
    largest = sys.float_info.max
    hostile = {}
    run = _drifting_run(1.0)
    run["samples"] = [{"entry": e, "case": c, "round": 0, "owner": largest if e == "x" else 1.0}
                      for e in ("empty_submission", "x") for c in range(80)]
    hostile["sample of the largest double"] = (run, r"owner figure 1.7976931348623157e\+308 is not a number from")
    run = _drifting_run(1.0)
    run["entries"]["v1_torch_sort"]["owner"]["center"] = 1e300
    hostile["center of 1e300"] = (run, r"v1_torch_sort's owner center 1e\+300 is not from 0.001 to 1e\+09")
    run = _drifting_run(1.0)  # red team 53: an infinite bound was shown as a spread of inf%
    run["entries"]["v1_torch_sort"]["owner"]["high"] = float("inf")
    hostile["an infinite bound"] = (run, "v1_torch_sort's owner is not an interval of numbers")
    run = _drifting_run(1.0)  # red team 53: two names shown alike, the second kept in the first's place
    run["entries"]["v1\n"] = run["entries"]["v1\\n"] = run["entries"]["v1_torch_sort"]
    hostile["two names shown alike"] = (run, "two entries shown as")
    run = _drifting_run(1.0)
    run["samples"] += [{"entry": f"e{n}", "case": 0, "round": 0, "owner": 1.0} for n in range(600)]
    hostile["600 entries in the samples"] = (run, "samples of 602 entries, more than the 500")
    run = _drifting_run(1.0)
    run["samples"] += [{"entry": "v1_torch_sort", "case": 0, "round": r, "owner": 1.0} for r in range(10_001)]
    hostile["10 001 rounds"] = (run, "samples of 10001 rounds of one entry, more than the 10000")
    for why, (saved, says) in hostile.items():
        folder = tmp_path / why.replace(" ", "_")
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(saved))
        with pytest.raises(core.UserError, match=says):
            run_leaderboard.compare([good, folder], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_saved_runs_floor_ratios_take_the_floors_rounds_once(monkeypatch):
    """Red team 39: each entry's ratio took the floor's geomean over all its rounds anew (0.3 s an entry at 300 000
    rounds). The floor's rounds are taken once, each entry's once, and only for the entries the run names."""
    import run_leaderboard

    saved = _drifting_run(1.0)
    for name in ("v2", "v3"):
        saved["entries"][name] = {"kind": "version"}
        saved["samples"] += [{**s, "entry": name} for s in saved["samples"] if s["entry"] == "v1_torch_sort"]
    saved["samples"] += [{"entry": "unnamed", "case": 0, "round": 0, "owner": 1.0}]
    taken = []
    geomean_by_round = iv.geomean_by_round
    monkeypatch.setattr(iv, "geomean_by_round", lambda per_shape: taken.append(per_shape) or geomean_by_round(
        per_shape))
    ratios = run_leaderboard._floor_ratios(saved)
    assert sorted(ratios) == ["v1_torch_sort", "v2", "v3"] and len(taken) == 4
    assert all(ratio.center == pytest.approx(1.1) for ratio in ratios.values())


def test_the_floor_ratio_cancels_what_a_round_shares():
    """clock.floor_ratio: per round, the entry's geomean over the shapes over the floor's; a round's shared factor
    goes, a round the floor lacks is left out."""
    samples = {}
    for entry, factor in (("floor", 1.0), ("v", 1.25)):
        for case in range(2):
            samples[(entry, case)] = {r: {"owner": 100.0 * factor * (1 + r) * (1 + case)} for r in range(5)}
    del samples[("floor", 1)][4]
    ratio = clock.floor_ratio(samples, "v", "floor", 2)
    assert ratio.rounds == 4 and abs(ratio.center - 1.25) < 1e-9 and ratio.high - ratio.low < 1e-9
    assert clock.floor_ratio(samples, "v", "absent", 2) is None


def test_a_run_with_an_empty_submission_saves_each_entrys_floor_ratio():
    """Run.entry_intervals adds the ratio where the run has an empty submission (not for the floor itself), and
    results.json keeps it beside the clock's metrics."""
    import dataclasses

    import run_leaderboard

    samples = {(entry, case): {r: {"owner": 100.0 * factor * (1 + r), "call": 1.0, "held": 1.0} for r in range(3)}
               for entry, factor in (("empty_submission", 1.0), ("v1_torch_sort", 2.0)) for case in range(2)}
    run = clock.Run(*[None] * len(dataclasses.fields(clock.Run)))
    run.entries = [clock.Entry("empty_submission", "empty", call="empty_submission"),
                   clock.Entry("v1_torch_sort", "version", "v1.py")]
    run.cases, run.samples, run.failed = [{}, {}], samples, {}
    summary = run_leaderboard.summaries(run)
    assert clock.FLOOR_RATIO not in summary["empty_submission"]["intervals"]
    assert abs(summary["v1_torch_sort"]["intervals"][clock.FLOOR_RATIO].center - 2.0) < 1e-9
    line = next(line for line in run_leaderboard.tables(pd.DataFrame([
        {"version": name, "kind": kind, "shape": "s", "status": "pass", "error": "", "rounds": 3, "stopped": "",
         "hold": "held", "mean_us": 1.0, "low_us": 1.0, "high_us": 1.0, "sol_mi300x_us": 6.0} for name, kind in
        (("empty_submission", "empty"), ("v1_torch_sort", "version"))]), {**META, "backend": "nccl"}, summary)
        .splitlines() if line.startswith("| v1_torch_sort"))
    assert "2.000 [2.000, 2.000]" in line, line
