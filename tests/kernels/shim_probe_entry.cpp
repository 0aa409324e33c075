// Test-only C entry points launching shim_probe.cu through the CPU shim.
#include "cuda_cpu_shim.h"

#include "shim_probe.cu"

extern "C" void probe_set_order(int order, unsigned long long seed) {
  cuda_cpu::set_thread_order(cuda_cpu::Order(order), seed);
}

extern "C" void probe_shuffle(int* out, int blocks, int threads, int os_threads) {
  cuda_cpu::launch(dim3(blocks), dim3(threads), os_threads, [&] { shuffle_probe(out); });
}

extern "C" void probe_reverse(const int* in, int* out, int blocks, int threads, int os_threads) {
  cuda_cpu::launch(dim3(blocks), dim3(threads), os_threads, [&] { reverse_in_shared(in, out); });
}

// which: 0 divergent __syncthreads, 1 exit before __syncthreads, 2 divergent shuffle, 3 divergent __syncwarp
extern "C" void probe_bug(int which, int* out) {
  cuda_cpu::launch(dim3(1), dim3(64), 1, [&] {
    if (which == 0) divergent_syncthreads(out);
    if (which == 1) exit_before_syncthreads(out);
    if (which == 2) divergent_shuffle(out);
    if (which == 3) divergent_syncwarp(out);
  });
}

// which: 0 missing __syncthreads, 1 shuffle used as a fence, 2 shared read past the end, 3 missing __syncwarp,
// 4 the same exchange behind __syncwarp; one block of 64
extern "C" void probe_planted(int which, int salt, int* out) {
  cuda_cpu::launch(dim3(1), dim3(64), 1, [&] {
    if (which == 0) missing_syncthreads(salt, out);
    if (which == 1) shuffle_as_fence(salt, out);
    if (which == 2) shared_past_end(salt, out);
    if (which == 3) warp_exchange<false>(salt, out);
    if (which == 4) warp_exchange<true>(salt, out);
  });
}
