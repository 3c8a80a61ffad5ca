"""Speed of light of this machine: measured once per run, then applied to each case's actual routing.

Measured (`make sol`, or inside `make leaderboard` on GPUs; saved as sol.json beside the run's results):
- launch_us: device time per empty kernel, back to back; launch_sync_us: launch + synchronize, host round trip;
- one_way_latency_us: a remote flag store seen by a spinning reader on another GPU (ping-pong, half a round trip);
- a2a_store_gbps: kernel-driven stores into peers' memory when every rank writes to every other at once
  (dispatch's pattern), per GPU and direction, the slowest rank; also at 1 MiB per rank (a2a_store_gbps_1mib);
- pair_store_gbps: one rank writing to one other, alone;
- local_copy_gbps: device-to-device copy, bytes read plus written over time.

Model of a case (the routing its seed gives, generated exactly as the evaluator does):
    SOL = launch_us + 2 * one_way_latency_us + max(link_us, local_us)
    link_us  = max over ranks r of (rows r sends to other ranks + rows r receives from them) * row bytes
               / a2a_store_gbps     (full duplex: dispatch's sends and combine's returns share each direction)
    local_us = max over ranks r of (2 * tokens_r + rows received + rows returned) * row bytes / local_copy_gbps
One launch and two flag hops (dispatch's arrival, combine's arrival) cannot be avoided; the rest overlaps at best.
Two variants: `routed` moves one row per (token, k) whose expert is on another rank; `dedup` moves one row per
(token, destination rank) and combine sends back one row per (token, rank), reduced on the expert's rank.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

from a2a import cli
from a2a import plan as planning
from eval import UserError

SOL_FILE = "sol.json"
STORE_BYTES_PER_RANK = 64 << 20
SMALL_STORE_BYTES_PER_RANK = 1 << 20


# --------------------------------------------------------------------------------------------------------------
# Measurement (GPU)
# --------------------------------------------------------------------------------------------------------------


def _per_peer(total: int, world_size: int) -> int:
    return max(total // max(world_size - 1, 1) // 16 * 16, 16)


def _measure_rank(rank: int, world_size: int) -> Optional[dict]:
    import eval as core

    with core.own_device(rank):  # every probe is this tool's own work on its rank's GPU
        return _measured(rank, world_size)


def _measured(rank: int, world_size: int) -> Optional[dict]:
    import torch
    import torch.distributed as dist

    import eval as core

    from a2a.probes import Probes, local_copy_gbps

    probes = Probes(rank, world_size, STORE_BYTES_PER_RANK)
    try:
        mine = {"launch_us": probes.launch_cost_us()}
        round_trips = []
        for _ in range(200):
            start = time.perf_counter_ns()
            probes.ext.empty_kernels(1)
            torch.cuda.synchronize()
            round_trips.append((time.perf_counter_ns() - start) / 1e3)
        mine["launch_sync_us"] = statistics.median(round_trips)
        mine["timer_step_ns"] = probes.timer_step_ns()
        mine["one_way_latency_us"] = probes.one_way_latency_us()
        everyone = list(range(world_size))
        others = {r: [d for d in everyone if d != r] for r in everyone}
        mine["a2a_store_gbps"] = probes.peer_store_gbps(everyone, others,
                                                        _per_peer(STORE_BYTES_PER_RANK, world_size))
        mine["a2a_store_gbps_1mib"] = probes.peer_store_gbps(everyone, others,
                                                             _per_peer(SMALL_STORE_BYTES_PER_RANK, world_size))
        mine["pair_store_gbps"] = probes.peer_store_gbps([0], {0: [1]}, _per_peer(STORE_BYTES_PER_RANK, 2))
        mine["local_copy_gbps"] = local_copy_gbps(core.rank_device(rank))
        mine["clock"] = probes.clock_offsets()[rank]
    finally:
        probes.close()
    gathered = [None] * world_size
    dist.all_gather_object(gathered, mine)
    if rank:
        return None
    finite = lambda key: [g[key] for g in gathered if g[key] == g[key]]  # noqa: E731 (NaN: ranks that had no part)
    return {
        "launch_us": statistics.median(finite("launch_us")),
        "launch_sync_us": statistics.median(finite("launch_sync_us")),
        "timer_step_ns": max(finite("timer_step_ns")),
        "one_way_latency_us": finite("one_way_latency_us")[0],
        "a2a_store_gbps": min(finite("a2a_store_gbps")),
        "a2a_store_gbps_1mib": min(finite("a2a_store_gbps_1mib")),
        "pair_store_gbps": finite("pair_store_gbps")[0],
        "local_copy_gbps": min(finite("local_copy_gbps")),
        "clock_offsets_ns": [g["clock"]["offset_ns"] for g in gathered],
        "clock_offset_errors_ns": [g["clock"]["error_ns"] for g in gathered],
        "per_rank": gathered,
    }


def measure(world_size: int, meta: dict) -> dict:
    """Runs the probes on `world_size` GPUs (NCCL) and returns the machine's figures with `meta` (device, date,
    commit) merged in."""
    from a2a.launch import parallel_launch

    if world_size < 2:
        raise ValueError("the speed-of-light probes need at least 2 GPUs")
    result = parallel_launch(world_size, _measure_rank, backend="nccl", timeout_s=600)[0]
    return {**meta, "world_size": world_size, **result}


# --------------------------------------------------------------------------------------------------------------
# Model (pure: unit-tested on hand-made routings)
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Routing:
    """Row counts between ranks for one case. routed[s][d]: (token, k) pairs of rank s whose expert lives on d;
    dedup[s][d]: tokens of rank s with at least one expert on d; tokens[s]: rank s's token count."""
    routed: list
    dedup: list
    tokens: list


def routing_matrices(indices_per_rank: list, num_local_experts: int, world_size: int) -> Routing:
    """From each rank's (tokens, topk) expert indices."""
    routed = [[0] * world_size for _ in range(world_size)]
    dedup = [[0] * world_size for _ in range(world_size)]
    tokens = []
    for src, indices in enumerate(indices_per_rank):
        rows = [[int(e) // num_local_experts for e in row] for row in indices]
        tokens.append(len(rows))
        for owners in rows:
            for dst in owners:
                routed[src][dst] += 1
            for dst in set(owners):
                dedup[src][dst] += 1
    return Routing(routed, dedup, tokens)


def routing_of_case(args: dict) -> Routing:
    """The case's routing, generated rank by rank as the evaluator does (cuda:rank on a GPU machine)."""
    from reference import generate_input

    indices = []
    for rank in range(args["world_size"]):
        _, rank_data, _, _ = generate_input(**args, rank=rank)
        indices.append(rank_data.indices.cpu().tolist())
    return routing_matrices(indices, args["num_experts"] // args["world_size"], args["world_size"])


def model(routing: Routing, hidden_dim: int, machine: dict) -> dict:
    """{variant: {fixed_us, link_us, local_us, total_us}} for `routed` and `dedup` (see the module text)."""
    row_bytes = hidden_dim * 2
    link_bytes_per_us = machine["a2a_store_gbps"] * 1e3
    local_bytes_per_us = machine["local_copy_gbps"] * 1e3
    fixed_us = machine["launch_us"] + 2 * machine["one_way_latency_us"]
    out = {}
    for variant in ("routed", "dedup"):
        rows = getattr(routing, variant)
        world = len(rows)
        sent = [sum(rows[r][d] for d in range(world) if d != r) for r in range(world)]
        received = [sum(rows[s][r] for s in range(world) if s != r) for r in range(world)]
        link_us = max((sent[r] + received[r]) * row_bytes for r in range(world)) / link_bytes_per_us
        local_us = max((2 * routing.tokens[r] + received[r] + sent[r]) * row_bytes
                       for r in range(world)) / local_bytes_per_us
        out[variant] = {"fixed_us": fixed_us, "link_us": link_us, "local_us": local_us,
                        "total_us": fixed_us + max(link_us, local_us)}
    return out


# --------------------------------------------------------------------------------------------------------------
# Files and the command
# --------------------------------------------------------------------------------------------------------------


def save(figures: dict, folder: Path) -> Path:
    """sol.json into a run's folder (made by its caller)."""
    path = folder / SOL_FILE
    path.write_text(json.dumps(figures, indent=1) + "\n")
    return path


SAVED_SOL_BYTES = 1 << 20  # a sol.json is about 1 KB
MODEL_KEYS = ("launch_us", "one_way_latency_us", "a2a_store_gbps", "local_copy_gbps")  # what model() reads
SAVED_TEXT_KEYS = ("device", "placement", "ranks", "backend", "mode", "date", "commit")


def load(path: Path, world_size: int) -> dict:
    """A saved sol.json (save's) for a run of `world_size` ranks, read before the run starts: a regular file within
    SAVED_SOL_BYTES whose model figures are positive numbers and whose world size is the run's; its text escaped,
    other keys left out. UserError otherwise (red team 38: read after the whole clock, a FIFO hung it, a missing
    file or another shape ended it with the clock's results unsaved)."""
    import wire

    shown = wire.as_text(str(path), 300)
    try:
        saved = json.loads(wire.read_regular_file(path, SAVED_SOL_BYTES))
    except (OSError, ValueError, RecursionError) as error:  # NotRegular and JSON's errors are ValueErrors
        raise UserError(f"--sol {shown}: no readable sol.json ({wire.as_text(error, 200)})") from None
    numbers = {key for key, _ in SUMMARY_KEYS} | set(MODEL_KEYS)
    figures = {key: float(value) for key, value in (saved.items() if isinstance(saved, dict) else ())
               if key in numbers and type(value) in (int, float) and 0 < value < math.inf}
    if not all(key in figures for key in MODEL_KEYS):
        raise UserError(f"--sol {shown}: not a saved speed of light (it needs {', '.join(MODEL_KEYS)}, positive)")
    if saved.get("world_size") != world_size:
        raise UserError(f"--sol {shown}: measured at world size {wire.as_text(saved.get('world_size'), 20)}, and "
                        f"this run has {world_size} ranks")
    return {**{key: wire.as_text(saved.get(key), 200) for key in SAVED_TEXT_KEYS}, "world_size": world_size,
            **figures}


SUMMARY_KEYS = (("launch_us", "empty kernel, back to back (µs, device)"),
                ("launch_sync_us", "launch + synchronize, host round trip (µs)"),
                ("one_way_latency_us", "remote flag store seen by a spinning reader (µs, one way)"),
                ("a2a_store_gbps", "peer stores, every rank to every other, 64 MiB per rank (GB/s per GPU)"),
                ("a2a_store_gbps_1mib", "the same, 1 MiB per rank (GB/s per GPU)"),
                ("pair_store_gbps", "peer stores, one rank to one other alone (GB/s)"),
                ("local_copy_gbps", "local device-to-device copy, read + write (GB/s)"),
                ("timer_step_ns", "smallest step of the device clock (ns)"))


def summary(figures: dict) -> str:
    from tabulate import tabulate

    rows = [[label, figures[key]] for key, label in SUMMARY_KEYS if key in figures]
    header = (f"speed of light of this machine: {figures.get('device')}, world size {figures.get('world_size')}, "
              f"{figures.get('date')}, commit {figures.get('commit')} (a2a/sol.py says how each is measured)")
    return header + "\n\n" + tabulate(rows, headers=["figure", "value"], tablefmt="github", floatfmt=".2f")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Measure this machine's speed-of-light figures (GPUs only).")
    cli.add_options(parser, "world-size", "out")
    args = parser.parse_args(argv)
    cli.writable(args.out)
    planning.use_bundle_modules()
    gpus = planning.machine_gpus()
    if gpus < 2:
        print(f"skipped: the speed-of-light probes need at least 2 GPUs (this machine has {gpus})")
        return 0
    if args.world_size is not None and args.world_size > gpus:
        raise UserError(f"--world-size {args.world_size}: the speed of light needs a GPU per rank (this machine has "
                        f"{gpus})")
    plan = planning.make_plan((), "benchmarks", args.world_size, "nccl", machine_only=True)
    meta = plan.meta_for("sol")
    figures = measure(plan.world_size, meta)
    print(summary(figures))
    cli.save_run(args.out, meta, lambda folder: save(figures, folder))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
