"""The seccomp filter each rank installs on itself before it runs a submission's code (boundary.enter_rank_sandbox):
what no namespace, uid or mount holds. Part of every staged bundle (task.yml lists it); it imports nothing of the
harness.
"""
from __future__ import annotations

import ctypes
import errno
import os

CLONE_NEWUSER = 0x10000000

# The seccomp filter a rank installs on itself (install_rank_filter): classic BPF over struct seccomp_data.
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# per architecture the harness runs on: its audit arch, and the numbers of the calls the filter looks at
_SYSCALLS = {"x86_64": (0xC000003E, {"clone": 56, "unshare": 272, "clone3": 435, "add_key": 248,
                                     "request_key": 249, "keyctl": 250, "ptrace": 101, "ioctl": 16, "io_setup": 206,
                                     "io_uring_setup": 425, "socket": 41}),
             "aarch64": (0xC00000B7, {"clone": 220, "unshare": 97, "clone3": 435, "add_key": 217,
                                      "request_key": 218, "keyctl": 219, "ptrace": 117, "ioctl": 29, "io_setup": 0,
                                      "io_uring_setup": 425, "socket": 198})}
CLONE_PARENT = 0x00008000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # a terminal's input pushed by ioctl (red team 23: typed into the operator's shell)
IPPROTO_MPTCP = 262
# The address families a rank may make sockets of: those its network namespace holds (and the kernel's own
# netlink); vsock, for one, has no namespace (red team 67: a rank listened in the machine's vsock port space).
SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
_X32_BIT = 0x40000000
_LOAD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def rank_filter(machine: str) -> list:
    """The filter's instructions (code, jt, jf, k): clone and unshare with CLONE_NEWUSER fail with EPERM, and clone
    with CLONE_PARENT (red team 19: a child of the rank's parent, the owner under spawn, which never reaps it, so the
    namespace could not end and the owner waited on it forever); clone3, whose flags a filter cannot read, fails
    with ENOSYS (glibc then falls back to clone), as do the kernel's asynchronous I/O contexts (io_setup,
    io_uring_setup: red team 60: 15 contexts held the machine's whole fs.aio-max-nr, and root's io_setup failed until
    the pool ended; a caller falls back to plain reads and writes); ptrace fails with EPERM, every request of it (red
    team 19: PTRACE_TRACEME made the owner the rank's tracer, and a stop it then read as its worker's exit ended the
    run with 114; red team 28: two workers that seized each other hid their exits from their parent, whose wait never
    ended); the kernel's keyrings (add_key, request_key, keyctl: a uid's keys outlive its processes, red team 14), the
    ioctls that push input into a terminal (TIOCSTI, TIOCLINUX: red team 23) and a call of another ABI (x32, 32-bit)
    fail with EPERM; a multipath TCP socket fails with EPROTONOSUPPORT, as on a kernel without it (red team 65: its
    buffers count against tcp_mem, but the kernel lists them apart from TCP's, and 420 of them held the machine past
    its pressure mark unseen by the guardian), and a socket of a family outside SOCKET_FAMILIES with EAFNOSUPPORT;
    everything else is allowed. Empty for an unknown architecture."""
    if machine not in _SYSCALLS:
        return []
    arch, number = _SYSCALLS[machine]
    program = [  # (code, label if true, label if false, k); a label is an instruction's name below
        (_LOAD, None, None, 4), (_JEQ, "native", "deny", arch),
        ("native", _LOAD, None, None, 0), (_JGE, "deny", None, _X32_BIT),
        *((_JEQ, "absent", None, number[name]) for name in ("clone3", "io_setup", "io_uring_setup")),
        *((_JEQ, "deny", None, number[name]) for name in ("add_key", "request_key", "keyctl")),
        (_JEQ, "deny", None, number["ptrace"]), (_JEQ, "terminal", None, number["ioctl"]),
        (_JEQ, "family", None, number["socket"]),
        (_JEQ, "flags", None, number["clone"]), (_JEQ, "flags", "allow", number["unshare"]),
        ("flags", _LOAD, None, None, 16), (_JSET, "deny", "allow", CLONE_NEWUSER | CLONE_PARENT),  # arg 1, low half
        ("terminal", _LOAD, None, None, 24), (_JEQ, "deny", None, TIOCSTI), (_JEQ, "deny", "allow", TIOCLINUX),
        ("family", _LOAD, None, None, 16), *((_JEQ, "protocol", None, family) for family in SOCKET_FAMILIES[:-1]),
        (_JEQ, "protocol", "no_family", SOCKET_FAMILIES[-1]),  # arg 0, low half
        ("protocol", _LOAD, None, None, 32), (_JEQ, "no_protocol", "allow", IPPROTO_MPTCP),  # arg 2, low half
        ("allow", _RET, None, None, SECCOMP_RET_ALLOW), ("absent", _RET, None, None, SECCOMP_RET_ERRNO | errno.ENOSYS),
        ("no_protocol", _RET, None, None, SECCOMP_RET_ERRNO | errno.EPROTONOSUPPORT),
        ("no_family", _RET, None, None, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT),
        ("deny", _RET, None, None, SECCOMP_RET_ERRNO | errno.EPERM)]
    labels = {step[0]: at for at, step in enumerate(program) if isinstance(step[0], str)}
    assembled = []
    for at, step in enumerate(program):
        code, true, false, k = step[1:] if isinstance(step[0], str) else step
        assembled.append((code, labels[true] - at - 1 if true else 0, labels[false] - at - 1 if false else 0, k))
    return assembled


def install_rank_filter(libc) -> None:
    """This process and its children can make no user namespace (in one a rank would be root, with every namespace
    and mount it then makes) and use no keyring (rank_filter). Needs no_new_privs. NOTES: the filter lasts for the
    process's life and is inherited; it costs a few instructions a system call."""
    program = rank_filter(os.uname().machine)
    if not program:
        raise OSError(f"rank sandbox: no seccomp filter for {os.uname().machine}")
    instructions = (_SockFilter * len(program))(*[_SockFilter(*i) for i in program])
    fprog = _SockFprog(len(program), instructions)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0):
        raise OSError(ctypes.get_errno(), f"rank sandbox: seccomp filter: {os.strerror(ctypes.get_errno())}")
