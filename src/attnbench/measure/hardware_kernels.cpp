// The CPU's hardware ceilings, measured by kernels that do nothing but the one thing they measure.
//
// Compute: each thread runs CHAINS independent accumulator chains of one instruction (a fused
// multiply-add, or a dot-product instruction), so the instruction's latency is hidden and the core issues
// as many as its execution ports allow. acc = acc·x + y with |x| < 1 converges to y / (1 − x): no
// overflow, no subnormals, and the compiler can't fold the loop away. FLOPs: a fused multiply-add is 2 per
// lane; AVX512-BF16's vdpbf16ps adds two bf16 products into each fp32 lane, 4 FLOP per fp32 lane.
//
// Memory: STREAM's triad, a[i] = b[i] + s·c[i], on float arrays the caller makes much larger than the
// last-level cache; the caller counts 12 bytes per element (two reads, one write; no write-allocate, as
// STREAM counts). And a read stream (the sum of one such array, 4 bytes per element): a workload that only
// reads, as decode reads its KV cache, can go faster than the triad, and a roof must bound it too.
//
// Each instruction set's kernel is compiled with a target attribute, so one build holds all the ones the
// compiler knows whatever -march says; attnbench_hw_compiled tells which. Which one runs is the caller's
// choice, from the CPU's flags: running one the CPU lacks is an illegal instruction.
//
// Threads: an OpenMP team (torch's own runtime, libgomp.so.1, already loaded by torch, so this library
// binds to it and the team is torch's pool); std::threads when built without OpenMP.

#include <cstdint>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HW_X86 1
#if defined(__clang__) ? (__clang_major__ >= 9) : (defined(__GNUC__) && __GNUC__ >= 10)
#define HW_BF16 1
#endif
#if defined(__clang__) ? (__clang_major__ >= 14) : (defined(__GNUC__) && __GNUC__ >= 12)
#define HW_FP16 1
#endif
#endif

namespace {

enum Isa {
  GENERIC_F32 = 0,
  AVX2_F32 = 1,
  AVX512_F32 = 2,
  AVX512_BF16 = 3,
  AVX512_FP16 = 4,
  GENERIC_F64 = 5,
  AVX2_F64 = 6,
  AVX512_F64 = 7,
};

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define REP16(X) REP12(X) X(12) X(13) X(14) X(15)

// Generic: what the compiler makes of a plain loop at this -march (12 chains of 16 lanes).
template <class T>
double generic(int64_t iters, T seed) {
  constexpr int kChains = 12, kLanes = 16;
  T acc[kChains][kLanes];
  const T x = T(0.999), y = seed * T(1e-3);
  for (int c = 0; c < kChains; ++c)
    for (int l = 0; l < kLanes; ++l) acc[c][l] = seed + T(c) * T(0.01) + T(l) * T(0.001);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains; ++c) {
#pragma GCC unroll 16
      for (int l = 0; l < kLanes; ++l) acc[c][l] = acc[c][l] * x + y;
    }
  }
  T sum = 0;
  for (int c = 0; c < kChains; ++c)
    for (int l = 0; l < kLanes; ++l) sum += acc[c][l];
  return static_cast<double>(sum);
}

#ifdef HW_X86
// AVX2: 16 ymm registers, so 12 chains and the two constants.
__attribute__((target("avx2,fma"))) double avx2_f32(int64_t iters, float seed) {
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(seed * 1e-3f);
#define INIT(i) __m256 a##i = _mm256_set1_ps(seed + 0.01f * i);
  REP12(INIT)
#undef INIT
  for (int64_t n = 0; n < iters; ++n) {
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, x, y);
    REP12(STEP)
#undef STEP
  }
  float out[8];
  __m256 s = a0;
#define ADD(i) s = _mm256_add_ps(s, a##i);
  ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8) ADD(9) ADD(10) ADD(11)
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

__attribute__((target("avx2,fma"))) double avx2_f64(int64_t iters, double seed) {
  const __m256d x = _mm256_set1_pd(0.999), y = _mm256_set1_pd(seed * 1e-3);
#define INIT(i) __m256d a##i = _mm256_set1_pd(seed + 0.01 * i);
  REP12(INIT)
#undef INIT
  for (int64_t n = 0; n < iters; ++n) {
#define STEP(i) a##i = _mm256_fmadd_pd(a##i, x, y);
    REP12(STEP)
#undef STEP
  }
  double out[4];
  __m256d s = a0;
#undef ADD
#define ADD(i) s = _mm256_add_pd(s, a##i);
  ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8) ADD(9) ADD(10) ADD(11)
  _mm256_storeu_pd(out, s);
  return out[0] + out[3];
}
#undef ADD

// AVX-512: 32 zmm registers, so 16 chains.
__attribute__((target("avx512f"))) double avx512_f32(int64_t iters, float seed) {
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(seed * 1e-3f);
#define INIT(i) __m512 a##i = _mm512_set1_ps(seed + 0.01f * i);
  REP16(INIT)
#undef INIT
  for (int64_t n = 0; n < iters; ++n) {
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, x, y);
    REP16(STEP)
#undef STEP
  }
  __m512 s = a0;
#define ADD(i) s = _mm512_add_ps(s, a##i);
  ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8) ADD(9) ADD(10) ADD(11) ADD(12) ADD(13) ADD(14) ADD(15)
#undef ADD
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f"))) double avx512_f64(int64_t iters, double seed) {
  const __m512d x = _mm512_set1_pd(0.999), y = _mm512_set1_pd(seed * 1e-3);
#define INIT(i) __m512d a##i = _mm512_set1_pd(seed + 0.01 * i);
  REP16(INIT)
#undef INIT
  for (int64_t n = 0; n < iters; ++n) {
#define STEP(i) a##i = _mm512_fmadd_pd(a##i, x, y);
    REP16(STEP)
#undef STEP
  }
  __m512d s = a0;
#define ADD(i) s = _mm512_add_pd(s, a##i);
  ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8) ADD(9) ADD(10) ADD(11) ADD(12) ADD(13) ADD(14) ADD(15)
#undef ADD
  return _mm512_reduce_add_pd(s);
}
#endif

#ifdef HW_BF16
// vdpbf16ps: each fp32 lane += a[2i]·b[2i] + a[2i+1]·b[2i+1] (bf16 pairs). x, y = 2⁻⁵: each instruction
// adds 2⁻⁹ per lane, so a lane stays far from fp32's range in any run this code makes.
__attribute__((target("avx512bf16,avx512f"))) double avx512_bf16(int64_t iters, float seed) {
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.03125f), _mm512_set1_ps(0.03125f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.03125f), _mm512_set1_ps(0.03125f));
#define INIT(i) __m512 a##i = _mm512_set1_ps(seed + 0.01f * i);
  REP16(INIT)
#undef INIT
  for (int64_t n = 0; n < iters; ++n) {
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    REP16(STEP)
#undef STEP
  }
  __m512 s = a0;
#define ADD(i) s = _mm512_add_ps(s, a##i);
  ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8) ADD(9) ADD(10) ADD(11) ADD(12) ADD(13) ADD(14) ADD(15)
#undef ADD
  return _mm512_reduce_add_ps(s);
}
#endif

#ifdef HW_FP16
// vfmadd…ph: 32 fp16 lanes per zmm; acc = acc·0.5 + 0.25 converges to 0.5.
__attribute__((target("avx512fp16,avx512f"))) double avx512_fp16(int64_t iters, float seed) {
  const __m512h x = _mm512_set1_ph(static_cast<_Float16>(0.5f));
  const __m512h y = _mm512_set1_ph(static_cast<_Float16>(0.25f));
#define INIT(i) __m512h a##i = _mm512_set1_ph(static_cast<_Float16>(seed + 0.01f * i));
  REP16(INIT)
#undef INIT
  for (int64_t n = 0; n < iters; ++n) {
#define STEP(i) a##i = _mm512_fmadd_ph(a##i, x, y);
    REP16(STEP)
#undef STEP
  }
  __m512h s = a0;
#define ADD(i) s = _mm512_add_ph(s, a##i);
  ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7) ADD(8) ADD(9) ADD(10) ADD(11) ADD(12) ADD(13) ADD(14) ADD(15)
#undef ADD
  return static_cast<double>(_mm512_reduce_add_ph(s));
}
#endif

// FLOPs one thread does in `iters` iterations of isa's kernel, or 0 when it is not compiled here.
double flops_per_thread(int isa, int64_t iters) {
  const double n = static_cast<double>(iters);
  switch (isa) {
    case GENERIC_F32:
    case GENERIC_F64:
      return n * 12 * 16 * 2;
#ifdef HW_X86
    case AVX2_F32:
      return n * 12 * 8 * 2;
    case AVX2_F64:
      return n * 12 * 4 * 2;
    case AVX512_F32:
      return n * 16 * 16 * 2;
    case AVX512_F64:
      return n * 16 * 8 * 2;
#endif
#ifdef HW_BF16
    case AVX512_BF16:
      return n * 16 * 16 * 4;
#endif
#ifdef HW_FP16
    case AVX512_FP16:
      return n * 16 * 32 * 2;
#endif
    default:
      return 0;
  }
}

double run_one(int isa, int64_t iters, int thread) {
  const float seed = 0.5f + 0.001f * static_cast<float>(thread);
  switch (isa) {
    case GENERIC_F32:
      return generic<float>(iters, seed);
    case GENERIC_F64:
      return generic<double>(iters, seed);
#ifdef HW_X86
    case AVX2_F32:
      return avx2_f32(iters, seed);
    case AVX2_F64:
      return avx2_f64(iters, seed);
    case AVX512_F32:
      return avx512_f32(iters, seed);
    case AVX512_F64:
      return avx512_f64(iters, seed);
#endif
#ifdef HW_BF16
    case AVX512_BF16:
      return avx512_bf16(iters, seed);
#endif
#ifdef HW_FP16
    case AVX512_FP16:
      return avx512_fp16(iters, seed);
#endif
    default:
      return 0;
  }
}

// body(t, team size) on threads t = 0 … team size − 1 at once; returns the team size.
template <class Body>
int64_t team(int64_t nthreads, Body body) {
#ifdef _OPENMP
  int64_t ran = 1;
#pragma omp parallel num_threads(static_cast<int>(nthreads))
  {
#pragma omp single
    ran = omp_get_num_threads();
    body(omp_get_thread_num(), ran);
  }
  return ran;
#else
  std::vector<std::thread> threads;
  int64_t t = 1;
  try {
    for (; t < nthreads; ++t) threads.emplace_back(body, t, nthreads);
  } catch (...) {
    // fewer threads than asked: this one runs the parts of the ones that could not start
  }
  body(0, nthreads);
  for (; t < nthreads; ++t) body(t, nthreads);
  for (auto& thread : threads) thread.join();
  return nthreads;
#endif
}

}  // namespace

extern "C" {

// 1 when isa's kernel is compiled into this library (the compiler knew its instructions), else 0.
int attnbench_hw_compiled(int isa) { return flops_per_thread(isa, 1) > 0 ? 1 : 0; }

// 1 when built with OpenMP.
int attnbench_hw_openmp() {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

// Runs isa's kernel for `iters` iterations on each of nthreads threads at once; returns the FLOPs done
// (by the threads that ran), or a negative number when isa is not compiled here. *sink receives a sum of
// the accumulators, so the work is observable.
double attnbench_hw_flops(int isa, int64_t iters, int64_t nthreads, double* sink) {
  const double per_thread = flops_per_thread(isa, iters);
  if (per_thread <= 0 || iters < 1 || nthreads < 1) return -1;
  std::vector<double> sums(static_cast<size_t>(nthreads), 0.0);
  const int64_t ran = team(nthreads, [&](int64_t t, int64_t) { sums[t] = run_one(isa, iters, static_cast<int>(t)); });
  double total = 0;
  for (double s : sums) total += s;
  if (sink != nullptr) *sink = total;
  return per_thread * static_cast<double>(ran);
}

// a[i] = b[i] + s·c[i] for i < n, split evenly over nthreads threads (each thread a contiguous range).
int attnbench_hw_triad(float* a, const float* b, const float* c, float s, int64_t n, int64_t nthreads) {
  if (n < 0 || nthreads < 1) return 1;
  team(nthreads, [&](int64_t t, int64_t ran) {
    const int64_t lo = n * t / ran, hi = n * (t + 1) / ran;
    float* __restrict__ out = a;
    const float* __restrict__ x = b;
    const float* __restrict__ y = c;
    for (int64_t i = lo; i < hi; ++i) out[i] = x[i] + s * y[i];
  });
  return 0;
}

// The sum of a[0..n), split evenly over nthreads threads, into *sink (so the reads can't be dropped).
int attnbench_hw_read(const float* a, int64_t n, int64_t nthreads, double* sink) {
  if (n < 0 || nthreads < 1 || sink == nullptr) return 1;
  std::vector<double> sums(static_cast<size_t>(nthreads), 0.0);
  team(nthreads, [&](int64_t t, int64_t ran) {
    const int64_t lo = n * t / ran, hi = n * (t + 1) / ran;
    float acc[64] = {};  // 64 independent partial sums: vectorised, no one long chain
    int64_t i = lo;
    for (; i + 64 <= hi; i += 64)
      for (int j = 0; j < 64; ++j) acc[j] += a[i + j];
    double total = 0;
    for (; i < hi; ++i) total += a[i];
    for (float x : acc) total += x;
    sums[static_cast<size_t>(t)] = total;
  });
  double total = 0;
  for (double x : sums) total += x;
  *sink = total;
  return 0;
}

}  // extern "C"
