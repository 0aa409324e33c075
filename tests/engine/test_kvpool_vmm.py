"""The bookkeeping of KV pools in CUDA virtual memory, on any machine: a recording driver stands in for CUDA,
and the emulated pool of the CPU backends maps, poisons and remaps pages."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from workbench import kernels
from workbench.engine.kvpool import KVContent, content_terms, prefix_sums
from workbench.engine.kvpool_vmm import (
    VirtualBuffer,
    VirtualKVArrays,
    VirtualKVPool,
    check_gpu_page,
    current_device,
    pages_of_rows,
    pages_within_rows,
    round_up,
)

MIB = 1 << 20


class RecordingDriver:
    """Every CUDA call as a tuple, with addresses and handles that a real driver could return."""

    def __init__(self, granularity: int = 2 * MIB) -> None:
        self.page = granularity
        self.calls: list[tuple] = []
        self.next_handle = 100

    def granularity(self) -> int:
        return self.page

    def synchronize(self) -> None:
        self.calls.append(("sync",))

    def reserve(self, size_bytes: int) -> int:
        self.calls.append(("reserve", size_bytes))
        return (1 + sum(c[0] == "reserve" for c in self.calls)) << 40

    def create(self, size_bytes: int) -> int:
        self.next_handle += 1
        self.calls.append(("create", size_bytes, self.next_handle))
        return self.next_handle

    def map(self, address: int, size_bytes: int, handle: int) -> None:
        self.calls.append(("map", address, size_bytes, handle))

    def set_access(self, address: int, size_bytes: int) -> None:
        self.calls.append(("access", address, size_bytes))

    def unmap(self, address: int, size_bytes: int) -> None:
        self.calls.append(("unmap", address, size_bytes))

    def release(self, handle: int) -> None:
        self.calls.append(("release", handle))

    def free(self, address: int, size_bytes: int) -> None:
        self.calls.append(("free", address, size_bytes))

    def view(self, address: int, shape, dtype, owner):
        """Stands in for a CuPy array over the range: like one, it keeps `owner` alive."""
        return types.SimpleNamespace(address=address, shape=shape, dtype=dtype, owner=owner)


def test_round_up_to_the_granularity():
    assert round_up(1, 2 * MIB) == 2 * MIB and round_up(4 * MIB, 2 * MIB) == 4 * MIB


def test_pages_of_rows_for_rows_smaller_and_larger_than_a_page():
    # Llama-3-8B fp16 rows of 2 KiB: 1,024 rows per 2 MiB page
    assert pages_of_rows(np.array([0, 1023, 1024, 5000]), 2048, 2 * MIB).tolist() == [0, 1, 4]
    # a row straddling two pages touches both
    assert pages_of_rows(np.array([2]), 3 * MIB // 4, 2 * MIB).tolist() == [0, 1]
    # rows larger than a page span several
    assert pages_of_rows(np.array([1]), 5 * MIB, 2 * MIB).tolist() == [2, 3, 4]


def test_a_release_unmaps_only_pages_wholly_inside_the_rows():
    assert list(pages_within_rows(1024, 4096, 2048, 2 * MIB)) == [1, 2, 3]
    assert list(pages_within_rows(1000, 2100, 2048, 2 * MIB)) == [1]  # pages 0 and 2 hold rows outside
    assert list(pages_within_rows(10, 20, 2048, 2 * MIB)) == []


def test_a_page_is_mapped_once_its_allocation_reused_after_an_unmap_and_released_at_close():
    driver = RecordingDriver()
    buf = VirtualBuffer(5 * MIB, driver)
    assert buf.size_bytes == 6 * MIB and driver.calls == [("reserve", 6 * MIB)]
    base = buf.address
    assert buf.map_pages([2, 0, 2]) == 2
    assert buf.map_pages([0]) == 0  # already mapped: no call
    assert driver.calls[1:] == [("create", 2 * MIB, 101), ("map", base + 4 * MIB, 2 * MIB, 101),
                                ("access", base + 4 * MIB, 2 * MIB), ("create", 2 * MIB, 102),
                                ("map", base, 2 * MIB, 102), ("access", base, 2 * MIB)]
    driver.calls.clear()
    assert buf.unmap_pages([0, 1]) == 1
    assert driver.calls == [("sync",), ("unmap", base, 2 * MIB)]  # the allocation stays, for the next page mapped
    driver.calls.clear()
    assert buf.map_pages([1]) == 1  # the spare allocation, no cuMemCreate: what the clock charges
    assert driver.calls == [("map", base + 2 * MIB, 2 * MIB, 102), ("access", base + 2 * MIB, 2 * MIB)]
    assert buf.unmap_pages([1, 2]) == 2 and buf.spare == [102, 101]
    driver.calls.clear()
    buf.close()
    assert driver.calls == [("release", 101), ("release", 102), ("free", base, 6 * MIB)]


def test_unmapping_waits_for_the_device_once_and_only_when_something_is_unmapped():
    """A write or copy kernel queued by an earlier step may still run when the strategy frees its page."""
    driver = RecordingDriver()
    buf = VirtualBuffer(8 * MIB, driver)
    buf.map_pages([0, 1, 3])
    driver.calls.clear()
    assert buf.unmap_pages([2]) == 0 and driver.calls == []  # nothing mapped there: no wait
    assert buf.unmap_pages([0, 1, 3]) == 3
    assert [c[0] for c in driver.calls] == ["sync", "unmap", "unmap", "unmap"]
    buf.map_pages([2])
    driver.calls.clear()
    buf.close()  # closing unmaps what is still mapped: the same wait first
    assert [c[0] for c in driver.calls] == ["sync", "unmap", "release", "release", "release", "free"]


def test_pages_are_whole_granules_of_the_driver():
    driver = RecordingDriver()
    buf = VirtualBuffer(16 * MIB, driver, page_bytes=4 * MIB)
    buf.map_pages([1])
    page1 = buf.address + 4 * MIB
    assert driver.calls[-2:] == [("map", page1, 4 * MIB, 101), ("access", page1, 4 * MIB)]
    for page_bytes in (MIB, 3 * MIB, 0):
        with pytest.raises(ValueError, match="not a multiple of the driver's mapping granularity"):
            VirtualBuffer(16 * MIB, driver, page_bytes=page_bytes)


def test_a_page_kib_below_the_gpu_granularity_is_refused_in_one_line():
    check_gpu_page(2 * MIB, 1024, 2048, 2 * MIB)  # Llama-3-8B fp16 rows, --page-kib 2048: one granule
    check_gpu_page(4 * MIB, 2048, 2048, 2 * MIB)
    with pytest.raises(ValueError) as raised:
        check_gpu_page(64 * 1024, 32, 2048, 2 * MIB)  # vAttention's 64 KiB pages need its driver extension
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--page-kib") and "64 KiB" in message and "2048 KiB" in message


class FakeCu:
    """`cuda.bindings.driver` as far as the context check uses it, in a chosen state."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_NO_DEVICE = 100

    def __init__(self, init=0, context=0x1234, device=0) -> None:
        self.init, self.context, self.device = init, context, device

    def cuInit(self, flags):
        return (self.init,)

    def cuCtxGetCurrent(self):
        return (0, self.context)

    def cuCtxGetDevice(self):
        return (0, self.device)


def test_the_context_check_needs_cuinit_and_a_current_context():
    assert current_device(FakeCu(device=2)) == 2
    with pytest.raises(RuntimeError, match="cuInit failed: 100"):
        current_device(FakeCu(init=FakeCu.CUresult.CUDA_ERROR_NO_DEVICE))
    with pytest.raises(RuntimeError, match="no current CUDA context"):
        current_device(FakeCu(context=0))


def test_a_dropped_pool_is_released_once_its_last_array_goes_without_a_garbage_collection():
    driver = RecordingDriver()
    arrays = VirtualKVArrays(4096, 8, 128, "fp16", driver)  # 2 KiB rows: 4 pages per buffer
    arrays.ensure_rows(np.arange(1500))
    k = arrays.k
    del arrays  # k still holds the range: nothing is given back
    assert not any(c[0] in ("unmap", "free") for c in driver.calls)
    del k  # no reference cycle: the finalizer runs now, not at some later collection
    assert [c for c in driver.calls if c[0] == "free"] == [("free", 2 << 40, 8 * MIB), ("free", 3 << 40, 8 * MIB)]
    assert sum(c[0] == "release" for c in driver.calls) == 4  # two pages each in K and V


def test_close_releases_everything_once():
    driver = RecordingDriver()
    arrays = VirtualKVArrays(4096, 8, 128, "fp16", driver)
    arrays.ensure_rows(np.array([0]))
    arrays.close()
    arrays.close()
    assert arrays.closed and sum(c[0] == "free" for c in driver.calls) == 2
    assert sum(c[0] == "release" for c in driver.calls) == 2


def test_the_cuda_driver_views_a_range_on_its_own_device(monkeypatch):
    """CuPy is told the device: looking it up on a range with nothing mapped fails."""
    pytest.importorskip("cuda.bindings.driver")
    from workbench.engine.kvpool_vmm import CudaDriver

    made = {}

    def unowned(address, nbytes, owner, device_id=None):
        made.update(address=address, nbytes=nbytes, owner=owner, device_id=device_id)
        return "memory"

    cuda = types.SimpleNamespace(UnownedMemory=unowned, MemoryPointer=lambda memory, offset: (memory, offset))
    fake = types.SimpleNamespace(cuda=cuda, ndarray=lambda shape, dtype, pointer: (shape, dtype, pointer))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    owner = object()
    view = CudaDriver(device=3).view(1 << 40, (4, 2, 8), np.dtype(np.float16), owner)
    assert view == ((4, 2, 8), np.dtype(np.float16), ("memory", 0))
    assert made == dict(address=1 << 40, nbytes=128, owner=owner, device_id=3)


def test_a_page_outside_the_reservation_is_refused():
    buf = VirtualBuffer(2 * MIB, RecordingDriver())
    with pytest.raises(ValueError, match="outside the reserved"):
        buf.map_pages([1])


def test_the_cuda_driver_describes_device_pages_without_a_device():
    """The descriptors the CUDA calls take are built from the bindings' real types (no device needed)."""
    cu = pytest.importorskip("cuda.bindings.driver")
    from workbench.engine.kvpool_vmm import CudaDriver

    driver = CudaDriver(device=0)
    assert driver.prop.type == cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    assert driver.prop.location.type == cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    assert driver.access.location.id == 0
    assert driver.access.flags == cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE


HEADS, HEAD_DIM, PAGE_ROWS = 2, 16, 32


def _decode(pool, start: int, length: int) -> np.ndarray:
    q = np.random.default_rng(0).standard_normal((1, 2 * HEADS, HEAD_DIM)).astype(np.float32)
    return kernels.contiguous_decode(q, pool.k, pool.v, np.array([start], dtype=np.int32),
                                     np.array([length], dtype=np.int32), backend="numba", kv_dtype=pool.kv_dtype)


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "bf16", "fp8"])
def test_the_emulated_pool_maps_on_write_and_a_released_page_reads_as_nan(kv_dtype):
    pool = VirtualKVPool(4 * PAGE_ROWS, 0, HEADS, HEAD_DIM, kv_dtype, "numba", page_rows=PAGE_ROWS)
    content = KVContent(HEADS, HEAD_DIM, kv_dtype)
    tokens = np.arange(40, dtype=np.int32)
    k, v = content.rows(prefix_sums(content_terms(tokens, np.arange(40))))
    assert pool.vmm.mapped_pages().tolist() == []
    pool.write(np.arange(40, dtype=np.int64), k, v)
    assert pool.vmm.mapped_pages().tolist() == [0, 1]  # rows 0..39 in pages of 32 rows
    assert np.isfinite(_decode(pool, 0, 40)).all()
    pool.release(np.array([[32, 64]]))  # the second page only
    assert pool.vmm.mapped_pages().tolist() == [0]
    assert np.isfinite(_decode(pool, 0, 32)).all() and np.isnan(_decode(pool, 0, 40)).all()
    pool.release(np.array([[0, 16], [0, 32]]))  # a range short of a page unmaps nothing
    assert pool.vmm.mapped_pages().tolist() == []
    pool.write(np.arange(8, dtype=np.int64), k[:8], v[:8])  # mapped again, zeroed, written
    assert pool.vmm.mapped_pages().tolist() == [0] and np.isfinite(_decode(pool, 0, 8)).all()
