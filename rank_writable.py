"""The operator's A2A_RANK_WRITABLE folders: where ranks may write besides their run's own folders (a test's marks),
and so where the judge, root, must run, load, read its settings from and save nothing.

Folders are told apart by device and inode, so a second name of one (a bind mount, a link to it) is the same folder,
and a path is followed part by part as the kernel will, so a link that lies in one of them counts as being there: a
rank could point it elsewhere at any time (red team 44: a link chain out of the folder, and a bind mount of it, each
passed a check that compared resolved path strings once).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Optional

from boundary import (CACHE_FOLDERS, COVERED, HERE, RANK_CACHE, RANK_WRITABLE, _preload_entries, _preload_file,
                      judge_cache)

# The judge's own knobs that name a folder it writes or reads; every other A2A_* is read by ranks alone.
JUDGES_FOLDER_KNOBS = ("A2A_LOG_DIR", "A2A_RANK_CACHE")
SHELLS_OWN = ("PWD", "OLDPWD", "_")  # the shell's bookkeeping, which nothing the judge runs reads
_ABSOLUTE = re.compile(r"/[^\s:,;'\"=]*")  # every absolute path in a value (a list, a flag's -I/x, a URL's tail)


def folders(env=None) -> list:
    env = os.environ if env is None else env
    return [os.path.realpath(f) for f in env.get(RANK_WRITABLE, "").split(os.pathsep) if f]


def _ids(paths) -> dict:
    """(device, inode) -> path, of those of `paths` that exist."""
    found = {}
    for path in paths:
        with contextlib.suppress(OSError):
            info = os.stat(path)
            found[(info.st_dev, info.st_ino)] = str(path)
    return found


def _holder(path: Path, ids: dict) -> Optional[str]:
    """The folder of `ids` that `path` or the nearest of its parents that exist is, or None."""
    for step in (path, *path.parents):
        with contextlib.suppress(OSError):
            info = os.stat(step)
            if (info.st_dev, info.st_ino) in ids:
                return ids[(info.st_dev, info.st_ino)]
    return None


def reach(path, ids: dict) -> tuple:
    """(where `path` leads, followed part by part as the kernel will; the folder of `ids` it lies in, or None; the
    folder of `ids` a link on the way lies in, or None)."""
    current, through = Path("/"), None
    for part in Path(os.path.join(os.getcwd(), os.fspath(path))).parts[1:]:
        if part == "..":
            current = current.parent
        elif part != ".":
            step = current / part
            if step.is_symlink():
                through = through or _holder(current, ids)
                step = Path(os.path.realpath(step))
            current = step
    return current, _holder(current, ids), through


def _loaded(env) -> list:
    """Where the judge's Python finds code: sys.path (a missing entry, such as the user site, counts: the next
    process puts it there once it exists), the bytecode prefix, the extension and Triton caches, preloads."""
    import site

    return [p for p in [*(entry or os.getcwd() for entry in sys.path), *([site.getusersitepackages()]
            if site.ENABLE_USER_SITE else []), sys.pycache_prefix or "", *(str(judge_cache(name) or "")
            for name in CACHE_FOLDERS), *(str(found) for found in map(_preload_file, _preload_entries(
                env.get("LD_PRELOAD", ""))) if found)] if p]


def _used_by_the_judge(env) -> list:
    """(path, what the judge does with it): its Python's import folders, preloads and caches, the scratch and
    temporary folders, root's home, and every absolute path a variable of its environment names (where the tools it
    runs read their settings and caches: git, matplotlib, compilers), but the harness's own folder and the working
    folder (a staged bundle and its run lie below the suite's writable folder)."""
    own = {os.path.realpath(HERE), os.path.realpath(os.getcwd())}
    named = [(path, f"reads or writes through {name}") for name, value in sorted(env.items())
             if name not in SHELLS_OWN and name != RANK_WRITABLE
             and (not name.startswith("A2A_") or name in JUDGES_FOLDER_KNOBS) for path in _ABSOLUTE.findall(value)]
    kept = [*COVERED, tempfile.gettempdir(), str(RANK_CACHE), os.path.expanduser("~")]
    return [(path, what) for path, what in [*((p, "runs or loads") for p in _loaded(env)), *named,
                                            *((p, "keeps") for p in kept)] if os.path.realpath(path) not in own]


def check(env=None) -> None:
    """Nothing the judge runs, loads, reads its settings from, writes or keeps lies in (or leads through a link in)
    a RANK_WRITABLE folder, and no such folder lies in one the judge imports or loads from (ValueError for the
    first). NOTES: a rank writes there for the rest of the command, and the judge's next process would run or read
    what it planted, as root: a package below PYTHONPATH (red team 42), a .pyc below PYTHONPYCACHEPREFIX (43), git's
    config below XDG_CONFIG_HOME, whose fsmonitor command root's `git status` ran, and matplotlib's font cache below
    MPLCONFIGDIR or XDG_CACHE_HOME, written by root through a rank's link onto a file of root's (44); /tmp writable
    hid the staged bundle from the ranks (41)."""
    env = os.environ if env is None else env
    ids = _ids(folders(env))
    if not ids:
        return
    for path, what in _used_by_the_judge(env):
        _, lies_in, through = reach(path, ids)
        if found := lies_in or through:
            raise ValueError(f"{RANK_WRITABLE} folder {found!r} holds {path!r}, which the judge {what}; a rank "
                             f"could plant there what the judge runs or reads")
    imported = _ids(_loaded(env))
    for folder in ids.values():
        if entry := _holder(Path(folder).parent, imported):
            raise ValueError(f"{RANK_WRITABLE} folder {folder!r} lies in {entry!r}, which the judge imports "
                             f"from; a rank could plant a module there")


def check_judges_folder(path: Path, what: str) -> None:
    """`path`, a folder the judge will save in (a run's results): where it lies in a RANK_WRITABLE folder, made now,
    so that no rank makes it first (removed on the way out if the command leaves it empty), and refused (ValueError)
    where a rank could move the run's folder or put its own in its place: no link on the way lies in a writable
    folder, and from the writable folder down to `path` each is root's or this process's (the writable one the
    operator's) and, where others may write it, sticky (they cannot move what is not theirs). NOTES: red team 43's
    rank made --out first and the saved run was its own (a forged results.csv); red team 44 did it through a link
    chain it could re-point and through a bind mount of the folder."""
    ids = _ids(folders())
    real, top, through = reach(path, ids)
    if through:
        raise ValueError(f"{what} {path} leads through a link in {RANK_WRITABLE} folder {through!r}, which a rank "
                         f"could point elsewhere")
    if top is None:
        return
    made = [folder for folder in [*reversed(real.parents), real] if not folder.exists()]
    real.mkdir(mode=0o755, parents=True, exist_ok=True)
    atexit.register(_remove_if_empty, made, os.getpid())
    chain = [real]
    while not _ids([chain[-1]]).keys() & ids.keys() and chain[-1] != chain[-1].parent:
        chain.append(chain[-1].parent)
    for folder in chain:
        info = os.lstat(folder)
        owner = folder == chain[-1] or info.st_uid in (os.geteuid(), 0)
        if not (stat.S_ISDIR(info.st_mode) and owner and (not info.st_mode & 0o022 or info.st_mode & stat.S_ISVTX)):
            raise ValueError(f"{what} {path}: {folder}, in {RANK_WRITABLE} folder {top!r}, is one a rank could "
                             f"replace with a folder of its own")


def _remove_if_empty(folders_made: list, pid: int) -> None:
    """The folders check_judges_folder made, each if empty, by the process that made them (not a child forked)."""
    for folder in reversed(folders_made if os.getpid() == pid else []):
        with contextlib.suppress(OSError):
            folder.rmdir()
