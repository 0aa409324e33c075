// C entry points of the CPU shim build (workbench/kernels/cuda_cpu.py loads it through ctypes).
// The kernels are the unmodified .cu text; this file only instantiates and launches them.
#include "cuda_cpu_shim.h"

#include "attention.cu"
#include "cache_ops.cu"

namespace {

// Mirrors workbench/kernels/cuda_cpu.py AttentionArgs field for field.
struct AttentionArgs {
  int paged;      // 1: kv_indptr / kv_indices / kv_last_page_len, 0: kv_start / kv_len
  int kv_dtype;   // 0 fp32, 1 fp16, 2 bf16
  int head_dim;
  int rows;
  const float* q;
  const int* qo_indptr;
  const void* k_pool;
  const void* v_pool;
  const int* kv_indptr;
  const int* kv_indices;
  const int* kv_last_page_len;
  const int* kv_start;
  const int* kv_len;
  int block_size;
  int num_heads;
  int num_kv_heads;
  int num_seqs;
  int row_chunks;
  int num_partitions;
  int partition_tokens;
  float scale;
  float* out;
  float* part_out;
  float* part_ml;
  int os_threads;
};

template <typename T, int HEAD_DIM, int ROWS>
void attention(const AttentionArgs& a) {
  const dim3 grid(a.num_kv_heads * a.row_chunks, a.num_partitions, a.num_seqs);
  const T* k = static_cast<const T*>(a.k_pool);
  const T* v = static_cast<const T*>(a.v_pool);
  if (a.paged) {
    cuda_cpu::launch(grid, dim3(kvw::ATTN_THREADS), a.os_threads, [&] {
      kvw::paged_attention<T, HEAD_DIM, ROWS>(a.q, a.qo_indptr, k, v, a.kv_indptr, a.kv_indices, a.kv_last_page_len,
                                               a.block_size, a.num_heads, a.num_kv_heads, a.row_chunks,
                                               a.partition_tokens, a.scale, a.out, a.part_out, a.part_ml);
    });
  } else {
    cuda_cpu::launch(grid, dim3(kvw::ATTN_THREADS), a.os_threads, [&] {
      kvw::contiguous_attention<T, HEAD_DIM, ROWS>(a.q, a.qo_indptr, k, v, a.kv_start, a.kv_len, a.num_heads,
                                                    a.num_kv_heads, a.row_chunks, a.partition_tokens, a.scale, a.out,
                                                    a.part_out, a.part_ml);
    });
  }
}

template <typename T, int HEAD_DIM>
bool attention_rows(const AttentionArgs& a) {
  switch (a.rows) {
    case 1: attention<T, HEAD_DIM, 1>(a); return true;
    case 2: attention<T, HEAD_DIM, 2>(a); return true;
    case 4: attention<T, HEAD_DIM, 4>(a); return true;
    case 8: attention<T, HEAD_DIM, 8>(a); return true;
  }
  return false;
}

template <typename T>
bool attention_head_dim(const AttentionArgs& a) {
  switch (a.head_dim) {
    case 64: return attention_rows<T, 64>(a);
    case 80: return attention_rows<T, 80>(a);
    case 96: return attention_rows<T, 96>(a);
    case 128: return attention_rows<T, 128>(a);
    case 256: return attention_rows<T, 256>(a);
  }
  return false;
}

}  // namespace

// Returns 0, or -1 when (kv_dtype, head_dim, rows) has no instantiation.
extern "C" int kvw_attention(const AttentionArgs* a) {
  switch (a->kv_dtype) {
    case 0: return attention_head_dim<float>(*a) ? 0 : -1;
    case 1: return attention_head_dim<__half>(*a) ? 0 : -1;
    case 2: return attention_head_dim<__nv_bfloat16>(*a) ? 0 : -1;
  }
  return -1;
}

extern "C" void kvw_merge_partitions(const float* part_out, const float* part_ml, int num_partitions, int head_dim,
                                     int num_heads, int total_q, float* out, int block_threads, int os_threads) {
  cuda_cpu::launch(dim3(total_q, num_heads), dim3(block_threads), os_threads,
                   [&] { kvw::merge_partitions(part_out, part_ml, num_partitions, head_dim, out); });
}

// word_bytes 16 moves uint4 words, 2 moves unsigned short words; returns -1 for any other size.
extern "C" int kvw_write_cache(int word_bytes, const void* k_new, const void* v_new, const long long* slot_mapping,
                               int num_tokens, int row_words, void* k_pool, void* v_pool, int chunks,
                               int block_threads, int os_threads) {
  const dim3 grid(num_tokens, chunks);
  if (word_bytes == 16) {
    cuda_cpu::launch(grid, dim3(block_threads), os_threads, [&] {
      kvw::write_cache(static_cast<const uint4*>(k_new), static_cast<const uint4*>(v_new), slot_mapping, row_words,
                       static_cast<uint4*>(k_pool), static_cast<uint4*>(v_pool));
    });
    return 0;
  }
  if (word_bytes == 2) {
    using W = unsigned short;
    cuda_cpu::launch(grid, dim3(block_threads), os_threads, [&] {
      kvw::write_cache(static_cast<const W*>(k_new), static_cast<const W*>(v_new), slot_mapping, row_words,
                       static_cast<W*>(k_pool), static_cast<W*>(v_pool));
    });
    return 0;
  }
  return -1;
}

extern "C" int kvw_copy_blocks(int word_bytes, const void* src_k, const void* src_v, void* dst_k, void* dst_v,
                               const int* pairs, int num_pairs, long long block_words, int chunks, int block_threads,
                               int os_threads) {
  const dim3 grid(num_pairs, chunks);
  if (word_bytes == 16) {
    cuda_cpu::launch(grid, dim3(block_threads), os_threads, [&] {
      kvw::copy_blocks(static_cast<const uint4*>(src_k), static_cast<const uint4*>(src_v), static_cast<uint4*>(dst_k),
                       static_cast<uint4*>(dst_v), pairs, block_words);
    });
    return 0;
  }
  if (word_bytes == 2) {
    using W = unsigned short;
    cuda_cpu::launch(grid, dim3(block_threads), os_threads, [&] {
      kvw::copy_blocks(static_cast<const W*>(src_k), static_cast<const W*>(src_v), static_cast<W*>(dst_k),
                       static_cast<W*>(dst_v), pairs, block_words);
    });
    return 0;
  }
  return -1;
}
