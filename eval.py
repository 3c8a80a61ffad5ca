#!/usr/bin/env python3
"""The all2all evaluator's protocol core: the file a leaderboard bundle runs as eval.py.

    POPCORN_FD=3 [POPCORN_SEED=S] [POPCORN_GPUS=N] python eval.py test|benchmark|leaderboard|profile TESTFILE

It imports `reference`, `utils`, `task` and `submission` from its own folder, writes `key: value` lines to the file
descriptor POPCORN_FD and exits 112 when a check fails. The process model is the runner's (gpu-mode
reference-kernels, problems/amd_distributed/eval.py): a spawn pool of POPCORN_GPUS workers reused across cases (a
worker is rank 0 in one case and another rank in the next), an NCCL group per case with `device_id` on the fixed
port, no `set_device` anywhere (the current device stays cuda:0 in every worker), the submission imported inside
the worker during the first case and within that case's time limit, the same timed loop, seeds, warm-up and stop
rules. What differs, and why none of it can turn a failure there into a pass here: README, "Faithful to the runner".

Run from the repository without POPCORN_FD, it hands over to the human face (a2a/harness.py). The human face's
options arrive as A2A_* variables, read once in `protocol_main`: A2A_BACKEND, A2A_EXTRA (device-side time, harness
floor, import time), A2A_RANK_PREFIX, A2A_TIMEOUT, A2A_RENDEZVOUS=private (ranks join a store this process holds on
a port the OS gave it, instead of the runner's fixed port), A2A_SHARE=mps (more ranks than GPUs: rank r on
cuda:(r mod GPUs), sharing through the MPS daemon the human face holds; a2a/sharing.py) with A2A_NCCL_VERSION (the
NCCL every rank must have loaded). Without A2A_SHARE a bundle refuses more ranks than GPUs, as the runner does.

Also the library the human face and the tools build on: `__all__` below, exactly the names they use
(tests/test_layers.py holds it to them). Its heart is the rank API: RankPool, rank_device, own_device, clone_data,
snapshot, all_ok, and `measure`, the one measuring loop around the runner's timed step.
"""
from __future__ import annotations

import base64
import contextlib
import copy
import ctypes
import dataclasses
import fcntl
import math
import multiprocessing
import multiprocessing.resource_tracker
import os
import re
import select
import signal
import stat
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

__all__ = [  # what a2a/, tools/, launch.py, run_leaderboard.py and diff.py use; everything else is the core's own
    "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED", "EXIT_CRASH", "EXTRA_STATS", "EXTRA_STAT_FIELDS", "HERE",
    "LEADERBOARD_SEED_STEP", "MODES", "MPS_DEFAULT_PIPE_DIRECTORY", "OFFICIAL_TIMEOUT_S", "RUN_OWNER", "SEED_MAX",
    "SPEC_KEYS",
    "WARMUP_CALLS", "RankPool", "Terminated", "TestCase", "UserError", "all_ok", "calculate_extra_stats", "claim_run",
    "cantor_combine", "case_problem", "clone_data", "die_with_parent", "environment_with", "get_test_cases",
    "install_signal_handlers", "kill_tree", "measure", "nccl_version_tuple", "own_device", "rank_device",
    "rank_failures", "snapshot", "spec_line", "validate_cases", "version_text",
]
HERE = Path(__file__).resolve().parent
MODES = ("test", "benchmark", "leaderboard", "profile")
# Exit codes: README lists them. 2 and 113 are the runner's own.
EXIT_USAGE = 2  # the command line is wrong
EXIT_CHECK_FAILED = 112  # a submission failed a check, crashed or hung
EXIT_BAD_INPUT = 113  # a file, a case value, a seed or a POPCORN_* value that no run could use
EXIT_CRASH = 114  # the evaluator itself failed: a bug here, never blamed on the submission
SPEC_KEYS = ("num_experts", "experts_per_token", "hidden_dim", "max_num_tokens", "seed", "world_size")

# Per-case timeouts of the official runner (seconds); A2A_TIMEOUT replaces them.
OFFICIAL_TIMEOUT_S = {"test": 60, "benchmark": 180, "leaderboard": 180, "profile": 120}
# After one rank of a case has failed, how long the others get to return before the watchdog kills them.
FAILED_PEER_GRACE_S = 10.0
DEFAULT_MASTER_PORT = 12356  # the runner's fixed rendezvous port
MPS_DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # where MPS clients look when CUDA_MPS_PIPE_DIRECTORY is unset
MAX_REPEATS = 100
LEADERBOARD_SEED_STEP = 13  # leaderboard mode: a fresh input per run, seed + 13 each time
MAX_LINE_CHARS = 1000
MAX_TEST_FILE_BYTES = 1 << 20
# Largest value of each field a run can take; a larger one is bad input, not a submission's failure.
SEED_MAX = 2**64 - 1 - 2**16  # the generator takes seeds up to 2**64 - 1; room for + rank and the +13 steps
CASE_LIMITS = {"num_experts": (1, 1024), "experts_per_token": (1, 1024), "hidden_dim": (1, 65536),
               "max_num_tokens": (2, 65536), "seed": (0, SEED_MAX), "world_size": (1, 64)}
REFERENCE_BYTES_MAX = 4 << 30  # the reference's dispatch buffer per rank: num_experts * max_num_tokens * hidden * 2

# NVLink multicast stays off on every machine this runs on (it can take a shared host's GPUs down).
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)


class UserError(Exception):
    """Bad input: one line, a non-zero exit, no traceback."""


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


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the signal handlers and kill_tree still clean up
        pass


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """The kernel sends `signum` to this process when its parent dies (PR_SET_PDEATHSIG)."""
    _prctl(1, signum)


def hide_result_channel() -> None:
    """Keeps the result channel out of the ranks' reach: POPCORN_FD leaves the environment the ranks inherit, and
    this process becomes non-dumpable, so another process of the same user cannot open /proc/<this pid>/fd/<fd>
    (root still can: README, "What a submission cannot do"). The human face's channel is a socket, which no
    process can open through /proc at all."""
    os.environ.pop("POPCORN_FD", None)
    _prctl(4, 0)  # PR_SET_DUMPABLE


def become_subreaper() -> None:
    """Orphaned descendants (a submission's children whose rank died) are re-parented here, not to init, so that
    kill_tree still finds them (PR_SET_CHILD_SUBREAPER)."""
    _prctl(36, 1)


def process_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ... start time at 19); OSError if gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(process_stat(int(entry))[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


RUN_OWNER = "A2A_RUN_OWNER"  # pid:start time of the command that owns a process (inherited by all it starts)


def _start_time(pid: int) -> Optional[str]:
    try:
        return process_stat(pid)[19]
    except (OSError, IndexError):
        return None


def claim_run(inherit: bool = False) -> None:
    """First ends what earlier runs left behind (sweep_orphans), then marks this command as the owner of every
    process it will start. `inherit`: keep an owner already named (the protocol face under the human face, which
    ends it on its way out)."""
    sweep_orphans()
    if not (inherit and os.environ.get(RUN_OWNER)):
        os.environ[RUN_OWNER] = f"{os.getpid()}:{_start_time(os.getpid())}"


def sweep_orphans() -> list[int]:
    """SIGKILLs every process whose owner (RUN_OWNER in its environment) is gone: what a run left after a SIGKILL
    took its owner before the owner could end it (a submission's forked children re-parented to init, a rank whose
    parent died). A live owner's processes are left alone. Returns the pids killed."""
    killed = []
    for pid, environ in other_processes():
        matched = re.search(rb"(?:^|\0)" + RUN_OWNER.encode() + rb"=(\d+):(\d+)", environ)
        if not matched or _start_time(int(matched[1])) == matched[2].decode():
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def other_processes():
    """(pid, environment as bytes) of every other process this one may read, from /proc (the one scan that finds
    processes by what their environment carries: the orphan sweep, the tests' leftover checks)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                yield int(entry), Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue


def kill_tree(pid: int, include_root: bool = True) -> None:
    """SIGKILLs every descendant of `pid` (and `pid` itself when include_root) and reaps the descendants that were
    re-parented to this process. The root is left for its owner to reap (multiprocessing joins its workers)."""
    below = descendants(pid)
    for victim in below + ([pid] if include_root else []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    for victim in below:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(victim, 0)


# --------------------------------------------------------------------------------------------------------------
# Test files and case values
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
    secret_seed: Optional[int] = None  # the POPCORN_SEED mixed into args["seed"], if any


@dataclasses.dataclass
class Stats:
    runs: int
    mean: float
    std: float
    err: float
    best: float
    worst: float


# The result contract: the official Stats fields for every timed case; with A2A_EXTRA, the quantiles of the official
# (leaderboard-style) time (`benchmark.N.p50`, ...) and, for each extra kind, these statistics
# (`benchmark.N.device_mean`, ...). The human face and the tables derive their columns from here (a2a/rows.py).
EXTRA_STATS = ("device", "floor")
QUANTILES = {"p50": 0.5, "p90": 0.9}


@dataclasses.dataclass
class ExtraStats:
    runs: int
    mean: float
    best: float
    p50: float
    p90: float


EXTRA_STAT_FIELDS = tuple(field.name for field in dataclasses.fields(ExtraStats))


def cantor_combine(a: int, b: int) -> int:
    """Mixes the secret seed into a public test seed (Cantor pairing), as the official runner does."""
    return int(a + (a + b) * (a + b + 1) // 2)


TEST_PART = re.compile(r"\s*([a-zA-Z_]+):\s*([a-zA-Z]+|[+-]?[0-9]+)\s*")


def parse_test_line(line: str) -> dict:
    """`key: value; key: value` -> dict, with the runner's grammar; raises ValueError naming the bad part. Unlike the
    runner, a key given twice and an over-long line are errors (the runner keeps the last value silently)."""
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"a test line of {len(line)} characters (at most {MAX_LINE_CHARS}): '{line[:60]}...'")
    case = {}
    for part in line.split(";"):
        matched = TEST_PART.fullmatch(part)
        if not matched:
            raise ValueError(f"invalid test case: '{line}': '{part}'")
        key, value = matched[1], matched[2]
        if key in case:
            raise ValueError(f"invalid test case: '{line}': '{key}' is given twice")
        case[key] = int(value) if re.fullmatch(r"[+-]?[0-9]+", value) else value
    return case


def spec_line(case: dict) -> str:
    """The runner's test line for a case (SPEC_KEYS order)."""
    return "; ".join(f"{key}: {case[key]}" for key in SPEC_KEYS)


def get_test_cases(text: str, seed: Optional[int]) -> list[TestCase]:
    tests = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            tests.append(TestCase(args=parse_test_line(line), spec=line))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    if seed is not None:
        for test in tests:
            if isinstance(test.args.get("seed"), int):
                test.args["seed"] = cantor_combine(test.args["seed"], seed)
                test.secret_seed = seed
    return tests


def read_test_file(path: Path, seed: Optional[int]) -> list[TestCase]:
    """The cases of a test file; UserError with one line for a file that cannot be read or parsed."""
    try:
        with open(path, "rb") as source:  # bounded: a link to /dev/zero must not be read until memory runs out
            raw = source.read(MAX_TEST_FILE_BYTES + 1)
        if len(raw) > MAX_TEST_FILE_BYTES:
            raise UserError(f"test file `{path}` is larger than {MAX_TEST_FILE_BYTES >> 20} MiB (1000 lines of the "
                            "longest case line fit in it)")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise UserError(f"Could not open test file `{path}`: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"test file `{path}` is not UTF-8 text (byte {exc.start})") from None
    try:
        tests = get_test_cases(text, seed)
    except ValueError as exc:
        raise UserError(f"test file `{path}`, {exc}") from None
    if not tests:
        raise UserError(f"test file `{path}` holds no test cases")
    return tests


def calculate_stats(durations: list[float]) -> Stats:
    runs = len(durations)
    avg = sum(durations) / runs
    std = math.sqrt(sum((d - avg) ** 2 for d in durations) / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs=runs, mean=avg, std=std, err=std / math.sqrt(runs), best=float(min(durations)),
                 worst=float(max(durations)))


def quantile(samples: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between the two nearest samples (numpy's default)."""
    ordered = sorted(samples)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (at - low))


def calculate_extra_stats(samples: list[float]) -> ExtraStats:
    return ExtraStats(runs=len(samples), mean=sum(samples) / len(samples), best=float(min(samples)),
                      **{name: quantile(samples, q) for name, q in QUANTILES.items()})


def case_problem(args: dict) -> Optional[str]:
    """None when the case's fields can make a run, else what is wrong (one line, no test prefix)."""
    unknown = [key for key in args if key not in SPEC_KEYS]
    if unknown:
        return f"unknown field '{unknown[0]}' (a case has exactly {', '.join(SPEC_KEYS)})"
    missing = [key for key in SPEC_KEYS if key not in args]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key in SPEC_KEYS:
        if not isinstance(args[key], int):
            return f"{key} must be an integer, not '{args[key]}'"
    for key, (low, high) in CASE_LIMITS.items():
        if not low <= args[key] <= high:
            why = " (token counts are drawn from [1, max_num_tokens))" if key == "max_num_tokens" else ""
            if key == "seed":
                return f"seed {args[key]} is outside what the generator takes (0 to {high})"
            return f"{key} must be at least {low}, not {args[key]}{why}" if args[key] < low else \
                f"{key} must be at most {high}, not {args[key]}"
    if args["experts_per_token"] > args["num_experts"]:
        return f"experts_per_token ({args['experts_per_token']}) must not exceed num_experts ({args['num_experts']})"
    if args["num_experts"] % args["world_size"]:
        return f"{args['num_experts']} experts cannot be split evenly over {args['world_size']} ranks"
    reference_bytes = args["num_experts"] * args["max_num_tokens"] * args["hidden_dim"] * 2
    if reference_bytes > REFERENCE_BYTES_MAX:
        return (f"num_experts x max_num_tokens x hidden_dim is too large: the reference would need "
                f"{reference_bytes / 2**30:.1f} GiB per rank (at most {REFERENCE_BYTES_MAX >> 30} GiB)")
    return None


def max_cpu_ranks() -> int:
    """gloo ranks a CPU machine may run at once: one per core, at least 8, never more than 64."""
    return min(64, max(8, os.cpu_count() or 1))


def validate_cases(tests: list[TestCase], pool_size: int, backend: str, gpus: int, shared: bool = False) -> None:
    """Rejects cases no run could finish: raises UserError with one line. `shared`: ranks may outnumber the GPUs
    (the human face shares them through MPS)."""
    if not tests:
        raise UserError("there are no test cases to run")
    for test in tests:
        ws = test.args.get("world_size")
        if isinstance(ws, int) and ws > pool_size:
            raise UserError(f"test '{test.spec}' needs {ws} ranks but the pool has {pool_size} "
                            f"(POPCORN_GPUS={pool_size})")
        if isinstance(ws, int) and backend != "gloo" and ws > gpus and not (shared and gpus):
            raise UserError(f"test '{test.spec}' needs {ws} ranks but this machine has {gpus} GPU(s); "
                            f"use --world-size {gpus} or --backend gloo")
        if isinstance(ws, int) and backend == "gloo" and ws > max_cpu_ranks():
            raise UserError(f"test '{test.spec}' needs {ws} ranks; on CPU (gloo) at most {max_cpu_ranks()} run at "
                            f"once here ({os.cpu_count()} cores)")
        seed = test.args.get("seed")
        if test.secret_seed is not None and isinstance(seed, int) and seed > SEED_MAX:
            raise UserError(f"test '{test.spec[:120]}': the secret seed {test.secret_seed} mixed into this test's seed "
                            f"gives {seed}, more than the generator takes ({SEED_MAX}); use a smaller one")
        problem = case_problem(test.args)
        if problem:
            raise UserError(f"test '{test.spec[:120]}': {problem}")


# --------------------------------------------------------------------------------------------------------------
# Rank side: what a pool worker runs for one rank of one case, and the rank API tools use
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
    nccl_version: Optional[str] = None  # ranks sharing GPUs: the NCCL each must have loaded (A2A_NCCL_VERSION)


@dataclasses.dataclass
class RankFailure:
    """Why a rank failed. `follow_on`: it failed because a peer did first (a collective lost its peer, a shared
    check failed), so the report puts it after the cause."""
    message: str
    follow_on: bool = False
    at: float = dataclasses.field(default_factory=time.time)


class RankResult(NamedTuple):
    ok: bool
    value: Any  # the job's result, or a RankFailure
    import_s: Optional[float] = None  # seconds this rank spent importing the submission during this case


_setup: Optional[RankSetup] = None
# The reference's functions, bound when the worker starts, before any submission is imported: a submission that
# replaces reference.check_implementation at import changes nothing here (README says what stays open).
_reference: tuple = ()
_kernel: Optional[Callable] = None
_import_s: Optional[float] = None


def _on_gpu() -> bool:
    import torch

    return _setup is not None and _setup.backend != "gloo" and torch.cuda.is_available()


def rank_device(rank: int):
    """Where a rank's inputs live: cuda:(rank mod GPUs) on a GPU run (cuda:rank under the runner, which never has
    more ranks than GPUs), else the CPU."""
    import torch

    return torch.device(f"cuda:{rank % torch.cuda.device_count()}") if _on_gpu() else torch.device("cpu")


def own_device(rank: int):
    """A guard for a tool's own GPU work (probes, markers, its buffers) on its rank's device; on exit the current
    device is again what the runner leaves (cuda:0). Never put a submission's call inside it."""
    import torch

    return torch.cuda.device(rank_device(rank)) if _on_gpu() else contextlib.nullcontext()


def nccl_version_tuple(code: int) -> tuple:
    """ncclGetVersion's integer as (major, minor, patch): 22809 -> (2, 28, 9) (NCCL 2.9 on; 1000s before)."""
    if code >= 10000:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def version_text(version: tuple) -> str:
    return ".".join(map(str, version))


def loaded_nccl_version() -> Optional[str]:
    """The version of the NCCL this process has loaded, asked of the library itself (torch.cuda.nccl.version()
    gives the headers torch was built with, whatever library is loaded); None when none is loaded."""
    try:
        library = ctypes.CDLL("libnccl.so.2", mode=getattr(os, "RTLD_NOLOAD", 4))
        code = ctypes.c_int()
        return None if library.ncclGetVersion(ctypes.byref(code)) else version_text(nccl_version_tuple(code.value))
    except (OSError, AttributeError):
        return None


def synchronize() -> None:
    """torch.cuda.synchronize() as the runner calls it: on the current device, which the runner never changes."""
    import torch

    if _on_gpu():
        torch.cuda.synchronize()


def clone_data(data, rank: int):
    """The runner's clone: tensors in tuples, lists and dicts are cloned onto cuda:rank (the CPU on gloo); other
    objects (cfg, rank_data) pass through uncopied, so the timed clone costs what it costs there."""
    import torch

    if isinstance(data, tuple):
        return tuple(clone_data(x, rank) for x in data)
    if isinstance(data, list):
        return [clone_data(x, rank) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v, rank) for k, v in data.items()}
    if isinstance(data, torch.Tensor):
        return data.clone().to(rank_device(rank))
    return data


def snapshot(data):
    """A deep copy of a case's input taken before the submission sees it: the check runs against this, so a
    submission that writes into `rank_data` cannot change what it is checked against."""
    return copy.deepcopy(data)


def all_ok(ok: bool, rank: int) -> bool:
    """True when every rank's `ok` is true (a collective: all ranks must call it)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=rank_device(rank))
    dist.all_reduce(flag)
    return flag.item() == 0


def slowest_rank(values: list, rank: int) -> list:
    """Element by element, the largest value over the ranks (a collective: every rank calls it with the same
    shape). Per-step device times become the slowest rank's, as the device-side number is defined."""
    import torch
    import torch.distributed as dist

    merged = torch.tensor(values, dtype=torch.float64, device=rank_device(rank))
    dist.all_reduce(merged, op=dist.ReduceOp.MAX)
    return merged.tolist()


STEP_BOUNDARIES = ("start", "cloned", "returned", "synchronized", "barrier passed")
_events: dict = {}


def _timing_events(device):
    """Two timing events for this device, made once: making them inside the timed window cost ~20 µs of every
    leaderboard-style step that the floor step did not pay (measured with tools/step_anatomy.py, H200 x2)."""
    import torch

    if device.index not in _events:
        _events[device.index] = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    return _events[device.index]


def timed_step(call: Optional[Callable], data, rank: int, device_clock: bool = False,
               probe: Optional[Callable[[str], None]] = None):
    """One leaderboard-style step in the runner's order, the same code for a case and for the harness floor (`call`
    None): clear the L2, synchronize, barrier, start the host clock, clone the input, call, synchronize, barrier,
    stop. Returns (host ns, output, device ns). The host time is the official number on rank 0. With
    `device_clock`, the device time is taken around the call alone: CUDA events on the rank's stream on a GPU run,
    this rank's host clock on a CPU run. `probe(boundary)` is called at each of STEP_BOUNDARIES (tools: stamps,
    markers); the call itself runs with the current device the runner leaves."""
    import torch
    import torch.distributed as dist
    from utils import clear_l2_cache

    mark = probe or (lambda _boundary: None)
    events = stream = None
    if call is not None and device_clock and _on_gpu():
        events, stream = _timing_events(rank_device(rank)), torch.cuda.current_stream(rank_device(rank))
    clear_l2_cache()
    synchronize()
    dist.barrier()
    start = time.perf_counter_ns()
    mark("start")
    cloned = clone_data(data, rank)
    mark("cloned")
    output = device_ns = None
    if events:
        events[0].record(stream)
        output = call(cloned)
        events[1].record(stream)
    elif call is not None:
        call_start = time.perf_counter_ns()
        output = call(cloned)
        device_ns = time.perf_counter_ns() - call_start if device_clock else None
    mark("returned")
    synchronize()
    mark("synchronized")
    dist.barrier()
    host_ns = time.perf_counter_ns() - start
    mark("barrier passed")
    if events:
        events[1].synchronize()
        device_ns = events[0].elapsed_time(events[1]) * 1e6
    return host_ns, output, device_ns


# Untimed calls of each callable before a tool measures it. The first calls of a shape pay one-time work (an
# extension's or Triton's build, a graph's capture, buffers' first touch, a communicator's setup) that no later call
# pays; five is what the anchors and traces have always used, more than any version has needed. The official loop
# takes none: its warm-up is the runner's (a separate first case, and the checked call before timing).
WARMUP_CALLS = 5


class Step(NamedTuple):
    """One measured step, as `measure`'s after_step sees it (this rank's numbers; `output` the call's)."""
    label: str
    host_ns: float
    device_ns: Optional[float]
    call_ns: Optional[float]
    output: Any


@dataclasses.dataclass
class Measured:
    """One label's steps in order: `host_ns` this rank's (rank 0's are the official numbers), `device_ns` and
    `call_ns` the slowest rank's (device clock around the call; host time inside the call), empty where not taken."""
    host_ns: list
    device_ns: list
    call_ns: list


def measure(calls: dict, data, rank: int, schedule, warmup: int = WARMUP_CALLS, device_clock: bool = False,
            call_clock: bool = False, probe: Optional[Callable[[str], None]] = None,
            before_step: Optional[Callable] = None, after_step: Optional[Callable[[Step], bool]] = None) -> dict:
    """The one rank-side measuring loop, around timed_step: `warmup` untimed calls of each callable in `calls`
    ({label: callable, or None for the harness floor}), then one timed step per label in `schedule` (labels in step
    order: a run of one, variants taking turns, A and B mirrored). `device_clock`: device time around the call;
    `call_clock`: host time inside the call (two more stamps in the timed window, so off for official numbers).
    `before_step(label)` may return the next step's input (leaderboard mode's fresh seed); `after_step(step)`
    returning True stops the loop, and must agree across ranks. A collective: every rank runs the same schedule.
    Returns {label: Measured}."""
    for call in calls.values():
        for _ in range(warmup if call is not None else 0):
            call(clone_data(data, rank))
    synchronize()
    stamps: dict = {}

    def boundary(name: str) -> None:
        stamps[name] = time.perf_counter_ns()
        if probe:
            probe(name)

    step_probe = boundary if call_clock else probe

    taken = {label: Measured([], [], []) for label in calls}
    for label in schedule:
        data = (before_step(label) if before_step else None) or data
        host_ns, output, device_ns = timed_step(calls[label], data, rank, device_clock=device_clock, probe=step_probe)
        call_ns = stamps["returned"] - stamps["cloned"] if call_clock and calls[label] is not None else None
        taken[label].host_ns.append(host_ns)
        if device_ns is not None:
            taken[label].device_ns.append(device_ns)
        if call_ns is not None:
            taken[label].call_ns.append(call_ns)
        if after_step and after_step(Step(label, host_ns, device_ns, call_ns, output)):
            break
        del output
    for label in calls:
        if taken[label].device_ns:
            taken[label].device_ns = slowest_rank(taken[label].device_ns, rank)
        if taken[label].call_ns:
            taken[label].call_ns = slowest_rank(taken[label].call_ns, rank)
    return taken


def _custom_kernel() -> Callable:
    """The submission's custom_kernel, imported on first use inside a case, as the runner does: a load_inline build
    at import time happens here, in every worker at once, within the case's time limit."""
    global _kernel, _import_s
    if _kernel is None:
        _set_phase("importing the submission")
        started = time.monotonic()
        import submission

        kernel = getattr(submission, "custom_kernel", None)
        if not callable(kernel):
            raise ImportError("submission.py defines no custom_kernel(data)")
        _kernel, _import_s = kernel, time.monotonic() - started
    return _kernel


def _checked(check_implementation, unchanged, output) -> tuple[bool, str]:
    """The reference's check, after the rule the reference cannot see: the output is a plain torch.Tensor (a
    subclass can answer any question the check asks, e.g. `torch.allclose`, with a lie)."""
    import torch

    if isinstance(output, torch.Tensor) and type(output) is not torch.Tensor:
        return False, (f"custom_kernel returned a {type(output).__name__}, a subclass of torch.Tensor; the output "
                       "must be a plain torch.Tensor")
    return check_implementation(unchanged, output)


def _shipped(unchanged, output) -> dict:
    """What the check apart needs (human face): the output and the inputs the closed form reads, as plain CPU
    tensors, taken in the worker before anything else runs there."""
    import torch

    cfg, rank_data, _, world_size = unchanged
    plain = output.detach().cpu().clone() if type(output) is torch.Tensor else None
    return {"output": plain, "returned": type(output).__name__, "x": rank_data.x.cpu(),
            "indices": rank_data.indices.cpu(), "weights": rank_data.weights.cpu(), "num_experts": cfg.num_experts,
            "world_size": world_size}


def _rank_test(test: TestCase, rank: int, apart: bool = False):
    generate_input, check_implementation = _reference
    custom_kernel = _custom_kernel()
    _set_phase("generating input")
    data = generate_input(**test.args, rank=rank)
    unchanged = snapshot(data)
    synchronize()
    _set_phase("in custom_kernel")
    output = custom_kernel(clone_data(data, rank))
    synchronize()
    _set_phase("checking the output")
    good, message = _checked(check_implementation, unchanged, output)
    return good, ({"apart": _shipped(unchanged, output)} if good and apart else message)


def _rank_benchmark(test: TestCase, rank: int, recheck: bool, max_repeats: int, max_time_ns: float, extra: bool):
    import torch
    import torch.distributed as dist

    generate_input, check_implementation = _reference
    custom_kernel = _custom_kernel()
    _set_phase("generating input")
    data = generate_input(**test.args, rank=rank)
    unchanged = snapshot(data)
    _set_phase("in custom_kernel")
    output = custom_kernel(clone_data(data, rank))
    _set_phase("checking the output")
    good, message = _checked(check_implementation, unchanged, output)
    if not all_ok(good, rank):
        return False, RankFailure(message) if not good else RankFailure("another rank failed its check", True)
    apart = _shipped(unchanged, output) if extra else None

    _set_phase("in the timing loop")
    bm_start = time.perf_counter_ns()
    current = {"unchanged": unchanged, "failure": None}
    durations: list = []

    def fresh_input(_label):
        if not recheck:
            return None
        test.args["seed"] += LEADERBOARD_SEED_STEP
        fresh = generate_input(**test.args, rank=rank)
        current["unchanged"] = snapshot(fresh)
        return fresh

    def checked_and_stopping(step: Step) -> bool:
        durations.append(step.host_ns)
        error_message = None
        if recheck:
            good, message = _checked(check_implementation, current["unchanged"], step.output)
            error_message = None if good else message
        if not all_ok(error_message is None, rank):
            current["failure"] = RankFailure(error_message or "another rank failed its check", not error_message)
            return True
        should_stop = False
        if rank == 0 and len(durations) > 2:
            stats = calculate_stats(durations)
            should_stop = (stats.err / stats.mean < 0.001 or stats.mean * stats.runs > max_time_ns
                           or time.perf_counter_ns() - bm_start > 120e9)
        stop = torch.tensor([should_stop], dtype=torch.bool, device=rank_device(rank))
        dist.broadcast(stop, 0)
        return bool(stop.item())

    timed = measure({"call": custom_kernel}, data, rank, ["call"] * max_repeats, warmup=0, device_clock=extra,
                    before_step=fresh_input, after_step=checked_and_stopping)["call"]
    if current["failure"]:
        return False, current["failure"]
    result = {"stats": calculate_stats(durations) if rank == 0 else None, "apart": apart}
    if extra:
        result["host"] = calculate_extra_stats(durations) if rank == 0 else None
        result["device"] = calculate_extra_stats(timed.device_ns)
        floor = measure({"floor": None}, data, rank, ["floor"] * max(len(durations), 10), warmup=0)["floor"]
        result["floor"] = calculate_extra_stats(floor.host_ns) if rank == 0 else None
    return True, result


def _rank_profile(test: TestCase, rank: int):
    from torch.profiler import ProfilerActivity, profile

    generate_input, _ = _reference
    custom_kernel = _custom_kernel()
    _set_phase("generating input")
    data = clone_data(generate_input(**test.args, rank=rank), rank)
    synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _on_gpu() else [])
    _set_phase("profiling")
    with profile(activities=activities) as prof:
        custom_kernel(data)
        synchronize()
    return True, prof.events()


def _rank_call(test: TestCase, rank: int, fn, args: tuple):
    """Any picklable fn(rank, world_size, *args): what launch.parallel_launch runs."""
    _set_phase("in the launched function")
    return True, fn(rank, test.args["world_size"], *args)


_RANK_JOBS = {"test": _rank_test, "benchmark": _rank_benchmark, "profile": _rank_profile, "call": _rank_call}


class _RankPrefix:
    """Line-prefixing wrapper for a worker's stdout/stderr (`[rank3] ...`), human face only."""

    def __init__(self, stream, prefix: str):
        self.stream, self.prefix, self.at_line_start = stream, prefix, True

    def write(self, text: str):
        out = []
        for piece in text.splitlines(keepends=True):
            out += [self.prefix, piece] if self.at_line_start else [piece]
            self.at_line_start = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _join_group(rank: int, world_size: int, setup: RankSetup, case_id: int):
    """The runner's group: NCCL bound to cuda:rank through `device_id`, which does not change the current device."""
    import torch
    import torch.distributed as dist

    if setup.rank_prefix:
        if not isinstance(sys.stdout, _RankPrefix):  # a closed stream (None) prints nowhere, without a traceback
            sys.stdout, sys.stderr = (_RankPrefix(stream or open(os.devnull, "w"), "")
                                      for stream in (sys.stdout, sys.stderr))
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
        dist.init_process_group(setup.backend, rank=rank, world_size=world_size, device_id=rank_device(rank),
                                **rendezvous)
        loaded = loaded_nccl_version() if setup.nccl_version else None
        if setup.nccl_version and loaded != setup.nccl_version:
            raise UserError(f"ranks sharing a GPU need NCCL {setup.nccl_version} and this rank loaded "
                            f"{loaded or 'no NCCL library'}")


# What a peer's failure looks like from a rank that was waiting on it in a collective.
_FOLLOW_ON = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator|"
                        r"ProcessGroup(Gloo|NCCL)|gloo/transport|another rank failed", re.IGNORECASE)
BUILD_ERROR_LINES = 4


def _failure_from_exception(exc: BaseException) -> RankFailure:
    """The exception type, its message on one line and the innermost frame of the submission, if any. A failed
    extension build keeps only the compiler's error lines."""
    import torch.distributed as dist

    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if f.filename.endswith("submission.py")), frames[-1] if frames else None)
    location = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    text = str(exc)
    if "Error building extension" in text:
        errors = [line.strip() for line in text.splitlines() if "error" in line.lower()]
        text = " | ".join(errors[:BUILD_ERROR_LINES]) or text.splitlines()[0]
    message = " ".join(text.split())
    follow_on = isinstance(exc, getattr(dist, "DistError", ())) or bool(_FOLLOW_ON.search(message))
    return RankFailure(f"{type(exc).__name__}: {message}{location}", follow_on=follow_on)


def _rank_entry(job: str, test: TestCase, rank: int, params: dict, setup: RankSetup, case_id: int) -> RankResult:
    """Runs one rank of one case in a pool worker."""
    import torch.distributed as dist

    global _setup, _import_s
    _setup, _import_s = setup, None
    try:
        _set_phase("joining the process group")
        _join_group(rank, test.args["world_size"], setup, case_id)
        try:
            ok, value = _RANK_JOBS[job](test, rank, **params)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        if not ok and not isinstance(value, RankFailure):
            value = RankFailure(str(value))
        return RankResult(ok, value, _import_s)
    except BaseException as exc:  # reported to the parent, which owns the exit status
        return RankResult(False, _failure_from_exception(exc), _import_s)


# What a pool worker is doing, kept in shared memory so the watchdog can say where a stuck rank is.
PHASES = ("idle", "joining the process group", "importing the submission", "generating input", "in custom_kernel",
          "checking the output", "in the timing loop", "profiling", "in the launched function")
_phase_slot = None


def _set_phase(name: str) -> None:
    if _phase_slot is not None:
        _phase_slot.value = PHASES.index(name)


def _worker_loop(conn, phase_slot, parent_pid: int) -> None:
    """A pool worker: runs one rank of a case per message until it gets None. Dies with the pool's owner."""
    global _phase_slot, _reference
    die_with_parent()
    # Ctrl-C reaches the whole process group: the pool's owner ends the run and its workers; a worker's own
    # KeyboardInterrupt would only add a traceback per rank.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() != parent_pid:  # the owner died before the line above took effect
        os._exit(1)
    _phase_slot = phase_slot
    with contextlib.suppress(ImportError):  # tools' pools run where no bundle is importable
        from reference import check_implementation, generate_input

        _reference = (generate_input, check_implementation)
    while (message := conn.recv()) is not None:
        result = _rank_entry(*message)
        _set_phase("idle")
        conn.send(result)
    # Out now: a normal interpreter exit would wait for any thread a submission left running (seen: 10 s per worker
    # of the pool's grace, then a kill), and the pool's owner has already ended what the submission forked.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


@contextlib.contextmanager
def environment_with(extra: dict):
    """os.environ with `extra` set, for the duration (what a spawned process starts with)."""
    before = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _death_message(exitcode: Optional[int]) -> str:
    with contextlib.suppress(ValueError, TypeError):
        if exitcode < 0:
            return f"rank process died (exit code {exitcode}, {signal.Signals(-exitcode).name})"
    return f"rank process died (exit code {exitcode})"


class RankPool:
    """Processes reused across cases, like the official runner's spawn pool, with a watchdog.

    As on the leaderboard, a process does not keep its rank: worker (rank + case number) % size runs `rank`, so
    per-process GPU state must be rebuilt for every process group. A case that runs past its timeout has its
    workers killed (SIGKILL, with whatever they started) and the ranks that did not return are named; a fresh worker
    takes a killed one's place when a later case needs it. Each worker talks over its own pipe, so a killed worker
    leaves no lock held.

    `master_port` None: this process holds a TCP store on a port the OS gave it for the pool's whole life and the
    ranks of case n join it as clients under the prefix `case<n>/`, so no port is ever bound twice. A port number:
    rank 0 of every case hosts the rendezvous there (the runner's way); after a watchdog kill the next port is
    used, since the killed rank 0 may leave it in TIME_WAIT.

    `env`: variables every worker starts with on top of this process's own (ranks sharing GPUs: the MPS pipe
    folder, the SM share, NCCL's multi-rank switch and library; a2a/sharing.py)."""

    def __init__(self, size: int, backend: str, master_port: Optional[int] = None, rank_prefix: bool = False,
                 env: Optional[dict] = None):
        self.context = multiprocessing.get_context("spawn")
        self.backend, self.rank_prefix, self.env = backend, rank_prefix, dict(env or {})
        self.nccl_version = self.env.get("A2A_NCCL_VERSION", os.environ.get("A2A_NCCL_VERSION"))
        self.store, self.master_port = None, master_port
        if master_port is None:
            import torch.distributed as dist

            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.workers = [self._start() for _ in range(size)]
        self.cases_run = 0

    def _setup(self) -> RankSetup:
        if self.store is not None:
            return RankSetup(self.backend, store_port=self.store.port, rank_prefix=self.rank_prefix,
                             nccl_version=self.nccl_version)
        return RankSetup(self.backend, master_port=self.master_port, rank_prefix=self.rank_prefix,
                         nccl_version=self.nccl_version)

    def _start(self):
        parent_end, child_end = self.context.Pipe()
        phase = self.context.RawValue("i", 0)
        process = self.context.Process(target=_worker_loop, args=(child_end, phase, os.getpid()), daemon=True)
        # NOTES: multiprocessing's tracker, which the first spawn starts, is this process's helper, not a rank: it
        # starts here with this process's own environment, since MPS's guardian ends every process that carries the
        # ranks' pipe folder (a2a/sharing.py).
        multiprocessing.resource_tracker.ensure_running()
        with environment_with(self.env):  # a spawned worker starts with this process's environment
            process.start()
        child_end.close()
        return process, parent_end, phase

    def _where(self, slot: int, test: TestCase) -> str:
        phase = PHASES[self.workers[slot][2].value]
        return f"in {test.spec}" if phase == "in the launched function" else phase

    def run(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None) -> list[RankResult]:
        """Runs `job` on every rank of `test`; one RankResult per rank (value a RankFailure when not ok)."""
        world_size = test.args["world_size"]
        slots = [(rank + self.cases_run) % len(self.workers) for rank in range(world_size)]
        for slot in slots:
            if self.workers[slot] is None:
                self.workers[slot] = self._start()
        case_id, self.cases_run = self.cases_run, self.cases_run + 1
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
                        results[rank] = RankResult(False, RankFailure(_death_message(process.exitcode)))
                elif not process.is_alive():
                    results[rank] = RankResult(False, RankFailure(_death_message(process.exitcode)))
            failed = [rank for rank, result in results.items() if not result.ok]
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
                self._retire(slots)
                return [results.get(rank, RankResult(False, failure)) for rank in range(world_size)]
            time.sleep(0.002)
        self._retire([slot for slot in slots if not self.workers[slot][0].is_alive()])
        return [results[rank] for rank in range(world_size)]

    def _retire(self, slots: list[int]) -> None:
        """Kills the workers in `slots` with everything below them; run() starts fresh ones when needed."""
        for slot in slots:
            process, conn, _ = self.workers[slot]
            kill_tree(process.pid, include_root=process.is_alive())
            process.join()
            conn.close()
            self.workers[slot] = None
        if slots and self.master_port is not None:
            self.master_port += 1

    def shutdown(self) -> None:
        """Ends what the submission started in each worker, then lets the workers exit (SIGKILL after 10 s)."""
        live = [worker for worker in self.workers if worker is not None]
        for process, conn, _ in live:
            kill_tree(process.pid, include_root=False)
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + 10  # one grace for the whole pool, not one per worker
        for process, conn, _ in live:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                kill_tree(process.pid)
                process.join()
            conn.close()
        self.workers = []

    def kill(self) -> None:
        """Ends every worker and everything below it at once (a signal or an error)."""
        self._retire([slot for slot, worker in enumerate(self.workers) if worker is not None])
        self.workers = []


# --------------------------------------------------------------------------------------------------------------
# Protocol modes
# --------------------------------------------------------------------------------------------------------------

FOLLOW_ON_SUMMARY_CHARS = 160


def rank_failures(results: list[RankResult]) -> str:
    """The failing ranks' own errors first, whole, in the order they happened; then, summarised, what their peers
    hit because of them."""
    failures = [(rank, result.value) for rank, result in enumerate(results) if not result.ok]
    causes = sorted((f for f in failures if not f[1].follow_on), key=lambda f: f[1].at)
    follow_ons = sorted((f for f in failures if f[1].follow_on), key=lambda f: f[1].at)
    if not causes:
        causes, follow_ons = follow_ons, []
    grouped: dict = {}  # one line per distinct error: the watchdog's sentence names every rank it killed once
    for rank, failure in causes:
        grouped.setdefault(failure.message, []).append(rank)
    lines = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} - {message}"
             for message, ranks in grouped.items()]
    if follow_ons:
        summary = "; ".join(f"rank {rank}: {failure.message[:FOLLOW_ON_SUMMARY_CHARS]}"
                            + ("..." if len(failure.message) > FOLLOW_ON_SUMMARY_CHARS else "")
                            for rank, failure in follow_ons)
        lines.append(f"follow-on (after the failure above): {summary}")
    return "\n".join(lines)


@dataclasses.dataclass
class ProtocolRun:
    """One protocol-face run: the output, the pool and what the human face asked for (A2A_*, read once)."""
    logger: PopcornOutput
    pool: RankPool
    backend: str
    extra: bool
    timeout_s: Optional[float]
    import_logged: bool = False

    def case(self, job: str, test: TestCase, mode: str, params: Optional[dict] = None) -> list[RankResult]:
        results = self.pool.run(job, test, self.timeout_s or OFFICIAL_TIMEOUT_S[mode], params)
        imports = [r.import_s for r in results if r.import_s is not None]
        if self.extra and imports and not self.import_logged:  # human face: what the first case spent importing
            self.logger.log("import_s", f"{max(imports):.2f}")
            self.import_logged = True
        return results


def check_apart(shipped: dict) -> tuple[bool, str]:
    """The check made where the submission cannot reach (human face): in this process, which never imports the
    submission, against the closed form (no communication), with this process's own torch and reference, imported
    before any rank started. What it cannot see: a worker whose own code the submission rewrote to ship something
    else (README, "What a submission cannot do")."""
    import types

    from reference import check_output, closed_form_output

    if shipped["output"] is None:
        return False, f"custom_kernel returned a {shipped['returned']}, not a plain torch.Tensor"
    cfg = types.SimpleNamespace(num_experts=shipped["num_experts"], out_dtype=shipped["output"].dtype)
    rank_data = types.SimpleNamespace(x=shipped["x"], indices=shipped["indices"], weights=shipped["weights"])
    return check_output(shipped["output"], closed_form_output((cfg, rank_data, None, shipped["world_size"])))


def _failed_apart(results: list[RankResult]) -> list[RankResult]:
    """Ranks whose output the check apart rejects, as failures (the check in their own process had passed); ranks
    that shipped nothing (the protocol face: no check apart) pass through."""
    checked = []
    for result in results:
        shipped = result.value.pop("apart", None) if result.ok and isinstance(result.value, dict) else None
        good, message = check_apart(shipped) if shipped else (True, "")
        checked.append(result if good else RankResult(False, RankFailure(
            "the output failed the check made outside the submission's process, although the check in it passed "
            f"(something in that process changed what the check saw): {message}"), result.import_s))
    return checked


def run_testing(run: ProtocolRun, tests: list[TestCase]) -> int:
    passed = True
    run.logger.log("test-count", len(tests))
    for idx, test in enumerate(tests):
        run.logger.log(f"test.{idx}.spec", test.spec)
        results = _failed_apart(run.case("test", test, "test", {"apart": True} if run.extra else None))
        if all(r.ok for r in results):
            run.logger.log(f"test.{idx}.status", "pass")
        else:
            passed = False
            run.logger.log(f"test.{idx}.status", "fail")
            run.logger.log(f"test.{idx}.error", rank_failures(results))
    run.logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _benchmark(run: ProtocolRun, test: TestCase, recheck: bool, max_time_ns: float, mode: str):
    params = dict(recheck=recheck, max_repeats=MAX_REPEATS, max_time_ns=max_time_ns, extra=run.extra)
    results = _failed_apart(run.case("benchmark", test, mode, params))
    return results[0].value if all(r.ok for r in results) else rank_failures(results)


def run_benchmarking(run: ProtocolRun, tests: list[TestCase], mode: str) -> int:
    """The runner's order: a warm-up on the first case (0.1 s budget in benchmark mode, 0.01 s in leaderboard
    mode), then every case; leaderboard mode rechecks with fresh seeds, logs each spec after its run and stops at
    the first failure."""
    leaderboard = mode == "leaderboard"
    _benchmark(run, tests[0], False, 1e7 if leaderboard else 1e8, mode)
    run.logger.log("benchmark-count", len(tests))
    passed = True
    for idx, test in enumerate(tests):
        if not leaderboard:
            run.logger.log(f"benchmark.{idx}.spec", test.spec)
        result = _benchmark(run, test, leaderboard, 30e9 if leaderboard else 10e9, mode)
        if leaderboard:
            run.logger.log(f"benchmark.{idx}.spec", test.spec)
        if isinstance(result, str):
            passed = False
            run.logger.log(f"benchmark.{idx}.status", "fail")
            run.logger.log(f"benchmark.{idx}.error", result)
            if leaderboard:
                break
            continue
        for field in dataclasses.fields(Stats):
            run.logger.log(f"benchmark.{idx}.{field.name}", getattr(result["stats"], field.name))
        if result.get("host") is not None:
            for name in QUANTILES:
                run.logger.log(f"benchmark.{idx}.{name}", getattr(result["host"], name))
        for kind in EXTRA_STATS:
            if result.get(kind) is not None:
                for field in EXTRA_STAT_FIELDS:
                    run.logger.log(f"benchmark.{idx}.{kind}_{field}", getattr(result[kind], field))
    run.logger.log("check", "pass" if passed else "fail")
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


def run_profiling(run: ProtocolRun, tests: list[TestCase]) -> int:
    passed = True
    run.logger.log("benchmark-count", len(tests))
    for idx, test in enumerate(tests):
        run.logger.log(f"benchmark.{idx}.spec", test.spec)
        results = run.case("profile", test, "profile")
        if not all(r.ok for r in results):
            passed = False
            run.logger.log(f"benchmark.{idx}.status", "fail")
            run.logger.log(f"benchmark.{idx}.error", rank_failures(results))
            continue
        sort_key = "self_cuda_time_total" if run.backend != "gloo" else "self_cpu_time_total"
        report = _combine_traces([r.value for r in results]).table(sort_by=sort_key, row_limit=20)
        run.logger.log(f"benchmark.{idx}.report", base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    run.logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _environment() -> tuple[int, Optional[int], int]:
    """POPCORN_FD, POPCORN_SEED (removed from the environment, as the runner does) and POPCORN_GPUS."""
    seed = os.environ.pop("POPCORN_SEED", None)
    values = {}
    for name, text, low, high in (("POPCORN_FD", os.getenv("POPCORN_FD"), 0, 2**31 - 1),
                                  ("POPCORN_SEED", seed, 0, SEED_MAX),
                                  ("POPCORN_GPUS", os.getenv("POPCORN_GPUS", "1"), 1, 64)):
        if text is None or (text == "" and name != "POPCORN_GPUS"):  # the GPU count has a default, never empty
            values[name] = None
            continue
        if not re.fullmatch(r"[0-9]+", text.strip()) or not low <= int(text) <= high:
            raise UserError(f"{name} must be an integer from {low} to {high}, not '{text[:40]}'")
        values[name] = int(text)
    fd = values["POPCORN_FD"]
    try:
        mode = os.fstat(fd).st_mode
        writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except (OSError, TypeError):
        raise UserError(f"POPCORN_FD={fd} is not an open file descriptor") from None
    if not writable:
        raise UserError(f"POPCORN_FD={fd} is open for reading only: the results could not be written")
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
            raise UserError(f"POPCORN_FD={fd} is a pipe or socket that nobody reads: the results would be lost")
    return fd, values["POPCORN_SEED"], values["POPCORN_GPUS"]


def _sharing_asked() -> bool:
    """A2A_SHARE=mps (the human face's, never the runner's): ranks may outnumber the GPUs, sharing them through the
    MPS control daemon named by CUDA_MPS_PIPE_DIRECTORY. Without a live daemon the ranks would be time-sliced, and
    ranks that spin on each other's flags would crawl or hang: refused."""
    share = os.environ.get("A2A_SHARE")
    if not share:
        return False
    if share != "mps":
        raise UserError(f"A2A_SHARE must be 'mps', not '{share[:40]}'")
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_DEFAULT_PIPE_DIRECTORY)
    if not Path(pipe, "control").exists():
        raise UserError(f"A2A_SHARE=mps but no MPS control daemon listens in {pipe} (CUDA_MPS_PIPE_DIRECTORY)")
    return True


def protocol_main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        print(f"usage: POPCORN_FD=N python eval.py {{{'|'.join(MODES)}}} TESTFILE", file=sys.stderr)
        return EXIT_USAGE
    sys.path.insert(0, str(HERE))
    mode, test_file = sys.argv[1], sys.argv[2]
    try:
        fd, seed, n_gpus = _environment()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    hide_result_channel()
    claim_run(inherit=True)
    install_signal_handlers()
    become_subreaper()
    pool = None
    try:
        tests = read_test_file(Path(test_file), seed)
        import torch
        from utils import set_seed

        set_seed(seed or 42)
        import reference  # noqa: F401  (this process's own, before any rank runs: the check apart reads it)
        backend = os.environ.get("A2A_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
        validate_cases(tests, n_gpus, backend, torch.cuda.device_count(), shared=_sharing_asked())
        timeout = os.environ.get("A2A_TIMEOUT")
        with PopcornOutput(fd) as logger:
            pool = RankPool(n_gpus, backend, None if os.environ.get("A2A_RENDEZVOUS") == "private"
                            else DEFAULT_MASTER_PORT, bool(os.environ.get("A2A_RANK_PREFIX")))
            run = ProtocolRun(logger, pool, backend, bool(os.environ.get("A2A_EXTRA")),
                              float(timeout) if timeout else None)
            if mode == "test":
                code = run_testing(run, tests)
            elif mode == "profile":
                code = run_profiling(run, tests)
            else:
                code = run_benchmarking(run, tests, mode)
            pool.shutdown()
            pool = None
            return code
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Terminated as stop:
        print(f"eval.py: {stop.name} received; every rank and what it started has been stopped", file=sys.stderr)
        return 128 + stop.signum
    except Exception as exc:  # a bug in the evaluator, not the submission's doing
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"eval.py: internal error: {type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})",
              file=sys.stderr)
        return EXIT_CRASH
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
    sys.exit(__import__("a2a.harness", fromlist=["main"]).main(sys.argv[1:]))
