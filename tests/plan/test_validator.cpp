// The validator must reject each way a plan can break DESIGN.md's invariants.
#include <gtest/gtest.h>

#include <functional>

#include "treeattn/planner.hpp"

using namespace treeattn;

namespace {

// root (40 tokens) -> a (10), b (20); queries on a, b, b.
Workload small_tree() {
  Workload w;
  w.heads = {8, 2, 64};
  w.layout = {16, 0, DType::fp16};
  PageAllocator pages(16);
  pages.add_node(w.tree, -1, 40);
  pages.add_node(w.tree, 0, 10);
  pages.add_node(w.tree, 0, 20);
  w.layout.num_pages = pages.finish(w.tree);
  w.query_nodes = {1, 2, 2};
  w.validate();
  return w;
}

void expect_invalid(const Workload& w, const std::function<void(Plan&)>& breakit, const std::string& needle) {
  PlanOptions nodes;  // one unit per node and query tile, slots and merges (the tree is compact)
  nodes.extra["flat_tokens"] = 0;
  Plan p = make_plan("node", w, nodes);
  ASSERT_NO_THROW(validate_plan(w, p));
  breakit(p);
  try {
    validate_plan(w, p);
    FAIL() << "expected a validation error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Validator, AcceptsBuiltInPlanners) {
  const Workload w = small_tree();
  for (const PlannerInfo& p : planners()) EXPECT_NO_THROW(validate_plan(w, p.fn(w, {}))) << p.name;
}

TEST(Validator, RejectsMissingTokens) {
  expect_invalid(small_tree(), [](Plan& p) { p.segments[0].end -= 1; }, "covered up to");
}

TEST(Validator, RejectsTokensSeenTwice) {
  expect_invalid(small_tree(), [](Plan& p) {
    // Duplicate the first unit's segment into the second unit's segment list.
    p.segments[1] = p.segments[0];
  }, "overlap");
}

TEST(Validator, RejectsSegmentsOffThePath) {
  const Workload w = small_tree();
  expect_invalid(w, [](Plan& p) {
    for (Segment& s : p.segments)
      if (s.node == 1) s = {2, 0, 10};  // node 2 is not on query 0's path
  }, "not on its path");
}

TEST(Validator, RejectsOverfullTiles) {
  Workload w = small_tree();
  w.heads = {16, 2, 64};  // the root unit holds 3 queries x 8 heads = 24 rows
  expect_invalid(w, [](Plan& p) { p.unit_tile[0] = 0; }, "exceed the tile");
}

TEST(Validator, RejectsMaskBitsBeyondSegments) {
  expect_invalid(small_tree(), [](Plan& p) { p.entry_mask[0] = 0b10; }, "mask has bits beyond");
}

TEST(Validator, RejectsWrongMaskedFlag) {
  expect_invalid(small_tree(), [](Plan& p) { p.unit_masked[0] = 1; }, "unit_masked");
}

TEST(Validator, RejectsSlotWrittenTwice) {
  expect_invalid(small_tree(), [](Plan& p) {
    int first = -1;
    for (int32_t& s : p.entry_slot) {
      if (s < 0) continue;
      if (first < 0) first = s; else { s = first; break; }
    }
  }, "written");
}

TEST(Validator, RejectsSlotForSingleUnitQuery) {
  const Workload w = small_tree();
  Workload one = w;
  one.query_nodes = {1};
  Plan p = make_plan("per-query", one);
  p.entry_slot[0] = 0;
  EXPECT_THROW(validate_plan(one, p), Error);
}

TEST(Validator, RejectsTooManySegments) {
  Workload w;
  w.heads = {1, 1, 64};
  w.layout = {1, 0, DType::fp32};
  PageAllocator pages(1);
  int32_t parent = -1;
  for (int i = 0; i < 70; ++i) parent = pages.add_node(w.tree, parent, 1);
  w.layout.num_pages = pages.finish(w.tree);
  w.query_nodes = {parent};
  w.validate();
  PlanBuilder b(w, "bad");
  b.begin_unit();
  for (int32_t v = 0; v < 70; ++v) b.add_segment(v, 0, 1);
  b.add_query(0, 0);
  b.end_unit();
  const Plan p = b.finish();
  try {
    validate_plan(w, p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("segments exceed 64"), std::string::npos) << e.what();
  }
  // The built-in planners cut deep chains into pieces of at most 64 segments.
  for (const PlannerInfo& pl : planners()) EXPECT_NO_THROW(validate_plan(w, pl.fn(w, {}))) << pl.name;
}
