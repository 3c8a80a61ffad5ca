"""The boundary the kernel holds between the judge and a submission's ranks: process trees that end with their
owner, the ranks' PID and mount namespaces, their unprivileged uid, and what they leave behind.

Part of every staged bundle (task.yml lists it): eval.py's rank pool starts its workers through it. It imports
nothing of the harness and no torch. What it holds and what it does not: docs/judge.md, "The threat model".
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

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


def process_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ... start time at 19); OSError if gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


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


def _gone(pid, start: str) -> bool:
    """Whether the process a mark names has ended (its pid is free, or another process's now)."""
    return _start_time(int(pid)) != start


def claim_run(inherit: bool = False) -> None:
    """First ends what earlier runs left behind (sweep_orphans), then marks this command as the owner of every
    process it will start. `inherit`: keep an owner already named (the protocol face under the human face, which
    ends it on its way out)."""
    sweep_orphans()
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


def _remove_orphan_tempdirs() -> None:
    for folder in Path(tempfile.gettempdir()).glob("a2a-*"):
        with contextlib.suppress(OSError, ValueError):
            if _gone(*(folder / TEMP_OWNER_MARK).read_text().split(":")):
                shutil.rmtree(folder, ignore_errors=True)


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
        matched = re.search(rb"(?:^|\0)" + RUN_OWNER.encode() + rb"=(\d+):(\d+)", environ)
        if not matched or not _gone(matched[1], matched[2].decode()):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def other_processes():
    """(pid, environment as bytes) of every other process this one may read, from /proc (the one scan that finds
    processes by what their environment carries: the orphan sweep, the tests' leftover checks)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                yield int(entry), Path(f"/proc/{entry}/environ").read_bytes()
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
# sight), as an unprivileged uid with no_new_privs (so the kernel refuses them ptrace, /proc/<pid>/mem, pidfd_getfd
# and signals to every harness process). Whatever a machine cannot do is said in the run's header (Guards).
# --------------------------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
# One uid per live pool owner (pids are unique among live processes), so two runs never share files or an MPS
# server, and what a run's ranks left in the shared temporary folders can be found by owner.
RANK_UID_BASE, RANK_UID_SPAN = 60000, 5000
# Folders every user may write and that outlive a process: what the ranks left there is removed with the run.
SHARED_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
# Extension and Triton caches the ranks can write as their uid, kept between runs (A2A_RANK_CACHE moves it).
RANK_CACHE = Path(os.environ.get("A2A_RANK_CACHE", "/var/tmp/a2a-rank-cache"))
# The caches a sandboxed rank uses unless its caller named its own (prepare_rank_cache makes them).
RANK_CACHE_ENV = {"TORCH_EXTENSIONS_DIR": str(RANK_CACHE / "torch_extensions"),
                  "TRITON_CACHE_DIR": str(RANK_CACHE / "triton")}
# The namespace's guardian and its init. The guardian, a tiny process outside the namespace, forks the init into
# it, says its pid, then waits for its owner's pipe to close (the owner is done, or was killed: SIGKILL included);
# then it kills the init (the kernel ends everything in the namespace with it) and, unless the owner said "keep",
# removes what the ranks' uid left in the shared temporary folders. Signals to the run's process group leave it.
_NAMESPACE_INIT = r"""
import ctypes, os, signal, sys
owner, here, uid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
for name in ("SIGINT", "SIGTERM", "SIGHUP"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
if os.getppid() != owner or libc.unshare(0x20000000):
    print("error", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
child = os.fork()
if child == 0:
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()
print(child, flush=True)
told = sys.stdin.read()
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
if "keep" not in told:
    sys.path.insert(0, here)
    import boundary
    boundary.release_uid(uid)
"""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class RankSandbox:
    """What a rank does to itself at start, before it imports torch or a submission (sent to every worker).
    `expose`: (folder, entry) pairs: in the rank's mount namespace the folder, which other users cannot search (a
    home like /root), is covered by an empty one holding only the entry the ranks need (the interpreter, the
    bundle), so the rest of it stays out of their sight too."""
    private_proc: bool
    uid: Optional[int]
    home: str
    expose: tuple = ()


@dataclasses.dataclass
class Guards:
    """Which of the kernel's guards a pool's ranks run under, and why any is off."""
    pid_namespace: bool = False
    private_proc: bool = False
    uid: Optional[int] = None
    off: list = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        if self.pid_namespace and self.private_proc and self.uid is not None:
            return f"ranks in their own PID namespace and /proc, as uid {self.uid} with no_new_privs"
        return "guards off: " + "; ".join(self.off)


def _ended(pid: int) -> bool:
    """Whether `pid` has exited: gone, or a zombie its parent has not reaped."""
    try:
        return process_stat(pid)[0] == "Z"
    except OSError:
        return True


def _ns_inode(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


class Sandbox:
    """The pool owner's side of the boundary: the PID namespace (its init, and the owner's children spawned into
    it), the ranks' uid and what they left behind. Without root, or without the kernel's namespaces, it turns the
    guard off and says why; the process-tree clean-up (subreaper, RUN_OWNER sweep) still applies. `reach`: paths the
    ranks must read besides the interpreter, the harness and this process's import path (a staged bundle)."""

    def __init__(self, enabled: bool = True, reach: tuple = ()):
        self.guards = Guards()
        self.parent: Optional[Any] = None
        self.init_pid: Optional[int] = None
        self.inode: Optional[int] = None
        self._theirs = self._own = None
        self.started_ns = time.time_ns()
        if not enabled:
            self.guards.off.append("the sandbox was turned off (A2A_SANDBOX=0)")
            return
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            self.guards.off.append("not started as root: the ranks run as this user, in this PID namespace, and can "
                                   "reach this user's processes")
            return
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != RUN_OWNER}  # no orphan sweep may end it mid-clean
        self.parent = subprocess.Popen([sys.executable, "-c", _NAMESPACE_INIT, str(os.getpid()), str(HERE),
                                        str(RANK_UID_BASE + os.getpid() % RANK_UID_SPAN)],
                                       stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env,
                                       start_new_session=True)  # a kill of the run's process group spares it
        answer = self.parent.stdout.readline().split()
        if not answer or answer[0] == "error":
            self.guards.off.append(f"the kernel refused a PID namespace ({' '.join(answer[1:]) or 'no answer'})")
            self.close()
            return
        self.init_pid = int(answer[0])
        self.inode = _ns_inode(self.init_pid)
        self._theirs = os.open(f"/proc/{self.init_pid}/ns/pid", os.O_RDONLY)
        self._own = os.open("/proc/self/ns/pid", os.O_RDONLY)
        self.guards.pid_namespace = self.guards.private_proc = True
        self.expose: tuple = ()
        prepare_rank_cache()
        for name in RANK_CACHE_ENV:  # caches a caller named: the ranks must write them
            if os.environ.get(name) and not rank_writable(Path(os.environ[name])):
                self.guards.off.append(f"the ranks keep this user's uid: {name}={os.environ[name]} cannot be made "
                                       "writable for another uid")
                return
        needed = [Path(sys.executable), Path(os.__file__).parent, HERE, Path.cwd(), RANK_CACHE, *map(Path, sys.path),
                  *map(Path, reach),
                  *(Path(os.environ[n]) for n in RANK_CACHE_ENV if os.environ.get(n))]
        pairs, unreachable = exposure([p for p in needed if str(p) and p.exists()])
        if unreachable:
            self.guards.off.append(f"the ranks keep this user's uid: {unreachable} is not readable by other users")
            return
        self.expose = tuple(pairs)
        self.guards.uid = RANK_UID_BASE + os.getpid() % RANK_UID_SPAN  # the guardian's, given when it started
        _record_uid(self.guards.uid, self.started_ns)

    def rank_setup(self) -> RankSandbox:
        return RankSandbox(private_proc=self.guards.private_proc, uid=self.guards.uid,
                           home=str(RANK_CACHE / "home"), expose=getattr(self, "expose", ()))

    @contextlib.contextmanager
    def spawning(self):
        """Processes this thread starts inside the block are born in the ranks' PID namespace."""
        if self._theirs is None:
            yield
            return
        libc = _libc()
        if libc.setns(self._theirs, CLONE_NEWPID):
            raise OSError(ctypes.get_errno(), "setns into the ranks' PID namespace failed")
        try:
            yield
        finally:
            libc.setns(self._own, CLONE_NEWPID)

    def members(self) -> list[int]:
        """Every process in the ranks' namespace but its init and the ended ones (pids as this process sees them). A
        zombie, a rank's child that the rank never reaps, has already released all it held (the rendezvous port
        too): waiting for it to go would wait out every deadline below."""
        if self.inode is None:
            return []
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != self.init_pid
                and _ns_inode(int(e)) == self.inode and not _ended(int(e))]

    def sweep(self, keep: set) -> list[int]:
        """SIGKILLs what the submission started in the namespace (everything but `keep`, the live workers): between
        cases, so nothing a case left (a child holding the rendezvous port, a daemon) reaches the next."""
        killed = []
        for pid in self.members():
            if pid not in keep:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        deadline = time.monotonic() + 5  # gone, not only signalled: a dying child may still hold the port
        while killed and set(self.members()) - set(keep) and time.monotonic() < deadline:
            time.sleep(0.005)
        return killed

    def close(self, clean_files: bool = True) -> None:
        """Ends the namespace (the kernel kills every process in it with its init) and, with `clean_files`, removes
        what the ranks' uid left in the shared temporary folders (a caller with many pools does it once, last)."""
        if self.parent is not None:
            with contextlib.suppress(OSError):  # the guardian ends the namespace, and cleans unless told to keep
                self.parent.stdin.write("clean" if clean_files and self.guards.uid is not None else "keep")
                self.parent.stdin.close()
            try:
                self.parent.wait(timeout=60)
            except Exception:
                self.parent.kill()
                self.parent.wait()
            self.parent = None
        deadline = time.monotonic() + 5
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.01)
        for fd in (self._theirs, self._own):
            if fd is not None:
                os.close(fd)
        self._theirs = self._own = None
        self.inode = None


def exposure(paths: list) -> tuple[list, Optional[str]]:
    """What makes every path reachable by another uid in a rank's mount namespace: (folder, entry) pairs, one per
    folder that others cannot search, naming the entry below it on the way to a path; and the first path that
    stays out of reach (a second such folder deeper down, an entry itself unreadable), or None."""
    pairs: set = set()
    for path in paths:
        path = Path(path).resolve()
        chain = list(reversed(path.parents)) + [path]
        blocked = None
        for above, below in zip(chain, chain[1:]):
            mode = os.stat(above).st_mode
            if not mode & stat.S_IXOTH:
                if blocked is not None:
                    return [], str(path)
                blocked = (str(above), below.name)
        mode = os.stat(path).st_mode
        if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
            return [], str(path)
        if blocked:
            pairs.add(blocked)
    return sorted(pairs), None


def rank_writable(folder: Path) -> bool:
    """Makes `folder` writable for every uid (sticky, like /tmp); False when a folder above it keeps others out."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.stat(folder).st_mode & 0o7777 != 0o1777:
            os.chmod(folder, 0o1777)
    except OSError:
        return False
    return not exposure([folder])[1]


def prepare_rank_cache() -> dict:
    """The ranks' caches and home, writable by every run's rank uid (ranks create files with umask 0); returns the
    cache variables a sandboxed rank gets unless its caller named its own (the builds they find there)."""
    for sub in ("home", "torch_extensions", "triton"):
        folder = RANK_CACHE / sub
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o1777)
    with contextlib.suppress(OSError):
        os.chmod(RANK_CACHE, 0o755)
    return dict(RANK_CACHE_ENV)


UID_RECORDS = RANK_CACHE / "owners"  # uid -> the command that ran ranks as it, and since when (release_uid)


def _record_uid(uid: int, since_ns: int) -> None:
    """Notes which command runs ranks as `uid`, so that the next command cleans up after one that was killed before
    it could (sweep_orphans)."""
    UID_RECORDS.mkdir(parents=True, exist_ok=True)
    record = UID_RECORDS / str(uid)
    if not record.exists():
        record.write_text(f"{_own_mark()}:{since_ns}")


def release_uid(uid: int) -> list[str]:
    """Removes what ranks running as `uid` left in the shared temporary folders, then the uid's record."""
    record = UID_RECORDS / str(uid)
    try:
        since_ns = int(record.read_text().split(":")[2])
    except (OSError, IndexError, ValueError):
        return []
    removed = remove_owned_by(uid, since_ns)
    with contextlib.suppress(OSError):
        record.unlink()
    return removed


def _release_stale_uids() -> None:
    """Cleans up after every command whose ranks' uid is recorded and which is gone (killed before its own
    clean-up)."""
    if not UID_RECORDS.is_dir():
        return
    for record in UID_RECORDS.iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid, start, _ = record.read_text().split(":")
            if _gone(pid, start):
                release_uid(int(record.name))


def remove_owned_by(uid: int, since_ns: int) -> list[str]:
    """Removes what `uid` made in the shared temporary folders since `since_ns` (its own caches excepted)."""
    import shutil

    removed = []
    for top in SHARED_SCRATCH:
        for dirpath, dirnames, filenames in os.walk(top, topdown=True):
            if Path(dirpath) == RANK_CACHE.parent:  # the caches and the records stay
                dirnames[:] = [d for d in dirnames if Path(dirpath, d) != RANK_CACHE]
            for name in list(dirnames) + filenames:
                path = os.path.join(dirpath, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if info.st_uid == uid and info.st_ctime_ns >= since_ns - 10**9:
                    if stat.S_ISDIR(info.st_mode):
                        shutil.rmtree(path, ignore_errors=True)
                        dirnames.remove(name)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(path)
                    removed.append(path)
    return removed


SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the same on x86-64 and arm64
OPEN_TREE_CLONE, AT_RECURSIVE, MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 1, 0x8000, 4, -100


def _expose(libc, pairs: tuple, check) -> None:
    """Covers each folder others cannot search with an empty searchable one, holding only the named entries (moved
    there as detached copies of their mounts: open_tree and move_mount, Linux 5.2 on)."""
    libc.syscall.restype = ctypes.c_long
    by_folder: dict = {}
    for folder, entry in pairs:
        by_folder.setdefault(folder, []).append(entry)
    for folder, entries in by_folder.items():
        trees = []
        for entry in entries:
            source = os.path.join(folder, entry)
            fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
            check(0 if fd >= 0 else 1, f"open_tree({source})")
            trees.append((entry, fd, os.path.isdir(source)))
        check(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"),
              f"covering {folder}")
        for entry, fd, is_dir in trees:
            target = os.path.join(folder, entry)
            if is_dir:
                os.mkdir(target, 0o755)
            else:
                open(target, "w").close()
            check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
                  f"move_mount({target})")
            os.close(fd)


def enter_rank_sandbox(sandbox: Optional[RankSandbox]) -> None:
    """A worker's first act, before torch or a submission: a mount namespace with its own /proc (only the ranks'
    PID namespace in sight), then the uid drop with no_new_privs. The ranks keep their GPU devices (world-usable
    device files), the caches (RANK_CACHE) and the MPS pipe."""
    if sandbox is None:
        return
    libc = _libc()

    def check(code: int, what: str) -> None:
        if code:
            raise OSError(ctypes.get_errno(), f"rank sandbox: {what}: {os.strerror(ctypes.get_errno())}")

    if sandbox.private_proc:
        check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
        check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mounting /proc")
        _expose(libc, sandbox.expose, check)
    if sandbox.uid is not None:
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        os.setgroups([])
        os.setgid(sandbox.uid)
        os.setuid(sandbox.uid)
        os.umask(0)
        os.environ.update(HOME=sandbox.home, USER=f"a2a-rank-{sandbox.uid}", LOGNAME=f"a2a-rank-{sandbox.uid}")
        for name, folder in RANK_CACHE_ENV.items():
            os.environ.setdefault(name, folder)


