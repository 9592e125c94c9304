// attnbench fused_cpu: FlashAttention-style forward on the CPU, float32.
//
// out = softmax(q·kᵀ·scale + mask)·v, computed one block of BQ query rows at a time against blocks of
// BK keys with the online-softmax recurrence (running row max m, running denominator l, rescaled
// output accumulator), so no more than a BQ×BK tile of scores ever exists.
//
// Layouts (prepared by impls/fused_cpu.py, all float32, contiguous):
//   q   (B, H,   Sq, D)     read as is; query head h uses kv head h / (H / Hkv) (GQA)
//   k   (B, Hkv, Sk, D)     read once, to fill kt
//   kt  (B, Hkv, Skp/64, D, 64)  scratch the kernel fills first: kᵀ in panels of 64 keys, each panel
//                           contiguous (16 KiB at D=64) so that it stays in L1 while every row of a
//                           query block reads it; the key axis padded with zeros to a multiple of 64
//   v   (B, Hkv, Sk, Dp)    values, head dim padded with zeros to a multiple of 16
//   out (B, H,   Sq, Dp)
// Every mask we support gives each query row a prefix of visible keys [0, limit(row)): none, causal
// (top-left), causal bottom-right and padding (per-batch lengths). Key blocks past the largest limit of
// a query block are never visited, which is how causal does half the work; inside the boundary block
// the scores past a row's limit are dropped. Rows with no visible key output zeros.
//
// Vectors are GCC/Clang vector extensions 16 floats wide: one AVX-512 register when built with
// -march=native on such a CPU, two AVX2 registers (or four SSE) elsewhere. Scores are kept in base 2
// (q is pre-multiplied by scale·log2 e) so the exponential is exp2 with a degree-7 polynomial.
// Threads: an OpenMP team of nthreads (torch's own pool, see the end of the file; std::threads when
// built without OpenMP) takes work items (batch, head, query block) from an atomic counter, largest first.

#include "fused_cpu_bf16.h"
#include "fused_cpu_tiles.h"

namespace {

struct Problem {
  const float* q;
  const float* k;
  float* kt;
  const float* v;
  float* out;
  float* lse;  // (B, H, Sq) natural log-sum-exp of each row's visible scaled scores (-inf: none), or null
  int64_t batch, heads, kv_heads, seq_q, seq_k, head_dim, skp, dp;
  float scale_log2;  // scale · log2(e)
  RowLimits rows;  // the mask: the number of keys query row i of batch b sees, a prefix [0, limit)
  int64_t block_q, block_k;
  // bfloat16 inputs (attnbench_fused_forward_bf16), else null: q as is, kᵀ and v packed in pairs
  const uint16_t *q16 = nullptr, *kt16 = nullptr, *v16 = nullptr;
  // score modifiers, applied to the scaled scores before the mask (in base 2: multiplied by log2 e)
  float softcap2 = 0.f;          // softcap·log2(e): s ← softcap2·tanh(s / softcap2); 0 = off
  const float* alibi2 = nullptr;  // per query head, slope·log2(e): s −= slope2·|i + Sk − Sq − j|; null = off
  std::vector<float> alibi2_storage;

  int64_t limit(int64_t b, int64_t i) const { return rows.limit(b, i); }
};

// Per-thread working memory, carved from the caller's buffer (torch allocates it, so the benchmark's
// memory measurement sees it): scaled q rows, score tile, output accumulator, row max, row sum, and the
// score tile's lane-wise row maxima.
// With bf16 inputs the q rows are read in place and the first part holds P in bf16 instead (block_k / 2).
int64_t scratch_floats(int64_t block_q, int64_t block_k, int64_t head_dim, int64_t dp) {
  return block_q * (std::max(head_dim, block_k / 2) + block_k + dp + 2 + W);
}

struct Scratch {
  float *q, *s, *o, *m, *l, *tile_max;
  int64_t tiles = 0;  // score entries computed, for the block-skipping check
  Scratch(const Problem& pb, float* base)
      : q(base), s(q + pb.block_q * std::max(pb.head_dim, pb.block_k / 2)), o(s + pb.block_q * pb.block_k),
        m(o + pb.block_q * pb.dp),
        l(m + pb.block_q), tile_max(l + pb.block_q) {}
};

// The score modifiers on one row of a score tile (keys c0 …), before masking: softcap, then ALiBi.
void modify_scores(const Problem& pb, int64_t h, int64_t i, int64_t c0, float* sr, int64_t nv) {
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const float at = static_cast<float>(i + pb.seq_k - pb.seq_q - c0);  // the query's position among the keys
  for (int64_t c = 0; c < nv; c += W) {
    vf x = load(sr + c);
    if (pb.softcap2 != 0.f) x = splat(pb.softcap2) * tanhv(x * (1.f / pb.softcap2));
    if (pb.alibi2 != nullptr) {
      vf distance = splat(at) - (__builtin_convertvector(lane, vf) + static_cast<float>(c));
      distance = distance < vf{} ? -distance : distance;
      x -= splat(pb.alibi2[h]) * distance;
    }
    store(sr + c, x);
  }
}

void run_item(const Problem& pb, int64_t b, int64_t h, int64_t i0, Scratch& sc) {
  const int64_t rows = std::min(pb.block_q, pb.seq_q - i0);
  const int64_t D = pb.head_dim, Dp = pb.dp, BK = pb.block_k;
  const int64_t hkv = h / (pb.heads / pb.kv_heads);
  const float* q = pb.q + ((b * pb.heads + h) * pb.seq_q + i0) * D;
  const float* kt = pb.kt + (b * pb.kv_heads + hkv) * pb.skp * D;
  const float* v = pb.v + (b * pb.kv_heads + hkv) * pb.seq_k * Dp;
  float* out = pb.out + ((b * pb.heads + h) * pb.seq_q + i0) * Dp;

  float* qs = sc.q;
  float* s = sc.s;
  float* o = sc.o;
  int64_t key_begin = pb.seq_k, key_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    key_begin = std::min(key_begin, pb.rows.first(b, i0 + r));
    if (pb.q16 == nullptr)
      for (int64_t d = 0; d < D; ++d) qs[r * D + d] = q[r * D + d] * pb.scale_log2;
    key_end = std::max(key_end, pb.limit(b, i0 + r));
    sc.m[r] = -std::numeric_limits<float>::infinity();
    sc.l[r] = 0.f;
  }
  std::memset(o, 0, sizeof(float) * rows * Dp);

  const bool modified = pb.softcap2 != 0.f || pb.alibi2 != nullptr;  // the tile's lane maxima are stale
  const bool bf16 = pb.q16 != nullptr;  // P is rounded to bf16: a shorter exp2 polynomial is exact enough
  // Key blocks from the first visible key of any row (a multiple of PANEL, where kt's panels start) to the
  // last: blocks wholly outside every row's range are never computed.
  for (int64_t c0 = std::min(key_begin, key_end) / PANEL * PANEL; c0 < key_end; c0 += BK) {
    const int64_t n = std::min(BK, key_end - c0);
    const int64_t nv = (n + W - 1) / W * W;  // kt's key axis is padded, so reading up to nv is safe
    std::fill(sc.tile_max, sc.tile_max + rows * W, -std::numeric_limits<float>::infinity());
    if (pb.q16 == nullptr) {
      qk_block(qs, D, kt + c0 * D, D, rows, nv, s, BK, sc.tile_max);  // c0 is a multiple of PANEL
    } else {
#ifdef ATTNBENCH_BF16
      const int64_t kv = b * pb.kv_heads + hkv, row0 = (b * pb.heads + h) * pb.seq_q + i0;
      qk_block_bf16(pb.q16 + row0 * D, D, pb.kt16 + (kv * pb.skp + c0) * D, D, rows, nv, pb.scale_log2, s, BK,
                    sc.tile_max);
#endif
    }
    sc.tiles += rows * nv;
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * BK;
      const int64_t visible = std::clamp<int64_t>(pb.limit(b, i0 + r) - c0, 0, n);
      const int64_t first = std::clamp<int64_t>(pb.rows.first(b, i0 + r) - c0, 0, n);
      if (visible <= first) {
        std::memset(sr, 0, sizeof(float) * nv);
        continue;
      }
      if (modified) modify_scores(pb, h, i0 + r, c0, sr, nv);
      if (first > 0) {  // keys before the row's range: -inf, so they count nowhere
        for (int64_t c = 0; c < first; ++c) sr[c] = -std::numeric_limits<float>::infinity();
      }
      const int64_t full = visible / W * W;
      float row_max;
      if (visible == nv && !modified && first == 0) {  // every column computed is visible: the tile's max is the row's
        row_max = std::max(sc.m[r], hmax(load(sc.tile_max + r * W)));
      } else {  // a boundary block (or padded keys): only the visible columns count
        vf vmax = splat(sc.m[r]);
        for (int64_t c = 0; c < full; c += W) {
          const vf x = load(sr + c);
          vmax = x > vmax ? x : vmax;
        }
        row_max = hmax(vmax);
        for (int64_t c = full; c < visible; ++c) row_max = std::max(row_max, sr[c]);
      }
      const float alpha = std::exp2(sc.m[r] - row_max);  // 0 on the first visible block (m = -inf)
      const vf m_new = splat(row_max);
      vf total = vf{};
      for (int64_t c = 0; c < full; c += W) {
        vf p = bf16 ? exp2v<5>(load(sr + c) - m_new) : exp2v(load(sr + c) - m_new);
        if (c < first) p = keep_from(p, static_cast<int>(first - c));  // exp2v(-inf) is 2^-126, not 0
        store(sr + c, p);
        total += p;
      }
      for (int64_t c = full; c < nv; c += W) {
        vf p = keep_below(bf16 ? exp2v<5>(load(sr + c) - m_new) : exp2v(load(sr + c) - m_new),
                          static_cast<int>(visible - c));
        if (c < first) p = keep_from(p, static_cast<int>(first - c));
        store(sr + c, p);
        total += p;
      }
      sc.l[r] = sc.l[r] * alpha + hsum(total);
      if (alpha != 1.f) {
        float* orow = o + r * Dp;
        const vf a = splat(alpha);
        for (int64_t d = 0; d < Dp; d += W) store(orow + d, load(orow + d) * a);
      }
      sc.m[r] = row_max;
    }
    if (pb.q16 == nullptr) {
      pv_block(s, BK, 1, v + c0 * Dp, Dp, n, rows, Dp, o, Dp);
    } else {
#ifdef ATTNBENCH_BF16
      const int64_t kv = b * pb.kv_heads + hkv;
      pv_block_bf16(s, BK, reinterpret_cast<uint16_t*>(sc.q), pb.v16 + (kv * pb.skp + c0) * Dp, n, rows, Dp, o);
#endif
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    const float inv = sc.l[r] > 0.f ? 1.f / sc.l[r] : 0.f;  // a row with no visible key outputs zeros
    const vf a = splat(inv);
    for (int64_t d = 0; d < Dp; d += W) store(out + r * Dp + d, load(o + r * Dp + d) * a);
    if (pb.lse != nullptr)  // the backward's P = exp(score - lse); base 2 inside, natural log outside
      pb.lse[(b * pb.heads + h) * pb.seq_q + i0 + r] =
          sc.l[r] > 0.f ? (sc.m[r] + std::log2(sc.l[r])) * 0.6931471805599453f
                        : -std::numeric_limits<float>::infinity();
  }
}

bool valid(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
           int64_t dp, int64_t mask, const int64_t* lengths, int64_t block_q, int64_t block_k, int64_t nthreads,
           const float* scratch) {
  return batch >= 1 && heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 && seq_q >= 1 && seq_k >= 1 &&
         head_dim >= 1 && dp >= head_dim && dp % W == 0 && block_q >= 1 && block_k >= PANEL &&
         block_k % PANEL == 0 && mask >= NONE && mask <= RANGES && (mask != PADDING || lengths != nullptr) &&
         nthreads >= 1 && scratch != nullptr;
}

// Packs (pack(p) for p in [0, packs), shared over the team), then the work items (batch, head, query
// block), largest first, from an atomic counter. Returns 0, or 2 when the work list could not be allocated.
template <typename Pack>
int launch(const Problem& pb, int64_t packs, Pack pack, int64_t nthreads, float* scratch, int64_t* tiles) {
  struct Item {
    int64_t b, h, i0, cost;
  };
  std::vector<Item> items;
  try {
    const int64_t blocks = (pb.seq_q + pb.block_q - 1) / pb.block_q;
    items.reserve(pb.batch * pb.heads * blocks);
    for (int64_t b = 0; b < pb.batch; ++b)
      for (int64_t i = 0; i < blocks; ++i) {
        const int64_t i0 = i * pb.block_q, last = std::min(pb.seq_q, i0 + pb.block_q) - 1;
        const int64_t keys = std::max(pb.limit(b, i0), pb.limit(b, last));
        for (int64_t h = 0; h < pb.heads; ++h) items.push_back({b, h, i0, keys * (last - i0 + 1)});
      }
  } catch (...) {
    return 2;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });

  std::atomic<int64_t> next{0};
  std::atomic<int64_t> computed{0};
  const int64_t per_thread = scratch_floats(pb.block_q, pb.block_k, pb.head_dim, pb.dp);
  auto worker = [&](int64_t t) {
    Scratch sc(pb, scratch + t * per_thread);
    for (int64_t k; (k = next.fetch_add(1)) < static_cast<int64_t>(items.size());)
      run_item(pb, items[k].b, items[k].h, items[k].i0, sc);
    computed += sc.tiles;
  };
  const int64_t team = std::min<int64_t>(nthreads, static_cast<int64_t>(items.size()));
#ifdef _OPENMP
  // torch's own OpenMP runtime (libgomp.so.1 is already loaded by torch, so this library binds to it):
  // the team is torch's intra-op pool, hot and not competing with it for the cores.
#pragma omp parallel num_threads(static_cast<int>(team))
  {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < packs; ++p) pack(p);  // all of the packing, then the for's barrier
    worker(omp_get_thread_num());
  }
#else
  for (int64_t p = 0; p < packs; ++p) pack(p);
  std::vector<std::thread> threads;
  try {
    for (int64_t t = 1; t < team; ++t) threads.emplace_back(worker, t);
  } catch (...) {
    // fewer threads than asked: the ones that started (and this one) still finish every item
  }
  worker(0);
  for (auto& t : threads) t.join();
#endif
  if (tiles != nullptr) *tiles = computed.load();
  return 0;
}

}  // namespace

extern "C" {

// What the forward takes beyond the four masks (null: nothing): per-row key ranges for mask RANGES (4), lo
// and hi (B, Sq) int64, row i of batch b seeing keys [lo, hi); softcap > 0: scores ← softcap·tanh(scores /
// softcap); alibi (H floats, or null): scores −= alibi[h]·|i + Sk − Sq − j|. Scores here are q·kᵀ·scale.
struct ForwardExtras {
  const int64_t* lo;
  const int64_t* hi;
  float softcap;
  const float* alibi;
};
}

namespace {

bool valid_extras(int64_t mask, const ForwardExtras* extras) {
  if (mask != RANGES) return true;
  return extras != nullptr && extras->lo != nullptr && extras->hi != nullptr;
}

void with_extras(Problem& pb, const ForwardExtras* extras) {
  if (extras == nullptr) return;
  pb.rows.lo = extras->lo;
  pb.rows.hi = extras->hi;
  pb.softcap2 = extras->softcap > 0.f ? extras->softcap * 1.4426950408889634f : 0.f;
  pb.alibi2_storage.clear();
  if (extras->alibi != nullptr) {
    for (int64_t h = 0; h < pb.heads; ++h) pb.alibi2_storage.push_back(extras->alibi[h] * 1.4426950408889634f);
    pb.alibi2 = pb.alibi2_storage.data();
  }
}

}  // namespace

extern "C" {

// Floats of scratch one thread needs; attnbench_fused_forward takes nthreads times this.
int64_t attnbench_fused_scratch_floats(int64_t block_q, int64_t block_k, int64_t head_dim, int64_t dp) {
  return scratch_floats(block_q, block_k, head_dim, dp);
}

// Keys kt holds per kv head: seq_k rounded up to whole panels. kt takes batch · kv_heads · head_dim times this.
int64_t attnbench_fused_packed_keys(int64_t seq_k) { return (seq_k + PANEL - 1) / PANEL * PANEL; }

// Returns 0 on success, 1 on bad arguments, 2 when memory for the work list could not be allocated.
// *tiles (when not null) receives the number of score entries computed: the block-skipping evidence.
// lse (when not null, (B, H, Sq)) receives each row's natural log-sum-exp, which the backward needs.

int attnbench_fused_forward(const float* q, const float* k, float* kt, const float* v, float* out, float* lse,
                            int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k,
                            int64_t head_dim, int64_t dp, float scale, int64_t mask, const int64_t* lengths,
                            const ForwardExtras* extras, int64_t block_q, int64_t block_k, int64_t nthreads,
                            float* scratch, int64_t* tiles) {
  if (!valid(batch, heads, kv_heads, seq_q, seq_k, head_dim, dp, mask, lengths, block_q, block_k, nthreads, scratch) ||
      !valid_extras(mask, extras))
    return 1;
  const int64_t skp = attnbench_fused_packed_keys(seq_k), per_head = skp / PANEL;
  Problem pb{q, k, kt, v, out, lse, batch, heads, kv_heads, seq_q, seq_k, head_dim, skp, dp,
                   scale * 1.4426950408889634f, RowLimits{mask, seq_q, seq_k, lengths}, block_q, block_k};
  with_extras(pb, extras);
  auto pack = [&](int64_t p) {  // panel p % per_head of kv head p / per_head
    pack_panel(k + (p / per_head) * seq_k * head_dim, seq_k, head_dim, p % per_head, kt + p * PANEL * head_dim);
  };
  return launch(pb, batch * kv_heads * per_head, pack, nthreads, scratch, tiles);
}

// 1 when this build has the bfloat16 forward (AVX512-BF16), else 0.
int attnbench_fused_has_bf16() {
#ifdef ATTNBENCH_BF16
  return 1;
#else
  return 0;
#endif
}

// As attnbench_fused_forward for bfloat16 q (B, H, Sq, D), k and v (B, Hkv, Sk, D), D even, all given as raw
// bits; kt16 and v16 are scratch of B·Hkv·packed_keys(Sk)·D and ·Dp bf16 the kernel packs into. out is
// float32 (B, H, Sq, Dp). Returns 3 when this build has no bf16 forward.
int attnbench_fused_forward_bf16(const uint16_t* q, const uint16_t* k, uint16_t* kt16, const uint16_t* v,
                                 uint16_t* v16, float* out, float* lse, int64_t batch, int64_t heads,
                                 int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t head_dim, int64_t dp,
                                 float scale, int64_t mask, const int64_t* lengths, const ForwardExtras* extras,
                                 int64_t block_q, int64_t block_k, int64_t nthreads, float* scratch,
                                 int64_t* tiles) {
#ifdef ATTNBENCH_BF16
  if (!valid(batch, heads, kv_heads, seq_q, seq_k, head_dim, dp, mask, lengths, block_q, block_k, nthreads,
             scratch) ||
      !valid_extras(mask, extras) || head_dim % 2 != 0)
    return 1;
  const int64_t skp = attnbench_fused_packed_keys(seq_k), per_head = skp / PANEL, kv = batch * kv_heads;
  Problem pb{nullptr, nullptr, nullptr, nullptr, out, lse, batch, heads, kv_heads, seq_q, seq_k, head_dim, skp, dp,
             scale * 1.4426950408889634f, RowLimits{mask, seq_q, seq_k, lengths}, block_q, block_k};
  with_extras(pb, extras);
  pb.q16 = q;
  pb.kt16 = kt16;
  pb.v16 = v16;
  const int64_t pairs = skp / 2;
  auto pack = [&](int64_t p) {  // kᵀ panel p, or for p ≥ the panels, a run of PANEL / 2 key pairs of v
    if (p < kv * per_head) {
      pack_panel_bf16(k + (p / per_head) * seq_k * head_dim, seq_k, head_dim, p % per_head,
                      kt16 + p * PANEL * head_dim);
      return;
    }
    const int64_t run = p - kv * per_head, head = run / per_head;
    for (int64_t c = run % per_head * (PANEL / 2); c < (run % per_head + 1) * (PANEL / 2); ++c)
      pack_pair_bf16(v + head * seq_k * head_dim, seq_k, head_dim, dp, c, v16 + (head * pairs + c) * dp * 2);
  };
  return launch(pb, 2 * kv * per_head, pack, nthreads, scratch, tiles);
#else
  (void)q, (void)k, (void)kt16, (void)v, (void)v16, (void)out, (void)lse, (void)batch, (void)heads, (void)kv_heads;
  (void)extras;
  (void)seq_q, (void)seq_k, (void)head_dim, (void)dp, (void)scale, (void)mask, (void)lengths, (void)block_q;
  (void)block_k, (void)nthreads, (void)scratch, (void)tiles;
  return 3;
#endif
}

}  // extern "C"
