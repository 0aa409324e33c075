// C entry points of the CPU shim build (workbench/kernels/cuda_cpu.py loads it through ctypes).
// The kernels are the unmodified .cu text; this file registers every instantiation under the name
// expression the CuPy launcher compiles (workbench/kernels/source.py) and launches it the way
// cuLaunchKernel does: args[i] points at the value of parameter i. Each argument's size is checked
// against its parameter, so a launch that would pass garbage to a GPU kernel fails here instead.
#include "cuda_cpu_shim.h"

#include <functional>
#include <map>
#include <string>
#include <utility>

#include "attention.cu"
#include "cache_ops.cu"
#include "mla_attention.cu"

namespace {

// Returns "" on success, else what was wrong with the arguments.
using Launcher = std::function<std::string(dim3 grid, dim3 block, void** args, const int* arg_bytes, int num_args,
                                           int os_threads)>;
using Registry = std::map<std::string, Launcher>;

template <typename... P, size_t... I>
void call_with(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<P*>(args[I])...);
}

template <typename... P>
Launcher launcher(void (*kernel)(P...)) {
  return [kernel](dim3 grid, dim3 block, void** args, const int* arg_bytes, int num_args, int os_threads) {
    constexpr int num_params = int(sizeof...(P));
    if (num_args != num_params)
      return "takes " + std::to_string(num_params) + " arguments, got " + std::to_string(num_args);
    const size_t param_bytes[] = {sizeof(P)...};
    for (int i = 0; i < num_params; ++i)
      if (size_t(arg_bytes[i]) != param_bytes[i])
        return "argument " + std::to_string(i) + " has " + std::to_string(arg_bytes[i]) + " bytes, the parameter " +
               std::to_string(param_bytes[i]);
    cuda_cpu::launch(grid, block, os_threads, [&] { call_with(kernel, args, std::index_sequence_for<P...>{}); });
    return std::string();
  };
}

template <typename T, int HEAD_DIM, int ROWS>
void add_attention(Registry& r, const std::string& type) {
  const std::string args = "<" + type + ", " + std::to_string(HEAD_DIM) + ", " + std::to_string(ROWS) + ">";
  r["kvw::paged_attention" + args] = launcher(&kvw::paged_attention<T, HEAD_DIM, ROWS>);
  r["kvw::contiguous_attention" + args] = launcher(&kvw::contiguous_attention<T, HEAD_DIM, ROWS>);
}

template <typename T, int HEAD_DIM>
void add_rows(Registry& r, const std::string& type) {
  add_attention<T, HEAD_DIM, 1>(r, type);
  add_attention<T, HEAD_DIM, 2>(r, type);
  add_attention<T, HEAD_DIM, 4>(r, type);
  add_attention<T, HEAD_DIM, 8>(r, type);
}

template <typename T, int LATENT, int ROPE>
void add_mla(Registry& r, const std::string& type) {
  for (const bool sparse : {false, true}) {
    const std::string args = "<" + type + ", " + std::to_string(LATENT) + ", " + std::to_string(ROPE) + ", " +
                             (sparse ? "true" : "false") + ">";
    r["kvw::paged_mla_decode" + args] = sparse ? launcher(&kvw::paged_mla_decode<T, LATENT, ROPE, true>)
                                               : launcher(&kvw::paged_mla_decode<T, LATENT, ROPE, false>);
    r["kvw::contiguous_mla_decode" + args] = sparse ? launcher(&kvw::contiguous_mla_decode<T, LATENT, ROPE, true>)
                                                    : launcher(&kvw::contiguous_mla_decode<T, LATENT, ROPE, false>);
  }
}

template <typename T>
void add_head_dims(Registry& r, const std::string& type) {
  add_mla<T, 512, 64>(r, type);
  add_rows<T, 64>(r, type);
  add_rows<T, 80>(r, type);
  add_rows<T, 96>(r, type);
  add_rows<T, 128>(r, type);
  add_rows<T, 256>(r, type);
}

const Registry& registry() {
  static const Registry r = [] {
    Registry built;
    add_head_dims<float>(built, "float");
    add_head_dims<__half>(built, "__half");
    add_head_dims<__nv_bfloat16>(built, "__nv_bfloat16");
    add_head_dims<kvw::Fp8E4M3>(built, "kvw::Fp8E4M3");
    built["kvw::merge_partitions"] = launcher(&kvw::merge_partitions);
    built["kvw::write_cache<uint4>"] = launcher(&kvw::write_cache<uint4>);
    built["kvw::write_cache<unsigned short>"] = launcher(&kvw::write_cache<unsigned short>);
    built["kvw::write_cache_fp8<float>"] = launcher(&kvw::write_cache_fp8<float>);
    built["kvw::write_cache_fp8<__half>"] = launcher(&kvw::write_cache_fp8<__half>);
    built["kvw::write_cache_fp8<__nv_bfloat16>"] = launcher(&kvw::write_cache_fp8<__nv_bfloat16>);
    built["kvw::copy_blocks<uint4>"] = launcher(&kvw::copy_blocks<uint4>);
    built["kvw::copy_blocks<unsigned short>"] = launcher(&kvw::copy_blocks<unsigned short>);
    return built;
  }();
  return r;
}

}  // namespace

extern "C" int kvw_has_kernel(const char* name) { return registry().count(name) ? 1 : 0; }

// The order a block's threads run in between barriers for the launches that follow: 0 index order,
// 1 reversed, 2 a shuffle drawn from `seed` (the default); see cuda_cpu_shim.h.
extern "C" void kvw_set_thread_order(int order, unsigned long long seed) {
  cuda_cpu::set_thread_order(cuda_cpu::Order(order), seed);
}

// Runs kernel `name` over grid[3] x block[3]; returns 0, or -1 with a message in `error`.
extern "C" int kvw_launch(const char* name, const unsigned* grid, const unsigned* block, void** args,
                          const int* arg_bytes, int num_args, int os_threads, char* error, int error_bytes) {
  const auto found = registry().find(name);
  std::string problem = found == registry().end() ? std::string("no such kernel")
                                                  : found->second(dim3(grid[0], grid[1], grid[2]),
                                                                  dim3(block[0], block[1], block[2]), args, arg_bytes,
                                                                  num_args, os_threads);
  if (problem.empty()) return 0;
  std::snprintf(error, size_t(error_bytes), "%s: %s", name, problem.c_str());
  return -1;
}
