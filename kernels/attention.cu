// Decode and extend attention over the KV pool, paged or contiguous (DESIGN §7).
//
// One kernel serves both: decode is extend with one query token per sequence. A thread block owns
// one (sequence, kv head, row chunk, KV partition): its "rows" are up to ROWS (query token, query
// head) pairs that read the same kv head, so each K/V row is fetched from memory once for the whole
// GQA group (and, in extend, for several query tokens). Query token j of a sequence with kv_len L
// and Q new tokens sits at position L - Q + j and sees positions 0..L - Q + j (causal); with a
// sliding window W > 0 (argument `window`, 0 = full attention) only L - Q + j - W + 1..L - Q + j.
//
// Warps: the block's rows are spread over ROW_WARPS warps of at most WARP_ROWS rows each (a lane
// keeps q and acc of at most MAX_LANE_ROW_VALUES values: 8 rows, or 4 of fp8's 16-code vectors, so a GQA
// group of 8 sits in one warp and each K/V byte is loaded once except in fp8); the warps that share rows
// split the KV positions into tiles. Inside a warp, a power-of-two lane group (GROUP lanes) covers one head row with 16-byte
// vector loads, SLOTS = 32 / GROUP rows side by side, and a tile is STEPS such steps. Each tile is
// three passes, so the loads of a whole tile are in flight together: (1) the slots of every token
// (page table reads, positions past the end clamped to the last visible one), (2) every K and V
// vector, raw, (3) convert, score (partial dot products summed over the lane group through shared
// memory, or shuffles where a lane would get no whole sum), one max and one rescale for the tile,
// accumulate. In the run of
// full tiles, (1) of the next tile is issued right after (2), so its page-table reads overlap (3). The running
// max m is warp-uniform (the tile max is reduced over the warp); sums l and accumulators acc are
// per row slot and simply added at the end. Warps sharing rows merge through shared memory, KV
// partitions (split-K, flash-decoding style) through merge_partitions.
//
// Limits, by design: a block holds at most 8 rows, so a GQA group of more than 8 query heads (MQA
// with many heads) is split over row chunks that each read the K/V rows again; extend re-reads the
// prefix once per 8 (token, head) rows and uses no tensor cores, which is fine for prefix hits and
// short chunks, not a replacement for a tiled prefill kernel.
#include "kv_common.cuh"

namespace kvw {

constexpr int ATTN_THREADS = 128;
constexpr int ATTN_WARPS = ATTN_THREADS / WARP_SIZE;
// __launch_bounds__ minimum resident blocks per SM: two leave ptxas the full 255 registers (with the
// thread count alone it squeezes small tiles into 64 and spills); split-K reads the real occupancy.
constexpr int ATTN_MIN_BLOCKS = 2;
// Query and accumulator values one lane keeps per row slice, over all its rows: a warp takes as many rows as
// keep q and acc within 2 x 64 registers (8 rows of the 8-element vectors of every 2- and 4-byte dtype, 4 rows
// of fp8's 16-code vectors), leaving the rest of 255 for a tile's loads. A warp holding a whole GQA group of 8
// loads each K/V byte once; split over two warps, both would load it.
constexpr int MAX_LANE_ROW_VALUES = 64;
constexpr int TILE_VECS_PER_LANE = 4;   // K (and V) vectors one lane has in flight per tile
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// The smallest power of two >= n, capped at a warp.
__host__ __device__ constexpr int pow2_at_least(int n, int p = 1) {
  return p >= n || p >= WARP_SIZE ? p : pow2_at_least(n, 2 * p);
}

template <typename T, int HEAD_DIM, int ROWS>
struct Tiling {
  using V = RowVec<T, HEAD_DIM>;
  static constexpr int GROUP = pow2_at_least(V::PER_ROW);       // lanes sharing one head row
  static constexpr int SLOTS = WARP_SIZE / GROUP;                // token rows a warp reads per step
  static constexpr int VECS = (V::PER_ROW + GROUP - 1) / GROUP;  // vectors per lane (last may be idle)
  static constexpr int ELEMS = VECS * V::ELEMS;                  // elements per lane
  static constexpr int MAX_WARP_ROWS = MAX_LANE_ROW_VALUES / ELEMS;
  static constexpr int WARP_ROWS = ROWS < MAX_WARP_ROWS ? ROWS : MAX_WARP_ROWS;
  static constexpr int ROW_WARPS = ROWS / WARP_ROWS;             // warps per token range
  static constexpr int TOKEN_WARPS = ATTN_WARPS / ROW_WARPS;     // warps splitting the positions
  static constexpr int STEPS = TILE_VECS_PER_LANE / VECS > 0 ? TILE_VECS_PER_LANE / VECS : 1;
  static constexpr int TILE = STEPS * SLOTS;                     // positions per warp per tile
  static constexpr int PARTIALS = STEPS * WARP_ROWS;             // partial scores per lane per tile
  // Score sums through shared memory when each lane of a head row takes whole sums (attention_block)
  static constexpr bool SHARED_REDUCE = GROUP >= 4 && PARTIALS % GROUP == 0;
  static constexpr int RED_STRIDE = WARP_SIZE + 4;  // padded: vector reads of different rows hit different banks
  static_assert(ROWS % WARP_ROWS == 0 && ATTN_WARPS % ROW_WARPS == 0, "rows must tile the warps");
};

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
  using L = Tiling<T, HEAD_DIM, ROWS>;
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

  // Scores are kept in base 2 (q carries log2(e)), so each exponential is one ex2; m and l stay in
  // that unit until they leave the block, where m is converted back to natural log units.
  const float q_scale = scale * LOG2E * KvUnit<T>::value;
  __shared__ float s_q[ROWS][HEAD_DIM];
  for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += ATTN_THREADS) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    s_q[r][d] = row_visible(r) > 0 ? q[((long long)row_q(r) * num_heads + row_head(r)) * HEAD_DIM + d] * q_scale : 0.f;
  }
  __syncthreads();

  const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
  const int slot = lane / L::GROUP, g = lane % L::GROUP;
  const int token_warp = warp % L::TOKEN_WARPS, first_row = warp / L::TOKEN_WARPS * L::WARP_ROWS;
  // Partitions tile the block's span [row_first(0), visible_max) (the whole prefix without a window):
  // nothing before the earliest row's window is read, and the launcher sizes split-K by that span. A
  // partition past the span reads nothing and leaves its rows empty (l = 0), weighed zero in the merge.
  const int begin = row_first(0) + part * partition_tokens;
  const int end = imin(begin + partition_tokens, visible_max);

  float q_reg[L::WARP_ROWS][L::ELEMS];
  // Positions below limit(r) are visible to the warp's row r (and inside the partition); positions from
  // lower(r) on are inside its window. Recomputed where masked tiles need them, not kept in registers.
  const auto limit = [&](int r) { return imin(end, row_visible(first_row + r)); };
  const auto lower = [&](int r) { return row_first(first_row + r); };
  int min_limit = end;      // the smallest limit of the warp's real rows (padding rows' results are dropped)
  int max_lower = begin;    // the largest window start of the warp's real rows
  float m[L::WARP_ROWS], l[L::WARP_ROWS], acc[L::WARP_ROWS][L::ELEMS];
#pragma unroll
  for (int r = 0; r < L::WARP_ROWS; ++r) {
    if (row0 + first_row + r < num_rows) {
      min_limit = imin(min_limit, limit(r));
      max_lower = imax(max_lower, lower(r));
    }
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < L::VECS; ++i)
#pragma unroll
      for (int e = 0; e < V::ELEMS; ++e) {
        const int vec = g + i * L::GROUP;
        q_reg[r][i * V::ELEMS + e] = vec < V::PER_ROW ? s_q[first_row + r][vec * V::ELEMS + e] : 0.f;
        acc[r][i * V::ELEMS + e] = 0.f;
      }
  }

  const auto table = addr.sequence(seq);
  // The block's kv head in each pool, seen as bytes: a row's offset is one 32 x 32 -> 64-bit multiply.
  const char* const k_head = reinterpret_cast<const char*>(k_pool + (long long)kv_head * HEAD_DIM);
  const char* const v_head = reinterpret_cast<const char*>(v_pool + (long long)kv_head * HEAD_DIM);
  const int slot_bytes = num_kv_heads * HEAD_DIM * int(sizeof(T));
  // One tile of L::TILE positions from `base`. MASKED: some position of the tile is past a real
  // row's limit or before a real row's window start, so positions are clamped for loading and masked
  // per row; full tiles skip both. (Positions are never below `begin`: nothing is clamped downwards.)
  // (The lambda is inlined at both calls, so each copy is compiled with MASKED a constant.)
  // (1) the byte offset of each step's K/V row in the tile at `base`; positions past the partition are
  // clamped to its last one (masked tiles, and the prefetch of the tile after the last full one).
  const auto tile_rows = [&](const int base, long long (&row_at)[L::STEPS], const bool CLAMP) {
#pragma unroll
    for (int s = 0; s < L::STEPS; ++s) {
      const int pos = base + s * L::SLOTS + slot;
      row_at[s] = (long long)table.slot(CLAMP ? imin(pos, end - 1) : pos) * slot_bytes;
    }
  };
  // Sums each lane's partial scores over the GROUP lanes of its head row. Through shared memory when every
  // lane can take whole sums (L::SHARED_REDUCE): each lane has stored its R partials, a lane adds up R / GROUP
  // of its row's partial columns (GROUP / 4 vector reads each) and stores the sums, and every lane reads its
  // row's R sums back: about R + 2 R / GROUP + R / 4 + 2 instructions where a butterfly of shuffles takes
  // 2 R log2(GROUP). Two __syncwarp per tile order the stores before the reads and the reads before the next
  // tile's stores.
  // (The partials share their memory with the accumulators that the warps merge after the tiles.)
  __shared__ union {
    float red[ATTN_WARPS][L::SHARED_REDUCE ? L::PARTIALS : 1][L::RED_STRIDE];
    float acc[L::TOKEN_WARPS][ROWS][HEAD_DIM];
  } s_work;
  __shared__ __align__(16) float s_sum[ATTN_WARPS][L::SHARED_REDUCE ? L::SLOTS : 1][L::PARTIALS];
  const auto reduce_scores = [&](float (&score)[L::STEPS][L::WARP_ROWS]) {
    if (!L::SHARED_REDUCE) {
#pragma unroll
      for (int offset = L::GROUP / 2; offset > 0; offset /= 2)
#pragma unroll
        for (int s = 0; s < L::STEPS; ++s)
#pragma unroll
          for (int r = 0; r < L::WARP_ROWS; ++r) score[s][r] += __shfl_xor_sync(FULL_MASK, score[s][r], offset);
      return;
    }
    constexpr int SUMS = L::PARTIALS / L::GROUP;  // sums one lane adds up
    __syncwarp();  // the tile's partials are stored (as each was computed)
#pragma unroll
    for (int k = 0; k < SUMS; ++k) {
      const int j = g * SUMS + k;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < L::GROUP; c += 4) {
        const float4 x = *reinterpret_cast<const float4*>(&s_work.red[warp][j][slot * L::GROUP + c]);
        sum += (x.x + x.y) + (x.z + x.w);
      }
      s_sum[warp][slot][j] = sum;
    }
    __syncwarp();
#pragma unroll
    for (int s = 0; s < L::STEPS; ++s)
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r) score[s][r] = s_sum[warp][slot][s * L::WARP_ROWS + r];
  };
  // One tile whose rows `row_at` holds. PREFETCH: once its loads are issued, `row_at` becomes the next
  // tile's rows, so the page-table reads of the next tile are in flight during this tile's math instead
  // of delaying its loads.
  const auto tile = [&](const int base, const bool MASKED, long long (&row_at)[L::STEPS], const bool PREFETCH) {
    Vec<T, V::ELEMS> k_raw[L::STEPS][L::VECS], v_raw[L::STEPS][L::VECS];  // (2) every load of the tile
#pragma unroll
    for (int s = 0; s < L::STEPS; ++s)
#pragma unroll
      for (int i = 0; i < L::VECS; ++i) {
        const int vec = imin(g + i * L::GROUP, V::PER_ROW - 1);  // idle lanes re-read a valid vector
        k_raw[s][i] = load_vec<T, V::ELEMS>(reinterpret_cast<const T*>(k_head + row_at[s]) + vec * V::ELEMS);
        v_raw[s][i] = load_vec<T, V::ELEMS>(reinterpret_cast<const T*>(v_head + row_at[s]) + vec * V::ELEMS);
      }
    if (PREFETCH) tile_rows(base + L::TOKEN_WARPS * L::TILE, row_at, true);
    float score[L::STEPS][L::WARP_ROWS];  // (3) scores, reduced over the lane group
#pragma unroll
    for (int s = 0; s < L::STEPS; ++s) {
      float k[L::ELEMS];
#pragma unroll
      for (int i = 0; i < L::VECS; ++i)
        vec_to_float(k_raw[s][i], k + i * V::ELEMS, g + i * L::GROUP < V::PER_ROW);
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r) {
        float partial = 0.f;
#pragma unroll
        for (int e = 0; e < L::ELEMS; ++e) partial += q_reg[r][e] * k[e];
        // stored as soon as it is complete, so no lane holds a tile of partials (registers, not instructions)
        if (L::SHARED_REDUCE) s_work.red[warp][s * L::WARP_ROWS + r][lane] = partial;
        score[s][r] = partial;
      }
    }
    reduce_scores(score);
    float tile_max[L::WARP_ROWS];
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r) {
      tile_max[r] = -INFINITY;
#pragma unroll
      for (int s = 0; s < L::STEPS; ++s) {
        const int pos = base + s * L::SLOTS + slot;
        if (MASKED && (pos >= limit(r) || pos < lower(r))) score[s][r] = -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], score[s][r]);
      }
    }
#pragma unroll
    for (int offset = L::GROUP; offset < WARP_SIZE; offset *= 2)
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r)
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(FULL_MASK, tile_max[r], offset));
    float p[L::STEPS][L::WARP_ROWS];  // one rescale per tile, then the tile's weights
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r) {
      const float m_new = fmaxf(m[r], tile_max[r]);
      const float m_safe = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays empty
      const float alpha = exp2f(m[r] - m_safe);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int e = 0; e < L::ELEMS; ++e) acc[r][e] *= alpha;
#pragma unroll
      for (int s = 0; s < L::STEPS; ++s) {
        p[s][r] = exp2f(score[s][r] - m_safe);
        l[r] += p[s][r];
      }
    }
#pragma unroll
    for (int s = 0; s < L::STEPS; ++s) {
      float v[L::ELEMS];
#pragma unroll
      for (int i = 0; i < L::VECS; ++i)
        vec_to_float(v_raw[s][i], v + i * V::ELEMS, g + i * L::GROUP < V::PER_ROW);
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r)
#pragma unroll
        for (int e = 0; e < L::ELEMS; ++e) acc[r][e] += p[s][r] * v[e];
    }
  };
  // Masked tiles that start before some real row's window start, then full tiles (every real row of
  // the warp sees all of them), then the masked rest. The loop bounds are warp-uniform, so every lane
  // reaches every shuffle.
  long long row_at[L::STEPS];
  int base = begin + token_warp * L::TILE;
  for (; base < max_lower && base < end; base += L::TOKEN_WARPS * L::TILE) {
    tile_rows(base, row_at, true);
    tile(base, true, row_at, false);
  }
  // Only a page table has reads worth starting early; contiguous rows are arithmetic.
  constexpr bool PREFETCH = Addressing::READS_TABLE;
  if (PREFETCH && base + L::TILE <= min_limit) tile_rows(base, row_at, false);
  for (; base + L::TILE <= min_limit; base += L::TOKEN_WARPS * L::TILE) {
    if (!PREFETCH) tile_rows(base, row_at, false);
    tile(base, false, row_at, PREFETCH);
  }
  for (; base < end; base += L::TOKEN_WARPS * L::TILE) {
    tile_rows(base, row_at, true);
    tile(base, true, row_at, false);
  }

  // Add up the row slots of each warp (they share m): afterwards lanes 0..GROUP-1 hold the warp's state.
#pragma unroll
  for (int offset = L::GROUP; offset < WARP_SIZE; offset *= 2)
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r) {
      l[r] += __shfl_xor_sync(FULL_MASK, l[r], offset);
#pragma unroll
      for (int e = 0; e < L::ELEMS; ++e) acc[r][e] += __shfl_xor_sync(FULL_MASK, acc[r][e], offset);
    }

  __syncthreads();  // every warp is past its tiles: s_work holds accumulators from here on
  __shared__ float s_m[L::TOKEN_WARPS][ROWS];
  __shared__ float s_l[L::TOKEN_WARPS][ROWS];
  if (slot == 0) {
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r) {
      if (g == 0) {
        s_m[token_warp][first_row + r] = m[r];
        s_l[token_warp][first_row + r] = l[r];
      }
#pragma unroll
      for (int i = 0; i < L::VECS; ++i)
#pragma unroll
        for (int e = 0; e < V::ELEMS; ++e) {
          const int vec = g + i * L::GROUP;
          if (vec < V::PER_ROW) s_work.acc[token_warp][first_row + r][vec * V::ELEMS + e] = acc[r][i * V::ELEMS + e];
        }
    }
  }
  __syncthreads();

  const int num_parts = gridDim.y;
  for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += ATTN_THREADS) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    if (row_visible(r) == 0) continue;
    float m_all = -INFINITY;
    for (int w = 0; w < L::TOKEN_WARPS; ++w) m_all = fmaxf(m_all, s_m[w][r]);
    float l_all = 0.f, a_all = 0.f;
    if (m_all != -INFINITY) {
      for (int w = 0; w < L::TOKEN_WARPS; ++w) {
        const float c = exp2f(s_m[w][r] - m_all);
        l_all += s_l[w][r] * c;
        a_all += s_work.acc[w][r][d] * c;
      }
    }
    const float o = l_all > 0.f ? __fdividef(a_all, l_all) * KvUnit<T>::value : 0.f;
    const long long head_row = (long long)row_q(r) * num_heads + row_head(r);
    if (num_parts == 1) {
      out[head_row * HEAD_DIM + d] = o;
    } else {
      const long long part_row = head_row * num_parts + part;
      part_out[part_row * HEAD_DIM + d] = o;
      if (d == 0) {
        part_ml[part_row * 2] = m_all * LN2;  // natural log units, as merge_partitions expects
        part_ml[part_row * 2 + 1] = l_all;
      }
    }
  }
}

// Grid (num_kv_heads * row_chunks, num_partitions, num_seqs), ATTN_THREADS threads.
template <typename T, int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)
    paged_attention(const float* __restrict__ q, const int* __restrict__ qo_indptr, const T* __restrict__ k_pool,
                    const T* __restrict__ v_pool, const int* __restrict__ kv_indptr,
                    const int* __restrict__ kv_indices, const int* __restrict__ kv_last_page_len, int block_size,
                    int num_heads, int num_kv_heads, int row_chunks, int partition_tokens, float scale, int window,
                    float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_ml) {
  const PagedAddressing addr{kv_indptr, kv_indices, kv_last_page_len, block_size};
  attention_block<T, HEAD_DIM, ROWS>(q, qo_indptr, k_pool, v_pool, addr, num_heads, num_kv_heads, row_chunks,
                                     partition_tokens, scale, window, out, part_out, part_ml);
}

// Same grid as paged_attention; only the addressing differs.
template <typename T, int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)
    contiguous_attention(const float* __restrict__ q, const int* __restrict__ qo_indptr,
                         const T* __restrict__ k_pool, const T* __restrict__ v_pool, const int* __restrict__ kv_start,
                         const int* __restrict__ kv_len, int num_heads, int num_kv_heads, int row_chunks,
                         int partition_tokens, float scale, int window, float* __restrict__ out,
                         float* __restrict__ part_out, float* __restrict__ part_ml) {
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
