// KV cache maintenance: scatter new rows to their slots (quantizing to fp8 when the pool is fp8), and
// copy whole blocks between pools.
//
// write_cache and copy_blocks move opaque words W (a 16-byte uint4 when rows and pointers allow it, else the 2-byte
// unsigned short every KV dtype is a multiple of), so one instantiation serves fp32, fp16 and bf16.
// A "row" is one slot: num_kv_heads * head_dim elements = row_words words.
#include "kv_common.cuh"

namespace kvw {

// Grid (num_tokens, chunks): token t's K and V rows go to slot slot_mapping[t]; a negative slot skips t.
template <typename W>
__global__ void write_cache(const W* __restrict__ k_new,              // [num_tokens, row_words]
                            const W* __restrict__ v_new,              // [num_tokens, row_words]
                            const long long* __restrict__ slot_mapping,  // [num_tokens]
                            int row_words,
                            W* __restrict__ k_pool,  // [num_slots, row_words]
                            W* __restrict__ v_pool) {
  const long long slot = slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const long long src = (long long)blockIdx.x * row_words, dst = slot * row_words;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < row_words; i += gridDim.y * blockDim.x) {
    k_pool[dst + i] = k_new[src + i];
    v_pool[dst + i] = v_new[src + i];
  }
}

// Grid (num_tokens, chunks): token t's K and V rows in the model dtype T (float, __half, __nv_bfloat16)
// go to slot slot_mapping[t] of fp8 pools as the e4m3 codes of value / k_scale and value / v_scale
// (vLLM's reshape_and_cache with kv_cache_dtype fp8); a negative slot skips t. A row is row_elems
// = num_kv_heads * head_dim elements.
template <typename T>
__global__ void write_cache_fp8(const T* __restrict__ k_new,                 // [num_tokens, row_elems]
                                const T* __restrict__ v_new,                 // [num_tokens, row_elems]
                                const long long* __restrict__ slot_mapping,  // [num_tokens]
                                int row_elems, float k_scale, float v_scale,
                                unsigned char* __restrict__ k_pool,  // [num_slots, row_elems] e4m3 codes
                                unsigned char* __restrict__ v_pool) {
  const long long slot = slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const long long src = (long long)blockIdx.x * row_elems, dst = slot * row_elems;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < row_elems; i += gridDim.y * blockDim.x) {
    k_pool[dst + i] = scaled_e4m3(to_float(k_new[src + i]), k_scale);
    v_pool[dst + i] = scaled_e4m3(to_float(v_new[src + i]), v_scale);
  }
}

// Grid (num_pairs, chunks): block pairs[b][1] of the dst pools gets block pairs[b][0] of the src pools.
// Serves copy-on-write (src and dst the same pools; the caller guarantees no dst is also a src and
// dst blocks are distinct, so the pairs are independent) and swap between pools.
template <typename W>
__global__ void copy_blocks(const W* __restrict__ src_k, const W* __restrict__ src_v,  // [src_blocks, block_words]
                            W* __restrict__ dst_k, W* __restrict__ dst_v,              // [dst_blocks, block_words]
                            const int* __restrict__ pairs,                             // [num_pairs, 2]
                            long long block_words) {
  const long long src = pairs[2 * blockIdx.x] * block_words, dst = pairs[2 * blockIdx.x + 1] * block_words;
  for (long long i = blockIdx.y * blockDim.x + threadIdx.x; i < block_words; i += (long long)gridDim.y * blockDim.x) {
    dst_k[dst + i] = src_k[src + i];
    dst_v[dst + i] = src_v[src + i];
  }
}

}  // namespace kvw
