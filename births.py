"""How a pool's rank workers are born. The runner's face spawns each (a fresh interpreter, its process model); the
judge's own faces fork them from a zygote per pool (zygote_loop): a root process born in the pool's namespaces,
which imports torch once and forks a worker at each of its owner's requests (Zygote, Forked). The clock's pools'
zygotes are forked in turn, torch imported, from the run's nursery (nursery_loop, Nursery), outside every pool.
What a worker and its owner share besides its pipe: its phase slot (PhaseSlot), the descriptors passed at its
birth (send_fds, receive_fds), and the environment it starts with (environment_with). Part of every staged bundle
(problems/all2all/task.yml)."""
from __future__ import annotations

import collections
import contextlib
import importlib
import math
import mmap
import multiprocessing
import multiprocessing.connection
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from boundary import CLONE_NEWPID, die_with_parent, hidden_from_ranks, kill_tree, process_stat, sealed_file


# Held while environment_with has os.environ changed, and while environ_with copies it: a thread that starts a
# process from a copy (the GPU suite's runs beside a group of 8) never takes a group's MPS and NCCL settings with it.
_ENVIRON_LOCK = threading.RLock()


@contextlib.contextmanager
def environment_with(extra: dict, ranks: bool = False):
    """os.environ with `extra` set, for the duration (what a spawned process starts with); `ranks`: a process of a
    pool's, so without what no rank starts with (boundary.hidden_from_ranks), which is then never in its memory."""
    with _ENVIRON_LOCK:
        drop = hidden_from_ranks(os.environ) if ranks else []
        before = {name: os.environ.get(name) for name in [*drop, *extra]}
        for name in drop:
            del os.environ[name]
        os.environ.update(extra)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def environ_with(extra: Optional[dict] = None, ranks: bool = False) -> dict:
    """A copy of os.environ with `extra` on top, for a child process (never a copy of another thread's
    environment_with); `ranks`: as environment_with's."""
    with _ENVIRON_LOCK:
        hidden = set(hidden_from_ranks(os.environ)) if ranks else set()
        return {**{name: value for name, value in os.environ.items() if name not in hidden}, **(extra or {})}


def send_fds(conn, fds: list) -> None:
    """`fds` to the process at the other end of `conn`, right after the last message (SCM_RIGHTS)."""
    from multiprocessing.reduction import sendfds

    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        sendfds(sock, fds)


def receive_fds(conn, count: int) -> list:
    """The descriptors sent right after the last message on `conn`."""
    from multiprocessing.reduction import recvfds

    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return recvfds(sock, count)


class PhaseSlot:
    """Where a worker stands (an index into PHASES): one int in a sealed file (boundary.sealed_file: the rank keeps a
    descriptor inside its mapping, and a shrunk file is SIGBUS in the owner's next read) that the owner makes and
    hands the worker with its pipes, mapped by both, whichever way the worker was born."""

    def __init__(self, fd: Optional[int] = None):
        self.fd = sealed_file(mmap.PAGESIZE, "a2a-phase") if fd is None else fd
        self._map = mmap.mmap(self.fd, mmap.PAGESIZE)

    @property
    def value(self) -> int:
        return self._map[0]

    @value.setter
    def value(self, index: int) -> None:
        self._map[0] = index


# A pool's zygote and its owner speak in fixed-size records, never pickles: (what, pid, exit code) from the zygote,
# (what, pid) to it. The fork request is followed by the new worker's four descriptors.
_BORN, _EXITED = 1, 2
_FORK, _REAP = 1, 2
_ZYGOTE_SAYS, _ZYGOTE_HEARS = struct.Struct("<3i"), struct.Struct("<2i")
ZYGOTE_PRELOAD = ("torch", "torch.distributed")  # what every rank imports first, imported once per pool
FORK_TIMEOUT_S = 300.0  # a first fork waits for the zygote's imports (a cold torch import on a loaded machine)


def zygote_loop(control, worker: Callable, parent_pid: int, sandbox: Any, bundle: Optional[str]) -> None:
    """A pool's zygote: born like a worker (the pool's namespaces and environment, root, no sandbox of its own yet),
    it imports torch once, without touching a GPU, then forks each of the pool's workers on its owner's request. A
    worker closes every descriptor but its own before anything else runs, so no rank can reach `control`;
    the ranks then drop to their uid, which cannot signal or trace this root process. An exit is told, its zombie
    kept until the owner has read it (so its pid is not reused while the owner may still signal it)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin_from_null()
    if os.getppid() not in (parent_pid, 0):
        os._exit(1)
    for name in ZYGOTE_PRELOAD:
        importlib.import_module(name)
    _serve(control, worker, sandbox, bundle)


def _wake_on_child_exit() -> int:
    """A descriptor that turns readable when a child of this process exits (SIGCHLD through the wake-up fd)."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_read


def _wait(control, wake_read: int) -> list:
    """What is ready of `control` and `wake_read` (drained), once either is."""
    ready = multiprocessing.connection.wait([control, wake_read])
    if wake_read in ready:
        with contextlib.suppress(BlockingIOError):
            os.read(wake_read, 4096)
    return ready


def _serve(control, worker: Callable, sandbox: Any, bundle: Optional[str]) -> None:
    """A zygote's loop, its imports done: forks a worker at each request, tells births and exits."""
    wake_read = _wake_on_child_exit()
    told: dict = {}  # pid -> whether its exit was told
    while True:
        ready = _wait(control, wake_read)
        for pid in [pid for pid, done in told.items() if not done]:
            exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if exited is not None:
                code = exited.si_status if exited.si_code == os.CLD_EXITED else -exited.si_status
                control.send_bytes(_ZYGOTE_SAYS.pack(_EXITED, pid, code))
                told[pid] = True
        if control not in ready:
            continue
        try:
            what, pid = _ZYGOTE_HEARS.unpack(control.recv_bytes(_ZYGOTE_HEARS.size))
        except (EOFError, OSError, struct.error):
            os._exit(0)  # its workers die with it (die_with_parent)
        if what == _REAP and told.get(pid):
            os.waitpid(pid, 0)
            del told[pid]
        elif what == _FORK:
            fds = receive_fds(control, 4)
            child = os.fork()
            if child == 0:
                try:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    control.close()  # the worker closes what else it inherited first thing
                    sys.modules["torch"].seed()  # a random state of its own, as a spawned worker's (red team 19)
                    worker(multiprocessing.connection.Connection(fds[0]), parent_pid=os.getppid(), sandbox=sandbox,
                           bundle=bundle, fds=fds[1:])
                finally:
                    os._exit(1)
            for fd in fds:
                os.close(fd)
            told[child] = False
            control.send_bytes(_ZYGOTE_SAYS.pack(_BORN, child, 0))


def nursery_loop(control) -> None:
    """The judge's nursery (Nursery): a root process outside every pool that imports ZYGOTE_PRELOAD once, then
    forks each pool's zygote into the pool's namespaces on its owner's request: its own PID namespace for children
    set to the pool's before the fork and back after, the child's network and IPC namespaces set by the child.
    The forked zygote keeps only its pipe and the standard streams, takes the pool's environment and serves
    (_serve). A zygote that exits is reaped at once: its zombie in the pool's PID namespace would keep the namespace
    from ending."""
    import ctypes

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin_from_null()
    for name in ZYGOTE_PRELOAD:
        importlib.import_module(name)
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/pid", os.O_RDONLY)
    wake_read = _wake_on_child_exit()
    while True:
        ready = _wait(control, wake_read)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if control not in ready:
            continue
        try:
            worker, sandbox, bundle, env, kinds = control.recv()
            fds = receive_fds(control, 1 + len(kinds))
        except (EOFError, OSError):
            os._exit(0)  # its zygotes die with it (die_with_parent)
        pipe, spaces = fds[0], dict(zip(kinds, fds[1:]))
        pid_space = spaces.pop(CLONE_NEWPID, None)
        child, error = -1, 0
        if pid_space is not None and libc.setns(pid_space, CLONE_NEWPID):
            error = ctypes.get_errno()
        else:
            child = os.fork()
            if child == 0:
                try:
                    if any(libc.setns(fd, kind) for kind, fd in spaces.items()):
                        os._exit(1)
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    close_all_but((0, 1, 2, pipe))
                    os.environ.clear()
                    os.environ.update(env)
                    die_with_parent()
                    _serve(multiprocessing.connection.Connection(pipe), worker, sandbox, bundle)
                finally:
                    os._exit(1)
            if pid_space is not None:
                libc.setns(own, CLONE_NEWPID)
        for fd in fds:
            os.close(fd)
        control.send_bytes(_ZYGOTE_SAYS.pack(_BORN if child > 0 else _EXITED, child, error))


class Nursery:
    """The owner's side of nursery_loop: one per clock run and pool environment (what the zygote imports may read
    it: ranks sharing GPUs load another NCCL through it). A pool's zygote forked from it starts with torch imported,
    where a spawned one imports it (about 3.5 s on an H200 machine, 1.2 s on this project's CPU machine)."""

    def __init__(self, spawn: Callable):
        """`spawn(target, args)` starts the nursery outside every pool, in the pools' environment."""
        self.conn, child_end = multiprocessing.get_context("spawn").Pipe()
        self.process = spawn(nursery_loop, (child_end,))
        child_end.close()

    def bear(self, pipe: int, worker: Callable, sandbox: Any, bundle: Optional[str], env: dict, spaces: dict) -> int:
        """A zygote forked into the namespaces `spaces` ({CLONE_NEW*: descriptor}), holding `pipe`; its pid."""
        self.conn.send((worker, sandbox, bundle, env, tuple(spaces)))
        send_fds(self.conn, [pipe, *spaces.values()])
        if not self.conn.poll(FORK_TIMEOUT_S):
            raise RuntimeError(f"the nursery forked no zygote within {FORK_TIMEOUT_S:g} s")
        what, pid, error = _ZYGOTE_SAYS.unpack(self.conn.recv_bytes(_ZYGOTE_SAYS.size))
        if what != _BORN:
            raise OSError(error, f"the nursery could not enter the pool's PID namespace: {os.strerror(error)}")
        return pid

    def close(self) -> None:
        self.conn.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            kill_tree(self.process.pid)
            join_within(self.process, KILLED_WAIT_S)


class _Nursed:
    """A zygote the nursery forked, with the face Zygote uses of a multiprocessing.Process. Its parent is the
    nursery, which reaps it at once: its end is seen, and it is signalled, through a pidfd, never by a pid that may
    be another process's by then. Its exit code is not known (-1)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.exitcode: Optional[int] = None
        try:
            self.fd: Optional[int] = os.pidfd_open(pid)
        except OSError:  # already gone
            self.fd, self.exitcode = None, -1

    def is_alive(self) -> bool:
        self.join(0)
        return self.exitcode is None

    def join(self, timeout: Optional[float] = None) -> None:
        if self.exitcode is None and select.select([self.fd], [], [], timeout)[0]:
            self.exitcode = -1
            os.close(self.fd)
            self.fd = None

    def kill(self) -> None:
        if self.exitcode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)


KILLED_WAIT_S = 10.0  # the most the owner waits for a killed worker's exit; past it the pool's end takes it


def join_within(process, timeout_s: float) -> bool:
    """Waits at most `timeout_s` for a pool's process to end, whatever its birth; whether it has. NOTES: a spawned
    worker's own join(timeout) may never return: its first act closes the pipe multiprocessing waits on
    (close_all_but), which then reads as its end, and Popen.wait goes on to a blocking waitpid (red team 28: the
    protocol face hung after `check: pass`). Its exit code is polled instead."""
    if not isinstance(process, multiprocessing.process.BaseProcess):
        process.join(timeout=timeout_s)
        return process.exitcode is not None
    deadline = time.monotonic() + timeout_s
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return process.exitcode is not None


def close_all_but(keep: tuple) -> None:
    """Closes every open descriptor of this process but `keep` (listed, not counted up to RLIMIT_NOFILE)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


def stdin_from_null() -> None:
    """fd 0 becomes /dev/null. NOTES: it was what the judge was started with, down every birth: the operator's
    terminal, past a rank's session of its own (red team 24: a rank read the operator's keys, left the terminal
    without echo, and ended a clock run with a SIGINT the terminal typed), or the rest of a script's input."""
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 0:
        os.dup2(null, 0)
        os.close(null)


RANK_BIRTH_ENV = "A2A_RANK_BIRTH"
RANK_BIRTHS = ("zygote", "spawn")


# A2A_PIN_CPUS=8,9,10,11: the clock's rank i of every pool on the i-th of these CPUs (all its threads, from its
# birth). An experiment (#49): whether the host speed each pool draws at its birth, the larger part of the rounds'
# spread (clock.spread), is where its ranks land. Unset, nothing is pinned.
PIN_CPUS_ENV = "A2A_PIN_CPUS"


def pinned_cpus() -> list:
    """The CPUs of A2A_PIN_CPUS (empty when unset); ValueError names one this process may not run on."""
    text = os.environ.get(PIN_CPUS_ENV, "").strip()
    if not text:
        return []
    allowed = os.sched_getaffinity(0)
    try:
        cpus = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{PIN_CPUS_ENV}={text!r}: expected CPU numbers, e.g. 8,9,10,11") from None
    if bad := [cpu for cpu in cpus if cpu not in allowed]:
        raise ValueError(f"{PIN_CPUS_ENV}={text!r}: CPU {bad[0]} is not among this process's "
                         f"({min(allowed)}-{max(allowed)})")
    return cpus


# A2A_PIN_OWNER_CPU=3: the clock's owner (the process whose clock ranks) on that CPU for each visit, its steps'
# spinning and copies with it. The other half of the experiment: in the step anatomy the owner's own phases and the
# rank's drew their speed apart (correlation 0.3-0.4 over a run's visits, 0.95 within each side: b04a593).
OWNER_CPU_ENV = "A2A_PIN_OWNER_CPU"


def owner_cpu() -> Optional[int]:
    """The CPU of A2A_PIN_OWNER_CPU (None when unset); ValueError names one this process may not run on, or one
    A2A_PIN_CPUS gives a rank as well."""
    text = os.environ.get(OWNER_CPU_ENV, "").strip()
    if not text:
        return None
    allowed = os.sched_getaffinity(0)
    try:
        cpu = int(text)
    except ValueError:
        raise ValueError(f"{OWNER_CPU_ENV}={text!r}: expected one CPU number, e.g. 3") from None
    if cpu not in allowed:
        raise ValueError(f"{OWNER_CPU_ENV}={text!r}: CPU {cpu} is not among this process's "
                         f"({min(allowed)}-{max(allowed)})")
    if cpu in pinned_cpus():
        raise ValueError(f"{OWNER_CPU_ENV}={text!r}: {PIN_CPUS_ENV} gives CPU {cpu} to a rank")
    return cpu


@contextlib.contextmanager
def on_cpu(cpu: int):
    """This thread on `cpu` for the block (Linux affinity is a thread's), then back where it could run before."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def rank_birth(runner_face: bool = False) -> str:
    """How a pool's workers are born: the runner's face spawns each one (its process model); the judge's own faces
    fork them from a zygote per pool (one torch import a pool, not one a worker), unless A2A_RANK_BIRTH=spawn."""
    if runner_face:
        return "spawn"
    birth = os.environ.get(RANK_BIRTH_ENV) or "zygote"
    if birth not in RANK_BIRTHS:
        raise ValueError(f"{RANK_BIRTH_ENV}={birth!r}: must be one of {', '.join(RANK_BIRTHS)}")
    return birth


def _outer_pid(parent: int, inner: int, known: set) -> int:
    """The pid, as this process sees it, of `parent`'s child whose pid in its own namespace is `inner`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in known:
            continue
        try:
            if int(process_stat(int(entry))[1]) != parent:
                continue
            status = Path(f"/proc/{entry}/status").read_bytes().decode("utf-8", "replace")  # a name is any bytes
        except (OSError, IndexError, ValueError):
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), None)
        if nspid is None or int(nspid[-1]) == inner:
            return int(entry)
    raise RuntimeError(f"the pool's zygote forked a worker (pid {inner} in the ranks' namespace) that is not there")


class Forked:
    """A worker its pool's zygote forks, with the face RankPool uses of a multiprocessing.Process: `pid` (as this
    process sees it; asking waits for the birth), `exitcode`, `is_alive()`, `join()`."""

    def __init__(self, zygote: "Zygote"):
        self.zygote = zygote
        self.inner_pid: Optional[int] = None  # in the ranks' PID namespace
        self.outer_pid: Optional[int] = None
        self.exitcode: Optional[int] = None

    @property
    def pid(self) -> int:
        deadline = time.monotonic() + FORK_TIMEOUT_S
        while self.outer_pid is None and not self.zygote.ended and time.monotonic() < deadline:
            self.zygote.hear(0.1)
        if self.outer_pid is None:
            raise RuntimeError(f"the pool's zygote ended (exit code {self.zygote.process.exitcode}) before it forked "
                               "a worker" if self.zygote.ended else
                               f"the pool's zygote did not fork a worker within {FORK_TIMEOUT_S:g} s")
        return self.outer_pid

    def is_alive(self) -> bool:
        self.zygote.hear(0)
        return self.exitcode is None

    def join(self, timeout: Optional[float] = None) -> None:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while self.exitcode is None and time.monotonic() < deadline:
            self.zygote.hear(min(0.5, max(0.0, deadline - time.monotonic())))
        if self.exitcode is not None:
            self.zygote.reap(self)


class Zygote:
    """The owner's side of a pool's zygote (zygote_loop), which forks the pool's workers in the order asked and
    tells their exits. What it says is read as fixed-size records. A zygote that ends takes its workers with it
    (die_with_parent): each is then read as killed."""

    def __init__(self, spawn: Callable, worker: Callable, nursery: Optional[Nursery] = None, born: tuple = ()):
        """`spawn(target, args)` starts the zygote where the pool's workers are born; `worker` is what each forked
        worker runs (eval._worker_loop). With a `nursery`, the zygote is forked from it instead, `born` being the
        rest of Nursery.bear's arguments (the ranks' sandbox, the bundle, the environment, the namespaces)."""
        self.conn, child_end = multiprocessing.get_context("spawn").Pipe()
        try:
            self.process = (spawn(zygote_loop, (child_end, worker)) if nursery is None
                            else _Nursed(nursery.bear(child_end.fileno(), worker, *born)))
        finally:
            child_end.close()
        self.unborn: collections.deque = collections.deque()
        self.children: dict = {}  # inner pid -> Forked
        self.ended = False

    def fork(self, fds: list) -> Forked:
        """A worker to be born holding `fds` (its pipe's end, stdout, stderr, phase slot); the request returns at
        once, so the owner goes on while the zygote still imports."""
        self.conn.send_bytes(_ZYGOTE_HEARS.pack(_FORK, 0))
        send_fds(self.conn, fds)
        child = Forked(self)
        self.unborn.append(child)
        return child

    def hear(self, timeout: float) -> None:
        """Reads what the zygote told within `timeout` (then without waiting): births and exits."""
        while not self.ended:
            try:
                if not self.conn.poll(timeout):
                    return
                what, pid, code = _ZYGOTE_SAYS.unpack(self.conn.recv_bytes(_ZYGOTE_SAYS.size))
            except (EOFError, OSError, struct.error):
                self._end_all()
                return
            timeout = 0
            if what == _BORN and self.unborn:
                child = self.unborn[0]
                child.inner_pid = pid
                try:
                    child.outer_pid = _outer_pid(self.process.pid, pid, {c.outer_pid for c in self.children.values()})
                except RuntimeError:
                    # NOTES: a worker's entry stays (a zombie until its owner asks the reap) while its zygote lives;
                    # one gone means the zygote's namespace ended meanwhile (red team 61: the guardian's end of a
                    # pool past its share of the file table read as the judge's own error, 114)
                    self.process.join(timeout=KILLED_WAIT_S)
                    if self.process.is_alive():
                        raise
                    self._end_all()
                    return
                self.children[pid] = self.unborn.popleft()
            elif what == _EXITED and pid in self.children:
                self.children[pid].exitcode = code

    def reap(self, child: Forked) -> None:
        if self.children.pop(child.inner_pid, None) is not None and not self.ended:
            with contextlib.suppress(OSError):
                self.conn.send_bytes(_ZYGOTE_HEARS.pack(_REAP, child.inner_pid))

    def _end_all(self) -> None:
        self.ended = True
        for child in [*self.children.values(), *self.unborn]:
            if child.exitcode is None:
                child.exitcode = -signal.SIGKILL  # die_with_parent
        self.process.join(timeout=5)

    def close(self, kill: bool = False) -> None:
        """Ends the zygote: at once (`kill`), else it exits at its pipe's end."""
        if kill and self.process.is_alive():
            kill_tree(self.process.pid)
        self.conn.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            kill_tree(self.process.pid)
            join_within(self.process, KILLED_WAIT_S)
        self._end_all()
