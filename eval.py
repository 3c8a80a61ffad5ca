#!/usr/bin/env python3
"""The all2all evaluator's protocol core: the file a leaderboard bundle runs as eval.py.

    POPCORN_FD=3 [POPCORN_SEED=S] [POPCORN_GPUS=N] python eval.py test|benchmark|leaderboard|profile TESTFILE

It imports `reference`, `utils`, `task` and `submission` from its own folder, writes `key: value` lines to the file
descriptor POPCORN_FD and exits 112 when a check fails. Keys, timing steps and stop rules are those of the official
runner. Run from the repository without POPCORN_FD, it hands over to the human face (`a2a/harness.py`: check, time,
stage, trace a version).

Additions over the official runner, none of which changes its output for a working submission:
- the submission is imported once in a separate process before any case (a load_inline build happens once, outside
  the per-case timeouts);
- a watchdog kills the ranks of a case that runs past its timeout, names where each rank was, and rebuilds the pool;
- the failing rank's own error is reported first and whole; errors its peers hit because of it are marked follow-on;
- the check compares against a copy of the input taken before the call (a submission that edits its input cannot
  make the check agree with a wrong answer);
- SIGTERM, SIGHUP and SIGINT end the whole process tree (ranks and whatever a submission started); ranks die with
  this process;
- bad input gets one line and a non-zero exit; CPU runs on gloo.
The human face passes its options as A2A_* environment variables, read once in `protocol_main`: A2A_BACKEND,
A2A_EXTRA (device-side time and harness floor), A2A_RANK_PREFIX, A2A_TIMEOUT, A2A_RENDEZVOUS=private (ranks join a
store this process holds on a port the OS gave it, instead of the runner's fixed port).
"""
from __future__ import annotations

import base64
import copy
import ctypes
import dataclasses
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
MODES = ("test", "benchmark", "leaderboard", "profile")
EXIT_CHECK_FAILED = 112
EXIT_BAD_TEST_FILE = 113
EXIT_USAGE = 2
SPEC_KEYS = ("num_experts", "experts_per_token", "hidden_dim", "max_num_tokens", "seed", "world_size")

# Per-case timeouts of the official runner (seconds); A2A_TIMEOUT replaces them.
OFFICIAL_TIMEOUT_S = {"test": 60, "benchmark": 180, "leaderboard": 180, "profile": 120}
# After one rank of a case has failed, how long the others get to return before the watchdog kills them.
FAILED_PEER_GRACE_S = 10.0
DEFAULT_MASTER_PORT = 12356  # the runner's fixed rendezvous port
BUILD_TIMEOUT_S = 900

# NVLink multicast stays off on every machine this runs on (it can take a shared host's GPUs down).
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)


class UserError(Exception):
    """Bad input: reported as one line, non-zero exit, no traceback."""


class Terminated(BaseException):
    """Raised in the main thread by SIGTERM, SIGHUP or SIGINT so that every `finally` runs and the tree is ended."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _raise_terminated(signum, _frame):
    # The clean-up that follows must not be cut short by a second signal (seen: a second SIGTERM while the pool was
    # being killed left a submission's child behind).
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(signum)


def install_signal_handlers() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _raise_terminated)


# --------------------------------------------------------------------------------------------------------------
# Process trees (Linux): ranks die with their parent, and nothing a submission starts outlives the run.
# --------------------------------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the signal handlers and kill_tree still clean up
        pass


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """The kernel sends `signum` to this process when its parent dies."""
    _prctl(_PR_SET_PDEATHSIG, signum)


def become_subreaper() -> None:
    """Orphaned descendants (a submission's children whose rank died) are re-parented here, not to init, so that
    kill_tree still finds them."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_tree(pid: int, include_root: bool = True) -> None:
    """SIGKILLs every descendant of `pid` (and `pid` itself when include_root) and reaps the descendants that were
    re-parented to this process. The root is left for its owner to reap (multiprocessing joins its workers)."""
    below = descendants(pid)
    for victim in below + ([pid] if include_root else []):
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for victim in below:
        try:
            os.waitpid(victim, 0)
        except ChildProcessError:
            pass


# --------------------------------------------------------------------------------------------------------------
# Test files
# --------------------------------------------------------------------------------------------------------------


class PopcornOutput:
    def __init__(self, fd: int):
        self.file = os.fdopen(fd, "w")
        os.set_inheritable(fd, False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def log(self, key, value):
        print(f"{key}: {value}", file=self.file, flush=True)


@dataclasses.dataclass
class TestCase:
    args: dict
    spec: str


@dataclasses.dataclass
class Stats:
    runs: int
    mean: float
    std: float
    err: float
    best: float
    worst: float


def cantor_combine(a: int, b: int) -> int:
    """Mixes the secret seed into a public test seed (Cantor pairing), as the official runner does."""
    return int(a + (a + b) * (a + b + 1) // 2)


TEST_PART = re.compile(r"\s*([a-zA-Z_]+):\s*([a-zA-Z]+|[+-]?[0-9]+)\s*")


def parse_test_line(line: str) -> dict:
    """`key: value; key: value` -> dict; raises ValueError naming the bad part."""
    case = {}
    for part in line.split(";"):
        matched = TEST_PART.fullmatch(part)
        if not matched:
            raise ValueError(f"invalid test case: '{line}': '{part}'")
        key, value = matched[1], matched[2]
        try:
            value = int(value)
        except ValueError:
            pass
        case[key] = value
    return case


def spec_line(case: dict) -> str:
    """The runner's test line for a case (SPEC_KEYS order)."""
    return "; ".join(f"{key}: {case[key]}" for key in SPEC_KEYS)


def get_test_cases(text: str, seed: Optional[int]) -> list[TestCase]:
    tests = [TestCase(args=parse_test_line(line), spec=line) for line in text.splitlines()]
    if seed is not None:
        for test in tests:
            if isinstance(test.args.get("seed"), int):
                test.args["seed"] = cantor_combine(test.args["seed"], seed)
    return tests


def calculate_stats(durations: list[float]) -> Stats:
    runs = len(durations)
    avg = sum(durations) / runs
    variance = sum((d - avg) ** 2 for d in durations)
    std = math.sqrt(variance / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs=runs, mean=avg, std=std, err=std / math.sqrt(runs), best=float(min(durations)),
                 worst=float(max(durations)))


# Smallest value of each field for which a case can run.
CASE_MINIMUM = {"num_experts": 1, "experts_per_token": 1, "hidden_dim": 1, "max_num_tokens": 2, "world_size": 1}


def case_problem(args: dict) -> Optional[str]:
    """None when the case's fields can make a run, else what is wrong (one line, no test prefix)."""
    missing = [key for key in SPEC_KEYS if key not in args]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key in SPEC_KEYS:
        if not isinstance(args[key], int):
            return f"{key} must be an integer, not '{args[key]}'"
    for key, minimum in CASE_MINIMUM.items():
        if args[key] < minimum:
            why = " (token counts are drawn from [1, max_num_tokens))" if key == "max_num_tokens" else ""
            return f"{key} must be at least {minimum}, not {args[key]}{why}"
    if args["experts_per_token"] > args["num_experts"]:
        return f"experts_per_token ({args['experts_per_token']}) must not exceed num_experts ({args['num_experts']})"
    if args["num_experts"] % args["world_size"]:
        return f"{args['num_experts']} experts cannot be split evenly over {args['world_size']} ranks"
    return None


def validate_cases(tests: list[TestCase], pool_size: int, backend: str, gpus: int) -> None:
    """Rejects cases no run could finish: raises UserError with one line."""
    if not tests:
        raise UserError("there are no test cases to run")
    for test in tests:
        problem = case_problem(test.args)
        if problem:
            raise UserError(f"test '{test.spec}': {problem}")
        ws = test.args["world_size"]
        if ws > pool_size:
            raise UserError(f"test '{test.spec}' needs {ws} ranks but the pool has {pool_size} "
                            f"(POPCORN_GPUS={pool_size})")
        if backend != "gloo" and ws > gpus:
            raise UserError(f"test '{test.spec}' needs {ws} ranks but this machine has {gpus} GPU(s); "
                            f"use --world-size {gpus} or --backend gloo")


# --------------------------------------------------------------------------------------------------------------
# Rank side: what a pool worker runs for one rank of one case
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankSetup:
    """How a rank joins its case's process group. With `store_port`, it joins as a client of the store the pool's
    owner holds for the whole run (one key prefix per case); otherwise rank 0 hosts the rendezvous on
    `master_port` (env://), as the official runner does."""
    backend: str
    store_port: Optional[int] = None
    master_port: int = DEFAULT_MASTER_PORT
    rank_prefix: bool = False


@dataclasses.dataclass
class RankFailure:
    """Why a rank failed. `follow_on`: it failed because a peer did first (a collective lost its peer, a shared
    check failed), so the report puts it after the cause."""
    message: str
    follow_on: bool = False
    at: float = dataclasses.field(default_factory=time.time)


_setup: Optional[RankSetup] = None


def _on_gpu() -> bool:
    import torch

    return _setup is not None and _setup.backend != "gloo" and torch.cuda.is_available()


def _synchronize():
    import torch

    if _on_gpu():
        torch.cuda.synchronize()


def _clone_data(data, rank: int):
    """Clones tensors in tuples, lists and dicts (onto cuda:rank on a GPU run), as the official runner does inside
    the timed region."""
    import torch

    if isinstance(data, tuple):
        return tuple(_clone_data(x, rank) for x in data)
    if isinstance(data, list):
        return [_clone_data(x, rank) for x in data]
    if isinstance(data, dict):
        return {k: _clone_data(v, rank) for k, v in data.items()}
    if isinstance(data, torch.Tensor):
        return data.clone().to(f"cuda:{rank}") if _on_gpu() else data.clone()
    # Like the official runner, other objects (cfg, rank_data) are passed through, not copied: the timed clone
    # costs what it costs there.
    return data


def _snapshot(data):
    """A deep copy of a case's input taken before the submission sees it: the check runs against this, so a
    submission that writes into `rank_data` cannot change what it is checked against."""
    return copy.deepcopy(data)


class _RankPrefix:
    """Line-prefixing wrapper for a worker's stdout/stderr (`[rank3] ...`), human face only."""

    def __init__(self, stream, prefix: str):
        self.stream, self.prefix, self.at_line_start = stream, prefix, True

    def write(self, text: str):
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(self.prefix)
            out.append(piece)
            self.at_line_start = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def flush(self):
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _join_group(rank: int, world_size: int, setup: RankSetup, case_id: int):
    import torch
    import torch.distributed as dist

    if setup.rank_prefix:
        if not isinstance(sys.stdout, _RankPrefix):
            sys.stdout, sys.stderr = _RankPrefix(sys.stdout, ""), _RankPrefix(sys.stderr, "")
        sys.stdout.prefix = sys.stderr.prefix = f"[rank{rank}] "
    if setup.store_port is not None:
        client = dist.TCPStore("127.0.0.1", setup.store_port, is_master=False, timeout=timedelta(seconds=120))
        rendezvous = {"store": dist.PrefixStore(f"case{case_id}/", client)}
    else:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(setup.master_port)
        rendezvous = {"init_method": "env://"}
    if setup.backend == "gloo":
        # CPU runs: ranks share the cores instead of each running a full thread pool over all of them (measured on
        # 2 cores, 2 ranks: the same code timed against itself spread 0.66-1.31x with full pools, 0.82-1.08x so).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group("gloo", rank=rank, world_size=world_size, **rendezvous)
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group(setup.backend, rank=rank, world_size=world_size,
                                device_id=torch.device(f"cuda:{rank}"), **rendezvous)


def _leave_group():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# What a peer's failure looks like from a rank that was waiting on it in a collective.
_FOLLOW_ON = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator|"
                        r"ProcessGroup(Gloo|NCCL)|gloo/transport|another rank failed", re.IGNORECASE)


def _failure_from_exception(exc: BaseException) -> RankFailure:
    """The exception type, its whole message on one line and the innermost frame of the submission, if any."""
    import torch.distributed as dist

    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if f.filename.endswith("submission.py")), frames[-1] if frames else None)
    location = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    message = " ".join(str(exc).split())
    follow_on = isinstance(exc, getattr(dist, "DistError", ())) or bool(_FOLLOW_ON.search(message))
    return RankFailure(f"{type(exc).__name__}: {message}{location}", follow_on=follow_on)


def _rank_entry(job: str, test: TestCase, rank: int, params: dict, setup: RankSetup, case_id: int):
    """Runs one rank of one case in a pool worker. Returns (True, value) or (False, RankFailure)."""
    global _setup
    _setup = setup
    try:
        _set_phase("joining the process group")
        _join_group(rank, test.args["world_size"], setup, case_id)
        try:
            ok, value = _RANK_JOBS[job](test, rank, **params)
        finally:
            _leave_group()
        if not ok and not isinstance(value, RankFailure):
            value = RankFailure(str(value))
        return ok, value
    except BaseException as exc:  # reported to the parent, which owns the exit status
        return False, _failure_from_exception(exc)


def _all_ok(ok: bool, rank: int) -> bool:
    """True when every rank's `ok` is true (a collective: all ranks must call it)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=f"cuda:{rank}" if _on_gpu() else "cpu")
    dist.all_reduce(flag)
    return flag.item() == 0


def slowest_rank(values: list, rank: int) -> list:
    """Element by element, the largest value over the ranks (a collective: every rank calls it with the same
    shape). Per-step device times become the slowest rank's, as the device-side number is defined."""
    import torch
    import torch.distributed as dist

    merged = torch.tensor(values, dtype=torch.float64, device=f"cuda:{rank}" if _on_gpu() else "cpu")
    dist.all_reduce(merged, op=dist.ReduceOp.MAX)
    return merged.tolist()


def timed_step(call: Optional[Callable], data, rank: int, device_clock: bool = False,
               stamps: Optional[list] = None):
    """One leaderboard-style step, the same code for a case and for the harness floor (`call` None): clear the L2,
    synchronize, barrier, start the host clock, clone the input, call, synchronize, barrier, stop. Returns
    (host ns, output, device ns). The host time is the official number on rank 0. With `device_clock`, the device
    time is taken around the call alone: CUDA events on a GPU run, this rank's host clock on a CPU run. With
    `stamps`, the host clock shared by all processes (time.time_ns) is appended at STEP_BOUNDARIES
    (tools/step_anatomy.py)."""
    import torch.distributed as dist
    from utils import clear_l2_cache

    events = timing_events() if call is not None and device_clock and _on_gpu() else None
    clear_l2_cache()
    _synchronize()
    dist.barrier()
    start = time.perf_counter_ns()
    _stamp(stamps)
    cloned = _clone_data(data, rank)
    _stamp(stamps)
    output = device_ns = None
    if events:
        events[0].record()
        output = call(cloned)
        events[1].record()
    elif call is not None and device_clock:
        call_start = time.perf_counter_ns()
        output = call(cloned)
        device_ns = time.perf_counter_ns() - call_start
    elif call is not None:
        output = call(cloned)
    _stamp(stamps)
    _synchronize()
    _stamp(stamps)
    dist.barrier()
    host_ns = time.perf_counter_ns() - start
    _stamp(stamps)
    if events:
        device_ns = events[0].elapsed_time(events[1]) * 1e6
    return host_ns, output, device_ns


STEP_BOUNDARIES = ("start", "cloned", "returned", "synchronized", "barrier passed")


def _stamp(stamps: Optional[list]) -> None:
    if stamps is not None:
        stamps.append(time.time_ns())


_events: dict = {}


def timing_events():
    """Two timing events for this device, made once: making them inside the timed window cost ~20 µs of every
    leaderboard-style step that the floor step did not pay (measured with tools/step_anatomy.py, H200 x2)."""
    import torch

    device = torch.cuda.current_device()
    if device not in _events:
        _events[device] = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return _events[device]


def _rank_test(test: TestCase, rank: int):
    from reference import check_implementation, generate_input
    from submission import custom_kernel

    _set_phase("generating input")
    data = generate_input(**test.args, rank=rank)
    unchanged = _snapshot(data)
    _synchronize()
    _set_phase("in custom_kernel")
    output = custom_kernel(_clone_data(data, rank))
    _synchronize()
    _set_phase("checking the output")
    return check_implementation(unchanged, output)


def _rank_benchmark(test: TestCase, rank: int, recheck: bool, max_repeats: int, max_time_ns: float, extra: bool):
    import torch
    import torch.distributed as dist
    from reference import check_implementation, generate_input
    from submission import custom_kernel

    device = f"cuda:{rank}" if _on_gpu() else "cpu"
    _set_phase("generating input")
    data = generate_input(**test.args, rank=rank)
    unchanged = _snapshot(data)
    _set_phase("in custom_kernel")
    output = custom_kernel(_clone_data(data, rank))
    _set_phase("checking the output")
    good, message = check_implementation(unchanged, output)
    if not _all_ok(good, rank):
        return False, RankFailure(message) if not good else RankFailure("another rank failed its check", True)

    durations, device_durations = [], []
    _set_phase("in the timing loop")
    bm_start = time.perf_counter_ns()
    for i in range(max_repeats):
        error_message = None
        if recheck:
            test.args["seed"] += 13
            data = generate_input(**test.args, rank=rank)
            unchanged = _snapshot(data)
        host_ns, output, device_ns = timed_step(custom_kernel, data, rank, device_clock=extra)
        durations.append(host_ns)
        device_durations.append(device_ns)
        if recheck:
            good, message = check_implementation(unchanged, output)
            if not good:
                error_message = message
        del output
        if not _all_ok(error_message is None, rank):
            return False, RankFailure(error_message) if error_message else RankFailure("another rank failed its "
                                                                                       "check", True)
        should_stop = False
        if rank == 0 and i > 1:
            stats = calculate_stats(durations)
            should_stop = (stats.err / stats.mean < 0.001 or stats.mean * stats.runs > max_time_ns
                           or time.perf_counter_ns() - bm_start > 120e9)
        stop = torch.tensor([should_stop], dtype=torch.bool, device=device)
        dist.broadcast(stop, 0)
        if stop.item():
            break

    result = {"stats": calculate_stats(durations) if rank == 0 else None}
    if extra:
        result["device"] = calculate_stats(slowest_rank(device_durations, rank))
        floor = [timed_step(None, data, rank)[0] for _ in range(max(len(durations), 10))]
        result["floor"] = calculate_stats(floor) if rank == 0 else None
    return True, result


def _rank_profile(test: TestCase, rank: int):
    from torch.profiler import ProfilerActivity, profile

    from reference import generate_input
    from submission import custom_kernel

    _set_phase("generating input")
    data = _clone_data(generate_input(**test.args, rank=rank), rank)
    _synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _on_gpu() else [])
    _set_phase("profiling")
    with profile(activities=activities) as prof:
        custom_kernel(data)
        _synchronize()
    return True, prof.events()


def _rank_call(test: TestCase, rank: int, fn, args: tuple):
    """Any picklable fn(rank, world_size, *args): what launch.parallel_launch runs."""
    _set_phase("in the launched function")
    return True, fn(rank, test.args["world_size"], *args)


_RANK_JOBS = {"test": _rank_test, "benchmark": _rank_benchmark, "profile": _rank_profile, "call": _rank_call}


# What a pool worker is doing, kept in shared memory so the watchdog can say where a stuck rank is.
PHASES = ("idle", "joining the process group", "generating input", "in custom_kernel", "checking the output",
          "in the timing loop", "profiling", "in the launched function")
_phase_slot = None


def _set_phase(name: str) -> None:
    if _phase_slot is not None:
        _phase_slot.value = PHASES.index(name)


def _worker_loop(conn, phase_slot, parent_pid: int) -> None:
    """A pool worker: runs one rank of a case per message until it gets None. Dies with the pool's owner."""
    global _phase_slot
    die_with_parent()
    if os.getppid() != parent_pid:  # the owner died before the line above took effect
        os._exit(1)
    _phase_slot = phase_slot
    while True:
        message = conn.recv()
        if message is None:
            return
        result = _rank_entry(*message)
        _set_phase("idle")
        conn.send(result)


def _death_message(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"rank process died (exit code {exitcode}, {signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"rank process died (exit code {exitcode})"


class RankPool:
    """Processes reused across cases, like the official runner's spawn pool, with a watchdog.

    As on the leaderboard, a process does not keep its rank: worker (rank + case number) % size runs `rank`, so
    per-process GPU state must be rebuilt for every process group. A case that runs past its timeout has its
    workers killed (SIGKILL, with whatever they started), the ranks that did not return are named, and fresh
    workers take their place. Each worker talks over its own pipe, so a killed worker leaves no lock held.

    `master_port` None: this process holds a TCP store on a port the OS gave it for the pool's whole life and the
    ranks of case n join it as clients under the prefix `case<n>/`, so no port is ever bound twice. A port number:
    rank 0 of every case hosts the rendezvous there (the runner's way); after a watchdog kill the next port is
    used, since the killed rank 0 may leave it in TIME_WAIT."""

    def __init__(self, size: int, backend: str, master_port: Optional[int] = None, rank_prefix: bool = False):
        self.context = multiprocessing.get_context("spawn")
        self.backend, self.rank_prefix = backend, rank_prefix
        self.store = self.master_port = None
        if master_port is None:
            import torch.distributed as dist

            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        else:
            self.master_port = master_port
        self.workers = [self._start() for _ in range(size)]
        self.cases_run = 0

    def _setup(self) -> RankSetup:
        if self.store is not None:
            return RankSetup(self.backend, store_port=self.store.port, rank_prefix=self.rank_prefix)
        return RankSetup(self.backend, master_port=self.master_port, rank_prefix=self.rank_prefix)

    def _start(self):
        parent_end, child_end = self.context.Pipe()
        phase = self.context.RawValue("i", 0)
        process = self.context.Process(target=_worker_loop, args=(child_end, phase, os.getpid()), daemon=True)
        process.start()
        child_end.close()
        return process, parent_end, phase

    def _where(self, slot: int, test: TestCase) -> str:
        phase = PHASES[self.workers[slot][2].value]
        return f"in {test.spec}" if phase == "in the launched function" else phase

    def run(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None) -> list:
        """Runs `job` on every rank of `test`; returns one (ok, value) per rank, value a RankFailure when not ok."""
        world_size = test.args["world_size"]
        slots = [(rank + self.cases_run) % len(self.workers) for rank in range(world_size)]
        case_id = self.cases_run
        self.cases_run += 1
        setup = self._setup()
        for rank, slot in enumerate(slots):
            self.workers[slot][1].send((job, test, rank, params or {}, setup, case_id))
        results: dict = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < world_size:
            for rank, slot in enumerate(slots):
                process, conn, _ = self.workers[slot]
                if rank in results:
                    continue
                if conn.poll():
                    try:
                        results[rank] = conn.recv()
                    except EOFError:  # the pipe closes before the dying process is reaped: wait for its code
                        process.join(timeout=5)
                        results[rank] = (False, RankFailure(_death_message(process.exitcode)))
                elif not process.is_alive():
                    results[rank] = (False, RankFailure(_death_message(process.exitcode)))
            failed = [rank for rank, (ok, _) in results.items() if not ok]
            if failed:
                deadline = min(deadline, time.monotonic() + FAILED_PEER_GRACE_S)
            if len(results) < world_size and time.monotonic() > deadline:
                missing = [rank for rank in range(world_size) if rank not in results]
                where = ", ".join(f"rank {rank} {self._where(slots[rank], test)}" for rank in missing)
                if failed:
                    failure = RankFailure(f"did not return within {FAILED_PEER_GRACE_S:g} s after rank(s) "
                                          f"{', '.join(map(str, failed))} failed; killed ({where})", follow_on=True)
                else:
                    failure = RankFailure(f"watchdog: case '{test.spec}' did not finish in {timeout_s:g} s; "
                                          f"rank(s) {', '.join(map(str, missing))} did not return and were killed "
                                          f"({where})")
                    print(failure.message, file=sys.stderr, flush=True)
                self._replace(slots)
                return [results.get(rank, (False, failure)) for rank in range(world_size)]
            time.sleep(0.002)
        dead = [slot for slot in slots if not self.workers[slot][0].is_alive()]
        if dead:
            self._replace(dead)
        return [results[rank] for rank in range(world_size)]

    def _replace(self, slots: list[int]) -> None:
        for slot in slots:
            process, conn, _ = self.workers[slot]
            kill_tree(process.pid, include_root=process.is_alive())
            process.join()
            conn.close()
            self.workers[slot] = self._start()
        if self.master_port is not None:
            self.master_port += 1

    def shutdown(self) -> None:
        """Ends what the submission started in each worker, then lets the workers exit (SIGKILL after 10 s)."""
        for process, conn, _ in self.workers:
            kill_tree(process.pid, include_root=False)
            try:
                conn.send(None)
            except OSError:
                pass
        for process, conn, _ in self.workers:
            process.join(timeout=10)
            if process.is_alive():
                kill_tree(process.pid)
                process.join()
            conn.close()

    def kill(self) -> None:
        """Ends every worker and everything below it at once (a signal or an error)."""
        for process, conn, _ in self.workers:
            kill_tree(process.pid, include_root=process.is_alive())
            process.join()
            conn.close()
        self.workers = []


# --------------------------------------------------------------------------------------------------------------
# Protocol modes
# --------------------------------------------------------------------------------------------------------------

FOLLOW_ON_SUMMARY_CHARS = 160


def rank_failures(results: list) -> str:
    """The failing ranks' own errors first, whole, in the order they happened; then, summarised, what their peers
    hit because of them."""
    failures = [(rank, value) for rank, (ok, value) in enumerate(results) if not ok]
    causes = sorted((f for f in failures if not f[1].follow_on), key=lambda f: f[1].at)
    follow_ons = sorted((f for f in failures if f[1].follow_on), key=lambda f: f[1].at)
    if not causes:
        causes, follow_ons = follow_ons, []
    lines = [f"rank {rank} - {failure.message}" for rank, failure in causes]
    if follow_ons:
        summary = "; ".join(f"rank {rank}: {failure.message[:FOLLOW_ON_SUMMARY_CHARS]}"
                            + ("..." if len(failure.message) > FOLLOW_ON_SUMMARY_CHARS else "")
                            for rank, failure in follow_ons)
        lines.append(f"follow-on (after the failure above): {summary}")
    return "\n".join(lines)


@dataclasses.dataclass
class ProtocolOptions:
    """What the human face asks of the protocol face (A2A_* variables, read once)."""
    backend: str
    extra: bool
    rank_prefix: bool
    private_rendezvous: bool
    timeout_s: Optional[float]

    @classmethod
    def from_environment(cls) -> "ProtocolOptions":
        import torch

        timeout = os.environ.get("A2A_TIMEOUT")
        return cls(backend=os.environ.get("A2A_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo"),
                   extra=bool(os.environ.get("A2A_EXTRA")), rank_prefix=bool(os.environ.get("A2A_RANK_PREFIX")),
                   private_rendezvous=os.environ.get("A2A_RENDEZVOUS") == "private",
                   timeout_s=float(timeout) if timeout else None)

    def case_timeout(self, mode: str) -> float:
        return self.timeout_s or OFFICIAL_TIMEOUT_S[mode]


def run_testing(logger: PopcornOutput, pool: RankPool, tests: list[TestCase], options: ProtocolOptions) -> int:
    passed = True
    logger.log("test-count", len(tests))
    for idx, test in enumerate(tests):
        logger.log(f"test.{idx}.spec", test.spec)
        results = pool.run("test", test, options.case_timeout("test"))
        if all(ok for ok, _ in results):
            logger.log(f"test.{idx}.status", "pass")
        else:
            passed = False
            logger.log(f"test.{idx}.status", "fail")
            logger.log(f"test.{idx}.error", rank_failures(results))
    logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def run_single_benchmark(pool: RankPool, test: TestCase, recheck: bool, max_repeats: int, max_time_ns: float,
                         mode: str, options: ProtocolOptions):
    params = dict(recheck=recheck, max_repeats=max_repeats, max_time_ns=max_time_ns, extra=options.extra)
    results = pool.run("benchmark", test, options.case_timeout(mode), params)
    if not all(ok for ok, _ in results):
        return rank_failures(results)
    return results[0][1]


def _log_benchmark(logger: PopcornOutput, idx: int, result) -> bool:
    if isinstance(result, str):
        logger.log(f"benchmark.{idx}.status", "fail")
        logger.log(f"benchmark.{idx}.error", result)
        return False
    for field in dataclasses.fields(Stats):
        logger.log(f"benchmark.{idx}.{field.name}", getattr(result["stats"], field.name))
    for kind in ("device", "floor"):
        if result.get(kind) is not None:
            for field in ("runs", "mean", "best"):
                logger.log(f"benchmark.{idx}.{kind}_{field}", getattr(result[kind], field))
    return True


def run_benchmarking(logger: PopcornOutput, pool: RankPool, tests: list[TestCase], mode: str,
                     options: ProtocolOptions) -> int:
    recheck, max_time_ns, warmup_time_ns = (True, 30e9, 1e7) if mode == "leaderboard" else (False, 10e9, 10e7)
    run_single_benchmark(pool, tests[0], False, 100, warmup_time_ns, mode, options)
    logger.log("benchmark-count", len(tests))
    passed = True
    for idx, test in enumerate(tests):
        logger.log(f"benchmark.{idx}.spec", test.spec)
        result = run_single_benchmark(pool, test, recheck, 100, max_time_ns, mode, options)
        passed = _log_benchmark(logger, idx, result) and passed
        if not passed and mode == "leaderboard":
            break
    logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _combine_traces(traces: list) -> Any:
    """Averages the profiler events of all ranks per key, like EventList.key_averages() over several traces."""
    from collections import defaultdict

    from torch.autograd.profiler_util import EventList, FunctionEventAvg

    stats = defaultdict(FunctionEventAvg)
    for events in traces:
        for event in events:
            stats[(str(event.key), str(event.node_id), str(event.device_type), str(event.is_legacy),
                   str(event.is_user_annotation))].add(event)
    averaged = EventList(stats.values())
    for event in averaged:
        event.stack, event.input_shapes, event.overload_name = [], "", ""
    return averaged


def run_profiling(logger: PopcornOutput, pool: RankPool, tests: list[TestCase], options: ProtocolOptions) -> int:
    passed = True
    logger.log("benchmark-count", len(tests))
    for idx, test in enumerate(tests):
        logger.log(f"benchmark.{idx}.spec", test.spec)
        results = pool.run("profile", test, options.case_timeout("profile"))
        if not all(ok for ok, _ in results):
            passed = False
            logger.log(f"benchmark.{idx}.status", "fail")
            logger.log(f"benchmark.{idx}.error", rank_failures(results))
            continue
        sort_key = "self_cuda_time_total" if options.backend != "gloo" else "self_cpu_time_total"
        report = _combine_traces([events for _, events in results]).table(sort_by=sort_key, row_limit=20)
        logger.log(f"benchmark.{idx}.report", base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def builds_device_code(source: str) -> bool:
    """A submission that builds device code with load_inline: built once before any case, GPU-only."""
    return "load_inline" in source


def import_once(folder: Path, module: str = "submission", env: Optional[dict] = None,
                compiles: bool = False) -> None:
    """Imports `module` from `folder` in a separate process: a load_inline build happens there, once, and later
    processes load it from the extension cache. Reports an import error or a missing custom_kernel as one line."""
    if compiles:
        print(f"compiling {module} extensions (once, before any case; ranks load the cached build) ...",
              file=sys.stderr, flush=True)
    probe = (f"import sys, {module}\n"
             f"sys.exit(0 if callable(getattr({module}, 'custom_kernel', None)) else 3)\n")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd=folder, capture_output=True, text=True,
                              timeout=float(os.environ.get("A2A_BUILD_TIMEOUT", BUILD_TIMEOUT_S)),
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        raise UserError(f"importing {module}.py (and building its extensions) did not finish in time")
    if done.returncode == 3:
        raise UserError(f"{module}.py defines no custom_kernel(data)")
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
        raise UserError(f"importing {module}.py failed: {last[0].strip()}")
    if compiles:
        print(f"compiled in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def protocol_main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        print(f"usage: POPCORN_FD=N python eval.py {{{'|'.join(MODES)}}} TESTFILE", file=sys.stderr)
        return EXIT_USAGE
    sys.path.insert(0, str(HERE))
    mode, test_file = sys.argv[1], sys.argv[2]
    seed = os.getenv("POPCORN_SEED")
    os.unsetenv("POPCORN_SEED")
    try:
        seed = int(seed) if seed else None
        n_gpus = int(os.getenv("POPCORN_GPUS", "1"))
    except ValueError:
        print("POPCORN_SEED and POPCORN_GPUS must be integers", file=sys.stderr)
        return EXIT_USAGE
    try:
        text = Path(test_file).read_text()
    except OSError as exc:
        print(f"Could not open test file `{test_file}`: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_TEST_FILE
    try:
        tests = get_test_cases(text, seed)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_TEST_FILE
    if not tests:
        print(f"test file `{test_file}` holds no test cases", file=sys.stderr)
        return EXIT_BAD_TEST_FILE
    import torch
    from utils import set_seed

    install_signal_handlers()
    become_subreaper()
    set_seed(seed or 42)
    options = ProtocolOptions.from_environment()
    pool = None
    try:
        validate_cases(tests, n_gpus, options.backend, torch.cuda.device_count())
        submission = HERE / "submission.py"
        import_once(HERE, compiles=submission.is_file() and builds_device_code(submission.read_text()))
        with PopcornOutput(int(os.environ["POPCORN_FD"])) as logger:
            pool = RankPool(n_gpus, options.backend, None if options.private_rendezvous else DEFAULT_MASTER_PORT,
                            options.rank_prefix)
            if mode == "test":
                code = run_testing(logger, pool, tests, options)
            elif mode == "profile":
                code = run_profiling(logger, pool, tests, options)
            else:
                code = run_benchmarking(logger, pool, tests, mode, options)
            pool.shutdown()
            pool = None
            return code
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except Terminated as stop:
        print(f"eval.py: {stop.name} received; every rank and what it started has been stopped", file=sys.stderr)
        return 128 + stop.signum
    finally:
        if pool is not None:
            pool.kill()
        kill_tree(os.getpid(), include_root=False)


if __name__ == "__main__":
    if os.getenv("POPCORN_FD"):
        sys.exit(protocol_main())
    if not (HERE / "a2a" / "harness.py").is_file():
        print("usage: POPCORN_FD=N python eval.py {test|benchmark|leaderboard|profile} TESTFILE", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    from a2a.harness import main

    sys.exit(main(sys.argv[1:]))
