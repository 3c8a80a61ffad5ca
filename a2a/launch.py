"""parallel_launch: run a function on N ranks of one process group (spawned processes, a rendezvous store held for
the run, `[rankN]` prefixed output, everything torn down on the way out). For tests and tools. It is the
evaluator's RankPool with a generic job, so group setup, failure grace and the watchdog exist once, in eval.py.

As in the evaluator, the current device in a rank is cuda:0 (what the runner leaves): a function that does its own
GPU work binds it with `eval.own_device(rank)`, and calls a submission outside that guard. With more ranks than
GPUs, rank r runs on cuda:(r mod GPUs) and the ranks share each GPU through CUDA MPS (a2a/sharing.py)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import eval as core
from a2a import sharing


class LaunchError(RuntimeError):
    pass


class SubmissionFailed(Exception):
    """A tool's ranks ran a submission, and it crashed, hung or returned what does not fit the tool's shape: the
    submission's failure, exit 112 with one line (a2a/cli.run_cli), never the harness's 114."""


def submission_launch(world_size: int, fn: Callable, *args: Any, backend: Optional[str] = None,
                      timeout_s: float = 300.0, reach: tuple = ()) -> list:
    """parallel_launch for a tool whose ranks import a submission: what they return is the submission's data, and a
    rank's failure is the submission's (SubmissionFailed)."""
    try:
        return parallel_launch(world_size, fn, *args, backend=backend, timeout_s=timeout_s, reach=reach)
    except LaunchError as error:
        raise SubmissionFailed(f"the submission's ranks failed: {error}") from None


def parallel_launch(world_size: int, fn: Callable, *args: Any, backend: Optional[str] = None,
                    timeout_s: float = 300.0, reach: tuple = ()) -> list:
    """Calls fn(rank, world_size, *args) on every rank (fn and args must be picklable) and returns the per-rank
    results. `reach`: files the ranks read (the submissions they import), in their view wherever they lie (/tmp is
    the ranks' own). NCCL wherever there is a GPU (ranks share GPUs when they outnumber them), else gloo. Raises
    LaunchError naming the ranks that failed or did not finish in timeout_s (the failing rank's own error first);
    no process outlives the call."""
    gpus = core.machine_gpus()
    backend = backend or ("nccl" if gpus else "gloo")
    with sharing.shared_ranks(sharing.placement(world_size, gpus, backend)) as env:
        pool = core.RankPool(world_size, backend, rank_prefix=True, env=env, reach=tuple(map(str, reach)))
        try:
            case = core.TestCase(args={"world_size": world_size}, spec=getattr(fn, "__name__", "fn"))
            results = pool.run("call", case, timeout_s, {"fn": fn, "args": args})
        finally:
            pool.shutdown()
    if not all(result.ok for result in results):
        raise LaunchError(core.rank_failures(results).replace("\n", "; "))
    return [result.value for result in results]
