"""The command layer every command and tool shares: one way to run an entry point under README's exit-code table,
and one way to save a run's folder.

Exit codes (eval.py's EXIT_* constants; README, "Exit codes"): 0 done and every check passed, 2 a malformed command
line (argparse), 112 a submission failed a check (a wrong output, a crash, a hang, device code that does not
compile), 113 bad input found before any work starts (eval.UserError), 114 the harness itself failed, 128 + N ended
by signal N with every process it started.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import eval as core
from a2a import plan as planning
from eval import UserError


def run_cli(entry, argv=None) -> int:
    """Runs a command's entry(argv): bad input becomes one line and exit 113 (argparse's usage errors exit 2);
    SIGTERM, SIGHUP or SIGINT end it (and, through the `finally`s below, every process it started) with 128 + the
    signal; an error in the harness itself exits 114 with one line saying where."""
    import traceback

    core.claim_run()
    core.install_signal_handlers()
    try:
        return entry(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return core.EXIT_BAD_INPUT
    except core.Terminated as stop:
        print(f"{Path(sys.argv[0]).name}: {stop.name} received; the run and every rank it started have been stopped",
              file=sys.stderr)
        return 128 + stop.signum
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"{Path(sys.argv[0]).name}: internal error: {type(exc).__name__}: {exc} "
              f"(at {Path(where.filename).name}:{where.lineno})", file=sys.stderr)
        return core.EXIT_CRASH


def writable(out: Path) -> None:
    """--out checked before any work starts (its folder is made at the end): a folder, or a new path whose nearest
    existing parent is a writable folder."""
    import os

    existing = next((p for p in [out, *out.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise UserError(f"--out {out}: {existing or out} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: {existing} cannot be written")


def save_run(out: Path, meta: dict, write: Callable[[Path], None]) -> Path:
    """Makes the run's folder (a2a.plan.run_folder: date, device, placement, what ran, commit), lets `write` fill it,
    and says where it is."""
    folder = planning.run_folder(out, meta)
    folder.mkdir(parents=True, exist_ok=True)
    write(folder)
    print(f"\nsaved {folder}")
    return folder


def verdict(passed: bool) -> int:
    """The exit code of a command whose run finished: 0, or 112 when a check it made failed."""
    return 0 if passed else core.EXIT_CHECK_FAILED
