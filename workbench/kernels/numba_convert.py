"""KV element decoding for the Numba backend: 16- and 8-bit storage → float32.

Numba has no CPU float16 or fp8, so fp16 and bf16 pools reach the kernels as uint16 bits, and fp8
pools as the same uint16 view of their bytes (two e4m3 codes per word, little-endian). `KV_CODE` is
passed to the kernels as a plain int so that one compiled kernel serves every format.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from workbench.kernels.fp8 import E4M3_VALUES

FP32, FP16, BF16, FP8 = 0, 1, 2, 3
KV_CODE = {"fp32": FP32, "fp16": FP16, "bf16": BF16, "fp8": FP8}


@njit(inline="always", cache=True)
def bits_to_float(bits):
    """uint32 bit pattern → the float32 with that representation."""
    return np.uint32(bits).view(np.float32)


@njit(inline="always", cache=True)
def float_to_bits(x):
    """float32 → its uint32 bit pattern."""
    return np.float32(x).view(np.uint32)


@njit(inline="always", cache=True)
def half_bits_to_float(bits):
    """IEEE binary16 bits → float32, exact for every pattern (subnormals, ±0, ±inf, NaN payloads).

    Branch-free so that row loops vectorize: the half's exponent and mantissa, shifted into a
    float32, are the value scaled by 2^-112 (a float32 subnormal when the half is subnormal), so one
    exact multiply by 2^112 rebiases them; inf and NaN (exponent all ones) are selected separately.
    """
    h = np.uint32(bits)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    magnitude = h & np.uint32(0x7FFF)
    finite = float_to_bits(bits_to_float(magnitude << np.uint32(13)) * np.float32(5.192296858534828e33))
    special = np.uint32(0x7F800000) | ((magnitude & np.uint32(0x3FF)) << np.uint32(13))
    return bits_to_float(sign | (special if magnitude >= np.uint32(0x7C00) else finite))


@intrinsic
def half_fpext(typingctx, bits):
    """binary16 bits → float32 as an LLVM `fpext half`: one vcvtph2ps per 8 lanes on F16C CPUs.

    Same results as `half_bits_to_float`, ~3x faster in row loops; used only where the target Numba
    compiles for lowers it to that instruction (without F16C LLVM emits a call to a soft-float helper
    that Numba's JIT cannot resolve: a crash, not a slow path).
    """
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


_FPEXT_HALF_IR = """
define float @half_to_float(i16 %bits) {
  %h = bitcast i16 %bits to half
  %f = fpext half %h to float
  ret float %f
}
"""


def target_converts_half_in_hardware() -> bool:
    """True when the CPU target Numba compiles for (the host, or NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)
    lowers `fpext half` to vcvtph2ps. Asked of the code generator itself: a CPU name says nothing about
    the features Numba passes with it (`generic` gets none; `x86-64` gets the host's)."""
    from numba.core.registry import cpu_target

    triple, cpu_name, features = cpu_target.target_context.codegen().magic_tuple()
    try:
        machine = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu_name, features=features)
        assembly = machine.emit_assembly(llvm.parse_assembly(_FPEXT_HALF_IR))
    except RuntimeError:  # a target LLVM cannot build code for: the portable route
        return False
    return "vcvtph2ps" in assembly


TARGET_HAS_F16C = target_converts_half_in_hardware()


@njit(inline="always", cache=True)
def half_to_float(bits):
    """binary16 bits → float32 by the fastest exact route the compile target has."""
    if TARGET_HAS_F16C:
        return half_fpext(np.uint16(bits))
    return half_bits_to_float(bits)


@njit(inline="always", cache=True)
def bf16_to_float(bits):
    """bfloat16 bits → float32: bf16 is the top half of a float32, so this is exact."""
    return bits_to_float(np.uint32(bits) << np.uint32(16))


@njit(inline="always", cache=True)
def load_row(pool, slot, kv_head, kv_code, dst, row):
    """dst[row, :] = pool[slot, kv_head, :] (uint16 fp16 or bf16 bits, or pairs of e4m3 codes) decoded to
    float32 (fp8: the code's value; the per-tensor scale is applied by the caller). Mutates dst only.

    One loop per format (not a branch per element) so that each loop vectorizes.
    """
    head_dim = dst.shape[1]
    if kv_code == FP8:
        for d in range(head_dim // 2):
            word = pool[slot, kv_head, d]
            dst[row, 2 * d] = E4M3_VALUES[word & np.uint16(0xFF)]
            dst[row, 2 * d + 1] = E4M3_VALUES[word >> np.uint16(8)]
    elif kv_code == FP16:
        for d in range(head_dim):
            dst[row, d] = half_to_float(pool[slot, kv_head, d])
    else:
        for d in range(head_dim):
            dst[row, d] = bf16_to_float(pool[slot, kv_head, d])
