// TreeAttention on the CPU (the C++ face of the runtime; the Python tests cover
// the binding and the GPU tests CudaStepExecutor): every way to plan against
// the fp64 reference, re-planning with other trees, draft token trees, and
// errors that name the capacity, field and value and keep the previous plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include <string>
#include <vector>

#include "tests/support/error_text.hpp"
#include "tests/support/tree_arrays.hpp"
#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

using test_support::Arrays;

TreeAttentionConfig cpu_config(const WorkloadParams& p, int64_t num_pages) {
  TreeAttentionConfig c;
  c.heads = p.heads;
  c.dtype = p.dtype;
  c.page_size = p.page_size;
  c.num_pages = num_pages;
  c.device = Device::cpu;
  return c;
}

// Two runtimes alike but for plan extension: `extending` extends the last
// plan up to `limit` tokens a unit, `fresh` plans every step afresh.
struct ExtendingAndFresh {
  TreeAttention extending, fresh;
};
ExtendingAndFresh extending_and_fresh(TreeAttentionConfig c, int32_t limit) {
  c.max_extension_tokens = limit;
  TreeAttentionConfig f = c;
  f.max_extension_tokens = 0;
  return {TreeAttention(c), TreeAttention(f)};
}

// Runs the planned step of `ta` on inputs for `w` (its tree as planned) and
// returns the error against the fp64 reference.
double step_error(const TreeAttention& ta, uint64_t seed) {
  const Workload& w = ta.workload();
  HostTensors h = make_random_inputs(w, seed);
  ta.run(h.args());
  return relative_error(w, h.out.data(), reference_attention(w, h.args()));
}

TEST(TreeAttentionCpu, ReplansOneObjectWithEveryKindOfTree) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  const std::vector<std::string> specs = {"fewshot:prompt=100:branches=6:len=9", "random:seed=4", "pat:B=1,4:L=30,7",
                                          "random:seed=9:nodes=40"};
  int64_t pool = 0;
  std::vector<Workload> ws;
  for (const std::string& s : specs) ws.push_back(make_workload(s, p)), pool = std::max(pool, ws.back().layout.num_pages);
  for (const char* planner : {"auto", "node", "per-query", "flatten"}) {
    TreeAttentionConfig c = cpu_config(p, pool);
    c.planner = planner;
    TreeAttention ta(c);
    for (size_t i = 0; i < ws.size(); ++i) {
      const Arrays a(ws[i]);
      ta.plan_tree(a.view());
      EXPECT_EQ(ta.num_queries(), ws[i].num_queries());
      EXPECT_LE(step_error(ta, i + 1), 2e-3) << specs[i] << " planner " << planner;
    }
  }
}

// The CPU executor has no launches: the graph-launch masks read 0, setting 0
// is accepted and any other mask refused with its value named.
TEST(TreeAttentionCpu, GraphLaunchMasksAreZeroWithoutLaunches) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  const Workload w = make_workload("fewshot:prompt=100:branches=6:len=9", p);
  TreeAttention ta(cpu_config(p, w.layout.num_pages));
  EXPECT_EQ(ta.plan_launches(), 0u);
  ta.plan_tree(Arrays(w).view());
  EXPECT_EQ(ta.plan_launches(), 0u);
  EXPECT_EQ(ta.graph_launches(), 0u);
  ta.set_graph_launches(0);
  try {
    ta.set_graph_launches(3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_graph_launches(3)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ta.graph_launches(), 0u);
}

TEST(TreeAttentionCpu, BlockTablesShareTheirLeadingPages) {
  WorkloadParams p;
  p.heads = {4, 4, 64};
  p.page_size = 4;
  TreeAttentionConfig c = cpu_config(p, 40);
  c.planner = "node";
  TreeAttention ta(c);
  // Three sequences sharing pages 7, 3 (8 tokens), then their own pages.
  const std::vector<int32_t> tables = {7, 3, 10, 11, 7, 3, 20, -1, 7, 3, 30, 31};
  const std::vector<int32_t> lens = {15, 10, 13};
  ta.plan_block_tables(tables, 3, 4, lens);
  const PlanSummary s = ta.summary();
  EXPECT_EQ(s.unique_kv_bytes, (8 + 7 + 2 + 5) * 4 * 64 * 2 * 2);
  EXPECT_EQ(s.kv_bytes, s.unique_kv_bytes);  // node reads the shared pages once
  EXPECT_LE(step_error(ta, 3), 2e-3);
}

// A vLLM-style decode loop through plan_block_tables: 6 sequences, two
// groups sharing a prompt, each a token longer a step (a page from the pool
// when its last fills), one finishing halfway. Every step holds the tree a
// never-extending object builds, matches the fp64 reference, and its plan
// (extended or fresh) passes the validator; most steps extend.
TEST(TreeAttentionCpu, BlockTableDecodeStepsExtendAndMatchTheReference) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  constexpr int32_t kWidth = 24;
  std::vector<std::vector<int32_t>> pages = {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {3, 4}, {3, 4}, {3, 4}};
  std::vector<int32_t> lens(6);
  int32_t next = 5;
  for (size_t s = 0; s < pages.size(); ++s) {  // own tails of 1 + s tokens after the full prompt pages
    lens[s] = int32_t(pages[s].size()) * 4 + 1 + int32_t(s);
    while (int32_t(pages[s].size()) * 4 < lens[s]) pages[s].push_back(next++);
  }
  auto [ta, fresh] = extending_and_fresh(cpu_config(p, 200), 8);
  for (int step = 0; step < 30; ++step) {
    if (step == 15) {  // sequence 4 finishes: the batch changes (planned afresh)
      pages.erase(pages.begin() + 4);
      lens.erase(lens.begin() + 4);
    }
    const int32_t batch = int32_t(pages.size());
    std::vector<int32_t> table(size_t(batch) * kWidth, -1);
    for (int32_t s = 0; s < batch; ++s) std::copy(pages[s].begin(), pages[s].end(), table.begin() + s * kWidth);
    ta.plan_block_tables(table, batch, kWidth, lens);
    fresh.plan_block_tables(table, batch, kWidth, lens);
    ASSERT_EQ(ta.workload().tree.nodes.size(), fresh.workload().tree.nodes.size()) << "step " << step;
    for (size_t v = 0; v < ta.workload().tree.nodes.size(); ++v) {
      ASSERT_EQ(ta.workload().tree.nodes[v].pages, fresh.workload().tree.nodes[v].pages) << "step " << step;
      ASSERT_EQ(ta.workload().tree.nodes[v].num_tokens, fresh.workload().tree.nodes[v].num_tokens) << "step " << step;
    }
    ASSERT_NO_THROW(validate_plan(ta.workload(), ta.plan())) << "step " << step;
    EXPECT_LE(step_error(ta, uint64_t(step) + 1), 2e-3) << "step " << step;
    for (int32_t s = 0; s < batch; ++s)
      if (++lens[s] > int32_t(pages[s].size()) * 4) pages[s].push_back(next++);
  }
  const PlanStats st = ta.plan_stats();
  EXPECT_EQ(st.planned + st.extended, 30);
  EXPECT_GE(st.planned, 2);    // the first step and the batch change at least
  EXPECT_GE(st.extended, 20);  // at most 8 tokens a unit between fresh plans
  EXPECT_EQ(fresh.plan_stats().extended, 0);
}

TEST(TreeAttentionCpu, DraftTokensSeeTheirPrefixAndAncestors) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  TreeAttention ta(cpu_config(p, 8));
  // One request: 9 tokens in pages 5, 2, 6 (slot 0 of page 6); drafts from slot 1 of page 6 on.
  const std::vector<int32_t> parents{-1}, tokens{9}, offsets{0, 3}, pages{5, 2, 6}, queries{0};
  const std::vector<int32_t> dnodes{0, 0, 0, 0}, dparents{-1, 0, 0, 1};
  const std::vector<int64_t> rows{25, 26, 27, 4 * 4 + 0};  // page 6 slots 1..3, then page 4 slot 0
  ta.plan_tree_queries({parents, tokens, offsets, pages, queries, {}}, {dnodes, dparents, rows});
  const Workload& w = ta.workload();
  ASSERT_EQ(w.num_queries(), 5);
  EXPECT_EQ(w.path(w.query_nodes[4]).size(), 4u);  // prefix, draft 0, draft 1, draft 3
  EXPECT_LE(step_error(ta, 5), 2e-3);
}

// Fresh plans of one object with draft trees, trees of other pages and sizes,
// and calls refused halfway: each plan's tree holds the pages it was given
// (a fresh plan copies only the nodes whose pages changed since the tree it
// loaded two plans before).
TEST(TreeAttentionCpu, FreshPlansHoldThePagesTheyWereGiven) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  TreeAttentionConfig c = cpu_config(p, 32);
  c.max_extension_tokens = 0;
  TreeAttention ta(c);
  struct Tree {
    std::vector<int32_t> parents, tokens, offsets, pages, queries;
    TreeArrays view() const { return {parents, tokens, offsets, pages, queries, {}}; }
  };
  const auto expect_pages = [&](const Tree& t, const std::vector<int64_t>& draft_rows, const char* step) {
    SCOPED_TRACE(step);
    const std::vector<Node>& nodes = ta.workload().tree.nodes;
    ASSERT_EQ(nodes.size(), t.parents.size() + draft_rows.size());
    for (size_t v = 0; v < t.parents.size(); ++v) {
      const std::vector<int32_t> given(t.pages.begin() + t.offsets[v], t.pages.begin() + t.offsets[v + 1]);
      EXPECT_EQ(nodes[v].pages, given) << "node " << v;
    }
    for (size_t i = 0; i < draft_rows.size(); ++i)
      EXPECT_EQ(nodes[t.parents.size() + i].pages, std::vector<int32_t>{int32_t(draft_rows[i] / p.page_size)});
    EXPECT_LE(step_error(ta, 3), 2e-3);
  };
  // A root of 9 tokens and two children with a query each.
  const Tree base{{-1, 0, 0}, {9, 4, 5}, {0, 3, 4, 6}, {5, 2, 6, 7, 8, 9}, {1, 2}};
  Tree swapped = base, grown = base, fewer = base, bad = base;
  swapped.pages = {5, 2, 6, 7, 9, 8};  // node 2's pages in the other order
  grown.tokens[1] = 6, grown.offsets = {0, 3, 5, 7}, grown.pages = {5, 2, 6, 7, 11, 8, 9};
  fewer.parents.pop_back(), fewer.tokens.pop_back(), fewer.offsets.pop_back(), fewer.pages.resize(4);
  fewer.queries = {1};
  bad.offsets = {0, 3, 2, 6};
  const std::vector<int32_t> dnodes{1, 2}, dparents{-1, -1};
  const std::vector<int64_t> rows{40, 41}, bad_rows{40, 32 * 4};
  ta.plan_tree(base.view());
  expect_pages(base, {}, "base");
  ta.plan_tree_queries(base.view(), {dnodes, dparents, rows});
  expect_pages(base, rows, "drafts");
  EXPECT_THROW(ta.plan_tree_queries(grown.view(), {dnodes, dparents, bad_rows}), Error);
  ta.plan_tree(swapped.view());
  expect_pages(swapped, {}, "swapped after refused drafts");
  ta.plan_tree(grown.view());
  expect_pages(grown, {}, "grown");
  EXPECT_THROW(ta.plan_tree(bad.view()), Error);
  ta.plan_tree(fewer.view());
  expect_pages(fewer, {}, "fewer after refused offsets");
  ta.plan_tree_queries(grown.view(), {dnodes, dparents, rows});
  expect_pages(grown, rows, "grown with drafts");
  for (const Tree* t : std::vector<const Tree*>{&base, &swapped, &base, &grown, &fewer, &base}) {
    ta.plan_tree(t->view());
    expect_pages(*t, {}, "in turn");
  }
}

TEST(TreeAttentionCpu, ErrorsNameTheFieldAndKeepThePreviousPlan) {
  WorkloadParams p;
  p.heads = {4, 2, 64};
  p.page_size = 4;
  TreeAttentionConfig c = cpu_config(p, 16);
  c.max_queries = 3;
  c.max_nodes = 4;
  TreeAttention ta(c);
  const std::vector<int32_t> parents{-1, 0}, tokens{8, 2}, offsets{0, 2, 3}, pages{0, 1, 2}, queries{1, 1};
  ta.plan_tree({parents, tokens, offsets, pages, queries, {}});
  auto error_of = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::vector<int32_t> four_queries{1, 1, 1, 1}, bad_pages{0, 1, 99}, cycle{1, 0}, short_offsets{0, 2};
  EXPECT_NE(error_of([&] { ta.plan_tree({parents, tokens, offsets, pages, four_queries, {}}); })
                .find("queries = 4 exceeds the capacity 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ta.plan_tree({parents, tokens, offsets, bad_pages, queries, {}}); }).find("page id 99"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ta.plan_tree({cycle, tokens, offsets, pages, queries, {}}); }).find("cycle"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ta.plan_tree({parents, tokens, short_offsets, pages, queries, {}}); })
                .find("page_offsets has 2 entries, expected nodes + 1 = 3"),
            std::string::npos);
  // An offset past the page ids that later ones undo (found by the Python
  // argument mutation test: the first node read 2^31 pages).
  const std::vector<int32_t> three{-1, 0, 1}, three_tokens{8, 2, 0}, past_end{0, 2, 2147483647, 3};
  EXPECT_NE(error_of([&] { ta.plan_tree({three, three_tokens, past_end, pages, queries, {}}); })
                .find("page_offsets[2] = 2147483647 is beyond len(page_ids) = 3"),
            std::string::npos);
  const std::vector<int32_t> dn{1}, dp{0};
  const std::vector<int64_t> dr{9};
  EXPECT_NE(error_of([&] { ta.plan_tree_queries({parents, tokens, offsets, pages, queries, {}}, {dn, dp, dr}); })
                .find("draft_parents = 0 must be -1 or an earlier draft"),
            std::string::npos);
  const std::vector<int32_t> on_a_draft{1, 2}, root_parent{-1};  // node 2 would be the draft's
  const std::vector<int64_t> free_row{15};
  EXPECT_NE(error_of([&] {
              ta.plan_tree_queries({parents, tokens, offsets, pages, on_a_draft, {}}, {dn, root_parent, free_row});
            })
                .find("query_nodes[1] = 2 is out of range [0, 2)"),
            std::string::npos);
  const std::vector<int32_t> under_a_draft{-1, 2};
  EXPECT_NE(error_of([&] {
              ta.plan_tree_queries({under_a_draft, tokens, offsets, pages, queries, {}}, {dn, root_parent, free_row});
            })
                .find("parents[1] = 2 is out of range [-1, 2)"),
            std::string::npos);
  // A draft whose row a tree node holds (page 2 slot 1: node 1's second
  // token): the tree's check names the draft's node, and says it is draft 0.
  const std::vector<int64_t> taken_row{9};
  const std::string taken = error_of([&] {
    ta.plan_tree_queries({parents, tokens, offsets, pages, queries, {}}, {dn, root_parent, taken_row});
  });
  EXPECT_NE(taken.find("node 2: pages: page id 2"), std::string::npos) << taken;
  EXPECT_NE(taken.find("node 2 + i is draft i, its KV at draft_rows[i]"), std::string::npos) << taken;
  EXPECT_EQ(ta.num_queries(), 2);  // the first plan is still in force
  EXPECT_LE(step_error(ta, 1), 2e-3);
  // Rows of out that overlap: units write them concurrently.
  {
    HostTensors h = make_random_inputs(ta.workload(), 3);
    AttentionArgs a = h.args();
    a.out_stride = 8;  // < num_qo_heads x head_dim = 256
    EXPECT_NE(error_of([&] { ta.run(a); }).find("out_stride = 8: the queries' rows of out overlap"),
              std::string::npos);
  }
  TreeAttentionConfig bad = c;
  for (const int threads : {-1, 1025}) {
    bad.cpu_threads = threads;
    EXPECT_NE(error_of([&] { TreeAttention x(bad); }).find("cpu_threads = " + std::to_string(threads) +
                                                             " is out of range [0, 1024]"),
              std::string::npos);
  }
  bad = c;
  bad.planner = "nope";
  EXPECT_NE(error_of([&] { TreeAttention x(bad); }).find("unknown planner 'nope'"), std::string::npos);
  bad = c;
  bad.device = Device::cuda;
#if !defined(TREEATTN_HAVE_CUDA)
  EXPECT_NE(error_of([&] { TreeAttention x(bad); }).find("no CUDA executor"), std::string::npos);
#endif
  TreeAttention fresh(c);
  HostTensors h = make_random_inputs(ta.workload(), 1);
  EXPECT_NE(error_of([&] { fresh.run(h.args()); }).find("run() before any plan"), std::string::npos);
  // Scales are checked on every run, as on the GPU.
  for (const float bad : {0.f, -1.f, NAN, INFINITY}) {
    AttentionArgs a = h.args();
    a.k_scale = bad;
    EXPECT_NE(error_of([&] { ta.run(a); }).find("k_scale: expected a positive finite number"), std::string::npos);
    a = h.args();
    a.v_scale = bad;
    EXPECT_NE(error_of([&] { ta.run(a); }).find("v_scale: expected a positive finite number"), std::string::npos);
    a = h.args();
    a.scale = bad == 0.f ? -0.5f : bad;
    EXPECT_NE(error_of([&] { ta.run(a); }).find("scale: expected 0 (1/sqrt(head_dim)) or a positive"),
              std::string::npos);
  }
}

// The inputs of a dense HostTensors copied into buffers of other strides
// (elements; a negative stride: the rows reversed, the pointer at row 0 of
// the view, which is the buffer's last): a strided run's q, pools and out.
struct StridedCopy {
  int64_t q_stride, out_stride, kv_token_stride, kv_page_stride;
  std::vector<uint16_t> q, k, v, out;
  int64_t q_at = 0, out_at = 0, kv_at = 0;  // element of row 0 in each buffer

  StridedCopy(const Workload& w, const HostTensors& h, int64_t qs, int64_t os, int64_t ts, int64_t pgs)
      : q_stride(qs), out_stride(os), kv_token_stride(ts), kv_page_stride(pgs) {
    const int64_t Q = w.num_queries(), H = w.heads.num_qo_heads, D = w.heads.head_dim;
    const int64_t R = int64_t(w.heads.num_kv_heads) * D, ps = w.layout.page_size, pages = w.layout.num_pages;
    q_at = qs < 0 ? (Q - 1) * -qs : 0;
    out_at = os < 0 ? (Q - 1) * -os : 0;
    kv_at = (ts < 0 ? (ps - 1) * -ts : 0) + (pgs < 0 ? (pages - 1) * -pgs : 0);
    q.assign(size_t(q_at + (qs < 0 ? H * D : (Q - 1) * qs + H * D)), 0);
    out.assign(size_t(out_at + (os < 0 ? H * D : (Q - 1) * os + H * D)), 0x7e00);  // NaN
    const int64_t kv_end = kv_at + (ts > 0 ? (ps - 1) * ts : 0) + (pgs > 0 ? (pages - 1) * pgs : 0) + R;
    k.assign(size_t(kv_end), 0);
    v.assign(size_t(kv_end), 0);
    const auto* hq = reinterpret_cast<const uint16_t*>(h.q.data());
    const auto* hk = reinterpret_cast<const uint16_t*>(h.k.data());
    const auto* hv = reinterpret_cast<const uint16_t*>(h.v.data());
    for (int64_t i = 0; i < Q; ++i) std::copy_n(hq + i * H * D, H * D, q.begin() + q_at + i * qs);
    for (int64_t pg = 0; pg < pages; ++pg)
      for (int64_t t = 0; t < ps; ++t) {
        const int64_t from = (pg * ps + t) * R, to = kv_at + pg * pgs + t * ts;
        std::copy_n(hk + from, R, k.begin() + to);
        std::copy_n(hv + from, R, v.begin() + to);
      }
  }
  AttentionArgs args() {
    AttentionArgs a{q.data() + q_at, k.data() + kv_at, v.data() + kv_at, out.data() + out_at};
    a.q_stride = q_stride;
    a.out_stride = out_stride;
    a.kv_token_stride = kv_token_stride;
    a.kv_page_stride = kv_page_stride;
    return a;
  }
  // out's rows gathered into a dense [num_queries, num_qo_heads, head_dim] fp16 buffer.
  std::vector<uint16_t> dense_out(const Workload& w) const {
    const int64_t row = int64_t(w.heads.num_qo_heads) * w.heads.head_dim;
    std::vector<uint16_t> d(size_t(w.num_queries() * row));
    for (int64_t i = 0; i < w.num_queries(); ++i)
      std::copy_n(out.begin() + out_at + i * out_stride, row, d.begin() + i * row);
    return d;
  }
};

// AttentionArgs carries pointers, not sizes, but the runtime knows the
// shapes behind them: strides that make rows overlap (out's, which units
// write concurrently; q's or the pools', a wrong stride rather than a
// layout) are refused naming the field and the value; any stride that keeps
// rows apart, negative (a reversed view) included, runs correctly.
TEST(TreeAttentionCpu, RunStridesAreCheckedAgainstTheShapes) {
  WorkloadParams p;
  p.heads = {4, 2, 64};  // q and out rows of 256 elements, pool rows of 128
  p.page_size = 4;
  TreeAttentionConfig c = cpu_config(p, 16);
  TreeAttention ta(c);
  const std::vector<int32_t> parents{-1, 0, 0}, tokens{8, 2, 3}, offsets{0, 2, 3, 4}, pages{5, 1, 2, 9},
      queries{1, 2, 2};
  ta.plan_tree({parents, tokens, offsets, pages, queries, {}});
  const Workload& w = ta.workload();
  HostTensors h = make_random_inputs(w, 7);
  const std::vector<double> ref = reference_attention(w, h.args());
  struct Layout {
    int64_t q, out, token, page;
    const char* what;
  };
  for (const Layout& l : {Layout{768, 320, 256, 1024, "q of a fused QKV, out padded, K/V interleaved per token"},
                          Layout{-256, -256, -128, -512, "every axis reversed"},
                          Layout{256, -512, 256, 896, "pages as tight as their rows allow, out reversed"},
                          Layout{512, 256, 128, -4096, "pages reversed, far apart"}}) {
    StridedCopy s(w, h, l.q, l.out, l.token, l.page);
    ASSERT_EQ(test_support::error_text([&] { ta.run(s.args()); }), "(accepted)") << l.what;
    EXPECT_LE(relative_error(w, s.dense_out(w).data(), ref), 2e-3) << l.what;
  }
  struct Refused {
    int64_t q, out, token, page;
    std::string error;
  };
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  for (const Refused& r : std::vector<Refused>{
           {8, 0, 0, 0, "q_stride = 8: the queries' rows of q overlap (|q_stride| < num_qo_heads x head_dim = 256)"},
           {-255, 0, 0, 0, "q_stride = -255: the queries' rows of q overlap"},
           {0, -8, 0, 0,
            "out_stride = -8: the queries' rows of out overlap (|out_stride| < num_qo_heads x head_dim = 256)"},
           {0, 0, 64, 0,
            "kv_token_stride = 64: a page's token rows overlap (|kv_token_stride| < num_kv_heads x head_dim = 128)"},
           {0, 0, -1, 0, "kv_token_stride = -1: a page's token rows overlap"},
           {0, 0, 256, 895, "kv_page_stride = 895: the pool's pages overlap (|kv_page_stride| < (page_size - 1) x "
                            "|kv_token_stride| + num_kv_heads x head_dim = 896)"},
           {0, 0, 0, -256, "kv_page_stride = -256: the pool's pages overlap"},
           {small, 0, 0, 0, "q_stride = " + std::to_string(small) + ": 3 queries' rows of q span more bytes"},
           {0, big / 2, 0, 0, "out_stride = " + std::to_string(big / 2) + ": 3 queries' rows of out span more bytes"},
           {0, 0, 0, big / 8, "kv_page_stride = " + std::to_string(big / 8) + ": 16 pages of the pools span more bytes"},
           {0, 0, big / 2, big, "kv_page_stride = " + std::to_string(big) + ": the pool's pages overlap"},
           {0, 0, big / 2, 0,
            "kv_token_stride = " + std::to_string(big / 2) + ": a page of 4 tokens spans more elements than int64"},
       }) {
    HostTensors t = h;
    AttentionArgs a = t.args();
    a.q_stride = r.q;
    a.out_stride = r.out;
    a.kv_token_stride = r.token;
    a.kv_page_stride = r.page;
    const std::string text = test_support::error_text([&] { ta.run(a); });
    EXPECT_NE(text.find(r.error), std::string::npos) << text;
    EXPECT_TRUE(std::isnan(load_element(t.out.data(), t.dtype, 0))) << r.error << ": out written";
  }
}

// Configuration values past what the runtime can represent are refused,
// naming the field and the value, instead of being read as something else
// (found by an adversarial probe of the C++ API).
TEST(TreeAttentionCpu, ConfigOutOfRangeIsRefusedNotReinterpreted) {
  WorkloadParams p;
  p.heads = {4, 2, 64};
  p.page_size = 4;
  const TreeAttentionConfig c = cpu_config(p, 16);
  using test_support::error_text;
  const auto refused = [&](auto&& edit) {
    TreeAttentionConfig bad = c;
    edit(bad);
    return error_text([&] { TreeAttention x(bad); });
  };
  // Page ids are int32: with 2^33 pages a draft row's page (row / page_size)
  // was truncated to another page, and num_pages x page_size could overflow.
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.num_pages = int64_t(1) << 33; })
                .find("num_pages = 8589934592 is out of range [1, 2147483647]"),
            std::string::npos);
  // Plan options set directly, bypassing set_plan_option: num_sms x
  // ctas_per_sm overflowed int, and zero or negative values were clamped.
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.plan_options.num_sms = 2147483647; })
                .find("num_sms = 2147483647 must be an integer in [1, 1024]"),
            std::string::npos);
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.plan_options.num_sms = -1; }).find("num_sms = -1"),
            std::string::npos);
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.plan_options.ctas_per_sm = -7; })
                .find("ctas_per_sm = -7 must be an integer in [1, 64]"),
            std::string::npos);
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.plan_options.chunk_tokens = 0; }).find("chunk_tokens = 0"),
            std::string::npos);
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.plan_options.extra["tile_row"] = 64; })
                .find("unknown key 'tile_row'"),
            std::string::npos);
  // 0 derives a plan capacity; a negative one was derived too.
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.max_units = -3; }).find("max_units = -3 must be >= 0"),
            std::string::npos);
  EXPECT_NE(refused([](TreeAttentionConfig& b) { b.max_slots = -1; }).find("max_slots = -1 must be >= 0"),
            std::string::npos);
  // A pool past the size a plan accepts (2^46 elements) was taken here and
  // every plan then failed on it: refused at construction, as a plan names it.
  EXPECT_NE(refused([](TreeAttentionConfig& b) {
              b.num_pages = 2147483647;
              b.page_size = 65536;
            }).find("num_pages: 2147483647 pages of 65536 tokens x 2 kv heads x 64 exceed the supported pool size"),
            std::string::npos);
  EXPECT_EQ(refused([](TreeAttentionConfig& b) {  // (2^31 - 1) x 256 x 2 x 64 < 2^46: the largest page size
              b.num_pages = 2147483647;
              b.page_size = 256;
            }),
            "(accepted)");
  EXPECT_NE(refused([](TreeAttentionConfig& b) {
              b.num_pages = 2147483647;
              b.page_size = 257;
            }).find("exceed the supported pool size (2^46 elements)"),
            std::string::npos);
  EXPECT_EQ(error_text([&] { TreeAttention x(c); }), "(accepted)");
}

// The plan capacities (max_units, ...) refuse a plan on the CPU as on the
// GPU, so that an engine tested on the CPU meets the same limits; the
// previous plan stays in force.
TEST(TreeAttentionCpu, PlanCapacitiesHoldOnTheCpu) {
  WorkloadParams p;
  p.heads = {4, 2, 64};
  p.page_size = 4;
  TreeAttentionConfig c = cpu_config(p, 16);
  c.planner = "per-query";
  c.max_units = 1;
  c.max_segments = 2;
  TreeAttention ta(c);
  const std::vector<int32_t> parents{-1, 0, 0}, tokens{8, 2, 3}, offsets{0, 2, 3, 4}, pages{0, 1, 2, 3};
  const std::vector<int32_t> one_leaf{1}, two_leaves{1, 2};
  ta.plan_tree({parents, tokens, offsets, pages, one_leaf, {}});  // 1 unit of 2 segments
  EXPECT_EQ(ta.plan().num_units(), 1);
  const std::string error =
      test_support::error_text([&] { ta.plan_tree({parents, tokens, offsets, pages, two_leaves, {}}); });
  EXPECT_NE(error.find("plan units (max_units) = 2 exceeds the capacity 1"), std::string::npos) << error;
  EXPECT_EQ(ta.num_queries(), 1);
  EXPECT_LE(step_error(ta, 1), 2e-3);
}

// Plan extension sums the growth of a unit's tail segments: three leaves of
// one unit, each grown to 2^30 - 1 tokens, grow it by more than 2^31 - 1
// tokens, over any max_extension_tokens, so the step is planned afresh (a
// 32-bit sum wrapped negative and the step extended the last plan).
TEST(TreeAttentionCpu, GrowthPastInt32IsOverTheExtensionLimit) {
  WorkloadParams p;
  p.heads = {1, 1, 64};
  p.page_size = 65536;
  TreeAttentionConfig c = cpu_config(p, 65536);
  c.planner = "flatten";
  c.plan_options.chunk_tokens = 1 << 30;  // one block a leaf once grown
  c.max_extension_tokens = INT32_MAX;
  TreeAttention ta(c);
  const std::vector<int32_t> parents{-1, 0, 0, 0}, tokens{1, 1, 1, 1}, offsets{0, 1, 2, 3, 4}, pages{0, 1, 2, 3},
      queries{1, 2, 3};
  ta.plan_tree({parents, tokens, offsets, pages, queries, {}});
  ASSERT_EQ(ta.plan().num_units(), 1);
  const int32_t big = (1 << 30) - 1, leaf_pages = (big + p.page_size - 1) / p.page_size;
  std::vector<int32_t> grown_tokens{1, big, big, big}, grown_offsets{0, 1}, grown_pages{0};
  int32_t next = 4;
  for (int32_t leaf = 1; leaf <= 3; ++leaf) {
    grown_pages.push_back(leaf);
    for (int32_t i = 1; i < leaf_pages; ++i) grown_pages.push_back(next++);
    grown_offsets.push_back(int32_t(grown_pages.size()));
  }
  ta.plan_tree({parents, grown_tokens, grown_offsets, grown_pages, queries, {}});
  EXPECT_EQ(ta.plan_stats().extended, 0);
  EXPECT_EQ(ta.plan_stats().planned, 2);
}

// A decode loop on one tree: every query's node one token longer per step,
// a fresh page when its last fills. The steps extend the last plan until a
// unit would outgrow max_extension_tokens; every step matches the fp64
// reference (every fourth step) and holds the tree a fresh TreeAttention
// holds; every plan, the extended ones too, passes the validator.
void grow_query_nodes(test_support::Arrays& a, int page_size, int32_t& next_page) {
  std::vector<char> grows(a.parents.size(), 0);
  for (const int32_t v : a.query_nodes) grows[size_t(v)] = 1;
  std::vector<int32_t> pages, offsets{0};
  for (size_t v = 0; v < a.parents.size(); ++v) {
    pages.insert(pages.end(), a.page_ids.begin() + a.page_offsets[v], a.page_ids.begin() + a.page_offsets[v + 1]);
    if (grows[v] && ++a.num_tokens[v] > (a.page_offsets[v + 1] - a.page_offsets[v]) * page_size)
      pages.push_back(next_page++);
    offsets.push_back(int32_t(pages.size()));
  }
  a.page_ids = pages;
  a.page_offsets = offsets;
}

TEST(TreeAttentionCpu, DecodeStepsExtendTheLastPlanUntilAUnitOutgrowsTheLimit) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  for (const char* spec : {"fewshot:prompt=100:branches=6:len=9", "kary:arity=3:depth=3:total=300", "pat:B=2,4:L=30,7"}) {
    const Workload w = make_workload(spec, p);
    test_support::Arrays a(w);
    int32_t next_page = int32_t(w.layout.num_pages);
    auto [ta, fresh] = extending_and_fresh(cpu_config(p, w.layout.num_pages + 64 * 40), 16);
    for (int step = 0; step < 40; ++step) {
      ta.plan_tree(a.view());
      fresh.plan_tree(a.view());
      ASSERT_EQ(ta.workload().total_tokens(), fresh.workload().total_tokens()) << spec << " step " << step;
      for (size_t v = 0; v < a.parents.size(); ++v)
        ASSERT_EQ(ta.workload().tree.nodes[v].pages, fresh.workload().tree.nodes[v].pages) << spec << " node " << v;
      // Extended plans are not validated by the runtime (valid by construction): here they are.
      ASSERT_NO_THROW(validate_plan(ta.workload(), ta.plan())) << spec << " step " << step;
      if (step % 4 == 0 || ta.plan_stats().extended == 0)
        EXPECT_LE(step_error(ta, uint64_t(step) + 1), 2e-3) << spec << " step " << step;
      grow_query_nodes(a, p.page_size, next_page);
    }
    const PlanStats s = ta.plan_stats(), f = fresh.plan_stats();
    EXPECT_EQ(f.planned, 40) << spec;
    EXPECT_EQ(f.extended, 0) << spec;
    EXPECT_EQ(s.planned + s.extended, 40) << spec;
    // At most 16 tokens a unit between fresh plans: a step adds one or more.
    EXPECT_GE(s.planned, 40 / 17 + 1) << spec;
    EXPECT_GE(s.extended, 20) << spec;
  }
}

TEST(TreeAttentionCpu, StepsThatAreNotAGrowthArePlannedAfresh) {
  WorkloadParams p;
  p.heads = {4, 4, 64};
  p.page_size = 4;
  const Workload w = make_workload("fewshot:prompt=20:branches=3:len=5", p);  // root 0, leaves 1..3
  TreeAttentionConfig c = cpu_config(p, w.layout.num_pages + 8);
  TreeAttention ta(c);
  test_support::Arrays a(w);
  ta.plan_tree(a.view());
  const int32_t spare = int32_t(w.layout.num_pages);
  auto grown = [&](int32_t node, int32_t page) {  // node + 4 tokens in one more page
    test_support::Arrays g = a;
    g.num_tokens[size_t(node)] += 4;
    g.page_ids.insert(g.page_ids.begin() + g.page_offsets[size_t(node) + 1], page);
    for (size_t v = size_t(node) + 1; v < g.page_offsets.size(); ++v) ++g.page_offsets[v];
    return g;
  };
  // A page another node holds: the fresh plan's validation names it, and
  // the plan in force (and its page bits) stay.
  const int32_t taken = a.page_ids[0];
  const test_support::Arrays reused = grown(1, taken);
  try {
    ta.plan_tree(reused.view());
    ADD_FAILURE() << "a page used twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page id " + std::to_string(taken)), std::string::npos) << e.what();
  }
  EXPECT_EQ(ta.workload().total_tokens(), w.total_tokens());
  EXPECT_EQ(ta.plan_stats().planned, 1);
  // The root has children: its growth is a new tree, not an extension.
  const test_support::Arrays root = grown(0, spare);
  ta.plan_tree(root.view());
  EXPECT_EQ(ta.plan_stats().planned, 2);
  EXPECT_EQ(ta.plan_stats().extended, 0);
  EXPECT_LE(step_error(ta, 2), 2e-3);
  // A leaf's growth extends; then the same page again (the tree as it was
  // before plus the page) is not, and fails validation as a fresh plan.
  a = root;
  const test_support::Arrays leaf = grown(2, spare + 1);
  ta.plan_tree(leaf.view());
  EXPECT_EQ(ta.plan_stats().extended, 1);
  EXPECT_LE(step_error(ta, 3), 2e-3);
  a = leaf;
  EXPECT_THROW(ta.plan_tree(grown(3, spare + 1).view()), Error);
  EXPECT_EQ(ta.plan_stats().extended, 1);
  ta.plan_tree(grown(3, spare + 2).view());  // the failed attempt left no page marked
  EXPECT_EQ(ta.plan_stats().extended, 2);
  EXPECT_LE(step_error(ta, 4), 2e-3);
  TreeAttentionConfig bad = c;
  bad.max_extension_tokens = -1;
  EXPECT_THROW({ TreeAttention x(bad); }, Error);
}

// A step that grows a leaf but also changes a page id some node already had
// is not an extension (the extension compares the kept pages in runs of
// nodes between the ones that gained pages): for every page of every node,
// swapping it for a free page makes the step a fresh plan that holds the new
// page; the same growth without the swap extends.
TEST(TreeAttentionCpu, AStepThatChangesAKeptPageIsPlannedAfresh) {
  WorkloadParams p;
  p.heads = {4, 4, 64};
  p.page_size = 4;
  const Workload w = make_workload("fewshot:prompt=20:branches=3:len=5", p);  // root 0, leaves 1..3
  const TreeAttentionConfig c = cpu_config(p, w.layout.num_pages + 8);
  const Arrays a(w);
  const int32_t spare = int32_t(w.layout.num_pages);
  Arrays grown = a;  // leaf 2 four tokens longer, in a new page: the nodes after it move by a page
  grown.num_tokens[2] += 4;
  grown.page_ids.insert(grown.page_ids.begin() + grown.page_offsets[3], spare);
  for (size_t v = 3; v < grown.page_offsets.size(); ++v) ++grown.page_offsets[v];
  {
    TreeAttention ta(c);
    ta.plan_tree(a.view());
    ta.plan_tree(grown.view());
    EXPECT_EQ(ta.plan_stats().extended, 1);
  }
  int cases = 0;
  for (size_t v = 0; v < a.parents.size(); ++v)
    for (int32_t i = grown.page_offsets[v]; i < grown.page_offsets[v + 1]; ++i) {
      if (v == 2 && i == grown.page_offsets[3] - 1) continue;  // the new page itself
      TreeAttention ta(c);
      ta.plan_tree(a.view());
      Arrays changed = grown;
      changed.page_ids[size_t(i)] = spare + 1;
      ta.plan_tree(changed.view());
      const PlanStats s = ta.plan_stats();
      EXPECT_EQ(s.extended, 0) << "node " << v << " page " << i;
      EXPECT_EQ(s.planned, 2) << "node " << v << " page " << i;
      EXPECT_EQ(ta.workload().tree.nodes[v].pages[size_t(i - grown.page_offsets[v])], spare + 1);
      EXPECT_LE(step_error(ta, uint64_t(i) + 1), 2e-3);
      ++cases;
    }
  EXPECT_GE(cases, 8);
}

// Fresh plans after the first check only the pages of the nodes that differ
// from the last tree's against its kept page bits. A random walk of trees
// (pages moved to free ones, taken from another node, out of range, shared
// in part by a node that starts where another ends, nodes added and
// dropped, the last good tree again) goes through one TreeAttention and,
// for each tree, through Workload::validate on its own: both accept the
// same trees and name the same error, every accepted plan passes the
// validator and holds the tree, and the walk's good steps after a tree
// without shared pages take the page-bits path.
Workload workload_of(const Arrays& a, const WorkloadParams& p, int64_t num_pages) {
  Workload w;
  w.heads = p.heads;
  w.layout = {p.page_size, num_pages, p.dtype, std::nullopt};
  for (size_t v = 0; v < a.parents.size(); ++v) {
    Node n;
    n.parent = a.parents[v];
    n.num_tokens = a.num_tokens[v];
    n.first_slot = a.first_slots[v];
    n.pages.assign(a.page_ids.begin() + a.page_offsets[v], a.page_ids.begin() + a.page_offsets[v + 1]);
    w.tree.nodes.push_back(std::move(n));
  }
  w.query_nodes = a.query_nodes;
  return w;
}

TEST(TreeAttentionCpu, FreshPlansRecheckOnlyChangedPagesAndAgreeWithTheValidator) {
  WorkloadParams p;
  p.heads = {4, 2, 64};
  p.page_size = 4;
  for (const int32_t extension : {0, 16}) {
    std::mt19937_64 rng(11 + extension);
    const auto pick = [&](int64_t n) { return int32_t(rng() % uint64_t(n)); };
    const Workload start = make_workload("random:seed=5:nodes=24", p);
    const int64_t pool = 2 * start.layout.num_pages;  // room for pages moved to free ones
    Arrays good(start), a = good;
    TreeAttentionConfig c = cpu_config(p, pool);
    c.max_extension_tokens = extension;
    TreeAttention ta(c);
    ta.plan_tree(good.view());
    // Node v's pages as a vector, and the arrays with v's pages replaced.
    const auto pages_of = [](const Arrays& x, size_t v) {
      return std::vector<int32_t>(x.page_ids.begin() + x.page_offsets[v], x.page_ids.begin() + x.page_offsets[v + 1]);
    };
    const auto with_pages = [&](const Arrays& x, size_t v, const std::vector<int32_t>& pages) {
      Arrays y = x;
      y.page_ids.clear();
      y.page_offsets = {0};
      for (size_t u = 0; u < x.parents.size(); ++u) {
        const std::vector<int32_t> own = u == v ? pages : pages_of(x, u);
        y.page_ids.insert(y.page_ids.end(), own.begin(), own.end());
        y.page_offsets.push_back(int32_t(y.page_ids.size()));
      }
      return y;
    };
    const auto free_page = [&](const Arrays& x) {  // a page no node of x holds
      for (;;) {
        const int32_t pg = pick(pool);
        if (std::find(x.page_ids.begin(), x.page_ids.end(), pg) == x.page_ids.end()) return pg;
      }
    };
    int64_t accepted = 0, rechecked_expected = 0, rejected = 0;
    bool last_shares = false;  // the tree in force has a page shared in part (random trees do not)
    for (int step = 0; step < 400; ++step) {
      a = good;
      const size_t n = a.parents.size();
      const size_t v = size_t(pick(int64_t(n)));
      std::vector<int32_t> pages = pages_of(a, v);
      switch (pick(7)) {
        case 0:  // a page moved to a free one
          if (!pages.empty()) pages[size_t(pick(int64_t(pages.size())))] = free_page(a);
          a = with_pages(a, v, pages);
          break;
        case 1:  // a page another node holds
          if (!pages.empty() && !a.page_ids.empty()) pages[size_t(pick(int64_t(pages.size())))] = a.page_ids[size_t(pick(int64_t(a.page_ids.size())))];
          a = with_pages(a, v, pages);
          break;
        case 2:  // out of range
          if (!pages.empty()) pages[size_t(pick(int64_t(pages.size())))] = pick(2) ? int32_t(pool) : -1;
          a = with_pages(a, v, pages);
          break;
        case 3: {  // a new leaf, starting where node v ends when v's last page has room (shared in part)
          const int32_t end = a.first_slots[v] + a.num_tokens[v];
          const bool share = !pages.empty() && end % p.page_size != 0 && pick(2);
          const int32_t first = share ? end % p.page_size : 0, tokens = 1 + pick(9);
          std::vector<int32_t> own;
          if (share) own.push_back(pages.back());
          while (int64_t(own.size()) * p.page_size < first + tokens) own.push_back(free_page(a));
          a.parents.push_back(int32_t(v));
          a.num_tokens.push_back(tokens);
          a.first_slots.push_back(first);
          a.page_ids.insert(a.page_ids.end(), own.begin(), own.end());
          a.page_offsets.push_back(int32_t(a.page_ids.size()));
          a.query_nodes.push_back(int32_t(n));
          break;
        }
        case 4: {  // the last node dropped, if it is a leaf and some query stays
          const int32_t last = int32_t(n) - 1;
          if (std::count(a.parents.begin(), a.parents.end(), last) != 0) break;
          std::vector<int32_t> q;
          for (const int32_t x : a.query_nodes)
            if (x != last) q.push_back(x);
          if (q.empty()) break;
          a.query_nodes = q;
          a.parents.pop_back();
          a.num_tokens.pop_back();
          a.first_slots.pop_back();
          a.page_offsets.pop_back();
          a.page_ids.resize(size_t(a.page_offsets.back()));
          break;
        }
        case 5:  // two nodes swap a page each (valid: each page still used once)
          if (!pages.empty()) {
            const size_t u = size_t(pick(int64_t(n)));
            std::vector<int32_t> other = pages_of(a, u);
            if (u != v && !other.empty() && a.first_slots[u] == 0 && a.first_slots[v] == 0) {
              std::swap(pages.front(), other.front());
              a = with_pages(with_pages(a, v, pages), u, other);
            }
          }
          break;
        default:  // the last good tree again
          break;
      }
      std::string expected, got;
      ValidateScratch sc;
      try {
        workload_of(a, p, pool).validate(&sc);
      } catch (const Error& e) {
        expected = e.what();
      }
      const PlanStats before = ta.plan_stats();
      try {
        ta.plan_tree(a.view());
      } catch (const Error& e) {
        got = e.what();
      }
      ASSERT_EQ(got, expected) << "step " << step;
      if (!got.empty()) {
        ++rejected;
        continue;
      }
      ++accepted;
      const PlanStats after = ta.plan_stats();
      // A page shared in part, before or now, takes the full check.
      if (after.planned > before.planned && !last_shares && !sc.pages_shared) ++rechecked_expected;
      good = a;
      ASSERT_EQ(ta.workload().tree.nodes.size(), a.parents.size());
      for (size_t u = 0; u < a.parents.size(); ++u) ASSERT_EQ(ta.workload().tree.nodes[u].pages, pages_of(a, u));
      ASSERT_NO_THROW(validate_plan(ta.workload(), ta.plan())) << "step " << step;
      if (step % 16 == 0) EXPECT_LE(step_error(ta, uint64_t(step) + 1), 2e-3) << "step " << step;
      last_shares = sc.pages_shared;
    }
    EXPECT_GE(accepted, 150) << "extension " << extension;
    EXPECT_GE(rejected, 50) << "extension " << extension;
    EXPECT_EQ(ta.plan_stats().pages_rechecked, rechecked_expected) << "extension " << extension;
    EXPECT_GE(rechecked_expected, 50) << "extension " << extension;
  }
}

// One object, two threads: one plans two trees in turn (as many queries, other
// shapes, so that each step is planned afresh), the other runs. Every run sees
// one whole plan: its output is bit for bit that tree's alone. Before the
// runtime held a lock, the run read a plan being swapped out and crashed.
TEST(TreeAttentionCpu, RunsAndPlansFromTwoThreadsSeeOneWholePlan) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  p.page_size = 4;
  const Workload wa = make_workload("fewshot:prompt=300:branches=16:len=9", p);
  const Workload wb = make_workload("fewshot:prompt=60:branches=16:len=40", p);
  ASSERT_EQ(wa.num_queries(), wb.num_queries());
  const Workload& big = wa.layout.num_pages >= wb.layout.num_pages ? wa : wb;
  TreeAttentionConfig c = cpu_config(p, big.layout.num_pages);
  c.cpu_threads = 1;
  c.max_extension_tokens = 0;
  const Arrays a(wa), b(wb);
  HostTensors h = make_random_inputs(big, 3);  // the larger pool; q and out of 16 queries serve both
  AttentionArgs args = h.args();
  args.num_queries = wa.num_queries();
  const auto output_of = [&](const Arrays& t) {
    TreeAttention one(c);
    one.plan_tree(t.view());
    one.run(args);
    return h.out;
  };
  const std::vector<uint8_t> out_a = output_of(a), out_b = output_of(b);
  ASSERT_NE(out_a, out_b);

  TreeAttention ta(c);
  ta.plan_tree(a.view());
  std::atomic<bool> done{false};
  std::thread planner([&] {
    for (int i = 0; i < 1000; ++i) ta.plan_tree((i % 2 ? a : b).view());
    done = true;
  });
  int runs = 0, wrong = 0;
  while (!done || runs < 50) {
    ta.run(args);
    wrong += h.out != out_a && h.out != out_b;
    ++runs;
  }
  planner.join();
  EXPECT_EQ(wrong, 0) << "of " << runs << " runs";

  // The query count the tensors hold is checked under the same lock.
  args.num_queries = wa.num_queries() - 1;
  EXPECT_NE(test_support::error_text([&] { ta.run(args); })
                .find("the tensors hold 15 queries, the plan in force 16"),
            std::string::npos);
}

}  // namespace
}  // namespace treeattn
