// Test-only CUDA kernels for the CPU shim (tests/kernels/test_cuda_cpu_shim.py): shuffle semantics,
// per-block shared memory behind __syncthreads and __syncwarp, and planted barrier bugs the shim must catch.

constexpr unsigned FULL = 0xffffffffu;

// out [gridDim.x * blockDim.x, 4]: the three shuffles of a per-thread value, and a warp-wide sum.
__global__ void shuffle_probe(int* out) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32;
  const int value = 1000 * blockIdx.x + threadIdx.x;
  out[4 * tid + 0] = __shfl_xor_sync(FULL, value, 5);
  out[4 * tid + 1] = __shfl_sync(FULL, value, (lane + 7) % 32);
  out[4 * tid + 2] = __shfl_down_sync(FULL, value, 3);
  float sum = float(value);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(FULL, sum, offset);
  out[4 * tid + 3] = int(sum);
}

// out [gridDim.x * blockDim.x]: each block reverses its slice of `in` through shared memory.
__global__ void reverse_in_shared(const int* in, int* out) {
  __shared__ int s[1024];
  const int base = blockIdx.x * blockDim.x;
  s[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// Planted bug: the two halves of the block wait at different __syncthreads.
__global__ void divergent_syncthreads(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Planted bug: one thread exits while the others wait at __syncthreads.
__global__ void exit_before_syncthreads(int* out) {
  if (threadIdx.x == 37) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Planted bug: odd and even lanes wait at different __syncwarp call sites.
__global__ void divergent_syncwarp(int* out) {
  if (threadIdx.x % 2) {
    __syncwarp();
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = 1;
}

// Planted bug: odd and even lanes shuffle at different call sites.
__global__ void divergent_shuffle(int* out) {
  int value = threadIdx.x;
  if (threadIdx.x % 2) {
    value = __shfl_xor_sync(FULL, value, 1);
  } else {
    value = __shfl_xor_sync(FULL, value, 1);
  }
  out[threadIdx.x] = value;
}

// Planted bug: thread t reads what thread t - 1 wrote with no __syncthreads between them (the reader's
// index above the writer's). Threads run in index order pass it by luck; any other order reads stale data.
__global__ void missing_syncthreads(int salt, int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = salt + int(threadIdx.x);
  out[threadIdx.x] = threadIdx.x > 0 ? s[threadIdx.x - 1] : salt - 1;
}

// Planted bug: a shuffle used as a fence between a shared write and a warp-mate's read (__syncwarp is the
// fence; a shuffle only exchanges values).
__global__ void shuffle_as_fence(int salt, int* out) {
  __shared__ int s[64];
  const int lane = threadIdx.x % 32, warp_base = threadIdx.x - lane;
  s[threadIdx.x] = salt + int(threadIdx.x);
  __shfl_xor_sync(FULL, 0, 1);
  out[threadIdx.x] = s[warp_base + (lane + 2) % 32];
}

// Planted bug: the last lane of each row reads one element past its __shared__ row (the next row's first).
__global__ void shared_past_end(int salt, int* out) {
  __shared__ int s[2][32];
  s[threadIdx.x / 32][threadIdx.x % 32] = salt + int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x / 32][threadIdx.x % 32 + 1];
}

// Lane l of each warp reads what lane l + 1 wrote to shared memory: with SYNC a __syncwarp between the
// write and the read (correct), without it a planted bug (the reader's lane may run before the writer's).
template <bool SYNC>
__global__ void warp_exchange(int salt, int* out) {
  __shared__ int s[64];
  const int lane = threadIdx.x % 32, warp_base = threadIdx.x - lane;
  s[threadIdx.x] = salt + int(threadIdx.x);
  if (SYNC) __syncwarp();
  out[threadIdx.x] = s[warp_base + (lane + 1) % 32];
}
