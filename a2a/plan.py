"""The run plan: which submission files, which cases (validated here, before any work starts; the protocol core
parses the staged case file again, as the runner's would), how many ranks on which backend, and what the results are
labelled with (device, date, commit). Every command and tool that runs anything makes one plan and works from it:
`python eval.py`, run_leaderboard.py, diff.py, `python -m a2a.sol` (a plan of the machine, no version), the trace,
sweep, anatomy, ideas, SM-share and launch-floor tools. tools/check_device.py compiles files and runs nothing.

Layers: imports only go down, from the commands and tools to eval (the protocol core, whose library part imports
nothing of a2a); tests/test_layers.py's LAYERS is the one list of them, and holds every module to it.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import eval as core
import judge
from boundary import folder_entries
import wire
from a2a import sharing
from eval import UserError

ROOT = core.HERE
MIN_TIMEOUT_S = 1.0  # a per-case timeout below this fails every submission: no case even joins its group in less
TASK_YML = ROOT / "problems" / "all2all" / "task.yml"
SUBMISSIONS = ROOT / "submissions" / "all2all"
# Where the bundle's modules (task, reference, utils) live in the repository; a leaderboard bundle has them side by
# side with eval.py. The one place that says so (tests, tools and tools/gpu_session.sh read it from here).
BUNDLE_DIRS = (ROOT / "problems" / "all2all", ROOT / "reference" / "all2all", ROOT / "reference")


def use_bundle_modules() -> None:
    """Makes task, reference and utils importable as in a bundle; spawned ranks inherit the path."""
    for folder in reversed(BUNDLE_DIRS):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


GIT_TIMEOUT_S = 10.0  # the judge's own git calls: a status of a large tree takes well under a second


def judges_git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """git as the judge runs it: without the operator's LD_PRELOAD (red team 39: /proc/self/fd/1 hung it reading its
    own stdout, and ld.so's warning naming a path of raw bytes ended the judge with 114), the user's and the
    system's git settings, the operator's GIT_* variables and relative PATH entries (red team 47: an `include.path`
    in ~/.gitconfig and a `git` found by `../W` from the repository led root's git to a rank's file); within
    GIT_TIMEOUT_S, its words as bytes."""
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD" and not name.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, PATH=folder_entries(env.get("PATH", "")))
    # no hook and no fsmonitor command: the repository's own config could name one (red team 58)
    return subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c",
                           "core.fsmonitor=false", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=GIT_TIMEOUT_S)


def commit() -> str:
    """The commit measured; A2A_COMMIT names it where the tree travels without .git (the device machine); "unknown"
    where git cannot say."""
    if os.environ.get("A2A_COMMIT"):
        return os.environ["A2A_COMMIT"]
    try:
        head = judges_git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return "unknown"
        dirty = judges_git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.decode("utf-8", "replace").strip() + ("-dirty" if dirty else "")
    except (OSError, ValueError, subprocess.SubprocessError):
        return "unknown"


machine_gpus = core.machine_gpus


def run_meta(backend: str, world_size: int, mode: str, where: Optional[sharing.Placement] = None) -> dict:
    """What every saved result carries: device, world size, where the ranks ran (`placement`: one GPU each, or
    shared through MPS; `ranks`: ws8, ws8-on-1gpu), backend, mode, date, commit."""
    if backend == "nccl":
        import torch

        device = torch.cuda.get_device_name(0)
    else:
        device = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    where = where or sharing.placement(world_size, machine_gpus() if backend == "nccl" else 0, backend)
    return {"device": device, "world_size": world_size, "placement": where.describe(), "shared_gpus": where.shared,
            "ranks": where.slug(), "backend": backend, "mode": mode, "date": datetime.date.today().isoformat(),
            "commit": commit()}


def device_slug(meta: dict) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", meta["device"]).strip("-").lower()


FOLDER_NAME_CHARS = 200  # a run folder's name (ASCII), room left for new_folder's "-N" within 255 (red team 38: a
# diff of two 100-byte stems on an H100 came to 254)
FOLDER_PART_CHARS = 40  # each part but the mode (red team 39: a compared run's 200-character device and world size
# named a 420-byte folder); four of them leave the mode 36 at least


def _cut(part: str, chars: int) -> str:
    """`part` within `chars`, one cut told apart from others cut alike by its hash."""
    if len(part) <= chars:
        return part
    import hashlib

    return f"{part[:max(1, chars - 9)]}-{hashlib.sha256(part.encode()).hexdigest()[:8]}"


def run_folder(out: Path, meta: dict) -> Path:
    """The name of a run's folder: results/<date>_<device>_<ranks>_<mode>_<commit>/, ranks `ws8` or, when they
    shared GPUs, `ws8-on-1gpu` (new_folder makes it). Every part is a slug, so the name is one folder inside `out`
    (red team 31: a saved run's date `/tmp/...` or commit `../..` put a compare's files outside it), of at most
    FOLDER_PART_CHARS but the mode, which is cut to fit FOLDER_NAME_CHARS (a diff's two stems)."""
    parts = [re.sub(r"[^A-Za-z0-9._+-]+", "-", str(part)).strip("-.") or "unknown" for part in (
        meta["date"], device_slug(meta), meta["ranks"] if "ranks" in meta else f"ws{meta['world_size']}",
        meta["mode"], meta["commit"])]
    parts = [part if index == 3 else _cut(part, FOLDER_PART_CHARS) for index, part in enumerate(parts)]
    parts[3] = _cut(parts[3], len(parts[3]) - max(0, len("_".join(parts)) - FOLDER_NAME_CHARS))
    return out / "_".join(parts)


def new_folder(path: Path) -> Path:
    """Makes a new, empty folder for one run's files and returns it: `path`, or where that exists (a second run on
    the same day and commit) the first free one of `path-2`, `path-3`, ...; a saved run is never written into. Each
    name is claimed by os.mkdir, which fails on an existing one, so two runs racing for a name get one each. Every
    results/ and traces/ folder is made here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    number = 1
    while True:
        candidate = path if number == 1 else path.with_name(f"{path.name}-{number}")
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            number += 1


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


def stage(version: Path, folder: Path, task_path: Path = TASK_YML, task: dict | None = None,
          test_files: bool = True) -> Path:
    """Writes the leaderboard bundle for `version` into `folder` (new or empty): the files task.yml lists
    (submission.py, task.py, utils.py, reference.py, eval.py), plus, with `test_files`, tests.txt and benchmarks.txt,
    the test files the runner makes from task.yml and passes to eval.py (a run of the plan's own cases writes only
    those). `task`: task.yml already read (a plan's)."""
    task = task or load_task(task_path)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder} exists and is not an empty folder; stage into a new or empty one")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for entry in task["files"]:
            source = version if entry["source"] == "@SUBMISSION@" else (task_path.parent / entry["source"]).resolve()
            if not source.is_file():
                raise UserError(f"{task_path}: file '{entry['source']}' for {entry['name']} does not exist")
            shutil.copyfile(source, folder / entry["name"])
        for section in ("tests", "benchmarks") if test_files else ():
            (folder / f"{section}.txt").write_text("\n".join(core.spec_line(c) for c in task[section]) + "\n")
        # the ranks' uid reads it, whatever the umask (red team 47: under umask 077 the honest v1 failed, 112)
        folder.chmod(0o755)
        for made in folder.iterdir():
            made.chmod(0o644)
    except OSError as exc:
        raise UserError(f"cannot write the bundle into {folder}: {exc.strerror}")
    return folder


# --------------------------------------------------------------------------------------------------------------
# Versions: a name from submissions/ or a user's own file, resolved once to a path that is never turned back into a
# name (so `--versions mine/v1.py` runs that file, not the repository's v1).
# --------------------------------------------------------------------------------------------------------------


def list_versions() -> list[Path]:
    """Every version, oldest first by its number (v9 before v10), as the Makefile's `sort -V`: the last is the
    newest."""
    def number(path: Path) -> tuple:
        found = re.match(r"v(\d+)", path.stem)
        return (int(found[1]) if found else float("inf"), path.stem)

    return sorted(SUBMISSIONS.glob("v*.py"), key=number)


MAX_NAME_BYTES = 100  # a file name's; diff.py's folder holds two stems and the date, device and commit (red team 35)


def resolve_version(name: str) -> Path:
    """A version name (`v1`, `v1_torch_sort`) or a path to a submission file; UserError otherwise."""
    if not name.strip():
        raise UserError("an empty version name")
    path = Path(name)
    if path.suffix == ".py" or os.sep in name:
        _check_path(path, "")
        if not path.is_file():
            kind = ("a folder" if path.is_dir() else "a FIFO" if path.is_fifo() else "a device" if
                    path.is_char_device() or path.is_block_device() else None) if path.exists() else None
            raise UserError(f"{name} is {kind}, not a submission file" if kind else f"no such file: {name}")
        # the file a link leads to names the results (label, stem): its path is held to the same rules (red team
        # 38: a plain name linked to one holding escapes reached the terminal and table.md; to 250 bytes, 114)
        _check_path(path.resolve(), f" (the file {wire.as_text(name, 100)} leads to)")
        return path.resolve()
    matches = [p for p in list_versions() if p.stem == name or p.stem.split("_")[0] == name]
    if len(matches) > 1:  # red team 53: a look-alike file beside v1's made `v1` "unknown"
        raise UserError(f"version '{name}' names {len(matches)} files: "
                        f"{', '.join(wire.as_text(p.name, 100) for p in matches)}; name one in full")
    if not matches:
        known = ", ".join(p.stem for p in list_versions()) or "none"
        raise UserError(f"unknown version '{name}' (known: {known})")
    return matches[0]


def _check_path(path: Path, which: str) -> None:
    """UserError unless `path` is fit to name results: no control, line-breaking or bidirectional character nor
    undecodable bytes (it goes into lines, tables and plots), a file name within MAX_NAME_BYTES (its stem goes into
    folder names)."""
    text = str(path)
    if wire.as_text(text, len(text) + 1) != text:
        raise UserError(f"{wire.as_text(text, 200)}{which}: a submission's path may hold no control, line-breaking "
                        "or bidirectional character, nor undecodable bytes")
    if len(path.name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise UserError(f"{wire.as_text(path.name, 60)}{which}: a submission's file name may be at most "
                        f"{MAX_NAME_BYTES} bytes (its stem goes into folder names, which hold 255)")


def label(path: Path) -> str:
    """How results name a version: its stem for the repository's versions, the file's path for a user's own (so a
    user's v1.py is never mistaken for the repository's v1)."""
    return path.stem if path.parent == SUBMISSIONS else str(path)


def submission_problem(path: Path) -> Optional[str]:
    """None when the file parses and defines custom_kernel; otherwise what is wrong, in one line."""
    import ast

    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        return f"{path.name} does not parse: {getattr(exc, 'lineno', '?')}: {getattr(exc, 'msg', exc)}"
    except (RecursionError, MemoryError) as exc:  # an expression nested past the parser's depth (red team 26)
        return f"{path.name} does not parse: {type(exc).__name__} (nested too deeply)"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    return None if "custom_kernel" in _module_names(tree) else f"{path.name} defines no custom_kernel(data)"


def _module_names(tree) -> set:
    """The names a module binds in its own scope, in its compound statements too (red team 54: an annotated
    assignment, a tuple's unpacking, an `if` or a `try` with an import's fallback each ran on the runner's face and
    were refused here as defining no custom_kernel); a function's, class's or comprehension's body is its own."""
    import ast

    names, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            todo.extend(ast.iter_child_nodes(node))
    return names


def checked_version(name: str) -> Path:
    """The submission file `name` resolves to, once it parses and defines custom_kernel; UserError otherwise."""
    path = resolve_version(name)
    problem = submission_problem(path)
    if problem:
        raise UserError(problem)
    return path


def builds_device_code(path: Path) -> bool:
    """A submission that builds device code (load_inline or Triton): GPU-only."""
    text = path.read_text(errors="replace")
    return "load_inline" in text or "@triton.jit" in text


def load_version(path: Path, name: str, trace: bool = False):
    """Imports a version file as the module `name` (several instances can live side by side): its trace build with
    `trace` (a version reads A2A_TRACE at import), else its timed build, whatever the environment says; the
    environment is left as it was, so a trace build and a timed build can be loaded in one process. A load_inline
    build happens at the first import on the machine; torch's lock lets one process build while the others wait."""
    with core.environment_with({"A2A_TRACE": "1" if trace else "0"}):  # no thread's child sees it meanwhile
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def prebuild(paths: list[Path]) -> list[str]:
    """Builds the timed and trace extensions of `paths` and the harness's probes (a2a/probes.py) all at once, one
    child process each (a build already in the cache costs an import); returns the failures, one line each. For a
    session that then runs many steps (tools/gpu_session.sh, tests/test_gpu.py), and the clock's probes alone
    (`paths` empty: only the harness's code is built as the judge, never a submission's). The
    caches are the judge's prebuilt ones (boundary.prepare_rank_cache), which every pool's ranks start from as a
    copy of their own, unless this process names its own; this process and its children use them from here on."""
    for name, folder in core.prepare_rank_cache().items():
        os.environ.setdefault(name, folder)
    children = [("a2a_probes", subprocess.Popen([sys.executable, "-c", "from a2a import probes; probes.extension()"],
                                                cwd=core.HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                text=True))]
    for path in [p for p in paths if builds_device_code(p)]:
        for trace in ("0", "1"):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, BUNDLE_DIRS)), A2A_TRACE=trace)
            children.append((f"{path.stem}{' (trace)' if trace == '1' else ''}",
                             subprocess.Popen([sys.executable, "-c", f"import {path.stem}"], cwd=path.parent, env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    failures = []
    for name, child in children:
        _, stderr = child.communicate()
        if child.returncode:
            last = [line for line in stderr.splitlines() if line.strip()][-1:] or ["(no message)"]
            failures.append(f"{name}: {last[0]}")
    return failures


# --------------------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------------------


def keep_rows_home(data: tuple) -> tuple:
    """`data` (a rank's generated input) with every token going to the rank's own experts: rank 0 one token, the
    others as many as max_num_tokens allows. No rank then sends another a row, and their calls meet only through
    the flags that say so: where a rank can run a call ahead of a peer (tools/interpret_ranks.py --local, the GPU
    suite's calls run free)."""
    import torch

    cfg, rank_data, rank, world_size = data
    device, tokens = rank_data.x.device, 1 if rank == 0 else cfg.max_num_tokens - 1
    first = rank * (cfg.num_experts // world_size)
    rank_data.num_tokens = tokens
    rank_data.x = torch.randn(tokens, cfg.hidden_dim, dtype=torch.float16, device=device)
    rank_data.indices = (first + torch.arange(cfg.experts_per_token, dtype=torch.int32, device=device)).repeat(
        tokens, 1)
    rank_data.weights = torch.rand(tokens, cfg.experts_per_token, dtype=torch.float32, device=device)
    return data


def select_cases(task: dict, selector: str) -> list[core.TestCase]:
    """`tests`, `benchmarks`, `tests:0,3`, `benchmarks:4`, or a file of test lines (blank lines skipped); each
    case's own values are checked here, before any world size is rewritten."""
    shown = wire.as_text(selector, 100)  # one line, however long the selector or whatever it holds
    section, colon, picks = selector.partition(":")
    if section in ("tests", "benchmarks"):
        cases = task[section]
        if colon:
            indices = picks.split(",")
            # at most 9 digits: int() refuses past 4300 (red team 69: 114 for a 5000-digit index)
            if not all(re.fullmatch(r"[0-9]{1,9}", i) and int(i) < len(cases) for i in indices):
                raise UserError(f"--cases {shown}: give indices from 0 to {len(cases) - 1}, "
                                f"separated by commas")
            cases = [cases[int(i)] for i in indices]
        return [core.TestCase(args=dict(case), spec=core.spec_line(case)) for case in cases]
    path = Path(selector)
    if path.exists() and not path.is_file():
        raise UserError(f"--cases {shown}: not a file")
    if not path.is_file():
        raise UserError(f"--cases {shown}: no such file (expected tests, benchmarks, tests:I,J, "
                        f"benchmarks:I or a test file)")
    try:
        lines = [line for line in path.read_bytes().decode("utf-8").splitlines() if line.strip()]
        tests = core.get_test_cases("\n".join(lines), None)
    except OSError as exc:
        raise UserError(f"--cases {shown}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"--cases {shown}: not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise UserError(f"--cases {shown}: {exc}") from None
    if not tests:
        raise UserError(f"--cases {shown}: the file holds no test cases")
    for test in tests:
        problem = core.case_problem(test.args)
        if problem:
            raise UserError(f"--cases {shown}: test '{test.spec[:120]}': {problem}")
    return tests


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Made once per command (make_plan) and handed to everything that runs. `cases` carry the runner's test line
    (`spec`, world size rewritten, public seed) and the arguments a rank gets (`args`, the secret seed mixed in)."""
    versions: tuple  # submission files (Path), in the order named
    cases: tuple  # core.TestCase, validated
    world_size: int
    backend: str
    meta: dict  # device, world size, placement, backend, date, commit (mode added by meta_for)
    seed: Optional[int] = None
    timeout_s: Optional[float] = None
    skipped: tuple = ()  # one line per version left out on this machine, and why
    task: Optional[dict] = None  # task.yml, read once
    task_path: Path = TASK_YML
    placement: Optional[sharing.Placement] = None  # where the ranks run (one GPU each, or shared through MPS)

    @property
    def version(self) -> Path:
        if len(self.versions) != 1:
            raise UserError(f"this command takes one version, not {len(self.versions)}")
        return self.versions[0]

    @property
    def case_args(self) -> list:
        """Fresh argument dicts, one per case (a rank job may change its copy's seed)."""
        return [dict(case.args) for case in self.cases]

    def meta_for(self, mode: str) -> dict:
        return {**self.meta, "mode": mode}


def make_plan(versions, selector: str = "tests", world_size: Optional[int] = None, backend: Optional[str] = None,
              seed: Optional[int] = None, timeout_s: Optional[float] = None, task_path: Path = TASK_YML,
              gpu_only: str = "error", distinct: bool = False, machine_only: bool = False) -> RunPlan:
    """Resolves and checks the versions, picks world size and backend for this machine (all GPUs up to 8 on NCCL,
    else 2 ranks on gloo), selects and validates the cases. A version that builds GPU code on a gloo run is an error
    (`gpu_only="error"`), a `skipped` line ("skip"), or left for the tool to report ("keep"). More ranks than GPUs
    on NCCL share the GPUs (a2a/sharing.py): refused here, before any work, where MPS or a new enough NCCL is
    missing."""
    use_bundle_modules()
    names = [versions] if isinstance(versions, (str, Path)) else list(versions)
    if not names and not machine_only:  # machine_only: a run of the machine, no version (a2a.sol)
        raise UserError("no version named")
    paths = [checked_version(str(name)) for name in names]
    if distinct and len(set(paths)) < len(paths):
        twice = sorted({p.stem for p in paths if paths.count(p) > 1})
        raise UserError(f"{', '.join(twice)} named more than once (by name or path): each version runs once")
    if backend not in (None, "nccl", "gloo"):
        raise UserError(f"--backend {backend}: expected nccl or gloo")
    if world_size is not None and world_size < 1:
        raise UserError(f"--world-size must be at least 1, not {world_size}")
    # at most what the evaluator takes as A2A_TIMEOUT, which carries it (inf, red team 39: refused only there)
    if timeout_s is not None and not MIN_TIMEOUT_S <= timeout_s <= judge.KNOBS["A2A_TIMEOUT"][1]:
        raise UserError(f"--timeout must be at least {MIN_TIMEOUT_S:g} s (a case's group setup alone takes about "
                        f"that) and at most {judge.KNOBS['A2A_TIMEOUT'][1]:g} s, not {timeout_s:g}")
    if seed is not None and not 0 <= seed <= core.SEED_MAX:
        raise UserError(f"--seed must be from 0 to {core.SEED_MAX}, not {seed}")
    task = load_task(task_path)
    selected = select_cases(task, selector)
    # Counted only now: on a GPU machine it imports torch (seconds), and bad input above is refused before that.
    gpus = machine_gpus()
    backend = backend or ("nccl" if gpus else "gloo")
    if backend == "nccl" and not gpus:
        raise UserError("--backend nccl needs GPUs and this machine has none; use --backend gloo")
    world_size = world_size if world_size is not None else (min(gpus, 8) if backend == "nccl" else 2)
    skipped = []
    if backend == "gloo" and gpu_only != "keep":
        for path in [p for p in paths if builds_device_code(p)]:
            if gpu_only == "error":
                raise UserError(f"{path.stem} builds GPU code (load_inline or Triton) and cannot run on gloo/CPU")
            skipped.append(f"skipped {path.stem}: it builds GPU code (load_inline or Triton) and this run is on CPU/gloo")
            paths.remove(path)
    cases = []
    for test in selected:
        args = {**test.args, "world_size": world_size}
        case = core.TestCase(args=args, spec=core.spec_line(args))
        if seed is not None:
            case.args["seed"], case.secret_seed = core.cantor_combine(args["seed"], seed), seed
        cases.append(case)
    where = sharing.placement(world_size, gpus if backend == "nccl" else 0, backend)
    core.validate_cases(cases, world_size, backend, gpus, shared=where.shared)
    if where.shared:
        sharing.check_available()
    return RunPlan(tuple(paths), tuple(cases), world_size, backend, run_meta(backend, world_size, "", where), seed,
                   timeout_s, tuple(skipped), task, task_path, where)
