"""The evaluator's human face: plan a run, stage a version as a leaderboard bundle, run the protocol core on it in a
child process exactly as the runner would, and print what came back.

    python eval.py test|benchmark|leaderboard|profile VERSION [--world-size N] [--cases tests|benchmarks|...]
                   [--seed S] [--backend nccl|gloo] [--timeout S] [--cold]
    python eval.py stage VERSION DIR
    python eval.py trace VERSION [--cases benchmarks:4] [--world-size N] [--iterations N]

Beside the leaderboard-style time it reports a device-side time, the harness floor and how long the ranks spent
importing (building) the submission in the first case (docs/timing.md, "How numbers are timed").
"""
from __future__ import annotations

import dataclasses
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import eval as core
import wire
from a2a import cli
from a2a import rows as result_rows
from a2a import sharing
from a2a.plan import TASK_YML, RunPlan, checked_version, make_plan, stage
from eval import UserError

TERMINATE_GRACE_S = 5.0  # what the protocol child gets to end its ranks after SIGTERM, before SIGKILL
SILENCE_MARGIN_S = 60.0  # beyond two case limits: the evaluator's start and its last case's wrap-up
STALLED_EXIT = -1000  # run_protocol's exit code for an evaluator that stopped answering (never a process's)
ERROR_CHARS = 20_000  # a case's whole error, as a row holds it (the human face prints it below the table)


@dataclasses.dataclass
class EvalResult:
    mode: str
    backend: str
    exit_code: int
    cases: list  # one row per case (a2a/rows.py): index, spec, args, status, error, runs, timing fields in µs
    import_s: float | None = None  # the first case's time (the owner's clock), the submission's import and builds in it
    placement: str = ""  # where the ranks ran (sharing.describe_run)
    shared_gpus: bool = False  # ranks shared GPUs: the timings are not the problem's
    void: str = ""  # why no result of this run stands (a key written twice, the evaluator signalled), or ""
    guards: str = ""  # which of the kernel's guards the ranks ran under (eval.Guards)


def evaluate(plan: RunPlan, mode: str, version: Path | None = None, cold: bool = False,
             progress=print) -> EvalResult:
    """Stages `version` (the plan's only one by default), runs the protocol core on the plan's cases in a child
    process and returns the parsed results. `cold`: an empty extension cache, so the first case builds the
    submission inside its time limit, as on the leaderboard's fresh machine. With more ranks than GPUs the ranks
    share them through MPS (a2a/sharing.py), and the result says so."""
    if mode not in core.MODES:
        raise UserError(f"unknown mode '{mode}' (expected one of {', '.join(core.MODES)})")
    path = version or plan.version
    where = plan.placement
    with core.owned_tempdir(path.stem) as tmp, sharing.shared_ranks(where) as share_env:
        bundle = stage(path, tmp / "bundle", plan.task_path, plan.task, test_files=False)
        (bundle / "cases.txt").write_text("\n".join(case.spec for case in plan.cases) + "\n")
        # POPCORN_GPUS is the pool's size (the runner sets it from its machine); each case line carries its own world
        # size. Both are the runner's protocol: the child re-reads its cases as the runner's would, and the results
        # come back joined to the plan's cases by index and spec line (join_cases).
        env = core.environ_with(dict(POPCORN_GPUS=str(plan.world_size), A2A_BACKEND=plan.backend, A2A_EXTRA="1",
                                     A2A_JUDGE="1", A2A_RANK_PREFIX="1", A2A_RENDEZVOUS="private",
                                     PYTHONUNBUFFERED="1", **share_env))
        env.setdefault(core.LOG_DIR_ENV, str(core.HERE / "build" / "logs"))  # not the staged bundle's, which goes
        env.pop("POPCORN_SEED", None)
        if plan.seed is not None:
            env["POPCORN_SEED"] = str(plan.seed)
        if plan.timeout_s:
            env["A2A_TIMEOUT"] = str(plan.timeout_s)
        if cold:
            env["TORCH_EXTENSIONS_DIR"] = str(tmp / "extensions")
            env["TRITON_CACHE_DIR"] = str(tmp / "triton")
        placement = sharing.describe_run(where, share_env)
        progress(f"{mode} {path.stem}: {len(plan.cases)} case(s), {placement}, backend {plan.backend}"
                 + ("" if plan.backend == "nccl" else " (CPU: timings are CPU timings)")
                 + (" (shared GPUs: timings are not the problem's)" if where.shared else "")
                 + (", cold extension cache" if cold else ""))
        exit_code, output, stderr = run_protocol(bundle, mode, "cases.txt", env, progress, len(plan.cases))
        if where.shared and exit_code != 0:  # what MPS logged, read before its daemon goes (a hang in CUDA's init)
            for line in sharing.daemon_log():
                progress(f"MPS {line}")
    keys = result_rows.parse_popcorn(output)
    if strays := result_rows.stray_lines(output):
        progress(f"the result channel held {strays} line(s) that are not `key: value`; they were ignored")
    cases = result_rows.rows_from_keys(keys, mode)
    void = _void(output, exit_code, stderr) or join_cases(cases, plan.cases)
    cases = [row for row in cases if "args" in row]  # a row the plan has no case for is dropped (and voids the run)
    for row in cases:  # from here on, a rank's words are escaped lines (wire.as_text) wherever they go
        row["spec"] = wire.as_text(row["spec"], ERROR_CHARS)
        row["error"] = wire.as_text(with_named_cause(row["error"], stderr), ERROR_CHARS)
        if "report" in row:  # a profile's table, built from the names of what the ranks ran
            row["report"] = "\n".join(wire.as_text(line, ERROR_CHARS) for line in row["report"].split("\n"))
    if void:
        for row in cases:  # its numbers too: a forged line may be the first of its key
            row.update({field: None for field in result_rows.TIMING_FIELDS}, status="fail", error=void)
    return EvalResult(mode=mode, backend=plan.backend, exit_code=core.EXIT_CHECK_FAILED if void else exit_code,
                      cases=cases, import_s=float(keys["import_s"]) if "import_s" in keys else None,
                      placement=placement, shared_gpus=where.shared, void=void, guards=keys.get("guards", ""))


# What a rank that died of a signal (no exception to report) may have said on stderr first, worth naming in its case.
KNOWN_CAUSES = ("Too many open files", "No space left on device", "Cannot allocate memory", "std::bad_alloc",
                "out of memory")


def with_named_cause(error: str, stderr: str) -> str:
    """A dead rank's error, with the known causes the run's stderr names (a SIGABRT alone hides that the
    submission ran out of file descriptors, say)."""
    if "rank process died" not in error:
        return error
    said = stderr.lower()
    found = [cause for cause in KNOWN_CAUSES if cause.lower() in said]
    return error + (f" (the run's stderr names: {', '.join(found)})" if found else "")


def join_cases(rows: list, cases: list) -> str:
    """Gives each result row its case's arguments: the protocol names cases by index, in the order of the test file
    the plan wrote, and repeats each case's spec line, which must be the plan's own (else no result of the run
    stands: returns why; "" when every row joined)."""
    why = ""
    for row in rows:
        index = row["index"]
        if index < len(cases):
            row["args"] = cases[index].args
        if not why and (index >= len(cases) or row["spec"] != cases[index].spec):
            why = (f"the result channel's case {index} ({row['spec'][:80]!r}) is not the plan's case {index}: "
                   "something besides the evaluator wrote into it, so no result of this run stands")
    return why


def _void(output: str, exit_code: int, stderr: str) -> str:
    """Why no result of a finished protocol run stands, or "": a key written twice (the evaluator writes each
    once), or the evaluator ended by a signal this process did not send (it sends one only on its own way out, and
    then never returns here): the submission sent it or caused it (a rank can reach its parent), or someone outside
    the run did."""
    if exit_code == STALLED_EXIT:
        return stderr.strip().splitlines()[-1].removeprefix("error: ")
    repeated = result_rows.repeated_keys(output)
    if repeated:
        return (f"the result channel holds {', '.join(repeated[:5])} twice: something besides the evaluator wrote "
                "into it, so no result of this run stands")
    signum = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 and " received" in stderr else 0
    if signum:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return (f"the evaluator was ended by {name} while the submission ran, and the harness did not send it: the "
                "submission sent or caused it (or a process outside the run did), so no result of this run stands")
    return ""


def _child_setup():
    # If this process is killed, the protocol child ends its ranks: by SIGTERM, which lets it clean up, where it
    # runs them as itself; by SIGKILL where it is root, whose ranks the kernel ends with their namespace (a
    # SIGTERM would stay pending in an evaluator a submission had stopped, and the run would live on).
    core.die_with_parent(signal.SIGKILL if os.geteuid() == 0 else signal.SIGTERM)


def run_protocol(bundle: Path, mode: str, test_file: str, env: dict, progress=None,
                 n_cases: int | None = None) -> tuple[int, str, str]:
    """Runs a bundle's `eval.py MODE TEST_FILE` as the leaderboard runner does and returns (exit code, the POPCORN
    output, stderr). POPCORN_FD is one end of a socket pair: unlike a pipe, a socket cannot be opened again through
    /proc/<pid>/fd, so no rank can write into it, even as root. Both streams are read as bytes and decoded with
    replacement, so no byte a submission prints can stop the reading. With `progress`, reports each case as its
    result arrives. The child runs in its own session; on the way out (also on a signal) it gets SIGTERM, time to
    end its ranks, then its whole process group is killed, so nothing outlives the run."""
    if n_cases is None and progress:  # a bundle run from outside a plan: count its cases for the progress lines
        n_cases = len([line for line in (bundle / test_file).read_bytes().decode(errors="replace").splitlines()
                       if line.strip()]) if (bundle / test_file).is_file() else 0
    ours, theirs = socket.socketpair()
    read_fd, write_fd = ours.detach(), theirs.detach()
    env = dict(env, POPCORN_FD=str(write_fd))
    stderr_lines: list[str] = []
    child = subprocess.Popen([sys.executable, "eval.py", mode, test_file], cwd=bundle, env=env, pass_fds=(write_fd,),
                             stdin=subprocess.DEVNULL, stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                             encoding="utf-8", errors="replace", start_new_session=True, preexec_fn=_child_setup)
    os.close(write_fd)

    def pump_stderr():
        for line in child.stderr:
            stderr_lines.append(line)
            sys.stderr.write(line)

    pump = threading.Thread(target=pump_stderr, daemon=True)
    pump.start()
    output = []
    started = time.monotonic()
    # NOTES: every wait has a deadline. The evaluator writes a line at least once per case, and a case (the warm-up
    # case of the timed modes before the first) ends within its limit: silence longer than two limits and a margin
    # means the evaluator was stopped or hangs, and the run is void.
    case_limit_s = float(env.get("A2A_TIMEOUT") or core.OFFICIAL_TIMEOUT_S.get(mode, 180))
    silence_s = 2 * case_limit_s + SILENCE_MARGIN_S
    stalled = ""
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as results:
            pending, last = b"", time.monotonic()
            while True:
                ready, _, _ = select.select([results], [], [], 1.0)
                if not ready:
                    if time.monotonic() - last > silence_s:
                        stalled = (f"the evaluator wrote nothing for {silence_s:.0f} s (it was stopped, or hangs); no "
                                   "result of this run stands")
                        break
                    continue
                chunk = results.read(65536)
                if not chunk:
                    break
                last = time.monotonic()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", errors="replace") + "\n"
                    output.append(line)
                    matched = re.match(r"^(test|benchmark)\.(\d+)\.(status|mean): ?(.*)$", line)
                    if matched and progress:
                        status = matched[4] if matched[3] == "status" else f"mean {float(matched[4]) / 1e3:.1f} us"
                        progress(f"  [{int(matched[2]) + 1}/{n_cases}] {status} "
                                 f"({time.monotonic() - started:.0f} s elapsed)")
            if pending:
                output.append(pending.decode("utf-8", errors="replace"))
        if stalled:
            os.killpg(child.pid, signal.SIGKILL)
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
    if stalled:
        stderr_lines.append(f"error: {stalled}\n")
        exit_code = STALLED_EXIT
    return exit_code, "".join(output), "".join(stderr_lines)


ERROR_COLUMN_CHARS = 120


def _floor_shown(case: dict):
    """The floor steps' mean, or why not. NOTES: the floor steps run in the submission's ranks, so the figure is
    theirs: a rank can slow them (red team 29: 4373 µs against its own timed mean of 2609; red team 30: just under a
    p90 bound), though never speed up its timed steps. A floor above the timed steps' median cannot be a step with no
    call in it; below, the column's name says whose it is."""
    floor, p50 = case.get("floor_mean_us"), case.get("p50_us")
    return "void (above p50)" if floor is not None and p50 is not None and floor > p50 else floor


def render(result: EvalResult) -> str:
    """The table, then every failed case's whole error (the failing rank's own error first)."""
    from tabulate import tabulate

    if result.mode == "profile":
        return "\n\n".join(f"case {c['index']}: {c['spec']}\n{c.get('report', c['error'])}" for c in result.cases)
    if result.mode == "test":
        table = tabulate([[c["index"], c["spec"], c["status"], wire.as_text(c["error"], ERROR_COLUMN_CHARS)]
                          for c in result.cases], headers=["#", "case", "status", "error"], tablefmt="github")
    else:
        unit = " [shared GPUs]" if result.shared_gpus else "" if result.backend == "nccl" else " [CPU]"
        table_rows = [[c["index"], result_rows.shape_label(**c["args"]), c["status"],
                       c.get("runs", ""), c.get("mean_us"), c.get("p50_us"), c.get("p90_us"), c.get("best_us"),
                       c.get("device_mean_us"), c.get("device_p50_us"), c.get("device_p90_us"),
                       _floor_shown(c), wire.as_text(c["error"], ERROR_COLUMN_CHARS)] for c in result.cases]
        headers = ["#", "shape", "status", "runs", f"mean µs{unit}", "p50", "p90", "best", "device mean µs",
                   "device p50", "device p90", "floor µs (ranks')", "error"]
        table = tabulate(table_rows, headers=headers, tablefmt="github", floatfmt=".1f")
        means = [c["mean_us"] for c in result.cases if c.get("mean_us")]
        if means and len(means) == len(result.cases):
            table += f"\ngeomean of means: {result_rows.geomean(means):.1f} µs{unit}"
    if result.shared_gpus and result.mode != "test":
        table += (f"\n{result.placement}: these times measure ranks sharing a GPU, not the problem (one GPU per "
                  "rank); compare them with nothing but other shared runs")
    if result.guards:
        table += f"\nboundary: {result.guards}"
    if result.import_s is not None:
        window = core.OFFICIAL_TIMEOUT_S["test" if result.mode == "test" else "benchmark"]
        table += (f"\nimporting the submission (and building its extensions) took {result.import_s:.1f} s or less: "
                  f"the first case's time by the owner's clock, whose limit on the leaderboard is {window} s")
    for case in [c for c in result.cases if c["error"]]:
        table += f"\n\ncase {case['index']} failed ({case['spec']}):\n{case['error']}"
    return table


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="eval.py", description="Check, time, stage or trace an all2all submission.")
    parser.add_argument("mode", choices=core.MODES + ("stage", "trace"))
    parser.add_argument("version", help="version name (v1, v1_torch_sort) or path to a submission file")
    parser.add_argument("dir", nargs="?", help="stage: the folder to write the bundle into")
    cli.add_options(parser, "world-size", "cases", "seed", "backend", "timeout", cases={"default": ""},
                    seed={"help": "secret seed mixed into every test seed (POPCORN_SEED)"})
    parser.add_argument("--cold", action="store_true",
                        help="an empty extension cache: the first case builds the submission, as on the leaderboard")
    parser.add_argument("--iterations", type=int, default=20, help="trace: clean traced calls per case")
    cli.add_options(parser, "out", out={"default": core.HERE / "traces", "help": "trace: where the trace folders go"})
    parser.add_argument("--task", type=Path, default=TASK_YML, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode == "stage":
        if not args.dir:
            raise UserError("usage: python eval.py stage VERSION DIR")
        ignored = [option for option, value in (("--world-size", args.world_size), ("--cases", args.cases),
                                                ("--seed", args.seed), ("--backend", args.backend),
                                                ("--timeout", args.timeout), ("--cold", args.cold)) if value]
        if ignored:
            raise UserError(f"stage writes the bundle only; {', '.join(ignored)} would be ignored (pass them to a run)")
        path = checked_version(args.version)
        cli.judges_folder(Path(args.dir), "the stage folder")  # red team 46: a rank's folder, or its link, in W
        folder = stage(path, Path(args.dir), args.task)
        print(f"staged {path.stem} into {folder}: " + ", ".join(sorted(p.name for p in folder.iterdir())))
        return 0
    if args.dir:
        raise UserError(f"unexpected argument '{args.dir}'")
    if args.mode == "trace":
        cli.writable(args.out)
    selector = args.cases or ("benchmarks:0" if args.mode == "trace" else
                              "tests" if args.mode == "test" else "benchmarks")
    plan = make_plan(args.version, selector, args.world_size, args.backend, args.seed, args.timeout, args.task,
                     gpu_only="keep" if args.mode == "trace" else "error")
    if args.mode == "trace":
        from a2a import timeline

        timeline.trace_version(plan, args.iterations, args.out)
        return 0
    result = evaluate(plan, args.mode, cold=args.cold)
    print(render(result))
    if result.void:
        print(f"error: {result.void}", file=sys.stderr)
    if not result.cases and result.exit_code:
        print(f"evaluation failed (exit {result.exit_code}); see the messages above", file=sys.stderr)
    return result.exit_code


def main(argv: list[str]) -> int:
    return cli.run_cli(_main, argv)
