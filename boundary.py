"""The boundary the kernel holds between the judge and a submission's ranks: process trees that end with their
owner, the ranks' PID and mount namespaces, their unprivileged uid, and what they leave behind.

Part of every staged bundle (task.yml lists it): eval.py's rank pool starts its workers through it. It imports
nothing of the harness and no torch. What it holds and what it does not: docs/judge.md, "The threat model".
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import resource  # here, not in a rank: a worker imports nothing after it lifts the covers (red team 50)
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from env_secrets import is_secret
from pool_memory import (CGROUP_ROOT, POOL_MEMORY_ENV, TCP_SHARE, make_memory_group, memory_cap_hit,  # noqa: F401
                         group_socket_bytes, memory_group, pool_memory_bytes, remove_pool_groups,
                         socket_memory)
from rank_filter import install_rank_filter

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------------------------
# Process trees (Linux): ranks die with their parent, and nothing a submission starts outlives the run.
# --------------------------------------------------------------------------------------------------------------


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the signal handlers and kill_tree still clean up
        pass


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """The kernel sends `signum` to this process when its parent dies (PR_SET_PDEATHSIG)."""
    _prctl(1, signum)


def hide_result_channel() -> None:
    """Keeps the result channel out of the ranks' reach: POPCORN_FD leaves the environment the ranks inherit, and
    this process becomes non-dumpable, so another process of the same user cannot open /proc/<this pid>/fd/<fd>
    (root still can: docs/judge.md, "What stays open"). The human face's channel is a socket, which no
    process can open through /proc at all."""
    os.environ.pop("POPCORN_FD", None)
    _prctl(4, 0)  # PR_SET_DUMPABLE


def become_subreaper() -> None:
    """Orphaned descendants (a submission's children whose rank died) are re-parented here, not to init, so that
    kill_tree still finds them (PR_SET_CHILD_SUBREAPER)."""
    _prctl(36, 1)


def process_stat(pid) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ... start time at 19); OSError if gone.
    `pid` may name a thread too ("<pid>/task/<tid>"). NOTES: read as bytes: the name is whatever bytes a process
    gave itself (prctl PR_SET_NAME), and text decoding it ended a judge that looked over /proc (red team 26)."""
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].decode("ascii", "replace").split()


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(process_stat(int(entry))[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


RUN_OWNER = "A2A_RUN_OWNER"  # pid:start time of the command that owns a process (inherited by all it starts)


def _start_time(pid: int) -> Optional[str]:
    try:
        return process_stat(pid)[19]
    except (OSError, IndexError):
        return None


def _own_mark() -> str:
    """`pid:start time` of this process: what names it as an owner after its pid is reused."""
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def _gone(*mark) -> bool:
    """Whether the process a mark (pid, start time) names has ended (its pid is free, or another process's now). A
    mark that is not one names no process of a run: False (red team 27: a rank's child marked with a 5000-digit
    pid ended every judge command that started on the machine while it lived)."""
    if len(mark) != 2 or not re.fullmatch(r"[0-9]{1,10}", str(mark[0])):
        return False
    return _start_time(int(mark[0])) != mark[1]


# What a rank starts with of the operator's environment: what a GPU, a compiler, Python, torch and the collectives
# read, and the harness's own A2A_* (a secret under an innocent name, FOO=..., reached every rank before). More names
# pass with RANK_ENV, comma-separated, itself never passed; a secret (is_secret) never passes. NOTES: families whose
# documented variables hold credentials stay out (red team 37: CCACHE_REMOTE_STORAGE, SCCACHE_AZURE_CONNECTION_STRING).
RANK_ENV = "A2A_RANK_ENV"
RANK_ENV_NAMES = re.compile(
    r"PATH|LANG|LANGUAGE|TZ|TERM|SHELL|LD_LIBRARY_PATH|LD_PRELOAD|LIBRARY_PATH|CPATH|C_INCLUDE_PATH|CPLUS_INCLUDE_PATH"
    r"|PKG_CONFIG_PATH|CC|CXX|CFLAGS|CXXFLAGS|LDFLAGS|MAX_JOBS|VIRTUAL_ENV|CONDA_PREFIX|MASTER_ADDR|MASTER_PORT|RANK"
    r"|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|PYTHON[A-Z0-9]*"
    r"|(LC_|CUDA|NVIDIA_|NVCC_|NVSHMEM_|NCCL_|TORCH|PYTORCH_|TRITON_|HIP|ROCM|ROCR_|HSA_|HCC_|AMD_|MIOPEN_|RCCL_|OMP_"
    r"|MKL_|KMP_|GOMP_|OPENBLAS_|A2A_|POPCORN_|GLOO_|TP_|UCX_|FI_).*")


def hidden_from_ranks(environ) -> list:
    """The names in `environ` (a mapping) that no rank starts with (RANK_ENV_NAMES, RANK_ENV, is_secret)."""
    passed = {name.strip() for name in environ.get(RANK_ENV, "").split(",")} - {""}
    return sorted(name for name, value in environ.items() if name == RANK_ENV or is_secret(name, value)
                  or not (RANK_ENV_NAMES.fullmatch(name) or name in passed))


def folder_entries(value: str) -> str:
    """A PATH-like list less its entries that name no one folder: relative ones, read from whatever folder a tool
    runs in, and ld.so's `$` tokens (red team 47: root's git found a rank's `git` by `../W` from the repository, and
    loaded a rank's library by `$PLATFORM`)."""
    return os.pathsep.join(entry for entry in value.split(os.pathsep) if os.path.isabs(entry) and "$" not in entry)


def reset_environment() -> None:
    """This process's C environment, what every process it starts inherits, made anew from os.environ's variables less
    the secrets (is_secret), and PATH and LD_LIBRARY_PATH less their entries that name no one folder (relative ones,
    read from whatever folder a tool runs in, and ld.so's `$` tokens). NOTES: an entry with an empty name or none at all
    (no '='), which only a raw execve makes, reached every rank past every filter (red team 37); unsetenv refuses an
    empty name (EINVAL)."""
    keep = {name: value for name, value in os.environ.items()
            if name and "=" not in name and not is_secret(name, value)}
    if "LD_PRELOAD" in keep:
        keep["LD_PRELOAD"] = loadable_preloads(keep["LD_PRELOAD"])
    for name in ("PATH", "LD_LIBRARY_PATH"):
        if name in keep:
            keep[name] = folder_entries(keep[name])
    ctypes.CDLL(None).clearenv()
    os.environ._data.clear()  # CPython's own mapping, emptied without unsetenv, which an empty name would fail
    os.environ.update(keep)


def claim_run(inherit: bool = False) -> None:
    """First ends what earlier runs left behind (sweep_orphans), then marks this command as the owner of every
    process it will start, and drops from its environment every variable is_secret says is one (before it starts
    any). `inherit`: keep an owner already named (the protocol face under the human face, which ends it on its way
    out). A standard stream the command was started without (`2>&-`) is /dev/null from here on: Python leaves it
    None, and the clock's ranks, forked from this process, died writing to it, which failed the honest v1 ("rank
    process died", red team 42)."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "w" if fd else "r", closefd=False))
    sweep_orphans()
    reset_environment()
    if not (inherit and os.environ.get(RUN_OWNER)):
        os.environ[RUN_OWNER] = _own_mark()


TEMP_OWNER_MARK = ".a2a-owner"  # in a folder of owned_tempdir: pid:start time of the process that made it


@contextlib.contextmanager
def owned_tempdir(what: str):
    """A temporary folder (a staged bundle, the clock's bundles) removed on the way out, or, when its process is
    killed before it can remove it, by the next command's sweep_orphans (it names its maker)."""
    with tempfile.TemporaryDirectory(prefix=f"a2a-{what}-") as tmp:
        Path(tmp, TEMP_OWNER_MARK).write_text(_own_mark())
        yield Path(tmp)


_NAME_KEY = secrets.token_bytes(16)  # this process's own: what names a file after a rank's words (owners_name)


def owners_name(data: bytes) -> str:
    """A name for `data` (the same within this process) that no rank can compute from what it wrote (red team 42:
    a build log named by a plain hash of its text told the round's next entry 16 bits of an input by its name)."""
    return hashlib.blake2b(data, key=_NAME_KEY, digest_size=8).hexdigest()


def _owners_folder(folder: Path, closed: bool) -> int:
    """A descriptor of `folder` (made where missing) that is this process's alone: a folder, not a link, of its own
    uid that no one else may write (PermissionError otherwise); with `closed`, made 0700. NOTES: the judge wrote its
    logs, and chmodded its old ones, in a folder a rank could fill with links (red team 43: root made a rival's
    staged file 0600 and the honest v1 failed); every operation here goes through this descriptor, naming no link."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(errno.EPERM, "a folder others own or may write", str(folder))
    if closed:
        os.fchmod(fd, 0o700)
    return fd


def write_owners_only(path: Path, data: bytes, closed_folder: bool = False) -> None:
    """`data` in `path`, a file only its owner reads (0600, however it was before; no link followed), in a folder
    of the owner's alone (_owners_folder); with `closed_folder`, one only its owner lists (0700: its names and count
    are no channel). NOTES: a failed build's log, a rank's words with its round's inputs in them, lay at 0644 in
    the harness's folder, which every later pool sees: the next entry of the round read them before its calls (red
    team 41)."""
    folder = _owners_folder(path.parent, closed_folder)
    try:
        fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder)
        with os.fdopen(fd, "wb") as file:
            os.fchmod(fd, 0o600)
            file.write(data)
    finally:
        os.close(folder)


def keep_newest(folder: Path, prefix: str, count: int, spared: set, group=lambda name: name) -> None:
    """Of the plain files in `folder` (the owner's alone: _owners_folder) named `prefix`..., taken in groups
    (`group(name)`: a run's logs), all but the `count` newest groups go (a group as new as its newest file), never
    one with a file named in `spared`; those kept are made 0600 (an older harness wrote them at 0644). Links and
    anything else are left as they are, unfollowed."""
    try:
        fd = _owners_folder(folder, False)
    except OSError:
        return
    try:
        found = []
        for entry in os.scandir(fd):
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if entry.name.startswith(prefix) and stat.S_ISREG(info.st_mode):
                    found.append((info.st_mtime_ns, entry.name, info.st_mode))
        found.sort(reverse=True)
        newest: dict = {}  # group -> its place, newest first
        for _, name, _ in found:
            newest.setdefault(group(name), len(newest))
        kept = set(map(group, spared))
        for _, name, mode in found:
            with contextlib.suppress(OSError):
                if newest[group(name)] >= count and group(name) not in kept:
                    os.unlink(name, dir_fd=fd)
                elif mode & 0o077:
                    file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    os.fchmod(file, 0o600)
                    os.close(file)
    finally:
        os.close(fd)


REMOVE_DEPTH = 64  # folders held open at once while a tree is removed; deeper ones are moved up first


def remove_tree(path: Path) -> None:
    """Removes a folder whatever its depth (a rank's tree may be deeper than Python's recursion: shutil.rmtree and
    os.walk recurse, and red team 16's 1500 nested folders made every later command fail at its start) and width
    (each folder is read once: rereading a parent after each child made 300 000 empty folders take minutes, red
    team 17), never through a link, never past its file system, with no child process (the guardian, whose PID
    namespace has ended, can fork none). What cannot be removed stays, and the walk goes on past it."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        top = os.open(path, flags)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # a file or a link
        return
    device = os.fstat(top).st_dev

    def emptied(fd: int) -> list:
        """Unlinks a folder's files and links; returns its subfolders' names."""
        folders = []
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.name)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=fd)
        return folders

    stack = [(top, "", emptied(top))]  # (an open folder, its name in the one below it, its subfolders left)
    moved: list = []  # folders moved up to the top from deep below
    while stack:
        fd, name, left = stack[-1]
        if not left and len(stack) == 1:
            left.extend(moved)
            moved.clear()
            if not left:
                break
        if not left:
            stack.pop()
            os.close(fd)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=stack[-1][0])
            continue
        child = left.pop()
        try:
            if len(stack) >= REMOVE_DEPTH:  # up to the top, under a fresh name: the chain held open stays short
                moved.append(f".a2a-deep-{secrets.token_hex(8)}")
                os.rename(child, moved[-1], src_dir_fd=fd, dst_dir_fd=top)
                continue
            inner = os.open(child, flags, dir_fd=fd)
        except OSError:
            continue
        if os.fstat(inner).st_dev != device:  # a mount point: not this tree's to empty
            os.close(inner)
            continue
        stack.append((inner, child, emptied(inner)))
    os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def judges_own_text(path: Path, limit: int = 256) -> Optional[str]:
    """The text of `path` where it is a regular file of this process's uid in a folder of that uid that others cannot
    write, read without following a link or waiting on a pipe; else None. NOTES: what the judge acts on before its
    first check (the sweeps of claim_run) must be its own (red team 48: a rank's `.a2a-owner` in a writable folder
    named /tmp/a2a-* had root remove the folder, and as a FIFO hung every later command; a rank's uid record in a
    misplaced rank cache had root remove another uid's System V IPC)."""
    try:
        folder = os.lstat(path.parent)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        own = {folder.st_uid, info.st_uid} == {os.geteuid()} and stat.S_ISDIR(folder.st_mode)
        if not (own and stat.S_ISREG(info.st_mode) and not folder.st_mode & 0o022):
            return None
        return os.read(fd, limit).decode("ascii", "replace")
    finally:
        os.close(fd)


def _remove_orphan_tempdirs() -> None:
    for folder in Path(tempfile.gettempdir()).glob("a2a-*"):
        mark = judges_own_text(folder / TEMP_OWNER_MARK)
        with contextlib.suppress(OSError):
            if mark is not None and _gone(*mark.strip().split(":")):
                remove_tree(folder)


def sweep_orphans() -> list[int]:
    """SIGKILLs every process whose owner (RUN_OWNER in its environment) is gone: what a run left after a SIGKILL
    took its owner before the owner could end it (a submission's forked children re-parented to init, a rank whose
    parent died), and removes the temporary folders of processes that are gone. A live owner's processes and
    folders are left alone. Returns the pids killed."""
    killed = []
    with contextlib.suppress(OSError):
        _release_stale_uids()
    _remove_orphan_tempdirs()
    for pid, environ in other_processes():
        matched = re.search(rb"(?:^|\0)" + RUN_OWNER.encode() + rb"=([0-9]{1,10}):([0-9]{1,20})(?:\0|$)", environ)
        if not matched or not _gone(matched[1].decode(), matched[2].decode()):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


# What of a pool uid's process environment is read: a rank's is the judge's (kilobytes) and what it adds (red team
# 27: 600 children of 1.9 MiB each slowed every other judge command's start tenfold); and over every such process of
# one scan (red team 28: 3000 children of 260 KiB, 7.8x). Past the total, one reads as empty: it lives in its pool's
# PID namespace, which ends with the pool.
POOL_ENVIRON_BYTES = 256 << 10
POOL_ENVIRON_TOTAL_BYTES = 16 << 20


def process_uid(pid) -> Optional[int]:
    """The real uid process `pid` runs as, from its status (its /proc folder is root's once it is not dumpable);
    None if it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_bytes().splitlines():
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    return None


def other_processes():
    """(pid, environment as bytes) of every other process this one may read, from /proc (the one scan that finds
    processes by what their environment carries: the orphan sweep, the tests' leftover checks); of a pool uid's
    process, its first POOL_ENVIRON_BYTES, within POOL_ENVIRON_TOTAL_BYTES over all of them."""
    left = POOL_ENVIRON_TOTAL_BYTES
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if not RANK_UID_BASE <= (process_uid(entry) or 0) < RANK_UID_BASE + RANK_UID_SPAN:
                        yield int(entry), environ.read()
                        continue
                    text = environ.read(min(POOL_ENVIRON_BYTES, left)) if left > 0 else b""
                    left -= len(text)
                    yield int(entry), text
            except OSError:
                continue


def kill_tree(pid: int, include_root: bool = True) -> None:
    """SIGKILLs every descendant of `pid` (and `pid` itself when include_root) and reaps the descendants that were
    re-parented to this process. The root is left for its owner to reap (multiprocessing joins its workers)."""
    below = descendants(pid)
    for victim in below + ([pid] if include_root else []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    for victim in below:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(victim, 0)


# --------------------------------------------------------------------------------------------------------------
# The boundary the kernel holds. Started as root on Linux, a pool's ranks live in a PID namespace of their own
# (whose init dies with the pool's owner, and the kernel then ends everything in it: daemons, double forks,
# setsid), each with a mount namespace and a /proc of its own (no harness process, environment or command line in
# sight), as an unprivileged uid of the pool's own with no_new_privs (so the kernel refuses them ptrace,
# /proc/<pid>/mem, pidfd_getfd and signals to every harness process). In that mount namespace every mount is
# read-only but the pool's run folders, which cover /tmp, /var/tmp and /dev/shm and go with the pool. Whatever a
# machine cannot do is said in the run's header (Guards).
# --------------------------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
CLONE_NEWIPC, CLONE_NEWNET = 0x08000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
SHADOW_BYTES = 256 << 20  # the most the judge copies of what the ranks need and cannot read (Sandbox._readable_copies)
PR_SET_NO_NEW_PRIVS = 38
# What a pool's ranks may hold at most (hard limits, set before the uid drop): processes and threads of the pool's
# uid together (the kernel's own pid_max was 32768 on this project's CPU machine, where a rank could make 96365: a
# fork bomb would have starved the judge; 8 ranks of torch threads on a 128-core host need about 1200), the size of
# one file (a build's shared object is tens of MB), and open files per process (20 000 were inherited: red team 16
# held a million eventfds, 40% of its machine's file-max, in 4.6 s; a rank of torch and NCCL uses some hundreds).
RANK_LIMITS = {"RLIMIT_NPROC": 4096, "RLIMIT_FSIZE": 4 << 30, "RLIMIT_NOFILE": 8192}
# Pseudo-terminals a rank may hold at once: its /dev/pts is an instance of its own with this cap (red team 60: two
# ranks held 4095 of the machine's 4096 through /dev/ptmx, and root's `script` failed until the pool ended).
RANK_PTYS = 16

# The ranks' uids: one per live pool, claimed by creating its record (UID_RECORDS), so two pools (two entries of
# run_leaderboard.py's clock side by side) never share files, a uid to signal or an MPS server.
RANK_UID_BASE, RANK_UID_SPAN = 60000, 5000
# Folders every user may write. In a rank's mount namespace each is covered by a folder of its pool's run.
COVERED = ("/tmp", "/var/tmp", "/dev/shm")
# The judge's own build cache, root's alone (0700) and out of the ranks' reach wherever A2A_RANK_CACHE moves it:
# `builds/<key>/`, what a pool of that source built, copied back by the judge when the pool ends; `prebuilt/`, what
# the judge's build step (a2a/plan.prebuild) made; `owners/`, the uid records.
RANK_CACHE = Path(os.environ.get("A2A_RANK_CACHE", "/var/tmp/a2a-rank-cache"))
BUILDS = RANK_CACHE / "builds"
UID_RECORDS = RANK_CACHE / "owners"  # uid -> the command that runs ranks as it (pid:start time:since ns)
# Where a rank's torch and Triton put their builds, within its run's `cache` folder.
CACHE_FOLDERS = {"TORCH_EXTENSIONS_DIR": "torch_extensions", "TRITON_CACHE_DIR": "triton"}
# Folders (os.pathsep between) the operator lets the ranks write besides their run's own (a test's marks).
RANK_WRITABLE = "A2A_RANK_WRITABLE"
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"  # where an MPS client looks when CUDA_MPS_PIPE_DIRECTORY is unset
# The namespace's guardian and its init. The guardian, a tiny process outside the PID namespace, first tries in a
# mount namespace of its own how this kernel makes mounts read-only, puts itself (and so the init and the ranks) in a
# network namespace with loopback alone and an IPC namespace of their own, forks the init into the PID namespace and
# says how each went, then waits for its owner's pipe: a line ("end") or its close (the owner is done, or was killed:
# SIGKILL included).
# It kills the init (the kernel ends everything in the namespace with it), answers "ended" to a line, and once the
# pipe is closed (the owner has copied the builds back) removes the run's folders and frees the uid. Signals to the
# run's process group leave it.
_NAMESPACE_INIT = r"""
import ctypes, json, os, signal, sys
owner, here, uid, owner_mark = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, here)
import boundary
libc = ctypes.CDLL(None, use_errno=True)
for name in ("SIGINT", "SIGTERM", "SIGHUP"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
read_only = boundary.read_only_method()
apart = boundary.isolate_network_and_ipc(libc)
if os.getppid() != owner or libc.unshare(0x20000000):
    print("error", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
child = os.fork()
if child == 0:  # the init: reaps every orphan as it ends
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        signal.sigwait({signal.SIGCHLD})
print(child, read_only or "-", apart.replace(" ", "_") or "apart", flush=True)
told = boundary.watch_tables(child, sys.stdin, json.loads(sys.argv[5]), uid)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
if told:
    try:
        print("ended", flush=True)
        sys.stdin.read()
    except OSError:  # the owner is gone: its folders are released all the same
        pass
boundary.release_uid(uid, owner_mark)
"""


# Tables of the machine's that every user shares and no limit of a uid or a cgroup bounds a pool's part of: the
# open-file table (fs.file-max; 8192 files a process and 4096 processes pass it: red team 60 held 2.47 M of this
# project's 2.47 M, and another user's process could not load libc) and socket buffers (tcp_mem, udp_mem; red
# team 62 held 2.26 GiB of TCP's, past the kernel's hard mark, and every socket of the machine slowed 2-10x). Root is
# exempt from the first alone, the ranks of every other pool from none, so the pool's guardian watches them
# (watch_tables): once the machine's use passes a table's alarm, a pool holding more than its share of the table is
# ended, and the guardian says so ("<table> HELD MOST"). NOTES: each share is of the table's limit, and counted only
# past the alarm. Table: (alarm, share), of fs.file-max, or of the buffers' pressure mark (`<protocol>_mem`'s second).
TABLES = {"files": (0.5, 0.125), "tcp": (1.0, 0.25), "udp": (1.0, 0.25)}
TABLE_WATCH_S = 0.05


def file_table() -> tuple:
    """(files open machine-wide, fs.file-max)."""
    allocated, free, most = (int(field) for field in Path("/proc/sys/fs/file-nr").read_text().split()[:3])
    return allocated - free, most


def socket_table(protocol: str) -> tuple:
    """(bytes of `protocol`'s ("tcp", "udp") buffers machine-wide, the kernel's pressure mark for them in bytes: the
    second of its `<protocol>_mem`, None where unseen). NOTES: those marks are the machine's, shown only in its first
    network namespace (not the guardian's); the count in sockstat is the machine's in every one."""
    page = os.sysconf("SC_PAGE_SIZE")
    fields = next(line.split() for line in Path("/proc/net/sockstat").read_text().splitlines()
                  if line.startswith(f"{protocol.upper()}:"))
    used = int(fields[fields.index("mem") + 1]) * page
    with contextlib.suppress(OSError):
        return used, int(Path(f"/proc/sys/net/ipv4/{protocol}_mem").read_text().split()[1]) * page
    return used, None


def table_limits() -> dict:
    """{table: (alarm, share, its limit)} for the guardian, the limits read here (TABLES). A table whose limit
    cannot be read is not watched."""
    limits = {}
    for table, (alarm, share) in TABLES.items():
        with contextlib.suppress(OSError, ValueError, StopIteration):
            if (most := _WATCHED[table][0]()[1]) is not None:
                limits[table] = (alarm, share, most)
    return limits


KCMP_FILES = 2
_KCMP = {"x86_64": 312, "aarch64": 272}


def _table_size(task: str) -> int:
    """FDSize of /proc/<task>/status: the descriptors its file table holds at most."""
    return int(next(line.split()[1] for line in Path(f"/proc/{task}/status").read_text().splitlines()
                    if line.startswith("FDSize:")))


def files_held(init: int, most: float) -> int:
    """What `init`'s PID namespace, nested ones included, can hold of the file table, counted until past `most`:
    each process's table size, each of its threads' that is not the process's own (a thread that unshared its table:
    red team 61 held 1.46 M files in the tables of 180 such threads, which the process's FDSize did not show), and
    each process's mappings (a mapping holds its file after the descriptor is closed: red team 62 held 1.32 M so).
    NOTES: every line of a process's maps counts, anonymous ones too, so that what the count reads is what it adds
    (red team 63: 65 000 mappings of one file a process, each one file of the machine's, made a count of 2.6 M lines
    last 10 s while other processes filled the table); a size above what a table holds, an anonymous mapping or a
    thread kcmp cannot compare counts against the pool alone."""
    libc, kcmp = _libc(), _KCMP.get(os.uname().machine)
    inode, held = _ns_inode(init), 0
    known = {inode: True}
    for entry in os.listdir("/proc"):
        if held > most:
            break
        if entry.isdigit() and _within(int(entry), inode, known):
            with contextlib.suppress(OSError, ValueError, StopIteration):
                held += _table_size(entry) + Path(f"/proc/{entry}/maps").read_bytes().count(b"\n")
                for thread in os.listdir(f"/proc/{entry}/task"):
                    if held > most:
                        break
                    if thread != entry and (kcmp is None or libc.syscall(kcmp, int(entry), int(thread), KCMP_FILES,
                                                                         0, 0) != 0):
                        with contextlib.suppress(OSError, ValueError, StopIteration):
                            held += _table_size(f"{entry}/task/{thread}")
    return held


def queued(init: int, most: float, protocol: str) -> int:
    """Bytes queued in the `protocol` sockets of `init`'s network namespace (the pool's own: loopback alone), both
    ways, counted until past `most`: the guardian's count where sock_diag cannot say their memory (sockets_held).
    NOTES: the queued bytes, not the memory they take (red team 63: one-byte TCP segments held about 800 times their
    bytes, and the pool stayed at the machine's pressure mark unseen)."""
    held = 0
    for name in (protocol, f"{protocol}6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{init}/net/{name}").read_text().splitlines()[1:]:
                sizes = line.split()[4].split(":")
                held += int(sizes[0], 16) + int(sizes[1], 16)
                if held > most:
                    return held
    return held


def sockets_held(init: int, most: float, protocol: str, uid: Optional[int] = None) -> int:
    """What the pool of `init` (and of `uid`) holds of `protocol`'s buffers: its sockets' memory
    (pool_memory.socket_memory), or the bytes they queue where that cannot be read; or, where more, what its memory
    group is charged for sockets (pool_memory.group_socket_bytes: those no listing shows too)."""
    charged = socket_memory(init, most, protocol)
    listed = queued(init, most, protocol) if charged is None else charged
    return max(listed, group_socket_bytes(uid) or 0)


_WATCHED = {"files": (file_table, lambda init, most, uid: files_held(init, most)),
            **{protocol: (functools.partial(socket_table, protocol), functools.partial(sockets_held, protocol=protocol))
               for protocol in ("tcp", "udp")}}


def watch_tables(init: int, told, limits: dict, uid: Optional[int] = None) -> str:
    """The guardian's wait for its owner's line (returned, "" at the pipe's end), meanwhile ending the namespace of
    `init` (its ranks of `uid`) where it holds more than its share of a machine's table whose use passes its alarm
    (`limits`: table_limits)."""
    import select

    while not select.select([told], [], [], TABLE_WATCH_S)[0]:
        for table, (alarm, share, most) in limits.items():
            with contextlib.suppress(OSError, ValueError, StopIteration):
                used = _WATCHED[table][0]()[0]
                if used > alarm * most and (held := _WATCHED[table][1](init, share * most, uid=uid)) > share * most:
                    with contextlib.suppress(OSError):  # said before the kill: the owner finds it with the deaths
                        print(table, held, most, flush=True)
                    os.kill(init, signal.SIGKILL)
                    return told.readline()
    return told.readline()


def ended_for_text(over: tuple) -> str:
    """Why the guardian ended a pool (Sandbox.ended_for's (table, held, its limit))."""
    if over[0] == "files":
        return (f"its pool was ended holding file tables of {over[1]} descriptors, past its share of the machine's "
                f"open-file table (fs.file-max {over[2]})")
    return (f"its pool was ended holding {over[1]} bytes in its {over[0].upper()} buffers, past its share of the "
            f"machine's ({over[0]}_mem's pressure mark, {over[2]} bytes)")


def death_message(exitcode: Optional[int], sandbox=None) -> str:
    """What a rank's end says (None: alive past its connection's end); a SIGKILL at its pool's memory cap, or by its
    guardian for its part of a machine's table (watch_tables), says so."""
    cap, guards = "", sandbox.guards if sandbox is not None else None
    if exitcode == -signal.SIGKILL and guards is not None and guards.memory_bytes and memory_cap_hit(guards.uid):
        cap = (f"; the kernel killed a process of its pool at the pool's memory cap, "
               f"{guards.memory_bytes / (1 << 30):.1f} GiB ({POOL_MEMORY_ENV})")
    elif exitcode == -signal.SIGKILL and sandbox is not None and (over := sandbox.ended_for(0)):
        cap = f"; {ended_for_text(over)}"
    with contextlib.suppress(ValueError, TypeError):
        if exitcode < 0:
            return f"rank process died (exit code {exitcode}, {signal.Signals(-exitcode).name}{cap})"
    return (f"rank process died (exit code {exitcode})" if exitcode is not None else  # alive 5 s after (red team 28)
            "rank process closed its connection to the evaluator and lived on (killed)")


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1


def isolate_network_and_ipc(libc) -> str:
    """This process into a new network namespace, its loopback up and nothing else in it, and a new IPC namespace
    (System V objects, POSIX message queues): a pool's ranks reach each other there and no other pool's sockets,
    abstract ones included, nor the host's. Returns why not ("" when done)."""
    import fcntl
    import socket
    import struct

    if libc.unshare(CLONE_NEWNET | CLONE_NEWIPC):
        return os.strerror(ctypes.get_errno())
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("16sH22x", b"lo", 0)  # struct ifreq: the name, then the flags
            flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    except OSError as error:
        return f"loopback: {error.strerror}"
    return ""


@dataclasses.dataclass(frozen=True)
class RankSandbox:
    """What a rank does to itself at start, before it imports torch or a submission (sent to every worker).
    `covers`: (folder, run folder) pairs, each folder every user may write covered by its run folder. `writable`:
    folders that stay writable (the run's own, the operator's, the MPS pipe). `keep`: folders the ranks read below a
    covered folder (a staged bundle), put back read-only. `read_only`: how every other mount is made read-only
    (read_only_method), or "" where it cannot be. `expose`: (folder, entry) pairs: in the rank's mount namespace the
    folder, which other users cannot search (a home like /root), is covered by an empty one holding only the entry
    the ranks need (the interpreter, the harness), so the rest of it stays out of their sight too. `hide`: files
    read as empty in the rank's mount namespace (a clock run's other entries). `shadow`: (path, copy) pairs: a path
    the ranks read that other users cannot (a bundle in a folder of mkdtemp's, a tool's 0600 submission), shown to
    them as the judge's readable copy of it. `env`: the rank's home, temporary folder and build caches, all in its
    run folder."""
    private_proc: bool
    uid: Optional[int]
    env: dict = dataclasses.field(default_factory=dict)
    covers: tuple = ()
    writable: tuple = ()
    keep: tuple = ()
    read_only: str = ""
    expose: tuple = ()
    hide: tuple = ()
    shadow: tuple = ()
    memory_group: str = ""


@dataclasses.dataclass
class Guards:
    """Which of the kernel's guards a pool's ranks run under, and why any is off."""
    pid_namespace: bool = False
    network_ipc: bool = False
    private_proc: bool = False
    read_only: bool = False
    uid: Optional[int] = None
    memory_bytes: Optional[int] = None  # the pool's memory cap
    memory_off: str = ""  # why it has none
    shared: list = dataclasses.field(default_factory=list)  # what the ranks share beyond their pool, and why
    off: list = dataclasses.field(default_factory=list)
    preloads_left_out: int = 0  # LD_PRELOAD's entries the ranks go without (preloads_in_reach)
    paths_left_out: int = 0  # sys.path entries and the working folder out of their view (other users cannot read)

    def describe(self) -> str:
        if self.pid_namespace and self.network_ipc and self.private_proc and self.read_only and self.uid is not None:
            memory = (f"at most {self.memory_bytes / (1 << 30):.1f} GiB of memory for the pool"
                      if self.memory_bytes else f"no memory cap ({self.memory_off})")
            return (f"ranks in their own PID, network and IPC namespaces and /proc, as uid {self.uid} with "
                    f"no_new_privs and no user namespace, every mount read-only but their run's own folders"
                    f"{'; but ' + ', '.join(self.shared) if self.shared else ''}, {memory}{_env_note()}"
                    f"{self._left_out_note()}")
        return "guards off: " + "; ".join(self.off + self.shared)

    def _left_out_note(self) -> str:
        preloads, paths = self.preloads_left_out, self.paths_left_out
        return ((f", LD_PRELOAD less {preloads} entr{'y' if preloads == 1 else 'ies'} that other users cannot read"
                 if preloads else "")
                + (f", {paths} path(s) of sys.path and the working folder out of their view (other users cannot "
                   "read them)" if paths else ""))


def _env_note() -> str:
    hidden = len(hidden_from_ranks(os.environ))
    return f", the operator's environment less {hidden} variable(s) ({RANK_ENV} passes more)" if hidden else ""


def has_ended(pid: int) -> bool:
    """Whether `pid` has exited: gone, or a zombie its parent has not reaped, every thread of it ended. NOTES: a
    process whose main thread ended (pthread_exit) reads as a zombie while its other threads run on (red team 19:
    such a hog was left out of the sweep)."""
    try:
        if process_stat(pid)[0] != "Z":
            return False
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for thread in threads:
        with contextlib.suppress(OSError, IndexError):
            if process_stat(f"{pid}/task/{thread}")[0] not in "ZX":
                return False
    return True


def _ns_inode(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


NS_GET_PARENT = 0xB702  # ioctl on a namespace file: its parent PID namespace, as a new descriptor


def _within(pid: int, inode: int, known: dict) -> bool:
    """Whether `pid`'s PID namespace is the one of `inode` or nested in it, at any depth (a rank may unshare a user
    and PID namespace of its own: its processes there are still the pool's). `known`: inode -> answer, filled."""
    import fcntl

    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return False
    seen = []
    try:
        while (here := os.fstat(fd).st_ino) not in known:
            seen.append(here)
            try:
                parent = fcntl.ioctl(fd, NS_GET_PARENT)
            except OSError:  # the top of this process's view: not below the pool's
                known[here] = False
                break
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
    for inode_seen in seen:
        known[inode_seen] = known[here]
    return known[here]


class Sandbox:
    """The pool owner's side of the boundary: the PID namespace (its init, and the owner's children spawned into
    it), the ranks' uid and their run folders. Without root, or without the kernel's namespaces, it turns the
    guard off and says why; the process-tree clean-up (subreaper, RUN_OWNER sweep) still applies. `reach`: paths the
    ranks must read besides the interpreter, the harness and this process's import path (a staged bundle). `env`:
    the pool's variables on top of this process's (an MPS pipe folder). `build_key`: what the pool runs (a hash of
    its source, Sandbox.source_key): its ranks start from the builds an earlier pool of the same key left, and theirs are
    kept for the next one. `hide`: files its ranks read as empty (RankSandbox.hide)."""

    def __init__(self, enabled: bool = True, reach: tuple = (), env: Optional[dict] = None,
                 build_key: Optional[str] = None, hide: tuple = ()):
        self.guards = Guards()
        self.parent: Optional[Any] = None
        self.init_pid: Optional[int] = None
        self.inode: Optional[int] = None
        self.over: Optional[tuple] = None  # (table, held, its limit) when the guardian ended the pool for its part
        self._namespaces: dict = {}  # CLONE_NEW* -> (the ranks' namespace, this thread's own), descriptors
        self._rendezvous: Optional[Path] = None
        self._temporary = contextlib.ExitStack()  # the folders this pool made that go with it
        self._shared_shm: Optional[str] = None  # the /dev/shm its ranks share with others, swept of theirs at its end
        self._mps_pipe: Optional[str] = None  # the MPS pipe folder they write in, swept of their files at its end
        self.uid: Optional[int] = None
        self._views: dict = {}
        self._seeded: set = set()
        self.build_key = build_key if build_key and re.fullmatch(r"[0-9a-f]{16,64}", build_key) else None
        self.setup = RankSandbox(private_proc=False, uid=None)
        if not enabled:
            self.guards.off.append("the sandbox was turned off (A2A_SANDBOX=0)")
            return
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            self.guards.off.append("not started as root: the ranks run as this user, in this PID namespace, and can "
                                   "reach this user's processes")
            return
        pool_env = {**os.environ, **(env or {})}
        self.uid = claim_uid()
        shm, shm_shared = shm_cover(self.uid, pool_env)
        if shm_shared:
            self.guards.shared.append(shm_shared)
            self._shared_shm = shm or "/dev/shm"
            self._mps_pipe = pool_env.get("CUDA_MPS_PIPE_DIRECTORY", MPS_DEFAULT_PIPE)
        make_run_folders(self.uid, own_shm=not shm_shared)
        read_only = self._start_guardian()
        if self.init_pid is None:
            return
        self.guards.pid_namespace = self.guards.private_proc = True
        self.setup = RankSandbox(private_proc=True, uid=None)
        # the libraries the ranks start with preloaded (a newer NCCL for sharing GPUs) stay in sight of whatever a
        # rank starts: every process ld.so makes reads them again (2026-11-29: 200 "cannot be preloaded" lines from
        # a world-size-8 test, the NCCL built under /tmp, which the ranks' run covers)
        preloaded, self.guards.preloads_left_out = preloads_in_reach(pool_env.get("LD_PRELOAD", ""))
        # the interpreter's own trees whole (its shared library and links lie beside it), every other path alone;
        # of the operator's sys.path and working folder only what other users can read (red team 40: PYTHONPATH=/root,
        # 0700, turned every guard off, and the ranks read /root as root)
        interpreter = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        operators = existing([Path.cwd(), *map(Path, sys.path)])
        readable = [p for p in operators if _below_covered(p) or exposure([p])[1] is None]
        self.guards.paths_left_out = len(set(operators) - set(readable))
        needed = existing([Path(sys.executable), *map(Path, interpreter), Path(os.__file__).parent, HERE,
                           *map(Path, filter(None, reach)), *map(Path, filter(os.path.isabs, preloaded))]) + readable
        shadow = self._readable_copies(existing([HERE, *map(Path, filter(None, reach))]))
        needed = [p for p in needed if str(p) not in shadow] + [Path(copy) for copy in shadow.values()]
        mount_points = [Path(p) for p in shadow if _below_covered(Path(p))]
        pairs, unreachable = exposure([p for p in needed if not _below_covered(p)]
                                      + [Path(p).parent for p in shadow if not _below_covered(Path(p))])
        if unreachable:
            self.guards.off.append(f"the ranks keep this user's uid: {unreachable} is not readable by other users")
            return
        self.guards.read_only = bool(read_only)
        if not read_only:
            self.guards.off.append("the kernel makes no mount read-only for the ranks (mount_setattr, remount): "
                                   "what they write outside /tmp, /var/tmp and /dev/shm outlives the run")
        covers = run_covers(self.uid, shm)
        self._views = cache_views(self.uid, needed, covers)
        self._seeded = seed_builds(self.uid, self.build_key, self._views)
        self.guards.uid = self.uid
        limit = pool_memory_bytes()
        group, self.guards.memory_off = make_memory_group(self.uid, limit)
        self.guards.memory_bytes = limit if group else None
        # shared with the MPS server: its pipe folder, and the machine's /dev/shm where theirs is not covered
        shared = tuple(filter(None, (self._mps_pipe, "/dev/shm" if shm_shared and shm is None else None)))
        preload = {"LD_PRELOAD": " ".join(preloaded)} if "LD_PRELOAD" in pool_env else {}
        self.setup = RankSandbox(private_proc=True, uid=self.uid, env={**run_env(self.uid, self._views), **preload},
                                 covers=covers, writable=_writable(self.uid, pool_env, shared),
                                 read_only=read_only,
                                 keep=tuple(sorted({str(p) for p in [*needed, *mount_points] if _below_covered(p)})),
                                 expose=tuple(pairs), memory_group=str(group or ""), shadow=tuple(shadow.items()),
                                 hide=tuple(sorted({str(Path(p).resolve()) for p in hide if Path(p).is_file()})))

    def _readable_copies(self, paths: list) -> dict:
        """{path: the judge's copy}, of each of `paths` other users cannot read themselves, where its folder is in
        their reach: a copy every user may read (links copied as links, never followed), at most SHADOW_BYTES. NOTES:
        red team 47: a bundle in a folder of mode 0700 (what mkdtemp makes) and a tool's 0600 submission turned
        every guard off, and the ranks ran as root with every mount writable."""
        copies: dict = {}
        folder: Optional[Path] = None
        for path in paths:
            if exposure([path])[1] is None or not (_below_covered(path) or exposure([path.parent])[1] is None):
                continue
            entries = [path] if not path.is_dir() else [path, *path.rglob("*")]
            if len(entries) > 10_000 or sum(p.lstat().st_size for p in entries if p.is_file()) > SHADOW_BYTES:
                continue  # too large to copy: the guards go off, and say why
            folder = folder or self._temporary.enter_context(owned_tempdir("readable"))
            copy = folder / str(len(copies)) / path.name
            copy.parent.mkdir(mode=0o755)
            if path.is_dir():
                shutil.copytree(path, copy, symlinks=True)
            else:
                shutil.copyfile(path, copy, follow_symlinks=False)
            for made in [copy, *(copy.rglob("*") if copy.is_dir() else ())]:
                if not made.is_symlink():
                    made.chmod(0o755 if made.is_dir() else 0o644)
            copies[str(path)] = str(copy)
        return copies

    @staticmethod
    def source_key(path: Path, entry: str = "") -> Optional[str]:
        """The build key of a submission file: the hash of its bytes, and of `entry` (the name a run gives it) when
        given (None when there is no file). NOTES: in one clock round every entry gets the same inputs, so two
        entries of the same bytes must not share builds (red team 33: the third of three identical files found
        the first's answers, kept by input in its extension cache, for 8 of 8 calls)."""
        import hashlib

        try:
            source = Path(path).read_bytes()
        except OSError:
            return None
        return hashlib.sha256(entry.encode("utf-8", "surrogateescape") + b"\0" + source if entry else source).hexdigest()

    def _start_guardian(self) -> str:
        """Starts the namespace's guardian; the way mounts are made read-only here ("" for none)."""
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != RUN_OWNER}  # no orphan sweep may end it mid-clean
        self.parent = subprocess.Popen([sys.executable, "-c", _NAMESPACE_INIT, str(os.getpid()), str(HERE),
                                        str(self.uid), _own_mark(), json.dumps(table_limits())],
                                       stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env,
                                       start_new_session=True)  # a kill of the run's process group spares it
        answer = self.parent.stdout.readline().split()
        if len(answer) != 3 or answer[0] == "error":
            self.guards.off.append(f"the kernel refused a PID namespace ({' '.join(answer[1:]) or 'no answer'})")
            self.close()
            return ""
        self.init_pid = int(answer[0])
        self.inode = _ns_inode(self.init_pid)
        kinds = {CLONE_NEWPID: "pid"}
        if answer[2] == "apart":
            kinds.update({CLONE_NEWNET: "net", CLONE_NEWIPC: "ipc"})
            self.guards.network_ipc = True
        else:
            self.guards.off.append(f"the ranks share this machine's network and IPC namespaces (the kernel said "
                                   f"{answer[2].replace('_', ' ')})")
        self._namespaces = {kind: (os.open(f"/proc/{self.init_pid}/ns/{name}", os.O_RDONLY),
                                   os.open(f"/proc/thread-self/ns/{name}", os.O_RDONLY))
                            for kind, name in kinds.items()}
        return "" if answer[1] == "-" else answer[1]

    def rank_setup(self) -> RankSandbox:
        return self.setup

    def namespace_fds(self) -> dict:
        """{CLONE_NEW*: a descriptor of the ranks' namespace of that kind} (empty without one): what a process born
        elsewhere enters to be born as `spawning` would have it."""
        return {kind: pair[0] for kind, pair in self._namespaces.items()}

    def rendezvous_folder(self) -> str:
        """A folder the pool's ranks write and no other pool's can, for their rendezvous files: in the run folder
        with a uid of their own, else a temporary folder removed with the pool (made on first use)."""
        if self._rendezvous is None:
            if self.uid is not None and self.guards.uid is not None:
                folder = run_folder(self.uid) / "tmp" / "a2a-rendezvous"
                folder.mkdir(mode=0o700, exist_ok=True)
                os.chown(folder, self.uid, self.uid)
            else:
                folder = self._temporary.enter_context(owned_tempdir("rendezvous"))
            self._rendezvous = folder
        return str(self._rendezvous)

    @contextlib.contextmanager
    def spawning(self):
        """Processes this thread starts inside the block are born in the ranks' PID, network and IPC namespaces."""
        with self._entered(tuple(self._namespaces)):
            yield

    @contextlib.contextmanager
    def _entered(self, kinds: tuple):
        libc = _libc()
        entered = []
        try:
            for kind in kinds:
                if libc.setns(self._namespaces[kind][0], kind):
                    raise OSError(ctypes.get_errno(), f"setns into the ranks' namespace ({kind:#x}) failed")
                entered.append(kind)
            yield
        finally:
            for kind in reversed(entered):
                libc.setns(self._namespaces[kind][1], kind)

    def members(self) -> list[int]:
        """Every process in the ranks' namespace or one nested in it, but its init and the ended ones (pids as this
        process sees them). A zombie, a rank's child that the rank never reaps, has already released all it held
        (the rendezvous port too): waiting for it to go would wait out every deadline below."""
        return [pid for pid in self._namespace_pids() if pid != self.init_pid and not has_ended(pid)]

    def _namespace_pids(self) -> list[int]:
        """Every process in the ranks' namespace or one nested in it, its init and the ended ones included."""
        if self.inode is None:
            return []
        known = {self.inode: True}
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and _within(int(e), self.inode, known)]

    def sweep(self, keep: set) -> list[int]:
        """SIGKILLs what the submission started in the namespace (everything but `keep`, the live workers): between
        cases, so nothing a case left (a child holding the rendezvous port, a daemon) reaches the next. Listed and
        killed again until none is left: a process may fork between the listing and its kill."""
        killed: set = set()
        deadline = time.monotonic() + 5  # gone, not only signalled: a dying child may still hold the port
        while (left := set(self.members()) - set(keep)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.005)
        return sorted(killed)

    def _guardians_word(self) -> str:
        """The first word of the guardian's next line, and what a table's line says kept in `over`."""
        said = self.parent.stdout.readline().split()
        if said[:1] and said[0] in TABLES and len(said) == 3 and all(field.isdigit() for field in said[1:]):
            self.over = (said[0], int(said[1]), int(said[2]))
        return said[0] if said else ""

    def ended_for(self, wait_s: float) -> Optional[tuple]:
        """(table, held, the table's limit) when the guardian ended this pool for its part of a machine's table
        (watch_tables), waiting up to `wait_s` for its word (said before its kill); else None."""
        import select

        if self.over is None and self.parent is not None:
            with contextlib.suppress(OSError, ValueError):
                if select.select([self.parent.stdout], [], [], wait_s)[0]:
                    self._guardians_word()
        return self.over

    def _ended_said(self) -> bool:
        """Waits, up to ENDED_TIMEOUT_S, for the guardian to say the namespace ended, meanwhile reaping any child of
        this process the namespace held: a PID namespace ends only once each of its processes is reaped, and one
        whose parent is out here (a worker this process spawned, or a child a rank made with CLONE_PARENT before
        the filter refused it: red team 19) would hold the guardian, and this wait, forever."""
        import select

        deadline = time.monotonic() + ENDED_TIMEOUT_S
        while time.monotonic() < deadline:
            if select.select([self.parent.stdout], [], [], 0.05)[0]:
                word = self._guardians_word()
                if word not in TABLES:  # its "ended" follows a table's line
                    return word == "ended"
            for pid in self._namespace_pids():
                with contextlib.suppress(OSError, IndexError, ValueError, ChildProcessError):
                    if process_stat(pid)[:2] == ["Z", str(os.getpid())]:
                        os.waitpid(pid, os.WNOHANG)
        return False

    def close(self, clean_files: bool = True) -> bool:
        """Ends the namespace (the kernel kills every process in it with its init), keeps what the ranks built
        under the pool's build key, then removes the run's folders and frees the uid. `clean_files` is taken
        and not needed: every pool's folders go with it. Whether the pool is gone: its namespace ended, no process of
        it left and its memory group removed (True where it had neither)."""
        ended = self.parent is None
        if self.parent is not None:
            try:  # the guardian ends the namespace, then says so; it ends at its input's end, whatever happened
                self.parent.stdin.write("end\n")
                self.parent.stdin.flush()
                ended = self._ended_said()
                if ended and self.guards.uid is not None:
                    keep_builds(self.uid, self.build_key, self._seeded, self._views)
            except (OSError, ValueError):
                pass
            finally:
                with contextlib.suppress(OSError, ValueError):
                    self.parent.stdin.close()
            try:
                self.parent.wait(timeout=60)
            except Exception:
                self.parent.kill()
                self.parent.wait()
            self.parent = None
        if self.uid is not None and self._shared_shm:
            sweep_owned(Path(self._shared_shm), self.uid)
            sweep_owned(Path(self._mps_pipe), self.uid, channels_kept=MPS_CHANNELS_KEPT)
        if self.uid is not None:
            release_uid(self.uid)  # the guardian's work, unless it never started
        deadline = time.monotonic() + 5
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.01)
        ended = ended and not self.members()
        if self.uid is not None and self.guards.memory_bytes:  # the guardian's release may have met a rank still
            ended = remove_pool_groups(self.uid) and ended     # exiting in it; none is left now
        for fd in (fd for pair in self._namespaces.values() for fd in pair):
            os.close(fd)
        self._namespaces = {}
        self._temporary.close()
        self._rendezvous = None
        self.inode = None
        return ended


def sealed_file(size: int, name: str = "a2a-channel") -> int:
    """A shared file of `size` bytes that no holder can shrink or grow: the rank gets it read-write and the owner
    keeps it mapped, and a mapping whose file shrank raises SIGBUS in the owner at its next touch (redteam13's
    memfd_truncate ended the owner so; red team 25 did the same through a worker's phase slot). Where memfd is
    missing (not Linux, so no rank sandbox either), an unlinked file."""
    if not hasattr(os, "memfd_create"):
        fd, path = tempfile.mkstemp(prefix=f"{name}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
        os.ftruncate(fd, size)
        return fd
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


# A uid's sockets and named pipes kept in the MPS pipe folder at its pool's end where no live process of the uid
# holds any there: its server's own, made when the pool's first rank reached the GPU, are among the oldest.
MPS_CHANNELS_KEPT = 16


def held_channels(uid: int) -> set:
    """What the live processes of `uid` hold open: (device, inode) of each named pipe, and the path of each socket
    bound in this network namespace (/proc/net/unix). Once a pool has ended, its uid's only live process is the MPS
    server that runs as it (outside the pool's namespaces)."""
    held, sockets = set(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if process_uid(pid) != uid:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        sockets.add(target[8:-1])
                    else:
                        info = os.stat(f"/proc/{pid}/fd/{fd}")
                        if stat.S_ISFIFO(info.st_mode):
                            held.add((info.st_dev, info.st_ino))
    if sockets:
        with contextlib.suppress(OSError), open("/proc/net/unix", "rb") as table:
            for line in table.read().splitlines()[1:]:
                fields = line.split(maxsplit=7)
                if len(fields) == 8 and fields[6].decode() in sockets:
                    held.add(os.path.realpath(os.fsdecode(fields[7])))  # as bound: maybe through a link
    return held


def sweep_owned(folder: Path, uid: int, channels_kept: Optional[int] = None) -> None:
    """Removes what `uid` owns at the top of `folder` (a /dev/shm its pool's ranks shared with others, and with the
    MPS server they used): what a pool's ranks left there would outlive the pool and its memory cap, and be read and
    written by the pools after it (red team 23: 1.6 GiB past a 0.5 GiB cap, over 4 rounds). `channels_kept`: the MPS
    pipe folder, where the server of that uid outlives its pool and its daemon may still reach it to end it (red
    team 24 left files on disk there, red team 25 60 000 named pipes, inodes outside every cap). Its sockets and
    named pipes that a live process of the uid holds open stay, the rest go; where it holds none there (an MPS
    that opens its own only when used), the `channels_kept` oldest stay (red team 26: ranks that made that many
    before their first CUDA call would then keep theirs in place of the server's)."""
    channels = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                found = entry.stat(follow_symlinks=False)
                if found.st_uid != uid:
                    continue
                if channels_kept is not None and (stat.S_ISSOCK(found.st_mode) or stat.S_ISFIFO(found.st_mode)):
                    channels.append((found.st_ctime_ns, entry.path, (found.st_dev, found.st_ino)))
                elif entry.is_dir(follow_symlinks=False):
                    remove_tree(Path(entry.path))
                else:
                    os.unlink(entry.path)
    held = held_channels(uid) if channels else set()
    holds = {path for _, path, identity in channels if identity in held or os.path.realpath(path) in held}
    for _, path, _ in sorted(channels)[0 if holds else channels_kept or 0:]:
        if path not in holds:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _below_covered(path: Path) -> bool:
    """Whether `path` lies below a folder that a rank sees covered by its run folder (it must be put back)."""
    return any(Path(folder) in Path(path).parents for folder in COVERED)


def existing(paths: list) -> list:
    """The paths that exist, resolved; a name the kernel refuses (too long, a /proc entry of another process) is
    none (red team 39: an LD_PRELOAD of 300 characters ended the judge with 114)."""
    found = []
    for path in paths:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            if str(path) and path.exists():
                found.append(path.resolve())
    return found


def loadable_preloads(preload: str) -> str:
    """LD_PRELOAD less the paths that are no regular file, or name one per process (/proc, /dev): what every process
    the judge starts loads. NOTES: ld.so reads whatever a path names, and /proc/self/fd/1, the judge's log file in
    the judge, had the human face's evaluator read its own stdout, a pipe, until the silence deadline (red team
    39)."""
    return " ".join(e for e in _preload_entries(preload) if "/" not in e or _preload_file(e))


def _preload_file(entry: str) -> Optional[Path]:
    """The regular file a preload path names, resolved; None where it names none, or goes by /proc or /dev."""
    found = [] if _by_way_of_proc_or_dev(entry) else existing([Path(entry)])
    return found[0] if found and found[0].is_file() else None


def _preload_entries(preload: str) -> list:
    """LD_PRELOAD's entries: a name with a slash is a path (ld.so reads it from the process's working folder when
    relative), made absolute from the judge's (red team 40: ../../proc/self/fd/1); a bare name ld.so searches for."""
    return [os.path.abspath(e) if "/" in e else e for e in re.split(r"[\s:]+", preload) if e]


def _by_way_of_proc_or_dev(path: str) -> bool:
    """Whether the way to `path`, its links followed one step at a time, passes through /proc or /dev (resolved
    whole, a /proc/self link names the judge's own file, not the one it names in another process); a way that
    cannot be followed counts as one."""
    way, here, hops = list(Path(path).parts[1:]), Path("/"), 0
    try:
        while way:
            part = way.pop(0)
            here = here.parent if part == ".." else here if part == "." else here / part
            if here.parts[1:2] in (("proc",), ("dev",)):
                return True
            if here.is_symlink():
                hops += 1
                target = Path(os.readlink(here))
                way = [*target.parts[1:], *way] if target.is_absolute() else [*target.parts, *way]
                here = Path("/") if target.is_absolute() else here.parent
                if hops > 40:
                    return True
    except OSError:
        return True
    return False


def preloads_in_reach(preload: str) -> tuple[list, int]:
    """LD_PRELOAD's entries a rank can be given: (the names ld.so searches for, and the regular files other users
    can read, resolved), and how many are left out. NOTES: one out of reach used to turn every guard off, the ranks
    running as root (red team 39: a library at 0600); a rank now goes without it."""
    kept, left_out = [], 0
    for entry in _preload_entries(preload):
        if not os.path.isabs(entry):
            kept.append(entry)
            continue
        found = _preload_file(entry)
        if found and exposure([found])[1] is None:
            kept.append(str(found))
        else:
            left_out += 1
    return kept, left_out


def exposure(paths: list) -> tuple[list, Optional[str]]:
    """What makes every path reachable by another uid in a rank's mount namespace: (folder, path below it) pairs,
    the first folder on the way that others cannot search and the whole way from it to the path; and the first
    path that stays out of reach (itself unreadable by others), or None. NOTES: the path itself is put in the
    rank's view, nothing beside it (red team 39: a library below /root/.cache put all of /root/.cache there, a
    token with it)."""
    pairs: set = set()
    for path in paths:
        try:
            path = Path(path).resolve()
            chain = list(reversed(path.parents)) + [path]
            blocked = next((above for above in chain[:-1] if not os.stat(above).st_mode & stat.S_IXOTH), None)
            mode = os.stat(path).st_mode
        except (OSError, RuntimeError):
            return [], str(path)
        if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
            return [], str(path)
        if blocked is not None:
            pairs.add((str(blocked), str(path.relative_to(blocked))))
    return sorted(pairs), None


# --------------------------------------------------------------------------------------------------------------
# A pool's run folders and uid. Its ranks write only there (every other mount is read-only to them); the guardian
# removes them when the pool ends, and the next command's sweep after a guardian that was killed too.
# --------------------------------------------------------------------------------------------------------------


def run_folder(uid: int) -> Path:
    """The run folder of the pool whose ranks run as `uid` (root's; the ranks own what is inside): home/, cache/,
    tmp/ (their /tmp), var-tmp/ (their /var/tmp)."""
    return Path("/var/tmp", f"a2a-run-{uid}")


# The pools' own /dev/shm folders, below a folder of the judge's where no rank can make an entry (red team 25: ranks
# that see the machine's /dev/shm, beside an MPS daemon that was already running, could hold another command's
# pool's name there, /dev/shm/a2a-run-<uid> as it was, and keep that pool from starting).
SHM_RUNS = Path("/dev/shm/a2a-runs")


def shm_folder(uid: int) -> Optional[Path]:
    """The pool's /dev/shm (its ranks share it: NCCL and multiprocessing), on /dev/shm's own memory."""
    return SHM_RUNS / str(uid) if os.path.isdir("/dev/shm") else None


def _judges_shm_runs() -> None:
    """Makes SHM_RUNS a folder of this process's uid, mode 0711, in place of anything else of that name (a rank's
    folder, file or link: /dev/shm is open to all)."""
    for _ in range(100):
        try:
            found = os.lstat(SHM_RUNS)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(SHM_RUNS, 0o711)
            continue
        if stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid():
            os.chmod(SHM_RUNS, 0o711)
            return
        remove_tree(SHM_RUNS)
    raise RuntimeError(f"{SHM_RUNS} is taken again each time it is removed")


# Ranks that share a GPU through CUDA MPS and their server (started by the daemon, outside every pool) share files
# in /dev/shm besides the pipe folder. So a2a/sharing.py's own daemon runs on a /dev/shm of its own, which
# MPS_SHM_ENV names to the pools that share GPUs through it, and their ranks see it as /dev/shm (shared by those
# pools of one command, removed with the daemon); ranks that use someone else's daemon see the machine's. With
# this, the ranks' own PID, network and IPC namespaces, and the judge outside MPS (eval.outside_mps), world size 8
# on 2 H200s passed on 2026-11-28 (0227b15).
MPS_SHM_ENV = "A2A_MPS_SHM"


def shm_cover(uid: int, pool_env: dict) -> tuple:
    """(the folder a pool's ranks see as /dev/shm, None for the machine's; "" or why it is not the pool's own)."""
    if pool_env.get("A2A_SHARE") != "mps":
        own = shm_folder(uid)
        return (str(own) if own else None), ""
    if pool_env.get(MPS_SHM_ENV):
        return pool_env[MPS_SHM_ENV], "the MPS daemon's /dev/shm, shared by the pools that share GPUs through it"
    return None, "this machine's /dev/shm, where the MPS server they share GPUs through keeps its files"


def _rank_folders(uid: int, own_shm: bool) -> list[Path]:
    base = run_folder(uid)
    return [base / "home", base / "tmp", base / "var-tmp", base / "cache",
            *(base / "cache" / sub for sub in CACHE_FOLDERS.values()),
            *filter(None, [shm_folder(uid) if own_shm else None])]


# A pool's run folder and /dev/shm folder are file systems of its own (tmpfs): what its ranks write there is capped
# in count (RUN_INODES) and held in memory its memory group pays for, and the pool's end unmounts each in one call
# (red team 17: 300 000 folders took 52.6 s to remove one by one). Where the kernel refuses the mount, plain
# folders, removed one by one.
RUN_INODES = 200_000
MNT_DETACH = 2


def _own_file_system(folder: Path) -> None:
    options = f"mode=0755,nr_inodes={RUN_INODES}".encode()
    _libc().mount(b"tmpfs", os.fsencode(folder), b"tmpfs", MS_NOSUID | MS_NODEV, options)


def make_run_folders(uid: int, own_shm: bool) -> None:
    if own_shm and shm_folder(uid):
        _judges_shm_runs()
    remove_run_folders(uid)  # a folder a cut-off clean-up left
    run_folder(uid).mkdir(mode=0o755)
    _own_file_system(run_folder(uid))
    for folder in _rank_folders(uid, own_shm):
        folder.mkdir(mode=0o700)  # the pool's ranks only: another entry's cannot look in
        if folder == shm_folder(uid):
            _own_file_system(folder)
            os.chmod(folder, 0o700)
        os.chown(folder, uid, uid)


def remove_run_folders(uid: int) -> list[str]:
    removed = []
    for folder in filter(None, [shm_folder(uid), run_folder(uid)]):
        if folder.exists():
            if os.path.ismount(folder):
                _libc().umount2(os.fsencode(folder), MNT_DETACH)
            remove_tree(folder)
            removed.append(str(folder))
    return removed


def run_env(uid: int, views: dict) -> dict:
    base = run_folder(uid)
    return {"HOME": str(base / "home"), "TMPDIR": str(base / "tmp"), "USER": f"a2a-rank-{uid}",
            "LOGNAME": f"a2a-rank-{uid}", **{name: view for name, (view, _) in views.items()}}


def run_covers(uid: int, shm: Optional[str]) -> tuple:
    """(folder, what covers it) for the ranks of the pool of `uid`; `shm`: their /dev/shm (shm_cover), None for the
    machine's."""
    base = run_folder(uid)
    return (("/tmp", str(base / "tmp")), ("/var/tmp", str(base / "var-tmp")), *((("/dev/shm", shm),) if shm else ()))


def _writable(uid: int, env: dict, shared: tuple) -> tuple:
    """The folders a rank may write: its run folder, the operator's (RANK_WRITABLE), and `shared`, what its pool
    shares with an MPS server (the pipe folder, swept of the pool's files at its end; the machine's /dev/shm where
    the ranks see it: shm_cover)."""
    folders = [str(run_folder(uid)), *env.get(RANK_WRITABLE, "").split(os.pathsep), *shared]
    return tuple(sorted({os.path.realpath(f) for f in folders if f and os.path.isdir(f)}))


# The uids this process's pools ran as, never given again in it: an MPS server runs as its clients' uid and
# outlives their pool, and a later pool of the same uid would meet it with its files swept (sweep_owned).
_CLAIMED_HERE: set = set()


def claim_uid() -> int:
    """A uid no live pool runs as, nor any earlier pool of this process, claimed by creating its record (O_EXCL: two
    pools never get the same), with no System V object left of an earlier pool of it."""
    prepare_rank_cache()
    first = secrets.randbelow(RANK_UID_SPAN)
    for step in range(RANK_UID_SPAN):
        uid = RANK_UID_BASE + (first + step) % RANK_UID_SPAN
        if uid in _CLAIMED_HERE:
            continue
        try:
            fd = os.open(UID_RECORDS / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as record:
            record.write(f"{_own_mark()}:{time.time_ns()}")
        remove_sysv_ipc(uid)
        _CLAIMED_HERE.add(uid)
        return uid
    raise OSError(f"every rank uid ({RANK_UID_BASE}-{RANK_UID_BASE + RANK_UID_SPAN - 1}) is taken")


def _record_owner(uid: int) -> Optional[str]:
    """`pid:start time` of the command that claimed `uid`, or None (no record of the judge's, or one still being
    written)."""
    try:
        pid, start, _ = (judges_own_text(UID_RECORDS / str(uid)) or "").split(":")
    except ValueError:
        return None
    return f"{pid}:{start}"


def release_uid(uid: int, owner: Optional[str] = None) -> list[str]:
    """Removes the run folders of the pool that ran as `uid`, then frees the uid, when its record names `owner`
    (this process unless told): never a uid another command has claimed since. Returns the folders removed."""
    if _record_owner(uid) != (owner or _own_mark()):
        return []
    removed = remove_run_folders(uid)
    remove_sysv_ipc(uid)
    if remove_pool_groups(uid):  # else the record stays, and a later command's sweep tries again
        with contextlib.suppress(OSError):
            (UID_RECORDS / str(uid)).unlink()
    return removed


# System V IPC objects are in none of the ranks' namespaces (an IPC namespace of their own is untried on GPUs), so
# they outlive the pool, and its uid, reused by a later pool, would reach them: IPC_RMID for each, per kind the
# call and its arguments after the id.
IPC_RMID = 0
_SYSV_REMOVE = {"shm": ("shmctl", (IPC_RMID, None)), "msg": ("msgctl", (IPC_RMID, None)),
                "sem": ("semctl", (0, IPC_RMID))}


def remove_sysv_ipc(uid: int) -> None:
    """Removes every System V shared memory segment, message queue and semaphore set that `uid` owns or created (a
    segment still attached goes at its last detach)."""
    libc = _libc()
    for kind, (call, args) in _SYSV_REMOVE.items():
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        except OSError:  # a kernel without System V IPC
            continue
        header = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(header, line.split()))
            if uid in (int(row["uid"]), int(row["cuid"])):
                getattr(libc, call)(int(row[header[1]]), *args)


def _release_stale_uids() -> None:
    """Cleans up after every pool whose command is gone and whose guardian was killed with it."""
    if not UID_RECORDS.is_dir():
        return
    for record in UID_RECORDS.iterdir():
        pool_uid = record.name.isdigit() and RANK_UID_BASE <= int(record.name) < RANK_UID_BASE + RANK_UID_SPAN
        owner = _record_owner(int(record.name)) if pool_uid else None
        if owner and _gone(*owner.split(":")):
            try:
                release_uid(int(record.name), owner)
            except Exception as error:  # what one pool left must not stop every later command at its start
                print(f"boundary: the pool of uid {record.name} left what could not be removed "
                      f"({type(error).__name__}: {error})", file=sys.stderr)


# --------------------------------------------------------------------------------------------------------------
# The build cache. A rank writes its builds into its run's cache folder only. The judge (root) fills that folder
# when the pool starts, from the caches its own build step made (the variables this process names) and from what
# an earlier pool of the same source left (builds/<key>), and copies it back there when the pool has ended: a build
# a submission made is only ever read by a later run of the same source.
# --------------------------------------------------------------------------------------------------------------

LEGACY_CACHES = ("home", "torch_extensions", "triton")  # world-writable and shared by every run, before builds/


def prepare_rank_cache() -> dict:
    """The judge's cache folders, root's and closed to the ranks (what older versions left shared, world-writable,
    goes); returns the cache variables for the judge's own build step (a2a/plan.prebuild), whose builds every pool
    then starts from."""
    for folder in (RANK_CACHE, BUILDS, UID_RECORDS, RANK_CACHE / "prebuilt"):
        folder.mkdir(parents=True, exist_ok=True)
        # NOTES: root's alone: a pool reads only its own copy (seed_builds). Below /tmp, /var/tmp or /dev/shm its
        # ranks see their own folders there anyway, but elsewhere (A2A_RANK_CACHE) 0755 let every source read every
        # other's kept builds, live, in the same round (red team 33).
        os.chmod(folder, 0o700)
    for name in LEGACY_CACHES:
        remove_tree(RANK_CACHE / name)
    return {name: str(RANK_CACHE / "prebuilt" / sub) for name, sub in CACHE_FOLDERS.items()}


def _copy_builds(source: Path, target: Path, uid: Optional[int]) -> None:
    """Copies the plain files of `source` into `target` (owned by `uid` when given, else root's), their times kept
    (ninja's up-to-date check reads them), their mode only rwxr-xr-x or rw-r--r-- and no extended attribute: a
    copy root keeps is never setuid, setgid or writable by others (red team 18: a rank's setuid program, kept as
    root's, gave any local user a root shell). Left out: links and anything not a file of one link (a rank's hard
    link to a file it cannot read), and a folder whose build lock is still there (torch's, of a build cut off: it
    would hold the next build waiting)."""
    for dirpath, dirnames, filenames in _walk(source):
        if "lock" in filenames:
            dirnames.clear()
            continue
        into = target / os.path.relpath(dirpath, source)
        into.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            info = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                shutil.copyfile(os.path.join(dirpath, name), into / name, follow_symlinks=False)
                os.chmod(into / name, KEPT_EXECUTABLE if info.st_mode & 0o111 else KEPT_FILE)
                os.utime(into / name, ns=(info.st_atime_ns, info.st_mtime_ns))
                if uid is not None:
                    os.chown(into / name, uid, uid)
        if uid is not None:
            os.chown(into, uid, uid)


def judge_cache(name: str) -> Optional[Path]:
    """The judge's folder of cache variable `name`: this process's own where it names one (an absolute path), else
    the judge's build step's (prepare_rank_cache); the pools' ranks start from a copy of it."""
    folder = os.environ.get(name) or str(RANK_CACHE / "prebuilt" / CACHE_FOLDERS[name])
    return Path(os.path.abspath(folder)) if os.path.isabs(folder) else None


def cache_views(uid: int, needed: tuple, covers: tuple) -> dict:
    """Per cache variable: (the path the pool's ranks use, where that folder is on the judge's side). A torch
    extension's build files name its folder, so a copy under another path is rebuilt whole (seen 2026-11-27: every
    pool of every clock round rebuilt its CUDA extensions, 60-90 s a round). So a rank sees its private copy at the
    judge's own path (the build step's, prepare_rank_cache, when unset) where that lies below a folder its run
    covers (/tmp, /var/tmp, /dev/shm) and holds no path the ranks read from the judge's side, nor lies inside one;
    elsewhere at run_folder/cache/<sub>."""
    base, covers = run_folder(uid), dict(covers)
    views = {}
    for name, sub in CACHE_FOLDERS.items():
        view = host = base / "cache" / sub
        judge = judge_cache(name)
        top = next((folder for folder in COVERED if judge and Path(folder) in judge.parents), None)
        clash = judge and any(p == judge or p in judge.parents or judge in p.parents for p in map(Path, needed))
        if top and top in covers and not clash:
            view, host = judge, Path(covers[top]) / judge.relative_to(top)
        views[name] = (str(view), host)
    return views


KEPT_EXECUTABLE, KEPT_FILE = 0o755, 0o644  # the only modes a kept build's file has
KEEP_MAX_DEPTH = 16  # folders below a cache folder that a kept build may go (torch's and Triton's go 2 or 3)


class TooDeep(Exception):
    """A tree deeper than KEEP_MAX_DEPTH: not kept."""


def _walk(top: Path):
    """os.walk's (folder, subfolders, files), links not followed, without recursion: TooDeep past KEEP_MAX_DEPTH.
    A caller may prune a folder's subfolders (clear the list) before the walk goes on."""
    stack = [(str(top), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        folders = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        yield folder, folders, [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        if folders and depth >= KEEP_MAX_DEPTH:
            raise TooDeep(folder)
        stack.extend((os.path.join(folder, name), depth + 1) for name in folders)


def _listing(views: dict) -> set:
    """(cache, path, size) of every file and folder (size 0, path ending in a separator) in the pool's caches."""
    out = set()
    for name, (_, host) in views.items():
        for d, folders, files in _walk(host):
            out |= {(name, os.path.relpath(os.path.join(d, f), host), os.lstat(os.path.join(d, f)).st_size)
                    for f in files}
            out |= {(name, os.path.relpath(os.path.join(d, f), host) + os.sep, 0) for f in folders}
    return out


def seed_builds(uid: int, key: Optional[str], views: dict) -> set:
    """Fills each of the pool's cache folders from the judge's cache and from what an earlier pool of the same
    source left (builds/<key>); returns what they then hold (keep_builds compares). The folders on the way to a
    cache folder are root's (the mount points made later below a covered folder must be), the folder the rank's."""
    base = run_folder(uid)
    _mark_used(key)
    if key:
        with contextlib.suppress(OSError):
            os.utime(BUILDS / key)  # used now: the last of the keys to be evicted (_evict_builds)
    for name, (_, host) in views.items():
        for parent in reversed(host.parents):
            if base in parent.parents and not parent.exists():
                parent.mkdir(mode=0o755)
        host.mkdir(mode=0o700, exist_ok=True)
        os.chown(host, uid, uid)
        judge = judge_cache(name)
        if judge and judge.is_dir():  # NOTES: the build step's too, not only a folder this process names (2026-11-28:
            _copy_builds(judge, host, uid)  # every clock round of a fresh machine built the handshake's probes again)
        if key and (BUILDS / key / CACHE_FOLDERS[name]).is_dir():
            _copy_builds(BUILDS / key / CACHE_FOLDERS[name], host, uid)
    try:
        return _listing(views)
    except TooDeep:  # the judge's own prebuilt cache (a file built there is trusted, not checked)
        return set()


# What a pool may leave for the next pool of its source: more is not kept (the next one builds again).
KEEP_MAX_BYTES, KEEP_MAX_FILES = 512 * 2**20, 20_000
# What builds/ may hold over every key (files and folders counted): a source changed by one comment per run is a new
# key each time, so past either the least recently used keys go.
KEEP_TOTAL_BYTES, KEEP_TOTAL_FILES = 2 * 2**30, 50_000


ENDED_TIMEOUT_S = 60.0  # a namespace's end takes well under a second; past this the pool closes without it
STALE_COPY_S = 3600  # a copy being made is minutes old at most; one older was left by a judge that was killed


# The build keys of the run under way (protect_builds), which no eviction takes: a clock run's entries are
# rivals, and what one keeps must not push out another's build (red team 39: three entries kept 19 950 files each,
# the cap over all keys evicted a fourth's build, which it built again inside its charged time and failed). Past the
# caps while a run lasts by at most its entries' own caps (KEEP_MAX_*); the next run's evictions take the rest.
_PROTECTED: Optional[set] = None


@contextlib.contextmanager
def protect_builds():
    """While it lasts, every key a pool of this process starts from or keeps stays in builds/."""
    global _PROTECTED
    outer = _PROTECTED
    _PROTECTED = set() if outer is None else outer
    try:
        yield
    finally:
        _PROTECTED = outer


def _mark_used(key: Optional[str]) -> None:
    if key and _PROTECTED is not None:
        _PROTECTED.add(key)


def _evict_builds() -> None:
    """Removes the least recently used keys of builds/ (a key's folder time: when a pool kept it or started from
    it) until what is left is within KEEP_TOTAL_BYTES and KEEP_TOTAL_FILES, sparing the run's (protect_builds)."""
    keys = []
    for folder in BUILDS.iterdir():
        if folder.name.startswith("."):  # a copy being made or retired; one a judge killed meanwhile left goes
            with contextlib.suppress(OSError):
                if time.time() - folder.stat().st_mtime > STALE_COPY_S:
                    remove_tree(folder)
            continue
        files = size = 0
        with contextlib.suppress(OSError, TooDeep):  # a key another pool retires meanwhile
            for dirpath, dirnames, filenames in _walk(folder):
                files += len(dirnames) + len(filenames)
                size += sum(os.lstat(os.path.join(dirpath, name)).st_size for name in filenames)
            keys.append((folder.stat().st_mtime_ns, folder, files, size))
    keys.sort(key=lambda k: k[0])
    files, size = sum(k[2] for k in keys), sum(k[3] for k in keys)
    for _, folder, key_files, key_size in keys:
        if files <= KEEP_TOTAL_FILES and size <= KEEP_TOTAL_BYTES:
            return
        if folder.name in (_PROTECTED or ()):
            continue
        retired = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=BUILDS))
        with contextlib.suppress(OSError):
            os.rename(folder, retired / folder.name)
        remove_tree(retired)
        files, size = files - key_files, size - key_size


def keep_builds(uid: int, key: Optional[str], seeded: set, views: dict) -> None:
    """Copies the ended pool's cache folders to builds/<key>, whole, in place of the one there (a new folder renamed
    into place: a pool starting meanwhile reads the old one or the new one); nothing when the ranks built nothing or
    beyond KEEP_MAX_BYTES or KEEP_MAX_FILES, and no folder whose way a rank swapped for a link (the run folder's own
    path has none). Then the least recently used keys go past the caps over all of them (_evict_builds)."""
    base = os.path.realpath(run_folder(uid))
    views = {name: (view, host) for name, (view, host) in views.items()
             if os.path.realpath(host) == os.path.join(base, os.path.relpath(host, run_folder(uid)))}
    try:
        listing = _listing(views)
    except TooDeep:
        return
    if not key or listing <= seeded:
        return
    if len(listing) > KEEP_MAX_FILES or sum(size for *_, size in listing) > KEEP_MAX_BYTES:
        return
    fresh = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=BUILDS))
    try:
        for name, (_, host) in views.items():
            _copy_builds(host, fresh / CACHE_FOLDERS[name], None)
    except (OSError, TooDeep):  # NOTES: a copy cut off goes whole (red team 18: a path too long for root's copy left
        remove_tree(fresh)  # 400 MiB a run in a dot folder no cap counted)
        return
    os.chmod(fresh, 0o755)
    retired = Path(tempfile.mkdtemp(prefix=f".{key}-old-", dir=BUILDS))
    with contextlib.suppress(FileNotFoundError):
        os.rename(BUILDS / key, retired / key)
    try:
        os.rename(fresh, BUILDS / key)
        os.utime(BUILDS / key)
    except OSError:  # another pool of the same key put its own there first
        remove_tree(fresh)
    remove_tree(retired)
    _evict_builds()


# --------------------------------------------------------------------------------------------------------------
# The rank's side: its mount namespace, then the uid drop.
# --------------------------------------------------------------------------------------------------------------

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on x86-64 and arm64
OPEN_TREE_CLONE, AT_RECURSIVE, MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 1, 0x8000, 4, -100
MOUNT_ATTR_RDONLY = 1
# Per-mount flags a read-only remount must repeat, or it clears them (mountinfo's names).
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048,
               "relatime": 1 << 21}


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _fail(what: str) -> None:
    raise OSError(ctypes.get_errno(), f"rank sandbox: {what}: {os.strerror(ctypes.get_errno())}")


def mount_table() -> list:
    """The fields of each line of /proc/self/mountinfo, the kernel's octal escapes in paths undone, a path of raw
    bytes kept as os.fsdecode keeps one (red team 47: read as strict UTF-8, one such mount failed every command)."""
    text = Path("/proc/self/mountinfo").read_bytes().decode("utf-8", "surrogateescape")
    return [[re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field) for field in line.split()]
            for line in text.splitlines()]


def mount_source(fields: list) -> tuple:
    """(file system type, source, its options) of a mount_table line: the fields after its separator."""
    return tuple((fields[fields.index("-") + 1:] + ["", "", ""])[:3])


def _make_read_only(libc, method: str) -> None:
    """Every mount of this mount namespace read-only: one recursive mount_setattr (Linux 5.12 on), or a read-only
    bind remount of each mount in mountinfo (a mount hidden below another stays as it was, and out of reach)."""
    if method == "mount_setattr":
        attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)):
            _fail("mount_setattr(/, read-only)")
        return
    for fields in mount_table():
        target = fields[4]
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for option in fields[5].split(","):
            flags |= _KEPT_FLAGS.get(option, 0)
        if libc.mount(None, os.fsencode(target), None, flags, None):
            _fail(f"remounting {target} read-only")


def read_only_method() -> str:
    """How this kernel lets a rank make its mounts read-only ("mount_setattr", "remount"), or "": each tried in a
    child of this (single-threaded) process, in a mount namespace of its own."""
    for method in ("mount_setattr", "remount"):
        child = os.fork()
        if child == 0:
            libc = _libc()
            code = 1
            with contextlib.suppress(Exception):
                if not libc.unshare(CLONE_NEWNS) and not libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None):
                    _make_read_only(libc, method)
                    code = 0
            os._exit(code)
        if os.waitpid(child, 0)[1] == 0:
            return method
    return ""


def _clone(libc, path: str) -> int:
    """A detached copy of the mounts at `path` (open_tree, Linux 5.2 on), with their flags of now."""
    fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
    if fd < 0:
        _fail(f"open_tree({path})")
    return fd


def _attach(libc, fd: int, target: str) -> None:
    if libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH):
        _fail(f"move_mount({target})")
    os.close(fd)


def _mount_point(path: str, is_dir: bool) -> None:
    """Makes the way to `path` below a covered folder, in the run folder that covers it: root's folders (one a rank
    made, or a link, in its place fails the rank instead of leading root's mounts elsewhere)."""
    top = next(folder for folder in COVERED if Path(folder) in Path(path).parents)
    here = Path(top)
    for part in Path(path).relative_to(top).parts:
        here = here / part
        last = here == Path(path)
        with contextlib.suppress(FileExistsError):
            if is_dir or not last:
                here.mkdir(mode=0o755)
            else:
                here.touch(mode=0o644, exist_ok=False)
        info = os.lstat(here)
        if info.st_uid != 0 or stat.S_ISLNK(info.st_mode):
            raise OSError(f"rank sandbox: {here} was made by a rank, not the judge")


def _put_back(libc, trees: dict) -> None:
    """Attaches each cloned tree at its own path, parents first: over itself, or, below a covered folder, at a
    mount point made in the run folder that covers it."""
    for path in sorted(trees, key=lambda p: len(Path(p).parts)):
        fd, is_dir = trees[path]
        if _below_covered(Path(path)):
            _mount_point(path, is_dir)
        _attach(libc, fd, path)


def _cover_scratch(libc, sandbox: RankSandbox) -> None:
    """/tmp, /var/tmp and /dev/shm become the run's own folders; every other mount read-only; the writable
    folders and what the ranks read below a covered folder put back at their paths."""
    writable = {path: (_clone(libc, path), True) for path in sandbox.writable}
    covers = [(folder, _clone(libc, run)) for folder, run in sandbox.covers]
    if sandbox.read_only:
        _make_read_only(libc, sandbox.read_only)
    kept = {path: (_clone(libc, path), os.path.isdir(path)) for path in sandbox.keep if path not in writable}
    for folder, fd in covers:
        _attach(libc, fd, folder)
    _put_back(libc, {**kept, **writable})


def _expose(libc, pairs: tuple) -> None:
    """Covers each folder others cannot search with an empty searchable one, holding only the named paths below it
    (moved there as detached copies of their mounts, on folders made for the way to them); a path below another
    named one comes with it."""
    by_folder: dict = {}
    for folder, below in pairs:
        by_folder.setdefault(folder, []).append(Path(below))
    for folder, paths in by_folder.items():
        paths = [p for p in paths if not any(other in p.parents for other in paths)]
        targets = [os.path.join(folder, p) for p in paths]
        trees = [(target, _clone(libc, target), os.path.isdir(target)) for target in targets]
        if libc.mount(b"tmpfs", os.fsencode(folder), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"):
            _fail(f"covering {folder}")
        for target, fd, is_dir in trees:
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            if is_dir:
                os.mkdir(target, 0o755)
            else:
                open(target, "w").close()
            _attach(libc, fd, target)


# The judge's covers over the RANK_WRITABLE folders (rank_writable.cover): empty read-only file systems of this name,
# in the judge's own mount namespace, which every rank's namespace lifts.
JUDGE_COVER = "a2a-judge-cover"


def judges_covers() -> list:
    """The mount points of the judge's covers this process sees, the last made first."""
    return [fields[4] for fields in mount_table() if mount_source(fields)[1] == JUDGE_COVER][::-1]


def _lift_judges_covers(libc) -> None:
    """The RANK_WRITABLE folders as they are, in this (a rank's) mount namespace: each of the judge's covers
    unmounted, the last made first (a protocol face under the human face covers again)."""
    for point in judges_covers():
        if libc.umount2(os.fsencode(point), MNT_DETACH):
            _fail(f"lifting the judge's cover of {point}")


def _own_terminals(libc) -> None:
    """/dev/pts as a devpts instance of the rank's own, at most RANK_PTYS terminals (/dev/ptmx opens the instance
    at /dev/pts beside it); where the kernel refuses one, no new terminal at all."""
    if not os.path.isdir("/dev/pts"):
        return
    options = f"newinstance,ptmxmode=0666,mode=0600,max={RANK_PTYS}".encode()
    if not libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, options):
        return
    for path in (b"/dev/ptmx", b"/dev/pts/ptmx"):
        if os.path.exists(path) and libc.mount(b"/dev/null", path, None, MS_BIND, None):
            _fail(f"closing {path.decode()}")


def enter_rank_sandbox(sandbox: Optional[RankSandbox]) -> None:
    """A worker's first act, before torch or a submission: a mount namespace in which the judge's covers are lifted
    and it writes only its run's folders and the RANK_WRITABLE ones (_cover_scratch), with its own /proc (only the
    ranks' PID namespace in sight), then the uid drop with no_new_privs. The ranks keep their GPU devices (device
    files are used, not written, on a read-only mount), the MPS pipe and what they must read."""
    if sandbox is None:
        return
    if sandbox.memory_group:  # while still root: the group's files are root's, and a rank cannot leave it
        try:
            Path(sandbox.memory_group, "cgroup.procs").write_text("0")
        except OSError as error:
            raise OSError(error.errno, f"rank sandbox: joining the pool's memory group {sandbox.memory_group}: "
                                       f"{error.strerror}") from None
    libc = _libc()
    if sandbox.private_proc:
        if libc.unshare(CLONE_NEWNS):
            _fail("unshare(CLONE_NEWNS)")
        if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None):
            _fail("making / private")
        _lift_judges_covers(libc)
        if sandbox.uid is not None:
            _cover_scratch(libc, sandbox)
        if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None):
            _fail("mounting /proc")
        _own_terminals(libc)
        _expose(libc, sandbox.expose)
        for path in sandbox.hide:  # NOTES: read-only is not hidden (red team 35: a rival entry's source, read by path)
            if os.path.isfile(path) and libc.mount(b"/dev/null", os.fsencode(path), None, MS_BIND, None):  # in sight
                _fail(f"hiding {path}")
        for path, copy in sandbox.shadow:  # the judge's readable copy over what the ranks' uid cannot read
            if libc.mount(os.fsencode(copy), os.fsencode(path), None, MS_BIND | MS_REC, None) or libc.mount(
                    None, os.fsencode(path), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None):
                _fail(f"showing {path}")
        if sandbox.shadow:
            os.chdir(os.getcwd())  # a working folder below one shown anew is the copy's now, not the folder beneath
    if sandbox.uid is not None:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            _fail("no_new_privs")
        for name, limit in RANK_LIMITS.items():
            resource.setrlimit(getattr(resource, name), (limit, limit))
        os.setgroups([])
        os.setgid(sandbox.uid)
        os.setuid(sandbox.uid)
        install_rank_filter(libc)
        os.umask(0o077)  # the ranks are one uid: nobody else needs their files
        os.environ.update(sandbox.env)
