"""The CPU shim itself: shuffle semantics, per-block shared memory, aborts on planted barrier bugs, and the
planted bugs that a GPU would expose but threads run in index order would hide: a missing __syncthreads, a
shuffle used as a fence, a read past a __shared__ array."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.kernels import cuda_cpu, cuda_launches, source

HERE = Path(__file__).resolve().parent
PROBE_CU = HERE / "shim_probe.cu"
PROBE_ENTRY = HERE / "shim_probe_entry.cpp"

try:
    cuda_cpu.shim_include_dir()
except cuda_cpu.ShimBuildError as exc:
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture(scope="module")
def probe_path() -> Path:
    return cuda_cpu.build_library(PROBE_ENTRY, depends=(PROBE_CU,))


@pytest.fixture(scope="module")
def probe(probe_path):
    lib = ctypes.CDLL(str(probe_path))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.probe_shuffle.argtypes = [p, i, i, i]
    lib.probe_reverse.argtypes = [p, p, i, i, i]
    lib.probe_planted.argtypes = [i, i, p]
    lib.probe_set_order.argtypes = [i, ctypes.c_ulonglong]
    yield lib
    lib.probe_set_order(cuda_cpu.THREAD_ORDERS["shuffled"], cuda_cpu.DEFAULT_ORDER_SEED)


def _line_of(function: str, needle: str, occurrence: int = 0) -> int:
    """1-based line of the `occurrence`-th `needle` inside `function` of shim_probe.cu."""
    lines = PROBE_CU.read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if f"void {function}(" in line)
    hits = [n for n in range(start, len(lines)) if needle in lines[n]]
    return hits[occurrence] + 1


@pytest.mark.parametrize("blocks, threads", [(1, 32), (3, 128), (5, 64)])
def test_shuffles_exchange_within_each_warp(probe, blocks, threads):
    out = np.full((blocks * threads, 4), -1, dtype=np.int32)
    probe.probe_shuffle(out.ctypes.data, blocks, threads, 2)
    tid = np.arange(blocks * threads)
    block, t = tid // threads, tid % threads
    warp_base, lane = t - t % 32, t % 32
    value = lambda thread: 1000 * block + thread
    np.testing.assert_array_equal(out[:, 0], value(warp_base + (lane ^ 5)))
    np.testing.assert_array_equal(out[:, 1], value(warp_base + (lane + 7) % 32))
    np.testing.assert_array_equal(out[:, 2], value(np.where(lane + 3 < 32, t + 3, t)))
    np.testing.assert_array_equal(out[:, 3], 32 * 1000 * block + 32 * warp_base + 31 * 32 // 2)


@pytest.mark.parametrize("os_threads", [1, 2, 4])
def test_shared_memory_is_per_block_across_os_threads(probe, os_threads):
    blocks, threads = 37, 96
    data = np.random.default_rng(os_threads).integers(0, 1 << 30, size=blocks * threads, dtype=np.int32)
    out = np.full_like(data, -1)
    probe.probe_reverse(data.ctypes.data, out.ctypes.data, blocks, threads, os_threads)
    np.testing.assert_array_equal(out, data.reshape(blocks, threads)[:, ::-1].reshape(-1))


def _run_bug(probe_path: Path, which: int, entry: str = "probe_bug({which}, out_ptr)") -> subprocess.CompletedProcess:
    code = (
        "import ctypes, sys, numpy as np\n"
        f"lib = ctypes.CDLL({str(probe_path)!r})\n"
        "out = np.zeros(64, dtype=np.int32)\n"
        "out_ptr = ctypes.c_void_p(out.ctypes.data)\n"
        f"lib.{entry.format(which=which)}\n"
        "print('returned normally')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_divergent_syncthreads_aborts_with_both_sites(probe_path):
    result = _run_bug(probe_path, 0)
    first = _line_of("divergent_syncthreads", "__syncthreads();", 0)
    second = _line_of("divergent_syncthreads", "__syncthreads();", 1)
    assert result.returncode != 0 and "returned normally" not in result.stdout
    assert re.search(
        rf"cuda_cpu_shim: divergent __syncthreads in block \(0,0,0\): thread \(0,0,0\) waits at __syncthreads "
        rf"\S*shim_probe\.cu:{first}, but thread \(32,0,0\) waits at __syncthreads \S*shim_probe\.cu:{second}",
        result.stderr,
    ), result.stderr


def test_thread_exiting_before_syncthreads_aborts(probe_path):
    result = _run_bug(probe_path, 1)
    line = _line_of("exit_before_syncthreads", "__syncthreads();")
    assert result.returncode != 0 and "returned normally" not in result.stdout
    assert re.search(
        rf"divergent __syncthreads in block \(0,0,0\): thread \(0,0,0\) waits at __syncthreads "
        rf"\S*shim_probe\.cu:{line}, but thread \(37,0,0\) has exited",
        result.stderr,
    ), result.stderr


def test_divergent_shuffle_aborts(probe_path):
    result = _run_bug(probe_path, 2)
    even = _line_of("divergent_shuffle", "__shfl_xor_sync", 1)
    odd = _line_of("divergent_shuffle", "__shfl_xor_sync", 0)
    assert result.returncode != 0 and "returned normally" not in result.stdout
    found = re.search(
        rf"divergent warp shuffle in block \(0,0,0\): thread \((\d+),0,0\) waits at a warp shuffle "
        rf"\S*shim_probe\.cu:{even}, but thread \((\d+),0,0\) waits at a warp shuffle \S*shim_probe\.cu:{odd}",
        result.stderr,
    )
    assert found, result.stderr
    even_lane, odd_lane = int(found[1]), int(found[2])  # a pair of xor-1 partners, whichever met first
    assert even_lane % 2 == 0 and odd_lane == even_lane + 1


def _planted(probe, which: int, order: str, salt: int) -> np.ndarray:
    """out [64] of planted bug `which` (0 missing __syncthreads, 1 shuffle as a fence) run in `order`; the
    salt changes what every thread writes, so a stale read (shared memory outlives a launch) shows."""
    probe.probe_set_order(cuda_cpu.THREAD_ORDERS[order], cuda_cpu.DEFAULT_ORDER_SEED)
    out = np.full(64, -1, dtype=np.int32)
    probe.probe_planted(which, salt, out.ctypes.data)
    return out


def test_a_missing_syncthreads_is_caught_once_threads_leave_index_order(probe):
    """Thread t reads thread t - 1's write with no barrier: index order hides it (the shim's old schedule)."""
    expected = lambda salt: salt - 1 + np.arange(64)
    np.testing.assert_array_equal(_planted(probe, 0, "index", 1000), expected(1000))
    for salt, order in enumerate(["reversed", "shuffled"], start=2000):
        assert (_planted(probe, 0, order, salt) != expected(salt)).any(), order


@pytest.mark.parametrize("order", ["index", "reversed", "shuffled"])
def test_a_shuffle_used_as_a_fence_is_caught_in_every_order(probe, order):
    """A lane passes a shuffle once its partner is there, before the rest of its warp has written."""
    salt = 3000 + cuda_cpu.THREAD_ORDERS[order]
    lane = np.arange(64) % 32
    expected = salt + (np.arange(64) - lane) + (lane + 2) % 32
    assert (_planted(probe, 1, order, salt) != expected).any()


def test_a_missing_syncwarp_is_caught_once_lanes_leave_index_order(probe):
    """Lane l reads lane l + 1's shared write: behind __syncwarp every order gives it, without it only some."""
    lane = np.arange(64) % 32
    expected = lambda salt: salt + (np.arange(64) - lane) + (lane + 1) % 32
    for salt, order in enumerate(["index", "reversed", "shuffled"], start=4000):
        np.testing.assert_array_equal(_planted(probe, 4, order, salt), expected(salt), err_msg=order)
    for salt, order in enumerate(["reversed", "shuffled"], start=5000):
        assert (_planted(probe, 3, order, salt) != expected(salt)).any(), order


def test_divergent_syncwarp_aborts_with_both_sites(probe_path):
    result = _run_bug(probe_path, 3)
    odd = _line_of("divergent_syncwarp", "__syncwarp();", 0)
    even = _line_of("divergent_syncwarp", "__syncwarp();", 1)
    assert result.returncode != 0 and "returned normally" not in result.stdout
    found = re.search(
        r"divergent __syncwarp in block \(0,0,0\): thread \((\d+),0,0\) waits at __syncwarp "
        r"\S*shim_probe\.cu:(\d+), but thread \((\d+),0,0\) waits at __syncwarp \S*shim_probe\.cu:(\d+)",
        result.stderr,
    )
    assert found, result.stderr
    sites = {int(found[1]) % 2: int(found[2]), int(found[3]) % 2: int(found[4])}
    assert sites == {1: odd, 0: even}


def test_a_read_past_a_shared_array_aborts_with_its_line(probe_path):
    """The shim is built with -fsanitize=bounds: the read would otherwise return the next row's element."""
    result = _run_bug(probe_path, 2, "probe_planted({which}, 7, out_ptr)")
    line = _line_of("shared_past_end", "out[threadIdx.x] = s[")
    assert result.returncode != 0 and "returned normally" not in result.stdout
    assert re.search(rf"shim_probe\.cu:{line}:\d+: runtime error: index 32 out of bounds for type 'int ?\[32\]'",
                     result.stderr), result.stderr


def test_shim_build_registers_every_kernel_the_gpu_launcher_compiles():
    names = [*source.all_attention_kernel_names(), source.MERGE_KERNEL_NAME, *source.cache_kernel_names()]
    assert [n for n in names if not cuda_cpu.has_kernel(n)] == []
    assert not cuda_cpu.has_kernel("kvw::paged_attention<float, 72, 1>")


def test_launch_checks_argument_sizes_against_parameters():
    """A launch whose scalar has the wrong width (int64 for an int parameter) fails with the kernel's name."""
    pool = np.zeros((4, 1, 8), dtype=np.float32)
    bad = cuda_launches.Launch(source.CACHE_OPS_CU, "kvw::write_cache<unsigned short>", (1, 1, 1), (32, 1, 1),
                               (pool, pool, np.zeros(1, dtype=np.int64), np.int64(16), pool, pool))
    with pytest.raises(ValueError, match=r"write_cache<unsigned short>: argument 3 has 8 bytes, the parameter 4"):
        cuda_cpu.run([bad])
    missing = cuda_launches.Launch(source.CACHE_OPS_CU, "kvw::write_cache<unsigned short>", (1, 1, 1), (32, 1, 1),
                                   (pool, pool))
    with pytest.raises(ValueError, match="takes 6 arguments, got 2"):
        cuda_cpu.run([missing])
