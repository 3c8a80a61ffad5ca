"""The command layer every command and tool shares: the one list of commands (COMMANDS; the Makefile and
tools/gpu_session.sh run each through `python -m a2a.cli NAME ARGS...`), one way to run an entry point under README's
exit-code table, and one way to save a run's folder (at the end, or filled as results come).

Exit codes (eval.py's EXIT_* constants; README, "Exit codes"): 0 done and every check passed, 2 a malformed command
line (argparse), 112 a submission failed a check (a wrong output, a crash, a hang, device code that does not
compile), 113 bad input found before any work starts (eval.UserError), 114 the harness itself failed, 128 + N ended
by signal N with every process it started.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import eval as core
import rank_writable
import wire
from a2a import plan as planning
from a2a.launch import SubmissionFailed
from eval import UserError

# name -> (what runs, relative to the repository: a script, or `-m module`; what it does). `python -m a2a.cli` lists
# them.
COMMANDS = {
    "eval": ("eval.py", "check, time, profile, trace or stage one version (the human face)"),
    "leaderboard": ("run_leaderboard.py", "every version x benchmark shape, anchors, speed of light, world-size-8 "
                                          "checks (make leaderboard)"),
    "sol": ("-m a2a.sol", "this machine's speed-of-light figures (make sol)"),
    "diff": ("diff.py", "what B changed against A: code, time, verdict per shape (make diff)"),
    "check-device": ("-m tools.check_device", "every version's device code compiled for each target (make "
                                              "check-device)"),
    "sweep": ("-m tools.sweep_launch", "a version's launch shapes (make sweep)"),
    "anatomy": ("-m tools.step_anatomy", "where a timed step's µs go besides the call"),
    "ideas": ("-m tools.compare_ideas", "a scratch copy's ideas, each alone, against its version"),
    "sm-share": ("-m tools.sm_share", "the SM share at which ranks sharing a GPU run every version cleanly"),
    "triton-launch": ("-m tools.triton_launch", "Triton's launch paths timed"),
    "launch-floor": ("-m tools.launch_floor", "one trivial kernel launched each way a version could: host µs, call "
                                              "time, held device time"),
    "runner-face": ("-m tools.runner_face", "gpu-mode's own evaluator beside ours on each version's bundle"),
    "cpu-speed": ("-m tools.cpu_speed", "this machine's host speed CPU by CPU: alone, in fresh processes, under load"),
    "visit-statistics": ("-m tools.visit_statistics", "saved clock runs' owner's step by each statistic of a visit's "
                                                      "steps, and how far two runs are apart"),
}


# The options the commands share, declared here once. A command offers those that mean something for it (the tools
# that run GPU kernels only take no --backend, a tool of one version no --versions) and may change a default or the
# help line: eval.py's --seed is the runner's secret seed, run_leaderboard.py's the seed of its rounds' orders.
SHARED_OPTIONS = {
    "world-size": {"type": int, "help": "ranks (default: every GPU up to 8 on NCCL, 2 on gloo)"},
    "cases": {"default": "benchmarks", "help": "tests | benchmarks | tests:0,3 | benchmarks:4 | FILE"},
    "seed": {"type": int},
    "backend": {"help": "nccl (GPUs) or gloo (CPU) (default: nccl where there are GPUs)"},
    "timeout": {"type": float, "help": "per-case timeout in seconds (default: the official ones)"},
    "out": {"type": Path, "default": core.HERE / "results", "help": "where the run's folder goes"},
    "versions": {"help": "comma-separated names or files (default: every version)"},
}


def add_options(parser, *names: str, **changes: dict) -> None:
    """Adds the shared options `names` (SHARED_OPTIONS keys) to an argparse parser; `changes` (keyed by the
    option's attribute name, world_size for --world-size) replaces some of one option's keywords."""
    for name in names:
        parser.add_argument(f"--{name}", **{**SHARED_OPTIONS[name], **changes.get(name.replace("-", "_"), {})})


class Unbroken:
    """A stream whose reader may go away (`| head`): once a write or flush finds the pipe broken, the descriptor is
    /dev/null's and the command goes on to save what it ran (red team 42: 114, and nothing saved)."""

    def __init__(self, stream):
        self.stream = stream

    def _guarded(self, act):
        try:
            return act()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
            return act()

    def write(self, text: str) -> int:
        return self._guarded(lambda: self.stream.write(text))

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def run_cli(entry, argv=None) -> int:
    """Runs a command's entry(argv): bad input becomes one line and exit 113 (argparse's usage errors exit 2);
    SIGTERM, SIGHUP or SIGINT end it (and, through the `finally`s below, every process it started) with 128 + the
    signal; an error in the harness itself exits 114 with one line saying where."""
    import traceback

    if sys.flags.inspect:  # before any work: there is nothing yet to end or remove
        os.write(2, b"error: PYTHONINSPECT (or -i) is set: every exit code would read 1 (a traceback of SystemExit), "
                    b"or root would stop in a prompt holding the judge; unset it\n")
        os._exit(core.EXIT_BAD_INPUT)  # red team 52: under it a SystemExit exits 1 whatever its code
    core.claim_run()  # a closed stdout (`>&-`) is /dev/null from here on
    core.install_signal_handlers()
    # A submission's message may hold any character (a lone surrogate): printing it must not end the run.
    sys.stdout.reconfigure(errors="backslashreplace")
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Unbroken(sys.stdout), Unbroken(sys.stderr)
    try:
        core.cover_rank_writable()  # before the entry starts any thread
        core.check_environment()
        return entry(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return core.EXIT_BAD_INPUT
    except SubmissionFailed as failure:
        print(f"{Path(sys.argv[0]).name}: {wire.as_text(failure, 2000)}", file=sys.stderr)
        return core.EXIT_CHECK_FAILED
    except core.Terminated as stop:
        print(f"{Path(sys.argv[0]).name}: {stop.name} received; the run and every rank it started have been stopped",
              file=sys.stderr)
        return 128 + stop.signum
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"{Path(sys.argv[0]).name}: internal error: {type(exc).__name__}: {exc} "
              f"(at {Path(where.filename).name}:{where.lineno})", file=sys.stderr)
        return core.EXIT_CRASH
    finally:
        sys.stdout, sys.stderr = streams


RUN_FILES_ROOM = planning.FOLDER_NAME_CHARS + 100  # a run's folder (new_folder's "-N" too) and a file's name in it


def writable(out: Path) -> None:
    """--out checked before any work starts (the run's folder is made once there is something to save): a folder,
    or a new path whose nearest existing parent is a writable folder."""
    import tempfile

    judges_folder(out, "--out")  # first: the judge's view of a writable folder is read-only, and this says why
    shown = wire.as_text(str(out), 80)
    try:
        existing = rank_writable.nearest_folder(out)
    except ValueError as exc:
        raise UserError(f"--out {shown}: {exc}") from None
    try:  # the permission bits say yes for root everywhere (/proc, a read-only mount): try it
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as exc:
        raise UserError(f"--out {shown}: {existing} cannot be written ({exc.strerror})") from None
    # The names still to make, and room below for the run's folder and its files (red team 69: a name past the file
    # system's limit ended the run with 114, its results unsaved).
    name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    if any(len(os.fsencode(part)) > name_max for part in out.relative_to(existing).parts):
        raise UserError(f"--out {shown}: a name longer than this file system's {name_max} bytes")
    if len(os.fsencode(os.path.abspath(out))) + RUN_FILES_ROOM > path_max:
        raise UserError(f"--out {shown}: too long a path for a run's folder and its files (at most "
                        f"{path_max - RUN_FILES_ROOM} bytes here)")


def judges_folder(path: Path, what: str) -> None:
    """`path`, where the judge will write, in no folder a rank writes (rank_writable.check_judges_folder)."""
    try:
        rank_writable.check_judges_folder(path, what)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def one_entry_per_writable(versions: list) -> None:
    """Submissions timed side by side get no RANK_WRITABLE folder: every pool's ranks may write there, so the entry
    timed first would leave the round's inputs and answers for the next (red team 43: 23 calls of 23 answered from
    its files, four times faster than the honest code)."""
    folders = rank_writable.folders()
    if folders and len(versions) > 1:
        raise UserError(f"{rank_writable.RANK_WRITABLE} ({', '.join(sorted(folders))}) would be written by the ranks of "
                        f"each of the {len(versions)} submissions: a channel between them; unset it, or time one "
                        f"submission at a time")


def save_run(out: Path, meta: dict, write: Callable[[Path], None]) -> Path:
    """Makes the run's new folder (a2a.plan.run_folder: date, device, placement, what ran, commit; a2a.plan.new_folder
    adds -2, -3, ... where a run already has the name), lets `write` fill it, and says where it is."""
    folder = planning.new_folder(planning.run_folder(out, meta))
    write(folder)
    print(f"\nsaved {folder}")
    return folder


class RunFiles:
    """The run's folder, made when the first result is ready (a2a.plan.new_folder: never a folder a run already
    has) and filled as results come, so that a later failure (the harness ending, an entry whose message breaks a
    file) costs nothing saved before it. Each entry's rows are rendered and written apart; text files are UTF-8 with
    what has no encoding (a lone surrogate in a submission's message) backslash-escaped. `problems`: what could not
    be saved, a line each."""

    def __init__(self, out: Path, meta: dict):
        self.out, self.meta, self.problems, self._folder = out, meta, [], None

    @property
    def folder(self) -> Path:
        if self._folder is None:
            self._folder = planning.new_folder(planning.run_folder(self.out, self.meta))
            print(f"saving into {self._folder}")
        return self._folder

    def attempt(self, what: str, step):
        """step()'s value; where it raises, None, and `what` goes into `problems` (the next step still runs)."""
        try:
            return step()
        except Exception as exc:
            self.problems.append(f"{what} not saved: {type(exc).__name__}: {exc}")
            return None

    def append_rows(self, file: str, name: str, rows) -> None:
        """Entry `name`'s rows (a pandas DataFrame) onto the CSV `file` (its header first where the file is new), rendered whole before
        any is written: rows that cannot be rendered leave the file as it was."""
        path = self.folder / file

        def append():
            text = rows.to_csv(index=False, header=not path.exists())
            with open(path, "a", encoding="utf-8", errors="backslashreplace", newline="") as csv:
                csv.write(text)
        self.attempt(f"{name}'s rows in {file}", append)

    def write_text(self, file: str, text: str) -> None:
        """`file` whole, through a temporary file moved over it: a reader finds the last version or this one."""
        path = self.folder / file
        path.with_name(file + ".tmp").write_text(text, encoding="utf-8", errors="backslashreplace")
        os.replace(path.with_name(file + ".tmp"), path)


def verdict(passed: bool) -> int:
    """The exit code of a command whose run finished: 0, or 112 when a check it made failed."""
    return 0 if passed else core.EXIT_CHECK_FAILED


def launch(argv: list[str]) -> int:
    """`python -m a2a.cli NAME ARGS...`: runs command NAME with ARGS in this process's place (its exit code is the
    command's); without NAME, lists the commands."""
    if not argv or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"a2a.cli: unknown command '{argv[0]}'", file=sys.stderr)
        print("usage: python -m a2a.cli NAME [ARGS...]\n\n" + "\n".join(f"  {name:14} {what}" for name, (_, what)
                                                                      in COMMANDS.items()))
        return 0 if not argv or argv[0] in ("-h", "--help") else core.EXIT_BAD_INPUT
    target = COMMANDS[argv[0]][0].split()
    if target[0] == "-m":  # a module of the repository, found from any working directory, never in it (-P: red
        # team 51, `python -m a2a.cli` typed in an A2A_RANK_WRITABLE folder imported a rank's package as root)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(core.HERE), os.environ.get("PYTHONPATH")]))
        target.insert(0, "-P")
    else:
        target = [str(core.HERE / target[0])]
    os.execv(sys.executable, [sys.executable, *target, *argv[1:]])


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
