"""parallel_launch: run a function on N ranks of one process group (spawned processes, a free port, `[rankN]`
prefixed output, everything torn down on the way out). For tests and tools. It is the evaluator's RankPool with a
generic job, so group setup, failure grace and the watchdog exist once, in eval.py."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

import eval as harness


class LaunchError(RuntimeError):
    pass


def parallel_launch(world_size: int, fn: Callable, *args: Any, backend: Optional[str] = None,
                    timeout_s: float = 300.0) -> list:
    """Calls fn(rank, world_size, *args) on every rank (fn and args must be picklable) and returns the per-rank
    results. Raises LaunchError naming the ranks that failed or did not finish in timeout_s; no process outlives
    the call."""
    import torch

    backend = backend or ("nccl" if torch.cuda.device_count() >= world_size else "gloo")
    saved = {k: os.environ.get(k) for k in ("A2A_BACKEND", "A2A_MASTER_PORT", "A2A_RANK_PREFIX")}
    os.environ.update(A2A_BACKEND=backend, A2A_MASTER_PORT=str(harness._free_port()), A2A_RANK_PREFIX="1")
    try:
        pool = harness.RankPool(world_size)
        try:
            case = harness.TestCase(args={"world_size": world_size}, spec=getattr(fn, "__name__", "fn"))
            results = pool.run("call", case, timeout_s, {"fn": fn, "args": args})
        finally:
            pool.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    problems = [f"rank {rank}: {value}" for rank, (ok, value) in enumerate(results) if not ok]
    if problems:
        raise LaunchError("; ".join(problems))
    return [value for _, value in results]
