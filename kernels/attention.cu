// Decode and extend attention over the KV pool, paged or contiguous (DESIGN §7).
//
// One kernel serves both: decode is extend with one query token per sequence. A thread block owns
// one (sequence, kv head, row chunk, KV partition): its "rows" are up to ROWS (query token, query
// head) pairs that read the same kv head, so each K/V row the block touches is loaded once for the
// whole GQA group (and, in extend, for several query tokens). Query token j of a sequence with
// kv_len L and Q new tokens sits at position L - Q + j and sees positions 0..L - Q + j (causal);
// with a sliding window W > 0 (argument `window`, 0 = full attention) only L - Q + j - W + 1..L - Q + j.
//
// Inside a block, a power-of-two lane group (GROUP lanes) covers one head row with vector loads;
// each warp reads SLOTS = 32 / GROUP rows per step and keeps an online-softmax state per row slot
// (running max m, running sum l, unnormalised accumulator acc). The states are merged across slots
// with warp shuffles, across warps through shared memory, and across KV partitions (split-K,
// flash-decoding style) by merge_partitions.
//
// Limits, by design: a block holds at most 8 rows, so a GQA group of more than 8 query heads (MQA
// with many heads) is split over row chunks that each read the K/V rows again; extend re-reads the
// prefix once per 8 (token, head) rows and uses no tensor cores, which is fine for prefix hits and
// short chunks, not a replacement for a tiled prefill kernel.
#include "kv_common.cuh"

namespace kvw {

constexpr int ATTN_THREADS = 128;
constexpr int ATTN_WARPS = ATTN_THREADS / WARP_SIZE;
constexpr int ATTN_UNROLL = 2;  // token steps whose K/V loads are in flight together
constexpr unsigned FULL_MASK = 0xffffffffu;

// The smallest power of two >= n, capped at a warp.
__host__ __device__ constexpr int pow2_at_least(int n, int p = 1) {
  return p >= n || p >= WARP_SIZE ? p : pow2_at_least(n, 2 * p);
}

template <typename T, int HEAD_DIM>
struct RowLanes {
  using V = RowVec<T, HEAD_DIM>;
  static constexpr int GROUP = pow2_at_least(V::PER_ROW);       // lanes sharing one head row
  static constexpr int SLOTS = WARP_SIZE / GROUP;                // rows a warp reads per step
  static constexpr int VECS = (V::PER_ROW + GROUP - 1) / GROUP;  // vectors per lane (last may be idle)
  static constexpr int ELEMS = VECS * V::ELEMS;                  // elements per lane
};

// Merges online-softmax state (m_o, l_o, acc_o) into (m, l, acc); an empty state has m = -inf, l = 0.
template <int ELEMS>
__device__ __forceinline__ void merge_state(float& m, float& l, float* acc, float m_o, float l_o, const float* acc_o) {
  const float m_new = fmaxf(m, m_o);
  const float a = m_new == -INFINITY ? 0.f : __expf(m - m_new);
  const float b = m_new == -INFINITY ? 0.f : __expf(m_o - m_new);
  l = l * a + l_o * b;
#pragma unroll
  for (int e = 0; e < ELEMS; ++e) acc[e] = acc[e] * a + acc_o[e] * b;
  m = m_new;
}

template <typename T, int HEAD_DIM, int ROWS, typename Addressing>
__device__ __forceinline__ void attention_block(
    const float* __restrict__ q,        // [total_q, num_heads, HEAD_DIM]
    const int* __restrict__ qo_indptr,  // [num_seqs + 1]
    const T* __restrict__ k_pool,       // [num_slots, num_kv_heads, HEAD_DIM]
    const T* __restrict__ v_pool,       // [num_slots, num_kv_heads, HEAD_DIM]
    const Addressing addr, int num_heads, int num_kv_heads, int row_chunks, int partition_tokens, float scale,
    int window,                    // sliding window in tokens; 0 = full attention
    float* __restrict__ out,       // [total_q, num_heads, HEAD_DIM], written when gridDim.y == 1
    float* __restrict__ part_out,  // [total_q, num_heads, gridDim.y, HEAD_DIM], written when gridDim.y > 1
    float* __restrict__ part_ml) {  // [total_q, num_heads, gridDim.y, 2] (max, sum), with part_out
  using L = RowLanes<T, HEAD_DIM>;
  using V = typename L::V;
  const int seq = blockIdx.z;
  const int part = blockIdx.y;
  const int kv_head = blockIdx.x / row_chunks;
  const int row0 = (blockIdx.x % row_chunks) * ROWS;
  const int group = num_heads / num_kv_heads;
  const int q_begin = qo_indptr[seq];
  const int num_q = qo_indptr[seq + 1] - q_begin;
  const int num_rows = num_q * group;
  if (row0 >= num_rows) return;  // block-uniform: this sequence has fewer rows than the grid
  const int kv_len = addr.kv_len(seq);

  // Row r of this block is query token (row0 + r) / group, head kv_head * group + (row0 + r) % group;
  // it sees `visible` KV positions (0 for padding rows past the sequence's rows).
  const auto row_q = [&](int r) { return q_begin + (row0 + r) / group; };
  const auto row_head = [&](int r) { return kv_head * group + (row0 + r) % group; };
  const auto row_visible = [&](int r) { return row0 + r < num_rows ? kv_len - num_q + (row0 + r) / group + 1 : 0; };
  const int visible_max = row_visible(imin(ROWS, num_rows - row0) - 1);  // the last real row sees the most
  // First position row r reads: its window's start (row 0, the earliest query, has the smallest one).
  const auto row_first = [&](int r) { return window > 0 ? imax(0, row_visible(r) - window) : 0; };

  __shared__ float s_q[ROWS][HEAD_DIM];
  for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += ATTN_THREADS) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    s_q[r][d] = row_visible(r) > 0 ? q[((long long)row_q(r) * num_heads + row_head(r)) * HEAD_DIM + d] * scale : 0.f;
  }
  __syncthreads();

  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  const int slot = lane / L::GROUP, g = lane % L::GROUP;
  float q_reg[ROWS][L::ELEMS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int i = 0; i < L::VECS; ++i)
#pragma unroll
      for (int e = 0; e < V::ELEMS; ++e) {
        const int vec = g + i * L::GROUP;
        q_reg[r][i * V::ELEMS + e] = vec < V::PER_ROW ? s_q[r][vec * V::ELEMS + e] : 0.f;
      }

  float m[ROWS], l[ROWS], acc[ROWS][L::ELEMS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < L::ELEMS; ++e) acc[r][e] = 0.f;
  }

  const int begin = part * partition_tokens;
  const int end = imin(begin + partition_tokens, visible_max);
  const int first = imax(begin, row_first(0));  // nothing before the earliest row's window is read
  // Each step the block covers STEP consecutive positions (warp w takes SLOTS of them); each loop
  // iteration issues the loads of UNROLL steps before using any, to keep more bytes in flight.
  // The loop bound is block-uniform, so every lane reaches every shuffle.
  constexpr int STEP = ATTN_WARPS * L::SLOTS;
  for (int base = first; base < end; base += ATTN_UNROLL * STEP) {
    int pos[ATTN_UNROLL];
    float k[ATTN_UNROLL][L::ELEMS], v[ATTN_UNROLL][L::ELEMS];
#pragma unroll
    for (int u = 0; u < ATTN_UNROLL; ++u) {
      pos[u] = base + u * STEP + warp * L::SLOTS + slot;
#pragma unroll
      for (int e = 0; e < L::ELEMS; ++e) k[u][e] = v[u][e] = 0.f;
      if (pos[u] < end) {
        const long long row = (addr.slot(seq, pos[u]) * num_kv_heads + kv_head) * HEAD_DIM;
#pragma unroll
        for (int i = 0; i < L::VECS; ++i) {
          const int vec = g + i * L::GROUP;
          if (vec < V::PER_ROW) {
            load_vec_as_float<T, V::ELEMS>(k_pool + row + vec * V::ELEMS, k[u] + i * V::ELEMS);
            load_vec_as_float<T, V::ELEMS>(v_pool + row + vec * V::ELEMS, v[u] + i * V::ELEMS);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < ATTN_UNROLL; ++u) {
      float score[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        score[r] = 0.f;
#pragma unroll
        for (int e = 0; e < L::ELEMS; ++e) score[r] += q_reg[r][e] * k[u][e];
      }
#pragma unroll
      for (int offset = L::GROUP / 2; offset > 0; offset /= 2)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) score[r] += __shfl_xor_sync(FULL_MASK, score[r], offset);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (pos[u] < end && pos[u] < row_visible(r) && pos[u] >= row_first(r)) {
          const float m_new = fmaxf(m[r], score[r]);
          const float alpha = __expf(m[r] - m_new);
          const float p = __expf(score[r] - m_new);
          l[r] = l[r] * alpha + p;
#pragma unroll
          for (int e = 0; e < L::ELEMS; ++e) acc[r][e] = acc[r][e] * alpha + p * v[u][e];
          m[r] = m_new;
        }
      }
    }
  }

  // Merge the row slots of each warp: afterwards lanes 0..GROUP-1 hold the warp's state.
#pragma unroll
  for (int offset = L::GROUP; offset < WARP_SIZE; offset *= 2) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float m_o = __shfl_xor_sync(FULL_MASK, m[r], offset);
      const float l_o = __shfl_xor_sync(FULL_MASK, l[r], offset);
      float acc_o[L::ELEMS];
#pragma unroll
      for (int e = 0; e < L::ELEMS; ++e) acc_o[e] = __shfl_xor_sync(FULL_MASK, acc[r][e], offset);
      merge_state<L::ELEMS>(m[r], l[r], acc[r], m_o, l_o, acc_o);
    }
  }

  __shared__ float s_acc[ATTN_WARPS][ROWS][HEAD_DIM];
  __shared__ float s_m[ATTN_WARPS][ROWS];
  __shared__ float s_l[ATTN_WARPS][ROWS];
  if (slot == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (g == 0) {
        s_m[warp][r] = m[r];
        s_l[warp][r] = l[r];
      }
#pragma unroll
      for (int i = 0; i < L::VECS; ++i)
#pragma unroll
        for (int e = 0; e < V::ELEMS; ++e) {
          const int vec = g + i * L::GROUP;
          if (vec < V::PER_ROW) s_acc[warp][r][vec * V::ELEMS + e] = acc[r][i * V::ELEMS + e];
        }
    }
  }
  __syncthreads();

  const int num_parts = gridDim.y;
  for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += ATTN_THREADS) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    if (row_visible(r) == 0) continue;
    float m_all = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; ++w) m_all = fmaxf(m_all, s_m[w][r]);
    float l_all = 0.f, a_all = 0.f;
    if (m_all != -INFINITY) {
      for (int w = 0; w < ATTN_WARPS; ++w) {
        const float c = __expf(s_m[w][r] - m_all);
        l_all += s_l[w][r] * c;
        a_all += s_acc[w][r][d] * c;
      }
    }
    const float o = l_all > 0.f ? __fdividef(a_all, l_all) : 0.f;
    const long long head_row = (long long)row_q(r) * num_heads + row_head(r);
    if (num_parts == 1) {
      out[head_row * HEAD_DIM + d] = o;
    } else {
      const long long part_row = head_row * num_parts + part;
      part_out[part_row * HEAD_DIM + d] = o;
      if (d == 0) {
        part_ml[part_row * 2] = m_all;
        part_ml[part_row * 2 + 1] = l_all;
      }
    }
  }
}

// Grid (num_kv_heads * row_chunks, num_partitions, num_seqs), ATTN_THREADS threads.
template <typename T, int HEAD_DIM, int ROWS>
__global__ void paged_attention(const float* __restrict__ q, const int* __restrict__ qo_indptr,
                                const T* __restrict__ k_pool, const T* __restrict__ v_pool,
                                const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
                                const int* __restrict__ kv_last_page_len, int block_size, int num_heads,
                                int num_kv_heads, int row_chunks, int partition_tokens, float scale, int window,
                                float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml) {
  const PagedAddressing addr{kv_indptr, kv_indices, kv_last_page_len, block_size};
  attention_block<T, HEAD_DIM, ROWS>(q, qo_indptr, k_pool, v_pool, addr, num_heads, num_kv_heads, row_chunks,
                                     partition_tokens, scale, window, out, part_out, part_ml);
}

// Same grid as paged_attention; only the addressing differs.
template <typename T, int HEAD_DIM, int ROWS>
__global__ void contiguous_attention(const float* __restrict__ q, const int* __restrict__ qo_indptr,
                                     const T* __restrict__ k_pool, const T* __restrict__ v_pool,
                                     const int* __restrict__ kv_start, const int* __restrict__ kv_len, int num_heads,
                                     int num_kv_heads, int row_chunks, int partition_tokens, float scale, int window,
                                     float* __restrict__ out, float* __restrict__ part_out,
                                     float* __restrict__ part_ml) {
  const ContiguousAddressing addr{kv_start, kv_len};
  attention_block<T, HEAD_DIM, ROWS>(q, qo_indptr, k_pool, v_pool, addr, num_heads, num_kv_heads, row_chunks,
                                     partition_tokens, scale, window, out, part_out, part_ml);
}

// Combines the per-partition results of one (query token, head) per block: grid (total_q, num_heads).
// Partition p carries its normalised output o_p, its max m_p and sum l_p; the result is
// sum_p w_p o_p / sum_p w_p with w_p = l_p exp(m_p - max_p m_p). Empty partitions have l_p = 0.
__global__ void merge_partitions(const float* __restrict__ part_out,  // [total_q, num_heads, num_parts, head_dim]
                                 const float* __restrict__ part_ml,   // [total_q, num_heads, num_parts, 2]
                                 int num_parts, int head_dim,
                                 float* __restrict__ out) {  // [total_q, num_heads, head_dim]
  const long long head_row = (long long)blockIdx.x * gridDim.y + blockIdx.y;
  const float* ml = part_ml + head_row * num_parts * 2;
  float m_all = -INFINITY;
  for (int p = 0; p < num_parts; ++p) m_all = fmaxf(m_all, ml[2 * p]);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float l_all = 0.f, a_all = 0.f;
    for (int p = 0; p < num_parts; ++p) {
      const float w = ml[2 * p + 1] == 0.f ? 0.f : ml[2 * p + 1] * __expf(ml[2 * p] - m_all);
      l_all += w;
      a_all += w * part_out[(head_row * num_parts + p) * head_dim + d];
    }
    out[head_row * head_dim + d] = __fdividef(a_all, l_all);
  }
}

}  // namespace kvw
