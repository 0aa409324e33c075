// The fibers under cuda_cpu_shim.h: one per CUDA thread of a block, all on one OS thread.
//
// A fiber has its own small stack and runs until it yields back to its executor's scheduler (at a
// barrier, a shuffle or its exit); a tiny x86-64 context switch (`cuda_cpu_switch_stack`) saves and
// loads the callee-saved registers and the SSE/x87 control words. This header holds the fiber and
// executor state and the switching; cuda_cpu_shim.h decides which fiber runs when (barriers, warp
// shuffles, thread order) and gives kernels the CUDA builtins.
#pragma once

#include <cuda_bf16.h>  // with cuda_fp16.h: dim3, uint3 and the half types
#include <cuda_fp16.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#if !defined(__x86_64__)
#error "cuda_cpu_fibers.h: the fiber context switch is written for x86-64"
#endif

namespace cuda_cpu {

constexpr int WARP = 32;
constexpr size_t STACK_BYTES = 64 * 1024;  // per fiber; kernels keep their arrays small
// Shuffles a lane may complete ahead of the slowest lane of its warp: a lane's value of shuffle n is kept
// until every warp-mate has completed it, in a ring of this many entries.
constexpr int SHUFFLE_SLACK = 2;

// Warp: at a shuffle, waiting to deposit its value (a warp-mate lags SHUFFLE_SLACK behind) or for its
// source lane's value of the same shuffle. WarpBarrier: at a __syncwarp, waiting for the rest of its warp.
enum class Wait : uint8_t { Running, Block, Warp, WarpBarrier, Done };

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  uint3 thread_idx{};
  Wait wait = Wait::Running;
  const char* file = "";  // call site of the barrier or shuffle the fiber waits at
  int line = 0;
  uint64_t shuffles = 0;    // shuffles whose value this lane has deposited
  bool deposited = false;   // at a shuffle: its value is deposited, its result not yet taken
  int shfl_src = -1;        // lane whose value this lane receives, -1 = its own
  uint64_t shfl_value = 0, shfl_result = 0;
  uint64_t ring_value[SHUFFLE_SLACK] = {};  // the values (and sites) of its last shuffles, by index % slack
  const char* ring_file[SHUFFLE_SLACK] = {};
  int ring_line[SHUFFLE_SLACK] = {};

  uint64_t completed_shuffles() const { return shuffles - (deposited ? 1 : 0); }
};

// The order a block's runnable threads run in between barriers (set_thread_order).
enum class Order : int { Index = 0, Reversed = 1, Shuffled = 2 };
inline std::atomic<int> thread_order{int(Order::Shuffled)};
inline std::atomic<uint64_t> thread_order_seed{0x5EED0F7EADu};

// Sets the order for the launches that follow (not for one running now).
inline void set_thread_order(Order order, uint64_t seed) {
  thread_order = int(order);
  thread_order_seed = seed;
}

// The blocks run by one OS thread: its fibers, their stacks, and the scheduler's saved context.
struct Executor {
  dim3 grid, block;
  uint3 block_idx{};
  std::vector<Fiber> fibers;
  std::vector<int> order;  // fiber indices in the order they run until the next barrier
  char* stacks = nullptr;
  size_t stack_stride = 0;
  void* scheduler_sp = nullptr;
  void (*body)(void*) = nullptr;
  void* body_ctx = nullptr;
};

inline thread_local Executor* current_executor = nullptr;
inline thread_local Fiber* current_fiber = nullptr;

}  // namespace cuda_cpu

// switch_stack(save, load): push the callee-saved registers and the SSE/x87 control words, store
// the stack pointer to *save, load `load` as the stack pointer, pop the same frame, return into it.
extern "C" void cuda_cpu_switch_stack(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl cuda_cpu_switch_stack
  .hidden cuda_cpu_switch_stack
  .type cuda_cpu_switch_stack, @function
cuda_cpu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_cpu_switch_stack, .-cuda_cpu_switch_stack
)");

namespace cuda_cpu {

[[noreturn]] inline void fail(const char* format, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] inline void fail(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fputs("cuda_cpu_shim: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::fflush(stderr);
  std::abort();
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
inline void yield_to_scheduler() {
  Fiber* self = current_fiber;
  cuda_cpu_switch_stack(&self->sp, current_executor->scheduler_sp);
}

[[noreturn]] inline void fiber_main() {
  Executor* ex = current_executor;
  ex->body(ex->body_ctx);
  current_fiber->wait = Wait::Done;
  yield_to_scheduler();
  __builtin_unreachable();
}

// A fresh fiber stack whose first switch "returns" into fiber_main with the ABI's stack alignment.
inline void* initial_stack(char* top) {
  uint32_t mxcsr;
  uint16_t fpu_cw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;  // fiber_main's (never used) return address: leaves rsp = 8 mod 16 at its entry
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12 r13 r14 r15
  *--sp = uint64_t(mxcsr) | uint64_t(fpu_cw) << 32;
  return sp;
}

}  // namespace cuda_cpu
