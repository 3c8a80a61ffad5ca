"""The tools' one measuring loop, in a rank's own process: `measure` (warm-up, then timed steps in any schedule of
labels, floor and held steps among them) around `timed_step` (one leaderboard-style step in the runner's order).
Every tool that times a call in a rank (the timeline, the step anatomy, the launch sweep and floor, compare_ideas)
times it here, on the primitives the worker bound (eval.bind_primitives). What it gives is the rank's own figure,
never a verdict: the judge's time is the owner's step (judge.py)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import eval as core


def slowest_rank(values: list, rank: int, b: Optional[core.Bound] = None) -> list:
    """Element by element, the largest value over the ranks (a collective: every rank calls it with the same
    shape). Per-step device times become the slowest rank's, as the device-side number is defined."""
    b = b or core.bound()
    ops = b.ops
    merged = ops["tensor"](values, dtype=ops["float64"], device=core.rank_device(rank))
    ops["all_reduce"](merged, op=ops["reduce_max"])
    return ops["tolist"](merged)




STEP_BOUNDARIES = ("start", "cloned", "returned", "synchronized", "barrier passed")


class StepTimes(NamedTuple):
    host_ns: int
    output: Any
    device_ns: Optional[float]  # around the call on an idle stream (the call time), or held (the GPU's work)
    held: Optional[bool]  # with a hold: whether the stream was still held when the call returned


def timed_step(call: Optional[Callable], data, rank: int, device_clock: bool = False,
               probe: Optional[Callable[[str], None]] = None, hold: Optional[core.Hold] = None,
               b: Optional[core.Bound] = None) -> StepTimes:
    """One leaderboard-style step in the runner's order, the same code for a case and for the harness floor (`call`
    None): clear the L2, synchronize, barrier, start the host clock, clone the input, call, synchronize, barrier,
    stop; every one of them a bound primitive. The host time is the official number on rank 0. With
    `device_clock`, the device time is taken around the call alone: CUDA events on the rank's stream on a GPU run
    (with `hold`, the stream held until the call has queued its work), this rank's host clock on a CPU run.
    `probe(boundary)` is called at each of STEP_BOUNDARIES (tools: stamps, markers); the call itself runs with the
    current device the runner leaves."""
    b = b or core.bound()
    ops = b.ops
    mark = probe or (lambda _boundary: None)
    events = stream = None
    on_gpu = core.on_gpu()
    if call is not None and device_clock and on_gpu:
        device = core.rank_device(rank)
        events, stream = core.timing_events(device, b), ops["current_stream"](device)
    core.clear_l2(b)
    core.synchronize(b)
    core.barrier(rank, b)
    start = b.clock_ns()
    mark("start")
    cloned = core.clone_data(data, rank, b)
    mark("cloned")
    output = device_ns = held = None
    if events:
        holding = hold is not None and not hold.sync_inside and ops["sleep"] is not None
        if holding:
            previous = ops["exchange_device"](stream.device_index)
            ops["sleep"](hold.cycles)
            ops["exchange_device"](previous)
        ops["record"](events[0], stream)
        output = call(cloned)
        ops["record"](events[1], stream)
        if holding:
            held = not ops["query"](events[0])
    elif call is not None:
        call_start = b.clock_ns()
        output = call(cloned)
        device_ns = b.clock_ns() - call_start if device_clock else None
    mark("returned")
    core.synchronize(b)
    mark("synchronized")
    core.barrier(rank, b)
    host_ns = b.clock_ns() - start
    mark("barrier passed")
    if events:
        ops["event_sync"](events[1])
        device_ns = ops["elapsed_ms"](events[0], events[1]) * 1e6
    return StepTimes(host_ns, output, device_ns, held)


# Untimed calls of each callable before a tool measures it. The first calls of a shape pay one-time work (an
# extension's or Triton's build, a graph's capture, buffers' first touch, a communicator's setup) that no later call
# pays; five is what the anchors and traces have always used, more than any version has needed. The official loop
# takes none: its warm-up is the runner's (a separate first case, and the checked call before timing).
WARMUP_CALLS = 5
HELD = "held"  # a schedule entry (label, HELD) is a step with the stream held


class Step(NamedTuple):
    """One measured step, as `measure`'s after_step sees it (this rank's numbers; `output` the call's)."""
    label: str
    host_ns: float
    device_ns: Optional[float]
    call_ns: Optional[float]
    output: Any
    held: Optional[bool] = None


@dataclasses.dataclass
class Measured:
    """One label's steps in order: `host_ns` this rank's (rank 0's are the official numbers), `device_ns` and
    `call_ns` the slowest rank's (device clock around the call; host time inside the call), `held_ns` the slowest
    rank's device time of held steps (NaN where a rank's stream was not held), empty where not taken."""
    host_ns: list
    device_ns: list
    call_ns: list
    held_ns: list = dataclasses.field(default_factory=list)


def measure(calls: dict, data, rank: int, schedule, warmup: int = WARMUP_CALLS, device_clock: bool = False,
            call_clock: bool = False, probe: Optional[Callable[[str], None]] = None,
            before_step: Optional[Callable] = None, after_step: Optional[Callable[[Step], bool]] = None,
            holds: Optional[dict] = None, b: Optional[core.Bound] = None) -> dict:
    """The one rank-side measuring loop, around timed_step: `warmup` untimed calls of each callable in `calls`
    ({label: callable, or None for the harness floor}), then one timed step per entry of `schedule` (labels in step
    order, or (label, HELD) for a step with the stream held: a run of one, variants taking turns, A and B
    mirrored). `device_clock`: device time around the call; `call_clock`: host time inside the call (two more
    stamps in the timed window, so off for official numbers); `holds`: {label: Hold}, the adaptive sleep of each
    label's held steps. `before_step(label)` may return the next step's input (leaderboard mode's fresh seed);
    `after_step(step)` returning True stops the loop, and must agree across ranks. A collective: every rank runs
    the same schedule. Returns {label: Measured}."""
    b = b or core.bound()
    for call in calls.values():
        for _ in range(warmup if call is not None else 0):
            call(core.clone_data(data, rank, b))
    core.synchronize(b)
    stamps: dict = {}

    def boundary(name: str) -> None:
        stamps[name] = b.clock_ns()
        if probe:
            probe(name)

    step_probe = boundary if call_clock else probe
    holds = holds or {}
    taken = {label: Measured([], [], []) for label in calls}
    for entry in schedule:
        label, held_step = (entry[0], True) if isinstance(entry, tuple) else (entry, False)
        hold = holds.setdefault(label, core.Hold()) if held_step else None
        data = (before_step(label) if before_step else None) or data
        times = timed_step(calls[label], data, rank, device_clock=device_clock, probe=step_probe, hold=hold, b=b)
        call_ns = stamps["returned"] - stamps["cloned"] if call_clock and calls[label] is not None else None
        if held_step and times.held is not None:
            hold.after(times.held)
            taken[label].held_ns.append(times.device_ns if times.held else float("nan"))
        else:
            taken[label].host_ns.append(times.host_ns)
            if times.device_ns is not None:
                taken[label].device_ns.append(times.device_ns)
        if call_ns is not None:
            taken[label].call_ns.append(call_ns)
        if after_step and after_step(Step(label, times.host_ns, times.device_ns, call_ns, times.output, times.held)):
            break
        del times
    for label in calls:
        for field in ("device_ns", "call_ns", "held_ns"):
            if getattr(taken[label], field):
                setattr(taken[label], field, slowest_rank(getattr(taken[label], field), rank, b))
    return taken
