"""Device memory that can be given back and taken again at the same addresses (CUDA virtual memory management).

Why: a CUDA graph holds the device addresses of everything it reads. Sleep mode that frees the weights and the KV
cache and allocates them anew on wake-up must capture every graph again (seconds on a 7B model, most of a woken
standby replica's start). Here, as vLLM's CuMemAllocator does, the tensors' memory comes from a torch MemPool whose
allocator reserves a virtual address range for each segment and maps physical memory into it (cuMemAddressReserve,
cuMemCreate, cuMemMap): `release` unmaps and frees the physical memory and keeps the ranges, `restore` maps new
physical memory into the same ranges. Every tensor, and every graph that reads it, stays valid; only the contents
are gone (the caller copies what it keeps to host memory first, and back after).

The allocator's two callbacks are ctypes functions handed to torch's pluggable-allocator hook, and they call the
CUDA driver through ctypes: no extension to build. Torch calls them only where the pool grows or gives a segment
back (the engine's start; never a step), holding its allocator's lock, and a callback takes the GIL: so the pool
is filled where no other thread frees device memory (the engine builds its model and its KV cache on one thread),
and the garbage collector, which could free a tensor into the allocator from inside its own allocation, is off
while a callback runs.

A pool lives as long as the process: torch calls its callbacks for as long as its MemPool holds segments, also while
the interpreter shuts down, and a callback into a collected pool (its attributes cleared, its ctypes thunks freed)
fails or crashes. So a pool is never collected (it holds one extra reference to itself), its MemPool is never
destroyed, and at shutdown its callbacks return at once: the process's exit gives the memory back. Nor does torch
hand a MemPool's cached free segments back while the pool lives (empty_cache skips them): a pool's memory is what it
ever held at once, which release() gives back whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

log = logging.getLogger("railyard.engine")

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class DriverError(RuntimeError):
    """A CUDA driver call failed (its name and the driver's error string)."""


class _Driver:
    """The few driver entry points the allocator needs, from the libcuda the CUDA runtime already loaded."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        u64, size_t = ctypes.c_uint64, ctypes.c_size_t
        sigs = {
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuCtxGetCurrent": [ctypes.POINTER(ctypes.c_void_p)],
            "cuCtxSetCurrent": [ctypes.c_void_p],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
            "cuMemGetAllocationGranularity": [ctypes.POINTER(size_t), ctypes.POINTER(_AllocationProp), ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, u64],
            "cuMemAddressFree": [u64, size_t],
            "cuMemCreate": [ctypes.POINTER(u64), size_t, ctypes.POINTER(_AllocationProp), u64],
            "cuMemRelease": [u64],
            "cuMemMap": [u64, size_t, size_t, u64, u64],
            "cuMemUnmap": [u64, size_t],
            "cuMemSetAccess": [u64, size_t, ctypes.POINTER(_AccessDesc), size_t],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            setattr(self, name, fn)

    def check(self, result: int, call: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.cuGetErrorString(result, ctypes.byref(text))
            raise DriverError(f"{call} failed: {(text.value or b'?').decode()} ({result})")

    def ensure_context(self, device: int) -> None:
        """The device's primary context current on this thread (the runtime's; a thread that never made a runtime
        call has none)."""
        ctx = ctypes.c_void_p()
        self.check(self.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self.check(self.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self.check(self.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.check(self.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


@dataclass
class _Segment:
    """One allocation of the pool: its address range, and its physical memory while mapped (None once released)."""

    size: int
    device: int
    handle: int | None


_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


class VirtualMemoryPool:
    """A torch MemPool whose segments' physical memory `release` gives back and `restore` maps again, at the same
    addresses. Allocate into it with `allocating()`; tensors allocated elsewhere are not touched."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._driver = _Driver()
        self._segments: dict[int, _Segment] = {}
        self._lock = threading.Lock()
        self._released = False
        # The ctypes callbacks must live as long as the allocator: torch holds only their addresses.
        self._alloc_fn, self._free_fn = _ALLOC(self._alloc), _FREE(self._free)
        allocator = torch._C._cuda_customAllocator(ctypes.cast(self._alloc_fn, ctypes.c_void_p).value,
                                                   ctypes.cast(self._free_fn, ctypes.c_void_p).value)
        self._allocator = allocator
        self.pool = torch.cuda.MemPool(allocator)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self))  # never collected: see the module's docstring

    @contextlib.contextmanager
    def allocating(self, device: torch.device) -> Iterator[None]:
        """Inside, this thread's device allocations come from the pool."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.cuda.use_mem_pool(self.pool, index):
            yield

    @property
    def mapped_bytes(self) -> int:
        """Physical memory the pool holds now."""
        return sum(s.size for s in self._segments.values() if s.handle is not None)

    @property
    def reserved_bytes(self) -> int:
        """Address space the pool holds (mapped or not)."""
        return sum(s.size for s in self._segments.values())

    @property
    def released(self) -> bool:
        return self._released

    def contains(self, tensor: torch.Tensor) -> bool:
        """Whether the tensor's storage lies in one of the pool's segments."""
        ptr = tensor.untyped_storage().data_ptr()
        return any(start <= ptr < start + s.size for start, s in self._segments.items())

    def release(self) -> None:
        """Give back every segment's physical memory (the contents are lost; the addresses stay reserved). The
        caller has synchronised: nothing queued may still touch the memory."""
        with self._lock:
            for start, seg in self._segments.items():
                if seg.handle is not None:
                    self._driver.ensure_context(seg.device)
                    self._unmap(start, seg)
            self._released = True

    def restore(self) -> None:
        """Map new physical memory into every released segment (contents undefined)."""
        with self._lock:
            for start, seg in self._segments.items():
                if seg.handle is None:
                    self._driver.ensure_context(seg.device)
                    self._map(start, seg)
            self._released = False

    # -- the allocator's callbacks (torch calls them; an exception must not cross into C) --------------
    def _alloc(self, size: int, device: int, stream: int) -> int:
        if sys.is_finalizing():
            return 0
        collecting = gc.isenabled()
        gc.disable()
        try:
            d = self._driver
            d.ensure_context(device)
            prop = self._prop(device)
            granularity = ctypes.c_size_t()
            d.check(d.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop),
                                                    _CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
            g = granularity.value
            size = -(-size // g) * g
            ptr = ctypes.c_uint64()
            d.check(d.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0), "cuMemAddressReserve")
            seg = _Segment(size, device, None)
            try:
                self._map(ptr.value, seg)
            except DriverError:
                d.cuMemAddressFree(ptr.value, size)
                raise
            with self._lock:
                self._segments[ptr.value] = seg
            return ptr.value
        except Exception:  # torch reads a null pointer as out of memory
            log.exception("%s pool: allocating %d bytes failed", self.name, size)
            return 0
        finally:
            if collecting:
                gc.enable()

    def _free(self, ptr: int, size: int, device: int, stream: int) -> None:
        if sys.is_finalizing():  # the process is exiting: its memory goes back with it
            return
        collecting = gc.isenabled()
        gc.disable()
        try:
            with self._lock:
                seg = self._segments.pop(ptr)
            self._driver.ensure_context(seg.device)
            if seg.handle is not None:
                self._unmap(ptr, seg)
            self._driver.check(self._driver.cuMemAddressFree(ptr, seg.size), "cuMemAddressFree")
        except Exception:
            log.exception("%s pool: freeing %#x failed", self.name, ptr)
        finally:
            if collecting:
                gc.enable()

    # -- mapping ------------------------------------------------------------------------------------
    @staticmethod
    def _prop(device: int) -> _AllocationProp:
        prop = _AllocationProp()
        prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = _Location(_CU_MEM_LOCATION_TYPE_DEVICE, device)
        return prop

    def _map(self, start: int, seg: _Segment) -> None:
        d = self._driver
        handle = ctypes.c_uint64()
        d.check(d.cuMemCreate(ctypes.byref(handle), seg.size, ctypes.byref(self._prop(seg.device)), 0), "cuMemCreate")
        try:
            d.check(d.cuMemMap(start, seg.size, 0, handle.value, 0), "cuMemMap")
        except DriverError:
            d.cuMemRelease(handle.value)
            raise
        access = _AccessDesc(_Location(_CU_MEM_LOCATION_TYPE_DEVICE, seg.device), _CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        d.check(d.cuMemSetAccess(start, seg.size, ctypes.byref(access), 1), "cuMemSetAccess")
        seg.handle = handle.value

    def _unmap(self, start: int, seg: _Segment) -> None:
        d = self._driver
        d.check(d.cuMemUnmap(start, seg.size), "cuMemUnmap")
        d.check(d.cuMemRelease(seg.handle), "cuMemRelease")
        seg.handle = None
