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
