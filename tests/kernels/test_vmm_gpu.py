"""KV in CUDA virtual memory on a GPU: pages mapped on demand, the decode kernel over a virtual extent,
the same bits as over a plain contiguous pool, then unmapped; a released extent's pages unmapped by the
pool and mapped again by the next write into it.

Marked `gpu`; skipped when CuPy is not installed or sees no device.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    _gpu = bool(cp.cuda.is_available())
except Exception:  # a broken driver install means no GPU here
    _gpu = False
if not _gpu:
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

# after the skip: a machine without a GPU never imports the rest of the GPU path
from workbench import kernels  # noqa: E402
from workbench.engine.kvpool import KVContent, KVPool, content_terms, prefix_sums  # noqa: E402
from workbench.engine.kvpool_vmm import VirtualKVArrays, VirtualKVPool  # noqa: E402

pytestmark = pytest.mark.gpu
HEADS, HEAD_DIM, EXTENT_SLOTS = 8, 128, 4096  # fp16 rows of 2 KiB: 1,024 per 2 MiB page


@pytest.mark.parametrize("kv_dtype", ["fp16", "fp32"])
def test_decode_over_mapped_pages_matches_a_contiguous_pool_bit_for_bit(kv_dtype):
    rng = np.random.default_rng(3)
    lengths = [1500, 1, 1025]  # extents 0..2: a page boundary crossed, a single row, one row past a page
    vmm = VirtualKVArrays(4 * EXTENT_SLOTS, HEADS, HEAD_DIM, kv_dtype)
    plain_k, plain_v = cp.zeros_like(vmm.k), cp.zeros_like(vmm.v)
    content = KVContent(HEADS, HEAD_DIM, kv_dtype)
    try:
        assert vmm.mapped_bytes() == 0
        for extent, length in enumerate(lengths):
            tokens = rng.integers(0, 1000, length).astype(np.int32)
            k, v = content.rows(prefix_sums(content_terms(tokens, np.arange(length))))
            slots = extent * EXTENT_SLOTS + np.arange(length, dtype=np.int64)
            vmm.ensure_rows(slots)
            for kk, vv in ((vmm.k, vmm.v), (plain_k, plain_v)):
                kernels.cache_write(kk, vv, cp.asarray(k), cp.asarray(v), cp.asarray(slots), backend="cupy")
        page = vmm.buffers[0].page_bytes
        touched = sum(-(-n * vmm.row_bytes // page) for n in lengths)
        assert vmm.mapped_bytes() == 2 * touched * page  # K and V: only the pages the rows touch
        q = cp.asarray(rng.standard_normal((3, 4 * HEADS, HEAD_DIM)).astype(np.float32))
        start = cp.asarray(np.arange(3, dtype=np.int32) * EXTENT_SLOTS)
        kv_len = cp.asarray(np.array(lengths, dtype=np.int32))
        out = kernels.contiguous_decode(q, vmm.k, vmm.v, start, kv_len, backend="cupy", kv_dtype=kv_dtype)
        ref = kernels.contiguous_decode(q, plain_k, plain_v, start, kv_len, backend="cupy", kv_dtype=kv_dtype)
        np.testing.assert_array_equal(cp.asnumpy(out), cp.asnumpy(ref))
        cp.cuda.Device().synchronize()
        assert vmm.release_rows(0, 4 * EXTENT_SLOTS) == 2 * touched
        assert vmm.mapped_bytes() == 0
    finally:
        vmm.close()


def test_a_released_extent_is_unmapped_and_maps_again_on_the_next_write():
    rng = np.random.default_rng(5)
    pool = VirtualKVPool(4 * EXTENT_SLOTS, 0, HEADS, HEAD_DIM, "fp16", "cupy", page_rows=1024)
    plain = KVPool(4 * EXTENT_SLOTS, 0, HEADS, HEAD_DIM, "fp16", "cupy")
    content = KVContent(HEADS, HEAD_DIM, "fp16")
    vmm = pool.vmm
    page = vmm.buffers[0].page_bytes

    def pages_of(extent: int, length: int) -> set[int]:
        """The pages rows [0, length) of the extent touch."""
        first = extent * EXTENT_SLOTS * vmm.row_bytes // page
        return set(range(first, -(-(extent * EXTENT_SLOTS + length) * vmm.row_bytes // page)))

    def fill(extent: int, length: int) -> None:
        tokens = rng.integers(0, 1000, length).astype(np.int32)
        k, v = content.rows(prefix_sums(content_terms(tokens, np.arange(length))))
        slots = extent * EXTENT_SLOTS + np.arange(length, dtype=np.int64)
        pool.write(slots, k, v)
        plain.write(slots, k, v)

    try:
        assert EXTENT_SLOTS * vmm.row_bytes % page == 0  # extents are whole pages: a release unmaps all of one
        fill(0, 1500)
        fill(1, 3000)
        assert set(vmm.mapped_pages().tolist()) == pages_of(0, 1500) | pages_of(1, 3000)
        cp.cuda.Device().synchronize()
        pool.release(np.array([[0, EXTENT_SLOTS]]))  # extent 0's request ended: its pages are unmapped
        assert set(vmm.mapped_pages().tolist()) == pages_of(1, 3000)
        assert vmm.mapped_bytes() == 2 * len(pages_of(1, 3000)) * page
        fill(0, 700)  # the next request in extent 0: its page is mapped again
        assert set(vmm.mapped_pages().tolist()) == pages_of(0, 700) | pages_of(1, 3000)
        q = cp.asarray(rng.standard_normal((2, 4 * HEADS, HEAD_DIM)).astype(np.float32))
        start = cp.asarray(np.array([0, EXTENT_SLOTS], dtype=np.int32))
        kv_len = cp.asarray(np.array([700, 3000], dtype=np.int32))
        out = kernels.contiguous_decode(q, pool.k, pool.v, start, kv_len, backend="cupy", kv_dtype="fp16")
        ref = kernels.contiguous_decode(q, plain.k, plain.v, start, kv_len, backend="cupy", kv_dtype="fp16")
        np.testing.assert_array_equal(cp.asnumpy(out), cp.asnumpy(ref))
        cp.cuda.Device().synchronize()
    finally:
        vmm.close()
