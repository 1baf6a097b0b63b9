// JSON tree format tests: the fixture file, round trips of every builder
// (random trees over many seeds, shapes and page sizes), and every malformed
// input naming its JSON field.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "tree/builder_test_util.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

void expect_round_trip(const Workload& w) {
  const std::string text = workload_to_json(w);
  const Workload back = workload_from_json(text, WorkloadParams{});
  treeattn_test::expect_same_workload(w, back);
  EXPECT_EQ(back.name, w.name);
  EXPECT_EQ(workload_to_json(back), text);
}

// A small valid document; tests break one field at a time.
std::string doc(const std::string& nodes, const std::string& queries = "[1, 2]",
                const std::string& extra = "") {
  return "{\"format\": \"treeattn.tree/1\", " + extra + "\"nodes\": " + nodes + ", \"queries\": " + queries + "}";
}
const std::string kNodes =
    R"([{"id": 0, "parent": -1, "tokens": 20}, {"id": 1, "parent": 0, "tokens": 5}, {"id": 2, "parent": 0, "tokens": 17}])";

Workload parse(const std::string& text) { return workload_from_json(text, WorkloadParams{}); }

}  // namespace

TEST(Json, FixtureFile) {
  WorkloadParams p;
  p.heads = {8, 8, 64};  // the file's heads win over the defaults
  const Workload w = read_workload_file(treeattn_test::fixture("tiny_tree.json"), p);
  ASSERT_EQ(w.tree.nodes.size(), 4u);
  EXPECT_EQ(w.tree.nodes[0].parent, -1);
  EXPECT_EQ(w.tree.nodes[0].num_tokens, 40);
  EXPECT_EQ(w.tree.nodes[1].num_tokens, 16);
  EXPECT_EQ(w.tree.nodes[2].num_tokens, 17);
  EXPECT_EQ(w.tree.nodes[2].parent, 0);
  EXPECT_EQ(w.tree.nodes[3].parent, 1);
  EXPECT_EQ(w.query_nodes, (std::vector<int32_t>{2, 3, 3, 1}));
  EXPECT_EQ(w.heads.num_qo_heads, 32);
  EXPECT_EQ(w.heads.num_kv_heads, 8);
  EXPECT_EQ(w.heads.head_dim, 128);
  EXPECT_EQ(w.layout.num_pages, 3 + 1 + 2 + 1);  // allocated: the file gives no pages
  const Workload s = make_workload("json:" + treeattn_test::fixture("tiny_tree.json"), p);
  EXPECT_EQ(s.name, "json:" + treeattn_test::fixture("tiny_tree.json"));
  treeattn_test::expect_same_workload(w, s);
  expect_round_trip(w);
}

TEST(Json, DefaultsAndExplicitPages) {
  WorkloadParams p;
  p.heads = {16, 2, 256};
  p.page_size = 4;
  p.dtype = DType::fp32;
  const Workload w = workload_from_json(
      R"({"nodes": [{"id": 1, "parent": 0, "tokens": 5, "pages": [9, 2]},
                    {"id": 0, "parent": -1, "tokens": 4, "pages": [7]},
                    {"id": 2, "parent": 0, "tokens": 0}],
          "queries": [1, {"node": 2}], "single_root": true})",
      p);
  EXPECT_EQ(w.heads.num_qo_heads, 16);
  EXPECT_EQ(w.heads.head_dim, 256);
  EXPECT_EQ(w.layout.page_size, 4);
  EXPECT_EQ(w.layout.dtype, DType::fp32);
  EXPECT_EQ(w.layout.num_pages, 10);  // max page id + 1
  EXPECT_EQ(w.tree.nodes[1].pages, (std::vector<int32_t>{9, 2}));
  EXPECT_EQ(w.tree.nodes[0].pages, (std::vector<int32_t>{7}));
  EXPECT_TRUE(w.tree.nodes[2].pages.empty());
  EXPECT_EQ(w.query_nodes, (std::vector<int32_t>{1, 2}));
  expect_round_trip(w);
}

TEST(Json, RoundTripRandomTrees) {
  for (int ps : {1, 16}) {
    for (uint64_t seed = 0; seed < 300; ++seed) {
      WorkloadParams p;
      p.page_size = ps;
      p.seed = seed * 3 + 1;
      p.heads = seed % 3 == 0 ? HeadConfig{32, 8, 128} : seed % 3 == 1 ? HeadConfig{4, 4, 64} : HeadConfig{64, 4, 256};
      p.dtype = seed % 2 ? DType::bf16 : DType::fp16;
      if (seed % 5 == 0) p.kv_dtype = DType::fp8_e4m3;
      SCOPED_TRACE("seed " + std::to_string(seed) + " page_size " + std::to_string(ps));
      expect_round_trip(random_workload(seed, p));
    }
  }
}

TEST(Json, RoundTripEveryGenerator) {
  WorkloadParams p;
  for (const char* spec : {"fasttree:N=1,4,16:C=128,32,32", "pat:B=2,8,16,256:L=512,128,64,32",
                           "pat:B=256:L=1024", "fewshot:prompt=4000:branches=32:len=256"})
    expect_round_trip(make_workload(spec, p));
  expect_round_trip(make_workload("tot:" + treeattn_test::fixture("tiny_tot.json") + ":task=0:iter=11", p));
  expect_round_trip(make_workload("medusa:" + treeattn_test::fixture("tiny_medusa.json") + ":record=0:step=2:prefix=100", p));
  expect_round_trip(make_workload("blocktable:" + treeattn_test::fixture("tiny_blocktable.json"), p));
}

TEST(JsonBadInput, Malformed) {
  EXPECT_ERROR_WITH(parse("{\"nodes\": [1, 2"), "parse error at byte");
  EXPECT_ERROR_WITH(parse("{\"nodes\": [}"), "parse error at byte 12");
  EXPECT_ERROR_WITH(parse(""), "parse error");
  EXPECT_ERROR_WITH(parse("[1, 2]"), "top level");
}

TEST(JsonBadInput, Cycle) {
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 1, "parent": 2, "tokens": 1},
                                  {"id": 2, "parent": 1, "tokens": 1}])")),
                    "nodes[", ".parent", "closes a cycle");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 1, "parent": 1, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[1].parent = 1", "cycle");
  // No root at all: every node is on a cycle.
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": 1, "tokens": 1}, {"id": 1, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "cycle");
}

TEST(JsonBadInput, SecondRootWhereOneIsRequired) {
  const std::string nodes =
      R"([{"id": 0, "parent": -1, "tokens": 4}, {"id": 1, "parent": 0, "tokens": 4}, {"id": 2, "parent": -1, "tokens": 4}])";
  EXPECT_NO_THROW(parse(doc(nodes)));  // forests are fine unless single_root
  EXPECT_ERROR_WITH(parse(doc(nodes, "[1, 2]", "\"single_root\": true, ")), "nodes[2].parent = -1",
                    "a second root where one is required");
}

TEST(JsonBadInput, UnknownParentAndQueryNode) {
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 1, "parent": 9, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[1].parent = 9", "no node has this id");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1, 7]")), "queries[1] = 7", "no node has this id");
  EXPECT_ERROR_WITH(parse(doc(kNodes, R"([{"node": -1}])")), "queries[0].node = -1");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[]")), "queries: empty");
  EXPECT_ERROR_WITH(parse(doc(kNodes, R"(["x"])")), "queries[0] = \"x\" is not an integer");
}

TEST(JsonBadInput, Pages) {
  const std::string given =
      R"([{"id": 0, "parent": -1, "tokens": 20, "pages": [0, 99]}, {"id": 1, "parent": 0, "tokens": 5, "pages": [2]},
          {"id": 2, "parent": 0, "tokens": 17, "pages": [3, 4]}])";
  EXPECT_NO_THROW(parse(doc(given)));
  EXPECT_ERROR_WITH(parse(doc(given, "[1, 2]", "\"num_pages\": 50, ")), "nodes[0].pages[1] = 99",
                    "beyond the pool (num_pages 50)");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 20, "pages": [0]}, {"id": 1, "parent": 0, "tokens": 5, "pages": [2]},
                                  {"id": 2, "parent": 0, "tokens": 17, "pages": [3, 4]}])")),
                    "nodes[0].pages: 1 pages for 20 tokens with page_size 16 (expected 2)");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 20, "pages": [0, 1]}, {"id": 1, "parent": 0, "tokens": 5, "pages": [1]},
                                  {"id": 2, "parent": 0, "tokens": 17, "pages": [3, 4]}])")),
                    "nodes[1].pages[0] = 1", "also used by nodes[0]");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 20, "pages": [0, 1]}, {"id": 1, "parent": 0, "tokens": 5},
                                  {"id": 2, "parent": 0, "tokens": 17, "pages": [3, 4]}])")),
                    "nodes[1].pages: missing");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1, 2]", "\"num_pages\": 4, ")), "num_pages = 4",
                    "smaller than the 5 pages");
  EXPECT_ERROR_WITH(parse(doc(given, "[1, 2]", "\"num_pages\": -1, ")), "num_pages = -1");
}

TEST(JsonBadInput, Heads) {
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("heads": {"qo": 30, "kv": 8}, )")), "heads.qo = 30",
                    "not a multiple of heads.kv = 8");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("heads": {"head_dim": 96}, )")), "heads.head_dim = 96",
                    "not supported");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("heads": {"kv": 0}, )")), "heads.kv = 0");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("heads": {"qo": 32, "q": 8}, )")), "heads.q", "unknown key");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("page_size": 0, )")), "page_size = 0");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("dtype": "fp64", )")), "dtype", "fp64");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("dtype": "fp8_e4m3", )")), "dtype", "K/V pools only");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("dtype": "fp16", "kv_dtype": "bf16", )")), "kv_dtype", "bf16");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("kv_dtype": 8, )")), "kv_dtype", "not a string");
  EXPECT_EQ(parse(doc(kNodes, "[1]", R"("kv_dtype": "fp8_e4m3", )")).layout.kv_type(), DType::fp8_e4m3);
}

TEST(JsonBadInput, NodesAndKeys) {
  EXPECT_ERROR_WITH(parse(doc("[]")), "nodes: empty");
  EXPECT_ERROR_WITH(parse(R"({"queries": [0]})"), "nodes: missing");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 0, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[1].id = 0", "duplicate of nodes[0].id");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 5, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[1].id = 5");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": -3}, {"id": 1, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[0].tokens = -3");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 2.5}, {"id": 1, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[0].tokens = 2.5 is not an integer");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 1, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[1].parent: missing");
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1, "parnet": 3}, {"id": 1, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}])")),
                    "nodes[0].parnet", "unknown key");
  EXPECT_ERROR_WITH(parse(R"({"format": "treeattn.tree/2", "nodes": )" + kNodes + R"(, "queries": [1]})"), "format",
                    "treeattn.tree/2");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("extra": 1, )")), "extra", "unknown key");
}

// json::parse keeps the last of repeated keys; a treeattn file must not
// depend on that: the parser names the key and the object holding it.
TEST(JsonBadInput, DuplicateKeys) {
  EXPECT_ERROR_WITH(parse(doc(R"([{"id": 0, "parent": -1, "tokens": 1}, {"id": 1, "parent": 0, "tokens": 1},
                                  {"id": 2, "parent": 0, "tokens": 1}, {"id": 3, "parent": 2, "parent": 1, "tokens": 1}])",
                              "[3]")),
                    "json: duplicate key \"parent\" in nodes[3]");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("heads": {"qo": 8, "kv": 8, "qo": 16}, )")),
                    "duplicate key \"qo\" in heads");
  EXPECT_ERROR_WITH(parse(doc(kNodes, "[1]", R"("queries": [2], )")), "duplicate key \"queries\" in the top level");
  EXPECT_ERROR_WITH(parse(R"([{"a": {"b": [0, {"c": 1, "c": 1}]}}])"), "duplicate key \"c\" in [0].a.b[1]");
  // Equal keys in different objects, and the same key twice in a list of
  // objects, are fine.
  EXPECT_NO_THROW(parse(doc(kNodes, "[1]", R"("heads": {"qo": 8, "kv": 8}, "dtype": "fp16", )")));
}

TEST(JsonBadInput, QueryRowsOverflow32Bit) {
  // 8193 queries x 1024 qo heads x 256 > 2^31 rows x dims.
  std::string qs = "[0";
  for (int i = 1; i < 8193; ++i) qs += ",0";
  qs += "]";
  EXPECT_ERROR_WITH(parse(doc(kNodes, qs, R"("heads": {"qo": 1024, "kv": 8, "head_dim": 256}, )")), "queries",
                    "overflow 32-bit");
}

TEST(JsonBadInput, UnreadableFile) {
  EXPECT_ERROR_WITH(read_workload_file("/nonexistent/tree.json", WorkloadParams{}),
                    "cannot read '/nonexistent/tree.json'");
  EXPECT_ERROR_WITH(make_workload("json:/nonexistent/tree.json", WorkloadParams{}), "json",
                    "/nonexistent/tree.json");
}

// The examples in docs/formats.md are valid documents.
TEST(Json, DocsExamplesParse) {
  std::ifstream in(std::string(TREEATTN_SOURCE_DIR) + "/docs/formats.md");
  ASSERT_TRUE(in) << "docs/formats.md";
  const std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> blocks;
  for (size_t pos = 0; (pos = md.find("```json\n", pos)) != std::string::npos;) {
    const size_t end = md.find("```", pos + 8);
    blocks.push_back(md.substr(pos + 8, end - pos - 8));
    pos = end + 3;
  }
  ASSERT_EQ(blocks.size(), 2u);
  const Workload w = parse(blocks[0]);
  EXPECT_EQ(w.tree.nodes.size(), 4u);
  EXPECT_EQ(w.num_queries(), 4);
  EXPECT_EQ(w.layout.num_pages, 64);
  expect_round_trip(w);
  const Workload b = block_tables_from_json(blocks[1], WorkloadParams{});
  EXPECT_EQ(b.tree.nodes.size(), 5u);
  EXPECT_EQ(b.num_queries(), 3);
}
