"""The operator's A2A_RANK_WRITABLE folders: where ranks may write besides their run's own folders (a test's marks),
and so where the judge, root, must run, load, read its settings from and save nothing.

Folders are told apart by device and inode, so a second name of one (a bind mount, a link to it) is the same folder,
and a path is followed part by part as the kernel will, so a link that lies in one of them counts as being there: a
rank could point it elsewhere at any time (red team 44: a link chain out of the folder, and a bind mount of it, each
passed a check that compared resolved path strings once).

The check is a list of names, and each red team found one more; what holds is the cover: the judge's own view has
those folders covered by empty read-only file systems (cover), lifted only in the ranks' namespaces.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Optional

from boundary import (CACHE_FOLDERS, CLONE_NEWNS, COVERED, JUDGE_COVER, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE,
                      MS_RDONLY, MS_REC, RANK_CACHE, RANK_WRITABLE, _libc, _preload_entries, _preload_file, judge_cache,
                      judges_covers, mount_source, mount_table)

SHELLS_OWN = ("PWD", "OLDPWD", "_")  # the shell's bookkeeping, which nothing the judge runs reads
RANKS_OWN = "A2A_TEST_"  # the suite's words to its ranks (where to leave their marks), read by no judge process
_ABSOLUTE = re.compile(r"/[^\s:,;'\"=})]*")  # every absolute path in a value (a list, a flag's -I/x, a URL's tail)
# The folders of root's home whose entries tools read by their own names when no variable says (XDG's defaults):
# their entries are followed too, as are the home's own. Red team 46 went past a list of names (fontconfig's
# ~/.fonts.conf.d, pip's ~/.pip): every entry there is one a tool may read.
HOME_FOLDERS = (".config", ".cache", ".local", ".local/share", ".local/state")
# The system's and its tools' trees, which root's programs read by fixed names before or around the judge (pyenv's
# hooks in /usr/local/etc/pyenv.d, a compiler's /usr/local/include, an interpreter's site folder, ld.so's conf): a
# writable folder lies in none of them, by any name (red team 59: each such folder, made 1777, had root run a rank's
# code). With root's home's dot-folders (~/.pyenv), they are refused as trees, not one name at a time.
SYSTEM_TREES = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/var/lib",
                "/var/cache", "/var/spool", "/snap")
HOME_ENTRIES_CHECKED = 10_000  # a home of more entries than this in those trees is followed this far


# File systems the kernel makes, whatever path shows them: the judge reads its own facts there (its memory cap in
# cgroup2, its processes in proc), so none may be a rank's to write.
KERNEL_FILE_SYSTEMS = {"proc", "sysfs", "cgroup", "cgroup2", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs",
                       "bpf", "configfs", "pstore", "mqueue", "binfmt_misc", "efivarfs", "fusectl", "nsfs",
                       "selinuxfs", "autofs", "rpc_pipefs", "hugetlbfs"}


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


def _mounts() -> list:
    """(mount id, its parent's id, file system 'major:minor', the folder of it mounted, mount point, file system
    type, source, its options) of each mount this process sees."""
    try:
        table = mount_table()
    except OSError:
        return []
    return [(*fields[:3], Path(fields[3]), Path(fields[4]), *mount_source(fields)) for fields in table]


def _layers(options: str) -> list:
    """The layers an overlay's options name, as given: `lowerdir=a:b`, `upperdir=`, and the `lowerdir+=` and
    `datadir+=` of the newer mount API, one each (red team 49); `\\` escapes ',' and ':'."""
    found = []
    for value in re.findall(r"(?:^|,)(?:lowerdir|upperdir|datadir)\+?=((?:\\.|[^,])*)", options):
        found += [re.sub(r"\\(.)", r"\1", layer) for layer in re.split(r"(?<!\\):", value) if layer]
    return found


def _shown_at(folder: Path, shown: Path, point: Path) -> Optional[Path]:
    """Where a mount at `point` that shows `shown` (a folder of a file system, or an overlay's layer) shows `folder`
    or a part of it, or None: `point` for a part below the folder, `point`/rest for the folder within more."""
    if shown == folder or folder in shown.parents:
        return point
    if shown in folder.parents:
        return point / folder.relative_to(shown)
    return None


def _loop_file(source: str) -> Optional[Path]:
    """The file behind a loop device's mount (red team 49: an image kept in the writable folder, rewritten by a rank,
    whose files root then ran)."""
    match = re.fullmatch(r"/dev/(loop[0-9]+)", source)
    with contextlib.suppress(OSError):
        return Path(Path(f"/sys/block/{match[1]}/loop/backing_file").read_text().strip()) if match else None
    return None


def _mount_of(folder: Path, mounts: list) -> Optional[tuple]:
    """The mount (a _mounts entry) that holds `folder`, resolved: the top one at the deepest point above it."""
    points = [m for m in mounts if m[4] == folder or m[4] in folder.parents]
    deepest = [m for m in points if len(m[4].parts) == max((len(p[4].parts) for p in points), default=0)]
    covered = {m[1] for m in deepest}  # a mount over another at the same point names it as its parent
    top = [m for m in deepest if m[0] not in covered]
    return top[-1] if top else None


def _names_of(folder: Path, mounts: list) -> list:
    """The other paths at which a mount shows `folder`, or a part of it: a bind mount of a folder below it (red team
    45) or above it (48), an overlay with it, or a folder above or below it, as a layer (48, 49: named through a link),
    and a loop device's file system whose image lies in it (49). ValueError for an overlay whose layer is named by a
    relative path found from no folder above it (49: root imported a rank's module through one)."""
    if (top := _mount_of(folder, mounts)) is None:
        return []
    _, _, device, root, point = top[:5]
    inside = root / folder.relative_to(point)  # the folder's place within its file system
    found = []
    for _, _, other_device, other_root, other_point, kind, source, options in mounts:
        found.append(_shown_at(inside, other_root, other_point) if other_device == device else None)
        image = _loop_file(source)
        if image is not None and _shown_at(folder, Path(os.path.realpath(image)), other_point) == other_point:
            found.append(other_point)
        for layer in _layers(options) if kind == "overlay" else []:
            # a relative layer, from the folder its maker ran in: each folder above the mount point that holds it
            # (Docker's overlay2 names `l/<id>` from the folder above a container's `merged`; red team 50)
            bases = ["/"] if layer.startswith("/") else [b for b in other_point.parents if os.path.lexists(b / layer)]
            if not bases and other_point != Path("/"):
                raise ValueError(f"the overlay at {other_point} names its layer {layer!r} by a relative path found "
                                 f"from no folder above it, so the judge cannot tell whether it shows {RANK_WRITABLE} "
                                 f"folder {str(folder)!r}: mount it by absolute paths, or unset {RANK_WRITABLE}")
            found += [_shown_at(folder, Path(os.path.realpath(Path(base) / layer)), other_point) for base in bases]
    return [path for path in found if path is not None]


def _other_names(named: list) -> dict:
    """{path: folder} of each other path at which a mount shows `folder` of `named`, or a part of it (_names_of),
    and so on from each such path (red team 49: an overlay whose layer is another overlay that shows the folder)."""
    mounts, found = (_mounts() if named else []), {}
    queue = [(Path(folder), folder) for folder in named]
    while queue and len(found) < 1000:
        shown, folder = queue.pop(0)
        for path in _names_of(shown, mounts):
            if str(path) not in found and not any(Path(f) in (path, *path.parents) for f in named):
                found[str(path)] = folder
                queue.append((path, folder))
    return found


def writable_ids(env=None, others: Optional[dict] = None) -> dict:
    """(device, inode) -> the writable folder, of each writable folder and each other name a mount gives it or a
    folder below it (`others`: _other_names of the folders, where the caller has them)."""
    named = folders(env)
    ids = _ids(named)
    for point, folder in (_other_names(named) if others is None else others).items():
        ids.update(dict.fromkeys(_ids([point]), folder))
    return ids


def _holder(path: Path, ids: dict) -> Optional[str]:
    """The folder of `ids` that `path` or the nearest of its parents that exist is, or None."""
    for step in (path, *path.parents):
        with contextlib.suppress(OSError):
            info = os.stat(step)
            if (info.st_dev, info.st_ino) in ids:
                return ids[(info.st_dev, info.st_ino)]
    return None


def reach(path, ids: dict) -> tuple:
    """(where `path` leads, followed part by part and link by link as the kernel will; the folder of `ids` it lies
    in, or None; the folder of `ids` a link on the way lies in, or None: red team 45 hid its links behind one of the
    operator's, which had been resolved whole)."""
    current, through, hops = Path("/"), None, 0
    parts = list(Path(os.path.join(os.getcwd(), os.fspath(path))).parts[1:])
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = current.parent
        elif part != ".":
            step = current / part
            try:  # a part no process can look at (too long a name, no search right) leads nowhere further
                target = Path(os.readlink(step)) if hops < 40 and stat.S_ISLNK(os.lstat(step).st_mode) else None
            except OSError:
                target = None
            if target is not None:
                hops += 1
                through = through or _holder(current, ids)
                current = Path("/") if target.is_absolute() else current
                parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            else:
                current = step
    return current, _holder(current, ids), through


def _interpreter_folders() -> list:
    """The folders the judge's interpreter reads before any code of the judge's: its own and its target's (a `._pth`
    file there is honoured, whatever -E or -I say: red team 58), and its prefix (`pyvenv.cfg`)."""
    return [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)), sys.prefix]


def _git_folders(root: Optional[Path] = None) -> list:
    """The repository's git folder and, for a worktree, the common one, read from `.git` itself (no git runs: a rank
    could have planted its hooks or config; red team 58, a bind of .git: root's next commit ran a rank's hook).
    `root`: the repository's folder, this file's by default."""
    found, dot = [], (root or Path(__file__).resolve().parent) / ".git"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if dot.is_file():
            named = dot.read_text().strip().removeprefix("gitdir:").strip()
            found.append(os.path.normpath(dot.parent / named))
            common = Path(found[0]) / "commondir"
            if common.is_file():
                found.append(os.path.normpath(Path(found[0]) / common.read_text().strip()))
        elif dot.is_dir():
            found.append(str(dot))
    return found


def _loaded(env) -> list:
    """Where the judge's Python finds code: sys.path (a missing entry, such as the user site, counts: the next
    process puts it there once it exists), its interpreter's folders, the bytecode prefix, the extension and Triton
    caches, preloads; and the repository's git folders, whose hooks and config root's git runs."""
    import site

    return [p for p in [*(entry or os.getcwd() for entry in sys.path), *([site.getusersitepackages()]
            if site.ENABLE_USER_SITE else []), *_interpreter_folders(), *_git_folders(), sys.pycache_prefix or "",
            *(str(judge_cache(name) or "")
            for name in CACHE_FOLDERS), *(str(found) for found in map(_preload_file, _preload_entries(
                env.get("LD_PRELOAD", ""))) if found)] if p]


def _home(env) -> str:
    return env.get("HOME") or os.path.expanduser("~")


def _used_by_the_judge(env) -> list:
    """(path, what the judge does with it): its Python's import folders, preloads and caches, the scratch and
    temporary folders, root's home and what tools read there by name, and every path a variable of its environment
    names (where the tools it runs read their settings and caches: git, matplotlib, compilers)."""
    named = [(path, f"may read or write as {name} names it") for name, value in sorted(env.items())
             if name not in SHELLS_OWN and name != RANK_WRITABLE and not name.startswith(RANKS_OWN)
             for path in _named_paths(value, env)]
    zone = env.get("TZ", "").lstrip(":")  # a zone file named from TZDIR (red team 49: the saved run dated by a rank)
    if zone and not zone.startswith("/"):
        named.append((os.path.join(env.get("TZDIR") or "/usr/share/zoneinfo", zone), "reads as TZ and TZDIR name it"))
    home = _home(env)
    kept = [*COVERED, tempfile.gettempdir(), str(RANK_CACHE), home, *_home_entries(home)]
    return [*((p, "runs or loads") for p in _loaded(env)), *named, *((p, "keeps") for p in kept)]


def _home_entries(home: str) -> list:
    """Every dot-entry of root's home (a folder of the operator's, `~/scratch`, may be the writable one), and every
    entry of its HOME_FOLDERS' trees, the shallower first (red team 47: ~/.config/git/config a link; 48: one three
    levels down), links and missing targets included (where a tool would make its folder), at most
    HOME_ENTRIES_CHECKED."""
    found, below = _dot_entries(home), [os.path.join(home, folder) for folder in HOME_FOLDERS]
    while below and len(found) < HOME_ENTRIES_CHECKED:
        folder = below.pop(0)
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in itertools.islice(entries, HOME_ENTRIES_CHECKED - len(found)):
                found.append(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    below.append(entry.path)
    return [*(os.path.join(home, folder) for folder in HOME_FOLDERS), *found[:HOME_ENTRIES_CHECKED]]


def _dot_entries(home: str) -> list:
    """The paths of the dot-entries of `home` (none where it cannot be listed)."""
    with contextlib.suppress(OSError), os.scandir(home) as entries:
        return [entry.path for entry in entries if entry.name.startswith(".")]
    return []


def _expanded(value: str, env) -> str:
    """`value` as a shell, git or Python would take it: `$NAME`, `${NAME}` and a leading `~` or `~user` expanded (red
    team 46: git's include.path `~/W/x` was read as `/W/x`)."""
    home = _home(env)
    value = re.sub(r"\$\{(\w+):?[-=?+]([^}]*)\}", lambda m: env.get(m[1]) or m[2], value)  # ${NAME:-default}
    value = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m[1] or m[2], m[0]), value)
    return re.sub(r"(^|[\s:,;'\"=])~([\w.-]*)(?=/|$|[\s:,;'\"])",
                  lambda m: m[1] + (os.path.expanduser("~" + m[2]) if m[2] else home), value)


def _named_paths(value: str, env) -> list:
    """The paths a variable's value may name, as given and expanded: every absolute one in it, and each entry of a
    list as a whole (a path with a space in it), a relative one from the working folder (red team 45: the space
    cut a path short, and a relative one was read from /; red team 46: `../lib` from a staged bundle)."""
    found = []
    for text in {value, _expanded(value, env)}:
        found += [*_ABSOLUTE.findall(text), *(os.path.join(os.getcwd(), entry) for entry in text.split(os.pathsep)
                                              if entry and entry != "." and not entry.startswith("/"))]
    return found


def check(env=None) -> dict:
    """Nothing the judge runs, loads, reads its settings from, writes or keeps lies in (or leads through a link in)
    a RANK_WRITABLE folder, and no such folder lies in one the judge imports or loads from (ValueError for the
    first), nor is the working folder. NOTES: a rank writes there for the rest of the command, and the judge's next
    process would run or read what it planted, as root: a package below PYTHONPATH (red team 42), a .pyc below
    PYTHONPYCACHEPREFIX (43), git's config below XDG_CONFIG_HOME, whose fsmonitor command root's `git status` ran,
    and matplotlib's font cache below MPLCONFIGDIR or XDG_CACHE_HOME, written by root through a rank's link onto a
    file of root's (44); /tmp writable hid the staged bundle from the ranks (41); fontconfig's ~/.fonts.conf.d, a
    rank's library by `LD_LIBRARY_PATH=../lib` from a bundle staged in one, and a bundle staged into a rank's
    folder (46). Returns writable_ids, for the checks that follow it."""
    env = os.environ if env is None else env
    if not (named := folders(env)):
        return {}
    others = _other_names(named)
    ids = writable_ids(env, others)
    _check_folders(env, ids, others)
    if found := reach(os.getcwd(), ids)[1]:  # red team 45: a rank's ./matplotlibrc, 114 in every later command
        raise ValueError(f"the working folder lies in {RANK_WRITABLE} folder {found!r}; a rank could plant there "
                         f"what the judge reads (run the judge, a staged bundle too, from a folder of its own)")
    for path, what in _used_by_the_judge(env):
        _, lies_in, through = reach(path, ids)
        if found := lies_in or through:
            raise ValueError(f"{RANK_WRITABLE} folder {found!r} holds {path!r}, which the judge {what}; a rank "
                             f"could plant there what the judge runs or reads")
    imported = _ids(_loaded(env))
    for name, folder in [*((f, f) for f in named), *others.items()]:  # red team 57: a bind of the judge's a2a/
        if entry := _holder(Path(name).parent, imported):
            shown = "" if name == folder else f" (shown at {name!r})"
            raise ValueError(f"{RANK_WRITABLE} folder {folder!r}{shown} lies in {entry!r}, which the judge imports "
                             f"from; a rank could plant a module or its bytecode there")
    return ids


def _check_folders(env, ids: dict, others: dict) -> None:
    """The writable folders themselves: each named by an absolute path, none on or through a file system of the
    kernel's, which the judge reads for itself (red team 48: /sys/fs/cgroup turned the pool's memory cap off, /proc
    ended the judge with 114), none in another or reached through a link in one (48: a rank made the inner one a
    link, and root took its target for the folder), and no mount below one (48: the ranks wrote it, and root read it
    under its other name). `others`: _other_names of the folders."""
    given, mounts = [entry for entry in env.get(RANK_WRITABLE, "").split(os.pathsep) if entry], _mounts()
    trees = [*map(Path, SYSTEM_TREES), *map(Path, _dot_entries(os.path.realpath(_home(env))))]
    for entry, folder in zip(given, map(os.path.realpath, given)):
        if not os.path.isabs(entry):  # red team 49: a staged bundle's ranks read it from another folder
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} is relative, read from whatever folder a process runs "
                             f"in; name it by an absolute path")
        # each step as given and as resolved: normalized, /proc/self/cwd/../../.. leaves /proc (CI's deeper folder)
        given_steps = [Path(*Path(entry).parts[:end]) for end in range(1, len(Path(entry).parts) + 1)]
        steps = given_steps + [Path(os.path.realpath(step)) for step in given_steps]
        names = [folder, *(path for path, shown in others.items() if shown == folder)]  # and a mount's other names
        if tree := next((t for name in map(Path, names) for t in trees if t == name or t in name.parents), None):
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} lies in {tree}, a folder of the system's or its "
                             f"tools', which root's programs read by fixed names (red team 59: pyenv's hooks, a "
                             f"compiler's headers, a site folder's .pth); name a folder made for the ranks")
        steps += map(Path, names[1:])  # red team 55: a bind of /sys/fs/cgroup at a path on a disk
        ways = {*steps, *(parent for step in steps for parent in step.parents)}
        if kernels := [k for k in map(Path, ("/proc", "/sys", "/dev")) if k in ways]:
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} lies in {kernels[0]}, a file system of the kernel's "
                             f"that the judge reads for itself, is named through it (red team 50: /proc/self/cwd, "
                             f"another folder in each process) or is one of its folders under another name; name a "
                             f"folder on a disk by its own path")
        if (held := _mount_of(Path(folder), mounts)) and held[5] in KERNEL_FILE_SYSTEMS:
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} is on a {held[5]} file system, the kernel's, which the "
                             f"judge reads for itself (red team 55: a bind of /sys/fs/cgroup at another path turned "
                             f"the pool's memory cap off, one of /proc ended the judge with 114); name a folder on a "
                             f"disk")
        if owns := next(filter(None, map(_judges_own, names)), None):  # red team 52: a bind of the judge's cache
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} lies in {owns}, the judge's own (its build cache, a "
                             f"pool's run or a staged bundle: red team 51, 114 when the judge wrote there); name a "
                             f"folder of the operator's")
        if not os.path.isdir(folder):  # CI's container has no /sys/fs/cgroup: checks by name come first
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} is not a folder; make it first (mode 1777 for every "
                             f"rank's uid)")
        _, lies_in, through = reach(entry, {key: name for key, name in ids.items() if name != folder})
        if found := lies_in or through:
            raise ValueError(f"{RANK_WRITABLE} folder {entry!r} lies in another, {found!r}, where a rank could make "
                             f"it a link; name the outer one alone")
    for mount in mounts:
        if holder := next((f for f in ids.values() if Path(f) in mount[4].parents), None):
            raise ValueError(f"{mount[4]} is mounted below {RANK_WRITABLE} folder {holder!r}: the ranks would write "
                             f"it, and the judge read it under its other names; unmount it, or name another folder")


def _check_result_file(fd: int, ids: dict) -> None:
    """The protocol face's result descriptor (POPCORN_FD), where it is a file the kernel names by a path, lies in no
    RANK_WRITABLE folder, nor has another name that could (ValueError): the ranks could write its lines (red team 51:
    ranks appended `benchmark.0.mean: 1.0` to a result file in the folder, and the runner's parser, whose last value
    wins, read it). `ids`: writable_ids."""
    if not ids:
        return
    with contextlib.suppress(OSError):
        where, info = os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd)
        if where.startswith("/") and (any(reach(where, ids)[1:]) or stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
            raise ValueError(f"POPCORN_FD={fd} is {where!r}, which the ranks could write through {RANK_WRITABLE} "
                             f"(lies in it, or has another name): give the results a file of the judge's own")


def _judges_own(folder: str) -> Optional[str]:
    """The judge's own folder that `folder` (resolved) is or lies in: its build cache (RANK_CACHE), or one it names
    a2a-* in /tmp or /var/tmp (a pool's run folder, a staged bundle, the default cache); else None."""
    path, cache = Path(folder), Path(os.path.realpath(RANK_CACHE))
    if path == cache or cache in path.parents:
        return str(cache)
    return next((str(top / part) for top in map(Path, ("/tmp", "/var/tmp")) if top in path.parents
                 for part in [path.relative_to(top).parts[0]] if part.startswith("a2a-")), None)


def nearest_folder(path: Path) -> Path:
    """The nearest of `path` and its parents that is there, which must be a folder (a ValueError says why not). A
    link to nothing is there: no folder can be made in its place (red team 69: a run's --out, or the rank cache, so
    named ended the command with 114)."""
    existing = next(p for p in [path, *path.parents] if os.path.lexists(p))
    if existing.is_symlink() and not existing.exists():
        raise ValueError(f"{existing} is a link to nothing")
    if not existing.is_dir():
        raise ValueError(f"{existing} is not a folder")
    return existing


def check_rank_cache() -> None:
    """A2A_RANK_CACHE before any work (a ValueError says what is wrong): a new path below a folder, or a folder the
    judge may take over. boundary.prepare_rank_cache makes it root's alone (0700) and prunes what older versions left
    in it, so another user's folder, or one open to others that holds anything, is refused rather than taken (red
    team 69: a shared folder named there lost its mode 1777 and two of its subfolders)."""
    try:
        if nearest_folder(RANK_CACHE) != RANK_CACHE:
            return  # made by prepare_rank_cache, root's alone from the start
    except ValueError as exc:
        raise ValueError(f"A2A_RANK_CACHE={str(RANK_CACHE)!r}: {exc}") from None
    info = os.stat(RANK_CACHE)
    if info.st_uid != os.geteuid():
        raise ValueError(f"A2A_RANK_CACHE={str(RANK_CACHE)!r}: a folder of uid {info.st_uid}, which the judge would "
                         f"make its own (0700): name a folder of the judge's or a new path")
    if info.st_mode & 0o077 and os.listdir(RANK_CACHE):
        raise ValueError(f"A2A_RANK_CACHE={str(RANK_CACHE)!r}: open to others (mode {stat.S_IMODE(info.st_mode):o}) "
                         f"and not empty, so its files may be anyone's: the judge would close it (0700) and prune it; "
                         f"name an empty folder or a new path")


def check_judges_folder(path: Path, what: str) -> None:
    """`path`, a folder the judge will save in (a run's results, a staged bundle): refused (ValueError) where it lies
    in a RANK_WRITABLE folder or leads through a link in one. NOTES: the judge's own view has those folders covered
    (cover), and a rank could make the folder first, swap what is in it or point the link elsewhere (red team 43: a
    forged results.csv; 44: a link chain and a bind mount; 46: a bundle staged into a rank's folder)."""
    _, top, through = reach(path, writable_ids())
    if through:
        raise ValueError(f"{what} {path} leads through a link in {RANK_WRITABLE} folder {through!r}, which a rank "
                         f"could point elsewhere")
    if top is not None:
        raise ValueError(f"{what} {path} lies in {RANK_WRITABLE} folder {top!r}, where ranks write: the judge saves "
                         f"only in a folder of its own")


def cover(env=None, result_fds=()) -> list:
    """The judge's own view without the RANK_WRITABLE folders, made first thing, before it starts a thread or a
    process: in a mount namespace of its own, each such folder, and each other name a mount gives it or a folder below
    it, is covered by an empty read-only file system, so no path root's processes follow, however spelled, linked or
    named inside a config file, reaches what a rank wrote there. The ranks lift the covers in their own namespaces
    (boundary.enter_rank_sandbox). The name check comes first, as the early and clearer word (ValueError). Returns the
    points covered: none without such a folder, where they are covered already (a protocol face under the human
    face), or not as root (the ranks then write as the judge's uid anyway). NOTES: what the judge's interpreter
    loaded before this (its imports, LD_PRELOAD, its working folder) the name check alone holds."""
    env = os.environ if env is None else env
    ids = check(env)  # the command's one name check, as any user
    for fd in result_fds:
        _check_result_file(fd, ids)
    named = [folder for folder in folders(env) if os.path.isdir(folder)]
    if not named or os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return []
    env[RANK_WRITABLE] = os.pathsep.join(folders(env))  # as resolved here, for every process it starts (red team 50)
    covered = set(judges_covers())
    others = {path: folder for path, folder in _other_names(named).items() if os.path.lexists(path)}
    found = sorted({*named, *others} - covered)
    points = [p for p in found if not any(Path(other) in Path(p).parents for other in found)]
    if not points:
        return []
    if files := [p for p in points if not os.path.isdir(p)]:
        raise ValueError(f"{files[0]} shows a file of {RANK_WRITABLE} folder {others[files[0]]!r}, which "
                         f"the judge cannot cover: unmount it, or unset {RANK_WRITABLE}")
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        raise RuntimeError(f"the judge covers {RANK_WRITABLE} before it starts a thread; this process has {threads}")
    libc = _libc()
    for action, failed in ((lambda: libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)"),
                           (lambda: libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")):
        if action():
            raise ValueError(f"{RANK_WRITABLE} needs a mount namespace of the judge's own, and {failed} failed: "
                             f"{os.strerror(ctypes.get_errno())}; unset it")
    for point in points:
        if libc.mount(JUDGE_COVER.encode(), os.fsencode(point), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      b"mode=0555,size=4k"):
            raise OSError(ctypes.get_errno(), f"covering {point}: {os.strerror(ctypes.get_errno())}")
    return points


def main(argv: list) -> int:
    """`python -E -s -B rank_writable.py COMMAND...`: the name check (check) in an interpreter that read no PYTHON*
    variable and no user site, then COMMAND in this process's place. The Makefile starts every judge command so:
    started directly, root's interpreter ran a rank's sitecustomize.py from a PYTHONPATH into a writable folder before
    the command's own check could refuse it (red team 50). NOTES: the loader's variables (LD_PRELOAD) act before any
    interpreter; no process can guard its own start against them."""
    if not argv:
        print("usage: python -E -s -B rank_writable.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        check()
    except ValueError as error:
        print(f"error: {error}".encode("unicode_escape").decode("ascii"), file=sys.stderr)
        return 113  # eval.EXIT_BAD_INPUT: eval imports torch, which this interpreter must not load from a PYTHONPATH
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
