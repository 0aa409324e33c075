"""The bookkeeping of KV pools in CUDA virtual memory, on any machine: a recording driver stands in for CUDA,
and the emulated pool of the CPU backends maps, poisons and remaps pages."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import kernels
from workbench.kvpool import KVContent, content_terms, prefix_sums
from workbench.kvpool_vmm import VirtualBuffer, VirtualKVPool, pages_of_rows, pages_within_rows, round_up

MIB = 1 << 20


class RecordingDriver:
    """Every CUDA call as a tuple, with addresses and handles that a real driver could return."""

    def __init__(self, granularity: int = 2 * MIB) -> None:
        self.page = granularity
        self.calls: list[tuple] = []
        self.next_handle = 100

    def granularity(self) -> int:
        return self.page

    def reserve(self, size_bytes: int) -> int:
        self.calls.append(("reserve", size_bytes))
        return 1 << 40

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
    assert driver.calls == [("unmap", base, 2 * MIB)]  # the allocation stays, for the next page mapped
    driver.calls.clear()
    assert buf.map_pages([1]) == 1  # the spare allocation, no cuMemCreate: what the clock charges
    assert driver.calls == [("map", base + 2 * MIB, 2 * MIB, 102), ("access", base + 2 * MIB, 2 * MIB)]
    assert buf.unmap_pages([1, 2]) == 2 and buf.spare == [102, 101]
    driver.calls.clear()
    buf.close()
    assert driver.calls == [("release", 101), ("release", 102), ("free", base, 6 * MIB)]


def test_a_page_outside_the_reservation_is_refused():
    buf = VirtualBuffer(2 * MIB, RecordingDriver())
    with pytest.raises(ValueError, match="outside the reserved"):
        buf.map_pages([1])


def test_the_cuda_driver_describes_device_pages_without_a_device():
    """The descriptors the CUDA calls take are built from the bindings' real types (no device needed)."""
    cu = pytest.importorskip("cuda.bindings.driver")
    from workbench.kvpool_vmm import CudaDriver

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
