// Test-only C entry points launching shim_probe.cu through the CPU shim.
#include "cuda_cpu_shim.h"

#include "shim_probe.cu"

extern "C" void probe_shuffle(int* out, int blocks, int threads, int os_threads) {
  cuda_cpu::launch(dim3(blocks), dim3(threads), os_threads, [&] { shuffle_probe(out); });
}

extern "C" void probe_reverse(const int* in, int* out, int blocks, int threads, int os_threads) {
  cuda_cpu::launch(dim3(blocks), dim3(threads), os_threads, [&] { reverse_in_shared(in, out); });
}

// which: 0 divergent __syncthreads, 1 exit before __syncthreads, 2 divergent shuffle
extern "C" void probe_bug(int which, int* out) {
  cuda_cpu::launch(dim3(1), dim3(64), 1, [&] {
    if (which == 0) divergent_syncthreads(out);
    if (which == 1) exit_before_syncthreads(out);
    if (which == 2) divergent_shuffle(out);
  });
}
