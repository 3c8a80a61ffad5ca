"""The judge's clock: every entry timed in rounds of fresh processes, one entry's pool alive at a time, with intervals
and a stopping rule.

A round takes every entry still running in an order shuffled with the round's seed (recorded). Each in turn gets
fresh rank processes of its own (a pool, born in the sandbox, as on the runner's fresh machine), imports the
submission, has its first call on every shape checked, is visited once on every shape (in a shuffled order) and is
ended, its namespace gone, before the next entry's ranks import anything (the next pool is born meanwhile, its zygote
forked from the run's nursery: the harness's code only): no process that ran another entry's code, nor anything the
kernel does on its behalf, exists while an entry is timed, and nothing one entry or one round leaves reaches
another. Every step
is the owner's (judge.Steps): the owner places a fresh input, raises the ranks' `go`, waits for every `done`, copies
the outputs out and stops its clock; the ranks never see an input before its step starts, an expected output, a check
or the clock that ranks. A visit is `warmup` untimed steps, then `steps` steps of each kind, taking turns:
- idle-stream steps: the owner's step time (the ranking figure) and, as the rank's own word, the call time (its
  events around the call on an idle stream);
- held steps: the rank's held-stream device time (its stream held by a sleep kernel until the call has queued its
  work, nvbench's blocking kernel); a call that synchronizes inside falls back to the call time, named.
Per step the slowest rank's figures count (nccl-tests' rule); a round's value is the mean of the visit's steps. A
rank's figure larger than the owner's window is dropped (it cannot be true). The owner checks every output of a
version against its closed form, and reads the GPU's SM clock and throttle reasons after each visit (NVML); a visit
that ran below 75% of the maximum SM clock is flagged and left out (nvbench's rule).

After `min_rounds`, an entry whose intervals (a2a/intervals.py) meet every target leaves the rounds; the others go on
until they do or the time cap comes, so the time goes where the intervals are widest. Each entry says what
stopped it.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import glob
import math
import random
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import eval as core
import channels
import judge
from births import on_cpu
from boundary import Sandbox, protect_builds
from a2a import intervals as iv
from a2a import sharing

METRICS = {"owner": "mean_us", "call": "device_mean_us", "held": "held_mean_us"}  # metric -> its row column
# metric -> its row columns: the figure and its 95% interval
COLUMNS = {"owner": ("mean_us", "low_us", "high_us"), "call": ("device_mean_us", "device_low_us", "device_high_us"),
           "held": ("held_mean_us", "held_low_us", "held_high_us")}
METRIC_NAMES = {"owner": "the owner's step (ranks)", "call": "call time (the rank's events, idle stream)",
                "held": "device time (the rank's events, stream held)"}
SAVED_RUN_BYTES = 64 << 20  # a saved run's results.json as read back (every visit's samples and steps: a few MB)
# A figure of a saved run as read back, in µs or a ratio: from a nanosecond (a rank's own figures are no less:
# judge.py) to past any visit (VISIT_TIMEOUT_S is 1.2e8 µs). Red team 39: steps and figures of the largest double
# overflowed a geomean over 80 shapes (--compare, 114) and a visit's mean (visit-statistics, a traceback).
SAVED_FIGURE_RANGE = (1e-3, 1e9)
RANKING = "owner"  # the figure that ranks: the owner's clock, out of every rank's reach
FLOOR_RATIO = "floor_ratio"  # the owner's step over its round's empty submission (floor_ratio): shown, not ranked
# What a round-limited run reached on one H100 at world size 1 (2026-11-25, WORKLOG "The judge's clock"): the held
# device time ±0.5-1% after 5 rounds, the call time ±4-9% after 10.
DEFAULT_TARGETS = (iv.Target("held", 0.02), iv.Target("call", 0.05), iv.Target("owner", 0.03))
SETUP_TIMEOUT_S = 300.0  # a round's start: imports, the first round's extension builds, checks, warm-up
VISIT_TIMEOUT_S = 120.0
THROTTLE_FRACTION = 0.75  # nvbench: a sample taken below 75% of the clock is throttled


def saved_figure(value) -> bool:
    """Whether a figure read back from a saved run is a number in SAVED_FIGURE_RANGE."""
    low, high = SAVED_FIGURE_RANGE
    return type(value) in (int, float) and low <= value <= high  # NaN fails too


def _wrong_output(rank: int, why: str, case: int) -> str:
    return f"rank {rank} - case {case}: the output the owner copied at 'done' {why}"


@dataclasses.dataclass(frozen=True)
class Entry:
    """What a row times: a version file (`kind` "version"), or the harness's own rows (`kind` "empty",
    "handshake", "anchor", with `call` the a2a.anchors entry)."""
    name: str
    kind: str
    path: Optional[str] = None
    call: Optional[str] = None


# Steps per visit and kind at most: every step's inputs are made before its round (red team 40: --steps 1e23 filled
# the machine's memory). 100x the default.
STEPS_MAX = 1000


@dataclasses.dataclass
class Settings:
    steps: int = 10  # timed steps per visit and kind (idle, held)
    warmup: int = 2  # untimed calls at the start of each visit
    min_rounds: int = 5
    max_rounds: int = 60
    time_cap_s: float = 240.0  # shared out evenly over the entries, counted from the end of the first round
    targets: tuple = DEFAULT_TARGETS
    seed: Optional[int] = None  # the run's seed for the rounds' orders (drawn and recorded when None)
    order: tuple = ()  # the entries' order in a round before its shuffle (stability runs reverse it)


# --------------------------------------------------------------------------------------------------------------
# Rank side
# --------------------------------------------------------------------------------------------------------------


def session_rank(rank: int, world_size: int, cases: list, regions: dict, entry: Entry) -> dict:
    """One entry's rank for one round: the submission (imported here, as the runner imports it inside the worker) or
    the harness row's call for each case, then the owner's steps until it stops them. With peers on GPUs a handshake
    (a2a/probes.py) starts every rank's held call together (eval.Hold.align; not where ranks share GPUs), one per
    process for every entry; it is closed (a collective) only after steps that ended well: a failed rank's peers are stopped by the owner."""
    from a2a import probes

    handshake = probes.peer_handshake(rank, world_size)
    align = handshake.launch if handshake is not None else None
    if entry.kind == "version":
        kernel = core.import_submission()
        steps = core.run_steps(rank, world_size, cases, regions, lambda _case: kernel, align=align)
    else:
        from a2a import anchors

        generate_input = core.bound().reference[0]
        # the harness's rows size their call from one input of each case, any one: the ranks are handed no seed
        calls = anchors.CaseCalls(entry.call, [generate_input(**args, seed=0, rank=rank) for args in cases], rank,
                                  handshake)
        try:
            steps = core.run_steps(rank, world_size, cases, regions, calls.for_case, harness_row=True, align=align)
        finally:
            calls.close()
    if handshake is not None:
        handshake.close()
    return {"steps": steps}


# --------------------------------------------------------------------------------------------------------------
# Owner side
# --------------------------------------------------------------------------------------------------------------


_nvml: list = []


def gpu_clocks(indices: list) -> Optional[dict]:
    """The SM clock (MHz) of each GPU in `indices`, their maximum, the throttle reasons and the application clocks
    (NVML); None where NVML cannot be read."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        if not _nvml:
            pynvml.nvmlInit()
            _nvml.append(True)
        out = {"sm_mhz": [], "max_mhz": [], "reasons": 0, "app_mhz": [], "default_app_mhz": []}
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            out["sm_mhz"].append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
            out["max_mhz"].append(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
            out["reasons"] |= pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
            out["app_mhz"].append(pynvml.nvmlDeviceGetApplicationsClock(handle, pynvml.NVML_CLOCK_SM))
            out["default_app_mhz"].append(pynvml.nvmlDeviceGetDefaultApplicationsClock(handle, pynvml.NVML_CLOCK_SM))
        return out
    except pynvml.NVMLError:
        return None


def clocks_locked(samples: list) -> str:
    """What the run's header says of the GPU clocks: whether an application clock other than the default was set
    (nvidia-smi -ac or -lgc show there), and the SM clocks read after the visits."""
    read = [s for s in samples if s]
    if not read:
        return "GPU clocks: not read (no NVML)"
    seen = [mhz for s in read for mhz in s["sm_mhz"]]
    locked = any(a != d for s in read for a, d in zip(s["app_mhz"], s["default_app_mhz"]))
    return (f"GPU clocks {'locked (application clock set)' if locked else 'not locked'} (left as found); SM clock "
            f"after visits {min(seen)}-{max(seen)} MHz of {max(m for s in read for m in s['max_mhz'])} MHz")


@dataclasses.dataclass
class _Live:
    """One entry's pool in one round, and the owner's steps on it."""
    entry: Entry
    pool: Optional[core.RankPool]
    steps: Optional[core.CaseSteps]
    failure: str = ""
    broken: bool = False  # the owner's step of it raised: its steps are left as they are, its pool killed


@dataclasses.dataclass
class Run:
    """What a clock run measured: per (entry, case index) and round, the visit's step means; what stopped each
    entry; the run's seeds; the clock samples."""
    entries: list
    cases: list
    samples: dict  # (entry, case index) -> {round: {"owner": µs, "owner_steps_us": [µs], "call": µs, "held": µs}}
    stopped: dict  # entry name -> why it left the rounds
    failed: dict  # entry name -> why it failed
    sync_inside: set  # entries timed on an idle stream in place of a held one
    round_seeds: list
    seed: int
    clocks: list
    throttled: int
    guards: str
    wall_s: float
    rounds: int
    phases: list  # per round, the seconds of its phases (pools started, ready, visits, ended), and each entry's ready
    visits: list  # per round, the (entry name, case index) visited, in order
    starts: list  # per round, the entries' names in the order their pools started
    processes: list  # per round, {entry name: the pids of its rank processes}

    def entry_intervals(self, name: str) -> dict:
        """entry_intervals, and FLOOR_RATIO (floor_ratio) where the run has an empty submission and `name` is not it:
        what a run shows and saves, not what stops an entry."""
        found = entry_intervals(self.samples, name, len(self.cases))
        floor = next((entry.name for entry in self.entries if entry.kind == "empty"), None)
        if floor not in (None, name) and (ratio := floor_ratio(self.samples, name, floor, len(self.cases))):
            found[FLOOR_RATIO] = ratio
        return found

    def sample_rows(self) -> list:
        """Every visit's sample as a row (entry, case, round and its metrics): what results.json keeps, so that a
        run's spread can be taken apart later (by round, pool and visit)."""
        return [{"entry": name, "case": index, "round": r, **values}
                for (name, index), per_round in self.samples.items() for r, values in per_round.items()]

    def case_intervals(self, name: str, index: int) -> dict:
        per_round = self.samples.get((name, index), {})
        return {metric: iv.interval([v[metric] for v in per_round.values() if metric in v]) for metric in METRICS
                if any(metric in v for v in per_round.values())}


def spread(run: Run) -> dict:
    """{metric: intervals.spread_parts of the entries' per-round geomeans over the shapes}: how much of a round's
    spread the round's machine shares across entries and how much is each entry's own pool (a pool is born anew each
    round); and "visit", each visit's own part (intervals.visit_spread), for the owner's step with the part of it
    its own steps explain ("steps", intervals.steps_spread). Failed entries are left out."""
    out = {}
    for metric in METRICS:
        per_entry, cases = {}, {}
        for entry in run.entries:
            per_case = _per_case(run.samples, entry.name, metric, len(run.cases))
            if (values := iv.geomean_by_round(per_case)) and entry.name not in run.failed:
                per_entry[entry.name], cases[entry.name] = values, per_case
        if parts := iv.spread_parts(per_entry):
            out[metric] = {**parts, "visit": iv.visit_spread(cases)}
            if metric == "owner" and (steps := iv.steps_spread(
                    [v.get("owner_steps_us", ()) for (name, _), per_round in run.samples.items()
                     if name in per_entry for v in per_round.values()])) is not None:
                out[metric]["steps"] = steps
    return out


def _per_case(samples: dict, name: str, metric: str, n_cases: int) -> dict:
    """{case index: {round: the entry's `metric` that round}} from a run's samples."""
    return {i: {r: v[metric] for r, v in samples.get((name, i), {}).items() if metric in v} for i in range(n_cases)}


def entry_intervals(samples: dict, name: str, n_cases: int) -> dict:
    """{metric: Interval} of an entry's geometric mean over the cases, from its rounds."""
    out = {}
    for metric in METRICS:
        values = iv.geomean_rounds(_per_case(samples, name, metric, n_cases))
        if values:
            out[metric] = iv.interval(values)
    return out


def floor_ratio(samples: dict, name: str, floor: str, n_cases: int) -> Optional[iv.Interval]:
    """The entry's owner's step over the `floor` entry's (the empty submission) in the same round, each the geomean
    over the shapes, as an interval over the rounds both have; None without such a round. A drift that a round's
    entries share moves both alike (twenty-eighth session, one H200, world size 1: a back-to-back pair within ±3.0% so
    where its owner's steps in µs were within ±6.8%)."""
    mine, base = (iv.geomean_by_round(_per_case(samples, entry, "owner", n_cases)) for entry in (name, floor))
    return ratio_by_round(mine, base)


def ratio_by_round(mine: dict, base: dict) -> Optional[iv.Interval]:
    """{round: figure} over {round: the floor's figure}, as an interval over the rounds both have; None without one."""
    ratios = [mine[r] / base[r] for r in mine if r in base]
    return iv.interval(ratios) if ratios else None


HELD_TEXT_BYTES = 64 << 20  # what the ranks of one round may have held for its end, together
HELD_WRITER_BYTES = 1 << 20  # and each rank's stream alone (wire.RANK_TEXT_BUDGET's size); the rest is counted


class _RoundGate:
    """A stream (the run's stdout or stderr) that holds what is written until the round ends (release). NOTES: a
    rank's words were shown the moment it wrote them, in a file the operator's output went to, which the round's
    next entry could read before its calls: the round's inputs, written by the entry before it (red team 41 did it
    with a build log). Only the run's own thread's lines pass the caps, and each writer (the thread of one rank's
    stream) has its own: one entry's eight ranks filled a shared cap and the next entry's lines went unseen (red team
    43). Where a writer's text is first cut off, a note says how much of it was not shown."""

    def __init__(self, stream):
        self.stream, self.held, self.held_bytes, self.lock = stream, [], 0, threading.Lock()
        self.taken: dict = {}  # writer -> characters held
        self.cut: dict = {}  # writer -> [its name, characters not shown], its place in `held`

    def write(self, text: str) -> int:
        with self.lock:
            writer = threading.current_thread()
            if writer is threading.main_thread():
                self.held.append(text)
                self.held_bytes += len(text)
            elif writer in self.cut or self.taken.get(writer, 0) + len(text) > HELD_WRITER_BYTES \
                    or self.held_bytes + len(text) > HELD_TEXT_BYTES:
                if writer not in self.cut:
                    self.cut[writer] = [writer.name, 0]
                    self.held.append(self.cut[writer])
                self.cut[writer][1] += len(text)
            else:
                self.taken[writer] = self.taken.get(writer, 0) + len(text)
                self.held.append(text)
                self.held_bytes += len(text)
        return len(text)

    def flush(self) -> None:
        pass

    def release(self) -> None:
        with self.lock:
            text = "".join(part if isinstance(part, str) else
                           f"({part[1]} characters of {part[0]} not shown from here to the round's end: past "
                           f"{HELD_WRITER_BYTES} a writer, {HELD_TEXT_BYTES} a round)\n" for part in self.held)
            self.held, self.held_bytes, self.taken, self.cut = [], 0, {}, {}
        self.stream.write(text)
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def held_to_round_ends():
    """The run's stdout and stderr held for each round's end (yields the release); what is held is shown on the
    way out, however the run ends. (A command started without one has /dev/null there: boundary.claim_run.)"""
    streams = (sys.stdout, sys.stderr)
    gates = [_RoundGate(stream) for stream in streams]
    sys.stdout, sys.stderr = gates

    def release() -> None:
        for gate in gates:
            gate.release()

    try:
        yield release
    finally:
        sys.stdout, sys.stderr = streams
        release()


LATE_FACTOR = 3  # how far past its rounds' expected cost an entry's own time may go before it fails


def cap_rounds(share_s: float, first_s: float) -> float:
    """The rounds an entry runs under its share of the time cap: the builds' round, then as many more as its first
    round after it fits (NOTES in Clock.run), one at least; no cap, no end."""
    return math.inf if share_s == math.inf else 1 + max(1, int(share_s // max(first_s, 1e-9)))


def _owner_pinned():
    """The owner's thread on the CPU A2A_PIN_OWNER_CPU names (births.on_cpu), only while it visits, so that the pools
    it starts between visits are born where they may run."""
    cpu = core.owner_cpu()
    return contextlib.nullcontext() if cpu is None else on_cpu(cpu)


@contextlib.contextmanager
def _collected():
    """The owner's garbage collected, then off for the block: a collection inside a timed step is the owner's pause
    in the ranking figure (timeit and pyperf time with it off too). NOTES: a round now births, readies and ends pools
    between visits, and the owner's figure spread about 1.5x as much from round to round as when all pools were made
    before any visit (eighteenth session)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _pids(live: _Live) -> list:
    return [w[0].pid for w in live.pool.workers if w is not None]


class Clock:
    def __init__(self, plan, entries: list, settings: Settings, bundles: dict, progress=print):
        self.plan, self.entries, self.settings, self.bundles, self.progress = plan, entries, settings, bundles, progress
        self.seed = settings.seed if settings.seed is not None else secrets.randbits(32)
        # NOTES: the inputs' seeds come from a key drawn here and never recorded: a round's inputs cannot be known
        # ahead from the run's recorded seed (which orders the visits), nor repeated by a rank from one round to the
        # next.
        self.seeds = judge.Seeds(keyed=True)
        self.samples: dict = {}
        self.stopped: dict = {}
        self.failed: dict = {}
        self.sync_inside: set = set()
        self.clocks: list = []
        self.throttled = 0
        self.guards = ""
        self.uid: Optional[int] = None
        self.round_seeds: list = []
        self.phases: list = []
        self.visits: list = []
        self.starts: list = []
        self.processes: list = []
        self.nursery = None
        self.devices = sorted({plan.placement.device_index(r) for r in range(plan.world_size)}) \
            if plan.backend == "nccl" else []
        self.kept_max_bytes = judge.bank_budget_bytes()  # of a visit's outputs kept for their check (Steps.defer)

    def _bank(self, round_index: int, sets: range) -> list:
        """Per case, the round's input sets `sets` (one input per rank each). An entry takes a case's sets in order,
        one per step: set 0 in its ready step, the next in each of its visit's warm-up, idle-stream and held steps, so
        no input repeats within an entry's process (a cache of answers by input never hits); each entry's pool is
        fresh, so all share the bank; the next round draws new ones."""
        return [[[judge.make_input(args, self.seeds.step_seed(round_index, i, k), rank)
                  for rank in range(self.plan.world_size)] for k in sets] for i, args in enumerate(self.plan.case_args)]

    # One entry's pool: born, ready, visited, ended.
    def _born(self, entry: Entry, env: dict) -> _Live:
        """An entry's pool, its workers being born: the harness's code only (nothing of the entry runs before
        _begin)."""
        pool = None
        try:
            bundle = self.bundles.get(entry.name)
            pool = core.RankPool(self.plan.world_size, self.plan.backend, rank_prefix=True, env=env, bundle=bundle,
                                 rerun_main=False, nursery=self.nursery,
                                 build_key=Sandbox.source_key(Path(bundle or ".") / "submission.py", entry.name),
                                 hide=self._others(entry))
            self.guards = f"{pool.guards.describe()}; {core.transport_text(pool, self.plan.world_size)}"
            self.uid = pool.guards.uid
            return _Live(entry, pool, None)
        except Exception as exc:  # a pool that cannot start fails its entry, not the run
            if pool is not None:
                pool.kill()
            return _Live(entry, None, None, f"{type(exc).__name__}: {exc}")

    def _others(self, entry: Entry) -> tuple:
        """The other entries' files, which this entry's ranks read as empty: their sources and staged copies (red
        team 35: a rank read a rival's source by its path, the file system being read-only but not hidden), and the
        compiled copies beside them (red team 38: a rival's __pycache__ .pyc gave its docstring and constants)."""
        others = [other for other in self.entries if other.kind == "version" and other.name != entry.name]
        sources = [Path(other.path) for other in others] + [Path(self.bundles[other.name]) / "submission.py"
                                                              for other in others if other.name in self.bundles]
        compiled = [found for source in sources
                    for found in (source.parent / "__pycache__").glob(f"{glob.escape(source.stem)}.*.pyc")]
        return tuple(map(str, sources + compiled))

    def _begin(self, live: _Live) -> None:
        """The entry's session started in its pool: its ranks import the submission from here on."""
        if live.failure:
            return
        try:
            if cpus := core.pinned_cpus():  # before the ranks start any thread of their own (the import, CUDA)
                live.pool.pin(cpus)
            test = core.TestCase(args={"world_size": self.plan.world_size}, spec=f"{live.entry.name} (clock round)")
            live.steps = core.CaseSteps(live.pool, test, list(self.plan.case_args), SETUP_TIMEOUT_S, fn=session_rank,
                                        fn_args=(live.entry,))
        except Exception as exc:
            live.failure = f"{type(exc).__name__}: {exc}"

    def _step(self, live: _Live, kind: int, index: int, inputs: list):
        """One step of `live` on case `index`; None when the entry failed (live.failure says why)."""
        version = live.entry.kind == "version"
        try:
            result = live.steps.step(kind, index, inputs, check_outputs=version)
        except (judge.RankEnded, judge.Missed):
            results = live.steps.finish()
            live.failure = (core.rank_failures(results, live.entry.name)
                            or "the ranks left the steps before the owner stopped them")
            return None
        except Exception as exc:  # noqa: BLE001 - said in its failure
            # NOTES: what a rank can reach of the owner's step (its phase slot, its channel's words) could raise
            # there; that voids this entry, not the run and every other entry's figures (red team 26).
            live.failure = f"the owner's step of it raised {type(exc).__name__}: {str(exc)[:300]}"
            live.broken = True
            return None
        problem = result.wrong()
        if not problem and live.steps.steps.full():  # a long visit, checked in parts
            settled = live.steps.steps.settle(again=True)
            problem = settled[1:] if settled else None
        if problem:
            live.failure = _wrong_output(*problem, index)
            return None
        return result

    def _ready(self, live: _Live, bank: list) -> bool:
        """The import (and builds) and a checked first call on every shape, within the setup's time."""
        return all(self._step(live, channels.CALL, i, bank[i][0]) is not None for i in range(len(bank)))

    def _visit(self, live: _Live, index: int, round_index: int, bank: list) -> None:
        """One visit of `live` on case `index`, the owner's garbage collector off (_collected), on its CPU if one is
        named (_owner_pinned)."""
        with _collected(), _owner_pinned():
            self._visit_steps(live, index, round_index, bank)

    def _visit_steps(self, live: _Live, index: int, round_index: int, bank: list) -> None:
        live.steps.case.extend(VISIT_TIMEOUT_S)
        inputs = iter(bank[index][1:])  # the ready step had the first
        # the outputs checked after the visit, no check between two of its steps; in parts past the memory it may keep
        steps = live.steps.steps
        fit = self.kept_max_bytes // steps.slot_bytes(index)
        steps.defer(index, max(1, min(self.settings.warmup + 2 * self.settings.steps, fit)))
        for _ in range(self.settings.warmup):
            if self._step(live, channels.CALL, index, next(inputs)) is None:
                return
        owner, call, held, synced = [], [], [], False
        # NOTES: the ranked (idle-stream) steps in one run after the warm-up, the held ones after them. Taking turns,
        # a rank that reads each step's kind (the header says it: a held step's rank holds its own stream) did its
        # per-call work in the unranked held steps between ranked ones: red team 56, with two workspaces, ranked 47%
        # under its twin doing the same work. Work prepared ahead now needs room for every ranked step of a visit, as
        # in the warm-up (docs/judge.md, "What stays open").
        for kind in (channels.CALL,) * self.settings.steps + (channels.HELD,) * self.settings.steps:
            result = self._step(live, kind, index, next(inputs))
            if result is None:
                return
            if kind == channels.CALL:
                owner.append(result.window_ns)
                call.append(max(result.call_ns))
            else:
                held.append(max(result.held_ns))
                # a held step whose stream was never held but that still gave its time: the rank ran it on an idle
                # stream (its call synchronizes inside)
                synced = synced or any(v == v and not ok for v, ok in zip(result.held_ns, result.held_ok))
        if problem := live.steps.steps.settle():
            live.failure = _wrong_output(*problem[1:], index)
            return
        clocks = gpu_clocks(self.devices) if self.plan.backend == "nccl" else None
        self.clocks.append(clocks)
        if clocks and min(clocks["sm_mhz"]) < THROTTLE_FRACTION * max(clocks["max_mhz"]):
            self.throttled += 1
            return
        # every idle step's window kept beside its mean: which statistic of a visit is steadiest is a question for
        # saved runs (one GPU, world size 1: the owner's step drifted ±6% between runs where held time moved ±0.6%)
        sample = {"owner": statistics.fmean(owner) / 1e3, "owner_steps_us": [round(w / 1e3, 3) for w in owner]}
        call = [v for v in call if v == v]
        if call:
            sample["call"] = statistics.fmean(call) / 1e3
        if synced and live.entry.name not in self.sync_inside:
            self.sync_inside.add(live.entry.name)
            for (name, _), per_round in self.samples.items():  # its figure is the call time from the start
                for value in per_round.values() if name == live.entry.name else ():
                    if "call" in value:
                        value["held"] = value["call"]
        held = [v for v in held if v == v]
        if live.entry.name in self.sync_inside:
            sample["held"] = sample.get("call", math.nan)
        elif held and len(held) >= self.settings.steps // 2:
            sample["held"] = statistics.fmean(held) / 1e3
        self.samples.setdefault((live.entry.name, index), {})[round_index] = sample

    def _end(self, live: _Live, round_index: int) -> None:
        """Ends an entry's session (the steps stopped, the ranks' results read), then its pool, and waits until no
        process of it is left (RankPool.shutdown, kill)."""
        if live.steps is not None and live.pool is not None and live.steps.case.done is None and not live.broken:
            live.steps.case.extend(VISIT_TIMEOUT_S)
            results = live.steps.finish()
            if not live.failure and not all(r.ok for r in results):
                live.failure = core.rank_failures(results, live.entry.name)
        if live.pool is not None and not (live.pool.kill if live.failure else live.pool.shutdown)(clean_files=False):
            live.failure = live.failure or ("something of its pool outlived its end (a process of it, or its memory "
                                            "group): it would have run beside the next entry's visits")
        if live.failure:
            self.failed.setdefault(live.entry.name, live.failure)
            for index in range(len(self.plan.case_args)):
                self.samples.get((live.entry.name, index), {}).pop(round_index, None)

    def _round(self, round_index: int, active: list, env: dict) -> tuple[dict, dict]:
        """One round; returns the seconds its phases took (inputs, start, ready, visits, end; each entry's ready) and
        each entry's own seconds (its ready, visits and end: what the time cap counts)."""
        seed = random.Random(self.seed + round_index).randrange(2 ** 32)
        self.round_seeds.append(seed)
        self.visits.append([])
        self.processes.append({})
        order = random.Random(seed)
        phases = dict.fromkeys(("inputs", "start", "ready", "visits", "end"), 0.0)
        own_s: dict = {}
        mark = time.monotonic()
        bank = self._bank(round_index, range(1))
        # The visits' sets (most of the owner's CPU work) are drawn while the first pool starts and imports; joined
        # before any visit, so no draw shares the CPU with a timed step.
        drawing = concurrent.futures.ThreadPoolExecutor(1)
        later = drawing.submit(self._bank, round_index, range(1, 1 + self.settings.warmup + 2 * self.settings.steps))
        drawing.shutdown(wait=False)
        phases["inputs"] += time.monotonic() - mark
        # NOTES: one entry's code runs at a time: its pool is readied, visited on every shape and ended (its
        # namespace gone, every process in it reaped) before the next entry's ranks import anything of theirs.
        # Nothing an entry leaves running, in a process or in the kernel on a process's behalf (timers and wake-ups
        # armed before a pause: red team 20), can then reach another entry's visits, and no two entries can talk.
        # The entries go in an order drawn per round, as their visits' shapes do, so that the entry listed first is
        # not first in every round (the order test found v7 2-3% apart between its listings in two sessions:
        # WORKLOG, seventeenth session).
        active = list(active)
        order.shuffle(active)
        self.starts.append([entry.name for entry in active])
        mark = time.monotonic()
        born = self._born(active[0], env)
        phases["start"] += time.monotonic() - mark
        try:
            for position, entry in enumerate(active):
                live, born = born, None
                self._begin(live)
                # NOTES: the next entry's pool is born while this one readies (its zygote forked from the run's
                # nursery: the harness's code, nothing of its entry's), and waited for before this entry's visits,
                # which it sits through idle (75 s rounds of 13 entries at world size 1 on an H200 when each pool was
                # born in turn, eighteenth session).
                mark = time.monotonic()
                if position + 1 < len(active):
                    born = self._born(active[position + 1], env)
                phases["start"] += time.monotonic() - mark
                mark = time.monotonic()
                ready = not live.failure and self._ready(live, bank)
                phases.setdefault("ready_s", {})[entry.name] = round(time.monotonic() - mark, 2)
                own_s[entry.name] = time.monotonic() - mark
                if born is not None and born.pool is not None and not born.pool.wait_born():
                    born.failure = "its pool's workers were not born within the setup's time"
                phases["ready"] += time.monotonic() - mark
                if later is not None:
                    mark = time.monotonic()
                    for case, more in zip(bank, later.result()):
                        case += more
                    later = None
                    phases["inputs"] += time.monotonic() - mark
                if ready:
                    mark = time.monotonic()
                    shapes = list(range(len(self.plan.case_args)))
                    order.shuffle(shapes)
                    self.processes[-1][entry.name] = _pids(live)
                    for index in shapes:
                        if live.failure:
                            break
                        self.visits[-1].append((entry.name, index))
                        self._visit(live, index, round_index, bank)
                    phases["visits"] += time.monotonic() - mark
                    own_s[entry.name] += time.monotonic() - mark
                mark = time.monotonic()
                self._end(live, round_index)
                phases["end"] += time.monotonic() - mark
                own_s[entry.name] += time.monotonic() - mark
        finally:
            if born is not None and born.pool is not None:  # a round cut short leaves no pool behind
                born.pool.kill()
        if later is not None:  # no entry was ready: the draw still ends with the round
            later.result()
        return phases, own_s

    def run(self) -> Run:
        started = time.monotonic()
        names = list(self.settings.order) or [e.name for e in self.entries]
        by_name = {e.name: e for e in self.entries}
        rounds = 0
        # NOTES: the cap is shared out: each entry runs the rounds its own time (its ready, visits and end) lets fit
        # in its share, counted from the end of the first round, which pays the builds once. A cap over the whole
        # round let one entry's slow import hold every entry to the least rounds (red team 24). The count is fixed by
        # its first round after the builds' (cap_rounds) and never recounted: its ready and end last as long as its
        # ranks take, so a charge recounted every round let it stop at the round it chose, when its running figure
        # was low (red team 31 with the sum, red team 32 with the median). Only the judge's own figure's target stops
        # an entry: a rank's call and held figures are its word, and two equal ones given at the round it chose met
        # their targets there (red team 32); their targets are shown in the stop reasons.
        # The rounds bought by a cheap first round are not a licence for dear later ones (red team 38: fast there,
        # then a 20 s import each round, 8x its share and on to the last round): an entry whose own time after the
        # first round passes LATE_FACTOR times what its rounds should cost (its share, or its rounds at its first
        # round's cost where those are more) fails. Failing serves no entry, so this is no stop to choose.
        share_s = self.settings.time_cap_s / max(1, len(self.entries))
        judged = [t for t in self.settings.targets if t.metric == RANKING]
        budget, first_s, spent_s = {}, {}, {}  # per entry: its rounds under the cap, its first round's s, its s since
        # protect_builds: what one entry keeps never pushes out another's build while the run lasts
        with (protect_builds(), held_to_round_ends() as round_ended, sharing.shared_ranks(self.plan.placement) as env,
              self._nursing(env)):
            for round_index in range(self.settings.max_rounds):
                active = [by_name[n] for n in names if n not in self.stopped and n not in self.failed]
                if round_index >= self.settings.min_rounds:
                    for entry in active:
                        if round_index >= budget.get(entry.name, math.inf):
                            self.stopped[entry.name] = self._stop_reason(
                                entry, f"time cap ({self.settings.time_cap_s:g} s, {share_s:.3g} s its own)")
                    active = [entry for entry in active if entry.name not in self.stopped]
                if not active:
                    break
                round_started = time.monotonic()
                phases, entry_s = self._round(round_index, active, env)
                round_s = time.monotonic() - round_started
                for name, seconds in entry_s.items() if round_index else ():
                    first = first_s.setdefault(name, seconds)
                    budget.setdefault(name, cap_rounds(share_s, first))
                    spent_s[name] = spent_s.get(name, 0.0) + seconds
                    expected_s = max(share_s, max(budget[name], self.settings.min_rounds) * first)
                    if spent_s[name] > LATE_FACTOR * expected_s and name not in self.failed:
                        self.failed[name] = (f"its own time after the first round, {spent_s[name]:.0f} s, passed "
                                             f"{LATE_FACTOR}x what its rounds should cost ({expected_s:.0f} s: the "
                                             f"time cap's share, or its rounds at its first round's {first:.1f} s)")
                self.phases.append(phases)
                rounds = round_index + 1
                waits = sorted(phases.get("ready_s", {}).items(), key=lambda item: -item[1])[:3]
                self.progress(f"  round {rounds}: {len(active)} entries, {round_s:.1f} s ("
                              + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()
                                          if name != "ready_s") + "; longest ready: "
                              + ", ".join(f"{name} {seconds:.1f}" for name, seconds in waits) + ")"
                              + (f", throttled visits so far {self.throttled}" if self.throttled else ""))
                round_ended()
                if rounds >= self.settings.min_rounds:
                    for entry in active:
                        if entry.name in self.failed:
                            continue
                        found = self._intervals(entry)
                        if judged and RANKING in found and not iv.unmet(found, judged):
                            self.stopped[entry.name] = f"the owner's target met at round {rounds}"
            for entry in self.entries:
                if entry.name not in self.stopped and entry.name not in self.failed:
                    self.stopped[entry.name] = self._stop_reason(entry, f"{self.settings.max_rounds} rounds")
        if self.uid is not None:
            core.release_uid(self.uid)
        return Run(self.entries, self.plan.case_args, self.samples, self.stopped, self.failed, self.sync_inside,
                   self.round_seeds, self.seed, self.clocks, self.throttled, self.guards,
                   time.monotonic() - started, rounds, self.phases, self.visits, self.starts, self.processes)

    @contextlib.contextmanager
    def _nursing(self, env: dict):
        """The run's nursery, where pools' ranks are forked from a zygote (births.Nursery): each pool's zygote is
        forked from it with torch imported, so a birth takes a fork, not an import."""
        self.nursery = core.start_nursery(env) if core.rank_birth() == "zygote" else None
        try:
            yield
        finally:
            if self.nursery is not None:
                self.nursery.close()
            self.nursery = None

    def _intervals(self, entry: Entry) -> dict:
        return entry_intervals(self.samples, entry.name, len(self.plan.case_args))

    def _stop_reason(self, entry: Entry, cap: str) -> str:
        """Why an entry left the rounds, with each target it missed and about how many rounds would meet it."""
        found = self._intervals(entry)
        missed = iv.unmet(found, self.settings.targets)

        def rounds(metric: str, target: float) -> str:
            need = iv.rounds_to_meet(found[metric], target)
            return f", about {need} rounds" if need else ""
        return cap + ("; " + ", ".join(f"{m} ±{100 * hw:.1f}% (target {100 * t:g}%{rounds(m, t)})"
                                       for m, hw, t in missed) if missed else "")


def time_entries(plan, entries: list, settings: Settings, progress=print) -> Run:
    """Stages each version as a bundle (what its pool's workers import) and runs the clock."""
    from a2a.plan import prebuild, stage

    peers_on_gpus = plan.world_size >= 2 and not plan.meta["shared_gpus"]
    if plan.backend == "nccl" and (peers_on_gpus or any(entry.name == "handshake" for entry in entries)):
        # NOTES: the harness's own extension (the handshake row, and the flag round that aligns held calls with
        # peers) is built once, by the judge, into the cache every pool starts from; built in a pool it was kept for
        # no other (no source of a submission keys it) and a fresh machine built it again every round (60-98 s).
        for failure in prebuild([]):
            progress(f"the harness's probes did not build ({failure}); the entries that use them will fail")
    with core.owned_tempdir("clock") as tmp:
        bundles = {}
        for entry in entries:
            if entry.kind == "version":
                bundles[entry.name] = stage(Path(entry.path), tmp / f"bundle{len(bundles)}",
                                                    plan.task_path, plan.task, test_files=False)
        progress(f"clock: {len(entries)} entries x {len(plan.case_args)} shapes, {settings.steps} idle + "
                 f"{settings.steps} held steps per visit, rounds {settings.min_rounds}-{settings.max_rounds}, time cap "
                 f"{settings.time_cap_s:g} s, {plan.meta['placement']}")
        return Clock(plan, entries, settings, bundles, progress).run()
