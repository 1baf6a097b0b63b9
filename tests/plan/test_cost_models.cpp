// The planners' data files and state: PAT's tile-rule table and FlashForge's
// cost table (format, loader, shipped files), the tile selector, the cost
// table's interpolation, and PatPlanner's plan cache (reuse, incremental
// path, rebuild), which must always return what the stateless planner returns.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "support/error_text.hpp"
#include "treeattn/cost_models.hpp"
#include "treeattn/pat_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

const std::string kData = std::string(TREEATTN_SOURCE_DIR) + "/data/";

bool same_plan(const Plan& a, const Plan& b) {
  const auto seg_eq = [](const Segment& x, const Segment& y) { return x.node == y.node && x.begin == y.begin && x.end == y.end; };
  return a.unit_segment_offset == b.unit_segment_offset &&
         std::equal(a.segments.begin(), a.segments.end(), b.segments.begin(), b.segments.end(), seg_eq) &&
         a.unit_query_offset == b.unit_query_offset && a.entry_query == b.entry_query && a.entry_mask == b.entry_mask &&
         a.entry_slot == b.entry_slot && a.unit_tile == b.unit_tile && a.query_slot_offset == b.query_slot_offset &&
         a.query_slots == b.query_slots && a.num_slots == b.num_slots;
}

}  // namespace

// The library's default (kBuiltinTileRules in src/plan/planners/pat.cpp) and
// the CLI's (data/pat_tile_rules.json) are the same table. After
// `treeattn calibrate --pat-tiles --out data/pat_tile_rules.json`, paste the
// "built-in copy" it prints into kBuiltinTileRules.
TEST(PatTileRules, ShippedFileMatchesBuiltinTable) {
  const PatTileRules file = load_pat_tile_rules(kData + "pat_tile_rules.json");
  const PatTileRules& builtin = builtin_pat_tile_rules();
  const char* hint = "data/pat_tile_rules.json and kBuiltinTileRules in src/plan/planners/pat.cpp differ: paste the "
                     "built-in copy that `treeattn calibrate --pat-tiles` prints into kBuiltinTileRules";
  EXPECT_EQ(file.source, builtin.source) << hint;
  EXPECT_EQ(file.note, builtin.note) << hint;
  EXPECT_EQ(file.device, builtin.device) << hint;
  EXPECT_EQ(file.commit, builtin.commit) << hint;
  EXPECT_TRUE(builtin.measurements.empty()) << "the built-in copy leaves the measurements to the file";
  EXPECT_EQ(to_json(file, false), to_json(builtin, false)) << hint;
  ASSERT_EQ(file.rules.size(), builtin.rules.size()) << hint;
  for (size_t i = 0; i < file.rules.size(); ++i) {
    EXPECT_EQ(file.rules[i].max_rows, builtin.rules[i].max_rows) << i;
    EXPECT_EQ(file.rules[i].max_kv, builtin.rules[i].max_kv) << i;
    EXPECT_EQ(file.rules[i].n, builtin.rules[i].n) << i;
  }
  if (file.source == "measured") {
    EXPECT_FALSE(file.measurements.empty()) << "a measured table carries its measurements";
    EXPECT_FALSE(file.device.empty());
  }
  // Round trip.
  const PatTileRules again = parse_pat_tile_rules(to_json(builtin));
  EXPECT_EQ(again.rules.size(), builtin.rules.size());
}

TEST(PatTileRules, SelectorPicksSmallestRowsTileAndNearestKvTile) {
  PatTileRules r;
  r.rules = {{128, 31, 16}, {128, -1, 128}};
  for (int rows : {1, 16, 17, 32, 33, 64, 65, 128}) {
    const int t = pat_select_tile(r, rows, 1000);
    EXPECT_EQ(kTileConfigs[t].m, kTileConfigs[smallest_tile_for_rows(rows)].m) << rows;
    EXPECT_GE(kTileConfigs[t].m, rows);
    // n = 128 where that m has it (m <= 32), else the nearest compiled n (64).
    EXPECT_EQ(kTileConfigs[t].n, rows <= 32 ? 128 : 64) << rows;
    // n = 16 is not compiled: the nearest is 32 (m <= 64), or 64 (m = 128).
    EXPECT_EQ(kTileConfigs[pat_select_tile(r, rows, 20)].n, rows <= 64 ? 32 : 64) << rows;
  }
  EXPECT_THROW(pat_select_tile(r, 129, 10), Error);
  EXPECT_THROW(parse_pat_tile_rules(R"({"format": "treeattn-pat-tile-rules/1", "rules": [{"max_rows": 0, "n": 16}]})"), Error);
  EXPECT_THROW(parse_pat_tile_rules(R"({"format": "other", "rules": []})"), Error);
}

// The shipped table is `treeattn calibrate` output from an H100: it must say
// so, cover the planner's range, and grow with KV length, as measured times do.
TEST(ForgeCostTable, ShippedFileIsTheMeasuredH100Table) {
  const ForgeCostTable file = load_forge_cost_table(kData + "forge_cost_h100.json");
  EXPECT_EQ(file.head_dim, 128);
  EXPECT_EQ(file.source, "measured");
  EXPECT_NE(file.device.find("H100"), std::string::npos) << file.device;
  EXPECT_NE(file.note.find("treeattn calibrate"), std::string::npos) << file.note;
  EXPECT_EQ(file.q_rows.back(), 128);
  EXPECT_EQ(file.kv_tokens.front(), 0);
  const size_t cols = file.kv_tokens.size();
  for (size_t r = 0; r < file.q_rows.size(); ++r)
    for (size_t c = 3; c < cols; ++c)  // beyond a few tiles, longer KV costs more
      EXPECT_GT(file.cost_us[r * cols + c], file.cost_us[r * cols + c - 1]) << "row " << r << " col " << c;
  // The analytic model stays available for devices without a calibration.
  EXPECT_EQ(analytic_forge_cost_table().source, "model");
}

// A text field of another JSON type is an Error naming it, for every table
// (found by fuzz/fuzz_cost_tables: json::value() threw a type_error, which the
// library's callers do not expect).
TEST(CostTables, FieldsOfTheWrongTypeAreNamedErrors) {
  const auto read = [](const std::string& file) {
    std::ifstream in(kData + file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::function<void(const std::string&)> forge = [](const std::string& t) { parse_forge_cost_table(t); },
                                                 pat = [](const std::string& t) { parse_pat_tile_rules(t); },
                                                 auto_model = [](const std::string& t) { parse_auto_cost_model(t); };
  struct Case {
    const char* file;
    const std::function<void(const std::string&)>& parse;
    std::string from, to, message;
  };
  const Case cases[] = {
      {"forge_cost_h100.json", forge, R"("device": )", R"("device": [1], "x": )", "device = [1] is not a string"},
      {"forge_cost_h100.json", forge, R"("dtype": "fp16")", R"("dtype": 16)", "dtype = 16 is not a string"},
      {"forge_cost_h100.json", forge, R"("format": "treeattn-forge-cost/1")", R"("format": {})", "format = {}"},
      {"pat_tile_rules.json", pat, R"("source": "measured")", R"("source": false)", "source = false is not a string"},
      {"pat_tile_rules.json", pat, R"("format": "treeattn-pat-tile-rules/1")", R"("format": 1)", "format = 1"},
      {"pat_tile_rules.json", pat, R"("us": 23.07)", R"("us": 1e30)", "measurements[0].us = 1e+30 is out of range"},
      {"pat_tile_rules.json", pat, R"("us": 23.07)", R"("us": -1)", "measurements[0].us = -1 is out of range"},
      {"auto_cost_h100.json", auto_model, R"("format": "treeattn-auto-cost/1")", R"("format": ["x"])", R"(format = ["x"])"},
      {"auto_cost_h100.json", auto_model, R"("device": )", R"("device": 3, "y": )", "device = 3 is not a string"},
  };
  for (const Case& c : cases) {
    std::string text = read(c.file);
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.file << ": " << c.from;
    text.replace(at, c.from.size(), c.to);
    const std::string error = test_support::error_text([&] { c.parse(text); });
    EXPECT_NE(error.find(c.message), std::string::npos) << c.file << " with " << c.to << ": " << error;
  }
}

TEST(ForgeCostTable, BilinearInterpolationAndExtrapolation) {
  ForgeCostTable t;
  t.q_rows = {16, 32};
  t.kv_tokens = {0, 100, 200};
  t.cost_us = {1, 2, 4,  //
               3, 4, 8};
  t.validate();
  EXPECT_DOUBLE_EQ(t(16, 100), 2);
  EXPECT_DOUBLE_EQ(t(24, 100), 3);          // halfway in rows
  EXPECT_DOUBLE_EQ(t(16, 150), 3);          // halfway in KV
  EXPECT_DOUBLE_EQ(t(24, 150), 0.5 * 3 + 0.5 * 6);
  EXPECT_DOUBLE_EQ(t(1, 100), 2);           // clamped below in rows
  EXPECT_DOUBLE_EQ(t(128, 0), 3);           // clamped above in rows
  EXPECT_DOUBLE_EQ(t(16, 400), 8);          // extrapolated along the last KV segment
  const ForgeCostTable again = parse_forge_cost_table(to_json(t));
  EXPECT_EQ(again.cost_us, t.cost_us);
  t.cost_us[3] = -1;
  EXPECT_THROW(t.validate(), Error);
}

TEST(ForgeCostTable, ModelIsMonotone) {
  const ForgeCostTable t = analytic_forge_cost_table();
  for (double rows = 1; rows <= 128; rows *= 2)
    for (double kv = 16; kv <= 100000; kv *= 3) {
      EXPECT_LE(t(rows, kv), t(rows, kv * 2));
      EXPECT_LE(t(rows, kv), t(rows * 2, kv) + 1e-9);
    }
}

TEST(PatPlanner, CacheReusesAndUpdatesIncrementally) {
  WorkloadParams wp;
  wp.heads = {32, 8, 128};
  PatPlanner cached;
  PlanOptions opt;
  const auto rules = default_pat_tile_rules();
  // Decode steps: every leaf grows by one token per step, crossing pages.
  for (int step = 0; step < 40; ++step) {
    const Workload w = pat_workload({1, 4, 32}, {1000, 200, 5 + step}, wp);
    const Plan a = cached.plan(w, opt);
    const Plan b = plan_pat_with(w, opt, *rules);
    ASSERT_TRUE(same_plan(a, b)) << "step " << step;
    validate_plan(w, a);
    const Plan again = cached.plan(w, opt);  // unchanged batch
    ASSERT_TRUE(same_plan(again, b)) << "step " << step;
  }
  EXPECT_EQ(cached.stats().rebuilt, 1);
  EXPECT_EQ(cached.stats().incremental, 39);
  EXPECT_EQ(cached.stats().reused, 40);

  // A structural change (a new branch; a different internal length) rebuilds.
  const Workload other = pat_workload({1, 4, 32}, {1001, 200, 5}, wp);
  ASSERT_TRUE(same_plan(cached.plan(other, opt), plan_pat_with(other, opt, *rules)));
  EXPECT_EQ(cached.stats().rebuilt, 2);
  const Workload more = pat_workload({1, 4, 36}, {1000, 200, 5}, wp);
  ASSERT_TRUE(same_plan(cached.plan(more, opt), plan_pat_with(more, opt, *rules)));
  EXPECT_EQ(cached.stats().rebuilt, 3);
  // Other options: another key.
  PlanOptions small;
  small.num_sms = 8;
  small.extra["pat_max_rows"] = 16;
  const Workload w = pat_workload({1, 4, 32}, {1000, 200, 44}, wp);
  ASSERT_TRUE(same_plan(cached.plan(w, small), plan_pat_with(w, small, *rules)));
  EXPECT_EQ(cached.stats().rebuilt, 4);
}

TEST(PatPlanner, RandomTreesAgreeWithStatelessPlanner) {
  PatPlanner cached(nullptr, 2);
  RandomTreeOptions shape;
  shape.max_nodes = 30;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    WorkloadParams wp;
    wp.heads = {16, 4, 64};
    wp.seed = seed;
    Workload w = random_workload(seed, wp, shape);
    std::vector<int> children(w.tree.nodes.size(), 0);
    for (const Node& n : w.tree.nodes)
      if (n.parent >= 0) ++children[n.parent];
    for (int step = 0; step < 6; ++step) {
      w.validate();
      ASSERT_TRUE(same_plan(cached.plan(w, {}), make_plan("pat", w))) << "seed " << seed << " step " << step;
      ASSERT_TRUE(same_plan(cached.plan(w, {}), make_plan("pat", w))) << "seed " << seed << " step " << step;
      // A decode step: every leaf grows by 7 tokens (new pages as needed).
      for (size_t v = 0; v < w.tree.nodes.size(); ++v) {
        if (children[v]) continue;
        Node& n = w.tree.nodes[v];
        n.num_tokens += 7;
        while (int64_t(n.pages.size()) * w.layout.page_size < n.num_tokens) n.pages.push_back(int32_t(w.layout.num_pages++));
      }
    }
  }
  EXPECT_EQ(cached.stats().rebuilt, 12);
  EXPECT_EQ(cached.stats().incremental, 12 * 5);
  EXPECT_EQ(cached.stats().reused, 12 * 6);
}
