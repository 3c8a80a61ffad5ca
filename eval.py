#!/usr/bin/env python3
"""The all2all evaluator: one core, two faces.

Protocol face (what the leaderboard runs; this file is the bundle's eval.py):
    POPCORN_FD=3 [POPCORN_SEED=S] [POPCORN_GPUS=N] python eval.py test|benchmark|leaderboard|profile TESTFILE
  It imports `reference`, `utils`, `task` and `submission` from its own folder, writes `key: value` lines to the
  file descriptor POPCORN_FD and exits 112 when a check fails. Keys, timing steps and stop rules are those of the
  official runner.

Human face (run from the repository):
    python eval.py test|benchmark|leaderboard|profile VERSION [--world-size N] [--cases tests|benchmarks|...]
                   [--seed S] [--backend nccl|gloo] [--timeout S]
    python eval.py stage VERSION DIR
  It stages VERSION as a leaderboard bundle, runs the protocol face on it, and prints a table. Beside the
  leaderboard-style time it reports a device-side time and the harness floor (see README, "How numbers are timed").

Additions over the official runner, none of which changes its output for a working submission: a build step that
imports the submission once before any case (so load_inline compiles once, outside the timeouts); a watchdog that
kills the ranks of a case that runs past its timeout and rebuilds the pool; clear one-line errors for bad input;
CPU runs on gloo. Options the human face passes to the protocol face travel as A2A_* environment variables.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
MODES = ("test", "benchmark", "leaderboard", "profile")
EXIT_CHECK_FAILED = 112
EXIT_BAD_TEST_FILE = 113
EXIT_USAGE = 2

# Per-case timeouts of the official runner (seconds); A2A_TIMEOUT replaces them.
OFFICIAL_TIMEOUT_S = {"test": 60, "benchmark": 180, "leaderboard": 180, "profile": 120}
# After one rank of a case has failed, how long the others get to return before the watchdog kills them.
FAILED_PEER_GRACE_S = 10.0
DEFAULT_MASTER_PORT = 12356
BUILD_TIMEOUT_S = 900

# NVLink multicast stays off on every machine this runs on (it can take a shared host's GPUs down).
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)


class UserError(Exception):
    """Bad input: reported as one line, non-zero exit, no traceback."""


# --------------------------------------------------------------------------------------------------------------
# Protocol core
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


def get_test_cases(text: str, seed: Optional[int]) -> list[TestCase]:
    tests = [TestCase(args=parse_test_line(line), spec=line) for line in text.splitlines()]
    if seed is not None:
        for test in tests:
            if "seed" in test.args:
                test.args["seed"] = cantor_combine(test.args["seed"], seed)
    return tests


def calculate_stats(durations: list[float]) -> Stats:
    runs = len(durations)
    avg = sum(durations) / runs
    variance = sum((d - avg) ** 2 for d in durations)
    std = math.sqrt(variance / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs=runs, mean=avg, std=std, err=std / math.sqrt(runs), best=float(min(durations)),
                 worst=float(max(durations)))


@functools.lru_cache(maxsize=None)
def _backend() -> str:
    """Fixed for a process's life: workers inherit A2A_BACKEND when they start."""
    import torch

    return os.environ.get("A2A_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")


@functools.lru_cache(maxsize=None)
def _on_gpu() -> bool:
    import torch

    return _backend() != "gloo" and torch.cuda.is_available()


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


def _join_group(rank: int, world_size: int):
    import torch
    import torch.distributed as dist

    if os.environ.get("A2A_RANK_PREFIX") and not isinstance(sys.stdout, _RankPrefix):
        sys.stdout = _RankPrefix(sys.stdout, f"[rank{rank}] ")
        sys.stderr = _RankPrefix(sys.stderr, f"[rank{rank}] ")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("A2A_MASTER_PORT", str(DEFAULT_MASTER_PORT))
    backend = _backend()
    if backend == "gloo":
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                device_id=torch.device(f"cuda:{rank}"))


def _leave_group():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _describe_exception(exc: BaseException) -> str:
    """One line: exception type, message and the innermost frame of the submission, if any."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if f.filename.endswith("submission.py")), frames[-1] if frames else None)
    location = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    message = " ".join(str(exc).split())[:400]
    return f"{type(exc).__name__}: {message}{location}"


def _rank_entry(job: str, test: TestCase, rank: int, params: dict):
    """Runs one rank of one case in a pool worker. Returns (ok, value): value is a message, Stats or a report."""
    try:
        _set_phase("joining the process group")
        _join_group(rank, test.args["world_size"])
        try:
            _set_phase("generating input")
            return _RANK_JOBS[job](test, rank, **params)
        finally:
            _leave_group()
    except BaseException as exc:  # reported to the parent, which owns the exit status
        return False, _describe_exception(exc)


def _all_ok(ok: bool, rank: int) -> bool:
    """True when every rank's `ok` is true (a collective: all ranks must call it)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=f"cuda:{rank}" if _on_gpu() else "cpu")
    dist.all_reduce(flag)
    return flag.item() == 0


def _rank_test(test: TestCase, rank: int):
    from reference import check_implementation, generate_input
    from submission import custom_kernel

    data = generate_input(**test.args, rank=rank)
    _synchronize()
    _set_phase("in custom_kernel")
    output = custom_kernel(_clone_data(data, rank))
    _synchronize()
    _set_phase("checking the output")
    return check_implementation(data, output)


def _rank_benchmark(test: TestCase, rank: int, recheck: bool, max_repeats: int, max_time_ns: float, extra: bool):
    import torch
    import torch.distributed as dist
    from reference import check_implementation, generate_input
    from submission import custom_kernel
    from utils import clear_l2_cache

    on_gpu = _on_gpu()
    device = f"cuda:{rank}" if on_gpu else "cpu"
    data = generate_input(**test.args, rank=rank)
    check_copy = _clone_data(data, rank)
    _set_phase("in custom_kernel")
    output = custom_kernel(_clone_data(data, rank))
    _set_phase("checking the output")
    good, message = check_implementation(check_copy, output)
    if not _all_ok(good, rank):
        return False, message or "another rank failed its check"

    durations, device_durations = [], []
    start_event = end_event = None
    if on_gpu and extra:
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _set_phase("in the timing loop")
    bm_start = time.perf_counter_ns()
    iterations = 0
    for i in range(max_repeats):
        iterations += 1
        error_message = None
        if recheck:
            test.args["seed"] += 13
            data = generate_input(**test.args, rank=rank)
            check_copy = _clone_data(data, rank)
        clear_l2_cache()
        _synchronize()
        dist.barrier()
        if rank == 0:
            start_time = time.perf_counter_ns()
        cloned = _clone_data(data, rank)
        if extra and on_gpu:
            start_event.record()
            output = custom_kernel(cloned)
            end_event.record()
        elif extra:
            rank_start = time.perf_counter_ns()
            output = custom_kernel(cloned)
            device_durations.append(time.perf_counter_ns() - rank_start)
        else:
            output = custom_kernel(cloned)
        _synchronize()
        dist.barrier()
        if rank == 0:
            durations.append(time.perf_counter_ns() - start_time)
        if extra and on_gpu:
            device_durations.append(start_event.elapsed_time(end_event) * 1e6)
        if recheck:
            good, message = check_implementation(check_copy, output)
            if not good:
                error_message = message
        del output
        if not _all_ok(error_message is None, rank):
            return False, error_message or "another rank failed its check"

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
        # Device-side time of an iteration = the slowest rank's time for that iteration.
        per_rank = torch.tensor(device_durations, dtype=torch.float64, device=device)
        dist.all_reduce(per_rank, op=dist.ReduceOp.MAX)
        result["device"] = calculate_stats(per_rank.tolist())
        result["floor"] = _harness_floor(data, rank, iterations)
    return True, result


def _harness_floor(data, rank: int, runs: int) -> Optional[Stats]:
    """The leaderboard-style timing of an empty step (L2 clear, sync, barrier, clone, sync, barrier): the part
    of every leaderboard-style number that is not the submission."""
    import torch.distributed as dist
    from utils import clear_l2_cache

    durations = []
    for _ in range(max(runs, 10)):
        clear_l2_cache()
        _synchronize()
        dist.barrier()
        start = time.perf_counter_ns()
        _clone_data(data, rank)
        _synchronize()
        dist.barrier()
        durations.append(time.perf_counter_ns() - start)
    return calculate_stats(durations) if rank == 0 else None


def _rank_profile(test: TestCase, rank: int):
    from torch.profiler import ProfilerActivity, profile

    from reference import generate_input
    from submission import custom_kernel

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
    return True, fn(rank, test.args["world_size"], *args)


_RANK_JOBS = {"test": _rank_test, "benchmark": _rank_benchmark, "profile": _rank_profile, "call": _rank_call}


# What a pool worker is doing, kept in shared memory so the watchdog can say where a stuck rank is.
PHASES = ("idle", "joining the process group", "generating input", "in custom_kernel", "checking the output",
          "in the timing loop", "profiling")
_phase_slot = None


def _set_phase(name: str) -> None:
    if _phase_slot is not None:
        _phase_slot.value = PHASES.index(name)


def _worker_loop(conn, phase_slot) -> None:
    """A pool worker: runs one rank of a case per message until it gets None."""
    global _phase_slot
    _phase_slot = phase_slot
    while True:
        message = conn.recv()
        if message is None:
            return
        result = _rank_entry(*message)
        _set_phase("idle")
        conn.send(result)


class RankPool:
    """Processes reused across cases, like the official runner's spawn pool, with a watchdog.

    As on the leaderboard, a process does not keep its rank: worker (rank + case number) % size runs `rank`, so
    per-process GPU state must be rebuilt for every process group. A case that runs past its timeout has its
    workers killed (SIGKILL), the ranks that did not return are named, and fresh workers take their place. Each
    worker talks over its own pipe, so a killed worker leaves no lock held."""

    def __init__(self, size: int):
        self.context = multiprocessing.get_context("spawn")
        self.workers = [self._start() for _ in range(size)]
        self.cases_run = 0

    def _start(self):
        parent_end, child_end = self.context.Pipe()
        phase = self.context.RawValue("i", 0)
        process = self.context.Process(target=_worker_loop, args=(child_end, phase), daemon=True)
        process.start()
        child_end.close()
        return process, parent_end, phase

    def run(self, job: str, test: TestCase, timeout_s: float, params: Optional[dict] = None) -> list:
        world_size = test.args["world_size"]
        slots = [(rank + self.cases_run) % len(self.workers) for rank in range(world_size)]
        self.cases_run += 1
        for rank, slot in enumerate(slots):
            self.workers[slot][1].send((job, test, rank, params or {}))
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
                    except EOFError:
                        results[rank] = (False, f"rank process died (exit code {process.exitcode})")
                elif not process.is_alive():
                    results[rank] = (False, f"rank process died (exit code {process.exitcode})")
            if any(not ok for ok, _ in results.values()):
                deadline = min(deadline, time.monotonic() + FAILED_PEER_GRACE_S)
            if len(results) < world_size and time.monotonic() > deadline:
                missing = [rank for rank in range(world_size) if rank not in results]
                where = ", ".join(f"rank {rank} {PHASES[self.workers[slots[rank]][2].value]}" for rank in missing)
                note = (f"watchdog: case '{test.spec}' did not finish in {timeout_s:g} s; "
                        f"rank(s) {', '.join(map(str, missing))} did not return and were killed ({where})")
                print(note, file=sys.stderr, flush=True)
                self._replace(slots)
                return [results.get(rank, (False, note)) for rank in range(world_size)]
            time.sleep(0.002)
        dead = [slot for slot in slots if not self.workers[slot][0].is_alive()]
        if dead:
            self._replace(dead)
        return [results[rank] for rank in range(world_size)]

    def _replace(self, slots: list[int]) -> None:
        for slot in slots:
            process, conn, _ = self.workers[slot]
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join()
            conn.close()
            self.workers[slot] = self._start()
        # A killed rank 0 may leave its rendezvous port in TIME_WAIT: later groups use the next port.
        os.environ["A2A_MASTER_PORT"] = str(int(os.environ.get("A2A_MASTER_PORT", DEFAULT_MASTER_PORT)) + 1)

    def shutdown(self) -> None:
        for _, conn, _ in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
        for process, conn, _ in self.workers:
            process.join(timeout=10)
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
                process.join()
            conn.close()


def _case_timeout(mode: str) -> float:
    return float(os.environ.get("A2A_TIMEOUT") or OFFICIAL_TIMEOUT_S[mode])


def _rank_failures(results: list) -> str:
    return "\n".join(f"rank {rank} - {value}" for rank, (ok, value) in enumerate(results) if not ok)


def run_testing(logger: PopcornOutput, pool: RankPool, tests: list[TestCase]) -> int:
    passed = True
    logger.log("test-count", len(tests))
    for idx, test in enumerate(tests):
        logger.log(f"test.{idx}.spec", test.spec)
        results = pool.run("test", test, _case_timeout("test"))
        if all(ok for ok, _ in results):
            logger.log(f"test.{idx}.status", "pass")
        else:
            passed = False
            logger.log(f"test.{idx}.status", "fail")
            logger.log(f"test.{idx}.error", _rank_failures(results))
    logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def run_single_benchmark(pool: RankPool, test: TestCase, recheck: bool, max_repeats: int, max_time_ns: float,
                         mode: str):
    extra = bool(os.environ.get("A2A_EXTRA"))
    params = dict(recheck=recheck, max_repeats=max_repeats, max_time_ns=max_time_ns, extra=extra)
    results = pool.run("benchmark", test, _case_timeout(mode), params)
    if not all(ok for ok, _ in results):
        return _rank_failures(results)
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
            for field in ("runs", "mean", "std", "best", "worst"):
                logger.log(f"benchmark.{idx}.{kind}_{field}", getattr(result[kind], field))
    return True


def run_benchmarking(logger: PopcornOutput, pool: RankPool, tests: list[TestCase], mode: str) -> int:
    recheck, max_time_ns, warmup_time_ns = (True, 30e9, 1e7) if mode == "leaderboard" else (False, 10e9, 10e7)
    run_single_benchmark(pool, tests[0], False, 100, warmup_time_ns, mode)
    logger.log("benchmark-count", len(tests))
    passed = True
    for idx, test in enumerate(tests):
        logger.log(f"benchmark.{idx}.spec", test.spec)
        result = run_single_benchmark(pool, test, recheck, 100, max_time_ns, mode)
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


def run_profiling(logger: PopcornOutput, pool: RankPool, tests: list[TestCase]) -> int:
    passed = True
    logger.log("benchmark-count", len(tests))
    for idx, test in enumerate(tests):
        logger.log(f"benchmark.{idx}.spec", test.spec)
        results = pool.run("profile", test, _case_timeout("profile"))
        if not all(ok for ok, _ in results):
            passed = False
            logger.log(f"benchmark.{idx}.status", "fail")
            logger.log(f"benchmark.{idx}.error", _rank_failures(results))
            continue
        sort_key = "self_cuda_time_total" if _on_gpu() else "self_cpu_time_total"
        report = _combine_traces([events for _, events in results]).table(sort_by=sort_key, row_limit=20)
        logger.log(f"benchmark.{idx}.report", base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    logger.log("check", "pass" if passed else "fail")
    return 0 if passed else EXIT_CHECK_FAILED


def validate_cases(tests: list[TestCase], pool_size: int, backend: str, gpus: int) -> None:
    """Rejects cases no run could finish: raises UserError with one line."""
    for test in tests:
        args = test.args
        missing = [k for k in ("num_experts", "experts_per_token", "hidden_dim", "max_num_tokens", "seed",
                               "world_size") if k not in args]
        if missing:
            raise UserError(f"test '{test.spec}' lacks {', '.join(missing)}")
        ws = args["world_size"]
        if ws < 1 or args["num_experts"] % ws:
            raise UserError(f"test '{test.spec}': {args['num_experts']} experts cannot be split evenly over "
                            f"{ws} ranks")
        if args["max_num_tokens"] < 2:
            raise UserError(f"test '{test.spec}': max_num_tokens must be at least 2 (token counts are drawn "
                            f"from [1, max_num_tokens))")
        if not 0 < args["experts_per_token"] <= args["num_experts"]:
            raise UserError(f"test '{test.spec}': experts_per_token must be in 1..num_experts")
        if ws > pool_size:
            raise UserError(f"test '{test.spec}' needs {ws} ranks but the pool has {pool_size} "
                            f"(POPCORN_GPUS={pool_size})")
        if backend != "gloo" and ws > gpus:
            raise UserError(f"test '{test.spec}' needs {ws} ranks but this machine has {gpus} GPU(s); "
                            f"use --world-size {gpus} or --backend gloo")


def builds_device_code(source: str) -> bool:
    """A submission that builds device code with load_inline: built once before any case, GPU-only."""
    return "load_inline" in source


def build_submission(folder: Path) -> None:
    """Imports the submission once, in a separate process, before any case: a load_inline build happens here,
    once, outside the per-case timeouts, and the pool's ranks then load it from the extension cache. Also
    reports an import error or a missing custom_kernel as one line."""
    compiles = builds_device_code((folder / "submission.py").read_text())
    if compiles:
        print("compiling submission extensions (once, before any case; ranks load the cached build) ...",
              file=sys.stderr, flush=True)
    probe = ("import sys, submission\n"
             "sys.exit(0 if callable(getattr(submission, 'custom_kernel', None)) else 3)\n")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd=folder, capture_output=True, text=True,
                              timeout=float(os.environ.get("A2A_BUILD_TIMEOUT", BUILD_TIMEOUT_S)))
    except subprocess.TimeoutExpired:
        raise UserError("importing submission.py (and building its extensions) did not finish in time")
    if done.returncode == 3:
        raise UserError("submission.py defines no custom_kernel(data)")
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
        raise UserError(f"importing submission.py failed: {last[0].strip()}")
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
    seed = int(seed) if seed else None
    n_gpus = int(os.getenv("POPCORN_GPUS", "1"))
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
    import torch
    from utils import set_seed

    set_seed(seed or 42)
    try:
        validate_cases(tests, n_gpus, _backend(), torch.cuda.device_count())
        build_submission(HERE)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    with PopcornOutput(int(os.environ["POPCORN_FD"])) as logger:
        pool = RankPool(n_gpus)
        try:
            if mode == "test":
                return run_testing(logger, pool, tests)
            if mode == "profile":
                return run_profiling(logger, pool, tests)
            return run_benchmarking(logger, pool, tests, mode)
        finally:
            pool.shutdown()


# --------------------------------------------------------------------------------------------------------------
# Human face
# --------------------------------------------------------------------------------------------------------------

TASK_YML = HERE / "problems" / "all2all" / "task.yml"
SUBMISSIONS = HERE / "submissions" / "all2all"
SPEC_KEYS = ("num_experts", "experts_per_token", "hidden_dim", "max_num_tokens", "seed", "world_size")


def load_task(path: Path = TASK_YML) -> dict:
    import yaml

    try:
        task = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}")
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {' '.join(str(exc).split())}")
    if not isinstance(task, dict):
        raise UserError(f"{path}: expected a mapping at the top level")
    for key in ("files", "tests", "benchmarks"):
        if not isinstance(task.get(key), list) or not task[key]:
            raise UserError(f"{path}: '{key}' must be a non-empty list")
    for section in ("tests", "benchmarks"):
        for i, case in enumerate(task[section]):
            if not isinstance(case, dict) or set(case) != set(SPEC_KEYS) or not all(
                    isinstance(v, int) for v in case.values()):
                raise UserError(f"{path}: {section}[{i}] must give exactly the integer fields "
                                f"{', '.join(SPEC_KEYS)}")
    for i, entry in enumerate(task["files"]):
        if not isinstance(entry, dict) or not {"name", "source"} <= set(entry):
            raise UserError(f"{path}: files[{i}] must have 'name' and 'source'")
    return task


def spec_line(case: dict) -> str:
    return "; ".join(f"{key}: {case[key]}" for key in SPEC_KEYS)


def list_versions() -> list[Path]:
    return sorted(p for p in SUBMISSIONS.glob("v*.py"))


def resolve_version(name: str) -> Path:
    """A version name (`v1`, `v1_torch_sort`) or a path to a submission file."""
    path = Path(name)
    if path.suffix == ".py" or os.sep in name:
        if not path.is_file():
            raise UserError(f"no such file: {name}")
        return path.resolve()
    matches = [p for p in list_versions() if p.stem == name or p.stem.split("_")[0] == name]
    if len(matches) != 1:
        known = ", ".join(p.stem for p in list_versions()) or "none"
        raise UserError(f"unknown version '{name}' (known: {known})")
    return matches[0]


def submission_problem(path: Path) -> Optional[str]:
    """None when the file parses and defines custom_kernel; otherwise what is wrong, in one line."""
    import ast

    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        return f"{path.name} does not parse: line {exc.lineno}: {exc.msg}"
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    return None if "custom_kernel" in names else f"{path.name} defines no custom_kernel(data)"


def needs_gpu(path: Path) -> bool:
    return builds_device_code(path.read_text())


def stage(version: Path, folder: Path, task_path: Path = TASK_YML) -> Path:
    """Writes the leaderboard bundle for `version` into `folder`: the files task.yml lists (submission.py,
    task.py, utils.py, reference.py, eval.py), plus tests.txt and benchmarks.txt, the test files the runner
    makes from task.yml and passes to eval.py."""
    import shutil

    task = load_task(task_path)
    folder.mkdir(parents=True, exist_ok=True)
    for entry in task["files"]:
        source = version if entry["source"] == "@SUBMISSION@" else (task_path.parent / entry["source"]).resolve()
        if not source.is_file():
            raise UserError(f"{task_path}: file '{entry['source']}' for {entry['name']} does not exist")
        shutil.copyfile(source, folder / entry["name"])
    for section in ("tests", "benchmarks"):
        (folder / f"{section}.txt").write_text("\n".join(spec_line(case) for case in task[section]) + "\n")
    return folder


def select_cases(task: dict, selector: str) -> list[str]:
    """`tests`, `benchmarks`, `tests:0,3`, `benchmarks:4`, or a file of spec lines."""
    section, _, picks = selector.partition(":")
    if section in ("tests", "benchmarks"):
        cases = task[section]
        if picks:
            try:
                indices = [int(p) for p in picks.split(",")]
                cases = [cases[i] for i in indices]
            except (ValueError, IndexError):
                raise UserError(f"--cases {selector}: indices must be in 0..{len(task[section]) - 1}")
        return [spec_line(c) for c in cases]
    path = Path(selector)
    if path.is_file():
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        for line in lines:
            try:
                parse_test_line(line)
            except ValueError as exc:
                raise UserError(str(exc))
        return lines
    raise UserError(f"--cases {selector}: expected tests, benchmarks, tests:I,J, benchmarks:I or a test file")


def with_world_size(line: str, world_size: int) -> str:
    case = parse_test_line(line)
    case["world_size"] = world_size
    return "; ".join(f"{k}: {v}" for k, v in case.items())


@dataclasses.dataclass
class EvalResult:
    version: str
    mode: str
    world_size: int
    backend: str
    exit_code: int
    keys: dict
    cases: list  # one dict per case: index, spec, status, error, and timing fields in microseconds
    stderr: str


def parse_popcorn(text: str) -> dict:
    """`key: value` lines -> dict; a line that is not `key: value` continues the previous value."""
    keys, last = {}, None
    for line in text.splitlines():
        matched = re.match(r"^([\w.-]+): (.*)$", line)
        if matched:
            last = matched[1]
            keys[last] = matched[2]
        elif last is not None:
            keys[last] += "\n" + line
    return keys


def _cases_from_keys(keys: dict, mode: str) -> list:
    prefix = "test" if mode == "test" else "benchmark"
    cases = []
    for idx in range(int(keys.get(f"{prefix}-count", 0))):
        if f"{prefix}.{idx}.spec" not in keys:
            break
        case = {"index": idx, "spec": keys[f"{prefix}.{idx}.spec"]}
        status = keys.get(f"{prefix}.{idx}.status")
        if mode != "test" and status is None and f"{prefix}.{idx}.mean" in keys:
            status = "pass"
        case["status"] = status or "not run"
        case["error"] = keys.get(f"{prefix}.{idx}.error", "")
        for field in ("mean", "std", "err", "best", "worst", "device_mean", "device_best", "floor_mean",
                      "floor_best"):
            if f"{prefix}.{idx}.{field}" in keys:
                case[f"{field}_us"] = float(keys[f"{prefix}.{idx}.{field}"]) / 1e3
        if f"{prefix}.{idx}.runs" in keys:
            case["runs"] = int(keys[f"{prefix}.{idx}.runs"])
        if f"{prefix}.{idx}.report" in keys:
            case["report"] = base64.b64decode(keys[f"{prefix}.{idx}.report"], b"+*").decode("utf-8")
        cases.append(case)
    return cases


def machine_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_run(world_size: Optional[int], backend: Optional[str]) -> tuple[int, str]:
    """Picks world size and backend for this machine: all GPUs up to 8 on NCCL, else 2 ranks on gloo."""
    gpus = machine_gpus()
    if backend not in (None, "nccl", "gloo"):
        raise UserError(f"--backend {backend}: expected nccl or gloo")
    backend = backend or ("nccl" if gpus else "gloo")
    if backend == "nccl" and not gpus:
        raise UserError("--backend nccl needs GPUs and this machine has none; use --backend gloo")
    world_size = world_size or (min(gpus, 8) if backend == "nccl" else 2)
    if world_size < 1:
        raise UserError("--world-size must be at least 1")
    if backend == "nccl" and world_size > gpus:
        raise UserError(f"--world-size {world_size} needs {world_size} GPUs and this machine has {gpus}")
    return world_size, backend


def evaluate(version: str, mode: str, cases: str = "", world_size: Optional[int] = None,
             backend: Optional[str] = None, seed: Optional[int] = None, timeout_s: Optional[float] = None,
             task_path: Path = TASK_YML, progress=print) -> EvalResult:
    """Stages `version`, runs the protocol face on it in a child process and returns the parsed results."""
    import tempfile

    if mode not in MODES:
        raise UserError(f"unknown mode '{mode}' (expected one of {', '.join(MODES)})")
    path = resolve_version(version)
    problem = submission_problem(path)
    if problem:
        raise UserError(problem)
    world_size, backend = plan_run(world_size, backend)
    if backend == "gloo" and needs_gpu(path):
        raise UserError(f"{path.stem} builds GPU code (load_inline) and cannot run on gloo/CPU")
    task = load_task(task_path)
    selector = cases or ("tests" if mode == "test" else "benchmarks")
    lines = [with_world_size(line, world_size) for line in select_cases(task, selector)]
    validate_cases(get_test_cases("\n".join(lines), None), world_size, backend, machine_gpus())
    with tempfile.TemporaryDirectory(prefix=f"a2a-{path.stem}-") as tmp:
        bundle = stage(path, Path(tmp), task_path)
        (bundle / "cases.txt").write_text("\n".join(lines) + "\n")
        env = dict(os.environ, POPCORN_GPUS=str(world_size), A2A_BACKEND=backend, A2A_EXTRA="1",
                   A2A_RANK_PREFIX="1", A2A_MASTER_PORT=str(_free_port()), PYTHONUNBUFFERED="1")
        env.pop("POPCORN_SEED", None)
        if seed is not None:
            env["POPCORN_SEED"] = str(seed)
        if timeout_s:
            env["A2A_TIMEOUT"] = str(timeout_s)
        progress(f"{mode} {path.stem}: {len(lines)} case(s), world size {world_size}, backend {backend}"
                 + ("" if backend == "nccl" else " (CPU: timings are CPU timings)"))
        exit_code, output, stderr = run_protocol(bundle, mode, "cases.txt", env, progress)
    keys = parse_popcorn(output)
    return EvalResult(version=path.stem, mode=mode, world_size=world_size, backend=backend, exit_code=exit_code,
                      keys=keys, cases=_cases_from_keys(keys, mode), stderr=stderr)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_protocol(bundle: Path, mode: str, test_file: str, env: dict, progress=None) -> tuple[int, str, str]:
    """Runs a bundle's `eval.py MODE TEST_FILE` as the leaderboard runner does (POPCORN_FD is a pipe) and returns
    (exit code, the POPCORN output, stderr). With `progress`, reports each case as its result arrives. The child
    runs in its own session and its whole process group is killed on the way out, so no rank outlives the run."""
    import threading

    n_cases = len([line for line in (bundle / test_file).read_text().splitlines() if line.strip()]) \
        if (bundle / test_file).is_file() else 0
    read_fd, write_fd = os.pipe()
    env = dict(env, POPCORN_FD=str(write_fd))
    stderr_lines: list[str] = []
    child = subprocess.Popen([sys.executable, "eval.py", mode, test_file], cwd=bundle, env=env,
                             pass_fds=(write_fd,), stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    os.close(write_fd)

    def pump_stderr():
        for line in child.stderr:
            stderr_lines.append(line)
            sys.stderr.write(line)

    pump = threading.Thread(target=pump_stderr, daemon=True)
    pump.start()
    output = []
    started = time.monotonic()
    try:
        with os.fdopen(read_fd) as results:
            for line in results:
                output.append(line)
                matched = re.match(r"^(test|benchmark)\.(\d+)\.(status|mean): ?(.*)$", line)
                if matched and progress:
                    status = matched[4] if matched[3] == "status" else f"mean {float(matched[4]) / 1e3:.1f} us"
                    progress(f"  [{int(matched[2]) + 1}/{n_cases}] {status} "
                             f"({time.monotonic() - started:.0f} s elapsed)")
        exit_code = child.wait()
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
        pump.join(timeout=5)
    return exit_code, "".join(output), "".join(stderr_lines)


def geomean(values) -> float:
    """Geometric mean of the positive values (NaN when there are none)."""
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def shape_label(num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int, **_) -> str:
    return f"E={num_experts} k={experts_per_token} H={hidden_dim} T={max_num_tokens}"


def render(result: EvalResult) -> str:
    from tabulate import tabulate

    if result.mode == "test":
        rows = [[c["index"], c["spec"], c["status"], c["error"].replace("\n", " | ")[:300]] for c in result.cases]
        return tabulate(rows, headers=["#", "case", "status", "error"], tablefmt="github")
    if result.mode == "profile":
        return "\n\n".join(f"case {c['index']}: {c['spec']}\n{c.get('report', c['error'])}" for c in result.cases)
    unit = "" if result.backend == "nccl" else " [CPU]"
    rows = []
    for c in result.cases:
        rows.append([c["index"], shape_label(**parse_test_line(c["spec"])), c["status"], c.get("runs", ""), c.get("mean_us"), c.get("best_us"),
                     c.get("device_mean_us"), c.get("floor_mean_us"), c["error"].replace("\n", " | ")[:200]])
    headers = ["#", "shape", "status", "runs", f"mean µs{unit}", "best µs", "device µs", "floor µs", "error"]
    table = tabulate(rows, headers=headers, tablefmt="github", floatfmt=".1f")
    means = [c["mean_us"] for c in result.cases if c.get("mean_us")]
    if len(means) == len(result.cases) and means:
        table += f"\ngeomean of means: {geomean(means):.1f} µs{unit}"
    return table


def human_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="eval.py", description="Check, time or stage an all2all submission.")
    parser.add_argument("mode", choices=MODES + ("stage",))
    parser.add_argument("version", help="version name (v1, v1_torch_sort) or path to a submission file")
    parser.add_argument("dir", nargs="?", help="stage: the folder to write the bundle into")
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--cases", default="", help="tests | benchmarks | tests:0,3 | benchmarks:4 | FILE")
    parser.add_argument("--seed", type=int, help="secret seed mixed into every test seed (POPCORN_SEED)")
    parser.add_argument("--backend", help="nccl (GPUs) or gloo (CPU)")
    parser.add_argument("--timeout", type=float, help="per-case timeout in seconds (default: the official ones)")
    parser.add_argument("--task", type=Path, default=TASK_YML, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode == "stage":
        if not args.dir:
            raise UserError("usage: python eval.py stage VERSION DIR")
        path = resolve_version(args.version)
        problem = submission_problem(path)
        if problem:
            raise UserError(problem)
        folder = stage(path, Path(args.dir), args.task)
        print(f"staged {path.stem} into {folder}: " + ", ".join(sorted(p.name for p in folder.iterdir())))
        return 0
    if args.dir:
        raise UserError(f"unexpected argument '{args.dir}'")
    result = evaluate(args.version, args.mode, args.cases, args.world_size, args.backend, args.seed, args.timeout,
                      args.task)
    print(render(result))
    if not result.cases and result.exit_code:
        print(f"evaluation failed (exit {result.exit_code}); see the messages above", file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    if os.getenv("POPCORN_FD"):
        sys.exit(protocol_main())
    try:
        sys.exit(human_main(sys.argv[1:]))
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        sys.exit(130)
