#!/usr/bin/env python3
"""The all2all evaluator's protocol core: the file a leaderboard bundle runs as eval.py.

    POPCORN_FD=3 [POPCORN_SEED=S] [POPCORN_GPUS=N] python eval.py test|benchmark|leaderboard|profile TESTFILE

It imports `reference`, `utils`, `task` and `submission` from its own folder, writes `key: value` lines to the file
descriptor POPCORN_FD and exits 112 when a check fails. The process model is the runner's (gpu-mode reference-kernels,
problems/amd_distributed/eval.py): a spawn pool of POPCORN_GPUS workers reused across cases (a worker is rank 0 in one
case and another rank in the next), an NCCL group per case with `device_id` on the fixed port, no `set_device` anywhere
(the current device stays cuda:0 in every worker), the submission imported inside the worker during the first case and
within that case's time limit, the same timed loop, seeds, warm-up and stop rules. Every step is the owner's
(judge.py): this process makes each rank's input, places it in the rank's shared buffer after its clock starts, checks
the output it copies out when every rank says done, and keeps the time; the ranks run `run_steps`, and nothing in their
processes is trusted. What differs from the runner, and why none of it can turn a failure there into a pass here:
docs/judge.md, "Faithful to the runner".

Run from the repository without POPCORN_FD, it hands over to the human face (a2a/harness.py). The human face's options
arrive as A2A_* variables, read once in `protocol_main`: A2A_BACKEND, A2A_EXTRA (device-side time, harness floor,
import time), A2A_JUDGE (keyed case seeds, a fresh input in every timed step), A2A_RANK_PREFIX, A2A_TIMEOUT,
A2A_RENDEZVOUS=private (ranks join a store on a port the OS gave this process, not the fixed one), A2A_SHARE=mps (more
ranks than GPUs: rank r on cuda:(r mod GPUs), sharing through the MPS daemon the human face holds; a2a/sharing.py) with
A2A_NCCL_VERSION (the NCCL every rank must have loaded). Without A2A_SHARE a bundle refuses more ranks than GPUs, as
the runner does. A2A_MASTER_PORT moves the fixed port (parallel test workers); the runner never sets it.

Also the library the human face and the tools build on: `__all__` below, exactly the names they use
(tests/test_layers.py holds it to them): RankPool, CaseSteps and run_steps for the judge's steps; rank_device,
own_device, clone_data, all_ok, and the primitives under a2a/bench.py, the tools' measuring loop in a rank's own
process (never a verdict).
"""
from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import faulthandler
import fcntl
import hashlib
import importlib.util
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.resource_tracker
import os
import re
import select
import signal
import socket
import stat
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bundle's own modules, wherever it is run from
from boundary import (MPS_DEFAULT_PIPE, RankSandbox, RUN_OWNER, Sandbox,  # noqa: E402
                      become_subreaper, claim_run, death_message, descendants, die_with_parent, ended_for_text,
                      enter_rank_sandbox, hide_result_channel, keep_newest, kill_tree, owned_tempdir, owners_name,
                      pool_memory_bytes, prepare_rank_cache, release_uid, write_owners_only)
import births  # noqa: E402
import rank_writable  # noqa: E402
from births import (KILLED_WAIT_S, Forked, Nursery, PhaseSlot, Zygote, close_all_but, environ_with,  # noqa: E402
                    environment_with, join_within, owner_cpu, pinned_cpus, rank_birth, send_fds, stdin_from_null)
import channels  # noqa: E402
import judge  # noqa: E402
from judge import HOLD_MAX_CYCLES, HOLD_START_CYCLES, cantor_combine  # noqa: E402
import wire  # noqa: E402

__all__ = [  # what a2a/, tools/, run_leaderboard.py and diff.py use; everything else is the core's own
    "all_ok", "bound", "calculate_extra_stats", "cantor_combine", "case_problem", "CaseSteps", "check_environment",
    "claim_run", "clone_data", "cover_rank_writable", "die_with_parent", "environ_with", "environment_with",
    "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED", "EXIT_CRASH", "EXTRA_STAT_FIELDS", "EXTRA_STATS", "get_test_cases", "HERE",
    "import_submission", "install_signal_handlers", "kill_tree", "LEADERBOARD_SEED_STEP", "LOG_DIR_ENV",
    "machine_gpus", "MODES", "MPS_DEFAULT_PIPE", "nccl_version_tuple", "OFFICIAL_TIMEOUT_S", "own_device",
    "owned_tempdir", "owner_cpu", "pinned_cpus", "prepare_rank_cache", "rank_birth", "rank_device", "rank_failures",
    "RankPool", "release_uid", "RUN_OWNER", "run_steps", "SEED_MAX", "SPEC_KEYS", "spec_line", "start_nursery",
    "Terminated", "TestCase", "transport_text", "UserError", "validate_cases", "version_text",
    # what a2a/bench.py, the tools' measuring loop, builds on
    "barrier", "Bound", "clear_l2", "Hold", "on_gpu", "synchronize", "timing_events",
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
FAILED_PEER_GRACE_S = 10.0  # after one rank of a case failed, how long the others get before the watchdog
DEFAULT_MASTER_PORT = 12356  # the runner's fixed rendezvous port
# Moves the protocol face's fixed port (never set by the runner): runs side by side, each on a port of its own.
MASTER_PORT_ENV = "A2A_MASTER_PORT"
# The judge's own run (the human face sets it; never the runner): keyed seeds, fresh inputs in benchmark mode too.
JUDGE_ENV = "A2A_JUDGE"
MAX_REPEATS = 100
LEADERBOARD_SEED_STEP = 13  # the runner's step between leaderboard mode's seeds (the judge draws its own)
L2_CLEAR_BYTES = 256 * 1024 * 1024  # the runner's L2 clear (utils.clear_l2_cache)
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
    # The clean-up must not be cut short by a second signal (one while the pool was killed left a child behind).
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(signum)


def install_signal_handlers() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _raise_terminated)


# --------------------------------------------------------------------------------------------------------------
# Test files and case values
# --------------------------------------------------------------------------------------------------------------


LOGGED_CHARS = 20000  # one logged value at most: a failed case's errors, every rank's


class PopcornOutput:
    def __init__(self, fd: int):
        self.file = os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")  # any locale (red team 52: 114)
        os.set_inheritable(fd, False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with contextlib.suppress(OSError):  # what a failed write left in the buffer (log said so already)
            self.file.close()

    def log(self, key, value):
        """`key: value` on one line: a value that holds a rank's words (an error) is escaped (wire.as_text). A
        descriptor that takes no write (a full disk, /dev/full) is bad input, found at the first key, before any case
        (red team 69: 114)."""
        try:
            print(f"{key}: {wire.as_text(str(value), LOGGED_CHARS)}", file=self.file, flush=True)
        except OSError as exc:
            raise UserError(f"POPCORN_FD: the results could not be written ({exc.strerror})") from None


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
EXTRA_STATS = ("device", "floor", "race", "gap")
QUANTILES = {"p50": 0.5, "p90": 0.9}


@dataclasses.dataclass
class ExtraStats:
    runs: int
    mean: float
    best: float
    p50: float
    p90: float


EXTRA_STAT_FIELDS = tuple(field.name for field in dataclasses.fields(ExtraStats))


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
        text = wire.read_regular_file(path, MAX_TEST_FILE_BYTES).decode("utf-8")
    except wire.NotRegular as exc:  # not a regular file, or past 1 MiB (1000 of the longest case lines)
        raise UserError(f"test file `{path}` is {exc}") from None
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


def _torch_build() -> dict:
    """The `cuda` and `hip` versions the installed torch was built for (None for a build without), read from its
    version.py without importing torch; {} where that file cannot be read."""
    try:
        spec = importlib.util.find_spec("torch")
        text = (Path(spec.origin).parent / "version.py").read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        return {}
    found = {name: re.search(rf"^{name}\s*(?::[^=]*)?=\s*(None|'[^']*')", text, re.M) for name in ("cuda", "hip")}
    if not all(found.values()):
        return {}
    return {name: None if match.group(1) == "None" else match.group(1).strip("'") for name, match in found.items()}


# NOTES: a process becomes an MPS client at cuInit when its CUDA_MPS_PIPE_DIRECTORY (or MPS's default folder) holds
# a control daemon, and MPS serves one uid's clients at a time. A judge's process (root, alive through its pools)
# that joined would keep every rank (a uid of its own) waiting in CUDA's first call: on 2026-11-28 (a7562e0, two
# H200s) world size 8 hung so in every case, the evaluator having counted GPUs through the driver while carrying
# the ranks' MPS variables for them; with the sandbox off (ranks as root) it passed. So the judge's driver starts
# with a pipe folder no daemon can be in (nothing can be created in /proc), and stays out of MPS for its life.
NO_MPS_PIPE = "/proc/a2a-no-mps"


def outside_mps():
    """The block's CUDA driver start (the first in a process) joins no MPS daemon (NO_MPS_PIPE)."""
    return environment_with({"CUDA_MPS_PIPE_DIRECTORY": NO_MPS_PIPE})


def _cuda_driver_gpus(cuda: str) -> int:
    """What torch.cuda.device_count() gives on a CUDA build, asked of the driver (CUDA_VISIBLE_DEVICES applies
    alike): 0 without a driver, a device, or a driver older than the CUDA major version torch was built for."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    with outside_mps():
        started = driver.cuInit(0)
    if started != 0 or driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return 0
    if version.value // 1000 < int(cuda.split(".")[0]):
        return 0
    return count.value if driver.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


def machine_gpus() -> int:
    """torch.cuda.device_count(), told without importing torch on a CPU or CUDA build (a torch import is 2-3 s of
    a small CPU; the protocol face starts its ranks first and imports torch while they do). A ROCm build is asked
    through torch."""
    build = _torch_build()
    if build and build["hip"] is None:
        return _cuda_driver_gpus(build["cuda"]) if build["cuda"] else 0
    import torch

    with outside_mps():
        return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
    """How a rank joins its case's process group. With `store_folder`, through a file store of its case in that
    folder, the pool's own (no socket, nobody else's); otherwise rank 0 hosts the rendezvous on `master_port`
    (env://), as the official runner does."""
    backend: str
    store_folder: Optional[str] = None
    master_port: int = DEFAULT_MASTER_PORT
    nccl_version: Optional[str] = None  # ranks sharing GPUs: the NCCL each must have loaded (A2A_NCCL_VERSION)


@dataclasses.dataclass
class RankFailure:
    """Why a rank failed. `follow_on`: it failed because a peer did first (a collective lost its peer, a shared
    check failed), so the report puts it after the cause."""
    message: str
    follow_on: bool = False
    at: float = dataclasses.field(default_factory=time.time)
    build_log: str = ""  # a failed extension build's whole output, which the owner writes to a file and names


class RankResult(NamedTuple):
    ok: bool
    value: Any  # the job's result, or a RankFailure


# --------------------------------------------------------------------------------------------------------------
# What a rank sends its owner is data (wire.py): a bounded format the owner decodes without running anything a rank
# chose (the owner runs as root, outside the ranks' sandbox), with the result types below as its only records.
# --------------------------------------------------------------------------------------------------------------

MAX_MESSAGE_BYTES = 64 << 20  # a rank's message: results, a profile's rows, a tool's figures; more voids the case
_WIRE_TYPES = {"RankResult": RankResult, "RankFailure": RankFailure, "Stats": Stats, "ExtraStats": ExtraStats}


def encode(obj) -> bytes:
    return wire.encode(obj, _WIRE_TYPES)


def decode(raw: bytes):
    return wire.decode(raw, _WIRE_TYPES, max_bytes=MAX_MESSAGE_BYTES)


class Tampering(Exception):
    """The harness's own machinery was changed under it (a no-op barrier, a re-registered operator, a mode that
    intercepts its calls): the case is void."""


class Bound(NamedTuple):
    """The primitives the tools' measuring loop (measure, timed_step) calls, taken in the worker before any
    submission is imported, so that a submission that patches `time.perf_counter_ns` or `torch.cuda.Event` at import
    does not bend a tool's figures by accident. It is no defence: everything in a rank's process is the
    submission's, and no verdict or ranking time is taken there (judge.py)."""
    clock_ns: Callable
    reference: tuple  # (generate_input,) (the harness rows' sizing input), or () where no bundle is importable
    on_cuda: bool
    tensor: Any  # torch.Tensor
    ops: dict  # name -> torch callable, taken from their classes and modules at start


def bind_primitives() -> Bound:
    import torch
    import torch.distributed as dist

    t = torch.Tensor
    ops = {"empty": torch.empty, "tensor": torch.tensor, "fill": t.fill_, "clone": t.clone, "to": t.to,
           "item": t.item, "tolist": t.tolist, "all_reduce": dist.all_reduce, "world_size": dist.get_world_size,
           "reduce_max": dist.ReduceOp.MAX, "reduce_sum": dist.ReduceOp.SUM, "float64": torch.float64,
           "int32": torch.int32, "int64": torch.int64}
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        event_type = torch._C._CudaEventBase
        ops.update(sync=torch._C._cuda_synchronize, new_event=lambda: event_type.__new__(event_type, enable_timing=True),
                   record=event_type.record, elapsed_ms=event_type.elapsed_time, query=event_type.query,
                   event_sync=event_type.synchronize, current_stream=torch.cuda.current_stream,
                   exchange_device=torch._C._cuda_exchangeDevice, sleep=getattr(torch._C, "_cuda_sleep", None))
    reference = ()
    with contextlib.suppress(ImportError):  # tools' pools run where no bundle is importable
        from reference import generate_input

        reference = (generate_input,)
    import types

    return Bound(time.perf_counter_ns, reference, on_cuda, t, types.MappingProxyType(ops))


_bound: Optional[Bound] = None  # the worker's, for tools' functions (the official jobs get theirs as an argument)


def bound() -> Bound:
    """The primitives this worker bound at start (a tool's rank function reads them here)."""
    if _bound is None:
        raise RuntimeError("not in a rank worker: nothing was bound")
    return _bound


_setup: Optional[RankSetup] = None
_kernel: Optional[Callable] = None
_owner_conn = None  # the worker's pipe to the pool's owner (descriptors it sends with a job: receive_fds)


def on_gpu() -> bool:
    import torch

    return _setup is not None and _setup.backend != "gloo" and torch.cuda.is_available()


def rank_device(rank: int):
    """Where a rank's inputs live: cuda:(rank mod GPUs) on a GPU run (cuda:rank under the runner, which never has
    more ranks than GPUs), else the CPU."""
    import torch

    return torch.device(f"cuda:{rank % torch.cuda.device_count()}") if on_gpu() else torch.device("cpu")


def own_device(rank: int):
    """A guard for a tool's own GPU work (probes, markers, its buffers) on its rank's device; on exit the current
    device is again what the runner leaves (cuda:0). Never put a submission's call inside it."""
    import torch

    return torch.cuda.device(rank_device(rank)) if on_gpu() else contextlib.nullcontext()


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


def synchronize(b: Optional[Bound] = None) -> None:
    """torch.cuda.synchronize() as the runner calls it: on the current device, which the runner never changes."""
    b = b or bound()
    if on_gpu():
        b.ops["sync"]()


def clear_l2(b: Bound) -> None:
    """utils.clear_l2_cache's work (a 256 MiB write on the current device, as the runner's), through bound calls."""
    if on_gpu():
        ops = b.ops
        buffer = ops["empty"](L2_CLEAR_BYTES // 8, dtype=ops["int64"], device="cuda")
        ops["fill"](buffer, 42)
        del buffer


def barrier(rank: int, b: Bound) -> None:
    """dist.barrier's work (an all-reduce every rank waits for), checked: a barrier made a no-op is caught, since
    the sum it returns must count every rank."""
    ops = b.ops
    flag = ops["tensor"]([1], dtype=ops["int32"], device=rank_device(rank))
    ops["all_reduce"](flag, op=ops["reduce_sum"])
    if ops["item"](flag) != ops["world_size"]():
        raise Tampering("the harness's barrier returned without every rank (the collective it runs was replaced)")


def clone_data(data, rank: int, b: Optional[Bound] = None):
    """The runner's clone: tensors in tuples, lists and dicts are cloned onto cuda:rank (the CPU on gloo); other
    objects (cfg, rank_data) pass through uncopied, so the timed clone costs what it costs there."""
    b = b or bound()
    if isinstance(data, tuple):
        return tuple(clone_data(x, rank, b) for x in data)
    if isinstance(data, list):
        return [clone_data(x, rank, b) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v, rank, b) for k, v in data.items()}
    if isinstance(data, b.tensor):
        return b.ops["to"](b.ops["clone"](data), rank_device(rank))
    return data


def all_ok(ok: bool, rank: int, b: Optional[Bound] = None) -> bool:
    """True when every rank's `ok` is true (a collective: all ranks must call it)."""
    b = b or bound()
    ops = b.ops
    flag = ops["tensor"]([0 if ok else 1], dtype=ops["int32"], device=rank_device(rank))
    ops["all_reduce"](flag)
    return ops["item"](flag) == 0


# Holding the stream (nvbench's blocking kernel): a sleep kernel queued before the start event keeps the GPU from
# starting the call's work until the host has queued all of it, so the events time the GPU's work alone. Its
# length adapts: a step whose start event had already passed when the call returned was not held (the sleep was too
# short for this host path, and the next is eight times longer); after HOLD_GIVE_UP such steps at the longest sleep
# (the fifth held step at the latest) the call is taken to synchronize inside (no sleep can outlast its queueing)
# and is timed on an idle stream instead, as nvbench's exec_tag::sync does. With peers, a flag round among the ranks
# after the sleep (Hold.align) starts every rank's call together, so a rank's held time is its call's, not its wait
# for the last peer to arrive (up to ~100 µs at world size 4 without it, 2026-11-27).
HOLD_GIVE_UP = 2  # HOLD_START_CYCLES and HOLD_MAX_CYCLES: judge.py's (the owner's steps set every rank's hold)


@dataclasses.dataclass
class Hold:
    cycles: int = HOLD_START_CYCLES
    align: Optional[Callable] = None  # with peers: a flag round among the ranks, queued after the sleep (a2a/clock.py)
    misses_at_max: int = 0
    sync_inside: bool = False
    held: int = 0
    not_held: int = 0

    def after(self, was_held: bool) -> None:
        if was_held:
            self.held += 1
            return
        self.not_held += 1
        if self.cycles >= HOLD_MAX_CYCLES:
            self.misses_at_max += 1
            self.sync_inside = self.misses_at_max >= HOLD_GIVE_UP and not self.held
        self.cycles = min(8 * self.cycles, HOLD_MAX_CYCLES)


_events: dict = {}


def timing_events(device, b: Bound):
    """Two timing events for this device, made once (made in the window they cost ~20 µs a step, H200 x2)."""
    if device.index not in _events:
        _events[device.index] = b.ops["new_event"](), b.ops["new_event"]()
    return _events[device.index]


def import_submission() -> Callable:
    """The submission's custom_kernel, imported on first use inside a case, as the runner does: a load_inline build
    at import time happens here, in every worker at once, within the case's time limit."""
    global _kernel
    if _kernel is None:
        _set_phase("importing the submission")
        import submission

        kernel = getattr(submission, "custom_kernel", None)
        if not callable(kernel):
            raise ImportError("submission.py defines no custom_kernel(data)")
        _kernel = kernel
    return _kernel


def receive_fds(count: int) -> list:
    """The descriptors the owner sent right after this job's message (a judge channel's buffer and pipes)."""
    return births.receive_fds(_owner_conn, count)


def _output_status(output, tokens: int, hidden: int, device) -> int:
    """judge.OUTPUT_PROBLEMS' code for what is wrong with an output's kind, shape, dtype or device; 0 when nothing."""
    import torch

    if not isinstance(output, torch.Tensor):
        return 1
    if type(output) is not torch.Tensor:
        return 2
    wrong = (tuple(output.shape) != (tokens, hidden), output.dtype != torch.float16, output.device != device)
    return next((code for code, bad in enumerate(wrong, 3) if bad), 0)


@contextlib.contextmanager
def _registered(memory, gpu: bool):
    """The channel's pages pinned for this rank's GPU copies while the steps run, then released (a later case's
    channel may be mapped at the same address, and registering it again fails)."""
    import torch

    address = ctypes.addressof(ctypes.c_char.from_buffer(memory)) if gpu else None
    error = int(torch.cuda.cudart().cudaHostRegister(address, len(memory), 0)) if gpu else 0
    if error:  # its copies still work, slower: said, so that a slow floor has a why
        print(f"the channel could not be pinned (cudaHostRegister: {error}): its copies are pageable", file=sys.stderr)
    try:
        yield
    finally:
        if gpu and not error:
            torch.cuda.cudart().cudaHostUnregister(address)


def _call_on_gpu(call: Callable, data, device, hold: Optional[Hold]) -> tuple:
    """(output, call time ns, held device time ns, held): events around the call on the device's current stream;
    with `hold`, a sleep kernel queued first keeps the stream from starting until the call has queued its work."""
    import torch

    stream = torch.cuda.current_stream(device)
    start, end = timing_events(device, bound())
    holding = hold is not None and not hold.sync_inside
    if hold is not None:
        with torch.cuda.device(device):
            if holding:
                torch.cuda._sleep(hold.cycles)
            if hold.align is not None:  # on every rank and held step, whatever its own hold state: the ranks'
                hold.align()  # calls start together, when the last rank's sleep has ended
    start.record(stream)
    output = call(data)
    end.record(stream)
    held = holding and not start.query()
    end.synchronize()
    elapsed = start.elapsed_time(end) * 1e6
    if hold is None:
        return output, elapsed, math.nan, False
    return output, math.nan, elapsed if held or hold.sync_inside else math.nan, held


def run_steps(rank: int, world_size: int, cases: list, regions: dict, call_for: Callable,
              harness_row: bool = False, align: Optional[Callable] = None) -> int:
    """A rank's end of the owner's steps (judge.Steps): at each `go`, the step's input as the runner hands it over
    (cfg, rank_data on the rank's device, rank, world size), the call (`call_for(case index)`), the output published
    into the shared buffer, `done`; returns the steps run. Nothing here is trusted. `harness_row`: the harness's own
    rows, whose outputs are not the problem's: an output-sized buffer is published instead. `align`: Hold.align."""
    device = rank_device(rank)
    gpu = device.type == "cuda"
    on_device = "gpu_bytes" in regions  # the owner shares the regions on this rank's GPU (channels.Channel)
    channel = channels.RankChannel(receive_fds(4 if on_device else 3), regions, device.index if on_device else None)
    channel.spin_ns = judge.spin_budget_ns(world_size, "A2A_RANK_SPIN_US", 20000)
    try:
        with _registered(channel.memory, gpu and not on_device):
            return _steps(channel, rank, world_size, cases, call_for, harness_row, device, Hold(align=align), regions)
    finally:
        channel.close()


def _steps(channel, rank: int, world_size: int, cases: list, call_for: Callable, harness_row: bool, device,
           hold: Hold, regions: dict) -> int:
    import torch
    from reference import MoEConfig, RankTestData

    gpu = device.type == "cuda"
    configs = [MoEConfig(c["num_experts"], c["experts_per_token"], c["hidden_dim"], c["max_num_tokens"]) for c in cases]
    floor_out = [torch.zeros(c["max_num_tokens"], c["hidden_dim"], dtype=torch.float16, device=device) for c in cases]
    # NOTES: host transport on a GPU: one copy into a device mirror (three were 141 of 293 µs, ws1 H200, 9561baf).
    mirror = channels.Views(torch.empty(regions["total"], dtype=torch.uint8, device=device), regions) \
        if gpu and channel.shared is None else None
    # NOTES: a step's views are cut from its case's whole ones, once per token count: a dozen views made in every
    # step were 34-155 µs of each window on the H200 hosts (step anatomy, "before its call", b04a593).
    extents = [(c["max_num_tokens"], c["hidden_dim"], c["experts_per_token"]) for c in cases]
    whole = [channel.views.tensors(*extent) for extent in extents]
    inputs_from = whole if mirror is None else [mirror.tensors(*extent) for extent in extents]
    made_views = {}
    steps = 0
    while True:
        _set_phase("waiting for the owner")
        kind, case, tokens = channel.wait()
        if kind == channels.STOP:
            return steps
        views, inputs = made_views.get((case, tokens)) or made_views.setdefault((case, tokens), tuple(
            {name: view[:tokens] for name, view in of[case].items()} for of in (whole, inputs_from)))
        if mirror is not None:  # else the inputs are the shared regions themselves (the device transport, or a CPU)
            first, end = channels.input_span(regions, tokens, cases[case]["hidden_dim"])
            mirror.raw_all[first:end].copy_(channel.views.raw_all[first:end], non_blocking=True)
            torch.cuda.current_stream(device).synchronize()  # in place before the call, as the device transport's are
        rank_data = RankTestData.__new__(RankTestData)
        rank_data.num_tokens = tokens
        rank_data.x, rank_data.indices, rank_data.weights = (inputs[name] for name in ("x", "indices", "weights"))
        data = (configs[case], rank_data, rank, world_size)
        call_ns, held_ns, held, failure = math.nan, math.nan, False, None
        _set_phase("in custom_kernel")
        channel.stamp(channels.CALL_FROM_NS)
        try:
            if kind == channels.FLOOR:
                output = floor_out[case][:tokens]
            elif gpu:
                if kind == channels.HELD:  # the owner's hold, the same on every rank (judge.Steps.hold_cycles)
                    hold.cycles = channel.field(channels.HOLD_CYCLES) or hold.cycles
                output, call_ns, held_ns, held = _call_on_gpu(call_for(case), data, device,
                                                              hold if kind == channels.HELD else None)
            else:
                started = time.perf_counter_ns()
                output = call_for(case)(data)
                call_ns = time.perf_counter_ns() - started
            channel.stamp(channels.CALL_TO_NS)
            status = _output_status(output, tokens, cases[case]["hidden_dim"], device)
            if status and harness_row:
                status, output = 0, floor_out[case][:tokens]
            if not status:
                if gpu:  # as the runner does before it reads an output: the device's work all done
                    torch.cuda.synchronize(device)
                views["out"].copy_(output)
                if channel.shared is not None:
                    torch.cuda.current_stream(device).synchronize()
        except Exception as exc:  # said first, so the owner's wait ends now; raised after, so its cause is reported
            status, failure = 6, exc
        channel.done(status, call_ns, held_ns, held)
        if failure is not None:
            raise failure
        if kind == channels.HELD and gpu:
            hold.after(held)
        steps += 1


def _rank_steps(b: Bound, test: TestCase, rank: int, cases: list, regions: dict):
    kernel = import_submission()
    return True, {"steps": run_steps(rank, test.args["world_size"], cases, regions, lambda _case: kernel)}


FLOOR_STEPS = 10  # floor steps before a timed loop (human face): the owner's step with no call, its handshake's cost


def profiled_steps(rank: int, world_size: int, cases: list, regions: dict) -> list:
    """Profile mode's rank (the "call" job): the owner's steps (its input, its check: red team 29 passed zeros and
    read a seed when a rank made its own input), each call under torch.profiler; the last one's rows, plain data."""
    from torch.profiler import ProfilerActivity, profile

    b, custom_kernel, rows = bound(), import_submission(), []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu() else [])

    def call(data):
        synchronize(b)
        with profile(activities=activities) as prof:
            output = custom_kernel(data)
            synchronize(b)
        rows[:] = [{"key": str(event.key), "count": int(event.count),
                    **{name: float(next((getattr(event, a) for a in attrs if hasattr(event, a)), 0.0))
                       for name, attrs in wire.PROFILE_TOTALS.items()}} for event in prof.key_averages()]
        return output

    run_steps(rank, world_size, cases, regions, lambda _case: call)
    return rows


def _rank_call(b: Bound, test: TestCase, rank: int, fn, args: tuple):
    """Any picklable fn(rank, world_size, *args): what launch.parallel_launch runs."""
    _set_phase("in the launched function")
    return True, fn(rank, test.args["world_size"], *args)


_RANK_JOBS = {"steps": _rank_steps, "call": _rank_call}


def _join_group(rank: int, world_size: int, setup: RankSetup, case_id: int):
    """The runner's group: NCCL bound to cuda:rank through `device_id`, which does not change the current device."""
    import torch
    import torch.distributed as dist

    if setup.store_folder is not None:
        store = dist.FileStore(os.path.join(setup.store_folder, f"case{case_id}"), world_size)
        store.set_timeout(timedelta(seconds=120))
        rendezvous = {"store": store}
    else:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(setup.master_port)
        rendezvous = {"init_method": "env://"}
    if setup.backend == "gloo":
        # CPU runs: ranks share the cores instead of each running a full thread pool over all of them (measured on
        # 2 cores, 2 ranks: the same code timed against itself spread 0.66-1.31x with full pools, 0.82-1.08x so).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group("gloo", rank=rank, world_size=world_size, **rendezvous)
        # NOTES: a rank can come out of gloo's join before its peer's connection to it is whole; one that then left
        # at once (a job with no collective) ended the peer's join, "Connection closed by peer" (CI, 2026-11-28).
        barrier(rank, bound())  # the bound one: a submission a worker imported before may have replaced dist's
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
BUILD_LOG_CHARS = 200_000  # the end of a failed build's output kept for its log file


def _failure_from_exception(exc: BaseException) -> RankFailure:
    """The exception type, its message on one line and the innermost frame of the submission, if any. A failed
    extension build keeps only the compiler's error lines."""
    import torch.distributed as dist

    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if f.filename.endswith("submission.py")), frames[-1] if frames else None)
    location = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    text, build_log = str(exc), ""
    if text.startswith("Error building extension"):
        text, build_log = wire.build_failure(text), text[-BUILD_LOG_CHARS:]
    message = " ".join(text.split())
    follow_on = isinstance(exc, getattr(dist, "DistError", ())) or bool(_FOLLOW_ON.search(message))
    prefix = "void: " if isinstance(exc, Tampering) else ""
    return RankFailure(f"{prefix}{type(exc).__name__}: {message}{location}", follow_on=follow_on, build_log=build_log)


def _rank_entry(b: Bound, job: str, test: TestCase, rank: int, params: dict, setup: RankSetup,
                case_id: int) -> RankResult:
    """Runs one rank of one case in a pool worker. A rank that succeeded leaves its process group here; one that
    failed leaves it after its result has gone (the worker loop calls _leave_group)."""
    global _setup
    _setup = setup
    try:
        _set_phase("joining the process group")
        _join_group(rank, test.args["world_size"], setup, case_id)
        ok, value = _RANK_JOBS[job](b, test, rank, **params)
        if ok:
            _leave_group()
        elif not isinstance(value, RankFailure):
            value = RankFailure(str(value))
        return RankResult(ok, value)
    except BaseException as exc:  # reported to the parent, which owns the exit status
        return RankResult(False, _failure_from_exception(exc))


def _leave_group() -> None:
    """Destroys this rank's process group, if it has one.
    NOTES: a failed rank's peers may still be inside a collective it never joined (or it left one in flight), and
    its teardown then waits for them. Its result goes to the owner first, so the owner names the failure and ends
    the peers after its grace (killing this worker with them) instead of waiting, causeless, for the watchdog."""
    import torch.distributed as dist

    if dist.is_initialized():
        _set_phase("leaving the process group")
        dist.destroy_process_group()


LEAVE_GRACE_S = 10.0  # how long a worker may take to leave its last case's group (RankPool.await_idle)
# A rank writes its Python stack to stderr on this signal (the watchdog asks before it kills), and is given this long.
STACK_SIGNAL = signal.SIGUSR1
STACK_WRITE_S = 0.2
# What a pool worker is doing, kept in shared memory so the watchdog can say where a stuck rank is.
PHASES = ("idle", "joining the process group", "importing the submission", "generating input", "in custom_kernel",
          "waiting for the owner", "profiling", "in the launched function", "leaving the process group")
_phase_slot = None


def _set_phase(name: str) -> None:
    if _phase_slot is not None:
        _phase_slot.value = PHASES.index(name)


def _worker_loop(conn, parent_pid: int, sandbox: Optional[RankSandbox] = None, bundle: Optional[str] = None,
                 fds: Optional[list] = None) -> None:
    """A pool worker: enters its sandbox, binds the harness's primitives, then runs one rank of a case per message
    until it gets None. Dies with the pool's owner (or its zygote). `fds`: its stdout, stderr and phase slot, from
    its zygote; a spawned worker reads them from `conn` first."""
    global _phase_slot, _bound, _owner_conn
    die_with_parent()
    # Ctrl-C reaches the whole process group: the pool's owner ends the run and its workers; a worker's own
    # KeyboardInterrupt would only add a traceback per rank.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin_from_null()
    with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):  # no stderr (`2>&-`): no stack
        faulthandler.register(STACK_SIGNAL, file=sys.__stderr__, all_threads=True)
    if os.getppid() not in (parent_pid, 0):  # the owner died before the line above took effect (0: born in the
        os._exit(1)  # ranks' PID namespace, whose parent is outside it)
    _owner_conn = conn
    out, err, phase = fds or receive_fds(3)
    # NOTES: nothing inherited stays open, the owner's helpers' pipes above all (red team 19: a spawned rank wrote to
    # multiprocessing's resource tracker, a root process outside the pool, 2.4 GB past the pool's cap)
    close_all_but((0, 1, 2, conn.fileno(), out, err, phase))
    _phase_slot = PhaseSlot(phase)
    os.close(phase)  # the map holds its own reference
    # NOTES: what a rank prints is data: its stdout and stderr are pipes the owner reads, escapes and bounds
    # (wire.RankText), never the terminal or a file a person reads as the harness's own lines.
    for target, fd in ((1, out), (2, err)):
        os.dup2(fd, target)
        os.close(fd)
    failure = None
    try:
        # NOTES: a session of its own, so no controlling terminal: /dev/tty opened from a rank was the operator's
        # (red team 23: a forged table written on it, and a command typed into the shell the operator returns to)
        os.setsid()
        enter_rank_sandbox(sandbox)
        if bundle:
            sys.path.insert(0, bundle)
            os.chdir(bundle)
        b = bind_primitives()
        _bound = b
    except Exception as exc:  # every case this worker gets fails with it
        failure = RankResult(False, RankFailure(f"{type(exc).__name__}: {exc}"))
    while (message := conn.recv()) is not None:
        result = failure or _rank_entry(b, *message)
        _send_result(conn, result)
        if not result.ok:
            with contextlib.suppress(Exception):  # the next case joins a fresh group all the same
                _leave_group()
        _set_phase("idle")
    # Out now: a normal interpreter exit would wait for any thread a submission left running (seen: 10 s per worker
    # of the pool's grace, then a kill), and the pool's owner has already ended what the submission forked.
    _flush_streams()
    os._exit(0)


def _flush_streams() -> None:
    """stdout and stderr written out before an os._exit (one that cannot be flushed is left)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _send_result(conn, result: RankResult) -> None:
    """A result as plain data; one that cannot be sent (not plain, or no descriptor left to send it with: a
    submission that used them all) becomes a short failure saying so, and a worker that cannot send even that ends
    at once, which its owner reports as a death."""
    try:
        raw = encode(result)
    except wire.Unsendable as exc:
        raw = encode(RankResult(False, RankFailure(str(exc))))
    try:
        conn.send_bytes(raw)
    except OSError as exc:
        try:
            conn.send_bytes(encode(RankResult(False, RankFailure(f"the rank could not send its result: {exc}"))))
        except OSError:
            os._exit(3)


class CaseRun:
    """One case in flight on a pool: the owner's side of the ranks' results. `next_event()` returns the ranks'
    results when the case is over (failed, timed out, or done); every wait has the case's deadline. A rank sends
    exactly one message per case, its result: anything else voids the case."""

    def __init__(self, pool: "RankPool", job: str, test: TestCase, timeout_s: float, params: Optional[dict],
                 fds: Optional[list] = None):
        self.pool, self.test = pool, test
        world_size = test.args["world_size"]
        pool.await_idle()
        self.slots = [(rank + pool.cases_run) % len(pool.workers) for rank in range(world_size)]
        self.case_id, pool.cases_run = pool.cases_run, pool.cases_run + 1
        self.results: dict = {}
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.done: Optional[list] = None
        self.violation: Optional[str] = None
        # NOTES: no process starts in a namespace whose init has ended (fork there fails with ENOMEM: red team 65,
        # read as the judge's own error, 114), so every later case of a pool the guardian ended fails at once
        over = pool.sandbox.ended_for(0)
        self.not_run = RankFailure(f"not run: {ended_for_text(over)} in an earlier case") if over else None
        if self.not_run:
            return
        for slot in self.slots:
            if pool.workers[slot] is None:
                pool.workers[slot] = pool._start()
        setup = pool._setup()
        # The ranks get the case's shape, never a seed (a runner's case seed inverts to its secret) nor the spec.
        args = {k: v for k, v in test.args.items() if k != "seed"}
        sent = TestCase(args=args, spec="")
        for rank, slot in enumerate(self.slots):
            conn = pool.workers[slot][1]
            begun = pool.frames.get(conn)  # NOTES: a message (or part of one) no case asked for voids this one
            if conn.poll(0) or (begun is not None and begun.buffer):
                self.violation = f"rank {rank}'s worker had sent a message outside any case"
            pool.label(slot, rank)
            try:  # the fds right behind the job's message, where the rank's receive_fds reads them
                conn.send((job, sent, rank, params or {}, setup, self.case_id))
                if fds:
                    send_fds(conn, fds[rank])
            except OSError as error:  # its end shut (red team 28: SHUT_RD made this 114, the harness's own code)
                self.violation = self.violation or f"rank {rank}'s worker refused the case's job ({error})"

    def extend(self, seconds: float) -> None:
        """A new deadline, `seconds` from now (a long-lived job's next phase), named by the watchdog if it passes."""
        self.deadline = time.monotonic() + seconds
        self.timeout_s = seconds

    def _receive(self, rank: int, conn) -> None:
        process = self.pool.workers[self.slots[rank]][0]
        try:
            raws = self.pool.frames.setdefault(conn, wire.Frames(MAX_MESSAGE_BYTES)).read(conn)
        except wire.TooLarge:
            self.violation = self.violation or (f"rank {rank} sent the evaluator a message larger than "
                                                f"{MAX_MESSAGE_BYTES >> 20} MiB")
            return
        except EOFError:
            join_within(process, 5)  # the pipe closes before the dying process is reaped: wait for its code
            self.results[rank] = RankResult(False, RankFailure(death_message(process.exitcode, self.pool.sandbox)))
            return
        if len(raws) > 1:  # NOTES: the harness sends exactly one result per case
            self.violation = self.violation or (f"rank {rank} sent the evaluator a message outside any case (a "
                                                "second one behind its result)")
        for raw in raws[:1]:
            self._take(rank, raw)

    def _take(self, rank: int, raw: bytes) -> None:
        """A rank's one message of the case: its result, or the violation it is."""
        try:
            message = decode(raw)
        except Exception as exc:  # not plain data (a class, a forged pickle, a malformed message): never run
            self.violation = self.violation or (f"rank {rank} sent the evaluator something that is not plain data "
                                                f"({type(exc).__name__}: {str(exc)[:120]})")
            return
        if isinstance(message, RankResult) and not message.ok and not isinstance(message.value, RankFailure):
            self.violation = self.violation or (f"rank {rank} sent a result that does not fit: a failure of type "
                                                f"{type(message.value).__name__}")
        elif isinstance(message, RankResult):
            self.results[rank] = message
        else:  # NOTES: the harness sends exactly one result per case
            self.violation = self.violation or (f"rank {rank} sent the evaluator a message it did not expect: its "
                                                "channel carried something besides the harness's own")

    def next_event(self):
        world_size = len(self.slots)
        if self.not_run:
            return self._end_with(self.not_run)
        while True:
            if self.violation:
                return self._end_with(RankFailure(f"void: {self.violation}"))
            if len(self.results) == world_size:
                return self._end()
            failed = [rank for rank, result in self.results.items() if not result.ok]
            if failed:
                self.deadline = min(self.deadline, time.monotonic() + FAILED_PEER_GRACE_S)
            waiting = [rank for rank in range(world_size) if rank not in self.results]
            now = time.monotonic()
            if now > self.deadline:
                return self._watchdog(failed, waiting)
            conns = {self.pool.workers[self.slots[rank]][1]: rank for rank in waiting}
            ready = multiprocessing.connection.wait(list(conns), timeout=min(0.5, self.deadline - now))
            for conn in ready:
                self._receive(conns[conn], conn)

    def _watchdog(self, failed: list, waiting: list) -> list:
        where = ", ".join(f"rank {rank} {self.pool._where(self.slots[rank], self.test)}" for rank in waiting)
        self._stacks_on_stderr(waiting)
        if failed:
            failure = RankFailure(f"did not return within {FAILED_PEER_GRACE_S:g} s after rank(s) "
                                  f"{', '.join(map(str, failed))} failed; killed ({where})", follow_on=True)
        else:
            failure = RankFailure(f"watchdog: case '{self.test.spec}' did not finish in {self.timeout_s:g} s; "
                                  f"rank(s) {', '.join(map(str, waiting))} did not return and were killed ({where})")
            print(failure.message, file=sys.stderr, flush=True)
        return self._end_with(failure)

    def _stacks_on_stderr(self, ranks: list) -> None:
        """Where each rank the watchdog is about to kill stands: its Python stack, every thread, written by the
        rank itself (faulthandler on STACK_SIGNAL, registered by every worker) to the stderr it shares with this
        process, one rank at a time under a header naming it. A rank that cannot answer (a submission took the
        signal) is killed all the same."""
        for rank in ranks:
            print(f"[rank{rank}] its stack when the watchdog fired in case '{self.test.spec}':", file=sys.stderr,
                  flush=True)
            with contextlib.suppress(OSError):
                os.kill(self.pool.workers[self.slots[rank]][0].pid, STACK_SIGNAL)
            time.sleep(STACK_WRITE_S)

    def _end_with(self, failure: RankFailure) -> list:
        self.pool._retire(self.slots)
        self.done = [self.results.get(rank, RankResult(False, failure)) if not self.violation
                     else RankResult(False, failure) for rank in range(len(self.slots))]
        self.pool.sweep()
        return self.done

    def _end(self) -> list:
        self.pool._retire([slot for slot in self.slots if not self.pool.workers[slot][0].is_alive()])
        self.done = [self.results[rank] for rank in range(len(self.slots))]
        self.pool.sweep()
        return self.done


@contextlib.contextmanager
def _main_not_rerun(skip: bool):
    """A spawned worker re-runs the owner's main script (as __mp_main__) before its target, so that functions the
    script defines can be sent to it. A pool whose jobs come from elsewhere (`skip`) hides the script's path and
    spares every rank process a whole command's imports (pandas, plots, ...). The protocol face's worker lives in
    its own main module, which is always left as it is."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not skip or main is None or path is None or _worker_loop.__module__ == "__main__":
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def start_nursery(env: dict) -> Nursery:
    """The clock's nursery (births.Nursery): spawned outside every pool, with the pools' variables `env` on top of
    this process's, without the owner's main script (no pool's job comes from it)."""
    multiprocessing.resource_tracker.ensure_running()  # this process's helper, started before any pool's (RankPool)

    def spawn(target: Callable, args: tuple):
        process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
        with environment_with(env, ranks=True), _main_not_rerun(True):
            process.start()
        return process

    return Nursery(spawn)


def cover_rank_writable(*result_fds: int) -> None:
    """The judge's view without the RANK_WRITABLE folders, and their name check (rank_writable.cover), at the top of
    each command; the protocol face's result descriptor in none of them."""
    try:
        rank_writable.cover(result_fds=result_fds)
    except ValueError as error:
        raise UserError(str(error)) from None


def check_environment() -> None:
    """The variables a run reads only once its pools start, checked before any work: a bad one is bad input."""
    try:
        for check in (rank_birth, pool_memory_bytes, pinned_cpus, owner_cpu, judge.check_knobs,
                      rank_writable.check_rank_cache):
            check()
    except ValueError as error:
        raise UserError(str(error)) from None


class RankPool:
    """Processes reused across cases, like the official runner's spawn pool, with a watchdog.

    As on the leaderboard, a process does not keep its rank: worker (rank + case number) % size runs `rank`, so
    per-process GPU state must be rebuilt for every process group. A case that runs past its timeout has its
    workers killed (SIGKILL, with whatever they started) and the ranks that did not return are named; a fresh worker
    takes a killed one's place when a later case needs it. Each worker talks over its own pipe, so a killed worker
    leaves no lock held. Workers are born inside the pool's Sandbox (its PID namespace, their own /proc, the ranks'
    uid, where the machine allows; `guards` says which), and between cases everything but the workers (and their
    zygote) is ended there, so nothing a case started (a child holding the rendezvous port) reaches the next.
    `birth`: "zygote" (the judge's faces: one process of the pool imports torch and forks each worker, Zygote) or
    "spawn" (the runner's face: a fresh interpreter each); rank_birth says which by default.

    `master_port` None: the ranks of case n meet in a file store of their own (`case<n>` in the pool's rendezvous
    folder, boundary.Sandbox.rendezvous_folder), so no port is ever bound and no socket is reachable. A port number:
    rank 0 of every case hosts the rendezvous there (the runner's way); after a watchdog kill the next port is
    used, since the killed rank 0 may leave it in TIME_WAIT.

    `env`: variables every worker starts with on top of this process's own (ranks sharing GPUs: the MPS pipe
    folder, the SM share, NCCL's multi-rank switch and library; a2a/sharing.py). `bundle`: a folder whose
    `submission`, `reference`, `utils` and `task` the workers import (a staged version). `rerun_main` False: no job
    comes from the owner's main script, which the workers then skip (_main_not_rerun). `build_key`: what keys the
    builds the ranks keep between pools (boundary.Sandbox); by default the hash of the submission they import.
    `hide`: files the ranks read as empty (a clock run's other entries). `reach`: other paths they read (a tool's
    submissions)."""

    def __init__(self, size: int, backend: str, master_port: Optional[int] = None, rank_prefix: bool = False,
                 env: Optional[dict] = None, bundle: Optional[Path] = None, rerun_main: bool = True, hide: tuple = (),
                 build_key: Optional[str] = None, birth: Optional[str] = None, nursery: Optional[Nursery] = None,
                 reach: tuple = ()):
        self.context = multiprocessing.get_context("spawn")
        self.birth = birth or rank_birth()
        self.zygote: Optional[Zygote] = None
        self.nursery = nursery
        self.rerun_main = rerun_main
        # A2A_TRACE=1 in the caller's environment would make every rank import its version's trace build
        self.backend, self.rank_prefix, self.env = backend, rank_prefix, dict(env or {}, A2A_TRACE="0")
        self.bundle = str(bundle) if bundle else None
        self.nccl_version = self.env.get("A2A_NCCL_VERSION", os.environ.get("A2A_NCCL_VERSION"))
        self.master_port = master_port
        self.sandbox = Sandbox(enabled=os.environ.get("A2A_SANDBOX", "1") != "0",
                               reach=(*((self.bundle,) if self.bundle else ()), *reach), env=self.env, hide=hide,
                               build_key=build_key or Sandbox.source_key(Path(self.bundle or ".") / "submission.py"))
        self.guards = self.sandbox.guards
        self.workers: list = []
        self.texts: dict = {}  # worker process -> the readers of its stdout and stderr
        self.frames: dict = {}  # worker connection -> what it sent so far of its next message (wire.Frames)
        self.cases_run = 0
        try:
            self.workers = [self._start() for _ in range(size)]
        except BaseException:
            self.kill()
            raise

    def _setup(self) -> RankSetup:
        if self.master_port is None:
            return RankSetup(self.backend, store_folder=self.sandbox.rendezvous_folder(),
                             nccl_version=self.nccl_version)
        return RankSetup(self.backend, master_port=self.master_port, nccl_version=self.nccl_version)

    def _spawn(self, target: Callable, args: tuple):
        """A process born in the pool's namespaces and environment, running target(*args, this pid, the ranks'
        sandbox, the bundle)."""
        process = self.context.Process(target=target, args=(*args, os.getpid(), self.sandbox.rank_setup(),
                                                            self.bundle), daemon=True)
        # NOTES: multiprocessing's tracker, which the first spawn starts, is this process's helper, not a rank: it
        # starts here with this process's own environment and outside the ranks' namespace, since MPS's guardian
        # ends every process that carries the ranks' pipe folder (a2a/sharing.py).
        multiprocessing.resource_tracker.ensure_running()
        with environment_with(self.env, ranks=True), self.sandbox.spawning(), _main_not_rerun(not self.rerun_main):
            process.start()
        return process

    def _start(self):
        parent_end, child_end = self.context.Pipe()
        phase = PhaseSlot()
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        handed = [out_write, err_write, phase.fd]
        if self.birth == "zygote":
            if self.zygote is None or self.zygote.ended:
                born = (self.sandbox.rank_setup(), self.bundle, environ_with(self.env, ranks=True),
                        self.sandbox.namespace_fds())
                self.zygote = Zygote(self._spawn, _worker_loop, self.nursery, born)
            process = self.zygote.fork([child_end.fileno(), *handed])
        else:
            process = self._spawn(_worker_loop, (child_end,))
            send_fds(parent_end, handed)
        child_end.close()
        for fd in handed:
            os.close(fd)
        self.texts[process] = (wire.RankText(out_read, sys.stdout, ""), wire.RankText(err_read, sys.stderr, ""))
        return process, parent_end, phase

    def label(self, slot: int, rank: int) -> None:
        """What the lines of the worker in `slot` start with while it runs `rank` (`[rankN] `, human face)."""
        for text in self.texts.get(self.workers[slot][0], ()):
            text.relabel(f"[rank{rank}] " if self.rank_prefix else "")

    def _pids(self, zygote: bool = True) -> tuple:
        """The pool's workers and (`zygote`) its zygote."""
        own = (self.zygote.process.pid,) if zygote and self.zygote is not None and not self.zygote.ended else ()
        return tuple(worker[0].pid for worker in self.workers if worker is not None) + own

    def pin(self, cpus: list) -> None:
        """Worker i, and every thread it starts from now on, on cpus[i % len(cpus)] (PIN_CPUS_ENV)."""
        for slot, pid in enumerate(self._pids(zygote=False)):
            os.sched_setaffinity(pid, {cpus[slot % len(cpus)]})

    def wait_born(self) -> bool:
        """Waits until every worker is born (asking a forked worker's pid waits for its birth, births.Forked);
        whether they all were."""
        try:
            self._pids(zygote=False)
        except RuntimeError:
            return False
        return True

    def _close_texts(self, process) -> None:
        for text in self.texts.pop(process, ()):
            text.close(wait_s=1.0)

    def _where(self, slot: int, test: TestCase) -> str:
        index = self.workers[slot][2].value  # NOTES: read once: the rank may rewrite the byte between two reads
        phase = PHASES[index] if 0 <= index < len(PHASES) else "?"  # (red team 26: IndexError in the owner)
        return f"in {test.spec}" if phase == "in the launched function" else phase

    def await_idle(self) -> None:
        """Waits until every worker has left its last case's group (a failed rank leaves after its result has gone),
        retiring one still leaving after LEAVE_GRACE_S. On the runner's fixed port the next case's rank 0, another
        worker, binds the port the last case's rank 0 may still be serving: seen under load (2 cores, two test
        processes) as EADDRINUSE, or a rank joining the old store while rank 0 made a new one (both hung)."""
        deadline, idle = time.monotonic() + LEAVE_GRACE_S, PHASES.index("idle")
        leaving = []
        for slot, worker in enumerate(self.workers):
            if worker is None:
                continue
            process, _, phase = worker
            while phase.value != idle and process.is_alive() and time.monotonic() < deadline:
                time.sleep(0.002)
            if phase.value != idle:
                leaving.append(slot)
        self._retire(leaving)

    def begin(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None,
              fds: Optional[list] = None) -> CaseRun:
        """Starts `job` on every rank of `test` (`fds[rank]`: descriptors that rank receives with its job); the owner
        then waits for the results with the CaseRun's next_event."""
        return CaseRun(self, job, test, timeout_s, params, fds)

    def run(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None) -> list[RankResult]:
        """Runs `job` on every rank of `test`; one RankResult per rank (value a RankFailure when not ok)."""
        return self.begin(job, test, timeout_s, params).next_event()

    def sweep(self) -> list[int]:
        """Ends what the ranks started besides themselves: everything else in the sandbox's namespace; without one,
        the workers' descendants (a double fork's orphan then waits for the end of the run, docs/judge.md)."""
        if self.sandbox.inode is not None:
            return self.sandbox.sweep(set(self._pids()))
        killed = []
        for pid in self._pids(zygote=False):
            killed += descendants(pid)
            kill_tree(pid, include_root=False)
        return killed

    def _retire(self, slots: list[int]) -> None:
        """Kills the workers in `slots` with everything below them; run() starts fresh ones when needed."""
        for slot in slots:
            if self.workers[slot] is None:
                continue
            process, conn, _ = self.workers[slot]
            # NOTES: a worker is signalled only while its pid is held (unreaped): a zygote that ended took its
            # workers with it, and their pids may be anyone's now
            if not (isinstance(process, Forked) and process.zygote.ended):
                kill_tree(process.pid, include_root=process.is_alive())
            join_within(process, KILLED_WAIT_S)  # past it, the pool's end takes it (its namespace, its uid)
            self.frames.pop(conn, None)
            conn.close()
            self._close_texts(process)
            self.workers[slot] = None
        if slots and self.master_port is not None:
            self.master_port += 1

    def shutdown(self, clean_files: bool = True) -> bool:
        """Ends what the submission started in each worker, then lets the workers exit (SIGKILL after 10 s); whether
        nothing of the pool is left (boundary.Sandbox.close)."""
        live = [worker for worker in self.workers if worker is not None]
        self.sweep()
        for process, conn, _ in live:
            kill_tree(process.pid, include_root=False)
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + 10  # one grace for the whole pool, not one per worker
        for process, conn, _ in live:
            if not join_within(process, max(0.0, deadline - time.monotonic())):
                kill_tree(process.pid)
                join_within(process, KILLED_WAIT_S)
            self.frames.pop(conn, None)
            conn.close()
            self._close_texts(process)
        self.workers = []
        if self.zygote is not None:
            self.zygote.close()
        return self.sandbox.close(clean_files)

    def kill(self, clean_files: bool = True) -> bool:
        """Ends every worker and everything below it at once (a signal or an error): the zygote first, and with it
        every worker it forked, born or not; whether nothing of the pool is left (boundary.Sandbox.close)."""
        if self.zygote is not None:
            self.zygote.close(kill=True)
        self._retire([slot for slot, worker in enumerate(self.workers) if worker is not None])
        self.workers = []
        return self.sandbox.close(clean_files)


# --------------------------------------------------------------------------------------------------------------
# Protocol modes
# --------------------------------------------------------------------------------------------------------------

FOLLOW_ON_SUMMARY_CHARS = 160
FAILURE_CHARS = 2000  # one rank's failure as shown


LOG_DIR_ENV = "A2A_LOG_DIR"  # where the owner writes failed builds' logs (default: build/logs beside eval.py)


# A log's content, so its name, is a rank's choice: a run (this process) writes few for each entry (red team 32: one
# entry of a clock run spent the whole run's and another's log was not written), and none of them whole.
BUILD_LOGS_PER_RUN = 8
BUILD_LOG_BYTES_PER_RUN = 4 << 20
# Over every run, the logs of the newest BUILD_LOG_RUNS_KEPT runs are kept (no run keeps the folder growing), a run's
# as one: a rank's text is a log's, so counted by files a run's 8 took older runs' logs (red team 54).
BUILD_LOG_RUNS_KEPT = 32
_RUN_KEY = f"{time.time_ns():016x}p{os.getpid()}"  # this run's logs' group, oldest first by name too
_build_logs: dict = {}  # path -> bytes, the logs this process wrote
_logs_of: dict = {}  # entry -> {path: bytes}, its share of them


def write_build_log(text: str, entry: str = "") -> str:
    """A failed build's output (a rank's text: written as data, never run or shown raw), its last BUILD_LOG_CHARS
    characters, in a file of the owner's named by a keyed hash of its content, within `entry`'s caps; returns the
    path, or why it was not written."""
    data = text[-BUILD_LOG_CHARS:].encode("utf-8", errors="replace")
    folder = Path(os.environ.get(LOG_DIR_ENV) or HERE / "build" / "logs")  # the default one only its owner lists
    path = folder / f"build-{_RUN_KEY}-{owners_name(data)}.log"
    mine = _logs_of.setdefault(entry, {})
    if path in mine:
        return str(path)
    if len(mine) >= BUILD_LOGS_PER_RUN or sum(mine.values()) + len(data) > BUILD_LOG_BYTES_PER_RUN:
        return (f"not written: this run wrote {len(mine)} logs of {sum(mine.values())} bytes for it, its "
                f"cap ({BUILD_LOGS_PER_RUN} logs, {BUILD_LOG_BYTES_PER_RUN} bytes)")
    try:
        write_owners_only(path, wire.lines_shown(data.decode("utf-8")).encode("utf-8"), not os.environ.get(LOG_DIR_ENV))
    except OSError as exc:
        return f"not written: {exc.strerror}"
    _build_logs[path] = mine[path] = len(data)
    keep_newest(folder, "build-", BUILD_LOG_RUNS_KEPT, {p.name for p in _build_logs if p.parent == folder},
                lambda name: name.rsplit("-", 1)[0] if name.count("-") > 1 else name)  # an older harness's alone
    return str(path)


def rank_failures(results: list[RankResult], entry: str = "") -> str:
    """The failing ranks' own errors first, whole, in the order they happened; then, summarised, what their peers
    hit because of them. A failed build's line names the file its log went to (`entry`'s: write_build_log)."""
    failures = [(rank, result.value) for rank, result in enumerate(results) if not result.ok]
    for _, failure in failures:
        if failure.build_log:
            failure.message = f"{failure.message} (full build log: {write_build_log(failure.build_log, entry)})"
            failure.build_log = ""
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
    return " | ".join(wire.as_text(line, FAILURE_CHARS) for line in lines)


TRANSPORT_ENV = "A2A_TRANSPORT"  # "host": the owner's steps through host memory even where the GPUs could share
COPIER_ENV = "A2A_OWNER_GPU"  # who makes the owner's copies on the device transport (channels.copiers)


def transport_options():
    """The owner's transport options, checked (bad input before any work): A2A_TRANSPORT and the copier choice
    (None: channels.copiers's default, "own", "next" or a GPU index)."""
    if os.environ.get(TRANSPORT_ENV, "") not in ("", "host", "device"):
        raise UserError(f"{TRANSPORT_ENV} must be 'host' or 'device', not '{os.environ[TRANSPORT_ENV][:40]}'")
    text = os.environ.get(COPIER_ENV, "")
    if text in ("", "own", "next"):
        return text or None
    return _env_integer(COPIER_ENV, text, 0, 63, "'own', 'next' or a GPU index")


def transport(pool: "RankPool", world_size: int) -> tuple:
    """("device", None) where every rank has a GPU of its own on a CUDA build (channels.Channel with a GPU), else
    ("host", why not). NOTES: MPS (ranks sharing GPUs) serves one uid's clients at a time: the owner's context would
    wait."""
    if os.environ.get(TRANSPORT_ENV) == "host":
        return "host", f"{TRANSPORT_ENV}=host"
    if pool.backend != "nccl":
        return "host", "ranks on the CPU"
    if "CUDA_MPS_PIPE_DIRECTORY" in pool.env:
        return "host", "ranks share GPUs (MPS)"
    import gpu_share

    why = gpu_share.supported()
    if why:
        return "host", why
    import torch

    if torch.cuda.device_count() < world_size:
        return "host", "fewer GPUs than ranks"
    copier = transport_options()
    if isinstance(copier, int) and copier >= torch.cuda.device_count():
        raise UserError(f"{COPIER_ENV}={copier}: this machine has GPUs 0 to {torch.cuda.device_count() - 1}")
    return "device", None


def transport_text(pool: "RankPool", world_size: int) -> str:
    """The owner's transport in words, for the run's boundary line."""
    kind, why = transport(pool, world_size)
    if kind == "host":
        return f"owner's steps: inputs and outputs through host memory ({why})"
    copiers = [copier for _gpu, copier in channel_places(pool, world_size)]
    return ("owner's steps: inputs and outputs in GPU buffers the owner shares with each rank, copied by "
            + ("each rank's own GPU" if all(c is None for c in copiers) else
               "GPU " + ", ".join("own" if c is None else str(c) for c in copiers) + " (rank by rank)"))


def channel_places(pool: "RankPool", world_size: int) -> list:
    """Per rank, (the GPU its judge channel's regions live on, the GPU whose context makes the owner's copies): its
    rank_device's index and channels.copiers's choice (None: its own), or (None, None) on the host transport."""
    if transport(pool, world_size)[0] == "host":
        return [(None, None)] * world_size
    import torch

    count = torch.cuda.device_count()
    gpus = [rank % count for rank in range(world_size)]
    return list(zip(gpus, channels.copiers(gpus, count, transport_options(), torch.cuda.can_device_access_peer)))


class CaseSteps:
    """A case's steps on a pool, from the owner's side: a judge channel to every rank, the ranks' job started (the
    protocol face's "steps", or a tool's function through "call" that ends in run_steps), and judge.Steps over the
    channels, whose waits end with the case's deadline or with any rank's end. `finish()` stops the ranks and returns
    their results."""

    def __init__(self, pool: "RankPool", test: TestCase, cases: list, timeout_s: float,
                 fn: Optional[Callable] = None, fn_args: tuple = ()):
        self.started = time.monotonic()
        self.channels = []
        try:
            for gpu, copier in channel_places(pool, test.args["world_size"]):
                self.channels.append(channels.Channel(cases, gpu, copier))
        except BaseException:
            for channel in self.channels:
                channel.close()
            raise
        regions = self.channels[0].regions
        shapes = [{k: v for k, v in case.items() if k != "seed"} for case in cases]  # the ranks get no seed
        job, params = ("steps", {"cases": shapes, "regions": regions}) if fn is None else \
            ("call", {"fn": fn, "args": (shapes, regions, *fn_args)})
        try:
            self.case = pool.begin(job, test, timeout_s, params, fds=[c.for_rank() for c in self.channels])
        except BaseException:
            for channel in self.channels:
                channel.close()
            raise
        for channel in self.channels:
            channel.given()
        watch = [] if self.case.not_run else [pool.workers[slot][1].fileno() for slot in self.case.slots]
        self.steps = judge.Steps(self.channels, cases, watch)
        self.spec = test.spec
        self.ended_early = False

    def step(self, kind: int, case: int, inputs: list, check_outputs: bool = True) -> judge.StepResult:
        if self.case.not_run:  # no rank is there to step (finish() says why)
            raise judge.RankEnded()
        try:
            return self.steps.step(kind, case, inputs, self.case.deadline, check_outputs)
        except judge.RankEnded:
            self.ended_early = True
            raise

    def finish(self) -> list:
        """Stops the ranks and waits for their results (the case's deadline and watchdog apply). A result that came
        while a step was still waiting for the ranks never passes: the steps were not over."""
        with contextlib.suppress(OSError):
            self.steps.stop()
        if self.steps.anatomy:
            print(f"{self.spec}: {self.steps.anatomy_text()}", file=sys.stderr)
        try:
            results = self.case.done or self.case.next_event()
        finally:
            self.steps.close()
        if self.ended_early and all(r.ok for r in results):
            why = "void: a rank sent its result while the owner still waited for its step's output"
            results = [RankResult(False, RankFailure(why)) for _ in results]
        return results


def step_failures(results: list, problems: Optional[list], step: str) -> list:
    """The ranks' results with each output problem the owner found (`problems[rank]`) turned into that rank's
    failure."""
    out = []
    for rank, result in enumerate(results):
        problem = problems[rank] if problems and result.ok else None
        out.append(RankResult(False, RankFailure(f"{step}: {problem}")) if problem else result)
    return out


@dataclasses.dataclass
class ProtocolRun:
    """One protocol-face run: the output, the pool, the run's seeds and what the human face asked for (A2A_*, read
    once). `fresh`: every timed step gets a fresh input (the judge's own runs; the runner's benchmark mode repeats
    the case's one input)."""
    logger: PopcornOutput
    pool: RankPool
    backend: str
    extra: bool
    timeout_s: Optional[float]
    seeds: judge.Seeds
    fresh: bool
    import_logged: bool = False

    def start(self, test: TestCase, mode: str, fn: Optional[Callable] = None) -> CaseSteps:
        return CaseSteps(self.pool, test, [test.args], self.timeout_s or OFFICIAL_TIMEOUT_S[mode], fn)

    def checked_call(self, idx: int, test: TestCase, mode: str, fn: Optional[Callable] = None) -> list:
        """One call on the owner's input for case `idx`: the ranks' results, the owner's output problems in them."""
        inputs = self.inputs(test, self.seeds.case_seed(idx, test.args["seed"]))
        steps, problems = self.start(test, mode, fn), None
        with contextlib.suppress(judge.RankEnded, judge.Missed):  # the ranks' failures are read below
            problems = steps.step(channels.CALL, 0, inputs).problems
        return step_failures(self.ended(steps.finish(), steps.started), problems, "custom_kernel")

    @staticmethod
    def inputs(test: TestCase, seed: int) -> list:
        return [judge.make_input(test.args, seed, rank) for rank in range(test.args["world_size"])]

    def ended(self, results: list, started: float) -> list:
        """The ranks' results of a case that the owner started at `started` (time.monotonic). Human face: the first
        case's time, by the owner's clock from the job sent to the results read, is its `import_s`: the submission's
        import and builds happen in it (a rank's own figure would be its word)."""
        if self.extra and not self.import_logged:
            self.logger.log("import_s", f"{time.monotonic() - started:.2f}")
            self.import_logged = True
        return results


def run_testing(run: ProtocolRun, tests: list[TestCase]) -> int:
    passed = True
    run.logger.log("test-count", len(tests))
    for idx, test in enumerate(tests):
        run.logger.log(f"test.{idx}.spec", test.spec)
        results = run.checked_call(idx, test, "test")
        if all(r.ok for r in results):
            run.logger.log(f"test.{idx}.status", "pass")
        else:
            passed = False
            run.logger.log(f"test.{idx}.status", "fail")
            run.logger.log(f"test.{idx}.error", rank_failures(results))
    run.logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _timed_loop(run: ProtocolRun, steps: CaseSteps, idx: int, test: TestCase, fresh: bool,
                max_time_ns: float) -> tuple:
    """The checked call, the floor steps (human face) and the runner's timed loop, every step the owner's: returns
    (durations, device times, floor windows, race windows, gaps, the first output problem as (rank, step, why) or
    None). Every output is checked, the timed steps' after their bank (judge.draw_bank, Steps.defer), so that the
    owner neither draws nor checks between two timed steps; the loop stops at the runner's rules, on the owner's
    times. NOTES: a bank's first timed step follows an untimed call of its own input (a lead-in), not the owner's
    draw and checks: a rank's work left running after `done` overlaps a timed step there too (red team 55: the
    bank's draw, about 0.1 s, sat before the first timed step, free for such work)."""
    first = run.inputs(test, run.seeds.case_seed(idx, test.args["seed"]))
    result = steps.step(channels.CALL, 0, first)
    if wrong := result.wrong():
        return [], [], [], [], [], (wrong[0], "the checked call", wrong[1])
    floor = [steps.step(channels.FLOOR, 0, first).window_ns for _ in range(FLOOR_STEPS if run.extra else 0)]
    durations, device, race, gap = [], [], [], []
    draw = (lambda step: run.inputs(test, run.seeds.step_seed(idx, test.args["seed"], step))) if fresh else \
        (lambda _: first)
    bank, base, problem, budget = [], 0, None, judge.bank_budget_bytes()

    def said_wrong(result: judge.StepResult, k: int) -> Optional[tuple]:
        """A rank's own word on its output, read at once: (k, the step since the bank's defer; rank; why)."""
        return (k, *wrong) if (wrong := result.wrong()) else None

    loop_start = time.perf_counter_ns()
    for step in range(MAX_REPEATS):
        if not bank:
            if problem := steps.steps.settle():
                break
            base, bank = step, judge.draw_bank(draw, step, MAX_REPEATS - step, budget, steps.steps.slot_bytes(0))
            steps.steps.defer(0, 1 + len(bank))  # the lead-in's slot and the bank's
            if problem := said_wrong(steps.step(channels.CALL, 0, draw(MAX_REPEATS + step)), 0):  # the lead-in
                break
        result = steps.step(channels.CALL, 0, bank.pop(0))
        if problem := said_wrong(result, step - base + 1):
            break
        durations.append(result.window_ns)
        device.append(max(result.call_ns))  # the slowest rank's own figure (NaN where a rank gave none)
        race.append(result.race_ns)
        gap.append(result.gap_ns)
        if len(durations) > 2:
            stats = calculate_stats(durations)
            if (stats.err / stats.mean < 0.001 or stats.mean * stats.runs > max_time_ns
                    or time.perf_counter_ns() - loop_start > 120e9):
                break
    problem = min(filter(None, (steps.steps.settle(), problem)), default=None)  # the earlier step's
    if problem:
        k, rank, why = problem
        problem = rank, f"timed call {base + k - 1}" if k else f"the untimed call before timed call {base}", why
    return durations, device, floor, race, gap, problem


def _benchmark(run: ProtocolRun, idx: int, test: TestCase, recheck: bool, max_time_ns: float, mode: str):
    """One timed case: its statistics from the owner's step windows, or its failures (a string)."""
    steps = run.start(test, mode)
    timed = None
    with contextlib.suppress(judge.RankEnded, judge.Missed):  # the ranks' failures are read below
        timed = _timed_loop(run, steps, idx, test, recheck or run.fresh, max_time_ns)
    results = run.ended(steps.finish(), steps.started)
    if timed is not None and timed[5] is not None:
        rank, where, why = timed[5]
        results = step_failures(results, [why if r == rank else None for r in range(len(results))], where)
    if timed is None and all(r.ok for r in results):  # the steps ended without a rank's word: never a pass
        results = [RankResult(False, RankFailure("the ranks left the steps before the owner stopped them"))]
    if not all(r.ok for r in results):
        return rank_failures(results)
    durations, device, floor, race, gap, _ = timed
    out = {"stats": calculate_stats(durations)}
    if run.extra:
        out.update(host=calculate_extra_stats(durations), floor=calculate_extra_stats(floor))
        for name, values in (("device", device), ("race", race), ("gap", gap)):
            values = [v for v in values if v == v]
            if values:
                out[name] = calculate_extra_stats(values)
    return out


# The warm-up's case index, for its seeds: a stream of its own, so that no timed step of any case (index 0 and up) is
# handed an input the warm-up was (red team 13: a cache of answers replayed the warm-up in the first case's steps).
WARMUP_INDEX = -1


def _log_failure(logger, idx: int, error: str) -> None:
    logger.log(f"benchmark.{idx}.status", "fail")
    logger.log(f"benchmark.{idx}.error", error)


def run_benchmarking(run: ProtocolRun, tests: list[TestCase], mode: str) -> int:
    """The runner's order: a warm-up on the first case (0.1 s budget in benchmark mode, 0.01 s in leaderboard
    mode), then every case; leaderboard mode checks fresh inputs, logs each spec after its run and stops at the
    first failure. A warm-up that hangs, raises or ends a rank fails the run, as on the runner, where it ends the
    run (its result's get raises); only the warm-up's outputs go unchecked (red team 14: a hang there, killed by the
    watchdog, passed)."""
    leaderboard = mode == "leaderboard"
    warmup = _benchmark(run, WARMUP_INDEX, tests[0], False, 1e7 if leaderboard else 1e8, mode)
    run.logger.log("benchmark-count", len(tests))
    if isinstance(warmup, str):
        run.logger.log("benchmark.0.spec", tests[0].spec)
        _log_failure(run.logger, 0, f"in the warm-up before the timed cases: {warmup}")
        run.logger.log("check", "fail")
        return EXIT_CHECK_FAILED
    passed = True
    for idx, test in enumerate(tests):
        if not leaderboard:
            run.logger.log(f"benchmark.{idx}.spec", test.spec)
        result = _benchmark(run, idx, test, leaderboard, 30e9 if leaderboard else 10e9, mode)
        if leaderboard:
            run.logger.log(f"benchmark.{idx}.spec", test.spec)
        if isinstance(result, str):
            passed = False
            _log_failure(run.logger, idx, result)
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


def run_profiling(run: ProtocolRun, tests: list[TestCase]) -> int:
    passed = True
    run.logger.log("benchmark-count", len(tests))
    for idx, test in enumerate(tests):
        run.logger.log(f"benchmark.{idx}.spec", test.spec)
        results = run.checked_call(idx, test, "profile", profiled_steps)
        unfit = [rank for rank, r in enumerate(results) if r.ok and not wire.profile_rows_fit(r.value)]
        if unfit or not all(r.ok for r in results):
            passed = False
            _log_failure(run.logger, idx, rank_failures(results) if not unfit else
                         f"rank {unfit[0]} - void: a profile that does not fit (a list of rows, each a str key and "
                         f"finite numbers from 0 to {wire.PROFILE_VALUE_LIMIT:g})")
            continue
        report = wire.profile_table([r.value for r in results], run.backend != "gloo", FAILURE_CHARS)
        run.logger.log(f"benchmark.{idx}.report", base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    run.logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _env_integer(name: str, text: str, low: int, high: int, what: str = "an integer") -> int:
    """An environment variable's integer in [low, high], or bad input naming it."""
    # at most 40 ASCII digits: int() refuses past 4300 (red team 69: a ValueError's traceback and exit 1)
    if not re.fullmatch(r"[0-9]{1,40}", text.strip()) or not low <= int(text) <= high:
        raise UserError(f"{name} must be {what} from {low} to {high}, not '{text[:40]}'")
    return int(text)


def _environment() -> tuple[int, Optional[int], int, bool]:
    """POPCORN_FD, POPCORN_SEED (removed from the environment, as the runner does), POPCORN_GPUS, and whether the
    ranks' lines are prefixed."""
    seed = os.environ.pop("POPCORN_SEED", None)
    values = {}
    for name, text, low, high in (("POPCORN_FD", os.getenv("POPCORN_FD"), 0, 2**31 - 1),
                                  ("POPCORN_SEED", seed, 0, SEED_MAX),
                                  ("POPCORN_GPUS", os.getenv("POPCORN_GPUS", "1"), 1, 64)):
        if text is None or (text == "" and name != "POPCORN_GPUS"):  # the GPU count has a default, never empty
            values[name] = None
            continue
        values[name] = _env_integer(name, text, low, high)
    transport_options()
    fd = values["POPCORN_FD"]
    if fd == 2:  # the ranks would start without a stderr, and this process's own errors would go out as results
        raise UserError("POPCORN_FD=2 is stderr: give the results a descriptor of their own (POPCORN_FD=1, 3>FILE)")
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
    # Where the result file is stdout's or stderr's as well (POPCORN_FD=1 by hand; the runner's is a pipe of its own),
    # the ranks' lines relayed there carry their `[rankN] ` prefix, so that none reads as a result key.
    return fd, values["POPCORN_SEED"], values["POPCORN_GPUS"], wire.shares_a_file(fd, (1, 2))


def _sharing_asked() -> bool:
    """A2A_SHARE=mps (the human face's, never the runner's): ranks may outnumber the GPUs, sharing them through the
    MPS control daemon named by CUDA_MPS_PIPE_DIRECTORY. Without a live daemon the ranks would be time-sliced, and
    ranks that spin on each other's flags would crawl or hang: refused."""
    if not (share := os.environ.get("A2A_SHARE")):
        return False
    if share != "mps":
        raise UserError(f"A2A_SHARE must be 'mps', not '{share[:40]}'")
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_DEFAULT_PIPE)
    if not Path(pipe, "control").exists():
        raise UserError(f"A2A_SHARE=mps but no MPS control daemon listens in {pipe} (CUDA_MPS_PIPE_DIRECTORY)")
    return True


def _port_free(port: int) -> None:
    """The fixed rendezvous port must be free before any rank binds it, where the ranks share this machine's
    network: another evaluator holding it would make every case fail at its rendezvous."""

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            named = "the runner's rendezvous port" if port == DEFAULT_MASTER_PORT else \
                f"the rendezvous port {MASTER_PORT_ENV} names"
            raise UserError(f"port {port}, {named}, is in use (another evaluator on this machine?); wait for it to "
                            "finish") from None


def _master_port() -> int:
    """The fixed rendezvous port: the runner's, or A2A_MASTER_PORT's."""
    text = os.environ.get(MASTER_PORT_ENV)
    return DEFAULT_MASTER_PORT if text is None else _env_integer(MASTER_PORT_ENV, text, 1, 65535, "a port number")


def protocol_main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        print(f"usage: POPCORN_FD=N python eval.py {{{'|'.join(MODES)}}} TESTFILE", file=sys.stderr)
        return EXIT_USAGE
    sys.path.insert(0, str(HERE))
    mode, test_file = sys.argv[1], sys.argv[2]
    try:
        fd, seed, n_gpus, prefixed = _environment()
        master_port = _master_port()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    hide_result_channel()
    claim_run(inherit=True)
    install_signal_handlers()
    become_subreaper()
    pool = None
    try:
        cover_rank_writable(fd)
        judged = os.environ.get(JUDGE_ENV) == "1"
        tests = read_test_file(Path(test_file), None if judged else seed)
        gpus = machine_gpus()
        backend = os.environ.get("A2A_BACKEND") or ("nccl" if gpus else "gloo")
        validate_cases(tests, n_gpus, backend, gpus, shared=_sharing_asked())
        check_environment()
        timeout = os.environ.get("A2A_TIMEOUT")
        with PopcornOutput(fd) as logger:
            # The ranks start first and import torch while this process does (nothing above imported it on a CPU or
            # CUDA build); none runs submission code before its first case, which comes after the reference's import.
            pool = RankPool(n_gpus, backend, None if os.environ.get("A2A_RENDEZVOUS") == "private"
                            else master_port, prefixed or bool(os.environ.get("A2A_RANK_PREFIX")),
                            birth=rank_birth(runner_face=not judged))
            if os.environ.get("A2A_RENDEZVOUS") != "private" and not pool.guards.network_ipc:
                _port_free(master_port)  # the ranks share this machine's network, where another run may hold it
            from utils import set_seed

            set_seed(seed or 42)
            import reference  # noqa: F401  (this process's own, before any rank runs a case: the owner's checks read it)
            run = ProtocolRun(logger, pool, backend, bool(os.environ.get("A2A_EXTRA")),
                              float(timeout) if timeout else None, judge.Seeds(keyed=judged, secret=seed), judged)
            if run.extra:
                logger.log("guards", f"{pool.guards.describe()}; {transport_text(pool, n_gpus)}")
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


def _exit_now(code: int) -> None:
    """Ends the protocol face: its exit handlers and its streams, then out, without tearing down the interpreter
    module by module (with torch loaded that took 0.4-0.5 s per run on a 2-core machine, and nothing of this process
    is left to tear down: the ranks, the pool and the output channel are ended and closed by then)."""
    import atexit

    atexit._run_exitfuncs()
    _flush_streams()
    os._exit(code)


if __name__ == "__main__":
    if os.getenv("POPCORN_FD"):
        _exit_now(protocol_main())
    if not (HERE / "a2a" / "harness.py").is_file():
        print("usage: POPCORN_FD=N python eval.py {test|benchmark|leaderboard|profile} TESTFILE", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    sys.exit(__import__("a2a.harness", fromlist=["main"]).main(sys.argv[1:]))
