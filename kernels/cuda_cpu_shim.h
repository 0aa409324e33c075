// Runs unmodified CUDA C kernels on the CPU, for correctness tests without a GPU (DESIGN §7).
//
// Include this header, then the .cu files, in one host translation unit built with g++ (-pthread).
// Model: the blocks of a grid are spread over OS threads, and the blocks given to one OS thread run
// one after another. Each CUDA thread of a block is a fiber with its own small stack, switched by a
// tiny x86-64 context switch (cuda_cpu_fibers.h); fibers run until they reach a barrier or exit.
// `__shared__` becomes `static thread_local`, which is per block because a block's fibers all live on
// one OS thread and that thread runs one block at a time (shared memory is not cleared between
// blocks, as on a GPU).
//
// Barriers: `__syncthreads()` waits for every thread of the block at the same call site. Between
// barriers the block's threads run in a chosen order (`set_thread_order`): index order, reversed, or
// (the default) a seeded shuffle drawn anew for every block and after every barrier, so code that
// reads another thread's write without a barrier in between sees a stale value in some order instead
// of passing because the writer happens to run first. The full-warp shuffles (`__shfl_xor_sync`,
// `__shfl_sync`, `__shfl_down_sync`, full mask, width 32) exchange values and nothing else: a lane
// continues as soon as its source lane has reached the same shuffle, possibly before other lanes of
// its warp have (a shuffle is no memory fence on a GPU either; `__syncwarp` is). `__syncwarp()` (full
// mask) waits for the 32 lanes of the warp at the same call site, the warp's barrier and fence. Lanes pair their
// n-th shuffles, which must be at the same call site; a lane runs at most SHUFFLE_SLACK shuffles ahead
// of the slowest lane of its warp. Threads that wait at different call sites, wait while others have
// exited, or pass a different number of shuffles than their warp-mates by a barrier or the end abort
// the process with a message naming the threads and sites: such code deadlocks or is undefined on a GPU.
//
// Build it with -fsanitize=bounds (workbench/kernels/cuda_cpu.py does): an index past a `__shared__`
// array (or any array of known size) then aborts with its file and line instead of reading a neighbour.
//
// Supported subset: the above plus the intrinsics defined below (`__launch_bounds__` is accepted
// and ignored); no atomics, no dynamic shared memory, no partial-mask `__syncwarp`, no cooperative
// groups, no inline PTX.
#pragma once

#include "cuda_cpu_fibers.h"

#undef __shared__
#define __shared__ static thread_local
// Occupancy hints mean nothing to the host compiler (host_defines.h only defines them for nvcc/NVRTC).
#define __launch_bounds__(...)

namespace cuda_cpu {

// "waits at __syncthreads file:line", "... at __syncwarp ...", "... at a warp shuffle ..." or "has exited".
inline void describe_wait(const Fiber& f, char* text, size_t size) {
  if (f.wait == Wait::Done) {
    std::snprintf(text, size, "has exited");
  } else {
    const char* what = f.wait == Wait::Block ? "__syncthreads" : f.wait == Wait::WarpBarrier ? "__syncwarp"
                                                                                             : "a warp shuffle";
    std::snprintf(text, size, "waits at %s %s:%d", what, f.file, f.line);
  }
}

// Aborts naming both threads, the lower thread index first (whichever of them the scheduler found first).
[[noreturn]] inline void describe_mismatch(const Executor& ex, const Fiber& x, const Fiber& y, const char* what) {
  const Fiber& a = &x < &y ? x : y;
  const Fiber& b = &x < &y ? y : x;
  char wait_a[512], wait_b[512];
  describe_wait(a, wait_a, sizeof wait_a);
  describe_wait(b, wait_b, sizeof wait_b);
  fail("%s in block (%u,%u,%u): thread (%u,%u,%u) %s, but thread (%u,%u,%u) %s", what, ex.block_idx.x,
       ex.block_idx.y, ex.block_idx.z, a.thread_idx.x, a.thread_idx.y, a.thread_idx.z, wait_a, b.thread_idx.x,
       b.thread_idx.y, b.thread_idx.z, wait_b);
}

inline Fiber* warp_of(Executor& ex, const Fiber& f) {
  return &ex.fibers[size_t(&f - ex.fibers.data()) / WARP * WARP];
}

// The warp-mate that keeps lane f from depositing its shuffle n (one that has not completed shuffle
// n - SHUFFLE_SLACK, whose ring entry f would overwrite), or nullptr.
inline Fiber* lagging_lane(Executor& ex, const Fiber& f, uint64_t n) {
  Fiber* lanes = warp_of(ex, f);
  for (int i = 0; i < WARP; ++i)
    if (lanes[i].completed_shuffles() + SHUFFLE_SLACK <= n) return &lanes[i];
  return nullptr;
}

// Moves lane f (waiting at a shuffle) on as far as it can: deposits its value once no warp-mate lags,
// then takes its source's value once the source has deposited the same shuffle, from the same call site.
// Returns whether f has its result and may run on.
inline bool advance_shuffle(Executor& ex, Fiber& f) {
  Fiber* lanes = warp_of(ex, f);
  const uint64_t n = f.completed_shuffles();  // this shuffle's index among the lane's shuffles
  const int entry = int(n % SHUFFLE_SLACK);
  if (!f.deposited) {
    if (lagging_lane(ex, f, n)) return false;
    f.ring_value[entry] = f.shfl_value;
    f.ring_file[entry] = f.file;
    f.ring_line[entry] = f.line;
    f.shuffles = n + 1;
    f.deposited = true;
  }
  const Fiber& src = f.shfl_src < 0 ? f : lanes[f.shfl_src];
  if (src.shuffles <= n) return false;
  if (src.ring_line[entry] != f.line || std::strcmp(src.ring_file[entry], f.file) != 0) {
    Fiber at_src = src;  // the source as it stood at this shuffle, for the message
    at_src.wait = Wait::Warp;
    at_src.file = src.ring_file[entry];
    at_src.line = src.ring_line[entry];
    const Fiber& a = &src < &f ? at_src : f;
    const Fiber& b = &src < &f ? f : at_src;
    char wait_a[512], wait_b[512];
    describe_wait(a, wait_a, sizeof wait_a);
    describe_wait(b, wait_b, sizeof wait_b);
    fail("divergent warp shuffle in block (%u,%u,%u): thread (%u,%u,%u) %s, but thread (%u,%u,%u) %s",
         ex.block_idx.x, ex.block_idx.y, ex.block_idx.z, a.thread_idx.x, a.thread_idx.y, a.thread_idx.z, wait_a,
         b.thread_idx.x, b.thread_idx.y, b.thread_idx.z, wait_b);
  }
  f.shfl_result = src.ring_value[entry];
  f.deposited = false;
  f.wait = Wait::Running;
  return true;
}

// Lane f waits at a __syncwarp: once all 32 lanes of its warp do, at the same call site, they run on.
inline void advance_warp_barrier(Executor& ex, const Fiber& f) {
  Fiber* lanes = warp_of(ex, f);
  for (int i = 0; i < WARP; ++i)
    if (lanes[i].wait != Wait::WarpBarrier) return;
  for (int i = 0; i < WARP; ++i)
    if (lanes[i].line != f.line || std::strcmp(lanes[i].file, f.file) != 0)
      describe_mismatch(ex, f, lanes[i], "divergent __syncwarp");
  for (int i = 0; i < WARP; ++i) lanes[i].wait = Wait::Running;
}

// Aborts unless every lane of every warp has completed the same number of shuffles (`where`: the barrier
// or the end of the block they all reached): a lane that skipped a full-warp shuffle.
inline void check_shuffle_counts(const Executor& ex, const char* where) {
  for (size_t w0 = 0; w0 < ex.fibers.size(); w0 += WARP)
    for (size_t i = w0 + 1; i < w0 + WARP; ++i)
      if (ex.fibers[i].shuffles != ex.fibers[w0].shuffles) {
        const Fiber &a = ex.fibers[w0], &b = ex.fibers[i];
        fail("divergent warp shuffle in block (%u,%u,%u): thread (%u,%u,%u) passed %llu shuffles, but thread "
             "(%u,%u,%u) passed %llu before %s", ex.block_idx.x, ex.block_idx.y, ex.block_idx.z, a.thread_idx.x,
             a.thread_idx.y, a.thread_idx.z, (unsigned long long)a.shuffles, b.thread_idx.x, b.thread_idx.y,
             b.thread_idx.z, (unsigned long long)b.shuffles, where);
      }
}

// Called when no fiber can run. Returns false when every fiber has exited; releases the block-wide
// barrier when every thread waits at the same one; aborts on any other state, naming two threads that
// disagree (a divergent barrier, or a shuffle whose partner never comes).
inline bool release_block(Executor& ex) {
  for (Fiber& f : ex.fibers) {
    if (f.wait != Wait::Warp) continue;
    const Fiber* blocker = !f.deposited    ? lagging_lane(ex, f, f.completed_shuffles())
                           : f.shfl_src < 0 ? &f
                                            : &warp_of(ex, f)[f.shfl_src];
    if (!blocker || blocker == &f) fail("internal: a warp shuffle that can complete was not released");
    describe_mismatch(ex, f, *blocker, "divergent warp shuffle");
  }
  for (const Fiber& f : ex.fibers) {  // a __syncwarp some warp-mate never reaches
    if (f.wait != Wait::WarpBarrier) continue;
    const Fiber* lanes = warp_of(ex, f);
    for (int i = 0; i < WARP; ++i)
      if (lanes[i].wait != Wait::WarpBarrier) describe_mismatch(ex, f, lanes[i], "divergent __syncwarp");
  }
  const Fiber* first = nullptr;  // the first thread still waiting somewhere
  for (const Fiber& f : ex.fibers)
    if (f.wait != Wait::Done) {
      first = &f;
      break;
    }
  if (!first) {
    check_shuffle_counts(ex, "the end of the block");
    return false;
  }
  for (const Fiber& f : ex.fibers) {
    const bool same = f.wait == first->wait && f.line == first->line && std::strcmp(f.file, first->file) == 0;
    if (!same) describe_mismatch(ex, *first, f, "divergent __syncthreads");
  }
  char where[512];
  std::snprintf(where, sizeof where, "__syncthreads %s:%d", first->file, first->line);
  check_shuffle_counts(ex, where);
  for (Fiber& f : ex.fibers) f.wait = Wait::Running;
  return true;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The order the fibers run in until the next barrier: index order, reversed, or a shuffle drawn from
// (seed, block, barriers passed), so a launch runs the same schedule every time.
inline void arrange(Executor& ex, uint64_t barriers) {
  const int n = int(ex.fibers.size());
  ex.order.resize(n);
  for (int i = 0; i < n; ++i) ex.order[i] = i;
  const Order order = Order(thread_order.load());
  if (order == Order::Reversed) std::reverse(ex.order.begin(), ex.order.end());
  if (order != Order::Shuffled) return;
  const uint64_t block = ex.block_idx.x + uint64_t(ex.grid.x) * (ex.block_idx.y + uint64_t(ex.grid.y) * ex.block_idx.z);
  uint64_t state = splitmix64(thread_order_seed.load() ^ splitmix64(block ^ splitmix64(barriers)));
  for (int i = n - 1; i > 0; --i) {  // Fisher-Yates
    state = splitmix64(state);
    std::swap(ex.order[i], ex.order[int(state % uint64_t(i + 1))]);
  }
}

inline void run_block(Executor& ex) {
  const unsigned bx = ex.block.x, by = ex.block.y;
  for (size_t i = 0; i < ex.fibers.size(); ++i) {
    Fiber& f = ex.fibers[i];
    f = Fiber{};
    f.thread_idx = uint3{unsigned(i % bx), unsigned(i / bx % by), unsigned(i / (bx * by))};
    f.sp = initial_stack(ex.stacks + (i + 1) * ex.stack_stride);
  }
  uint64_t barriers = 0;
  arrange(ex, barriers);
  for (;;) {
    bool progressed = false;
    for (const int i : ex.order) {
      Fiber& f = ex.fibers[i];
      if (f.wait == Wait::Warp) advance_shuffle(ex, f);
      if (f.wait == Wait::WarpBarrier) advance_warp_barrier(ex, f);
      if (f.wait != Wait::Running) continue;
      current_fiber = &f;
      cuda_cpu_switch_stack(&ex.scheduler_sp, f.sp);
      progressed = true;
    }
    current_fiber = nullptr;
    if (progressed) continue;
    if (!release_block(ex)) return;
    arrange(ex, ++barriers);
  }
}

// Runs blocks first_block, first_block + stride, ... of the grid on the calling OS thread.
inline void run_blocks(Executor& ex, std::atomic<unsigned long long>& next_block, unsigned long long num_blocks) {
  const size_t num_threads = size_t(ex.block.x) * ex.block.y * ex.block.z;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  ex.stack_stride = STACK_BYTES + page;  // a guard page below each stack turns an overflow into SIGSEGV
  const size_t bytes = ex.stack_stride * num_threads + page;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) fail("cannot map %zu bytes of fiber stacks", bytes);
  ex.stacks = static_cast<char*>(mem);
  for (size_t i = 0; i < num_threads; ++i) mprotect(ex.stacks + i * ex.stack_stride, page, PROT_NONE);
  ex.fibers.assign(num_threads, Fiber{});
  current_executor = &ex;
  for (unsigned long long b = next_block++; b < num_blocks; b = next_block++) {
    ex.block_idx = uint3{unsigned(b % ex.grid.x), unsigned(b / ex.grid.x % ex.grid.y),
                         unsigned(b / (ex.grid.x * ex.grid.y))};
    run_block(ex);
  }
  current_executor = nullptr;
  munmap(mem, bytes);
}

// Runs `kernel()` (a call of a __global__ function with its arguments) as a grid launch, on up to
// `os_threads` OS threads. Returns when every block has finished.
template <typename Kernel>
void launch(dim3 grid, dim3 block, int os_threads, const Kernel& kernel) {
  const unsigned long long num_blocks = (unsigned long long)grid.x * grid.y * grid.z;
  const size_t block_threads = size_t(block.x) * block.y * block.z;
  if (num_blocks == 0 || block_threads == 0) return;
  if (block_threads % WARP != 0 || block_threads > 1024)
    fail("block of %zu threads: the shim runs blocks of whole warps, at most 1024 threads", block_threads);
  std::atomic<unsigned long long> next_block{0};
  const int workers = int(std::min<unsigned long long>(num_blocks, (unsigned long long)std::max(1, os_threads)));
  auto body = [](void* ctx) { (*static_cast<const Kernel*>(ctx))(); };
  std::vector<Executor> executors(workers);
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t) {
    Executor& ex = executors[t];
    ex.grid = grid;
    ex.block = block;
    ex.body = body;
    ex.body_ctx = const_cast<Kernel*>(&kernel);
    if (t + 1 == workers) {
      run_blocks(ex, next_block, num_blocks);
    } else {
      threads.emplace_back([&ex, &next_block, num_blocks] { run_blocks(ex, next_block, num_blocks); });
    }
  }
  for (std::thread& th : threads) th.join();
}

inline Fiber& self() {
  if (!current_fiber) fail("a CUDA builtin was used outside a kernel launched through cuda_cpu::launch");
  return *current_fiber;
}

template <typename T>
T shuffle(unsigned mask, T value, int src_lane, int width, const char* file, int line) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable<T>::value, "shuffle of a scalar");
  if (mask != 0xffffffffu || width != WARP)
    fail("%s:%d: only full-warp shuffles (mask 0xffffffff, width 32) are supported", file, line);
  Fiber& f = self();
  f.shfl_value = 0;
  std::memcpy(&f.shfl_value, &value, sizeof(T));
  f.shfl_src = src_lane;
  f.file = file;
  f.line = line;
  f.wait = Wait::Warp;
  // on at once when the source lane is already there: nothing waits for the rest of the warp
  if (!advance_shuffle(*current_executor, f)) yield_to_scheduler();
  T result;
  std::memcpy(&result, &f.shfl_result, sizeof(T));
  return result;
}

inline int lane_id() {
  const Executor& ex = *current_executor;
  const uint3 t = self().thread_idx;
  return int((t.x + ex.block.x * (t.y + ex.block.y * t.z)) % WARP);
}

}  // namespace cuda_cpu

#define threadIdx (::cuda_cpu::self().thread_idx)
#define blockIdx (::cuda_cpu::current_executor->block_idx)
#define blockDim (::cuda_cpu::current_executor->block)
#define gridDim (::cuda_cpu::current_executor->grid)

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cuda_cpu::Fiber& f = cuda_cpu::self();
  f.file = file;
  f.line = line;
  f.wait = cuda_cpu::Wait::Block;
  cuda_cpu::yield_to_scheduler();
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (mask != 0xffffffffu) cuda_cpu::fail("%s:%d: only full-warp __syncwarp (mask 0xffffffff) is supported", file, line);
  cuda_cpu::Fiber& f = cuda_cpu::self();
  f.file = file;
  f.line = line;
  f.wait = cuda_cpu::Wait::WarpBarrier;
  cuda_cpu::yield_to_scheduler();
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return cuda_cpu::shuffle(mask, value, cuda_cpu::lane_id() ^ (lane_mask & 31), width, file, line);
}

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return cuda_cpu::shuffle(mask, value, src_lane & 31, width, file, line);
}

template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  const int src = cuda_cpu::lane_id() + int(delta);
  return cuda_cpu::shuffle(mask, value, src < 32 ? src : -1, width, file, line);
}

inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((static_cast<unsigned long long>(a) * b) >> 32); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
