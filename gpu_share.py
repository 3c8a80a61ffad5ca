"""GPU memory that one process makes and another maps, handed over as a file descriptor (CUDA's virtual memory
management: cuMemCreate with a POSIX file-descriptor handle, exported, sent by SCM_RIGHTS, imported).

The judge (judge.py) keeps its steps' inputs and outputs on the ranks' GPUs this way. Legacy CUDA IPC
(cudaIpcOpenMemHandle) names the exporting process and does not cross the ranks' PID namespace; a descriptor is a
capability that does, whatever the two processes' uids. The exporter's context keeps its own mapping, so the owner
copies into and out of the very memory the rank reads and writes, on its own stream.

NVIDIA only: on ROCm (and wherever `supported()` says why not) the judge keeps the host transport.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from typing import Optional

_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.lru_cache(maxsize=None)
def _driver():
    return ctypes.CDLL("libcuda.so.1")


def _call(name: str, *args) -> None:
    err = getattr(_driver(), name)(*args)
    if err:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(err, ctypes.byref(text))
        raise RuntimeError(f"{name} failed: {text.value.decode() if text.value else err}")


def supported() -> Optional[str]:
    """None where shared GPU buffers work here, else why not."""
    import torch

    if torch.version.hip is not None or torch.version.cuda is None:
        return "not a CUDA build of torch"
    if not torch.cuda.is_available():
        return "no GPU"
    try:
        _driver()
    except OSError as exc:
        return f"no CUDA driver library ({exc})"
    return None


def _prop(device: int) -> _Prop:
    return _Prop(type=_PINNED, requestedHandleTypes=_POSIX_FD, location=_Location(_ON_DEVICE, device))


@contextlib.contextmanager
def _current(device: int):
    """GPU `device`'s primary context current on this thread for the driver calls, and the current device as it
    was after (torch.cuda.device: never set_device)."""
    import torch

    with torch.cuda.device(device):
        torch.cuda.init()
        torch.empty(1, device=f"cuda:{device}")  # the primary context exists and is current
        yield


def _granule(device: int) -> int:
    size = ctypes.c_size_t()
    _call("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(_prop(device)), _MINIMUM)
    return size.value


class Buffer:
    """`size` bytes on GPU `device`, mapped in this process; `tensor` a uint8 view of them, on GPU `user` (the
    device by default; another GPU reaches the memory over its peer link, and work on `tensor` runs there). Made
    with `create` (exportable: `export()` gives a descriptor for another process) or `open` (another process's,
    from its descriptor)."""

    def __init__(self, device: int, size: int, handle: int, user: Optional[int] = None):
        import torch

        self.device, self.size, self.handle = device, size, handle
        self.user = device if user is None else user
        self.address = ctypes.c_uint64()
        with _current(self.user):
            _call("cuMemAddressReserve", ctypes.byref(self.address), ctypes.c_size_t(size), ctypes.c_size_t(0),
                  ctypes.c_uint64(0), ctypes.c_ulonglong(0))
            _call("cuMemMap", self.address, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                  ctypes.c_ulonglong(0))
            gpus = sorted({device, self.user})
            access = (_Access * len(gpus))(*[_Access(location=_Location(_ON_DEVICE, g), flags=_READ_WRITE)
                                             for g in gpus])
            _call("cuMemSetAccess", self.address, ctypes.c_size_t(size), access, ctypes.c_size_t(len(gpus)))
        self.tensor = torch.as_tensor(_Interface(self.address.value, size), device=f"cuda:{self.user}")

    @classmethod
    def create(cls, device: int, size: int, user: Optional[int] = None) -> "Buffer":
        granule = _granule(device)
        size = -(-size // granule) * granule
        handle = ctypes.c_uint64()
        with _current(device):
            _call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(_prop(device)),
                  ctypes.c_ulonglong(0))
        return cls(device, size, handle.value, user)

    @classmethod
    def open(cls, fd: int, device: int, size: int) -> "Buffer":
        """Maps the buffer whose descriptor another process exported (`fd` is closed here once imported)."""
        handle = ctypes.c_uint64()
        try:
            with _current(device):
                _call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD)
        finally:
            os.close(fd)
        return cls(device, size, handle.value)

    def export(self) -> int:
        """A new descriptor for this buffer (the caller sends and closes it)."""
        fd = ctypes.c_int()
        _call("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_uint64(self.handle), _POSIX_FD,
              ctypes.c_ulonglong(0))
        return fd.value

    def close(self) -> None:
        """Unmaps and releases this process's hold (the memory goes when no process maps it). Every view of
        `tensor` must be dropped and every queued use finished first."""
        import torch

        if self.handle is None:
            return
        self.tensor = None
        torch.cuda.synchronize(self.user)
        _call("cuMemUnmap", self.address, ctypes.c_size_t(self.size))
        _call("cuMemAddressFree", self.address, ctypes.c_size_t(self.size))
        _call("cuMemRelease", ctypes.c_uint64(self.handle))
        self.handle = None


class _Interface:
    """What torch.as_tensor reads to view memory it did not allocate (the CUDA array interface)."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}
