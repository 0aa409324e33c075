// Shared pieces of the KV kernels: float conversion of the KV dtypes (fp32, fp16, bf16, fp8 e4m3),
// vector loads, and the two addressing policies (paged CSR vs contiguous extent). The attention
// kernel is written once against the policy interface, so the page-table indirection is the only
// difference between the two.
//
// Pool layout (DESIGN §7): K and V are [num_slots, num_kv_heads, head_dim] in the KV dtype. Slot indices
// are int, as everywhere they are stored (page tables, extents, slot mappings); element offsets are 64-bit.
// This file is plain CUDA C++ that NVRTC compiles as is and the CPU shim (cuda_cpu_shim.h) runs on
// the host; keep it inside the shim's subset (no inline PTX, no cooperative groups).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// sm_89 and later widen two e4m3 codes to a half2 in one instruction (cvt.rn.f16x2.e4m3x2, through
// cuda_fp8.h) to the codes' own values; sm_80 and the CPU shim use the integer form below, which gives
// value / 256. Both are exact, so the results agree bit for bit (KvUnit carries the factor).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define KVW_FP8_HARDWARE_DECODE 1
#else
#define KVW_FP8_HARDWARE_DECODE 0
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace kvw {

constexpr int WARP_SIZE = 32;

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// An fp8 KV element: an OCP e4m3fn code (bias 7, no infinities, NaN = S.1111.111), one byte.
struct Fp8E4M3 {
  unsigned char bits;
};

// to_float of an fp8 code is its value / KvUnit: without the hardware decode 256 (the code's exponent
// and mantissa moved into a half, shifted left by 7, are exactly value / 256, subnormals included, so
// decoding is one conversion), with it 1; the attention kernel folds KvUnit into its query scale and
// output. Other dtypes decode exactly.
template <typename T>
struct KvUnit {
  static constexpr float value = 1.f;
};
template <>
struct KvUnit<Fp8E4M3> {
  static constexpr float value = KVW_FP8_HARDWARE_DECODE ? 1.f : 256.f;
};

__device__ __forceinline__ float to_float(Fp8E4M3 x) {
#if KVW_FP8_HARDWARE_DECODE
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.bits, __NV_E4M3)));
#else
  __half_raw h;
  h.x = (unsigned short)(((x.bits & 0x80u) << 8) | ((x.bits & 0x7Fu) << 7));
  const float value = __half2float(__half(h));
  return (x.bits & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fc00000) : value;  // NaN stays NaN
#endif
}

// The cache write's float -> e4m3 rounding (workbench/kernels/fp8.py `quantize` defines it): round to
// nearest, ties to even, saturating at +-448 (infinities included) like vLLM's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); NaN -> 0x7F. Integer operations on the bits
// only, so the result does not depend on the compiler's float mode (flush-to-zero) and needs no
// cuda_fp8.h (CuPy's bundled headers lack it).
__device__ __forceinline__ unsigned char float_to_e4m3(float x) {
  const unsigned bits = __float_as_uint(x);
  const unsigned sign = (bits >> 24) & 0x80u;
  const unsigned magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7Fu;            // NaN
  if (magnitude >= 0x43E00000u) return sign | 0x7Eu;   // >= 448 saturates
  if (magnitude >= 0x3C800000u) {                      // >= 2^-6, a normal e4m3: keep 3 of 23 mantissa bits
    const unsigned rounded = magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u);  // carries into the exponent
    return (unsigned char)(sign | ((rounded >> 20) - (120u << 3)));             // rebias 127 -> 7
  }
  if (magnitude <= 0x3A800000u) return sign;            // <= 2^-10, half the smallest subnormal: +-0
  // a subnormal e4m3: the value in units of 2^-9, rounded to nearest even (8 is the smallest normal, 0x08)
  const unsigned mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
  const int shift = 14 - (int(magnitude >> 23) - 127);  // 21..24 for exponents -7..-10
  const unsigned q = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return (unsigned char)(sign | (q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u)));
}

// e4m3 code of x / scale in float32 (scale a normal float). A float32-subnormal x counts as a signed
// zero first: a GPU compiled with flush-to-zero divides it as zero, the CPU shim would not.
__device__ __forceinline__ unsigned char scaled_e4m3(float x, float scale) {
  const unsigned bits = __float_as_uint(x);
  if ((bits & 0x7F800000u) == 0u) x = __uint_as_float(bits & 0x80000000u);
  return float_to_e4m3(x / scale);
}

// The widest load (16, 8, 4 bytes, or one element) that divides a head row of `head_dim` elements, so
// every row of every head starts on a vector boundary when the pool base is 16-byte aligned (the
// launchers check that); at most 8 elements of a 2- or 4-byte type (a lane holds ELEMS query and
// accumulator values per row). fp8 takes 16 codes: half the lanes per row of 8-code vectors, so half
// the score-reduction work and tile overhead per byte (docs/kernels.md), for up to 255 registers (no
// spills in any variant) and 2 blocks per SM instead of 3. MAX_ELEMS lowers the cap (the attention kernel
// gives fp8 8-code vectors where a lane keeps 8 rows, as 8 rows of 16 values would not fit its registers).
template <typename T, int HEAD_DIM, int MAX_ELEMS = sizeof(T) == 1 ? 16 : 8>
struct RowVec {
  static constexpr int ROW_BYTES = HEAD_DIM * int(sizeof(T));
  static constexpr int MAX_BYTES = MAX_ELEMS * int(sizeof(T)) < 16 ? MAX_ELEMS * int(sizeof(T)) : 16;
  static constexpr int BYTES = ROW_BYTES % 16 == 0 && MAX_BYTES >= 16 ? 16
                               : ROW_BYTES % 8 == 0 && MAX_BYTES >= 8 ? 8
                               : ROW_BYTES % 4 == 0 && MAX_BYTES >= 4 ? 4
                                                                      : int(sizeof(T));
  static constexpr int ELEMS = BYTES / int(sizeof(T));
  static constexpr int PER_ROW = HEAD_DIM / ELEMS;  // vectors in one head row
};

// ELEMS elements loaded by one aligned vector instruction.
template <typename T, int ELEMS>
struct __align__(sizeof(T) * ELEMS) Vec {
  T v[ELEMS];
};

template <typename T, int ELEMS>
__device__ __forceinline__ Vec<T, ELEMS> load_vec(const T* __restrict__ src) {
  return *reinterpret_cast<const Vec<T, ELEMS>*>(src);
}

// dst = the vector's elements as float, or zeros when `valid` is false (a lane past the head row).
template <typename T, int ELEMS>
__device__ __forceinline__ void vec_to_float(const Vec<T, ELEMS>& raw, float* dst, bool valid) {
#pragma unroll
  for (int i = 0; i < ELEMS; ++i) dst[i] = valid ? to_float(raw.v[i]) : 0.f;
}

// An fp8 vector is whole 32-bit words of codes (every instantiated head dim gives 8 codes per vector),
// so the conversion below works on words without assembling them from bytes.
template <int ELEMS>
struct __align__(ELEMS) Vec<Fp8E4M3, ELEMS> {
  static_assert(ELEMS % 4 == 0, "fp8 vectors hold whole 32-bit words of codes");
  unsigned w[ELEMS / 4];  // code i in byte i % 4 of word i / 4 (little-endian, as in memory)
};

// Two e4m3 codes (the low bytes of the two 16-bit halves of `x`) as a half2 with the scalar to_float's
// layout: sign to bit 15, exponent and mantissa to bits 7..13, and for a NaN code (seven low bits set)
// the half exponent all ones, so NaN stays NaN without a compare: adding 1 to the seven low bits carries
// into bit 7 for that code only, and bit 7 moves to bit 14.
__device__ __forceinline__ __half2 e4m3x2_to_half2(unsigned x) {
  const unsigned low7 = x & 0x007F007Fu;
  const unsigned nan = (low7 + 0x00010001u) & 0x00800080u;
  __half2_raw h;
  const unsigned bits = ((x << 8) & 0x80008000u) | ((low7 | nan) << 7);
  h.x = (unsigned short)bits;
  h.y = (unsigned short)(bits >> 16);
  return __half2(h);
}

// dst = the vector's codes as float (value / KvUnit), two codes per instruction (the hardware's) or per
// integer operation, or zeros when `valid` is false.
template <int ELEMS>
__device__ __forceinline__ void vec_to_float(const Vec<Fp8E4M3, ELEMS>& raw, float* dst, bool valid) {
#pragma unroll
  for (int i = 0; i < ELEMS / 4; ++i) {
#if KVW_FP8_HARDWARE_DECODE
    const float2 low = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(raw.w[i] & 0xFFFFu, __NV_E4M3)));
    const float2 high = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(raw.w[i] >> 16, __NV_E4M3)));
    dst[4 * i] = valid ? low.x : 0.f;
    dst[4 * i + 1] = valid ? low.y : 0.f;
    dst[4 * i + 2] = valid ? high.x : 0.f;
    dst[4 * i + 3] = valid ? high.y : 0.f;
#else
    const float2 even = __half22float2(e4m3x2_to_half2(raw.w[i]));      // codes 0 and 2 of the word
    const float2 odd = __half22float2(e4m3x2_to_half2(raw.w[i] >> 8));  // codes 1 and 3
    dst[4 * i] = valid ? even.x : 0.f;
    dst[4 * i + 1] = valid ? odd.x : 0.f;
    dst[4 * i + 2] = valid ? even.y : 0.f;
    dst[4 * i + 3] = valid ? odd.y : 0.f;
#endif
  }
}

// q = n / d and r = n % d for 0 <= n < 2^31 without a division instruction (round-up multiply
// method: Granlund-Montgomery, as PyTorch's IntDivider): mul and shift are set once per block.
struct FastDivmod {
  int d;
  unsigned mul;
  int shift;

  __device__ __forceinline__ explicit FastDivmod(int divisor) : d(divisor), shift(0) {
    while ((1u << shift) < unsigned(divisor)) ++shift;
    mul = unsigned(((1ull << 32) * ((1ull << shift) - unsigned(divisor))) / unsigned(divisor) + 1);
  }
  __device__ __forceinline__ int div(int n) const { return int((__umulhi(unsigned(n), mul) + unsigned(n)) >> shift); }
};

// Paged CSR addressing (FlashInfer's page table): logical position t of sequence s lives in slot
// kv_indices[kv_indptr[s] + t / block_size] * block_size + t % block_size.
struct PagedAddressing {
  const int* __restrict__ kv_indptr;         // [num_seqs + 1]
  const int* __restrict__ kv_indices;        // [nnz_blocks]
  const int* __restrict__ kv_last_page_len;  // [num_seqs], 1..block_size
  int block_size;
  static constexpr bool READS_TABLE = true;  // a position's slot is a memory read

  __device__ __forceinline__ int kv_len(int seq) const {
    const int num_blocks = kv_indptr[seq + 1] - kv_indptr[seq];
    return (num_blocks - 1) * block_size + kv_last_page_len[seq];
  }

  // One sequence's page table, bound once per thread block so the loop only divides and looks up.
  struct Sequence {
    const int* __restrict__ pages;  // [num_blocks of the sequence]
    FastDivmod block;
    __device__ __forceinline__ int slot(int pos) const {
      const int page = block.div(pos);
      return pages[page] * block.d + (pos - page * block.d);
    }
  };
  __device__ __forceinline__ Sequence sequence(int seq) const {
    return Sequence{kv_indices + kv_indptr[seq], FastDivmod(block_size)};
  }
};

// Contiguous extents: logical position t of sequence s lives in slot kv_start[s] + t.
struct ContiguousAddressing {
  const int* __restrict__ kv_start;  // [num_seqs]
  const int* __restrict__ kv_lens;   // [num_seqs]
  static constexpr bool READS_TABLE = false;  // a position's slot is arithmetic

  __device__ __forceinline__ int kv_len(int seq) const { return kv_lens[seq]; }

  struct Sequence {
    int start;
    __device__ __forceinline__ int slot(int pos) const { return start + pos; }
  };
  __device__ __forceinline__ Sequence sequence(int seq) const { return Sequence{kv_start[seq]}; }
};

}  // namespace kvw
