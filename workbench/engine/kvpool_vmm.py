"""KV pool arrays in CUDA virtual memory (vAttention on the GPU): reserve once, map physical pages on demand.

For `virtual-contiguous` on the `cupy` backend, each of K and V is one reserved virtual range of
`virtual_slots` rows (`cuMemAddressReserve`), seen by the kernels as a plain CuPy array
([virtual_slots, num_kv_heads, head_dim], through `UnownedMemory`). Rows are backed by physical pages
of the strategy's page size, which must be a multiple of the driver's granularity
(`cuMemGetAllocationGranularity`, 2 MiB on current GPUs; a smaller `--page-kib` is refused on the
GPU, not rounded up silently): a page is mapped and made accessible (`cuMemMap`, `cuMemSetAccess`)
before the first row in it is written, and unmapped (`cuMemUnmap`) by `release_rows`, after the
device has finished every kernel queued so far (a write or copy of an earlier step may still be
running when the strategy frees the page; PyTorch's expandable segments synchronise the same way).
As in vAttention, physical allocations are not given back on unmap: an unmapped page's allocation
waits on a free list for the next page to map, so mapping costs `cuMemCreate` only while the pool
grows past its high-water mark, and `cuMemRelease` runs at `close` (the clock charges a mapping
cuMemMap + cuMemSetAccess: `workbench.presets`). Reading an unmapped page is an illegal address, so
the kernels reading only written rows is checked by the hardware.

Lifetime: `close()` (the engine calls it when a run ends, failed runs included) unmaps and releases
everything and gives the ranges back; a pool that is dropped without it is closed by a finalizer
once its last array is gone. The arrays keep a small `Reservation` alive, never the pool itself, so
no reference cycle delays that until a garbage collection.

The bookkeeping (which pages a set of rows touches, which are mapped) is plain Python over a
`Driver`; `CudaDriver` is the only code that calls CUDA, one call per method, so everything else is
tested on any machine with a recording driver. On the CPU backends `EmulatedDriver` stands in: the
reserved range is host memory, mapping zeroes a page and unmapping fills it with NaN bytes, so a kernel
reading a released page computes NaN and fails verification, as it would fault on the GPU.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import numpy as np

from workbench.engine.kvpool import STORAGE_DTYPES, KVPool
from workbench.intmath import cdiv


def round_up(size_bytes: int, granularity_bytes: int) -> int:
    return cdiv(size_bytes, granularity_bytes) * granularity_bytes


def pages_of_rows(rows: np.ndarray, row_bytes: int, page_bytes: int) -> np.ndarray:
    """Sorted distinct pages holding any byte of these rows (int64 [k] row indices) -> int64 [m]."""
    rows = np.asarray(rows, dtype=np.int64)
    first = rows * row_bytes // page_bytes  # [k]
    last = ((rows + 1) * row_bytes - 1) // page_bytes  # [k]; > first + 1 only when a row spans pages
    spans = last - first + 1
    offsets = np.arange(int(spans.sum()), dtype=np.int64) - np.repeat(np.cumsum(spans) - spans, spans)
    return np.unique(np.repeat(first, spans) + offsets)


def pages_within_rows(start_row: int, stop_row: int, row_bytes: int, page_bytes: int) -> range:
    """Pages lying entirely inside rows [start_row, stop_row): those a release may unmap (a page shared
    with a row outside the range stays)."""
    first = cdiv(start_row * row_bytes, page_bytes)
    return range(first, stop_row * row_bytes // page_bytes)


class Driver(Protocol):
    """The CUDA virtual memory calls, one per method (addresses and handles are ints)."""

    def granularity(self) -> int: ...
    def synchronize(self) -> None: ...
    def reserve(self, size_bytes: int) -> int: ...
    def create(self, size_bytes: int) -> int: ...
    def map(self, address: int, size_bytes: int, handle: int) -> None: ...
    def set_access(self, address: int, size_bytes: int) -> None: ...
    def unmap(self, address: int, size_bytes: int) -> None: ...
    def release(self, handle: int) -> None: ...
    def free(self, address: int, size_bytes: int) -> None: ...


class VirtualBuffer:
    """One reserved virtual range with pages mapped on demand. Mutating methods say so.

    `page_bytes` (default: the driver's granularity) must be a multiple of the granularity, the only
    sizes cuMemMap takes."""

    def __init__(self, size_bytes: int, driver: Driver, page_bytes: int | None = None) -> None:
        self.driver = driver
        granularity = driver.granularity()
        self.page_bytes = granularity if page_bytes is None else page_bytes
        if self.page_bytes <= 0 or self.page_bytes % granularity:
            raise ValueError(f"a page of {self.page_bytes} bytes is not a multiple of the driver's mapping "
                             f"granularity of {granularity} bytes")
        self.size_bytes = round_up(size_bytes, self.page_bytes)
        self.address = driver.reserve(self.size_bytes)
        self.handles: dict[int, int] = {}  # mapped page -> its physical allocation
        self.spare: list[int] = []  # physical allocations unmapped and kept for reuse (vAttention's free list)

    def map_pages(self, pages) -> int:
        """Mutates. Back these pages with physical memory (those not mapped yet), reusing spare
        allocations before creating any; returns how many were mapped."""
        new = [p for p in dict.fromkeys(int(p) for p in pages) if p not in self.handles]
        for page in new:
            if not 0 <= page < self.size_bytes // self.page_bytes:
                raise ValueError(f"page {page} outside the reserved {self.size_bytes} bytes")
            handle = self.spare.pop() if self.spare else self.driver.create(self.page_bytes)
            address = self.address + page * self.page_bytes
            self.driver.map(address, self.page_bytes, handle)
            self.driver.set_access(address, self.page_bytes)
            self.handles[page] = handle
        return len(new)

    def unmap_pages(self, pages) -> int:
        """Mutates. Unmap these pages (those mapped), keeping their allocations as spares; returns how
        many were unmapped. Waits for the device first: a kernel queued earlier may still touch them."""
        gone = [p for p in dict.fromkeys(int(p) for p in pages) if p in self.handles]
        if gone:
            self.driver.synchronize()
        for page in gone:
            self.driver.unmap(self.address + page * self.page_bytes, self.page_bytes)
            self.spare.append(self.handles.pop(page))
        return len(gone)

    def close(self) -> None:
        """Mutates. Unmap everything, release every physical allocation and give the virtual range back."""
        self.unmap_pages(list(self.handles))
        while self.spare:
            self.driver.release(self.spare.pop())
        self.driver.free(self.address, self.size_bytes)


def current_device(cu) -> int:
    """The device of the calling thread's current CUDA context, after `cuInit` (what vAttention checks
    before its first cuMem call): the virtual memory calls act on that context, and with none current
    they fail with an error that does not say so. `cu` is `cuda.bindings.driver` (or a stand-in)."""
    for name, result in (("cuInit", cu.cuInit(0)), ("cuCtxGetCurrent", cu.cuCtxGetCurrent())):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{name} failed: {err}")
    if not int(rest[0]):
        raise RuntimeError("no current CUDA context on this thread: initialise the device through CuPy first "
                           "(cupy.cuda.Device(i).use() and a first call such as synchronize())")
    err, device = cu.cuCtxGetDevice()
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuCtxGetDevice failed: {err}")
    return int(device)


class CudaDriver:
    """`Driver` over `cuda.bindings.driver` for `device`. Construct it with `current()` on a thread whose
    current context is the device's (the constructor only builds the descriptors, needing no device)."""

    @classmethod
    def current(cls, device: int) -> CudaDriver:
        """The driver for `device`, after checking that the current context belongs to it: CuPy and the
        driver calls must agree on the device, or the pages land where the arrays do not look."""
        from cuda.bindings import driver as cu
        found = current_device(cu)
        if found != device:
            raise RuntimeError(f"the current CUDA context is on device {found}, the KV pool's arrays on "
                               f"device {device}")
        return cls(device)

    def __init__(self, device: int) -> None:
        from cuda.bindings import driver as cu
        self.cu = cu
        self.device = device
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        self.prop = prop
        access = cu.CUmemAccessDesc()
        access.location = prop.location
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.access = access

    def _call(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA virtual memory call failed: {err}")
        return rest[0] if rest else None

    def granularity(self) -> int:
        flag = self.cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        return int(self._call(self.cu.cuMemGetAllocationGranularity(self.prop, flag)))

    def synchronize(self) -> None:
        self._call(self.cu.cuCtxSynchronize())  # every stream of the context: a write may be on any

    def reserve(self, size_bytes: int) -> int:
        return int(self._call(self.cu.cuMemAddressReserve(size_bytes, 0, 0, 0)))

    def create(self, size_bytes: int) -> int:
        return int(self._call(self.cu.cuMemCreate(size_bytes, self.prop, 0)))

    def map(self, address: int, size_bytes: int, handle: int) -> None:
        self._call(self.cu.cuMemMap(address, size_bytes, 0, handle, 0))

    def set_access(self, address: int, size_bytes: int) -> None:
        self._call(self.cu.cuMemSetAccess(address, size_bytes, [self.access], 1))

    def unmap(self, address: int, size_bytes: int) -> None:
        self._call(self.cu.cuMemUnmap(address, size_bytes))

    def release(self, handle: int) -> None:
        self._call(self.cu.cuMemRelease(handle))

    def free(self, address: int, size_bytes: int) -> None:
        self._call(self.cu.cuMemAddressFree(address, size_bytes))

    def view(self, address: int, shape: tuple[int, ...], dtype: np.dtype, owner):
        """A CuPy array over a reserved range; `owner` keeps the range alive. The device is given, not looked
        up: CuPy would ask the driver about a range whose pages are not mapped yet."""
        import cupy
        nbytes = int(np.prod(shape)) * dtype.itemsize
        memory = cupy.cuda.UnownedMemory(address, nbytes, owner, device_id=self.device)
        return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


class EmulatedDriver:
    """`Driver` over host memory with pages of `page_bytes`, for the CPU backends. `view` is the array
    over a reserved range. Untouched host memory stays uncommitted (NumPy zeros), so a large reserved
    range costs the pages written, as on the GPU."""

    _SPAN = 1 << 48  # address space of one reservation: its base is a multiple of this

    def __init__(self, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.ranges: dict[int, np.ndarray] = {}  # base address -> uint8 [size_bytes]
        self.num_reserved = 0  # reservations so far: the next one's base, never one still in use
        self.next_handle = 0

    def granularity(self) -> int:
        return self.page_bytes

    def synchronize(self) -> None:
        pass  # the CPU backends return when their kernels have finished

    def reserve(self, size_bytes: int) -> int:
        self.num_reserved += 1
        base = self.num_reserved * self._SPAN
        self.ranges[base] = np.zeros(size_bytes, dtype=np.uint8)
        return base

    def create(self, size_bytes: int) -> int:
        self.next_handle += 1
        return self.next_handle

    def map(self, address: int, size_bytes: int, handle: int) -> None:
        self._bytes(address, size_bytes)[:] = 0

    def set_access(self, address: int, size_bytes: int) -> None:
        pass  # host memory is always accessible; `unmap` poisons what may no longer be read

    def unmap(self, address: int, size_bytes: int) -> None:
        self._bytes(address, size_bytes)[:] = 0xFF  # NaN in every storage dtype (fp32, fp16, bf16, fp8 e4m3)

    def release(self, handle: int) -> None:
        pass

    def free(self, address: int, size_bytes: int) -> None:
        del self.ranges[address]

    def view(self, address: int, shape: tuple[int, ...], dtype: np.dtype, owner) -> np.ndarray:
        del owner  # the range lives as long as this driver
        return self.ranges[address][:int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)

    def _bytes(self, address: int, size_bytes: int) -> np.ndarray:
        base = address - address % self._SPAN
        return self.ranges[base][address - base:address - base + size_bytes]


def cuda_driver() -> CudaDriver:
    """The driver for CuPy's current device, its context made current and checked."""
    import cupy
    device = cupy.cuda.Device()
    device.synchronize()  # a first runtime call: makes the device's primary context current on this thread
    return CudaDriver.current(device.id)


class Reservation:
    """What the K and V arrays keep alive: the two buffers, and through its finalizer their release.
    It holds no array, so the arrays, the pool and it form no reference cycle."""

    def __init__(self, buffers: list[VirtualBuffer]) -> None:
        self.buffers = buffers


def _close_buffers(buffers: list[VirtualBuffer]) -> None:
    for b in buffers:
        b.close()


class VirtualKVArrays:
    """K and V of one layer, [num_slots, num_kv_heads, head_dim] each, in virtual memory: on the GPU
    (the default driver) or emulated in host memory (`EmulatedDriver`).

    `ensure_rows` maps the pages that rows are about to be written into; `release_rows` unmaps the
    pages lying wholly inside a released range of rows. `k` and `v` are the driver's arrays (CuPy on
    the GPU, NumPy emulated) over the ranges. Pages are `page_rows` rows (default: the driver's
    granularity); `close()` gives everything back, and so does a finalizer once this object and both
    arrays are gone."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, kv_dtype: str,
                 driver: CudaDriver | EmulatedDriver | None = None, page_rows: int | None = None) -> None:
        dtype = np.dtype(STORAGE_DTYPES[kv_dtype])
        self.row_bytes = num_kv_heads * head_dim * dtype.itemsize
        driver = cuda_driver() if driver is None else driver
        page_bytes = None if page_rows is None else page_rows * self.row_bytes
        self.buffers = [VirtualBuffer(num_slots * self.row_bytes, driver, page_bytes) for _ in range(2)]
        self._reservation = Reservation(self.buffers)
        self._finalizer = weakref.finalize(self._reservation, _close_buffers, self.buffers)
        # at interpreter exit the process's memory goes with it; the CUDA context may already be torn down
        self._finalizer.atexit = False
        shape = (num_slots, num_kv_heads, head_dim)
        self.k, self.v = (driver.view(b.address, shape, dtype, self._reservation) for b in self.buffers)

    def ensure_rows(self, rows: np.ndarray) -> int:
        """Mutates. Map every page these rows touch in K and V; returns the pages mapped (K and V)."""
        pages = pages_of_rows(rows, self.row_bytes, self.buffers[0].page_bytes)
        return sum(b.map_pages(pages) for b in self.buffers)

    def release_rows(self, start: int, stop: int) -> int:
        """Mutates. Unmap the pages wholly inside rows [start, stop) in K and V; returns how many."""
        pages = pages_within_rows(start, stop, self.row_bytes, self.buffers[0].page_bytes)
        return sum(b.unmap_pages(pages) for b in self.buffers)

    def mapped_bytes(self) -> int:
        return sum(len(b.handles) * b.page_bytes for b in self.buffers)

    def mapped_pages(self) -> np.ndarray:
        """int64 [m], ascending: the pages mapped in K (V maps the same ones)."""
        return np.array(sorted(self.buffers[0].handles), dtype=np.int64)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Mutates. Unmap and release every page and give both ranges back (once; later calls do nothing).
        `k` and `v` must not be used afterwards."""
        self._finalizer()


class VirtualKVPool(KVPool):
    """`KVPool` whose device K/V live in virtual memory: CUDA's on backend `cupy`, emulated with pages
    of `page_rows` rows on the CPU backends. The pages a write, a copy or a swap-in lands in are mapped
    first; `release` unmaps the pages of the slot ranges the strategy unmapped (the step plan's
    `unmapped`), so the mapped pages follow the strategy's, page reuse included (with `--page-reuse on`
    a released extent's pages stay mapped until the strategy reclaims them)."""

    def __init__(self, *args, page_rows: int, **kwargs) -> None:
        self.page_rows = page_rows  # read by _device_arrays, which the base constructor calls
        super().__init__(*args, **kwargs)

    def _device_arrays(self, num_slots: int, num_kv_heads: int, head_dim: int):
        row_bytes = num_kv_heads * head_dim * np.dtype(STORAGE_DTYPES[self.kv_dtype]).itemsize
        page_bytes = self.page_rows * row_bytes
        if self.backend == "cupy":
            driver = cuda_driver()
            check_gpu_page(page_bytes, self.page_rows, row_bytes, driver.granularity())
        else:
            driver = EmulatedDriver(page_bytes)
        self.vmm = VirtualKVArrays(num_slots, num_kv_heads, head_dim, self.kv_dtype, driver, self.page_rows)
        return self.vmm.k, self.vmm.v

    def close(self) -> None:
        self.vmm.close()

    def release(self, ranges: np.ndarray) -> None:
        """Unmap the pages lying wholly inside each slot range [start, stop) of int64 `ranges` [k, 2]."""
        for start, stop in np.asarray(ranges, dtype=np.int64).tolist():
            self.vmm.release_rows(start, stop)

    def write(self, slots: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        self.vmm.ensure_rows(slots[slots >= 0])
        super().write(slots, k_rows, v_rows)

    def copy_blocks(self, copies: np.ndarray, block_size: int) -> None:
        self.vmm.ensure_rows(_block_rows(copies[:, 1], block_size))
        super().copy_blocks(copies, block_size)

    def swap_in(self, moves: np.ndarray, block_size: int) -> None:
        self.vmm.ensure_rows(_block_rows(moves[:, 1], block_size))
        super().swap_in(moves, block_size)


def check_gpu_page(page_bytes: int, page_rows: int, row_bytes: int, granularity_bytes: int) -> None:
    """Raise one line unless a page of the kernel's pool is whole granules: the GPU cannot map less, and
    rounding the page up would model a different `--page-kib` than the run reports."""
    if page_bytes % granularity_bytes:
        raise ValueError(f"--page-kib: a page here is {page_rows} rows x {row_bytes} B = {page_bytes / 1024:g} KiB "
                         f"per K or V buffer of the kernel's pool, not a multiple of the GPU's mapping granularity "
                         f"({granularity_bytes // 1024} KiB); raise --page-kib (or --kernel-heads), or run "
                         f"--kernel numba, which emulates any page size")


def _block_rows(blocks: np.ndarray, block_size: int) -> np.ndarray:
    """Rows of these blocks, int64 [len(blocks) × block_size]."""
    return (np.asarray(blocks, dtype=np.int64)[:, None] * block_size + np.arange(block_size)).ravel()
