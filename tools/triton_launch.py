#!/usr/bin/env python3
"""What launching a Triton version costs on the host, and whether torch's symmetric memory could hold its heap.

`cost`: host µs per call of v7's kernel launched three ways, each rank calling in lockstep (every call is a real
all-to-all at world size N, `benchmarks:0`-sized): Triton's default launch (`kernel[grid](...)`: argument binding,
specialization key, cache lookup, under a device guard since the runner never sets the device), the cached compiled
kernel's launcher called directly (what v7 does), and v7's whole `custom_kernel` (the direct launch plus the Python
around it). Host time = wall time of `--calls` back-to-back calls / calls (no synchronize inside), median over
`--rounds`, slowest rank.

`symm`: torch's symmetric memory under the runner's process model (no set_device, the group joined with
device_id): allocate on the input's device, rendezvous, store into a peer's buffer, read it back there; then leave
the group and do it again in a new group with the GPUs reassigned (as the runner's next case may).

    python -m tools.triton_launch cost [--version v7] [--world-size 2] [--calls 200] [--rounds 7]
    python -m tools.triton_launch symm [--world-size 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import eval as core
from a2a import plan as planning
from a2a import cli
from a2a.launch import parallel_launch


def _per_call_us(call, calls: int, rounds: int, device_index: int) -> float:
    import torch
    import torch.distributed as dist

    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize(device_index)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize(device_index)
    return statistics.median(samples)


def _cost_rank(rank: int, world_size: int, path: str, args: dict, calls: int, rounds: int) -> dict:
    import torch

    from reference import generate_input

    module = planning.load_version(Path(path), "triton_version")
    data = generate_input(**args, rank=rank)
    module.custom_kernel(data)
    state, (_, rank_data, _, _) = module._state, data
    x, indices, weights = rank_data.x, rank_data.indices, rank_data.weights
    num_warps = module.LAUNCH_SHAPE[1] // (64 if module.HIP else 32)

    def default_launch():
        state.epoch += 1
        with torch.cuda.device(state.device):
            module.all2all_kernel[(state.grid,)](x, indices, weights, x.shape[0], state.epoch, *state.fixed,
                                                 num_warps=num_warps)

    def direct_launch():
        state.run(x, indices, weights)

    def whole_call():
        module.custom_kernel(data)

    default_launch()  # the JIT path's own first call (its key and binder)
    return {name: _per_call_us(fn, calls, rounds, state.index) for name, fn in
            (("triton default launch", default_launch), ("direct launch (v7)", direct_launch),
             ("custom_kernel (v7)", whole_call))}


def _symm_rank(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from eval import rank_device

    results = {}
    for round_name, device_index in (("first group", rank), ("next group, GPUs reassigned",
                                                              (rank + 1) % world_size)):
        device = torch.device("cuda", device_index)
        if round_name != "first group":  # rank 0 holds the next group's store on a port the OS gives it
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) if rank == 0 else None
            port = torch.tensor([store.port if store else 0], device=rank_device(rank))
            dist.broadcast(port, 0)
            dist.destroy_process_group()
            store = store or dist.TCPStore("127.0.0.1", int(port.item()), is_master=False)
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, device_id=device)
        try:
            buffer = symm_mem.empty(1024, dtype=torch.int32, device=device)
            handle = symm_mem.rendezvous(buffer, dist.group.WORLD)
            buffer.fill_(-1)
            dist.barrier()
            peer = (rank + 1) % world_size
            handle.get_buffer(peer, (1024,), torch.int32).fill_(100 + rank)
            torch.cuda.synchronize(device)
            dist.barrier()
            got = int(buffer[0].item())
            expected = 100 + (rank - 1) % world_size
            results[round_name] = ("ok" if got == expected else f"read {got}, expected {expected}") \
                + f"; current device cuda:{torch.cuda.current_device()}"
        except Exception as exc:  # the finding is the message
            results[round_name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("cost", "symm"))
    parser.add_argument("--version", default="v7")
    cli.add_options(parser, "world-size", "cases", world_size={"type": int, "default": 2},
                    cases={"default": "benchmarks:0"})
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    import torch

    if torch.cuda.device_count() < args.world_size:
        raise core.UserError(f"needs {args.world_size} GPUs; this machine has {torch.cuda.device_count()}")
    if args.what == "symm":
        for rank, found in enumerate(parallel_launch(args.world_size, _symm_rank, backend="nccl")):
            for round_name, outcome in found.items():
                print(f"rank {rank}, {round_name}: {outcome}")
        return 0
    plan = planning.make_plan(args.version, args.cases, args.world_size, "nccl")
    rows = parallel_launch(args.world_size, _cost_rank, str(plan.version), plan.cases[0].args, args.calls,
                           args.rounds, backend="nccl", reach=(plan.version,))
    print(f"host µs per call, {plan.version.stem}, {plan.cases[0].spec}, world size {args.world_size}, "
          f"{args.calls} calls x {args.rounds} rounds, median round, slowest rank")
    for name in rows[0]:
        print(f"  {name:24s} {max(row[name] for row in rows):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
