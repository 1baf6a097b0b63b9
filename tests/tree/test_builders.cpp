// Generator tests: node/query counts and lengths of the FastTree, PAT,
// few-shot and random builders for known specs, spec parsing, canonical names,
// and the variety and determinism of random trees.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "tree/builder_test_util.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

int64_t path_tokens(const Workload& w, int32_t v) {
  int64_t t = 0;
  for (int32_t u : w.path(v)) t += w.tree.nodes[u].num_tokens;
  return t;
}

int num_roots(const Workload& w) {
  int r = 0;
  for (const Node& n : w.tree.nodes) r += n.parent == -1;
  return r;
}

int64_t pages_in_tree(const Workload& w) {
  int64_t p = 0;
  for (const Node& n : w.tree.nodes) p += int64_t(n.pages.size());
  return p;
}

}  // namespace

TEST(Builders, FastTreeKnownSpec) {
  WorkloadParams p;
  const Workload w = make_workload("fasttree:N=1,4,16:C=128,32,32", p);
  EXPECT_EQ(w.name, "fasttree:N=1,4,16:C=128,32,32");
  ASSERT_EQ(w.tree.nodes.size(), 21u);
  EXPECT_EQ(w.num_queries(), 16);
  EXPECT_EQ(w.total_tokens(), 128 + 4 * 32 + 16 * 32);
  EXPECT_EQ(num_roots(w), 1);
  // Level 2 node j hangs under level-1 node j / 4.
  for (int j = 0; j < 4; ++j) EXPECT_EQ(w.tree.nodes[1 + j].parent, 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(w.tree.nodes[5 + j].parent, 1 + j / 4);
  for (int32_t q : w.query_nodes) EXPECT_EQ(path_tokens(w, q), 128 + 32 + 32);
  // 8 + 4*2 + 16*2 pages, each used once, ids a permutation of the pool.
  EXPECT_EQ(w.layout.num_pages, 48);
  EXPECT_EQ(pages_in_tree(w), 48);
  EXPECT_EQ(w.layout.page_size, 16);
  EXPECT_EQ(w.heads.num_qo_heads, 32);
  EXPECT_EQ(w.heads.num_kv_heads, 8);
  EXPECT_EQ(w.layout.dtype, DType::fp16);
}

TEST(Builders, PagesAreShuffled) {
  const Workload w = make_workload("fewshot:prompt=4000:branches=4:len=256", WorkloadParams{});
  const std::vector<int32_t>& root = w.tree.nodes[0].pages;
  ASSERT_EQ(root.size(), 250u);
  std::vector<int32_t> sorted = root;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(root, sorted) << "a node's pages must not be contiguous in the pool";
}

TEST(Builders, SpecEqualsDirectCall) {
  WorkloadParams p;
  p.heads = {16, 4, 64};
  p.page_size = 1;
  p.dtype = DType::bf16;
  treeattn_test::expect_same_workload(make_workload("fasttree:N=1,4,16:C=128,32,32", p),
                                      fasttree_workload({1, 4, 16}, {128, 32, 32}, p));
  treeattn_test::expect_same_workload(make_workload("fasttree:C=128,32,32:N=1,4,16", p),
                                      fasttree_workload({1, 4, 16}, {128, 32, 32}, p));
  treeattn_test::expect_same_workload(make_workload("pat:B=2,4:L=7,9", p), pat_workload({2, 4}, {7, 9}, p));
  treeattn_test::expect_same_workload(make_workload("fewshot:len=3:prompt=10:branches=5", p),
                                      fewshot_workload(10, 5, 3, p));
  RandomTreeOptions o;
  o.max_nodes = 40;
  o.max_tokens = 300;
  treeattn_test::expect_same_workload(make_workload("random:seed=7:nodes=40:tokens=300", p),
                                      random_workload(7, p, o));
  const Workload w = make_workload("fasttree:C=128,32,32:N=1,4,16", p);
  EXPECT_EQ(w.name, "fasttree:N=1,4,16:C=128,32,32");
  EXPECT_EQ(w.heads.num_qo_heads, 16);
  EXPECT_EQ(w.heads.head_dim, 64);
  EXPECT_EQ(w.layout.dtype, DType::bf16);
  EXPECT_EQ(w.layout.num_pages, w.total_tokens());  // page_size 1
  EXPECT_EQ(make_workload("random:seed=7", p).name, "random:seed=7:nodes=24:tokens=300");
}

TEST(Builders, PatLevels) {
  WorkloadParams p;
  const Workload w = make_workload("pat:B=1,4,16:L=128,256,1024", p);
  EXPECT_EQ(w.name, "pat:B=1,4,16:L=128,256,1024");
  EXPECT_EQ(w.tree.nodes.size(), 21u);
  EXPECT_EQ(w.num_queries(), 16);
  EXPECT_EQ(w.total_tokens(), 128 + 4 * 256 + 16 * 1024);
  for (int32_t q : w.query_nodes) EXPECT_EQ(path_tokens(w, q), 128 + 256 + 1024);

  const Workload flat = make_workload("pat:B=256:L=1024", p);  // no sharing at all
  EXPECT_EQ(flat.tree.nodes.size(), 256u);
  EXPECT_EQ(num_roots(flat), 256);
  EXPECT_EQ(flat.num_queries(), 256);
  EXPECT_EQ(flat.total_tokens(), 256 * 1024);
  std::set<int32_t> qs(flat.query_nodes.begin(), flat.query_nodes.end());
  EXPECT_EQ(qs.size(), 256u);  // one query per leaf

  const Workload two = make_workload("pat:B=2,8,16,256:L=512,128,64,32", p);
  EXPECT_EQ(num_roots(two), 2);
  EXPECT_EQ(two.tree.nodes.size(), 2u + 8 + 16 + 256);
  EXPECT_EQ(two.num_queries(), 256);
  for (int32_t q : two.query_nodes) EXPECT_EQ(path_tokens(two, q), 512 + 128 + 64 + 32);
}

TEST(Builders, FewShot) {
  const Workload w = make_workload("fewshot:prompt=4000:branches=32:len=256", WorkloadParams{});
  EXPECT_EQ(w.name, "fewshot:prompt=4000:branches=32:len=256");
  EXPECT_EQ(w.tree.nodes.size(), 33u);
  EXPECT_EQ(w.num_queries(), 32);
  EXPECT_EQ(w.total_tokens(), 4000 + 32 * 256);
  EXPECT_EQ(w.layout.num_pages, 250 + 32 * 16);
  for (int32_t q : w.query_nodes) {
    EXPECT_EQ(w.tree.nodes[q].parent, 0);
    EXPECT_EQ(path_tokens(w, q), 4256);
  }
}

TEST(Builders, RandomIsDeterministicPerSeed) {
  WorkloadParams p;
  for (uint64_t seed : {0ull, 1ull, 7ull, 123456789ull}) {
    const Workload a = random_workload(seed, p), b = random_workload(seed, p);
    treeattn_test::expect_same_workload(a, b);
  }
  int differing = 0;
  for (uint64_t seed = 0; seed < 20; ++seed)
    differing += workload_to_json(random_workload(seed, p)) != workload_to_json(random_workload(seed + 1, p));
  EXPECT_GE(differing, 19);
}

// Over many seeds the generator must reach every shape the planners care about.
TEST(Builders, RandomShapesVary) {
  WorkloadParams p;
  RandomTreeOptions o;
  int deep = 0, wide = 0, one_token = 0, empty = 0, forest = 0, internal_q = 0, multi_q = 0, single = 0,
      aligned = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const Workload w = random_workload(seed, p, o);  // validated inside
    ASSERT_LE(w.tree.nodes.size(), size_t(o.max_nodes));
    const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
    const int n = int(w.tree.nodes.size());
    int max_depth = 0, max_children = 0;
    for (int v = 0; v < n; ++v) {
      max_depth = std::max(max_depth, ix.depth[v]);
      max_children = std::max(max_children, ix.num_children(v));
      const int t = w.tree.nodes[v].num_tokens;
      ASSERT_GE(t, 0);
      ASSERT_LE(t, o.max_tokens);
    }
    deep += max_depth >= 10;
    wide += max_children >= 10;
    single += n == 1;
    forest += ix.roots.size() >= 2;
    bool has_one = false, has_empty = false, all_aligned = true;
    for (const Node& nd : w.tree.nodes) {
      has_one |= nd.num_tokens == 1;
      has_empty |= nd.num_tokens == 0;
      all_aligned &= nd.num_tokens % p.page_size == 0;
    }
    one_token += has_one;
    empty += has_empty;
    aligned += all_aligned && n >= 4;
    std::vector<int> per_node(n, 0);
    for (int32_t q : w.query_nodes) {
      ++per_node[q];
      EXPECT_GE(ix.path_tokens[q], 1) << "seed " << seed << ": a query sees no token";
      internal_q += ix.num_children(q) > 0;
    }
    multi_q += *std::max_element(per_node.begin(), per_node.end()) >= 2;
    for (int v = 0; v < n; ++v)
      if (ix.num_children(v) == 0) {
        EXPECT_GE(per_node[v], 1) << "seed " << seed << ": leaf " << v;
      }
  }
  EXPECT_GE(deep, 30);
  EXPECT_GE(wide, 30);
  EXPECT_GE(one_token, 100);
  EXPECT_GE(empty, 30);
  EXPECT_GE(forest, 30);
  EXPECT_GE(internal_q, 100);
  EXPECT_GE(multi_q, 100);
  EXPECT_GE(single, 10);
  EXPECT_GE(aligned, 10);
}

TEST(Builders, RandomRespectsOptions) {
  WorkloadParams p;
  p.page_size = 1;
  RandomTreeOptions o;
  o.max_nodes = 200;
  o.max_tokens = 5;
  o.empty_node_prob = 0;
  o.internal_query_prob = 0;
  o.max_queries_per_node = 1;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const Workload w = random_workload(seed, p, o);
    const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
    std::set<int32_t> qs(w.query_nodes.begin(), w.query_nodes.end());
    EXPECT_EQ(qs.size(), w.query_nodes.size());
    for (int32_t q : w.query_nodes) EXPECT_EQ(ix.num_children(q), 0);
    for (const Node& n : w.tree.nodes) EXPECT_LE(n.num_tokens, 5);
  }
}

TEST(Builders, FamiliesListEverySpecKind) {
  std::set<std::string> prefixes;
  for (const WorkloadFamily& f : workload_families()) {
    prefixes.insert(f.prefix);
    EXPECT_EQ(f.syntax.rfind(f.prefix + ":", 0), 0u) << f.syntax;
    EXPECT_FALSE(f.description.empty());
  }
  for (const char* f : {"fasttree", "pat", "fewshot", "random", "json", "blocktable", "tot", "medusa"})
    EXPECT_TRUE(prefixes.count(f)) << f;
  // The example syntax of every generator family builds as written.
  for (const char* spec : {"fasttree:N=1,4,16:C=128,32,32", "pat:B=1,4,16:L=128,256,1024",
                           "fewshot:prompt=4000:branches=32:len=256", "random:seed=7"})
    EXPECT_NO_THROW(make_workload(spec, WorkloadParams{})) << spec;
}

// An index rebuilt in place equals a fresh one: for a tree of the last
// rebuild's shape with other token counts (only those are read again), for
// other queries or parents, and after a rebuild that threw (a cycle), whose
// arrays it must not reuse.
TEST(TreeIndex, RebuildInPlaceEqualsAFreshBuild) {
  const auto expect_fresh = [](const TreeIndex& ix, const Workload& w, const char* step) {
    SCOPED_TRACE(step);
    const TreeIndex fresh = TreeIndex::build(w.tree, w.query_nodes);
    EXPECT_EQ(ix.parent, fresh.parent);
    EXPECT_EQ(ix.tokens, fresh.tokens);
    EXPECT_EQ(ix.roots, fresh.roots);
    EXPECT_EQ(ix.child_offset, fresh.child_offset);
    EXPECT_EQ(ix.children, fresh.children);
    EXPECT_EQ(ix.bfs_order, fresh.bfs_order);
    EXPECT_EQ(ix.depth, fresh.depth);
    EXPECT_EQ(ix.path_tokens, fresh.path_tokens);
    EXPECT_EQ(ix.subtree_queries, fresh.subtree_queries);
    EXPECT_EQ(ix.query_begin, fresh.query_begin);
  };
  TreeIndex ix;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Workload w = random_workload(seed, WorkloadParams{}, RandomTreeOptions{});
    ix.rebuild(w.tree, w.query_nodes);
    expect_fresh(ix, w, "another tree");
    for (size_t v = 0; v < w.tree.nodes.size(); ++v) w.tree.nodes[v].num_tokens += int32_t(v % 3);
    ix.rebuild(w.tree, w.query_nodes);
    expect_fresh(ix, w, "tokens grown");
    w.query_nodes.push_back(w.query_nodes.front());
    ix.rebuild(w.tree, w.query_nodes);
    expect_fresh(ix, w, "a query more");
    const auto child = std::find_if(w.tree.nodes.begin(), w.tree.nodes.end(), [](const Node& n) { return n.parent >= 0; });
    if (child == w.tree.nodes.end()) continue;
    const int32_t c = int32_t(child - w.tree.nodes.begin()), p = child->parent, grandparent = w.tree.nodes[p].parent;
    w.tree.nodes[size_t(c)].parent = -1;
    ix.rebuild(w.tree, w.query_nodes);
    expect_fresh(ix, w, "a parent changed");
    w.tree.nodes[size_t(c)].parent = p;
    w.tree.nodes[size_t(p)].parent = c;  // p and c on a cycle
    EXPECT_THROW(ix.rebuild(w.tree, w.query_nodes), Error);
    EXPECT_THROW(ix.rebuild(w.tree, w.query_nodes), Error);
    w.tree.nodes[size_t(p)].parent = grandparent;
    ix.rebuild(w.tree, w.query_nodes);
    expect_fresh(ix, w, "after a cycle");
  }
}
