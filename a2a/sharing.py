"""More ranks than GPUs: where each rank runs, CUDA MPS to share a GPU, and an NCCL that allows it.

The problem is posed at 8 ranks and most machines here have fewer GPUs. When a run's world size exceeds the GPU
count G, rank r runs on cuda:(r mod G) (eval.rank_device), and the ranks of one GPU share it through CUDA MPS:
their kernels run side by side, each rank limited to an SM share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) small enough
that every rank's grid is resident at once. Without that, kernels that spin on flags raised by another rank's
kernel wait for a time slice that never comes. NCCL stays the process group: from 2.30 it accepts several ranks on
one GPU when NCCL_MULTI_RANK_GPU_ENABLE=1 is set.

What sharing proves and what it cannot (docs/sharing.md, "World size 8 on fewer GPUs"): the algorithm at 8 ranks and the
runner's process model except the device binding; never a timing, the interconnect's ordering or AMD's caching.

- `Placement`: world size over GPUs, the SM share, the words every header and folder name uses.
- `shared_ranks(placement)`: a context that holds an MPS control daemon (one already running, or its own, stopped
  at the end by a guardian process that outlives even a SIGKILL of this one) and yields the environment the rank
  processes need.
- `nccl_for_sharing()`: the NCCL library the ranks load (torch's own when it is 2.30 or later, else one built or
  named), checked by asking the library itself.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import eval as core
import wire
from boundary import MPS_SHM_ENV
from eval import UserError

MPS_CONTROL = "nvidia-cuda-mps-control"
NCCL_MULTI_RANK = (2, 30, 0)  # the first NCCL with NCCL_MULTI_RANK_GPU_ENABLE
# Where `make nccl` puts the NCCL it builds (a user can name another with A2A_NCCL_LIB).
BUILT_NCCL = core.HERE / "build" / "nccl" / "lib" / "libnccl.so.2"
# Where obtain_nccl puts the nvidia-nccl wheel when a package registry answers (its library preloaded, as a built one).
WHEEL_DIR = core.HERE / "build" / "nccl-wheel"
WHEEL_NCCL = WHEEL_DIR / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
# Each rank's share of a GPU it shares (WORKLOG, "World size 8 on one GPU" and "the SM share, third part"): together
# the ranks of one GPU hold SHARED_SM_FRACTION of it, and no rank gets less than MIN_SM_PERCENT. MPS's share is a cap,
# not a partition (this driver's MPS has no static partitioning), so a rank's blocks can wait behind other ranks'
# spinning blocks; the larger the share, the more often: 4 ranks at 25% (32 of 132 SMs each) left v5 and v6 waiting
# on flags, 18% was clean; among 8 ranks the pressure run (20 calls of a 256-token case) gave v4-v6 give-ups in 5 of
# 10 runs at 12% (14 SMs), 2 of 15 at 10% (12 SMs), 0 of 9 at 8% (10 SMs), where v6's official tests and v1's
# leaderboard mode also passed. Below that, NCCL's own kernels hung before its channels were capped.
SHARED_SM_FRACTION = 0.64
MIN_SM_PERCENT = 8
STOP_TIMEOUT_S = 15.0
LOG_TAIL_BYTES = 1 << 16  # of each MPS log read for its last lines


@dataclasses.dataclass(frozen=True)
class Placement:
    """How a run's ranks sit on this machine's GPUs. `gpus` 0: a CPU (gloo) run. `sm_percent`: each rank's share
    of its GPU when shared (A2A_SM_PERCENT overrides the default, for measuring it)."""
    world_size: int
    gpus: int
    sm_percent: Optional[int] = None

    @property
    def shared(self) -> bool:
        return 0 < self.gpus < self.world_size

    @property
    def gpus_used(self) -> int:
        return min(self.gpus, self.world_size)

    @property
    def ranks_per_gpu(self) -> int:
        return math.ceil(self.world_size / self.gpus_used) if self.gpus else 0

    def device_index(self, rank: int) -> int:
        return rank % self.gpus_used

    def describe(self) -> str:
        """`8 ranks on 1 GPU, shared through MPS (9% of its SMs each)`, `2 ranks on 2 GPUs, one each`, ..."""
        ranks = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        if not self.gpus:
            return f"{ranks} on the CPU (gloo)"
        gpus = f"{self.gpus_used} GPU{'s' if self.gpus_used != 1 else ''}"
        if not self.shared:
            return f"{ranks} on {gpus}, one each"
        return f"{ranks} on {gpus}, shared through MPS ({self.sm_percent}% of its SMs each)"

    def slug(self) -> str:
        """What folder names carry: `ws8`, or `ws8-on-1gpu` when the ranks share GPUs."""
        return f"ws{self.world_size}" + (f"-on-{self.gpus_used}gpu" if self.shared else "")


def sm_share_percent(ranks_per_gpu: int, fraction: float = SHARED_SM_FRACTION) -> int:
    """Each rank's share of a GPU it shares with `ranks_per_gpu - 1` others, in whole percent: `fraction` of the GPU
    over its ranks, raised to MIN_SM_PERCENT where that still fits the GPU (up to 8 ranks), never more than a fair
    split (more than 8 ranks per GPU is untried)."""
    share = max(math.floor(100 * fraction / ranks_per_gpu), MIN_SM_PERCENT)
    return max(1, min(share, math.floor(100 / ranks_per_gpu)))


def nccl_channels(sms_per_rank: int) -> int:
    """NCCL_MAX_NCHANNELS for ranks sharing a GPU: a power of two (NCCL rounds its peer-to-peer channels up to one)
    at most half the SMs a rank sees, so that every block of each rank's NCCL kernel can be resident at once; blocks
    of one rank wait on the same channel's blocks of the others. Untuned NCCL sizes its channels for a whole GPU."""
    return 1 << max(0, (max(1, sms_per_rank // 2)).bit_length() - 1)


def placement(world_size: int, gpus: int, backend: str) -> Placement:
    """The placement of a run; A2A_SM_PERCENT (1-100) replaces the measured SM share of shared ranks."""
    if backend == "gloo" or not gpus:
        return Placement(world_size, 0)
    if world_size <= gpus:
        return Placement(world_size, gpus)
    forced = os.environ.get("A2A_SM_PERCENT", "").strip()
    if forced:
        if not re.fullmatch(r"[0-9]{1,3}", forced) or not 1 <= int(forced) <= 100:  # isdigit takes '²', int not
            raise UserError(f"A2A_SM_PERCENT must be a whole percent from 1 to 100, not '{forced[:40]}'")
        percent = int(forced)
        ranks = Placement(world_size, gpus).ranks_per_gpu
        if percent * ranks > 100:
            raise UserError(f"A2A_SM_PERCENT={percent} gives {ranks} ranks {percent * ranks}% of one GPU: at most "
                            f"{100 // ranks}% each (8 ranks at 15% each failed with illegal memory accesses)")
    else:
        percent = sm_share_percent(Placement(world_size, gpus).ranks_per_gpu)
    return Placement(world_size, gpus, percent)


# --------------------------------------------------------------------------------------------------------------
# NCCL: several ranks on one GPU need 2.30 or later
# --------------------------------------------------------------------------------------------------------------

_VERSION_CHILD = ("import ctypes, sys\n"
                  "lib = ctypes.CDLL(sys.argv[1])\n"
                  "code = ctypes.c_int()\n"
                  "sys.exit(3) if lib.ncclGetVersion(ctypes.byref(code)) else print(code.value)\n")


class NcclSilent(UserError):
    """A library file is there but did not answer ncclGetVersion: fetching another would not say why."""


_VERSIONS: dict = {}  # library path -> the version it reported (the plan and every shared run of a command ask)


def nccl_version_of(path: Path) -> Optional[tuple]:
    """The version an NCCL library file reports, or None (nccl_for_sharing says why)."""
    return _asked_version(path)[0]


def _asked_version(path: Path) -> tuple:
    """(version, "") or (None, why), asked with ncclGetVersion in a child process so that this one never loads the
    library (torch would then bind to whichever copy came first). An answer is kept for the process; a failure is
    not, so that one slow start does not stand for the rest of a run (seen once: a library that had answered all
    session failed one ask, and the suite skipped every run of 8 ranks)."""
    if path in _VERSIONS:
        return _VERSIONS[path], ""
    try:
        done = subprocess.run([sys.executable, "-c", _VERSION_CHILD, str(path)], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as failed:
        return None, f"{type(failed).__name__}: {failed}"
    if done.returncode or not done.stdout.strip().isdigit():
        said = (done.stderr.strip().splitlines() or [done.stdout.strip() or "nothing said"])[-1][:160]
        return None, f"exit {done.returncode}: {said}"
    _VERSIONS[path] = core.nccl_version_tuple(int(done.stdout))
    return _VERSIONS[path], ""


def torch_nccl_library() -> Optional[Path]:
    """The libnccl.so.2 of the nvidia-nccl wheel torch's CUDA build loads (its RPATH points into site-packages)."""
    for entry in sys.path:
        candidate = Path(entry or ".") / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        if candidate.is_file():
            return candidate.resolve()
    return None


@dataclasses.dataclass(frozen=True)
class Nccl:
    version: tuple
    path: Path
    preload: bool  # the ranks load it with LD_PRELOAD (torch's own is older)


def nccl_for_sharing() -> Nccl:
    """The NCCL that lets several ranks share a GPU: torch's own if it is new enough, else A2A_NCCL_LIB or what
    `make nccl` built. UserError (one line, how to get one) when there is none."""
    own = torch_nccl_library()
    own_version = nccl_version_of(own) if own else None
    if own_version and own_version >= NCCL_MULTI_RANK:
        return Nccl(own_version, own, preload=False)
    named = os.environ.get("A2A_NCCL_LIB")
    candidates = [Path(named)] if named else [BUILT_NCCL, WHEEL_NCCL]
    for candidate in candidates:
        if not candidate.is_file():
            if named:
                raise UserError(f"A2A_NCCL_LIB={named}: no such file")
            continue
        version, why = _asked_version(candidate)
        if version is None:
            raise NcclSilent(f"{candidate} is not an NCCL library that answers here (ncclGetVersion: {why})")
        if version < NCCL_MULTI_RANK:
            raise UserError(f"{candidate} is NCCL {core.version_text(version)}; several ranks on one GPU need "
                            f"{core.version_text(NCCL_MULTI_RANK)} or later")
        return Nccl(version, candidate.resolve(), preload=True)
    found = f"NCCL {core.version_text(own_version)} ({own})" if own_version else "no NCCL library of its own"
    raise UserError(f"several ranks on one GPU need NCCL {core.version_text(NCCL_MULTI_RANK)} or later and torch "
                    f"loads {found}: pip install 'nvidia-nccl-cu13>=2.30' (or -cu12), or build one with `make nccl` "
                    "(docs/sharing.md)")


def obtain_nccl(progress=print) -> Optional[str]:
    """Gets, once, an NCCL that lets ranks share a GPU where none is found (the second of the two commands needs no
    third): the nvidia-nccl wheel into build/nccl-wheel where a package registry answers, else NCCL's source
    (NCCL_SRC, or a clone of NVIDIA/nccl) built for this GPU by tools/build_nccl.sh into build/nccl. Both are
    cached there for every later run. Returns None when one is there now, else the one line that says why not."""
    try:
        nccl_for_sharing()
        return None
    except NcclSilent as silent:
        return str(silent)
    except UserError as missing:
        if os.environ.get("A2A_NCCL_LIB"):
            return str(missing)
    import torch

    flavour = "cu13" if (torch.version.cuda or "").startswith("13") else "cu12"
    progress(f"ranks sharing a GPU need NCCL {core.version_text(NCCL_MULTI_RANK)} or later and none is here: getting "
             f"one, once (the nvidia-nccl-{flavour} wheel where a registry answers, else the source built for this "
             "GPU, about 4-5 minutes), into build/")
    tried = []
    for fetch, library in ((lambda: _pip_wheel(flavour), WHEEL_NCCL), (_build_source, BUILT_NCCL)):
        said = fetch()
        if _usable(library):
            progress(f"NCCL {core.version_text(nccl_version_of(library))} is in {library.parent.parent}")
            return None
        tried.append(said)
    return (f"no NCCL {core.version_text(NCCL_MULTI_RANK)}+ could be had here ({'; '.join(tried)}): name a source "
            "archive with NCCL_SRC=FILE.tar.gz, or a library with A2A_NCCL_LIB=PATH")


def _pip_wheel(flavour: str) -> str:
    """The nvidia-nccl wheel into WHEEL_DIR; what went wrong, in a few words, when it did."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--retries", "0", "--timeout", "10", "--target", str(WHEEL_DIR),
                           f"nvidia-nccl-{flavour}>={core.version_text(NCCL_MULTI_RANK[:2])}"],
                          capture_output=True, text=True, timeout=900)
    return "pip: " + ((done.stderr.strip().splitlines() or ["no answer"])[-1][:120] if done.returncode else "done")


def _build_source() -> str:
    """NCCL built from source into build/nccl (tools/build_nccl.sh: NCCL_SRC, or a clone)."""
    done = subprocess.run([str(core.HERE / "tools" / "build_nccl.sh")], capture_output=True, text=True, timeout=3600)
    return "build: " + ((done.stderr.strip().splitlines() or ["failed"])[-1][:160] if done.returncode else "done")


def _usable(library: Path) -> bool:
    version = nccl_version_of(library) if library.is_file() else None
    return bool(version and version >= NCCL_MULTI_RANK)


def _require_mps() -> None:
    if shutil.which(MPS_CONTROL) is None:
        raise UserError(f"ranks cannot share a GPU here: CUDA MPS is not installed ({MPS_CONTROL} is not on the "
                        "PATH); run at most one rank per GPU (--world-size)")


def check_available() -> None:
    """UserError (one line) when ranks cannot share GPUs on this machine: no MPS, or no NCCL that allows it. What
    can only be seen by trying (MPS refusing a client) is found when the daemon starts, before any rank does."""
    _require_mps()
    nccl_for_sharing()


# --------------------------------------------------------------------------------------------------------------
# CUDA MPS: one control daemon for as long as any shared run of this process needs it
# --------------------------------------------------------------------------------------------------------------

# Runs its arguments (a program and its own) with the folder in sys.argv[1] as /dev/shm, in a mount namespace of its
# own (root only): the MPS daemon, and so every server it starts, and the probe, a client like the ranks, keep
# their shared files there, where the ranks of pools sharing GPUs through it find them (boundary.MPS_SHM_ENV).
ON_SHM = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x00020000) or libc.mount(None, b"/", None, 16384 | (1 << 18), None) or \
        libc.mount(sys.argv[1].encode(), b"/dev/shm", None, 4096, None):
    sys.exit(f"/dev/shm from {sys.argv[1]}: {os.strerror(ctypes.get_errno())}")
os.execv(sys.argv[2], sys.argv[2:])
"""


def on_shm(shm: Optional[Path], argv: list) -> list:
    """`argv` run with `shm` as its /dev/shm (ON_SHM), or as it is where `shm` is None."""
    return [sys.executable, "-c", ON_SHM, str(shm), *argv] if shm else argv


# The guardian: starts the control daemon in the foreground as its own child (on the daemon's /dev/shm, ON_SHM,
# where it has one), says `ready`, then waits for its owner's pipe to close (the owner ended, by any means, SIGKILL
# included), asks the daemon to quit, kills whatever still carries the daemon's pipe folder in its environment (the
# MPS server, a stray client) and removes the folders. It runs in its own session, so a signal to the owner's
# process group does not reach it.
_GUARDIAN = r"""
import json, os, signal, shutil, subprocess, sys, time
control, folder, shm, start = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
pipe = os.path.join(folder, "pipe")
log = open(os.path.join(folder, "daemon.out"), "w")
daemon = subprocess.Popen(start, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
deadline = time.monotonic() + 15
while not os.path.exists(os.path.join(pipe, "control")) and daemon.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
print("ready" if daemon.poll() is None and os.path.exists(os.path.join(pipe, "control")) else "failed", flush=True)
sys.stdin.read()
if daemon.poll() is None:
    try:
        subprocess.run([control], input="quit\n", text=True, timeout=10, capture_output=True)
        daemon.wait(timeout=10)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
mark = ("CUDA_MPS_PIPE_DIRECTORY=" + pipe).encode()
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass
shutil.rmtree(folder, ignore_errors=True)
if shm:
    shutil.rmtree(shm, ignore_errors=True)
"""

# Run in a rank's environment: opens a context on every GPU through the CUDA driver and prints each GPU's SM count
# as this process sees it (MPS shrinks it to the share), then holds the contexts until stdin closes.
_PROBE = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(code, what):
    if code:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        print(f"error {what}: {(name.value or b'?').decode()}", flush=True)
        sys.exit(3)
check(cuda.cuInit(0), "cuInit")
count = ctypes.c_int()
check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
sms = []
for index in range(count.value):
    device, context, value = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "opening a context")
    check(cuda.cuDeviceGetAttribute(ctypes.byref(value), 16, device), "cuDeviceGetAttribute")
    sms.append(str(value.value))
print("sms " + " ".join(sms), flush=True)
sys.stdin.readline()
"""


def _control(pipe: str, command: str, timeout_s: float = 10.0) -> Optional[str]:
    """A command to the control daemon listening in `pipe`; its answer, or None when no daemon answers."""
    if not Path(pipe, "control").exists():
        return None
    try:
        done = subprocess.run([MPS_CONTROL], input=command + "\n", text=True, capture_output=True,
                              timeout=timeout_s, env=core.environ_with({"CUDA_MPS_PIPE_DIRECTORY": pipe}))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


class MpsDaemon:
    """A control daemon: one already running (CUDA_MPS_PIPE_DIRECTORY, or MPS's default folder), or this
    process's own, in a private folder, held by a guardian that stops it when this process ends. This process's own
    runs, as root, on a /dev/shm of its own (`shm`, in /dev/shm, 1777 as /dev/shm is), which the ranks sharing GPUs
    through it see as theirs (boundary.shm_cover)."""

    def __init__(self):
        _require_mps()
        self.guardian: Optional[subprocess.Popen] = None
        self.folder: Optional[Path] = None
        self.shm: Optional[Path] = None
        existing = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or core.MPS_DEFAULT_PIPE
        if _control(existing, "get_server_list") is not None:
            self.pipe, self.owned = existing, False
            return
        self.folder = Path(tempfile.mkdtemp(prefix="a2a-mps-"))
        self.pipe, self.owned = str(self.folder / "pipe"), True
        # NOTES: the daemon starts each server as its clients' uid (the ranks'), which writes its sockets in the pipe
        # folder and its log in the log folder: both open to every uid, sticky (2026-11-28, a7562e0: with the
        # folders root's alone, every server for the ranks' uid exited at once, and their CUDA failed with 805)
        os.chmod(self.folder, 0o711)
        for name in ("pipe", "log"):
            (self.folder / name).mkdir()
            os.chmod(self.folder / name, 0o1777)
        if os.geteuid() == 0 and os.path.isdir("/dev/shm"):
            self.shm = Path(tempfile.mkdtemp(prefix="a2a-mps-", dir="/dev/shm"))
            os.chmod(self.shm, 0o1777)
        env = core.environ_with({"CUDA_MPS_PIPE_DIRECTORY": self.pipe,
                                 "CUDA_MPS_LOG_DIRECTORY": str(self.folder / "log")})
        env.pop(core.RUN_OWNER, None)  # the guardian outlives its owner on purpose: no orphan sweep may end it
        control = shutil.which(MPS_CONTROL)
        self.guardian = subprocess.Popen([sys.executable, "-c", _GUARDIAN, control, str(self.folder),
                                          str(self.shm or ""), json.dumps(on_shm(self.shm, [control, "-f"]))],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                         start_new_session=True)
        if self.guardian.stdout.readline().strip() != "ready":
            why = self._log_tail()
            self.stop()
            raise UserError(f"ranks cannot share a GPU here: the MPS control daemon did not start ({why})")

    def _log_tail(self) -> str:
        return (self.log_lines(1) or ["no message"])[0]

    def log_lines(self, count: int) -> list[str]:
        """The last `count` lines of each of its own daemon's output and logs, named, escaped and cut (the server
        runs as the ranks' uid: its words are theirs); none for a daemon this process did not start."""
        lines = []
        for name in ("daemon.out", "log/control.log", "log/server.log") if self.folder else ():
            # NOTES: the log folder is open to every uid (the servers write there): a link or a named pipe put in
            # place of a log is not followed or waited on (red team 24), and only a plain file is read
            with contextlib.suppress(OSError), open(os.open(self.folder / name, os.O_RDONLY | os.O_NOFOLLOW
                                                            | os.O_NONBLOCK), "rb") as log:
                if not stat.S_ISREG(os.fstat(log.fileno()).st_mode):
                    continue
                log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                lines += [f"{name}: {wire.as_text(line.strip(), 200)}"
                          for line in log.read().splitlines()[-count:] if line.strip()]
        return lines

    def probe(self, percent: int) -> list[int]:
        """Opens a context on every GPU as a rank would (MPS client, `percent` share) and checks that the daemon
        counts it among its clients; returns each GPU's SM count as a rank sees it. UserError when MPS refuses or
        the process ran without it (a time-sliced run would crawl, or hang on the flags)."""
        env = core.environ_with({"CUDA_MPS_PIPE_DIRECTORY": self.pipe,
                                 "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent)})
        child = subprocess.Popen(on_shm(self.shm, [sys.executable, "-c", _PROBE]), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            answer = child.stdout.readline().strip()
            if not answer.startswith("sms "):
                raise UserError(f"ranks cannot share a GPU here: MPS refused a client ({answer or 'no answer'}"
                                + (f"; daemon: {self._log_tail()}" if self.owned else "") + ")")
            servers = (_control(self.pipe, "get_server_list") or "").split()
            clients = {pid for server in servers for pid in (_control(self.pipe, f"get_client_list {server}")
                                                               or "").split()}
            if str(child.pid) not in clients:
                raise UserError("ranks cannot share a GPU here: a process started with the MPS environment did not "
                                "become an MPS client (the GPUs would be time-sliced instead)")
            return [int(n) for n in answer.split()[1:]]
        finally:
            with contextlib.suppress(OSError):
                child.stdin.close()
            child.wait(timeout=30)

    def stop(self) -> None:
        """Stops this process's own daemon (the guardian does it and returns); one already running is left."""
        if self.guardian is None:
            return
        with contextlib.suppress(OSError):
            self.guardian.stdin.close()
        try:
            self.guardian.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            core.kill_tree(self.guardian.pid)
            self.guardian.wait()
        self.guardian = None


_daemon: Optional[MpsDaemon] = None
_users = 0
_probed: dict = {}  # percent -> SM counts a rank sees


def daemon_log(count: int = 6) -> list[str]:
    """The last lines of each log of the MPS daemon this process holds and started (MpsDaemon.log_lines): what a
    failed run of ranks sharing GPUs says about MPS, read before the daemon and its folder go."""
    return _daemon.log_lines(count) if _daemon is not None else []


@contextlib.contextmanager
def shared_ranks(where: Placement) -> Iterator[dict]:
    """The environment rank processes of `where` need: nothing when each rank has its own GPU; with shared GPUs, the
    MPS pipe folder (of a daemon held for as long as any caller in this process needs it) and its /dev/shm, each
    rank's SM share, NCCL's switch for several ranks on one GPU, its channels capped to the share (nccl_channels)
    and, where torch's own NCCL is older, the newer one preloaded.
    `A2A_SHARE=mps` tells the protocol core that the ranks may outnumber the GPUs."""
    global _daemon, _users
    if not where.shared:
        yield {}
        return
    nccl = nccl_for_sharing()
    if _daemon is None:
        _daemon = MpsDaemon()
        _probed.clear()
    _users += 1
    try:
        if where.sm_percent not in _probed:
            _probed[where.sm_percent] = _daemon.probe(where.sm_percent)
        env = {"A2A_SHARE": "mps", "CUDA_MPS_PIPE_DIRECTORY": _daemon.pipe,
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(where.sm_percent), "NCCL_MULTI_RANK_GPU_ENABLE": "1",
               "A2A_NCCL_VERSION": core.version_text(nccl.version), "A2A_RANK_SMS": ",".join(
                   map(str, _probed[where.sm_percent])), **({MPS_SHM_ENV: str(_daemon.shm)} if _daemon.shm else {})}
        if nccl.preload:
            env["LD_PRELOAD"] = " ".join(filter(None, (str(nccl.path), os.environ.get("LD_PRELOAD"))))
        if "NCCL_MAX_NCHANNELS" not in os.environ:
            env["NCCL_MAX_NCHANNELS"] = str(nccl_channels(min(_probed[where.sm_percent])))
        yield env
    finally:
        _users -= 1
        if _users == 0:
            _daemon.stop()
            _daemon = None


def describe_run(where: Placement, env: dict) -> str:
    """The header line of a run: the placement and, when shared, the SMs a rank sees (the probe's count on the first
    GPU) and which NCCL runs."""
    text = where.describe()
    if env.get("A2A_RANK_SMS"):
        text += f": {env['A2A_RANK_SMS'].split(',')[0]} SMs per rank, NCCL {env['A2A_NCCL_VERSION']}"
    return text
