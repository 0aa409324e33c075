// Decode attention over a latent KV pool (multi-head latent attention, DeepSeek-V2/V3), paged or contiguous,
// dense or over a given list of positions (DeepSeek Sparse Attention's top-k).
//
// Absorbed form, as FlashMLA decodes: the query arrives already projected into the latent space, per head a
// LATENT-wide latent query and a ROPE-wide rotary query. The pool holds one row per token,
// [latent c (LATENT) | rotary key k_rope (ROPE)], shared by every head. Head h scores token t as
// scale · (q_lat[h] · c[t] + q_rope[h] · k_rope[t]) and outputs Σ_t p[h][t] c[t], a LATENT-wide latent
// (the caller's up-projection turns it into the head's value). fp8 rows are e4m3 codes of value / kv_scale.
//
// A thread block owns one sequence and MLA_HEADS query heads: each tile of MLA_TILE tokens' rows is read
// once into shared memory (as float) and serves all of its heads, so a row's bytes are read once per
// MLA_HEADS heads. Per tile: (1) the rows, (2) MLA_HEADS × MLA_TILE scores, MLA_SPLIT lanes each over an
// interleaved part of the row, summed by shuffles, (3) one thread per head: tile max, rescale, weights,
// (4) each thread accumulates its LATENT / MLA_THREADS output columns of every head. Scores are in base 2
// (the query carries log2 e); float32 throughout. The sparse variant reads positions[i] instead of i: the
// same rows gathered through the same page table. Every thread's sums run in a fixed order, so the result
// does not depend on the order threads run in.
#include "kv_common.cuh"

namespace kvw {

constexpr int MLA_THREADS = 128;
constexpr int MLA_HEADS = 8;  // query heads per block sharing each row read
constexpr int MLA_TILE = 8;   // tokens per tile: s_q and s_kv of a 512 + 64 row stay within 48 KB of shared memory
constexpr int MLA_SPLIT = MLA_THREADS / (MLA_HEADS * MLA_TILE);  // lanes per score
constexpr float MLA_LOG2E = 1.4426950408889634f;
static_assert(MLA_SPLIT >= 1 && (MLA_SPLIT & (MLA_SPLIT - 1)) == 0 && MLA_SPLIT <= WARP_SIZE,
              "a score's lanes are a power-of-two group inside one warp");

template <typename T, int LATENT, int ROPE, bool SPARSE, typename Addressing>
__device__ __forceinline__ void mla_block(
    const float* __restrict__ q_latent,       // [num_seqs, num_heads, LATENT]
    const float* __restrict__ q_rope,         // [num_seqs, num_heads, ROPE]
    const T* __restrict__ pool,               // [num_slots, LATENT + ROPE]
    const Addressing addr,
    const int* __restrict__ sel_indptr,       // SPARSE: [num_seqs + 1]
    const int* __restrict__ sel_positions,    // SPARSE: [nnz] logical positions, each < the sequence's kv_len
    int num_heads, float scale, float kv_scale,
    float* __restrict__ out) {                // [num_seqs, num_heads, LATENT]
  constexpr int ROW = LATENT + ROPE;
  constexpr int OWN = (LATENT + MLA_THREADS - 1) / MLA_THREADS;  // output columns per thread and head
  __shared__ float s_q[MLA_HEADS][ROW];
  __shared__ float s_kv[MLA_TILE][ROW];
  __shared__ float s_p[MLA_HEADS][MLA_TILE];
  __shared__ float s_alpha[MLA_HEADS];
  __shared__ float s_m[MLA_HEADS];
  __shared__ float s_l[MLA_HEADS];
  const int seq = blockIdx.y;
  const int head0 = blockIdx.x * MLA_HEADS;
  const int tid = threadIdx.x;
  const auto rows = addr.sequence(seq);
  const int* positions = SPARSE ? sel_positions + sel_indptr[seq] : nullptr;
  const int count = SPARSE ? sel_indptr[seq + 1] - sel_indptr[seq] : addr.kv_len(seq);

  // fp8 decodes to code / KvUnit: the factor and the pool's scale go into the query and the output
  const float q_scale = scale * MLA_LOG2E * KvUnit<T>::value * kv_scale;
  for (int i = tid; i < MLA_HEADS * ROW; i += MLA_THREADS) {
    const int h = i / ROW, d = i % ROW, head = head0 + h;
    float x = 0.f;
    if (head < num_heads) {
      const long long row = (long long)seq * num_heads + head;
      x = d < LATENT ? q_latent[row * LATENT + d] : q_rope[row * ROPE + (d - LATENT)];
    }
    s_q[h][d] = x * q_scale;
  }
  if (tid < MLA_HEADS) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.f;
  }
  float acc[MLA_HEADS][OWN];
#pragma unroll
  for (int h = 0; h < MLA_HEADS; ++h)
#pragma unroll
    for (int i = 0; i < OWN; ++i) acc[h][i] = 0.f;

  for (int base = 0; base < count; base += MLA_TILE) {
    __syncthreads();  // the previous tile's rows and weights are used up; s_q is written
    // one warp per token row: its slot is looked up once, then the lanes read the row's consecutive elements
    for (int t = tid / WARP_SIZE; t < MLA_TILE; t += MLA_THREADS / WARP_SIZE) {
      const int idx = base + t;
      const bool valid = idx < count;
      const T* __restrict__ row = pool + (valid ? (long long)rows.slot(SPARSE ? positions[idx] : idx) * ROW : 0);
#pragma unroll
      for (int d = tid % WARP_SIZE; d < ROW; d += WARP_SIZE) s_kv[t][d] = valid ? to_float(row[d]) : 0.f;
    }
    __syncthreads();
    {
      const int pair = tid / MLA_SPLIT, part = tid % MLA_SPLIT;
      const int h = pair / MLA_TILE, t = pair % MLA_TILE;
      float s = 0.f;
      for (int d = part; d < ROW; d += MLA_SPLIT) s += s_q[h][d] * s_kv[t][d];
#pragma unroll
      for (int offset = 1; offset < MLA_SPLIT; offset *= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (part == 0) s_p[h][t] = base + t < count ? s : -INFINITY;
    }
    __syncthreads();
    if (tid < MLA_HEADS) {
      const float m_old = s_m[tid];
      float m_new = m_old;
#pragma unroll
      for (int t = 0; t < MLA_TILE; ++t) m_new = fmaxf(m_new, s_p[tid][t]);
      // the tile holds at least one real token, so m_new is finite
      const float alpha = m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
      float l = s_l[tid] * alpha;
#pragma unroll
      for (int t = 0; t < MLA_TILE; ++t) {
        const float p = exp2f(s_p[tid][t] - m_new);  // 0 for the masked tail
        s_p[tid][t] = p;
        l += p;
      }
      s_m[tid] = m_new;
      s_l[tid] = l;
      s_alpha[tid] = alpha;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < MLA_HEADS; ++h) {
      const float alpha = s_alpha[h];
#pragma unroll
      for (int i = 0; i < OWN; ++i) {
        const int d = tid + i * MLA_THREADS;
        if (d < LATENT) {
          float a = acc[h][i] * alpha;
#pragma unroll
          for (int t = 0; t < MLA_TILE; ++t) a += s_p[h][t] * s_kv[t][d];
          acc[h][i] = a;
        }
      }
    }
  }
  __syncthreads();  // s_l's last write is visible
  const float out_scale = KvUnit<T>::value * kv_scale;
#pragma unroll
  for (int h = 0; h < MLA_HEADS; ++h) {
    const int head = head0 + h;
    if (head >= num_heads) break;
    const float inv_l = out_scale / s_l[h];
#pragma unroll
    for (int i = 0; i < OWN; ++i) {
      const int d = tid + i * MLA_THREADS;
      if (d < LATENT) out[((long long)seq * num_heads + head) * LATENT + d] = acc[h][i] * inv_l;
    }
  }
}

// Grid (ceil(num_heads / MLA_HEADS), num_seqs), MLA_THREADS threads. Every sequence attends >= 1 token.
template <typename T, int LATENT, int ROPE, bool SPARSE>
__global__ void __launch_bounds__(MLA_THREADS)
    paged_mla_decode(const float* __restrict__ q_latent, const float* __restrict__ q_rope, const T* __restrict__ pool,
                     const int* __restrict__ kv_indptr, const int* __restrict__ kv_indices,
                     const int* __restrict__ kv_last_page_len, int block_size, const int* __restrict__ sel_indptr,
                     const int* __restrict__ sel_positions, int num_heads, float scale, float kv_scale,
                     float* __restrict__ out) {
  const PagedAddressing addr{kv_indptr, kv_indices, kv_last_page_len, block_size};
  mla_block<T, LATENT, ROPE, SPARSE>(q_latent, q_rope, pool, addr, sel_indptr, sel_positions, num_heads, scale,
                                     kv_scale, out);
}

// Same grid as paged_mla_decode; only the addressing differs.
template <typename T, int LATENT, int ROPE, bool SPARSE>
__global__ void __launch_bounds__(MLA_THREADS)
    contiguous_mla_decode(const float* __restrict__ q_latent, const float* __restrict__ q_rope,
                          const T* __restrict__ pool, const int* __restrict__ kv_start, const int* __restrict__ kv_len,
                          const int* __restrict__ sel_indptr, const int* __restrict__ sel_positions, int num_heads,
                          float scale, float kv_scale, float* __restrict__ out) {
  const ContiguousAddressing addr{kv_start, kv_len};
  mla_block<T, LATENT, ROPE, SPARSE>(q_latent, q_rope, pool, addr, sel_indptr, sel_positions, num_heads, scale,
                                     kv_scale, out);
}

}  // namespace kvw
