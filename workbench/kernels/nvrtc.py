"""Compile the kernel sources with NVRTC (no GPU needed) and read ptxas's register / spill report.

Uses the public NVRTC bindings of `cuda-bindings` (CuPy's own compile call queries a device). The
NVRTC in use must be the CUDA 13.0 series: newer NVRTC emits PTX that 13.0 drivers reject.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from workbench.kernels.source import cuda_include_dirs, kernels_dir, read_source

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\d+)'")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<spill_stores>\d+) bytes spill stores, "
    r"(?P<spill_loads>\d+) bytes spill loads"
)
_REGS = re.compile(r"Used (?P<registers>\d+) registers")


@dataclass(frozen=True)
class KernelResources:
    """ptxas's report for one compiled entry function."""

    mangled_name: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass(frozen=True)
class CompiledModule:
    """One NVRTC compilation: the CUBIN, the mangled name of each name expression, and the ptxas report."""

    arch: str
    cubin: bytes
    lowered_names: dict[str, str]  # name expression -> mangled entry name
    resources: dict[str, KernelResources]  # mangled entry name -> report
    log: str


class NvrtcError(RuntimeError):
    """NVRTC rejected the source; the message carries the compiler log."""


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return major, minor


# Code generation options of every build of the kernels: NVRTC (the CuPy launcher, the compile checks, the
# SASS table) and nvcc (`nvcc_cubin`), so a register or SASS report read from either is the GPU's kernel.
# --ftz=true: float32 subnormals flush to zero (docs/kernels.md "Flush to zero"): exp2f becomes one
# MUFU.EX2, ~8% fewer instructions in the decode loop. NVRTC 13 and nvcc 13 both default to C++17.
CODEGEN_OPTIONS = ("--ftz=true",)


def source_options() -> list[str]:
    """Options shared by the NVRTC compile checks, the CuPy launcher (which adds the target itself) and nvcc."""
    includes = cuda_include_dirs()
    if not includes:
        raise NvrtcError("cuda_fp16.h not found: install nvidia-cuda-runtime 13.0 or point CUDA_HOME at a toolkit")
    return [f"-I{kernels_dir()}", f"-I{includes[0]}", *CODEGEN_OPTIONS]


def compile_cubin(source_name: str, name_expressions: list[str], arch: str) -> CompiledModule:
    """Compile kernel source `source_name` to a CUBIN for `arch` (e.g. "sm_80"), instantiating `name_expressions`.

    Raises NvrtcError with the compiler log when compilation fails.
    """
    from cuda.bindings import nvrtc

    text = read_source(source_name).encode()
    (program,) = _check(nvrtc.nvrtcCreateProgram(text, source_name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expression in name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(program, expression.encode()), f"nvrtcAddNameExpression {expression}")
        options = [o.encode() for o in [f"--gpu-architecture={arch}", *source_options(), "--ptxas-options=-v"]]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        log = _program_log(program)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"NVRTC failed to compile {source_name} for {arch} ({status.name}):\n{log}")
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        lowered = {}
        for expression in name_expressions:
            (name,) = _check(nvrtc.nvrtcGetLoweredName(program, expression.encode()), "nvrtcGetLoweredName")
            lowered[expression] = name.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return CompiledModule(arch=arch, cubin=cubin, lowered_names=lowered, resources=parse_ptxas_report(log), log=log)


def nvcc_cubin(nvcc: str, source_name: str, name_expressions: list[str], arch: str) -> CompiledModule:
    """`compile_cubin` with nvcc instead of NVRTC, from the same options: a translation unit that includes
    `source_name` and takes each name expression's address (which instantiates it), built with `-cubin
    -Xptxas -v`. Mangled names come from NVRTC (the same front end mangles alike).

    Raises NvrtcError with nvcc's output when it fails.
    """
    lowered = compile_cubin(source_name, name_expressions, arch).lowered_names
    entries = ", ".join(f"(const void*)&{expression}" for expression in name_expressions)
    unit = f'#include "{source_name}"\nextern const void* const kvw_instantiated[] = {{{entries}}};\n'
    with tempfile.TemporaryDirectory() as tmp:
        cubin_path, unit_path = Path(tmp) / "unit.cubin", Path(tmp) / "unit.cu"
        command = [nvcc, "-cubin", f"-arch={arch}", "-Xptxas=-v", *source_options(), "-o", str(cubin_path),
                   str(unit_path)]
        unit_path.write_text(unit)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise NvrtcError(f"nvcc failed on {source_name} for {arch}:\n$ {' '.join(command)}\n{result.stderr}")
        cubin = cubin_path.read_bytes()
    log = result.stdout + result.stderr
    return CompiledModule(arch=arch, cubin=cubin, lowered_names=lowered, resources=parse_ptxas_report(log), log=log)


def parse_ptxas_report(log: str) -> dict[str, KernelResources]:
    """The per-entry register / stack / spill figures of a `ptxas -v` log, keyed by mangled entry name."""
    resources = {}
    current, frame = None, None
    for line in log.splitlines():
        if entry := _ENTRY.search(line):
            current, frame = entry["name"], None
        elif (found := _FRAME.search(line)) and current:
            frame = found
        elif (regs := _REGS.search(line)) and current and frame:
            resources[current] = KernelResources(
                mangled_name=current,
                registers=int(regs["registers"]),
                stack_bytes=int(frame["stack"]),
                spill_store_bytes=int(frame["spill_stores"]),
                spill_load_bytes=int(frame["spill_loads"]),
            )
            current, frame = None, None
    return resources


def _program_log(program) -> str:
    from cuda.bindings import nvrtc

    (size,) = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
    log = b" " * size
    _check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
    return log.decode(errors="replace").rstrip("\x00 \n")


def _check(result, call: str):
    from cuda.bindings import nvrtc

    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{call} failed: {status.name}")
    return values
