"""The timeline writer on synthetic rank data: the breakdown, the phase table, the Chrome trace, the picture."""
import gzip
import json

import pytest

from a2a import timeline

PHASES = ["send", "send.rows", "recv", "recv.wait"]


def rank_data(rank: int, clock_offset_ns: float, slower_ns: int = 0) -> dict:
    """One iteration: markers at 1000 and 11000 ns (this GPU's clock, shifted by clock_offset_ns); kernel `send`
    on two blocks 2000-6000 (+ slower_ns), its phase `rows` on two warps 2000-4000; kernel `recv` 7000-9000 with
    `wait` 7500-8000. The profiler saw the two stamps 500 ns (host clock) before the markers' values."""
    shift = clock_offset_ns
    records = [[0, (0 << 16) | 0, 2000, 5000], [0, (1 << 16) | 0, 2500, 6000 + slower_ns],
               [1, (0 << 16) | 0, 2000, 3000], [1, (0 << 16) | 1, 2500, 4000],
               [2, (0 << 16) | 0, 7000, 9000], [3, (0 << 16) | 0, 7500, 8000]]
    records = [[p, w, s + shift, e + shift] for p, w, s, e in records]
    events = [("kernel", "stamp_kernel(long*)", (500 + shift) / 1e3, (600 + shift) / 1e3),
              ("kernel", "stamp_kernel(long*)", (10500 + shift) / 1e3, (10600 + shift) / 1e3),
              ("user_annotation", "custom_kernel", (600 + shift) / 1e3, (3600 + shift) / 1e3),
              ("cuda_runtime", "cudaLaunchKernel", (1000 + shift) / 1e3, (1200 + shift) / 1e3)]
    return {"rank": rank, "marks": [[1000 + shift, 11000 + shift]], "records": [records], "host_call_ns": [3000],
            "clock": {"offset_ns": clock_offset_ns, "error_ns": 100.0, "timer_step_ns": 32},
            "events": events, "phases": PHASES}


META = {"device": "test device", "world_size": 2, "placement": "2 ranks on 2 GPUs, one each", "date": "2026-11-22",
        "commit": "abc", "version": "vT", "case": "num_experts: 8", "iterations": 1, "backend": "nccl", "mode": "trace"}


def test_breakdown_cuts_the_call_into_named_parts_that_sum_to_it():
    data = rank_data(0, 0.0)
    offset, error = timeline.host_to_device_ns(data)
    assert (offset, error) == (500.0, 0.0)
    rows = timeline.breakdown(data, 0, offset)
    assert rows == {"device-side (markers)": 10.0, "host and launch before the first kernel": 1.0, "send": 4.0,
                    "recv": 2.0, "gaps between kernels": 1.0, "after the last kernel": 2.0, "send / rows": 2.0,
                    "recv / wait": 0.5, "host: custom_kernel, enter to return": 3.0}
    top = ["host and launch before the first kernel", "send", "gaps between kernels", "recv", "after the last kernel"]
    assert sum(rows[name] for name in top) == rows["device-side (markers)"]


def test_phase_table_names_the_slowest_rank_and_shares():
    header, rows = timeline.phase_table([rank_data(0, 0.0), rank_data(1, 5e6, slower_ns=1000)])
    assert header == ["phase", "rank 0 µs", "rank 1 µs", "slowest rank", "share"]
    by_name = {row[0]: row for row in rows}
    assert by_name["send"][1:] == [4.0, 5.0, 1, "50%"]  # 5 µs of rank 1's 10 µs call
    assert by_name["send / rows"][1:] == [2.0, 2.0, 0, "50%"]  # of rank 0's 4 µs send kernel


def test_a_version_without_probes_is_traced_from_the_profilers_kernels():
    data = rank_data(0, 0.0)
    data["phases"], data["records"] = [], []
    # host µs -> device ns: +500. Two runs of one kernel with another on a second stream overlapping the first.
    data["events"] += [("kernel", "sort(int)", 2.0, 3.0), ("kernel", "sort(int)", 6.0, 7.0),
                       ("kernel", "ncclDevKernel_AllToAll(int)", 2.5, 4.5)]
    rows = timeline.breakdown(data, 0, 500.0)
    assert rows["host and launch before the first kernel"] == 1.5  # first kernel at 2500 ns, marker at 1000
    assert rows["kernels (union)"] == 3.5  # 2500-5000 and 6500-7500
    assert rows["gaps between kernels"] == 1.5  # 5000-6500
    assert rows["after the last kernel"] == 3.5  # 7500 to the 11000 marker
    assert rows["kernels / sort"] == 2.0 and rows["kernels / ncclDevKernel_AllToAll"] == 2.0
    top = ["host and launch before the first kernel", "kernels (union)", "gaps between kernels", "after the last kernel"]
    assert sum(rows[name] for name in top) == rows["device-side (markers)"]


def test_chrome_trace_has_ranks_blocks_host_and_alignment():
    trace = timeline.chrome_trace([rank_data(0, 0.0), rank_data(1, 5e6)], META)
    json.dumps(trace)  # serialisable
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    send = [e for e in spans if e["name"] == "send" and e["pid"] == 1]
    assert sorted(e["tid"] for e in send) == [0, 1]
    # rank 1's clock runs 5 ms ahead: aligned, its kernels sit where rank 0's do
    assert min(e["ts"] for e in send) == pytest.approx(1.0) and min(
        e["ts"] for e in spans if e["name"] == "send" and e["pid"] == 0) == pytest.approx(1.0)
    host = [e for e in spans if e["tid"] == timeline.HOST_TID and e["pid"] == 0]
    assert {e["name"] for e in host} == {"custom_kernel", "cudaLaunchKernel"}
    assert [e["ts"] for e in host if e["name"] == "custom_kernel"] == [pytest.approx(0.1)]
    alignment = trace["otherData"]["clock_alignment"]
    assert alignment["rank 1"]["device_alignment_error_ns"] == 100.0
    assert alignment["rank 1"]["device_offset_from_rank0_ns"] == 5e6
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names[(0, 1)] == "block 1" and names[(1, timeline.HOST_TID)] == "host (CPU)"
    assert names[(0, timeline.MARKER_TID)] == "call (markers)"
    assert len({timeline.HOST_TID, timeline.MARKER_TID, timeline.KERNEL_TID}) == 3


def test_write_makes_the_json_the_picture_and_the_table(tmp_path):
    ranks = [{"clean": rank_data(r, offset), "profiled": rank_data(r, offset)} for r, offset in ((0, 0.0), (1, 5e6))]
    ranks[0]["clean"]["events"] = []  # clean calls carry no profiler events
    folder = timeline.write(ranks, META, tmp_path / "t")
    assert json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["otherData"]["version"] == "vT"
    assert (folder / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (folder / "phases.md").read_text()
    assert "| send / rows" in table and "test device, 2 ranks on 2 GPUs, one each" in table and "1 clean calls" in table


def test_without_the_profilers_stamps_the_probes_still_give_the_breakdown():
    data = rank_data(0, 0.0)
    data["events"] = [e for e in data["events"] if "stamp" not in e[1]]
    offset, error = timeline.host_to_device_ns(data)
    assert offset != offset and error == float("inf")
    assert timeline.breakdown(data, 0, offset)["send"] == 4.0
    trace = timeline.chrome_trace([data], META)
    assert not [e for e in trace["traceEvents"] if e.get("tid") == timeline.HOST_TID and e["ph"] == "X"]


def test_the_table_says_each_ranks_load():
    ranks = [rank_data(0, 0.0), rank_data(1, 5e6)]
    ranks[0].update(num_tokens=7, rows_to=[3, 11])
    ranks[1].update(num_tokens=2, rows_to=[4, 0])
    text = timeline.phases_markdown(ranks, META)
    assert "rank 0: 7 tokens, sends [3, 11], receives 7; rank 1: 2 tokens, sends [4, 0], receives 11." in text


def test_the_start_skew_is_the_ranks_start_markers_apart_on_rank_0s_clock():
    """Rank 1's clock runs 5 ms ahead of rank 0's; its start markers are 3, 1 and 2 µs after rank 0's, on rank 0's
    clock: the median skew is 2 µs, and phases.md says whether the calls were aligned."""
    first, second = rank_data(0, 0.0), rank_data(1, 5e6)
    first["marks"] = [[1000, 11000], [2000, 12000], [3000, 13000]]
    second["marks"] = [[5e6 + 4000, 5e6 + 14000], [5e6 + 3000, 5e6 + 13000], [5e6 + 5000, 5e6 + 15000]]
    assert timeline.start_skew_us([first, second]) == 2.0
    for data in (first, second):
        data["records"] *= 3
        data["host_call_ns"] *= 3
        data["aligned"] = True
    text = timeline.phases_markdown([first, second], META)
    assert "Start skew (the ranks' start markers on rank 0's clock, latest - earliest, median): 2.0 µs; each call " \
           "queued behind a sleep" in text, text
    assert "Start skew" not in timeline.phases_markdown([first], META)


def test_the_table_says_what_the_probes_cost_when_the_timed_build_ran_beside():
    """2026-11-28: v13's trace showed its kernel 3 µs shorter than v10's while the clock saw a tie. The timed build's
    marker-to-marker time beside the trace build's says how much of a phase is the probes'."""
    ranks = [rank_data(0, 0.0), rank_data(1, 5e6)]
    assert timeline.probes_cost(ranks) is None and "probes' own cost" not in timeline.phases_markdown(ranks, META)
    ranks[0]["timed_marks"] = [[0, 8000], [0, 9000], [0, 20000]]  # median 9 µs against the trace build's 10
    ranks[1]["timed_marks"] = [[5e6, 5e6 + 10000]]  # no cost on rank 1
    assert timeline.probes_cost(ranks) == [(9.0, 10.0), (10.0, 10.0)]
    line = next(line for line in timeline.phases_markdown(ranks, META).splitlines() if "probes' own cost" in line)
    assert "9.0-10.0 µs marker to marker" in line and "the probes add 0.0 to 1.0 µs (0% to 11%)" in line, line


def test_a_trace_build_and_a_timed_build_load_side_by_side(tmp_path, monkeypatch):
    """A version reads A2A_TRACE at import. load_version used to set it and leave it set, so any version loaded
    after a trace build in the same process (the tracer's timed build, test_gpu's) was a trace build too."""
    import os

    from a2a.plan import load_version

    path = tmp_path / "reads_the_flag.py"
    path.write_text('import os\nTRACE = os.environ.get("A2A_TRACE") == "1"\n')
    monkeypatch.setenv("A2A_TRACE", "1")  # whatever the caller's environment says
    assert not load_version(path, "timed_one").TRACE
    assert os.environ["A2A_TRACE"] == "1"
    monkeypatch.delenv("A2A_TRACE")
    assert load_version(path, "traced_one", trace=True).TRACE and not load_version(path, "timed_two").TRACE
    assert "A2A_TRACE" not in os.environ


def _returned(world_size: int = 2, cases: int = 1) -> list:
    """What parallel_launch returns from _trace_rank: per rank, per case, {"clean", "profiled"} (1 clean call)."""
    def calls(rank: int, count: int) -> dict:
        data = rank_data(rank, 5_000_000 * rank)
        return {**data, "marks": data["marks"] * count, "records": data["records"] * count,
                "host_call_ns": [3000] * count, "aligned": True, "num_tokens": 3, "rows_to": [2] * world_size}

    return [[{"clean": calls(r, 1), "profiled": calls(r, timeline.JSON_ITERATIONS)} for _ in range(cases)]
            for r in range(world_size)]


def test_names_from_the_ranks_reach_the_table_escaped(tmp_path):
    """A phase and a profiler event named with terminal escapes (red team 33: `ESC[2J`, a title, `all checks
    passed`, written raw into phases.md and printed): the table holds them as text."""
    returned = _returned()
    for rank in returned:
        rank[0]["clean"]["phases"][0] = "\x1b[2J\x1b[H\x1b]0;owned\x07all checks passed\x1b[8m"
        rank[0]["profiled"]["events"].append(("kernel", "k\x1b[31m\nforged: pass", 1.0, 2.0))
    (checked,) = timeline.checked_ranks(returned, 2, 1, 1)
    folder = timeline.write(checked, META, tmp_path / "t")
    written = (folder / "phases.md").read_text() + gzip.decompress((folder / "trace.json.gz").read_bytes()).decode()
    assert "\x1b" not in written and "\x07" not in written and "\\x1b[2J" in written
    assert "\nforged: pass" not in written


def _broken(change) -> list:
    returned = _returned()
    change(returned[1][0])
    return returned


@pytest.mark.parametrize("returned", [
    _broken(lambda case: case["clean"]["records"][0].append([7, 0, 1, 2])),  # a phase it does not name
    _broken(lambda case: case["clean"].update(marks=[])),
    _broken(lambda case: case["clean"].update(marks=[[1, "2"]])),
    _broken(lambda case: case["clean"].update(phases="send")),
    _broken(lambda case: case["profiled"]["events"].append(("kernel", "k", float("nan"), 1.0))),
    _broken(lambda case: case["profiled"]["events"].append(("made_up", "k", 1.0, 2.0))),
    _broken(lambda case: case["clean"]["clock"].pop("offset_ns")),
    _broken(lambda case: case["clean"].update(rows_to=[1])),
    _broken(lambda case: case.pop("profiled")),
    [[]],
    "ranks",
], ids=["phase-index", "no-marks", "text-mark", "phases-text", "nan-event", "unknown-category", "no-clock",
        "short-load", "no-profiled", "no-cases", "text"])
def test_trace_data_that_does_not_fit_is_the_submissions_failure(returned):
    """Anything a rank returns outside _trace_rank's shape is refused before the analysis (red team 33: a phase
    index past the rank's names raised IndexError in the owner, which the human face reports as its own, 114)."""
    from a2a.launch import SubmissionFailed

    with pytest.raises(SubmissionFailed):
        timeline.checked_ranks(returned, 2, 1, 1)
