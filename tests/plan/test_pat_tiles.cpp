// The compiled tile set and PAT's KV-tile selection: tile_index and
// smallest_tile_for_rows (which keeps returning the n = 64 tiles), the shipped
// rule table resolved to the KV-tile variants, the rule derivation from
// measured times (what `treeattn calibrate --pat-tiles` writes), PAT plans
// that use n = 32 and n = 128 tiles (valid, and the CPU executor matches the
// fp64 reference), and every planner's plans over generator families.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "treeattn/cost_models.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/pat_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

int n_of(const Plan& p, int32_t u) { return kTileConfigs[p.unit_tile[u]].n; }

WorkloadParams heads(int qo, int kv, int d, DType t = DType::fp16) {
  WorkloadParams wp;
  wp.heads = {qo, kv, d};
  wp.dtype = t;
  return wp;
}

// PAT's artifact thresholds (getMNW), the table shipped before ours was
// measured: fixed expectations for the selector, whatever the shipped file holds.
PatTileRules artifact_rules() {
  PatTileRules r;
  r.rules = {{32, 31, 16}, {32, 63, 32}, {32, 128, 64}, {32, -1, 128}, {64, 63, 32},
             {64, 128, 64}, {64, -1, 128}, {128, 16, 16}, {128, -1, 64}};
  return r;
}

}  // namespace

TEST(PatTiles, TileTableKeepsTheDefaultTilesAndAddsKvVariants) {
  for (int i = 0; i < num_tile_configs(); ++i) EXPECT_EQ(tile_index(kTileConfigs[i].m, kTileConfigs[i].n), i);
  for (auto [m, n] : {std::pair{16, 32}, {32, 32}, {64, 32}, {16, 128}, {32, 128}})
    EXPECT_GE(tile_index(m, n), 0) << m << "x" << n;
  EXPECT_EQ(tile_index(128, 32), -1);
  EXPECT_EQ(tile_index(16, 16), -1);
  // The first four indices keep their meaning: the n = 64 tiles by m.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(kTileConfigs[i].n, kDefaultKvTile);
  for (int rows = 1; rows <= kMaxTileRows; ++rows) {
    const int t = smallest_tile_for_rows(rows);
    EXPECT_EQ(kTileConfigs[t].n, kDefaultKvTile) << rows;
    EXPECT_GE(kTileConfigs[t].m, rows);
    EXPECT_LT(kTileConfigs[t].m / 2, std::max(rows, 16)) << "not the smallest m for " << rows;
  }
  EXPECT_EQ(smallest_tile_for_rows(1), tile_index(16, 64));
  EXPECT_EQ(smallest_tile_for_rows(33), tile_index(64, 64));
  EXPECT_THROW(smallest_tile_for_rows(kMaxTileRows + 1), Error);
}

// The shipped table (PAT's artifact thresholds) resolved to the compiled
// tiles: n = 16 runs as 32; n = 128 exists at m <= 32 only.
TEST(PatTiles, SelectorResolvesRulesToCompiledTiles) {
  const PatTileRules r = artifact_rules();
  const auto pick = [&](int rows, int64_t kv) {
    const TileConfig t = kTileConfigs[pat_select_tile(r, rows, kv)];
    return std::pair{t.m, t.n};
  };
  EXPECT_EQ(pick(4, 10), (std::pair{16, 32}));    // n = 16 -> 32
  EXPECT_EQ(pick(16, 31), (std::pair{16, 32}));
  EXPECT_EQ(pick(16, 32), (std::pair{16, 32}));
  EXPECT_EQ(pick(16, 63), (std::pair{16, 32}));
  EXPECT_EQ(pick(16, 64), (std::pair{16, 64}));
  EXPECT_EQ(pick(16, 128), (std::pair{16, 64}));
  EXPECT_EQ(pick(16, 129), (std::pair{16, 128}));
  EXPECT_EQ(pick(32, 40), (std::pair{32, 32}));
  EXPECT_EQ(pick(32, 5000), (std::pair{32, 128}));
  EXPECT_EQ(pick(48, 40), (std::pair{64, 32}));
  EXPECT_EQ(pick(64, 100), (std::pair{64, 64}));
  EXPECT_EQ(pick(64, 5000), (std::pair{64, 64}));  // no 64 x 128 tile: nearest n
  EXPECT_EQ(pick(128, 8), (std::pair{128, 64}));   // only n = 64 at m = 128
  EXPECT_EQ(pick(100, 5000), (std::pair{128, 64}));
  // n = 128 tiles do not fit shared memory at head_dim 256: nearest that does.
  EXPECT_EQ(kTileConfigs[pat_select_tile(r, 16, 5000, 256)].n, 64);
  EXPECT_EQ(kTileConfigs[pat_select_tile(r, 16, 5000, 128)].n, 128);
}

// The shipped table is measured, and every row count has a rule for any KV length.
TEST(PatTiles, ShippedRulesAreMeasuredAndComplete) {
  const PatTileRules& r = builtin_pat_tile_rules();
  EXPECT_EQ(r.source, "measured");
  for (int rows : {1, 16, 17, 32, 33, 64, 65, 128})
    for (int64_t kv : {1, 100, 1000000}) {
      const int t = pat_select_tile(r, rows, kv);
      EXPECT_GE(kTileConfigs[t].m, rows);
      EXPECT_TRUE(tile_fits_head_dim(t, 128));
    }
}

TEST(PatTiles, DeriveRulesTakesTheFastestPerLengthAndMergesRuns) {
  // m = 16: n = 32 wins up to 48 tokens, n = 64 at 64..128 (96 is a tie
  // within 2%: the larger n), n = 128 beyond. m = 64: n = 64 everywhere but
  // 16 tokens. m = 128: one tile.
  std::vector<PatTileTiming> t;
  const auto add = [&](int m, int64_t kv, std::vector<std::pair<int, double>> us) {
    for (auto [n, x] : us) t.push_back({m, kv, n, x});
  };
  add(16, 16, {{32, 5.0}, {64, 6.0}, {128, 9.0}});
  add(16, 32, {{32, 5.1}, {64, 6.1}, {128, 9.0}});
  add(16, 48, {{32, 6.0}, {64, 6.5}, {128, 9.1}});
  add(16, 64, {{32, 7.0}, {64, 6.6}, {128, 9.2}});
  add(16, 96, {{32, 8.0}, {64, 8.1}, {128, 9.3}});  // 32 fastest, 64 within 2%
  add(16, 128, {{32, 9.0}, {64, 8.0}, {128, 9.5}});
  add(16, 256, {{32, 16.0}, {64, 12.0}, {128, 11.0}});
  add(16, 4096, {{32, 200.0}, {64, 150.0}, {128, 120.0}});
  add(64, 16, {{32, 5.0}, {64, 7.0}});
  add(64, 64, {{32, 9.0}, {64, 7.0}});
  add(64, 1024, {{32, 90.0}, {64, 70.0}});
  add(128, 16, {{64, 10.0}});
  add(128, 4096, {{64, 300.0}});
  std::reverse(t.begin(), t.end());  // input order does not matter
  const std::vector<PatTileRule> r = derive_pat_tile_rules(t);
  const std::vector<std::tuple<int, int64_t, int>> want = {
      {16, 48, 32}, {16, 128, 64}, {16, -1, 128}, {64, 16, 32}, {64, -1, 64}, {128, -1, 64}};
  ASSERT_EQ(r.size(), want.size());
  for (size_t i = 0; i < r.size(); ++i)
    EXPECT_EQ(std::tuple(r[i].max_rows, r[i].max_kv, r[i].n), want[i]) << "rule " << i;

  // The tie margin is a parameter: with none, 96 tokens goes to n = 32 and
  // splits the n = 64 run.
  const std::vector<PatTileRule> strict = derive_pat_tile_rules(t, 0.0);
  ASSERT_GE(strict.size(), 3u);
  EXPECT_EQ(std::tuple(strict[0].max_rows, strict[0].max_kv, strict[0].n), std::tuple(16, int64_t(48), 32));
  EXPECT_EQ(std::tuple(strict[1].max_kv, strict[1].n), std::tuple(int64_t(64), 64));
  EXPECT_EQ(std::tuple(strict[2].max_kv, strict[2].n), std::tuple(int64_t(96), 32));

  // The rules drive the selector as measured: 40 tokens at 16 rows -> n = 32.
  PatTileRules rules;
  rules.rules = r;
  EXPECT_EQ(kTileConfigs[pat_select_tile(rules, 16, 40)].n, 32);
  EXPECT_EQ(kTileConfigs[pat_select_tile(rules, 16, 100)].n, 64);
  EXPECT_EQ(kTileConfigs[pat_select_tile(rules, 8, 300)].n, 128);
  EXPECT_EQ(kTileConfigs[pat_select_tile(rules, 40, 10)].n, 32);
  EXPECT_EQ(kTileConfigs[pat_select_tile(rules, 40, 17)].n, 64);
  EXPECT_EQ(kTileConfigs[pat_select_tile(rules, 128, 17)].n, 64);

  EXPECT_THROW(derive_pat_tile_rules({}), Error);
  EXPECT_THROW(derive_pat_tile_rules({{16, 16, 32, 0.0}}), Error);
  EXPECT_THROW(derive_pat_tile_rules({{16, 16, 32, std::nan("")}}), Error);
  EXPECT_THROW(derive_pat_tile_rules({{16, 16, 32, 1.0}}, 1.5), Error);
}

// A measured table (what calibrate writes) keeps its evidence through a round
// trip, and the form without measurements is the built-in copy's form.
TEST(PatTiles, MeasuredTableRoundTrip) {
  PatTileRules r;
  r.source = "measured";
  r.device = "NVIDIA H100 80GB HBM3";
  r.date = "2026-11-22";
  r.commit = "abc1234";
  r.config = "heads 32/8, head_dim 128, fp16, page 16";
  r.note = "test";
  r.measurements = {{16, 16, 32, 5.25}, {16, 16, 64, 6.5}, {16, 4096, 128, 120}};
  r.rules = derive_pat_tile_rules(r.measurements);
  const PatTileRules back = parse_pat_tile_rules(to_json(r));
  EXPECT_EQ(back.source, r.source);
  EXPECT_EQ(back.device, r.device);
  EXPECT_EQ(back.date, r.date);
  EXPECT_EQ(back.commit, r.commit);
  EXPECT_EQ(back.config, r.config);
  ASSERT_EQ(back.measurements.size(), 3u);
  EXPECT_EQ(back.measurements[2].kv, 4096);
  EXPECT_EQ(back.measurements[2].n, 128);
  EXPECT_DOUBLE_EQ(back.measurements[0].us, 5.25);
  ASSERT_EQ(back.rules.size(), r.rules.size());
  EXPECT_EQ(to_json(back), to_json(r));
  const PatTileRules compact = parse_pat_tile_rules(to_json(r, false));
  EXPECT_TRUE(compact.measurements.empty());
  EXPECT_EQ(compact.device, r.device);
  EXPECT_THROW(parse_pat_tile_rules(R"({"format": "treeattn-pat-tile-rules/1", "rules": [{"max_rows": 16, "n": 32}],
                                       "measurements": [{"m": 16, "kv": 16, "n": 32}]})"),
               Error);
}

// PAT plans whose units use n = 32 and n = 128 tiles: valid, and the CPU
// executor (which ignores n) matches the fp64 reference.
TEST(PatTiles, PlansWithKvVariantsValidateAndMatchReference) {
  struct Case {
    const char* spec;
    WorkloadParams wp;
  };
  const Case cases[] = {
      {"pat:B=1,4,16:L=300,100,20", heads(16, 4, 64)},
      {"pat:B=2,8:L=40,9", heads(8, 2, 64, DType::fp32)},
      {"fasttree:N=1,4,32:C=500,300,30", heads(8, 8, 64)},
      {"fewshot:prompt=400:branches=6:len=50", heads(32, 8, 64, DType::bf16)},
  };
  std::set<std::pair<int, int>> used;
  for (const Case& c : cases) {
    const Workload w = make_workload(c.spec, c.wp);
    HostTensors t = make_random_inputs(w, 7);
    const std::vector<double> ref = reference_attention(w, t.args());
    const double tol = w.layout.dtype == DType::fp32 ? 1e-5 : w.layout.dtype == DType::bf16 ? 1e-2 : 2e-3;
    std::vector<std::pair<std::string, Plan>> plans;
    PlanOptions opt;
    opt.num_sms = 8;
    plans.emplace_back("pat (shipped rules)", make_plan("pat", w, opt));
    for (int n : {32, 64, 128}) {  // every unit asks for n; m stays the smallest holding its rows
      PatTileRules forced;
      forced.rules = {{kMaxTileRows, -1, n}};
      for (int rows : {16, 32, 64}) {
        PlanOptions o = opt;
        o.extra["pat_max_rows"] = rows;
        if (rows < w.heads.group_size()) continue;
        plans.emplace_back("pat n=" + std::to_string(n) + " rows " + std::to_string(rows), plan_pat_with(w, o, forced));
        const Plan& p = plans.back().second;
        for (int32_t u = 0; u < p.num_units(); ++u) {
          const int m = kTileConfigs[p.unit_tile[u]].m;
          EXPECT_EQ(n_of(p, u), tile_index(m, n) >= 0 ? n : kDefaultKvTile) << c.spec << " unit " << u;
        }
      }
    }
    for (auto& [what, p] : plans) {
      validate_plan(w, p);
      for (int32_t u = 0; u < p.num_units(); ++u) used.insert({kTileConfigs[p.unit_tile[u]].m, n_of(p, u)});
      run_cpu(w, p, t.args(), 1);
      EXPECT_LE(relative_error(w, t.out.data(), ref), tol) << c.spec << " " << what;
    }
  }
  for (auto [m, n] : {std::pair{16, 32}, {32, 32}, {64, 32}, {16, 128}, {32, 128}})
    EXPECT_TRUE(used.count({m, n})) << "no plan used tile " << m << "x" << n;
}

// The shipped rules on PAT's generator: short leaves get n = 32 tiles, long
// 16-32-row units n = 128, and every tile config is one run of units.
TEST(PatTiles, PatPlannerUsesShortAndLongKvTiles) {
  const auto tiles_of = [](const char* spec) {
    const Workload w = make_workload(spec, heads(32, 8, 128));
    const Plan p = plan_pat_with(w, PlanOptions{}, artifact_rules());
    validate_plan(w, p);
    std::set<std::pair<int, int>> used;
    for (int32_t u = 0; u < p.num_units(); ++u) used.insert({kTileConfigs[p.unit_tile[u]].m, n_of(p, u)});
    std::set<int> seen;
    for (const TileRun& r : tile_runs(p))
      EXPECT_TRUE(seen.insert(r.tile).second) << spec << ": tile " << r.tile << " split";
    return used;
  };
  // 20-token leaves of one query (4 rows): m16n32; the 2100-token middle
  // level (root merged in) cut at the mean into 64-row pieces of > 128 tokens:
  // m64n64 (no m64n128).
  const auto a = tiles_of("pat:B=1,4,64:L=2000,100,20");
  EXPECT_TRUE(a.count({16, 32}));
  EXPECT_TRUE(a.count({64, 64}));
  // 200-token leaves (below the mean, not split): m16n128; 300-token middle
  // nodes of 8 queries, split in two: m32n128.
  const auto b = tiles_of("pat:B=1,4,8:L=1000,300,200");
  EXPECT_TRUE(b.count({16, 128}));
  EXPECT_TRUE(b.count({32, 128}));
}

// Planners that only count rows keep the n = 64 tiles; pat's plans validate;
// all of them over the generator families and several head shapes.
TEST(PatTiles, EveryPlannerValidatesWithTheNewTiles) {
  const char* specs[] = {"fasttree:N=1,4,16:C=300,40,20", "pat:B=1,4,16:L=200,100,30", "pat:B=2,8:L=100,60",
                         "fewshot:prompt=700:branches=12:len=50", "pat:B=1,10:L=4096,416"};
  const int hs[][2] = {{32, 8}, {8, 8}, {32, 4}, {32, 2}, {32, 32}};
  for (const char* spec : specs)
    for (const auto& h : hs) {
      const Workload w = make_workload(spec, heads(h[0], h[1], 128));
      for (const PlannerInfo& pl : planners()) {
        PlanOptions opt;
        opt.num_sms = 16;
        const Plan p = pl.fn(w, opt);
        ASSERT_NO_THROW(validate_plan(w, p)) << spec << " " << pl.name;
        if (pl.name == "pat" || pl.name == "auto") continue;
        for (int32_t u = 0; u < p.num_units(); ++u)
          ASSERT_EQ(n_of(p, u), kDefaultKvTile) << spec << " " << pl.name << " unit " << u;
      }
    }
}
