"""A pool's memory cap: a cgroup of the pool's own, which every rank joins before it drops root, and how the judge
tells a kill at that cap and removes the group; and what a pool's sockets are charged of the socket buffers the
whole machine shares (tcp_mem, udp_mem: the guardian's count, boundary.watch_tables). Part of every staged bundle
(task.yml lists it); it imports nothing of the harness.
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import struct
import time
from pathlib import Path
from typing import Iterator, Optional

# A pool's ranks share one memory cap, a cgroup of the pool's own (the memory controller of cgroup v1, or v2's),
# which every rank joins before it drops root: without it one rank that takes the host's memory starves the owner and
# every other pool. A2A_POOL_MEMORY_GB sets it; by default half the machine's memory.
POOL_MEMORY_ENV = "A2A_POOL_MEMORY_GB"
CGROUP_ROOT = Path("/sys/fs/cgroup")


# The least cap taken: v1 passed under 0.1 GiB at world size 2 on gloo (this project's CPU machine, 2026-11-29, its
# ranks forked from a zygote that had imported torch), where 0.0001 failed it as the submission's (red team 51).
POOL_MEMORY_MIN_GIB = 0.1


def pool_memory_bytes() -> int:
    """A pool's memory cap in bytes; ValueError naming the variable when it is set to anything but a number of GiB
    from POOL_MEMORY_MIN_GIB to the machine's memory (red team 51: 1e-300 rounded to a cap the kernel refused, and
    the pool ran with none; 0.0001 failed the honest v1 as the submission's; 1e300 ended the judge with 114), or
    set on a machine with no memory cgroup to hold it (its pools would have run with none)."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    text = os.environ.get(POOL_MEMORY_ENV)
    if text and _memory_controller() is None:
        raise ValueError(f"{POOL_MEMORY_ENV}={text!r}: this machine has no memory cgroup to hold a pool's cap "
                         f"(cgroup v1's memory controller, or v2's with memory delegated); unset it to run without one")
    if text:
        try:
            gib = float(text)
        except ValueError:
            gib = math.nan
        if not (POOL_MEMORY_MIN_GIB <= gib <= machine / (1 << 30)):
            raise ValueError(f"{POOL_MEMORY_ENV}={text!r}: must be a number of GiB from {POOL_MEMORY_MIN_GIB} to "
                             f"this machine's {machine / (1 << 30):.1f}")
        return int(gib * (1 << 30))
    return machine // 2


def _own_v1_group(controller: str) -> Path:
    """This process's own group in cgroup v1's hierarchy of `controller` (its root where /proc says none or the
    folder is not there)."""
    root = CGROUP_ROOT / controller
    own = ""
    with contextlib.suppress(OSError):
        own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if controller in line.split(":")[1].split(",")), "")
    group = root / own.strip().lstrip("/") if own.strip() else root
    return group if group.is_dir() else root


TCP_SHARE = 0.125  # of a pool's memory cap, its TCP buffers' (cgroup v1 only, which counts them apart)


def _memory_controller() -> Optional[tuple]:
    """(the folder pools' groups go under, {its limit files: their share of the cap}, its OOM files) or None. Under
    cgroup v1 the groups go below this process's own memory group, whose limits then hold them too; v2 gives a group
    with processes no controllers for its children, so there they go below the hierarchy's root."""
    if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
        # NOTES: v1 counts a socket's TCP buffers apart from the group's memory, and only once their own limit is
        # set (red team 17: 1.2 GiB of loopback buffers passed a 1 GiB cap without it; red team 21, with it: 0.8 GiB
        # of memory and 1.0 GiB of buffers both within their own limits): the cap is split between the two
        return (_own_v1_group("memory"), {"memory.limit_in_bytes": 1 - TCP_SHARE, "memory.kmem.tcp.limit_in_bytes":
                                          TCP_SHARE}, ("memory.oom_control", "memory.failcnt"))
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        with contextlib.suppress(OSError):
            if "memory" in (root / "cgroup.subtree_control").read_text().split():
                return root, {"memory.max": 1.0}, ("memory.events",)
    return None


def memory_group(uid: int) -> Optional[Path]:
    found = _memory_controller()
    return found[0] / f"a2a-pool-{uid}" if found else None


def make_memory_group(uid: int, limit: int) -> tuple:
    """The pool's memory group, capped at `limit` bytes (an earlier pool's of this uid removed first): (its folder,
    "") or (None, why there is none)."""
    found, group = _memory_controller(), memory_group(uid)
    if found is None:
        return None, "no memory cgroup here"
    remove_pool_groups(uid)
    try:
        group.mkdir()
        for name, share in found[1].items():
            if (group / name).exists():
                (group / name).write_text(str(int(limit * share)))
        _try_joining(group)
    except OSError as error:
        remove_pool_groups(uid)
        return None, f"no memory cgroup ({group}: {error.strerror})"
    return group, ""


def _try_joining(group: Path) -> None:
    """A forked child joins the group and ends (a kernel may make the group and refuse members): OSError if it
    could not. Only system calls in the child: the owner may have threads."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            fd = os.open(group / "cgroup.procs", os.O_WRONLY)
            os.write(fd, b"0")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(errno.EPERM, "the kernel refused a process into it")


GROUP_EMPTY_WAIT_S = 5.0  # for a released pool's last tasks to exit before its groups are removed


def remove_pool_groups(uid: int) -> bool:
    """Removes the uid's memory group: every task still in it killed, what the kernel still holds for it freed
    (_freed), and removed once empty (waiting up to GROUP_EMPTY_WAIT_S in all). Whether it is gone (red team 20: a
    group removed at once, while its tasks were still exiting, stayed, and no later command tried again)."""
    groups = [group for group in (memory_group(uid),) if group is not None]
    deadline = time.monotonic() + GROUP_EMPTY_WAIT_S
    freed = False
    while True:
        for group in groups:
            with contextlib.suppress(OSError):
                tasks = (group / "cgroup.procs").read_text().split()
                for pid in tasks:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                if not tasks and not freed:
                    _freed(group, deadline)
                    freed = True
            with contextlib.suppress(OSError):
                group.rmdir()
        groups = [group for group in groups if group.exists()]
        if not groups or time.monotonic() > deadline:
            return not groups
        time.sleep(0.02)


SETTLED_S = 0.1  # a group's usage that has not fallen by a MiB for this long is what stays charged (page cache)


def _freed(group: Path, deadline: float) -> None:
    """Asks the kernel's unix-socket collector to run, then waits until the group's memory use stops falling (at most
    until `deadline`). NOTES: memory a rank sent in flight in a unix socket's queue, every descriptor then closed,
    is freed only by that collector, which runs when a socket holding descriptors in flight is released; left alone it
    stayed for minutes, and once freed it drained through the next entry's visits (red team 22: 3 GiB)."""
    import array
    import socket

    name = "memory.usage_in_bytes" if (group / "memory.usage_in_bytes").exists() else "memory.current"
    with contextlib.suppress(OSError):
        sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        read_end, write_end = os.pipe()
        try:
            sender.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [read_end]))])
        finally:
            for fd in (read_end, write_end):
                os.close(fd)
            sender.close()
            receiver.close()
    try:
        last, quiet_since = int((group / name).read_text()), time.monotonic()
        while time.monotonic() - quiet_since < SETTLED_S and time.monotonic() < deadline:
            time.sleep(0.02)
            now = int((group / name).read_text())
            if last - now > 1 << 20:
                quiet_since = time.monotonic()
            last = now
    except (OSError, ValueError):
        pass


def memory_cap_hit(uid: Optional[int]) -> bool:
    """Whether the kernel killed a process of the pool at the pool's own cap: an OOM kill in the group while its
    usage met its limit (a kill by the system's own OOM killer counts in the group too, red team 17)."""
    found = _memory_controller()
    if uid is None or found is None:
        return False
    counts = {}
    for name in found[2]:
        with contextlib.suppress(OSError):
            text = (memory_group(uid) / name).read_text()
            lines = [line.split() for line in text.splitlines()]
            counts.update({fields[0]: fields[1] for fields in lines if len(fields) == 2})
            counts.update({name: fields[0] for fields in lines if len(fields) == 1})
    met = counts.get("memory.failcnt", counts.get("oom", "0"))  # v1: charges refused at the limit; v2: its OOMs
    return counts.get("oom_kill", "0") != "0" and met != "0"


def group_socket_bytes(uid: Optional[int]) -> Optional[int]:
    """Bytes of socket buffers charged to the pool's memory group (cgroup v1: its TCP counter, which every socket of
    the group is charged to once that limit is set, UDP and multipath TCP too; v2: memory.stat's `sock`), None
    without one. NOTES: the kernel's own count of what the pool's sockets hold, whichever it lists: red team 65's
    UDP sockets unhashed by connect(AF_UNSPEC) kept their queues (2.37 GB) out of sock_diag and /proc/net/udp."""
    group = memory_group(uid) if uid is not None else None
    if group is None:
        return None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        if (v1 := group / "memory.kmem.tcp.usage_in_bytes").exists():
            return int(v1.read_text())
        return int(next(line.split()[1] for line in (group / "memory.stat").read_text().splitlines()
                        if line.startswith("sock ")))
    return None


# sock_diag (netlink) asked for every socket of one protocol and address family with its memory (SKMEMINFO): the
# netlink header, then inet_diag_req_v2 (family, protocol, extensions wanted, pad, states, a socket id of zeros).
SOCK_DIAG, SOCK_DIAG_BY_FAMILY, DUMP_REQUEST, INET_DIAG_SKMEMINFO = 4, 20, 0x301, 7
NLMSG_ERROR, NLMSG_DONE = 2, 3
_NETLINK_HEADER = struct.Struct("=IHHII")
_DIAG_REQUEST = struct.Struct("=IHHIIBBBBI48x")
_DIAG_MESSAGE_BYTES = 72  # inet_diag_msg, before its attributes
# Of SKMEMINFO's words, those a socket is charged against its protocol's buffers: its receive queue, its forward
# allocation, its write queue and its backlog (sk_rmem_alloc, sk_forward_alloc, sk_wmem_queued, sk_backlog.len).
CHARGED_WORDS = (0, 4, 5, 7)


def socket_memory(init: int, most: float, protocol: str) -> Optional[int]:
    """Bytes of `protocol`'s ("tcp", "udp") buffers that the sockets of `init`'s network namespace are charged, as
    the kernel counts them against `<protocol>_mem`, counted until past `most`; None where sock_diag cannot answer
    or this process is not in that namespace (sock_diag answers for its caller's: the guardian's is its pool's).
    NOTES: the memory, not the bytes queued: red team 63's one-byte TCP segments were charged about 800 bytes each
    (3000 segments 2.4 MB, here), and a count of their bytes left the machine at its pressure mark for 8 s unseen."""
    import socket

    with contextlib.suppress(OSError):
        if os.stat("/proc/self/ns/net").st_ino != os.stat(f"/proc/{init}/ns/net").st_ino:
            return None
        number, held = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}[protocol], 0
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            for family in (socket.AF_INET, socket.AF_INET6):
                diag.send(_DIAG_REQUEST.pack(_DIAG_REQUEST.size, SOCK_DIAG_BY_FAMILY, DUMP_REQUEST, 1, 0, family,
                                             number, 1 << (INET_DIAG_SKMEMINFO - 1), 0, 0xFFFFFFFF))
                for words in _diag_replies(diag):
                    held += sum(words[i] for i in CHARGED_WORDS if i < len(words))
                    if held > most:
                        return held
        return held
    return None


def _diag_replies(diag) -> Iterator[tuple]:
    """Each socket's SKMEMINFO words in sock_diag's replies, until the dump's end; OSError for an error reply."""
    while True:
        data, at = diag.recv(1 << 16), 0
        if not data:
            raise OSError(errno.EIO, "sock_diag said nothing")
        while at + _NETLINK_HEADER.size <= len(data):
            length, kind = _NETLINK_HEADER.unpack_from(data, at)[:2]
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                raise OSError(-struct.unpack_from("=i", data, at + _NETLINK_HEADER.size)[0], "sock_diag")
            attribute, end = at + _NETLINK_HEADER.size + _DIAG_MESSAGE_BYTES, min(at + length, len(data))
            while attribute + 4 <= end:
                size, what = struct.unpack_from("=HH", data, attribute)
                if what == INET_DIAG_SKMEMINFO and attribute + size <= end:
                    yield struct.unpack_from(f"={(size - 4) // 4}I", data, attribute + 4)
                attribute += max(4, (size + 3) & ~3)
            at += max(_NETLINK_HEADER.size, (length + 3) & ~3)
