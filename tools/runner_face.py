#!/usr/bin/env python3
"""Both evaluators on one staged bundle: gpu-mode's own (reference-kernels, problems/amd_distributed/eval.py, with
its utils.py and the all2all problem's reference.py and task.py) beside this harness's protocol face, for every
version and mode asked, at one world size; one table of both faces' verdicts and times (issue #50, item 4).

The runner's files are not part of this repository. `--fetch CLONE` copies them from a clone of
gpu-mode/reference-kernels into build/runner/ (git-ignored; a device session carries it) with the clone's commit;
`--runner FOLDER` names such a folder. The runner's evaluator runs on NCCL with a GPU per rank (cuda:rank, port
12356), so it needs as many GPUs as ranks; both faces run as the runner runs them (POPCORN_GPUS, a secret seed in
POPCORN_SEED, no A2A_* extras), one after the other. The times are each face's own: the runner's is rank 0's host
clock around barrier, call, synchronize, barrier; ours is the owner's step (docs/judge.md).

    python -m tools.runner_face --fetch /path/to/reference-kernels
    python -m tools.runner_face [--runner build/runner] [--versions v1,v9] [--world-size 4] [--modes test,leaderboard]
"""
from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import eval as core
import wire
from a2a import cli
from a2a import plan as planning
from a2a import rows as result_rows
from a2a.harness import run_protocol

RUNNER_FILES = {"eval.py": "problems/amd_distributed/eval.py", "utils.py": "problems/amd_distributed/utils.py",
                "reference.py": "problems/amd_distributed/all2all/reference.py",
                "task.py": "problems/amd_distributed/all2all/task.py"}
DEFAULT_RUNNER = core.HERE / "build" / "runner"
MODES = ("test", "benchmark", "leaderboard")


def fetch(clone: Path, folder: Path = DEFAULT_RUNNER) -> None:
    """Copies the runner's files from a clone of gpu-mode/reference-kernels (a work tree, or a bare mirror read with
    git show) into `folder`, with the clone's commit in COMMIT."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return planning.judges_git("-C", str(clone), *args)

    commit = git("rev-parse", "HEAD")
    if commit.returncode:
        raise core.UserError(f"--fetch {clone}: not a git clone of gpu-mode/reference-kernels")
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in RUNNER_FILES.items():
        shown = git("show", f"HEAD:{source}")
        if shown.returncode:
            raise core.UserError(f"--fetch {clone}: it has no {source}")
        (folder / name).write_bytes(shown.stdout)
    (folder / "COMMIT").write_text(commit.stdout.decode().strip() + "\n")
    print(f"the runner's files of {commit.stdout.decode().strip()[:12]} are in {folder}")


def checked_runner(folder: Path) -> str:
    """The runner folder's commit; bad input when a file is missing."""
    missing = [name for name in [*RUNNER_FILES, "COMMIT"] if not (folder / name).is_file()]
    if missing:
        raise core.UserError(f"--runner {folder}: {', '.join(missing)} missing (python -m tools.runner_face --fetch "
                             f"CLONE makes the folder)")
    return (folder / "COMMIT").read_text().strip()


def runner_bundle(ours: Path, runner: Path, folder: Path) -> Path:
    """The runner's bundle of the same submission: the runner folder's Python files (RUNNER_FILES) and our bundle's
    submission.py and case file."""
    folder.mkdir()
    for path in runner.glob("*.py"):
        shutil.copyfile(path, folder / path.name)
    for name in ("submission.py", "cases.txt"):
        shutil.copyfile(ours / name, folder / name)
    return folder


def run_faces(version: Path, mode: str, plan, runner: Path, seed: int, tmp: Path) -> list:
    """Both faces on `version` in `mode` over the plan's cases: one row per case."""
    ours = planning.stage(version, tmp / f"{version.stem}_{mode}_ours", plan.task_path, plan.task, test_files=False)
    (ours / "cases.txt").write_text("\n".join(case.spec for case in plan.cases) + "\n")
    theirs = runner_bundle(ours, runner, tmp / f"{version.stem}_{mode}_runner")
    env = core.environ_with({"POPCORN_GPUS": str(plan.world_size), "POPCORN_SEED": str(seed)})
    for name in [key for key in env if key.startswith("A2A_")]:  # the runner's environment: none of our extras
        env.pop(name)
    faces = {}
    for face, bundle in (("runner", theirs), ("ours", ours)):
        print(f"{version.stem} {mode}: the {face} face ...", flush=True)
        code, output, _stderr = run_protocol(bundle, mode, "cases.txt", env)
        faces[face] = (code, result_rows.parse_popcorn(output))
    rows = []
    prefix = "test" if mode == "test" else "benchmark"
    for index, case in enumerate(plan.cases):
        row = {"version": version.stem, "mode": mode, "shape": result_rows.shape_label(**case.args)}
        for face, (code, keys) in faces.items():
            mean = keys.get(f"{prefix}.{index}.mean")
            status = keys.get(f"{prefix}.{index}.status") or ("pass" if mean is not None else "fail")
            row.update({f"{face} exit": code, f"{face} status": status,
                        f"{face} mean µs": round(float(mean) / 1e3, 1) if mean is not None else None,
                        f"{face} error": wire.as_text(keys.get(f"{prefix}.{index}.error", ""), 160)})
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_options(parser, "versions", "world-size", "out")
    parser.add_argument("--runner", type=Path, default=DEFAULT_RUNNER, help="a folder of the runner's files")
    parser.add_argument("--fetch", type=Path, help="copy the runner's files from this clone into build/runner/")
    parser.add_argument("--modes", default="test,leaderboard", help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args(argv)
    if args.fetch:
        fetch(args.fetch)
        return 0
    modes = args.modes.split(",")
    if not modes or any(mode not in MODES for mode in modes):
        raise core.UserError(f"--modes {args.modes}: expected a comma-separated list of {', '.join(MODES)}")
    versions = [planning.resolve_version(v) for v in args.versions.split(",")] if args.versions else \
        planning.list_versions()
    cli.one_entry_per_writable(versions)  # red team 46: one seed for every version, so one's answers for the next
    commit = checked_runner(args.runner)
    cli.writable(args.out)
    gpus = planning.machine_gpus()
    world_size = args.world_size or min(gpus, 8)
    if gpus < max(world_size, 1):
        print(f"skipped: the runner's evaluator runs a GPU per rank; this machine has {gpus} GPU(s) for "
              f"{world_size} rank(s)")
        return 0
    seed = secrets.randbits(31)
    import pandas as pd

    rows, files, commit_line = [], None, ""
    with tempfile.TemporaryDirectory(prefix="a2a-runner-face-") as tmp:
        for mode in modes:
            plan = planning.make_plan(versions, "tests" if mode == "test" else "benchmarks", world_size, "nccl")
            if files is None:  # the folder, made before the first row, gets each version's rows as they come
                meta = {**plan.meta_for("runner-face"), "runner_commit": commit, "seed": seed}
                files = cli.RunFiles(args.out, meta)
                commit_line = (f"device: {meta.get('device')}, world size {world_size}, {meta.get('date')}, commit "
                               f"{meta.get('commit')}, POPCORN_SEED {seed}. The runner's time is rank 0's host clock "
                               "around barrier, call, synchronize, barrier; ours is the owner's step "
                               "(docs/judge.md).")
            for version in plan.versions:
                found = run_faces(version, mode, plan, args.runner, seed, Path(tmp))
                files.append_rows("results.csv", version.stem, pd.DataFrame(found))
                print(verdict_line(version.stem, mode, found), flush=True)
                rows += found
    table = pd.DataFrame(rows)
    text = "\n".join([f"# Both evaluators on one bundle: gpu-mode's ({commit[:12]}) and ours", "", commit_line, "",
                      table.to_markdown(index=False), ""])
    print(text)
    files.write_text("table.md", text)
    print(f"\nsaved {files.folder}")
    for problem in files.problems:
        print(f"tools.runner_face: {problem}", file=sys.stderr)
    if files.problems:
        return core.EXIT_CRASH
    passed = all(table[f"{face} status"].eq("pass").all() for face in ("runner", "ours"))
    return cli.verdict(passed)


def verdict_line(name: str, mode: str, rows: list) -> str:
    """One line per version and mode as it finishes: each face's passes and exit code, and its geomean µs where
    timed."""
    parts = []
    for face in ("runner", "ours"):
        passed = sum(row[f"{face} status"] == "pass" for row in rows)
        means = [row[f"{face} mean µs"] for row in rows if row[f"{face} mean µs"] is not None]
        parts.append(f"{face} {passed} of {len(rows)} pass (exit {rows[0][f'{face} exit']})"
                     + (f", geomean {result_rows.geomean(means):.1f} µs" if means and len(means) == len(rows) else ""))
    return f"{name} {mode}: " + "; ".join(parts)


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
