"""The judge's clock: every entry timed in interleaved rounds of fresh processes, with intervals and a stopping rule.

A round starts every entry still running in fresh rank processes of its own (a pool each, born in the sandbox, as
on the runner's fresh machine: nothing one entry or one round leaves in a process reaches another), lets each make
its inputs, import the submission, check its first call on every shape and warm up, then visits every (entry,
shape) pair once in an order shuffled with the round's seed (recorded). A visit is `steps` timed steps in the
runner's order (eval.timed_step), alternating two kinds:
- idle-stream steps: the leaderboard-style host time (rank 0's clock around clone, call, synchronize and barrier)
  and the call time (events around the call on an idle stream: the GPU waiting for the host path, today's
  device-side figure);
- held steps: the stream held by a sleep kernel until the call has queued its work (nvbench's blocking kernel), so
  the events see the GPU's work alone; a call that synchronizes inside falls back to the call time, named.
Per step the slowest rank's device times count (nccl-tests' rule); a round's value is the mean of the visit's steps.
The owner (this process) never imports a submission: it keeps its own clock around each visit, draws which outputs
go to the check apart, checks them, and reads the GPU's SM clock and throttle reasons after each visit (NVML); a
visit that ran below 75% of the maximum SM clock is flagged and left out (nvbench's rule).

After `min_rounds`, an entry whose intervals (a2a/intervals.py) meet every target leaves the rounds; the others go on
until they do or the time cap comes, so the time goes where the intervals are widest. Each entry says what
stopped it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import secrets
import statistics
import time
from pathlib import Path
from typing import Optional

import eval as core
from a2a import intervals as iv
from a2a import sharing

METRICS = {"call": "device_mean_us", "held": "held_mean_us", "host": "mean_us"}  # metric -> its row column
# metric -> its row columns: the figure and its 95% interval
COLUMNS = {"call": ("device_mean_us", "device_low_us", "device_high_us"),
           "held": ("held_mean_us", "held_low_us", "held_high_us"), "host": ("mean_us", "low_us", "high_us")}
METRIC_NAMES = {"call": "call time (device, idle stream)", "held": "device time (stream held)",
                "host": "leaderboard-style"}
# What a round-limited run reaches on one H100 at world size 1 (2026-11-25, WORKLOG "The judge's clock"): the held
# device time ±0.5-1% after 5 rounds, the call time ±4-9% and the leaderboard-style time ±7-12% after 10.
DEFAULT_TARGETS = (iv.Target("held", 0.02), iv.Target("call", 0.05), iv.Target("host", 0.08))
SETUP_TIMEOUT_S = 300.0  # a round's start: imports, the first round's extension builds, checks, warm-up
VISIT_TIMEOUT_S = 120.0
APART_PER_VISIT = 1  # outputs of a visit checked apart, after the round's visits; every round adds one per shape
FIGURES = ("steps", "device_ns", "held_ns")  # the lists of times a visit's clock-end report carries
THROTTLE_FRACTION = 0.75  # nvbench: a sample taken below 75% of the clock is throttled
# MPS serves at most 48 clients per GPU: pools alive at once, when ranks share GPUs, stay below that.
MPS_CLIENTS = 40


@dataclasses.dataclass(frozen=True)
class Entry:
    """What a row times: a version file (`kind` "version"), or the harness's own rows (`kind` "empty",
    "handshake", "anchor", with `call` the a2a.anchors entry)."""
    name: str
    kind: str
    path: Optional[str] = None
    call: Optional[str] = None


@dataclasses.dataclass
class Settings:
    steps: int = 10  # timed steps per visit and kind (idle, held)
    warmup: int = 2  # untimed calls at the start of each visit
    min_rounds: int = 5
    max_rounds: int = 60
    time_cap_s: float = 240.0  # from the end of the first round, which pays the builds
    targets: tuple = DEFAULT_TARGETS
    seed: Optional[int] = None  # the run's seed for the rounds' orders (drawn and recorded when None)
    order: tuple = ()  # the entries' order in a round before its shuffle (stability runs reverse it)


# --------------------------------------------------------------------------------------------------------------
# Rank side
# --------------------------------------------------------------------------------------------------------------


def _entry_call(entry: Entry, rank: int, inputs: list):
    """The callable an entry's steps time. A version's custom_kernel is imported here, after its inputs exist, as
    the runner imports it inside the worker; the harness rows build one call per case on the rank's device."""
    if entry.kind == "version":
        return core.import_submission()
    from a2a import anchors

    return anchors.CaseCalls(entry.call, inputs, rank)


def _schedule(steps: int) -> list:
    """Idle and held steps taking turns, each kind first in every other pair."""
    pair = ["call", ("call", core.HELD)]
    return [kind for k in range(steps) for kind in (pair if k % 2 == 0 else pair[::-1])]


def session_rank(rank: int, world_size: int, entry: Entry, cases: list, settings: dict) -> dict:
    """One entry's rank for one round: inputs, then the submission, then one visit per owner's command."""
    b = core.bound()
    generate_input = b.reference[0]
    version = entry.kind == "version"
    # NOTES: the inputs and their expected outputs are made before any submission code runs in this process.
    inputs = [generate_input(**args, rank=rank) for args in cases]
    unchanged = [core.snapshot(data) for data in inputs]
    expected = [core.expected_output(data, b) for data in unchanged] if version else None
    call = _entry_call(entry, rank, inputs)
    first = []
    for i, data in enumerate(inputs):
        output = call(core.clone_data(data, rank, b))
        if version:
            good, message = core.checked(b, unchanged[i], output)
            if not core.all_ok(good, rank, b):
                raise RuntimeError(message or "another rank failed its check")
            first.append(core.shipped(b, output))
    hold = core.Hold(sync_inside=settings["sync_inside"])  # whether a call synchronizes inside is the entry's
    command = core.ask_owner("ready", {"apart": first})
    while command[0] == "visit":
        i = command[1]
        checker = core.OutputCheck(b, core.rank_device(rank)) if version else None
        count = [0]

        def after(step: core.Step) -> bool:
            if checker:
                checker.add(count[0], step.output, expected[i])
            count[0] += 1
            return False

        core.ask_owner("clock-start")
        started = b.clock_ns()
        taken = core.measure({"call": call}, inputs[i], rank, _schedule(settings["steps"]), warmup=settings["warmup"],
                             device_clock=True, after_step=after, holds={"call": hold}, b=b)["call"]
        loop_ns = b.clock_ns() - started
        # NOTES: the figures the owner records are those of this report, the one its own clock is checked against.
        core.ask_owner("clock-end", {"loop_ns": loop_ns, "steps": taken.host_ns, "device_ns": taken.device_ns,
                                     "held_ns": taken.held_ns})
        why = (checker.verdict() if checker else None) or b.tampering(b)
        if not core.all_ok(why is None, rank, b):
            raise core.Tampering(why) if why and why.startswith("the ") else RuntimeError(
                why or "another rank failed its check")
        picks = core.ask_owner("apart", count[0]) if checker else []
        command = core.ask_owner("visit-done", {"sync_inside": hold.sync_inside,
                                                "apart": [core.shipped(b, checker.copies[j]) for j in picks]})
    if hasattr(call, "close"):
        call.close()
    return {"rank": rank}


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
    """One entry's pool in one round."""
    entry: Entry
    pool: Optional[core.RankPool]
    case: Optional[core.CaseRun]
    failure: str = ""
    apart: list = dataclasses.field(default_factory=list)  # each visit's shipped outputs, checked after the visits


@dataclasses.dataclass
class Run:
    """What a clock run measured: per (entry, case index) and round, the visit's step means; what stopped each
    entry; the run's seeds; the clock samples."""
    entries: list
    cases: list
    samples: dict  # (entry name, case index) -> {round: {"host": µs, "call": µs, "held": µs}}
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
    phases: list  # per round, the seconds of its phases: pools started, ready, visits, ended
    visits: list  # per round, the (entry name, case index) visited, in order
    processes: list  # per round, {entry name: the pids of its rank processes}

    def entry_intervals(self, name: str) -> dict:
        return entry_intervals(self.samples, name, len(self.cases))

    def case_intervals(self, name: str, index: int) -> dict:
        per_round = self.samples.get((name, index), {})
        return {metric: iv.interval([v[metric] for v in per_round.values() if metric in v]) for metric in METRICS
                if any(metric in v for v in per_round.values())}


def entry_intervals(samples: dict, name: str, n_cases: int) -> dict:
    """{metric: Interval} of an entry's geometric mean over the cases, from its rounds."""
    out = {}
    for metric in METRICS:
        per_case = {i: {r: v[metric] for r, v in samples.get((name, i), {}).items() if metric in v}
                    for i in range(n_cases)}
        values = iv.geomean_rounds(per_case)
        if values:
            out[metric] = iv.interval(values)
    return out


def _chunks(entries: list, placement) -> list:
    if not placement.shared:
        return [entries]
    size = max(1, MPS_CLIENTS // placement.ranks_per_gpu)
    return [entries[i:i + size] for i in range(0, len(entries), size)]


class Clock:
    def __init__(self, plan, entries: list, settings: Settings, bundles: dict, progress=print):
        self.plan, self.entries, self.settings, self.bundles, self.progress = plan, entries, settings, bundles, progress
        self.seed = settings.seed if settings.seed is not None else secrets.randbits(32)
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
        self.oracle = core.InputOracle(plan.backend)
        self.visits: list = []
        self.processes: list = []
        self.devices = sorted({plan.placement.device_index(r) for r in range(plan.world_size)}) \
            if plan.backend == "nccl" else []

    # One entry's pool: born, ready, visited, ended.
    def _start(self, entry: Entry, env: dict) -> _Live:
        pool = None
        try:
            pool = core.RankPool(self.plan.world_size, self.plan.backend, rank_prefix=True, env=env,
                                 bundle=self.bundles.get(entry.name), rerun_main=False)
            self.guards, self.uid = pool.guards.describe(), pool.guards.uid
            test = core.TestCase(args={"world_size": self.plan.world_size}, spec=f"{entry.name} (clock round)")
            params = {"fn": session_rank, "args": (entry, self.plan.case_args, {
                "steps": self.settings.steps, "warmup": self.settings.warmup,
                "sync_inside": entry.name in self.sync_inside})}
            return _Live(entry, pool, pool.begin("call", test, SETUP_TIMEOUT_S, params))
        except Exception as exc:  # a pool that cannot start fails its entry, not the run
            if pool is not None:
                pool.kill()
            return _Live(entry, None, None, f"{type(exc).__name__}: {exc}")

    def _until(self, live: _Live, kind: str, answers: core.OwnerAnswers):
        """Answers the owner's questions of a visit (clock, apart) until the ranks ask `kind`; its Gather, or None
        when the entry failed (live.failure says why)."""
        while True:
            event = live.case.next_event()
            if isinstance(event, list):
                live.failure = core.rank_failures(event) or "the session ended early"
                return None
            if event.kind == kind:
                return event
            try:
                reply = answers(event)
            except ValueError as exc:
                live.case.violation = str(exc)
                continue
            if isinstance(reply, dict) and "per_rank" in reply:
                live.case.reply(per_rank=reply["per_rank"])
            else:
                live.case.reply(reply)

    def _check_apart(self, live: _Live, cases: list, payloads: dict) -> bool:
        """The outputs a visit (or the first calls) shipped, each against the input of its case made again by the
        owner's oracle; exactly one output per case named, or the entry fails."""
        for rank, payload in sorted(payloads.items()):
            items = payload.get("apart")
            if not isinstance(items, list) or len(items) != len(cases):
                live.failure = f"rank {rank} shipped {len(items or [])} outputs for the check apart, not {len(cases)}"
                return False
            made = self.oracle.inputs([(self.plan.case_args[index], rank) for index in cases])
            for item, input_made in zip(items, made):
                good, message = core.check_apart(item, input_made)
                if not good:
                    live.failure = (f"rank {rank}: the output failed the check made outside the submission's "
                                    f"process: {message}")
                    return False
        return True

    def _visit(self, live: _Live, index: int, round_index: int) -> None:
        answers = core.OwnerAnswers(apart_min=APART_PER_VISIT, apart_fraction=0.0)
        live.case.extend(VISIT_TIMEOUT_S)
        live.case.reply(("visit", index))
        done = self._until(live, "visit-done", answers)
        if done is None:
            return
        if answers.void:
            live.failure = answers.void
            return
        # NOTES: the check apart runs after the round's visits (it is CPU work that would compete with the ranks'
        # host path); a failure then voids the entry's samples of this round.
        live.apart.append(([index] * APART_PER_VISIT, done.payloads))
        said = answers.reports.get(0)
        if not isinstance(said, dict) or not all(isinstance(said.get(key), list) and all(
                isinstance(v, (int, float)) for v in said[key]) for key in FIGURES) or not said["steps"]:
            live.failure = "rank 0 sent no times, or not numbers, with the end of its timed loop"
            return
        clocks = gpu_clocks(self.devices) if self.plan.backend == "nccl" else None
        self.clocks.append(clocks)
        if clocks and min(clocks["sm_mhz"]) < THROTTLE_FRACTION * max(clocks["max_mhz"]):
            self.throttled += 1
            return
        sample = {"host": statistics.fmean(said["steps"]) / 1e3}
        if said["device_ns"]:
            sample["call"] = statistics.fmean(said["device_ns"]) / 1e3
        held = [v for v in said["held_ns"] if v == v]
        synced = any(isinstance(p, dict) and p.get("sync_inside") for p in done.payloads.values())
        if synced and live.entry.name not in self.sync_inside:
            self.sync_inside.add(live.entry.name)
            for (name, _), per_round in self.samples.items():  # its figure is the call time from the start
                for value in per_round.values() if name == live.entry.name else ():
                    if "call" in value:
                        value["held"] = value["call"]
        if live.entry.name in self.sync_inside:
            sample["held"] = sample.get("call", math.nan)
        elif held and len(held) >= len(said["held_ns"]) // 2:
            sample["held"] = statistics.fmean(held) / 1e3
        self.samples.setdefault((live.entry.name, index), {})[round_index] = sample

    def _end(self, lives: list, round_index: int) -> None:
        """Ends a chunk's sessions (their last answers first, then every pool), then checks apart what the visits
        shipped."""
        for live in lives:
            if live.case is not None and live.case.done is None and not live.failure:
                live.case.extend(VISIT_TIMEOUT_S)
                live.case.reply(("done",))
        for live in lives:
            if live.case is not None and live.case.done is None and not live.failure:
                results = live.case.next_event()
                if isinstance(results, list) and not all(r.ok for r in results):
                    live.failure = core.rank_failures(results)
        for live in lives:
            if live.pool is not None:
                (live.pool.kill if live.failure else live.pool.shutdown)(clean_files=False)
            if not live.failure and live.entry.kind == "version":
                for cases, payloads in live.apart:
                    if not self._check_apart(live, cases, payloads):
                        break
            if live.failure:
                self.failed.setdefault(live.entry.name, live.failure)
                for index in range(len(self.plan.case_args)):
                    self.samples.get((live.entry.name, index), {}).pop(round_index, None)

    def _round(self, round_index: int, active: list, env: dict) -> dict:
        """One round; returns the seconds its phases took (start, ready, visits, end)."""
        seed = random.Random(self.seed + round_index).randrange(2 ** 32)
        self.round_seeds.append(seed)
        self.visits.append([])
        self.processes.append({})
        order = random.Random(seed)
        phases = dict.fromkeys(("start", "ready", "visits", "end"), 0.0)
        for chunk in _chunks(active, self.plan.placement):
            mark = time.monotonic()
            lives = [self._start(entry, env) for entry in chunk]
            phases["start"] += time.monotonic() - mark
            mark = time.monotonic()
            ready = []
            for live in lives:
                if not live.failure:
                    gather = self._until(live, "ready", core.OwnerAnswers())
                    if gather is not None:
                        live.apart.append((list(range(len(self.plan.case_args))), gather.payloads))
                        ready.append(live)
            phases["ready"] += time.monotonic() - mark
            mark = time.monotonic()
            visits = [(live, index) for live in ready for index in range(len(self.plan.case_args))]
            order.shuffle(visits)
            self.visits[-1] += [(live.entry.name, index) for live, index in visits]
            self.processes[-1].update({live.entry.name: [w[0].pid for w in live.pool.workers if w is not None]
                                       for live in ready})
            for live, index in visits:
                if not live.failure:
                    self._visit(live, index, round_index)
            phases["visits"] += time.monotonic() - mark
            mark = time.monotonic()
            self._end(lives, round_index)
            phases["end"] += time.monotonic() - mark
        return phases

    def run(self) -> Run:
        started = time.monotonic()
        names = list(self.settings.order) or [e.name for e in self.entries]
        by_name = {e.name: e for e in self.entries}
        round_s = 0.0
        rounds = 0
        timing_from = None
        with sharing.shared_ranks(self.plan.placement) as env, contextlib.closing(self.oracle):
            for round_index in range(self.settings.max_rounds):
                active = [by_name[n] for n in names if n not in self.stopped and n not in self.failed]
                if not active:
                    break
                # The first round pays the builds (extensions, Triton) once; the cap counts from its end.
                elapsed = time.monotonic() - (timing_from or started)
                if round_index >= self.settings.min_rounds and elapsed + round_s > self.settings.time_cap_s:
                    for entry in active:
                        self.stopped[entry.name] = self._stop_reason(entry, f"time cap ({self.settings.time_cap_s:g} s)")
                    break
                round_started = time.monotonic()
                phases = self._round(round_index, active, env)
                round_s = time.monotonic() - round_started
                timing_from = timing_from or time.monotonic()
                self.phases.append(phases)
                rounds = round_index + 1
                self.progress(f"  round {rounds}: {len(active)} entries, {round_s:.1f} s ("
                              + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()) + ")"
                              + (f", throttled visits so far {self.throttled}" if self.throttled else ""))
                if rounds >= self.settings.min_rounds:
                    for entry in active:
                        if entry.name in self.failed:
                            continue
                        found = self._intervals(entry)
                        if self.settings.targets and found and not iv.unmet(found, self.settings.targets):
                            self.stopped[entry.name] = f"targets met at round {rounds}"
            for entry in self.entries:
                if entry.name not in self.stopped and entry.name not in self.failed:
                    self.stopped[entry.name] = self._stop_reason(entry, f"{self.settings.max_rounds} rounds")
        if self.uid is not None:
            core.release_uid(self.uid)
        return Run(self.entries, self.plan.case_args, self.samples, self.stopped, self.failed, self.sync_inside,
                   self.round_seeds, self.seed, self.clocks, self.throttled, self.guards,
                   time.monotonic() - started, rounds, self.phases, self.visits, self.processes)

    def _intervals(self, entry: Entry) -> dict:
        return entry_intervals(self.samples, entry.name, len(self.plan.case_args))

    def _stop_reason(self, entry: Entry, cap: str) -> str:
        missed = iv.unmet(self._intervals(entry), self.settings.targets)
        return cap + ("; " + ", ".join(f"{m} ±{100 * hw:.1f}% (target {100 * t:g}%)" for m, hw, t in missed)
                      if missed else "")


def time_entries(plan, entries: list, settings: Settings, progress=print) -> Run:
    """Stages each version as a bundle (what its pool's workers import) and runs the clock."""
    from a2a.plan import stage

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
