// RadixCache unit tests: match, insert, split, lock/unlock, eviction order,
// alloc/free, export for planning, and every error path (the message names the
// field and value; the cache is unchanged afterwards).
#include <gtest/gtest.h>

#include <vector>

#include "cache/cache_test_util.hpp"
#include "treeattn/cache.hpp"
#include "treeattn/tree.hpp"

using namespace treeattn;

namespace {
using Ids = std::vector<int32_t>;

// A snapshot of the counters a failed operation must leave alone.
struct Counters {
  int64_t free, cached, evictable, nodes;
  bool operator==(const Counters&) const = default;
};
Counters counters(const RadixCache& c) {
  return {c.num_free_pages(), c.num_cached_pages(), c.num_evictable_pages(), c.num_nodes()};
}

// Caches `tokens` with freshly allocated pages; returns the node.
int32_t put(RadixCache& c, const Ids& tokens) {
  Ids pages = c.alloc(static_cast<int64_t>(tokens.size()) / c.page_size());
  return c.insert(tokens, pages);
}
}  // namespace

TEST(RadixCache, EmptyCacheMatchesNothing) {
  RadixCache c(16, 4);
  EXPECT_EQ(c.num_pages(), 16);
  EXPECT_EQ(c.page_size(), 4);
  auto m = c.match_prefix(Ids{1, 2, 3, 4, 5});
  EXPECT_EQ(m.node, RadixCache::kRoot);
  EXPECT_EQ(m.num_tokens, 0);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_EQ(c.num_free_pages(), 16);
  EXPECT_EQ(c.num_cached_pages(), 0);
  EXPECT_EQ(c.num_nodes(), 1);
  c.check();
}

TEST(RadixCache, InsertThenMatchRoundsDownToPages) {
  RadixCache c(16, 4);
  Ids tokens{1, 2, 3, 4, 5, 6, 7, 8};
  Ids pages = c.alloc(2);
  const int32_t node = c.insert(tokens, pages);
  EXPECT_NE(node, RadixCache::kRoot);
  EXPECT_EQ(c.num_cached_pages(), 2);
  EXPECT_EQ(c.num_evictable_pages(), 2);
  EXPECT_EQ(c.num_free_pages(), 14);
  c.check();

  auto m = c.match_prefix(Ids{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // the tail is not a whole cached page
  EXPECT_EQ(m.node, node);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.pages, pages);
  // A partial page never matches: 7 tokens give one page, which splits the node.
  auto p = c.match_prefix(Ids{1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(p.pages, Ids{pages[0]});
  EXPECT_NE(p.node, node);
  EXPECT_EQ(c.num_nodes(), 3);
  // A mismatch inside the first page matches nothing.
  EXPECT_EQ(c.match_prefix(Ids{1, 2, 3, 9, 5, 6, 7, 8}).num_tokens, 0);
  c.check();
}

TEST(RadixCache, SplitKeepsTheOldHandleForTheDeeperPart) {
  RadixCache c(16, 1);
  Ids pages = c.alloc(4);
  const int32_t leaf = c.insert(Ids{10, 11, 12, 13}, pages);
  auto m = c.match_prefix(Ids{10, 11, 99});
  EXPECT_EQ(m.num_tokens, 2);
  EXPECT_EQ(m.pages, (Ids{pages[0], pages[1]}));
  const int32_t mid = m.node;
  EXPECT_NE(mid, leaf);
  // The old handle still denotes the whole path.
  auto full = c.match_prefix(Ids{10, 11, 12, 13});
  EXPECT_EQ(full.node, leaf);
  EXPECT_EQ(full.pages, pages);
  auto e = c.export_tree(Ids{leaf});
  EXPECT_EQ(e.parents, (Ids{-1, 0}));
  EXPECT_EQ(e.num_tokens, (Ids{2, 2}));
  EXPECT_EQ(e.node_index, Ids{1});
  // Splitting exactly at a node boundary creates nothing.
  const int64_t nodes = c.num_nodes();
  EXPECT_EQ(c.match_prefix(Ids{10, 11}).node, mid);
  EXPECT_EQ(c.num_nodes(), nodes);
  c.check();
}

TEST(RadixCache, InsertSharedPrefixFreesDuplicatesAndKeepsSamePages) {
  RadixCache c(32, 2);
  Ids a_tokens{1, 1, 2, 2, 3, 3};
  Ids a_pages = c.alloc(3);
  const int32_t a = c.insert(a_tokens, a_pages);
  // A second request computed the same first two pages into its own pages and
  // a different third page: the duplicates go back to the pool.
  Ids b_tokens{1, 1, 2, 2, 4, 4};
  Ids b_pages = c.alloc(3);
  const int64_t free_before = c.num_free_pages();
  const int32_t b = c.insert(b_tokens, b_pages);
  EXPECT_EQ(c.num_free_pages(), free_before + 2);
  EXPECT_EQ(c.num_cached_pages(), 4);
  EXPECT_NE(a, b);
  auto m = c.match_prefix(b_tokens);
  EXPECT_EQ(m.node, b);
  EXPECT_EQ(m.pages, (Ids{a_pages[0], a_pages[1], b_pages[2]}));
  // Inserting the very same page ids again changes nothing.
  EXPECT_EQ(c.insert(a_tokens, a_pages), a);
  EXPECT_EQ(c.num_cached_pages(), 4);
  EXPECT_EQ(c.num_free_pages(), free_before + 2);
  // A request that matched a prefix and extends it passes the cached pages back.
  auto pm = c.match_prefix(Ids{1, 1, 2, 2, 3, 3, 7, 7});
  EXPECT_EQ(pm.node, a);
  Ids tail = c.alloc(1);
  Ids ext_pages = pm.pages;
  ext_pages.push_back(tail[0]);
  const int32_t ext = c.insert(Ids{1, 1, 2, 2, 3, 3, 7, 7}, ext_pages);
  EXPECT_EQ(c.num_cached_pages(), 5);
  EXPECT_EQ(c.match_prefix(Ids{1, 1, 2, 2, 3, 3, 7, 7}).node, ext);
  // Inserting a prefix that ends at a node returns that node.
  const int32_t two = c.insert(Ids{1, 1, 2, 2}, Ids{a_pages[0], a_pages[1]});
  EXPECT_EQ(c.match_prefix(Ids{1, 1, 2, 2}).node, two);
  // Inserting a prefix that ends inside a node splits it there.
  Ids q = c.alloc(2);
  const int32_t long_node = c.insert(Ids{5, 5, 6, 6}, q);
  const int64_t nodes = c.num_nodes();
  const int32_t short_node = c.insert(Ids{5, 5}, Ids{q[0]});
  EXPECT_NE(short_node, long_node);
  EXPECT_EQ(c.num_nodes(), nodes + 1);
  EXPECT_EQ(c.match_prefix(Ids{5, 5, 8, 8}).node, short_node);
  EXPECT_EQ(c.match_prefix(Ids{5, 5, 6, 6}).node, long_node);
  EXPECT_EQ(c.num_cached_pages(), 7);
  EXPECT_EQ(c.insert(Ids{}, Ids{}), RadixCache::kRoot);
  c.check();
}

TEST(RadixCache, InsertErrorsNameTheFieldAndChangeNothing) {
  RadixCache c(16, 4);
  Ids cached_pages = c.alloc(2);
  c.insert(Ids{1, 2, 3, 4, 5, 6, 7, 8}, cached_pages);
  Ids mine = c.alloc(2);
  const Counters before = counters(c);
  EXPECT_ERROR_HAS(c.insert(Ids{1, 2, 3}, Ids{mine[0]}), "insert: tokens.size() = 3 is not a multiple of page_size = 4");
  EXPECT_ERROR_HAS(c.insert(Ids{1, 2, 3, 4, 9, 9, 9, 9}, Ids{mine[0]}),
                    "insert: pages.size() = 1 but tokens.size() = 8 needs 2");
  EXPECT_ERROR_HAS(c.insert(Ids{9, 9, 9, 9}, Ids{16}), "insert: pages[0] = 16 is out of range [0, 16)");
  EXPECT_ERROR_HAS(c.insert(Ids{9, 9, 9, 9}, Ids{-3}), "pages[0] = -3 is out of range");
  EXPECT_ERROR_HAS(c.insert(Ids{9, 9, 9, 9}, Ids{15}), "insert: pages[0] = 15 is free (not handed out by alloc)");
  EXPECT_ERROR_HAS(c.insert(Ids{9, 9, 9, 9, 8, 8, 8, 8}, Ids{mine[0], mine[0]}),
                    "pages[1] = " + std::to_string(mine[0]) + " is listed twice");
  // A page cached for another position cannot be given again.
  EXPECT_ERROR_HAS(c.insert(Ids{9, 9, 9, 9}, Ids{cached_pages[1]}),
                    "pages[0] = " + std::to_string(cached_pages[1]) + " is cached by node");
  EXPECT_ERROR_HAS(c.insert(Ids{1, 2, 3, 4, 5, 6, 7, 8}, Ids{cached_pages[1], cached_pages[0]}),
                    "pages[0] = " + std::to_string(cached_pages[1]) + " is cached by node",
                    "but this position caches page " + std::to_string(cached_pages[0]));
  // The failing page comes after a new suffix: nothing was inserted.
  EXPECT_ERROR_HAS(c.insert(Ids{1, 2, 3, 4, 5, 6, 7, 0, 4, 4, 4, 4}, Ids{cached_pages[0], mine[0], 15}),
                    "pages[2] = 15 is free");
  EXPECT_EQ(counters(c), before);
  EXPECT_EQ(c.peek_prefix(Ids{1, 2, 3, 4, 5, 6, 7, 0}).num_tokens, 4);
  c.check();
  c.free(mine);
  c.check();
}

TEST(RadixCache, LockedPathsAreNeverEvicted) {
  RadixCache c(16, 1);
  const int32_t a = put(c, Ids{1, 2, 3});
  const int32_t b = put(c, Ids{1, 2, 4, 5});  // splits: [1 2] -> {[3], [4 5]}
  EXPECT_EQ(c.num_cached_pages(), 5);
  c.lock(b);
  EXPECT_EQ(c.num_evictable_pages(), 1);  // only [3]
  c.check();
  EXPECT_EQ(c.evict(100), 1);
  EXPECT_EQ(c.num_cached_pages(), 4);
  EXPECT_EQ(c.peek_prefix(Ids{1, 2, 4, 5}).num_tokens, 4);
  EXPECT_ERROR_HAS(c.lock(a), "lock: node " + std::to_string(a) + " is not a live node");
  // Locks count: two locks need two unlocks.
  c.lock(b);
  c.unlock(b);
  EXPECT_EQ(c.num_evictable_pages(), 0);
  c.unlock(b);
  EXPECT_EQ(c.num_evictable_pages(), 4);
  EXPECT_ERROR_HAS(c.unlock(b), "unlock: node " + std::to_string(b) + " is not locked");
  c.check();
  EXPECT_EQ(c.evict(1), 2);  // the whole leaf [4 5]
  EXPECT_EQ(c.evict(1), 2);  // then its parent [1 2], now a leaf
  EXPECT_EQ(c.num_cached_pages(), 0);
  EXPECT_EQ(c.num_free_pages(), 16);
  EXPECT_EQ(c.num_nodes(), 1);
  EXPECT_EQ(c.evict(5), 0);
  c.check();
}

TEST(RadixCache, UnlockMatchesLockNotTheAncestors) {
  RadixCache c(8, 1);
  const int32_t leaf = put(c, Ids{1, 2, 3});
  const int32_t mid = c.match_prefix(Ids{1, 2}).node;
  c.lock(leaf);
  // mid is referenced through leaf but was never locked itself.
  EXPECT_ERROR_HAS(c.unlock(mid), "unlock: node " + std::to_string(mid) + " is not locked", "(locks held on nodes below it: 1)");
  EXPECT_ERROR_HAS(c.unlock(RadixCache::kRoot), "unlock: node 0 is not locked");
  EXPECT_ERROR_HAS(c.unlock(99), "unlock: node 99 is not a live node");
  EXPECT_ERROR_HAS(c.lock(-1), "lock: node -1 is not a live node");
  c.lock(RadixCache::kRoot);  // allowed: a request that matched nothing holds the root
  c.unlock(RadixCache::kRoot);
  c.unlock(leaf);
  c.check();
}

TEST(RadixCache, EvictsLeastRecentlyUsedFirst) {
  RadixCache c(16, 2);
  put(c, Ids{1, 1});
  put(c, Ids{2, 2});
  put(c, Ids{3, 3});
  c.match_prefix(Ids{1, 1});  // 1 is now the most recent: 2 goes first, then 3
  EXPECT_EQ(c.evict(1), 1);
  EXPECT_EQ(c.peek_prefix(Ids{2, 2}).num_tokens, 0);
  EXPECT_EQ(c.peek_prefix(Ids{1, 1}).num_tokens, 2);
  EXPECT_EQ(c.peek_prefix(Ids{3, 3}).num_tokens, 2);
  // peek_prefix does not count as a use.
  c.peek_prefix(Ids{3, 3});
  EXPECT_EQ(c.evict(1), 1);
  EXPECT_EQ(c.peek_prefix(Ids{3, 3}).num_tokens, 0);
  EXPECT_EQ(c.peek_prefix(Ids{1, 1}).num_tokens, 2);
  EXPECT_ERROR_HAS(c.evict(-1), "evict of -1 pages");
  c.check();
}

TEST(RadixCache, AllocEvictsWhenNeededAndFailsCleanly) {
  RadixCache c(10, 1);
  const int32_t locked = put(c, Ids{1, 2, 3});
  put(c, Ids{4, 5});
  c.lock(locked);
  Ids mine = c.alloc(4);  // 10 - 5 cached = 5 free: no eviction yet
  EXPECT_EQ(c.num_cached_pages(), 5);
  EXPECT_EQ(c.num_free_pages(), 1);
  const Counters before = counters(c);
  // 1 free + 2 evictable < 4.
  EXPECT_ERROR_HAS(c.alloc(4), "kv cache: 4 pages requested, 1 free + 2 evictable of 10",
                    "3 cached and locked, 4 handed out to requests");
  EXPECT_EQ(counters(c), before);
  EXPECT_ERROR_HAS(c.alloc(-2), "alloc of -2 pages");
  Ids more = c.alloc(3);  // evicts [4 5]
  EXPECT_EQ(more.size(), 3u);
  EXPECT_EQ(c.num_cached_pages(), 3);
  EXPECT_EQ(c.num_free_pages(), 0);
  EXPECT_EQ(c.peek_prefix(Ids{4, 5}).num_tokens, 0);
  c.check();
  c.free(more);
  c.free(mine);
  c.unlock(locked);
  EXPECT_EQ(c.num_free_pages(), 7);
  c.check();
}

TEST(RadixCache, FreeErrorsNameThePage) {
  RadixCache c(8, 1);
  Ids cached = c.alloc(2);
  const int32_t node = c.insert(Ids{5, 6}, cached);
  Ids mine = c.alloc(2);
  const Counters before = counters(c);
  EXPECT_ERROR_HAS(c.free(Ids{mine[0], cached[1]}),
                    "free: pages[1] = " + std::to_string(cached[1]) + " is cached by node " + std::to_string(node));
  EXPECT_ERROR_HAS(c.free(Ids{mine[0], 7}), "free: pages[1] = 7 is already free");
  EXPECT_ERROR_HAS(c.free(Ids{8}), "free: pages[0] = 8 is out of range [0, 8)");
  EXPECT_ERROR_HAS(c.free(Ids{mine[1], mine[1]}), "pages[1] = " + std::to_string(mine[1]) + " is already free");
  EXPECT_EQ(counters(c), before);
  c.free(mine);
  c.check();
}

TEST(RadixCache, BadConstruction) {
  EXPECT_ERROR_HAS(RadixCache(8, 0), "page_size = 0 must be >= 1");
  EXPECT_ERROR_HAS(RadixCache(0, 4), "num_pages = 0");
}

TEST(RadixCache, ExportTreeIsTheSmallestForestOfThePaths) {
  RadixCache c(32, 2);
  // root -> [1 1] -> { [2 2 3 3], [4 4] };  root -> [9 9]
  const int32_t x = put(c, Ids{1, 1, 2, 2, 3, 3});
  const int32_t y = put(c, Ids{1, 1, 4, 4});
  const int32_t z = put(c, Ids{9, 9});
  const int32_t shared = c.match_prefix(Ids{1, 1}).node;
  put(c, Ids{7, 7});  // not requested: not exported
  auto px = c.peek_prefix(Ids{1, 1, 2, 2, 3, 3}).pages;
  auto py = c.peek_prefix(Ids{1, 1, 4, 4}).pages;

  auto e = c.export_tree(Ids{y, x, RadixCache::kRoot, z, y});
  // y's path first: shared (0), y (1); then x under shared (2); then z (3).
  EXPECT_EQ(e.parents, (Ids{-1, 0, 0, -1}));
  EXPECT_EQ(e.num_tokens, (Ids{2, 2, 4, 2}));
  EXPECT_EQ(e.page_offsets, (Ids{0, 1, 2, 4, 5}));
  EXPECT_EQ(e.page_ids, (Ids{px[0], py[1], px[1], px[2], c.peek_prefix(Ids{9, 9}).pages[0]}));
  EXPECT_EQ(e.node_index, (Ids{1, 2, -1, 3, 1}));
  EXPECT_EQ(c.export_tree(Ids{shared}).parents, Ids{-1});

  auto none = c.export_tree(Ids{});
  EXPECT_TRUE(none.parents.empty());
  EXPECT_EQ(none.page_offsets, Ids{0});
  EXPECT_ERROR_HAS(c.export_tree(Ids{x, 1000}), "export_tree: node 1000 is not a live node");
  c.check();
}

// What an engine does each step: match, lock, allocate a private tail, export
// the cached forest, append one tail node per request, and plan on it.
TEST(RadixCache, ExportPlusTailsIsAValidWorkloadTree) {
  const int ps = 4;
  RadixCache c(64, ps);
  put(c, Ids{1, 2, 3, 4, 5, 6, 7, 8});
  const std::vector<Ids> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9}, {1, 2, 3, 4, 0, 0}, {7, 7}};
  std::vector<int32_t> nodes;
  std::vector<int64_t> matched;
  std::vector<Ids> tails;
  for (const Ids& p : prompts) {
    auto m = c.match_prefix(p);
    c.lock(m.node);
    nodes.push_back(m.node);
    matched.push_back(m.num_tokens);
    const int64_t rest = static_cast<int64_t>(p.size()) - m.num_tokens;
    tails.push_back(c.alloc((rest + ps - 1) / ps));
  }
  auto e = c.export_tree(nodes);
  Workload w;
  w.layout.page_size = ps;
  w.layout.num_pages = c.num_pages();
  w.heads = HeadConfig{4, 1, 64};
  for (size_t v = 0; v < e.parents.size(); ++v) {
    Node n;
    n.parent = e.parents[v];
    n.num_tokens = e.num_tokens[v];
    n.pages.assign(e.page_ids.begin() + e.page_offsets[v], e.page_ids.begin() + e.page_offsets[v + 1]);
    w.tree.nodes.push_back(n);
  }
  for (size_t r = 0; r < prompts.size(); ++r) {
    Node tail;
    tail.parent = e.node_index[r];
    tail.num_tokens = static_cast<int32_t>(static_cast<int64_t>(prompts[r].size()) - matched[r]);
    tail.pages = tails[r];
    w.query_nodes.push_back(static_cast<int32_t>(w.tree.nodes.size()));
    w.tree.nodes.push_back(tail);
  }
  EXPECT_EQ(matched, (std::vector<int64_t>{8, 4, 0}));
  w.validate();
  for (size_t r = 0; r < prompts.size(); ++r) {
    int64_t path = 0;
    for (int32_t v : w.path(w.query_nodes[r])) path += w.tree.nodes[static_cast<size_t>(v)].num_tokens;
    EXPECT_EQ(path, static_cast<int64_t>(prompts[r].size()));
  }
  for (size_t r = 0; r < prompts.size(); ++r) {
    c.free(tails[r]);
    c.unlock(nodes[r]);
  }
  c.check();
}
