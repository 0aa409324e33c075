// Test-only C entry points: kv_common.cuh's float_to_e4m3 beside NVIDIA's own conversion,
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) (cuda_fp8.hpp's host code; on sm_89+ the same
// call is one cvt.rn.satfinite.e4m3x2.f32 instruction).
#include "cuda_cpu_shim.h"

#include <cuda_fp8.h>

#include "kv_common.cuh"

// ours[i], nvidia[i] = the two conversions of x[i].
extern "C" void probe_e4m3(const float* x, unsigned char* ours, unsigned char* nvidia, long long n) {
  for (long long i = 0; i < n; ++i) {
    ours[i] = kvw::float_to_e4m3(x[i]);
    nvidia[i] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
  }
}

// Over the float32 bit patterns start, start + step, ... (n of them, wrapping at 2^32): how many convert
// differently; *first_bad is the first such pattern.
extern "C" long long probe_e4m3_sweep(unsigned start, unsigned step, long long n, unsigned* first_bad) {
  long long mismatches = 0;
  unsigned bits = start;
  for (long long i = 0; i < n; ++i, bits += step) {
    const float x = __uint_as_float(bits);
    if (kvw::float_to_e4m3(x) != __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) && mismatches++ == 0)
      *first_bad = bits;
  }
  return mismatches;
}

// For each 32-bit word of four e4m3 codes: ours[4i..4i+3] = kv_common.cuh's integer decode (the shim's and
// sm_80's; value / KvUnit, 256 here), nvidia[4i..4i+3] = cuda_fp8.hpp's __nv_cvt_fp8x2_to_halfraw2 of its two
// code pairs (the conversion the kernel runs on sm_89+, one cvt.rn.f16x2.e4m3x2 instruction there).
extern "C" void probe_e4m3_decode(const unsigned* words, float* ours, float* nvidia, long long n) {
  for (long long i = 0; i < n; ++i) {
    kvw::Vec<kvw::Fp8E4M3, 4> raw;
    raw.w[0] = words[i];
    kvw::vec_to_float(raw, ours + 4 * i, true);
    const __half2 low(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[i] & 0xFFFFu), __NV_E4M3));
    const __half2 high(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[i] >> 16), __NV_E4M3));
    nvidia[4 * i] = __low2float(low);
    nvidia[4 * i + 1] = __high2float(low);
    nvidia[4 * i + 2] = __low2float(high);
    nvidia[4 * i + 3] = __high2float(high);
  }
}
