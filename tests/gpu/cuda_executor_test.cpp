// GPU tests of the CUDA executor: every registered planner over random trees
// and the generator families, against the CPU executor and the fp64
// reference, with the output poisoned (NaN) before each run; page sizes 1, 16,
// 64; GQA 1/4/8/16; head_dim 64/128/256; fp16 (<= 2e-3) and bf16 (<= 1e-2);
// hand-built plans with 1 and 64 masked segments; every tile config (m, n),
// PAT's KV-tile variants included; one query; one-token nodes;
// a 128k-token node; CUDA graph replay; the CTA trace. Tests named Sanitize* are the small
// subset that the device script runs under compute-sanitizer.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "treeattn/cost_models.hpp"
#include "treeattn/cuda_executor.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/pat_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

double tolerance(DType t) { return t == DType::bf16 ? 1e-2 : 2e-3; }

struct Errors {
  double gpu_vs_ref = 0, cpu_vs_ref = 0, gpu_vs_cpu = 0;
};

std::vector<double> as_doubles(const Workload& w, const std::vector<uint8_t>& out) {
  const size_t n = out.size() / dtype_size(w.layout.dtype);
  std::vector<double> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = load_element(out.data(), w.layout.dtype, int64_t(i));
  return r;
}

// Runs plan p on the GPU (output poisoned first) and on the CPU; both against
// the fp64 reference, and against each other.
Errors check_plan(const Workload& w, const Plan& p, uint64_t seed, bool with_cpu = true,
                  const CudaExecutorOptions& eo = {}) {
  HostTensors h = make_random_inputs(w, seed);
  const std::vector<double> ref = reference_attention(w, h.args());
  DeviceTensors d = DeviceTensors::upload(h);
  CudaExecutor ex(w, p, eo);
  d.poison_out();
  ex.run(d.args(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "test run");
  HostTensors g = h;
  d.download_out(g);
  Errors e;
  e.gpu_vs_ref = relative_error(w, g.out.data(), ref);
  if (with_cpu) {
    run_cpu(w, p, h.args());
    e.cpu_vs_ref = relative_error(w, h.out.data(), ref);
    e.gpu_vs_cpu = relative_error(w, g.out.data(), as_doubles(w, h.out));
  }
  return e;
}

void expect_ok(const Workload& w, const Plan& p, const Errors& e, const std::string& what) {
  const double tol = tolerance(w.layout.dtype);
  EXPECT_LE(e.gpu_vs_ref, tol) << what << " planner " << p.planner << " (gpu vs fp64 reference)";
  EXPECT_LE(e.cpu_vs_ref, tol) << what << " planner " << p.planner << " (cpu vs fp64 reference)";
  EXPECT_LE(e.gpu_vs_cpu, tol) << what << " planner " << p.planner << " (gpu vs cpu executor)";
}

WorkloadParams params(int qo, int kv, int d, DType t, int page, uint64_t seed = 1,
                      std::optional<DType> kv_dtype = std::nullopt) {
  WorkloadParams p;
  p.heads = {qo, kv, d};
  p.page_size = page;
  p.dtype = t;
  p.kv_dtype = kv_dtype;
  p.seed = seed;
  return p;
}

// ---- every planner x random trees --------------------------------------------

TEST(CudaExecutor, EveryPlannerRandomTrees) {
  // Shapes rotate with the seed so that every dtype / head_dim / page size /
  // GQA ratio meets every planner and several tree shapes.
  const int heads[][2] = {{8, 8}, {32, 8}, {32, 4}, {32, 2}};
  const int dims[] = {64, 128, 256};
  const int pages[] = {1, 16, 64};
  const int sms[] = {4, 132, 1};
  double worst[2] = {0, 0};
  int runs = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const DType t = seed % 2 ? DType::fp16 : DType::bf16;
    const auto& hd = heads[seed % 4];
    const WorkloadParams wp = params(hd[0], hd[1], dims[seed % 3], t, pages[(seed / 3) % 3], seed);
    RandomTreeOptions ro;
    ro.max_nodes = 30;
    ro.max_tokens = 200;
    const Workload w = random_workload(seed, wp, ro);
    PlanOptions opt;
    opt.num_sms = sms[seed % 3];
    for (const PlannerInfo& pl : planners()) {
      const Plan p = pl.fn(w, opt);
      const Errors e = check_plan(w, p, seed * 7 + 1);
      expect_ok(w, p, e, w.name + " d=" + std::to_string(w.heads.head_dim));
      worst[t == DType::bf16] = std::max(worst[t == DType::bf16], e.gpu_vs_ref);
      ++runs;
    }
  }
  std::printf("  %d (tree, planner) runs; worst gpu-vs-reference: fp16 %.2e, bf16 %.2e\n", runs, worst[0], worst[1]);
}

// ---- generator families --------------------------------------------------------

TEST(CudaExecutor, GeneratorFamilies) {
  const char* specs[] = {
      "fasttree:N=1,4,16:C=300,40,20",
      "pat:B=1,4,16:L=200,100,30",
      "pat:B=2,8:L=100,60",
      "fewshot:prompt=700:branches=12:len=50",
  };
  const int heads[][2] = {{32, 8}, {8, 8}, {32, 4}, {32, 2}};
  int i = 0;
  for (const char* spec : specs) {
    for (DType t : {DType::fp16, DType::bf16}) {
      const auto& hd = heads[i % 4];
      const Workload w = make_workload(spec, params(hd[0], hd[1], 128, t, 16, 3 + i));
      PlanOptions opt;
      opt.num_sms = 8;
      for (const PlannerInfo& pl : planners()) {
        const Plan p = pl.fn(w, opt);
        expect_ok(w, p, check_plan(w, p, 100 + i), w.name);
      }
      ++i;
    }
  }
}

// ---- shape matrix on one tree: page sizes, GQA, head dims, dtypes ---------------

TEST(CudaExecutor, ShapeMatrix) {
  const int group_heads[][2] = {{4, 4}, {16, 4}, {32, 4}, {32, 2}};  // GQA 1, 4, 8, 16
  for (int page : {1, 16, 64})
    for (const auto& hd : group_heads)
      for (int d : {64, 128, 256})
        for (DType t : {DType::fp16, DType::bf16}) {
          if (page == 1 && d == 256 && t == DType::bf16) continue;  // keep the matrix short
          const Workload w = make_workload("fasttree:N=1,3,6:C=150,33,17", params(hd[0], hd[1], d, t, page, page + d));
          for (const char* planner : {"per-query", "node"}) {
            PlanOptions opt;
            opt.num_sms = 2;
            const Plan p = make_plan(planner, w, opt);
            expect_ok(w, p, check_plan(w, p, 11), w.name + " page " + std::to_string(page) + " heads " +
                                                      std::to_string(hd[0]) + "/" + std::to_string(hd[1]) + " d " +
                                                      std::to_string(d) + " " + std::string(to_string(t)));
          }
        }
}

// ---- hand-built masked plans -------------------------------------------------------

// Root of 100 tokens with one child of 37; query 0 on the root, query 1 on the
// child. One unit holds both segments; query 0 does not see the child: one
// masked segment, a tile spanning two segments, output written directly.
TEST(CudaExecutor, SanitizeOneMaskedSegment) {
  for (DType t : {DType::fp16, DType::bf16}) {
    WorkloadParams wp = params(8, 2, 128, t, 16);
    Workload w;
    w.name = "two-node";
    w.heads = wp.heads;
    w.layout.page_size = 16;
    w.layout.dtype = t;
    PageAllocator alloc(16, 5);
    const int32_t root = alloc.add_node(w.tree, -1, 100);
    const int32_t child = alloc.add_node(w.tree, root, 37);
    w.layout.num_pages = alloc.finish(w.tree);
    w.query_nodes = {root, child};
    w.validate();
    PlanBuilder b(w, "hand");
    b.begin_unit();
    b.add_segment(root, 0, 100);
    b.add_segment(child, 0, 37);
    b.add_query(0, 0b01);
    b.add_query(1, 0b11);
    b.end_unit();
    const Plan p = b.finish();
    ASSERT_EQ(p.unit_masked[0], 1);
    ASSERT_EQ(p.num_slots, 0);
    expect_ok(w, p, check_plan(w, p, 3), "one masked segment");
  }
}

// A root with 64 children (1..9 tokens, one-token nodes among them), a query
// per child. Unit A: the 64 children as 64 segments, each query seeing only
// its own child (64 masked segments, many per tile); units B: the root split
// in two, all queries. Every query has 3 partials to merge.
Workload star64(DType t, int qo, int kv, int d, int page, std::optional<DType> kv_dtype = std::nullopt) {
  Workload w;
  w.name = "star64";
  w.heads = {qo, kv, d};
  w.layout.page_size = page;
  w.layout.dtype = t;
  w.layout.kv_dtype = kv_dtype;
  PageAllocator alloc(page, 9);
  const int32_t root = alloc.add_node(w.tree, -1, 300);
  for (int c = 0; c < 64; ++c) w.query_nodes.push_back(alloc.add_node(w.tree, root, 1 + c % 9));
  w.layout.num_pages = alloc.finish(w.tree);
  w.validate();
  return w;
}

// tile >= 0: every unit runs that tile (and holds at most its m rows).
Plan star64_plan(const Workload& w, int tile = -1) {
  PlanBuilder b(w, "hand-64");
  const int per_unit = std::min(64, (tile < 0 ? kMaxTileRows : kTileConfigs[tile].m) / w.heads.group_size());
  for (int q0 = 0; q0 < 64; q0 += per_unit) {
    b.begin_unit(tile);
    for (int c = 0; c < 64; ++c) b.add_segment(w.query_nodes[c], 0, w.tree.nodes[w.query_nodes[c]].num_tokens);
    for (int q = q0; q < q0 + per_unit; ++q) b.add_query(q, 1ull << q);
    b.end_unit();
  }
  for (auto [lo, hi] : {std::pair{0, 170}, std::pair{170, 300}})
    for (int q0 = 0; q0 < 64; q0 += per_unit) {
      b.begin_unit(tile);
      b.add_segment(0, lo, hi);
      for (int q = q0; q < q0 + per_unit; ++q) b.add_query(q);
      b.end_unit();
    }
  return b.finish();
}

TEST(CudaExecutor, SanitizeSixtyFourMaskedSegments) {
  for (DType t : {DType::fp16, DType::bf16}) {
    const Workload w = star64(t, 4, 2, 64, 1);
    const Plan p = star64_plan(w);
    validate_plan(w, p);
    ASSERT_EQ(p.unit_num_segments(0), 64);
    ASSERT_GT(p.num_slots, 0);
    expect_ok(w, p, check_plan(w, p, 5), "64 masked segments");
  }
}

TEST(CudaExecutor, SixtyFourMaskedSegmentsShapes) {
  for (int page : {1, 16, 64})
    for (int d : {64, 128, 256}) {
      const Workload w = star64(DType::fp16, 32, 8, d, page);
      const Plan p = star64_plan(w);
      expect_ok(w, p, check_plan(w, p, 6), "64 masked segments d " + std::to_string(d));
    }
}

// ---- PAT's KV-tile variants ---------------------------------------------------------

// Every compiled tile config (m, n), run exactly (no m16n32 substitution), at
// d 64/128/256 in fp16 and bf16, with pools of the dtype or (kv_dtype) fp8:
// (a) PAT plans with every unit on (m, n) (pat_max_rows = m, so units hold at
// most m rows; units of several tiles and a partial last tile); (b) the
// 64-masked-segment plan on (m, n) (masks across n-token tiles, partials +
// merge). fp8 pools are checked against the fp64 reference over the
// dequantised values (the inputs' k_scale / v_scale are not 1) within the
// dtype's tolerance: the conversion is exact, so they cost no accuracy
// beyond their own rounding.
void check_every_tile_config(std::optional<DType> kv_dtype, uint64_t seed) {
  double worst[2] = {0, 0};
  CudaExecutorOptions exact;
  exact.short_m16 = false;
  for (int t = 0; t < num_tile_configs(); ++t) {
    const TileConfig tc = kTileConfigs[t];
    for (int d : {64, 128, 256})
      for (DType dt : {DType::fp16, DType::bf16}) {
        if (!tile_fits_head_dim(t, d)) continue;  // the validator rejects it (tests/plan)
        const std::string what = "tile m" + std::to_string(tc.m) + "n" + std::to_string(tc.n) + " d " +
                                  std::to_string(d) + " " + std::string(to_string(dt)) +
                                  (kv_dtype ? " kv " + std::string(to_string(*kv_dtype)) : "");
        const Workload w = make_workload("pat:B=1,4,12:L=150,70,45", params(16, 4, d, dt, 16, 7 + t, kv_dtype));
        PlanOptions opt;
        opt.num_sms = 8;
        opt.extra["pat_max_rows"] = tc.m;
        PatTileRules rules;
        rules.rules = {{kMaxTileRows, -1, tc.n}};
        Plan p = plan_pat_with(w, opt, rules);
        for (uint8_t& x : p.unit_tile) x = uint8_t(t);
        validate_plan(w, p);
        Errors e = check_plan(w, p, seed + t, true, exact);
        expect_ok(w, p, e, what + " pat");
        worst[dt == DType::bf16] = std::max(worst[dt == DType::bf16], e.gpu_vs_ref);

        const Workload s = star64(dt, 8, 2, d, 16, kv_dtype);
        const Plan sp = star64_plan(s, t);
        validate_plan(s, sp);
        e = check_plan(s, sp, seed + 10 + t, true, exact);
        expect_ok(s, sp, e, what + " 64 masked segments");
        worst[dt == DType::bf16] = std::max(worst[dt == DType::bf16], e.gpu_vs_ref);
      }
  }
  std::printf("  %d tile configs%s; worst gpu-vs-reference: fp16 %.2e, bf16 %.2e\n", num_tile_configs(),
              kv_dtype ? ", fp8 K/V" : "", worst[0], worst[1]);
}

TEST(CudaExecutor, PatTileConfigs) { check_every_tile_config(std::nullopt, 20); }
TEST(CudaExecutor, Fp8KvEveryTileConfig) { check_every_tile_config(DType::fp8_e4m3, 40); }

// fp8 K/V under compute-sanitizer: every planner on a small tree, page
// sizes 1 and 16 (a tile's rows from many pages), one-stage and pipelined
// launches.
TEST(CudaExecutor, SanitizeFp8Kv) {
  for (int page : {1, 16})
    for (DType dt : {DType::fp16, DType::bf16}) {
      const Workload w =
          make_workload("fasttree:N=1,3,6:C=150,33,17", params(32, 8, 128, dt, page, 3 + page, DType::fp8_e4m3));
      PlanOptions opt;
      opt.num_sms = 4;
      for (const PlannerInfo& pl : planners()) {
        const Plan p = pl.fn(w, opt);
        expect_ok(w, p, check_plan(w, p, 60 + page), "fp8 kv page " + std::to_string(page));
      }
    }
}

// The pat planner's own tile choice (shipped rules): n = 32 for short leaves,
// n = 128 for long 16-32-row units, n = 64 between; one launch per tile
// config, chained in one stream and on a stream each, merged.
TEST(CudaExecutor, PatPlannerMixedTiles) {
  const char* specs[] = {"pat:B=1,4,64:L=2000,100,20", "pat:B=1,4,8:L=1000,300,200", "pat:B=1,4,16:L=300,100,20",
                         "pat:B=2,8:L=40,9"};
  int i = 0;
  for (const char* spec : specs)
    for (DType dt : {DType::fp16, DType::bf16}) {
      const Workload w = make_workload(spec, params(32, 8, 128, dt, 16, 40 + i));
      const Plan p = make_plan("pat", w, PlanOptions{});
      std::string tiles;
      for (const TileRun& r : tile_runs(p))
        tiles += " m" + std::to_string(kTileConfigs[r.tile].m) + "n" + std::to_string(kTileConfigs[r.tile].n) + "x" +
                 std::to_string(r.end - r.begin);
      const Errors e = check_plan(w, p, 50 + i, true);
      expect_ok(w, p, e, w.name + tiles);
      CudaExecutorOptions streams;  // PAT's multi-stream forward
      streams.stream_per_tile_config = true;
      expect_ok(w, p, check_plan(w, p, 50 + i, false, streams), w.name + tiles + " (stream per tile config)");
      std::printf("  %s %s:%s, gpu err %.2e\n", spec, std::string(to_string(dt)).c_str(), tiles.c_str(), e.gpu_vs_ref);
      ++i;
    }
}

// ---- edge cases ----------------------------------------------------------------------

TEST(CudaExecutor, SanitizeOneQuery) {
  for (DType t : {DType::fp16, DType::bf16}) {
    const Workload w = make_workload("pat:B=1:L=77", params(32, 8, 128, t, 16));
    ASSERT_EQ(w.num_queries(), 1);
    for (const PlannerInfo& pl : planners()) {
      PlanOptions opt;
      opt.num_sms = 3;
      const Plan p = pl.fn(w, opt);
      expect_ok(w, p, check_plan(w, p, 2), "one query");
    }
  }
}

// node's compact subtrees: units of several queries over the union of their
// paths, masked per query, written directly (no slot, no merge): 16 queries
// a unit at GQA 1, 4 at GQA 4; and a random forest (queries on internal
// nodes too, empty nodes) at 1-token pages, bf16, beside ordinary node units.
TEST(CudaExecutor, SanitizeCompactSubtrees) {
  for (const char* heads : {"32/32", "32/8"}) {
    const int qo = 32, kv = std::string(heads) == "32/8" ? 8 : 32;
    // Enough units to fill the GPU at both head counts (fewer, each far longer
    // than node's units, would be planned as nodes instead).
    const Workload w = make_workload("fasttree:N=1,256:C=64,8", params(qo, kv, 128, DType::fp16, 16));
    const Plan p = make_plan("node", w);
    EXPECT_EQ(p.num_slots, 0) << heads << ": every query in one unit";
    EXPECT_LT(p.num_units(), 64) << heads << ": queries share units";
    expect_ok(w, p, check_plan(w, p, 31), heads);
  }
  const Workload spec = make_workload("random:seed=5:nodes=40:tokens=6", params(16, 4, 64, DType::bf16, 1));
  const Plan p = make_plan("node", spec);
  expect_ok(spec, p, check_plan(spec, p, 32), "small random tree, 1-token pages");
}

// Compact subtrees of 128-row units (GQA 4: 32 queries a unit), whose leaf
// tiles only some rows see: CudaExecutor runs them with the 128-row tile's
// skip variant (a launch of its own), whose warpgroups skip the masked tiles
// none of their rows see. Its output against fp64 and against the plain loop
// (CudaExecutorOptions::skip_unseen = false); fp16 at d = 128, bf16 at d = 64.
TEST(CudaExecutor, SanitizeMaskedUnitsSkipUnseenTiles) {
  for (const auto& [dtype, dim] : {std::pair{DType::fp16, 128}, std::pair{DType::bf16, 64}}) {
    const Workload w = make_workload("fasttree:N=1,4,64:C=64,40,24", params(32, 8, dim, dtype, 16));
    PlanOptions opt;  // the whole tree one compact subtree of two 128-row units (912 tokens each)
    opt.extra["flat_rows"] = 128;
    opt.extra["compact_stretch"] = 1000;
    const Plan p = make_plan("node", w, opt);
    bool masked128 = false;
    for (int32_t u = 0; u < p.num_units(); ++u) masked128 |= kTileConfigs[p.unit_tile[u]].m == 128 && p.unit_masked[u];
    ASSERT_TRUE(masked128) << to_string(dtype) << ": the plan has masked 128-row units";
    HostTensors h = make_random_inputs(w, 51);
    const std::vector<double> ref = reference_attention(w, h.args());
    DeviceTensors d = DeviceTensors::upload(h);
    CudaExecutorOptions plain_loop;
    plain_loop.skip_unseen = false;
    CudaExecutor ex(w, p), plain(w, p, plain_loop);
    EXPECT_NE(ex.describe().find("skip"), std::string::npos) << ex.describe();
    EXPECT_EQ(plain.describe().find("skip"), std::string::npos) << plain.describe();
    for (CudaExecutor* e : {&ex, &plain}) {
      HostTensors g = h;
      d.poison_out();
      e->run(d.args(), nullptr);
      check_cuda(cudaDeviceSynchronize(), "skip variant run");
      d.download_out(g);
      EXPECT_LE(relative_error(w, g.out.data(), ref), tolerance(dtype)) << to_string(dtype) << ": " << e->describe();
    }
  }
}

// node's folded short nodes: the 32-token root opens each 64-token child's
// unit (two segments, no mask), so each query has 2 slots instead of 3.
TEST(CudaExecutor, NodeFoldedShortNodes) {
  const Workload w = make_workload("pat:B=1,8,512:L=32,64,160", params(32, 8, 128, DType::fp16, 16));
  PlanOptions opt;
  opt.extra["flat_tokens"] = 0;  // node units (the leaves would otherwise form compact subtrees)
  const Plan p = make_plan("node", w, opt);
  EXPECT_EQ(p.num_slots, 2 * 512);
  expect_ok(w, p, check_plan(w, p, 41), "pat:B=1,8,512:L=32,64,160 folded");
}

// Queries with more partial slots than one merge batch (8). Few (query, qo
// head) pairs: the merge splits each pair's slots over a CTA's warps and folds
// the quarters in order; 9, 21 and 139 slots (more than 32 per warp: two
// rounds of slot ids), at every head_dim (2, 4 and 8 floats per lane). Many
// pairs (64 queries x 16 heads, more than a wave of such CTAs): one warp per
// pair, three batches of slots.
TEST(CudaExecutor, SanitizeManySlotMerge) {
  const auto check = [](const char* spec, int head_dim, int split) {
    const Workload w = make_workload(spec, params(16, 4, head_dim, DType::fp16, 16));
    PlanOptions opt;
    opt.extra["split_tokens"] = split;
    opt.extra["flat_tokens"] = 0;  // node units, one slot per piece
    const Plan p = make_plan("node", w, opt);
    int most = 0;
    for (int q = 0; q < w.num_queries(); ++q)
      most = std::max(most, p.query_slot_offset[q + 1] - p.query_slot_offset[q]);
    EXPECT_GT(most, 8) << spec << " split " << split;
    expect_ok(w, p, check_plan(w, p, 5), std::string(spec) + ", split " + std::to_string(split));
  };
  for (const int head_dim : {64, 128, 256})
    for (const int split : {138, 55, 8}) check("fasttree:N=1,3:C=1100,40", head_dim, split);
  check("fasttree:N=1,64:C=1100,40", 128, 55);
}

// A speculative-decoding chain of one-token nodes with a query on each.
TEST(CudaExecutor, OneTokenNodes) {
  Workload w;
  w.name = "one-token chain";
  w.heads = {16, 4, 128};
  w.layout.page_size = 16;
  w.layout.dtype = DType::fp16;
  PageAllocator alloc(16, 3);
  int32_t v = alloc.add_node(w.tree, -1, 40);
  for (int i = 0; i < 20; ++i) {
    v = alloc.add_node(w.tree, v, 1);
    w.query_nodes.push_back(v);
  }
  w.layout.num_pages = alloc.finish(w.tree);
  w.validate();
  for (const PlannerInfo& pl : planners()) {
    const Plan p = pl.fn(w, PlanOptions{});
    expect_ok(w, p, check_plan(w, p, 4), "one-token nodes");
  }
}

// One node of 128k tokens and a single query: the per-query planner splits it
// into many partials (merge of many slots); node runs it too.
TEST(CudaExecutor, LongNode128k) {
  const Workload w = make_workload("pat:B=1:L=131072", params(8, 2, 128, DType::bf16, 16));
  for (const char* planner : {"per-query", "node", "pat"}) {
    const Plan p = make_plan(planner, w, PlanOptions{});
    const Errors e = check_plan(w, p, 8);
    expect_ok(w, p, e, "128k node");
    std::printf("  128k node, %s: %d units, %d slots, gpu err %.2e\n", planner, p.num_units(), p.num_slots,
                e.gpu_vs_ref);
  }
}

// ---- run semantics -------------------------------------------------------------------

// The same run twice gives bit-identical results; a graph captured from run()
// replays to the same result.
// Both launch orders (chained in the caller's stream, and one stream per tile
// config): two runs bit-identical, graph replay bit-identical to run().
TEST(CudaExecutor, SanitizeDeterministicAndGraphReplay) {
  const Workload w = make_workload("fasttree:N=1,4,16:C=300,40,20", params(32, 8, 128, DType::fp16, 16));
  PlanOptions opt;
  opt.num_sms = 4;
  opt.extra["flat_tokens"] = 0;  // node units and a merge (the compact tree would need none)
  const Plan p = make_plan("node", w, opt);
  HostTensors h = make_random_inputs(w, 12);
  DeviceTensors d = DeviceTensors::upload(h);
  std::vector<uint8_t> chained_out;  // of the first mode: the L2 policy must not change a bit of it
  for (const auto& [streams, l2] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
    CudaExecutorOptions eo;
    eo.stream_per_tile_config = streams;
    eo.l2_persistent_plan = l2;
    const std::string mode = streams ? "stream per tile config" : l2 ? "chained, plan in L2" : "chained";
    CudaExecutor ex(w, p, eo);
    ASSERT_GT(ex.num_launches(), 1) << "the tree needs several tile configs";
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");

    d.poison_out(s);
    ex.run(d.args(), s);
    check_cuda(cudaStreamSynchronize(s), "run 1");
    HostTensors a = h, b = h, c = h;
    d.download_out(a);
    d.poison_out(s);
    ex.run(d.args(), s);
    check_cuda(cudaStreamSynchronize(s), "run 2");
    d.download_out(b);
    EXPECT_EQ(a.out, b.out) << mode << ": two runs differ";
    if (chained_out.empty()) chained_out = a.out;
    if (l2) {
      EXPECT_EQ(a.out, chained_out) << mode << ": differs from the run without the L2 policy";
      size_t set_aside = 0;
      check_cuda(cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize), "persisting L2 limit");
      int dev = 0, max_persist = 0;
      check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
      check_cuda(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, dev), "max persisting L2");
      if (max_persist > 0) EXPECT_GT(set_aside, 0u) << mode << ": no L2 set aside for the plan";
    }

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
    ex.run(d.args(), s);
    check_cuda(cudaStreamEndCapture(s, &graph), "end capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int i = 0; i < 3; ++i) {
      d.poison_out(s);
      check_cuda(cudaGraphLaunch(exec, s), "graph launch");
    }
    check_cuda(cudaStreamSynchronize(s), "graph replay");
    d.download_out(c);
    EXPECT_EQ(a.out, c.out) << mode << ": graph replay differs from run()";
    const std::vector<double> ref = reference_attention(w, h.args());
    EXPECT_LE(relative_error(w, c.out.data(), ref), tolerance(w.layout.dtype)) << mode;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
}

// Chained runs back to back on one stream, each on other inputs: a merge
// that waited for the wrong count (the counters of stored partials carry over
// from run to run, compared against the run's epoch) would fold the previous
// run's partials or hang. The tree has many slots per query and a leaf level
// of short units that the merge of early queries overtakes.
TEST(CudaExecutor, SanitizeChainedRunsMergeTheirOwnPartials) {
  const Workload w = make_workload("fasttree:N=1,8,64:C=700,60,12", params(16, 4, 64, DType::fp16, 16));
  PlanOptions opt;
  opt.num_sms = 16;
  opt.extra["flat_tokens"] = 0;  // node units: three slots per query
  const Plan p = make_plan("node", w, opt);
  CudaExecutor ex(w, p);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  constexpr int kInputs = 3;
  std::vector<HostTensors> h;
  std::vector<DeviceTensors> d;
  std::vector<std::vector<double>> ref;
  for (int i = 0; i < kInputs; ++i) {
    h.push_back(make_random_inputs(w, 100 + i));
    d.push_back(DeviceTensors::upload(h.back()));
    ref.push_back(reference_attention(w, h.back().args()));
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kInputs; ++i) d[i].poison_out(s);
    for (int i = 0; i < kInputs; ++i) ex.run(d[i].args(), s);  // no host sync in between
    check_cuda(cudaStreamSynchronize(s), "chained runs");
    for (int i = 0; i < kInputs; ++i) {
      HostTensors g = h[i];
      d[i].download_out(g);
      EXPECT_LE(relative_error(w, g.out.data(), ref[i]), tolerance(w.layout.dtype))
          << "round " << round << ", inputs " << i;
    }
  }
  cudaStreamDestroy(s);
}

// A launch of more items than fit on the GPU at once (multi-tile leaves)
// runs persistent CTAs that claim items in turn: every item computed exactly
// once (poisoned output, fp64 reference), bit-identical to one CTA per item,
// and again on the next runs (the claim counters reset themselves).
TEST(CudaExecutor, SanitizePersistentLaunch) {
  for (const char* spec : {"fasttree:N=1,96:C=40,100", "fasttree:N=1,4,80:C=100,70,300"}) {
    const Workload w = make_workload(spec, params(64, 16, 64, DType::fp16, 16));
    PlanOptions unpacked;  // one leaf per unit: more items than a wave
    unpacked.extra["pack_tokens"] = 0;
    unpacked.extra["flat_tokens"] = 0;
    const Plan p = make_plan("node", w, unpacked);
    HostTensors h = make_random_inputs(w, 21);
    const std::vector<double> ref = reference_attention(w, h.args());
    DeviceTensors d = DeviceTensors::upload(h);
    CudaExecutorOptions one_per_item;
    one_per_item.persistent = false;
    CudaExecutor ex(w, p), plain(w, p, one_per_item);
    EXPECT_NE(ex.describe().find("persistent"), std::string::npos) << spec << ": " << ex.describe();
    EXPECT_EQ(plain.describe().find("persistent"), std::string::npos) << spec << ": " << plain.describe();
    HostTensors expect = h;
    d.poison_out();
    plain.run(d.args(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "one CTA per item");
    d.download_out(expect);
    EXPECT_LE(relative_error(w, expect.out.data(), ref), tolerance(w.layout.dtype)) << spec;
    for (int r = 0; r < 3; ++r) {
      HostTensors g = h;
      d.poison_out();
      ex.run(d.args(), nullptr);
      check_cuda(cudaDeviceSynchronize(), "persistent run");
      d.download_out(g);
      EXPECT_EQ(g.out, expect.out) << spec << ": persistent run " << r << " differs from one CTA per item";
    }
  }
}

// The CTA timeline of a traced run: one line per attention launch and one for
// the merge, every phase non-negative (the stamps are in order), the output
// still right. In a build without TREEATTN_CTA_TRACE the option must say so.
TEST(CudaExecutor, CtaTrace) {
  const Workload w = make_workload("fasttree:N=1,4,16:C=300,40,20", params(32, 8, 128, DType::fp16, 16));
  PlanOptions opt;
  opt.num_sms = 4;
  opt.extra["flat_tokens"] = 0;  // node units and a merge (the compact tree would need none)
  const Plan p = make_plan("node", w, opt);
  EXPECT_THROW(CudaExecutor(w, p).trace_report(), Error) << "an untraced executor has no timeline";
  CudaExecutorOptions eo;
  eo.trace = true;
  std::unique_ptr<CudaExecutor> ex;
  try {
    ex = std::make_unique<CudaExecutor>(w, p, eo);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TREEATTN_CTA_TRACE"), std::string::npos) << e.what();
    return;
  }
  HostTensors h = make_random_inputs(w, 3);
  DeviceTensors d = DeviceTensors::upload(h);
  d.poison_out();
  ex->run(d.args(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "traced run");
  const std::string r = ex->trace_report();
  std::printf("%s", r.c_str());
  EXPECT_EQ(std::count(r.begin(), r.end(), '\n'), ex->num_launches() + 1) << r;
  EXPECT_NE(r.find("merge"), std::string::npos) << r;
  EXPECT_EQ(r.find('-'), std::string::npos) << "a phase ends before it starts:\n" << r;
  HostTensors g = h;
  d.download_out(g);
  EXPECT_LE(relative_error(w, g.out.data(), reference_attention(w, h.args())), tolerance(w.layout.dtype));
}

TEST(CudaExecutor, RejectsBadArgs) {
  const Workload w = make_workload("pat:B=1:L=32", params(8, 8, 64, DType::fp16, 16));
  const Plan p = make_plan("per-query", w, PlanOptions{});
  CudaExecutor ex(w, p);
  AttentionArgs a;
  EXPECT_THROW(ex.run(a, nullptr), Error);
  const Workload w32 = make_workload("pat:B=1:L=32", params(8, 8, 64, DType::fp32, 16));
  EXPECT_THROW(CudaExecutor(w32, make_plan("per-query", w32, PlanOptions{})), Error);
}

}  // namespace
}  // namespace treeattn
