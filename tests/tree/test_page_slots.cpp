// Workload::validate's page check: nodes that start inside a page
// (Node::first_slot) share pages only in disjoint slots; the stamp path (a
// reused ValidateScratch, or a pool not much larger than the tree) and the
// sort path (a pool far larger than the tree) accept and reject the same trees.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "treeattn/tree.hpp"

namespace treeattn {
namespace {

Workload base(int page_size, int64_t num_pages) {
  Workload w;
  w.heads = {4, 2, 64};
  w.layout.page_size = page_size;
  w.layout.num_pages = num_pages;
  return w;
}

// Validates with a scratch, without one, and with the pool made huge (the
// sort path); returns the error text ("" when accepted) after checking that
// all three agree.
std::string check_all_paths(Workload w) {
  auto run = [](const Workload& x, ValidateScratch* s) -> std::string {
    try {
      x.validate(s);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  };
  ValidateScratch scratch;
  const std::string a = run(w, &scratch), b = run(w, nullptr);
  const std::string c = run(w, &scratch);  // the scratch reused: a new stamp
  Workload huge = w;
  huge.layout.num_pages = int64_t(1) << 34;
  const std::string d = run(huge, nullptr);
  EXPECT_EQ(a.empty(), b.empty()) << a << " | " << b;
  EXPECT_EQ(a, c);
  EXPECT_EQ(a.empty(), d.empty()) << a << " | " << d;
  return a;
}

TEST(PageSlots, DraftTokensShareTheirRequestsPage) {
  Workload w = base(8, 4);
  w.tree.nodes = {{-1, 11, {2, 0}, 0}};                  // prefix: page 2 full, page 0 slots 0..2
  w.tree.nodes.push_back({0, 1, {0}, 3});                // draft at page 0 slot 3
  w.tree.nodes.push_back({1, 1, {0}, 4});                // its child at slot 4
  w.tree.nodes.push_back({0, 6, {0, 1}, 5});             // a 6-token node from slot 5: pages 0 and 1
  w.query_nodes = {1, 2, 3};
  EXPECT_EQ(check_all_paths(w), "");
  EXPECT_EQ(w.tree.nodes[3].token_row(0, 8), 5);
  EXPECT_EQ(w.tree.nodes[3].token_row(3, 8), 8 + 0);     // slot 8 -> page 1 slot 0
}

TEST(PageSlots, OverlapsAndBadSlotsAreRejected) {
  Workload w = base(8, 4);
  w.tree.nodes = {{-1, 11, {2, 0}, 0}, {0, 1, {0}, 2}};  // slot 2 of page 0 is the prefix's
  w.query_nodes = {1};
  EXPECT_NE(check_all_paths(w).find("page id 0 slots [2, 3) are also used by node 0"), std::string::npos)
      << check_all_paths(w);
  w.tree.nodes[1] = {0, 1, {0}, 8};
  EXPECT_NE(check_all_paths(w).find("first_slot = 8 is out of range [0, 8)"), std::string::npos);
  w.tree.nodes[1] = {0, 6, {0}, 5};                       // 6 tokens from slot 5 need 2 pages
  EXPECT_NE(check_all_paths(w).find("(expected 2)"), std::string::npos);
  w.tree.nodes[1] = {0, 8, {2}, 0};                       // a whole page used twice
  EXPECT_NE(check_all_paths(w).find("page id 2"), std::string::npos);
}

// Random forests whose nodes take slot ranges of a few pages, sometimes
// overlapping: every path agrees on every tree.
TEST(PageSlots, StampAndSortPathsAgreeOnRandomTrees) {
  std::mt19937 rng(5);
  int accepted = 0, rejected = 0;
  for (int t = 0; t < 3000; ++t) {
    const int ps = 1 + int(rng() % 8);
    const int64_t pages = 6;
    Workload w = base(ps, pages);
    const int n = 1 + int(rng() % 5);
    for (int v = 0; v < n; ++v) {
      Node node;
      node.parent = v == 0 ? -1 : int32_t(rng() % v);
      node.first_slot = int32_t(rng() % ps);
      node.num_tokens = int32_t(rng() % (2 * ps + 1));
      const int64_t need = node.num_tokens == 0 ? 0 : (node.first_slot + node.num_tokens + ps - 1) / ps;
      for (int64_t i = 0; i < need; ++i) node.pages.push_back(int32_t(rng() % pages));
      w.tree.nodes.push_back(node);
    }
    w.query_nodes = {int32_t(rng() % n)};
    (check_all_paths(w).empty() ? accepted : rejected)++;
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(rejected, 100);
}

// keep_page_bits (the runtime's plan extension takes them): a tree that
// passes leaves exactly its pages' bits set, and its partial pages'; one that
// fails leaves them clear. pages_shared says whether two nodes share a page,
// on the bit path and on the sort path alike.
TEST(PageSlots, KeptBitsHoldTheTreesPagesAndSayWhetherNodesSharePages) {
  Workload w = base(8, 130);
  w.tree.nodes = {{-1, 11, {2, 129}, 0}};  // page 2 whole, page 129 slots 0..2
  w.tree.nodes.push_back({0, 8, {7}, 0});  // page 7 whole
  w.query_nodes = {1};
  ValidateScratch s;
  s.keep_page_bits = true;
  w.validate(&s);
  ASSERT_TRUE(s.page_bits_kept);
  EXPECT_FALSE(s.pages_shared);
  ASSERT_GE(s.page_used.size(), 3u);
  EXPECT_EQ(s.page_used[0], (uint64_t(1) << 2) | (uint64_t(1) << 7));
  EXPECT_EQ(s.page_used[2], uint64_t(1) << 1);  // page 129
  EXPECT_EQ(s.page_partial[0], 0u);
  EXPECT_EQ(s.page_partial[2], uint64_t(1) << 1);
  // The caller clears them; a failing tree leaves them clear and not kept.
  std::fill(s.page_used.begin(), s.page_used.end(), 0);
  std::fill(s.page_partial.begin(), s.page_partial.end(), 0);
  Workload bad = w;
  bad.tree.nodes[1].pages = {2};  // page 2 twice
  EXPECT_THROW(bad.validate(&s), Error);
  EXPECT_FALSE(s.page_bits_kept);
  for (size_t i = 0; i < s.page_used.size(); ++i) EXPECT_EQ(s.page_used[i] | s.page_partial[i], 0u) << "word " << i;
  // A draft token in its request's last page: shared, on both paths.
  Workload draft = w;
  draft.tree.nodes.push_back({0, 1, {129}, 3});  // page 129 slot 3
  draft.query_nodes = {1, 2};
  draft.validate(&s);
  EXPECT_TRUE(s.page_bits_kept);
  EXPECT_TRUE(s.pages_shared);
  std::fill(s.page_used.begin(), s.page_used.end(), 0);
  std::fill(s.page_partial.begin(), s.page_partial.end(), 0);
  for (const bool shared : {false, true}) {
    Workload huge = shared ? draft : w;
    huge.layout.num_pages = int64_t(1) << 34;  // no bits: every use sorted
    ValidateScratch t;
    t.keep_page_bits = true;
    huge.validate(&t);
    EXPECT_FALSE(t.page_bits_kept);
    EXPECT_EQ(t.pages_shared, shared);
  }
}

}  // namespace
}  // namespace treeattn
