"""The judge's clock on CPU: intervals of the width a known distribution gives, ties, the agreement measures, and
real rounds (gloo, two ranks): every entry in every round in fresh processes, the order shuffled from a recorded
seed, the stopping rule."""
import dataclasses
import math
import os
import random
import re
import statistics
import sys
import threading
from pathlib import Path

import pytest

import channels
from a2a import clock
from a2a import intervals as iv
from a2a.plan import make_plan

SIGMA = 0.10  # the spread of log round values in the simulated runs


def test_an_interval_has_the_width_and_coverage_a_known_distribution_gives():
    """Round values drawn lognormal around 100 with sigma 0.1 on the log scale: the interval's log half-width is
    t * s / sqrt(n), and over many runs it holds the true geometric mean about 95% of the time."""
    from scipy import stats

    generator = random.Random(1)
    rounds = 12
    held, widths = 0, []
    for _ in range(2000):
        values = [100 * math.exp(generator.gauss(0, SIGMA)) for _ in range(rounds)]
        found = iv.interval(values)
        held += found.low <= 100 <= found.high
        widths.append(math.log(found.high / found.center))
    expected = stats.t.ppf(0.975, rounds - 1) * SIGMA / math.sqrt(rounds)
    assert 0.93 <= held / 2000 <= 0.97
    assert abs(sum(widths) / len(widths) / expected - 1) < 0.05
    one = iv.interval([5.0])
    assert one.rounds == 1 and one.half_width == math.inf
    assert math.isnan(iv.interval([]).center)


def test_geomean_rounds_takes_only_rounds_every_shape_has():
    per_shape = {0: {0: 2.0, 1: 4.0, 2: 8.0}, 1: {0: 8.0, 2: 2.0}}
    assert iv.geomean_rounds(per_shape) == pytest.approx([4.0, 4.0])


def test_the_rounds_spread_splits_into_the_rounds_machine_and_each_entrys_pool():
    """Rounds move every entry by 0.2, 0, -0.2 in the log; each entry's pool adds +-0.05 of its own: the parts come
    back (SD of the round's shared part 0.2; of the pools', over 6 values, sqrt(0.01 / 5)), whatever each entry's
    own level; only the rounds every entry has count."""
    shared, own = [0.2, 0.0, -0.2], {"A": [0.05, -0.05, 0.0], "B": [-0.05, 0.05, 0.0]}
    per_entry = {name: {r: math.exp(level + shared[r] + own[name][r]) for r in range(3)}
                 for name, level in (("A", 1.0), ("B", 5.0))}
    per_entry["A"][7] = 100.0  # a round B does not have
    parts = iv.spread_parts(per_entry)
    assert parts["round"] == pytest.approx(0.2) and parts["pool"] == pytest.approx(math.sqrt(0.01 / 5))
    assert (parts["entries"], parts["rounds"]) == (2, 3)
    assert iv.spread_parts({"A": per_entry["A"]}) is None


def test_a_visits_own_spread_is_what_its_pool_and_its_shape_do_not_explain():
    """Shapes at their own levels, pools (an entry's round) moving all their shapes by -0.3/+0.3 in the log, and
    visits of +-0.1 each: the visit part comes back alone (SD of 0.1, -0.1 over the 8 visits), the pools' moves
    taken out; a pool of one shape counts no visit."""
    pools, visits = [-0.3, 0.3], [0.1, -0.1]
    per_case = {i: {r: math.exp(level + pools[r] + visits[(i + r) % 2]) for r in range(2)}
                for i, level in enumerate((2.0, 4.0))}
    spread = iv.visit_spread({"A": per_case, "B": per_case})
    assert spread == pytest.approx(statistics.stdev([0.1, -0.1] * 4))
    assert iv.visit_spread({"A": {0: per_case[0]}}) is None


def test_the_part_of_a_visit_its_own_steps_explain():
    """Visits whose steps spread by a known SD in the log: their part is that SD over the root of the steps' count,
    the median over visits; a visit of one step, or none with a value that is no time, counts nothing."""
    wide, narrow = [math.exp(x) for x in (0.2, -0.2, 0.2, -0.2)], [math.exp(x) for x in (0.05, -0.05, 0.05, -0.05)]
    sd = statistics.stdev([0.2, -0.2, 0.2, -0.2])
    assert iv.steps_spread([wide, wide, narrow]) == pytest.approx(sd / 2)
    assert iv.steps_spread([[5.0], [0.0, math.nan, 3.0]]) is None


def test_a_ranks_zero_or_denormal_figure_breaks_no_statistic():
    """Red team 31: a round whose call figure was 0 reached visit_spread's log, and rounds of 1e-321 and 8 µs
    overflowed an interval's exp: both ended the clock with 114. A value that is no time is left out; an interval's
    top stops at 1e300."""
    per_case = {0: {0: 0.0, 1: 5.0, 2: 6.0}, 1: {0: 7.0, 1: 8.0, 2: 9.0}}
    assert iv.visit_spread({"A": per_case, "B": per_case}) is not None
    wide = iv.interval([1e-321, 8.0])
    assert wide.center > 0 and wide.high == pytest.approx(1e300)


def test_many_shapes_or_rounds_of_the_largest_double_overflow_no_geomean():
    """Red team 39: the mean of 70 or more logs of the largest double rounds past its log, and a geomean over 80
    shapes (or an interval over 80 rounds) of it ended --compare with 114. Each figure stops at 1e300."""
    per_shape = {shape: {0: sys.float_info.max} for shape in range(80)}
    assert iv.geomean_by_round(per_shape)[0] == pytest.approx(1e300)
    found = iv.interval([sys.float_info.max] * 80)
    assert found.center == pytest.approx(1e300) and found.low == pytest.approx(1e300)


def test_the_rounds_a_target_needs_follow_from_the_spread_seen():
    """An interval of n rounds whose half-width is twice the target needs about 4n rounds (a little less: t shrinks
    with n); meeting it already needs no more than it has; one round says nothing."""
    values = [math.exp(x) for x in (0.1, -0.1, 0.05, -0.05, 0.0, 0.08, -0.08, 0.02)]
    found = iv.interval(values)
    need = iv.rounds_to_meet(found, found.half_width / 2)
    assert 3 * found.rounds < need <= 4 * found.rounds, (need, found)
    repeated = values * math.ceil(need / len(values))  # the same spread over at least that many rounds meets it
    assert iv.interval(repeated).half_width <= found.half_width / 2 * 1.02
    assert iv.rounds_to_meet(found, found.half_width) <= found.rounds
    assert iv.rounds_to_meet(iv.interval([1.0]), 0.03) is None


def test_entries_rank_by_center_and_name_the_ones_whose_intervals_overlap():
    found = {"a": iv.Interval(10, 9, 11, 5), "b": iv.Interval(10.5, 10.8, 12, 5), "c": iv.Interval(12, 11.5, 13, 5),
             "d": iv.Interval(30, 29, 31, 5)}
    ranks = iv.ranks_with_ties(found)
    assert ranks["a"] == (1, ["b"]) and ranks["b"] == (2, ["a", "c"]) and ranks["c"] == (3, ["b"])
    assert ranks["d"] == (4, [])


def test_a_noisy_entry_does_not_rank_ahead_of_a_steady_faster_one():
    """Red team 24: 1.5x slower than its rival in four rounds of five and far slower in one, an entry's interval
    reached below the fastest entry's; ranked by interval it tied for first, ahead of a steady entry faster than it."""
    rounds = {"fast": [100.0] * 5, "steady": [130.0] * 5, "erratic": [150.0] * 4 + [3000.0]}
    found = {name: iv.interval(values) for name, values in rounds.items()}
    assert found["erratic"].low < found["fast"].center  # its interval does reach down
    ranks = iv.ranks_with_ties(found)
    assert ranks["fast"][0] == 1 and ranks["steady"][0] == 2 and ranks["erratic"][0] == 3, ranks
    assert "fast" in ranks["erratic"][1]


def test_agreement_between_runs():
    assert iv.kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert iv.kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    runs = [{"a": 1.0, "b": 2.0, "c": 2.05}, {"a": 1.1, "b": 2.1, "c": 2.0}, {"a": 0.9, "b": 2.0, "c": 2.1}]
    assert iv.pairwise_agreement(runs) == (2, 2)  # a-b and a-c are far apart and ordered alike; b-c is close
    runs.append({"a": 2.5, "b": 2.0, "c": 2.1})
    assert iv.pairwise_agreement(runs) == (0, 2)


def test_unmet_names_what_is_still_too_wide():
    found = {"call": iv.Interval(10, 9, 11, 5), "held": iv.Interval(10, 9.9, 10.1, 5)}
    missed = iv.unmet(found, (iv.Target("call", 0.05), iv.Target("held", 0.02), iv.Target("owner", 0.05)))
    assert [(m, round(w, 3), t) for m, w, t in missed] == [("call", 0.1, 0.05)]


def _cases_file(tmp_path):
    path = tmp_path / "cases.txt"
    path.write_text("".join(f"num_experts: 8; experts_per_token: 2; hidden_dim: {h}; max_num_tokens: 8; seed: {s}; "
                            f"world_size: 2\n" for h, s in ((64, 1), (128, 2))))
    return str(path)


def test_rounds_visit_every_entry_on_every_shape_in_fresh_processes_in_a_recorded_order(tmp_path):
    plan = make_plan(["v1", "v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("A", "version", str(plan.versions[0])), clock.Entry("B", "version", str(plan.versions[1]))]
    # seed 0 draws both start orders in three rounds: listed first is not started first in every round
    settings = clock.Settings(steps=2, warmup=1, min_rounds=3, max_rounds=3, time_cap_s=math.inf, targets=(), seed=0)
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 3 and not run.failed
    assert {tuple(s) for s in run.starts} == {("A", "B"), ("B", "A")}, run.starts
    for r in range(3):
        assert sorted(run.visits[r]) == [("A", 0), ("A", 1), ("B", 0), ("B", 1)]
        drawn = random.Random(run.round_seeds[r])
        starts = ["A", "B"]
        drawn.shuffle(starts)
        assert run.starts[r] == starts  # the entries go in the recorded seed's order
        replayed = []
        for entry in starts:  # each visited on its shapes in the seed's next shuffles
            shapes = [0, 1]
            drawn.shuffle(shapes)
            replayed += [(entry, i) for i in shapes]
        assert run.visits[r] == replayed
    assert len({tuple(v) for v in run.visits}) > 1  # shuffled anew each round
    pids = [pid for per_round in run.processes for per_entry in per_round.values() for pid in per_entry]
    assert len(pids) == len(set(pids)) == 3 * 2 * 2  # fresh processes: 3 rounds x 2 entries x 2 ranks
    for key in (("A", 0), ("A", 1), ("B", 0), ("B", 1)):
        assert sorted(run.samples[key]) == [0, 1, 2] and all(v["owner"] > 0 for v in run.samples[key].values())
        for value in run.samples[key].values():  # each idle step's window kept, the figure their mean
            assert len(value["owner_steps_us"]) == 2 and value["owner"] == pytest.approx(
                statistics.fmean(value["owner_steps_us"]), abs=1e-3), value
    spread = clock.spread(run)  # the header's line: the rounds' spread, the machine's part and the pools'
    assert {(p["entries"], p["rounds"]) for p in spread.values()} == {(2, 3)} and "owner" in spread, spread
    assert spread["owner"]["steps"] > 0 and all("steps" not in spread[m] for m in spread if m != "owner"), spread
    assert run.stopped == {"A": "3 rounds", "B": "3 rounds"}  # no targets: every round asked for runs


def test_a_visits_ranked_steps_run_together_with_no_unranked_step_between(tmp_path, monkeypatch):
    """Red team 56: with idle (ranked) and held (unranked) steps taking turns, a rank that read each step's kind did
    its per-call work in the held steps between ranked ones and ranked 47% under its twin doing the same work. A
    visit is its warm-up, then every ranked step, then every held step."""
    import judge

    plan = make_plan(["v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    visits, step, visit = [], clock.Clock._step, clock.Clock._visit

    def visiting(self, live, index, round_index, bank):
        visits.append([])
        return visit(self, live, index, round_index, bank)

    def stepping(self, live, kind, index, inputs):
        if visits:
            visits[-1].append(kind)
        return step(self, live, kind, index, inputs)

    monkeypatch.setattr(clock.Clock, "_visit", visiting)
    monkeypatch.setattr(clock.Clock, "_step", stepping)
    settings = clock.Settings(steps=3, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, [clock.Entry("A", "version", str(plan.versions[0]))], settings,
                             progress=lambda _: None)
    assert not run.failed and len(visits) == 2, (run.failed, visits)
    assert all(kinds == [channels.CALL] * 4 + [channels.HELD] * 3 for kinds in visits), visits


@pytest.mark.parametrize("kept_max_bytes", [None, 1], ids=["whole", "in-parts"])
def test_a_visits_outputs_are_checked_after_it_and_a_wrong_one_fails_its_entry(tmp_path, monkeypatch, kept_max_bytes):
    """The owner checks a visit's outputs after its last step (no check between two of its steps: red team 54), or
    in parts where they pass the memory it may keep, and still every one: an entry right in its ready steps and
    wrong in one step of a visit fails, its rank and case named, with no figure; the other entry keeps its own."""
    import judge

    parts, settle = [], judge.Steps.settle
    if kept_max_bytes:
        monkeypatch.setattr(judge, "bank_budget_bytes", lambda: kept_max_bytes)
        monkeypatch.setattr(judge.Steps, "settle", lambda self, again=False: parts.append(again) or settle(self, again))
    plan = make_plan(["v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    wrong = tmp_path / "wrong_later.py"
    wrong.write_text(Path(plan.versions[0]).read_text() + "\n\n_calls = [0]\n_right = custom_kernel\n\n\n"
                     "def custom_kernel(data):\n    _calls[0] += 1\n    out = _right(data)\n"
                     "    return out * 0 if _calls[0] == 4 else out  # wrong in one step of the first visit alone\n")
    entries = [clock.Entry("right", "version", str(plan.versions[0])), clock.Entry("wrong", "version", str(wrong))]
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    failed = run.failed.get("wrong", "")
    assert re.search(r"rank \d - case \d: the output the owner copied at 'done' .*mismatch", failed), run.failed
    assert "right" not in run.failed and {name for (name, _), rounds in run.samples.items() if rounds} == {"right"}
    assert bool(kept_max_bytes) == any(parts), parts  # checked in parts only where the outputs pass the memory


def test_an_entry_stops_once_its_targets_are_met_and_says_so(tmp_path):
    plan = make_plan(["v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("loose", "version", str(plan.versions[0]))]
    # targets no three rounds can miss (a factor of e^5.8 between rounds would): the rule, not the machine, is tested.
    settings = clock.Settings(steps=2, warmup=1, min_rounds=3, max_rounds=6, time_cap_s=math.inf,
                              targets=(iv.Target("call", 1e6), iv.Target("owner", 1e6)))
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 3 and run.stopped == {"loose": "the owner's target met at round 3"}
    # a target on the rank's own figures alone stops nothing (red team 32: the rank gave two equal call figures at
    # the round it chose, and its target was met there)
    settings = dataclasses.replace(settings, max_rounds=4, targets=(iv.Target("call", 1e6),))
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 4 and run.stopped == {"loose": "4 rounds"}, run.stopped


def test_one_entrys_slow_import_does_not_cut_the_other_entries_rounds(tmp_path):
    """Red team 24: the time cap counted whole rounds, so an entry that took seconds to import every round held
    every entry to the least rounds. The cap is shared out: the slow entry spends its own share, the other goes on."""
    slow = tmp_path / "slow_import.py"
    slow.write_text("import time\ntime.sleep(4.0)\n" + (Path(clock.__file__).parents[1] / "submissions" / "all2all"
                                                       / "v1_torch_sort.py").read_text())
    plan = make_plan(["v1", str(slow)], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("quick", "version", str(plan.versions[0])),
               clock.Entry("slow", "version", str(plan.versions[1]))]
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=4, time_cap_s=12.0, targets=(), seed=0)
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    rounds = {name: len(run.samples[(name, 0)]) for name in ("quick", "slow")}
    assert not run.failed and rounds["slow"] < rounds["quick"], (rounds, run.stopped)
    assert run.stopped["slow"].startswith("time cap (12 s, 6 s its own)"), run.stopped


def test_an_entrys_rounds_under_the_cap_are_fixed_by_its_first_timed_round():
    """Red teams 31 and 32: an entry's ranks can hold their result after the owner's stop, and a charge recounted
    every round (the sum, then the median) let it stop at the round it chose. Its rounds are fixed once, by its first
    round after the builds': 10 s of share and a 2 s round give the builds' round and five more."""
    assert clock.cap_rounds(10.0, 2.0) == 6 and clock.cap_rounds(10.0, 30.0) == 2
    assert clock.cap_rounds(math.inf, 2.0) == math.inf


def test_an_entry_whose_later_rounds_cost_past_what_its_first_bought_fails(tmp_path, monkeypatch):
    """Red team 38: fast in its first round after the builds, which fixes its rounds under the cap, then a 20 s import
    every round: 8x its share, on to the last round. Each later round is charged: past LATE_FACTOR times what its
    rounds should cost, the entry fails, named. Here the factor is cut to 0.4 so that an honest entry's second round
    after the first (together about 2x its first, against 0.4 x its 3 rounds' worth) passes it, and its first alone
    (1x against 1.2x) does not."""
    monkeypatch.setattr(clock, "LATE_FACTOR", 0.4)
    plan = make_plan(["v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("later", "version", str(plan.versions[0]))]
    settings = clock.Settings(steps=1, warmup=1, min_rounds=3, max_rounds=4, time_cap_s=1e-3, targets=(), seed=0)
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 3 and "its own time after the first round" in run.failed.get("later", ""), (
        run.rounds, run.failed, run.stopped)
    assert "0.4x what its rounds should cost" in run.failed["later"]


def test_a_held_steps_sleep_is_the_owners_and_grows_when_any_rank_was_not_held():
    """judge.next_hold_cycles: the owner keeps one sleep for every rank's held step; one rank not held makes every
    rank's next sleep eight times longer, never past the longest."""
    import judge

    assert judge.next_hold_cycles(judge.HOLD_START_CYCLES, [True, True, True]) == judge.HOLD_START_CYCLES
    assert judge.next_hold_cycles(judge.HOLD_START_CYCLES, [True, False, True]) == 8 * judge.HOLD_START_CYCLES
    assert judge.next_hold_cycles(judge.HOLD_MAX_CYCLES // 2, [False]) == judge.HOLD_MAX_CYCLES


def test_the_owners_copies_come_from_a_gpu_no_rank_uses_else_the_next_ranks():
    """channels.copiers: by default each rank's regions are copied by a GPU no rank uses (round robin), else by the next
    rank's GPU; a copier that cannot reach the rank's GPU, or is the rank's own, leaves the rank's own (None)."""
    import judge

    def every(_copier, _gpu):
        return True

    assert channels.copiers([0, 1], 4, None, every) == [2, 3]
    assert channels.copiers([0], 4, None, every) == [1]
    assert channels.copiers([0, 1, 2, 3], 4, None, every) == [1, 2, 3, 0]
    assert channels.copiers([0, 1], 4, "next", every) == [1, 2]
    assert channels.copiers([0, 1], 4, "own", every) == [None, None]
    assert channels.copiers([0, 1], 4, 1, every) == [1, None]
    assert channels.copiers([0], 1, None, every) == [None]
    assert channels.copiers([0, 1, 2, 3], 4, None, lambda copier, gpu: (copier, gpu) != (3, 2)) == [1, 2, None, 0]


# A hostile entry that leaves work behind after every call: a child burning a core, a daemon of its own session
# (double fork), a thread inside a long system call (madvise(MADV_POPULATE_READ) over untouched memory, which only a
# fatal signal ends: SIGSTOP never held it, red team 14), timers armed on many timerfds to fire later (red team 20's
# storm, charged to whoever runs when they fire), and a flood of empty lines on its stdout (red team 13: relayed
# by the owner's threads during the next entry's visit).
LEFT_BEHIND = r"""
import ctypes as _ctypes
import os as _os
import subprocess as _subprocess
import sys as _sys
import threading as _threading

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = _ctypes.c_void_p
_libc.mmap.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t, _ctypes.c_int, _ctypes.c_int, _ctypes.c_int, _ctypes.c_long]
_libc.madvise.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t, _ctypes.c_int]
_libc.munmap.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t]
_SIZE = 1 << 30
_started = []


class _Spec(_ctypes.Structure):
    _fields_ = [("i_s", _ctypes.c_long), ("i_ns", _ctypes.c_long), ("v_s", _ctypes.c_long), ("v_ns", _ctypes.c_long)]


def _burn_in_the_kernel():
    while True:
        address = _libc.mmap(None, _SIZE, 3, 0x22 | 0x4000, -1, 0)  # private, anonymous, no reserve
        _libc.madvise(address, _SIZE, 15)  # MADV_NOHUGEPAGE
        _libc.madvise(address, _SIZE, 22)  # MADV_POPULATE_READ
        _libc.munmap(address, _SIZE)


def _arm_timers(count=200):
    for k in range(count):  # CLOCK_MONOTONIC, each to fire 20-220 ms from now, then every ms
        fd = _libc.timerfd_create(1, 0)
        if fd >= 0:
            _libc.timerfd_settime(fd, 0, _ctypes.byref(_Spec(0, 1000000, 0, 20000000 + k * 1000000)), None)


def custom_kernel(data):
    if not _started:
        _started.append(_subprocess.Popen([_sys.executable, "-c", "while True: pass"]))
        _subprocess.Popen([_sys.executable, "-c", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                           "    while True: time.sleep(0.01)\n"]).wait()
        _threading.Thread(target=_burn_in_the_kernel, daemon=True).start()
    _arm_timers()
    try:
        import fcntl
        fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ
        _os.set_blocking(1, False)
        for _ in range(16):
            _os.write(1, b"\n" * (1 << 16))
    except OSError:  # the pipe is full
        pass
    return _v1_kernel(data)
"""


def _seed_starting_first(entry: int, entries: int) -> int:
    """A clock seed whose first round takes entry `entry` first (clock.Clock._round's first shuffle)."""
    for seed in range(1000):
        starts = list(range(entries))
        random.Random(random.Random(seed).randrange(2 ** 32)).shuffle(starts)
        if starts[0] == entry:
            return seed
    raise AssertionError("no seed found")


class _Written:
    """A stream that counts what each thread wrote to it, and keeps nothing."""

    def __init__(self):
        self.by_thread: dict = {}

    def write(self, text: str) -> int:
        ident = threading.get_ident()
        self.by_thread[ident] = self.by_thread.get(ident, 0) + len(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="pools run in their own PID namespace only when started as root")
def test_no_process_or_relay_of_another_entry_exists_while_an_entry_is_timed(tmp_path, monkeypatch):
    """An entry that leaves work behind after every call (LEFT_BEHIND: children, a daemon, a thread in a long system
    call, armed timers, a flood of lines), timed right before v1: in every one of v1's visits no process of the
    hostile entry's pool exists (none with its uid, none of its pids), its memory group is gone and no thread of the
    owner relays its text. Both entries are timed."""
    import boundary
    from tests.conftest import v1_kernel_source

    hostile = tmp_path / "left_behind.py"
    hostile.write_text(v1_kernel_source() + LEFT_BEHIND)
    plan = make_plan(["v1", str(hostile)], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("v1", "version", str(plan.versions[0])),
               clock.Entry("left", "version", str(plan.versions[1]))]
    written = _Written()
    monkeypatch.setattr(sys, "stdout", written)  # where the pools' relays write the ranks' stdout
    pools: dict = {}  # entry -> (its uid, its relays, the pids seen in it)
    seen: list = []  # per v1 visit: the hostile pool's processes, groups and relays still there
    visit, start = clock.Clock._visit, clock.Clock._born

    def in_pool(uid: int) -> set:
        found = set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            except (OSError, ValueError):
                continue
            if int(status["Uid"].split()[0]) == uid:
                found.add(int(pid))
        return found

    def started(self, entry, env):
        live = start(self, entry, env)
        pools[entry.name] = (live.pool.guards.uid, [t for pair in live.pool.texts.values() for t in pair], set())
        return live

    def watched(self, live, index, round_index, bank):
        if live.entry.name == "left":
            pools["left"][2].update(in_pool(pools["left"][0]))
        elif "left" in pools:
            uid, texts, pids = pools["left"]
            alive = {pid for pid in pids if not boundary.has_ended(pid)}
            group = boundary.memory_group(uid)
            seen.append((in_pool(uid) | alive, group is not None and group.exists(),
                         [t for t in texts if t._thread.is_alive()]))
        visit(self, live, index, round_index, bank)
        if live.entry.name == "left":
            pools["left"][2].update(in_pool(pools["left"][0]))

    monkeypatch.setattr(clock.Clock, "_visit", watched)
    monkeypatch.setattr(clock.Clock, "_born", started)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=(),
                              seed=_seed_starting_first(1, 2))
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 1 and not run.failed, run.failed
    assert run.starts == [["left", "v1"]] and {name for name, _ in run.samples} == {"v1", "left"}, run.starts
    assert len(pools["left"][2]) >= 2 * 3, pools["left"][2]  # the ranks, their hogs and their daemons
    assert sum(written.by_thread.values()) > 1 << 18  # it flooded
    assert len(seen) == 2 and all(seen_now == (set(), False, []) for seen_now in seen), seen


def test_an_entry_whose_pool_does_not_end_fails_and_says_so(tmp_path, monkeypatch):
    """A pool whose end leaves something of it behind (RankPool.shutdown says so) fails its entry, named, before the
    next entry's pool is born; the other entry keeps its figure."""
    from eval import RankPool

    plan = make_plan(["v1", "v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("A", "version", str(plan.versions[0])), clock.Entry("B", "version", str(plan.versions[1]))]
    shutdown, start = RankPool.shutdown, clock.Clock._born
    lingering: list = []

    def started(self, entry, env):
        live = start(self, entry, env)
        if entry.name == "A":
            lingering.append(live.pool)
        return live

    def shut(self, clean_files=True):
        return shutdown(self, clean_files) and self not in lingering

    monkeypatch.setattr(RankPool, "shutdown", shut)
    monkeypatch.setattr(clock.Clock, "_born", started)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert "something of its pool outlived its end" in run.failed.get("A", ""), run.failed
    assert "B" not in run.failed and {name for (name, _), rounds in run.samples.items() if rounds} == {"B"}, run.samples


def test_an_error_of_the_owner_on_one_entrys_step_fails_that_entry_alone(tmp_path, monkeypatch):
    """An exception the owner meets stepping one entry (red team 26: an IndexError from a phase byte its rank
    rewrote; a UnicodeDecodeError from a process name) fails that entry, named, its pool killed; the run goes on and
    the other entry keeps its figure."""
    from eval import CaseSteps

    plan = make_plan(["v1", "v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("A", "version", str(plan.versions[0])), clock.Entry("B", "version", str(plan.versions[1]))]
    step = CaseSteps.step

    def raising(self, *args, **kwargs):
        if "A (clock round)" in self.case.test.spec:
            raise IndexError("tuple index out of range")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(CaseSteps, "step", raising)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert "the owner's step of it raised IndexError" in run.failed.get("A", ""), run.failed
    assert "B" not in run.failed and {name for (name, _), rounds in run.samples.items() if rounds} == {"B"}, run.samples


@pytest.mark.skipif(os.geteuid() != 0, reason="pools run in their own PID namespace only when started as root")
def test_the_next_entrys_pool_is_born_before_a_visit_and_runs_none_of_its_code(tmp_path, monkeypatch):
    """The next entry's pool is born while an entry readies, so that a round pays one pool start: in every visit of
    the first entry the second's pool is there, its workers born, and its submission (which marks its import) not
    yet imported; after the round, it was."""
    from tests.conftest import v1_kernel_source

    mark = tmp_path / "marks" / "imported"
    marking = tmp_path / "marking.py"
    marking.write_text(v1_kernel_source("custom_kernel") + f"\nopen({str(mark)!r}, 'a').write('imported\\n')\n")
    plan = make_plan(["v1", str(marking)], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("v1", "version", str(plan.versions[0])),
               clock.Entry("marking", "version", str(plan.versions[1]))]
    lives: dict = {}
    seen: list = []
    visit, born = clock.Clock._visit, clock.Clock._born

    def bear(self, entry, env):
        lives[entry.name] = born(self, entry, env)
        return lives[entry.name]

    def watched(self, live, index, round_index, bank):
        if live.entry.name == "v1":
            pool = lives["marking"].pool
            seen.append((mark.exists(), len(pool.zygote.unborn), len(pool.zygote.children)))
        visit(self, live, index, round_index, bank)

    monkeypatch.setattr(clock.Clock, "_visit", watched)
    monkeypatch.setattr(clock.Clock, "_born", bear)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=(),
                              seed=_seed_starting_first(0, 2))
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 1 and not run.failed and run.starts == [["v1", "marking"]], (run.failed, run.starts)
    assert seen == [(False, 0, 2)] * 2, seen
    assert mark.read_text() == "imported\n" * 2  # its two ranks, in its own turn


def test_a_pools_ranks_are_pinned_where_asked_before_their_import(tmp_path, monkeypatch):
    """A2A_PIN_CPUS (the experiment on where a pool's host speed comes from): rank i of the pool runs on the i-th
    CPU named, from before the submission's import on."""
    from tests.conftest import v1_kernel_source

    cpus = sorted(os.sched_getaffinity(0))
    mark = tmp_path / "marks" / "affinity"
    marking = tmp_path / "marking.py"
    marking.write_text(v1_kernel_source("custom_kernel") + "\nimport os\n"
                       f"open({str(mark)!r}, 'a').write(str(sorted(os.sched_getaffinity(0))) + '\\n')\n")
    monkeypatch.setenv("A2A_PIN_CPUS", f"{cpus[-1]},{cpus[0]}")
    plan = make_plan([str(marking)], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, [clock.Entry("marking", "version", str(plan.versions[0]))], settings,
                             progress=lambda _: None)
    assert not run.failed, run.failed
    assert sorted(mark.read_text().split("\n")[:-1]) == sorted([f"[{cpus[-1]}]", f"[{cpus[0]}]"]), mark.read_text()


def test_the_owner_visits_on_the_cpu_named_and_starts_pools_where_it_may_run(tmp_path, monkeypatch):
    """A2A_PIN_OWNER_CPU: the owner's thread runs every visit's steps on that CPU, and is back on every CPU it may
    use before and after (the pools it starts between visits are not born on one CPU)."""
    import judge

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: pinned and unpinned are the same")
    monkeypatch.setenv("A2A_PIN_OWNER_CPU", str(cpus[-1]))
    plan = make_plan(["v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    seen = []
    step = judge.Steps.step

    def watched(self, *args, **kwargs):
        seen.append(sorted(os.sched_getaffinity(0)))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(judge.Steps, "step", watched)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=2, max_rounds=2, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, [clock.Entry("v1", "version", str(plan.versions[0]))], settings,
                             progress=lambda _: None)
    assert not run.failed, run.failed
    assert sorted(os.sched_getaffinity(0)) == cpus
    visiting = [s for s in seen if s == [cpus[-1]]]
    assert len(visiting) >= 2 * 2 * 2 and all(s in ([cpus[-1]], cpus) for s in seen), seen
    assert cpus in seen  # the ready steps, outside the visits


def test_the_owners_garbage_collector_is_off_in_every_visit_and_on_after(tmp_path, monkeypatch):
    """A collection inside a timed step would be the owner's own pause in the ranking figure: the owner collects
    before each visit and leaves the collector off through its steps (the ready steps before keep it on)."""
    import gc

    plan = make_plan(["v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("v1", "version", str(plan.versions[0]))]
    enabled: list = []
    step = clock.Clock._step

    def watched(self, live, kind, index, inputs):
        enabled.append(gc.isenabled())
        return step(self, live, kind, index, inputs)

    monkeypatch.setattr(clock.Clock, "_step", watched)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 1 and not run.failed, run.failed
    shapes = len(plan.case_args)  # one ready step each, then per visit 1 warm-up and 2 + 2 timed steps
    assert enabled == [True] * shapes + [False] * (shapes * 5), enabled
    assert gc.isenabled()


@pytest.mark.skipif(os.geteuid() != 0, reason="pools run in their own PID namespace only when started as root")
def test_every_pools_zygote_is_forked_from_the_runs_nursery_which_ends_with_the_run(tmp_path, monkeypatch):
    """A pool's zygote is forked from the run's nursery (torch imported once a run, not once a pool), born in its
    pool's PID namespace, never in another's; the nursery ends with the run."""
    import boundary

    plan = make_plan(["v1", "v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("A", "version", str(plan.versions[0])), clock.Entry("B", "version", str(plan.versions[1]))]
    seen: list = []
    nurseries: list = []
    visit = clock.Clock._visit

    def watched(self, live, index, round_index, bank):
        zygote, init = live.pool.zygote.process.pid, live.pool.sandbox.init_pid
        nurseries.append(self.nursery.process)
        seen.append((int(boundary.process_stat(zygote)[1]) == self.nursery.process.pid,
                     os.readlink(f"/proc/{zygote}/ns/pid") == os.readlink(f"/proc/{init}/ns/pid")))
        visit(self, live, index, round_index, bank)

    monkeypatch.setattr(clock.Clock, "_visit", watched)
    settings = clock.Settings(steps=2, warmup=1, min_rounds=2, max_rounds=2, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert run.rounds == 2 and not run.failed, run.failed
    assert seen == [(True, True)] * 8, seen  # 2 rounds x 2 entries x 2 shapes
    assert len({id(n) for n in nurseries}) == 1 and not nurseries[0].is_alive()


@pytest.mark.parametrize("backend, world_size, shared, entry, builds", [
    ("nccl", 1, False, "handshake", True),  # the handshake row loads the probes
    ("nccl", 2, False, "empty_submission", True),  # every pool's held calls start on the probes' flag round
    ("nccl", 8, True, "empty_submission", False),  # ranks sharing GPUs load no probe
    ("gloo", 2, False, "handshake", False),  # no GPU: nothing to build
])
def test_the_judge_builds_the_harnesss_probes_once_before_any_pool(monkeypatch, backend, world_size, shared, entry,
                                                                   builds):
    """The probes (a2a/probes.py) are the harness's code, kept by no pool's build key: the judge builds them into the
    cache every pool starts from before the first round, where some pool will load them, and nowhere else."""
    import types

    from a2a import plan as planning

    built = []
    monkeypatch.setattr(planning, "prebuild", lambda paths: built.append(list(paths)) or [])
    monkeypatch.setattr(clock, "Clock", lambda *args: types.SimpleNamespace(run=lambda: "ran"))
    plan = types.SimpleNamespace(backend=backend, world_size=world_size, meta={"shared_gpus": shared, "placement": ""},
                                 case_args=[{}])
    assert clock.time_entries(plan, [clock.Entry(entry, "empty", "")], clock.Settings(), progress=lambda _: None) == "ran"
    assert built == ([[]] if builds else [])


def test_a_message_cut_short_fails_its_entry_alone_at_the_rounds_limit(tmp_path, monkeypatch):
    """Red team 27: a length promising 1000 bytes and 2 of them on the worker's connection held the clock's owner in
    a read past every limit, and the run never ended. Now the entry fails at its limit and the other keeps its
    figure."""
    from tests.conftest import v1_kernel_source

    cut = tmp_path / "cut.py"
    cut.write_text(v1_kernel_source("_v1") + "\nimport os, struct, sys, time\n\n\ndef custom_kernel(data):\n"
                   "    if data[2] == 0:\n        pipe = sys.modules['eval']._owner_conn  # the worker's, to the owner\n"
                   "        os.write(pipe.fileno(), struct.pack('!i', 1000) + b'w1')\n        time.sleep(3600)\n"
                   "    return _v1(data)\n")
    monkeypatch.setattr(clock, "SETUP_TIMEOUT_S", 10.0)
    plan = make_plan([str(cut), "v1"], _cases_file(tmp_path), 2, "gloo", gpu_only="keep")
    entries = [clock.Entry("cut", "version", str(plan.versions[0])), clock.Entry("v1", "version", str(plan.versions[1]))]
    settings = clock.Settings(steps=2, warmup=1, min_rounds=1, max_rounds=1, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, entries, settings, progress=lambda _: None)
    assert "watchdog" in run.failed.get("cut", "") and "v1" not in run.failed, run.failed
    assert {name for (name, _), rounds in run.samples.items() if rounds} == {"v1"}, run.samples


def test_one_entrys_flood_leaves_the_next_entrys_lines_shown(monkeypatch):
    """Red team 43: one entry's eight ranks filled a round's shared cap of held text, and the next entry's lines in
    that round were only counted. Each writer (a rank stream's thread) has its own cap: the flood is cut where it
    passes its own, with a note there, and a later writer's line is shown whole."""
    import io

    monkeypatch.setattr(clock, "HELD_WRITER_BYTES", 1000)
    monkeypatch.setattr(clock, "HELD_TEXT_BYTES", 8000)
    shown = io.StringIO()
    gate = clock._RoundGate(shown)

    def writes(lines):
        for line in lines:
            gate.write(line)

    floods = [threading.Thread(target=writes, args=([f"flood {i} " + "x" * 90 + "\n"] * 100,), name=f"flood {i}")
              for i in range(8)]
    for thread in floods:
        thread.start()
        thread.join()
    later = threading.Thread(target=writes, args=(["MARKER of the next entry\n"],), name="marker")
    later.start()
    later.join()
    gate.write("the run's own line\n")
    assert shown.getvalue() == ""  # nothing before the round's end
    gate.release()
    text = shown.getvalue()
    assert "MARKER of the next entry\n" in text and "the run's own line\n" in text, text[-500:]
    assert all(f"characters of flood {i} not shown" in text for i in range(8)), text[-2000:]
    assert len(text) < 8 * 1000 + 2000

