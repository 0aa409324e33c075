"""Every CUDA kernel variant compiles with NVRTC 13.0 for sm_80 and sm_90, and ptxas reports no spills."""

from __future__ import annotations

import functools
import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from workbench.kernels import nvrtc, source  # noqa: E402

# (arch, head dims, row tiles compiled): every launcher variant for sm_90 (H100/H200) and sm_80 (A100) in the
# full run; the quick run compiles sm_90's largest per KV dtype and addressing, the largest head dim at the
# most rows per block (a thread's accumulators, and with them registers and spills, grow with both)
TARGETS = [
    pytest.param(("sm_90", (max(source.HEAD_DIMS),), (max(source.ROW_TILES),)), id="sm_90-quick"),
    pytest.param(("sm_90", source.HEAD_DIMS, source.ROW_TILES), id="sm_90", marks=pytest.mark.slow),
    pytest.param(("sm_80", source.HEAD_DIMS, source.ROW_TILES), id="sm_80", marks=pytest.mark.slow),
]
NVCC = shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if os.path.isfile(p)), None)


def test_nvrtc_is_the_cuda_13_0_series():
    """Newer NVRTC emits PTX that 13.0 drivers reject (docs/kernels.md)."""
    assert nvrtc.nvrtc_version() == (13, 0)


def attention_names(head_dims: tuple[int, ...], row_tiles: tuple[int, ...] = source.ROW_TILES) -> list[str]:
    """The launcher's attention variants at these head dims and row tiles, and the merge kernel."""
    return [*source.all_attention_kernel_names(head_dims, row_tiles), source.MERGE_KERNEL_NAME]


@functools.cache
def compiled_for(arch: str, head_dims: tuple[int, ...], row_tiles: tuple[int, ...]) -> list[nvrtc.CompiledModule]:
    """Both sources for one arch; NVRTC releases the GIL, so the two compilations run side by side."""
    jobs = [(source.ATTENTION_CU, attention_names(head_dims, row_tiles)),
            (source.CACHE_OPS_CU, source.cache_kernel_names())]
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        return list(pool.map(lambda job: nvrtc.compile_cubin(job[0], job[1], arch), jobs))


@pytest.fixture(params=TARGETS)
def target(request) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    return request.param


@pytest.fixture
def compiled(target) -> list[nvrtc.CompiledModule]:
    return compiled_for(*target)


def test_every_variant_compiles_without_spills(compiled):
    for module in compiled:
        assert module.cubin[:4] == b"\x7fELF", f"{module.arch}: NVRTC did not return a CUBIN"
        for expression, mangled in module.lowered_names.items():
            report = module.resources.get(mangled)
            assert report is not None, f"{module.arch}: no ptxas report for {expression}"
            assert not report.spills, (
                f"{module.arch}: {expression} spills ({report.spill_store_bytes} B stored, "
                f"{report.spill_load_bytes} B loaded, {report.registers} registers)"
            )
            assert 0 < report.registers <= 255


def test_the_launcher_knows_every_variant():
    """2 addressings x 4 dtypes x 5 head dims x 4 row tiles; 2 cache ops x 2 word sizes + the fp8 write from
    3 model dtypes."""
    assert len(set(source.all_attention_kernel_names())) == 2 * 4 * 5 * 4
    assert len(attention_names(source.HEAD_DIMS)) == 2 * 4 * 5 * 4 + 1
    assert len(attention_names((256,))) == 2 * 4 * 4 + 1
    assert len(attention_names((256,), (8,))) == 2 * 4 + 1
    assert len(set(source.cache_kernel_names())) == 4 + 3


def test_every_requested_variant_is_instantiated(target, compiled):
    attention, cache_ops = compiled
    assert len(attention.lowered_names) == len(attention_names(*target[1:]))
    assert len(cache_ops.lowered_names) == 4 + 3
    assert len(set(attention.lowered_names.values())) == len(attention.lowered_names)


def test_ptxas_report_parser_catches_spills():
    log = "\n".join([
        "ptxas info    : Compiling entry function '_Z1kPf' for 'sm_80'",
        "ptxas info    : Function properties for _Z1kPf",
        "ptxas         .     24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads",
        "ptxas info    : Used 255 registers, used 1 barriers, 24 bytes cumulative stack size",
        "ptxas info    : Compiling entry function '_Z1gPf' for 'sm_80'",
        "ptxas info    : Function properties for _Z1gPf",
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 32 registers, used 0 barriers",
    ])
    report = nvrtc.parse_ptxas_report(log)
    assert report["_Z1kPf"] == nvrtc.KernelResources("_Z1kPf", 255, 24, 16, 8)
    assert report["_Z1kPf"].spills and not report["_Z1gPf"].spills
    assert report["_Z1gPf"].registers == 32


def _text_bytes(cubin: bytes) -> dict[str, int]:
    """Size of each `.text.<mangled entry>` section of an ELF64 CUBIN: the entry's machine code."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]  # sh_offset of the section-name table

    def name(header) -> str:
        start = names_at + header[0]
        return cubin[start:cubin.index(b"\0", start)].decode()

    return {name(h)[len(".text."):]: h[5] for h in headers if name(h).startswith(".text.")}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_builds_the_same_machine_code_from_the_same_options(monkeypatch):
    """nvcc given NVRTC's options emits each cache kernel with the same registers and the same machine code
    size as NVRTC; without --ftz=true the fp8 write (a float division) comes out different, so the
    comparison sees the flags."""
    names = source.cache_kernel_names()
    by_nvrtc = nvrtc.compile_cubin(source.CACHE_OPS_CU, names, "sm_90")
    by_nvcc = nvrtc.nvcc_cubin(NVCC, source.CACHE_OPS_CU, names, "sm_90")
    nvrtc_text, nvcc_text = _text_bytes(by_nvrtc.cubin), _text_bytes(by_nvcc.cubin)
    for expression, mangled in by_nvrtc.lowered_names.items():
        assert by_nvcc.resources[mangled].registers == by_nvrtc.resources[mangled].registers, expression
        assert nvcc_text[mangled] == nvrtc_text[mangled], expression
    monkeypatch.setattr(nvrtc, "CODEGEN_OPTIONS", ())
    without_ftz = _text_bytes(nvrtc.nvcc_cubin(NVCC, source.CACHE_OPS_CU, names, "sm_90").cubin)
    fp8_write = by_nvrtc.lowered_names["kvw::write_cache_fp8<float>"]
    assert without_ftz[fp8_write] != nvrtc_text[fp8_write]


# sm_90 in every run (the machine the latent presets are served on); sm_80 in the full run, as for attention
@pytest.mark.parametrize("arch", [pytest.param("sm_80", marks=pytest.mark.slow), "sm_90"])
def test_every_latent_attention_variant_compiles_without_spills(arch):
    """2 addressings × 4 KV dtypes × dense/sparse at every latent preset's 512 + 64, within the 48 KB of static
    shared memory a block may hold."""
    names = source.all_mla_kernel_names()
    assert len(set(names)) == 2 * 4 * len(source.MLA_DIMS) * 2
    module = nvrtc.compile_cubin(source.MLA_CU, names, arch)
    assert len(set(module.lowered_names.values())) == len(names)
    for expression, mangled in module.lowered_names.items():
        report = module.resources[mangled]
        assert not report.spills, f"{arch}: {expression} spills ({report.spill_store_bytes} B stored)"
        assert 0 < report.registers <= 255
