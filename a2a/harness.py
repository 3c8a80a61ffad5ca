"""The evaluator's human face: pick cases, stage a version as a leaderboard bundle, run the protocol core on it in a
child process, and print what came back.

    python eval.py test|benchmark|leaderboard|profile VERSION [--world-size N] [--cases tests|benchmarks|...]
                   [--seed S] [--backend nccl|gloo] [--timeout S]
    python eval.py stage VERSION DIR
    python eval.py trace VERSION [--cases benchmarks:4] [--world-size N] [--iterations N]

Beside the leaderboard-style time it reports a device-side time and the harness floor (README, "How numbers are
timed"). The protocol core (eval.py) is what the leaderboard runs; this module only drives it.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import eval as core
from eval import UserError

ROOT = core.HERE
TASK_YML = ROOT / "problems" / "all2all" / "task.yml"
SUBMISSIONS = ROOT / "submissions" / "all2all"
TERMINATE_GRACE_S = 5.0  # what the protocol child gets to end its ranks after SIGTERM, before SIGKILL


def use_bundle_modules() -> None:
    """Makes the bundle's modules (task, reference, utils) importable as they are in a leaderboard bundle; spawned
    ranks inherit the path."""
    for folder in (ROOT / "problems" / "all2all", ROOT / "reference" / "all2all", ROOT / "reference"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def commit() -> str:
    """The commit measured; A2A_COMMIT names it where the tree travels without .git (the device machine)."""
    if os.environ.get("A2A_COMMIT"):
        return os.environ["A2A_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(backend: str) -> str:
    import platform

    import torch

    if backend == "nccl":
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def run_meta(backend: str, world_size: int, mode: str) -> dict:
    """What every saved result carries: device, world size, backend, mode, date, commit."""
    import datetime

    return {"device": device_name(backend), "world_size": world_size, "backend": backend, "mode": mode,
            "date": datetime.date.today().isoformat(), "commit": commit()}


def device_slug(meta: dict) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", meta["device"]).strip("-").lower()


def run_folder(out: Path, meta: dict) -> Path:
    """results/<date>_<device>_ws<N>_<mode>_<commit>/"""
    return out / f"{meta['date']}_{device_slug(meta)}_ws{meta['world_size']}_{meta['mode']}_{meta['commit']}"


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
            if not isinstance(case, dict) or set(case) != set(core.SPEC_KEYS) or not all(
                    isinstance(v, int) for v in case.values()):
                raise UserError(f"{path}: {section}[{i}] must give exactly the integer fields "
                                f"{', '.join(core.SPEC_KEYS)}")
    for i, entry in enumerate(task["files"]):
        if not isinstance(entry, dict) or not {"name", "source"} <= set(entry):
            raise UserError(f"{path}: files[{i}] must have 'name' and 'source'")
    return task


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


def checked_version(name: str) -> Path:
    path = resolve_version(name)
    problem = submission_problem(path)
    if problem:
        raise UserError(problem)
    return path


def needs_gpu(path: Path) -> bool:
    return core.builds_device_code(path.read_text())


def stage(version: Path, folder: Path, task_path: Path = TASK_YML) -> Path:
    """Writes the leaderboard bundle for `version` into `folder` (new or empty): the files task.yml lists
    (submission.py, task.py, utils.py, reference.py, eval.py), plus tests.txt and benchmarks.txt, the test files
    the runner makes from task.yml and passes to eval.py."""
    task = load_task(task_path)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} exists and is not an empty folder; stage into a new or empty one")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for entry in task["files"]:
            source = version if entry["source"] == "@SUBMISSION@" else (task_path.parent / entry["source"]).resolve()
            if not source.is_file():
                raise UserError(f"{task_path}: file '{entry['source']}' for {entry['name']} does not exist")
            shutil.copyfile(source, folder / entry["name"])
        for section in ("tests", "benchmarks"):
            (folder / f"{section}.txt").write_text("\n".join(core.spec_line(c) for c in task[section]) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write the bundle into {folder}: {exc.strerror}")
    return folder


def select_cases(task: dict, selector: str) -> list[str]:
    """`tests`, `benchmarks`, `tests:0,3`, `benchmarks:4`, or a file of spec lines."""
    section, _, picks = selector.partition(":")
    if section in ("tests", "benchmarks"):
        cases = task[section]
        if picks:
            try:
                cases = [cases[int(p)] for p in picks.split(",")]
            except (ValueError, IndexError):
                raise UserError(f"--cases {selector}: indices must be in 0..{len(task[section]) - 1}")
        return [core.spec_line(c) for c in cases]
    path = Path(selector)
    if path.is_file():
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if not lines:
            raise UserError(f"--cases {selector}: the file holds no test cases")
        for line in lines:
            try:
                core.parse_test_line(line)
            except ValueError as exc:
                raise UserError(str(exc))
        return lines
    raise UserError(f"--cases {selector}: expected tests, benchmarks, tests:I,J, benchmarks:I or a test file")


def with_world_size(line: str, world_size: int) -> str:
    case = core.parse_test_line(line)
    case["world_size"] = world_size
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def planned_cases(selector: str, world_size: int, backend: str, task_path: Path = TASK_YML) -> list:
    """The cases `selector` names, rewritten to `world_size` and checked against this machine (core.validate_cases),
    as TestCases whose spec is the runner's test line."""
    lines = [with_world_size(line, world_size) for line in select_cases(load_task(task_path), selector)]
    tests = core.get_test_cases("\n".join(lines), None)
    core.validate_cases(tests, world_size, backend, machine_gpus())
    return tests


def case_args(selector: str, world_size: int, backend: str, task_path: Path = TASK_YML) -> list[dict]:
    """planned_cases as argument dicts (what rank functions take)."""
    return [test.args for test in planned_cases(selector, world_size, backend, task_path)]


def load_version(path: Path, name: str):
    """Imports a version file as the module `name` (several instances can live side by side). In a rank process the
    extension build is already in the cache: see build_version."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_version(path: Path, trace: bool = False) -> None:
    """Imports a version once in a child process, so that its load_inline build (the trace build with `trace`)
    happens once, before any rank imports it."""
    env = {"PYTHONPATH": os.pathsep.join(sys.path), **({"A2A_TRACE": "1"} if trace else {})}
    core.import_once(path.parent, path.stem, env=env, compiles=needs_gpu(path))


@dataclasses.dataclass
class EvalResult:
    mode: str
    backend: str
    exit_code: int
    cases: list  # one dict per case: index, spec, status, error, and timing fields in microseconds


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


TIMING_FIELDS = ("mean", "best", "device_mean", "device_best", "floor_mean", "floor_best")


def _cases_from_keys(keys: dict, mode: str) -> list:
    import base64

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
        for field in TIMING_FIELDS:
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
    """Picks world size and backend for this machine: all GPUs up to 8 on NCCL, else 2 ranks on gloo. Whether the
    machine has enough GPUs for the cases is checked with them (core.validate_cases)."""
    gpus = machine_gpus()
    if backend not in (None, "nccl", "gloo"):
        raise UserError(f"--backend {backend}: expected nccl or gloo")
    backend = backend or ("nccl" if gpus else "gloo")
    if backend == "nccl" and not gpus:
        raise UserError("--backend nccl needs GPUs and this machine has none; use --backend gloo")
    if world_size is None:
        world_size = min(gpus, 8) if backend == "nccl" else 2
    if world_size < 1:
        raise UserError(f"--world-size must be at least 1, not {world_size}")
    return world_size, backend


def evaluate(version: str, mode: str, cases: str = "", world_size: Optional[int] = None,
             backend: Optional[str] = None, seed: Optional[int] = None, timeout_s: Optional[float] = None,
             task_path: Path = TASK_YML, progress=print) -> EvalResult:
    """Stages `version`, runs the protocol core on it in a child process and returns the parsed results."""
    if mode not in core.MODES:
        raise UserError(f"unknown mode '{mode}' (expected one of {', '.join(core.MODES)})")
    if timeout_s is not None and not timeout_s > 0:
        raise UserError(f"--timeout must be a positive number of seconds, not {timeout_s:g}")
    path = checked_version(version)
    world_size, backend = plan_run(world_size, backend)
    if backend == "gloo" and needs_gpu(path):
        raise UserError(f"{path.stem} builds GPU code (load_inline) and cannot run on gloo/CPU")
    selector = cases or ("tests" if mode == "test" else "benchmarks")
    lines = [test.spec for test in planned_cases(selector, world_size, backend, task_path)]
    with tempfile.TemporaryDirectory(prefix=f"a2a-{path.stem}-") as tmp:
        bundle = stage(path, Path(tmp), task_path)
        (bundle / "cases.txt").write_text("\n".join(lines) + "\n")
        env = dict(os.environ, POPCORN_GPUS=str(world_size), A2A_BACKEND=backend, A2A_EXTRA="1",
                   A2A_RANK_PREFIX="1", A2A_RENDEZVOUS="private", PYTHONUNBUFFERED="1")
        env.pop("POPCORN_SEED", None)
        if seed is not None:
            env["POPCORN_SEED"] = str(seed)
        if timeout_s:
            env["A2A_TIMEOUT"] = str(timeout_s)
        progress(f"{mode} {path.stem}: {len(lines)} case(s), world size {world_size}, backend {backend}"
                 + ("" if backend == "nccl" else " (CPU: timings are CPU timings)"))
        exit_code, output, _ = run_protocol(bundle, mode, "cases.txt", env, progress)
    return EvalResult(mode=mode, backend=backend, exit_code=exit_code, cases=_cases_from_keys(parse_popcorn(output), mode))


def _child_setup():
    core.die_with_parent(signal.SIGTERM)  # if this process is killed, the protocol child ends its ranks


def run_protocol(bundle: Path, mode: str, test_file: str, env: dict, progress=None) -> tuple[int, str, str]:
    """Runs a bundle's `eval.py MODE TEST_FILE` as the leaderboard runner does (POPCORN_FD is a pipe) and returns
    (exit code, the POPCORN output, stderr). With `progress`, reports each case as its result arrives. The child
    runs in its own session; on the way out (also on a signal) it gets SIGTERM, time to end its ranks, then its
    whole process group is killed, so nothing outlives the run."""
    n_cases = len([line for line in (bundle / test_file).read_text().splitlines() if line.strip()]) \
        if (bundle / test_file).is_file() else 0
    read_fd, write_fd = os.pipe()
    env = dict(env, POPCORN_FD=str(write_fd))
    stderr_lines: list[str] = []
    child = subprocess.Popen([sys.executable, "eval.py", mode, test_file], cwd=bundle, env=env,
                             pass_fds=(write_fd,), stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_child_setup)
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
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
        pump.join(timeout=5)
    return exit_code, "".join(output), "".join(stderr_lines)


def geomean(values) -> float:
    """Geometric mean of the positive values (NaN when there are none)."""
    values = [v for v in values if v and v > 0 and not math.isnan(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def shape_label(num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int, **_) -> str:
    return f"E={num_experts} k={experts_per_token} H={hidden_dim} T={max_num_tokens}"


ERROR_COLUMN_CHARS = 120


def _short(text: str, limit: int = ERROR_COLUMN_CHARS) -> str:
    text = text.replace("\n", " | ")
    return text if len(text) <= limit else text[:limit] + "..."


def render(result: EvalResult) -> str:
    """The table, then every failed case's whole error (the failing rank's own error first)."""
    from tabulate import tabulate

    if result.mode == "profile":
        return "\n\n".join(f"case {c['index']}: {c['spec']}\n{c.get('report', c['error'])}" for c in result.cases)
    if result.mode == "test":
        rows = [[c["index"], c["spec"], c["status"], _short(c["error"])] for c in result.cases]
        table = tabulate(rows, headers=["#", "case", "status", "error"], tablefmt="github")
    else:
        unit = "" if result.backend == "nccl" else " [CPU]"
        rows = [[c["index"], shape_label(**core.parse_test_line(c["spec"])), c["status"], c.get("runs", ""),
                 c.get("mean_us"), c.get("best_us"), c.get("device_mean_us"), c.get("floor_mean_us"),
                 _short(c["error"])] for c in result.cases]
        headers = ["#", "shape", "status", "runs", f"mean µs{unit}", "best µs", "device µs", "floor µs", "error"]
        table = tabulate(rows, headers=headers, tablefmt="github", floatfmt=".1f")
        means = [c["mean_us"] for c in result.cases if c.get("mean_us")]
        if means and len(means) == len(result.cases):
            table += f"\ngeomean of means: {geomean(means):.1f} µs{unit}"
    failed = [c for c in result.cases if c["error"]]
    for case in failed:
        table += f"\n\ncase {case['index']} failed ({case['spec']}):\n{case['error']}"
    return table


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="eval.py", description="Check, time, stage or trace an all2all submission.")
    parser.add_argument("mode", choices=core.MODES + ("stage", "trace"))
    parser.add_argument("version", help="version name (v1, v1_torch_sort) or path to a submission file")
    parser.add_argument("dir", nargs="?", help="stage: the folder to write the bundle into")
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--cases", default="", help="tests | benchmarks | tests:0,3 | benchmarks:4 | FILE")
    parser.add_argument("--seed", type=int, help="secret seed mixed into every test seed (POPCORN_SEED)")
    parser.add_argument("--backend", help="nccl (GPUs) or gloo (CPU)")
    parser.add_argument("--timeout", type=float, help="per-case timeout in seconds (default: the official ones)")
    parser.add_argument("--iterations", type=int, default=20, help="trace: clean traced calls per case")
    parser.add_argument("--out", type=Path, default=ROOT / "traces", help="trace: where the trace folders go")
    parser.add_argument("--task", type=Path, default=TASK_YML, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode == "stage":
        if not args.dir:
            raise UserError("usage: python eval.py stage VERSION DIR")
        path = checked_version(args.version)
        folder = stage(path, Path(args.dir), args.task)
        print(f"staged {path.stem} into {folder}: " + ", ".join(sorted(p.name for p in folder.iterdir())))
        return 0
    if args.dir:
        raise UserError(f"unexpected argument '{args.dir}'")
    if args.mode == "trace":
        from a2a import timeline

        timeline.trace_version(args.version, args.cases or "benchmarks:0", args.world_size, args.backend,
                               args.iterations, args.out)
        return 0
    result = evaluate(args.version, args.mode, args.cases, args.world_size, args.backend, args.seed, args.timeout,
                      args.task)
    print(render(result))
    if not result.cases and result.exit_code:
        print(f"evaluation failed (exit {result.exit_code}); see the messages above", file=sys.stderr)
    return result.exit_code


def run_cli(entry, argv=None) -> int:
    """Runs a command's entry(argv): bad input becomes one line and exit 2; SIGTERM, SIGHUP or SIGINT end it (and,
    through the `finally`s below, every process it started) with 128 + the signal."""
    core.install_signal_handlers()
    try:
        return entry(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return core.EXIT_USAGE
    except core.Terminated as stop:
        print(f"{Path(sys.argv[0]).name}: {stop.name} received; the run and every rank it started have been stopped",
              file=sys.stderr)
        return 128 + stop.signum


def main(argv: list[str]) -> int:
    return run_cli(_main, argv)
