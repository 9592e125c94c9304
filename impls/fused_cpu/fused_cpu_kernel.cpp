// attnbench fused_cpu: FlashAttention-style forward on the CPU, float32 (and bfloat16 products where the
// CPU has AVX512-BF16, fused_cpu_bf16.h).
//
// out = softmax(q·kᵀ·scale + mask)·v, computed for work items of up to block_q query rows, six rows (GROUP)
// at a time against blocks of block_k keys, with the online-softmax recurrence (running row max m, running
// denominator l, rescaled output accumulator), so no more than a GROUP × block_k tile of scores exists per
// group; the softmax of one group runs inside the previous group's P·V (fused_cpu_pipeline.h).
//
// Layouts (prepared by impls/fused_cpu/__init__.py, all float32, contiguous):
//   q   (B, H,   Sq, D)     read as is; query head h uses kv head h / (H / Hkv) (GQA)
//   k   (B, Hkv, Sk, D)     read once, to fill kt
//   kt  (B, Hkv, Skp/64, D, 64)  scratch the kernel fills as it goes: kᵀ in panels of 64 keys, each panel
//                           contiguous (16 KiB at D=64) so that it stays in L1 while every row of a
//                           query block reads it; the key axis padded with zeros to a multiple of 64
//   v   (B, Hkv, Sk, Dp)    values, head dim padded with zeros to a multiple of 16
//   out (B, H,   Sq, Dp)
// Every mask gives each query row one range of visible keys [first(row), limit(row)) (RowLimits). A group
// scores only the 64-key panels some row of it sees, which is how causal does half the work and a window
// work proportional to its width; inside a boundary panel the scores outside a row's range are dropped.
// Rows with no visible key output zeros.
//
// Vectors are GCC/Clang vector extensions 16 floats wide: one AVX-512 register when built with
// -march=native on such a CPU, two AVX2 registers (or four SSE) elsewhere. Scores are kept in base 2
// (q is pre-multiplied by scale·log2 e) so the exponential is exp2 (exp2_table; exp2fit3 in bf16).
// Threads: an OpenMP team of nthreads (torch's own pool, see the end of the file; std::threads when
// built without OpenMP) takes work items (batch, head, query block) from an atomic counter, largest first.

#include <functional>
#include <memory>

#include "fused_cpu_pipeline.h"

namespace {

// kᵀ panels (and in bf16 also v's key pairs) packed on first use: panel p (of kv head p / per_head) by the
// first thread whose work item needs it, while the others compute; one that finds it being packed waits. No
// packing phase before the work items, no barrier, and the panel is still in the packer's cache when used.
struct Packer {
  std::unique_ptr<std::atomic<uint8_t>[]> state;  // per panel: 0 to pack, 1 being packed, 2 ready
  std::function<void(int64_t)> pack;
  int64_t per_head = 0;

  bool ready(int64_t kv, int64_t c0) const {
    return c0 / PANEL < per_head && state[kv * per_head + c0 / PANEL].load(std::memory_order_acquire) == 2;
  }

  // The panels of keys [c0, c1) of kv head kv, ready when this returns.
  void ensure(int64_t kv, int64_t c0, int64_t c1) {
    for (int64_t i = c0 / PANEL; i < std::min(per_head, (c1 + PANEL - 1) / PANEL); ++i) {
      std::atomic<uint8_t>& at = state[kv * per_head + i];
      if (at.load(std::memory_order_acquire) == 2) continue;
      uint8_t expected = 0;
      if (at.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        pack(kv * per_head + i);
        at.store(2, std::memory_order_release);
      } else {
        while (at.load(std::memory_order_acquire) != 2) std::this_thread::yield();
      }
    }
  }
};

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
  int64_t khs = 0;  // elements from one kv head of the caller's k to the next (as the packer reads it)
  const uint16_t *k16 = nullptr, *v16_rows = nullptr;  // bfloat16: the caller's k and v, as the packer reads them
  // score modifiers, applied to the scaled scores before the mask (in base 2: multiplied by log2 e)
  float softcap2 = 0.f;          // softcap·log2(e): s ← softcap2·tanh(s / softcap2); 0 = off
  const float* alibi2 = nullptr;  // per query head, slope·log2(e): s −= slope2·|i + Sk − Sq − j|; null = off
  std::vector<float> alibi2_storage;
  const float* sinks = nullptr;  // per query head, the learned sink logit (natural log); null = none
  int64_t vs = 0;                // v: elements from one v row to the next (dp, or Dv in bf16, unless a strided view)
  int64_t vhs = 0;               // v: elements from one kv head (b · Hkv + h) to the next (Sk · vs if dense)
  Packer* packer = nullptr;  // set by launch

  int64_t limit(int64_t b, int64_t i) const { return rows.limit(b, i); }
};

constexpr int64_t GROUP = TILE_ROWS;  // query rows that go through a step (scores, softmax, P·V) together

// Per-thread working memory, carved from the caller's buffer (torch allocates it, so the benchmark's
// memory measurement sees it): the item's scaled q rows, output accumulator, row max and lane-wise partial
// row sums; two group tiles (the pipeline's current and previous group), each with its bf16 copy and its
// lane-wise row maxima; then each row's key range (int64, after an even float count).
int64_t scratch_floats(int64_t block_q, int64_t block_k, int64_t head_dim, int64_t dp) {
  const int64_t floats = block_q * (head_dim + dp + 1 + W) + 2 * GROUP * (block_k + block_k / 2 + W);
  return floats + floats % 2 + 4 * block_q;
}

struct Scratch {
  float *q, *o, *m, *l;
  float* s[2];
  uint16_t* p16[2];
  float* tile_max[2];
  int64_t *lo, *hi;
  int64_t tiles = 0;  // score entries computed, for the block-skipping check
  Scratch(const Problem& pb, float* base) {
    const int64_t bq = pb.block_q, bk = pb.block_k;
    float* at = base;
    auto take = [&at](int64_t count) {
      float* start = at;
      at += count;
      return start;
    };
    q = take(bq * pb.head_dim);
    o = take(bq * pb.dp);
    m = take(bq);
    l = take(bq * W);
    for (int t = 0; t < 2; ++t) {
      s[t] = take(GROUP * bk);
      p16[t] = reinterpret_cast<uint16_t*>(take(GROUP * bk / 2));
      tile_max[t] = take(GROUP * W);
    }
    at += (at - base) % 2;
    lo = reinterpret_cast<int64_t*>(at);
    hi = lo + bq;
  }
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

// Work item (batch b, head h, query rows [i0, i0 + block_q)) and its kv head.
struct Item {
  int64_t b, h, i0, kv;
};

// One group's scores in one block of keys: rows [g0, g0 + rows) of the item against keys [cs, cs + n), nv
// score columns (n rounded up to 16; kt is padded), in tile buffer `buf`. Fast: every column visible to
// every row and no score modifier, so the exponentials can wait in an ExpJob.
struct Tile {
  int64_t g0, rows, cs, n, nv;
  int buf;
  bool fast;
};

// The scores of rows [g0, g0 + R) against keys [c0, c0 + block_k) — only from the group's first visible
// panel to its last visible key — into tile buffer buf, with their lane-wise row maxima. False when no row
// of the group sees a key there.
bool scores(const Problem& pb, const Item& it, int64_t g0, int64_t R, int64_t c0, int buf, Scratch& sc, Tile& t) {
  const int64_t D = pb.head_dim, BK = pb.block_k;
  int64_t glo = pb.seq_k, ghi = 0;
  bool every = true;  // every row sees every key of the block
  for (int64_t r = g0; r < g0 + R; ++r) {
    if (sc.lo[r] < sc.hi[r]) glo = std::min(glo, sc.lo[r]), ghi = std::max(ghi, sc.hi[r]);
    every = every && sc.lo[r] <= c0 && sc.hi[r] >= c0 + BK;
  }
  const int64_t cs = std::max(c0, glo / PANEL * PANEL), ce = std::min(c0 + BK, ghi);
  if (cs >= ce) return false;
  const int64_t n = ce - cs, nv = (n + W - 1) / W * W;
  t = Tile{g0, R, cs, n, nv, buf, every && pb.softcap2 == 0.f && pb.alibi2 == nullptr};
  float* s = sc.s[buf];
  std::fill(sc.tile_max[buf], sc.tile_max[buf] + R * W, -std::numeric_limits<float>::infinity());
  for (int64_t pc = cs; pc < cs + nv; pc += PANEL) {
    const int vecs = static_cast<int>(std::min<int64_t>(TILE_VECS, (cs + nv - pc) / W));
    if (pb.q16 == nullptr) {
      QK[R - 1][vecs - 1](sc.q + g0 * D, D, pb.kt + (it.kv * pb.skp + pc) * D, PANEL, D, s + (pc - cs), BK,
                          sc.tile_max[buf]);
    } else {
#ifdef ATTNBENCH_BF16
      const int64_t row0 = (it.b * pb.heads + it.h) * pb.seq_q + it.i0 + g0;
      QK_BF16[R - 1][vecs - 1](pb.q16 + row0 * D, D, pb.kt16 + (it.kv * pb.skp + pc) * D, D / 2, pb.scale_log2,
                               s + (pc - cs), BK, sc.tile_max[buf]);
#endif
    }
  }
  sc.tiles += R * nv;
  return true;
}

// Row r of the tile has a new max m_new: O's row and the lane sums scaled by 2^(m_old − m_new) (0 on the row's
// first visible tile, where m_old = −inf).
void raise_max(const Problem& pb, Scratch& sc, int64_t row, float m_new) {
  const float alpha = std::exp2(sc.m[row] - m_new);
  const vf a = splat(alpha);
  store(sc.l + row * W, load(sc.l + row * W) * a);
  float* o = sc.o + row * pb.dp;
  for (int64_t d = 0; d < pb.dp; d += W) store(o + d, load(o + d) * a);
  sc.m[row] = m_new;
}

// A fast tile: each row's new max from the lane maxima, O rescaled where it rose; the exponentials become
// the returned job (p = 2^(s − m) in place, sums into l; in bf16 also the bf16 copy for P·V).
ExpJob prepare(const Problem& pb, const Tile& t, Scratch& sc) {
  for (int64_t r = 0; r < t.rows; ++r) {
    const float m_new = hmax(load(sc.tile_max[t.buf] + r * W));
    if (m_new > sc.m[t.g0 + r]) raise_max(pb, sc, t.g0 + r, m_new);
  }
  ExpJob job;
  job.s = sc.s[t.buf];
  job.p16 = pb.q16 == nullptr ? nullptr : sc.p16[t.buf];
  job.lds = pb.block_k;
  job.m = sc.m + t.g0;
  job.l = sc.l + t.g0 * W;
  job.rows = t.rows;
  job.vecs = t.nv / W;
  return job;
}

// Any other tile (a mask boundary inside it, a score modifier): the softmax now, row by row, only the visible
// columns counting; in bf16 then rounded into the bf16 copy.
void softmax_now(const Problem& pb, const Item& it, const Tile& t, Scratch& sc) {
  const bool modified = pb.softcap2 != 0.f || pb.alibi2 != nullptr;
  const bool bf16 = pb.q16 != nullptr;  // P is rounded to bf16: a shorter exp2 polynomial is exact enough
  for (int64_t r = 0; r < t.rows; ++r) {
    float* sr = sc.s[t.buf] + r * pb.block_k;
    const int64_t row = t.g0 + r;
    const int64_t visible = std::clamp<int64_t>(sc.hi[row] - t.cs, 0, t.n);
    const int64_t first = std::clamp<int64_t>(sc.lo[row] - t.cs, 0, t.n);
    if (visible <= first) {
      std::memset(sr, 0, sizeof(float) * t.nv);
      continue;
    }
    if (modified) modify_scores(pb, it.h, it.i0 + row, t.cs, sr, t.nv);
    for (int64_t c = 0; c < first; ++c) sr[c] = -std::numeric_limits<float>::infinity();
    const int64_t full = visible / W * W;
    vf vmax = splat(-std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < full; c += W) {
      const vf x = load(sr + c);
      vmax = x > vmax ? x : vmax;
    }
    float row_max = hmax(vmax);
    for (int64_t c = full; c < visible; ++c) row_max = std::max(row_max, sr[c]);
    if (row_max > sc.m[row]) raise_max(pb, sc, row, row_max);
    const vf mv = splat(sc.m[row]);
    vf total = vf{};
    for (int64_t c = 0; c < t.nv; c += W) {
      vf p = bf16 ? exp2fit3(load(sr + c) - mv) : exp2_table(load(sr + c) - mv);
      if (c + W > visible) p = keep_below(p, static_cast<int>(visible - c));
      if (c < first) p = keep_from(p, static_cast<int>(first - c));  // exp2(-inf) is 2^-126 here, not 0
      store(sr + c, p);
      total += p;
    }
    store(sc.l + row * W, load(sc.l + row * W) + total);
  }
#ifdef ATTNBENCH_BF16
  if (bf16) round_rows_bf16(sc.s[t.buf], pb.block_k, sc.p16[t.buf], t.rows, t.nv);
#endif
}

// O += P·V for a tile whose P is complete, with the next tile's exponentials spread over it.
void accumulate(const Problem& pb, const Item& it, const Tile& t, Scratch& sc, ExpJob& job) {
  const int64_t Dp = pb.dp;
  if (pb.q16 == nullptr) {
    pv_group_exp(sc.s[t.buf], pb.block_k, pb.v + it.kv * pb.vhs + t.cs * pb.vs, pb.vs, t.n, t.rows, Dp,
                 sc.o + t.g0 * Dp, Dp, job);
  } else {
#ifdef ATTNBENCH_BF16
    pv_group_bf16_exp(sc.p16[t.buf], pb.block_k, pb.v16 + (it.kv * pb.skp + t.cs) * Dp, t.n, t.rows, Dp,
                      sc.o + t.g0 * Dp, job);
#endif
  }
}

// Part `part` of `parts` of the key block from key c1 (its kᵀ panels and v rows) brought into L2 ahead of use:
// the groups of the current block each prefetch a share, so the next block's first group finds it there
// instead of waiting on L3 for every line. Packed panels once packed (the block's first panel says); before
// that, the caller's k and v rows that the packer will read.
void prefetch_block(const Problem& pb, const Item& it, int64_t c1, int64_t part, int64_t parts) {
  const int64_t keys = std::min(pb.block_k, pb.seq_k - c1);
  if (keys <= 0) return;
  const bool packed = pb.packer->ready(it.kv, c1);
  const char* regions[2];
  int64_t bytes[2];
  if (pb.q16 == nullptr) {  // kᵀ's panels once packed, else the k rows the packer will read
    regions[0] = packed ? reinterpret_cast<const char*>(pb.kt + (it.kv * pb.skp + c1) * pb.head_dim)
                        : reinterpret_cast<const char*>(pb.k + it.kv * pb.khs + c1 * pb.head_dim);
    regions[1] = reinterpret_cast<const char*>(pb.v + it.kv * pb.vhs + c1 * pb.vs);
    bytes[0] = keys * pb.head_dim * 4, bytes[1] = keys * pb.vs * 4;
  } else if (packed) {
    regions[0] = reinterpret_cast<const char*>(pb.kt16 + (it.kv * pb.skp + c1) * pb.head_dim);
    regions[1] = reinterpret_cast<const char*>(pb.v16 + (it.kv * pb.skp + c1) * pb.dp);
    bytes[0] = keys * pb.head_dim * 2, bytes[1] = keys * pb.dp * 2;
  } else {  // the rows the packer will read (a latent cache's v rows lie inside its k rows: those lines hit)
    regions[0] = reinterpret_cast<const char*>(pb.k16 + it.kv * pb.khs + c1 * pb.head_dim);
    regions[1] = reinterpret_cast<const char*>(pb.v16_rows + it.kv * pb.vhs + c1 * pb.vs);
    bytes[0] = keys * pb.head_dim * 2, bytes[1] = keys * pb.vs * 2;
  }
  const int64_t lines = (bytes[0] + bytes[1]) / 64, from = lines * part / parts, to = lines * (part + 1) / parts;
  for (int64_t line = from; line < to; ++line) {
    const int64_t at = line * 64, region = at < bytes[0] ? 0 : 1;
    __builtin_prefetch(regions[region] + (region == 0 ? at : at - bytes[0]), 0, 2);
  }
}

// Work item (batch b, head h, query rows [i0, i0 + block_q)): for each block of keys from the item's first
// visible panel to its last visible key, the groups of GROUP rows in turn, pipelined — group g's scores,
// then group g − 1's P·V with group g's exponentials spread over it — so the block's kᵀ panels and v rows
// are shared by the groups while they are in cache. Then out = O / l and, when asked, each row's lse.
void run_item(const Problem& pb, int64_t b, int64_t h, int64_t i0, Scratch& sc) {
  const int64_t rows = std::min(pb.block_q, pb.seq_q - i0);
  const int64_t D = pb.head_dim, Dp = pb.dp;
  const Item it{b, h, i0, b * pb.kv_heads + h / (pb.heads / pb.kv_heads)};
  const float* q = pb.q16 == nullptr ? pb.q + ((b * pb.heads + h) * pb.seq_q + i0) * D : nullptr;
  float* out = pb.out + ((b * pb.heads + h) * pb.seq_q + i0) * Dp;

  int64_t key_begin = pb.seq_k, key_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    sc.lo[r] = pb.rows.first(b, i0 + r);
    sc.hi[r] = pb.limit(b, i0 + r);
    if (sc.lo[r] < sc.hi[r]) key_begin = std::min(key_begin, sc.lo[r]), key_end = std::max(key_end, sc.hi[r]);
    if (q != nullptr)
      for (int64_t d = 0; d < D; ++d) sc.q[r * D + d] = q[r * D + d] * pb.scale_log2;
    sc.m[r] = -std::numeric_limits<float>::infinity();
    store(sc.l + r * W, vf{});
  }
  std::memset(sc.o, 0, sizeof(float) * rows * Dp);
  for (int64_t c0 = key_begin / PANEL * PANEL; c0 < key_end; c0 += pb.block_k) {
    pb.packer->ensure(it.kv, c0, std::min(c0 + pb.block_k, key_end));
    Tile prev{};
    bool have_prev = false;
    int buf = 0;
    const int64_t groups = (rows + GROUP - 1) / GROUP;
    for (int64_t g0 = 0; g0 < rows; g0 += GROUP) {
      if (c0 + pb.block_k < key_end) prefetch_block(pb, it, c0 + pb.block_k, g0 / GROUP, groups);
      Tile t;
      if (!scores(pb, it, g0, std::min(GROUP, rows - g0), c0, buf, sc, t)) continue;
      ExpJob job;
      if (t.fast)
        job = prepare(pb, t, sc);
      else
        softmax_now(pb, it, t, sc);
      if (have_prev) accumulate(pb, it, prev, sc, job);
      job.finish();  // what the previous tile's P·V did not cover
      prev = t;
      have_prev = true;
      buf ^= 1;
    }
    ExpJob none;
    if (have_prev) accumulate(pb, it, prev, sc, none);
  }

  constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
  for (int64_t r = 0; r < rows; ++r) {
    float l = hsum(load(sc.l + r * W)), top = sc.m[r], weight = 1.f;  // O and l are relative to exp2(top)
    if (pb.sinks != nullptr && l > 0.f) {  // the sink joins the denominator: l·2^(m−top) + 2^(sink−top)
      const float sink2 = pb.sinks[h] * LOG2E;
      top = std::max(sc.m[r], sink2);
      weight = std::exp2(sc.m[r] - top);
      l = l * weight + std::exp2(sink2 - top);
    }
    const float inv = l > 0.f ? weight / l : 0.f;  // a row with no visible key outputs zeros
    const vf a = splat(inv);
    for (int64_t d = 0; d < Dp; d += W) store(out + r * Dp + d, load(sc.o + r * Dp + d) * a);
    if (pb.lse != nullptr) {  // the backward's P = exp(score - lse); base 2 inside, natural log outside
      const float none = pb.sinks != nullptr ? pb.sinks[h] : -std::numeric_limits<float>::infinity();
      pb.lse[(b * pb.heads + h) * pb.seq_q + i0 + r] = l > 0.f ? (top + std::log2(l)) * LN2 : none;
    }
  }
}

bool valid(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
           int64_t dp, int64_t mask, const int64_t* lengths, int64_t block_q, int64_t block_k, int64_t nthreads,
           const float* scratch) {
  return batch >= 1 && heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0 && seq_q >= 1 && seq_k >= 1 &&
         head_dim >= 1 && dp >= 1 && dp % W == 0 && block_q >= 1 && block_k >= PANEL &&
         block_k % PANEL == 0 && mask >= NONE && mask <= RANGES && (mask != PADDING || lengths != nullptr) &&
         nthreads >= 1 && scratch != nullptr;
}

// The work items (batch, head, query block), largest first, from an atomic counter, each packing the panels
// it needs (pack(p) for panel p of the B·Hkv·skp/PANEL) on first use (Packer). Returns 0, or 2 when the work list or the
// panels' states could not be allocated.
template <typename Pack>
int launch(Problem& pb, Pack pack, int64_t nthreads, float* scratch, int64_t* tiles) {
  Packer packer;
  packer.per_head = pb.skp / PANEL;
  try {
    packer.state.reset(new std::atomic<uint8_t>[pb.batch * pb.kv_heads * packer.per_head]());
    packer.pack = pack;
  } catch (...) {
    return 2;
  }
  pb.packer = &packer;
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
  worker(omp_get_thread_num());
#else
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
// sinks (H floats, or null): learned sink logits, exp(sinks[h]) joins every row's denominator (and its lse).
// Views of k and v read in place (0: dense): v_stride, elements from one v row to the next (MLA's values are
// the first Dv channels of its latent keys); k_head_stride and v_head_stride, elements from one kv head
// (b · Hkv + h) to the next (a shared prefix: the first P keys of a longer cache). dv > 0: the bf16 forward's v
// row length (Dv, even) when it differs from D; 0: D.
struct ForwardExtras {
  const int64_t* lo;
  const int64_t* hi;
  float softcap;
  const float* alibi;
  const float* sinks;
  int64_t v_stride;
  int64_t dv;
  int64_t k_head_stride;
  int64_t v_head_stride;
};
}

namespace {

bool valid_extras(int64_t mask, const ForwardExtras* extras) {
  if (extras != nullptr && (extras->v_stride < 0 || extras->dv < 0 || extras->k_head_stride < 0 ||
                            extras->v_head_stride < 0))
    return false;
  if (mask != RANGES) return true;
  return extras != nullptr && extras->lo != nullptr && extras->hi != nullptr;
}

void with_extras(Problem& pb, const ForwardExtras* extras) {
  if (extras == nullptr) return;
  pb.sinks = extras->sinks;
  if (extras->v_stride > 0) pb.vs = extras->v_stride;
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
  pb.vs = dp;
  with_extras(pb, extras);
  pb.vhs = extras != nullptr && extras->v_head_stride > 0 ? extras->v_head_stride : seq_k * pb.vs;
  const int64_t khs = extras != nullptr && extras->k_head_stride > 0 ? extras->k_head_stride : seq_k * head_dim;
  if (pb.vs < dp || pb.vhs < seq_k * pb.vs || khs < seq_k * head_dim) return 1;
  pb.khs = khs;
  auto pack = [&](int64_t p) {  // panel p % per_head of kv head p / per_head
    pack_panel(k + (p / per_head) * khs, seq_k, head_dim, p % per_head, kt + p * PANEL * head_dim);
  };
  return launch(pb, pack, nthreads, scratch, tiles);
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
  const int64_t skp = attnbench_fused_packed_keys(seq_k), per_head = skp / PANEL;
  Problem pb{nullptr, nullptr, nullptr, nullptr, out, lse, batch, heads, kv_heads, seq_q, seq_k, head_dim, skp, dp,
             scale * 1.4426950408889634f, RowLimits{mask, seq_q, seq_k, lengths}, block_q, block_k};
  with_extras(pb, extras);
  const int64_t dv = extras != nullptr && extras->dv > 0 ? extras->dv : head_dim;
  const int64_t vs = extras != nullptr && extras->v_stride > 0 ? extras->v_stride : dv;
  const int64_t vhs = extras != nullptr && extras->v_head_stride > 0 ? extras->v_head_stride : seq_k * vs;
  const int64_t khs = extras != nullptr && extras->k_head_stride > 0 ? extras->k_head_stride : seq_k * head_dim;
  if (dv % 2 != 0 || dv > dp || vs < dv || vhs < seq_k * vs || khs < seq_k * head_dim) return 1;
  pb.q16 = q;
  pb.kt16 = kt16;
  pb.v16 = v16;
  pb.k16 = k, pb.v16_rows = v, pb.khs = khs, pb.vs = vs, pb.vhs = vhs;
  const int64_t pairs = skp / 2;
  auto pack = [&](int64_t p) {  // kᵀ panel p and the PANEL / 2 key pairs of v of the same keys
    const int64_t head = p / per_head;
    pack_panel_bf16(k + head * khs, seq_k, head_dim, p % per_head, kt16 + p * PANEL * head_dim);
    for (int64_t c = p % per_head * (PANEL / 2); c < (p % per_head + 1) * (PANEL / 2); ++c)
      pack_pair_bf16(v + head * vhs, seq_k, vs, dv, dp, c, v16 + (head * pairs + c) * dp * 2);
  };
  return launch(pb, pack, nthreads, scratch, tiles);
#else
  (void)q, (void)k, (void)kt16, (void)v, (void)v16, (void)out, (void)lse, (void)batch, (void)heads, (void)kv_heads;
  (void)extras;
  (void)seq_q, (void)seq_k, (void)head_dim, (void)dp, (void)scale, (void)mask, (void)lengths, (void)block_q;
  (void)block_k, (void)nthreads, (void)scratch, (void)tiles;
  return 3;
#endif
}

}  // extern "C"
