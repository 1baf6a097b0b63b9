// A decode loop's planning allocates nothing once TreeAttention's buffers have
// grown (issue 17): plan_tree over trees it has planned before, with auto
// choosing node (shared trees) and per-query (no sharing), counted by a
// replaced global operator new. The replacement counts only; it allocates
// with malloc and frees with free. Not under AddressSanitizer, whose own
// operator new checks more.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "bench/planning/bench_tree.hpp"
#include "tests/support/tree_arrays.hpp"
#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

#if !defined(__SANITIZE_ADDRESS__)
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace treeattn {
namespace {

TEST(PlanningAllocations, SteadyStatePlanTreeAllocatesNothing) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "operator new is AddressSanitizer's here";
#endif
  std::vector<Workload> trees = {bench::planning_bench_tree(1000, 256, 42), bench::planning_bench_tree(1000, 256, 7)};
  WorkloadParams p;
  p.heads = trees[0].heads;
  trees.push_back(make_workload("pat:B=64:L=500", p));  // no sharing: per-query
  TreeAttentionConfig c;
  c.heads = trees[0].heads;
  c.page_size = 16;
  c.num_pages = 0;
  for (const Workload& w : trees) c.num_pages = std::max(c.num_pages, w.layout.num_pages);
  c.device = Device::cpu;
  c.max_queries = 256;
  c.max_nodes = 4096;
  c.max_page_refs = 1 << 20;
  TreeAttention ta(c);
  std::vector<test_support::Arrays> arrays;
  for (const Workload& w : trees) arrays.emplace_back(w);
  for (int round = 0; round < 2; ++round)  // every buffer grows to its largest here
    for (const auto& a : arrays) ta.plan_tree(a.view());
  for (size_t i = 0; i < arrays.size(); ++i) {
    const int64_t before = g_allocations.load();
    ta.plan_tree(arrays[i].view());
    EXPECT_EQ(g_allocations.load() - before, 0) << "tree " << i << " (" << ta.plan().planner << ")";
  }
}

}  // namespace
}  // namespace treeattn
