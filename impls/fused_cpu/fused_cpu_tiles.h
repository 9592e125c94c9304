// attnbench fused_cpu: what the forward and backward kernels share — 16-float vectors, the exp2
// polynomial, the register tiles of the two products (S = Q·Kᵀ from packed kᵀ panels, O += P·V), the
// panel packing, the masks as per-row key prefixes, and the thread team. Layouts: fused_cpu_kernel.cpp.

#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

constexpr int W = 16;  // floats per vector
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef float vf_unaligned __attribute__((vector_size(64), aligned(4)));

inline vf load(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vf_unaligned*>(p) = x; }
inline vf splat(float s) { return vf{s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }  // one vbroadcastss

// Horizontal max and sum by halving: four shuffles instead of fifteen lane extractions.
template <typename Op>
inline float reduce(vf x, Op op) {
#ifndef __clang__
  const vi half = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
  const vi quarter = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
  const vi eighth = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
  const vi pair = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
#endif
#ifdef __clang__
  x = op(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
#else
  x = op(x, __builtin_shuffle(x, half));
  x = op(x, __builtin_shuffle(x, quarter));
  x = op(x, __builtin_shuffle(x, eighth));
  x = op(x, __builtin_shuffle(x, pair));
#endif
  return x[0];
}

inline float hmax(vf x) {
  return reduce(x, [](vf a, vf b) { return a > b ? a : b; });
}

inline float hsum(vf x) {
  return reduce(x, [](vf a, vf b) { return a + b; });
}

// 2^x for x <= 0 (values below 2^-126 come out as about 2^-126 or 0: harmless in a sum of terms >= 1):
// 2^x = 2^n · p(f) with n = round(x), |f| <= 1/2, p the polynomial c[0] + c[1]·f + … + c[DEGREE]·f^DEGREE.
template <int DEGREE>
inline vf exp2_poly(vf x, const float* c) {
#ifdef __AVX512F__
  const __m512 v = _mm512_max_ps((__m512)x, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(v, n);
  __m512 p = _mm512_set1_ps(c[DEGREE]);
  for (int i = DEGREE - 1; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
  return (vf)_mm512_scalef_ps(p, n);  // p · 2^n in one instruction
#else
  x = x < splat(-126.f) ? splat(-126.f) : x;
  const vf shifted = x + 0.5f;
  vf n = __builtin_convertvector(__builtin_convertvector(shifted, vi), vf);
  n = n > shifted ? n - 1.f : n;  // floor(x + 0.5): round to nearest
  const vf f = x - n;
  vf p = splat(c[DEGREE]);
  for (int i = DEGREE - 1; i >= 0; --i) p = p * f + c[i];
  const vi bits = (vi)p + __builtin_convertvector(n, vi) * (1 << 23);  // p · 2^n
  return (vf)bits;
#endif
}

// 2^f = e^(f·ln2) by its Taylor series to degree 7 (coefficients ln2^i / i!; relative error below 1e-8
// before rounding); DEGREE 5 (below 3e-6) where the result is rounded to bf16 anyway.
template <int DEGREE = 7>
inline vf exp2v(vf x) {
  static_assert(DEGREE >= 1 && DEGREE <= 7, "Taylor coefficients to degree 7");
  static constexpr float c[8] = {1.f, 0.6931471805599453f, 0.2402265069591007f, 0.0555041086648216f,
                                 0.0096181291076285f, 0.0013333558146428f, 0.0001540353039338f,
                                 1.525273380405984e-05f};
  return exp2_poly<DEGREE>(x, c);
}

// 2^x with a degree-3 polynomial fitted for the least largest relative error on [-1/2, 1/2] (Lawson-
// reweighted least squares) instead of Taylor's: within 7.5e-5 of 2^f, for probabilities rounded to bfloat16
// (whose own rounding is 3.9e-3) — four FMAs fewer per 16 scores than exp2v<7>.
inline vf exp2fit3(vf x) {
  static constexpr float c3[4] = {9.9992807279e-01f, 6.9326098701e-01f, 2.4261113509e-01f, 5.5171666815e-02f};
  return exp2_poly<3>(x, c3);
}

// 2^x for x <= 0 with a 16-entry table: x = n + j/16 + r, |r| <= 1/32, 2^x = 2^n · 2^(j/16) · 2^r, the table
// entry picked by one vpermps (a shuffle, not an FMA) and 2^r by its Taylor polynomial to degree 3 (relative
// error below 1.2e-7 in float32, rounding included). The rounding and the 2^n are adds and integer
// instructions, so the FMA pipes — which the products around it keep busy — see four operations per 16
// exponentials instead of the seven or more of exp2v (what `nox -s bench_fused` measures of the forward).
inline vf exp2_table(vf x) {
  x = x < splat(-126.f) ? splat(-126.f) : x;
  const vf t = x + 786432.f;  // 1.5·2^19: x rounded to a multiple of 1/16 lands in t's low mantissa bits
  const vf r = x - (t - 786432.f);
  const vi bits = (vi)t;  // = bits(1.5·2^19) + 16·n + j
#ifdef __AVX512F__
  static const __m512 table = _mm512_setr_ps(1.f, 1.0442737824274138f, 1.0905077326652577f, 1.1387886347566916f,
                                             1.189207115002721f, 1.2418578120734840f, 1.2968395546510096f,
                                             1.3542555469368927f, 1.4142135623730951f, 1.4768261459394993f,
                                             1.5422108254079407f, 1.6104903319492543f, 1.681792830507429f,
                                             1.7562521603732995f, 1.8340080864093424f, 1.9152065613971474f);
  const vf entry = (vf)_mm512_permutexvar_ps((__m512i)bits, table);
#else
  static const float table[16] = {1.f, 1.0442737824274138f, 1.0905077326652577f, 1.1387886347566916f,
                                  1.189207115002721f, 1.2418578120734840f, 1.2968395546510096f,
                                  1.3542555469368927f, 1.4142135623730951f, 1.4768261459394993f,
                                  1.5422108254079407f, 1.6104903319492543f, 1.681792830507429f,
                                  1.7562521603732995f, 1.8340080864093424f, 1.9152065613971474f};
  vf entry;
  for (int i = 0; i < W; ++i) entry[i] = table[bits[i] & 15];
#endif
  // 2^r − 1 = r·(ln2 + r·(ln2²/2 + r·ln2³/6))
  const vf q = ((r * 0.0555041086648216f + 0.2402265069591007f) * r + 0.6931471805599453f) * r;
  const vf y = entry * q + entry;  // 2^(j/16) · 2^r
  return (vf)((vi)y + ((bits << 19) & static_cast<int32_t>(0xFF800000u)));  // · 2^n: bits' 16·n + j, j masked off
}

// tanh(x) = sign(x)·(1 − e^(−2|x|)) / (1 + e^(−2|x|)), with exp2v (valid for arguments ≤ 0).
inline vf tanhv(vf x) {
  const vf ax = x < vf{} ? -x : x;
  const vf e = exp2v(ax * -2.8853900817779268f);  // e^(−2|x|) = 2^(−2|x|·log2 e)
  const vf t = (1.f - e) / (1.f + e);
  return x < vf{} ? -t : t;
}

// Lanes [0, count) of x, zeros elsewhere.
inline vf keep_below(vf x, int count) {
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < count ? x : vf{};
}

// Lanes [start, 16) of x, zeros elsewhere.
inline vf keep_from(vf x, int start) {
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane >= start ? x : vf{};
}

// S[R][NV·W] = Q[R][D] · KT[D][NV·W]; rmax[R][W] = lane-wise max of itself and of the tile's rows, taken
// while the scores are still in registers (the softmax then needs no pass of its own for the row max).
template <int R, int NV>
void qk_tile(const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t d_len, float* s, int64_t lds,
             float* rmax) {
  vf acc[R][NV];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] = vf{};
  for (int64_t d = 0; d < d_len; ++d) {
    vf k[NV];
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) k[j] = load(kt + d * ldk + j * W);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      vf qb = splat(q[r * ldq + d]);
      _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] += qb * k[j];
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
    vf m = load(rmax + r * W);
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) {
      store(s + r * lds + j * W, acc[r][j]);
      m = acc[r][j] > m ? acc[r][j] : m;
    }
    store(rmax + r * W, m);
  }
}

// Work to spread over a P·V loop (see fused_cpu_pipeline.h's ExpJob); NoJob is none.
struct NoJob {
  bool pending() const { return false; }
  void next() {}
};

// O[R][NV·W] += P[R][n] · V[n][NV·W], P's element (r, c) at p[r·ldp + c·ldc] (ldc = 1 for P, ldp = 1 for a
// transposed P: the backward's Pᵀ·dO and dSᵀ·Q read the score tile column-wise this way, with no copy), with
// job.next() every `every` keys while the job lasts.
template <int R, int NV, typename Job>
__attribute__((always_inline)) inline void pv_tile_job(const float* p, int64_t ldp, int64_t ldc, const float* v,
                                                       int64_t ldv, int64_t n, float* o, int64_t ldo, Job& job,
                                                       int64_t every) {
  vf acc[R][NV];
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] = load(o + r * ldo + j * W);
  int64_t countdown = every;
  for (int64_t c = 0; c < n; ++c) {
    vf vv[NV];
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) vv[j] = load(v + c * ldv + j * W);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {
      vf pb = splat(p[r * ldp + c * ldc]);
      _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) acc[r][j] += pb * vv[j];
    }
    if (--countdown == 0) {
      countdown = every;
      if (job.pending()) job.next();
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int j = 0; j < NV; ++j) store(o + r * ldo + j * W, acc[r][j]);
}

template <int R, int NV>
void pv_tile(const float* p, int64_t ldp, int64_t ldc, const float* v, int64_t ldv, int64_t n, float* o,
             int64_t ldo) {
  NoJob none;
  pv_tile_job<R, NV>(p, ldp, ldc, v, ldv, n, o, ldo, none, n + 1);
}

constexpr int TILE_ROWS = 6;  // 6 rows × 4 vectors = 24 accumulators of AVX-512's 32 registers
constexpr int TILE_VECS = 4;

typedef void (*QkFn)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, float*);
typedef void (*PvFn)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <int R>
struct Row {
  static constexpr QkFn qk[TILE_VECS] = {qk_tile<R, 1>, qk_tile<R, 2>, qk_tile<R, 3>, qk_tile<R, 4>};
  static constexpr PvFn pv[TILE_VECS] = {pv_tile<R, 1>, pv_tile<R, 2>, pv_tile<R, 3>, pv_tile<R, 4>};
};

const QkFn* const QK[TILE_ROWS] = {Row<1>::qk, Row<2>::qk, Row<3>::qk, Row<4>::qk, Row<5>::qk, Row<6>::qk};
const PvFn* const PV[TILE_ROWS] = {Row<1>::pv, Row<2>::pv, Row<3>::pv, Row<4>::pv, Row<5>::pv, Row<6>::pv};

constexpr int PANEL = TILE_VECS * W;  // keys per packed kᵀ panel

// S[rows][cols] = Q[rows][D] · Kᵀ[D][cols], Kᵀ given as consecutive (D, PANEL) panels; cols a multiple of W.
inline void qk_block(const float* q, int64_t ldq, const float* panels, int64_t d_len, int64_t rows, int64_t cols,
                     float* s, int64_t lds, float* rmax) {
  for (int64_t c = 0; c < cols; c += PANEL) {
    int nv = static_cast<int>(std::min<int64_t>(TILE_VECS, (cols - c) / W));
    const float* panel = panels + (c / PANEL) * d_len * PANEL;
    for (int64_t r = 0; r < rows; r += TILE_ROWS) {
      int nr = static_cast<int>(std::min<int64_t>(TILE_ROWS, rows - r));
      QK[nr - 1][nv - 1](q + r * ldq, ldq, panel, PANEL, d_len, s + r * lds + c, lds, rmax + r * W);
    }
  }
}

#ifdef __AVX512F__
// rows[0..16) ← their transpose (16 × 16 floats), by the usual four rounds of unpacks and lane shuffles.
inline void transpose16(__m512 rows[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)
    for (int j = 0; j < 2; ++j) {
      rows[i + j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
      rows[i + j + 2] =
          _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
    }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(rows[i + j], rows[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(rows[i + j], rows[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    rows[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    rows[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
  // the unpacks leave columns 1 and 2 of each group of four swapped
  for (int i = 0; i < 16; i += 4) std::swap(rows[i + 1], rows[i + 2]);
}
#endif

// Panel p of kᵀ·factor for one kv head (k's rows d_len floats apart): keys [p·PANEL, (p+1)·PANEL), zeros
// past seq_k. Whole 16 × 16 blocks go through a register transpose (one load and one store per 16 floats
// instead of 16 scattered stores); the edges, element by element.
inline void pack_panel(const float* k, int64_t seq_k, int64_t d_len, int64_t p, float* panel,
                       float factor = 1.f) {
  int64_t d_done = 0;
#ifdef __AVX512F__
  if (p * PANEL + PANEL <= seq_k) {
    d_done = d_len / W * W;
    const __m512 f = _mm512_set1_ps(factor);
    for (int64_t c0 = 0; c0 < PANEL; c0 += W)
      for (int64_t d0 = 0; d0 < d_done; d0 += W) {
        __m512 block[16];
        for (int i = 0; i < 16; ++i) block[i] = _mm512_mul_ps(_mm512_loadu_ps(k + (p * PANEL + c0 + i) * d_len + d0), f);
        transpose16(block);
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(panel + (d0 + i) * PANEL + c0, block[i]);
      }
  }
#endif
  for (int64_t c = 0; c < PANEL; ++c) {
    const int64_t key = p * PANEL + c;
    for (int64_t d = d_done; d < d_len; ++d) panel[d * PANEL + c] = key < seq_k ? k[key * d_len + d] * factor : 0.f;
  }
}

// O[rows][Dp] += P[rows][n] · V[n][Dp], P's element (r, c) at p[r·ldp + c·ldc]; Dp a multiple of W.
inline void pv_block(const float* p, int64_t ldp, int64_t ldc, const float* v, int64_t ldv, int64_t n,
                     int64_t rows, int64_t dp, float* o, int64_t ldo) {
  for (int64_t c = 0; c < dp; c += TILE_VECS * W) {
    int nv = static_cast<int>(std::min<int64_t>(TILE_VECS, (dp - c) / W));
    for (int64_t r = 0; r < rows; r += TILE_ROWS) {
      int nr = static_cast<int>(std::min<int64_t>(TILE_ROWS, rows - r));
      PV[nr - 1][nv - 1](p + r * ldp, ldp, ldc, v + c, ldv, n, o + r * ldo + c, ldo);
    }
  }
}

enum Mask : int64_t { NONE = 0, CAUSAL = 1, CAUSAL_BOTTOM_RIGHT = 2, PADDING = 3, RANGES = 4 };

// Every mask gives query row i of batch b one range of visible keys [first(b, i), limit(b, i)): a prefix for
// none, causal (top-left), causal bottom-right and padding (per-batch lengths); for RANGES the caller's
// per-row bounds (B, Sq) — a sliding window, a document, any band. Only the forward takes RANGES.
struct RowLimits {
  int64_t mask, seq_q, seq_k;
  const int64_t* lengths;  // per batch element, for PADDING
  const int64_t* lo = nullptr;  // (B, Sq), for RANGES
  const int64_t* hi = nullptr;

  int64_t limit(int64_t b, int64_t i) const {
    switch (mask) {
      case CAUSAL: return std::min(seq_k, i + 1);
      case CAUSAL_BOTTOM_RIGHT: return std::clamp<int64_t>(i + 1 + seq_k - seq_q, 0, seq_k);
      case PADDING: return std::clamp<int64_t>(lengths[b], 0, seq_k);
      case RANGES: return std::clamp<int64_t>(hi[b * seq_q + i], 0, seq_k);
      default: return seq_k;
    }
  }
  int64_t first(int64_t b, int64_t i) const {
    return mask == RANGES ? std::clamp<int64_t>(lo[b * seq_q + i], 0, seq_k) : 0;
  }
};

// fn(t) on each thread t of a team of `team`: torch's own OpenMP pool when built with OpenMP (libgomp.so.1
// is already loaded by torch, so this library binds to it: the team is torch's intra-op pool, hot and not
// competing with it for the cores), std::threads otherwise. One call is one phase: it returns when every
// thread is done, so a sequence of calls needs no barrier of its own.
template <typename Fn>
void on_team(int64_t team, Fn fn) {
#ifdef _OPENMP
#pragma omp parallel num_threads(static_cast<int>(team))
  fn(static_cast<int64_t>(omp_get_thread_num()));
#else
  std::vector<std::thread> threads;
  try {
    for (int64_t t = 1; t < team; ++t) threads.emplace_back(fn, t);
  } catch (...) {
    // fewer threads than asked: callers hand out work dynamically, so the ones that started finish it
  }
  fn(0);
  for (auto& t : threads) t.join();
#endif
}

// fn(i) for every i in [0, n), split into contiguous ranges over the team.
template <typename Fn>
void team_for(int64_t team, int64_t n, Fn fn) {
  std::atomic<int64_t> next{0};
  const int64_t chunk = std::max<int64_t>(1, n / (8 * team));
  on_team(std::min(team, std::max<int64_t>(n, 1)), [&](int64_t) {
    for (int64_t i0; (i0 = next.fetch_add(chunk)) < n;)
      for (int64_t i = i0; i < std::min(n, i0 + chunk); ++i) fn(i);
  });
}

}  // namespace
