// attnbench fused_cpu: the forward's two products with bfloat16 inputs on AVX512-BF16 (vdpbf16ps), fp32
// accumulators. Compiled only where the compiler targets AVX512-BF16 (-march=native on such a CPU); the
// forward falls back to its float32 tiles elsewhere.
//
// vdpbf16ps(acc, a, b) adds a[2i]·b[2i] + a[2i+1]·b[2i+1] to lane i: it multiplies pairs, so both operands
// are packed in pairs along the summed axis:
//   S = Q·Kᵀ sums over d: q rows are read as they are (d pairs adjacent), kᵀ is packed into panels of 64
//       keys as (D/2, 64 keys, 2): one 32-bf16 vector = 16 keys × one pair of d;
//   O += P·V sums over keys: P (rounded to bf16, as FlashAttention does on GPUs) is converted row by row
//       (key pairs adjacent), v is packed as (Skp/2, Dp, 2): one vector = 16 head dims × one pair of keys
//       (that loop lives in fused_cpu_pipeline.h, with the next group's exponentials spread over it).
// Scores come out in float32 and are multiplied by scale·log2(e) as they leave the registers.

#pragma once

#include "fused_cpu_tiles.h"

#if defined(__AVX512BF16__)
#define ATTNBENCH_BF16 1

namespace {

typedef uint16_t bf16;  // raw bfloat16 bits

inline __m512 dp_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

inline __m512i pair_at(const bf16* p) {  // the two bf16 at p broadcast to all 16 lanes
  int32_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _mm512_set1_epi32(bits);
}

// S[R][NV·W] = scale · Q[R][D] · KT, KT one (D/2, PANEL, 2) panel; rmax as in qk_tile.
template <int R, int NV>
void qk_tile_bf16(const bf16* q, int64_t ldq, const bf16* kt, int64_t d_pairs, float scale, float* s,
                  int64_t lds, float* rmax) {
  __m512 acc[R][NV];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < d_pairs; ++d) {
    __m512i k[NV];
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) k[j] = _mm512_loadu_si512(kt + (d * PANEL + j * W) * 2);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      const __m512i qb = pair_at(q + r * ldq + 2 * d);
      _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] = dp_pairs(acc[r][j], qb, k[j]);
    }
  }
  const __m512 factor = _mm512_set1_ps(scale);
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    __m512 m = _mm512_loadu_ps(rmax + r * W);
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) {
      const __m512 x = _mm512_mul_ps(acc[r][j], factor);
      _mm512_storeu_ps(s + r * lds + j * W, x);
      m = _mm512_max_ps(m, x);
    }
    _mm512_storeu_ps(rmax + r * W, m);
  }
}

typedef void (*QkBf16)(const bf16*, int64_t, const bf16*, int64_t, float, float*, int64_t, float*);

template <int R>
struct RowBf16 {
  static constexpr QkBf16 qk[TILE_VECS] = {qk_tile_bf16<R, 1>, qk_tile_bf16<R, 2>, qk_tile_bf16<R, 3>,
                                           qk_tile_bf16<R, 4>};
};

const QkBf16* const QK_BF16[TILE_ROWS] = {RowBf16<1>::qk, RowBf16<2>::qk, RowBf16<3>::qk,
                                          RowBf16<4>::qk, RowBf16<5>::qk, RowBf16<6>::qk};

// Panel p of kᵀ as (d_len/2, PANEL, 2) from k's rows (d_len bf16 apart, d_len even); zeros past seq_k. A pair
// of d is one 32-bit word, so the panel is k's rows of words transposed: 16 keys × 16 words at a time
// (transpose16) where the panel is whole, element by element for the rest.
inline void pack_panel_bf16(const bf16* k, int64_t seq_k, int64_t d_len, int64_t p, bf16* panel) {
  const int64_t words = d_len / 2, whole = p * PANEL + PANEL <= seq_k ? words / W * W : 0;
  for (int64_t c0 = 0; c0 < PANEL && whole > 0; c0 += W)
    for (int64_t w0 = 0; w0 < whole; w0 += W) {
      __m512 block[16];
      for (int i = 0; i < 16; ++i)
        block[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(k + (p * PANEL + c0 + i) * d_len) + w0);
      transpose16(block);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(panel) + (w0 + i) * PANEL + c0, block[i]);
    }
  for (int64_t c = 0; c < PANEL; ++c) {
    const int64_t key = p * PANEL + c;
    for (int64_t d = 2 * whole; d < d_len; ++d)
      panel[((d / 2) * PANEL + c) * 2 + d % 2] = key < seq_k ? k[key * d_len + d] : bf16{0};
  }
}

// Key pair c of v as (Dp, 2) from v's rows (d_len bf16 each, ld apart); zeros past seq_k and past d_len. Where
// both keys exist, 32 d at a time: the two rows' bf16 interleaved by two vpermt2w.
inline void pack_pair_bf16(const bf16* v, int64_t seq_k, int64_t ld, int64_t d_len, int64_t dp, int64_t c,
                           bf16* out) {
  const int64_t whole = 2 * c + 1 < seq_k ? d_len / (2 * W) * (2 * W) : 0;
  if (whole > 0) {
    alignas(64) static constexpr int16_t lo_index[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                         37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                         11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo_at = _mm512_load_si512(lo_index), hi_at = _mm512_add_epi16(lo_at, _mm512_set1_epi16(16));
    const bf16 *a = v + 2 * c * ld, *b = a + ld;
    for (int64_t d = 0; d < whole; d += 2 * W) {
      const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
      _mm512_storeu_si512(out + d * 2, _mm512_permutex2var_epi16(x, lo_at, y));
      _mm512_storeu_si512(out + d * 2 + 2 * W, _mm512_permutex2var_epi16(x, hi_at, y));
    }
  }
  for (int64_t e = 0; e < 2; ++e) {
    const int64_t key = 2 * c + e;
    for (int64_t d = whole; d < dp; ++d) out[d * 2 + e] = key < seq_k && d < d_len ? v[key * ld + d] : bf16{0};
  }
}

}  // namespace

#endif  // __AVX512BF16__
