// Property tests of the paper planners (node-chunk, flatten, fasttree, pat,
// forge): over 304 seeded random trees, each under every GQA ratio {1, 4, 8,
// 16} and page size {1, 16}, every plan passes the validator and the CPU
// executor matches the fp64 reference (fp32 <= 1e-5, fp16 <= 2e-3 relative).
// The trees are small (<= 12 nodes, <= 24 tokens a node) so the suite stays
// fast; the options are shrunk so chunking, KV splits, Q-tile splits and the
// 64-segment limit are all reached.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"
#include "tree/builder_test_util.hpp"

using namespace treeattn;

namespace {

constexpr uint64_t kSeeds = 304;

PlanOptions options_for(uint64_t seed) {
  PlanOptions o;
  o.num_sms = int(1 + seed % 5 * 9);  // 1 .. 37 SMs: both filled and starved grids
  o.ctas_per_sm = 1 + int(seed % 2);
  o.chunk_tokens = int(4 + seed % 6 * 7);
  o.min_split_tokens = int(1 + seed % 4 * 8);
  if (seed % 3 == 0) {
    o.extra["kv_split_long"] = 48;   // fasttree: exercise its long-context split
    o.extra["kv_split_short"] = 8;
  }
  if (seed % 4 == 1) o.extra["fill"] = 0;              // flatten: fixed block length
  o.extra["pat_max_rows"] = double(16 << (seed % 4));  // pat: CTAs of 16 .. 128 rows
  return o;
}

double tolerance_for(DType t) { return t == DType::fp32 ? 1e-5 : 2e-3; }

}  // namespace

// One loop over the cases, all planners per case, so the inputs and the fp64
// reference (the expensive part) are computed once per case.
TEST(PaperPlanners, ValidAndMatchReferenceOnRandomTrees) {
  const std::vector<std::string> names = {"node-chunk", "flatten", "fasttree", "pat", "forge"};
  RandomTreeOptions shape;
  shape.max_nodes = 12;
  shape.max_tokens = 24;
  std::map<std::string, int64_t> merged, masked;
  int64_t cases = 0;
  const uint64_t trees = treeattn_test::property_trees(kSeeds);  // $TREEATTN_PROPERTY_TREES (scripts/stress.sh)
  for (uint64_t seed = 0; seed < trees; ++seed) {
    for (const int ratio : {1, 4, 8, 16}) {
      for (const int page : {1, 16}) {
        WorkloadParams wp;
        wp.heads.num_kv_heads = 1 + int(seed % 2);
        wp.heads.num_qo_heads = wp.heads.num_kv_heads * ratio;
        wp.heads.head_dim = 64;
        wp.page_size = page;
        wp.dtype = (seed + ratio) % 2 ? DType::fp16 : DType::fp32;
        wp.seed = seed * 31 + ratio * 2 + page;
        const Workload w = random_workload(seed, wp, shape);
        const PlanOptions opt = options_for(seed);
        HostTensors t = make_random_inputs(w, seed * 7 + 1);
        const std::vector<double> ref = reference_attention(w, t.args());
        ++cases;
        for (const std::string& planner : names) {
          const std::string what = planner + " seed " + std::to_string(seed) + " heads " + std::to_string(wp.heads.num_qo_heads) +
                                   "/" + std::to_string(wp.heads.num_kv_heads) + " page " + std::to_string(page) + " " +
                                   std::string(to_string(wp.dtype));
          Plan p;
          ASSERT_NO_THROW(p = make_plan(planner, w, opt)) << what;
          ASSERT_NO_THROW(validate_plan(w, p)) << what;
          const PlanSummary s = summarize(w, p);
          if (planner != "flatten") ASSERT_EQ(s.masked_units, 0) << what << ": only flatten needs masks";
          merged[planner] += p.num_slots > 0;
          masked[planner] += s.masked_units > 0;
          std::fill(t.out.begin(), t.out.end(), uint8_t(0xff));  // NaN garbage: every output must be written
          run_cpu(w, p, t.args(), 1);
          ASSERT_LE(relative_error(w, t.out.data(), ref), tolerance_for(w.layout.dtype)) << what;
        }
      }
    }
  }
  for (const std::string& planner : names)
    EXPECT_GT(merged[planner], cases / 4) << planner << ": the random cases should exercise partials and the merge";
  EXPECT_GT(masked["flatten"], cases / 4) << "flatten should produce mixed (masked) blocks";
}

// Speculative decoding: a 300-token prefix, a chain of 80 accepted one-token
// nodes and a binary token tree of draft tokens below it, every one-token node
// holding its own query (queries on internal nodes). Long runs of one-token
// nodes drive units to the 64-segment limit.
TEST(PaperPlanners, TokenTreeQueriesOnInternalNodes) {
  for (const int page : {1, 16}) {
    Workload w;
    w.heads = {8, 2, 64};
    w.layout.page_size = page;
    w.layout.dtype = DType::fp32;
    PageAllocator alloc(page, 5);
    int32_t tip = alloc.add_node(w.tree, -1, 300);
    for (int i = 0; i < 80; ++i) {
      tip = alloc.add_node(w.tree, tip, 1);
      w.query_nodes.push_back(tip);
    }
    std::vector<int32_t> level = {tip};
    for (int depth = 0; depth < 5; ++depth) {
      std::vector<int32_t> next;
      for (const int32_t v : level)
        for (int k = 0; k < 2; ++k) {
          next.push_back(alloc.add_node(w.tree, v, 1));
          w.query_nodes.push_back(next.back());
        }
      level = next;
    }
    w.layout.num_pages = alloc.finish(w.tree);
    w.validate();
    PlanOptions opt;
    opt.chunk_tokens = 128;
    opt.extra["fill"] = 0;
    HostTensors t = make_random_inputs(w, 3);
    const auto ref = reference_attention(w, t.args());
    for (const char* name : {"node-chunk", "flatten", "fasttree", "pat", "forge"}) {
      const Plan p = make_plan(name, w, opt);
      ASSERT_NO_THROW(validate_plan(w, p)) << name;
      run_cpu(w, p, t.args(), 1);
      EXPECT_LE(relative_error(w, t.out.data(), ref), 1e-5) << name << " page " << page;
      if (std::string(name) == "flatten") {
        int32_t most = 0;
        for (int32_t u = 0; u < p.num_units(); ++u) most = std::max(most, p.unit_num_segments(u));
        EXPECT_EQ(most, kMaxSegmentsPerUnit) << "a block of one-token nodes closes at 64 segments";
      }
    }
  }
}
