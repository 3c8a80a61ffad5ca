"""parallel_launch: run a function on N ranks of one process group (spawned processes, a free port, `[rankN]`
prefixed output, everything torn down on the way out). For tests and tools; the evaluator has its own reused
pool because the leaderboard's protocol needs one. Both join groups through eval.py's `_join_group`."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any, Callable, Optional

import eval as harness


def _launch_entry(conn, rank: int, world_size: int, fn: Callable, args: tuple) -> None:
    try:
        harness._join_group(rank, world_size)
        try:
            conn.send((True, fn(rank, world_size, *args)))
        finally:
            harness._leave_group()
    except BaseException as exc:
        conn.send((False, harness._describe_exception(exc)))


class LaunchError(RuntimeError):
    pass


def parallel_launch(world_size: int, fn: Callable, *args: Any, backend: Optional[str] = None,
                    timeout_s: float = 300.0) -> list:
    """Calls fn(rank, world_size, *args) on every rank and returns the per-rank results. Raises LaunchError
    naming the ranks that failed or did not finish in timeout_s; no process outlives the call."""
    import torch

    backend = backend or ("nccl" if torch.cuda.device_count() >= world_size else "gloo")
    context = multiprocessing.get_context("spawn")
    saved = {k: os.environ.get(k) for k in ("A2A_BACKEND", "A2A_MASTER_PORT", "A2A_RANK_PREFIX")}
    os.environ.update(A2A_BACKEND=backend, A2A_MASTER_PORT=str(harness._free_port()), A2A_RANK_PREFIX="1")
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent_end, child_end = context.Pipe()
            proc = context.Process(target=_launch_entry, args=(child_end, rank, world_size, fn, args), daemon=True)
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        results: dict = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < world_size and time.monotonic() < deadline:
            for rank, conn in enumerate(conns):
                if rank not in results and (conn.poll() or not procs[rank].is_alive()):
                    try:
                        results[rank] = conn.recv()
                    except EOFError:
                        results[rank] = (False, f"process died (exit code {procs[rank].exitcode})")
            if any(not ok for ok, _ in results.values()):
                deadline = min(deadline, time.monotonic() + harness.FAILED_PEER_GRACE_S)
            time.sleep(0.002)
        problems = [f"rank {r}: {v}" for r, (ok, v) in sorted(results.items()) if not ok]
        problems += [f"rank {r}: did not finish in {timeout_s:g} s" for r in range(world_size) if r not in results]
        if problems:
            raise LaunchError("; ".join(problems))
        return [results[rank][1] for rank in range(world_size)]
    finally:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
