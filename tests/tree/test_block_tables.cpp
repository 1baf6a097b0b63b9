// Block-table builder tests: the radix tree found in hand-made vLLM-style
// batches, a property check against trees with page-aligned prefixes, the
// JSON block-table file, and the errors for pages that cannot be shared.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <random>

#include "tree/builder_test_util.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

using Tables = std::vector<std::vector<int32_t>>;

Workload bt(const Tables& t, const std::vector<int32_t>& lens, int64_t num_pages = 100, int ps = 16) {
  WorkloadParams p;
  p.page_size = ps;
  return from_block_tables(t, lens, num_pages, p);
}

// Node of the query of sequence s, and its (parent, tokens, pages).
void expect_node(const Workload& w, int32_t v, int32_t parent, int32_t tokens, std::vector<int32_t> pages) {
  ASSERT_LT(size_t(v), w.tree.nodes.size());
  EXPECT_EQ(w.tree.nodes[v].parent, parent) << "node " << v;
  EXPECT_EQ(w.tree.nodes[v].num_tokens, tokens) << "node " << v;
  EXPECT_EQ(w.tree.nodes[v].pages, pages) << "node " << v;
}

// Query i's path holds exactly sequence i's pages (its whole block table) and length.
void expect_paths_hold(const Workload& w, const Tables& tables, const std::vector<int32_t>& lens) {
  ASSERT_EQ(size_t(w.num_queries()), tables.size());
  for (int32_t i = 0; i < w.num_queries(); ++i) {
    std::vector<int32_t> pages;
    int64_t len = 0;
    for (int32_t v : w.path(w.query_nodes[i])) {
      pages.insert(pages.end(), w.tree.nodes[v].pages.begin(), w.tree.nodes[v].pages.end());
      len += w.tree.nodes[v].num_tokens;
    }
    EXPECT_EQ(pages, tables[size_t(i)]) << "query " << i;
    EXPECT_EQ(len, lens[size_t(i)]) << "query " << i;
  }
}

}  // namespace

TEST(BlockTables, TwoSequencesShareTwoPagesThenDiverge) {
  const Workload w = bt({{1, 2, 3}, {1, 2, 4}}, {48, 40});
  ASSERT_EQ(w.tree.nodes.size(), 3u);
  expect_node(w, 0, -1, 32, {1, 2});
  expect_node(w, 1, 0, 16, {3});
  expect_node(w, 2, 0, 8, {4});
  EXPECT_EQ(w.query_nodes, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(w.layout.num_pages, 100);
  EXPECT_EQ(w.name, "blocktable");
}

TEST(BlockTables, NestedSharing) {
  // All three share page 1; seqs 0 and 1 also share 2, 3; seq 2 goes its own way.
  const Workload w = bt({{1, 2, 3, 4}, {1, 2, 3, 5}, {1, 6}}, {64, 50, 20});
  ASSERT_EQ(w.tree.nodes.size(), 5u);
  expect_node(w, 0, -1, 16, {1});
  const int32_t q0 = w.query_nodes[0], q1 = w.query_nodes[1], q2 = w.query_nodes[2];
  const int32_t mid = w.tree.nodes[q0].parent;
  EXPECT_EQ(w.tree.nodes[q1].parent, mid);
  expect_node(w, mid, 0, 32, {2, 3});
  expect_node(w, q0, mid, 16, {4});
  expect_node(w, q1, mid, 2, {5});
  expect_node(w, q2, 0, 4, {6});
}

TEST(BlockTables, NoSharing) {
  const Workload w = bt({{1, 2}, {3}, {4, 5, 6}}, {17, 16, 40});
  ASSERT_EQ(w.tree.nodes.size(), 3u);
  expect_node(w, 0, -1, 17, {1, 2});
  expect_node(w, 1, -1, 16, {3});
  expect_node(w, 2, -1, 40, {4, 5, 6});
  EXPECT_EQ(w.query_nodes, (std::vector<int32_t>{0, 1, 2}));
}

TEST(BlockTables, IdenticalSequences) {
  const Workload w = bt({{1, 2}, {1, 2}, {1, 2}}, {20, 20, 20});
  ASSERT_EQ(w.tree.nodes.size(), 1u);
  expect_node(w, 0, -1, 20, {1, 2});
  EXPECT_EQ(w.query_nodes, (std::vector<int32_t>{0, 0, 0}));
}

TEST(BlockTables, SequenceThatIsAPrefixOfAnother) {
  const Workload w = bt({{1, 2}, {1, 2, 3}}, {32, 40});
  ASSERT_EQ(w.tree.nodes.size(), 2u);
  expect_node(w, 0, -1, 32, {1, 2});
  expect_node(w, 1, 0, 8, {3});
  EXPECT_EQ(w.query_nodes, (std::vector<int32_t>{0, 1}));
}

TEST(BlockTables, PaddingPastTheLastPageIsIgnored) {
  const Workload w = bt({{1, 2, 999, -1}}, {20}, 10);
  expect_node(w, 0, -1, 20, {1, 2});
  // In the JSON format too: padding may be -1, and it does not set the default
  // num_pages (a 99999999 there asked verify for TBs of pool).
  const Workload j = block_tables_from_json(
      R"({"page_size": 16, "block_tables": [[1, 2, 99999999, -1], [1, 0]], "seq_lens": [20, 17]})", WorkloadParams{});
  EXPECT_EQ(j.layout.num_pages, 3);
  EXPECT_THROW(block_tables_from_json(R"({"page_size": 16, "block_tables": [[1, -1]], "seq_lens": [20]})",
                                      WorkloadParams{}),
               Error);  // -1 where a page is used
}

TEST(BlockTables, FixtureFile) {
  const Workload w = make_workload("blocktable:" + treeattn_test::fixture("tiny_blocktable.json"), WorkloadParams{});
  EXPECT_EQ(w.name, "blocktable:" + treeattn_test::fixture("tiny_blocktable.json"));
  ASSERT_EQ(w.tree.nodes.size(), 5u);
  EXPECT_EQ(w.layout.num_pages, 64);
  expect_node(w, 0, -1, 32, {7, 3});
  const auto& q = w.query_nodes;
  expect_node(w, q[1], 0, 8, {9});
  const int32_t shared = w.tree.nodes[q[0]].parent;
  EXPECT_EQ(w.tree.nodes[q[2]].parent, shared);
  expect_node(w, shared, 0, 16, {12});
  expect_node(w, q[0], shared, 12, {40});
  expect_node(w, q[2], shared, 2, {41});
}

// A tree whose non-leaf nodes hold whole pages is exactly representable as
// block tables; rebuilding it must give every query the same context.
TEST(BlockTables, RebuildsRandomTrees) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    WorkloadParams p;
    p.page_size = seed % 2 ? 16 : 4;
    const Workload r = random_workload(seed, p);
    const TreeIndex ix = TreeIndex::build(r.tree, r.query_nodes);
    // Round internal nodes up to whole pages, keep leaves ragged.
    Tree t;
    PageAllocator alloc(p.page_size, seed);
    for (int32_t v = 0; v < int32_t(r.tree.nodes.size()); ++v) {
      int32_t tok = r.tree.nodes[v].num_tokens;
      if (ix.num_children(v) > 0) tok = (tok + p.page_size - 1) / p.page_size * p.page_size;
      alloc.add_node(t, r.tree.nodes[v].parent, tok);
    }
    const int64_t num_pages = alloc.finish(t);
    Tables tables;
    std::vector<int32_t> lens;
    int64_t unique = 0;
    for (const Node& n : t.nodes) unique += n.num_tokens;
    for (int32_t q : r.query_nodes) {
      std::vector<int32_t> pages;
      int32_t len = 0;
      std::vector<int32_t> path;
      for (int32_t v = q; v >= 0; v = t.nodes[v].parent) path.push_back(v);
      for (auto it = path.rbegin(); it != path.rend(); ++it) {
        pages.insert(pages.end(), t.nodes[*it].pages.begin(), t.nodes[*it].pages.end());
        len += t.nodes[*it].num_tokens;
      }
      tables.push_back(pages);
      lens.push_back(len);
    }
    const Workload w = from_block_tables(tables, lens, num_pages, p);
    ASSERT_EQ(w.num_queries(), r.num_queries());
    EXPECT_EQ(w.total_tokens(), unique);  // every node lies on some query's path
    EXPECT_LE(w.tree.nodes.size(), t.nodes.size());
    expect_paths_hold(w, tables, lens);
    // Radix property: a node with one child has a query on it (else they would be one run).
    const TreeIndex wx = TreeIndex::build(w.tree, w.query_nodes);
    std::vector<int> queries_on(w.tree.nodes.size(), 0);
    for (int32_t q : w.query_nodes) ++queries_on[q];
    for (int32_t v = 0; v < int32_t(w.tree.nodes.size()); ++v)
      if (wx.num_children(v) == 1) {
        EXPECT_GT(queries_on[v], 0) << "node " << v;
      }
  }
}

// Sequences of one long prefix next to each other (the builder skips the
// pages a row shares with the row before, 64 at a time) give the same tree
// as the same rows interleaved with others (every page looked up).
TEST(BlockTables, NeighboursSharingLongPrefixesGiveTheTreeOfAnyOrder) {
  Tables rows;
  std::vector<int32_t> lens;
  int32_t next = 0;
  auto run = [&](int n) {
    std::vector<int32_t> r(static_cast<size_t>(n));
    for (int32_t& pg : r) pg = next++;
    return r;
  };
  for (int g = 0; g < 3; ++g) {  // prefixes of 150, 151 and 152 pages; two sub-branches of 70 pages in each
    const std::vector<int32_t> prefix = run(150 + g);
    for (int b = 0; b < 2; ++b) {
      const std::vector<int32_t> mid = run(70);
      for (int s = 0; s < 3; ++s) {
        std::vector<int32_t> r = prefix;
        r.insert(r.end(), mid.begin(), mid.end());
        const std::vector<int32_t> own = run(1 + s);
        r.insert(r.end(), own.begin(), own.end());
        rows.push_back(r);
        lens.push_back(int32_t(r.size() - 1) * 16 + 1 + s);
      }
    }
  }
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (i * 7) % rows.size();  // 18 rows: 7 is coprime
  Tables shuffled;
  std::vector<int32_t> shuffled_lens;
  for (size_t i : order) shuffled.push_back(rows[i]), shuffled_lens.push_back(lens[i]);
  for (const auto& [t, l] : {std::pair{&rows, &lens}, std::pair{&shuffled, &shuffled_lens}}) {
    const Workload w = bt(*t, *l, next);
    EXPECT_EQ(w.tree.nodes.size(), 3u + 6u + 18u);  // prefixes, sub-branches, own tails
    expect_paths_hold(w, *t, *l);
  }
  // A neighbour that continues past the other's partial last page is still refused.
  Tables bad = {rows[0], rows[0]};
  bad[1].push_back(next);
  EXPECT_ERROR_WITH(bt(bad, {lens[0], int32_t(bad[1].size()) * 16}, next + 1), "seq 1: page", "shared but partially filled");
}

TEST(BlockTablesBadInput, SharedPartialPage) {
  EXPECT_ERROR_WITH(bt({{1, 2}, {1, 2, 3}}, {20, 40}), "seq 1: page 2 is shared but partially filled");
  EXPECT_ERROR_WITH(bt({{1, 2, 3}, {1, 2}}, {40, 20}), "seq 1: page 2 is shared but partially filled");
  EXPECT_ERROR_WITH(bt({{1, 2}, {1, 2}}, {20, 30}), "seq 1: page 2 is shared but partially filled");
}

TEST(BlockTablesBadInput, PageBeyondPool) {
  EXPECT_ERROR_WITH(bt({{1, 2}, {1, 17}}, {32, 32}, 10), "seq 1", "page 17", "beyond the pool (num_pages 10)");
  EXPECT_ERROR_WITH(bt({{-4}}, {3}, 10), "seq 0", "page -4");
}

TEST(BlockTablesBadInput, PageWithTwoPrefixes) {
  EXPECT_ERROR_WITH(bt({{1, 2}, {3, 2}}, {32, 32}), "seq 1", "page 2", "only one prefix");
  EXPECT_ERROR_WITH(bt({{1, 1}}, {32}), "seq 0", "page 1", "only one prefix");
  EXPECT_ERROR_WITH(bt({{5}, {1, 5}}, {16, 32}), "seq 1", "page 5");
}

TEST(BlockTablesBadInput, Shapes) {
  EXPECT_ERROR_WITH(bt({{1, 2}}, {40}), "seq 0: seq_len = 40 needs 3 pages", "has 2");
  EXPECT_ERROR_WITH(bt({{1, 2}}, {0}), "seq 0: seq_len = 0");
  EXPECT_ERROR_WITH(bt({{1, 2}, {3}}, {20}), "block_tables: 2 sequences but seq_lens has 1");
  EXPECT_ERROR_WITH(bt({}, {}), "block_tables: empty");
  EXPECT_ERROR_WITH(bt({{1}}, {1}, 0), "num_pages: 0");
  EXPECT_ERROR_WITH(block_tables_from_json(R"({"block_tables": [[1, 2]], "seq_lens": [20, "x"]})", WorkloadParams{}),
                    "seq_lens[1]");
  EXPECT_ERROR_WITH(block_tables_from_json(R"({"block_tables": [[1, 2]], "seq_len": [20]})", WorkloadParams{}),
                    "seq_len", "unknown key");
  EXPECT_ERROR_WITH(block_tables_from_json(R"({"block_tables": [[1, 2]] "seq_lens": [20]})", WorkloadParams{}),
                    "parse error at byte");
  EXPECT_ERROR_WITH(make_workload("blocktable:/nonexistent.json", WorkloadParams{}), "cannot read '/nonexistent.json'");
}

TEST(BlockTablesBadInput, RaggedRowOffsets) {
  BlockTableTree t;
  const std::vector<int32_t> pages{1, 2, 3}, lens{16, 16};
  EXPECT_ERROR_WITH(build_block_table_tree(pages, std::vector<int64_t>{0}, {}, 16, 10, t), "block_tables: empty");
  EXPECT_ERROR_WITH(build_block_table_tree(pages, std::vector<int64_t>{1, 2, 3}, lens, 16, 10, t),
                    "row_offsets[0] = 1 must be 0");
  EXPECT_ERROR_WITH(build_block_table_tree(pages, std::vector<int64_t>{0, 2, 1}, lens, 16, 10, t),
                    "row_offsets[2] = 1 must lie in [row_offsets[1] = 2, 3]");
  EXPECT_ERROR_WITH(build_block_table_tree(pages, std::vector<int64_t>{0, 2, 4}, lens, 16, 10, t),
                    "row_offsets[2] = 4");
  EXPECT_ERROR_WITH(build_block_table_tree(pages, std::vector<int64_t>{0, 2, 2}, lens, 16, 10, t),
                    "seq 1: seq_len = 16 needs 1 pages of 16 tokens but its block table has 0");
  build_block_table_tree(pages, std::vector<int64_t>{0, 2, 3}, std::vector<int32_t>{20, 16}, 16, 10, t);
  EXPECT_EQ(t.query_nodes.size(), 2u);
  EXPECT_EQ(t.page_ids, (std::vector<int32_t>{1, 2, 3}));
}

// A batch of many one-page sequences and one long one is held as its rows,
// not padded to batch x the longest row (4000 x 200000 entries would be 3.2 GB).
TEST(BlockTables, ManyShortRowsAndOneLongRow) {
  Tables rows(4000);
  std::vector<int32_t> lens(rows.size(), 1);
  for (size_t s = 0; s < rows.size(); ++s) rows[s] = {int32_t(s)};
  rows[0].resize(200000);
  for (int32_t k = 0; k < 200000; ++k) rows[0][size_t(k)] = 4000 + k;
  lens[0] = 200000;
  WorkloadParams p;
  p.page_size = 1;
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  const Workload w = from_block_tables(rows, lens, 204000, p);
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "KiB of peak memory grown by the build";
  EXPECT_EQ(w.num_queries(), 4000);
  EXPECT_EQ(w.tree.nodes[size_t(w.query_nodes[0])].pages.size(), 200000u);
}

namespace {

// One flat block table for build_block_table_tree.
struct FlatBatch {
  std::vector<int32_t> table, lens;
  int32_t batch = 0, width = 0;
};
FlatBatch flatten(const Tables& rows, const std::vector<int32_t>& lens, int32_t extra_width) {
  FlatBatch f;
  f.batch = int32_t(rows.size());
  for (const auto& r : rows) f.width = std::max(f.width, int32_t(r.size()));
  f.width += extra_width;
  f.table.assign(size_t(f.batch) * size_t(f.width), -1);
  for (size_t s = 0; s < rows.size(); ++s) std::copy(rows[s].begin(), rows[s].end(), f.table.begin() + s * f.width);
  f.lens = lens;
  return f;
}

// A build's arrays as text.
std::string arrays_text(const BlockTableTree& t) {
  std::string r;
  for (const auto* a : {&t.parents, &t.num_tokens, &t.page_offsets, &t.page_ids, &t.query_nodes}) {
    for (int32_t x : *a) r += std::to_string(x) + ",";
    r += "|";
  }
  return r;
}

// The arrays of a build, or its error message.
std::string build_result(const FlatBatch& f, int ps, int64_t num_pages, BlockTableTree& t) {
  try {
    build_block_table_tree(f.table, f.batch, f.width, f.lens, ps, num_pages, t);
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
  return arrays_text(t);
}

// The same through the ragged-rows overload, each row cut after the pages
// its sequence needs (no padding).
std::string build_ragged_result(const FlatBatch& f, int ps, int64_t num_pages, BlockTableTree& t) {
  std::vector<int32_t> pages;
  std::vector<int64_t> offsets{0};
  for (int32_t q = 0; q < f.batch; ++q) {
    const int32_t need = std::min((std::max(f.lens[size_t(q)], 0) + ps - 1) / ps, f.width);
    pages.insert(pages.end(), f.table.begin() + q * f.width, f.table.begin() + q * f.width + need);
    offsets.push_back(int64_t(pages.size()));
  }
  try {
    build_block_table_tree(pages, offsets, f.lens, ps, num_pages, t);
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
  return arrays_text(t);
}

}  // namespace

// A decode loop through one kept BlockTableTree: sequences of a random tree
// grow a few tokens a step (a new page when the last fills), fork (the child
// copies the full pages and gets a page for the shared partial one), finish,
// and now and then the batch is bad (a page reused, out of the pool, a
// sequence shrunk, a kept page changed). Every step's arrays, or error, equal
// a fresh builder's; most steps extend the kept tree. A second kept builder
// given the same rows ragged (each cut after its last page) agrees.
TEST(BlockTables, DecodeStepsThroughAKeptTreeEqualFreshBuilds) {
  int64_t steps = 0, grown = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int ps = seed % 3 == 0 ? 1 : seed % 3 == 1 ? 4 : 16;
    const int64_t num_pages = 4000;
    int32_t next_page = 0;
    // A few shared prompts of whole pages, then each sequence's own tail.
    Tables rows;
    std::vector<int32_t> lens;
    const int prompts = 1 + int(rng() % 3);
    for (int g = 0; g < prompts; ++g) {
      std::vector<int32_t> prompt(1 + rng() % 6);
      for (int32_t& pg : prompt) pg = next_page++;
      const int seqs = 1 + int(rng() % 5);
      for (int s = 0; s < seqs; ++s) {
        std::vector<int32_t> r = prompt;
        const int32_t own = int32_t(rng() % (3 * ps)) + 1;
        for (int32_t k = 0; k < (own + ps - 1) / ps; ++k) r.push_back(next_page++);
        rows.push_back(r);
        lens.push_back(int32_t(prompt.size()) * ps + own);
      }
    }
    BlockTableTree kept, kept_ragged;
    for (int step = 0; step < 60; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      Tables r = rows;
      std::vector<int32_t> l = lens;
      const uint64_t event = rng() % 20;
      if (event == 0 && r.size() > 1) {  // a sequence finishes
        const size_t s = rng() % r.size();
        r.erase(r.begin() + int64_t(s));
        l.erase(l.begin() + int64_t(s));
      } else if (event == 1) {  // a fork: full pages shared, the partial one copied to a new page
        const size_t s = rng() % r.size();
        std::vector<int32_t> child = r[s];
        if (l[s] % ps != 0) child.back() = next_page++;
        r.insert(r.begin() + int64_t(s) + 1, child);
        l.insert(l.begin() + int64_t(s) + 1, l[s]);
      } else if (event == 2) {  // an identical twin (both end at one page)
        const size_t s = rng() % r.size();
        r.push_back(r[s]);
        l.push_back(l[s]);
      }
      // Every sequence grows 0-2 tokens, a page of its own when its last fills.
      for (size_t s = 0; s < r.size(); ++s) {
        const int32_t add = int32_t(rng() % 3);
        for (int32_t a = 0; a < add; ++a) {
          if (l[s] % ps == 0) r[s].push_back(next_page++);
          ++l[s];
        }
      }
      FlatBatch f = flatten(r, l, int32_t(rng() % 2));
      const uint64_t bad = rng() % 25;
      const size_t s = rng() % r.size();
      const int64_t np = (int64_t(l[s]) + ps - 1) / ps;
      if (bad == 0) f.table[s * size_t(f.width) + size_t(np - 1)] = 0;  // page 0: another sequence's (or its own first)
      if (bad == 1) f.table[s * size_t(f.width) + size_t(np - 1)] = int32_t(num_pages + 3);
      if (bad == 2 && l[s] > 1) f.lens[s] = l[s] - 1;  // shrunk
      if (bad == 3) f.table[s * size_t(f.width)] = next_page++;  // a kept page replaced
      BlockTableTree fresh;
      const std::string want = build_result(f, ps, num_pages, fresh);
      const int64_t grown_before = kept.grown_builds;
      ASSERT_EQ(build_result(f, ps, num_pages, kept), want);
      ASSERT_EQ(build_ragged_result(f, ps, num_pages, kept_ragged), want);
      ++steps;
      grown += kept.grown_builds - grown_before;
      if (bad > 3 || want.rfind("error", 0) != 0) {  // the batch stands: the next step starts from it
        if (bad <= 3) {
          rows = Tables();
          for (int32_t q = 0; q < f.batch; ++q)
            rows.emplace_back(f.table.begin() + q * f.width, f.table.begin() + q * f.width +
                                                                 (f.lens[size_t(q)] + ps - 1) / ps);
          lens = f.lens;
        } else {
          rows = r;
          lens = l;
        }
      }
    }
    EXPECT_EQ(kept_ragged.grown_builds, kept.grown_builds);
  }
  // Most steps only grow the batch; a broken one must still have been built afresh.
  EXPECT_GT(grown, steps / 2) << grown << " of " << steps << " steps extended the kept tree";
  EXPECT_LT(grown, steps);
}
