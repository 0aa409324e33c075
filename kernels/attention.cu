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
// loads each K/V byte once; split over two warps, both would load it. So a block of more than 4 rows gives fp8
// 8-code vectors (Tiling), and its 8 rows fit one warp too.
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
  static constexpr int MAX_VEC_ELEMS = MAX_LANE_ROW_VALUES / ROWS;  // so that a lane's vectors of ROWS rows fit
  using V = RowVec<T, HEAD_DIM, (sizeof(T) == 1 ? 16 : 8) < MAX_VEC_ELEMS ? (sizeof(T) == 1 ? 16 : 8) : MAX_VEC_ELEMS>;
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
  // With SHARED_REDUCE each lane owns OWNED of the tile's summed scores, consecutive steps of one row, and is the
  // only lane that computes their weights (attention_block); otherwise every lane of a head row holds all of its
  // rows' scores.
  static constexpr int OWNED = SHARED_REDUCE ? PARTIALS / GROUP : PARTIALS;
  // A row of partials in shared memory: OWNED steps of each of the 32 lanes, padded so that vector reads of
  // different rows hit different banks.
  static constexpr int RED_STRIDE = WARP_SIZE * OWNED + 4;
  static constexpr int LANE_ROWS = SHARED_REDUCE ? 1 : WARP_ROWS;  // rows whose m and l one lane keeps
  // Lanes keeping the same rows' m and l differ only in lane bits from this one up (the owners of a row, or the
  // row slots), so the tile max and the final l are reduced over those bits.
  static constexpr int ROW_LANE_STRIDE = SHARED_REDUCE ? WARP_ROWS : GROUP;
  static_assert(ROWS % WARP_ROWS == 0 && ATTN_WARPS % ROW_WARPS == 0, "rows must tile the warps");
  static_assert(!SHARED_REDUCE || (GROUP % WARP_ROWS == 0 && STEPS % (GROUP / WARP_ROWS) == 0),
                "a head row's lanes own its rows' sums, OWNED steps each");
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
  // m and l of LANE_ROWS rows: with SHARED_REDUCE the lane's own row g % WARP_ROWS, else rows 0..WARP_ROWS-1.
  float m[L::LANE_ROWS], l[L::LANE_ROWS], acc[L::WARP_ROWS][L::ELEMS];
#pragma unroll
  for (int i = 0; i < L::LANE_ROWS; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
#pragma unroll
  for (int r = 0; r < L::WARP_ROWS; ++r) {
    if (row0 + first_row + r < num_rows) {
      min_limit = imin(min_limit, limit(r));
      max_lower = imax(max_lower, lower(r));
    }
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
  // The lane's vector i of a head row (idle lanes past the row re-read its last one); its first one is folded into
  // each pool's pointer once, so a load's address is that pointer plus the row's offset.
  const auto lane_vec = [&](int i) { return imin(g + i * L::GROUP, V::PER_ROW - 1); };
  const char* const k_lane = k_head + lane_vec(0) * V::BYTES;
  const char* const v_lane = v_head + lane_vec(0) * V::BYTES;
  // One tile of L::TILE positions from `base`. MASKED: some position of the tile is past a real
  // row's limit or before a real row's window start, so positions are clamped for loading and masked
  // per row; full tiles skip both. (Positions are never below `begin`: nothing is clamped downwards.)
  // (The lambda is inlined at both calls, so each copy is compiled with MASKED a constant.)
  // (1) The slot of position base + lane % TILE of the tile at `base`; step s of lane (slot, g) takes the slot of
  // its position base + s SLOTS + slot from lane s SLOTS + slot by a shuffle, so the page-table read and the
  // division cost each lane one per tile instead of one per step (TILE <= 32: SLOTS STEPS vectors fill a lane's
  // tile). Positions past the partition are clamped to its last one (masked tiles, and the prefetch of the tile
  // after the last full one).
  static_assert(L::TILE <= WARP_SIZE, "a tile's slots are spread over the lanes of a warp");
  const auto tile_slot = [&](const int base, const bool CLAMP) {
    const int pos = base + lane % L::TILE;
    return table.slot(CLAMP ? imin(pos, end - 1) : pos);
  };
  // Partial scores are summed over the GROUP lanes of their head row in one of two ways.
  // SHARED_REDUCE (every lane can take whole sums): lane (slot, g) owns the sums of row g % WARP_ROWS at the OWNED
  // steps from (g / WARP_ROWS) OWNED on, of its slot. Each lane stores its partials of those OWNED steps as one
  // vector per row once it has computed them (OWNED steps per store), the owner adds up its sums (GROUP OWNED / 4
  // vector reads: OWNED sums at once), and it alone takes their exponentials and keeps its row's m and l; the tile's
  // weights and rescale factors reach the other lanes through shared memory (one vector read per 4 rows). So a
  // weight costs its exponential once per warp instead of once per lane of the head row, and the tile max is
  // OWNED - 1 + log2(32 / WARP_ROWS) steps per lane, not per row.
  // Otherwise (a head row's lanes have fewer partials than lanes) a butterfly of shuffles leaves every lane with
  // all of its rows' sums, and each lane computes every weight it uses.
  // Two __syncwarp per tile: the partials are stored before they are summed, and the weights before they are read
  // (which also orders this tile's reads of the partials before the next tile's stores, and this tile's reads of
  // the weights before the next tile's).
  // (The partials share their memory with the accumulators that the warps merge after the tiles.)
  constexpr int RED_ROWS = L::SHARED_REDUCE ? L::WARP_ROWS : 1;
  constexpr int RED_TILES = L::SHARED_REDUCE ? L::STEPS / L::OWNED : 1;  // groups of OWNED steps
  __shared__ union {
    __align__(16) float red[ATTN_WARPS][RED_TILES][RED_ROWS][L::RED_STRIDE];  // [.][lane * OWNED + step % OWNED]
    float acc[L::TOKEN_WARPS][ROWS][HEAD_DIM];
  } s_work;
  __shared__ __align__(16) float s_p[ATTN_WARPS][L::SHARED_REDUCE ? L::SLOTS : 1][L::PARTIALS];  // weights [slot][j]
  __shared__ __align__(16) float s_alpha[ATTN_WARPS][L::WARP_ROWS];  // each row's rescale factor for the tile
  const int own_row = g % L::WARP_ROWS, own_step = g / L::WARP_ROWS * L::OWNED;  // the first owned sum (SHARED_REDUCE)
  // The owned sums of a tile (SHARED_REDUCE): own[k] is that of row own_row at step own_step + k.
  const auto owned_scores = [&](float (&own)[L::OWNED]) {
    __syncwarp();  // the tile's partials are stored
    const float* const row = &s_work.red[warp][own_step / L::OWNED][own_row][slot * L::GROUP * L::OWNED];
#pragma unroll
    for (int c = 0; c < L::GROUP * L::OWNED; c += 4) {  // 4 floats: partials (lane, step) of 4 / OWNED lanes
      const float4 x = *reinterpret_cast<const float4*>(row + c);
      const float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int k = 0; k < L::OWNED; ++k) {
        float quad = e[k];
#pragma unroll
        for (int i = k + L::OWNED; i < 4; i += L::OWNED) quad += e[i];
        own[k] = c == 0 ? quad : own[k] + quad;  // not 0 + quad: the compiler may not drop an add of +0
      }
    }
  };
  // The same sums by shuffles (not SHARED_REDUCE): score[s][r] of every row, in every lane of the head row.
  const auto butterfly_scores = [&](float (&score)[L::STEPS][L::WARP_ROWS]) {
#pragma unroll
    for (int offset = L::GROUP / 2; offset > 0; offset /= 2)
#pragma unroll
      for (int s = 0; s < L::STEPS; ++s)
#pragma unroll
        for (int r = 0; r < L::WARP_ROWS; ++r) score[s][r] += __shfl_xor_sync(FULL_MASK, score[s][r], offset);
  };
  // Row max of a tile given each lane's candidates for its rows: lanes with the same rows differ from
  // ROW_LANE_STRIDE up.
  const auto warp_row_max = [&](float (&x)[L::LANE_ROWS]) {
#pragma unroll
    for (int offset = L::ROW_LANE_STRIDE; offset < WARP_SIZE; offset *= 2)
#pragma unroll
      for (int i = 0; i < L::LANE_ROWS; ++i) x[i] = fmaxf(x[i], __shfl_xor_sync(FULL_MASK, x[i], offset));
  };
  // Folds a tile with row maxima tile_max into m and l: returns each row's rescale factor for the earlier tiles
  // and leaves m_safe, the new max with -inf as 0, so that a row with nothing visible yet stays empty.
  const auto rescale = [&](const int i, const float tile_max, float& m_safe) {
    const float m_new = fmaxf(m[i], tile_max);
    m_safe = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2f(m[i] - m_safe);
    m[i] = m_new;
    l[i] *= alpha;
    return alpha;
  };
  // acc += the weights of step s times its V vectors.
  const auto accumulate = [&](const Vec<T, V::ELEMS> (&v_raw)[L::VECS], const float (&p)[L::WARP_ROWS]) {
    float v[L::ELEMS];
#pragma unroll
    for (int i = 0; i < L::VECS; ++i) vec_to_float(v_raw[i], v + i * V::ELEMS, g + i * L::GROUP < V::PER_ROW);
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r)
#pragma unroll
      for (int e = 0; e < L::ELEMS; ++e) acc[r][e] += p[r] * v[e];
  };
  // One tile whose slots (tile_slot) `slot_of` holds. PREFETCH: once its loads are issued, `slot_of` becomes the
  // next tile's, so the page-table read of the next tile is in flight during this tile's math instead of delaying
  // its loads.
  const auto tile = [&](const int base, const bool MASKED, int& slot_of, const bool PREFETCH) {
    Vec<T, V::ELEMS> k_raw[L::STEPS][L::VECS], v_raw[L::STEPS][L::VECS];  // (2) every load of the tile
#pragma unroll
    for (int s = 0; s < L::STEPS; ++s) {
      const long long row_at = (long long)__shfl_sync(FULL_MASK, slot_of, s * L::SLOTS + slot) * slot_bytes;
#pragma unroll
      for (int i = 0; i < L::VECS; ++i) {
        const long long at = row_at + (lane_vec(i) - lane_vec(0)) * V::BYTES;
        k_raw[s][i] = load_vec<T, V::ELEMS>(reinterpret_cast<const T*>(k_lane + at));
        v_raw[s][i] = load_vec<T, V::ELEMS>(reinterpret_cast<const T*>(v_lane + at));
      }
    }
    if (PREFETCH) slot_of = tile_slot(base + L::TOKEN_WARPS * L::TILE, true);
    float score[L::STEPS][L::WARP_ROWS];  // (3) partial scores (summed in place when not SHARED_REDUCE)
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
        score[s][r] = partial;
      }
      // stored once OWNED steps are complete, one vector per row, so no lane holds a whole tile of partials
      if constexpr (L::SHARED_REDUCE) {
        if (s % L::OWNED == L::OWNED - 1) {
#pragma unroll
          for (int r = 0; r < L::WARP_ROWS; ++r) {
            Vec<float, L::OWNED> steps;
#pragma unroll
            for (int k = 0; k < L::OWNED; ++k) steps.v[k] = score[s - (L::OWNED - 1) + k][r];
            *reinterpret_cast<Vec<float, L::OWNED>*>(&s_work.red[warp][s / L::OWNED][r][lane * L::OWNED]) = steps;
          }
        }
      }
    }
    const auto masked_out = [&](const int s, const int r) {
      const int pos = base + s * L::SLOTS + slot;
      return MASKED && (pos >= limit(r) || pos < lower(r));
    };
    if constexpr (L::SHARED_REDUCE) {
      float own[L::OWNED], tile_max[1] = {-INFINITY};
      owned_scores(own);
#pragma unroll
      for (int k = 0; k < L::OWNED; ++k) {
        if (masked_out(own_step + k, own_row)) own[k] = -INFINITY;
        tile_max[0] = fmaxf(tile_max[0], own[k]);
      }
      warp_row_max(tile_max);
      float m_safe;
      const float alpha = rescale(0, tile_max[0], m_safe);
#pragma unroll
      for (int k = 0; k < L::OWNED; ++k) {
        const float p = exp2f(own[k] - m_safe);
        l[0] += p;
        s_p[warp][slot][(own_step + k) * L::WARP_ROWS + own_row] = p;
      }
      if (lane < L::WARP_ROWS) s_alpha[warp][lane] = alpha;  // slot 0, g = lane: every row once
      __syncwarp();
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r) {
        const float a = s_alpha[warp][r];
#pragma unroll
        for (int e = 0; e < L::ELEMS; ++e) acc[r][e] *= a;
      }
#pragma unroll
      for (int s = 0; s < L::STEPS; ++s) {
        float p[L::WARP_ROWS];
#pragma unroll
        for (int r = 0; r < L::WARP_ROWS; ++r) p[r] = s_p[warp][slot][s * L::WARP_ROWS + r];
        accumulate(v_raw[s], p);
      }
    } else {
      butterfly_scores(score);
      float tile_max[L::WARP_ROWS];
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r) {
        tile_max[r] = -INFINITY;
#pragma unroll
        for (int s = 0; s < L::STEPS; ++s) {
          if (masked_out(s, r)) score[s][r] = -INFINITY;
          tile_max[r] = fmaxf(tile_max[r], score[s][r]);
        }
      }
      warp_row_max(tile_max);
      float p[L::STEPS][L::WARP_ROWS];  // one rescale per tile, then the tile's weights
#pragma unroll
      for (int r = 0; r < L::WARP_ROWS; ++r) {
        float m_safe;
        const float alpha = rescale(r, tile_max[r], m_safe);
#pragma unroll
        for (int e = 0; e < L::ELEMS; ++e) acc[r][e] *= alpha;
#pragma unroll
        for (int s = 0; s < L::STEPS; ++s) {
          p[s][r] = exp2f(score[s][r] - m_safe);
          l[r] += p[s][r];
        }
      }
#pragma unroll
      for (int s = 0; s < L::STEPS; ++s) accumulate(v_raw[s], p[s]);
    }
  };
  // Masked tiles that start before some real row's window start, then full tiles (every real row of
  // the warp sees all of them), then the masked rest. The loop bounds are warp-uniform, so every lane
  // reaches every shuffle.
  int slot_of;
  int base = begin + token_warp * L::TILE;
  for (; base < max_lower && base < end; base += L::TOKEN_WARPS * L::TILE) {
    slot_of = tile_slot(base, true);
    tile(base, true, slot_of, false);
  }
  // Only a page table has reads worth starting early; contiguous rows are arithmetic.
  constexpr bool PREFETCH = Addressing::READS_TABLE;
  if (PREFETCH && base + L::TILE <= min_limit) slot_of = tile_slot(base, false);
  for (; base + L::TILE <= min_limit; base += L::TOKEN_WARPS * L::TILE) {
    if (!PREFETCH) slot_of = tile_slot(base, false);
    tile(base, false, slot_of, PREFETCH);
  }
  for (; base < end; base += L::TOKEN_WARPS * L::TILE) {
    slot_of = tile_slot(base, true);
    tile(base, true, slot_of, false);
  }

  // Add up the row slots of each warp (they share m): afterwards lanes 0..GROUP-1 hold the warp's
  // accumulators, and the lanes below ROW_LANE_STRIDE (slot 0) its rows' l.
#pragma unroll
  for (int offset = L::GROUP; offset < WARP_SIZE; offset *= 2)
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r)
#pragma unroll
      for (int e = 0; e < L::ELEMS; ++e) acc[r][e] += __shfl_xor_sync(FULL_MASK, acc[r][e], offset);
#pragma unroll
  for (int offset = L::ROW_LANE_STRIDE; offset < WARP_SIZE; offset *= 2)
#pragma unroll
    for (int i = 0; i < L::LANE_ROWS; ++i) l[i] += __shfl_xor_sync(FULL_MASK, l[i], offset);

  __syncthreads();  // every warp is past its tiles: s_work holds accumulators from here on
  __shared__ float s_m[L::TOKEN_WARPS][ROWS];
  __shared__ float s_l[L::TOKEN_WARPS][ROWS];
  // m and l of row r: in lane r when each lane keeps one row (its owner g = r of slot 0), else in lane 0.
#pragma unroll
  for (int i = 0; i < L::LANE_ROWS; ++i) {
    const int r = L::SHARED_REDUCE ? lane : i;
    if (L::SHARED_REDUCE ? lane < L::WARP_ROWS : lane == 0) {
      s_m[token_warp][first_row + r] = m[i];
      s_l[token_warp][first_row + r] = l[i];
    }
  }
  if (slot == 0) {
#pragma unroll
    for (int r = 0; r < L::WARP_ROWS; ++r) {
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
