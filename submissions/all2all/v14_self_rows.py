#!POPCORN leaderboard amd-all2all
#!POPCORN gpu MI300x8
"""v14 - v11 with a rank's rows to itself kept inside the program that routed them: no flag, no wait, no release
for the own-rank lane, and none at all at world size 1.

v11 traced at world size 1 on an H200 (2026-11-29, traces/..._ws1_v11_range_flags_*_6a9abc7) spends its kernel in
flags: raise_flags (two batched releases at system scope), wait_range and wait_combined, while every one of those
flags is one a program raises for itself (receiver program q reads source program q's range, and the source is
itself). v14 keeps v11's route, rows, metas, expert counters, reduce order, native entry and driver launch, and
changes who waits for whom:
- a program's range at its own rank comes from its own route table; its rows still go through the heap (the
  expert side's layout is v11's), ordered by the program's barrier, not by a flag;
- a token is reduced by the program that sent its (token, own rank) item, which also received that row and stored
  its combined row: its own-rank row needs no home flag, and each program still reduces one contiguous run;
- the releases leave out the own-rank lane; at world size 1 there is none (a constexpr), only the barriers;
- the range words alternate by call parity (v13's fix): a source that sent a receiver nothing runs at most one
  call ahead of it, and must not overwrite the word the receiver has not read.
The trace build's phases are v11's and own_rows (a program's rows from its own range, before any wait): route,
send_row, raise_flags, own_rows, wait_range, row_in_and_home, wait_combined, reduce.
"""
import contextlib
import ctypes
import os
import re
import sys
import threading
import time
from inspect import signature

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline
from triton.language.extra import cuda as tl_cuda

TRACE = os.environ.get("A2A_TRACE") == "1"
# In the order each (program, warp) first enters them (raise_flags again after the rows sent home).
TRACE_PHASES = ("all2all", "all2all.route", "all2all.send_row", "all2all.raise_flags", "all2all.own_rows",
                "all2all.wait_range", "all2all.row_in_and_home", "all2all.wait_combined", "all2all.reduce")
TRACE_CAPACITY = 1 << 20  # records per rank between two trace_take() calls
PH_ALL2ALL = tl.constexpr(TRACE_PHASES.index("all2all"))
PH_ROUTE = tl.constexpr(TRACE_PHASES.index("all2all.route"))
PH_SEND_ROW = tl.constexpr(TRACE_PHASES.index("all2all.send_row"))
PH_WAIT_RANGE = tl.constexpr(TRACE_PHASES.index("all2all.wait_range"))
PH_OWN_ROWS = tl.constexpr(TRACE_PHASES.index("all2all.own_rows"))
PH_ROW_IN_AND_HOME = tl.constexpr(TRACE_PHASES.index("all2all.row_in_and_home"))
PH_WAIT_COMBINED = tl.constexpr(TRACE_PHASES.index("all2all.wait_combined"))
PH_REDUCE = tl.constexpr(TRACE_PHASES.index("all2all.reduce"))
PH_RAISE_FLAGS = tl.constexpr(TRACE_PHASES.index("all2all.raise_flags"))
TRACE_RECORDS = tl.constexpr(TRACE_CAPACITY)
# (field, lowest bit, width) of the give-up word, as a2a/contract.py's GIVE_UP_FIELDS.
GIVE_UP_FIELDS = (("kind", 60, 4), ("peer", 52, 8), ("slot_plus_one", 28, 24), ("epoch", 0, 28))
(KIND_LOW, KIND_MASK), (PEER_LOW, PEER_MASK), (SLOT_LOW, SLOT_MASK), (EPOCH_LOW, EPOCH_MASK) = (
    (tl.constexpr(low), tl.constexpr((1 << width) - 1)) for _, low, width in GIVE_UP_FIELDS)
WAIT_KINDS = {1: "the row count", 2: "a dispatched row", 3: "a combined row"}
WAIT_COUNT = tl.constexpr(1)  # a source program's range word carries its row count
WAIT_COMBINED_ROW = tl.constexpr(3)


# ---------------------------------------------------------------------------------------------------------------
# Device code. The only vendor branches are on HIP (a constexpr): each compiles for one target only.
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def _now_ns(HIP: tl.constexpr):
    if HIP:
        # s_memrealtime counts at a constant 100 MHz on MI300X; it is a scalar-memory read (lgkmcnt).
        ticks = tl.inline_asm_elementwise("s_memrealtime $0\n s_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                          is_pure=False, pack=1)
        now = ticks * 10
    else:
        now = tl_cuda.globaltimer()
    return now


@triton.jit
def _stamp(TRACE_ON: tl.constexpr, HIP: tl.constexpr):
    if TRACE_ON:
        now = _now_ns(HIP)
    else:
        now = 0
    return now


@triton.jit
def _trace(trace_ptr, phase: tl.constexpr, start, TRACE_ON: tl.constexpr, HIP: tl.constexpr):
    """One record (phase, program << 16, start ns, end ns) after the record count at trace_ptr[0]."""
    if TRACE_ON:
        end = _now_ns(HIP)
        at = tl.atomic_add(trace_ptr, 1, sem="relaxed", scope="gpu")
        if at < TRACE_RECORDS:
            record = trace_ptr + 1 + 4 * at
            tl.store(record, phase)
            tl.store(record + 1, tl.program_id(0).to(tl.int64) << 16)
            tl.store(record + 2, start)
            tl.store(record + 3, end)


@triton.jit
def _backoff(HIP: tl.constexpr):
    if HIP:
        # 64 clocks between polls: a tight spin over xGMI livelocked MORI's kernels.
        tl.inline_asm_elementwise("s_sleep 1", "=s", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _poll(ptr, mask):
    """A relaxed system-scope read of a flag or count another GPU writes (an add of 0 that Triton emits as a load)."""
    return tl.atomic_add(ptr, 0, mask=mask, sem="relaxed", scope="sys")


@triton.jit
def _acquire(ptr, mask):
    """The read that ends a wait: later loads see what the writer stored before its release. Use its value."""
    return tl.atomic_add(ptr, 0, mask=mask, sem="acquire", scope="sys")


@triton.jit
def _order_own(HIP: tl.constexpr):
    """Orders every store the program made before it ahead of the program's own later loads (what no other program
    reads needs nothing more). NOTES: on gfx942 each wave first waits for its own stores to complete (a bare
    s_barrier does not); a program's waves share one compute unit and its write-through L1."""
    if HIP:
        tl.inline_asm_elementwise("s_waitcnt vmcnt(0)", "=s", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _publish(flag_ptr, value, mask, WORLD: tl.constexpr, HIP: tl.constexpr):
    """Raises a flag (or a vector of flags, where `mask` holds) after every store the program made before it.
    NOTES: the barrier (_order_own) orders all of them before the lanes that write the flags with release at system
    scope, each lane's release in parallel: one drain and one round trip over the link for the whole vector. With
    no peer there is no flag to raise, and no release: the barrier alone."""
    _order_own(HIP)
    if WORLD > 1:
        tl.atomic_xchg(flag_ptr, value, mask=mask, sem="release", scope="sys")


@triton.jit
def _give_up(abandon_ptr, report_ptr, kind: tl.constexpr, peer, slot, epoch):
    """The first wait to give up raises `abandon` and writes one packed record into mapped host memory."""
    first = tl.atomic_xchg(abandon_ptr, 1, sem="relaxed", scope="gpu")
    if first == 0:
        zero = tl.full([], 0, tl.int64)
        word = (((zero + kind) & KIND_MASK) << KIND_LOW) | (((zero + peer) & PEER_MASK) << PEER_LOW) \
            | (((zero + slot + 1) & SLOT_MASK) << SLOT_LOW) | (((zero + epoch) & EPOCH_MASK) << EPOCH_LOW)
        tl.atomic_xchg(report_ptr, word, sem="release", scope="sys")


@triton.jit
def _wait_flag(flag_ptr, epoch, abandon_ptr, report_ptr, timeout_ns, kind: tl.constexpr, peer, slot,
               HIP: tl.constexpr):
    """Waits until the flag holds `epoch`; gives up after timeout_ns (or at once once another wait has). Returns
    the acquired value: equal to epoch unless the wait gave up."""
    seen = _poll(flag_ptr, None)
    if seen != epoch:
        start = _now_ns(HIP)
        waiting = 1
        while waiting != 0:
            _backoff(HIP)
            seen = _poll(flag_ptr, None)
            if seen == epoch:
                waiting = 0
            elif _poll(abandon_ptr, None) != 0:
                waiting = 0
            elif _now_ns(HIP) - start > timeout_ns:
                _give_up(abandon_ptr, report_ptr, kind, peer, slot, epoch)
                waiting = 0
    return _acquire(flag_ptr, None)


@triton.jit
def _wait_range(range_ptr, epoch, abandon_ptr, report_ptr, timeout_ns, source, HIP: tl.constexpr):
    """Waits until a source program's range word holds this call's epoch ((epoch << 32) | first slot << 16 | rows);
    gives up after timeout_ns (or at once once another wait has). Returns the acquired word: its epoch is this
    call's unless the wait gave up."""
    seen = _poll(range_ptr, None)
    if (seen >> 32).to(tl.int32) != epoch:
        start = _now_ns(HIP)
        waiting = 1
        while waiting != 0:
            _backoff(HIP)
            seen = _poll(range_ptr, None)
            if (seen >> 32).to(tl.int32) == epoch:
                waiting = 0
            elif _poll(abandon_ptr, None) != 0:
                waiting = 0
            elif _now_ns(HIP) - start > timeout_ns:
                _give_up(abandon_ptr, report_ptr, WAIT_COUNT, source, -1, epoch)
                waiting = 0
    return _acquire(range_ptr, None)


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _heap(base, offset, dtype: tl.constexpr):
    """A typed pointer into a heap (its base as an integer); heap regions are 256-byte aligned."""
    return tl.multiple_of(tl.cast(base + offset, tl.pointer_type(dtype)), 16)


@triton.jit(do_not_specialize=["num_tokens", "epoch", "report_address", "rank", "timeout_ns"])
def all2all_kernel(x_ptr, indices_ptr, weights_ptr, num_tokens, epoch,
                   out_ptr, heap_bases, expert_count_ptr, abandon_ptr, expert_meta_ptr, route_ptr, report_address,
                   trace_ptr, rank, timeout_ns,
                   WORLD: tl.constexpr, W_BLOCK: tl.constexpr, TOPK: tl.constexpr, K_BLOCK: tl.constexpr,
                   HIDDEN: tl.constexpr, H_BLOCK: tl.constexpr, SLOTS: tl.constexpr, T_BLOCK: tl.constexpr,
                   N_LOCAL: tl.constexpr, NL_BLOCK: tl.constexpr, CAPACITY: tl.constexpr, META_INTS: tl.constexpr,
                   ROUTE_WORDS: tl.constexpr, PROGRAMS_MAX: tl.constexpr, DISP_X: tl.constexpr,
                   COMB_Y: tl.constexpr, DISP_META: tl.constexpr, SENT: tl.constexpr, HOME: tl.constexpr,
                   TRACE_ON: tl.constexpr, HIP: tl.constexpr):
    """One call: route, send, receive + expert + send home, reduce; the parts meet only through flags.
    Heap layout (byte offsets, the same on every rank; `SLOTS` = max tokens = rows one source sends one rank):
      DISP_X    [WORLD][SLOTS] rows   written by the source, read here: the receive buffer expert_meta points into
      COMB_Y    [WORLD][SLOTS] rows   one weighted row per token, written by the expert's rank
      DISP_META [WORLD][SLOTS] records of META_INTS int32: the global expert of each k that goes here (-1 for the
                                      others), then each k's weight bits, then the token
      SENT      [2][WORLD][PROGRAMS_MAX] int64 = (epoch << 32) | (first slot << 16) | rows, once that source's
                                      program has stored that range of its rows (and metas) here; by call parity
      HOME      [WORLD][PROGRAMS_MAX] int32 = epoch once that rank has stored home every combined row of the range
                                      this rank's program sent it
    NOTES: a program's share of (token, rank) items is a contiguous run of items in token order, so the slots it
    fills at one destination are one contiguous range: one flag says which. Receiver program q takes every source's
    program q's range, so every rank launches the same grid (agreed at build: P2PState.configure). The own rank's
    lane has no flags: its program q is the receiver of its own range, and a token is reduced by the program that
    sent its own-rank item, so those rows are ordered by the program's barriers alone. Range words alternate by
    call parity: a source that sent a receiver nothing can finish its call and start the next, but not finish it
    (it waits for that receiver's next range word), so one call ahead at most. Nothing else is reset between calls
    but the expert counters, which alternate by call parity: program 0 zeroes the next call's half (the previous
    call, complete, used it last). Every program must be resident at once (they wait on each other through peers):
    the grid is capped at what fits."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    t_kernel = _stamp(TRACE_ON, HIP)
    report_ptr = tl.cast(report_address, tl.pointer_type(tl.int64))  # mapped host memory
    my_base = tl.load(heap_bases + rank)
    tokens = tl.arange(0, T_BLOCK)
    ks = tl.arange(0, K_BLOCK)
    ranks = tl.arange(0, W_BLOCK)
    columns = tl.arange(0, H_BLOCK)
    in_row = columns < HIDDEN
    in_world = ranks < WORLD
    table = route_ptr + pid * ROUTE_WORDS  # this program's route table: [T_BLOCK][W_BLOCK] slots, then its ranges'
    # first slots and rows per destination

    # Route: bit d of a token's mask = it has a row for rank d; a row's slot = rows for d of earlier tokens. This
    # program's items (token * WORLD + rank) are [first_item, last_item): per destination, the rows of the items
    # before them are its range's first slot.
    t_route = _stamp(TRACE_ON, HIP)
    pairs = (tokens[:, None] < num_tokens) & (ks[None, :] < TOPK)
    experts = tl.load(indices_ptr + tokens[:, None] * TOPK + ks[None, :], mask=pairs, other=0)
    owners = tl.reduce(tl.where(pairs, tl.full([T_BLOCK, K_BLOCK], 1, tl.int64) << (experts // N_LOCAL).to(tl.int64), 0), 1,
                       _bit_or)
    rows = ((owners[:, None] >> ranks[None, :].to(tl.int64)) & 1).to(tl.int32)
    slots = tl.cumsum(rows, 0) - rows
    tl.store(table + tokens[:, None] * W_BLOCK + ranks[None, :], tl.where(rows != 0, slots, -1))
    items = num_tokens * WORLD
    first_item = pid * items // programs
    last_item = (pid + 1) * items // programs
    item_ids = tokens[:, None] * WORLD + ranks[None, :]
    range_first = tl.sum(tl.where(item_ids < first_item, rows, 0), 0)
    range_rows = tl.sum(tl.where((item_ids >= first_item) & (item_ids < last_item), rows, 0), 0)
    # Kept in the table and read back below in the ranks' own layout: a reduction's result handed straight to the
    # flags' vector is converted through shared memory (a store, a barrier, a load) inside _publish, after its
    # barrier and before the release (seen in the gfx942 assembly).
    tl.store(table + T_BLOCK * W_BLOCK + ranks, range_first)
    tl.store(table + T_BLOCK * W_BLOCK + W_BLOCK + ranks, range_rows)
    # The tokens this program reduces: those whose item (token, rank) is among its items.
    first_token = (first_item - rank + WORLD - 1) // WORLD
    last_token = (last_item - rank + WORLD - 1) // WORLD
    if pid == 0:
        locals_ = tl.arange(0, NL_BLOCK)
        tl.store(expert_count_ptr + ((epoch + 1) & 1) * N_LOCAL + locals_, 0, mask=locals_ < N_LOCAL)
    tl.debug_barrier()
    _trace(trace_ptr, PH_ROUTE, t_route, TRACE_ON, HIP)

    # Send: a present item is one row plus its meta; then one range word per destination (an empty range too: the
    # receiver learns it has nothing from this program), one release for all of them (_publish).
    for item in range(first_item, last_item):
        token = item // WORLD
        dst = item % WORLD
        slot = tl.load(table + token * W_BLOCK + dst)
        if slot >= 0:
            t_row = _stamp(TRACE_ON, HIP)
            dst_base = tl.load(heap_bases + dst)
            index = rank * SLOTS + slot
            row = tl.load(x_ptr + token * HIDDEN + columns, mask=in_row)
            tl.store(_heap(dst_base, DISP_X, tl.float16) + index * HIDDEN + columns, row, mask=in_row)
            pair_experts = tl.load(indices_ptr + token * TOPK + ks, mask=ks < TOPK, other=0)
            here = (ks < TOPK) & (pair_experts // N_LOCAL == dst)
            weights = tl.load(weights_ptr + token * TOPK + ks, mask=ks < TOPK, other=0.0)
            meta = _heap(dst_base, DISP_META, tl.int32) + index * META_INTS
            tl.store(meta + ks, tl.where(here, pair_experts, -1))
            tl.store(meta + K_BLOCK + ks, weights.to(tl.int32, bitcast=True))
            tl.store(meta + 2 * K_BLOCK, token)
            _trace(trace_ptr, PH_SEND_ROW, t_row, TRACE_ON, HIP)
    t_flags = _stamp(TRACE_ON, HIP)
    peers = in_world & (ranks != rank)
    parity = (epoch & 1) * WORLD * PROGRAMS_MAX
    dst_bases = tl.load(heap_bases + ranks, mask=peers, other=0)
    sent = tl.cast(dst_bases + SENT + (parity + rank * PROGRAMS_MAX + pid).to(tl.int64) * 8,
                   tl.pointer_type(tl.int64))
    range_first = tl.load(table + T_BLOCK * W_BLOCK + ranks)
    range_rows = tl.load(table + T_BLOCK * W_BLOCK + W_BLOCK + ranks)
    words = (epoch.to(tl.int64) << 32) | (range_first.to(tl.int64) << 16) | range_rows.to(tl.int64)
    _publish(sent, words, peers, WORLD, HIP)
    _trace(trace_ptr, PH_RAISE_FLAGS, t_flags, TRACE_ON, HIP)

    # Receive + expert + send home: every source's program-pid range, this rank's own first (its range from the
    # table: this program filled it), then the peers' in rank order from it (so that ranks do not all start on
    # source 0); no wait per row.
    expert_count = expert_count_ptr + (epoch & 1) * N_LOCAL
    scale = (1 + rank).to(tl.float32)
    for step in range(0, WORLD):
        src = (rank + step) % WORLD
        first_slot = tl.load(table + T_BLOCK * W_BLOCK + rank)
        count = tl.load(table + T_BLOCK * W_BLOCK + W_BLOCK + rank)
        if WORLD > 1:  # a constexpr: with no peer, no wait is compiled
            if step != 0:
                t_wait = _stamp(TRACE_ON, HIP)
                word = _wait_range(_heap(my_base, SENT, tl.int64) + parity + src * PROGRAMS_MAX + pid, epoch,
                                   abandon_ptr, report_ptr, timeout_ns, src, HIP)
                _trace(trace_ptr, PH_WAIT_RANGE, t_wait, TRACE_ON, HIP)
                arrived = (word >> 32).to(tl.int32) == epoch
                first_slot = ((word >> 16) & 0xffff).to(tl.int32)
                count = tl.where(arrived, (word & 0xffff).to(tl.int32), 0)
        src_base = tl.load(heap_bases + src)
        for slot in range(first_slot, first_slot + count):
            t_row = _stamp(TRACE_ON, HIP)
            index = src * SLOTS + slot
            meta = _heap(my_base, DISP_META, tl.int32) + index * META_INTS
            pair_experts = tl.load(meta + ks, mask=ks < TOPK, other=-1)
            weights = tl.load(meta + K_BLOCK + ks, mask=ks < TOPK, other=0).to(tl.float32, bitcast=True)
            token = tl.load(meta + 2 * K_BLOCK)
            here = pair_experts >= 0
            weight_sum = tl.sum(tl.where(here, weights, 0.0), 0)
            local = pair_experts - rank * N_LOCAL
            position = tl.atomic_add(expert_count + local, 1, mask=here, sem="relaxed", scope="gpu")
            entry = expert_meta_ptr + (local * CAPACITY + position) * 4
            tl.store(entry, tl.full([K_BLOCK], 0, tl.int32) + src, mask=here)
            tl.store(entry + 1, tl.full([K_BLOCK], 0, tl.int32) + slot, mask=here)
            tl.store(entry + 2, tl.full([K_BLOCK], 0, tl.int32) + token, mask=here)
            tl.store(entry + 3, ks, mask=here)
            received = tl.load(_heap(my_base, DISP_X, tl.float16) + index * HIDDEN + columns, mask=in_row)
            expert_out = (received.to(tl.float32) * scale).to(tl.float16)
            weighted = (expert_out.to(tl.float32) * weight_sum).to(tl.float16)
            home = rank * SLOTS + slot
            tl.store(_heap(src_base, COMB_Y, tl.float16) + home * HIDDEN + columns, weighted, mask=in_row)
            if step == 0:
                _trace(trace_ptr, PH_OWN_ROWS, t_row, TRACE_ON, HIP)
            else:
                _trace(trace_ptr, PH_ROW_IN_AND_HOME, t_row, TRACE_ON, HIP)
    # Every combined row of this program's ranges is stored: one home flag per source, one release for all.
    t_flags = _stamp(TRACE_ON, HIP)
    src_bases = tl.load(heap_bases + ranks, mask=peers, other=0)
    homes = tl.cast(src_bases + HOME + (rank * PROGRAMS_MAX + pid).to(tl.int64) * 4, tl.pointer_type(tl.int32))
    _publish(homes, epoch, peers, WORLD, HIP)
    _trace(trace_ptr, PH_RAISE_FLAGS, t_flags, TRACE_ON, HIP)

    # Reduce: the tokens whose own-rank item this program sent; a token's rows (one per rank it went to, already
    # weighted) are added in rank order, a peer's once the home flag of the program that sent it that row is up
    # (item i was sent by the program q with q * items // programs <= i < (q + 1) * items // programs), its own
    # rank's at once (this program stored it, before the barrier above).
    for token in range(first_token, last_token):
        total = tl.zeros([H_BLOCK], dtype=tl.float32)
        for dst in tl.static_range(WORLD):
            slot = tl.load(table + token * W_BLOCK + dst)
            if slot >= 0:
                ready = slot >= 0  # the own rank's row: this program stored it
                if WORLD > 1:
                    if dst != rank:
                        item = token * WORLD + dst
                        sender = ((item + 1) * programs + items - 1) // items - 1
                        t_wait = _stamp(TRACE_ON, HIP)
                        ready = _wait_flag(_heap(my_base, HOME, tl.int32) + dst * PROGRAMS_MAX + sender, epoch,
                                           abandon_ptr, report_ptr, timeout_ns, WAIT_COMBINED_ROW, dst, slot,
                                           HIP) == epoch
                        _trace(trace_ptr, PH_WAIT_COMBINED, t_wait, TRACE_ON, HIP)
                t_reduce = _stamp(TRACE_ON, HIP)
                row = tl.load(_heap(my_base, COMB_Y, tl.float16) + (dst * SLOTS + slot) * HIDDEN + columns,
                              mask=in_row & ready, other=0.0)
                total += row.to(tl.float32)
                # The own rank's row is traced only where it is the only one: among peers' rows its place differs
                # by rank, and the phases are named in the order of their first entry.
                if WORLD == 1:
                    _trace(trace_ptr, PH_REDUCE, t_reduce, TRACE_ON, HIP)
                elif dst != rank:
                    _trace(trace_ptr, PH_REDUCE, t_reduce, TRACE_ON, HIP)
        tl.store(out_ptr + token * HIDDEN + columns, total.to(tl.float16), mask=in_row)
    _trace(trace_ptr, PH_ALL2ALL, t_kernel, TRACE_ON, HIP)


# ---------------------------------------------------------------------------------------------------------------
# Shapes: the constexprs of one specialization, the heap layout, the runtime arguments' types.
# ---------------------------------------------------------------------------------------------------------------

MAX_WORLD = 32  # a token's ranks are bits of one int64 mask (and one register tile column each)
MAX_SLOTS = 1024  # the route is a [tokens, ranks] tile in registers
MAX_THREADS = 1024
PROGRAMS_MAX = 1024  # range and home flags per source (the grid is capped at it)
# Runtime arguments in kernel order (what tools/check_device.py compiles against without a GPU).
ARG_TYPES = {"x_ptr": "*fp16", "indices_ptr": "*i32", "weights_ptr": "*fp32", "num_tokens": "i32", "epoch": "i32",
             "out_ptr": "*fp16", "heap_bases": "*i64", "expert_count_ptr": "*i32", "abandon_ptr": "*i32",
             "expert_meta_ptr": "*i32", "route_ptr": "*i32", "report_address": "i64", "trace_ptr": "*i64",
             "rank": "i32", "timeout_ns": "i64"}
PER_CALL = ("x_ptr", "indices_ptr", "weights_ptr", "num_tokens", "epoch")  # the arguments a call changes, first
TRITON_KERNELS = {"all2all_kernel": ARG_TYPES}  # every kernel and its runtime arguments (make check-device)


def heap_layout(world: int, slots: int, hidden: int, topk: int) -> dict:
    """Byte offsets of the heap's regions (256-byte aligned) and its total size."""
    k_block = triton.next_power_of_2(topk)
    region = world * slots
    sizes = {"DISP_X": region * hidden * 2, "COMB_Y": region * hidden * 2,
             "DISP_META": region * meta_ints(k_block) * 4, "SENT": 2 * world * PROGRAMS_MAX * 8,
             "HOME": world * PROGRAMS_MAX * 4}
    layout, at = {}, 0
    for name, size in sizes.items():
        layout[name] = at
        at += (size + 255) // 256 * 256
    return {**layout, "total": at}


def meta_ints(k_block: int) -> int:
    return (2 * k_block + 1 + 3) // 4 * 4


def constants(num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int, world_size: int,
              trace: bool, hip: bool) -> dict:
    """The constexprs of the kernel for one shape and world size."""
    w_block, k_block = triton.next_power_of_2(world_size), triton.next_power_of_2(experts_per_token)
    t_block, n_local = triton.next_power_of_2(max_num_tokens), num_experts // world_size
    layout = heap_layout(world_size, max_num_tokens, hidden_dim, experts_per_token)
    return {"WORLD": world_size, "W_BLOCK": w_block, "TOPK": experts_per_token, "K_BLOCK": k_block,
            "HIDDEN": hidden_dim, "H_BLOCK": triton.next_power_of_2(hidden_dim), "SLOTS": max_num_tokens,
            "T_BLOCK": t_block, "N_LOCAL": n_local, "NL_BLOCK": triton.next_power_of_2(n_local),
            "CAPACITY": max_num_tokens * world_size, "META_INTS": meta_ints(k_block),
            "ROUTE_WORDS": t_block * w_block + 2 * w_block, "PROGRAMS_MAX": PROGRAMS_MAX,
            **{name: offset for name, offset in layout.items() if name != "total"},
            "TRACE_ON": trace, "HIP": hip}


# ---------------------------------------------------------------------------------------------------------------
# The native entry: custom_kernel in C. Python.h only; the launch is a function pointer handed over from ctypes
# (cuLaunchKernel and hipModuleLaunchKernel share one signature), so the source names neither vendor.
# ---------------------------------------------------------------------------------------------------------------

ENTRY = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define A2A_JOIN_(a, b) a##b
#define A2A_JOIN(a, b) A2A_JOIN_(a, b)
#define A2A_TEXT_(a) #a
#define A2A_TEXT(a) A2A_TEXT_(a)
#define A2A_BINDING "a2a v14 binding"

// (function, grid x y z, block x y z, shared bytes, stream, kernelParams, extra) -> the runtime's error code
typedef int (*LaunchFn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);

// What one loaded instance of the version has bound: the group's key, its launch and where each call writes.
// NOTES: the slots and the kernelParams array belong to `keep` (the Python launch object), held here so they live
// as long as the binding; pointer slots are 64-bit, num_tokens and epoch 32-bit (ARG_TYPES).
struct Binding {
  PyObject* slow_path;  // Python: slow_path(cfg, rank, world_size, x) builds or finds the group's state, binds it
  PyObject* cfg;        // the bound call's cfg (a reference: its identity is the hot path's first key)
  PyObject* keep;
  PyObject* views;      // tuple: views[n] = the output's first n rows
  PyObject* device;     // the device index, as torch's device and stream calls take it
  PyObject* exchange_device;
  PyObject* restore_device;
  PyObject* raw_stream;
  PyObject* error_text;  // error_text(code) -> the runtime's message
  long rank, world, index, slots, experts, topk, hidden;
  LaunchFn launch;
  void* function;
  unsigned grid, threads, shared;
  void** params;
  uint64_t *x_slot, *indices_slot, *weights_slot;
  int32_t *tokens_slot, *epoch_slot;
};

static PyObject *s_x, *s_indices, *s_weights, *s_shape, *s_data_ptr, *s_get_device;
static PyObject *s_num_experts, *s_experts_per_token, *s_hidden_dim, *s_max_num_tokens;

static void clear(Binding* b) {
  Py_CLEAR(b->cfg);
  Py_CLEAR(b->keep);
  Py_CLEAR(b->views);
  Py_CLEAR(b->device);
  Py_CLEAR(b->exchange_device);
  Py_CLEAR(b->restore_device);
  Py_CLEAR(b->raw_stream);
  Py_CLEAR(b->error_text);
}

static void destroy(PyObject* capsule) {
  Binding* b = (Binding*)PyCapsule_GetPointer(capsule, A2A_BINDING);
  clear(b);
  Py_CLEAR(b->slow_path);
  PyMem_Free(b);
}

// An int attribute's or call's value; -1 with an exception set on failure (check PyErr_Occurred).
static long long_of(PyObject* value) {
  if (!value) return -1;
  long out = PyLong_AsLong(value);
  Py_DECREF(value);
  return out;
}

static int failed(long value) { return value == -1 && PyErr_Occurred(); }

// The same shape as the bound call's, read from a new cfg object: then only the cfg reference changes.
static int same_shape(Binding* b, PyObject* cfg) {
  PyObject* names[4] = {s_num_experts, s_experts_per_token, s_hidden_dim, s_max_num_tokens};
  long bound[4] = {b->experts, b->topk, b->hidden, b->slots};
  for (int i = 0; i < 4; ++i) {
    long value = long_of(PyObject_GetAttr(cfg, names[i]));
    if (failed(value)) return -1;
    if (value != bound[i]) return 0;
  }
  return 1;
}

// tensor.data_ptr(); 0 or -1 with an exception set.
static int data_ptr(PyObject* tensor, uint64_t* out) {
  PyObject* value = PyObject_CallMethodNoArgs(tensor, s_data_ptr);
  if (!value) return -1;
  *out = PyLong_AsUnsignedLongLong(value);
  Py_DECREF(value);
  return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static int attribute_data_ptr(PyObject* holder, PyObject* name, uint64_t* out) {
  PyObject* tensor = PyObject_GetAttr(holder, name);
  if (!tensor) return -1;
  int status = data_ptr(tensor, out);
  Py_DECREF(tensor);
  return status;
}

// Binds the device, launches on torch's current stream of it, restores the device; 0 or -1 with an exception set.
static int launch_bound(Binding* b) {
  PyObject* previous = PyObject_CallOneArg(b->exchange_device, b->device);
  if (!previous) return -1;
  int err = 0;
  PyObject* stream = PyObject_CallOneArg(b->raw_stream, b->device);
  if (stream) {
    void* raw = PyLong_AsVoidPtr(stream);
    Py_DECREF(stream);
    if (!PyErr_Occurred())
      err = b->launch(b->function, b->grid, 1, 1, b->threads, 1, 1, b->shared, raw, b->params, NULL);
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // the device is restored whatever happened
  PyObject* restored = PyObject_CallOneArg(b->restore_device, previous);
  Py_DECREF(previous);
  if (type) {
    Py_XDECREF(restored);
    PyErr_Restore(type, value, traceback);
    return -1;
  }
  if (!restored) return -1;
  Py_DECREF(restored);
  if (err) {
    PyObject* text = PyObject_CallFunction(b->error_text, "i", err);
    if (text) {
      PyErr_Format(PyExc_RuntimeError, "v14: launching all2all_kernel failed: %S", text);
      Py_DECREF(text);
    }
    return -1;
  }
  return 0;
}

// custom_kernel(data): data = (cfg, rank_data, rank, world_size), as the runner passes it.
static PyObject* call_entry(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "custom_kernel(data) takes exactly one argument");
    return NULL;
  }
  Binding* b = (Binding*)PyCapsule_GetPointer(self, A2A_BINDING);
  if (!b) return NULL;
  PyObject* data = PySequence_Tuple(args[0]);
  if (!data) return NULL;
  PyObject *x = NULL, *shape = NULL, *result = NULL;
  if (PyTuple_GET_SIZE(data) != 4) {
    PyErr_Format(PyExc_ValueError, "v14: data must be (cfg, rank_data, rank, world_size), not %zd items",
                 PyTuple_GET_SIZE(data));
    goto done;
  }
  {
    PyObject *cfg = PyTuple_GET_ITEM(data, 0), *rank_data = PyTuple_GET_ITEM(data, 1);
    PyObject *rank = PyTuple_GET_ITEM(data, 2), *world = PyTuple_GET_ITEM(data, 3);
    x = PyObject_GetAttr(rank_data, s_x);
    if (!x) goto done;
    long rank_value = PyLong_AsLong(rank);
    if (failed(rank_value)) goto done;
    long world_value = PyLong_AsLong(world);
    if (failed(world_value)) goto done;
    long index = long_of(PyObject_CallMethodNoArgs(x, s_get_device));
    if (failed(index)) goto done;
    if (cfg != b->cfg) {
      int same = b->cfg && rank_value == b->rank && world_value == b->world && index == b->index
                 ? same_shape(b, cfg) : 0;
      if (same < 0) goto done;
      if (same) {  // the same group and shape: only the cfg reference changes
        PyObject* old = b->cfg;
        Py_INCREF(cfg);
        b->cfg = cfg;
        Py_DECREF(old);
      }
    }
    if (cfg != b->cfg || rank_value != b->rank || world_value != b->world || index != b->index) {
      PyObject* bound = PyObject_CallFunctionObjArgs(b->slow_path, cfg, rank, world, x, NULL);
      if (!bound) goto done;
      Py_DECREF(bound);
      if (cfg != b->cfg) {
        PyErr_SetString(PyExc_RuntimeError, "v14: the slow path did not bind this call's group");
        goto done;
      }
    }
    shape = PyObject_GetAttr(x, s_shape);
    if (!shape) goto done;
    long tokens = PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) == 2 ? PyLong_AsLong(PyTuple_GET_ITEM(shape, 0))
                                                                        : -2;
    if (failed(tokens)) goto done;
    if (tokens < 0 || tokens > b->slots) {
      PyErr_Format(PyExc_ValueError, "v14: x must be [tokens, hidden] with at most max_num_tokens=%ld tokens, not %S",
                   b->slots, shape);
      goto done;
    }
    uint64_t x_ptr, indices_ptr, weights_ptr;
    if (data_ptr(x, &x_ptr) || attribute_data_ptr(rank_data, s_indices, &indices_ptr)
        || attribute_data_ptr(rank_data, s_weights, &weights_ptr))
      goto done;
    *b->x_slot = x_ptr;
    *b->indices_slot = indices_ptr;
    *b->weights_slot = weights_ptr;
    *b->tokens_slot = (int32_t)tokens;
    *b->epoch_slot += 1;
    if (launch_bound(b)) goto done;
    result = PyTuple_GET_ITEM(b->views, tokens);
    Py_INCREF(result);
  }
done:
  Py_XDECREF(shape);
  Py_XDECREF(x);
  Py_DECREF(data);
  return result;
}

// bind(cfg, keep, views, device, exchange_device, restore_device, raw_stream, error_text, rank, world, slots,
//      experts, topk, hidden, launch, function, grid, threads, shared, params, x, indices, weights, tokens, epoch)
static PyObject* bind_group(PyObject* self, PyObject* args) {
  Binding* b = (Binding*)PyCapsule_GetPointer(self, A2A_BINDING);
  if (!b) return NULL;
  Binding next = *b;
  unsigned long long launch_fn, function, params, x, indices, weights, tokens, epoch;
  if (!PyArg_ParseTuple(args, "OOO!OOOOOllllllKKIIIKKKKKK", &next.cfg, &next.keep, &PyTuple_Type, &next.views,
                        &next.device, &next.exchange_device, &next.restore_device, &next.raw_stream,
                        &next.error_text, &next.rank, &next.world, &next.slots, &next.experts, &next.topk,
                        &next.hidden, &launch_fn, &function, &next.grid, &next.threads, &next.shared, &params, &x,
                        &indices, &weights, &tokens, &epoch))
    return NULL;
  if (PyTuple_GET_SIZE(next.views) != next.slots + 1) {
    PyErr_SetString(PyExc_ValueError, "v14: views must hold max_num_tokens + 1 outputs");
    return NULL;
  }
  next.index = PyLong_AsLong(next.device);
  if (failed(next.index)) return NULL;
  next.launch = (LaunchFn)(uintptr_t)launch_fn;
  next.function = (void*)(uintptr_t)function;
  next.params = (void**)(uintptr_t)params;
  next.x_slot = (uint64_t*)(uintptr_t)x;
  next.indices_slot = (uint64_t*)(uintptr_t)indices;
  next.weights_slot = (uint64_t*)(uintptr_t)weights;
  next.tokens_slot = (int32_t*)(uintptr_t)tokens;
  next.epoch_slot = (int32_t*)(uintptr_t)epoch;
  PyObject* held[8] = {next.cfg, next.keep, next.views, next.device, next.exchange_device, next.restore_device,
                       next.raw_stream, next.error_text};
  for (PyObject* object : held) Py_INCREF(object);
  clear(b);
  *b = next;
  Py_RETURN_NONE;
}

static PyObject* unbind_group(PyObject* self, PyObject*) {
  Binding* b = (Binding*)PyCapsule_GetPointer(self, A2A_BINDING);
  if (!b) return NULL;
  clear(b);
  Py_RETURN_NONE;
}

static PyMethodDef entry_methods[] = {
    {"custom_kernel", (PyCFunction)(void (*)(void))call_entry, METH_FASTCALL, "custom_kernel(data) -> output"},
    {"bind", bind_group, METH_VARARGS, "binds a group's state: the calls after it run in C"},
    {"unbind", unbind_group, METH_NOARGS, "drops the binding: the next call takes the slow path"},
};

// entry(slow_path) -> (custom_kernel, bind, unbind), sharing one binding.
static PyObject* entry(PyObject*, PyObject* slow_path) {
  Binding* b = (Binding*)PyMem_Calloc(1, sizeof(Binding));
  if (!b) return PyErr_NoMemory();
  Py_INCREF(slow_path);
  b->slow_path = slow_path;
  PyObject* capsule = PyCapsule_New(b, A2A_BINDING, destroy);
  if (!capsule) {
    Py_DECREF(slow_path);
    PyMem_Free(b);
    return NULL;
  }
  PyObject* functions = PyTuple_New(3);
  for (int i = 0; functions && i < 3; ++i) {
    PyObject* function = PyCFunction_New(&entry_methods[i], capsule);
    if (!function) Py_CLEAR(functions);
    else PyTuple_SET_ITEM(functions, i, function);
  }
  Py_DECREF(capsule);
  return functions;
}

static PyMethodDef module_methods[] = {
    {"entry", entry, METH_O, "entry(slow_path) -> (custom_kernel, bind, unbind)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, A2A_TEXT(TORCH_EXTENSION_NAME), NULL, -1, module_methods};

PyMODINIT_FUNC A2A_JOIN(PyInit_, TORCH_EXTENSION_NAME)(void) {
  const char* names[10] = {"x", "indices", "weights", "shape", "data_ptr", "get_device", "num_experts",
                           "experts_per_token", "hidden_dim", "max_num_tokens"};
  PyObject** interned[10] = {&s_x, &s_indices, &s_weights, &s_shape, &s_data_ptr, &s_get_device, &s_num_experts,
                             &s_experts_per_token, &s_hidden_dim, &s_max_num_tokens};
  for (int i = 0; i < 10; ++i)
    if (!(*interned[i] = PyUnicode_InternFromString(names[i]))) return NULL;
  return PyModule_Create(&module);
}
"""

# Each source includes what it needs (WORKLOG, cold starts): a torch without the switch adds its own headers, which
# costs build time, not correctness.
_ONLY_NAMED_HEADERS = ({"no_implicit_headers": True}
                       if "no_implicit_headers" in signature(load_inline).parameters else {})
# Built at import: under the runner, in every worker during the first case (torch lets one build, the rest wait).
_native = load_inline(name="a2a_v14_entry", cpp_sources=[ENTRY], extra_cflags=["-O3"], verbose=False,
                      **_ONLY_NAMED_HEADERS)


# ---------------------------------------------------------------------------------------------------------------
# Host side: the GPU runtime through ctypes (heap, IPC, mapped host word), the state of one group, the launch.
# ---------------------------------------------------------------------------------------------------------------

HIP = torch.version.hip is not None
SPIN_TIMEOUT_NS = int(float(os.environ.get("A2A_SPIN_TIMEOUT_S", "10")) * 1e9)
# Launch shape: (programs per multiprocessor, threads per program), scaled by the multiprocessor count read from the
# device and capped at what can be resident at once.
LAUNCH_SHAPE = (1, 512)


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_byte * 64)]  # cudaIpcMemHandle_t and hipIpcMemHandle_t: 64 opaque bytes


def _runtime_library() -> ctypes.CDLL:
    """The runtime torch loaded (its path read from this process's mappings), else the one the loader finds."""
    name = "libamdhip64.so" if HIP else "libcudart.so"
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if os.path.basename(line.split()[-1]).startswith(name)}
    for candidate in sorted(paths) + [name, name + ".13", name + ".12", name + ".6"]:
        with contextlib.suppress(OSError):
            return ctypes.CDLL(candidate)
    raise OSError(f"v14: no {name} to allocate the symmetric heap with")


class Runtime:
    """The few runtime calls the heap needs; each raises with the runtime's own message."""

    def __init__(self):
        self.lib = _runtime_library()
        prefix = "hip" if HIP else "cuda"
        self.fn = {name: getattr(self.lib, prefix + name) for name in (
            "SetDevice", "Malloc", "Memset", "Free", "IpcGetMemHandle", "IpcOpenMemHandle", "IpcCloseMemHandle",
            "HostGetDevicePointer", "GetErrorString")}
        self.fn["HostAlloc"] = getattr(self.lib, "hipHostMalloc" if HIP else "cudaHostAlloc")
        if HIP:
            self.fn["MallocFineGrained"] = self.lib.hipExtMallocWithFlags
        self.fn["GetErrorString"].restype = ctypes.c_char_p
        self.fn["IpcOpenMemHandle"].argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]

    def call(self, name: str, *args) -> None:
        err = self.fn[name](*args)
        if err != 0:
            raise RuntimeError(f"v14: {name} failed: {self.fn['GetErrorString'](err).decode()}")

    @contextlib.contextmanager
    def on(self, device: torch.device):
        """Binds `device` for torch and for this library (the same one unless torch links its runtime statically)."""
        with torch.cuda.device(device):
            self.call("SetDevice", device.index)
            yield

    def heap(self, device: torch.device, size: int) -> int:
        """Zeroed device memory peers can map; fine-grained on AMD (peers' stores are seen without cache flushes)."""
        ptr = ctypes.c_void_p()
        with self.on(device):
            if HIP:
                self.call("MallocFineGrained", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_uint(1))
            else:
                self.call("Malloc", ctypes.byref(ptr), ctypes.c_size_t(size))
            self.call("Memset", ptr, 0, ctypes.c_size_t(size))  # epochs start at 1: zero means "not yet"
        return ptr.value

    def export(self, device: torch.device, base: int) -> bytes:
        handle = _IpcHandle()
        with self.on(device):
            self.call("IpcGetMemHandle", ctypes.byref(handle), ctypes.c_void_p(base))
        return bytes(handle.reserved)

    def open(self, device: torch.device, handle: bytes) -> int:
        ptr, raw = ctypes.c_void_p(), _IpcHandle()
        ctypes.memmove(raw.reserved, handle, 64)
        with self.on(device):
            self.call("IpcOpenMemHandle", ctypes.byref(ptr), raw, ctypes.c_uint(1))  # lazy peer access
        return ptr.value

    def release(self, device: torch.device, peers: list, base: int) -> None:
        """Unmaps the peers' heaps and frees ours; errors are ignored (the group is over)."""
        with self.on(device):
            for peer in peers:
                self.fn["IpcCloseMemHandle"](ctypes.c_void_p(peer))
            self.fn["Free"](ctypes.c_void_p(base))

    def mapped_word(self, device: torch.device) -> tuple:
        """One zeroed 64-bit word of pinned host memory mapped for every device: (host address, device address)."""
        host, dev = ctypes.c_void_p(), ctypes.c_void_p()
        with self.on(device):
            self.call("HostAlloc", ctypes.byref(host), ctypes.c_size_t(8), ctypes.c_uint(3))  # portable | mapped
            ctypes.c_uint64.from_address(host.value).value = 0
            self.call("HostGetDevicePointer", ctypes.byref(dev), host, ctypes.c_uint(0))
        return host.value, dev.value



def param_count(kernel) -> int:
    """The parameters of a compiled Triton kernel as the GPU sees them: its runtime arguments, then what Triton's
    launcher appends (3.6: a global and a profile scratch pointer). Read from the compiled code: the PTX entry's
    .param list, or the AMDGPU metadata's explicit (not hidden_*) kernel arguments."""
    if "ptx" in kernel.asm:
        ptx = kernel.asm["ptx"]
        entry = ptx.index(".entry")
        return ptx[entry:ptx.index(")", entry)].count(".param")
    lines = kernel.asm["amdgcn"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == ".args:")
    depth = len(lines[start]) - len(lines[start].lstrip())
    count = 0
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= depth and not line.lstrip().startswith("-"):
            break  # the kernel's next metadata key: the argument list is over
        kind = re.match(r"\s*(?:- )?\.value_kind:\s+(\S+)", line)
        if kind and not kind.group(1).startswith("hidden_"):
            count += 1
    return count


class DriverLaunch:
    """One compiled kernel launched by the driver (cuLaunchKernel; hipModuleLaunchKernel on ROCm), from the native
    entry, on a kernelParams array built once: a slot per runtime argument (ARG_TYPES order, the kernel's), then null
    trailing pointers for what Triton's launcher would append. NOTES: kernelParams holds the slots' addresses, so
    the slots live as long as this object (the entry's binding holds it); a call writes slot values, never the
    array."""

    def __init__(self, kernel, arg_types: dict, grid: int, threads: int):
        library = _runtime.lib if HIP else ctypes.CDLL("libcuda.so.1")  # loaded by torch already
        self.lib = library
        self.address = ctypes.cast(library.hipModuleLaunchKernel if HIP else library.cuLaunchKernel,
                                   ctypes.c_void_p).value
        ctype = {"i32": ctypes.c_int32, "i64": ctypes.c_int64}
        self.slots = {name: ctype.get(kind, ctypes.c_uint64)() for name, kind in arg_types.items()}
        trailing = param_count(kernel) - len(self.slots)
        if trailing < 0:
            raise RuntimeError(f"v14: the compiled kernel takes fewer parameters than its {len(self.slots)} runtime "
                               "arguments")
        self.trailing = [ctypes.c_uint64(0) for _ in range(trailing)]
        values = list(self.slots.values()) + self.trailing
        self.params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(value) for value in values])
        self.function, self.grid, self.threads, self.shared = kernel.function, grid, threads, kernel.metadata.shared

    def set(self, **values) -> None:
        for name, value in values.items():
            self.slots[name].value = value

    def error_text(self, err: int) -> str:
        if HIP:
            self.lib.hipGetErrorString.restype = ctypes.c_char_p
            return self.lib.hipGetErrorString(err).decode()
        text = ctypes.c_char_p()
        self.lib.cuGetErrorString(err, ctypes.byref(text))
        return (text.value or b"error %d" % err).decode()


_runtime = None


class GiveUpReport:
    """The mapped host word a kernel writes when a spin-wait gives up, and a daemon thread that prints it at once.
    The kernel itself finishes (with wrong data, which the check then reports)."""

    def __init__(self, device: torch.device):
        self.host, self.device = _runtime.mapped_word(device)
        self.rank = -1
        self.word = ctypes.c_uint64.from_address(self.host)
        threading.Thread(target=self._watch, name="a2a-give-up-report", daemon=True).start()

    def _watch(self):
        while not self.word.value:
            time.sleep(0.02)
        record = self.word.value
        field = {name: (record >> low) & ((1 << width) - 1) for name, low, width in GIVE_UP_FIELDS}
        slot = field["slot_plus_one"] - 1
        where = "" if slot < 0 else f", slot {slot}"
        print(f"[a2a v14] rank {self.rank}: gave up after {SPIN_TIMEOUT_NS // 1_000_000} ms waiting for "
              f"{WAIT_KINDS.get(field['kind'], field['kind'])} from rank {field['peer']}{where} "
              f"(call {field['epoch']})", file=sys.stderr, flush=True)


_report = None


class _DeviceArray:
    """Raw device memory seen as a tensor (through __cuda_array_interface__), for the tests' look at the heap."""

    def __init__(self, ptr: int, shape: tuple, typestr: str):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3}


class P2PState:
    """One process group's symmetric heap, scratch, output buffer and compiled kernel. Built on the first call in a
    group (a collective: every rank builds at the same call); closed when the group is destroyed (the next group may
    put this process on another GPU) or when the shape changes.

    NOTES: it must hold no reference to the process group: a live group object keeps its TCP store listening on
    the rendezvous port, and the runner's next group, whose rank 0 may be another process, then fails with
    EADDRINUSE."""

    def __init__(self, key: tuple, cfg, rank: int, world_size: int, device: torch.device):
        if cfg.hidden_dim % 8:
            raise ValueError(f"v14 moves rows in 16-byte pieces: hidden_dim must be a multiple of 8, not "
                             f"{cfg.hidden_dim}")
        if world_size > MAX_WORLD:
            raise ValueError(f"v14 keeps a token's ranks in one 64-bit mask: at most {MAX_WORLD} ranks, not "
                             f"{world_size}")
        if cfg.max_num_tokens > MAX_SLOTS:
            raise ValueError(f"v14 routes in a register tile: max_num_tokens at most {MAX_SLOTS}, not "
                             f"{cfg.max_num_tokens}")
        self.key, self.device, self.index, self.rank = key, device, device.index, rank
        self.cfg, self.world_size = cfg, world_size  # what bind() hands the native entry
        self.slots, self.hidden = cfg.max_num_tokens, cfg.hidden_dim
        self.num_local_experts = cfg.num_experts // world_size
        self.capacity = cfg.max_num_tokens * world_size  # a source token reaches an expert at most once
        self.constants = constants(cfg.num_experts, cfg.experts_per_token, cfg.hidden_dim, cfg.max_num_tokens,
                                   world_size, TRACE, HIP)
        self.layout = heap_layout(world_size, self.slots, self.hidden, cfg.experts_per_token)
        self.base = _runtime.heap(device, self.layout["total"])
        mine = torch.frombuffer(bytearray(_runtime.export(device, self.base)), dtype=torch.uint8).to(device)
        handles = torch.empty(world_size, mine.numel(), dtype=torch.uint8, device=device)
        dist.all_gather_into_tensor(handles, mine)
        handles = handles.cpu()
        self.peers = {r: _runtime.open(device, bytes(handles[r].tolist())) for r in range(world_size) if r != rank}
        bases = [self.base if r == rank else self.peers[r] for r in range(world_size)]
        self.heap_bases = torch.tensor(bases, dtype=torch.int64, device=device)
        # scratch: expert_count [2][local experts] (by call parity), then abandon [1] (NOTES: set once by the first
        # wait that gives up, never reset: every later wait of this group returns at once)
        self.scratch = torch.zeros(2 * self.num_local_experts + 1, dtype=torch.int32, device=device)
        self.expert_meta = torch.empty(self.num_local_experts * self.capacity, 4, dtype=torch.int32, device=device)
        self.out = torch.empty(cfg.max_num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=device)
        self.views = tuple(self.out.narrow(0, 0, n) for n in range(self.slots + 1))  # a call returns views[tokens]
        self.trace = torch.zeros(1 + 4 * TRACE_CAPACITY if TRACE else 1, dtype=torch.int64, device=device)
        self.launch = None
        self.configure()
        dist.barrier()  # every peer has mapped every heap before anyone writes

    @property
    def epoch(self) -> int:
        """Calls of this group so far: the native entry counts them in the launch's epoch slot."""
        return self.launch.slots["epoch"].value

    def configure(self) -> None:
        """Compiles for LAUNCH_SHAPE's warps (cached on disk by Triton) and sizes the grid: programs per
        multiprocessor times the count, capped at what the compiled kernel lets be resident at once and agreed
        over the group. The native entry launches it once bound (bind)."""
        per_multiprocessor, threads = LAUNCH_SHAPE
        properties = triton.runtime.driver.active.utils.get_device_properties(self.index)
        warp = properties.get("warpSize", 64 if HIP else 32)
        num_warps = max(1, threads // warp)
        multiprocessors = properties["multiprocessor_count"]
        route = torch.empty(1, dtype=torch.int32, device=self.device)
        x = torch.empty(1, self.hidden, dtype=torch.float16, device=self.device)
        indices = torch.empty(1, self.constants["TOPK"], dtype=torch.int32, device=self.device)
        weights = torch.empty(1, self.constants["TOPK"], dtype=torch.float32, device=self.device)
        with torch.cuda.device(self.device):
            kernel = all2all_kernel.warmup(x, indices, weights, 1, 1, *self._fixed(route), **self.constants,
                                           grid=(1,), num_warps=num_warps)
            kernel._init_handles()
        resident = multiprocessors * _blocks_per_multiprocessor(kernel, properties, warp, num_warps)
        grid = max(1, min(round(per_multiprocessor * multiprocessors), resident, PROGRAMS_MAX))
        # NOTES: receiver program q reads every source's program-q range, so every rank launches the same grid: the
        # least any rank can hold resident (a collective: every rank configures at the same point).
        agreed = torch.tensor([grid], dtype=torch.int64, device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        self.grid = int(agreed.item())
        self.route = torch.empty(self.grid * self.constants["ROUTE_WORDS"], dtype=torch.int32, device=self.device)
        calls = self.epoch if self.launch else 0  # flags carry the epoch: a new launch counts on from the last one
        self.launch = DriverLaunch(kernel, ARG_TYPES, self.grid, warp * num_warps)
        fixed = self._fixed(self.route)
        self.launch.set(epoch=calls, **{name: value.data_ptr() if isinstance(value, torch.Tensor) else value
                                        for name, value in zip(list(ARG_TYPES)[len(PER_CALL):], fixed)})

    def bind(self) -> None:
        """Hands this group, once built, to the native entry: the calls after it run no Python until the group,
        shape, rank or device changes."""
        cfg, launch = self.cfg, self.launch
        _entry_bind(cfg, launch, self.views, self.index, torch.cuda._exchange_device,
                    torch.cuda._maybe_exchange_device, torch._C._cuda_getCurrentRawStream, launch.error_text,
                    self.rank, self.world_size, self.slots, cfg.num_experts, cfg.experts_per_token, self.hidden,
                    launch.address, launch.function, launch.grid, launch.threads, launch.shared,
                    ctypes.addressof(launch.params), *(ctypes.addressof(launch.slots[name]) for name in PER_CALL))

    def _fixed(self, route: torch.Tensor) -> tuple:
        """The arguments after the per-call ones (PER_CALL), in kernel order, without the constexprs."""
        abandon = self.scratch[2 * self.num_local_experts:]
        return (self.out, self.heap_bases, self.scratch, abandon, self.expert_meta, route, _report.device, self.trace,
                self.rank, SPIN_TIMEOUT_NS)

    def expert_counts(self) -> torch.Tensor:
        """Rows the last call laid out per local expert (its counters, by call parity)."""
        start = (self.epoch & 1) * self.num_local_experts
        return self.scratch[start:start + self.num_local_experts].cpu()

    def dispatched(self) -> tuple:
        """What the last call dispatched to this rank's experts: (rows per local expert, meta [local experts,
        capacity, 4] of (src, slot, token, k), rows [local experts, capacity, hidden] gathered from the receive
        buffer through the meta). For tests: the kernel itself copies no row per expert."""
        counts, meta = self.expert_counts(), self.expert_meta.view(self.num_local_experts, self.capacity, 4)
        rows = self.constants["WORLD"] * self.slots
        received = torch.as_tensor(_DeviceArray(self.base + self.layout["DISP_X"], (rows, self.hidden), "<f2"),
                                   device=self.device)
        where = (meta[..., 0].long() * self.slots + meta[..., 1].long()).clamp(0, rows - 1)
        return counts, meta, received[where.view(-1)].view(self.num_local_experts, self.capacity, -1)

    def close(self):
        torch.cuda.synchronize(self.device)
        _runtime.release(self.device, list(self.peers.values()), self.base)


def _blocks_per_multiprocessor(kernel, properties: dict, warp: int, num_warps: int) -> int:
    """How many programs of the compiled kernel fit on one multiprocessor (registers, shared memory, threads)."""
    threads = warp * num_warps
    fits = [max(1, 2048 // threads)]
    if kernel.n_regs:
        fits.append(properties["max_num_regs"] // (kernel.n_regs * threads))
    if kernel.metadata.shared:
        fits.append(properties["max_shared_mem"] // kernel.metadata.shared)
    return max(1, min(fits))


_state = None
_state_key = None


def _close_state() -> None:
    global _state, _state_key
    _entry_unbind()  # before the heap goes: no call may launch on it
    if _state is not None:
        _state.close()
        _state = _state_key = None


def _new_state(key: tuple, cfg, rank: int, world_size: int, device: torch.device) -> P2PState:
    global _state, _state_key, _report, _runtime
    _close_state()
    if _runtime is None:
        _runtime = Runtime()
    if _report is None:
        _report = GiveUpReport(device)
    _report.rank = rank
    _state = P2PState(key, cfg, rank, world_size, device)
    _state_key = key
    return _state


def configure(launch_shape=None) -> None:
    """Changes the launch shape, for this group's state too (tools/sweep_launch.py); with a group, every rank
    calls it at the same point (the grid is agreed over the group)."""
    global LAUNCH_SHAPE
    LAUNCH_SHAPE = launch_shape if launch_shape is not None else LAUNCH_SHAPE
    if _state is not None:
        _state.configure()
        _state.bind()


def trace_take() -> torch.Tensor:
    """Trace build only: the records since the last take, int64 [n, 4] (phase index into TRACE_PHASES,
    program << 16, start ns, end ns on this GPU's clock); empties the buffer."""
    buffer = _state.trace
    count = min(int(buffer[0].item()), TRACE_CAPACITY)
    records = buffer[1:1 + 4 * count].view(count, 4).cpu()
    buffer[0].zero_()
    return records


def _destroy_process_group_and_heap(*args, **kwargs):
    _close_state()
    return _destroy_process_group(*args, **kwargs)


# The runner reuses processes across groups: a group's heap must go with the group.
_destroy_process_group = dist.destroy_process_group
dist.destroy_process_group = _destroy_process_group_and_heap


def inspect() -> dict:
    """What the last call dispatched to this rank's experts (the version protocol): 'counts' (rows per local
    expert), 'meta' [local experts, capacity, 4] of (src, slot, token, k), 'rows' [local experts, capacity, hidden]
    gathered from the receive buffer through the meta. For tests; the kernel copies no row per expert."""
    counts, meta, rows = _state.dispatched()
    return {"counts": counts, "meta": meta, "rows": rows}


def _bind_group(cfg, rank: int, world_size: int, x: torch.Tensor) -> None:
    """The entry's slow half, called from C for a call that is not the bound group's (the first of a group, another
    shape, rank or device): the group's state for this call's key, built (a collective) when the whole key differs,
    bound with this call's cfg."""
    if x.get_device() < 0:
        raise ValueError("v14: the inputs must be on a GPU")
    key = (rank, world_size, x.get_device(), cfg.num_experts, cfg.experts_per_token, cfg.hidden_dim,
           cfg.max_num_tokens)
    state = _state if key == _state_key else _new_state(key, cfg, rank, world_size, x.device)
    state.cfg = cfg
    state.bind()


_entry = _native.entry(_bind_group)  # custom_kernel, bind, unbind: three functions sharing one binding
custom_kernel = _entry[0]  # the native entry itself: no Python frame between the runner's call and the launch
_entry_bind, _entry_unbind = _entry[1], _entry[2]
