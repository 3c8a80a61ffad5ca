"""tools/sweep_launch.py's report on synthetic measurements: the best shape per kernel, and shapes that change the
output are named."""
import pandas as pd

from tools.sweep_launch import PER_MULTIPROCESSOR, THREADS, report

META = {"version": "vT", "device": "test", "multiprocessors": 132, "world_size": 2,
        "placement": "2 ranks on 2 GPUs, one each", "date": "2026-11-22", "commit": "abc", "iterations": 5}


def test_report_picks_the_fastest_shape_and_names_broken_ones(tmp_path):
    rows = []
    for shape in ("E=8 k=2 H=6144 T=16", "E=256 k=8 H=7168 T=256"):
        for kernel in ("dispatch_send", "combine_send"):
            for per_mp in PER_MULTIPROCESSOR:
                for threads in THREADS:
                    fast = kernel == "combine_send" and (per_mp, threads) == (2, 512)
                    rows.append({"shape": shape, "kernel": kernel, "per_multiprocessor": per_mp, "threads": threads,
                                 "device_us": 50.0 if fast else 100.0 + per_mp + threads / 1000, "host_us": 10.0,
                                 "bit_identical": not (kernel == "dispatch_send" and threads == 1024)})
    text = report(pd.DataFrame(rows), META, tmp_path)
    assert "LAUNCH_SHAPE = {'dispatch_send': (0.5, 128), 'combine_send': (2, 512)}" in text
    assert "NOT bit-identical at 8 shape(s)" in text and "host µs inside the call (combine_send)" in text
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
