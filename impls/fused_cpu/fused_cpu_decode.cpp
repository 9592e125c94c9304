// attnbench fused_cpu: the forward for few query rows (decode: Sq ≤ 16 against a long KV cache).
//
// Decode reads every key and value once and does little arithmetic with each, so it is bound by memory
// bandwidth, and what matters is (1) reading k and v exactly once, straight from the caller's tensors (no
// packed kᵀ copy, no float32 copy of a narrower cache), and (2) keeping every core streaming. For (1), one work
// item takes all G·Sq query rows of a kv head (the G query heads of its GQA group × the Sq rows), so a key is
// loaded once for the whole group; scores are dot products of a query row with 16 key rows at a time, then the
// online softmax on that vector of 16; the next tile's lines are prefetched a few at a time from inside the
// current tile's loops (see Ahead). For (2), when B·Hkv items are too few to feed the threads, the keys are
// split (flash-decoding): item (b, kv head, split) covers keys [split·chunk, (split+1)·chunk), keeps its own
// (row max m, row sum l, unnormalised output o) per row, and a merge pass combines the splits:
//   M = max_s m_s,  L = Σ_s l_s·2^(m_s − M),  out = Σ_s o_s·2^(m_s − M) / L.
// Scores are in base 2 (q pre-multiplied by scale·log2 e) as in the forward kernel; masks are the same
// per-row key prefixes (padding lengths = per-sequence cache lengths; causal bottom-right for Sq > 1; a ragged
// batch's rows, each its own prefix [0, hi), as mask RANGES with the first key 0).
// Learned sinks (one natural-log logit per query head, gpt-oss) join each row's denominator once, where the
// row is finished (the merge when split): L += 2^(sink·log2 e − M); they add no value, and the lse includes them.
//
// The cache's own type (kv_type; attnbench.kv_cache): float32, bfloat16, or fp8 (float8_e4m3fn, float8_e5m2)
// with float32 scales, read in its type, a tile of 16 keys at a time (never a float32 copy of the cache). Where
// the CPU has AVX512-BF16, the scores are bf16 dot products (vdpbf16ps) on keys converted in registers, and P·V
// widens v in registers (a bf16 q: vdpbf16ps too, on v converted to bf16) — see decode_item and bf16x32. Widened to float32 (v always — in registers, or into a float32 tile in L1
// when Dv is not a multiple of 16 — and k where there is no AVX512-BF16, into a tile the G·Sq rows share):
//   bf16 → fp32: the 16 bits shifted up by 16 (exact);
//   e4m3 → fp32: the byte sign-extended, shifted left by 20 and masked with 0x87FFFFFF — the sign stays in bit
//     31, exponent and mantissa land in fp32's low exponent and top mantissa bits — which reads as the value
//     times 2^-120 exactly, subnormals included (e4m3's 2^-6·0.m is fp32's 2^-126·0.m);
//   e5m2 → fp32: the same with a shift of 21 and the mask 0x8FFFFFFF: the value times 2^-112.
// The 2^120 (2^112) and the scales stay out of the per-element loops: q is pre-multiplied by 2^64 (so its
// products with the tiny raw keys stay normal floats), a tile's 16 scores are multiplied by lane j's k scale
// (its key's block: a sequence, or a page) · 2^56, its probabilities by the v scale · 2^100 before P·V (the
// sums l are taken before, unscaled), and the output by 2^20 when normalised: one multiply per row and tile.
// The tile is also how a head dim that is not a multiple of 16 (of k: D, of v: Dv) is read: widened rows
// zero-padded to Dk or Dvp. A float32 cache whose head dims are multiples of 16 is read in place as it is.
//
// Layouts: q (B, H, Sq, D), float32 or bfloat16; k (B, Hkv, Sk, D) and v (B, Hkv, Sk, ·) in the cache type,
// v's rows v_row ≥ Dv elements apart (Dv, or D for a latent cache whose values are its keys' first Dv channels);
// out (B, H, Sq, Dvp) float32 with Dvp = Dv padded to a multiple of 16; lse (B, H, Sq) natural log-sum-exp per
// row, or null. Paged KV: k (num_pages, Hkv, page_size, D) and v (…, ·) pools with a page table (B, max_pages)
// int32, read in place. fp8 scales: contiguous, (B, Hkv, ceil(Sk / scale_block)) (one per block of positions);
// paged, (num_pages, Hkv) (one per pool page).

#include "fused_cpu_bf16.h"
#include "fused_cpu_tiles.h"

namespace {

constexpr int64_t MIN_SPLIT_KEYS = 512;  // fewer keys per split would cost more in merging than it gains
// prefetch the tile this many float32 tiles' bytes ahead: the next tile in float32 (two or more ahead was slower
// in tuning on a Zen 5 VM; on the Zen 4 VM, into L2, two measured B/A 1.010), as many bytes ahead for the
// narrower types (2 tiles of bf16, 4 of fp8)
constexpr int64_t AHEAD_TILES = 1;
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
constexpr float Q_BOOST = 0x1p64f;  // fp8: q's factor (see the top of the file), the output's is OUT_BOOST
constexpr float OUT_BOOST = 0x1p20f;

int64_t decode_splits(int64_t batch, int64_t kv_heads, int64_t seq_k, int64_t nthreads) {
  const int64_t items = batch * kv_heads, wanted = (4 * nthreads + items - 1) / items;  // ≥ 4 items per thread
  return std::clamp<int64_t>(std::min(wanted, seq_k / MIN_SPLIT_KEYS), 1, seq_k);
}

int64_t round_up(int64_t n, int64_t to = W) { return (n + to - 1) / to * to; }

enum KvType : int64_t { KV_FLOAT32 = 0, KV_BFLOAT16 = 1, KV_E4M3 = 2, KV_E5M2 = 3 };

inline float bits_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vu16 __attribute__((vector_size(32), aligned(2)));  // 16 bf16
typedef int8_t vs8 __attribute__((vector_size(16), aligned(1)));  // 16 fp8 bytes

// A cache type: its element T, widen (16 elements → 16 floats: vpmovzxwd/vpmovsxbd and one or two integer
// operations with AVX-512), one (a single element, for a row's tail) and bias (the true value = the widened
// float · bias; scaled: whether it carries fp8 scales).
template <int64_t KT>
struct Kv;
template <>
struct Kv<KV_FLOAT32> {
  typedef float T;
  static constexpr bool scaled = false;
  static constexpr float bias = 1.f;
  static vf widen(const T* p) { return load(p); }
  static float one(T x) { return x; }
};
template <>
struct Kv<KV_BFLOAT16> {
  typedef uint16_t T;
  static constexpr bool scaled = false;
  static constexpr float bias = 1.f;
  static vf widen(const T* p) {
#ifdef __AVX512F__
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
#else
    return (vf)(__builtin_convertvector(*reinterpret_cast<const vu16*>(p), vu) << 16);
#endif
  }
  static float one(T x) { return bits_float(static_cast<uint32_t>(x) << 16); }
};
template <int SHIFT, uint32_t MASK>
struct Fp8 {
  typedef int8_t T;  // read signed: sign extension puts the sign in bit 31 (and in the bits MASK clears)
  static constexpr bool scaled = true;
  static vf widen(const T* p) {
#ifdef __AVX512F__  // vpmovsxbd straight from memory (GCC lowers the generic conversion byte by byte)
    const __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return (vf)_mm512_and_si512(_mm512_slli_epi32(x, SHIFT), _mm512_set1_epi32(static_cast<int>(MASK)));
#else
    return (vf)(((vu)__builtin_convertvector(*reinterpret_cast<const vs8*>(p), vi) << SHIFT) & MASK);
#endif
  }
  static float one(T x) { return bits_float((static_cast<uint32_t>(static_cast<int32_t>(x)) << SHIFT) & MASK); }
};
template <>
struct Kv<KV_E4M3> : Fp8<20, 0x87FFFFFFu> {
  static constexpr float bias = 0x1p120f;
};
template <>
struct Kv<KV_E5M2> : Fp8<21, 0x8FFFFFFFu> {
  static constexpr float bias = 0x1p112f;
};

#ifdef ATTNBENCH_BF16
// Keys (and, for P·V by vdpbf16ps, values) as bfloat16: every bf16, e4m3 and e5m2 value is a normal bf16 (e4m3's
// smallest is 2^-9, e5m2's 2^-16; vdpbf16ps reads a subnormal bf16 as zero), so the conversion is exact and the
// bf16 holds the true value (no factor). A bf16 cache is used as stored. fp8, 32 bytes at a time:
//   where none of the 32 has a zero exponent field (zeros and subnormals: rare in a scaled cache), arithmetic:
//     the byte sign-extended to 16 bits and shifted left by 4 (e5m2: 5) puts the sign in bit 15 and exponent and
//     mantissa in bf16's low exponent and top mantissa bits; masked (0x87F0; 0x8FE0) and the exponent rebased by
//     an add of 120 << 7 (112 << 7) it is the value's bf16 — four integer operations;
//   otherwise a table of the 128 magnitudes' bf16 bits, looked up 32 at a time by two vpermt2w (64 entries
//     each) and a blend on bit 6, the sign moved to bit 15.

inline bf16 bf16_nearest(float x) {  // round to nearest even (x finite)
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<bf16>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

template <int64_t KT>
struct Fp8Table {  // the bf16 of each magnitude 0..127 (its byte & 0x7F) of the fp8 type, in four vectors
  __m512i part[4];
  Fp8Table() {
    alignas(64) bf16 bits[128];
    for (int m = 0; m < 128; ++m)
      bits[m] = bf16_nearest(Kv<KT>::one(static_cast<typename Kv<KT>::T>(m)) * Kv<KT>::bias);
    for (int i = 0; i < 4; ++i) part[i] = _mm512_load_si512(bits + 32 * i);
  }
};

template <int64_t KT>
const Fp8Table<KT>& fp8_table() {
  static const Fp8Table<KT> table;
  return table;
}

// The arithmetic conversion's constants: the shift, the bits kept, the exponent rebase, the exponent field.
template <int64_t KT>
struct Fp8Bits;
template <>
struct Fp8Bits<KV_E4M3> {
  static constexpr int shift = 4;
  static constexpr int16_t keep = static_cast<int16_t>(0x87F0), rebase = 120 << 7;
  static constexpr char exponent = 0x78;
};
template <>
struct Fp8Bits<KV_E5M2> {
  static constexpr int shift = 5;
  static constexpr int16_t keep = static_cast<int16_t>(0x8FE0), rebase = 112 << 7;
  static constexpr char exponent = 0x7C;
};

// 32 elements' channels in order, as bf16; `table`: fp8_table<KT>().part (unused for bf16)
template <int64_t KT>
inline __m512i bf16x32(const typename Kv<KT>::T* p, const __m512i* table) {
  if constexpr (KT == KV_BFLOAT16) {
    (void)table;
    return _mm512_loadu_si512(p);
  } else {
    typedef Fp8Bits<KT> F;
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if (__builtin_expect(_mm256_testn_epi8_mask(raw, _mm256_set1_epi8(F::exponent)) == 0, 1)) {
      const __m512i x = _mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), F::shift);
      return _mm512_add_epi16(_mm512_and_si512(x, _mm512_set1_epi16(F::keep)), _mm512_set1_epi16(F::rebase));
    }
    const __m512i w = _mm512_cvtepu8_epi16(raw);
    const __m512i low = _mm512_permutex2var_epi16(table[0], w, table[1]);  // magnitudes 0..63 (w's bits 0..5)
    const __m512i high = _mm512_permutex2var_epi16(table[2], w, table[3]);  // 64..127
    const __m512i magnitude = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), low, high);
    // magnitude | (w << 8 & 0x8000): the sign
    return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(w, 8),
                                     _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
  }
}
#endif

struct Decode {
  const void *q, *k, *v;  // q float32 (or bfloat16 with q_bf16), k and v in the cache type
  float *out, *lse;
  int64_t batch, heads, kv_heads, seq_q, seq_k, head_dim, dk, head_dim_v, dvp, v_row, splits, chunk;
  float scale_log2;
  RowLimits rows;
  float* partials;  // (B, Hkv, splits, G·Sq, Dvp + 2): o, then m and l; used when splits > 1
  // Paged KV (null pages: k and v are (B, Hkv, Sk, ·)): k and v are pools (num_pages, Hkv, page_size, D or
  // v_row), key j of batch b in page pages[b·max_pages + j / page_size]; page_size a multiple of 16, so a tile
  // of 16 keys never straddles two pages.
  const int32_t* pages = nullptr;
  int64_t page_size = 0, max_pages = 0;
  bool q_bf16 = false;
  const float *k_scale = nullptr, *v_scale = nullptr;  // fp8 scales (see the top of the file)
  int64_t scale_block = 0;  // contiguous fp8 cache: positions per scale
  const float* sinks = nullptr;  // (H,) natural-log sink logits, or null
  int64_t k_head = 0, v_head = 0;  // contiguous cache: elements from one kv head (b · Hkv + h) to the next

  // Row of key `key` (kv head hkv, batch b) in k (width D, kv heads k_head apart) or v (width v_row, v_head).
  template <typename T>
  const T* row(const void* base, int64_t width, int64_t head, int64_t b, int64_t hkv, int64_t key) const {
    const T* at = static_cast<const T*>(base);
    if (pages == nullptr) return at + (b * kv_heads + hkv) * head + key * width;
    const int64_t page = pages[b * max_pages + key / page_size];
    return at + ((page * kv_heads + hkv) * page_size + key % page_size) * width;
  }

  // Lane j: the scale of key c0 + j (of kv head hkv, batch b) for a tile of n keys (lanes past n: the last's).
  vf tile_scales(const float* scales, int64_t b, int64_t hkv, int64_t c0, int64_t n) const {
    if (pages != nullptr) return splat(scales[pages[b * max_pages + c0 / page_size] * kv_heads + hkv]);
    const float* s = scales + (b * kv_heads + hkv) * ((seq_k + scale_block - 1) / scale_block);
    const int64_t first = c0 / scale_block, last = (c0 + n - 1) / scale_block;
    if (first == last) return splat(s[first]);
    vf lanes;
    for (int j = 0; j < W; ++j) lanes[j] = s[(c0 + std::min<int64_t>(j, n - 1)) / scale_block];
    return lanes;
  }

  // O += P·V by vdpbf16ps for a bf16 q over a narrow cache (Dv a multiple of 32): v converted to bf16 exactly, P
  // rounded to bf16 (as the bf16 forward does, and FlashAttention on GPUs: bf16's tolerance). A float32 q keeps
  // float32 P·V (two bf16 terms of P, tried, were slower than its FMAs).
  bool pv_dot(int64_t kv_type) const {
#ifdef ATTNBENCH_BF16
    return q_bf16 && kv_type != KV_FLOAT32 && head_dim_v % (2 * W) == 0;
#else
    (void)kv_type;
    return false;
#endif
  }
  // the output's factor: OUT_BOOST where fp8 values are widened to float32 times 2^-120 (2^-112) for P·V
  float out_boost(int64_t kv_type) const {
    return (kv_type == KV_E4M3 || kv_type == KV_E5M2) && !pv_dot(kv_type) ? OUT_BOOST : 1.f;
  }

  float q_at(int64_t at) const {
    if (q_bf16) return bits_float(static_cast<uint32_t>(static_cast<const uint16_t*>(q)[at]) << 16);
    return static_cast<const float*>(q)[at];
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
// Into L2, not L1 (prefetcht1): a float32 tile's k and v rows are 16 KiB, the one in use as much again, and
// fetched into a 32 KiB L1 (Zen 4) the next tile evicts the current one. `attnbench ab` on the Zen 4 VM, H32/8
// D128 × 32768, against L1: float32 cache B/A 0.733 [0.725, 0.748], bf16 0.765, fp8 (compute-bound) 1.00–1.02;
// B32 × 16640 keys read per sequence 0.514 [0.499, 0.531].
struct Ahead {
  const char* region[2] = {nullptr, nullptr};
  int64_t bytes[2] = {0, 0};
  int64_t at = 0;  // bytes of the two regions issued so far
  int64_t per_step = 0;  // lines per step, so that the steps of one tile cover the next one

  void aim(const void* k, int64_t k_bytes, const void* v, int64_t v_bytes, int64_t steps) {
    region[0] = static_cast<const char*>(k), region[1] = static_cast<const char*>(v);
    bytes[0] = k_bytes, bytes[1] = v_bytes, at = 0;
    per_step = (k_bytes + v_bytes + 64 * steps - 1) / (64 * steps);
  }
  __attribute__((always_inline)) inline void step() {
    for (int64_t i = 0; i < per_step; ++i, at += 64) {
      if (at < bytes[0]) __builtin_prefetch(region[0] + at, 0, 2);
      else if (at < bytes[0] + bytes[1]) __builtin_prefetch(region[1] + at - bytes[0], 0, 2);
    }
  }
};

// Scores of one query row q (D floats, zeros past the head dim) against keys k[0..n) (rows D floats apart), n ≤ 16,
// as one vector; lanes past n are 0. A whole tile walks d in the outer loop, so the 16 keys' dot products are 16
// independent FMA chains side by side, not one chain after another; with the head dim known at compile time (DC:
// 64 or 128, the common ones) the 16 key rows are one pointer plus constant offsets.
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
  for (int64_t j = 0; j < n; ++j)  // head dims past the last whole vector (none when D is a multiple of 16)
    for (int64_t d = full; d < D; ++d) scores[j] += q[d] * k[j * D + d];
  return scores;
}

inline vf score_tile_any(const float* q, const float* k, int64_t D, int64_t n, Ahead& ahead) {
  return D == 128  ? score_tile<128>(q, k, D, n, ahead)
         : D == 64 ? score_tile<64>(q, k, D, n, ahead)
                   : score_tile<0>(q, k, D, n, ahead);
}

#ifdef ATTNBENCH_BF16
// score_tile for keys as bf16 (rows ldk bf16 apart, dk channels, a multiple of 32, zeros past the head dim) and
// the row's q as TERMS bf16 vectors (dk each, one after another) that sum to q: TERMS vdpbf16ps per 32 channels
// of a key, each product exact in float32.
template <int TERMS, int64_t DC, bool FULL>
inline vf score_tile_dot(const bf16* q, const bf16* k, int64_t ldk, int64_t d_len, int64_t n, Ahead& ahead) {
  const int64_t D = DC > 0 ? DC : d_len;
  const int keys = FULL ? W : static_cast<int>(n);
  vf acc[W];
  _Pragma("GCC unroll 16") for (int j = 0; j < W; ++j) acc[j] = vf{};
  for (int64_t d = 0; d < D; d += 2 * W) {
    __m512i qt[TERMS];
    _Pragma("GCC unroll 3") for (int t = 0; t < TERMS; ++t) qt[t] = _mm512_loadu_si512(q + t * D + d);
    _Pragma("GCC unroll 16") for (int j = 0; j < keys; ++j) {
      const __m512i kj = _mm512_loadu_si512(k + j * ldk + d);
      __m512 a = (__m512)acc[j];
      _Pragma("GCC unroll 3") for (int t = 0; t < TERMS; ++t) a = dp_pairs(a, qt[t], kj);
      acc[j] = (vf)a;
    }
    if (FULL) ahead.step();
  }
  return hsum16(acc);
}

template <int TERMS>
inline vf score_tile_dot_dims(const bf16* q, const bf16* k, int64_t ldk, int64_t dk, int64_t n, Ahead& ahead) {
  if (n < W) return score_tile_dot<TERMS, 0, false>(q, k, ldk, dk, n, ahead);
  return dk == 128  ? score_tile_dot<TERMS, 128, true>(q, k, ldk, dk, n, ahead)
         : dk == 64 ? score_tile_dot<TERMS, 64, true>(q, k, ldk, dk, n, ahead)
                    : score_tile_dot<TERMS, 0, true>(q, k, ldk, dk, n, ahead);
}

inline vf score_tile_dot_any(const bf16* q, int64_t terms, const bf16* k, int64_t ldk, int64_t dk, int64_t n,
                             Ahead& ahead) {
  return terms == 1 ? score_tile_dot_dims<1>(q, k, ldk, dk, n, ahead) : score_tile_dot_dims<2>(q, k, ldk, dk, n, ahead);
}

// Rows [0, n) of a key tile (`from` elements apart in the cache, D used) as bf16 rows dk apart, zeros
// from D to dk.
template <int64_t KT>
inline void bf16_tile(bf16* dst, int64_t dk, const typename Kv<KT>::T* src, int64_t from, int64_t D, int64_t n) {
  const int64_t whole = D / (2 * W) * (2 * W);
  const __m512i* table = nullptr;
  if constexpr (KT != KV_BFLOAT16) table = fp8_table<KT>().part;
  for (int64_t j = 0; j < n; ++j) {
    const typename Kv<KT>::T* s = src + j * from;
    bf16* d = dst + j * dk;
    for (int64_t x = 0; x < whole; x += 2 * W) _mm512_storeu_si512(d + x, bf16x32<KT>(s + x, table));
    for (int64_t x = whole; x < dk; ++x)
      d[x] = x < D ? bf16_nearest(Kv<KT>::one(s[x]) * Kv<KT>::bias) : bf16{0};
  }
}
#endif

#ifdef ATTNBENCH_BF16
// Scores of ROWS query rows (row r's TERMS bf16 vectors at q + (r·TERMS + t)·D) against keys [0, n) read as stored
// (rows ldk elements apart, D channels, a multiple of 32), each 32 channels of a key converted to bf16 (bf16x32)
// once for all ROWS rows, in registers (no bf16 copy of the tile). The keys go in groups of W / ROWS: a group's
// ROWS × W / ROWS dot products are one hsum16 (lane r·KG + j: row r, key j of the group), and the groups' sums
// are regrouped into one vector per row by 128-bit block shuffles. Keys from n on read nothing and score 0.
template <int64_t KT, int TERMS, int ROWS, bool FULL>
inline void score_rows(const bf16* q, const typename Kv<KT>::T* k, int64_t ldk, int64_t D, int64_t n, Ahead& ahead,
                       const __m512i* table, vf* out) {
  constexpr int KG = W / ROWS, GROUPS = W / KG;
  __m512 sums[GROUPS];
  _Pragma("GCC unroll 4") for (int g = 0; g < GROUPS; ++g) {
    vf acc[W];
    _Pragma("GCC unroll 16") for (int i = 0; i < W; ++i) acc[i] = vf{};
    for (int64_t d = 0; d < D; d += 2 * W) {
      __m512i qt[ROWS][TERMS];
      _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
        _Pragma("GCC unroll 2") for (int t = 0; t < TERMS; ++t) qt[r][t] = _mm512_loadu_si512(q + (r * TERMS + t) * D + d);
      _Pragma("GCC unroll 16") for (int j = 0; j < KG; ++j) {
        const int64_t key = g * KG + j;
        const __m512i kj = FULL || key < n ? bf16x32<KT>(k + key * ldk + d, table) : _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
          __m512 a = (__m512)acc[r * KG + j];
          _Pragma("GCC unroll 2") for (int t = 0; t < TERMS; ++t) a = dp_pairs(a, qt[r][t], kj);
          acc[r * KG + j] = (vf)a;
        }
      }
      if (FULL) ahead.step();
    }
    sums[g] = (__m512)hsum16(acc);
  }
  if constexpr (ROWS == 1) {
    out[0] = (vf)sums[0];
  } else if constexpr (ROWS == 2) {  // row r: half r of each group
    out[0] = (vf)_mm512_shuffle_f32x4(sums[0], sums[1], 0x44);
    out[1] = (vf)_mm512_shuffle_f32x4(sums[0], sums[1], 0xEE);
  } else {  // row r: block r of each group, a 4 × 4 transpose of 128-bit blocks
    const __m512 t0 = _mm512_shuffle_f32x4(sums[0], sums[1], 0x44), t1 = _mm512_shuffle_f32x4(sums[2], sums[3], 0x44);
    const __m512 t2 = _mm512_shuffle_f32x4(sums[0], sums[1], 0xEE), t3 = _mm512_shuffle_f32x4(sums[2], sums[3], 0xEE);
    out[0] = (vf)_mm512_shuffle_f32x4(t0, t1, 0x88), out[1] = (vf)_mm512_shuffle_f32x4(t0, t1, 0xDD);
    out[2] = (vf)_mm512_shuffle_f32x4(t2, t3, 0x88), out[3] = (vf)_mm512_shuffle_f32x4(t2, t3, 0xDD);
  }
}

// score_rows for `rows` rows in blocks of 4, then 2, then 1: out[r] for row r.
template <int64_t KT, int TERMS, bool FULL>
inline void score_row_blocks(const bf16* q, int64_t rows, const typename Kv<KT>::T* k, int64_t ldk, int64_t D,
                             int64_t n, Ahead& ahead, const __m512i* table, vf* out) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) score_rows<KT, TERMS, 4, FULL>(q + r * TERMS * D, k, ldk, D, n, ahead, table, out + r);
  if (r + 2 <= rows) score_rows<KT, TERMS, 2, FULL>(q + r * TERMS * D, k, ldk, D, n, ahead, table, out + r), r += 2;
  if (r < rows) score_rows<KT, TERMS, 1, FULL>(q + r * TERMS * D, k, ldk, D, n, ahead, table, out + r);
}

// score_row_blocks with `terms` bf16 terms of q per row, for a whole tile (n = 16) or a partial one.
template <int64_t KT>
inline void score_all_rows(const bf16* q, int64_t terms, int64_t rows, const typename Kv<KT>::T* k, int64_t ldk,
                           int64_t D, int64_t n, Ahead& ahead, vf* out) {
  const __m512i* table = nullptr;
  if constexpr (KT != KV_BFLOAT16) table = fp8_table<KT>().part;
  typedef void (*Blocks)(const bf16*, int64_t, const typename Kv<KT>::T*, int64_t, int64_t, int64_t, Ahead&,
                         const __m512i*, vf*);
  static constexpr Blocks blocks[2][2] = {{score_row_blocks<KT, 1, false>, score_row_blocks<KT, 1, true>},
                                          {score_row_blocks<KT, 2, false>, score_row_blocks<KT, 2, true>}};
  blocks[terms - 1][n == W](q, rows, k, ldk, D, n, ahead, table, out);
}
#endif

// o_r[d0 .. d0 + VECS·W) += Σ_{j<n} p_r[j]·v[j][d0 …] for ROWS rows (v's rows loaded, and widened from a narrow
// cache type in registers, once for all of them), o rows ldo floats apart, v rows ldv elements apart, p rows W
// floats apart, the accumulators in registers.
template <int64_t KT, int ROWS, int VECS>
inline void pv_chunk(float* o, int64_t ldo, const float* p, const typename Kv<KT>::T* v, int64_t ldv, int64_t n,
                     Ahead& ahead) {
  vf acc[ROWS][VECS];
  _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) acc[r][x] = load(o + r * ldo + x * W);
  for (int64_t j = 0; j < n; ++j) {
    vf vv[VECS];
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) vv[x] = Kv<KT>::widen(v + j * ldv + x * W);
    _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
      const vf pj = splat(p[r * W + j]);
      _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) acc[r][x] += pj * vv[x];
    }
    ahead.step();
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) store(o + r * ldo + x * W, acc[r][x]);
}

// o_r[0..Dvp) += Σ_{j<n} p_r[j]·v[j] for ROWS rows (1 or 2), in chunks of up to 8 vectors of o.
template <int ROWS>
inline void pv_rows(float* o, int64_t ldo, const float* p, const float* v, int64_t ldv, int64_t dvp, int64_t n,
                    Ahead& ahead) {
  typedef void (*Chunk)(float*, int64_t, const float*, const float*, int64_t, int64_t, Ahead&);
  static constexpr Chunk chunks[8] = {pv_chunk<KV_FLOAT32, ROWS, 1>, pv_chunk<KV_FLOAT32, ROWS, 2>,
                                      pv_chunk<KV_FLOAT32, ROWS, 3>, pv_chunk<KV_FLOAT32, ROWS, 4>,
                                      pv_chunk<KV_FLOAT32, ROWS, 5>, pv_chunk<KV_FLOAT32, ROWS, 6>,
                                      pv_chunk<KV_FLOAT32, ROWS, 7>, pv_chunk<KV_FLOAT32, ROWS, 8>};
  for (int64_t d0 = 0; d0 < dvp; d0 += 8 * W)
    chunks[std::min<int64_t>(8, (dvp - d0) / W) - 1](o + d0, ldo, p, v + d0, ldv, n, ahead);
}

// o_r[0..dvp) += Σ_{j<n} p_r[j]·v[j] for `rows` rows of a narrow cache (dvp = Dv, a multiple of 16), in blocks of
// up to 4 rows × 4 vectors (16 accumulators).
template <int64_t KT>
inline void pv_narrow(float* o, int64_t ldo, const float* p, const typename Kv<KT>::T* v, int64_t ldv, int64_t dvp,
                      int64_t rows, int64_t n, Ahead& ahead) {
  typedef void (*Chunk)(float*, int64_t, const float*, const typename Kv<KT>::T*, int64_t, int64_t, Ahead&);
  static constexpr Chunk chunks[4][4] = {
      {pv_chunk<KT, 1, 1>, pv_chunk<KT, 1, 2>, pv_chunk<KT, 1, 3>, pv_chunk<KT, 1, 4>},
      {pv_chunk<KT, 2, 1>, pv_chunk<KT, 2, 2>, pv_chunk<KT, 2, 3>, pv_chunk<KT, 2, 4>},
      {pv_chunk<KT, 3, 1>, pv_chunk<KT, 3, 2>, pv_chunk<KT, 3, 3>, pv_chunk<KT, 3, 4>},
      {pv_chunk<KT, 4, 1>, pv_chunk<KT, 4, 2>, pv_chunk<KT, 4, 3>, pv_chunk<KT, 4, 4>}};
  for (int64_t r = 0; r < rows; r += 4)
    for (int64_t d0 = 0; d0 < dvp; d0 += 4 * W)
      chunks[std::min<int64_t>(4, rows - r) - 1][std::min<int64_t>(4, (dvp - d0) / W) - 1](
          o + r * ldo + d0, ldo, p + r * W, v + d0, ldv, n, ahead);
}

#ifdef ATTNBENCH_BF16
// o_r[d0 .. d0 + VECS·W) += Σ_{j<n} p_r[j]·v[j][d0 …] for ROWS rows by vdpbf16ps, which sums over pairs of keys:
// P as bf16 (row r's at p + r·2W, zeros past n), v's rows converted to bf16 32 channels at a time (bf16x32) and
// two rows interleaved into pairs by two vpermt2w (a row of zeros after an odd last key), once for all ROWS rows.
template <int64_t KT, int ROWS, int VECS>
inline void pv_dot_chunk(float* o, int64_t ldo, const bf16* p, const typename Kv<KT>::T* v, int64_t ldv, int64_t n,
                         Ahead& ahead, const __m512i* table) {
  static_assert(VECS % 2 == 0, "32 channels of v per conversion");
  alignas(64) static constexpr int16_t lo_index[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                       8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo_at = _mm512_load_si512(lo_index), hi_at = _mm512_add_epi16(lo_at, _mm512_set1_epi16(16));
  __m512 acc[ROWS][VECS];
  _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) acc[r][x] = _mm512_loadu_ps(o + r * ldo + x * W);
  for (int64_t j = 0; j < n; j += 2) {
    __m512i pairs[VECS];
    _Pragma("GCC unroll 4") for (int c = 0; c < VECS / 2; ++c) {
      const __m512i a = bf16x32<KT>(v + j * ldv + c * 2 * W, table);
      const __m512i b = j + 1 < n ? bf16x32<KT>(v + (j + 1) * ldv + c * 2 * W, table) : _mm512_setzero_si512();
      pairs[2 * c] = _mm512_permutex2var_epi16(a, lo_at, b);
      pairs[2 * c + 1] = _mm512_permutex2var_epi16(a, hi_at, b);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r) {
      const __m512i pj = pair_at(p + r * 2 * W + j);
      _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) acc[r][x] = dp_pairs(acc[r][x], pj, pairs[x]);
    }
    ahead.step();
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; ++r)
    _Pragma("GCC unroll 8") for (int x = 0; x < VECS; ++x) _mm512_storeu_ps(o + r * ldo + x * W, acc[r][x]);
}

// o_r[0..dvp) += Σ_{j<n} p_r[j]·v[j] for `rows` rows by vdpbf16ps (dvp = Dv, a multiple of 32), in blocks of up
// to 4 rows × 4 vectors.
template <int64_t KT>
inline void pv_dot(float* o, int64_t ldo, const bf16* p, const typename Kv<KT>::T* v, int64_t ldv, int64_t dvp,
                   int64_t rows, int64_t n, Ahead& ahead) {
  typedef void (*Chunk)(float*, int64_t, const bf16*, const typename Kv<KT>::T*, int64_t, int64_t, Ahead&,
                        const __m512i*);
  static constexpr Chunk chunks[4][2] = {{pv_dot_chunk<KT, 1, 2>, pv_dot_chunk<KT, 1, 4>},
                                         {pv_dot_chunk<KT, 2, 2>, pv_dot_chunk<KT, 2, 4>},
                                         {pv_dot_chunk<KT, 3, 2>, pv_dot_chunk<KT, 3, 4>},
                                         {pv_dot_chunk<KT, 4, 2>, pv_dot_chunk<KT, 4, 4>}};
  const __m512i* table = nullptr;
  if constexpr (KT != KV_BFLOAT16) table = fp8_table<KT>().part;
  for (int64_t r = 0; r < rows; r += 4)
    for (int64_t d0 = 0; d0 < dvp; d0 += 4 * W)
      chunks[std::min<int64_t>(4, rows - r) - 1][std::min<int64_t>(4 * W, dvp - d0) / (2 * W) - 1](
          o + r * ldo + d0, ldo, p + r * 2 * W, v + d0, ldv, n, ahead, table);
}
#endif

// Rows [0, n) of a tile (`from` elements apart in the cache, `len` used) widened to float32 rows `to` floats
// apart (a multiple of W), zeros from len to `to`.
template <int64_t KT>
inline void widen_tile(float* dst, int64_t to, const typename Kv<KT>::T* src, int64_t from, int64_t len, int64_t n) {
  const int64_t whole = len / W * W;
  for (int64_t j = 0; j < n; ++j) {
    const typename Kv<KT>::T* s = src + j * from;
    float* d = dst + j * to;
    for (int64_t x = 0; x < whole; x += W) store(d + x, Kv<KT>::widen(s + x));
    for (int64_t x = whole; x < to; ++x) d[x] = x < len ? Kv<KT>::one(s[x]) : 0.f;
  }
}

// Per-thread scratch: the widened tile of k (W rows of Dk) and of v (W rows of Dvp), the group's scaled q rows
// (Dk each), their o (Dvp each), lane-wise sums l (W each), the tile's probabilities (W each), m, one float of
// padding when rows is odd (so the int64 limits start 8-byte aligned), and key limits (int64, two floats). The
// padding is counted here too: without it an odd row count (GQA group 1 at Sq 1) wrote each thread's last limit
// one float into the next thread's q rows, or past the scratch. The total is even, so every thread's block
// starts 8-byte aligned when the first one does. Dk is the head dim padded to 32 (the dot path's bf16 rows; the
// float32 tiles pad to 16 and use less): its k tile (W rows of Dk bf16) and q rows (two terms of Dk bf16) fit in
// the float32 path's shapes, with 2·Dk floats per q row.
int64_t decode_thread_floats(int64_t rows, int64_t head_dim, int64_t dvp) {
  const int64_t dk = round_up(head_dim, 2 * W);
  return W * (dk + dvp) + rows * (2 * dk + dvp + 2 * W + 3) + rows % 2;
}

// A row's output (Dvp floats) and lse from its unnormalised o (may be `out` itself), max m and sum l (base 2),
// with the sink (base 2; −inf: none) joining the denominator: out = o·boost / (l + 2^(sink − m)),
// lse = ln(2^m·l + 2^sink). A row that saw no key (l = 0) outputs zeros; its lse is the sink's alone.
inline void finish_row(float* out, const float* o, int64_t dvp, float m, float l, float sink, float boost,
                       float* lse) {
  if (l == 0.f) {
    std::memset(out, 0, sizeof(float) * dvp);
    if (lse != nullptr) *lse = sink * LN2;  // −inf without a sink
    return;
  }
  float rescale = 1.f;
  if (sink > m) {  // the sink is the row's largest logit: take it as the reference
    rescale = std::exp2(m - sink);
    l = l * rescale + 1.f;
    m = sink;
  } else {
    l += std::exp2(sink - m);  // 0 without a sink
  }
  const vf factor = splat(boost * rescale / l);
  for (int64_t d = 0; d < dvp; d += W) store(out + d, load(o + d) * factor);
  if (lse != nullptr) *lse = (m + std::log2(l)) * LN2;
}

// Whether some lane of x is above m.
inline bool any_above(vf x, float m) {
#ifdef __AVX512F__
  return _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(m), _CMP_GT_OQ) != 0;
#else
  for (int i = 0; i < W; ++i)
    if (x[i] > m) return true;
  return false;
#endif
}

inline float sink_of(const Decode& pb, int64_t h) {
  return pb.sinks != nullptr ? pb.sinks[h] * LOG2E : -std::numeric_limits<float>::infinity();
}

// One item: rows of kv head hkv of batch b against keys [split·chunk, …). Returns score entries computed.
// Per tile of 16 keys: every row's scores and online softmax (the running max only rescales o and l when it
// rises), then O += P·V. A float32 cache is read in place (k and v copied into float32 tiles only to pad a head
// dim that is not a multiple of 16), O += P·V two rows at a time. A narrow cache (bf16, fp8) is read as stored:
//   scores by vdpbf16ps where the CPU has AVX512-BF16 (the dot path): keys converted to bf16 in registers, once
//     for all rows (score_all_rows; a bf16 tile in L1 when D is not a multiple of 32), against q split into bf16
//     hi + lo, so q keeps 16 bits of its mantissa; elsewhere keys widened into a float32 tile;
//   O += P·V with v widened in registers as it is read, once for up to 4 rows (a float32 tile when Dv is not a
//     multiple of 16), or for a bf16 q by vdpbf16ps with P rounded to bf16 (pv_dot).
template <int64_t KT>
int64_t decode_item(const Decode& pb, int64_t b, int64_t hkv, int64_t split, float* scratch) {
  typedef typename Kv<KT>::T T;
  constexpr bool scaled = Kv<KT>::scaled;
#ifdef ATTNBENCH_BF16
  constexpr bool dot = KT != KV_FLOAT32;
  constexpr float k_bias = 1.f, q_boost = 1.f;  // keys as their true bf16 values
#else
  constexpr bool dot = false;
  constexpr float k_bias = Kv<KT>::bias / Q_BOOST, q_boost = scaled ? Q_BOOST : 1.f;
#endif
  const int64_t group = pb.heads / pb.kv_heads, R = group * pb.seq_q, D = pb.head_dim;
  const int64_t Dk = dot ? round_up(D, 2 * W) : pb.dk, Dv = pb.head_dim_v, Dvp = pb.dvp, v_row = pb.v_row;
  const bool v_regs = KT != KV_FLOAT32 && Dv == Dvp;  // narrow v widened inside P·V
  const bool v_dot = pb.pv_dot(KT);  // … or converted to bf16 pairs for vdpbf16ps (then also v_regs)
  const bool widen_k = !dot && (KT != KV_FLOAT32 || Dk != D), widen_v = !v_regs && (KT != KV_FLOAT32 || Dvp != Dv);
  [[maybe_unused]] const bool k_direct = dot && Dk == D;  // keys read as stored (converted in registers): score_all_rows
  const int64_t k_lo = split * pb.chunk, k_hi = std::min(pb.seq_k, k_lo + pb.chunk);
  float *k_tile = scratch, *v_tile = k_tile + W * Dk, *qs = v_tile + W * Dvp, *o = qs + 2 * R * Dk, *l = o + R * Dvp;
  float *p = l + R * W, *m = p + R * W;
  int64_t* lim = reinterpret_cast<int64_t*>(m + R + R % 2);  // 8-byte aligned
  int64_t key_end = k_lo, computed = 0;
  // the dot path: q as it is (scale·log2 e multiplies the scores instead: s_factor) in `terms` bf16 vectors that
  // sum to it — a bf16 q exactly in one; a float32 q in two, hi + lo, its 16 leading bits (to 2^-17 of each q
  // element: 2^8 below what the cache's own rounding, 2^-9 for bf16 and 2^-4 for fp8, does to every key)
  [[maybe_unused]] const int64_t terms = dot ? (pb.q_bf16 ? 1 : 2) : 1;
  const float s_factor = dot ? pb.scale_log2 : 1.f, q_factor = pb.scale_log2 * q_boost / s_factor;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = hkv * group + r / pb.seq_q, i = r % pb.seq_q, at = ((b * pb.heads + h) * pb.seq_q + i) * D;
    for (int64_t d = 0; d < Dk; ++d) {
      const float x = d < D ? pb.q_at(at + d) * q_factor : 0.f;
#ifdef ATTNBENCH_BF16
      if constexpr (dot) {  // row r's terms at terms·r·Dk bf16, one after another
        bf16* q_terms = reinterpret_cast<bf16*>(qs) + terms * r * Dk + d;
        float rest = x;
        for (int64_t t = 0; t < terms; ++t) {
          q_terms[t * Dk] = bf16_nearest(rest);
          rest -= Kv<KV_BFLOAT16>::one(q_terms[t * Dk]);
        }
        continue;
      }
#endif
      qs[r * Dk + d] = x;
    }
    std::memset(o + r * Dvp, 0, sizeof(float) * Dvp);
    store(l + r * W, vf{});
    m[r] = -std::numeric_limits<float>::infinity();
    const int64_t limit = std::min(pb.rows.limit(b, i), k_hi);
    lim[r] = limit - k_lo;
    key_end = std::max(key_end, limit);
  }
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int64_t ahead_keys = AHEAD_TILES * W * static_cast<int64_t>(sizeof(float) / sizeof(T));
  const int64_t k_bytes = W * D * sizeof(T), v_bytes = ((W - 1) * v_row + Dv) * sizeof(T);  // one tile's rows
  Ahead ahead;
  // the loop steps in a whole tile that issue prefetches: score d-steps (whole tiles, full vectors) and P·V keys
  const int64_t score_steps = R * (Dk / (dot ? 2 * W : W));
  const int64_t pv_steps = v_regs ? (R + 3) / 4 * (v_dot ? W / 2 : W) * ((Dvp + 4 * W - 1) / (4 * W))
                                  : (R + 1) / 2 * W * ((Dvp + 8 * W - 1) / (8 * W));
  const int64_t steps = std::max<int64_t>(1, score_steps + pv_steps);
  // fp8: lane j's k scale · bias / Q_BOOST and v scale · bias / OUT_BOOST, once per item when one scale covers the
  // sequence (a contiguous cache), else per tile (a page's, or the blocks of a gathered paged cache)
  vf k_factor = splat(s_factor), v_factor = splat(1.f);
  const float v_bias = v_dot ? 1.f : Kv<KT>::bias / OUT_BOOST;  // bf16 values are true ones
  const bool per_tile = scaled && (pb.pages != nullptr || pb.scale_block < pb.seq_k);
  if (scaled && !per_tile) {
    k_factor = pb.tile_scales(pb.k_scale, b, hkv, 0, 1) * (k_bias * s_factor);
    v_factor = pb.tile_scales(pb.v_scale, b, hkv, 0, 1) * v_bias;
  }
  for (int64_t c0 = k_lo; c0 < key_end; c0 += W) {  // k_lo is a multiple of 16 (chunks are)
    const int64_t n = std::min<int64_t>(W, key_end - c0);
    const T* k = pb.row<T>(pb.k, D, pb.k_head, b, hkv, c0);
    const T* v = pb.row<T>(pb.v, v_row, pb.v_head, b, hkv, c0);
    const int64_t next = c0 + ahead_keys;
    if (next + W <= key_end)
      ahead.aim(pb.row<T>(pb.k, D, pb.k_head, b, hkv, next), k_bytes, pb.row<T>(pb.v, v_row, pb.v_head, b, hkv, next),
                v_bytes, steps);
    else
      ahead.aim(nullptr, 0, nullptr, 0, 1);
    const float* kt = reinterpret_cast<const float*>(k);  // used as is only when T is float
    if (widen_k) widen_tile<KT>(k_tile, Dk, k, D, D, n), kt = k_tile;
#ifdef ATTNBENCH_BF16
    vf direct[dot ? 16 : 1];  // R ≤ 16 (attnbench_fused_decode_max_rows)
    if constexpr (dot) {
      if (k_direct)
        score_all_rows<KT>(reinterpret_cast<const bf16*>(qs), terms, R, k, D, D, n, ahead, direct);
      else
        bf16_tile<KT>(reinterpret_cast<bf16*>(k_tile), Dk, k, D, D, n);
    }
#endif
    const float* vt = reinterpret_cast<const float*>(v);
    int64_t ldv = v_row;
    if (widen_v) widen_tile<KT>(v_tile, Dvp, v, v_row, Dv, n), vt = v_tile, ldv = Dvp;
    if (per_tile) {
      k_factor = pb.tile_scales(pb.k_scale, b, hkv, c0, n) * (k_bias * s_factor);
      v_factor = pb.tile_scales(pb.v_scale, b, hkv, c0, n) * v_bias;
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t visible = std::clamp<int64_t>(lim[r] - (c0 - k_lo), 0, n);
      if (visible == 0) {
        store(p + r * W, vf{});
        continue;
      }
      vf x;
#ifdef ATTNBENCH_BF16
      if constexpr (dot) {
        x = k_direct ? direct[r]
                     : score_tile_dot_any(reinterpret_cast<const bf16*>(qs) + terms * r * Dk, terms,
                                          reinterpret_cast<const bf16*>(k_tile), Dk, Dk, n, ahead);
      } else
#endif
        x = score_tile_any(qs + r * Dk, kt, Dk, n, ahead);
      x = lane < static_cast<int>(visible) ? x : splat(-std::numeric_limits<float>::infinity());
      if (scaled || s_factor != 1.f) x = x * k_factor;  // scales are positive: −inf stays −inf
      computed += visible;
      // the max rose (some lane above it; the horizontal max only then): o and l scaled by 2^(m_old − m_new), 0 on
      // the first keys
      if (any_above(x, m[r])) {
        const float row_max = hmax(x);
        const vf alpha = splat(std::exp2(m[r] - row_max));
        store(l + r * W, load(l + r * W) * alpha);
        for (int64_t d = 0; d < Dvp; d += W) store(o + r * Dvp + d, load(o + r * Dvp + d) * alpha);
        m[r] = row_max;
      }
      const vf pr = keep_below(exp2_table(x - splat(m[r])), static_cast<int>(visible));
      store(l + r * W, load(l + r * W) + pr);
      const vf pv = scaled ? pr * v_factor : pr;
#ifdef ATTNBENCH_BF16
      if (v_dot) {  // P rounded to bf16
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + r * W), (__m256i)_mm512_cvtneps_pbh((__m512)pv));
        continue;
      }
#endif
      store(p + r * W, pv);
    }
#ifdef ATTNBENCH_BF16
    if constexpr (dot)
      if (v_dot) {
        pv_dot<KT>(o, Dvp, reinterpret_cast<const bf16*>(p), v, v_row, Dvp, R, n, ahead);
        continue;
      }
#endif
    if constexpr (KT != KV_FLOAT32) {
      if (v_regs) {
        pv_narrow<KT>(o, Dvp, p, v, v_row, Dvp, R, n, ahead);
        continue;
      }
    }
    int64_t r = 0;
    for (; r + 2 <= R; r += 2) pv_rows<2>(o + r * Dvp, Dvp, p + r * W, vt, ldv, Dvp, n, ahead);
    if (r < R) pv_rows<1>(o + r * Dvp, Dvp, p + r * W, vt, ldv, Dvp, n, ahead);
  }
  const float boost = pb.out_boost(KT);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = hkv * group + r / pb.seq_q, row = (b * pb.heads + h) * pb.seq_q + r % pb.seq_q;
    const float total = hsum(load(l + r * W));
    if (pb.splits == 1) {  // the whole row is here: normalise and write
      finish_row(pb.out + row * Dvp, o + r * Dvp, Dvp, m[r], total, sink_of(pb, h), boost,
                 pb.lse == nullptr ? nullptr : pb.lse + row);
      continue;
    }
    float* part = pb.partials + (((b * pb.kv_heads + hkv) * pb.splits + split) * R + r) * (Dvp + 2);
    std::memcpy(part, o + r * Dvp, sizeof(float) * Dvp);
    part[Dvp] = m[r];
    part[Dvp + 1] = total;
  }
  return computed;
}

// Combine the splits of query row (b, h, i); the sink joins here, once.
void merge_row(const Decode& pb, int64_t b, int64_t h, int64_t i, float boost) {
  const int64_t group = pb.heads / pb.kv_heads, R = group * pb.seq_q, Dvp = pb.dvp;
  const int64_t hkv = h / group, r = (h % group) * pb.seq_q + i, row = (b * pb.heads + h) * pb.seq_q + i;
  auto part = [&](int64_t split) {
    return pb.partials + (((b * pb.kv_heads + hkv) * pb.splits + split) * R + r) * (Dvp + 2);
  };
  float top = -std::numeric_limits<float>::infinity(), total = 0.f;
  for (int64_t s = 0; s < pb.splits; ++s) top = std::max(top, part(s)[Dvp]);
  float* out = pb.out + row * Dvp;
  std::memset(out, 0, sizeof(float) * Dvp);
  if (top != -std::numeric_limits<float>::infinity()) {  // some split saw a key
    for (int64_t s = 0; s < pb.splits; ++s) {
      const float* p = part(s);
      if (p[Dvp + 1] == 0.f) continue;
      const float w = std::exp2(p[Dvp] - top);
      total += p[Dvp + 1] * w;
      for (int64_t d = 0; d < Dvp; d += W) store(out + d, load(out + d) + load(p + d) * splat(w));
    }
  }
  finish_row(out, out, Dvp, top, total, sink_of(pb, h), boost, pb.lse == nullptr ? nullptr : pb.lse + row);
}

typedef int64_t (*Item)(const Decode&, int64_t, int64_t, int64_t, float*);
constexpr Item ITEMS[4] = {decode_item<KV_FLOAT32>, decode_item<KV_BFLOAT16>, decode_item<KV_E4M3>,
                           decode_item<KV_E5M2>};

}  // namespace

extern "C" {

// What attnbench_fused_decode_kv takes beyond attnbench_fused_decode's arguments (see the top of the file).
struct DecodeCache {
  int64_t q_type;  // 0: float32, 1: bfloat16
  int64_t kv_type;  // KvType: 0 float32, 1 bfloat16, 2 float8_e4m3fn, 3 float8_e5m2
  int64_t head_dim_v;  // Dv; out rows are Dv padded to a multiple of 16
  int64_t v_row;  // elements between v's rows: Dv, or D for a latent cache's values (a view of its keys)
  const float* k_scale;  // fp8: contiguous (B, Hkv, ceil(Sk / scale_block)); paged (num_pages, Hkv)
  const float* v_scale;
  int64_t scale_block;  // contiguous fp8 cache: positions per scale
  const float* sinks;  // (H,) natural-log sink logits, or null
  const int64_t* row_hi;  // mask RANGES: (B, Sq), row i of batch b sees keys [0, row_hi[b·Sq + i]) (ragged batches)
  int64_t k_head, v_head;  // contiguous cache, 0 or elements from one kv head to the next (≥ Sk rows: a view
                           // such as a shared prefix's suffix, the keys P … of a longer cache)
};

// Rows a decode call may have at most (more rows go to attnbench_fused_forward, which is compute-bound).
int64_t attnbench_fused_decode_max_rows() { return 16; }

// Floats of scratch attnbench_fused_decode_kv needs.
int64_t attnbench_fused_decode_kv_scratch_floats(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q,
                                                 int64_t seq_k, int64_t head_dim, int64_t head_dim_v,
                                                 int64_t nthreads) {
  const int64_t rows = heads / std::max<int64_t>(kv_heads, 1) * seq_q;
  const int64_t dvp = round_up(head_dim_v), splits = decode_splits(batch, kv_heads, seq_k, nthreads);
  return nthreads * decode_thread_floats(rows, head_dim, dvp) +
         (splits > 1 ? batch * kv_heads * splits * rows * (dvp + 2) : 0);
}

// out (and lse when not null) of attention for few query rows; see the top of the file. Returns 0 on
// success, 1 on bad arguments. *tiles (when not null) receives the number of score entries computed,
// *splits the number of key splits chosen.
int attnbench_fused_decode_kv(const void* q, const void* k, const void* v, float* out, float* lse, int64_t batch,
                              int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                              float scale, int64_t mask, const int64_t* lengths, const int32_t* pages,
                              int64_t page_size, int64_t max_pages, const DecodeCache* cache, int64_t nthreads,
                              float* scratch, int64_t* tiles, int64_t* splits_used) {
  if (cache == nullptr || batch < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || seq_q < 1 ||
      seq_q > attnbench_fused_decode_max_rows() || seq_k < 1 || head_dim < 1 || mask < NONE || mask > RANGES ||
      (mask == PADDING && lengths == nullptr) || (mask == RANGES && cache->row_hi == nullptr) || nthreads < 1 ||
      scratch == nullptr ||
      (pages != nullptr && (page_size < W || page_size % W != 0 || max_pages * page_size < seq_k)))
    return 1;
  const int64_t kv_type = cache->kv_type, dv = cache->head_dim_v;
  const bool scaled = kv_type == KV_E4M3 || kv_type == KV_E5M2;
  if (cache->q_type < 0 || cache->q_type > 1 || kv_type < KV_FLOAT32 || kv_type > KV_E5M2 || dv < 1 ||
      cache->v_row < dv || (scaled && (cache->k_scale == nullptr || cache->v_scale == nullptr ||
                                       (pages == nullptr && cache->scale_block < 1))))
    return 1;
  const int64_t splits = decode_splits(batch, kv_heads, seq_k, nthreads);
  const int64_t chunk = ((seq_k + splits - 1) / splits + W - 1) / W * W, rows = heads / kv_heads * seq_q;
  const int64_t dk = round_up(head_dim), dvp = round_up(dv);
  Decode pb{q,      k,  v,           out, lse,           batch,  heads,  kv_heads, seq_q,
            seq_k,  head_dim, dk,   dv,  dvp,           cache->v_row, splits, chunk,
            scale * LOG2E, RowLimits{mask, seq_q, seq_k, lengths, nullptr, cache->row_hi}, nullptr};
  pb.partials = scratch + nthreads * decode_thread_floats(rows, head_dim, dvp);
  pb.pages = pages;
  pb.page_size = page_size;
  pb.max_pages = max_pages;
  pb.q_bf16 = cache->q_type == 1;
  pb.k_scale = cache->k_scale;
  pb.v_scale = cache->v_scale;
  pb.scale_block = cache->scale_block;
  pb.sinks = cache->sinks;
  pb.k_head = cache->k_head > 0 ? cache->k_head : seq_k * head_dim;
  pb.v_head = cache->v_head > 0 ? cache->v_head : seq_k * cache->v_row;
  if (pages == nullptr && (pb.k_head < seq_k * head_dim || pb.v_head < (seq_k - 1) * cache->v_row + dv)) return 1;
  const Item item = ITEMS[kv_type];
  const int64_t items = batch * kv_heads * splits;
  const int64_t team = std::min(nthreads, items);
  std::atomic<int64_t> next{0}, computed{0};
  on_team(team, [&](int64_t t) {
    float* mine = scratch + t * decode_thread_floats(rows, head_dim, dvp);
    int64_t count = 0;
    for (int64_t i; (i = next.fetch_add(1)) < items;)
      count += item(pb, i / (kv_heads * splits), i / splits % kv_heads, i % splits, mine);
    computed += count;
  });
  const float boost = pb.out_boost(kv_type);
  if (splits > 1)
    team_for(nthreads, batch * heads * seq_q, [&](int64_t row) {
      merge_row(pb, row / (heads * seq_q), row / seq_q % heads, row % seq_q, boost);
    });
  if (tiles != nullptr) *tiles = computed.load();
  if (splits_used != nullptr) *splits_used = splits;
  return 0;
}

// Floats of scratch attnbench_fused_decode needs.
int64_t attnbench_fused_decode_scratch_floats(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q,
                                              int64_t seq_k, int64_t dp, int64_t nthreads) {
  return attnbench_fused_decode_kv_scratch_floats(batch, heads, kv_heads, seq_q, seq_k, dp, dp, nthreads);
}

// attnbench_fused_decode_kv for float32 q, k, v with v (and out) padded to dp, a multiple of 16, and no sinks.
int attnbench_fused_decode(const float* q, const float* k, const float* v, float* out, float* lse, int64_t batch,
                           int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                           int64_t dp, float scale, int64_t mask, const int64_t* lengths, const int32_t* pages,
                           int64_t page_size, int64_t max_pages, int64_t nthreads, float* scratch, int64_t* tiles,
                           int64_t* splits_used) {
  if (dp < head_dim || dp % W != 0) return 1;
  if (mask == RANGES) return 1;
  const DecodeCache cache{0, KV_FLOAT32, dp, dp, nullptr, nullptr, 0, nullptr, nullptr};
  return attnbench_fused_decode_kv(q, k, v, out, lse, batch, heads, kv_heads, seq_q, seq_k, head_dim, scale, mask,
                                   lengths, pages, page_size, max_pages, &cache, nthreads, scratch, tiles,
                                   splits_used);
}

}  // extern "C"
