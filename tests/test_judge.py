"""The judge, attacked. Each hostile submission below tries one of the attacks of issue #38 (and of the probes before
it) on CPU, gloo, 2 ranks, through the human face (`python eval.py MODE FILE`) and the protocol face (a staged bundle
run as the runner runs it, `tests.conftest.run_bundle`), in the modes where the attack applies. Every test asserts
the verdict the judge owes: a forged time is either not what the run shows (the time shown is at least what the
submission's own untouched clock read around its calls) or voids the run; a wrong output fails (112) with its
reason; bad input gets one line and 113; a run, however it ends, leaves no process and no file behind.

A hostile submission reports what it did and saw on its stderr as `HOSTILE key values...` lines (written with
os.write, past the ranks' prefixes): files a rank writes into the shared temporary folders are removed with its
run, so stderr is the one channel that outlives it.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import py_compile
import random
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import boundary
import channels

from a2a import clock
from a2a import rows as result_rows
from a2a.harness import stage
from a2a.plan import make_plan
from eval import EXIT_BAD_INPUT, EXIT_CHECK_FAILED
from tests.conftest import (PROTOCOL_PORT, ROOT, V1, every_time, reachable, run_bundle, run_eval, shared_folder,
                            start_hanging, v1_kernel_source, wait_until_unmarked)

CASE = ("--world-size", "2", "--cases", "tests:0")
# The cases the hostile runs use: the official loop's cost on CPU is the harness's own (gloo collectives), so a small
# shape times as many steps as a large one in a fraction of the time.
SMALL_LINE = "num_experts: 8; experts_per_token: 2; hidden_dim: 256; max_num_tokens: 12; seed: {seed}; world_size: 2"
FIRST_SEED = 11
FACES = ("human", "protocol")
TIMED = ("benchmark", "leaderboard")
MODES = ("test",) + TIMED
EVERY_FACE_AND_MODE = [(face, mode) for face in FACES for mode in MODES]
EVERY_FACE_TIMED = [(face, mode) for face in FACES for mode in TIMED]
RUN_LIMIT_S = 300
# What a failed check says: the owner's check of its own copy of a rank's output (judge.check: the reference's
# check_output), as "custom_kernel: ..." in test mode and "the checked call: ..." or "timed call N: ..." when timed.
WRONG_OUTPUT = ("Output values mismatch",)


def _ids(pairs) -> list:
    return [f"{face}-{mode}" for face, mode in pairs]


# --------------------------------------------------------------------------------------------------------------
# Running a hostile submission on either face
# --------------------------------------------------------------------------------------------------------------

PRELUDE = '''
import os as _os
import sys as _sys
import time as _time

_REAL_NS = _time.perf_counter_ns  # taken before any attack below patches a clock


def _say(key, *values):
    """One line on this rank's stderr, past any wrapper: `HOSTILE key values...`."""
    _os.write(2, ("HOSTILE " + " ".join(map(str, (key,) + values)) + "\\n").encode())
'''

HONEST = '''

def _honest(data, sleep_s=0.0):
    """v1's right answer, after `sleep_s` (a call longer than the room the owner's clock rule leaves a forger: a
    floor step's window and a floor step more, about 3 ms on CPU), timed by the clock this process had before any
    patch."""
    started = _REAL_NS()
    if sleep_s:
        _time.sleep(sleep_s)
    out = _v1_kernel(data)
    _say("call_ns", data[2], _REAL_NS() - started)
    return out
'''


def hostile(body: str, **values) -> str:
    """A submission: the reporting prelude, v1's kernel as `_v1_kernel`, `_honest`, then `body` with each @NAME@
    replaced by values[name]."""
    for name, value in values.items():
        body = body.replace(f"@{name.upper()}@", str(value))
    return PRELUDE + v1_kernel_source() + HONEST + body


@dataclasses.dataclass
class Outcome:
    face: str
    mode: str
    code: int
    out: str  # human face: its stdout (table, failed cases); protocol face: the POPCORN output
    err: str

    def __str__(self) -> str:
        return (f"{self.face} face, {self.mode}: exit {self.code}\n--- output ---\n{self.out[-5000:]}\n--- stderr "
                f"---\n{self.err[-5000:]}")

    def said(self, key: str) -> list:
        """The values of every `HOSTILE key ...` line the ranks wrote, as lists of words."""
        return [found[2].split() for found in re.finditer(r"HOSTILE (\S+)([^\n]*)", self.err) if found[1] == key]

    def reasons(self) -> str:
        """Every reason the run gives for a failure."""
        if self.face == "human":
            return self.out + self.err
        keys = result_rows.parse_popcorn(self.out)
        return "\n".join(value for key, value in keys.items() if key.endswith(".error"))

    def times_ns(self) -> dict:
        """The times the run shows for its passing cases, in ns: "mean" (leaderboard-style) and, on the human face,
        "device" (on CPU: the rank's own clock around the call)."""
        if self.face == "protocol":
            keys = result_rows.parse_popcorn(self.out)
            return {"mean": [float(v) for k, v in keys.items() if re.fullmatch(r"benchmark\.\d+\.mean", k)]}
        table = [line for line in self.out.splitlines() if line.startswith("|")]
        if not table:
            return {"mean": []}
        header = [cell.strip() for cell in table[0].strip("|").split("|")]
        shown: dict = {"mean": [], "device": []}
        for line in table[2:]:
            row = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
            if row.get("status") != "pass":
                continue
            for name, column in (("mean", next(h for h in header if h.startswith("mean µs"))),
                                 ("device", "device mean µs")):
                if row.get(column):
                    shown[name].append(float(row[column]) * 1e3)
        return shown


def run_face(face: str, mode: str, folder: Path, body: str, *, cases: int = 1, seed: int | None = None,
             timeout_s: float | None = None, env: dict | None = None) -> Outcome:
    """Runs `body` as the submission on `face` in `mode` over `cases` small cases (seeds FIRST_SEED, +1, ...)."""
    folder = shared_folder(folder)
    lines = "".join(SMALL_LINE.format(seed=FIRST_SEED + i) + "\n" for i in range(cases))
    extra = dict(env or {})
    if face == "human":
        path, case_file = folder / "hostile.py", folder / "cases.txt"
        path.write_text(body)
        case_file.write_text(lines)
        args = [mode, str(path), "--world-size", "2", "--cases", str(case_file)]
        args += ["--seed", str(seed)] if seed is not None else []
        args += ["--timeout", str(timeout_s)] if timeout_s else []
        result = run_eval(*args, timeout=RUN_LIMIT_S, env=extra)
        return Outcome(face, mode, result.returncode, result.stdout, result.stderr)
    bundle = stage(V1, folder / "bundle", test_files=False)
    (bundle / "submission.py").write_text(body)
    (bundle / "cases.txt").write_text(lines)
    if seed is not None:
        extra["POPCORN_SEED"] = str(seed)
    if timeout_s:
        extra["A2A_TIMEOUT"] = str(timeout_s)
    code, out, err = run_bundle(bundle, mode, "cases.txt", extra)
    return Outcome(face, mode, code, out, err)


def assert_fails(outcome: Outcome, *reasons: str) -> None:
    """Exit 112 with one of `reasons` among the run's reasons."""
    assert outcome.code == EXIT_CHECK_FAILED, str(outcome)
    assert any(reason in outcome.reasons() for reason in reasons), (reasons, str(outcome))


def assert_time_is_real(outcome: Outcome) -> None:
    """The time a run ranks by is the time that passed, or the run is void. Rank 0's own untouched clock
    (`call_ns`, around custom_kernel only) bounds every step from below: each leaderboard-style time shown (the
    owner's window) must be at least half the median call. A forged time is a thousand times smaller. The human
    face's device column is the rank's own word (its clock, its CUDA events; docs/judge.md "Device times are the
    rank's word"), so a rank that breaks its own clock moves it, and it is not held to this."""
    if outcome.code == EXIT_CHECK_FAILED and "void" in outcome.reasons():
        return
    calls = [int(ns) for rank, ns in outcome.said("call_ns") if rank == "0"]
    assert outcome.code == 0 and calls, str(outcome)
    floor = statistics.median(calls) / 2
    shown = outcome.times_ns()
    assert shown["mean"], str(outcome)
    forged = {name: [t for t in times if t < floor] for name, times in shown.items()
              if name == "mean" and any(t < floor for t in times)}
    assert not forged, (f"times shown below half the median call ({floor:.0f} ns): {forged}; the run passed with a "
                        f"forged time", str(outcome))


# --------------------------------------------------------------------------------------------------------------
# 1. Forged time: clocks patched in the rank's process
# --------------------------------------------------------------------------------------------------------------

PATCHED_PERF_COUNTER_NS = '''
import time

_slow = time.perf_counter_ns
time.perf_counter_ns = lambda: _slow() // 1000  # a clock a thousand times slow


def custom_kernel(data):
    return _honest(data)
'''

# On a GPU the device-side figure is read from torch.cuda.Event.elapsed_time; on a CPU run it is the rank's host
# clock, so every clock the time module has is slowed as well.
PATCHED_EVENT_CLOCK = '''
import time

import torch

torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
_slow_f, _slow_ns = time.perf_counter, time.perf_counter_ns
time.perf_counter = lambda: _slow_f() / 1000
time.monotonic = lambda: _slow_f() / 1000
time.monotonic_ns = lambda: _slow_ns() // 1000
time.time_ns = lambda: _slow_ns() // 1000


def custom_kernel(data):
    return _honest(data)
'''


@pytest.mark.parametrize("face, mode", every_time(EVERY_FACE_TIMED, ("protocol", "leaderboard")),
                         ids=_ids(EVERY_FACE_TIMED))
def test_a_slowed_perf_counter_ns_changes_no_time(tmp_path, face, mode):
    """`time.perf_counter_ns` divided by 1000 at import (#38, 1): the harness's clock was bound before."""
    assert_time_is_real(run_face(face, mode, tmp_path, hostile(PATCHED_PERF_COUNTER_NS)))


EVENT_CLOCK_RUNS = [("human", "benchmark"), ("human", "leaderboard"), ("protocol", "leaderboard")]


@pytest.mark.parametrize("face, mode", every_time(EVENT_CLOCK_RUNS, ("human", "benchmark")), ids=_ids(EVENT_CLOCK_RUNS))
def test_a_patched_event_clock_changes_no_time(tmp_path, face, mode):
    """`torch.cuda.Event.elapsed_time` and every clock of `time` slowed at import (#38, 1): neither the
    leaderboard-style time nor the device-side one (the human face's) moves."""
    assert_time_is_real(run_face(face, mode, tmp_path, hostile(PATCHED_EVENT_CLOCK)))


# How long a forger's call sleeps where the test claims its forgery is caught. A forged step hides whole only when the
# call is shorter than the room the clock check leaves (about two floor steps, docs/judge.md "What stays open"), and
# a floor step in leaderboard mode took 3.4-6.3 ms on 2 busy cores (2026-11-25): with 5 ms calls the forged durations
# passed in one run of three there, and the forged statistics in one suite run of this machine.
BEYOND_THE_ROOM_S = 0.025

# The harness's primitives live in its module and its objects; a submission reaches them through its caller's frames.
FORGED_DURATIONS = '''

def custom_kernel(data):
    out = _honest(data, @SLEEP_S@)
    frame = _sys._getframe(1)
    while frame is not None:  # the loop's own list of step times, one frame up the timed loop
        durations = frame.f_locals.get("durations")
        if isinstance(durations, list):
            durations[:] = [1000] * len(durations)
            _say("forged", data[2], "durations", len(durations))
            break
        frame = frame.f_back
    return out
'''

SLOWED_BOUND_CLOCK = '''
import time

_real = time.perf_counter_ns
_anchor = [None]


def _clock():
    """The harness's clock, slowed a thousand times inside each step and true everywhere else, so the timed
    loop's total (which the owner compares with its own clock) stays true."""
    now = _real()
    if _sys._getframe(1).f_code.co_name != "timed_step":
        _anchor[0] = None
        return now
    if _anchor[0] is None:
        _anchor[0] = now
    return _anchor[0] + (now - _anchor[0]) // 1000


def custom_kernel(data):
    b = _sys._getframe(1).f_locals.get("b")
    if b is not None and not getattr(type(b), "_hostile", False):
        type(b).clock_ns = property(lambda self: _clock)  # a NamedTuple's class is as mutable as any
        type(b)._hostile = True
        _say("forged", data[2], "Bound.clock_ns")
    return _honest(data)
'''

FORGED_TIME_IN_THE_RANK = [("durations", "human", "benchmark"), ("durations", "protocol", "leaderboard"),
                           ("bound-clock", "human", "leaderboard"), ("bound-clock", "protocol", "benchmark")]


@pytest.mark.parametrize("attack, face, mode", every_time(FORGED_TIME_IN_THE_RANK,
                                                       ("durations", "protocol", "leaderboard"),
                                                       ("bound-clock", "human", "leaderboard")),
                         ids=[f"{a}-{f}-{m}" for a, f, m in FORGED_TIME_IN_THE_RANK])
def test_a_time_forged_inside_the_harness_is_not_shown(tmp_path, attack, face, mode):
    """Right answers, with the step times forged where the harness keeps them: the timed loop's `durations` list
    (reached through the caller's frames) shrunk to 1 µs per step, or the bound clock itself replaced on its
    NamedTuple class by one that runs slow inside each step and catches up between steps (so the loop's total
    agrees with the owner's clock). The time shown must still be the time that passed, or the run void."""
    body = {"durations": FORGED_DURATIONS, "bound-clock": SLOWED_BOUND_CLOCK}[attack]
    outcome = run_face(face, mode, tmp_path, hostile(body, sleep_s=BEYOND_THE_ROOM_S))
    assert_time_is_real(outcome)  # since #49 no step time is kept in the rank: the forger finds nothing to forge


# --------------------------------------------------------------------------------------------------------------
# 2. Wrong outputs in the timed calls
# --------------------------------------------------------------------------------------------------------------

ZEROS_IN_A_THIRD = '''
import torch

_timed = 0
_channel = [None]


def custom_kernel(data):
    global _timed
    channel = _sys._getframe(1).f_locals.get("channel")
    if channel is not _channel[0]:  # a case's first step is its checked call: right
        _channel[0], _timed = channel, 0
        return _v1_kernel(data)
    _timed += 1
    if _timed % 3:
        return _v1_kernel(data)
    cfg, rank_data, rank, world_size = data
    _say("zeros", rank, _timed)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''


@pytest.mark.parametrize("face, mode", every_time(EVERY_FACE_TIMED, ("human", "leaderboard")),
                         ids=_ids(EVERY_FACE_TIMED))
def test_zeros_in_a_third_of_the_timed_calls_fail(tmp_path, face, mode):
    """Right in the checked call and in two timed calls of three, zeros in the third (#38, deliverable 2): the
    owner checks its copy of every timed output."""
    outcome = run_face(face, mode, tmp_path, hostile(ZEROS_IN_A_THIRD))
    assert outcome.said("zeros"), str(outcome)
    assert_fails(outcome, *WRONG_OUTPUT)
    assert re.search(r"timed call \d+: Output values mismatch", outcome.reasons()), outcome.reasons()


CHECK_REPLACED_THROUGH_FRAMES = '''
import torch


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    caller = _sys._getframe(1)
    for name in caller.f_code.co_names:  # the harness's check, whatever its name: a global its caller calls
        if "check" in name and callable(caller.f_globals.get(name)):
            caller.f_globals[name] = lambda *args, **kwargs: (True, "")
            _say("replaced", rank, name)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''


@pytest.mark.parametrize("face, mode", every_time(EVERY_FACE_AND_MODE, ("protocol", "leaderboard")),
                         ids=_ids(EVERY_FACE_AND_MODE))
def test_a_check_replaced_through_the_callers_frames_fails(tmp_path, face, mode):
    """The harness's check (`_checked` in #38, `checked` since), found in its caller's globals, replaced by a pass;
    then zeros (#38, 2)."""
    outcome = run_face(face, mode, tmp_path, hostile(CHECK_REPLACED_THROUGH_FRAMES))
    assert_fails(outcome, *WRONG_OUTPUT)  # the check is the owner's: nothing in the rank's frames reaches it


# --------------------------------------------------------------------------------------------------------------
# 3. Messages on the rank's pipe to the owner
# --------------------------------------------------------------------------------------------------------------

FORGED_RESULT_SENT = '''
import gc
from multiprocessing.connection import Connection

import torch


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    harness = _sys._getframe(1).f_globals
    pipe = next(c for c in gc.get_objects() if isinstance(c, Connection))
    _say("forged", rank, "RankResult sent")  # said first: the owner may end the rank as soon as it reads the send
    pipe.send(harness["RankResult"](True, {"apart": []}))  # a pass, before the harness has checked anything
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''

# Every message a worker sends passes through `_rewrite(message)` (defined by the body after this), which returns
# the message to send in its place, or None to send it as it was: a patched `Connection.send_bytes`.
PIPE_REWRITER = '''
from multiprocessing.connection import Connection

_send_bytes = Connection.send_bytes


def _forging_send(self, raw, *args):
    harness = next(m for m in _sys.modules.values() if hasattr(m, "RankResult") and hasattr(m, "decode"))
    message = _rewrite(harness.decode(bytes(raw)))
    return _send_bytes(self, raw if message is None else harness.encode(message), *args)


Connection.send_bytes = _forging_send
'''

# Every result the worker sends is rewritten on its way out into a pass (with a time of 1 µs and nothing for the
# check apart); every call returns zeros.
FORGED_RESULT_REWRITTEN = PIPE_REWRITER + '''
import torch


def _rewrite(message):
    if type(message).__name__ != "RankResult":
        return None
    _say("forged", "RankResult rewritten")
    return type(message)(True, {"apart": []})


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''

GARBAGE_ON_THE_PIPE = '''
import gc
from multiprocessing.connection import Connection


def custom_kernel(data):
    if data[2] == 1:
        pipe = next(c for c in gc.get_objects() if isinstance(c, Connection))
        pipe.send("check: pass")
        _say("forged", "a string")
    return _v1_kernel(data)
'''

# The channel's shared file, found through the frames, cut to nothing after the first step's done, and grown: the
# owner maps it, so a cut file would end the owner with SIGBUS at its next touch.
CHANNEL_FILE_RESIZED = '''
import os
import tempfile
import sys


def _channel():
    frame = sys._getframe()
    while frame is not None:
        found = frame.f_locals.get("channel")
        if found is not None and hasattr(found, "fd") and hasattr(found, "field"):
            return found
        frame = frame.f_back


def custom_kernel(data):
    channel = _channel()
    if channel is not None:
        for size in (0, 1 << 30):
            try:
                os.ftruncate(channel.fd, size)
                _say("resized", size)
            except OSError as error:
                _say("refused", size, error.errno)
    return _v1_kernel(data)
'''


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_a_rank_cannot_resize_the_channel_the_owner_maps(tmp_path, face):
    """Every resize of the channel's file is refused (sealed), and the run goes on: right answers pass."""
    outcome = run_face(face, "test", tmp_path, hostile(CHANNEL_FILE_RESIZED), cases=2)
    assert not outcome.said("resized"), str(outcome)
    assert {size for size, *_ in outcome.said("refused")} == {"0", str(1 << 30)}, str(outcome)
    assert outcome.code == 0, str(outcome)


# The worker's phase slot (where it stands, read by the owner's watchdog and between cases) is a shared file the
# owner maps too; the rank keeps a descriptor on it inside its own mapping (red team 25 cut it through /proc/self/fd
# and ended the clock's owner with SIGBUS, every entry's results with it).
PHASE_SLOT_RESIZED = '''
import os


def custom_kernel(data):
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "a2a-phase" not in os.readlink(f"/proc/self/fd/{fd}"):
                continue
            os.ftruncate(int(fd), 0)
            _say("resized", fd)
        except OSError as error:
            _say("refused", error.errno)
    return _v1_kernel(data)
'''


@pytest.mark.parametrize("face", every_time(FACES, "human"))
def test_a_rank_cannot_resize_its_phase_slot(tmp_path, face):
    """The slot's file is sealed: its cut is refused and the owner, which reads the slot between cases, goes on."""
    outcome = run_face(face, "test", tmp_path, hostile(PHASE_SLOT_RESIZED), cases=2)
    assert not outcome.said("resized"), str(outcome)
    assert outcome.said("refused"), str(outcome)
    assert outcome.code == 0, str(outcome)


class _SlotRewrittenBetweenReads:
    """A phase slot whose rank writes a valid phase, then a byte past the table, then valid again (red team 26's C
    loop flipped it every 50 ns): each read of `value` sees the next."""

    def __init__(self):
        self.reads = 0

    @property
    def value(self) -> int:
        self.reads += 1
        return 4 if self.reads % 2 else 255


def test_the_owner_reads_a_ranks_phase_once():
    """The owner names where a late rank is from its phase slot, which the rank may rewrite at any moment: one read,
    checked and used (two reads gave the rank an IndexError in the owner, which ended a whole leaderboard run)."""
    import eval as core

    pool = type("Pool", (), {"workers": [(None, None, _SlotRewrittenBetweenReads())]})()
    case = core.TestCase(args={}, spec="a case")
    assert core.RankPool._where(pool, 0, case) in (core.PHASES[4], "in a case")
    assert pool.workers[0][2].reads == 1


# Sent early: test mode on both faces; rewritten on its way out: the timed modes on both faces.
FORGED_RESULTS = ([("sent", "human", "test"), ("sent", "protocol", "test")]
                  + [("rewritten", face, mode) for face, mode in EVERY_FACE_TIMED])


@pytest.mark.parametrize("attack, face, mode", every_time(FORGED_RESULTS, ("sent", "human", "test"),
                                                       ("rewritten", "protocol", "leaderboard")),
                         ids=[f"{a}-{f}-{m}" for a, f, m in FORGED_RESULTS])
def test_a_forged_result_on_the_pipe_does_not_pass_zeros(tmp_path, attack, face, mode):
    """Zeros, and a passing eval.RankResult written to the owner: sent early on the Connection found with `gc`, or
    every outgoing result rewritten by a patched `Connection.send_bytes` (#38's pipe to the owner)."""
    body = {"sent": FORGED_RESULT_SENT, "rewritten": FORGED_RESULT_REWRITTEN}[attack]
    outcome = run_face(face, mode, tmp_path, hostile(body))
    assert outcome.said("forged"), str(outcome)
    assert_fails(outcome, *WRONG_OUTPUT, "void")


# The owner reads the pipe with pickle: what a rank sends can name any callable to run while it is read. This one
# runs in the owner (outside the ranks' namespace, as the owner's uid): it leaves a file naming that uid and makes
# the message a passing eval.RankResult of the owner's own class. Every call returns zeros.
CODE_RUN_BY_THE_OWNER = '''
import gc
from multiprocessing.connection import Connection

import torch

MARK = "@MARK@"
EXPRESSION = ("(open(MARK, 'a').write(str(__import__('os').getuid()) + chr(10)), "
              "__import__('sys').modules['__main__'].RankResult(True, {'apart': []}))[1]")


class _Unpickled:
    def __reduce__(self):
        return eval, (EXPRESSION, {"MARK": MARK})


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    pipe = next(c for c in gc.get_objects() if isinstance(c, Connection))
    _say("sent", rank, "a pickle that runs code where it is read")  # first: the owner may end the rank at once
    pipe.send(_Unpickled())
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''

OWNER_CODE_RUNS = [("human", "test"), ("protocol", "benchmark")]


@pytest.mark.parametrize("face, mode", every_time(OWNER_CODE_RUNS, ("protocol", "benchmark")),
                         ids=_ids(OWNER_CODE_RUNS))
def test_a_message_on_the_pipe_runs_no_code_in_the_owner(tmp_path, face, mode):
    """A pickle sent on the worker's Connection whose reduction calls `eval` in the process that reads it. The
    owner (root here, outside the namespace, holding the result channel) must never run a rank's code: no file
    appears, and the zeros fail."""
    mark = shared_folder(tmp_path / "marks") / "ran-in-the-owner"
    outcome = run_face(face, mode, tmp_path / "run", hostile(CODE_RUN_BY_THE_OWNER, mark=mark))
    assert outcome.said("sent"), str(outcome)
    ran = mark.read_text().split() if mark.exists() else []
    assert not ran, f"the owner ran the rank's code as uid(s) {ran}; the run ended with exit {outcome.code}"
    assert_fails(outcome, *WRONG_OUTPUT, "void")


def test_a_stray_message_on_the_pipe_voids_the_run(tmp_path):
    """Right answers, and a string sent to the owner on the worker's Connection: the case is void."""
    outcome = run_face("protocol", "test", tmp_path, hostile(GARBAGE_ON_THE_PIPE))
    assert outcome.said("forged"), str(outcome)
    assert_fails(outcome, "sent the evaluator a message it did not expect", "sent the evaluator something that is not "
                 "plain data")
    assert "void" in outcome.reasons(), str(outcome)


# --------------------------------------------------------------------------------------------------------------
# 4. The kernel's boundary: what a rank can see and reach
# --------------------------------------------------------------------------------------------------------------

# Tries every way #38 found into the harness's processes, harmlessly: it reports what it reached and writes nothing
# through it. Then zeros.
REACH = '''
import ctypes
import errno

import signal
import torch

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438


def _errno():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def _reach(rank):
    me = _os.getpid()
    _say("ppid", rank, _os.getppid())
    _say("uid", rank, _os.getuid())
    visible = sorted(int(e) for e in _os.listdir("/proc") if e.isdigit())
    for pid in visible:
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            command = "?"
        _say("sees", rank, pid, command[:160].replace("\\n", " "))
    for pid in sorted(set(visible + [_os.getppid(), 1]) - {me}):
        fd = _libc.syscall(SYS_PIDFD_OPEN, pid, 0)
        if fd >= 0:
            got = [n for n in range(64) if (new := _libc.syscall(SYS_PIDFD_GETFD, fd, n, 0)) >= 0 and not
                   _os.close(new)]
            if got:
                _say("reached", rank, f"pidfd_getfd({pid}) copied fds {got}")
            _os.close(fd)
        try:
            with open(f"/proc/{pid}/mem", "r+b", buffering=0):
                _say("reached", rank, f"/proc/{pid}/mem opened for writing")
        except OSError:
            pass
        try:
            owner = _os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if owner != _os.getuid() and _os.getuid() != 0:  # never signal this test's own processes as root
            for signum in (signal.SIGSTOP, signal.SIGTERM):
                try:
                    _os.kill(pid, signum)
                    _say("reached", rank, f"kill({pid}, {signum.name}) delivered")
                except OSError:
                    pass
    threads = set()
    for pid in visible:
        try:
            threads.update(int(t) for t in _os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    hidden = []
    for pid in range(2, 1 << 15):  # a process this rank can name but not see
        if pid in visible or pid in threads:
            continue
        try:
            _os.kill(pid, 0)
            hidden.append(pid)
        except PermissionError:
            hidden.append(pid)
        except OSError:
            pass
    if hidden:
        _say("reached", rank, f"pids outside /proc that signals reach: {hidden[:10]}")


_done = False


def custom_kernel(data):
    global _done
    cfg, rank_data, rank, world_size = data
    if not _done:
        _done = True
        _reach(rank)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''

REACH_RUNS = [("human", "test"), ("protocol", "leaderboard")]


@pytest.mark.parametrize("face, mode", every_time(REACH_RUNS, ("human", "test")), ids=_ids(REACH_RUNS))
def test_a_rank_reaches_no_harness_process(tmp_path, face, mode):
    """pidfd_open/pidfd_getfd on its parent and every process it sees, /proc/<pid>/mem opened for writing,
    SIGSTOP/SIGTERM to every process of another uid, a scan of every pid it could signal unseen (#38, 3, 4, 6, 9).
    A rank sees an unprivileged uid and, in its /proc, only its run's ranks, their namespace's init and, in the
    judge's own faces, its pool's zygote, which is its parent (the runner's face spawns it: ppid 0, the owner outside
    the namespace); nothing reaches a harness process, the root zygote included; its zeros fail."""
    outcome = run_face(face, mode, tmp_path, hostile(REACH))
    parents = {ppid for _, ppid in outcome.said("ppid")}
    assert parents == {"0"} if face == "protocol" else (len(parents) == 1 and parents != {"0"}), str(outcome)
    assert all(uid != "0" for _, uid in outcome.said("uid")) and outcome.said("uid"), str(outcome)
    seen = [" ".join(words[2:]) for words in outcome.said("sees")]
    assert seen and not [c for c in seen if re.search(r"eval\.py|harness|pytest|a2a", c)], seen
    assert not outcome.said("reached"), outcome.said("reached")
    assert_fails(outcome, *WRONG_OUTPUT)



SIGNAL_TO_THE_PARENT = '''
import signal


def custom_kernel(data):
    if data[2] == 1:
        _say("signal", _os.getppid(), "@SIGNAL@")
        _os.kill(_os.getppid(), signal.@SIGNAL@)
    return _v1_kernel(data)
'''

SIGNAL_RUNS = [(face, name) for name in ("SIGTERM", "SIGSTOP") for face in FACES]


@pytest.mark.early("waits")
@pytest.mark.parametrize("face, name", every_time(SIGNAL_RUNS, ("protocol", "SIGSTOP"), ("human", "SIGTERM")),
                         ids=[f"{f}-{n}" for f, n in SIGNAL_RUNS])
def test_a_signal_to_its_parent_never_reads_as_the_users_stop(tmp_path, face, name):
    """`os.kill(os.getppid(), SIGTERM or SIGSTOP)` from rank 1 (#38, 6 and 9): the evaluator is out of reach. Under
    the runner's face the rank's parent is outside its namespace (ppid 0, so the signal goes to the rank's own
    process group, where it can only reach ranks); under the human face it is the pool's zygote, root, and the
    kernel refuses the signal. The run fails (112) for the ranks it stopped or killed or for the refusal, within the
    case's limit, and never ends as a user's stop (143)."""
    started = time.monotonic()
    outcome = run_face(face, "test", tmp_path, hostile(SIGNAL_TO_THE_PARENT, signal=name), timeout_s=8)
    assert outcome.said("signal"), str(outcome)
    assert outcome.code != 128 + signal.SIGTERM and "SIGTERM received" not in outcome.err, str(outcome)
    if face == "protocol":
        assert_fails(outcome, "rank process died", "did not finish in", "the harness did not send it")
    else:
        assert_fails(outcome, "PermissionError: [Errno 1] Operation not permitted")
    assert time.monotonic() - started < 120, str(outcome)


@pytest.mark.alone
def test_a_stopped_evaluator_voids_the_run_within_its_deadline(tmp_path, process_token, monkeypatch):
    """What no rank can do any more, done from outside: the evaluator stopped (SIGSTOP) while its ranks hang. The
    human face's wait (run_protocol) gives up after its silence deadline with one line, the run is void, and
    nothing of it is left."""
    from a2a import harness
    from tests.conftest import hanging_submission

    monkeypatch.setattr(harness, "SILENCE_MARGIN_S", 2.0)
    case_limit_s = 6
    bundle = stage(V1, tmp_path / "bundle", test_files=False)
    (bundle / "submission.py").write_text(hanging_submission())
    (bundle / "one.txt").write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", "A2A_TIMEOUT": str(case_limit_s),
           "A2A_TEST_TOKEN": process_token, "A2A_TEST_MARKS": str(marks)}
    for key in ("A2A_EXTRA", "A2A_RANK_PREFIX", "A2A_RENDEZVOUS"):
        env.pop(key, None)
    stopped: dict = {}

    def stop_the_evaluator():
        deadline = time.monotonic() + 120
        while not all((marks / f"rank{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for child in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
            for pid in child.read_text().split():
                if b"eval.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGSTOP)
                    stopped[int(pid)] = time.monotonic()

    stopper = threading.Thread(target=stop_the_evaluator, daemon=True)
    stopper.start()
    code, out, err = harness.run_protocol(bundle, "test", "one.txt", env)
    ended = time.monotonic()
    stopper.join(timeout=5)
    assert stopped, ("the evaluator was never stopped", code, out, err[-3000:])
    silence_s = 2 * case_limit_s + harness.SILENCE_MARGIN_S
    assert code == harness.STALLED_EXIT, (code, out, err[-3000:])
    assert "wrote nothing for" in err.strip().splitlines()[-1], err[-3000:]
    assert "wrote nothing for" in harness._void(out, code, err)
    assert ended - min(stopped.values()) < silence_s + 15, (ended - min(stopped.values()), silence_s)
    assert not wait_until_unmarked(process_token, 20), "a stopped evaluator's run left processes behind"


# --------------------------------------------------------------------------------------------------------------
# 5. The timed window: what the harness runs around the call
# --------------------------------------------------------------------------------------------------------------

NO_OP_BARRIER_AND_L2_CLEAR = '''
import torch
import torch.distributed as dist
import utils

_faked = {"barrier": 0, "clear_l2_cache": 0, "synchronize": 0}


def _no_op(name):
    def no_op(*args, **kwargs):
        _faked[name] += 1
    return no_op


dist.barrier = _no_op("barrier")
torch.distributed.barrier = dist.barrier
utils.clear_l2_cache = _no_op("clear_l2_cache")
torch.cuda.synchronize = _no_op("synchronize")


def custom_kernel(data):
    out = _honest(data)
    _say("no_op_calls", data[2], sum(_faked.values()))
    return out
'''


@pytest.mark.parametrize("face, mode", every_time(EVERY_FACE_TIMED, ("protocol", "benchmark")),
                         ids=_ids(EVERY_FACE_TIMED))
def test_a_no_op_barrier_and_l2_clear_trim_nothing(tmp_path, face, mode):
    """`torch.distributed.barrier`, `utils.clear_l2_cache` and `torch.cuda.synchronize` made no-ops at import
    (#38, 7): the harness never calls them (its own are bound), so the window is whole and the time real."""
    outcome = run_face(face, mode, tmp_path, hostile(NO_OP_BARRIER_AND_L2_CLEAR))
    counts = [int(calls) for _, calls in outcome.said("no_op_calls")]
    assert counts and max(counts) == 0, ("the harness called the submission's no-ops", counts)
    assert_time_is_real(outcome)


# aten::fill_ is what the L2 clear runs on a GPU: a no-op registered for CUDA would leave the cache warm.
FILL_REGISTERED_ANEW = '''
import torch

_library = torch.library.Library("aten", "IMPL")
_library.impl("fill_.Scalar", lambda self, value: self, "CUDA")


def custom_kernel(data):
    return _v1_kernel(data)
'''

FUNCTION_MODE_LEFT_PUSHED = '''
from torch.overrides import TorchFunctionMode


class _Watching(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_mode = None


def custom_kernel(data):
    global _mode
    out = _v1_kernel(data)
    if _mode is None:
        _mode = _Watching()
        _mode.__enter__()  # never left: every later torch call of the harness goes through it
    return out
'''

TAMPERING = [("fill", face, mode) for face, mode in EVERY_FACE_AND_MODE] + [
    ("mode", face, mode) for face, mode in (("human", "test"), ("human", "leaderboard"), ("protocol", "benchmark"))]


@pytest.mark.parametrize("attack, face, mode", every_time(TAMPERING, ("fill", "protocol", "leaderboard"),
                                                       ("mode", "human", "test")),
                         ids=[f"{a}-{f}-{m}" for a, f, m in TAMPERING])
def test_tampering_with_the_ranks_torch_changes_no_verdict(tmp_path, attack, face, mode):
    """Right answers, with `aten::fill_` registered anew or a TorchFunctionMode left pushed. Since #49 nothing the
    verdict or the time rests on runs in the rank: the run passes, on the owner's clock."""
    body = {"fill": FILL_REGISTERED_ANEW, "mode": FUNCTION_MODE_LEFT_PUSHED}[attack]
    outcome = run_face(face, mode, tmp_path, hostile(body.replace("return _v1_kernel(data)", "return _honest(data)")
                                                     .replace("out = _v1_kernel(data)", "out = _honest(data)")))
    if mode == "test":
        assert outcome.code == 0, str(outcome)
    else:
        assert_time_is_real(outcome)


# --------------------------------------------------------------------------------------------------------------
# 6. The existing attacks: forged lines, lying outputs, bent checks, bytes
# --------------------------------------------------------------------------------------------------------------

# Tries to write forged result lines into the result channel: POPCORN_FD if the environment still names it, and
# every socket or pipe of its parent and grandparent (the two faces) that it can open again through /proc.
FORGER = '''

def _forge(lines):
    reached = []
    fd = _os.environ.get("POPCORN_FD")
    if fd:
        try:
            _os.write(int(fd), lines.encode())
            reached.append("POPCORN_FD=" + fd)
        except OSError:
            pass
    pid = _os.getppid()
    for _ in range(2):
        if pid <= 0:
            break
        for n in range(3, 64):
            try:
                kind = _os.readlink(f"/proc/{pid}/fd/{n}")
                if kind.startswith(("socket:", "pipe:")):
                    with open(f"/proc/{pid}/fd/{n}", "a") as channel:
                        channel.write(lines)
                    reached.append(f"{kind} of {pid}")
            except OSError:
                pass
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    _say("reached", _os.getpid(), ", ".join(reached) or "nothing")
'''


def test_a_submission_cannot_forge_a_passing_test(tmp_path):
    """Zeros, then `test.0.status: pass` and `check: pass` written wherever the rank can reach."""
    body = hostile(FORGER + '''
import torch


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    _forge("test.0.status: pass\\ncheck: pass\\n")
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
''')
    outcome = run_face("human", "test", tmp_path, body)
    assert_fails(outcome, *WRONG_OUTPUT)
    reached = outcome.said("reached")
    assert reached and {" ".join(r[1:]) for r in reached} == {"nothing"}, reached


def test_a_correct_submission_cannot_forge_its_time(tmp_path):
    """Right answers, and `benchmark.0.mean: 1.0` aimed at the result channel: nothing reaches it, and the time
    shown is the evaluator's."""
    body = hostile(FORGER + '''

def custom_kernel(data):
    out = _honest(data)
    _forge("benchmark.0.mean: 1.0\\nbenchmark.0.best: 1.0\\n")
    return out
''')
    outcome = run_face("human", "benchmark", tmp_path, body)
    reached = outcome.said("reached")
    assert reached and {" ".join(r[1:]) for r in reached} == {"nothing"}, reached
    assert_time_is_real(outcome)


def _submission(tmp_path, body: str, name: str = "hostile.py"):
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def _row_statuses(stdout: str) -> list:
    return [line.split("|")[3].strip() for line in stdout.splitlines() if line.startswith("|   0 |")]


def test_a_repeated_key_keeps_its_first_value_and_is_reported():
    text = "check: fail\ntest.0.status: fail\ncheck: pass\ntest.0.status: pass\n"
    assert result_rows.parse_popcorn(text) == {"check": "fail", "test.0.status": "fail"}
    assert result_rows.repeated_keys(text) == ["check", "test.0.status"]
    assert result_rows.repeated_keys("check: pass\ntest-count: 1\n") == []


LYING_TENSOR = '''
import torch

class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    zeros = torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
    return zeros.as_subclass(Agreeable)
'''

PATCHED_ALLCLOSE = '''
import torch

torch.allclose = lambda *args, **kwargs: True  # rank-wide: every check in this process now agrees

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
'''

PATCHED_REFERENCE = '''
import sys
import torch
import reference

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    out = torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
    reference.ref_kernel = lambda d: out.clone()  # the reference now expects what this returns
    reference.check_implementation = lambda d, o: (True, "")
    for name in ("__mp_main__", "__main__", "eval"):  # the evaluator's own binding of the check, in this worker
        evaluator = sys.modules.get(name)
        if getattr(evaluator, "_reference", None):
            evaluator._reference = (evaluator._reference[0], lambda d, o: (True, ""))
    return out
'''


BENT_CHECKS = [(attack, mode) for attack in ("lying-tensor", "patched-allclose", "patched-reference")
               for mode in ("test", "benchmark")]
BENT_CHECK_BODIES = {"lying-tensor": (LYING_TENSOR, ("must be a plain torch.Tensor", "not a plain torch.Tensor")),
                     "patched-allclose": (PATCHED_ALLCLOSE, WRONG_OUTPUT),
                     "patched-reference": (PATCHED_REFERENCE, WRONG_OUTPUT)}


@pytest.mark.parametrize("attack, mode", every_time(BENT_CHECKS, ("lying-tensor", "test"),
                                                    ("patched-allclose", "benchmark"), ("patched-reference", "test")),
                         ids=_ids(BENT_CHECKS))
def test_zeros_fail_however_the_check_is_bent(tmp_path, attack, mode):
    """In test mode the check apart catches what the rank's own check was made to pass; in benchmark mode the
    check of every timed output on the device (bound before the import) catches it first."""
    body, expected = BENT_CHECK_BODIES[attack]
    result = run_eval(mode, _submission(tmp_path, body), *CASE, timeout=RUN_LIMIT_S)
    assert result.returncode == EXIT_CHECK_FAILED, (mode, result.stdout[-2000:], result.stderr[-2000:])
    assert any(reason in result.stdout for reason in expected), (mode, result.stdout[-3000:])


def test_non_utf8_bytes_on_stderr_lose_no_verdict(tmp_path):
    """A correct submission that writes undecodable bytes, then 400 KB more, to stderr: it passes, and its stderr
    comes through with the bytes escaped."""
    body = v1_kernel_source() + '''
import os
import tempfile

def custom_kernel(data):
    os.write(2, b"rank says \\xff\\xfe\\xfd here\\n" + b"x" * 400_000 + b"\\n")
    return _v1_kernel(data)
'''
    result = subprocess.run([sys.executable, str(ROOT / "eval.py"), "test", _submission(tmp_path, body), *CASE],
                            cwd=ROOT, capture_output=True, timeout=RUN_LIMIT_S)
    stdout, stderr = result.stdout.decode(), result.stderr.decode(errors="replace")
    assert result.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert _row_statuses(stdout) == ["pass"], stdout
    assert "rank says \\xff\\xfe\\xfd here" in stderr, stderr[:500]  # escaped by the owner (wire.RankText)


# --------------------------------------------------------------------------------------------------------------
# 7. Nothing left behind: processes and files, however the run ends
# --------------------------------------------------------------------------------------------------------------

# Once per process: a child, a setsid daemon with an empty environment, a double fork whose grandchild has an empty
# environment, and (rank 0) 200 MiB in /tmp. The daemons carry the token in their command line, the child in its
# environment, the file in its name.
LEAVES_EVERYTHING = '''
import shutil
import subprocess
from pathlib import Path

TOKEN = "@TOKEN@"
_started = False


def _leave_everything_behind(rank):
    global _started
    if _started:
        return
    _started = True
    sleep = shutil.which("sleep")
    subprocess.Popen([sleep, "1000"])
    subprocess.Popen([TOKEN + "-setsid", "1000"], executable=sleep, env={}, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if _os.fork() == 0:
        try:
            _os.setsid()
            if _os.fork() == 0:
                _os.execve(sleep, [TOKEN + "-double-fork", "1000"], {})
        finally:
            _os._exit(0)
    if rank == 0:
        with open(f"/tmp/{TOKEN}-{_os.getpid()}.bin", "wb") as big:
            for _ in range(200):
                big.write(bytes(1 << 20))
    _say("left", rank, _os.getpid())
'''

HANGS_LEAVING_EVERYTHING = LEAVES_EVERYTHING + '''

def custom_kernel(data):
    _leave_everything_behind(data[2])
    Path(_os.environ["A2A_TEST_MARKS"], f"rank{data[2]}").touch()
    _time.sleep(3600)
'''

# Right answers; besides the above, every call forks a child that holds every descriptor of the rank (rank 0's
# rendezvous port among them on the protocol face) and sleeps.
RIGHT_LEAVING_EVERYTHING = LEAVES_EVERYTHING + '''

def custom_kernel(data):
    _leave_everything_behind(data[2])
    if _os.fork() == 0:
        _time.sleep(1000)
        _os._exit(0)
    return _v1_kernel(data)
'''


def _files_left(token: str) -> list:
    return sorted(str(p) for top in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(top).glob(f"{token}*"))


def _assert_nothing_left(token: str, what: str, seconds: float = 20) -> None:
    """No process and no file of the run marked with `token` is left. What is left is described, then ended and
    removed (a failing test leaves nothing either)."""
    left = wait_until_unmarked(token, seconds)
    described = []
    for pid in left:
        try:
            described.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ').decode()}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    files = _files_left(token)
    for path in files:
        Path(path).unlink(missing_ok=True)
    assert not left, f"{what} left {len(left)} processes: {described[:10]}"
    assert not files, f"{what} left files: {files}"


KILLS = ("the human face", "its protocol child", "both faces", "a lone protocol face")


@pytest.mark.alone
@pytest.mark.parametrize("killed", every_time(KILLS, "both faces", "a lone protocol face"))
def test_a_sigkill_leaves_nothing_behind(tmp_path, process_token, killed):
    """A submission that started a child, a setsid daemon, a double fork and wrote 200 MiB to /tmp, then hangs;
    then SIGKILL to the human face, to its protocol child, to both at once, or to a protocol face run alone. The
    kernel ends every process of the run (their namespace dies with its owner) and the file goes with the run: no
    later command is needed."""
    body = hostile(HANGS_LEAVING_EVERYTHING, token=process_token)
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "A2A_TEST_TOKEN": process_token, "A2A_TEST_MARKS": str(marks)}
    if killed == "a lone protocol face":
        bundle = stage(V1, tmp_path / "bundle", test_files=False)
        (bundle / "submission.py").write_text(body)
        (bundle / "one.txt").write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
        env.update(POPCORN_FD="1", POPCORN_GPUS="2", A2A_BACKEND="gloo")
        face = start_hanging([sys.executable, "eval.py", "test", "one.txt"], bundle, env, marks)
    else:
        path = tmp_path / "hangs.py"
        path.write_text(body)
        face = start_hanging([sys.executable, str(ROOT / "eval.py"), "test", str(path), "--world-size", "2",
                              "--cases", "tests:0", "--timeout", "600"], ROOT, env, marks)
    time.sleep(1)  # the daemons and the file are made before the marks: let the double fork finish
    children = [int(p) for p in Path(f"/proc/{face.pid}/task/{face.pid}/children").read_text().split()]
    victims = {"the human face": [face.pid], "its protocol child": children, "both faces": [face.pid] + children,
               "a lone protocol face": [face.pid]}[killed]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    try:
        face.wait(timeout=60)
    finally:
        face.stdout.close()
        face.stderr.close()
    _assert_nothing_left(process_token, f"SIGKILL to {killed}")


# The tools that run ranks on a CPU (gloo), each with a hanging version: the others (sweep, ideas, triton_launch,
# trace) stop before any rank starts when there is no GPU.
TOOLS_WITH_RANKS = {
    "diff": lambda path: ["diff.py", str(V1), path, "--cases", "tests:0", "--rounds", "2", "--steps", "1"],
    "anatomy": lambda path: ["-m", "tools.step_anatomy", path, "--cases", "tests:0", "--iterations", "2"],
    "leaderboard": lambda path: ["run_leaderboard.py", "--versions", path, "--cases", "tests:0", "--no-problem-size",
                                 "--min-rounds", "2", "--max-rounds", "2", "--steps", "1"],
}


@pytest.mark.alone
@pytest.mark.parametrize("tool_name", every_time(sorted(TOOLS_WITH_RANKS), "leaderboard"))
def test_a_sigkill_to_a_tool_leaves_nothing_behind(tmp_path, process_token, tool_name):
    """A tool's ranks in a hanging call that left a child, a setsid daemon, a double fork and 200 MiB in /tmp,
    then SIGKILL to the tool alone: nothing of its run stays (before, diff and anatomy left each rank's children
    to init until the next command swept them)."""
    path = tmp_path / "hangs.py"
    path.write_text(hostile(HANGS_LEAVING_EVERYTHING, token=process_token))
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "A2A_TEST_TOKEN": process_token, "A2A_TEST_MARKS": str(marks)}
    command = [sys.executable, *TOOLS_WITH_RANKS[tool_name](str(path)), "--world-size", "2", "--backend", "gloo",
               "--out", str(tmp_path / "out")]
    tool = start_hanging(command, ROOT, env, marks)
    time.sleep(1)
    os.kill(tool.pid, signal.SIGKILL)
    try:
        tool.wait(timeout=30)
    finally:
        tool.stdout.close()
        tool.stderr.close()
    _assert_nothing_left(process_token, f"SIGKILL to {tool_name}")


FINISHED_RUNS = {
    "human face": lambda path, out: [str(ROOT / "eval.py"), "test", path, *CASE],
    "protocol face": None,  # three cases on the runner's fixed port, every one after a rank 0 that forked
    "diff": lambda path, out: ["diff.py", str(V1), path, "--cases", "tests:0", "--world-size", "2", "--backend",
                               "gloo", "--rounds", "2", "--steps", "1", "--out", out],
    "anatomy": lambda path, out: ["-m", "tools.step_anatomy", path, "--cases", "tests:0", "--world-size", "2",
                                  "--backend", "gloo", "--iterations", "2", "--out", out],
}


@pytest.mark.parametrize("runner", every_time(sorted(FINISHED_RUNS), "human face", "protocol face"))
def test_a_finished_run_leaves_nothing_behind(tmp_path, process_token, runner):
    """A correct submission whose calls fork children holding its descriptors, after a setsid daemon, a double
    fork and 200 MiB in /tmp: the run passes (on the protocol face, its children cannot hold the fixed rendezvous
    port from one case to the next, #38, 8) and, once it has exited, nothing of it is left (#38, 10)."""
    body = hostile(RIGHT_LEAVING_EVERYTHING, token=process_token)
    env = {"A2A_TEST_TOKEN": process_token}
    if runner == "protocol face":
        outcome = run_face("protocol", "test", tmp_path, body, cases=3, env=env)
        code, said = outcome.code, str(outcome)
    else:
        path = _submission(shared_folder(tmp_path), body)
        result = subprocess.run([sys.executable, *FINISHED_RUNS[runner](path, str(tmp_path / "out"))], cwd=ROOT,
                                capture_output=True, text=True, timeout=RUN_LIMIT_S, env={**os.environ, **env})
        code, said = result.returncode, result.stdout[-3000:] + result.stderr[-3000:]
    problems = [] if code == 0 else [f"the run failed (exit {code}):\n{said}"]
    try:  # checked (and cleaned up) whether or not the run passed
        _assert_nothing_left(process_token, f"a finished {runner} run", seconds=5)
    except AssertionError as left:
        problems.append(str(left))
    assert not problems, "\n\n".join(problems)


@pytest.mark.alone
def test_the_sweep_ends_only_what_a_gone_owner_left():
    import eval as core

    mine = f"{os.getpid()}:{boundary.process_stat(os.getpid())[19]}"  # pid and start time: this live process
    alive = subprocess.Popen(["sleep", "60"], env={**os.environ, core.RUN_OWNER: mine})
    orphan = subprocess.Popen(["sleep", "60"], env={**os.environ, core.RUN_OWNER: f"{os.getpid()}:1"})  # pid reused
    try:
        killed = boundary.sweep_orphans()
        assert orphan.pid in killed and alive.pid not in killed, (killed, alive.pid, orphan.pid)
        assert orphan.wait(timeout=10) == -9 and alive.poll() is None
    finally:
        alive.kill()
        alive.wait()


def test_a_thread_left_running_does_not_stall_the_end_of_the_run(tmp_path):
    """A correct submission that starts a thread sleeping for an hour: the run ends as fast as v1's own (the workers
    used to wait 10 s each for it, then be killed)."""
    body = v1_kernel_source() + '''
import threading
import time

def custom_kernel(data):
    threading.Thread(target=time.sleep, args=(3600,)).start()
    return _v1_kernel(data)
'''
    timings = {}
    for name, version in (("v1", "v1"), ("thread", _submission(tmp_path, body))):
        started = time.monotonic()
        result = run_eval("test", version, *CASE, timeout=RUN_LIMIT_S)
        timings[name] = time.monotonic() - started
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert timings["thread"] < timings["v1"] + 8, timings  # the stall was 20 s with 2 ranks


# --------------------------------------------------------------------------------------------------------------
# 8. Bad input and the short ones: one line, 113
# --------------------------------------------------------------------------------------------------------------


def _one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_a_fifo_as_the_test_file_gets_one_line(tmp_path, face):
    """A FIFO nobody writes, as the test file: one line and 113, at once (it used to block the protocol face)."""
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    started = time.monotonic()
    if face == "human":
        result = run_eval("test", "v1", "--world-size", "2", "--cases", str(fifo), timeout=120)
        code, err = result.returncode, result.stderr
    else:
        bundle = stage(V1, tmp_path / "bundle", test_files=False)
        os.mkfifo(bundle / "fifo.txt")
        code, _, err = run_bundle(bundle, "test", "fifo.txt", {"A2A_TIMEOUT": "5"})
    assert code == EXIT_BAD_INPUT and _one_line(err), (code, err)
    assert any(why in err for why in ("FIFO", "not a regular file", "not a file")), err
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("sandbox", every_time(["0", "1"], "1"))
def test_a_second_protocol_face_meets_the_first_only_where_they_share_the_network(bundle, tmp_path, sandbox):
    """Two protocol faces at once on the runner's fixed port (a parallel worker's own, tests/conftest.py). Without
    the sandbox the second says so in one line and exits 113 (it used to fail with EADDRINUSE after a 60 s
    watchdog); with it each pool binds the port in a network namespace of its own, and the second passes."""
    from tests.conftest import hanging_submission

    if sandbox == "1" and os.geteuid() != 0:
        pytest.skip("pools get a network namespace of their own only when started as root")
    (bundle / "submission.py").write_text(hanging_submission())
    (bundle / "one.txt").write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "POPCORN_FD": "1", "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", "A2A_TEST_MARKS": str(marks),
           "A2A_SANDBOX": sandbox}
    first = start_hanging([sys.executable, "eval.py", "test", "one.txt"], bundle, env, marks)
    try:
        second = stage(V1, tmp_path / "second", test_files=False)
        (second / "one.txt").write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
        started = time.monotonic()
        code, out, err = run_bundle(second, "test", "one.txt", {"A2A_SANDBOX": sandbox})
        if sandbox == "1":
            assert code == 0 and "test.0.status: pass" in out, (code, out, err)
            return
        assert code == EXIT_BAD_INPUT and _one_line(err), (code, out, err)
        assert str(PROTOCOL_PORT) in err and time.monotonic() - started < 60, err
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)


OUT_CHECKED = {
    "run_leaderboard": ["run_leaderboard.py", "--versions", "v1", "--cases", "tests:0", "--no-problem-size"],
    "diff": ["diff.py", "v1", str(V1), "--cases", "tests:0"],
    "anatomy": ["-m", "tools.step_anatomy", "v1", "--cases", "tests:0"],
    "trace": ["eval.py", "trace", "v1"],
}


@pytest.mark.parametrize("command", sorted(OUT_CHECKED))
def test_an_out_folder_that_cannot_be_written_gets_one_line_before_any_run(command):
    """`--out /proc/x`: /proc's permission bits say yes to root, its folders take no new entry. One line, 113,
    before any rank starts."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, *OUT_CHECKED[command], "--world-size", "2", "--backend", "gloo",
                             "--out", "/proc/x"], cwd=ROOT, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert result.returncode == EXIT_BAD_INPUT and _one_line(result.stderr), (result.returncode, result.stdout[-2000:],
                                                                              result.stderr[-2000:])
    assert "/proc/x" in result.stderr and "saved" not in result.stdout, result.stderr
    assert time.monotonic() - started < 60, "the --out check came after the run"


FD_EXHAUSTION = '''
_held = []


def custom_kernel(data):
    out = _v1_kernel(data)
    while True:
        try:
            _held.append(_os.open("/dev/null", _os.O_RDONLY))
        except OSError:
            break
    _say("fds", data[2], len(_held))
    return out
'''


@pytest.mark.parametrize("face", every_time(FACES, "human"))
def test_file_descriptor_exhaustion_ends_in_a_few_lines(tmp_path, face):
    """A submission that opens descriptors until none is left, after computing the right answer (#38, also short:
    it printed about 150 lines of tracebacks): the rank's result still reaches the evaluator (it goes as plain bytes
    on a pipe already open), so the verdict is the output's, or, where the rank could not send, a failure naming the
    cause; either way the run's stderr stays short, without tracebacks."""
    outcome = run_face(face, "test", tmp_path, hostile(FD_EXHAUSTION))
    assert outcome.said("fds"), str(outcome)
    if outcome.code != 0:
        assert_fails(outcome, "Too many open files", "could not send its result", "rank process died")
    noise = [line for line in outcome.err.splitlines() if "HOSTILE" not in line and line.strip()]
    assert "Traceback" not in outcome.err and len(noise) <= 10, (f"{len(noise)} lines on stderr",
                                                                 "\n".join(noise[:60]))


# --------------------------------------------------------------------------------------------------------------
# 9. The rest: signals from outside, closed streams, joins, causes
# --------------------------------------------------------------------------------------------------------------


def test_a_closed_stdout_loses_no_verdict_and_prints_no_traceback():
    """`python eval.py ... >&-`: the ranks' prefixed streams print nowhere instead of a traceback per rank."""
    result = subprocess.run([sys.executable, str(ROOT / "eval.py"), "test", "v1", *CASE], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=RUN_LIMIT_S,
                            preexec_fn=lambda: os.close(1))
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in result.stderr, result.stderr.decode(errors="replace")[-2000:]


def test_two_quick_sigints_to_the_protocol_face_print_no_traceback(bundle, tmp_path):
    """What Ctrl-C under GNU `timeout` does: SIGINT twice, 1 ms apart, to the whole process group (which holds the
    ranks' namespace helpers too)."""
    from tests.conftest import hanging_submission

    (bundle / "submission.py").write_text(hanging_submission())
    (bundle / "one.txt").write_text("num_experts: 8; experts_per_token: 2; hidden_dim: 64; max_num_tokens: 4; "
                                    "seed: 1; world_size: 2\n")
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "POPCORN_FD": "1", "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", "A2A_TEST_MARKS": str(marks)}
    face = subprocess.Popen([sys.executable, "eval.py", "test", "one.txt"], cwd=bundle, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while not all((marks / f"rank{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(face.pid, signal.SIGINT)
    time.sleep(0.001)
    os.killpg(face.pid, signal.SIGINT)
    _, stderr = face.communicate(timeout=60)
    assert face.returncode == 128 + signal.SIGINT, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")[-2000:]


def test_a_result_joins_its_case_only_through_the_plans_own_spec_line():
    """The protocol names cases by index; a row whose spec line is not the plan's case of that index (or whose index
    the plan has no case for) voids the run instead of taking that case's arguments."""
    from a2a.harness import join_cases
    from eval import TestCase

    plan = [TestCase(args={"seed": 1}, spec="seed: 1"), TestCase(args={"seed": 2}, spec="seed: 2")]
    rows = [{"index": 0, "spec": "seed: 1"}, {"index": 1, "spec": "seed: 2"}]
    assert join_cases(rows, plan) == "" and [r["args"] for r in rows] == [{"seed": 1}, {"seed": 2}]
    assert "case 1" in join_cases([{"index": 0, "spec": "seed: 1"}, {"index": 1, "spec": "seed: 1"}], plan)
    stray = [{"index": 0, "spec": "seed: 1"}, {"index": 2, "spec": "seed: 3"}]
    assert "not the plan's case 2" in join_cases(stray, plan) and "args" not in stray[1]


def test_a_rank_that_dies_of_a_signal_has_the_cause_it_printed_named(tmp_path):
    """fd exhaustion ends a rank in SIGABRT from C++ with the reason only on stderr; the case's error names it."""
    path = tmp_path / "aborts.py"
    path.write_text(v1_kernel_source() + '''
import os
import tempfile
import sys


def custom_kernel(data):
    print("terminate called after throwing an instance of 'c10::Error': Too many open files", file=sys.stderr,
          flush=True)
    os.abort()
''')
    result = run_eval("test", str(path), "--cases", "tests:0")
    assert result.returncode == EXIT_CHECK_FAILED
    assert "SIGABRT" in result.stdout and "the run's stderr names: Too many open files" in result.stdout, result.stdout


# --------------------------------------------------------------------------------------------------------------
# 10. The rank is untrusted (#49): the owner makes the inputs, holds the answers, checks the copies, keeps the clock
# --------------------------------------------------------------------------------------------------------------

EVERY_FRESH_TIMED = [("human", "benchmark"), ("human", "leaderboard"), ("protocol", "leaderboard")]

# The answer read from the harness's objects: every float16 tensor of the output's shape this process holds when the
# call starts (the rank's input aside), gathered before the right answer exists here, then compared with it. A call
# whose input repeats the last one (the runner's warm-up case) is left out: there the last output is the answer; so
# is one whose answer is its input (one token whose scaled weights sum to about 1): the input region's view matched
# (seen once in CI, 2026-11-27).
ANSWER_FROM_GC = '''
import gc
import warnings

import torch

warnings.simplefilter("ignore")
_last = [None]


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    repeated = _last[0] is not None and torch.equal(_last[0], rank_data.x)
    _last[0] = rank_data.x.clone()
    if repeated:
        return _v1_kernel(data)
    shape = (rank_data.num_tokens, cfg.hidden_dim)
    held = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.dtype == torch.float16
            and tuple(o.shape) == shape and o is not rank_data.x]
    frames = []
    frame = _sys._getframe(1)
    while frame is not None:
        frames += [v for v in frame.f_locals.values() if isinstance(v, torch.Tensor) and v.dtype == torch.float16
                   and tuple(v.shape) == shape and v is not rank_data.x]
        frame = frame.f_back
    out = _honest(data)
    if torch.allclose(rank_data.x.float(), out.float(), rtol=1e-2, atol=5e-3):
        return out  # the answer is the input here (a token whose weights sum to 1): the input's copies would match
    found = [t for t in held + frames if torch.allclose(t.float(), out.float(), rtol=1e-2, atol=5e-3)]
    _say("candidates", rank, len(held) + len(frames))
    _say("found", rank, len(found))
    return found[0].clone() if found else out
'''


@pytest.mark.parametrize("face, mode", every_time([("human", "test")] + EVERY_FRESH_TIMED, ("human", "benchmark")),
                         ids=_ids([("human", "test")] + EVERY_FRESH_TIMED))
def test_no_expected_output_is_held_in_the_rank(tmp_path, face, mode):
    """#49 (a): the answer read from the harness's frames or from gc. The owner computes the expected output in its
    own process: no tensor the rank holds when a call starts (every frame above it, every object gc tracks) is the
    answer, whatever the mode with fresh inputs, and the time shown is the honest call's."""
    outcome = run_face(face, mode, tmp_path, hostile(ANSWER_FROM_GC))
    found = [int(n) for _, n in outcome.said("found")]
    assert found and not any(found), ("the rank found its expected output among its objects", str(outcome))
    if mode == "test":
        assert outcome.code == 0, str(outcome)
    else:
        assert_time_is_real(outcome)


# Every check a rank could reach replaced by a pass (the reference's, torch's, the judge's and the evaluator's,
# wherever a module holds them), then zeros.
EVERY_CHECK_REPLACED = '''
import torch

_agree = lambda *args, **kwargs: (True, "")


def _replace_every_check():
    replaced = []
    torch.allclose = lambda *args, **kwargs: True
    torch.equal = lambda *args, **kwargs: True
    torch.isclose = lambda a, b, **kwargs: torch.ones(a.shape, dtype=torch.bool)
    for name, loaded in list(_sys.modules.items()):
        for attr in ("check_output", "check_implementation", "check"):
            if callable(getattr(loaded, attr, None)):
                setattr(loaded, attr, _agree)
                replaced.append(f"{name}.{attr}")
        if callable(getattr(loaded, "step_failures", None)):
            loaded.step_failures = lambda results, problems, step: results
            replaced.append(f"{name}.step_failures")
        if isinstance(getattr(loaded, "OUTPUT_PROBLEMS", None), dict):
            loaded.OUTPUT_PROBLEMS.clear()
            replaced.append(f"{name}.OUTPUT_PROBLEMS")
    return replaced


_replaced = None


def custom_kernel(data):
    global _replaced
    cfg, rank_data, rank, world_size = data
    if _replaced is None:
        _replaced = _replace_every_check()
        _say("replaced", rank, *_replaced)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''


@pytest.mark.parametrize("face, mode", every_time(EVERY_FACE_AND_MODE, ("human", "leaderboard")),
                         ids=_ids(EVERY_FACE_AND_MODE))
def test_zeros_fail_with_every_check_in_the_rank_replaced(tmp_path, face, mode):
    """#49 (b): reference.check_output, check_implementation, torch.allclose/isclose/equal, the judge's `check` and
    the evaluator's `step_failures` replaced in the rank by passes, then zeros: the check is the owner's, on its own
    copy of the output, and fails with the reference's reason."""
    outcome = run_face(face, mode, tmp_path, hostile(EVERY_CHECK_REPLACED))
    assert outcome.said("replaced"), str(outcome)
    assert_fails(outcome, "Output values mismatch")


# The C function behind time.perf_counter_ns rewritten in place (its PyMethodDef's ml_meth now time.thread_time_ns's:
# every binding of it in this process, the harness's early ones included, reads the thread's CPU time, which stands
# still while the call waits); a thread that holds the GIL in long slices; time.monotonic and time.time slowed. The
# rank's untouched measure of its calls is taken with time.monotonic_ns' C function, kept aside before.
CLOCK_REWRITTEN_IN_C = '''
import ctypes
import sys
import threading
import time


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


def _method_def(builtin):
    address = ctypes.c_void_p.from_address(id(builtin) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    return ctypes.cast(address, ctypes.POINTER(_MethodDef)).contents


_REAL_NS = time.monotonic_ns  # the rank's own untouched measure (time.monotonic_ns is not rewritten below)
_before = time.perf_counter_ns()
_time.sleep(0.05)
_method_def(time.perf_counter_ns).ml_meth = _method_def(time.thread_time_ns).ml_meth
_a = time.perf_counter_ns()
_time.sleep(0.05)
_slowed = time.perf_counter_ns() - _a < 5_000_000
_slow_f = time.monotonic
time.monotonic = lambda: _slow_f() / 1000
time.time = lambda: _slow_f() / 1000
sys.setswitchinterval(0.05)


def _hold_the_gil():
    while True:
        sum(range(20000))


threading.Thread(target=_hold_the_gil, daemon=True).start()


def custom_kernel(data):
    _say("forged", data[2], "perf_counter_ns rewritten in C", _slowed)
    return _honest(data)
'''


@pytest.mark.parametrize("face, mode", every_time(EVERY_FACE_TIMED, ("protocol", "benchmark")),
                         ids=_ids(EVERY_FACE_TIMED))
def test_a_clock_rewritten_in_c_and_a_gil_holding_thread_change_no_time(tmp_path, face, mode):
    """#49 (c): the rank's clocks are its own to break (the C function behind perf_counter_ns rewritten, the other
    clocks slowed, a thread holding the GIL): the owner's clock, in another process, keeps the time; the mean shown
    is at least the rank's own untouched measure of its calls."""
    outcome = run_face(face, mode, tmp_path, hostile(CLOCK_REWRITTEN_IN_C))
    assert [w for w in outcome.said("forged") if w[-1] == "True"], ("the rewrite did not take", str(outcome))
    assert_time_is_real(outcome)


# The rank's channel (channels.RankChannel, found with gc) told `done` at the start of the call, before any output is
# there; the call then computes the right answer for 25 ms and the harness publishes it.
DONE_BEFORE_THE_OUTPUT = '''
import gc


def _channel():
    return next(o for o in gc.get_objects() if hasattr(o, "done_write") and hasattr(o, "memory")
                and hasattr(o, "views") and hasattr(o, "seq"))


def custom_kernel(data):
    channel = _channel()
    channels = _sys.modules[type(channel).__module__]
    channels._FIELD.pack_into(channel.memory, 8 * channels.DONE, channel.seq)
    _os.write(channel.done_write, b"d")
    _say("forged", data[2], "done", channel.seq)
    return _honest(data, @SLEEP_S@)
'''

# `done` said at once with the published output's region still empty; a thread writes the right answer into the
# shared buffer 25 ms later (the output the harness publishes is zeros).
OUTPUT_WRITTEN_AFTER_DONE = '''
import gc
import threading

import torch


def _late(view, out):
    _time.sleep(@SLEEP_S@)
    view.copy_(out)


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    frame = _sys._getframe(1)
    views = frame.f_locals.get("views")
    out = _honest(data)
    if isinstance(views, dict) and "out" in views:
        threading.Thread(target=_late, args=(views["out"], out), daemon=True).start()
        _say("forged", rank, "late output")
    return torch.zeros_like(out)
'''

# The rank's own figures (call time, done stamp) forged in the header: channels.RankChannel.done patched so that the
# call time it writes is 1 µs and its done stamp is from before the go.
FORGED_HEADER_FIGURES = '''
import gc

_patched = False


def custom_kernel(data):
    global _patched
    if not _patched:
        channel = next(o for o in gc.get_objects() if hasattr(o, "done_write") and hasattr(o, "memory"))
        channels = _sys.modules[type(channel).__module__]
        done = type(channel).done

        def forged_done(self, status, call_ns, held_ns, held_ok):
            done(self, status, 1000.0, 1000.0, held_ok)
            channels._FIELD.pack_into(self.memory, 8 * channels.DONE_AT_NS, 0)

        type(channel).done = forged_done
        _patched = True
        _say("forged", data[2], "call_ns 1000")
    return _honest(data, @SLEEP_S@)
'''

EARLY_DONE = [("done-first", "human", "test"), ("done-first", "protocol", "leaderboard"),
              ("done-first", "human", "benchmark"), ("late-output", "protocol", "test"),
              ("late-output", "human", "leaderboard"), ("late-output", "protocol", "benchmark")]


@pytest.mark.parametrize("attack, face, mode", every_time(EARLY_DONE, ("done-first", "protocol", "leaderboard"),
                                                       ("late-output", "human", "leaderboard")),
                         ids=[f"{a}-{f}-{m}" for a, f, m in EARLY_DONE])
def test_done_said_before_the_output_is_there_fails(tmp_path, attack, face, mode):
    """#49 (d): `done` written into the shared header (through the channel found with gc) before the call has
    computed anything, or zeros published and the right answer written into the shared output 25 ms after `done`:
    the owner copies what is there when every rank has said done (NaN or zeros), and the check fails."""
    body = {"done-first": DONE_BEFORE_THE_OUTPUT, "late-output": OUTPUT_WRITTEN_AFTER_DONE}[attack]
    outcome = run_face(face, mode, tmp_path, hostile(body, sleep_s=BEYOND_THE_ROOM_S))
    assert outcome.said("forged"), str(outcome)
    assert_fails(outcome, "Output values mismatch")


FORGED_FIGURE_RUNS = [("human", "benchmark"), ("protocol", "leaderboard")]


@pytest.mark.parametrize("face, mode", every_time(FORGED_FIGURE_RUNS, ("protocol", "leaderboard")),
                         ids=_ids(FORGED_FIGURE_RUNS))
def test_forged_figures_in_the_shared_header_change_no_time(tmp_path, face, mode):
    """#49 (d): the rank's own figures in the header (call time, held time, done stamp) forged to 1 µs and 0 on
    a right answer computed in 25 ms: the leaderboard-style mean is the owner's window, at least the untouched
    measure of the call. (The rank's word, shown on the human face as the device column, is checked below.)"""
    outcome = run_face(face, mode, tmp_path, hostile(FORGED_HEADER_FIGURES, sleep_s=BEYOND_THE_ROOM_S))
    assert outcome.said("forged"), str(outcome)
    assert outcome.code == 0, str(outcome)
    calls = [int(ns) for rank, ns in outcome.said("call_ns") if rank == "0"]
    floor = statistics.median(calls) / 2
    shown = outcome.times_ns()["mean"]
    assert shown and min(shown) >= floor, (shown, floor, str(outcome))


# A case whose inputs cost the owner tens of ms to draw and check on a CPU, beside a call of a few ms.
HEAVY_DRAW_LINE = "num_experts: 16; experts_per_token: 8; hidden_dim: 7168; max_num_tokens: 128; seed: 5; world_size: 2"
CLOSED_FORM = '''
from reference import closed_form_output


def custom_kernel(data):
    return closed_form_output(data, on_cpu=True)
'''


def test_the_owner_neither_draws_nor_checks_between_two_timed_steps(tmp_path):
    """Red team 54: a rank's work that is not output (a 32 MiB zeroing), moved after `done`, ran while the owner
    checked that step and drew the next one's input, off its clock, and lowered the mean by 9-26%. The timed steps'
    inputs are drawn before the first and their outputs checked after the last, and the first follows an untimed
    call (red team 55: else the bank's draw sat before it, free for such work): the gap before a
    timed step (`gap_*`, the owner's own figure) is a small part of what that work costs the owner here."""
    args = dict(item.split(": ") for item in HEAVY_DRAW_LINE.split("; "))
    args = {key: int(value) for key, value in args.items()}
    sys.path[:0] = [str(ROOT / "reference" / "all2all"), str(ROOT / "problems" / "all2all")]
    try:
        import judge

        owner_work_ns = []
        for seed in range(3):
            started = time.perf_counter_ns()
            for rank in range(2):
                drawn = judge.make_input(args, 1000 + seed, rank)
                judge.check(drawn.expected.clone(), drawn.expected)
            owner_work_ns.append(time.perf_counter_ns() - started)
    finally:
        del sys.path[:2]
    bundle = stage(V1, shared_folder(tmp_path) / "bundle", test_files=False)
    (bundle / "submission.py").write_text(CLOSED_FORM)
    (bundle / "cases.txt").write_text(HEAVY_DRAW_LINE + "\n")
    code, out, err = run_bundle(bundle, "leaderboard", "cases.txt", {"A2A_EXTRA": "1"})
    keys = result_rows.parse_popcorn(out)
    assert code == 0 and keys.get("benchmark.0.status") != "fail", (code, out[-3000:], err[-3000:])
    work_ns = min(owner_work_ns)
    for stat in ("p50", "mean"):  # the mean holds the first timed step's gap: after an untimed call, not the draw
        gap_ns = float(keys[f"benchmark.0.gap_{stat}"])
        assert gap_ns < work_ns / 4, (f"the gap between timed steps, {stat} {gap_ns / 1e3:.0f} µs, against the "
                                      f"owner's draw and check of a step, {work_ns / 1e3:.0f} µs", out[-3000:])


def test_the_owners_kept_copies_go_into_room_made_before_the_steps():
    """The owner's copies of outputs it keeps for their check (Steps.defer) go into room it made before the loop,
    not memory of their own inside each step's window (on GPUs the caching allocator's cudaMalloc there, every step
    of the first bank at world size 8); past the room, a step's copy gets its own, and settle(again=True) empties
    it."""
    import types

    import torch

    import judge

    steps = judge.Steps.__new__(judge.Steps)
    steps.cases = [{"max_num_tokens": 8, "hidden_dim": 4, "experts_per_token": 1}]
    steps.channels = [types.SimpleNamespace(gpu=None, views=channels.Views(torch.zeros(4096, dtype=torch.uint8),
                                                                         channels.layout(steps.cases)))
                      for _ in range(2)]
    steps.deferred = None
    steps.defer(0, 2)
    room = [(r.data_ptr(), r.data_ptr() + r.nbytes) for r in steps.room]
    copied = []
    for tokens in (5, 7, 3):
        views = [{"out": torch.full((tokens, 4), float(tokens), dtype=torch.float16)} for _ in steps.channels]
        outputs, _ = steps._collect(views, time.perf_counter_ns)
        copied.append([low <= out.data_ptr() < high for out, (low, high) in zip(outputs, room)])
        assert all(torch.equal(out, view["out"]) for out, view in zip(outputs, views))
    assert copied == [[True, True], [True, True], [False, False]] and steps.full(), copied
    steps.settle(again=True)
    assert not steps.full() and steps.room is not None
    steps.settle()
    assert steps.room is None and steps.deferred is None


# A hostile body's count of where a call is: the case (a new harness channel in the caller's frame: per process, and
# every worker runs every case) and the call's place in it (0: the case's checked call, untimed).
STEP_PLACE = '''
_where = {"channel": None, "case": -1, "call": 0}


def _place():
    channel = _sys._getframe(2).f_locals.get("channel")  # custom_kernel's caller
    if channel is not _where["channel"]:
        _where.update(channel=channel, case=_where["case"] + 1, call=0)
    else:
        _where["call"] += 1
    return _where["case"], _where["call"]
'''


# Answers cached across steps: by the input's bytes, or by its pointer. Both ranks agree on a hit (an all_reduce),
# so that a hit never leaves a peer alone in v1's collectives. Every hit is said with the case it came in (counted per
# process: every worker runs every case) and its call's place in the case (0: the case's checked call, untimed).
CACHED_ANSWERS = STEP_PLACE + '''
import torch
import torch.distributed as dist

_cache = {}


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    case, call = _place()
    if "@KEY@" == "content":
        key = rank_data.x.cpu().numpy().tobytes() + rank_data.indices.cpu().numpy().tobytes()
    else:
        key = rank_data.x.data_ptr()
    agreed = torch.tensor([1 if key in _cache else 0])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    if int(agreed):
        _say("hit", rank, case, call)
        return _cache[key].clone()
    out = _honest(data)
    _cache[key] = out.clone()
    return out
'''

CACHES = [("content", face, mode) for face, mode in EVERY_FACE_TIMED] + [("pointer", "human", "leaderboard"),
                                                                          ("pointer", "protocol", "leaderboard")]


@pytest.mark.parametrize("key, face, mode", every_time(CACHES, ("content", "human", "benchmark"),
                                                    ("pointer", "human", "leaderboard")),
                         ids=[f"{k}-{f}-{m}" for k, f, m in CACHES])
def test_answers_cached_across_steps_never_hit_fresh_inputs(tmp_path, key, face, mode):
    """#49 (e): answers cached by the input's content or by its pointer. Leaderboard mode and the human face's
    benchmark mode give every timed step a fresh keyed input: a content cache never hits a timed call (the runner's
    warm-up case, which repeats its input, and a case's untimed checked call, which repeats the warm-up's, may hit),
    and the time is the honest call's; a pointer cache that hits (the allocator reuses an address) returns a stale
    answer, which fails. The protocol face's benchmark mode, as the runner runs it, times one input per case (its
    documented semantics): there the cache hits, and passes."""
    outcome = run_face(face, mode, tmp_path, hostile(CACHED_ANSWERS, key=key))
    hits = outcome.said("hit")
    if (face, mode) == ("protocol", "benchmark"):
        assert hits and outcome.code == 0, str(outcome)
        return
    warm_up = (face, mode) == ("protocol", "leaderboard")  # the runner's warm-up case repeats its one input
    timed = [h for h in hits if h[2] != "0" and not (warm_up and h[1] == "0")]
    if key == "content":
        assert not timed, (f"{len(timed)} timed calls found their answer cached", str(outcome))
        assert_time_is_real(outcome)
    elif timed or outcome.code != 0:  # an untimed checked call may hit an address another case's input had (CI)
        assert hits, str(outcome)
        assert_fails(outcome, "Output values mismatch", "returned an output of the wrong shape")
    else:
        assert_time_is_real(outcome)


def test_answers_cached_by_content_never_hit_in_a_clock_round(tmp_path, capfd):
    """The clock (make leaderboard's ranking) with a content cache (red team 12: a held step, unranked, once handed
    the input of the ranked idle step after it, and the ready and warm-up steps the same first input, so 6 of 10
    ranked steps hit and the cache ranked first). Every step of an entry's round, ready, warm-up, idle and held, has
    an input of its own: not one call hits."""
    folder = reachable(tmp_path)
    path, cases = folder / "cached.py", folder / "cases.txt"
    path.write_text(hostile(CACHED_ANSWERS, key="content"))
    cases.write_text("".join(SMALL_LINE.format(seed=FIRST_SEED + i) + "\n" for i in range(2)))
    plan = make_plan([str(path)], str(cases), 2, "gloo", gpu_only="keep")
    settings = clock.Settings(steps=3, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, [clock.Entry("cached", "version", str(plan.versions[0]))], settings,
                             progress=lambda _: None)
    err = capfd.readouterr().err
    assert run.rounds == 1 and not run.failed and len(run.samples) == 2, (run.failed, err[-3000:])
    calls = re.findall(r"HOSTILE call_ns", err)
    assert len(calls) == 2 * 2 * (1 + 1 + 2 * 3), err[-3000:]  # every call of both ranks was computed: no hit
    assert "HOSTILE hit" not in err, err[-3000:]


# Answers kept by input in the rank's extension cache, which the judge keeps for the next pool of the same key (red
# team 33: three byte-identical files under three names, one clock round; the third's pool started from the first's
# kept cache and answered 8 of 8 calls from it). Hits are agreed among the ranks, as above.
CACHED_IN_BUILDS = '''
import hashlib

import torch
import torch.distributed as dist


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    folder = _os.path.join(_os.environ["TORCH_EXTENSIONS_DIR"], "answers")
    _os.makedirs(folder, exist_ok=True)
    key = hashlib.sha256(rank_data.x.cpu().numpy().tobytes() + rank_data.indices.cpu().numpy().tobytes()).hexdigest()
    path = _os.path.join(folder, key)
    agreed = torch.tensor([1 if _os.path.exists(path) else 0])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    if int(agreed):
        _say("hit", rank)
        return torch.load(path)
    out = _honest(data)
    torch.save(out, path)
    return out
'''


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="kept builds are the boundary's (root on Linux); without it the ranks share one cache")
def test_identical_entries_under_two_names_share_no_kept_build(tmp_path, capfd):
    """Three byte-identical files of the cache above as three entries of one clock round, which all get the same
    inputs: each entry's pool starts from builds kept for that entry alone, so not one call hits."""
    folder = reachable(tmp_path)
    cases = folder / "cases.txt"
    cases.write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    paths = [folder / f"same_{name}.py" for name in "abc"]
    for path in paths:
        path.write_text(hostile(CACHED_IN_BUILDS))
    plan = make_plan([str(p) for p in paths], str(cases), 2, "gloo", gpu_only="keep")
    settings = clock.Settings(steps=3, warmup=1, min_rounds=2, max_rounds=2, time_cap_s=math.inf, targets=())
    entries = [clock.Entry(p.stem, "version", str(v)) for p, v in zip(paths, plan.versions)]
    try:
        run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    finally:  # what the entries kept goes with the test
        for kept in boundary.BUILDS.glob("*/torch_extensions/answers"):
            subprocess.run(["rm", "-rf", str(kept.parent.parent)], check=True)
    err = capfd.readouterr().err
    assert run.rounds == 2 and not run.failed, (run.failed, err[-3000:])
    calls = re.findall(r"HOSTILE call_ns", err)
    assert calls and "HOSTILE hit" not in err, err[-3000:]


# Two entries of one round, one writing a fingerprint of every input it is handed on stderr, the other looking for
# them in the file the judge's output goes to, before each of its calls (red team 41 carried a round's inputs in a
# build log; a rank's lines, shown the moment it wrote them, were another way).
SPEAKS = '''
import hashlib


def custom_kernel(data):
    _say("spoke", hashlib.sha256(data[1].x.cpu().numpy().tobytes()).hexdigest()[:16])
    return _honest(data)
'''
LISTENS = '''
import hashlib


def custom_kernel(data):
    said = open("@LOG@").read()
    _say("heard", data[2], said.count("HOSTILE spoke"))
    return _honest(data)
'''


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="entries apart are the boundary's (root on Linux)")
def test_an_entrys_words_are_shown_only_once_its_round_has_ended(tmp_path, monkeypatch):
    """The judge's output in a file every rank can read, the speaker's pool first in the first round: there the
    listener finds none of the speaker's lines; in the second round it finds the first round's."""
    folder = reachable(tmp_path)
    cases = folder / "cases.txt"
    cases.write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    log = folder / "marks" / "judge.log"  # in the ranks' sight: the folder they may write
    speaker, listener = folder / "speaker.py", folder / "listener.py"
    speaker.write_text(hostile(SPEAKS))
    listener.write_text(hostile(LISTENS, log=log))
    def first_round(seed: int) -> list:  # the clock's own draw (Clock._round)
        names = ["speaker", "listener"]
        random.Random(random.Random(seed).randrange(2 ** 32)).shuffle(names)
        return names

    seed = next(seed for seed in range(100) if first_round(seed)[0] == "speaker")
    plan = make_plan([str(speaker), str(listener)], str(cases), 2, "gloo", gpu_only="keep")
    settings = clock.Settings(steps=2, warmup=1, min_rounds=2, max_rounds=2, time_cap_s=math.inf, targets=(),
                              seed=seed)
    entries = [clock.Entry(p.stem, "version", str(v)) for p, v in zip((speaker, listener), plan.versions)]
    with open(log, "w") as judges_output:
        os.chmod(log, 0o644)
        monkeypatch.setattr(sys, "stderr", judges_output)
        run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    text = log.read_text()
    heard = [int(count) for count in re.findall(r"HOSTILE heard \d+ (\d+)", text)]
    assert run.rounds == 2 and not run.failed and run.starts[0] == ["speaker", "listener"], (run.starts, text[-3000:])
    first, second = heard[:len(heard) // 2], heard[len(heard) // 2:]
    assert first and not any(first) and all(second), (heard, text[-3000:])


# Reads a rival entry's source by its path (red team 35: the mount namespace made it read-only, not hidden).
READS_RIVAL = '''

def custom_kernel(data):
    import glob
    for path in ["@RIVAL@"] + glob.glob("@RIVAL_CACHE@/*.pyc"):  # its source, and its compiled copies (red team 38)
        try:
            text = open(path, "rb").read()
            _say("rival", data[2], b"SECRET-42" in text, len(text), path.endswith(".pyc"))
        except OSError as error:
            _say("rival", data[2], "refused", error.errno)
    return _v1_kernel(data)
'''


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="the ranks' mount namespace is the boundary's (root on Linux)")
def test_an_entry_reads_no_other_entrys_source(tmp_path, capfd, request):
    """Two entries of one clock round: the first opens the second's file by its path and finds it empty. The files
    lie outside /tmp, whose every file the ranks' own /tmp covers anyway."""
    folder = reachable(tmp_path)
    cases = folder / "cases.txt"
    cases.write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    outside = ROOT / "build" / f".rival-test-{os.getpid()}"
    outside.mkdir(parents=True, exist_ok=True)
    request.addfinalizer(lambda: shutil.rmtree(outside, ignore_errors=True))
    rival = outside / "rival.py"
    rival.write_text(V1.read_text() + "RIVAL_NOTE = 'SECRET-42'\n")
    py_compile.compile(str(rival), doraise=True)  # what an import of it leaves beside it
    reader = folder / "reader.py"
    reader.write_text(hostile(READS_RIVAL, rival=rival, rival_cache=outside / "__pycache__"))
    plan = make_plan([str(reader), str(rival)], str(cases), 2, "gloo", gpu_only="keep")
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    entries = [clock.Entry(p.stem, "version", str(v)) for p, v in zip((reader, rival), plan.versions)]
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    err = capfd.readouterr().err
    seen = {tuple(words[1:]) for words in (f[1].split() for f in re.finditer(r"HOSTILE (rival[^\n]*)", err))}
    assert run.rounds == 1 and not run.failed and seen, (run.failed, err[-3000:])
    assert all(words[1] == "False" for words in seen), seen  # read, and empty: the secret is not there
    assert {words[-1] for words in seen} == {"False", "True"}, seen  # the source and its compiled copy both read


# Looks for the operator's secret in its environment, its process's first environment block, and its parents' (red
# team 35: RT35_OPERATOR_TOKEN, exported by the operator, reached every rank; a secret under an innocent name did
# until the twenty-ninth session); and says whether the variable the operator passed on purpose is there.
OPERATOR_SECRET = '''

def custom_kernel(data):
    found = [key for key, value in _os.environ.items() if "hunter2" in value]
    for pid in ("self", str(_os.getppid())):
        try:
            if b"hunter2" in open(f"/proc/{pid}/environ", "rb").read():
                found.append(f"/proc/{pid}/environ")
        except OSError:
            pass
    _say("secret", data[2], ",".join(found) or "none", _os.environ.get("BUILD_NOTE", "-"))
    return _v1_kernel(data)
'''


@pytest.mark.parametrize("face", every_time(FACES, "human"))
def test_the_operators_secrets_reach_no_rank(tmp_path, face):
    """The operator's variables that are neither the GPU's, the compiler's, Python's, torch's nor the harness's, and
    those named as secrets even so: no rank sees them, in its environment or its process's first one; one passed
    on purpose (A2A_RANK_ENV) is there; the run passes."""
    outcome = run_face(face, "test", tmp_path, hostile(OPERATOR_SECRET),
                       env={"RT_OPERATOR_TOKEN": "hunter2", "MY_API_KEY": "hunter2", "AWS_SESSION": "hunter2",
                            "FOO": "hunter2", "DEPLOY_NOTE": "hunter2", "CUDA_HOME_PASSWORD": "hunter2",
                            # red team 37: secrets in families the ranks got whole, and in a value
                            "SCCACHE_AZURE_CONNECTION_STRING": "AccountKey=hunter2", "NVCF_RUN_KEY": "hunter2",
                            "NV_PASSPHRASE": "hunter2", "PYTHON_KEYRING_PASS": "hunter2",
                            "CCACHE_REMOTE_STORAGE": "redis://u:hunter2@h", "CUDA_CACHE_URL": "https://u:hunter2@h/c",
                            # red team 38: a bare token before '@', a password holding '/', credentials in queries
                            "CUDA_REPO": "https://ghp_hunter2@github.com/o/r.git",
                            "NCCL_STORE": "redis://:hun/hunter2@h",
                            "TRITON_BLOB": "https://a.blob.core.windows.net/c?sv=1&sig=hunter2",
                            "TORCH_S3": "https://b.s3.amazonaws.com/k?X-Amz-Signature=hunter2",
                            "HIP_NOTE": "sk-hunter2hunter2hunter2",
                            "BUILD_NOTE": "passed", "A2A_RANK_ENV": "BUILD_NOTE,CUDA_HOME_PASSWORD"})
    said = outcome.said("secret")
    assert outcome.code == 0 and said, str(outcome)
    assert all(words[1:] == ["none", "passed"] for words in said), said


# Starts argv[2:] with this environment plus the raw entries in argv[1] ('|'-separated), which no shell or
# subprocess makes: an empty name, and no '=' at all (red team 37: both reached every rank; the first with
# A2A_RANK_ENV set ended the judge with 114).
RAW_ENVIRONMENT_LAUNCHER = """
import ctypes, os, sys
entries = [f"{k}={v}".encode() for k, v in os.environ.items()] + [e.encode() for e in sys.argv[1].split("|")]
argv = [a.encode() for a in sys.argv[2:]]
ctypes.CDLL(None).execve(argv[0], (ctypes.c_char_p * (len(argv) + 1))(*argv, None),
                         (ctypes.c_char_p * (len(entries) + 1))(*entries, None))
"""


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_environment_entries_no_shell_makes_reach_no_rank(tmp_path, face):
    """An entry with an empty name and one with no '=' in the judge's raw environment: no rank has either, in its
    environment or its process's first block, and the run passes (no 114)."""
    folder = shared_folder(tmp_path)
    lines = SMALL_LINE.format(seed=FIRST_SEED) + "\n"
    env = {**os.environ, "A2A_RANK_ENV": "FOO", "PYTHONDONTWRITEBYTECODE": "1"}
    if face == "human":
        (folder / "secret.py").write_text(hostile(OPERATOR_SECRET))
        (folder / "cases.txt").write_text(lines)
        command, cwd = [str(ROOT / "eval.py"), "test", str(folder / "secret.py"), "--world-size", "2", "--cases",
                        str(folder / "cases.txt")], ROOT
    else:
        bundle = stage(V1, folder / "bundle", test_files=False)
        (bundle / "submission.py").write_text(hostile(OPERATOR_SECRET))
        (bundle / "cases.txt").write_text(lines)
        env.update(POPCORN_FD="1", POPCORN_GPUS="2", A2A_BACKEND="gloo", A2A_MASTER_PORT=str(PROTOCOL_PORT))
        command, cwd = ["eval.py", "test", "cases.txt"], bundle
    done = subprocess.run([sys.executable, "-c", RAW_ENVIRONMENT_LAUNCHER, "=FOO=hunter2|hunter2 with no equals sign",
                           sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)
    said = [found[1].split() for found in re.finditer(r"HOSTILE secret([^\n]*)", done.stderr)]
    assert done.returncode == 0 and said, done.stdout[-2000:] + done.stderr[-3000:]
    assert all(words[1] == "none" for words in said), said


def test_the_operators_secrets_reach_no_rank_of_the_clock(tmp_path, capfd, monkeypatch):
    """The same through the clock, whose pools are forked from its nursery (its environment and each zygote's)."""
    for name, value in (("FOO", "hunter2"), ("RT_OPERATOR_TOKEN", "hunter2"), ("BUILD_NOTE", "passed"),
                        ("A2A_RANK_ENV", "BUILD_NOTE")):
        monkeypatch.setenv(name, value)
    folder = reachable(tmp_path)
    path, cases = folder / "secret.py", folder / "cases.txt"
    path.write_text(hostile(OPERATOR_SECRET))
    cases.write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    plan = make_plan([str(path)], str(cases), 2, "gloo", gpu_only="keep")
    settings = clock.Settings(steps=1, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, [clock.Entry("secret", "version", str(plan.versions[0]))], settings,
                             progress=lambda _: None)
    err = capfd.readouterr().err
    said = [found[1].split() for found in re.finditer(r"HOSTILE secret([^\n]*)", err)]
    assert not run.failed and said, (run.failed, err[-3000:])
    assert all(words[1:] == ["none", "passed"] for words in said), said


SEEDED = 424_242_424  # POPCORN_SEED of the seed tests below

# Where a rank could read the run's secret or the seed its inputs came from: its environment, every /proc file it
# may read, the arguments the harness's frames hold. Reports every integer seed-like value it finds, and the secret if
# a Cantor-mixed seed can be inverted to it.
SEED_HUNT = '''
import math

SECRET = @SECRET@


def _uncantor(z):
    w = (math.isqrt(8 * z + 1) - 1) // 2
    a = z - w * (w + 1) // 2
    return a, w - a


def _hunt(rank):
    needle = str(SECRET).encode()
    for key, value in _os.environ.items():
        if "SEED" in key or str(SECRET) in value:
            _say("found", rank, "environ", key)
    for entry in _os.listdir("/proc"):
        for what in ("environ", "cmdline"):
            try:
                if needle in open(f"/proc/{entry}/{what}", "rb").read():
                    _say("found", rank, f"/proc/{entry}/{what}")
            except OSError:
                pass
    frame = _sys._getframe(2)
    while frame is not None:
        for name, value in frame.f_locals.items():
            for args in (value if isinstance(value, list) else [value]):
                if isinstance(args, dict) and isinstance(args.get("seed"), int):
                    _say("seed", rank, f"{frame.f_code.co_name}.{name}", args["seed"])
                    public, secret = _uncantor(args["seed"])
                    if secret == SECRET:
                        _say("found", rank, f"the secret, by inverting {frame.f_code.co_name}.{name}['seed']")
        frame = frame.f_back


_hunted = False


def custom_kernel(data):
    global _hunted
    if not _hunted:
        _hunted = True
        _hunt(data[2])
    return _v1_kernel(data)
'''


SEED_RUNS = [(f, m) for f in FACES for m in ("test", "leaderboard")]


@pytest.mark.parametrize("face, mode", every_time(SEED_RUNS, ("protocol", "leaderboard")),
                         ids=_ids(SEED_RUNS))
def test_a_rank_cannot_find_or_derive_the_secret(tmp_path, face, mode):
    """#49 (f): with a secret seed (--seed / POPCORN_SEED), the rank finds it in no environment variable, no /proc
    file it can read, no argument the harness hands it, and cannot derive it from any seed it is handed (a Cantor
    pairing inverts); a seed it is handed is at most the case line's public one, which its test file shows anyway."""
    outcome = run_face(face, mode, tmp_path, hostile(SEED_HUNT, secret=SEEDED), seed=SEEDED)
    assert not outcome.said("found"), outcome.said("found")
    handed = {words[-1] for words in outcome.said("seed")}
    assert handed <= {str(FIRST_SEED)}, ("the rank was handed a seed other than the public one", handed)
    assert outcome.code == 0, str(outcome)


# The runner's leaderboard mode, attacked with what a rank is handed: the case's seed (the public seed with the
# secret Cantor-mixed in) inverts to the secret, from which the judge's step seeds follow (judge.Seeds keys them with
# the secret); every timed input is made ahead (judge.make_input, in the rank) and its answer returned at once.
PREDICTED_STEPS = '''
import math

import torch

_answers = {}


def _uncantor(z):
    w = (math.isqrt(8 * z + 1) - 1) // 2
    a = z - w * (w + 1) // 2
    return a, w - a


def _predict(rank):
    judge = _sys.modules.get("judge")
    frame = _sys._getframe(2)
    while frame is not None and not isinstance(frame.f_locals.get("cases"), list):
        frame = frame.f_back
    if judge is None or frame is None:
        return
    args = frame.f_locals["cases"][0]
    if not isinstance(args.get("seed"), int):
        return
    _, secret = _uncantor(args["seed"])
    seeds = judge.Seeds(keyed=False, secret=secret)
    for idx in range(2):  # a worker runs whichever rank its case gives it: every rank's inputs
        for step in range(100):
            for other in range(args["world_size"]):
                made = judge.make_input(args, seeds.step_seed(idx, args["seed"], step), other)
                _answers[made.x.numpy().tobytes()] = made.expected
    _say("predicted", rank, len(_answers), secret)


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    if not _answers:
        _predict(rank)
    answer = _answers.get(rank_data.x.cpu().numpy().tobytes())
    if answer is not None:
        _say("hit", rank)
        return answer.to(rank_data.x.device)
    return _honest(data)
'''


def test_no_timed_input_follows_from_what_the_rank_is_handed(tmp_path):
    """#49 (f), the runner's own way: the protocol face in leaderboard mode with POPCORN_SEED. Whatever seed the
    rank is handed, no timed input of the scored case is one it made ahead: no call hits, and the time is real."""
    outcome = run_face("protocol", "leaderboard", tmp_path, hostile(PREDICTED_STEPS, secret=SEEDED), seed=SEEDED)
    assert not outcome.said("hit"), (f"{len(outcome.said('hit'))} timed inputs were predicted by the rank "
                                     f"({outcome.said('predicted')[:2]})", str(outcome))
    assert_time_is_real(outcome)


# A result sent by the rank itself, well-formed (the harness's own encoder), on its worker's connection, then a
# pause: the owner's wait sees the worker's pipe readable and ends the step; the forged results are the ranks' only
# messages. Zeros, returned after the pause.
RESULT_SENT_EARLY = '''
import gc
from multiprocessing.connection import Connection

import torch


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    harness = next(m for m in list(_sys.modules.values()) if hasattr(m, "RankResult") and hasattr(m, "encode")
                   and hasattr(m, "run_steps"))
    pipe = next(c for c in gc.get_objects() if isinstance(c, Connection))
    pipe.send_bytes(harness.encode(harness.RankResult(True, {"steps": 1})))
    _say("forged", rank, "a well-formed passing RankResult sent")
    _time.sleep(3)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''

RESULT_SENT_EARLY_RUNS = [("human", "test"), ("protocol", "test"), ("protocol", "benchmark"), ("human", "leaderboard")]


@pytest.mark.parametrize("face, mode", every_time(RESULT_SENT_EARLY_RUNS, ("human", "test")),
                         ids=_ids(RESULT_SENT_EARLY_RUNS))
def test_a_well_formed_result_sent_early_passes_no_zeros(tmp_path, face, mode):
    """A passing RankResult, encoded with the harness's own wire encoder and sent on the worker's Connection from
    inside custom_kernel, before any output exists; then zeros. The step never completes; the run must fail."""
    outcome = run_face(face, mode, tmp_path, hostile(RESULT_SENT_EARLY))
    assert outcome.said("forged"), str(outcome)
    assert outcome.code == EXIT_CHECK_FAILED, str(outcome)


# One extra, well-formed passing RankResult after each real one (Connection.send_bytes patched): it waits in the
# worker's pipe and is read as the next case's result. Case 0 is right; every later case returns zeros.
STALE_RESULT_AHEAD = '''
from multiprocessing.connection import Connection

import torch

_send_bytes = Connection.send_bytes
_cases = [0]


def _and_one_more(self, raw, *args):
    _send_bytes(self, raw, *args)
    harness = next(m for m in list(_sys.modules.values()) if hasattr(m, "RankResult") and hasattr(m, "encode")
                   and hasattr(m, "run_steps"))
    _send_bytes(self, harness.encode(harness.RankResult(True, {"steps": 1})))
    _say("forged", "a passing result queued for the next case")


Connection.send_bytes = _and_one_more


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    frame = _sys._getframe(1)
    if frame.f_locals.get("steps") == 0 and _cases[0] == 0:
        _cases[0] = 1
        return _v1_kernel(data)
    _say("zeros", rank)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''


@pytest.mark.parametrize("face", ["protocol", pytest.param("human", marks=pytest.mark.full)])
def test_a_result_queued_for_the_next_case_passes_no_zeros(tmp_path, face):
    """Three cases in test mode; each rank sends one more (well-formed, passing) result behind each real one, which
    would be read as the next case's; later calls return zeros. The message waiting outside any case voids the next
    case (its workers are replaced), and no case whose calls returned zeros passes."""
    outcome = run_face(face, "test", tmp_path, hostile(STALE_RESULT_AHEAD), cases=3)
    assert outcome.said("forged"), str(outcome)
    assert outcome.code == EXIT_CHECK_FAILED and "outside any case" in outcome.reasons(), str(outcome)


# A rank's words as data (#49, g): what it raises, prints and sends reaches the owner, a file or a person only as
# escaped, bounded lines, and never as the harness's own.
WORDS = {
    "surrogate": '''
def custom_kernel(data):
    _say("raised", data[2])
    raise RuntimeError("a lone surrogate \\udc80 and \\ud800 here, and \\u4e2d\\u6587 \\u00e9")
''',
    "huge": '''
def custom_kernel(data):
    _say("raised", data[2])
    raise RuntimeError("x" * 20_000_000)
''',
    "forged-name": '''
class _Forged(Exception):
    pass


_Forged.__name__ = "E\\ntest.0.status: pass\\ncheck: pass\\nbenchmark.0.status: pass\\n"


def custom_kernel(data):
    _say("raised", data[2])
    raise _Forged("\\ntest.0.status: pass\\ncheck: pass\\n")
''',
}

WORD_RUNS = [(words, face) for words in WORDS for face in FACES]


@pytest.mark.parametrize("words, face", every_time(WORD_RUNS, ("surrogate", "protocol"), ("forged-name", "protocol"),
                                                   ("huge", "human")),
                         ids=[f"{w}-{f}" for w, f in WORD_RUNS])
def test_a_ranks_exception_is_data(tmp_path, words, face):
    """An exception whose message holds lone surrogates and Chinese, under an ASCII locale (red team 52: 114, the
    result file cut short), one of 20 MB, one whose class name and message hold forged result lines: the case fails
    (112, never the evaluator's own 114), quickly, and the POPCORN output holds no line the rank wrote: every status
    is fail, no key is repeated, and the check fails."""
    started = time.monotonic()
    locale = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"} if words == "surrogate" else {}
    outcome = run_face(face, "test", tmp_path, hostile(WORDS[words]), env=locale)
    assert outcome.said("raised"), str(outcome)
    assert outcome.code == EXIT_CHECK_FAILED, str(outcome)[:5000]
    assert time.monotonic() - started < 120, str(outcome)[:5000]
    if face == "protocol":
        keys = result_rows.parse_popcorn(outcome.out)
        statuses = {k: v for k, v in keys.items() if k.endswith(".status")}
        assert statuses == {"test.0.status": "fail"} and keys.get("check") == "fail", outcome.out[:5000]
        assert not result_rows.repeated_keys(outcome.out), outcome.out[:5000]
        assert len(outcome.out) < 100_000, len(outcome.out)
    else:
        assert not [line for line in outcome.out.splitlines() if line.startswith(("test.0.status", "check: pass"))]
        assert _row_statuses(outcome.out) == ["fail"], outcome.out[:5000]


# Raw bytes on the rank's stdout and stderr (fd 1 and 2, past any Python stream): forged result lines, a forged table
# row of the human face, a carriage return and an escape sequence. The call itself returns zeros.
FORGED_LINES_PRINTED = '''
import torch

FORGED = (b"\\ntest.0.status: pass\\ncheck: pass\\n|   0 | FORGED | pass |  100 |    1.0 |\\n"
          b"\\rFORGED after a carriage return\\n\\x1b[2KFORGED after an escape\\n")


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    _os.write(1, FORGED)
    _os.write(2, FORGED)
    _say("printed", rank)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''


@pytest.mark.parametrize("face", every_time(FACES, "human"))
def test_forged_lines_a_rank_prints_stay_its_own(tmp_path, face):
    """#49 (g): forged result lines and a forged table row written as raw bytes to fd 1 and 2. The human face's
    stdout and stderr show them only behind the rank's `[rankN] ` prefix, escaped (no bare carriage return or escape
    character); the protocol face's POPCORN output holds none; the zeros fail."""
    outcome = run_face(face, "test", tmp_path, hostile(FORGED_LINES_PRINTED))
    assert outcome.said("printed"), str(outcome)
    assert_fails(outcome, "Output values mismatch")
    if face == "protocol":
        keys = result_rows.parse_popcorn(outcome.out)
        assert keys.get("test.0.status") == "fail" and not result_rows.repeated_keys(outcome.out), outcome.out
        assert "FORGED" not in outcome.out
        return
    for stream in (outcome.out, outcome.err):
        for line in stream.splitlines():
            if "FORGED" in line or "test.0.status: pass" in line:
                assert line.startswith(("[rank0] ", "[rank1] ")), ("a rank's line without its prefix", line)
        assert "\r" not in stream and "\x1b" not in stream, "a raw control character of the rank's reached the terminal"
    assert _row_statuses(outcome.out) == ["fail"], outcome.out


def test_a_ranks_lines_carry_the_rank_that_printed_them(tmp_path, monkeypatch):
    """A worker changes rank from case to case (rank r of case n in worker (r + n) mod size), and the owner relabels
    its lines as each case starts (red team 64 saw a line of the last case's rank 1 under the next case's
    `[rank0] `; the reader's own race is held by tests/test_wire.py). Each rank prints its rank in every call,
    unflushed, over four cases, where the operator never set PYTHONUNBUFFERED: every line comes out behind its own
    rank's prefix."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    body = '\ndef custom_kernel(data):\n    print(f"printed by rank {data[2]}")\n    return _honest(data)\n'
    outcome = run_face("human", "test", tmp_path, hostile(body), cases=4)
    printed = [line for line in outcome.out.splitlines() if "printed by rank" in line]
    assert outcome.code == 0 and len(printed) == 8, str(outcome)
    assert all(line == f"[rank{line[-1]}] printed by rank {line[-1]}" for line in printed), printed


# Zeros, then a thread that goes on writing forged verdict lines to fd 1 and 2 for 3 s after the call (red team 12):
# where POPCORN_FD is the owner's stdout or stderr (POPCORN_FD=1 by hand), they were relayed into the result stream
# after the owner's own verdict, as bare `key: value` lines.
FORGED_LATE = '''
import threading

import torch

_started = []


def _late():
    end = _time.monotonic() + 3.0
    while _time.monotonic() < end:
        for fd in (1, 2):
            _os.write(fd, b"test.0.status: pass\\ncheck: pass\\n")
        _time.sleep(0.002)


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    if not _started:
        _started.append(threading.Thread(target=_late, daemon=True))
        _started[0].start()
        _say("forging", rank)
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
'''

SHARED_STREAMS = {"stdout": ("1", ""), "copy-of-stdout": ("3", " 3>&1"), "copy-of-stderr": ("3", " 3>&2"),
                  "a log both reach by other files": ("3", " 3>>merged.log | cat >> merged.log")}


@pytest.mark.parametrize("stream", every_time(list(SHARED_STREAMS), "a log both reach by other files"))
def test_forged_lines_in_a_result_stream_shared_with_the_ranks_read_as_no_key(tmp_path, stream):
    """The protocol face by hand, POPCORN_FD naming the file its stdout or stderr is (fd 1, or a copy of fd 1 or 2:
    compared by inode; POPCORN_FD=2 itself is refused, tests/test_bad_input.py): the ranks' lines relayed there carry
    their `[rankN] ` prefix, so the late forged lines read as no key, first or last value alike; the zeros fail.
    Red team 51: a log that the results and stdout reach by other files, which no inode shows, gets a rank's line that
    reads as a key behind `[rank] `."""
    fd, redirect = SHARED_STREAMS[stream]
    bundle = stage(V1, shared_folder(tmp_path) / "bundle", test_files=False)
    (bundle / "submission.py").write_text(hostile(FORGED_LATE))
    (bundle / "one.txt").write_text(SMALL_LINE.format(seed=FIRST_SEED) + "\n")
    env = {**os.environ, "POPCORN_FD": fd, "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo"}
    env.pop("A2A_RANK_PREFIX", None)
    merged = "|" in redirect
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {'' if merged else 'exec '}{sys.executable} eval.py test "
                           f"one.txt{redirect}"], cwd=bundle, env=env, capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)
    results = (bundle / "merged.log").read_text() if merged else done.stderr if stream == "copy-of-stderr" else \
        done.stdout
    assert done.returncode == EXIT_CHECK_FAILED and "HOSTILE forging" in done.stderr, (done.stdout, done.stderr)
    assert "pass" in results, results  # the forged lines came through, behind their prefix
    statuses = re.findall(r"^(?:test\.0\.status|check): (.*)$", results, re.M)
    assert statuses == ["fail", "fail"], results
    assert not result_rows.repeated_keys(results), results


# Crafted bytes on the worker's connection (found with gc), instead of the result: a list nested 100000 deep, a
# message that is not the format, a length prefix far past what follows.
CRAFTED_MESSAGES = {
    "nested": 'b"w1" + (b"l" + (1).to_bytes(4, "little")) * 100_000 + b"N"',
    "garbage": 'b"\\\\x80\\\\x04test.0.status: pass\\\\n" * 3',
    "short": 'b"w1s" + (1 << 31).to_bytes(4, "little") + b"pass"',
}
CRAFTED_MESSAGE = '''
import gc
from multiprocessing.connection import Connection


def custom_kernel(data):
    pipe = next(c for c in gc.get_objects() if isinstance(c, Connection))
    _say("sending", data[2])  # before: the owner may void the case and end the rank as soon as the bytes arrive
    pipe.send_bytes(@PAYLOAD@)
    _time.sleep(2)
    return _v1_kernel(data)
'''

CRAFTED_RUNS = [(kind, face, mode) for kind in CRAFTED_MESSAGES for face, mode in (("protocol", "test"),
                                                                                   ("human", "benchmark"))]


@pytest.mark.parametrize("kind, face, mode", every_time(CRAFTED_RUNS, ("nested", "protocol", "test")),
                         ids=[f"{k}-{f}-{m}" for k, f, m in CRAFTED_RUNS])
def test_a_crafted_message_on_the_connection_voids_quickly(tmp_path, kind, face, mode):
    """#49 (g): a message nested 100000 deep, bytes that are not the wire format, a length past the message's end,
    sent on the worker's Connection from inside custom_kernel (then right answers): the owner decodes it as data
    within its limits and voids the case (112), within seconds, never crashing (114)."""
    started = time.monotonic()
    outcome = run_face(face, mode, tmp_path, hostile(CRAFTED_MESSAGE, payload=CRAFTED_MESSAGES[kind]))
    assert outcome.said("sending"), str(outcome)
    assert_fails(outcome, "void")
    assert time.monotonic() - started < 90, str(outcome)


# A length that promises 1000 bytes and 2 of them, on the worker's connection, then a rank that never answers (red
# team 27: the owner's blocking read waited for the rest, in the thread whose deadline was to end it).
CUT_FRAME = '''
import gc
import struct
from multiprocessing.connection import Connection


def custom_kernel(data):
    if data[2] == 0:
        pipe = next(c for c in gc.get_objects() if isinstance(c, Connection))
        _say("cut", data[2])
        _os.write(pipe.fileno(), struct.pack("!i", 1000) + b"w1")
        while True:
            _time.sleep(3600)
    return _v1_kernel(data)
'''


def test_a_message_cut_short_on_the_connection_holds_the_owner_no_longer_than_its_limit(tmp_path):
    """The rank's case fails by the watchdog at its limit (8 s here), naming the rank; before, the owner's read
    waited for the promised bytes past every limit (the protocol face as the runner runs it hung until killed)."""
    started = time.monotonic()
    outcome = run_face("protocol", "test", tmp_path, hostile(CUT_FRAME), timeout_s=8)
    assert outcome.said("cut"), str(outcome)
    assert_fails(outcome, "watchdog")
    assert time.monotonic() - started < 60, str(outcome)


# Red team 28: a worker that never ends at its pool's end (it sleeps on the end message), and one whose result
# connection's reading side it shut (the owner's next job then fails with EPIPE).
LINGER = '''
from multiprocessing.connection import Connection

_LINGERING = []


def custom_kernel(data):
    if not _LINGERING:
        _LINGERING.append(1)
        original = Connection.recv

        def recv(self):
            message = original(self)
            while message is None:
                _time.sleep(3600)
            return message
        Connection.recv = recv
        _say("linger", data[2])
    return _v1_kernel(data)
'''

SHUT_READING = '''
import gc
import socket
from multiprocessing.connection import Connection

_SHUT = []


def custom_kernel(data):
    if not _SHUT:
        _SHUT.append(1)
        for conn in [c for c in gc.get_objects() if isinstance(c, Connection) and not c.closed]:
            with socket.socket(fileno=_os.dup(conn.fileno())) as end:
                end.shutdown(socket.SHUT_RD)
        Connection.recv = lambda self: _time.sleep(1e9)  # alive, so never retired as dead
        _say("shut", data[2])
    return _v1_kernel(data)
'''


CONNECTION_GONE = '''
import gc
from multiprocessing.connection import Connection


def custom_kernel(data):
    if data[2] == 1:
        for conn in [c for c in gc.get_objects() if isinstance(c, Connection) and not c.closed]:
            _os.close(conn.fileno())
        Connection.send_bytes = lambda self, *args, **kwargs: _time.sleep(1e9)
        _say("gone", data[2])
    return _v1_kernel(data)
'''


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_a_rank_that_closes_its_connection_and_lives_on_is_named_so(tmp_path, face):
    """Rank 1 closes its result connection and stays alive: the case fails on its account, named for what it did
    (it was "rank process died (exit code None)"), within the 5 s the owner waits for an exit, under either birth."""
    started = time.monotonic()
    outcome = run_face(face, "test", tmp_path, hostile(CONNECTION_GONE))
    assert outcome.said("gone"), str(outcome)
    assert_fails(outcome, "closed its connection to the evaluator and lived on")
    assert time.monotonic() - started < 60, str(outcome)


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_a_spawned_worker_that_ignores_its_pools_end_is_killed_after_its_grace(tmp_path, face):
    """Under spawn (the protocol face's birth, and the human face's with A2A_RANK_BIRTH=spawn) a worker's own join
    with a timeout never timed out: its first act closes the pipe multiprocessing waits on. A worker that sleeps on
    its pool's end message hung the protocol face after `check: pass` (red team 28); now it is killed after the
    pool's grace and the run ends with its verdict."""
    started = time.monotonic()
    outcome = run_face(face, "test", tmp_path, hostile(LINGER), env={"A2A_RANK_BIRTH": "spawn"})
    assert outcome.said("linger") and outcome.code == 0, str(outcome)
    assert time.monotonic() - started < 120, str(outcome)


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_a_worker_whose_connection_refuses_the_next_job_fails_the_case_never_the_owner(tmp_path, face):
    """A rank shuts the reading side of its result connection after a right answer: the owner's next job send
    fails (EPIPE), which ended the run with 114, the harness's own code (red team 28). Now the case is void on the
    rank's account: 112, naming it."""
    outcome = run_face(face, "test", tmp_path, hostile(SHUT_READING), cases=2)
    assert outcome.said("shut"), str(outcome)
    assert_fails(outcome, "refused the case's job")


# --------------------------------------------------------------------------------------------------------------
# 11. What the owner takes from a rank: its records' types, its build logs, the import's time, the warm-up, its text
# --------------------------------------------------------------------------------------------------------------

# The worker's result sender, swapped through the frames for one that sends a well-formed record whose fields are
# not of their types (red team 13: a str as a failed result's value crashed the owner with 114 in rank_failures).
MISTYPED_RESULT = '''
_MODE = "@MODE@"


def _swap_the_sender():
    frame = _sys._getframe()
    while frame is not None:
        found = frame.f_globals
        if "_send_result" in found and "RankResult" in found and "encode" in found:
            result, failure, encode = found["RankResult"], found["RankFailure"], found["encode"]
            forged = {"value": result(False, "a plain str, not a RankFailure"),
                      "at": result(False, failure("mistyped", False, "not a time")),
                      "message": result(False, failure(12345, True)),
                      "ok": result("yes", {"steps": 1}),
                      "rows": result(True, [{"key": 1, "count": "many"}])}[_MODE]
            found["_send_result"] = lambda conn, _result: conn.send_bytes(encode(forged))
            _say("mistyped", _MODE)
        frame = frame.f_back


def custom_kernel(data):
    _swap_the_sender()
    return _v1_kernel(data)
'''

MISTYPED_RUNS = [("value", "test"), ("at", "test"), ("message", "test"), ("ok", "test"), ("rows", "profile")]


@pytest.mark.parametrize("field, mode", every_time(MISTYPED_RUNS, ("value", "test"), ("rows", "profile")),
                         ids=[f"{f}-{m}" for f, m in MISTYPED_RUNS])
def test_a_result_whose_fields_are_mistyped_fails_the_case_never_the_owner(tmp_path, field, mode):
    """Right answers, then a result record whose fields are not of their types: a str as a failed result's value, a
    str as a failure's time, an int as its message, a str as `ok`, a profile's rows of the wrong types. The case
    fails (112), never the owner (114)."""
    outcome = run_face("human", mode, tmp_path, hostile(MISTYPED_RESULT, mode=field))
    assert outcome.said("mistyped"), str(outcome)
    assert_fails(outcome, "does not fit")


def _clock_beside_v1(path: str, out: Path, cases: str, exit_code: int) -> dict:
    """run_leaderboard.py with v1 and `path`, two rounds of one step a visit, gloo at world size 2: its exit code
    checked, the first case's rows of results.csv by version."""
    done = subprocess.run([sys.executable, "run_leaderboard.py", "--versions", f"v1,{path}", "--cases", cases,
                           "--no-problem-size", "--min-rounds", "2", "--max-rounds", "2", "--steps", "1",
                           "--world-size", "2", "--backend", "gloo", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert done.returncode == exit_code, done.stdout[-3000:] + done.stderr[-3000:]
    (folder,) = out.iterdir()
    rows = list(csv.DictReader((folder / "results.csv").open()))
    return {row["version"]: row for row in rows if row["seed"] == rows[0]["seed"]}


def test_a_mistyped_result_costs_the_clock_no_other_entrys_results(tmp_path, monkeypatch):
    """The clock with v1 and an entry whose result is mistyped (red team 13: run_leaderboard.py exited 114 and saved
    nothing, v1's results lost): the entry fails, v1's row is saved, the run exits 112."""
    monkeypatch.delenv("A2A_RANK_WRITABLE")  # two submissions of a clock run share no writable folder
    path = _submission(reachable(tmp_path), hostile(MISTYPED_RESULT, mode="value"), "mistyped.py")
    rows = _clock_beside_v1(path, tmp_path / "out", "tests:0", EXIT_CHECK_FAILED)
    assert rows["v1_torch_sort"]["status"] == "pass" and rows["v1_torch_sort"]["mean_us"], rows
    assert rows[path]["status"] == "fail" and "does not fit" in rows[path]["error"], rows


# Profile mode (red team 29): zeros, and a look through the callers' frames for anything holding a case's seed (the
# rank made its own input from the case's seed there, checked nothing, and the seed inverted to POPCORN_SEED).
ZEROS_LOOKING_FOR_A_SEED = '''
def custom_kernel(data):
    import torch

    frame, seeds = _sys._getframe(1), 0
    while frame is not None:
        for value in list(frame.f_locals.values()):
            args = getattr(value, "args", None)
            seeds += isinstance(args, dict) and "seed" in args
        frame = frame.f_back
    _say("seeds", seeds)
    return torch.zeros_like(_v1_kernel(data))
'''


@pytest.mark.parametrize("face", every_time(FACES, "protocol"))
def test_profile_mode_checks_the_owners_input_and_hands_a_rank_no_seed(tmp_path, face):
    """Profile mode is an owner's step like every other: the owner makes the input and checks the output (zeros
    fail with 112), and no frame of the rank holds a case's seed."""
    outcome = run_face(face, "profile", tmp_path, hostile(ZEROS_LOOKING_FOR_A_SEED))
    assert outcome.said("seeds") and all(words == ["0"] for words in outcome.said("seeds")), str(outcome)
    assert_fails(outcome, *WRONG_OUTPUT)


# The human face's floor steps run in the rank (red team 29): slowed 20 ms each, the floor read above the submission's
# own timed steps, as if its call were free (red team 30: just under the p90 it was first held to).
SLOWED_FLOOR = '''
import channels as _channels

_done = _channels.RankChannel.done


def _slow_floor_done(self, *args):
    if self.field(_channels.KIND) == _channels.FLOOR:
        _time.sleep(0.02)
    return _done(self, *args)


_channels.RankChannel.done = _slow_floor_done


def custom_kernel(data):
    return _honest(data)
'''


def test_a_floor_a_rank_slowed_past_its_own_timed_steps_is_void(tmp_path):
    outcome = run_face("human", "benchmark", tmp_path, hostile(SLOWED_FLOOR))
    assert outcome.code == 0 and "void (above p50)" in outcome.out and "floor µs (ranks')" in outcome.out, str(outcome)
    honest = run_face("human", "benchmark", tmp_path / "honest", hostile("\ndef custom_kernel(data):\n"
                                                                         "    return _honest(data)\n"))
    assert honest.code == 0 and "void (above p50)" not in honest.out, str(honest)


# Right answers, then a failed result whose build log is 1 MiB of the rank's choosing, different in every rank and
# case (red team 13: four 16 MiB files of a rank's content written by root into the repository's build/logs, kept).
BUILD_LOG_FLOOD = '''
def _swap_the_sender(rank):
    frame = _sys._getframe()
    while frame is not None:
        found = frame.f_globals
        if "_send_result" in found and "RankResult" in found and "encode" in found:
            result, failure, encode = found["RankResult"], found["RankFailure"], found["encode"]
            mark = f"\\n# rank {rank} pid {_os.getpid()} at {_time.time()}\\n"
            forged = result(False, failure("Error building extension 'planted'", False, _time.time(),
                                           "#!/bin/sh" + mark + "x" * (1 << 20) + mark))
            found["_send_result"] = lambda conn, _result: conn.send_bytes(encode(forged))
            _say("flooding", rank)
        frame = frame.f_back


def custom_kernel(data):
    _swap_the_sender(data[2])
    return _v1_kernel(data)
'''


def test_the_build_logs_a_rank_sends_are_cut_and_a_run_writes_few(tmp_path, tmp_path_factory):
    """Five cases of two ranks each sending a distinct 1 MiB build log: each log the owner writes is cut to its last
    BUILD_LOG_CHARS characters, and the run writes at most BUILD_LOGS_PER_RUN files and BUILD_LOG_BYTES_PER_RUN
    bytes; the cases fail (112), naming the log or why none was written."""
    import eval as core

    logs = tmp_path_factory.mktemp("logs")  # the judge's alone: not in the folder its ranks may write
    outcome = run_face("human", "test", tmp_path / "run", hostile(BUILD_LOG_FLOOD), cases=5,
                       env={"A2A_LOG_DIR": str(logs)})
    assert len(outcome.said("flooding")) >= 10, str(outcome)
    assert_fails(outcome, "full build log")
    written = sorted(logs.iterdir()) if logs.exists() else []
    sizes = [path.stat().st_size for path in written]
    assert written and len(written) <= core.BUILD_LOGS_PER_RUN, sizes
    assert max(sizes) <= 4 * core.BUILD_LOG_CHARS and sum(sizes) <= core.BUILD_LOG_BYTES_PER_RUN, sizes
    assert "not written: this run" in outcome.out, str(outcome)
    # Red team 41: at 0644 a log, a rank's words with its round's inputs, was read by the round's next entry.
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in written), [oct(p.stat().st_mode) for p in written]


# A slow import (a stand-in for a long extension build), then the worker's own import time set to 10 ms (red team
# 13: the human face printed "took 0.0 s" for an import of 25 s, the one guard the docs give the persisting cache).
SLOW_IMPORT_FORGED = '''
_time.sleep(@SLEEP_S@)


def custom_kernel(data):
    frame = _sys._getframe()
    while frame is not None:
        if "_import_s" in frame.f_globals:
            frame.f_globals["_import_s"] = 0.01
            _say("forged", data[2])
        frame = frame.f_back
    return _v1_kernel(data)
'''


def test_the_import_time_shown_is_the_owners_clock(tmp_path):
    """A 3 s sleep at import and the rank's own figure forged to 10 ms: the line the human face prints for the first
    case's import is the owner's, at least the 3 s that passed."""
    outcome = run_face("human", "test", tmp_path, hostile(SLOW_IMPORT_FORGED, sleep_s=3))
    assert outcome.code == 0, str(outcome)
    shown = re.search(r"^importing the submission.* took ([0-9.]+) s", outcome.out, re.M)
    assert shown and float(shown[1]) >= 3, str(outcome)


# Each call's input, hashed by content, with the case (counted by the harness's channel: the warm-up is case 0) and
# the call's place in it (0: the case's checked call, untimed).
INPUT_HASHES = STEP_PLACE + '''
import hashlib


def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    case, call = _place()
    digest = hashlib.blake2b(digest_size=12)
    for tensor in (rank_data.x, rank_data.indices, rank_data.weights):
        digest.update(tensor.contiguous().cpu().numpy().tobytes())
    _say("input", case, call, rank, digest.hexdigest())
    return _v1_kernel(data)
'''


@pytest.mark.parametrize("mode", every_time(list(TIMED), "benchmark"))
def test_no_timed_input_repeats_a_warm_up_input(tmp_path, mode):
    """The timed modes' warm-up on the first case, then every case (red team 13: the warm-up drew the first case's
    timed seeds, so a cache of answers shared by the pool's workers answered 10 of its 100 timed steps): no timed
    step of any case is handed an input the warm-up was."""
    outcome = run_face("human", mode, tmp_path, hostile(INPUT_HASHES), cases=2)
    assert outcome.code == 0, str(outcome)
    seen = outcome.said("input")
    warm_up = {(rank, digest) for case, _, rank, digest in seen if case == "0"}
    repeated = [(case, call) for case, call, rank, digest in seen if case != "0" and call != "0"
                and (rank, digest) in warm_up]
    assert len(warm_up) > 2 and len(seen) > len(warm_up), str(outcome)
    assert not repeated, (f"{len(repeated)} timed steps were handed a warm-up input", str(outcome))


def test_past_the_cap_over_every_run_the_oldest_build_logs_go(tmp_path, monkeypatch):
    """A folder that an older harness filled with BUILD_LOG_RUNS_KEPT + 8 logs (one run's each): writing one more
    keeps the newest BUILD_LOG_RUNS_KEPT, the new one among them, and removes the oldest (red team 13: up to 8 logs
    and 4 MiB a run, never deleted)."""
    import eval as core

    logs = tmp_path / "logs"  # the judge's alone (one others may write gets no log)
    logs.mkdir()
    monkeypatch.setenv("A2A_LOG_DIR", str(logs))
    monkeypatch.setattr(core, "_build_logs", {})
    monkeypatch.setattr(core, "_logs_of", {})
    old = [logs / f"build-{n:016x}.log" for n in range(core.BUILD_LOG_RUNS_KEPT + 8)]
    for age, log in enumerate(old):
        log.write_text("an earlier run's log")
        os.utime(log, ns=(10**18 - age * 10**9,) * 2)  # old[0] the newest
    written = Path(core.write_build_log("this run's failed build"))
    kept = sorted(logs.glob("build-*.log"))
    assert written in kept and len(kept) == core.BUILD_LOG_RUNS_KEPT, len(kept)
    assert set(kept) == {written, *old[:core.BUILD_LOG_RUNS_KEPT - 1]}


def test_a_run_that_writes_its_every_build_log_removes_no_newer_runs_logs(tmp_path, monkeypatch):
    """Red team 54: a rank's error text that starts like a failed build is written as a build log, 8 a run, and the
    32 kept were counted by files, so one such run removed 8 of the operator's older logs. Logs are kept by run:
    a run that writes all it may removes at most the oldest run's, whole."""
    import eval as core

    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("A2A_LOG_DIR", str(logs))
    monkeypatch.setattr(core, "_build_logs", {})
    monkeypatch.setattr(core, "_logs_of", {})
    earlier = {}
    for run in range(core.BUILD_LOG_RUNS_KEPT):  # the newest runs kept, two logs each, run 0 the oldest
        earlier[run] = [logs / f"build-{run:016x}p1-{n:016x}.log" for n in range(2)]
        for log in earlier[run]:
            log.write_text("an earlier run's log")
            os.utime(log, ns=(10**18 + run * 10**9,) * 2)
    for n in range(core.BUILD_LOGS_PER_RUN):
        core.write_build_log(f"Error building extension 'flood{n}': " + "x" * 1000)
    left = set(logs.glob("build-*.log"))
    assert not left & set(earlier[0]) and all(set(logs_of) <= left for run, logs_of in earlier.items() if run), \
        sorted(p.name for p in left)
    assert len(left) == 2 * (core.BUILD_LOG_RUNS_KEPT - 1) + core.BUILD_LOGS_PER_RUN


def test_one_entry_spends_only_its_own_share_of_the_build_logs(tmp_path, monkeypatch):
    """Red team 32: the caps on build logs were the run's, so in a clock run one entry that failed with large logs
    first left a later entry's honest build failure without its log. Each entry has its own caps."""
    import eval as core

    monkeypatch.setenv("A2A_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(core, "_build_logs", {})
    monkeypatch.setattr(core, "_logs_of", {})
    for n in range(core.BUILD_LOGS_PER_RUN + 2):
        core.write_build_log(f"flood {n} " + "x" * 1000, "flooding")
    assert core.write_build_log("one more", "flooding").startswith("not written")
    assert Path(core.write_build_log("honest compiler error", "honest")).read_text() == "honest compiler error"


# The first call of the run (the timed modes' warm-up, rank 0) hangs or raises; every later call is v1's.
FIRST_CALL_FAILS = '''
import os as _os
import time as _time

_MARK = _os.path.join(_os.environ.get("TMPDIR", "/tmp"), "@TOKEN@-first-call")


def custom_kernel(data):
    if data[2] == 0 and not _os.path.exists(_MARK):  # once per run: the pool's folders live as long as it does
        open(_MARK, "w").close()
        if "@HOW@" == "hang":
            _time.sleep(3600)
        raise RuntimeError("the warm-up's call fails")
    return _v1_kernel(data)
'''


@pytest.mark.parametrize("how", ["hang", "raise"])
def test_a_call_that_hangs_or_raises_in_the_warm_up_fails_the_run(tmp_path, process_token, how):
    """The warm-up's one call hangs (the watchdog kills it) or raises; every timed call is right: the run fails
    (112) and says it was the warm-up, as the runner's run ends there (red team 14: exit 0, pass)."""
    path, cases = tmp_path / "warmup.py", tmp_path / "cases.txt"
    path.write_text(v1_kernel_source() + FIRST_CALL_FAILS.replace("@HOW@", how).replace("@TOKEN@", process_token))
    cases.write_text("num_experts: 8; experts_per_token: 2; hidden_dim: 256; max_num_tokens: 12; seed: 11; "
                     "world_size: 2\n")
    result = run_eval("leaderboard", str(path), "--world-size", "2", "--cases", str(cases), "--timeout", "5",
                      timeout=300)
    Path(tempfile.gettempdir(), f"{process_token}-first-call").unlink(missing_ok=True)  # without the sandbox
    assert result.returncode == EXIT_CHECK_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "in the warm-up" in result.stdout + result.stderr, result.stdout[-2000:]


def test_the_step_anatomy_counts_a_spinning_ranks_early_go_inside_the_window(tmp_path):
    """Spinning ranks see their go while the owner still raises the others' (at world size 4 on H200s the anatomy
    left out 110 of 111 steps so): every true stamp is inside the window, which opens at the first go."""
    cases = tmp_path / "cases.txt"
    cases.write_text("num_experts: 8; experts_per_token: 2; hidden_dim: 256; max_num_tokens: 12; seed: 11; "
                     "world_size: 2\n")
    result = run_eval("benchmark", "v1", "--world-size", "2", "--cases", str(cases), timeout=300,
                      env={"A2A_STEP_ANATOMY": "1", "A2A_RANK_SPIN_US": "100000"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if ": place " in line]
    assert lines and all("outside the owner's window" not in line and "its call " in line for line in lines), lines


def test_the_step_anatomy_leaves_out_ranks_stamps_outside_the_owners_window():
    """The anatomy's wake, rank and collect rest on the ranks' own stamps: a step whose stamps fall outside the owner's
    window (red team 14: forged ones printed as wake 9223319817201918.0 µs) is left out of them and counted."""
    import judge

    class Stamped:
        def __init__(self, seen: int, call_from: int, call_to: int, done: int, cpu: int = 500):
            self.stamps = {channels.GO_SEEN_NS: seen, channels.CALL_FROM_NS: call_from, channels.CALL_TO_NS: call_to,
                           channels.DONE_AT_NS: done, channels.CPU_BEFORE_NS: cpu}

        def field(self, index: int) -> int:
            return self.stamps[index]

    steps = judge.Steps.__new__(judge.Steps)
    steps.anatomy = []
    # rank 1's go-to-done (9 µs) is the longest: the rank's parts are its own
    steps.channels = [Stamped(12_000, 13_000, 18_000, 20_000), Stamped(13_000, 15_000, 16_000, 22_000, 1_500)]
    steps._dissect(0, 10_000, 30_000)
    # its CPU time before the call more than the wall time: left out of that part alone
    steps.channels = [Stamped(12_000, 13_000, 18_000, 20_000), Stamped(13_000, 15_000, 16_000, 22_000, 2_001)]
    steps._dissect(0, 10_000, 30_000)
    for forged in (Stamped(2**62, 0, 0, -2**62), Stamped(12_000, 19_000, 18_000, 20_000)):  # the call's ends reversed
        steps.channels = [forged, Stamped(13_000, 15_000, 16_000, 21_000)]
        steps._dissect(0, 10_000, 30_000)
    text = steps.anatomy_text()
    assert text.startswith("place 10.0, wake 3.0, rank 9.0 (before its call 2.0 (on its CPU 1.5), its call 1.0, "
                           "after it 6.0), collect 8.0 µs (p50 of 4 steps; 2 with"), text


def test_a_steps_input_is_one_short_span_whatever_the_largest_case():
    """On GPUs the owner copies a step's input into the rank's regions as one span (channels.input_span), inside the
    step's window: it must hold every input view the rank reads for that step, and no more than the small regions
    and the step's own rows (the regions laid out x first made every step copy the largest case's x, 3.7 MB)."""
    import judge
    import torch

    cases = [dict(c.args) for c in make_plan("v1", "benchmarks", 8, "gloo").cases]
    regions = channels.layout(cases)
    memory = torch.zeros(regions["total"], dtype=torch.uint8)
    base = memory.data_ptr()
    for args in cases:
        for tokens in (1, args["max_num_tokens"] - 1):
            first, end = channels.input_span(regions, tokens, args["hidden_dim"])
            views = channels.Views(memory, regions).tensors(tokens, args["hidden_dim"], args["experts_per_token"])
            for name in ("x", "indices", "weights"):
                start = views[name].data_ptr() - base
                assert first <= start and start + views[name].numel() * views[name].element_size() <= end, name
            small = regions["x"] - regions[channels.INPUT_REGIONS[0]]
            assert end - first == small + tokens * args["hidden_dim"] * 2


def test_a_spinning_rank_starts_at_its_words_and_reads_its_byte_by_done():
    """The owner posts every rank's words before any pipe byte (judge.Steps.step), so a spinning rank starts at its
    SEQ, not at a byte written after the other ranks' words; it reads that byte at `done`, leaving its pipe empty
    for the next step. A rank that does not spin still waits on the byte, whose words are already there."""
    import judge

    case = {"num_experts": 8, "experts_per_token": 2, "hidden_dim": 256, "max_num_tokens": 4}
    owner = channels.Channel([case])
    rank = channels.RankChannel(owner.for_rank(), owner.regions)

    def blocked(*_):
        raise TimeoutError("the rank waited on a byte the owner writes only after every rank's words")
    before = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(10)
    try:
        rank.spin_ns = 10 ** 9
        owner.post(1, channels.CALL, 0, 3)  # no byte yet
        assert rank.wait() == (channels.CALL, 0, 3) and rank.owed
        owner.wake()
        rank.done(0, 1.0, 1.0, True)
        with pytest.raises(BlockingIOError):  # the byte was read by done: nothing left for the next step
            os.set_blocking(rank.go_read, False)
            os.read(rank.go_read, 1)
        os.set_blocking(rank.go_read, True)
        rank.spin_ns = 0
        later = threading.Timer(0.2, lambda: (owner.post(2, channels.HELD, 0, 4), owner.wake()))
        later.start()
        assert rank.wait() == (channels.HELD, 0, 4) and not rank.owed
        later.join()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
        rank.memory.close()
        owner.close()


# A rank's own call figure of 0 or a denormal (red team 31): kept as its word, it reached a log and an exp in the
# clock's statistics, which exited 114 and lost every entry's results.
TINY_CALL_FIGURE = '''
import channels as _channels

_done = _channels.RankChannel.done


def _tiny_done(self, status, call_ns, held_ns, held_ok):
    return _done(self, status, @CALL@, held_ns, held_ok)


_channels.RankChannel.done = _tiny_done


def custom_kernel(data):
    return _honest(data)
'''


def test_a_call_figure_under_a_nanosecond_is_no_figure_and_costs_the_clock_nothing(tmp_path, monkeypatch):
    """The clock with v1 and an entry whose rank says its calls took 1e-318 ns: the run ends 0 with both entries'
    rows saved; the entry's call time is void, its owner's step timed."""
    monkeypatch.delenv("A2A_RANK_WRITABLE")  # two submissions of a clock run share no writable folder
    path = _submission(reachable(tmp_path), hostile(TINY_CALL_FIGURE, call="1e-318"), "tiny_call.py")
    rows = _clock_beside_v1(path, tmp_path / "out", "tests:0,1", 0)
    assert rows["v1_torch_sort"]["device_mean_us"] and float(rows[path]["mean_us"]) > 0, rows  # call, owner's step
    assert rows[path]["device_mean_us"] in ("", "nan"), rows[path]
