#!/usr/bin/env python3
"""The all2all evaluator's protocol core: the file a leaderboard bundle runs as eval.py.

    POPCORN_FD=3 [POPCORN_SEED=S] [POPCORN_GPUS=N] python eval.py test|benchmark|leaderboard|profile TESTFILE

It imports `reference`, `utils`, `task` and `submission` from its own folder, writes `key: value` lines to the file
descriptor POPCORN_FD and exits 112 when a check fails. The process model is the runner's (gpu-mode
reference-kernels, problems/amd_distributed/eval.py): a spawn pool of POPCORN_GPUS workers reused across cases (a
worker is rank 0 in one case and another rank in the next), an NCCL group per case with `device_id` on the fixed
port, no `set_device` anywhere (the current device stays cuda:0 in every worker), the submission imported inside
the worker during the first case and within that case's time limit, the same timed loop, seeds, warm-up and stop
rules. What differs, and why none of it can turn a failure there into a pass here: docs/judge.md, "Faithful to the runner".

Run from the repository without POPCORN_FD, it hands over to the human face (a2a/harness.py). The human face's
options arrive as A2A_* variables, read once in `protocol_main`: A2A_BACKEND, A2A_EXTRA (device-side time, harness
floor, import time), A2A_RANK_PREFIX, A2A_TIMEOUT, A2A_RENDEZVOUS=private (ranks join a store this process holds on
a port the OS gave it, instead of the runner's fixed port), A2A_SHARE=mps (more ranks than GPUs: rank r on
cuda:(r mod GPUs), sharing through the MPS daemon the human face holds; a2a/sharing.py) with A2A_NCCL_VERSION (the
NCCL every rank must have loaded). Without A2A_SHARE a bundle refuses more ranks than GPUs, as the runner does.
A2A_MASTER_PORT moves the fixed port (parallel test workers); the runner never sets it.

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
import faulthandler
import fcntl
import importlib.util
import math
import multiprocessing
import multiprocessing.resource_tracker
import os
import re
import select
import signal
import stat
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bundle's own modules, wherever it is run from
from boundary import (RUN_OWNER, RankSandbox, Sandbox, become_subreaper, claim_run, descendants,  # noqa: E402
                      die_with_parent, enter_rank_sandbox, hide_result_channel, kill_tree, owned_tempdir,
                      prepare_rank_cache, release_uid)

__all__ = [  # what a2a/, tools/, run_leaderboard.py and diff.py use; everything else is the core's own
    "CaseRun", "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED", "EXIT_CRASH", "EXTRA_STATS", "EXTRA_STAT_FIELDS", "HELD",
    "HERE", "Hold", "InputOracle", "LEADERBOARD_SEED_STEP", "MODES", "MPS_DEFAULT_PIPE_DIRECTORY",
    "OFFICIAL_TIMEOUT_S", "OutputCheck", "OwnerAnswers", "RUN_OWNER", "RankPool", "SEED_MAX", "SPEC_KEYS", "Step",
    "Tampering", "Terminated", "TestCase", "UserError", "WARMUP_CALLS", "all_ok", "ask_owner", "bound",
    "calculate_extra_stats", "cantor_combine", "case_problem", "check_apart", "checked", "claim_run", "clone_data",
    "die_with_parent", "environ_with", "environment_with", "expected_output", "get_test_cases", "import_submission",
    "install_signal_handlers", "kill_tree", "machine_gpus", "measure", "nccl_version_tuple", "own_device", "owned_tempdir",
    "prepare_rank_cache", "rank_device", "rank_failures", "release_uid", "shipped", "snapshot", "spec_line",
    "validate_cases", "version_text",
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
# Moves the protocol face's fixed port (never set by the runner): runs side by side on one machine, such as the test
# suite's parallel workers, each on a port of its own.
MASTER_PORT_ENV = "A2A_MASTER_PORT"
MPS_DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # where MPS clients look when CUDA_MPS_PIPE_DIRECTORY is unset
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
    # The clean-up that follows must not be cut short by a second signal (seen: a second SIGTERM while the pool was
    # being killed left a submission's child behind).
    for other in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(signum)


def install_signal_handlers() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _raise_terminated)


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
_PLAIN_TYPES: dict = {"Stats": Stats, "ExtraStats": ExtraStats}  # dataclasses a rank may send (RankFailure below)


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
        # Opened without blocking and read only when it is a regular file: a FIFO would wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as source:  # bounded: a link to /dev/zero must not be read until memory runs out
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise UserError(f"Could not open test file `{path}`: Is a directory")
            if not stat.S_ISREG(mode):
                raise UserError(f"test file `{path}` is not a regular file (a FIFO, a device or a socket)")
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


def _cuda_driver_gpus(cuda: str) -> int:
    """What torch.cuda.device_count() gives on a CUDA build, asked of the driver (CUDA_VISIBLE_DEVICES applies
    alike): 0 without a driver, a device, or a driver older than the CUDA major version torch was built for."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
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


_PLAIN_TYPES["RankFailure"] = RankFailure


class RankResult(NamedTuple):
    ok: bool
    value: Any  # the job's result, or a RankFailure
    import_s: Optional[float] = None  # seconds this rank spent importing the submission during this case


# --------------------------------------------------------------------------------------------------------------
# What a rank sends its owner is plain data: the owner never unpickles an object a rank chose (an unpickled object
# can run code, and the owner runs as root, outside the ranks' sandbox). Tensors, the result types and numbers go
# as tagged dicts; the owner's unpickler resolves no class at all.
# --------------------------------------------------------------------------------------------------------------

MAX_MESSAGE_BYTES = 1 << 30
_PLAIN = "__plain__"


class Unsendable(TypeError):
    """A rank tried to send its owner something that is not plain data."""


def to_plain(obj):
    """`obj` as plain data (None, bool, int, float, str, bytes, lists, tuples, dicts of those), with tensors, the
    result types and numpy numbers tagged; Unsendable for anything else."""
    import numbers

    if obj is None or isinstance(obj, (bool, str, bytes)):
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    if isinstance(obj, RankResult):
        return {_PLAIN: "RankResult", "fields": [to_plain(v) for v in obj]}
    if type(obj).__name__ == "Tensor" and type(obj).__module__ == "torch":
        import torch

        flat = obj.detach().cpu().contiguous().reshape(-1)
        return {_PLAIN: "tensor", "dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape),
                "data": flat.view(torch.uint8).numpy().tobytes()}
    if dataclasses.is_dataclass(obj) and type(obj).__name__ in _PLAIN_TYPES:
        return {_PLAIN: type(obj).__name__, "fields": {f.name: to_plain(getattr(obj, f.name))
                                                     for f in dataclasses.fields(obj)}}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj) if type(obj) in (list, tuple) else [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {to_plain(k): to_plain(v) for k, v in obj.items()}
    raise Unsendable(f"a {type(obj).__module__}.{type(obj).__name__} cannot be sent to the evaluator")


def from_plain(obj):
    """to_plain's inverse, with this process's own classes."""
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    if not isinstance(obj, dict):
        return obj
    kind = obj.get(_PLAIN)
    if kind is None:
        return {k: from_plain(v) for k, v in obj.items()}
    if kind == "tensor":
        import torch

        raw = torch.frombuffer(bytearray(obj["data"]), dtype=torch.uint8) if obj["data"] else \
            torch.empty(0, dtype=torch.uint8)
        return raw.view(getattr(torch, obj["dtype"])).reshape(obj["shape"])
    if kind == "RankResult":
        return RankResult(*from_plain(obj["fields"]))
    return _PLAIN_TYPES[kind](**from_plain(obj["fields"]))


class _PlainUnpickler(__import__("pickle").Unpickler):
    def find_class(self, module, name):
        raise Unsendable(f"a rank sent {module}.{name}: not plain data")


def encode(obj) -> bytes:
    import pickle

    return pickle.dumps(to_plain(obj), protocol=5)


def decode(raw: bytes):
    import io

    return from_plain(_PlainUnpickler(io.BytesIO(raw)).load())


class Tampering(Exception):
    """The harness's own machinery was changed under it (a no-op barrier, a re-registered operator, a mode that
    intercepts its calls): the case is void."""


# Operators the harness's own steps run (L2 clear, clone, barrier, check, copies): a submission that re-registers any
# of them with the dispatcher (torch.library) is caught by comparing their registrations with those taken at start.
HARNESS_OPS = ("aten::fill_.Scalar", "aten::clone", "aten::_to_copy", "aten::copy_", "aten::isclose",
               "aten::logical_not", "aten::sum", "aten::sum.dim_IntList", "aten::add.Tensor", "aten::mul.Tensor",
               "aten::floor_divide", "aten::unsqueeze", "aten::empty.memory_format", "aten::_local_scalar_dense",
               "aten::max", "c10d::allreduce_")


class Bound(NamedTuple):
    """The harness's primitives, taken in the worker before any submission is imported: a submission that replaces
    `time.perf_counter_ns`, `torch.cuda.Event.elapsed_time`, `torch.distributed.barrier`, `utils.clear_l2_cache`,
    `torch.cuda.synchronize`, `torch.allclose` or the reference's functions, in their modules or classes, changes
    nothing the harness calls. It is a tuple, handed from the worker's loop to each job, never a global the
    submission could swap. What binding cannot see (the dispatcher, modes) `tampering` looks for."""
    clock_ns: Callable
    reference: tuple  # (generate_input, check_implementation), or () where no bundle is importable
    on_cuda: bool
    tensor: Any  # torch.Tensor, the class a plain output must be
    ops: dict  # name -> torch callable, taken from their classes and modules at start
    registrations: dict  # HARNESS_OPS -> the dispatcher's registrations at start
    harness: tuple  # (name, object) of every global of this module, Bound's class and `ops`, at start
    tampering: Callable  # this module's `tampering`, as it was at start


def bind_primitives() -> Bound:
    import torch
    import torch.distributed as dist

    t = torch.Tensor
    ops = {"empty": torch.empty, "zeros": torch.zeros, "tensor": torch.tensor, "fill": t.fill_, "clone": t.clone,
           "to": t.to, "cpu": t.cpu, "detach": t.detach, "item": t.item, "tolist": t.tolist,
           "isclose": torch.isclose, "logical_not": torch.logical_not, "sum": torch.sum, "add": torch.add,
           "mul": torch.mul, "floor_divide": torch.floor_divide, "unsqueeze": torch.unsqueeze, "long": t.long,
           "all_reduce": dist.all_reduce, "broadcast": dist.broadcast, "world_size": dist.get_world_size,
           "reduce_max": dist.ReduceOp.MAX, "reduce_sum": dist.ReduceOp.SUM, "device": torch.device,
           "float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
           "int64": torch.int64, "bool": torch.bool,
           "function_modes": torch._C._len_torch_function_stack, "dispatch_modes": torch._C._len_torch_dispatch_stack,
           "no_torch_function": torch._C.DisableTorchFunction, "dispatch_dump": torch._C._dispatch_dump}
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        event_type = torch._C._CudaEventBase
        ops.update(sync=torch._C._cuda_synchronize, new_event=lambda: event_type.__new__(event_type, enable_timing=True),
                   record=event_type.record, elapsed_ms=event_type.elapsed_time, query=event_type.query,
                   event_sync=event_type.synchronize, current_stream=torch.cuda.current_stream,
                   exchange_device=torch._C._cuda_exchangeDevice, sleep=getattr(torch._C, "_cuda_sleep", None))
    reference = ()
    with contextlib.suppress(ImportError):  # tools' pools run where no bundle is importable
        from reference import check_implementation, generate_input

        reference = (generate_input, check_implementation)
    registrations = {}
    for name in HARNESS_OPS:
        with contextlib.suppress(RuntimeError):
            registrations[name] = torch._C._dispatch_dump(name)
    import types

    harness = tuple((name, value) for name, value in globals().items() if name not in _HARNESS_STATE)
    return Bound(time.perf_counter_ns, reference, on_cuda, t, types.MappingProxyType(ops), registrations,
                 harness + (("Bound.__dict__", tuple(vars(Bound).items())), ("ops", tuple(ops.items()))),
                 tampering)


# The module's globals the harness itself rebinds as it runs (every other one must stay what it was at the bind).
_HARNESS_STATE = ("_setup", "_kernel", "_import_s", "_bound")


_bound: Optional[Bound] = None  # the worker's, for tools' functions (the official jobs get theirs as an argument)


def bound() -> Bound:
    """The primitives this worker bound at start (a tool's rank function reads them here)."""
    if _bound is None:
        raise RuntimeError("not in a rank worker: nothing was bound")
    return _bound


def tampering(b: Bound) -> Optional[str]:
    """What, if anything, changed under the harness's bound primitives: a torch function or dispatch mode left
    active, or an operator the harness runs registered anew."""
    here = dict(globals(), **{"Bound.__dict__": tuple(vars(type(b)).items()), "ops": tuple(b.ops.items())})
    for name, value in b.harness:
        now = here.get(name)
        if now is not value and not (isinstance(value, tuple) and now == value):
            return f"the harness's own `{name}` was replaced in its process"
    if b.ops["function_modes"]():
        return "a torch function mode is active around the harness's own calls"
    if b.ops["dispatch_modes"]():
        return "a torch dispatch mode is active around the harness's own calls"
    for name, before in b.registrations.items():
        with contextlib.suppress(RuntimeError):
            if b.ops["dispatch_dump"](name) != before:
                return f"the operator {name}, which the harness's own steps run, was registered anew"
    return None


_setup: Optional[RankSetup] = None
_kernel: Optional[Callable] = None
_import_s: Optional[float] = None
_owner_conn = None  # the worker's pipe to the pool's owner, for a job's questions (ask_owner)


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


def synchronize(b: Optional[Bound] = None) -> None:
    """torch.cuda.synchronize() as the runner calls it: on the current device, which the runner never changes."""
    b = b or bound()
    if _on_gpu():
        b.ops["sync"]()


def clear_l2(b: Bound) -> None:
    """utils.clear_l2_cache's work (a 256 MiB write on the current device, as the runner's), through bound calls."""
    if _on_gpu():
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


def snapshot(data):
    """A deep copy of a case's input taken before the submission sees it: the check runs against this, so a
    submission that writes into `rank_data` cannot change what it is checked against."""
    return copy.deepcopy(data)


def all_ok(ok: bool, rank: int, b: Optional[Bound] = None) -> bool:
    """True when every rank's `ok` is true (a collective: all ranks must call it)."""
    b = b or bound()
    ops = b.ops
    flag = ops["tensor"]([0 if ok else 1], dtype=ops["int32"], device=rank_device(rank))
    ops["all_reduce"](flag)
    return ops["item"](flag) == 0


def slowest_rank(values: list, rank: int, b: Optional[Bound] = None) -> list:
    """Element by element, the largest value over the ranks (a collective: every rank calls it with the same
    shape). Per-step device times become the slowest rank's, as the device-side number is defined."""
    b = b or bound()
    ops = b.ops
    merged = ops["tensor"](values, dtype=ops["float64"], device=rank_device(rank))
    ops["all_reduce"](merged, op=ops["reduce_max"])
    return ops["tolist"](merged)


class AbortAsk(NamedTuple):
    """The owner's answer to a question when a peer has failed: the case is over."""
    why: str


def ask_owner(kind: str, payload: Any = None) -> Any:
    """A question to the pool's owner, which answers once every rank of the case has asked the same (a
    collective). The owner never imports the submission: its clock, generator and checks are out of reach."""
    _owner_conn.send_bytes(encode(("ask", kind, payload)))
    answer = _owner_conn.recv()
    if isinstance(answer, AbortAsk):
        raise RuntimeError(answer.why)
    return answer


def expected_output(data, b: Bound):
    """The closed form of the case's output (the reference module's closed_form_output), through bound calls: what
    every timed output is checked against on the rank's device, right after its end event."""
    ops = b.ops
    cfg, rank_data, _, world_size = data
    owner = ops["floor_divide"](ops["long"](rank_data.indices), cfg.num_experts // world_size)
    scale = ops["to"](ops["add"](owner, 1), cfg.out_dtype)
    expert_out = ops["mul"](ops["unsqueeze"](ops["to"](rank_data.x, cfg.out_dtype), 1), ops["unsqueeze"](scale, 2))
    summed = ops["sum"](ops["mul"](ops["to"](expert_out, ops["float32"]), ops["unsqueeze"](rank_data.weights, 2)),
                        dim=1)
    return ops["to"](summed, cfg.out_dtype)


class OutputCheck:
    """Every timed output, checked on its device right after the end event (queued there, read once at the end):
    its type, shape, dtype and device on the host, its values against the closed form on the GPU. A copy of each is
    kept for the check apart, which the owner samples after the loop."""
    RTOL, ATOL = 1e-2, 5e-3

    def __init__(self, b: Bound, device, keep_copies: bool = True):
        self.b, self.keep = b, keep_copies
        self.bad = b.ops["zeros"](1, dtype=b.ops["int64"], device=device)
        self.host_problem: Optional[str] = None
        self.copies: list = []

    def add(self, step: int, output, expected) -> None:
        ops = self.b.ops
        if type(output) is not self.b.tensor:
            problem = f"returned a {type(output).__name__}, not a plain torch.Tensor"
        elif output.device != expected.device or output.shape != expected.shape or output.dtype != expected.dtype:
            problem = (f"returned {tuple(output.shape)} {output.dtype} on {output.device}, expected "
                       f"{tuple(expected.shape)} {expected.dtype} on {expected.device} (a shape, dtype or device "
                       "mismatch)")
        else:
            problem = None
            with ops["no_torch_function"]():
                close = ops["isclose"](output, expected, rtol=self.RTOL, atol=self.ATOL)
                ops["add"](self.bad, ops["sum"](ops["logical_not"](close)), out=self.bad)
                if self.keep:
                    self.copies.append(ops["clone"](ops["detach"](output)))
        if problem:
            self.host_problem = self.host_problem or f"timed call {step} {problem}"
            if self.keep:
                self.copies.append(None)

    def verdict(self) -> Optional[str]:
        """Why the timed outputs fail, or None (reads the device's count: one synchronization, after the loop)."""
        if self.host_problem:
            return self.host_problem
        wrong = int(self.b.ops["item"](self.bad))
        return (f"{wrong} elements of the timed calls' outputs differ from the expected values (rtol={self.RTOL}, "
                f"atol={self.ATOL}): a timed call returned a wrong output") if wrong else None


# Holding the stream (nvbench's blocking kernel): a sleep kernel queued before the start event keeps the GPU from
# starting the call's work until the host has queued all of it, so the events time the GPU's work alone. Its
# length adapts: a step whose start event had already passed when the call returned was not held (the sleep was too
# short for this host path, and the next is eight times longer); after HOLD_GIVE_UP such steps at the longest
# sleep (the fifth held step at the latest) the call is taken to synchronize
# inside (it waits for its own work, so no sleep can outlast its queueing) and is timed on an idle stream instead,
# as nvbench's exec_tag::sync does.
HOLD_START_CYCLES = 200_000  # about 100 µs at 2 GHz
HOLD_MAX_CYCLES = 64_000_000  # about 32 ms
HOLD_GIVE_UP = 2


@dataclasses.dataclass
class Hold:
    cycles: int = HOLD_START_CYCLES
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


STEP_BOUNDARIES = ("start", "cloned", "returned", "synchronized", "barrier passed")
_events: dict = {}


def _timing_events(device, b: Bound):
    """Two timing events for this device, made once: making them inside the timed window cost ~20 µs of every
    leaderboard-style step that the floor step did not pay (measured with tools/step_anatomy.py, H200 x2)."""
    if device.index not in _events:
        _events[device.index] = b.ops["new_event"](), b.ops["new_event"]()
    return _events[device.index]


class StepTimes(NamedTuple):
    host_ns: int
    output: Any
    device_ns: Optional[float]  # around the call on an idle stream (the call time), or held (the GPU's work)
    held: Optional[bool]  # with a hold: whether the stream was still held when the call returned


def timed_step(call: Optional[Callable], data, rank: int, device_clock: bool = False,
               probe: Optional[Callable[[str], None]] = None, hold: Optional[Hold] = None,
               b: Optional[Bound] = None) -> StepTimes:
    """One leaderboard-style step in the runner's order, the same code for a case and for the harness floor (`call`
    None): clear the L2, synchronize, barrier, start the host clock, clone the input, call, synchronize, barrier,
    stop; every one of them a bound primitive. The host time is the official number on rank 0. With
    `device_clock`, the device time is taken around the call alone: CUDA events on the rank's stream on a GPU run
    (with `hold`, the stream held until the call has queued its work), this rank's host clock on a CPU run.
    `probe(boundary)` is called at each of STEP_BOUNDARIES (tools: stamps, markers); the call itself runs with the
    current device the runner leaves."""
    b = b or bound()
    ops = b.ops
    mark = probe or (lambda _boundary: None)
    events = stream = None
    on_gpu = _on_gpu()
    if call is not None and device_clock and on_gpu:
        device = rank_device(rank)
        events, stream = _timing_events(device, b), ops["current_stream"](device)
    clear_l2(b)
    synchronize(b)
    barrier(rank, b)
    start = b.clock_ns()
    mark("start")
    cloned = clone_data(data, rank, b)
    mark("cloned")
    output = device_ns = held = None
    if events:
        holding = hold is not None and not hold.sync_inside and ops["sleep"] is not None
        if holding:
            previous = ops["exchange_device"](stream.device_index)
            ops["sleep"](hold.cycles)
            ops["exchange_device"](previous)
        ops["record"](events[0], stream)
        output = call(cloned)
        ops["record"](events[1], stream)
        if holding:
            held = not ops["query"](events[0])
    elif call is not None:
        call_start = b.clock_ns()
        output = call(cloned)
        device_ns = b.clock_ns() - call_start if device_clock else None
    mark("returned")
    synchronize(b)
    mark("synchronized")
    barrier(rank, b)
    host_ns = b.clock_ns() - start
    mark("barrier passed")
    if events:
        ops["event_sync"](events[1])
        device_ns = ops["elapsed_ms"](events[0], events[1]) * 1e6
    return StepTimes(host_ns, output, device_ns, held)


# Untimed calls of each callable before a tool measures it. The first calls of a shape pay one-time work (an
# extension's or Triton's build, a graph's capture, buffers' first touch, a communicator's setup) that no later call
# pays; five is what the anchors and traces have always used, more than any version has needed. The official loop
# takes none: its warm-up is the runner's (a separate first case, and the checked call before timing).
WARMUP_CALLS = 5
HELD = "held"  # a schedule entry (label, HELD) is a step with the stream held


class Step(NamedTuple):
    """One measured step, as `measure`'s after_step sees it (this rank's numbers; `output` the call's)."""
    label: str
    host_ns: float
    device_ns: Optional[float]
    call_ns: Optional[float]
    output: Any
    held: Optional[bool] = None


@dataclasses.dataclass
class Measured:
    """One label's steps in order: `host_ns` this rank's (rank 0's are the official numbers), `device_ns` and
    `call_ns` the slowest rank's (device clock around the call; host time inside the call), `held_ns` the slowest
    rank's device time of held steps (NaN where a rank's stream was not held), empty where not taken."""
    host_ns: list
    device_ns: list
    call_ns: list
    held_ns: list = dataclasses.field(default_factory=list)


def measure(calls: dict, data, rank: int, schedule, warmup: int = WARMUP_CALLS, device_clock: bool = False,
            call_clock: bool = False, probe: Optional[Callable[[str], None]] = None,
            before_step: Optional[Callable] = None, after_step: Optional[Callable[[Step], bool]] = None,
            holds: Optional[dict] = None, b: Optional[Bound] = None) -> dict:
    """The one rank-side measuring loop, around timed_step: `warmup` untimed calls of each callable in `calls`
    ({label: callable, or None for the harness floor}), then one timed step per entry of `schedule` (labels in step
    order, or (label, HELD) for a step with the stream held: a run of one, variants taking turns, A and B
    mirrored). `device_clock`: device time around the call; `call_clock`: host time inside the call (two more
    stamps in the timed window, so off for official numbers); `holds`: {label: Hold}, the adaptive sleep of each
    label's held steps. `before_step(label)` may return the next step's input (leaderboard mode's fresh seed);
    `after_step(step)` returning True stops the loop, and must agree across ranks. A collective: every rank runs
    the same schedule. Returns {label: Measured}."""
    b = b or bound()
    for call in calls.values():
        for _ in range(warmup if call is not None else 0):
            call(clone_data(data, rank, b))
    synchronize(b)
    stamps: dict = {}

    def boundary(name: str) -> None:
        stamps[name] = b.clock_ns()
        if probe:
            probe(name)

    step_probe = boundary if call_clock else probe
    holds = holds or {}
    taken = {label: Measured([], [], []) for label in calls}
    for entry in schedule:
        label, held_step = (entry[0], True) if isinstance(entry, tuple) else (entry, False)
        hold = holds.setdefault(label, Hold()) if held_step else None
        data = (before_step(label) if before_step else None) or data
        times = timed_step(calls[label], data, rank, device_clock=device_clock, probe=step_probe, hold=hold, b=b)
        call_ns = stamps["returned"] - stamps["cloned"] if call_clock and calls[label] is not None else None
        if held_step and times.held is not None:
            hold.after(times.held)
            taken[label].held_ns.append(times.device_ns if times.held else float("nan"))
        else:
            taken[label].host_ns.append(times.host_ns)
            if times.device_ns is not None:
                taken[label].device_ns.append(times.device_ns)
        if call_ns is not None:
            taken[label].call_ns.append(call_ns)
        if after_step and after_step(Step(label, times.host_ns, times.device_ns, call_ns, times.output, times.held)):
            break
        del times
    for label in calls:
        for field in ("device_ns", "call_ns", "held_ns"):
            if getattr(taken[label], field):
                setattr(taken[label], field, slowest_rank(getattr(taken[label], field), rank, b))
    return taken


def import_submission() -> Callable:
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


def checked(b: Bound, unchanged, output) -> tuple[bool, str]:
    """The reference's check (bound before the import), after the rule the reference cannot see: the output is a
    plain torch.Tensor (a subclass can answer any question the check asks, e.g. `torch.allclose`, with a lie)."""
    if isinstance(output, b.tensor) and type(output) is not b.tensor:
        return False, (f"custom_kernel returned a {type(output).__name__}, a subclass of torch.Tensor; the output "
                       "must be a plain torch.Tensor")
    with b.ops["no_torch_function"]():
        return b.reference[1](unchanged, output)


def shipped(b: Bound, output) -> dict:
    """What the check apart needs from a rank: its output, as a plain CPU tensor (the owner makes the input again
    itself, where no submission runs, and never takes one from a rank)."""
    ops = b.ops
    plain = ops["clone"](ops["cpu"](ops["detach"](output))) if type(output) is b.tensor else None
    return {"output": plain, "returned": type(output).__name__}


def _rank_test(b: Bound, test: TestCase, rank: int, apart: bool = True):
    generate_input, _ = b.reference
    custom_kernel = import_submission()
    _set_phase("generating input")
    data = generate_input(**test.args, rank=rank)
    unchanged = snapshot(data)
    synchronize(b)
    _set_phase("in custom_kernel")
    output = custom_kernel(clone_data(data, rank, b))
    synchronize(b)
    _set_phase("checking the output")
    good, message = checked(b, unchanged, output)
    if good and (why := b.tampering(b)):
        good, message = False, f"void: {why}"
    return good, ({"apart": [shipped(b, output)]} if good and apart else message)


# The check apart samples the timed calls after the loop: the ranks cannot know in advance which of their outputs
# will be checked. At least APART_MIN calls of a case (all of them when fewer ran) and APART_FRACTION of the rest go
# apart, so a submission whose outputs are wrong in a third of its timed calls is caught with probability at least
# 1 - (2/3)^12 > 0.99 by the check apart alone, whatever the GPU check in its own process says.
APART_MIN = 12
APART_FRACTION = 0.1
# The owner's clock around a timed loop may run ahead of a rank's by the messages' travel and scheduling, never by
# more than this: beyond it the rank's clock was slower than real time (docs/judge.md, "What a submission cannot do").
CLOCK_SLACK_NS = 5_000_000
CLOCK_SLACK_FRACTION = 0.05


def apart_count(steps: int, at_least: int = APART_MIN, fraction: float = APART_FRACTION) -> int:
    return min(steps, max(at_least, math.ceil(fraction * steps)))


FLOOR_STEPS = 10  # harness floor steps in front of every timed loop: the owner's measure of a step without a call


def _rank_benchmark(b: Bound, test: TestCase, rank: int, recheck: bool, max_repeats: int, max_time_ns: float,
                    extra: bool):
    generate_input, _ = b.reference
    ops = b.ops
    custom_kernel = import_submission()
    _set_phase("generating input")
    data = generate_input(**test.args, rank=rank)
    unchanged = snapshot(data)
    _set_phase("in custom_kernel")
    output = custom_kernel(clone_data(data, rank, b))
    _set_phase("checking the output")
    good, message = checked(b, unchanged, output)
    if not all_ok(good, rank, b):
        return False, RankFailure(message) if not good else RankFailure("another rank failed its check", True)
    first = shipped(b, output)
    del output

    _set_phase("in the timing loop")
    current = {"unchanged": unchanged, "expected": expected_output(unchanged, b), "failure": None}
    checker = OutputCheck(b, rank_device(rank))
    durations: list = []

    def fresh_input(_label):
        if not recheck:
            return None
        # NOTES: the seed of every step is the owner's, drawn when the step is about to run: nothing a rank holds
        # before then (its frames, its environment, the case's own seed) says what the next input will be.
        fresh = generate_input(**dict(test.args, seed=ask_owner("seed")), rank=rank)
        current["unchanged"] = snapshot(fresh)
        current["expected"] = expected_output(current["unchanged"], b)
        return fresh

    def checked_and_stopping(step: Step) -> bool:
        durations.append(step.host_ns)
        checker.add(len(durations) - 1, step.output, current["expected"])
        if recheck and "clock-mid" in current:
            rechecks.append(current["unchanged"])
        if not all_ok(True, rank, b):
            return True
        should_stop = False
        if rank == 0 and len(durations) > 2:
            stats = calculate_stats(durations)
            should_stop = (stats.err / stats.mean < 0.001 or stats.mean * stats.runs > max_time_ns
                           or b.clock_ns() - loop_start > 120e9)
        stop = ops["tensor"]([should_stop], dtype=ops["bool"], device=rank_device(rank))
        ops["broadcast"](stop, 0)
        return bool(ops["item"](stop))

    # NOTES: the owner's clock brackets the floor steps and the timed loop apart (clock-start, clock-mid,
    # clock-end): a loop whose reported steps leave more time unaccounted for than the floor steps took is void.
    def floor_work(_step: Step) -> bool:
        """What a timed step does after its window, done by each floor step too (on the expected output), so that a
        floor step is a timed step without its call."""
        stand_in = current["expected"]
        OutputCheck(b, rank_device(rank), keep_copies=False).add(0, stand_in, current["expected"])
        all_ok(True, rank, b)
        ops["broadcast"](ops["tensor"]([False], dtype=ops["bool"], device=rank_device(rank)), 0)
        return False

    ask_owner("clock-start")
    floor_start = b.clock_ns()
    floor = measure({"floor": None}, data, rank, ["floor"] * FLOOR_STEPS, warmup=0,
                    before_step=fresh_input if recheck else None, after_step=floor_work, b=b)["floor"].host_ns
    floor_ns = b.clock_ns() - floor_start
    ask_owner("clock-mid")
    current["clock-mid"] = True
    rechecks: list = []  # leaderboard mode: each timed step's input, its output checked by the reference after
    loop_start = b.clock_ns()
    timed = measure({"call": custom_kernel}, data, rank, ["call"] * max_repeats, warmup=0, device_clock=extra,
                    before_step=fresh_input, after_step=checked_and_stopping, b=b)["call"]
    loop_ns = b.clock_ns() - loop_start
    ask_owner("clock-end", {"floor_ns": floor_ns, "loop_ns": loop_ns, "floor": floor, "steps": durations,
                            "device": timed.device_ns})
    # NOTES: leaderboard mode checks every timed output with the reference, as the runner does, but after the loop,
    # on the copy taken right after its end event: so a timed step does nothing between its window and the next
    # that a floor step does not, and the owner's clock can hold the steps to the loop (clock_disagreement).
    for step, unchanged_then in enumerate(rechecks):
        if checker.copies[step] is None:  # not a tensor of the right kind: checker.verdict() says which
            continue
        good, message = checked(b, unchanged_then, checker.copies[step])
        if not good:
            current["failure"] = RankFailure(f"timed call {step}: {message}")
            break
    if not all_ok(current["failure"] is None, rank, b):
        return False, current["failure"] or RankFailure("another rank failed its check", True)
    why = checker.verdict() or b.tampering(b)
    if not all_ok(why is None, rank, b):
        return False, RankFailure(f"void: {why}") if why else RankFailure("another rank failed its check", True)
    picks = ask_owner("apart", len(durations))
    return True, {"apart": [first] + [shipped(b, checker.copies[i]) for i in picks]}


def _rank_profile(b: Bound, test: TestCase, rank: int):
    from torch.profiler import ProfilerActivity, profile

    generate_input, _ = b.reference
    custom_kernel = import_submission()
    _set_phase("generating input")
    data = clone_data(generate_input(**test.args, rank=rank), rank, b)
    synchronize(b)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if _on_gpu() else [])
    _set_phase("profiling")
    with profile(activities=activities) as prof:
        custom_kernel(data)
        synchronize(b)
    rows = []
    for event in prof.key_averages():  # plain rows: the owner unpickles nothing a rank chose
        rows.append({"key": str(event.key), "count": int(event.count),
                     **{name: float(next((getattr(event, a) for a in attrs if hasattr(event, a)), 0.0))
                        for name, attrs in PROFILE_TOTALS.items()}})
    return True, rows


def _rank_call(b: Bound, test: TestCase, rank: int, fn, args: tuple):
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
    prefix = "void: " if isinstance(exc, Tampering) else ""
    return RankFailure(f"{prefix}{type(exc).__name__}: {message}{location}", follow_on=follow_on)


def _rank_entry(b: Bound, job: str, test: TestCase, rank: int, params: dict, setup: RankSetup,
                case_id: int) -> RankResult:
    """Runs one rank of one case in a pool worker. A rank that succeeded leaves its process group here; one that
    failed leaves it after its result has gone (the worker loop calls _leave_group)."""
    global _setup, _import_s
    _setup, _import_s = setup, None
    try:
        _set_phase("joining the process group")
        _join_group(rank, test.args["world_size"], setup, case_id)
        ok, value = _RANK_JOBS[job](b, test, rank, **params)
        if ok:
            _leave_group()
        elif not isinstance(value, RankFailure):
            value = RankFailure(str(value))
        return RankResult(ok, value, _import_s)
    except BaseException as exc:  # reported to the parent, which owns the exit status
        return RankResult(False, _failure_from_exception(exc), _import_s)


def _leave_group() -> None:
    """Destroys this rank's process group, if it has one.
    NOTES: a failed rank's peers may still be inside a collective it never joined (or it left one in flight), and
    its teardown then waits for them. Its result goes to the owner first, so the owner names the failure and ends
    the peers after its grace (killing this worker with them) instead of waiting, causeless, for the watchdog."""
    import torch.distributed as dist

    if dist.is_initialized():
        _set_phase("leaving the process group")
        dist.destroy_process_group()


# How long a worker may take to leave its last case's group before the next case (RankPool.await_idle).
LEAVE_GRACE_S = 10.0
# A rank writes its Python stack to stderr on this signal (the watchdog asks before it kills), and is given this long.
STACK_SIGNAL = signal.SIGUSR1
STACK_WRITE_S = 0.2
# What a pool worker is doing, kept in shared memory so the watchdog can say where a stuck rank is.
PHASES = ("idle", "joining the process group", "importing the submission", "generating input", "in custom_kernel",
          "checking the output", "in the timing loop", "profiling", "in the launched function",
          "leaving the process group")
_phase_slot = None


def _set_phase(name: str) -> None:
    if _phase_slot is not None:
        _phase_slot.value = PHASES.index(name)


def _worker_loop(conn, phase_slot, parent_pid: int, sandbox: Optional[RankSandbox] = None,
                 bundle: Optional[str] = None) -> None:
    """A pool worker: enters its sandbox, binds the harness's primitives, then runs one rank of a case per message
    until it gets None. Dies with the pool's owner."""
    global _phase_slot, _bound, _owner_conn
    die_with_parent()
    # Ctrl-C reaches the whole process group: the pool's owner ends the run and its workers; a worker's own
    # KeyboardInterrupt would only add a traceback per rank.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, ValueError, OSError):  # no stderr to write to: no stack, still a rank
        faulthandler.register(STACK_SIGNAL, file=sys.__stderr__, all_threads=True)
    if os.getppid() not in (parent_pid, 0):  # the owner died before the line above took effect (0: born in the
        os._exit(1)  # ranks' PID namespace, whose parent is outside it)
    _phase_slot, _owner_conn = phase_slot, conn
    failure = None
    try:
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
    except Unsendable as exc:
        raw = encode(RankResult(False, RankFailure(str(exc)), result.import_s))
    try:
        conn.send_bytes(raw)
    except OSError as exc:
        try:
            conn.send_bytes(encode(RankResult(False, RankFailure(f"the rank could not send its result: {exc}"))))
        except OSError:
            os._exit(3)


# Held while environment_with has os.environ changed, and while environ_with copies it: a thread that starts a
# process from a copy (the GPU suite's runs beside a group of 8) never takes a group's MPS and NCCL settings with it.
_ENVIRON_LOCK = threading.RLock()


@contextlib.contextmanager
def environment_with(extra: dict):
    """os.environ with `extra` set, for the duration (what a spawned process starts with)."""
    with _ENVIRON_LOCK:
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


def environ_with(extra: Optional[dict] = None) -> dict:
    """A copy of os.environ with `extra` on top, for a child process (never a copy of another thread's
    environment_with)."""
    with _ENVIRON_LOCK:
        return {**os.environ, **(extra or {})}


def _death_message(exitcode: Optional[int]) -> str:
    with contextlib.suppress(ValueError, TypeError):
        if exitcode < 0:
            return f"rank process died (exit code {exitcode}, {signal.Signals(-exitcode).name})"
    return f"rank process died (exit code {exitcode})"


class Gather(NamedTuple):
    """Every rank of a case asked the owner the same question (ask_owner): `kind`, and each rank's payload."""
    kind: str
    payloads: dict


class CaseRun:
    """One case in flight on a pool: the owner's side of the ranks' questions and results. `next_event()` returns a
    Gather when every rank has asked the same question (answer it with `reply`), or the ranks' results when the
    case is over (failed, timed out, or done). Every wait has the case's deadline."""

    def __init__(self, pool: "RankPool", job: str, test: TestCase, timeout_s: float, params: Optional[dict]):
        self.pool, self.test = pool, test
        world_size = test.args["world_size"]
        pool.await_idle()
        self.slots = [(rank + pool.cases_run) % len(pool.workers) for rank in range(world_size)]
        for slot in self.slots:
            if pool.workers[slot] is None:
                pool.workers[slot] = pool._start()
        self.case_id, pool.cases_run = pool.cases_run, pool.cases_run + 1
        setup = pool._setup()
        # The ranks get the case's arguments, never the secret seed (TestCase.secret_seed and the spec line stay
        # here): the seed they get is the one their inputs are made from.
        sent = TestCase(args=dict(test.args), spec="")
        for rank, slot in enumerate(self.slots):
            pool.workers[slot][1].send((job, sent, rank, params or {}, setup, self.case_id))
        self.results: dict = {}
        self.asks: dict = {}
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.violation: Optional[str] = None
        self.done: Optional[list] = None

    def extend(self, seconds: float) -> None:
        """A new deadline, `seconds` from now (a long-lived job's next phase)."""
        self.deadline = time.monotonic() + seconds

    def _receive(self, rank: int, conn) -> None:
        process = self.pool.workers[self.slots[rank]][0]
        try:
            message = decode(conn.recv_bytes(MAX_MESSAGE_BYTES))
        except (EOFError, OSError):  # the pipe closes before the dying process is reaped: wait for its code
            process.join(timeout=5)
            self.results[rank] = RankResult(False, RankFailure(_death_message(process.exitcode)))
            return
        except Exception as exc:  # not plain data (a class, a forged pickle, a malformed message): never run
            self.violation = self.violation or (f"rank {rank} sent the evaluator something that is not plain data "
                                                f"({type(exc).__name__}: {str(exc)[:120]})")
            return
        if isinstance(message, RankResult):
            self.results[rank] = message
        elif isinstance(message, tuple) and len(message) == 3 and message[0] == "ask" and rank not in self.asks:
            self.asks[rank] = (message[1], message[2])
        else:  # NOTES: the harness sends exactly one result per case and asks one question at a time
            self.violation = self.violation or (f"rank {rank} sent the evaluator a message it did not expect: its "
                                                "channel carried something besides the harness's own")

    def next_event(self):
        world_size = len(self.slots)
        while True:
            if self.violation:
                return self._end_with(RankFailure(f"void: {self.violation}"))
            if len(self.results) == world_size:
                return self._end()
            failed = [rank for rank, result in self.results.items() if not result.ok]
            if failed:
                self.deadline = min(self.deadline, time.monotonic() + FAILED_PEER_GRACE_S)
                if self.asks:  # peers waiting on the owner hear at once that the case is over
                    self.reply(AbortAsk(f"another rank failed (rank {failed[0]}); the evaluator ended the case"))
            waiting = [rank for rank in range(world_size) if rank not in self.results]
            if not failed and self.asks and set(self.asks) == set(range(world_size)):
                kinds = {kind for kind, _ in self.asks.values()}
                if len(kinds) > 1:
                    self.violation = f"the ranks asked different questions at once ({', '.join(sorted(kinds))})"
                    continue
                event = Gather(kinds.pop(), {rank: payload for rank, (_, payload) in self.asks.items()})
                return event
            if not failed and self.results and self.asks:
                self.violation = "a rank finished while its peers were still asking the evaluator"
                continue
            now = time.monotonic()
            if now > self.deadline:
                return self._watchdog(failed, waiting)
            conns = {self.pool.workers[self.slots[rank]][1]: rank for rank in waiting if rank not in self.asks}
            ready = multiprocessing.connection.wait(list(conns), timeout=min(0.5, self.deadline - now))
            for conn in ready:
                self._receive(conns[conn], conn)

    def reply(self, answer: Any = None, per_rank: Optional[dict] = None) -> None:
        """Answers the gathered question: the same `answer` to every rank, or `per_rank[rank]`."""
        for rank in sorted(self.asks):
            with contextlib.suppress(OSError):
                self.pool.workers[self.slots[rank]][1].send(per_rank[rank] if per_rank is not None else answer)
        self.asks = {}

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


class RankPool:
    """Processes reused across cases, like the official runner's spawn pool, with a watchdog.

    As on the leaderboard, a process does not keep its rank: worker (rank + case number) % size runs `rank`, so
    per-process GPU state must be rebuilt for every process group. A case that runs past its timeout has its
    workers killed (SIGKILL, with whatever they started) and the ranks that did not return are named; a fresh worker
    takes a killed one's place when a later case needs it. Each worker talks over its own pipe, so a killed worker
    leaves no lock held. Workers are born inside the pool's Sandbox (its PID namespace, their own /proc, the ranks'
    uid, where the machine allows; `guards` says which), and between cases everything but the workers is ended
    there, so nothing a case started (a child holding the rendezvous port) reaches the next.

    `master_port` None: this process holds a TCP store on a port the OS gave it for the pool's whole life and the
    ranks of case n join it as clients under the prefix `case<n>/`, so no port is ever bound twice. A port number:
    rank 0 of every case hosts the rendezvous there (the runner's way); after a watchdog kill the next port is
    used, since the killed rank 0 may leave it in TIME_WAIT.

    `env`: variables every worker starts with on top of this process's own (ranks sharing GPUs: the MPS pipe
    folder, the SM share, NCCL's multi-rank switch and library; a2a/sharing.py). `bundle`: a folder whose
    `submission`, `reference`, `utils` and `task` the workers import (a staged version). `rerun_main` False: no job
    comes from the owner's main script, which the workers then skip (_main_not_rerun). `build_key`: what keys the
    builds the ranks keep between pools (boundary.Sandbox); by default the hash of the submission they import."""

    def __init__(self, size: int, backend: str, master_port: Optional[int] = None, rank_prefix: bool = False,
                 env: Optional[dict] = None, bundle: Optional[Path] = None, rerun_main: bool = True,
                 build_key: Optional[str] = None):
        self.context = multiprocessing.get_context("spawn")
        self.rerun_main = rerun_main
        self.backend, self.rank_prefix, self.env = backend, rank_prefix, dict(env or {})
        self.bundle = str(bundle) if bundle else None
        self.nccl_version = self.env.get("A2A_NCCL_VERSION", os.environ.get("A2A_NCCL_VERSION"))
        self.store, self.master_port = None, master_port
        self.sandbox = Sandbox(enabled=os.environ.get("A2A_SANDBOX", "1") != "0",
                               reach=(self.bundle,) if self.bundle else (), env=self.env,
                               build_key=build_key or Sandbox.source_key(Path(self.bundle or ".") / "submission.py"))
        self.guards = self.sandbox.guards
        self.workers: list = []
        self.cases_run = 0
        try:
            self.workers = [self._start() for _ in range(size)]
            if master_port is None:  # made once the workers are starting: its torch import overlaps theirs
                import torch.distributed as dist

                self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        except BaseException:
            self.kill()
            raise

    def _setup(self) -> RankSetup:
        if self.store is not None:
            return RankSetup(self.backend, store_port=self.store.port, rank_prefix=self.rank_prefix,
                             nccl_version=self.nccl_version)
        return RankSetup(self.backend, master_port=self.master_port, rank_prefix=self.rank_prefix,
                         nccl_version=self.nccl_version)

    def _start(self):
        parent_end, child_end = self.context.Pipe()
        phase = self.context.RawValue("i", 0)
        process = self.context.Process(target=_worker_loop, args=(child_end, phase, os.getpid(),
                                                                  self.sandbox.rank_setup(), self.bundle),
                                       daemon=True)
        # NOTES: multiprocessing's tracker, which the first spawn starts, is this process's helper, not a rank: it
        # starts here with this process's own environment and outside the ranks' namespace, since MPS's guardian
        # ends every process that carries the ranks' pipe folder (a2a/sharing.py).
        multiprocessing.resource_tracker.ensure_running()
        with environment_with(self.env), self.sandbox.spawning(), _main_not_rerun(not self.rerun_main):
            process.start()
        child_end.close()
        return process, parent_end, phase

    def _where(self, slot: int, test: TestCase) -> str:
        phase = PHASES[self.workers[slot][2].value] if 0 <= self.workers[slot][2].value < len(PHASES) else "?"
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

    def begin(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None) -> CaseRun:
        """Starts `job` on every rank of `test`; the owner then drives it with the CaseRun's next_event/reply."""
        return CaseRun(self, job, test, timeout_s, params)

    def run(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None,
            answer: Optional[Callable[[Gather], Any]] = None) -> list[RankResult]:
        """Runs `job` on every rank of `test`; one RankResult per rank (value a RankFailure when not ok). The ranks'
        questions go to `answer(gather)`, which returns the reply ({"per_rank": {...}} for one per rank); a
        question nobody answers voids the case."""
        case = self.begin(job, test, timeout_s, params)
        while True:
            event = case.next_event()
            if isinstance(event, list):
                return event
            if answer is None:
                case.violation = f"the ranks asked '{event.kind}', which this run does not answer"
                continue
            reply = answer(event)
            if isinstance(reply, dict) and "per_rank" in reply:
                case.reply(per_rank=reply["per_rank"])
            else:
                case.reply(reply)

    def sweep(self) -> list[int]:
        """Ends what the ranks started besides themselves: everything else in the sandbox's namespace; without one,
        the workers' descendants (a double fork's orphan then waits for the end of the run, docs/judge.md)."""
        live = {worker[0].pid for worker in self.workers if worker is not None}
        if self.sandbox.inode is not None:
            return self.sandbox.sweep(live)
        killed = []
        for pid in live:
            killed += descendants(pid)
            kill_tree(pid, include_root=False)
        return killed

    def _retire(self, slots: list[int]) -> None:
        """Kills the workers in `slots` with everything below them; run() starts fresh ones when needed."""
        for slot in slots:
            if self.workers[slot] is None:
                continue
            process, conn, _ = self.workers[slot]
            kill_tree(process.pid, include_root=process.is_alive())
            process.join()
            conn.close()
            self.workers[slot] = None
        if slots and self.master_port is not None:
            self.master_port += 1

    def shutdown(self, clean_files: bool = True) -> None:
        """Ends what the submission started in each worker, then lets the workers exit (SIGKILL after 10 s)."""
        live = [worker for worker in self.workers if worker is not None]
        self.sweep()
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
        self.sandbox.close(clean_files)

    def kill(self, clean_files: bool = True) -> None:
        """Ends every worker and everything below it at once (a signal or an error)."""
        self._retire([slot for slot, worker in enumerate(self.workers) if worker is not None])
        self.workers = []
        self.sandbox.close(clean_files)


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


class OwnerAnswers:
    """The owner's side of a timed case, out of every rank's reach: its own clock around the floor steps and the
    timed loop, each step's seed (leaderboard mode), and which timed outputs go to the check apart, drawn after
    the loop."""

    def __init__(self, apart_min: int = APART_MIN, apart_fraction: float = APART_FRACTION):
        import random

        self.random = random.SystemRandom()
        self.stamps: dict = {}
        self.void = ""
        self.apart_rule = (apart_min, apart_fraction)
        self.loop_seeds: list = []  # the seeds of the timed loop's steps, in order (leaderboard mode)
        self.picks: dict = {}  # rank -> the timed steps whose outputs go apart
        self.reports: dict = {}  # rank -> its clock-end report (steps, floor, device times)

    def __call__(self, gather: Gather):
        if gather.kind in ("clock-start", "clock-mid"):
            self.stamps[gather.kind] = time.perf_counter_ns()
            return "go"
        if gather.kind == "clock-end" and "clock-start" in self.stamps:
            self.reports = gather.payloads  # the times the owner shows: those its clock was checked against
            self.void = self.void or clock_disagreement(self.stamps, time.perf_counter_ns(), gather.payloads)
            return "ok"
        if gather.kind == "seed":
            seed = self.random.randrange(SEED_MAX - 2 ** 10)  # room for + rank, as the case's own seeds
            if "clock-mid" in self.stamps:
                self.loop_seeds.append(seed)
            return seed
        if gather.kind == "apart":
            self.picks = {rank: sorted(self.random.sample(range(steps), apart_count(steps, *self.apart_rule)))
                          for rank, steps in gather.payloads.items()}
            return {"per_rank": self.picks}
        raise ValueError(f"an unexpected question from the ranks: {gather.kind}")


def clock_disagreement(stamps: dict, end_ns: int, said: dict) -> str:
    """Why the times a case's ranks report cannot be the time that passed, or "": each rank's own clock around its
    floor steps and its timed loop must read what the owner's read (less the messages' travel), and the loop's
    steps must account for the loop but for about a floor step each (a floor step does all a timed step does
    but the call, its checks included)."""
    mid = stamps.get("clock-mid", stamps["clock-start"])
    floor_owner, loop_owner = mid - stamps["clock-start"], end_ns - mid
    per_floor_step = floor_owner / FLOOR_STEPS
    for rank, report in sorted(said.items()):
        steps, slack = report["steps"], CLOCK_SLACK_NS + CLOCK_SLACK_FRACTION * (floor_owner + loop_owner)
        unaccounted = loop_owner - sum(steps)
        if report["loop_ns"] < loop_owner - slack or report.get("floor_ns", 0) < floor_owner - slack:
            return (f"void: the evaluator's clock read {loop_owner / 1e6:.3f} ms around the timed loop and rank "
                    f"{rank}'s {report['loop_ns'] / 1e6:.3f} ms: the times reported are not the time that passed (a "
                    "clock changed in the rank's process)")
        if sum(steps) > report["loop_ns"] or (
                floor_owner and unaccounted > len(steps) * FLOOR_SHARE * per_floor_step + slack):
            return (f"void: rank {rank}'s {len(steps)} timed steps add up to {sum(steps) / 1e6:.3f} ms of the "
                    f"{loop_owner / 1e6:.3f} ms the evaluator's clock read around them, and a step without a call "
                    f"took {per_floor_step / 1e3:.1f} µs: the steps' times were made smaller than they were")
    return ""


# A floor step does all a timed step does but the call, so a loop's time outside its steps' windows is about its
# steps' count times a floor step. Measured on CPU (gloo, 2 ranks, 100 honest steps): that outside time per step was
# 0.51-1.30 floor steps on a quiet machine, and above 1.25 plus the slack in one honest run of a loaded suite run.
# The floor step's own window (the synchronize and barrier around no call) cannot be subtracted either, since the
# rank reports it: a step's time made smaller by more than that window plus one floor step is caught, a smaller
# forgery is not, and a call faster than that room can be hidden whole (docs/judge.md, "What stays open").
FLOOR_SHARE = 2.0


@dataclasses.dataclass
class ProtocolRun:
    """One protocol-face run: the output, the pool and what the human face asked for (A2A_*, read once)."""
    logger: PopcornOutput
    pool: RankPool
    backend: str
    extra: bool
    timeout_s: Optional[float]
    import_logged: bool = False
    oracle: Optional["InputOracle"] = None
    reports: dict = dataclasses.field(default_factory=dict)  # the last timed case's clock-end reports, by rank

    def case(self, job: str, test: TestCase, mode: str, params: Optional[dict] = None) -> list[RankResult]:
        answers = OwnerAnswers()
        try:
            results = self.pool.run(job, test, self.timeout_s or OFFICIAL_TIMEOUT_S[mode], params, answer=answers)
        except ValueError as exc:
            results = [RankResult(False, RankFailure(f"void: {exc}"))] * test.args["world_size"]
        if answers.void:  # a rank's own failure (a wrong output, tampering) is the reason it shows, if it has one
            results = [RankResult(False, RankFailure(answers.void), r.import_s) if r.ok else r for r in results]
        imports = [r.import_s for r in results if r.import_s is not None]
        if self.extra and imports and not self.import_logged:  # human face: what the first case spent importing
            self.logger.log("import_s", f"{max(imports):.2f}")
            self.import_logged = True
        if self.oracle is None:
            self.oracle = InputOracle(self.backend)
        self.reports = answers.reports
        return failed_apart(results, test, answers.picks, answers.loop_seeds, self.oracle)


def _oracle_inputs(rank: int, world_size: int, requests: list) -> list:
    """In a worker that never imports a submission: each requested rank input made where that rank makes it, as
    the plain tensors the closed form reads."""
    return _inputs_made(bound().reference[0], requests)


def _inputs_made(generate_input: Callable, requests: list) -> list:
    import torch

    made = []
    for args, which, device in requests:
        cfg, data, _, ws = generate_input(**args, rank=which, device=torch.device(device))
        made.append({"x": data.x.cpu(), "indices": data.indices.cpu(), "weights": data.weights.cpu(),
                     "num_experts": cfg.num_experts, "world_size": ws})
    return made


class InputOracle:
    """The inputs a case's ranks made, made again where no submission runs: a pool of one worker of its own (in
    the ranks' sandbox and GPU environment, on a CPU group), started on first use; on a CPU group the ranks made
    theirs on the CPU, and this process (which never imports a submission) makes them itself, with its own
    reference, sparing a worker's start. The check apart reads these, never an input a rank shipped."""

    def __init__(self, backend: str):
        self.backend, self.pool, self.cache = backend, None, {}

    def inputs(self, requests: list) -> list:
        """[(case args, rank)] -> the rank's input for each, made on that rank's device."""
        missing = [(args, rank) for args, rank in requests if self._key(args, rank) not in self.cache]
        if missing:
            made = self._made_here(missing) if self.backend == "gloo" else self._made_in_worker(missing)
            self.cache.update((self._key(args, rank), inputs) for (args, rank), inputs in zip(missing, made))
        return [self.cache[self._key(args, rank)] for args, rank in requests]

    @staticmethod
    def _made_here(missing: list) -> list:
        import reference

        return _inputs_made(reference.generate_input, [(args, rank, "cpu") for args, rank in missing])

    def _made_in_worker(self, missing: list) -> list:
        import torch

        if self.pool is None:
            self.pool = RankPool(1, "gloo")
        test = TestCase(args={"world_size": 1}, spec="the evaluator's own inputs")
        (result,) = self.pool.run("call", test, OFFICIAL_TIMEOUT_S["benchmark"], {
            "fn": _oracle_inputs, "args": ([(args, rank, f"cuda:{rank % torch.cuda.device_count()}")
                                            for args, rank in missing],)})
        if not result.ok:
            raise RuntimeError(f"the evaluator could not make the inputs again: {result.value.message}")
        return result.value

    @staticmethod
    def _key(args: dict, rank: int) -> tuple:
        return tuple(sorted(args.items())) + (rank,)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def check_apart(item: dict, made: dict) -> tuple[bool, str]:
    """The check made where the submission cannot reach: in this process, which never imports the submission,
    against the closed form of the input the owner made itself (InputOracle), with this process's own torch and
    reference, imported before any rank started."""
    import types

    from reference import check_output, closed_form_output

    if item.get("output") is None:
        return False, f"custom_kernel returned a {item.get('returned')}, not a plain torch.Tensor"
    cfg = types.SimpleNamespace(num_experts=made["num_experts"], out_dtype=item["output"].dtype)
    rank_data = types.SimpleNamespace(x=made["x"], indices=made["indices"], weights=made["weights"])
    return check_output(item["output"], closed_form_output((cfg, rank_data, None, made["world_size"]), on_cpu=True))


def failed_apart(results: list, test: TestCase, picks: dict, loop_seeds: list, oracle: InputOracle) -> list:
    """Ranks whose outputs the check apart rejects, as failures: the checked call, and (timed modes) each timed
    call the owner drew, exactly those, each against the input of its own seed (the case's, or the step's in
    leaderboard mode). A rank that shipped more, fewer or other outputs than that fails too."""
    wanted = {}
    for rank, result in enumerate(results):
        if result.ok and isinstance(result.value, dict):
            seeds = [test.args["seed"]] + [loop_seeds[i] if loop_seeds else test.args["seed"]
                                           for i in picks.get(rank, [])]
            wanted[rank] = [(dict(test.args, seed=seed), rank) for seed in seeds]
    made = dict(zip(wanted, _chunked(oracle.inputs([r for rs in wanted.values() for r in rs]),
                                     [len(rs) for rs in wanted.values()])))
    checked_results = []
    for rank, result in enumerate(results):
        if rank not in wanted:
            checked_results.append(result)
            continue
        items = result.value.pop("apart", None)
        if not isinstance(items, list) or len(items) != len(wanted[rank]):
            message = (f"it shipped {len(items) if isinstance(items, list) else 'no'} outputs for the check apart, "
                       f"not the {len(wanted[rank])} the evaluator drew")
        else:
            message = next((why for good, why in (check_apart(i, m) for i, m in zip(items, made[rank]))
                            if not good), None)
        checked_results.append(result if message is None else RankResult(False, RankFailure(
            "the output failed the check made outside the submission's process, although the check in it passed "
            f"(something in that process changed what the check saw): {message}"), result.import_s))
    return checked_results


def _chunked(items: list, sizes: list) -> list:
    out, at = [], 0
    for size in sizes:
        out.append(items[at:at + size])
        at += size
    return out


def run_testing(run: ProtocolRun, tests: list[TestCase]) -> int:
    passed = True
    run.logger.log("test-count", len(tests))
    for idx, test in enumerate(tests):
        run.logger.log(f"test.{idx}.spec", test.spec)
        results = run.case("test", test, "test")
        if all(r.ok for r in results):
            run.logger.log(f"test.{idx}.status", "pass")
        else:
            passed = False
            run.logger.log(f"test.{idx}.status", "fail")
            run.logger.log(f"test.{idx}.error", rank_failures(results))
    run.logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _benchmark(run: ProtocolRun, test: TestCase, recheck: bool, max_time_ns: float, mode: str):
    """One timed case: its statistics, computed here from the steps rank 0 reported at the end of its loop, the
    report the owner's clock was checked against (the device times are already the slowest rank's), or its
    failures."""
    params = dict(recheck=recheck, max_repeats=MAX_REPEATS, max_time_ns=max_time_ns, extra=run.extra)
    results = run.case("benchmark", test, mode, params)
    if not all(r.ok for r in results):
        return rank_failures(results)
    report = run.reports[0]
    out = {"stats": calculate_stats(report["steps"])}
    if run.extra:
        out.update(host=calculate_extra_stats(report["steps"]), floor=calculate_extra_stats(report["floor"]))
        if report["device"]:
            out["device"] = calculate_extra_stats(report["device"])
    return out


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


# The totals a profile reports per operator, each from whichever attribute the installed torch names it by.
PROFILE_TOTALS = {"self_cpu_us": ("self_cpu_time_total",), "cpu_us": ("cpu_time_total",),
                  "self_device_us": ("self_device_time_total", "self_cuda_time_total"),
                  "device_us": ("device_time_total", "cuda_time_total")}
PROFILE_ROWS = 20


def profile_table(per_rank: list, on_gpu: bool) -> str:
    """The operators of every rank's profile summed per key, the PROFILE_ROWS largest by self device time (CPU time
    on a CPU run), as a fixed-width table (the bundle has no tabulate)."""
    totals: dict = {}
    for rows in per_rank:
        for row in rows:
            into = totals.setdefault(row["key"], dict.fromkeys(("count", *PROFILE_TOTALS), 0.0))
            for name in into:
                into[name] += row[name]
    order = "self_device_us" if on_gpu else "self_cpu_us"
    ranked = sorted(totals.items(), key=lambda item: -item[1][order])[:PROFILE_ROWS]
    width = max([len("operator")] + [len(key[:60]) for key, _ in ranked])
    header = f"{'operator':<{width}}  {'calls':>7}" + "".join(f"  {name:>15}" for name in PROFILE_TOTALS)
    lines = [header, "-" * len(header)]
    for key, row in ranked:
        lines.append(f"{key[:60]:<{width}}  {int(row['count']):>7}" + "".join(f"  {row[n]:>15.1f}"
                                                                             for n in PROFILE_TOTALS))
    return "\n".join(lines) + f"\n(summed over {len(per_rank)} ranks; µs)"


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
        report = profile_table([r.value for r in results], run.backend != "gloo")
        run.logger.log(f"benchmark.{idx}.report", base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    run.logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def _env_integer(name: str, text: str, low: int, high: int, what: str = "an integer") -> int:
    """An environment variable's integer in [low, high], or bad input naming it."""
    if not re.fullmatch(r"[0-9]+", text.strip()) or not low <= int(text) <= high:
        raise UserError(f"{name} must be {what} from {low} to {high}, not '{text[:40]}'")
    return int(text)


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
        values[name] = _env_integer(name, text, low, high)
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


def _port_free(port: int) -> None:
    """The fixed rendezvous port must be free before any rank binds it: another evaluator holding it would make
    every case fail at its rendezvous."""
    import socket

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
        fd, seed, n_gpus = _environment()
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
        tests = read_test_file(Path(test_file), seed)
        gpus = machine_gpus()
        backend = os.environ.get("A2A_BACKEND") or ("nccl" if gpus else "gloo")
        validate_cases(tests, n_gpus, backend, gpus, shared=_sharing_asked())
        timeout = os.environ.get("A2A_TIMEOUT")
        if os.environ.get("A2A_RENDEZVOUS") != "private":
            _port_free(master_port)
        with PopcornOutput(fd) as logger:
            # The ranks start first and import torch while this process does (nothing above imported it on a CPU or
            # CUDA build); none runs submission code before its first case, which comes after the reference's import.
            pool = RankPool(n_gpus, backend, None if os.environ.get("A2A_RENDEZVOUS") == "private"
                            else master_port, bool(os.environ.get("A2A_RANK_PREFIX")))
            from utils import set_seed

            set_seed(seed or 42)
            import reference  # noqa: F401  (this process's own, before any rank runs a case: the check apart reads it)
            run = ProtocolRun(logger, pool, backend, bool(os.environ.get("A2A_EXTRA")),
                              float(timeout) if timeout else None)
            if run.extra:
                logger.log("guards", pool.guards.describe())
            try:
                if mode == "test":
                    code = run_testing(run, tests)
                elif mode == "profile":
                    code = run_profiling(run, tests)
                else:
                    code = run_benchmarking(run, tests, mode)
            finally:
                if run.oracle is not None:
                    run.oracle.close()
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
