// The partial-attention kernel: a CTA computes one (unit, kv head) item of a
// Plan (a persistent CTA several, one after another).
// Its Q rows (the unit's queries x the qo heads of the kv head) are staged once
// in shared memory; the unit's KV tokens (the concatenation of its segments)
// stream through a cp.async pipeline of K/V tiles of N tokens, gathered page
// by page (its depth is set per launch by the executor); S = Q K^T and
// O += P V run on tensor cores (mma.sync m16n8k16 via ldmatrix) with the
// online softmax in registers.
//
// Warps: kWarpsM row blocks of 16 rows x kWarpsN token slices. Small tiles
// (m = 16, 32: decode) split every KV tile across warps so that all warps
// stream KV, and the slices' softmax states are combined in shared memory at
// the end (as FlashInfer's decode kernel does).
//
// fp8 K/V (KV = __nv_fp8_e4m3): the pipeline stages hold the tiles as stored,
// one byte an element (half the HBM traffic). wgmma reads its operands from
// shared memory in T, so there each tile is converted into one K and one V
// tile of T after it lands. The mma.sync tiles convert in registers as they
// load their fragments (ldmatrix on the fp8 rows, then cvt), with no second
// copy: S = Q K^T takes head_dim in a permuted order, the same for Q and K
// (so each thread's K fragment is 4 consecutive bytes), and O = P V produces
// its columns permuted, undone when O is stored. k_scale is folded into the
// softmax scale and v_scale into the output (AttnParams), so the conversion
// is exact.
//
// Included only by the per-instantiation files in kernels/ (one TU each).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "exec/cuda/attention_params.hpp"
#include "exec/cuda/primitives/cp_async.cuh"
#include "exec/cuda/primitives/cta_trace.cuh"
#include "exec/cuda/primitives/fp8.cuh"
#include "exec/cuda/primitives/grid_dependency.cuh"
#include "exec/cuda/primitives/math.cuh"
#include "exec/cuda/primitives/mma.cuh"
#include "exec/cuda/primitives/wgmma.cuh"
#include "treeattn/plan.hpp"

namespace treeattn::cuda {

// The shared memory of the skip of unseen masked tiles (AttnTraits::
// kSkipUnseen): per segment, the warps whose real rows see it (bit w: warp
// w), per warp the segments its real rows see (bit k: segment k), both for
// masked units only; per row, the segments it sees (every unit: the other
// tiles keep their rows' in registers). None (an empty base) elsewhere.
template <bool kSkipUnseen, int M, int kWarps>
struct SmemSkip {
  uint32_t seg_warps[kMaxSegmentsPerUnit];
  uint64_t warp_sees[kWarps];
  uint64_t row_mask[M];
};
template <int M, int kWarps>
struct SmemSkip<false, M, kWarps> {};

// Bookkeeping shared memory of one CTA. Slot i of the ring describes the tile
// loaded into stage i % stages (the ring has one slot more than stages, so the
// slot for tile t + S can be filled while tile t is computed and tile t + S - 1
// is being issued).
template <int kMaxSlots, int N, int M, int WN, bool kSkipUnseen>
struct SmemMisc : SmemSkip<kSkipUnseen, M, M / 16 * WN> {
  SegDesc seg[kMaxSegmentsPerUnit];          // the unit's segment records
  uint64_t ent_mask[M];                      // the unit's entries (nent <= M rows)
  int32_t ent_query[M];
  int32_t ent_slot[M];
  int32_t row[kMaxSlots][N];                 // token row (page * page_size + slot), -1: past the end
  uint8_t pos_seg[kMaxSlots][N];             // segment of each position, 255: past the end (after row: 4-byte aligned)
  // Per 32 positions of a slot's tile: [0] the ballot of the positions that
  // need the mask; [1] (masked units of tiles that skip unseen tiles,
  // kSkipUnseen) the warps whose real rows see one of them (bit w: warp w).
  uint32_t tile_flag[kMaxSlots][N / 32][kSkipUnseen ? 2 : 1];
  float row_m[WN][M];                        // per-slice softmax state, log2 units
  float row_d[WN][M];
  int32_t next_item;                         // persistent launches: the item after this one
};

// kSkip_: the variant whose warpgroups skip masked tiles none of their rows
// see (kSkipUnseen below), compiled beside the plain one for the 128-row
// wgmma tile (CudaExecutor runs it for masked units only).
template <class T_, int D_, int M_, int N_, class KV_ = T_, bool kSkip_ = false>
struct AttnTraits {
  using T = T_;
  using KV = KV_;  // K/V pool element: T, or __nv_fp8_e4m3 converted to T per tile
  static constexpr bool kKvFp8 = !std::is_same_v<KV, T>;
  static constexpr int D = D_, M = M_, N = N_;
  static constexpr int kWarpsM = M / 16;
  // m = 16: 4 slices (2 with 32-token tiles), m = 32: 2; each slice takes
  // whole 16-token k-steps.
  static constexpr int kWarpsN = M >= 64 ? 1 : (64 / M < N / 16 ? 64 / M : N / 16);
  static constexpr int kWarps = kWarpsM * kWarpsN;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpTokens = N / kWarpsN;  // tokens of a tile one warp handles
  static constexpr int kChunks = D / 8;            // 16-byte chunks of a row
  static constexpr int kRowBytes = D * 2;
  static constexpr int kTileBytes = N * kRowBytes;  // one K or V tile of T, as the MMAs read it
  static constexpr int kQBytes = M * kRowBytes;
  static constexpr int kKvRowBytes = D * int(sizeof(KV));  // a token's K (V) row of one head, as stored
  static constexpr int kKvChunks = kKvRowBytes / 16;       // 16-byte chunks of it
  static constexpr int kStageBytes = N * kKvRowBytes;      // one K or V pipeline stage

  // The pipeline depth is chosen per launch by the executor (AttnParams::
  // stages): deep when few CTAs share an SM, shallow when occupancy matters.
  // Epilogue: each slice's unnormalised O in fp32, rows padded by 8 floats so
  // the quads of a warp hit distinct banks; overlaps Q and the K/V stages.
  // One stage (no overlap inside the CTA) is only chosen for launches whose
  // units have one tile, only for decode tiles (m <= 32), and only where the
  // epilogue scratch fits in Q + one K/V stage: it halves the K/V shared
  // memory of short decode CTAs, so more of them share an SM.
  static constexpr int kOStride = D + 8;
  static constexpr int kScratchBytes = kWarpsN * M * kOStride * 4;
  // 64- and 128-row tiles run on warpgroup MMA where the target has it
  // (sm_90a): one (two) warpgroups, K/V read from shared memory once per
  // warpgroup instead of once per warp. Elsewhere, and for m <= 32, mma.sync.
  // kWgmmaShape is the same in host and device passes (the host sizes shared
  // memory from it); kWgmma is what the device pass compiles.
  static constexpr bool kWgmmaShape = M % 64 == 0 && kWarpsN == 1;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static constexpr bool kWgmma = kWgmmaShape;
#else
  static constexpr bool kWgmma = false;
#endif
  // fp8: the tiles of wgmma's shape have the converted K and V tiles of T
  // (kConvBytes); the others convert in registers (kFp8InRegisters), their
  // stages swizzled for ldmatrix (kv8_offset).
  static constexpr bool kFp8InRegisters = kKvFp8 && !kWgmma;
  static constexpr int kConvBytes = kKvFp8 && kWgmmaShape ? 2 * kTileBytes : 0;
  // The fewest stages whose shared memory holds the epilogue scratch (1 only
  // for decode tiles, see above).
  static constexpr bool scratch_fits(int stages) { return kScratchBytes <= kQBytes + kConvBytes + 2 * stages * kStageBytes; }
  static constexpr int kMinStages = (M <= 32 && scratch_fits(1))   ? 1
                                    : scratch_fits(2)              ? 2
                                    : scratch_fits(3)              ? 3
                                                                   : 4,
                       kMaxStages = 6;
  // Small tiles at d <= 128 are capped at 128 registers (no spills): then a
  // 128-row CTA and a 16-row CTA share an SM's register file, so concurrent
  // launches of both overlap instead of queueing. The 32-token m = 16 variant
  // (2 warps, for units of at most 32 tokens) at 8 CTAs/SM keeps the same cap.
  // The 128-row wgmma tile at d <= 128 is capped at 128 registers too, for 2
  // CTAs/SM: it spills 16 bytes, and two CTAs per SM outrun one at 162
  // registers on the shared trees (docs/cuda.md, "Kernel").
  // Persistent launches (AttnParams::work) only for decode tiles at d <= 128,
  // whose launches have thousands of short items; the other tiles are at
  // their register caps (the item loop's state made the 128-row tile spill
  // 208 bytes, and m = 32 at d = 256 48 instead of 0).
  static constexpr bool kPersistent = M <= 32 && D <= 128;
  static constexpr int kMinBlocksPerSm =
      (M <= 16 && D <= 128) ? (N == 32 ? 8 : 4) : (kWgmma && M == 128 && D <= 128) ? 2 : 1;
  // Masked tiles that no row of a warpgroup sees are skipped by it (the K/V
  // loop): in the skip variant (kSkip_) of the 128-row wgmma tile only (one
  // warpgroup's rows are all of a smaller unit's, and each segment is seen by
  // some entry), and not with fp8 K/V, whose K/V loop would spill at its
  // 128-register cap. A variant of its own: the test, in the one loop, slows
  // the unmasked units' tiles too (ptxas schedules the loop differently).
  static constexpr bool kSkipUnseen = kSkip_ && kWgmmaShape && M == 128 && !kKvFp8;
  using Misc = SmemMisc<kMaxStages + 1, N, M, kWarpsN, kSkipUnseen>;
  // Layout: [misc][Q][converted K, V (fp8 only)][K stages][V stages]; every
  // tile starts 1024-byte aligned (the 128-byte swizzle repeats every 8 rows
  // of 128 bytes, and wgmma applies it to absolute shared addresses).
  static constexpr int kQOffset = (int(sizeof(Misc)) + 1023) / 1024 * 1024;
  static constexpr int smem_bytes(int stages) { return kQOffset + kQBytes + kConvBytes + 2 * stages * kStageBytes; }
  static_assert(M % 16 == 0 && M <= kMaxTileRows, "m must be a multiple of 16, at most 128");
  static_assert(kWarpTokens % 16 == 0, "each warp needs whole k-steps of 16 tokens");
  static_assert(N % 32 == 0 && N <= kThreads, "one filler thread per tile position");
  static_assert(D % 64 == 0, "the swizzle needs at least 8 chunks per row");
  static_assert(scratch_fits(kMinStages), "epilogue scratch must fit in Q + K/V");
  static_assert(kKvRowBytes % 16 == 0 && kStageBytes % 1024 == 0, "whole chunks per row, stages 1024-byte aligned");
  static_assert(smem_bytes(kMinStages) <= 227 * 1024, "shared memory of one CTA");
};

// cp.async.wait_group takes an immediate: the runtime pipeline depth picks one.
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    default: cp_async_wait<4>(); break;
  }
}

// Byte offset of 16-byte chunk c of row r in a [Rows][D] tile. The chunk
// index is XORed with r % 8 so that the 8 rows an ldmatrix phase reads (same
// logical chunk) and the 8 chunks a cp.async wavefront writes land in
// distinct banks. wgmma tiles use its 128-byte-swizzle layout (wgmma.cuh):
// D/64 regions of [Rows][64 elements]; mma.sync tiles keep whole rows
// together, which needs fewer registers for the addresses.
template <class Tr, int Rows>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  if constexpr (Tr::kWgmma)
    return uint32_t((c >> 3) * Rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
  else
    return uint32_t(r * Tr::kRowBytes + ((c ^ (r & 7)) << 4));
}
// mma.sync tiles: the shared address of chunk 2 kk + h of a row, from that of
// chunk h (k-step 0) at `row_h`, in a tile whose base is a multiple of the
// row bytes. The swizzle XORs the chunk with r % 8 and 2 kk leaves bit 0 to
// h, so (2 kk + h) ^ (r % 8) = 2 kk ^ (h ^ r % 8): the offset moves by an XOR
// with kk << 5, below the row bytes (kk < D / 16, rows 2 D bytes apart).
template <class Tr>
__device__ __forceinline__ uint32_t kstep_addr(uint32_t row_h, int kk) {
  static_assert(!Tr::kWgmma && (Tr::kRowBytes & (Tr::kRowBytes - 1)) == 0 && (Tr::D / 16 - 1) * 32 < Tr::kRowBytes,
                "whole-row layout, rows a power of two bytes, k-steps within a row");
  return row_h ^ uint32_t(kk << 5);
}

// Byte offset of 16-byte chunk c of token row r in an fp8 stage of the
// mma.sync tiles (kFp8InRegisters): rows as stored, the chunk index XORed with
// a key that differs for the 8 rows one ldmatrix phase reads, so that they
// hit distinct banks (64-byte rows: two rows per 128-byte line, key r / 2).
template <class Tr>
__device__ __forceinline__ uint32_t kv8_offset(int r, int c) {
  constexpr int kRowBytes = Tr::kKvRowBytes;
  static_assert(kRowBytes == 64 || kRowBytes == 128 || kRowBytes == 256, "fp8 rows of head_dim 64, 128 or 256");
  const int key = kRowBytes >= 128 ? (r & 7) : ((r >> 1) & 3);
  return uint32_t(r * kRowBytes + ((c ^ key) << 4));
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm) attention_kernel(const __grid_constant__ AttnParams p) {
  using T = typename Tr::T;
  using MmaT = Mma<T>;
  constexpr int D = Tr::D, M = Tr::M, N = Tr::N;
  constexpr int WN = Tr::kWarpsN, WM = Tr::kWarpsM, WT = Tr::kWarpTokens;
  constexpr int kThreads = Tr::kThreads, kChunks = Tr::kChunks;
  constexpr float kNegInf = -INFINITY;
  const int S = p.stages, kSlots = p.stages + 1;  // the executor keeps kMinStages <= S <= kMaxStages (1: one-tile units)

  // Chained runs (executor.cpp): the next launch in the stream (another
  // attention launch, which reads nothing this one writes, or the merge,
  // which waits on ctas_done) may take the SMs this one leaves free at once.
  launch_dependents();
  CtaTrace trace;
  trace.mark(kTraceStart);
  extern __shared__ __align__(1024) uint8_t smem[];
  auto& misc = *reinterpret_cast<typename Tr::Misc*>(smem);
  uint8_t* sQ = smem + Tr::kQOffset;
  uint8_t* sKc = sQ + Tr::kQBytes;  // fp8: the converted tiles
  uint8_t* sVc = sKc + Tr::kTileBytes;
  uint8_t* sK = sQ + Tr::kQBytes + Tr::kConvBytes;
  uint8_t* sV = sK + S * Tr::kStageBytes;
  if constexpr (Tr::kWgmma) {
    if (smem_addr(smem) & 1023) __trap();  // the swizzle of wgmma's operands needs 1024-byte alignment
  }

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % WM, wn = warp / WM;
  // Filler threads: position fill_pos of every tile (-1: none). The N / 32
  // filler warps are spread over the warpgroups and the SM's four schedulers
  // (warp i * stride + i % stride for i < N / 32): the lookups are the
  // largest per-tile work that only some warps do, and the CTA barrier at
  // each tile waits for the slowest warp.
  constexpr int kFillStride = Tr::kWarps / (N / 32);
  static_assert(kFillStride >= 1 && Tr::kWarps % (N / 32) == 0, "whole filler warps");
  const int fill_pos = warp % kFillStride == (warp / kFillStride) % kFillStride ? (warp / kFillStride) * 32 + lane : -1;
  constexpr bool kSkipUnseen = Tr::kSkipUnseen;
  const int Hkv = p.num_kv_heads, G = p.group, Hqo = p.num_qo_heads, ps = p.page_size;
  // Row r of a tile is head r % G of entry r / G (GQA packing).
  const auto entry_of_row = [&](int r) { return int(p.group_divisor.divide(uint32_t(r))); };
  // K/V copies: thread tid copies chunk copy_c of rows copy_r0 + k * kCopyRows.
  constexpr int kKvChunks = Tr::kKvChunks;
  constexpr int kCopyRows = kThreads / kKvChunks, kCopyPasses = N / kCopyRows;
  static_assert(kThreads % kKvChunks == 0 && N % kCopyRows == 0, "whole rows per pass, whole passes per tile");
  constexpr uint32_t kSwzRowBytes = Tr::kWgmma ? 128 : Tr::kRowBytes;  // swz(r + 1, c) - swz(r, c) within 8 rows
  const int copy_c = tid % kKvChunks, copy_r0 = tid / kKvChunks;
  const uint32_t token_bytes = p.kv_token_bytes;  // pool stride of one token row (>= Hkv * D elements)
  // Items are (unit, kv head) pairs: item i is units[i / Hkv] for kv head
  // i % Hkv. A CTA computes item blockIdx.x; in a persistent launch (p.work)
  // it then takes items gridDim.x + 0, 1, 2, ... in the order they are
  // claimed, and loads the next item's descriptor during this item's epilogue
  // (a short unit's CTA otherwise spends much of its life being launched and
  // on the descriptor -> page id -> K/V load chain).
  // A step executor's launch (p.counts) reads its units and their number
  // from the plan it uploaded last: its grid is fixed, so a CTA may have no
  // item at all.
  // (Read again where needed rather than kept in registers through the KV loop.)
  auto units = [&] { return p.counts ? p.units + p.counts[2 * p.launch_index] : p.units; };
  auto num_items = [&] {
    return p.counts ? (p.counts[2 * p.launch_last] + p.counts[2 * p.launch_last + 1] - p.counts[2 * p.launch_index]) * Hkv
                    : p.num_items;
  };
  const bool persistent = Tr::kPersistent && p.work != nullptr;
  int item = blockIdx.x;
  UnitDesc u{};
  const bool has_items = item < num_items();  // a step executor's fixed grid may leave a CTA none
  if (has_items) u = units()[item / Hkv];
  for (bool first_item = true; item < num_items(); first_item = false) {
    unsigned int claimed = 0;  // persistent: thread 0's claim of the next item, read after the KV loop
    const int kvh = item % Hkv;
    const int nseg = u.nseg, e0 = u.ent_off, len = u.len;
    const int nent = min(u.nent, M);
    const int rows = min(u.nent * G, M);  // the validator guarantees nent * G <= M
    const bool masked = u.any_missing != 0;
    const uint64_t any_missing = u.any_missing;

    // Resolving a tile's N positions (one filler thread each) to token rows of
    // the pool takes two steps, so that the page-table load is in flight for a
    // whole iteration before its result is needed: lookup() finds the segment
    // (binary search over the segment ends) and starts the load of the page id;
    // commit() writes the row, the segment and the mask flag into a slot.
    struct Lookup {
      int seg = 255, slot = 0, page = 0;  // seg 255: past the end of the unit; slot: the token's in its page
    };
    // early: a position of the first segment, before the records are in
    // shared memory (the record comes from the descriptor's registers; only
    // the prologue, so that they are not live in the main loop).
    auto lookup = [&](int t, bool early = false) {
      Lookup l;
      const int pos = t * N + fill_pos;
      if (fill_pos >= 0 && pos < len) {
        int lo = 0, hi = early ? 0 : nseg - 1;  // first s with end > pos (skips empty segments)
        while (lo < hi) {
          const int mid = (lo + hi) >> 1;
          if (misc.seg[mid].end > pos) hi = mid; else lo = mid + 1;
        }
        const SegDesc sg = early ? u.seg0 : misc.seg[lo];
        l.seg = lo;
        const int tok = sg.begin + pos - sg.pos, page_index = int(p.page_divisor.divide(uint32_t(tok)));
        l.slot = tok - page_index * ps;
        l.page = p.page_ids[sg.pbase + page_index];
      }
      return l;
    };
    // busy: the busy warps of masked units (kSkipUnseen) from seg_warps;
    // else every warp is marked busy (the prologue's tiles: seg_warps is not
    // there yet).
    auto commit = [&](const Lookup& l, int sl, bool busy) {
      if (fill_pos >= 0) {
        const bool valid = l.seg != 255;
        misc.row[sl][fill_pos] = valid ? l.page * p.rows_per_page + l.slot : -1;
        misc.pos_seg[sl][fill_pos] = uint8_t(l.seg);
        const bool need = !valid || ((any_missing >> (l.seg & 63)) & 1);
        const uint32_t b = __ballot_sync(0xffffffffu, need);
        if constexpr (kSkipUnseen) {
          // (b == 0: every real row sees these positions; b is warp-uniform.)
          const uint32_t warps = !busy || b == 0 || any_missing == 0
                                     ? ~0u
                                     : __reduce_or_sync(0xffffffffu, valid ? misc.seg_warps[l.seg & 63] : 0u);
          if (lane == 0) *reinterpret_cast<uint2*>(misc.tile_flag[sl][fill_pos / 32]) = make_uint2(b, warps);
        } else {
          if (lane == 0) misc.tile_flag[sl][fill_pos / 32][0] = b;
        }
      }
    };

    // Issues the cp.async copies of the K and V rows of the tile described by
    // slot sl into stage st; positions past the end are zero-filled (a masked
    // score times a V row of garbage could be NaN). A thread always copies the
    // same 16-byte chunk (column) of rows copy_r0, + kCopyRows, ...: its
    // global column offset and, where kCopyRows keeps r % 8, its swizzled
    // shared offset are fixed, so a copy costs a row load and two multiply-adds
    // (the generic index arithmetic took ~20 instructions per copy).
    // fp8 stages of wgmma tiles are plain [N][kKvRowBytes] rows, read once,
    // chunk by chunk in order, by the conversion (convert below); those of
    // mma.sync tiles are read by ldmatrix, swizzled (kv8_offset).
    const int64_t col_bytes = int64_t(kvh) * Tr::kKvRowBytes + copy_c * 16;
    const uint8_t* kcol = static_cast<const uint8_t*>(p.k) + col_bytes;
    const uint8_t* vcol = static_cast<const uint8_t*>(p.v) + col_bytes;
    auto issue = [&](int st, int sl) {
      uint8_t* dk = sK + st * Tr::kStageBytes;
      uint8_t* dv = sV + st * Tr::kStageBytes;
      const uint32_t so0 = Tr::kKvFp8 ? uint32_t(copy_r0 * Tr::kKvRowBytes + copy_c * 16) : swz<Tr, N>(copy_r0, copy_c);
#pragma unroll
      for (int k = 0; k < kCopyPasses; ++k) {
        const int r = copy_r0 + k * kCopyRows;
        const int row = misc.row[sl][r];
        const uint64_t off = uint64_t(uint32_t(max(row, 0))) * token_bytes;
        uint32_t so;
        if constexpr (Tr::kFp8InRegisters)
          so = kv8_offset<Tr>(r, copy_c);
        else if constexpr (Tr::kKvFp8)
          so = so0 + uint32_t(k * kCopyRows * Tr::kKvRowBytes);
        else
          so = kCopyRows % 8 == 0 ? so0 + k * kCopyRows * kSwzRowBytes : swz<Tr, N>(r, copy_c);
        cp_async_16_zfill(dk + so, kcol + off, row >= 0);
        cp_async_16_zfill(dv + so, vcol + off, row >= 0);
      }
    };
    // fp8 on wgmma: stage st -> the converted K and V tiles (T, swizzled as a
    // 16-bit stage is). Rows past the end were zero-filled and convert to
    // zeros. wgmma reads the whole tile from every warp: the CTA converts it
    // and waits at a CTA barrier.
    // In batches of up to 4 chunks, loads first: the chunks' load -> convert
    // -> store chains overlap instead of running one after another (more
    // than 4 chunks in registers spilled at the 128-register caps).
    constexpr int kConvIters = N * kKvChunks / kThreads;
    constexpr int kConvBatch = kConvIters < 4 ? kConvIters : 4;
    static_assert(!(Tr::kKvFp8 && Tr::kWgmma) || (N * kKvChunks % kThreads == 0 && kConvIters % kConvBatch == 0),
                  "whole conversion passes and batches");
    auto convert_tile = [&](const uint8_t* raw, uint8_t* dst) {
#pragma unroll
      for (int j0 = 0; j0 < kConvIters; j0 += kConvBatch) {
        uint4 x[kConvBatch];
#pragma unroll
        for (int j = 0; j < kConvBatch; ++j) x[j] = *reinterpret_cast<const uint4*>(raw + (tid + (j0 + j) * kThreads) * 16);
#pragma unroll
        for (int j = 0; j < kConvBatch; ++j) {
          const int i = tid + (j0 + j) * kThreads;
          const int r = i / kKvChunks, c = i % kKvChunks;
          uint4 lo, hi;
          fp8x16_to<T>(x[j], lo, hi);
          *reinterpret_cast<uint4*>(dst + swz<Tr, N>(r, 2 * c)) = lo;
          *reinterpret_cast<uint4*>(dst + swz<Tr, N>(r, 2 * c + 1)) = hi;
        }
      }
    };
    auto convert = [&](int st) {
      convert_tile(sK + st * Tr::kStageBytes, sKc);
      convert_tile(sV + st * Tr::kStageBytes, sVc);
    };

    // ---- the unit's segment records and entries -> shared memory. The first
    // segment comes with the descriptor: a one-segment unit's page lookups
    // depend on nothing else.
    if (tid == 0 && nseg > 0) misc.seg[0] = u.seg0;
    if (tid > 0 && tid < nseg) misc.seg[tid] = p.segs[u.seg_off + tid];
    for (int e = tid; e < nent; e += kThreads) {
      misc.ent_query[e] = p.entry_query[e0 + e];
      misc.ent_slot[e] = p.entry_slot[e0 + e];
      if (masked) misc.ent_mask[e] = p.entry_mask[e0 + e];
    }
    const int num_tiles = (len + N - 1) / N;
    // When the first S tiles lie in the first segment (every one-segment unit;
    // a flattened unit whose shared prefix is long enough) their page lookups
    // need nothing from shared memory: the loads go out now, together with the
    // entries' and segments' (one round trip fewer before the first K/V copy).
    Lookup first[Tr::kMaxStages];
    const bool early = D <= 128 && (nseg <= 1 || u.seg0.end >= min(S, num_tiles) * N);  // at d = 256 the registers spill
    if (early) {
#pragma unroll
      for (int t = 0; t < Tr::kMaxStages; ++t)
        if (t < S && t < num_tiles) first[t] = lookup(t, true);
    }
    __syncthreads();

    // ---- Q rows -> shared memory (cp.async group 0); padded rows are zeros.
    {
      const T* q = static_cast<const T*>(p.q);
      for (int i = tid; i < M * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks;
        const T* src = q;
        if (r < rows) {
          const int e = entry_of_row(r);
          src = q + int64_t(misc.ent_query[e]) * p.q_stride + (kvh * G + r - e * G) * D + c * 8;
        }
        cp_async_16_zfill(sQ + swz<Tr, M>(r, c), src, r < rows);
      }
      cp_async_commit();
    }
    // The segments this warp's real rows see (padded rows see none): after
    // the next barrier, seg_warps is made from them (here, once Q's copies
    // are out).
    if constexpr (kSkipUnseen) {
      if (masked) {
        uint64_t sees = 0;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = wm * 16 + (lane >> 2) + 8 * i;
          if (r < rows) sees |= misc.ent_mask[entry_of_row(r)];
        }
        sees = warp_or(sees);
        if (lane == 0) misc.warp_sees[warp] = sees;
      }
      for (int r = tid; r < M; r += kThreads) misc.row_mask[r] = (masked && r < rows) ? misc.ent_mask[entry_of_row(r)] : ~0ull;
    }

    // ---- prologue: slots for tiles 0..S-1, copies for tiles 0..S-2.
    if (!early) {  // all loads first, then all commits
#pragma unroll
      for (int t = 0; t < Tr::kMaxStages; ++t)
        if (t < S && t < num_tiles) first[t] = lookup(t);
    }
#pragma unroll
    for (int t = 0; t < Tr::kMaxStages; ++t)
      if (t < S && t < num_tiles) commit(first[t], t, false);
    Lookup next = lookup(S);  // tile S, committed in iteration 0
    __syncthreads();
    for (int t = 0; t < S - 1; ++t) {
      if (t < num_tiles) issue(t, t);
      cp_async_commit();
    }
    // Segment k's warps, for the tiles committed in the loop (after its
    // first barrier; here, once the first K/V copies are out).
    if constexpr (kSkipUnseen) {
      if (masked && tid < nseg) {
        uint32_t warps = 0;
#pragma unroll
        for (int w = 0; w < Tr::kWarps; ++w) warps |= uint32_t((misc.warp_sees[w] >> tid) & 1) << w;
        misc.seg_warps[tid] = warps;
      }
    }

    // The segments seen by the rows of this thread in the mma accumulators:
    // r0 = lane / 4 and r0 + 8 of the warp's row block (kSkipUnseen: read
    // from row_mask where a tile needs them, which leaves the K/V loop the
    // registers its skip test takes).
    uint64_t rmask[2] = {~0ull, ~0ull};
    if constexpr (!kSkipUnseen) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm * 16 + (lane >> 2) + 8 * i;
        rmask[i] = (masked && r < rows) ? misc.ent_mask[entry_of_row(r)] : ~0ull;
      }
    }

    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[j][c] = 0.f;
    float row_max[2] = {kNegInf, kNegInf};  // log2 units
    float row_sum[2] = {0.f, 0.f};          // this thread's columns only; quad-summed at the end
    const float sl2 = p.scale_log2;

    // A persistent CTA claims its next item once it has issued this item's
    // last copies: near its end, so that items go to CTAs in the order they
    // finish (claims made when items start hand the last items to the CTAs
    // of the longest ones; docs/cuda.md, "Persistent launches"), yet early
    // enough that the claim is back by the epilogue.
    const int claim_at = max(0, num_tiles - S);
    if (persistent && tid == 0 && num_tiles == 0) claimed = atomicAdd(p.work, 1u);

    // Ring positions: stage/slot of the tile computed (t), issued (t + S - 1)
    // and filled (t + S), advanced with wrap-around instead of a modulo.
    int st = 0, sl = 0, st_issue = S - 1, sl_issue = S - 1, sl_fill = S;
    for (int t = 0; t < num_tiles; ++t) {
      if (persistent && tid == 0 && t == claim_at) claimed = atomicAdd(p.work, 1u);  // in flight during the wait
      // A masked tile that none of the rows of this warp (mma.sync) or
      // warpgroup (wgmma) see leaves their softmax state as it is (every
      // score -inf: P = 0, no rescale): they skip it. The test is uniform
      // over the warp or warpgroup (shared memory, read by all), as wgmma
      // needs; the busy warps are gathered per 32 positions, so a warp's
      // slice of 16 tokens may count as seen for its neighbour's (it then
      // computes). Read before this tile's barrier: tile t's slot was
      // committed before the barrier of tile t - 1 (of the prologue for the
      // first S), and is committed again only after the next one.
      bool idle = false;
      if constexpr (kSkipUnseen) {
        if (any_missing != 0) {
          uint32_t busy = 0;
          if constexpr (Tr::kWgmma) {
#pragma unroll
            for (int w = 0; w < N / 32; ++w) busy |= misc.tile_flag[sl][w][1];
            idle = ((busy >> (warp & ~3)) & 0xfu) == 0;
          } else {
            for (int w = wn * WT / 32; w <= (wn * WT + WT - 1) / 32; ++w) busy |= misc.tile_flag[sl][w][1];
            idle = ((busy >> warp) & 1u) == 0;
          }
        }
      }
      if (Tr::kMinStages == 1 && S == 1) {
        // One stage: tile t is issued and awaited here (one-tile units only, so
        // nothing is lost); the barrier before the issue frees the stage, and
        // makes the slot committed in iteration t - 1 visible.
        if (t > 0) __syncthreads();
        issue(0, sl);
        cp_async_commit();
        cp_async_wait<0>();
        if constexpr (Tr::kWgmma) fence_proxy_async();
        __syncthreads();
      } else {
        cp_async_wait_pending(S - 2);  // tile t (and Q) landed for this thread's copies
        if constexpr (Tr::kWgmma) fence_proxy_async();  // ... visible to wgmma's reads
        __syncthreads();               // ... and everyone's; stage (t-1)%S is free again
        if (t + S - 1 < num_tiles) issue(st_issue, sl_issue);
        cp_async_commit();
      }
      if constexpr (Tr::kKvFp8 && Tr::kWgmma) {
        // Tile t landed for everyone (the barrier above), and every warp is
        // done with the converted tiles of tile t - 1.
        convert(st);
        fence_proxy_async();
        __syncthreads();
      }
      if (t + S < num_tiles) {
        commit(next, sl_fill, true);
        next = lookup(t + S + 1);
      }

      if (t == 0 && first_item) trace.mark(kTraceFirstTile);
      const uint8_t* Ks = Tr::kKvFp8 && Tr::kWgmma ? sKc : sK + st * Tr::kStageBytes;
      const uint8_t* Vs = Tr::kKvFp8 && Tr::kWgmma ? sVc : sV + st * Tr::kStageBytes;

      if (!idle) {
        // S = Q K^T over this warp's WT tokens.
        float s[WT / 8][4];
#pragma unroll
        for (int j = 0; j < WT / 8; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[j][c] = 0.f;
        if constexpr (Tr::kWgmma) {
          // Q rows of this warpgroup and the K tile, both K-major; a k-step of 16
          // elements is 32 bytes into a 128-byte row of a 64-element region.
          // The warpgroup index from a shuffle: the compiler then knows it is
          // warp-uniform and builds the descriptors in uniform registers.
          const int warpgroup = __shfl_sync(0xffffffffu, warp / 4, 0);
          const WgmmaDescBase<16> q_desc(smem_addr(sQ) + warpgroup * 64 * 128), k_desc(smem_addr(Ks));
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t step = (kk & 3) * 32;
            Wgmma<T, N>::ss(s, q_desc.at((kk >> 2) * M * 128 + step), k_desc.at((kk >> 2) * N * 128 + step), kk > 0);
          }
          wgmma_commit();
          wgmma_wait<0>();
        } else if constexpr (Tr::kFp8InRegisters) {
          // head_dim in a permuted order, the same for Q and K: k-step kk's
          // logical k = 2t + j (+ 8) of thread t = lane % 4 is element
          // 16 kk + 4t + j (+ 2), so that one ldmatrix row of 16 fp8 bytes
          // gives thread t the 4 bytes of K it needs for a k-step, and Q's A
          // fragment is 8 bytes of a row (a0 a2 of row g, a1 a3 of row g + 8).
#pragma unroll
          for (int k4 = 0; k4 < D / 64; ++k4) {
            uint32_t a[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int col = 16 * (4 * k4 + i) + 4 * (lane & 3);  // element of the Q row
              const int r = wm * 16 + (lane >> 2);
              const uint2 lo = *reinterpret_cast<const uint2*>(sQ + swz<Tr, M>(r, col >> 3) + ((col & 7) << 1));
              const uint2 hi = *reinterpret_cast<const uint2*>(sQ + swz<Tr, M>(r + 8, col >> 3) + ((col & 7) << 1));
              a[i][0] = lo.x;
              a[i][1] = hi.x;
              a[i][2] = lo.y;
              a[i][3] = hi.y;
            }
#pragma unroll
            for (int nb = 0; nb < WT / 8; ++nb) {
              // Matrix i: the 8 token rows of n-block nb, 16-byte chunk 4 k4 + i
              // (k-step 4 k4 + i); register i: bytes 4t .. 4t + 3 of row g.
              uint32_t b[4];
              ldmatrix_x4(b, Ks + kv8_offset<Tr>(wn * WT + nb * 8 + (lane & 7), 4 * k4 + (lane >> 3)));
#pragma unroll
              for (int i = 0; i < 4; ++i)
                MmaT::run(s[nb], a[i], fp8x2_to<T>(uint16_t(b[i] & 0xffffu)), fp8x2_to<T>(uint16_t(b[i] >> 16)));
            }
          }
        } else {
          const uint32_t q_row = smem_addr(sQ) + swz<Tr, M>(wm * 16 + (lane & 15), lane >> 4);
          uint32_t k_row[WT / 16];
#pragma unroll
          for (int n2 = 0; n2 < WT / 16; ++n2)
            k_row[n2] = smem_addr(Ks) + swz<Tr, N>(wn * WT + n2 * 16 + ((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            ldmatrix_x4(a, kstep_addr<Tr>(q_row, kk));
#pragma unroll
            for (int n2 = 0; n2 < WT / 16; ++n2) {
              uint32_t b[4];
              ldmatrix_x4(b, kstep_addr<Tr>(k_row[n2], kk));
              MmaT::run(s[2 * n2], a, b[0], b[1]);
              MmaT::run(s[2 * n2 + 1], a, b[2], b[3]);
            }
          }
        }

        // Masks only where needed: a position past the end, or a segment some
        // entry of the unit does not see.
        uint32_t flag = 0;
#pragma unroll
        for (int w = 0; w < N / 32; ++w) flag |= misc.tile_flag[sl][w][0];
        if (flag) {
          // Selects, not branches: a thread's two positions of an n-block are
          // adjacent bytes (one 16-bit load, at an even position of an
          // even-aligned row), and a position past the end (segment 255)
          // shifts every mask bit out (shr.b64 clamps the shift).
          // (pos_seg follows the int32 rows in SmemMisc: it is 4-byte aligned.)
          static_assert(N % 2 == 0 && WT % 2 == 0, "the 16-bit loads of pos_seg need even byte offsets");
          if constexpr (kSkipUnseen) {
#pragma unroll
            for (int i = 0; i < 2; ++i) rmask[i] = misc.row_mask[wm * 16 + (lane >> 2) + 8 * i];
          }
#pragma unroll
          for (int j = 0; j < WT / 8; ++j) {
            const uint32_t segs = *reinterpret_cast<const uint16_t*>(&misc.pos_seg[sl][wn * WT + j * 8 + ((lane & 3) << 1)]);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const uint32_t sg = (segs >> (8 * c)) & 0xffu;
              s[j][c] = (shr_u64(rmask[0], sg) & 1) ? s[j][c] : kNegInf;
              s[j][2 + c] = (shr_u64(rmask[1], sg) & 1) ? s[j][2 + c] : kNegInf;
            }
          }
        }

        // Online softmax. m_safe = 0 for a row that has seen nothing yet, so that
        // exp2(-inf - m_safe) = 0 instead of NaN.
        // The reference maximum row_max moves only when a score exceeds it by
        // more than kRescaleSlack (log2 units; the first finite score always
        // moves it from -inf): a row's (row_max, row_sum, O) stay a consistent
        // softmax state with any reference at or above the true maximum minus
        // the slack, and P = 2^(s - row_max) <= 2^8 fits the 16-bit P operand
        // and the fp32 sums. So O is rescaled on few tiles instead of on most
        // (a row's maximum over a random prefix keeps creeping up).
        constexpr float kRescaleSlack = 8.f;
        float alphas[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float mx = kNegInf;
#pragma unroll
          for (int j = 0; j < WT / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
          mx = quad_max(mx) * sl2;
          const bool move = mx > row_max[i] + kRescaleSlack;  // -inf + slack = -inf
          const float m_new = move ? mx : row_max[i];
          const float m_safe = m_new == kNegInf ? 0.f : m_new;
          const float alpha = move ? fast_exp2(row_max[i] - m_safe) : 1.f;
          row_max[i] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < WT / 8; ++j) {
            s[j][2 * i] = fast_exp2(fmaf(s[j][2 * i], sl2, -m_safe));
            s[j][2 * i + 1] = fast_exp2(fmaf(s[j][2 * i + 1], sl2, -m_safe));
            sum += s[j][2 * i] + s[j][2 * i + 1];
          }
          row_sum[i] = row_sum[i] * alpha + sum;
          alphas[i] = alpha;
        }
        // Rescale O only when a row's reference maximum moved somewhere in the
        // warp (alpha is exactly 1 otherwise): the D / 2 multiplies per thread
        // are a tenth of a tile's instructions.
        if (__any_sync(0xffffffffu, alphas[0] != 1.f || alphas[1] != 1.f)) {
#pragma unroll
          for (int j = 0; j < D / 8; ++j) {
            o[j][0] *= alphas[0];
            o[j][1] *= alphas[0];
            o[j][2] *= alphas[1];
            o[j][3] *= alphas[1];
          }
        }

        // O += P V: the S accumulators become A fragments (16 tokens) directly.
        auto p_fragment = [&](int kk, uint32_t (&a)[4]) {
          a[0] = MmaT::pack(s[2 * kk][0], s[2 * kk][1]);
          a[1] = MmaT::pack(s[2 * kk][2], s[2 * kk][3]);
          a[2] = MmaT::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
          a[3] = MmaT::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        };
        if constexpr (Tr::kWgmma) {
          // V is N-major for this product: 16 tokens (rows) per k-step, the
          // 64-element regions of head_dim N * 128 bytes apart.
          uint32_t pa[WT / 16][4];
#pragma unroll
          for (int kk = 0; kk < WT / 16; ++kk) p_fragment(kk, pa[kk]);
          const WgmmaDescBase<N * 128> v_desc(smem_addr(Vs));
          wgmma_fence();  // o was rescaled and pa written by ordinary instructions
#pragma unroll
          for (int kk = 0; kk < WT / 16; ++kk) Wgmma<T, D>::rs(o, pa[kk], v_desc.at(kk * 16 * 128));
          wgmma_commit();
          wgmma_wait<0>();
        } else {
          // fp8 (kFp8InRegisters): ldmatrix.trans on the fp8 rows hands thread
          // (g, t) the bytes V[2t][2g], V[2t][2g + 1], V[2t + 1][2g],
          // V[2t + 1][2g + 1] of a 16-byte chunk (tokens 8 apart in the next
          // matrix): the even and the odd columns of the chunk are each a B
          // fragment once the bytes are regrouped, o[2c] holding columns
          // 16c + 2n and o[2c + 1] columns 16c + 2n + 1 (n: the MMA's column);
          // the epilogue puts them back.
#pragma unroll
          for (int kk = 0; kk < WT / 16; ++kk) {
            uint32_t a[4];
            p_fragment(kk, a);
            const int r = wn * WT + kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
            if constexpr (Tr::kFp8InRegisters) {
#pragma unroll
              for (int c2 = 0; c2 < D / 32; ++c2) {
                uint32_t v[4];  // tokens 0-7 and 8-15 of chunk 2 c2, then of chunk 2 c2 + 1
                ldmatrix_x4_trans(v, Vs + kv8_offset<Tr>(r, 2 * c2 + (lane >> 4)));
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const uint32_t even = __byte_perm(v[2 * h], v[2 * h + 1], 0x6420);
                  const uint32_t odd = __byte_perm(v[2 * h], v[2 * h + 1], 0x7531);
                  const int c = 2 * c2 + h;
                  MmaT::run(o[2 * c], a, fp8x2_to<T>(uint16_t(even & 0xffffu)), fp8x2_to<T>(uint16_t(even >> 16)));
                  MmaT::run(o[2 * c + 1], a, fp8x2_to<T>(uint16_t(odd & 0xffffu)), fp8x2_to<T>(uint16_t(odd >> 16)));
                }
              }
            } else {
              const uint32_t v_row = smem_addr(Vs) + swz<Tr, N>(r, lane >> 4);
#pragma unroll
              for (int d2 = 0; d2 < D / 16; ++d2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, kstep_addr<Tr>(v_row, d2));
                MmaT::run(o[2 * d2], a, b[0], b[1]);
                MmaT::run(o[2 * d2 + 1], a, b[2], b[3]);
              }
            }
          }
        }
      }
      st = st + 1 == S ? 0 : st + 1;
      sl = sl + 1 == kSlots ? 0 : sl + 1;
      st_issue = st_issue + 1 == S ? 0 : st_issue + 1;
      sl_issue = sl_issue + 1 == kSlots ? 0 : sl_issue + 1;
      sl_fill = sl_fill + 1 == kSlots ? 0 : sl_fill + 1;
    }

    // ---- epilogue: slices -> shared memory, combined per row, written out.
    trace.mark(kTraceLoopDone);
    cp_async_wait<0>();
    if (persistent && tid == 0) misc.next_item = int(gridDim.x + claimed);
    __syncthreads();  // every warp is done with Q and K/V: the scratch may overlap them
    // The next item: claimed (persistent), the grid's stride away (a step
    // executor's fixed grid), or none.
    const int next_item = persistent ? misc.next_item : p.grid_stride ? item + int(gridDim.x) : num_items();
    UnitDesc next_unit{};
    if constexpr (Tr::kPersistent)
      if (next_item < num_items()) next_unit = units()[next_item / Hkv];  // in flight during the epilogue
    float* sO = reinterpret_cast<float*>(sQ);
    // One slice (the 64- and 128-row tiles): each row is finished once, by
    // the thread that holds its softmax state, instead of by every thread
    // that stores a column of it (which took an integer division by the
    // group size, a float division and the slot lookup per 16 bytes stored).
    constexpr bool kRowsOnce = WN == 1;
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = wm * 16 + (lane >> 2) + 8 * i;
      const float d = quad_sum(row_sum[i]);
      if constexpr (kRowsOnce) {
        // Its lse, 1 / sum (into row_d) and its output offset (into
        // ent_mask, read only before the KV loop): >= 0 into out, ~offset
        // into partial_o. The same arithmetic as the loop below with one
        // slice (weight exp2(0) = 1), so the results are bit-identical.
        if ((lane & 3) == 0 && r < rows) {
          const float sum = row_max[i] == kNegInf ? 0.f : d;
          const float lse = sum > 0.f ? (row_max[i] + fast_log2(sum)) * kLn2 : kNegInf;
          const int e = entry_of_row(r), h = kvh * G + r - e * G, slot = misc.ent_slot[e];
          int64_t off;
          if (slot < 0) {
            off = int64_t(misc.ent_query[e]) * p.o_stride + h * D;
            if (p.lse_out) p.lse_out[int64_t(misc.ent_query[e]) * Hqo + h] = lse;
          } else {
            off = ~((int64_t(slot) * Hqo + h) * D);
            p.partial_lse[int64_t(slot) * Hqo + h] = lse;
          }
          misc.row_d[0][r] = sum > 0.f ? p.v_scale / sum : 0.f;  // a fully masked row yields zeros
          misc.ent_mask[r] = uint64_t(off);
        }
      } else if ((lane & 3) == 0) {
        misc.row_m[wn][r] = row_max[i];
        misc.row_d[wn][r] = d;
      }
      if constexpr (Tr::kFp8InRegisters) {
        // o[2c] holds columns 16c + 4t and + 2, o[2c + 1] 16c + 4t + 1 and + 3.
        float* dst = sO + (wn * M + r) * Tr::kOStride + ((lane & 3) << 2);
#pragma unroll
        for (int c = 0; c < D / 16; ++c)
          *reinterpret_cast<float4*>(dst + c * 16) =
              make_float4(o[2 * c][2 * i], o[2 * c + 1][2 * i], o[2 * c][2 * i + 1], o[2 * c + 1][2 * i + 1]);
      } else {
        float* dst = sO + (wn * M + r) * Tr::kOStride + ((lane & 3) << 1);
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
          *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
      }
    }
    __syncthreads();

    if constexpr (kRowsOnce) {
      for (int i = tid; i < rows * (D / 4); i += kThreads) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        const float inv = misc.row_d[0][r];
        const int64_t off = int64_t(misc.ent_mask[r]);
        float4 acc = *reinterpret_cast<const float4*>(sO + r * Tr::kOStride + c);
        acc.x *= inv;
        acc.y *= inv;
        acc.z *= inv;
        acc.w *= inv;
        if (off >= 0) {
          uint2 packed = make_uint2(MmaT::pack(acc.x, acc.y), MmaT::pack(acc.z, acc.w));
          *reinterpret_cast<uint2*>(static_cast<T*>(p.out) + off + c) = packed;
        } else {
          *reinterpret_cast<float4*>(p.partial_o + (~off) + c) = acc;
        }
      }
    }
    // Several slices, at least four warps: each row is combined by kPerRow
    // threads, which work out its weights, 1 / sum and output address once
    // and then take every kPerRow-th float4 of it; the same arithmetic per
    // element as one thread per float4 (below), which redoes the per-row
    // work, two integer divisions by the group size among it, for every 16
    // bytes stored. The two-warp m16 n32 tile, at its 128-register cap,
    // spilled in its prologue with this path and keeps the other.
    constexpr bool kRowCombine = !kRowsOnce && kThreads >= 128;
    if constexpr (kRowCombine) {
      constexpr int kPerRow = kThreads / M;
      static_assert(kThreads % M == 0 && (D / 4) % kPerRow == 0, "whole threads per row, whole float4s per thread");
      const int r = tid / kPerRow;
      if (r < rows) {
        float mx = kNegInf;
#pragma unroll
        for (int w = 0; w < WN; ++w) mx = fmaxf(mx, misc.row_m[w][r]);
        float weight[WN];
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < WN; ++w) {
          const float mw = misc.row_m[w][r];
          weight[w] = mw == kNegInf ? 0.f : fast_exp2(mw - mx);  // empty slice: weight 0
          sum += misc.row_d[w][r] * weight[w];
        }
        const float inv = sum > 0.f ? p.v_scale / sum : 0.f;  // a fully masked row yields zeros
        const int e = entry_of_row(r), h = kvh * G + r - e * G, slot = misc.ent_slot[e];
        // The row's output: fp16/bf16 in out (slot -1) or an fp32 partial.
        const bool direct = slot < 0;
        uint8_t* const row_out =
            direct ? reinterpret_cast<uint8_t*>(static_cast<T*>(p.out) + int64_t(misc.ent_query[e]) * p.o_stride + h * D)
                   : reinterpret_cast<uint8_t*>(p.partial_o + (int64_t(slot) * Hqo + h) * D);
#pragma unroll 1
        for (int k = 0; k < D / 4 / kPerRow; ++k) {
          const int c = (tid % kPerRow + k * kPerRow) * 4;
          float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int w = 0; w < WN; ++w) {
            const float4 x = *reinterpret_cast<const float4*>(sO + (w * M + r) * Tr::kOStride + c);
            acc.x += weight[w] * x.x;
            acc.y += weight[w] * x.y;
            acc.z += weight[w] * x.z;
            acc.w += weight[w] * x.w;
          }
          acc.x *= inv;
          acc.y *= inv;
          acc.z *= inv;
          acc.w *= inv;
          if (direct)
            *reinterpret_cast<uint2*>(row_out + c * sizeof(T)) = make_uint2(MmaT::pack(acc.x, acc.y), MmaT::pack(acc.z, acc.w));
          else
            *reinterpret_cast<float4*>(row_out + c * sizeof(float)) = acc;
        }
        if (tid % kPerRow == 0) {
          const float lse = sum > 0.f ? (mx + fast_log2(sum)) * kLn2 : kNegInf;
          if (!direct)
            p.partial_lse[int64_t(slot) * Hqo + h] = lse;
          else if (p.lse_out)
            p.lse_out[int64_t(misc.ent_query[e]) * Hqo + h] = lse;
        }
      }
    }
    for (int i = tid; !kRowsOnce && !kRowCombine && i < rows * (D / 4); i += kThreads) {
      const int r = i / (D / 4), c = (i % (D / 4)) * 4;
      float mx = kNegInf;
#pragma unroll
      for (int w = 0; w < WN; ++w) mx = fmaxf(mx, misc.row_m[w][r]);
      float sum = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < WN; ++w) {
        const float mw = misc.row_m[w][r];
        const float sc = mw == kNegInf ? 0.f : fast_exp2(mw - mx);  // empty slice: weight 0
        sum += misc.row_d[w][r] * sc;
        const float4 x = *reinterpret_cast<const float4*>(sO + (w * M + r) * Tr::kOStride + c);
        acc.x += sc * x.x;
        acc.y += sc * x.y;
        acc.z += sc * x.z;
        acc.w += sc * x.w;
      }
      const float inv = sum > 0.f ? p.v_scale / sum : 0.f;  // a fully masked row yields zeros
      acc.x *= inv;
      acc.y *= inv;
      acc.z *= inv;
      acc.w *= inv;
      const int e = entry_of_row(r), h = kvh * G + r - e * G;
      const int slot = misc.ent_slot[e];
      if (slot < 0) {
        const int64_t off = int64_t(misc.ent_query[e]) * p.o_stride + h * D + c;
        uint2 packed = make_uint2(MmaT::pack(acc.x, acc.y), MmaT::pack(acc.z, acc.w));
        *reinterpret_cast<uint2*>(static_cast<T*>(p.out) + off) = packed;
        if (p.lse_out && c == 0)
          p.lse_out[int64_t(misc.ent_query[e]) * Hqo + h] = sum > 0.f ? (mx + fast_log2(sum)) * kLn2 : kNegInf;
      } else {
        const int64_t off = (int64_t(slot) * Hqo + h) * D + c;
        *reinterpret_cast<float4*>(p.partial_o + off) = acc;
        if (c == 0) p.partial_lse[int64_t(slot) * Hqo + h] = sum > 0.f ? (mx + fast_log2(sum)) * kLn2 : kNegInf;
      }
    }
    trace.mark(kTraceStored);
    if (next_item >= num_items()) break;
    __syncthreads();  // the next item reuses the shared memory: every read of this one is done
    item = next_item;
    if constexpr (Tr::kPersistent)
      u = next_unit;
    else
      u = units()[item / Hkv];
  }  // items

  if (persistent && tid == 0 && atomicAdd(p.work + 1, 1u) == gridDim.x - 1) {
    // The last CTA out (every CTA's last claim came before its count): reset
    // the claim counters for the next run.
    p.work[0] = 0;
    p.work[1] = 0;
  }
  if (p.ctas_done && (!p.num_merges_dev || *p.num_merges_dev > 0)) {
    // Every thread's stores, then one fence and the count: the barrier orders
    // them before thread 0's fence, which makes them visible device-wide
    // before the count (cumulativity, as a grid barrier does), and the other
    // warps can leave without a fence round trip of their own. A CTA without
    // items stored nothing: it only counts itself.
    if (has_items) {
      __syncthreads();
      if (tid == 0) __threadfence();
    }
    if (tid == 0) atomicAdd(p.ctas_done, 1u);
  }
  if (tid == 0) {
    trace.mark(kTraceDone);
    trace.store(p.trace ? p.trace + (int64_t(p.trace_first_cta) + blockIdx.x) * kTracePoints : nullptr);
  }
}

}  // namespace treeattn::cuda
