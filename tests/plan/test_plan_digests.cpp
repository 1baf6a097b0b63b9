// Plans are pinned: a digest of every field of every planner's plan on the
// suites' trees (each head config), the planning benchmark's trees and seeded
// random trees, against tests/data/plan_digests.txt. Work on planning speed
// must leave every plan bit-identical; a change meant to alter plans rewrites
// the file (TREEATTN_WRITE_PLAN_DIGESTS=1 ctest -R PlanDigests) and says why
// in its commit. Also: TreeAttention, which reuses its memory step to step,
// plans exactly what make_plan plans, over a sequence of unrelated trees.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "bench/planning/bench_tree.hpp"
#include "bench/suite.hpp"
#include "support/tree_arrays.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

const std::string kDigestFile = std::string(TREEATTN_SOURCE_DIR) + "/tests/data/plan_digests.txt";

// FNV-1a over the plan's arrays, each preceded by its length.
struct Digest {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001b3ull;
  }
  template <class T>
  void array(const std::vector<T>& v) {
    const uint64_t n = v.size();
    bytes(&n, sizeof n);
    bytes(v.data(), v.size() * sizeof(T));
  }
};

std::string plan_digest(const Plan& p) {
  Digest d;
  d.bytes(p.planner.data(), p.planner.size());
  d.array(p.unit_segment_offset);
  d.array(p.segments);
  d.array(p.unit_query_offset);
  d.array(p.entry_query);
  d.array(p.entry_mask);
  d.array(p.entry_slot);
  d.array(p.unit_tile);
  d.array(p.unit_masked);
  d.array(p.query_slot_offset);
  d.array(p.query_slots);
  d.bytes(&p.num_slots, sizeof p.num_slots);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(d.h));
  return hex;
}

std::string resolve(const std::string& spec) {
  for (const char* f : {"tot:", "medusa:"})
    if (spec.rfind(f, 0) == 0) return f + std::string(TREEATTN_SOURCE_DIR) + "/data/workloads/" + spec.substr(strlen(f));
  return spec;
}

std::string heads_name(const HeadConfig& h) {
  return std::to_string(h.num_qo_heads) + "/" + std::to_string(h.num_kv_heads) + ":d" + std::to_string(h.head_dim);
}

// The pinned workloads, keyed by a name that says how to rebuild them.
std::vector<std::pair<std::string, Workload>> pinned_workloads() {
  std::vector<std::pair<std::string, Workload>> out;
  for (const std::string& name : bench::builtin_suites()) {
    const bench::Suite s = bench::load_suite(name, std::string(TREEATTN_SOURCE_DIR) + "/data");
    for (const HeadConfig& h : s.heads)
      for (const auto& e : s.entries) {
        WorkloadParams p;
        p.heads = h;
        p.heads.head_dim = s.head_dim;
        p.page_size = s.page_size;
        p.dtype = s.dtype;
        out.emplace_back(name + " " + heads_name(p.heads) + " " + e.spec, make_workload(resolve(e.spec), p));
      }
  }
  for (const int nodes : {100, 1000, 10000})
    out.emplace_back("planning_bench_tree nodes=" + std::to_string(nodes),
                     bench::planning_bench_tree(nodes, 256, 42));
  const HeadConfig heads[] = {{32, 8, 128}, {32, 32, 128}, {8, 1, 64}, {16, 2, 256}, {4, 4, 64}};
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    WorkloadParams p;
    p.heads = heads[seed % std::size(heads)];
    p.page_size = seed % 3 == 0 ? 1 : 16;
    p.seed = seed;
    RandomTreeOptions o;
    o.max_nodes = seed % 4 == 0 ? 400 : 24;
    o.max_tokens = seed % 5 == 0 ? 3000 : 300;
    out.emplace_back("random seed=" + std::to_string(seed) + " " + heads_name(p.heads) +
                         " page=" + std::to_string(p.page_size) + " nodes=" + std::to_string(o.max_nodes) +
                         " tokens=" + std::to_string(o.max_tokens),
                     random_workload(seed, p, o));
  }
  return out;
}

TEST(PlanDigests, EveryPlannerPlansWhatItPlannedBefore) {
  std::map<std::string, std::string> now;
  for (const auto& [key, w] : pinned_workloads())
    for (const PlannerInfo& info : planners()) {
      const Plan p = info.fn(w, PlanOptions{});
      validate_plan(w, p);
      now[key + " | " + info.name] = plan_digest(p);
    }
  if (const char* write = std::getenv("TREEATTN_WRITE_PLAN_DIGESTS"); write && std::string(write) == "1") {
    std::ofstream f(kDigestFile);
    f << "# Plan digests (tests/plan/test_plan_digests.cpp): workload | planner<TAB>FNV-1a of the plan's arrays\n";
    for (const auto& [key, digest] : now) f << key << '\t' << digest << '\n';
    GTEST_SKIP() << "wrote " << now.size() << " digests to " << kDigestFile;
  }
  std::ifstream f(kDigestFile);
  ASSERT_TRUE(f) << "cannot read " << kDigestFile;
  std::map<std::string, std::string> pinned;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.rfind('\t');
    pinned[line.substr(0, tab)] = line.substr(tab + 1);
  }
  EXPECT_EQ(pinned.size(), now.size()) << "the set of pinned plans changed";
  int differ = 0;
  for (const auto& [key, digest] : now) {
    const auto it = pinned.find(key);
    if (it == pinned.end() || it->second != digest)
      if (++differ <= 20) ADD_FAILURE() << key << ": digest " << digest << ", pinned "
                                        << (it == pinned.end() ? "none" : it->second);
  }
  EXPECT_EQ(differ, 0) << "plans differ from tests/data/plan_digests.txt";
}

// One TreeAttention over unrelated trees in turn (sizes up and down, with and
// without sharing, draft queries): each step's plan equals a fresh make_plan.
TEST(PlanDigests, RuntimePlansEqualFreshPlans) {
  TreeAttentionConfig c;
  c.heads = {32, 8, 128};
  c.page_size = 16;
  c.num_pages = 1 << 20;
  c.device = Device::cpu;
  c.max_queries = 512;
  c.max_nodes = 16384;
  c.max_page_refs = 1 << 20;
  TreeAttention ta(c);
  std::vector<Workload> trees;
  for (const int nodes : {1000, 100, 10000, 1000}) trees.push_back(bench::planning_bench_tree(nodes, 256, nodes));
  WorkloadParams p;
  p.heads = c.heads;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    p.seed = seed;
    RandomTreeOptions o;
    o.max_nodes = seed % 2 ? 24 : 300;
    trees.push_back(random_workload(seed, p, o));
  }
  trees.push_back(make_workload("pat:B=4:L=300", p));  // no sharing: per-query
  trees.push_back(make_workload("fasttree:N=1,4,16:C=128,32,32", p));
  const auto expect_same = [](const Plan& a, const Plan& b, const std::string& what) {
    EXPECT_EQ(plan_digest(a), plan_digest(b)) << what;
  };
  for (size_t i = 0; i < trees.size(); ++i) {
    trees[i].layout.num_pages = c.num_pages;
    trees[i].name = "step";
    const test_support::Arrays a(trees[i]);
    ta.plan_tree(a.view());
    expect_same(ta.plan(), make_plan("auto", trees[i]), "tree " + std::to_string(i));
  }
  // Draft queries: two drafts under the first query's node, the second under the first.
  const Workload& w = trees[1];
  const test_support::Arrays a(w);
  const std::vector<int32_t> draft_nodes{w.query_nodes[0], 0}, draft_parents{-1, 0};
  const std::vector<int64_t> draft_rows{int64_t(c.num_pages - 1) * 16, int64_t(c.num_pages - 1) * 16 + 1};
  ta.plan_tree_queries(a.view(), {draft_nodes, draft_parents, draft_rows});
  expect_same(ta.plan(), make_plan("auto", ta.workload()), "draft queries");
  ta.plan_tree(a.view());
  expect_same(ta.plan(), make_plan("auto", w), "the tree again after the drafts");
}

}  // namespace
