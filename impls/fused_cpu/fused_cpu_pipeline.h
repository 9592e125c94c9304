// attnbench fused_cpu: the forward's software pipeline — one group's exponentials spread over the previous
// group's O += P·V.
//
// P·V keeps both FMA pipes busy and leaves the vector unit's other pipes (adds, max, rounding, shuffles,
// stores) nearly idle; the softmax is the opposite, and as a phase of its own the FMA pipes wait for it.
// So once a group's scores and row maxima are known, its exponentials become an ExpJob
// handed out one vector (or one bf16 pair of vectors) at a time from inside the previous group's P·V loop,
// where the out-of-order core runs them beside the FMAs. Per 16 scores that adds 4 operations on the FMA
// pipes (exp2_table) to the 128 FMAs of the two products at D = 64 (bf16: exp2fit3's 5 or so to 64).

#pragma once

#include "fused_cpu_bf16.h"
#include "fused_cpu_tiles.h"

namespace {

// p = 2^(s − m) for `rows` rows of `vecs` score vectors each (row r at s + r·lds, its max at m[r]), in place,
// with the lane-wise row sums added to l[r·W …]; with p16 set, each pair of vectors is also rounded to bf16
// into p16 + r·lds (the key pairs the bf16 P·V reads), the sums taken before rounding.
struct ExpJob {
  float* s = nullptr;
  uint16_t* p16 = nullptr;
  int64_t lds = 0;
  const float* m = nullptr;
  float* l = nullptr;
  int64_t rows = 0, vecs = 0, r = 0, c = 0;

  bool pending() const { return r < rows; }
  int64_t left() const { return (rows - r) * vecs - c; }  // vectors not yet done

  __attribute__((always_inline)) inline void next() {
    float* x = s + r * lds + c * W;
    const vf mv = splat(m[r]);
    if (p16 == nullptr) {
      const vf p = exp2_table(load(x) - mv);
      store(x, p);
      store(l + r * W, load(l + r * W) + p);
      c += 1;
    } else {
#ifdef ATTNBENCH_BF16
      const vf lo = exp2fit3(load(x) - mv);
      const vf hi = c + 1 < vecs ? exp2fit3(load(x + W) - mv) : vf{};
      store(l + r * W, load(l + r * W) + lo + hi);
      const __m512bh pair = _mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
      _mm512_storeu_si512(p16 + r * lds + c * W, reinterpret_cast<__m512i>(pair));
#endif
      c += 2;
    }
    if (c >= vecs) c = 0, ++r;
  }

  void finish() {
    while (pending()) next();
  }
};

// pv_tile (P rows contiguous) with job.next() every `every` keys while the job lasts.
template <int R, int NV>
void pv_tile_exp(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, float* o, int64_t ldo,
                 ExpJob& job, int64_t every) {
  pv_tile_job<R, NV>(p, ldp, 1, v, ldv, n, o, ldo, job, every);
}

typedef void (*PvExpFn)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, ExpJob&, int64_t);

template <int R>
struct RowExp {
  static constexpr PvExpFn pv[TILE_VECS] = {pv_tile_exp<R, 1>, pv_tile_exp<R, 2>, pv_tile_exp<R, 3>,
                                            pv_tile_exp<R, 4>};
};

const PvExpFn* const PV_EXP[TILE_ROWS] = {RowExp<1>::pv, RowExp<2>::pv, RowExp<3>::pv,
                                          RowExp<4>::pv, RowExp<5>::pv, RowExp<6>::pv};

// How many keys of P·V per job.next(), to spread the job's `left` items evenly over `keys` keys.
inline int64_t spacing(int64_t keys, int64_t left) { return left > 0 ? std::max<int64_t>(1, keys / left) : keys + 1; }

// O[rows ≤ TILE_ROWS][Dp] += P[rows][n] · V[n][Dp] (P rows ldp apart), the job spread over it.
inline void pv_group_exp(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t n, int64_t rows,
                         int64_t dp, float* o, int64_t ldo, ExpJob& job) {
  const int64_t chunks = (dp + TILE_VECS * W - 1) / (TILE_VECS * W);
  const int64_t every = spacing(n * chunks, job.p16 == nullptr ? job.left() : (job.left() + 1) / 2);
  for (int64_t c = 0; c < dp; c += TILE_VECS * W) {
    const int nv = static_cast<int>(std::min<int64_t>(TILE_VECS, (dp - c) / W));
    PV_EXP[rows - 1][nv - 1](p, ldp, v + c, ldv, n, o + c, ldo, job, every);
  }
}

#ifdef ATTNBENCH_BF16
// O[R][NV·W] += P[R][2·pairs] · V with bf16 P (rows ldp apart) and V as (pairs, ldv, 2), fp32 accumulators,
// with job.next() every `every` key pairs while the job lasts.
template <int R, int NV>
void pv_tile_bf16_exp(const bf16* p, int64_t ldp, const bf16* v, int64_t ldv, int64_t pairs, float* o, int64_t ldo,
                      ExpJob& job, int64_t every) {
  __m512 acc[R][NV];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_loadu_ps(o + r * ldo + j * W);
  int64_t countdown = every;
  for (int64_t c = 0; c < pairs; ++c) {
    __m512i vv[NV];
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) vv[j] = _mm512_loadu_si512(v + (c * ldv + j * W) * 2);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      const __m512i pb = pair_at(p + r * ldp + 2 * c);
      _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] = dp_pairs(acc[r][j], pb, vv[j]);
    }
    if (--countdown == 0) {
      countdown = every;
      if (job.pending()) job.next();
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + r * ldo + j * W, acc[r][j]);
}

typedef void (*PvBf16ExpFn)(const bf16*, int64_t, const bf16*, int64_t, int64_t, float*, int64_t, ExpJob&, int64_t);

template <int R>
struct RowBf16Exp {
  static constexpr PvBf16ExpFn pv[TILE_VECS] = {pv_tile_bf16_exp<R, 1>, pv_tile_bf16_exp<R, 2>,
                                                pv_tile_bf16_exp<R, 3>, pv_tile_bf16_exp<R, 4>};
};

const PvBf16ExpFn* const PV_BF16_EXP[TILE_ROWS] = {RowBf16Exp<1>::pv, RowBf16Exp<2>::pv, RowBf16Exp<3>::pv,
                                                   RowBf16Exp<4>::pv, RowBf16Exp<5>::pv, RowBf16Exp<6>::pv};

// O[rows][Dp] += P·V for keys [0, n) with P already in bf16 (rows ldp apart, zeros past each row's visible
// keys up to n rounded to even), v the (Skp/2, Dp, 2) packing from this tile's first key; the job spread over it.
inline void pv_group_bf16_exp(const bf16* p, int64_t ldp, const bf16* v, int64_t n, int64_t rows, int64_t dp,
                              float* o, ExpJob& job) {
  const int64_t pairs = (n + 1) / 2, chunks = (dp + TILE_VECS * W - 1) / (TILE_VECS * W);
  const int64_t every = spacing(pairs * chunks, (job.left() + 1) / 2);
  for (int64_t c = 0; c < dp; c += TILE_VECS * W) {
    const int nv = static_cast<int>(std::min<int64_t>(TILE_VECS, (dp - c) / W));
    PV_BF16_EXP[rows - 1][nv - 1](p, ldp, v + c * 2, dp, pairs, o + c, dp, job, every);
  }
}

// P's fp32 rows (lds apart) rounded to bf16 into pb (same stride), columns [0, cols rounded up to 32).
inline void round_rows_bf16(const float* s, int64_t lds, bf16* pb, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 2 * W) {
      const __m512 lo = _mm512_loadu_ps(s + r * lds + c);
      const __m512 hi = c + W < cols ? _mm512_loadu_ps(s + r * lds + c + W) : _mm512_setzero_ps();
      _mm512_storeu_si512(pb + r * lds + c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
}
#endif

}  // namespace
