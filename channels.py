"""The channel between the owner and one rank: a shared buffer (a header of words, then the input and output
regions) and two pipes whose bytes only wake the reader. The owner's end (`Channel`) is the judge's; the rank's end
(`RankChannel`) runs in the rank, the submission's process, so nothing in it is trusted: the owner reads the header's
rank words (its status, its own figures, its stamps) as the rank's word only (judge.Steps).
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Optional

from boundary import sealed_file

# A step's kind, in the shared header: what the rank does between `go` and `done`.
CALL, HELD, FLOOR, STOP = 0, 1, 2, 3

# The header: the owner writes seq..tokens, the rank done..held_ok. Plain stores; the pipes' system calls order them.
HEADER_BYTES = 128  # seq kind case tokens hold_cycles | done status call_ns held_ns held_ok done_at_ns go_seen_ns
#                    call_from_ns call_to_ns cpu_before_ns (the rank's stamps around its call, and its thread's CPU
#                    time from its go to its call: read only by the step anatomy)
(SEQ, KIND, CASE, TOKENS, HOLD_CYCLES, DONE, STATUS, CALL_NS, HELD_NS, HELD_OK, DONE_AT_NS, GO_SEEN_NS, CALL_FROM_NS,
 CALL_TO_NS, CPU_BEFORE_NS) = range(15)
_FIELD = struct.Struct("<q")
_REAL = struct.Struct("<d")
ALIGN = 256


def _offset(field: int) -> int:
    return 8 * field


def layout(cases: list) -> dict:
    """Byte offsets of the regions for the largest of `cases`, in this order: indices, weights, x, out; and the total
    size. The small regions come first, so that a step's input is one short span from the first region to the end
    of its x (`input_span`), whatever the largest case."""
    tokens = max(c["max_num_tokens"] for c in cases)
    hidden = max(c["hidden_dim"] for c in cases)
    topk = max(c["experts_per_token"] for c in cases)
    sizes = {"indices": tokens * topk * 4, "weights": tokens * topk * 4, "x": tokens * hidden * 2,
             "out": tokens * hidden * 2}
    offsets, at = {}, HEADER_BYTES
    for name, size in sizes.items():
        offsets[name] = at
        at += -(-size // ALIGN) * ALIGN
    return dict(offsets, total=at)


class Views:
    """Typed views of a channel's regions for one case's step (either side): `memory` a uint8 tensor over the
    whole channel, the shared host buffer or the shared GPU buffer."""

    def __init__(self, memory, regions: dict):
        self.raw_all = memory
        self.raw = {name: memory[regions[name]:regions[name] + size] for name, size in _sizes(regions).items()}

    def tensors(self, tokens: int, hidden: int, topk: int) -> dict:
        import torch

        shapes = {"x": ((tokens, hidden), torch.float16), "indices": ((tokens, topk), torch.int32),
                  "weights": ((tokens, topk), torch.float32), "out": ((tokens, hidden), torch.float16)}
        return {name: self.raw[name][:shape[0] * shape[1] * dtype.itemsize].view(dtype).view(shape)
                for name, (shape, dtype) in shapes.items()}


def _host_bytes(memory: mmap.mmap):
    import torch

    return torch.frombuffer(memory, dtype=torch.uint8)


INPUT_REGIONS = ("indices", "weights", "x")  # in layout order, then "out"


def input_span(regions: dict, tokens: int, hidden: int) -> tuple:
    """(first, end) byte offsets of a step's input: every input region up to the end of its x's `tokens` rows."""
    return regions[INPUT_REGIONS[0]], regions["x"] + tokens * hidden * 2


def _sizes(regions: dict) -> dict:
    names = INPUT_REGIONS + ("out",)
    ends = [regions[n] for n in names[1:]] + [regions["total"]]
    return {name: end - regions[name] for name, end in zip(names, ends)}


class _Header:
    """The shared buffer's header, read by either end (`memory`: the mapped buffer)."""
    memory: mmap.mmap

    def field(self, index: int) -> int:
        return _FIELD.unpack_from(self.memory, _offset(index))[0]

    def real(self, index: int) -> float:
        return _REAL.unpack_from(self.memory, _offset(index))[0]


class Channel(_Header):
    """The owner's end of one rank's channel: a shared buffer (header, input regions, output region) and two pipes,
    `go` (owner to rank) and `done` (rank to owner), whose bytes only wake the reader; the header says what happened.
    `gpu` (an index): the regions live on that GPU instead (the device transport, gpu_share.py), where the owner
    also keeps `stage`, its own copy of the input regions, filled before a step's clock starts; `copier`: the GPU
    whose context makes the owner's copies (the regions' own by default; another reaches them over its peer link).
    `for_rank()` gives the descriptors the rank gets (sent once, then closed here)."""

    def __init__(self, cases: list, gpu: Optional[int] = None, copier: Optional[int] = None):
        self.regions = layout(cases)
        self.gpu = gpu
        self.copier = gpu if copier is None else copier
        host_bytes = HEADER_BYTES if gpu is not None else self.regions["total"]
        self.fd = sealed_file(host_bytes)
        self.memory = mmap.mmap(self.fd, host_bytes)
        self.shared = self.stage = None
        if gpu is None:
            self.views = Views(_host_bytes(self.memory), self.regions)
        else:
            import torch

            import gpu_share

            self.shared = gpu_share.Buffer.create(gpu, self.regions["total"], user=self.copier)
            self.regions["gpu_bytes"] = self.shared.size
            self.views = Views(self.shared.tensor, self.regions)
            self.stage = Views(torch.empty(self.regions["total"], dtype=torch.uint8, device=f"cuda:{self.copier}"),
                               self.regions)
        self.go_read, self.go_write = os.pipe()
        self.done_read, self.done_write = os.pipe()
        os.set_blocking(self.done_read, False)
        os.set_blocking(self.go_write, False)  # a rank that never reads its bytes never holds the owner
        self._given = False
        self.exported = None

    def for_rank(self) -> list:
        if self.shared is not None and self.exported is None:
            self.exported = self.shared.export()
        return [self.fd, self.go_read, self.done_write] + ([self.exported] if self.shared is not None else [])

    def given(self) -> None:
        """The rank holds its descriptors now: this side's copies of its ends are closed (a dead rank then shows as
        end of file on `done`)."""
        if not self._given:
            for fd in (self.go_read, self.done_write) + ((self.exported,) if self.exported is not None else ()):
                os.close(fd)
            self._given = True

    def set(self, index: int, value: int) -> None:
        _FIELD.pack_into(self.memory, _offset(index), value)

    def go(self, seq: int, kind: int, case: int, tokens: int, hold_cycles: int = 0) -> None:
        self.post(seq, kind, case, tokens, hold_cycles)
        self.wake()

    def post(self, seq: int, kind: int, case: int, tokens: int, hold_cycles: int = 0) -> None:
        """The step's words, SEQ last: a spinning rank starts when it sees SEQ."""
        for index, value in ((KIND, kind), (CASE, case), (TOKENS, tokens), (HOLD_CYCLES, hold_cycles), (SEQ, seq)):
            self.set(index, value)

    def wake(self) -> None:
        """The pipe's byte, which wakes a rank blocked on it (a spinning one reads it by its `done`)."""
        try:
            os.write(self.go_write, b"g")
        except (BrokenPipeError, BlockingIOError):  # a rank that is gone, or that never reads: the wait says so
            pass

    def drain(self) -> None:
        """Empties the rank's `done` pipe of what it holds (a pipe holds at most 1 MiB), and no more: a rank writing
        as fast as the owner reads never holds it here (red team 27, from the code)."""
        try:
            for _ in range(32):
                if not os.read(self.done_read, 1 << 16):
                    return
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.given()
        self.memory.close()
        for fd in (self.fd, self.go_write, self.done_read):
            os.close(fd)
        if self.shared is not None:
            self.views = self.stage = None
            self.shared.close()


def copiers(gpus: list, count: int, choice, can_peer) -> list:
    """For each rank's GPU in `gpus` (of `count`), the GPU whose context makes the owner's copies of its regions
    (None: the rank's own). `choice`: None (default) a GPU no rank uses, else the next rank's; "next" the next rank's;
    "own"; or a GPU index. `can_peer(copier, gpu)`: whether copier's context reaches gpu's memory; one that cannot
    leaves the rank's own. NOTES: with the owner's context beside the rank's on one GPU the copy out took 2-3x longer
    (85-127 µs from another GPU, 225-309 µs from its own:
    results/2026-11-27_nvidia-h200_ws4_floor-experiment_5d82ef6), the GPU switching between the two processes'
    contexts."""
    if choice == "own":
        return [None] * len(gpus)
    spare = [g for g in range(count) if g not in gpus]
    chosen = []
    for index, gpu in enumerate(gpus):
        if isinstance(choice, int):
            copier = choice
        else:
            copier = spare[index % len(spare)] if spare and choice is None else (gpu + 1) % count
        chosen.append(copier if copier != gpu and can_peer(copier, gpu) else None)
    return chosen



# --------------------------------------------------------------------------------------------------------------
# The rank's end (runs in the rank: the submission's process; nothing here is trusted)
# --------------------------------------------------------------------------------------------------------------


class RankChannel(_Header):
    """A rank's end of its channel: waits for `go`, gives the step's input, publishes the output, says `done`.
    With a fourth descriptor the regions are on GPU `gpu` (the device transport); `close()` unmaps them."""

    def __init__(self, fds: list, regions: dict, gpu: Optional[int] = None):
        self.fd, self.go_read, self.done_write = fds[:3]
        self.shared = None
        if len(fds) > 3:
            import gpu_share

            self.memory = mmap.mmap(self.fd, HEADER_BYTES)
            self.shared = gpu_share.Buffer.open(fds[3], gpu, regions["gpu_bytes"])
            self.views = Views(self.shared.tensor, regions)
        else:
            self.memory = mmap.mmap(self.fd, regions["total"])
            self.views = Views(_host_bytes(self.memory), regions)
        self.seq = 0
        self.spin_ns = 0
        self.go_cpu_ns = 0
        self.owed = False  # a step's byte on `go` not read yet

    def close(self) -> None:
        if self.shared is not None:
            self.views = None
            self.shared.close()

    def wait(self) -> tuple:
        """(kind, case, tokens) of the next step; blocks until the owner says go (one byte on `go` per step)."""
        spin_until = time.perf_counter_ns() + self.spin_ns
        while self.field(SEQ) <= self.seq and time.perf_counter_ns() < spin_until:
            pass
        if self.field(SEQ) > self.seq:  # started by its words: the byte the owner writes after every rank's words
            self.owed = True  # is read at `done`, not waited for now
        elif not os.read(self.go_read, 1):
            return STOP, 0, 0
        self.seq = self.field(SEQ)
        self.stamp(GO_SEEN_NS)
        self.go_cpu_ns = time.thread_time_ns()
        return self.field(KIND), self.field(CASE), self.field(TOKENS)

    def stamp(self, field: int) -> None:
        """Now, into one of the rank's stamps (GO_SEEN_NS, CALL_FROM_NS, CALL_TO_NS, DONE_AT_NS); with CALL_FROM_NS,
        also the thread's CPU time since its go (CPU_BEFORE_NS: wall time well past it is time not on a CPU)."""
        _FIELD.pack_into(self.memory, _offset(field), time.perf_counter_ns())
        if field == CALL_FROM_NS:
            _FIELD.pack_into(self.memory, _offset(CPU_BEFORE_NS), time.thread_time_ns() - self.go_cpu_ns)

    def done(self, status: int, call_ns: float, held_ns: float, held_ok: bool) -> None:
        if self.owed:
            self.owed = False
            os.read(self.go_read, 1)
        _FIELD.pack_into(self.memory, _offset(STATUS), status)
        _REAL.pack_into(self.memory, _offset(CALL_NS), call_ns)
        _REAL.pack_into(self.memory, _offset(HELD_NS), held_ns)
        _FIELD.pack_into(self.memory, _offset(HELD_OK), int(held_ok))
        self.stamp(DONE_AT_NS)
        _FIELD.pack_into(self.memory, _offset(DONE), self.seq)
        os.write(self.done_write, b"d")
