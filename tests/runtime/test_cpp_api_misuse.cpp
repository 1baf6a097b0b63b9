// The library's C++ entry points below TreeAttention (make_plan,
// plan_reusing, Workload::path, run_cpu, reference_attention) misused as a
// serving engine's C++ code might: each is refused with an Error naming the
// field and the value, where before it divided by zero, read past a vector,
// walked a cycle forever or dereferenced a null tensor (found by an
// adversarial probe of the C++ API).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/support/error_text.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

using test_support::error_text;

Workload small_workload() {
  WorkloadParams p;
  p.heads = {4, 2, 64};
  p.page_size = 4;
  return make_workload("random:seed=3:nodes=12", p);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Options set on PlanOptions directly reached the planners unchecked:
// num_sms = 0 divided by zero in auto (SIGFPE), num_sms x ctas_per_sm
// overflowed int, and ctas_per_sm = 0 or chunk_tokens = 0 made plans of
// whatever shape the arithmetic gave. (The knobs of `extra` each planner
// checks as it reads them.)
TEST(CppApiMisuse, PlannersRefuseOptionsOutOfRange) {
  const Workload w = small_workload();
  struct Case {
    const char* what;
    void (*edit)(PlanOptions&);
    std::string error;
  };
  const std::vector<Case> cases = {
      {"num_sms 0", [](PlanOptions& o) { o.num_sms = 0; }, "plan option num_sms = 0 must be an integer in [1, 1024]"},
      {"num_sms huge", [](PlanOptions& o) { o.num_sms = 1 << 30; }, "num_sms = 1073741824"},
      {"ctas_per_sm 0", [](PlanOptions& o) { o.ctas_per_sm = 0; }, "ctas_per_sm = 0 must be an integer in [1, 64]"},
      {"chunk_tokens -3", [](PlanOptions& o) { o.chunk_tokens = -3; }, "chunk_tokens = -3 must be an integer"},
      {"min_split_tokens 0", [](PlanOptions& o) { o.min_split_tokens = 0; }, "min_split_tokens = 0 must be"},
  };
  for (const Case& c : cases) {
    PlanOptions o;
    c.edit(o);
    for (const PlannerInfo& info : planners()) {
      const std::string text = error_text([&] { make_plan(info.name, w, o); });
      EXPECT_TRUE(has(text, c.error)) << c.what << ", " << info.name << ": " << text;
      Plan out;
      PlanScratch scratch;
      const TreeIndex ix = TreeIndex::build(w.tree, w.query_nodes);
      const std::string reusing = error_text([&] { plan_reusing(info, w, ix, o, scratch, out); });
      EXPECT_TRUE(has(reusing, c.error)) << c.what << ", " << info.name << " (plan_reusing): " << reusing;
    }
  }
  // A field's name as a key of `extra` was accepted by check_plan_options
  // and read by no planner (the TreeAttention constructor took it silently).
  PlanOptions in_extra;
  in_extra.extra["chunk_tokens"] = 64;
  EXPECT_EQ(error_text([&] { check_plan_options(in_extra); }),
            "plan option: 'chunk_tokens' is a field of PlanOptions, not a knob of PlanOptions::extra");
  // What set_plan_option accepts, check_plan_options accepts.
  PlanOptions o;
  set_plan_option(o, "chunk_tokens", 64);
  set_plan_option(o, "split_scale", 2);
  EXPECT_EQ(error_text([&] { check_plan_options(o); }), "(accepted)");
  EXPECT_EQ(error_text([&] { validate_plan(w, make_plan("node", w, o)); }), "(accepted)");
  EXPECT_TRUE(has(error_text([&] { make_plan("nope", w); }), "unknown planner 'nope'"));
}

// A hand-built workload whose heads were never validated: group_size()
// divided by zero in every planner.
TEST(CppApiMisuse, MakePlanRefusesHeadsItWouldDivideBy) {
  Workload w = small_workload();
  w.heads = {0, 0, 64};
  EXPECT_TRUE(has(error_text([&] { make_plan("auto", w); }), "num_kv_heads: 0 is out of range [1, 1024]"));
  w.heads = {3, 2, 64};
  EXPECT_TRUE(has(error_text([&] { make_plan("node", w); }), "num_qo_heads: 3 is not a multiple of num_kv_heads 2"));
}

// A hand-built workload never validated: a token count its pages cannot
// hold made fasttree plan millions of units, and flatten and node-chunk
// allocate until memory ran out (every planner is called here).
TEST(CppApiMisuse, MakePlanValidatesTheWorkload) {
  Workload w = small_workload();
  w.tree.nodes[0].num_tokens = 2000000000;
  for (const PlannerInfo& info : planners())
    EXPECT_TRUE(has(error_text([&] { make_plan(info.name, w); }), "node 0: pages: ")) << info.name;
  w = small_workload();
  w.query_nodes.push_back(int32_t(w.tree.nodes.size()));
  const std::string text = error_text([&] { make_plan("fasttree", w); });
  EXPECT_TRUE(has(text, "is out of range")) << text;
}

// Workload::path walked parents unchecked: a node out of range read past
// the nodes, and a cycle (an unvalidated tree) pushed nodes until memory ran out.
TEST(CppApiMisuse, PathRefusesNodesOutOfRangeAndCycles) {
  Workload w = small_workload();
  const int32_t n = int32_t(w.tree.nodes.size());
  EXPECT_EQ(error_text([&] { w.path(n); }), "path: node = 12 is out of range [0, 12)");
  EXPECT_EQ(error_text([&] { w.path(-1); }), "path: node = -1 is out of range [0, 12)");
  EXPECT_EQ(w.path(n - 1).front(), 0);  // a random tree's root is node 0
  Workload cyclic = w;
  cyclic.tree.nodes[0].parent = 1;
  cyclic.tree.nodes[1].parent = 0;
  EXPECT_TRUE(has(error_text([&] { cyclic.path(1); }), "closes a cycle"));
  Workload dangling = w;
  dangling.tree.nodes[1].parent = 99;
  EXPECT_EQ(error_text([&] { dangling.path(1); }), "path: node 1: parent = 99 is out of range [-1, 12)");
}

// run_cpu and reference_attention take AttentionArgs as TreeAttention::run
// does, but checked neither null pointers (run_cpu: a segfault) nor, in the
// reference, strides (a read before q with q_stride = -1).
TEST(CppApiMisuse, HostExecutorsCheckTheirTensors) {
  const Workload w = small_workload();
  const Plan p = make_plan("node", w);
  validate_plan(w, p);
  HostTensors h = make_random_inputs(w, 5);
  for (const char* field : {"q", "k", "v", "out"}) {
    AttentionArgs a = h.args();
    if (field[0] == 'q') a.q = nullptr;
    if (field[0] == 'k') a.k = nullptr;
    if (field[0] == 'v') a.v = nullptr;
    if (field[0] == 'o') a.out = nullptr;
    EXPECT_EQ(error_text([&] { run_cpu(w, p, a); }), std::string(field) + ": null tensor pointer in AttentionArgs");
    const std::string ref = error_text([&] { reference_attention(w, a); });
    if (field[0] == 'o')
      EXPECT_EQ(ref, "(accepted)");  // the reference writes its own result, not out
    else
      EXPECT_EQ(ref, std::string(field) + ": null tensor pointer in AttentionArgs");
  }
  AttentionArgs a = h.args();
  a.q_stride = -1;
  EXPECT_TRUE(has(error_text([&] { reference_attention(w, a); }), "q_stride = -1: the queries' rows of q overlap"));
  a = h.args();
  a.kv_page_stride = 7;
  EXPECT_TRUE(has(error_text([&] { reference_attention(w, a); }), "kv_page_stride = 7: the pool's pages overlap"));
  run_cpu(w, p, h.args());
  EXPECT_LE(relative_error(w, h.out.data(), reference_attention(w, h.args())), 2e-3);
}

// A DType cast from a number past the enum passed Workload::validate, and
// the executors then neither read q nor wrote out (silently wrong results).
TEST(CppApiMisuse, ValidateRefusesADTypeOutsideTheEnum) {
  Workload w = small_workload();
  w.layout.dtype = static_cast<DType>(9);
  EXPECT_EQ(error_text([&] { w.validate(); }), "dtype: 9 is not a DType (fp16, bf16, fp32, fp8_e4m3)");
  w = small_workload();
  w.layout.kv_dtype = static_cast<DType>(200);
  EXPECT_EQ(error_text([&] { w.validate(); }), "kv_dtype: 200 is not a DType (fp16, bf16, fp32, fp8_e4m3)");
}

}  // namespace
}  // namespace treeattn
