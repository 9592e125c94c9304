// attnbench fused_cpu: FlashAttention-2 backward on the CPU, float32.
//
// With P = softmax(S), S = q·kᵀ·scale + mask, O = P·v and the upstream gradient dO:
//   D_i  = Σ_d dO_id · O_id                      (one number per query row)
//   P_ij = exp(S_ij − lse_i)                     (recomputed from q, k and the forward's log-sum-exp)
//   dV   = Pᵀ·dO,   dP = dO·vᵀ,   dS = P ∘ (dP − D),   dQ = dS·k·scale,   dK = dSᵀ·q·scale
// with dK and dV summed over the query heads of a kv head (GQA). No S×S matrix exists: the kernel walks
// tiles of BQ query rows × BK keys and recomputes P tile by tile.
//
// Work split: one work item per (batch, kv head, key block of BK keys) owns that block's rows of dK and dV,
// so they are written with no atomics; inside it, the query heads of the group and the query blocks that
// see any of its keys go by in order (masked blocks skipped, the same prefix rule as the forward). dQ gets
// contributions from every key block, so each thread accumulates its own partial dQ (B, H, Sq, Dp) and the
// partials are summed at the end. That is the choice between the two FlashAttention-2 options: a second
// pass over (batch, head, query block) would recompute S and dP there (7 tile products instead of 5, 40 %
// more arithmetic) to avoid the partials; with the few threads of a CPU the partials cost T·B·H·Sq·Dp floats
// (O(S·D), 4 MiB per thread at B1 H8 S2048 D64) and one summing pass, which is cheaper than the products.
//
// Masks: the four prefix masks and per-row key ranges (RANGES, row_lo/row_hi (B, Sq)), as in the forward.
//
// Layouts (prepared by impls/fused_cpu/__init__.py, all float32, contiguous, head dim padded with zeros to Dp, a
// multiple of 16): q, out, dout, dq (B, H, Sq, Dp); k, v, dk, dv (B, Hkv, Sk, Dp); lse (B, H, Sq).

#include "fused_cpu_tiles.h"

namespace {

struct Backward {
  const float *q, *k, *v, *out, *dout, *lse;
  float *dq, *dk, *dv;
  int64_t batch, heads, kv_heads, seq_q, seq_k, dp, skp;
  float scale;
  RowLimits rows;
  int64_t block_q, block_k;
  // scratch, carved by the entry point
  float* kt = nullptr;        // (B, Hkv, Skp/PANEL, Dp, PANEL): kᵀ·scale·log2(e) in panels
  float* vt = nullptr;        // the same for vᵀ
  float* delta = nullptr;     // (B, H, Sq): D_i
  float* partials = nullptr;  // (T, B, H, Sq, Dp): each thread's dQ (before the factor scale)
};

// Per-thread tiles: P (then dS) and dP, BQ × BK each, and the lane-wise maxima qk_block keeps (unused here).
int64_t thread_floats(int64_t block_q, int64_t block_k) { return block_q * (2 * block_k + W); }

// Whether any of query rows [i0, i0 + rows) of batch b sees a key in [c0, c0 + n).
bool sees(const RowLimits& limits, int64_t b, int64_t i0, int64_t rows, int64_t c0, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    if (limits.limit(b, i0 + r) > c0 && limits.first(b, i0 + r) < c0 + n &&
        limits.first(b, i0 + r) < limits.limit(b, i0 + r))
      return true;
  return false;
}

// One work item: dK and dV for keys [c0, c0 + n) of kv head hkv of batch b, and this thread's share of dQ.
// Returns the number of score entries computed.
int64_t key_block(const Backward& pb, int64_t b, int64_t hkv, int64_t c0, float* tiles, float* dq_partial) {
  const int64_t Dp = pb.dp, BK = pb.block_k, BQ = pb.block_q;
  const int64_t n = std::min(BK, pb.seq_k - c0), nv = (n + W - 1) / W * W;  // kt, vt padded past n
  const int64_t kv = b * pb.kv_heads + hkv, group = pb.heads / pb.kv_heads;
  const float* kt = pb.kt + kv * pb.skp * Dp + c0 * Dp;  // c0 is a multiple of PANEL
  const float* vt = pb.vt + kv * pb.skp * Dp + c0 * Dp;
  const float* k = pb.k + (kv * pb.seq_k + c0) * Dp;
  float* dk = pb.dk + (kv * pb.seq_k + c0) * Dp;
  float* dv = pb.dv + (kv * pb.seq_k + c0) * Dp;
  std::memset(dk, 0, sizeof(float) * n * Dp);
  std::memset(dv, 0, sizeof(float) * n * Dp);
  float* p = tiles;                  // BQ × BK: P, then dS in place
  float* dp = p + BQ * BK;           // BQ × BK: dP
  float* unused_max = dp + BQ * BK;  // BQ × W
  int64_t computed = 0;

  for (int64_t h = hkv * group; h < (hkv + 1) * group; ++h) {
    const int64_t row0 = (b * pb.heads + h) * pb.seq_q;
    for (int64_t i0 = 0; i0 < pb.seq_q; i0 += BQ) {
      const int64_t rows = std::min(BQ, pb.seq_q - i0);
      if (!sees(pb.rows, b, i0, rows, c0, n)) continue;
      const float* q = pb.q + (row0 + i0) * Dp;
      const float* dout = pb.dout + (row0 + i0) * Dp;
      qk_block(q, Dp, kt, Dp, rows, nv, p, BK, unused_max);      // S in base 2
      qk_block(dout, Dp, vt, Dp, rows, nv, dp, BK, unused_max);  // dP = dO·vᵀ
      computed += rows * nv;
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = p + r * BK;
        float* dpr = dp + r * BK;
        const int64_t visible = std::clamp<int64_t>(pb.rows.limit(b, i0 + r) - c0, 0, n);
        const int64_t first = std::clamp<int64_t>(pb.rows.first(b, i0 + r) - c0, 0, n);
        if (visible <= first) {  // masked row (an empty row always is): P = dS = 0
          std::memset(pr, 0, sizeof(float) * nv);
          std::memset(dpr, 0, sizeof(float) * nv);
          continue;
        }
        const vf lse = splat(pb.lse[row0 + i0 + r] * 1.4426950408889634f);
        const vf delta = splat(pb.delta[row0 + i0 + r]);
        for (int64_t c = 0; c < nv; c += W) {
          vf x = exp2_table(load(pr + c) - lse);
          if (c + W > visible) x = keep_below(x, static_cast<int>(visible - c));
          if (c < first) x = keep_from(x, static_cast<int>(first - c));
          store(dpr + c, x * (load(dpr + c) - delta));  // dS
          store(pr + c, x);                             // P
        }
      }
      pv_block(p, 1, BK, dout, Dp, rows, n, Dp, dv, Dp);  // dV += Pᵀ·dO
      pv_block(dp, 1, BK, q, Dp, rows, n, Dp, dk, Dp);    // dK += dSᵀ·q
      pv_block(dp, BK, 1, k, Dp, n, rows, Dp, dq_partial + (row0 + i0) * Dp, Dp);  // dQ += dS·k
    }
  }
  const vf factor = splat(pb.scale);
  for (int64_t c = 0; c < n * Dp; c += W) store(dk + c, load(dk + c) * factor);
  return computed;
}

}  // namespace

extern "C" {

// Floats of scratch attnbench_fused_backward needs.
int64_t attnbench_fused_backward_scratch_floats(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q,
                                                int64_t seq_k, int64_t dp, int64_t block_q, int64_t block_k,
                                                int64_t nthreads) {
  const int64_t skp = (seq_k + PANEL - 1) / PANEL * PANEL;
  return 2 * batch * kv_heads * skp * dp + batch * heads * seq_q * (1 + nthreads * dp) +
         nthreads * thread_floats(block_q, block_k);
}

// dq, dk, dv of attention (see the top of the file); returns 0 on success, 1 on bad arguments, 2 when
// memory for the work list could not be allocated. *tiles (when not null) receives the number of score
// entries computed (per pass over the tiles: S and dP are each that many).
int attnbench_fused_backward(const float* q, const float* k, const float* v, const float* out, const float* dout,
                             const float* lse, float* dq, float* dk, float* dv, int64_t batch, int64_t heads,
                             int64_t kv_heads, int64_t seq_q, int64_t seq_k, int64_t dp, float scale, int64_t mask,
                             const int64_t* lengths, const int64_t* row_lo, const int64_t* row_hi, int64_t block_q,
                             int64_t block_k, int64_t nthreads, float* scratch, int64_t* tiles) {
  if (batch < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || seq_q < 1 || seq_k < 1 || dp < W ||
      dp % W != 0 || block_q < 1 || block_k < PANEL || block_k % PANEL != 0 || mask < NONE || mask > RANGES ||
      (mask == PADDING && lengths == nullptr) || (mask == RANGES && (row_lo == nullptr || row_hi == nullptr)) ||
      nthreads < 1 || scratch == nullptr)
    return 1;
  const int64_t skp = (seq_k + PANEL - 1) / PANEL * PANEL, q_rows = batch * heads * seq_q;
  Backward pb{q, k, v, out, dout, lse, dq, dk, dv, batch, heads, kv_heads, seq_q, seq_k, dp, skp, scale,
              RowLimits{mask, seq_q, seq_k, lengths, row_lo, row_hi}, block_q, block_k};
  pb.kt = scratch;
  pb.vt = pb.kt + batch * kv_heads * skp * dp;
  pb.delta = pb.vt + batch * kv_heads * skp * dp;
  pb.partials = pb.delta + q_rows;
  float* thread_tiles = pb.partials + nthreads * q_rows * dp;

  struct Item {
    int64_t b, hkv, c0, cost;
  };
  std::vector<Item> items;
  try {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t c0 = 0; c0 < seq_k; c0 += block_k) {
        int64_t cost = 0;  // score entries the item computes (per head of its group)
        for (int64_t i0 = 0; i0 < seq_q; i0 += block_q) {
          const int64_t rows = std::min(block_q, seq_q - i0);
          const int64_t n = std::min(block_k, seq_k - c0);
          cost += sees(pb.rows, b, i0, rows, c0, n) ? rows * n : 0;
        }
        if (cost > 0)
          for (int64_t hkv = 0; hkv < kv_heads; ++hkv) items.push_back({b, hkv, c0, cost});
        else  // no query row sees these keys: their gradients are zero
          for (int64_t hkv = 0; hkv < kv_heads; ++hkv) {
            const int64_t n = std::min(block_k, seq_k - c0), at = ((b * kv_heads + hkv) * seq_k + c0) * dp;
            std::memset(dk + at, 0, sizeof(float) * n * dp);
            std::memset(dv + at, 0, sizeof(float) * n * dp);
          }
      }
  } catch (...) {
    return 2;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });
  const int64_t team = std::max<int64_t>(1, std::min<int64_t>(nthreads, static_cast<int64_t>(items.size())));

  // Phase 1: pack kᵀ (scaled, so S comes out in base 2) and vᵀ; D_i; zero the partial dQs.
  const int64_t per_head = skp / PANEL, panels = batch * kv_heads * per_head;
  const float scale_log2 = scale * 1.4426950408889634f;
  team_for(nthreads, 2 * panels + q_rows, [&](int64_t i) {
    if (i < 2 * panels) {
      const int64_t panel = i % panels, head = panel / per_head;
      const float* src = (i < panels ? k : v) + head * seq_k * dp;
      float* dst = (i < panels ? pb.kt : pb.vt) + panel * PANEL * dp;
      pack_panel(src, seq_k, dp, panel % per_head, dst, i < panels ? scale_log2 : 1.f);
      return;
    }
    const int64_t row = i - 2 * panels;
    vf acc = vf{};
    for (int64_t d = 0; d < dp; d += W) acc += load(dout + row * dp + d) * load(out + row * dp + d);
    pb.delta[row] = hsum(acc);
    for (int64_t t = 0; t < team; ++t) std::memset(pb.partials + (t * q_rows + row) * dp, 0, sizeof(float) * dp);
  });

  // Phase 2: the key blocks, largest first, each thread into its own partial dQ.
  std::atomic<int64_t> next{0}, computed{0};
  on_team(team, [&](int64_t t) {
    float* tiles_t = thread_tiles + t * thread_floats(block_q, block_k);
    float* partial = pb.partials + t * q_rows * dp;
    int64_t mine = 0;
    for (int64_t i; (i = next.fetch_add(1)) < static_cast<int64_t>(items.size());)
      mine += key_block(pb, items[i].b, items[i].hkv, items[i].c0, tiles_t, partial);
    computed += mine;
  });

  // Phase 3: dQ = scale · Σ_t partial_t.
  team_for(nthreads, q_rows, [&](int64_t row) {
    const vf factor = splat(scale);
    for (int64_t d = 0; d < dp; d += W) {
      vf acc = vf{};
      for (int64_t t = 0; t < team; ++t) acc += load(pb.partials + (t * q_rows + row) * dp + d);
      store(dq + row * dp + d, acc * factor);
    }
  });
  if (tiles != nullptr) *tiles = computed.load();
  return 0;
}

}  // extern "C"
