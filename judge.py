"""The judge's trusted part: what a verdict and a time rest on, held where no rank can write.

Everything inside a rank process is the submission's (its frames, its classes, its clocks, its messages), so the
judge keeps its facts in the process that owns the ranks (the pool's owner, which never imports a submission and
runs as a uid the ranks cannot signal, ptrace or write to):

- **seeds**: every case's and step's seed comes from a per-run secret through a keyed hash (BLAKE2b), so no rank can
  invert one or predict the next (`Seeds`; the protocol face run as the runner runs it keeps Cantor pairing);
- **inputs**: the owner makes every rank's input itself (the reference's generator, on the CPU) and places it in a
  buffer it shares with that rank only after the step's clock has started, so no rank sees an input before it is
  timed;
- **answers and checks**: the expected output (the closed form, local to each rank) and the comparison are the
  owner's, on its own copy of the rank's output, taken when every rank has said "done";
- **the time that ranks**: the owner's clock, from before it places the inputs to after it holds every rank's output.

One timed step, as the owner runs it (`Steps.step`): clear the output buffers (untimed); start the clock; for each
rank, place its input and raise its `go`; wait until every rank has raised `done`; copy every output out of the
shared buffers; stop the clock; check each copy against its expected output (untimed; in a timed loop after its
last step, Steps.defer, so that no check lies between two timed steps). A rank that says "done"
before its output is complete either finished its work inside the window anyway or is checked on an incomplete
output: what it can gain is bounded by the owner's reaction (docs/judge.md, "The threat model").

A rank's own figures (the call time and the held-stream device time from its CUDA events) travel in the same shared
header; they are the rank's word, shown as diagnostics and never larger than the owner's window.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import secrets
import select
import time
from typing import Optional

from channels import (CALL_FROM_NS, CALL_NS, CALL_TO_NS, CPU_BEFORE_NS, DONE, DONE_AT_NS, FLOOR, GO_SEEN_NS, HELD,
                      HELD_NS, HELD_OK, INPUT_REGIONS, STATUS, STOP, Views, input_span)

SEED_LIMIT = 2**62  # seeds the generator takes with room for + rank (generate_input seeds seed + rank)
RTOL, ATOL = 1e-2, 5e-3  # the reference's check

# What a rank says about its output (header `status`), so that no text of a rank's is needed to name a failure.
OUTPUT_PROBLEMS = {1: "returned something that is not a torch.Tensor", 2: "returned a subclass of torch.Tensor (the "
                   "output must be a plain torch.Tensor)", 3: "returned an output of the wrong shape",
                   4: "returned an output of the wrong dtype", 5: "returned an output on the wrong device",
                   6: "raised an exception in custom_kernel"}


# --------------------------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------------------------


def cantor_combine(a: int, b: int) -> int:
    """The runner's mix of its secret seed into a public test seed (Cantor pairing; it inverts: docs/judge.md)."""
    return int(a + (a + b) * (a + b + 1) // 2)


class Seeds:
    """Every seed a run uses. Keyed (the judge's own faces): BLAKE2b keyed with 16 bytes, random per run unless a
    secret seed is given (then derived from it, so the run can be repeated); a rank sees only the seeds of its
    inputs, from which neither the key nor another seed follows. Runner (the protocol face as the runner runs it):
    a case's seed is the runner's, its public seed with the secret mixed in by Cantor pairing (as read from the
    test file); its timed steps' seeds stay keyed."""

    def __init__(self, keyed: bool, secret: Optional[int] = None):
        self.keyed = keyed
        # A given secret makes the cases repeatable; the timed steps' key is always fresh, so nothing a rank could
        # learn (the runner's case seeds invert to its secret: docs/judge.md) says what a timed input will be.
        self.case_key = (hashlib.blake2b(str(secret).encode(), digest_size=16, person=b"a2a-judge").digest()
                         if secret is not None else secrets.token_bytes(16))
        self.step_key = secrets.token_bytes(16)

    @staticmethod
    def _hash(key: bytes, *parts: int) -> int:
        digest = hashlib.blake2b(b",".join(str(p).encode() for p in parts), key=key, digest_size=8).digest()
        return int.from_bytes(digest, "little") % SEED_LIMIT

    def case_seed(self, case_index: int, seed: int) -> int:
        """A case's seed: keyed, or `seed` as the runner has it (the test file's, the secret already mixed in)."""
        return self._hash(self.case_key, case_index, seed) if self.keyed else seed

    def step_seed(self, case_index: int, public_seed: int, step: int) -> int:
        """A timed step's seed, keyed with the run's fresh key in every run (the runner's +13 rule would let a rank
        compute the next input)."""
        return self._hash(self.step_key, case_index, public_seed, step)


# --------------------------------------------------------------------------------------------------------------
# Inputs, answers, checks: made and compared in the owner, on the CPU
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RankInput:
    """One rank's input of one step, as the owner made it, and what its output must be."""
    x: object  # (n, hidden) float16
    indices: object  # (n, topk) int32
    weights: object  # (n, topk) float32
    expected: object  # (n, hidden) float16

    @property
    def num_tokens(self) -> int:
        return int(self.x.shape[0])


def make_input(args: dict, seed: int, rank: int) -> RankInput:
    """Rank `rank`'s input for `args` (a case) drawn from `seed + rank`, and its closed-form output
    (reference.closed_form_output: local to the rank, no communication needed to know it). The draws have the
    reference generator's distribution (a token count in [1, max_num_tokens), each token's experts the first k of a
    uniform random permutation, uniform weights, normal activations), made at once on the CPU: the reference's
    per-token loop there would cost the owner tens of ms per rank and step."""
    import types

    import torch
    from reference import MoEConfig, closed_form_output

    generator = torch.Generator().manual_seed(seed + rank)
    tokens = int(torch.randint(1, args["max_num_tokens"], [1], generator=generator))
    indices = torch.rand(tokens, args["num_experts"], generator=generator).argsort(dim=1)
    indices = indices[:, :args["experts_per_token"]].to(torch.int32).contiguous()
    weights = torch.rand(tokens, args["experts_per_token"], generator=generator)
    x = torch.randn(tokens, args["hidden_dim"], generator=generator).to(torch.float16)
    cfg = MoEConfig(args["num_experts"], args["experts_per_token"], args["hidden_dim"], args["max_num_tokens"])
    data = (cfg, types.SimpleNamespace(x=x, indices=indices, weights=weights), rank, args["world_size"])
    return RankInput(x, indices, weights, closed_form_output(data, on_cpu=True))


def check(output, expected) -> Optional[str]:
    """Why `output` (the owner's copy of a rank's output) is wrong, or None (the reference's tolerance)."""
    from reference import check_output

    good, message = check_output(output, expected, RTOL, ATOL)
    return None if good else message


# The most a timed loop holds at once of its steps' inputs, answers and the owner's output copies: its inputs are
# drawn before its first step and its outputs checked after its last (Steps.defer), in banks of what fits.
BANK_MAX_BYTES = 8 << 30


def bank_budget_bytes() -> int:
    """A bank's size: BANK_MAX_BYTES, or a quarter of the memory available now where that is less."""
    with open("/proc/meminfo") as meminfo:
        available = next((int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")), None)
    return min(BANK_MAX_BYTES, (available or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 4)


def draw_bank(draw, first: int, most: int, budget: int, slot_bytes: int) -> list:
    """The next timed steps' inputs, `draw(step)` (one RankInput per rank) for steps first.., at most `most` of them
    and at least one, as many as `budget` bytes hold: each input new to the bank with its answer, and the owner's
    room for a step's copies (`slot_bytes`, Steps.slot_bytes). NOTES: drawn before the bank's first step, so that no
    draw lies between two of its steps."""
    bank, held, seen = [], 0, set()
    while len(bank) < most:
        inputs = draw(first + len(bank))
        size = slot_bytes + sum(0 if id(i) in seen else i.x.nbytes + i.indices.nbytes + i.weights.nbytes
                                + i.expected.nbytes for i in inputs)
        if bank and held + size > budget:
            break
        bank.append(inputs)
        held += size
        seen.update(map(id, inputs))
    return bank


# --------------------------------------------------------------------------------------------------------------
# The steps: the owner's side of every rank's channel (channels.py), its clock and its checks
# --------------------------------------------------------------------------------------------------------------

# A held step's sleep before the call (eval.Hold), in GPU cycles: set by the owner for every rank alike, so that no
# rank's kernel waits on a peer still asleep (ranks adapting their own can drift apart; held intervals reached ±400%
# at world size 4 before); eight times longer after a step in which any rank's stream was not held.
HOLD_START_CYCLES = 200_000  # about 100 µs at 2 GHz
HOLD_MAX_CYCLES = 64_000_000  # about 32 ms
ANATOMY_ENV = "A2A_STEP_ANATOMY"  # "1": the owner prints where its steps' µs went, per case (Steps.anatomy)
ANATOMY_PHASES = ("place", "wake", "rank", "collect")
RANK_PARTS = ("before its call", "its call", "after it")  # of the slowest rank's go-to-done
CPU_PART = "on its CPU"  # of the part before the call: the rank thread's own CPU time in it


@dataclasses.dataclass
class StepResult:
    """What the owner saw of one step: its window on the owner's clock, each rank's output problem (None: right),
    and each rank's own figures (call and held-stream device time, ns; NaN where not taken). `race_ns`: how long
    after a rank said `done` (its own monotonic clock, which is the owner's too) the owner was still copying that
    rank's output, the largest over the ranks: the most that work finished after `done` could still reach the
    copy, so the most a rank could gain by saying `done` early (the rank's stamp is its word; a lie only moves
    this diagnostic). `gap_ns`: from the end of the owner's previous step to this one's start, the time a rank could
    work unseen between two steps (NaN for a case's first)."""
    window_ns: int
    problems: list
    call_ns: list
    held_ns: list
    held_ok: list
    race_ns: float = math.nan
    gap_ns: float = math.nan

    def wrong(self) -> Optional[tuple]:
        """(rank, its problem) of the first rank whose output the step found wrong, else None."""
        return next(((rank, why) for rank, why in enumerate(self.problems) if why), None)


class RankEnded(Exception):
    """A rank's worker sent its result or died in the middle of the steps: the case is over (its result says why)."""


class Missed(Exception):
    """The step's deadline passed with ranks that never said `done`."""

    def __init__(self, ranks: list):
        super().__init__(ranks)
        self.ranks = ranks


def next_hold_cycles(cycles: int, held_ok: list) -> int:
    """The next held step's hold: eight times longer (up to HOLD_MAX_CYCLES) after a step in which any rank's
    stream was not held when its call returned."""
    return cycles if all(held_ok) else min(8 * cycles, HOLD_MAX_CYCLES)


# The operator's numeric knobs: name -> (lowest, highest). A spin past a second would outlast the waits it precedes
# (a step's deadline is checked only once it ends); a case timeout past a day is no timeout, and a silence deadline
# of twice it no deadline (a2a/harness.py); under a second fails every case (a2a/plan.py's MIN_TIMEOUT_S, red
# team 40: the entry blamed). NaN, inf and text are bad input (red team 39: 114, or a case failed).
KNOBS = {"A2A_SPIN_US": (0.0, 1e6), "A2A_RANK_SPIN_US": (0.0, 1e6), "A2A_TIMEOUT": (1.0, 86400.0)}


def knob(name: str) -> Optional[float]:
    """The operator's KNOBS value `name` (None when unset or empty); ValueError, naming it, for one that is not a
    finite number in its range."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    low, high = KNOBS[name]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"{name}={text[:40]!r}: expected a number from {low:g} to {high:g}")
    return value


def check_knobs() -> None:
    """Every KNOBS value checked (ValueError for the first bad one), before any work reads it."""
    for name in KNOBS:
        knob(name)


def spin_budget_ns(ranks: int, name: str, default_us: float) -> int:
    """How long a waiting side polls its flags before it sleeps on the pipe: spinning is sub-µs, a wake-up from the
    pipe 5-30 µs, but a spinning process takes a core; so it spins only where every rank and the owner have a core
    of their own (A2A_SPIN_US / A2A_RANK_SPIN_US set it)."""
    value = knob(name)
    if value is not None:
        return int(value * 1e3)
    return int(default_us * 1e3) if (os.cpu_count() or 1) >= 2 * (ranks + 1) else 0


class Steps:
    """The owner's side of a case's steps over every rank's channel. `watch`: descriptors that turn readable when a
    rank's worker ends or sends its result (the pool's pipes), so that a wait never outlives a dead rank."""

    def __init__(self, channels: list, cases: list, watch: list):
        import torch

        # NOTES: the owner's own tensor work (placing, copying out, checking) is small; a pool of intra-op threads
        # as wide as the machine, woken for each copy beside spinning ranks, cost tens of ms a step (H200 x4).
        torch.set_num_threads(1)
        self.channels, self.cases, self.watch = channels, cases, set(watch)
        self.seq = 0
        self.ended_ns = None  # the end of the last step, for the next one's gap_ns
        self.deferred = None  # while deferring (defer): each kept output to check, with its step and rank
        self.deferred_steps = 0
        self.room, self.slot = None, 0  # while deferring: per rank, the owner's copies' room made beforehand
        self.hold_cycles = HOLD_START_CYCLES
        self.anatomy = [] if os.environ.get(ANATOMY_ENV) == "1" else None
        self.spin_ns = spin_budget_ns(len(channels), "A2A_SPIN_US", 2000)
        self.poller = select.poll()  # made once: a step's wait sits inside its window
        # (shared input regions, the owner's staged copy of them) per rank on GPUs, cut once from the first input
        # region on: a step's own span is a prefix of them (input_span)
        low, high = channels[0].regions[INPUT_REGIONS[0]], channels[0].regions["out"]
        self.input_regions = [(c.views.raw_all[low:high], c.stage.raw_all[low:high]) for c in channels
                              if c.gpu is not None]
        for fd in [channel.done_read for channel in channels] + list(watch):
            self.poller.register(fd, select.POLLIN)

    def _views(self, views: Views, case: int, tokens: int) -> dict:
        args = self.cases[case]
        return views.tensors(tokens, args["hidden_dim"], args["experts_per_token"])

    def step(self, kind: int, case: int, inputs: list, deadline: float, check_outputs: bool = True) -> StepResult:
        """One step on every rank: `inputs[rank]` a RankInput (every kind places one, so that a floor step moves
        what a timed step moves). `check_outputs` False: the harness's own rows, whose outputs mean nothing. Raises
        RankEnded or Missed."""
        self.seq += 1
        views = [self._views(c.views, case, inp.num_tokens) for c, inp in zip(self.channels, inputs)]
        self._prepare(case, views, inputs)
        clock = time.perf_counter_ns
        start = clock()
        # NOTES: every input is in place before the first `go`, so that the ranks start together (placing and
        # raising rank by rank started rank 3 milliseconds after rank 0 at world size 4 on H200s).
        self._place(case, views, inputs)
        hold = self.hold_cycles if kind == HELD else 0
        placed = clock()
        # NOTES: every rank's words first, then every pipe's byte: a spinning rank starts at its SEQ, so the ranks
        # start within a few µs of each other, where a pipe write between one rank's words and the next's put
        # (world size - 1) writes between the first rank's start and the last's.
        for channel, inp in zip(self.channels, inputs):
            channel.post(self.seq, kind, case, inp.num_tokens, hold)
        for channel in self.channels:
            channel.wake()
        self._wait(self.seq, deadline)
        outputs, copied = self._collect(views, clock)
        end = clock()
        if self.anatomy is not None:
            self._dissect(start, placed, end)
        result = self._result(kind, inputs, outputs, end - start, check_outputs)
        races = [stop - channel.field(DONE_AT_NS) for stop, channel in zip(copied, self.channels)]
        result.race_ns = max(races) if all(0 <= r <= result.window_ns for r in races) else math.nan
        result.gap_ns = math.nan if self.ended_ns is None else start - self.ended_ns
        self.ended_ns = end
        if kind == HELD:
            self.hold_cycles = next_hold_cycles(self.hold_cycles, result.held_ok)
        return result

    def _on_gpu(self) -> bool:
        return self.channels[0].gpu is not None

    def _prepare(self, case: int, views: list, inputs: list) -> None:
        """Before the clock: every output region cleared (NaN); on GPUs the step's inputs staged in the owner's own
        memory on each rank's GPU."""
        for channel, view, inp in zip(self.channels, views, inputs):
            if self._on_gpu():
                stage = self._views(channel.stage, case, inp.num_tokens)
                for name in ("x", "indices", "weights"):
                    stage[name].copy_(getattr(inp, name))
            view["out"].fill_(float("nan"))
        if self._on_gpu():
            self._synchronize()

    def _place(self, case: int, views: list, inputs: list) -> None:
        """Every rank's input into its regions: on GPUs its span of them (input_span) as one copy, GPU to GPU, from
        the staged ones; else CPU copies. NOTES: before, every step copied the whole input regions, sized for the
        largest case (3.7 MB), where the smallest shape needs 0.2 MB; the step anatomy's "place", this copy and its
        synchronize, was 29-56 µs at world size 1 on an H200 (b04a593)."""
        if self._on_gpu():
            hidden = self.cases[case]["hidden_dim"]
            for (shared, staged), channel, inp in zip(self.input_regions, self.channels, inputs):
                first, end = input_span(channel.regions, inp.num_tokens, hidden)
                span = end - first
                shared[:span].copy_(staged[:span])
            self._synchronize()
            return
        for view, inp in zip(views, inputs):
            for name in ("x", "indices", "weights"):
                view[name].copy_(getattr(inp, name))

    def _collect(self, views: list, clock) -> tuple:
        """Every output region copied into memory of the owner's own; and when each copy was complete."""
        import torch

        outputs, copied = [], []
        room = self.room if self.deferred is not None and not self.full() else None
        for rank, view in enumerate(views):
            into = room[rank][self.slot][:len(view["out"])] if room else torch.empty_like(view["out"])
            outputs.append(into.copy_(view["out"]))
            copied.append(clock())
        self.slot += room is not None
        if self._on_gpu():
            self._synchronize()
            copied = [clock()] * len(views)
        return outputs, copied

    def _result(self, kind: int, inputs: list, outputs: list, window: int, check_outputs: bool) -> StepResult:
        """What the step says: each output's problem (the rank's status, or the owner's check of its copy), and the
        ranks' own figures where they fit in the owner's window."""
        problems, calls, helds, held_ok = [], [], [], []
        for channel, inp, output in zip(self.channels, inputs, outputs):
            status = channel.field(STATUS)
            if kind == FLOOR or not check_outputs:
                problems.append(None)
            elif status:
                problems.append(OUTPUT_PROBLEMS.get(status, f"said its output was wrong (status {status})"))
            elif self.deferred is not None:
                self.deferred.append((self.deferred_steps, len(problems), output, inp.expected))
                problems.append(None)
            else:
                problems.append(check(output.cpu(), inp.expected))
            call, held = channel.real(CALL_NS), channel.real(HELD_NS)
            # NOTES: a rank's own figures are its word; one larger than the owner's window cannot be true, and one
            # under a nanosecond (0, a denormal) is no call's: logs of 1e-318 overflowed the clock's intervals (red
            # team 31).
            calls.append(call if 1 <= call <= window else float("nan"))
            helds.append(held if 1 <= held <= window else float("nan"))
            held_ok.append(bool(channel.field(HELD_OK)))
        self.deferred_steps += self.deferred is not None
        return StepResult(window, problems, calls, helds, held_ok)

    def slot_bytes(self, case: int) -> int:
        """The owner's room for one step's copies of case `case`, every rank's (defer)."""
        return len(self.channels) * self.cases[case]["max_num_tokens"] * self.cases[case]["hidden_dim"] * 2

    def defer(self, case: int, slots: int) -> None:
        """From the next step on, each output the owner copies is kept and checked in settle(), not after its step:
        the owner's check between two timed steps is time a rank could work unseen (red team 54: a 32 MiB zeroing
        moved after `done` lowered the human face's mean 9-26%). The copies go into room made now for `slots` steps
        of case `case` (full() once they are taken): kept copies each in memory of its own would allocate inside
        the steps' windows (on GPUs the caching allocator's cudaMalloc). A rank's own word on its output (`status`)
        is still read at once."""
        import torch

        args = self.cases[case]
        self.deferred, self.deferred_steps, self.slot = [], 0, 0
        self.room = [torch.empty((slots, args["max_num_tokens"], args["hidden_dim"]), dtype=torch.float16,
                                 device=self._views(channel.views, case, 1)["out"].device) for channel in self.channels]

    def full(self) -> bool:
        """Whether every slot of the room defer() made holds a kept copy (settle(again=True) empties it)."""
        return self.room is not None and self.slot >= len(self.room[0])

    def settle(self, again: bool = False) -> Optional[tuple]:
        """The outputs kept since defer() checked, in step order, and deferring ended (`again`: begun anew in the
        same room, its steps counted on): (step since defer, rank, its problem) for the first wrong one, else
        None."""
        kept, self.deferred, self.slot = self.deferred or [], [] if again else None, 0
        if not again:
            self.room = None
        return next(((step, rank, problem) for step, rank, output, expected in kept
                     if (problem := check(output.cpu(), expected))), None)

    def _dissect(self, start: int, placed: int, end: int) -> None:
        """Where a step's window went (profiling, ANATOMY_ENV): placing the inputs; from raising the first go until
        the last rank saw its go; the longest a rank took from its go to its done, and its parts (RANK_PARTS); from
        the last done to the end (the copies out). All but the first and the last rest on the ranks' stamps."""
        stamps = [[c.field(f) for f in (GO_SEEN_NS, CALL_FROM_NS, CALL_TO_NS, DONE_AT_NS, CPU_BEFORE_NS)]
                  for c in self.channels]
        # NOTES: a spinning rank sees its go while the owner still raises the others' (at world size 4 on H200s, 110
        # of 111 steps had rank 0's stamp before the last go was raised): the window of a go opens at the first.
        if all(placed <= g <= f <= t <= d <= end for g, f, t, d, _ in stamps):
            g, f, t, d, cpu = max(stamps, key=lambda s: s[3] - s[0])
            self.anatomy.append((placed - start, max(s[0] for s in stamps) - placed, d - g,
                                 end - max(s[3] for s in stamps), f - g, t - f, d - t,
                                 cpu if 0 <= cpu <= f - g else math.nan))  # more CPU than wall time cannot be true
        else:  # a stamp outside the owner's window cannot be true (red team 14: forged ones were shown as phases)
            self.anatomy.append((placed - start,) + (math.nan,) * 7)

    def anatomy_text(self) -> str:
        """The median of each phase over the steps so far, in µs (empty when not profiled); the phases that rest on
        the ranks' stamps over the steps whose stamps fit the owner's window, and how many did not."""
        if not self.anatomy:
            return ""
        import statistics

        def median_us(values: list) -> str:
            values = [v for v in values if v == v]
            return f"{statistics.median(values) / 1e3:.1f}" if values else "n/a"

        def part(i: int, name: str) -> str:
            return f"{name} {median_us([p[i] for p in self.anatomy])}"

        parts = ", ".join(part(len(ANATOMY_PHASES) + i, name) for i, name in enumerate(RANK_PARTS))
        parts = parts.replace(", ", f" ({part(len(ANATOMY_PHASES) + len(RANK_PARTS), CPU_PART)}), ", 1)
        phases = ", ".join(part(i, name) + (f" ({parts})" if name == "rank" else "")
                           for i, name in enumerate(ANATOMY_PHASES))
        outside = sum(1 for p in self.anatomy if p[1] != p[1])
        note = f"; {outside} with ranks' stamps outside the owner's window, left out of wake, rank and collect"
        return f"{phases} µs (p50 of {len(self.anatomy)} steps{note if outside else ''})"

    def _synchronize(self) -> None:
        import torch

        for gpu in sorted({channel.copier for channel in self.channels}):
            torch.cuda.synchronize(gpu)

    def _wait(self, seq: int, deadline: float) -> None:
        pending = set(range(len(self.channels)))
        spin_until = time.perf_counter_ns() + self.spin_ns
        while True:
            pending = {r for r in pending if self.channels[r].field(DONE) != seq}
            if not pending:
                break
            if time.perf_counter_ns() < spin_until:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise Missed(sorted(pending))
            events = self.poller.poll(min(left, 0.5) * 1e3)
            if any(fd in self.watch for fd, _ in events):
                raise RankEnded()
            hung_up = {fd for fd, flags in events if flags & select.POLLHUP}  # a rank's end of `done` closed
            for channel in self.channels:
                channel.drain()
            if any(self.channels[r].done_read in hung_up and self.channels[r].field(DONE) != seq for r in pending):
                raise RankEnded()
        for channel in self.channels:
            channel.drain()

    def stop(self) -> None:
        self.seq += 1
        for channel in self.channels:
            channel.go(self.seq, STOP, 0, 0)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
