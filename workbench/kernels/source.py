"""Find and read the CUDA C sources, in a source checkout (`kernels/`) or an installed wheel (`workbench/_kernels`)."""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from workbench.paths import PACKAGE_DIR, REPO_ROOT

# Every file of the kernel sources; the .cu files are the compilation units, the rest are included.
ATTENTION_CU = "attention.cu"
CACHE_OPS_CU = "cache_ops.cu"
MLA_CU = "mla_attention.cu"
SHIM_HEADER = "cuda_cpu_shim.h"
SHIM_ENTRY = "cuda_cpu_entry.cpp"


@cache
def kernels_dir() -> Path:
    """The folder holding the .cu sources: the checkout's `kernels/` first, else the wheel's `_kernels/`."""
    for candidate in (REPO_ROOT / "kernels", PACKAGE_DIR / "_kernels"):
        if (candidate / ATTENTION_CU).is_file():
            return candidate
    raise FileNotFoundError(
        f"CUDA kernel sources not found: looked for {ATTENTION_CU} in {REPO_ROOT / 'kernels'} (source checkout) "
        f"and {PACKAGE_DIR / '_kernels'} (installed wheel)"
    )


def read_source(name: str) -> str:
    """The text of kernel source `name`, prefixed with `#line 1 "<path>"` so compiler messages name the real file."""
    path = kernels_dir() / name
    return f'#line 1 "{path}"\n' + path.read_text()


def source_files() -> list[Path]:
    """All kernel source files (sorted), for cache keys over everything a compilation may include."""
    return sorted(p for p in kernels_dir().iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp"))


def sources_digest() -> str:
    """SHA-256 over every kernel source file: changes whenever any .cu, .cuh, .h or .cpp changes."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cuda_include_dirs() -> list[Path]:
    """Folders holding cuda_fp16.h and cuda_bf16.h: the nvidia-cuda-runtime wheel, then $CUDA_HOME,
    /usr/local/cuda, then the copies CuPy bundles.

    NVRTC needs only the fp16/bf16 headers; a host compiler (the CPU shim) also needs `crt/host_defines.h`
    and `nv/target` (a toolkit, or the nvidia-cuda-crt and -cccl wheels), so callers pick the first
    folder that has what they need.
    """
    found = []
    try:
        import nvidia.cu13  # the nvidia-cuda-runtime 13.x wheel

        found += [Path(p) / "include" for p in nvidia.cu13.__path__]
    except ImportError:
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found.append(Path(os.environ[env]) / "include")
    found.append(Path("/usr/local/cuda/include"))
    found += _cupy_bundled_headers()
    return [p for p in found if (p / "cuda_fp16.h").is_file() and (p / "cuda_bf16.h").is_file()]


def _cupy_bundled_headers() -> list[Path]:
    """CuPy's own copies of the CUDA 13 fp16/bf16 headers (a machine with cupy-cuda13x and no toolkit)."""
    import importlib.util

    spec = importlib.util.find_spec("cupy")
    if spec is None or not spec.submodule_search_locations:
        return []
    bundled = Path(next(iter(spec.submodule_search_locations))) / "_core" / "include" / "cupy" / "_cuda"
    return sorted(bundled.glob("cuda-13*"), reverse=True)


# Template arguments the launchers instantiate (docs/kernels.md): KV dtype → CUDA type, head dims, row tiles.
CUDA_KV_TYPES = {"fp32": "float", "fp16": "__half", "bf16": "__nv_bfloat16", "fp8": "kvw::Fp8E4M3"}
HEAD_DIMS = (64, 80, 96, 128, 256)
ROW_TILES = (1, 2, 4, 8)  # (query token, query head) rows per attention block
COPY_WORDS = ("uint4", "unsigned short")  # 16-byte words when rows and pointers allow, else 2-byte
FP8_WRITE_SOURCES = ("fp32", "fp16", "bf16")  # model dtypes write_cache_fp8 quantizes from


def attention_kernel_name(addressing: str, kv_dtype: str, head_dim: int, rows: int) -> str:
    """The name expression of one attention instantiation, e.g. `kvw::paged_attention<__half, 128, 4>`."""
    if addressing not in ("paged", "contiguous"):
        raise ValueError(f"addressing must be 'paged' or 'contiguous', got {addressing!r}")
    return f"kvw::{addressing}_attention<{CUDA_KV_TYPES[kv_dtype]}, {head_dim}, {rows}>"


def all_attention_kernel_names(head_dims: tuple[int, ...] = HEAD_DIMS,
                               row_tiles: tuple[int, ...] = ROW_TILES) -> list[str]:
    """Every attention instantiation a launcher may ask for (at these head dims and row tiles)."""
    return [
        attention_kernel_name(addressing, kv_dtype, head_dim, rows)
        for addressing in ("paged", "contiguous")
        for kv_dtype in CUDA_KV_TYPES
        for head_dim in head_dims
        for rows in row_tiles
    ]


def cache_kernel_names() -> list[str]:
    """Every cache-op instantiation: write_cache and copy_blocks per copy word, and the fp8 quantizing
    write_cache_fp8 per model dtype."""
    copies = [f"kvw::{kernel}<{word}>" for kernel in ("write_cache", "copy_blocks") for word in COPY_WORDS]
    return copies + [f"kvw::write_cache_fp8<{CUDA_KV_TYPES[dtype]}>" for dtype in FP8_WRITE_SOURCES]


MERGE_KERNEL_NAME = "kvw::merge_partitions"
# (kv_lora_rank, qk_rope_head_dim) of the latent attention kernels: every latent preset's 512 + 64
MLA_DIMS = ((512, 64),)


def mla_kernel_name(addressing: str, kv_dtype: str, latent: int, rope: int, sparse: bool) -> str:
    """The name expression of one latent attention instantiation, e.g. `kvw::paged_mla_decode<__half, 512, 64,
    false>`."""
    if addressing not in ("paged", "contiguous"):
        raise ValueError(f"addressing must be 'paged' or 'contiguous', got {addressing!r}")
    return f"kvw::{addressing}_mla_decode<{CUDA_KV_TYPES[kv_dtype]}, {latent}, {rope}, {str(sparse).lower()}>"


def all_mla_kernel_names() -> list[str]:
    """Every latent attention instantiation: addressing × KV dtype × dims × dense/sparse."""
    return [mla_kernel_name(addressing, kv_dtype, latent, rope, sparse)
            for addressing in ("paged", "contiguous") for kv_dtype in CUDA_KV_TYPES
            for latent, rope in MLA_DIMS for sparse in (False, True)]
