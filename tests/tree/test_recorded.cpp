// Recorded-workload tests: tree-of-thoughts replay and Medusa token trees, on
// the hand-written fixtures in tests/data (always) and on the real recorded
// files (data/workloads, or $TREEATTN_WORKLOADS; skipped when absent).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tree/builder_test_util.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

struct Shape {
  size_t nodes;
  int32_t queries;
  int64_t tokens;
};

void expect_shape(const Workload& w, Shape s) {
  EXPECT_EQ(w.tree.nodes.size(), s.nodes) << w.name;
  EXPECT_EQ(w.num_queries(), s.queries) << w.name;
  EXPECT_EQ(w.total_tokens(), s.tokens) << w.name;
}

int64_t path_tokens(const Workload& w, int32_t v) {
  int64_t t = 0;
  for (int32_t u : w.path(v)) t += w.tree.nodes[u].num_tokens;
  return t;
}

const std::string kTot = treeattn_test::fixture("tiny_tot.json");
const std::string kMedusa = treeattn_test::fixture("tiny_medusa.json");

}  // namespace

TEST(Tot, FixtureReplay) {
  WorkloadParams p;
  // iter 0: only the prefilled root, which emits the first token.
  expect_shape(tot_workload(kTot, 0, 0, p), {1, 1, 100});
  // iter 1: nodes 1 and 2 generate their first token; empty node 3 is finished: dropped.
  expect_shape(tot_workload(kTot, 0, 1, p), {3, 2, 102});
  expect_shape(tot_workload(kTot, 0, 5, p), {3, 2, 110});
  // iter 6: node 2 finished at 5 with nothing below it: dropped.
  expect_shape(tot_workload(kTot, 0, 6, p), {2, 1, 106});
  // iter 11: node 1 finished (10 tokens) but is the prefix of 4 and 5.
  const Workload w11 = tot_workload(kTot, 0, 11, p);
  expect_shape(w11, {4, 2, 112});
  for (int32_t q : w11.query_nodes) EXPECT_EQ(path_tokens(w11, q), 111);
  expect_shape(tot_workload(kTot, 0, 14, p), {3, 1, 114});
  expect_shape(tot_workload(kTot, 0, 30, p), {3, 1, 130});
  EXPECT_ERROR_WITH(tot_workload(kTot, 0, 31, p), "tot: task 0 has no generating node at iter 31",
                    "last iteration 30");
  // Task 1: a chain through a 1-token node.
  expect_shape(tot_workload(kTot, 1, 1, p), {2, 1, 51});
  expect_shape(tot_workload(kTot, 1, 2, p), {3, 1, 52});
  expect_shape(tot_workload(kTot, 1, 41, p), {3, 1, 91});
}

TEST(Tot, Spec) {
  const Workload w = make_workload("tot:" + kTot + ":task=0:iter=11", WorkloadParams{});
  EXPECT_EQ(w.name, "tot:" + kTot + ":task=0:iter=11");
  treeattn_test::expect_same_workload(w, tot_workload(kTot, 0, 11, WorkloadParams{}));
  // Key order does not matter.
  treeattn_test::expect_same_workload(make_workload("tot:" + kTot + ":iter=11:task=0", WorkloadParams{}), w);
}

TEST(Tot, AllTasksMakeOneForest) {
  WorkloadParams p;
  // iter 1: task 0 (3 nodes, 2 queries, 102 tokens) and task 1 (2 nodes, 1 query, 51 tokens).
  const Workload w = tot_workload(kTot, kTotAllTasks, 1, p);
  expect_shape(w, {5, 3, 153});
  int roots = 0;
  for (const Node& n : w.tree.nodes) roots += n.parent < 0;
  EXPECT_EQ(roots, 2);
  // iter 31: task 0 has ended, task 1 alone (it generates up to 41).
  expect_shape(tot_workload(kTot, kTotAllTasks, 31, p), {3, 1, 81});
  EXPECT_ERROR_WITH(tot_workload(kTot, kTotAllTasks, 42, p), "tot: no task has a generating node at iter 42",
                    "last iteration 41");
  const Workload spec = make_workload("tot:" + kTot + ":task=all:iter=1", p);
  EXPECT_EQ(spec.name, "tot:" + kTot + ":task=all:iter=1");
  treeattn_test::expect_same_workload(spec, w);
}

TEST(Tot, BadInput) {
  WorkloadParams p;
  EXPECT_ERROR_WITH(tot_workload(kTot, 2, 1, p), "task = 2", "out of range [0, 2)");
  EXPECT_ERROR_WITH(tot_workload(kTot, -2, 1, p), "task = -2");
  EXPECT_ERROR_WITH(tot_workload(kTot, 0, -1, p), "iter = -1");
  EXPECT_ERROR_WITH(tot_workload("/nonexistent/tot.json", 0, 1, p), "cannot read '/nonexistent/tot.json'");
  EXPECT_ERROR_WITH(tot_workload(kMedusa, 0, 1, p), "not a list of tasks");
  EXPECT_ERROR_WITH(make_workload("tot:" + kTot + ":task=0", p), "missing key 'iter'");
  EXPECT_ERROR_WITH(make_workload("tot:" + kTot + ":task=x:iter=1", p), "task = 'x' is not an integer");
  EXPECT_ERROR_WITH(make_workload("tot:task=0:iter=1", p), "missing FILE");
  EXPECT_ERROR_WITH(make_workload("tot:" + kTot + ":task=0:iter=1:depth=3", p), "unknown key 'depth'");
}

TEST(Tot, MalformedTasks) {
  const std::string f = ::testing::TempDir() + "tot_malformed.json";
  auto write = [&](const std::string& text) { std::ofstream(f, std::ios::trunc) << text; };
  const std::string good = R"({"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                        "1": {"id": 1, "value": 3, "start": 1, "end": 3, "children": []}}})";
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [7]}}}])");
  WorkloadParams p;
  expect_shape(tot_workload(f, 0, 2, p), {2, 1, 7});  // a bad task does not spoil the others
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "[1]", "child 7 does not exist");
  // A rewritten file is read again.
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": "x", "start": -4, "end": 0, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "[1].data[\"0\"].value = \"x\" is not an integer");
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                    "1": {"id": 1, "value": 5, "start": 1, "end": 5, "children": [0]}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "no root");
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": []},
                                    "1": {"id": 1, "value": 5, "start": 1, "end": 5, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "node 1 is a second root");
  // The key is the node's id. (Each write below differs in size from the one
  // before it: the file cache compares size and mtime.)
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                    "1": {"id": 2, "value": 3, "start": 1, "end": 3, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "[1].data[\"1\"].id = 2 differs from its key \"1\"");
  // start..end holds at least value iterations; an empty node may end at start - 1.
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                    "1": {"id": 1, "value": 0, "start": 19, "end": 3, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "[1].data[\"1\"]: start = 19, end = 3: end is before start - 1");
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                    "1": {"id": 1, "value": 3, "start": 4, "end": 3, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "[1].data[\"1\"]: start = 4, end = 3 give 0 iterations, fewer than value = 3");
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                    "1": {"id": 1, "value": 13, "start": 1, "end": 12, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "start = 1, end = 12 give 12 iterations, fewer than value = 13");
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1, 2]},
                                    "1": {"id": 1, "value": 0, "start": 4, "end": 3, "children": []},
                                    "2": {"id": 2, "value": 2, "start": 1, "end": 5, "children": []}}}])");
  expect_shape(tot_workload(f, 1, 2, p), {2, 1, 5 + 2});  // empty, and live after its last token: fine
  // Keys are unique (a repeated one is a JSON error), so ids are too.
  write("[" + good + R"(, {"data": {"0": {"id": 0, "value": 5, "start": -4, "end": 0, "children": [1]},
                                    "0": {"id": 0, "value": 3, "start": 1, "end": 3, "children": []}}}])");
  EXPECT_ERROR_WITH(tot_workload(f, 0, 2, p), "duplicate key \"0\" in [1].data");
  write("[" + good + ", {\"data\": {}}]");
  EXPECT_ERROR_WITH(tot_workload(f, 1, 2, p), "data: empty");
  write("[" + good);
  EXPECT_ERROR_WITH(tot_workload(f, 0, 2, p), "parse error at byte");
}

TEST(Medusa, FixtureTree) {
  WorkloadParams p;
  const Workload w = medusa_workload(kMedusa, 0, 2, 100, p);
  // Sequence node: 100 + 1 + 3 accepted tokens; 6 draft tokens of one token each.
  ASSERT_EQ(w.tree.nodes.size(), 7u);
  EXPECT_EQ(w.tree.nodes[0].parent, -1);
  EXPECT_EQ(w.tree.nodes[0].num_tokens, 104);
  EXPECT_EQ(w.num_queries(), 7);  // Token_Tree_size: the tree root (sequence's last token) + 6 drafts
  EXPECT_EQ(w.total_tokens(), 110);
  EXPECT_EQ(w.layout.num_pages, 7 + 6);  // each one-token node takes its own page
  std::vector<int> depth_count(5, 0);
  for (int32_t q : w.query_nodes) ++depth_count[w.path(q).size()];
  EXPECT_EQ(depth_count, (std::vector<int>{0, 1, 2, 3, 1}));  // by path length: sequence, [0] [1], [0,0] [0,1] [1,0], [0,0,0]
  for (int32_t q : w.query_nodes) EXPECT_EQ(path_tokens(w, q), 104 + int64_t(w.path(q).size()) - 1);
  EXPECT_EQ(medusa_workload(kMedusa, 1, 1, 10, p).tree.nodes[0].num_tokens, 12);
  EXPECT_EQ(medusa_workload(kMedusa, 1, 0, 10, p).tree.nodes[0].num_tokens, 10);
  const std::string spec = "medusa:" + kMedusa + ":record=0:step=2:prefix=100";
  EXPECT_EQ(make_workload(spec, p).name, spec);
}

TEST(Medusa, BadInput) {
  WorkloadParams p;
  EXPECT_ERROR_WITH(medusa_workload(kMedusa, 2, 0, 10, p), "record = 2", "out of range [0, 2)");
  EXPECT_ERROR_WITH(medusa_workload(kMedusa, 1, 2, 10, p), "step = 2", "out of range [0, 2)");
  EXPECT_ERROR_WITH(medusa_workload(kMedusa, 0, -1, 10, p), "step = -1");
  EXPECT_ERROR_WITH(medusa_workload(kMedusa, 0, 0, 0, p), "prefix = 0");
  EXPECT_ERROR_WITH(medusa_workload(kMedusa, 0, 3, 2147483646, p), "prefix = 2147483646", "overflow");
  EXPECT_ERROR_WITH(medusa_workload(kTot, 0, 0, 10, p), "medusa", "top level");
  EXPECT_ERROR_WITH(medusa_workload("/nonexistent/m.json", 0, 0, 10, p), "cannot read");
  EXPECT_ERROR_WITH(make_workload("medusa:" + kMedusa + ":record=0:step=2", p), "missing key 'prefix'");
  EXPECT_ERROR_WITH(make_workload("medusa:" + kMedusa + ":record=0:step=2:prefix=-5", p), "prefix = -5");
}

TEST(Medusa, MalformedTreeStructure) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + name) << text;
    return dir + name;
  };
  const std::string rec = R"("Records": [{"Accept_length": [1, 2]}])";
  WorkloadParams p;
  EXPECT_ERROR_WITH(medusa_workload(write("m1.json", R"({"Tree_Structure": [[0], [1, 0]], )" + rec + "}"), 0, 0, 8, p),
                    "Tree_Structure[1] = [1,0]", "parent path is not in the tree");
  EXPECT_ERROR_WITH(medusa_workload(write("m2.json", R"({"Tree_Structure": [[0], [0]], )" + rec + "}"), 0, 0, 8, p),
                    "Tree_Structure[1]", "duplicate of Tree_Structure[0]");
  EXPECT_ERROR_WITH(medusa_workload(write("m3.json", R"({"Tree_Structure": [[0], []], )" + rec + "}"), 0, 0, 8, p),
                    "Tree_Structure[1]", "empty path");
  EXPECT_ERROR_WITH(medusa_workload(write("m4.json", R"({"Tree_Structure": [[0]], "Records": [{"Accept_length": [1, "a"]}]})"), 0, 2, 8, p),
                    "step = 2");
  EXPECT_ERROR_WITH(medusa_workload(write("m5.json", R"({"Tree_Structure": [[0]], "Records": [{"Accept_length": [1, "a", 3]}]})"), 0, 2, 8, p),
                    "Accept_length[1]", "not an integer");
  EXPECT_ERROR_WITH(medusa_workload(write("m6.json", R"({"Tree_Structure": [[0]], )"), 0, 0, 8, p),
                    "parse error at byte");
  // Token_Tree_size, where given, is 1 + the paths (the root token counts).
  EXPECT_ERROR_WITH(medusa_workload(write("m7.json", R"({"Tree_Structure": [[0], [1]], "Token_Tree_size": 2, )" + rec + "}"), 0, 0, 8, p),
                    "Token_Tree_size = 2 disagrees with Tree_Structure's 2 paths");
  EXPECT_ERROR_WITH(medusa_workload(write("m8.json", R"({"Tree_Structure": [[0]], "Token_Tree_size": "2", )" + rec + "}"), 0, 0, 8, p),
                    "Token_Tree_size = \"2\" is not an integer");
  EXPECT_EQ(medusa_workload(write("m9.json", R"({"Tree_Structure": [[0], [1]], "Token_Tree_size": 3, )" + rec + "}"), 0, 0, 8, p)
                .num_queries(),
            3);
}

// ---- the real recorded files -------------------------------------------------

class Recorded : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = treeattn_test::workloads_dir();
    if (dir_.empty()) GTEST_SKIP() << "recorded workloads not found (set TREEATTN_WORKLOADS)";
  }
  std::string dir_;
};

TEST_F(Recorded, DocmergeKnownIterations) {
  WorkloadParams p;
  const std::string f = dir_ + "/docmergeToT.json";
  // Task 0: a 1073-token prompt; 10 thoughts start at iteration 1.
  const Workload w1 = tot_workload(f, 0, 1, p);
  expect_shape(w1, {11, 10, 1073 + 10});
  // Iteration 882: thoughts 1 and 2 still generate (882 tokens each), thought 9
  // finished at 881 and is the prefix of its 10 children (1 token each).
  const Workload w = tot_workload(f, 0, 882, p);
  expect_shape(w, {14, 12, 1073 + 2 * 882 + 881 + 10});
  EXPECT_ERROR_WITH(tot_workload(f, 0, 2376, p), "no generating node at iter 2376", "last iteration 2375");
  EXPECT_NO_THROW(tot_workload(f, 0, 2375, p));
}

TEST_F(Recorded, TotEveryTaskReplays) {
  WorkloadParams p;
  for (const char* name : {"docmergeToT.json", "sorting128ToT.json"}) {
    const std::string f = dir_ + "/" + name;
    std::ifstream in(f);
    const nlohmann::json tasks = nlohmann::json::parse(in);
    for (int task = 0; task < int(tasks.size()); ++task) {
      int last = 0;
      for (const auto& [k, v] : tasks[task]["data"].items()) last = std::max(last, v["end"].get<int>());
      for (int iter : {0, 1, last / 3, last}) {
        SCOPED_TRACE(std::string(name) + " task " + std::to_string(task) + " iter " + std::to_string(iter));
        const Workload w = tot_workload(f, task, iter, p);  // validated inside
        EXPECT_GE(w.num_queries(), 1);
        EXPECT_EQ(w.tree.nodes[0].num_tokens, tasks[task]["data"]["0"]["value"].get<int>());
      }
      EXPECT_ERROR_WITH(tot_workload(f, task, last + 1, p), "no generating node");
    }
  }
}

TEST_F(Recorded, MedusaTreeSizes) {
  WorkloadParams p;
  for (int size : {32, 64, 128}) {
    const std::string f = dir_ + "/APPS_tree_size" + std::to_string(size) + ".json";
    const Workload w = medusa_workload(f, 0, 10, 4096, p);
    EXPECT_EQ(w.num_queries(), size);
    EXPECT_EQ(w.tree.nodes.size(), size_t(size));
    // Record 0 accepts 1,4,5,3,5,4,2,1,2,3 tokens in its first ten steps.
    EXPECT_EQ(w.tree.nodes[0].num_tokens, 4096 + 30);
    EXPECT_EQ(w.total_tokens(), 4096 + 30 + size - 1);
    EXPECT_NO_THROW(make_workload("medusa:" + f + ":record=19:step=400:prefix=1", p));
    EXPECT_ERROR_WITH(make_workload("medusa:" + f + ":record=20:step=0:prefix=1", p), "record = 20");
    EXPECT_ERROR_WITH(make_workload("medusa:" + f + ":record=0:step=401:prefix=1", p), "step = 401");
  }
}
