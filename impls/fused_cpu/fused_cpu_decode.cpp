// attnbench fused_cpu: the forward for few query rows (decode: Sq ≤ 16 against a long KV cache), float32.
//
// Decode reads every key and value once and does little arithmetic with each, so it is bound by memory
// bandwidth, and what matters is (1) reading k and v exactly once, straight from the caller's tensors (no
// packed kᵀ copy), and (2) keeping every core streaming. For (1), one work item takes all G·Sq query rows
// of a kv head (the G query heads of its GQA group × the Sq rows), so a key is loaded once for the whole
// group; scores are dot products of a query row with 16 key rows at a time, then the online softmax on that
// vector of 16; the next tile's lines are prefetched a few at a time from inside the current tile's loops
// (see Ahead). For (2), when B·Hkv items are too few to feed the threads, the keys are split
// (flash-decoding): item (b, kv head, split) covers keys [split·chunk, (split+1)·chunk), keeps its own
// (row max m, row sum l, unnormalised output o) per row, and a merge pass combines the splits:
//   M = max_s m_s,  L = Σ_s l_s·2^(m_s − M),  out = Σ_s o_s·2^(m_s − M) / L.
// Scores are in base 2 (q pre-multiplied by scale·log2 e) as in the forward kernel; masks are the same
// per-row key prefixes (padding lengths = per-sequence cache lengths; causal bottom-right for Sq > 1).
//
// Layouts (float32, contiguous): q (B, H, Sq, D); k (B, Hkv, Sk, D); v (B, Hkv, Sk, Dp) with Dp = D padded
// to a multiple of 16; out (B, H, Sq, Dp); lse (B, H, Sq) natural log-sum-exp per row, or null. Paged KV:
// k (num_pages, Hkv, page_size, D) and v (…, Dp) pools with a page table (B, max_pages) int32, read in place.

#include "fused_cpu_tiles.h"

namespace {

constexpr int64_t MIN_SPLIT_KEYS = 512;  // fewer keys per split would cost more in merging than it gains
constexpr int64_t AHEAD_TILES = 1;  // prefetch the next tile (two or more ahead was slower in tuning on a Zen 5 VM)

int64_t decode_splits(int64_t batch, int64_t kv_heads, int64_t seq_k, int64_t nthreads) {
  const int64_t items = batch * kv_heads, wanted = (4 * nthreads + items - 1) / items;  // ≥ 4 items per thread
  return std::clamp<int64_t>(std::min(wanted, seq_k / MIN_SPLIT_KEYS), 1, seq_k);
}

struct Decode {
  const float *q, *k, *v;
  float *out, *lse;
  int64_t batch, heads, kv_heads, seq_q, seq_k, head_dim, dp, splits, chunk;
  float scale_log2;
  RowLimits rows;
  float* partials;  // (B, Hkv, splits, G·Sq, Dp + 2): o, then m and l; used when splits > 1
  // Paged KV (null pages: k and v are (B, Hkv, Sk, ·)): k and v are pools (num_pages, Hkv, page_size, D or
  // Dp), key j of batch b in page pages[b·max_pages + j / page_size]; page_size a multiple of 16, so a tile
  // of 16 keys never straddles two pages.
  const int32_t* pages = nullptr;
  int64_t page_size = 0, max_pages = 0;

  // Row of key `key` (kv head hkv, batch b) in k (width D) or v (width Dp).
  const float* row(const float* base, int64_t width, int64_t b, int64_t hkv, int64_t key) const {
    if (pages == nullptr) return base + ((b * kv_heads + hkv) * seq_k + key) * width;
    const int64_t page = pages[b * max_pages + key / page_size];
    return base + ((page * kv_heads + hkv) * page_size + key % page_size) * width;
  }
};

#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, vi{__VA_ARGS__})
#endif

// The 16 horizontal sums of a[0..15] as one vector (lane j = Σ a[j]), by a tree of pairwise half-swaps:
// 15 steps of two shuffles and an add, where sixteen separate reductions would take 64 of each.
__attribute__((always_inline)) inline vf hsum16(vf* a) {
  for (int j = 0; j < 8; ++j)  // lanes 0-7: a[j]'s 8 partial sums, lanes 8-15: a[j + 8]'s
    a[j] = SHUFFLE2(a[j], a[j + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUFFLE2(a[j], a[j + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int j = 0; j < 4; ++j)  // 4 lanes each of keys j, j + 4, j + 8, j + 12
    a[j] = SHUFFLE2(a[j], a[j + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           SHUFFLE2(a[j], a[j + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int j = 0; j < 2; ++j)  // 2 lanes each of keys j, j + 2, …, j + 14
    a[j] = SHUFFLE2(a[j], a[j + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           SHUFFLE2(a[j], a[j + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return SHUFFLE2(a[0], a[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
         SHUFFLE2(a[0], a[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

// The k and v rows of a tile further on, fetched a few lines at a time from inside the loops that use the
// current tile: on this kind of machine a core does not overlap its compute with the memory stream by itself
// (the hardware prefetchers stop where demand stops), and a burst of prefetches would stall on miss buffers.
struct Ahead {
  const char* region[2] = {nullptr, nullptr};
  int64_t bytes[2] = {0, 0};
  int64_t at = 0;  // bytes of the two regions issued so far
  int64_t per_step = 0;  // lines per step, so that the steps of one tile cover the next one

  void aim(const float* k, int64_t k_bytes, const float* v, int64_t v_bytes, int64_t steps) {
    region[0] = reinterpret_cast<const char*>(k), region[1] = reinterpret_cast<const char*>(v);
    bytes[0] = k_bytes, bytes[1] = v_bytes, at = 0;
    per_step = (k_bytes + v_bytes + 64 * steps - 1) / (64 * steps);
  }
  __attribute__((always_inline)) inline void step() {
    for (int64_t i = 0; i < per_step; ++i, at += 64) {
      if (at < bytes[0]) __builtin_prefetch(region[0] + at, 0, 3);
      else if (at < bytes[0] + bytes[1]) __builtin_prefetch(region[1] + at - bytes[0], 0, 3);
    }
  }
};

// Scores of one query row q (D floats, read as Dp with zeros past D) against keys k[0..n) (rows D floats
// apart), n ≤ 16, as one vector; lanes past n are 0. A whole tile walks d in the outer loop, so the 16 keys'
// dot products are 16 independent FMA chains side by side, not one chain after another; with the head dim
// known at compile time (DC: 64 or 128, the common ones) the 16 key rows are one pointer plus constant offsets.
template <int64_t DC>
inline vf score_tile(const float* q, const float* k, int64_t d_len, int64_t n, Ahead& ahead) {
  const int64_t D = DC > 0 ? DC : d_len, full = D / W * W;
  vf acc[W];
  _Pragma("GCC unroll 16") for (int j = 0; j < W; ++j) acc[j] = vf{};
  if (n == W) {
    for (int64_t d = 0; d < full; d += W) {
      const vf qv = load(q + d);
      _Pragma("GCC unroll 16") for (int j = 0; j < W; ++j) acc[j] += qv * load(k + j * D + d);
      ahead.step();
    }
  } else {
    for (int64_t d = 0; d < full; d += W) {
      const vf qv = load(q + d);
      _Pragma("GCC unroll 16") for (int j = 0; j < W; ++j) if (j < n) acc[j] += qv * load(k + j * D + d);
    }
  }
  vf scores = hsum16(acc);
  for (int64_t j = 0; j < n; ++j)  // head dims past the last whole vector
    for (int64_t d = full; d < D; ++d) scores[j] += q[d] * k[j * D + d];
  return scores;
}

inline vf score_tile_any(const float* q, const float* k, int64_t D, int64_t n, Ahead& ahead) {
  return D == 128  ? score_tile<128>(q, k, D, n, ahead)
         : D == 64 ? score_tile<64>(q, k, D, n, ahead)
                   : score_tile<0>(q, k, D, n, ahead);
}

// o_r[d0 .. d0 + VECS·W) += Σ_{j<n} p_r[j]·v[j][d0 …] for ROWS rows (v's rows loaded once for all of them), o rows
// Dp floats apart, p rows W floats apart, the accumulators in registers.
template <int ROWS, int VECS>
inline void pv_chunk(float* o, const float* p, const float* v, int64_t Dp, int64_t n, Ahead& ahead) {
  vf acc[ROWS][VECS];
  _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) acc[r][x] = load(o + r * Dp + x * W);
  for (int64_t j = 0; j < n; ++j) {
    vf vv[VECS];
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) vv[x] = load(v + j * Dp + x * W);
    _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
      const vf pj = splat(p[r * W + j]);
      _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) acc[r][x] += pj * vv[x];
    }
    ahead.step();
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) store(o + r * Dp + x * W, acc[r][x]);
}

// o_r[0..Dp) += Σ_{j<n} p_r[j]·v[j] for ROWS rows (1 or 2), in chunks of up to 8 vectors of o.
template <int ROWS>
inline void pv_rows(float* o, const float* p, const float* v, int64_t Dp, int64_t n, Ahead& ahead) {
  typedef void (*Chunk)(float*, const float*, const float*, int64_t, int64_t, Ahead&);
  static constexpr Chunk chunks[8] = {pv_chunk<ROWS, 1>, pv_chunk<ROWS, 2>, pv_chunk<ROWS, 3>, pv_chunk<ROWS, 4>,
                                      pv_chunk<ROWS, 5>, pv_chunk<ROWS, 6>, pv_chunk<ROWS, 7>, pv_chunk<ROWS, 8>};
  for (int64_t d0 = 0; d0 < Dp; d0 += 8 * W) chunks[std::min<int64_t>(8, (Dp - d0) / W) - 1](o + d0, p, v + d0, Dp, n, ahead);
}

// Per-thread scratch: the group's scaled q rows (Dp each), their o, lane-wise sums l (W each), the tile's
// probabilities (W each), m, one float of padding when rows is odd (so the int64 limits start 8-byte aligned),
// and key limits (int64, two floats). The padding is counted here too: without it an odd row count (GQA group
// 1 at Sq 1) wrote each thread's last limit one float into the next thread's q rows, or past the scratch.
// The total is even, so every thread's block starts 8-byte aligned when the first one does.
int64_t decode_thread_floats(int64_t rows, int64_t dp) { return rows * (2 * dp + 2 * W + 3) + rows % 2; }

// One item: rows of kv head hkv of batch b against keys [split·chunk, …). Returns score entries computed.
// Per tile of 16 keys: every row's scores and online softmax (the running max only rescales o and l when it
// rises), then O += P·V two rows at a time.
int64_t decode_item(const Decode& pb, int64_t b, int64_t hkv, int64_t split, float* scratch) {
  const int64_t group = pb.heads / pb.kv_heads, R = group * pb.seq_q, D = pb.head_dim, Dp = pb.dp;
  const int64_t k_lo = split * pb.chunk, k_hi = std::min(pb.seq_k, k_lo + pb.chunk);
  float *qs = scratch, *o = qs + R * Dp, *l = o + R * Dp, *p = l + R * W, *m = p + R * W;
  int64_t* lim = reinterpret_cast<int64_t*>(m + R + R % 2);  // 8-byte aligned
  int64_t key_end = k_lo, computed = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = hkv * group + r / pb.seq_q, i = r % pb.seq_q;
    const float* qr = pb.q + ((b * pb.heads + h) * pb.seq_q + i) * D;
    for (int64_t d = 0; d < Dp; ++d) qs[r * Dp + d] = d < D ? qr[d] * pb.scale_log2 : 0.f;
    std::memset(o + r * Dp, 0, sizeof(float) * Dp);
    store(l + r * W, vf{});
    m[r] = -std::numeric_limits<float>::infinity();
    const int64_t limit = std::min(pb.rows.limit(b, i), k_hi);
    lim[r] = limit - k_lo;
    key_end = std::max(key_end, limit);
  }
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  Ahead ahead;
  // the loop steps in a whole tile that issue prefetches: score d-steps (whole tiles, full vectors) and P·V keys
  const int64_t steps = std::max<int64_t>(1, R * (D / W) + (R + 1) / 2 * W * ((Dp + 8 * W - 1) / (8 * W)));
  for (int64_t c0 = k_lo; c0 < key_end; c0 += W) {  // k_lo is a multiple of 16 (chunks are)
    const int64_t n = std::min<int64_t>(W, key_end - c0);
    const float* k = pb.row(pb.k, D, b, hkv, c0);
    const float* v = pb.row(pb.v, Dp, b, hkv, c0);
    const int64_t next = c0 + AHEAD_TILES * W;
    if (next + W <= key_end)
      ahead.aim(pb.row(pb.k, D, b, hkv, next), W * D * 4, pb.row(pb.v, Dp, b, hkv, next), W * Dp * 4, steps);
    else
      ahead.aim(nullptr, 0, nullptr, 0, 1);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t visible = std::clamp<int64_t>(lim[r] - (c0 - k_lo), 0, n);
      if (visible == 0) {
        store(p + r * W, vf{});
        continue;
      }
      const vf x = lane < static_cast<int>(visible) ? score_tile_any(qs + r * Dp, k, D, n, ahead)
                                                    : splat(-std::numeric_limits<float>::infinity());
      computed += visible;
      const float row_max = hmax(x);
      if (row_max > m[r]) {  // the max rose: o and l scaled by 2^(m_old − m_new) (0 on the first keys)
        const vf alpha = splat(std::exp2(m[r] - row_max));
        store(l + r * W, load(l + r * W) * alpha);
        for (int64_t d = 0; d < Dp; d += W) store(o + r * Dp + d, load(o + r * Dp + d) * alpha);
        m[r] = row_max;
      }
      const vf pr = keep_below(exp2_table(x - splat(m[r])), static_cast<int>(visible));
      store(l + r * W, load(l + r * W) + pr);
      store(p + r * W, pr);
    }
    int64_t r = 0;
    for (; r + 2 <= R; r += 2) pv_rows<2>(o + r * Dp, p + r * W, v, Dp, n, ahead);
    if (r < R) pv_rows<1>(o + r * Dp, p + r * W, v, Dp, n, ahead);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = hkv * group + r / pb.seq_q, row = (b * pb.heads + h) * pb.seq_q + r % pb.seq_q;
    const float total = hsum(load(l + r * W));
    if (pb.splits == 1) {  // the whole row is here: normalise and write
      const vf inv = splat(total > 0.f ? 1.f / total : 0.f);  // a row with no visible key outputs zeros
      for (int64_t d = 0; d < Dp; d += W) store(pb.out + row * Dp + d, load(o + r * Dp + d) * inv);
      if (pb.lse != nullptr)
        pb.lse[row] = total > 0.f ? (m[r] + std::log2(total)) * 0.6931471805599453f
                                  : -std::numeric_limits<float>::infinity();
      continue;
    }
    float* part = pb.partials + (((b * pb.kv_heads + hkv) * pb.splits + split) * R + r) * (Dp + 2);
    std::memcpy(part, o + r * Dp, sizeof(float) * Dp);
    part[Dp] = m[r];
    part[Dp + 1] = total;
  }
  return computed;
}

// Combine the splits of query row (b, h, i).
void merge_row(const Decode& pb, int64_t b, int64_t h, int64_t i) {
  const int64_t group = pb.heads / pb.kv_heads, R = group * pb.seq_q, Dp = pb.dp;
  const int64_t hkv = h / group, r = (h % group) * pb.seq_q + i, row = (b * pb.heads + h) * pb.seq_q + i;
  auto part = [&](int64_t split) {
    return pb.partials + (((b * pb.kv_heads + hkv) * pb.splits + split) * R + r) * (Dp + 2);
  };
  float top = -std::numeric_limits<float>::infinity(), total = 0.f;
  for (int64_t s = 0; s < pb.splits; ++s) top = std::max(top, part(s)[Dp]);
  float* out = pb.out + row * Dp;
  std::memset(out, 0, sizeof(float) * Dp);
  if (top == -std::numeric_limits<float>::infinity()) {  // no split saw a key
    if (pb.lse != nullptr) pb.lse[row] = top;
    return;
  }
  for (int64_t s = 0; s < pb.splits; ++s) {
    const float* p = part(s);
    if (p[Dp + 1] == 0.f) continue;
    const float w = std::exp2(p[Dp] - top);
    total += p[Dp + 1] * w;
    for (int64_t d = 0; d < Dp; d += W) store(out + d, load(out + d) + load(p + d) * splat(w));
  }
  const vf inv = splat(1.f / total);
  for (int64_t d = 0; d < Dp; d += W) store(out + d, load(out + d) * inv);
  if (pb.lse != nullptr) pb.lse[row] = (top + std::log2(total)) * 0.6931471805599453f;
}

}  // namespace

extern "C" {

// Rows a decode call may have at most (more rows go to attnbench_fused_forward, which is compute-bound).
int64_t attnbench_fused_decode_max_rows() { return 16; }

// Floats of scratch attnbench_fused_decode needs.
int64_t attnbench_fused_decode_scratch_floats(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q,
                                              int64_t seq_k, int64_t dp, int64_t nthreads) {
  const int64_t rows = heads / std::max<int64_t>(kv_heads, 1) * seq_q;
  const int64_t splits = decode_splits(batch, kv_heads, seq_k, nthreads);
  return nthreads * decode_thread_floats(rows, dp) + (splits > 1 ? batch * kv_heads * splits * rows * (dp + 2) : 0);
}

// out (and lse when not null) of attention for few query rows; see the top of the file. Returns 0 on
// success, 1 on bad arguments. *tiles (when not null) receives the number of score entries computed,
// *splits the number of key splits chosen.
int attnbench_fused_decode(const float* q, const float* k, const float* v, float* out, float* lse, int64_t batch,
                           int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                           int64_t dp, float scale, int64_t mask, const int64_t* lengths, const int32_t* pages,
                           int64_t page_size, int64_t max_pages, int64_t nthreads, float* scratch, int64_t* tiles,
                           int64_t* splits_used) {
  if (batch < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || seq_q < 1 ||
      seq_q > attnbench_fused_decode_max_rows() || seq_k < 1 || head_dim < 1 || dp < head_dim || dp % W != 0 ||
      mask < NONE || mask > PADDING || (mask == PADDING && lengths == nullptr) || nthreads < 1 || scratch == nullptr ||
      (pages != nullptr && (page_size < W || page_size % W != 0 || max_pages * page_size < seq_k)))
    return 1;
  const int64_t splits = decode_splits(batch, kv_heads, seq_k, nthreads);
  const int64_t chunk = ((seq_k + splits - 1) / splits + W - 1) / W * W, rows = heads / kv_heads * seq_q;
  Decode pb{q, k, v, out, lse, batch, heads, kv_heads, seq_q, seq_k, head_dim, dp, splits, chunk,
            scale * 1.4426950408889634f, RowLimits{mask, seq_q, seq_k, lengths}, nullptr};
  pb.partials = scratch + nthreads * decode_thread_floats(rows, dp);
  pb.pages = pages;
  pb.page_size = page_size;
  pb.max_pages = max_pages;
  const int64_t items = batch * kv_heads * splits;
  const int64_t team = std::min(nthreads, items);
  std::atomic<int64_t> next{0}, computed{0};
  on_team(team, [&](int64_t t) {
    float* mine = scratch + t * decode_thread_floats(rows, dp);
    int64_t count = 0;
    for (int64_t i; (i = next.fetch_add(1)) < items;)
      count += decode_item(pb, i / (kv_heads * splits), i / splits % kv_heads, i % splits, mine);
    computed += count;
  });
  if (splits > 1)
    team_for(nthreads, batch * heads * seq_q, [&](int64_t row) {
      merge_row(pb, row / (heads * seq_q), row / seq_q % heads, row % seq_q);
    });
  if (tiles != nullptr) *tiles = computed.load();
  if (splits_used != nullptr) *splits_used = splits;
  return 0;
}

}  // extern "C"
