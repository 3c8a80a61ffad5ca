"""Anchors and floors: what a user could run instead of a custom kernel, and the least a call can cost, timed by the
judge's clock exactly as the versions are (a2a/clock.py: fresh processes per round, in turn with the versions,
the same steps).

Each anchor moves the case's actual routed volume (one row per (token, k) whose expert lives on another rank, from
the case's own seed) twice, dispatch then combine, and does nothing else: no permutation, no expert, no weighted
sum. Split sizes are exchanged once before timing (a real user would pay for that too, so anchors are a floor for
these libraries, not a rival submission).

- nccl_a2a_x2: two `torch.distributed.all_to_all_single` (NCCL on NVIDIA, RCCL on AMD).
- nvshmem_a2a_vdev_x2: two `torch.ops.symm_mem.all_to_all_vdev` (NVSHMEM), where the build has it.
- empty_submission: a custom_kernel that returns a preallocated output of the right shape and does nothing else
  (never checked). It is the floor of a call as each number is timed: the call time of a call that launches
  nothing, the held device time of an event pair, and the leaderboard-style harness floor (clone, call,
  synchronize, barrier).
- handshake: the least a correct multi-rank call does: one launch that raises a flag at every peer and waits for
  every peer's flag, moving no data (a2a/probes.py, `Handshake`). With peers on their own GPUs, SOL here plus this
  row is the mark a version is held to (`mark_us`).

The two floors (FLOORS) need no peer to mean something, so they run at every world size on GPUs, 1 included, and
on shared GPUs (where, like every time there, they are not the problem's); the all-to-all anchors need peers on
their own GPUs. Every entry is called on the case's real input (cloned each step, as for a version), so its
leaderboard-style time includes the same clone.
"""
from __future__ import annotations

import dataclasses
import os
import warnings

ANCHORS = {
    "nccl_a2a_x2": "2x all_to_all_single (NCCL) of the routed volume",
    "nvshmem_a2a_vdev_x2": "2x symm_mem.all_to_all_vdev (NVSHMEM) of the routed volume",
    "empty_submission": "returns a preallocated output: the floor of a call",
    "handshake": "one launch, a flag to and from every peer, no data: the floor of a correct call",
}
KINDS = {"empty_submission": "empty", "handshake": "handshake"}  # the row kind of each entry; "anchor" where not named
FLOORS = ("empty_submission", "handshake")  # the entries that run at every world size (see above)


@dataclasses.dataclass
class Exchange:
    """One rank's side of the routed volume: rows it sends to each rank, rows it gets from each."""
    send_rows: list
    recv_rows: list
    hidden_dim: int
    num_tokens: int


def exchange_of(data, rank: int) -> Exchange:
    """One rank's side of a case's routed volume, its split sizes exchanged with the peers (a collective)."""
    import torch
    import torch.distributed as dist

    cfg, rank_data, _, world_size = data
    owner = rank_data.indices.long().reshape(-1) // (cfg.num_experts // world_size)
    send = torch.bincount(owner, minlength=world_size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return Exchange(send.tolist(), recv.tolist(), cfg.hidden_dim, rank_data.num_tokens)


def _nccl_call(exchange: Exchange, device):
    import torch
    import torch.distributed as dist

    h = exchange.hidden_dim
    rows_out = torch.randn(sum(exchange.send_rows), h, dtype=torch.float16, device=device)
    rows_in = torch.empty(sum(exchange.recv_rows), h, dtype=torch.float16, device=device)
    rows_back = torch.empty_like(rows_out)

    def call(_data):
        dist.all_to_all_single(rows_in, rows_out, exchange.recv_rows, exchange.send_rows)
        dist.all_to_all_single(rows_back, rows_in, exchange.send_rows, exchange.recv_rows)
        return rows_back

    return call, None


def _nvshmem_call(exchange: Exchange, device):
    """Two all_to_all_vdev on symmetric buffers sized for the case (splits in elements of flat float16 buffers).
    Handles both schemas torch has shipped: (input, out, in_splits, out_splits_offsets, group) and the older
    (input, out, in_out_splits, group)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    # torch's all_to_all_vdev kernel splits each peer's bytes evenly over grid / world blocks and asserts on a
    # remainder (seen here: a device assertion, both ranks aborted). 16 blocks per peer always divide a split of
    # whole rows (hidden_dim * 2 bytes is a multiple of 16). Read once per process, before the first call.
    os.environ.setdefault("TORCH_SYMMMEM_NBLOCKS", str(16 * len(exchange.send_rows)))
    if hasattr(symm_mem, "is_nvshmem_available") and not symm_mem.is_nvshmem_available():
        raise RuntimeError("this torch build has no NVSHMEM")
    if hasattr(symm_mem, "set_backend"):
        symm_mem.set_backend("NVSHMEM")
    group = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch; a no-op that warns each round in 2.11
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group)
    h, world = exchange.hidden_dim, len(exchange.send_rows)
    capacity = max(sum(exchange.send_rows), sum(exchange.recv_rows), 1)
    capacity = torch.tensor([capacity], device=device)
    dist.all_reduce(capacity, op=dist.ReduceOp.MAX)  # symmetric buffers must have the same size everywhere
    elements = int(capacity.item()) * h

    def buffer(shape, dtype):
        tensor = symm_mem.empty(shape, dtype=dtype, device=device)
        symm_mem.rendezvous(tensor, group)
        return tensor

    rows_out, rows_in, rows_back = (buffer(elements, torch.float16) for _ in range(3))
    rows_out.normal_()
    splits = torch.tensor([r * h for r in exchange.send_rows], dtype=torch.int64, device=device)
    op = torch.ops.symm_mem.all_to_all_vdev
    if len(op.default._schema.arguments) == 5:
        in_splits, back_splits = buffer(world, torch.int64), buffer(world, torch.int64)
        out_meta, back_meta = buffer((2, world), torch.int64), buffer((2, world), torch.int64)
        in_splits.copy_(splits)

        def call(_data):
            op(rows_out, rows_in, in_splits, out_meta, group)
            back_splits.copy_(out_meta[0])
            op(rows_in, rows_back, back_splits, back_meta, group)
            return rows_back
    else:
        there, back = buffer((3, world), torch.int64), buffer((3, world), torch.int64)
        there[0].copy_(splits)

        def call(_data):
            op(rows_out, rows_in, there, group)
            back[0].copy_(there[1])
            op(rows_in, rows_back, back, group)
            return rows_back

    return call, (rows_out, rows_in, rows_back)


def _empty_call(exchange: Exchange, device):
    import torch

    out = torch.empty(exchange.num_tokens, exchange.hidden_dim, dtype=torch.float16, device=device)
    return (lambda _data: out), None


_CALLS = {"nccl_a2a_x2": _nccl_call, "nvshmem_a2a_vdev_x2": _nvshmem_call, "empty_submission": _empty_call}


class CaseCalls:
    """An entry's call for several cases in one process, each case's own (its routed volume, its output shape), built
    from one input of each case. `close()` ends them all (a collective; raises if an entry's own check failed, as a
    handshake that gave up). `handshake`: the process's probes.Handshake where the caller holds one (and closes it)."""

    def __init__(self, name: str, inputs: list, rank: int, handshake=None):
        import eval as core

        self.by_case, self.keep = [], []
        with core.own_device(rank):
            if name == "handshake":  # one heap and one set of kernel arguments for every case (probes.Handshake)
                import torch
                import torch.distributed as dist

                from a2a import probes

                if handshake is None:
                    handshake = probes.Handshake(dist.get_rank(), dist.get_world_size())
                    self.keep.append(handshake)
                for data in inputs:
                    exchange = exchange_of(data, rank)
                    self.by_case.append(handshake.returning(torch.empty(
                        exchange.num_tokens, exchange.hidden_dim, dtype=torch.float16, device=core.rank_device(rank))))
                return
            for data in inputs:
                call, keep = _CALLS[name](exchange_of(data, rank), core.rank_device(rank))
                self.by_case.append(call)
                self.keep.append(keep)

    def for_case(self, index: int):
        return self.by_case[index]

    def close(self) -> None:
        """Closes every case's call (each close a collective, so every rank closes all of them in the same order),
        then raises the first failure, if any."""
        failures = []
        for keep in self.keep:
            if hasattr(keep, "close"):
                try:
                    keep.close()
                except Exception as exc:
                    failures.append(exc)
        self.keep = []
        if failures:
            raise failures[0]
