// Bad workload specs and builder arguments: each gives a treeattn::Error whose
// message names the field and the value (JSON, block-table and recorded-file
// errors are tested next to their builders).
#include <gtest/gtest.h>

#include "tree/builder_test_util.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {
Workload spec(const std::string& s, WorkloadParams p = {}) { return make_workload(s, p); }
}  // namespace

TEST(SpecBadInput, FamilyAndKeys) {
  EXPECT_ERROR_WITH(spec("foo:x=1"), "unknown family 'foo'", "fasttree");
  EXPECT_ERROR_WITH(spec(""), "unknown family ''");
  EXPECT_ERROR_WITH(spec("fasttree:N=1:C=1:X=3"), "fasttree", "unknown key 'X'");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,4"), "fasttree", "missing key 'C'");
  EXPECT_ERROR_WITH(spec("fasttree"), "missing key 'N'");
  EXPECT_ERROR_WITH(spec("fasttree:N=1:C"), "'C' is not of the form key=value");
  EXPECT_ERROR_WITH(spec("fasttree:N=1:C=2:N=1"), "key 'N' is given twice");
  EXPECT_ERROR_WITH(spec("pat:B=1,4"), "pat", "missing key 'L'");
  EXPECT_ERROR_WITH(spec("fewshot:prompt=10:branches=2"), "fewshot", "missing key 'len'");
  EXPECT_ERROR_WITH(spec("random:nodes=4"), "random", "missing key 'seed'");
  EXPECT_ERROR_WITH(spec("random:seed=1:depth=4"), "unknown key 'depth'");
  EXPECT_ERROR_WITH(spec("json:"), "json", "missing FILE");
  EXPECT_ERROR_WITH(spec("json:/nonexistent/x.json"), "cannot read '/nonexistent/x.json'");
  EXPECT_ERROR_WITH(spec("medusa:/nonexistent/m.json:record=0:step=1:prefix=8"), "cannot read '/nonexistent/m.json'");
}

TEST(SpecBadInput, Numbers) {
  EXPECT_ERROR_WITH(spec("fasttree:N=1,a:C=1,2"), "N[1] = 'a' is not an integer");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,,4:C=1,2,3"), "N[1] = '' is not an integer");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,4:C=1,2.5"), "C[1] = '2.5' is not an integer");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,4:C=128,0"), "C[1] = 0 must be positive");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,4:C=128,-3"), "C[1] = -3 must be positive");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,4:C=128,99999999999"), "C[1] = 99999999999", "out of range");
  EXPECT_ERROR_WITH(spec("fewshot:prompt=0:branches=2:len=3"), "prompt = 0 must be positive");
  EXPECT_ERROR_WITH(spec("fewshot:prompt=4:branches=x:len=3"), "branches = 'x'");
  EXPECT_ERROR_WITH(spec("random:seed=abc"), "seed = 'abc'");
  EXPECT_ERROR_WITH(spec("random:seed=1:nodes=0"), "nodes = 0 must be positive");
  EXPECT_ERROR_WITH(spec("random:seed=-1"), "seed = -1");
  // A flag: 0 or 1, not "any non-zero".
  EXPECT_ERROR_WITH(spec("kary:arity=2:depth=2:total=64:leftmost=2"), "kary", "leftmost = 2 is out of range [0, 1]");
  EXPECT_ERROR_WITH(spec("kary:arity=2:depth=2:total=64:leftmost=-1"), "leftmost = -1 is out of range [0, 1]");
  EXPECT_ERROR_WITH(spec("kary:arity=2:depth=2:total=64:leftmost=yes"), "leftmost = 'yes' is not an integer");
  EXPECT_EQ(spec("kary:arity=2:depth=2:total=64:leftmost=1").name, "kary:arity=2:depth=2:total=64:leftmost=1");
  EXPECT_EQ(spec("kary:arity=2:depth=2:total=64:leftmost=0").name, "kary:arity=2:depth=2:total=64");
}

TEST(SpecBadInput, LevelShapes) {
  EXPECT_ERROR_WITH(spec("fasttree:N=1,3,4:C=1,1,1"), "N[2] = 4 is not a multiple of N[1] = 3");
  EXPECT_ERROR_WITH(spec("pat:B=2,3:L=1,1"), "pat", "B[1] = 3 is not a multiple of B[0] = 2");
  EXPECT_ERROR_WITH(spec("fasttree:N=1,4:C=1"), "N has 2 levels but C has 1");
  EXPECT_ERROR_WITH(fasttree_workload({}, {}, WorkloadParams{}), "N is empty");
  EXPECT_ERROR_WITH(pat_workload({4, 0}, {1, 1}, WorkloadParams{}), "B[1] = 0 must be positive");
  EXPECT_ERROR_WITH(fewshot_workload(4, 2, -1, WorkloadParams{}), "len = -1");
  RandomTreeOptions o;
  o.empty_node_prob = 1.5;
  EXPECT_ERROR_WITH(random_workload(1, WorkloadParams{}, o), "empty_node_prob");
  o = {};
  o.max_queries_per_node = 0;
  EXPECT_ERROR_WITH(random_workload(1, WorkloadParams{}, o), "max_queries_per_node = 0");
}

TEST(SpecBadInput, HeadsAndPages) {
  WorkloadParams p;
  p.heads = {30, 8, 128};
  EXPECT_ERROR_WITH(spec("fewshot:prompt=4:branches=2:len=3", p), "num_qo_heads: 30", "not a multiple",
                    "num_kv_heads 8");
  p.heads = {32, 8, 96};
  EXPECT_ERROR_WITH(spec("fewshot:prompt=4:branches=2:len=3", p), "head_dim: 96");
  p = {};
  p.page_size = 0;
  EXPECT_ERROR_WITH(spec("fewshot:prompt=4:branches=2:len=3", p), "page_size: 0");
  EXPECT_ERROR_WITH(random_workload(3, p), "page_size: 0");
}

// Sizes far beyond memory are refused before anything is allocated.
TEST(SpecBadInput, Overflow) {
  EXPECT_ERROR_WITH(spec("fasttree:N=1,65536,1073741824:C=1,1,1"), "nodes exceed the builder limit");
  EXPECT_ERROR_WITH(spec("fewshot:prompt=2147483647:branches=2147483647:len=2147483647"), "exceed the builder limit");
  WorkloadParams p;
  p.page_size = 1;
  EXPECT_ERROR_WITH(spec("fasttree:N=1,1024:C=2147483647,65536", p), "pages exceed the builder limit");
  // 65540 queries x 128 qo heads x 256 overflow 32-bit row indexing.
  p.heads = {128, 1, 256};
  EXPECT_ERROR_WITH(spec("pat:B=65540:L=1", p), "queries", "overflow 32-bit");
}

// A pool far larger than host memory is only described, never allocated, by
// validation (regression: validate() once sized a vector by num_pages).
TEST(SpecBadInput, HugePoolIsNotAllocated) {
  WorkloadParams p;
  p.heads = {1, 1, 64};
  p.page_size = 1;
  Workload w = spec("fewshot:prompt=4:branches=2:len=3", p);
  w.layout.num_pages = int64_t(1) << 39;  // 2^45 elements: allowed
  EXPECT_NO_THROW(w.validate());
  w.layout.num_pages = int64_t(1) << 41;
  EXPECT_ERROR_WITH(w.validate(), "num_pages", "2^46");
}
