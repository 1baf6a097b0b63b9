// `treeattn calibrate`: measures FlashForge's cost table C(rows, kv) on this
// GPU -- the time of one unit (one CTA per kv head) with `rows` Q rows over
// `kv` KV tokens while the GPU is full of identical units -- and writes it in
// the treeattn-forge-cost/1 format that `forge` reads (--forge-table).
// `treeattn calibrate --pat-tiles` measures PAT's KV-tile rule table instead:
// for each Q tile m and KV length, the time of a launch of identical units
// with every compiled KV tile n of that m; the fastest n per KV-length range
// becomes a rule (derive_pat_tile_rules), written in the
// treeattn-pat-tile-rules/1 format with the times behind it.
// `treeattn calibrate --auto` fits the auto planner's cost model on this
// GPU: it times per-query's and node's plans of the benchmark suites' configs
// and fits the table (fit_auto_cost_model) that --auto-cost FILE reads.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>

#include "bench/suite.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "tree/builder_util.hpp"
#include "treeattn/bench.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn::cli {

namespace {

// `units` roots of `kv` tokens, each with `queries` queries attached, and the
// plan that gives every root exactly one unit (no split, no merge).
std::pair<Workload, Plan> identical_units(int units, int kv, int queries, const WorkloadParams& p) {
  Workload w;
  w.name = "calibrate:units=" + std::to_string(units) + ":kv=" + std::to_string(kv) + ":queries=" + std::to_string(queries);
  w.heads = p.heads;
  w.layout.page_size = p.page_size;
  w.layout.dtype = p.dtype;
  PageAllocator pages(p.page_size, p.seed);
  for (int u = 0; u < units; ++u) {
    const int32_t root = pages.add_node(w.tree, -1, kv);
    for (int q = 0; q < queries; ++q) w.query_nodes.push_back(root);
  }
  w.layout.num_pages = std::max<int64_t>(1, pages.finish(w.tree));  // kv = 0: an unused page keeps the pools non-null
  w.validate();
  PlanBuilder b(w, "calibrate");
  for (int u = 0; u < units; ++u) {
    b.begin_unit();
    if (kv > 0) b.add_segment(u, 0, kv);
    for (int q = 0; q < queries; ++q) b.add_query(u * queries + q);
    b.end_unit();
  }
  return {std::move(w), b.finish()};
}

std::string utc_date() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// Writes a calibration's output; Error naming the file where it cannot.
void write_output(const std::string& path, const std::string& text, const std::string& what) {
  std::ofstream f(path);
  f << text;
  if (!f) throw Error(what + ": cannot write '" + path + "'");
  std::printf("wrote %s\n", path.c_str());
}

// PAT's tile rules: every compiled n of every Q tile m over a sweep of KV
// lengths, `units` identical units (m rows each) per launch, each unit run
// with exactly the tile being timed (no executor substitution).
void calibrate_pat_tiles(const CommonOptions& o, const std::string& out, int waves) {
  require_gpu("calibrate --pat-tiles");
  const WorkloadParams p = workload_params(o);
  const PlanOptions opt = plan_options(o);
  const int g = p.heads.group_size();
  const int slots = opt.num_sms * opt.ctas_per_sm;
  const int units = std::max(1, waves * slots / p.heads.num_kv_heads);
  const std::vector<int64_t> kvs = {16, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 4096};
  std::map<int, std::vector<int>> ns;  // m -> compiled n, ascending
  for (const TileConfig& t : kTileConfigs)
    if (t.m >= g) ns[t.m].push_back(t.n);
  if (ns.empty()) throw Error("calibrate --pat-tiles: group size " + std::to_string(g) + " exceeds every Q tile");
  for (auto& [m, v] : ns) std::sort(v.begin(), v.end());

  BenchOptions b;
  b.verify_queries = 2;  // each new tile's output is checked against fp64 as it is timed
  b.graph = false;
  b.seed = o.seed;
  b.exact_tiles = true;
  const std::string device = gpu_device_name();
  std::printf("calibrate --pat-tiles on %s: heads %d/%d, d=%d, %s, page %d, %d units x %d kv heads per launch "
              "(%d waves of %d CTA slots); median us of %d L2-flushed runs\n",
              device.c_str(), p.heads.num_qo_heads, p.heads.num_kv_heads, p.heads.head_dim,
              std::string(to_string(p.dtype)).c_str(), p.page_size, units, p.heads.num_kv_heads, waves, slots, b.iters);
  std::vector<PatTileTiming> times;
  for (const auto& [m, tile_ns] : ns) {
    const int queries = m / g;
    std::printf("\nm=%d (%d queries x %d qo heads per kv head = %d rows)\n%8s", m, queries, g, queries * g, "kv");
    for (int n : tile_ns) std::printf("  %8s", ("n=" + std::to_string(n)).c_str());
    std::printf("  %6s\n", "best");
    for (const int64_t kv : kvs) {
      std::printf("%8lld", static_cast<long long>(kv));
      auto [w, plan] = identical_units(units, int(kv), queries, p);
      GpuBench gpu(w, o.seed);
      std::vector<PatTileTiming> point;
      for (int n : tile_ns) {
        std::fill(plan.unit_tile.begin(), plan.unit_tile.end(), uint8_t(tile_index(m, n)));
        const GpuTiming timing = gpu.time(plan, b);
        if (!(timing.max_rel_err >= 0 && timing.max_rel_err <= tolerance(p.dtype)))
          throw Error("calibrate --pat-tiles: m=" + std::to_string(m) + " n=" + std::to_string(n) + " kv=" +
                      std::to_string(kv) + ": output error " + std::to_string(timing.max_rel_err) +
                      " against the fp64 reference exceeds " + std::to_string(tolerance(p.dtype)));
        point.push_back({m, kv, n, timing.us});
        std::printf("  %8.2f", timing.us);
        std::fflush(stdout);
      }
      const std::vector<PatTileRule> best = derive_pat_tile_rules(point);
      std::printf("  %6d\n", best.front().n);
      times.insert(times.end(), point.begin(), point.end());
    }
  }

  PatTileRules r;
  r.source = "measured";
  r.device = device;
  r.date = utc_date();
  r.commit = current_commit(TREEATTN_SOURCE_DIR);
  r.config = "heads " + o.heads + ", head_dim " + std::to_string(p.heads.head_dim) + ", " +
             std::string(to_string(p.dtype)) + ", page " + std::to_string(p.page_size) + ", " + std::to_string(units) +
             " units x " + std::to_string(p.heads.num_kv_heads) + " kv heads per launch";
  r.rules = derive_pat_tile_rules(times);
  r.measurements = times;
  r.note = "Measured by `treeattn calibrate --pat-tiles --heads " + o.heads + " --head-dim " +
           std::to_string(p.heads.head_dim) + " --dtype " + o.dtype +
           "`: for each Q tile m (rows = m) and KV length, the median time (us, L2 flushed) of one launch of " +
           std::to_string(units) + " identical single-segment units x " + std::to_string(p.heads.num_kv_heads) +
           " kv heads with each compiled KV tile n (measurements); a rule is the fastest n over a run of adjacent "
           "measured lengths (within 2% the larger n wins), up to the longest length of the run.";
  std::printf("\nrules (first match: rows <= max_rows and kv <= max_kv):\n");
  for (const PatTileRule& x : r.rules)
    std::printf("  rows <= %3d  kv <= %6s  n = %d\n", x.max_rows,
                x.max_kv < 0 ? "any" : std::to_string(x.max_kv).c_str(), x.n);
  std::printf("\nbuilt-in copy for kBuiltinTileRules in src/plan/planners/pat.cpp (make it the library default):\n%s",
              to_json(r, false).c_str());
  if (out.empty()) {
    std::printf("\n%s", to_json(r).c_str());
  } else {
    write_output(out, to_json(r), "calibrate --pat-tiles");
  }
}

struct AutoCostRun {
  std::vector<std::string> suites;        // measured: these suites' configs
  bool quick = false;                     // their --quick subsets
  std::vector<std::string> from_samples;  // or fitted from these samples files (no GPU)
  std::vector<std::string> test_samples;  // scored on these too (trees the fit did not see)
  std::string samples_out;                // the measured samples, written here
  std::string out;                        // the table (default: printed)
};

// The configs of the suites calibrate --auto measures: each suite's specs
// at each of its head configs (--quick: its representative subset).
struct CalibrationConfigs {
  struct Config {
    const bench::Suite* suite;
    std::string spec;
    HeadConfig heads;
  };
  std::vector<bench::Suite> suites;
  std::vector<Config> list;

  explicit CalibrationConfigs(const AutoCostRun& run) {
    for (const std::string& name : run.suites)
      suites.push_back(load_named_suite(name, "calibrate --auto --suite"));
    for (const bench::Suite& suite : suites)
      for (const HeadConfig& h : run.quick ? suite.quick_heads : suite.heads)
        for (const auto& e : suite.entries)
          if (!run.quick || e.quick) list.push_back({&suite, e.spec, h});
  }
  // Config i's options (its heads, head_dim, dtype and page size over `common`).
  CommonOptions options(const CommonOptions& common, size_t i) const {
    const Config& c = list[i];
    CommonOptions o = common;
    o.heads = std::to_string(c.heads.num_qo_heads) + "/" + std::to_string(c.heads.num_kv_heads);
    o.head_dim = c.suite->head_dim;
    o.dtype = std::string(to_string(c.suite->dtype));
    o.page_size = c.suite->page_size;
    o.workloads = {c.spec};
    return o;
  }
};

// Timing as in the fit's samples: median of 50 L2-flushed runs, no graph.
BenchOptions calibration_timing(const CommonOptions& common) {
  BenchOptions b;
  b.verify_queries = 0;
  b.graph = false;
  b.seed = common.seed;
  return b;
}

// The suites' configs, each planned by per-query and node and timed: the
// fit's samples; auto's own plan is timed too, for the report.
AutoCostSamples measure_auto_cost_samples(const CommonOptions& common, const AutoCostRun& run,
                                          const CalibrationConfigs& configs) {
  AutoCostSamples out;
  out.device = gpu_device_name();
  out.commit = current_commit(TREEATTN_SOURCE_DIR);
  out.date = utc_date();
  out.command = "treeattn calibrate --auto";
  for (const std::string& s : run.suites) out.command += " --suite " + s;
  if (run.quick) out.command += " --quick";
  out.command += " --sms " + std::to_string(common.num_sms);
  const BenchOptions b = calibration_timing(common);
  Progress progress("calibrate --auto");
  for (size_t i = 0; i < configs.list.size(); ++i) {
    const CommonOptions o = configs.options(common, i);
    AutoCostSample s;
    s.config = configs.list[i].spec + " @" + o.heads;
    s.group = configs.list[i].suite->name;
    progress.step(s.config, int(configs.list.size()));
    const PlanOptions opt = plan_options(o);
    const Workload w = load_workloads(o, {}).front();
    GpuBench gpu(w, common.seed);
    const Plan pq = make_plan("per-query", w, opt), node = make_plan("node", w, opt);
    s.per_query = auto_cost_features(w, pq, opt);
    s.node = auto_cost_features(w, node, opt);
    s.per_query_us = gpu.time(pq, b).us;
    s.node_us = gpu.time(node, b).us;
    s.auto_us = gpu.time(make_plan("auto", w, opt), b).us;  // the table in use (--auto-cost), its shape choice too
    out.samples.push_back(std::move(s));
  }
  progress.clear();
  return out;
}

// A plan's arrays as bytes: equal keys, the same plan.
std::string plan_key(const Plan& p) {
  std::string key;
  const auto add = [&](const auto& v) {
    key.append(reinterpret_cast<const char*>(v.data()), sizeof(v[0]) * v.size());
    key += '|';
  };
  add(p.unit_tile);
  add(p.unit_masked);
  add(p.unit_segment_offset);
  add(p.segments);
  add(p.unit_query_offset);
  add(p.entry_query);
  add(p.entry_mask);
  add(p.entry_slot);
  return key;
}

// samples[i].shape_us: auto with model m under each pair of shape margins on
// config i, each distinct plan timed once.
void measure_shape_margins(const CommonOptions& common, const CalibrationConfigs& configs, const AutoCostModel& m,
                           std::vector<AutoCostSample>& samples) {
  const BenchOptions b = calibration_timing(common);
  Progress progress("calibrate --auto: shape margins");
  for (size_t i = 0; i < configs.list.size(); ++i) {
    progress.step(samples[i].config, int(configs.list.size()));
    const CommonOptions o = configs.options(common, i);
    const PlanOptions opt = plan_options(o);
    const Workload w = load_workloads(o, {}).front();
    GpuBench gpu(w, common.seed);
    std::vector<std::pair<std::string, double>> timed;  // plan key -> us
    samples[i].shape_us.assign(kShapeMarginPairs, 0);
    for (size_t pair = 0; pair < kShapeMarginPairs; ++pair) {
      AutoCostModel with = m;
      std::tie(with.smaller_tiles_margin, with.wider_units_margin) = shape_margin_pair(pair);
      const Plan p = plan_auto_with(w, opt, with);
      std::string key = plan_key(p);
      auto it = std::find_if(timed.begin(), timed.end(), [&](const auto& t) { return t.first == key; });
      if (it == timed.end()) {
        timed.emplace_back(std::move(key), gpu.time(p, b).us);
        it = timed.end() - 1;
      }
      samples[i].shape_us[pair] = it->second;
    }
  }
  progress.clear();
}

void calibrate_auto_cost(const CommonOptions& o, const AutoCostRun& run) {
  AutoCostSamples data;
  std::string source;
  // Samples files, concatenated (the first one's device and commit).
  const auto read_samples = [](const std::vector<std::string>& paths) {
    AutoCostSamples all;
    for (const std::string& path : paths) {
      AutoCostSamples d;
      try {
        d = parse_auto_cost_samples(detail::read_text_file(path, "auto cost samples"));
      } catch (const Error& e) {
        throw Error(path + ": " + e.what());
      }
      if (all.samples.empty() && all.device.empty()) all = d;
      else all.samples.insert(all.samples.end(), d.samples.begin(), d.samples.end());
    }
    return all;
  };
  const AutoCostSamples test = read_samples(run.test_samples);  // read first: a bad file stops before measuring
  std::optional<CalibrationConfigs> configs;  // a measuring run's
  if (!run.from_samples.empty()) {
    data = read_samples(run.from_samples);
    for (const std::string& path : run.from_samples) source += (source.empty() ? "" : " ") + path;
  } else {
    require_gpu("calibrate --auto");
    std::printf("calibrate --auto on %s: per-query and node on every config of the suites", gpu_device_name().c_str());
    for (const std::string& s : run.suites) std::printf(" %s", s.c_str());
    std::printf("%s, planned for %d SMs (--sms; default: this GPU's)\n", run.quick ? " (--quick)" : "", o.num_sms);
    configs.emplace(run);
    data = measure_auto_cost_samples(o, run, *configs);
  }
  AutoCostModel m = fit_auto_cost_model(data.samples);  // Error on a non-finite or negative coefficient
  // All 0 prices every plan at 0 us: auto would pick node everywhere, whatever
  // the GPU. Such a fit means the samples cannot tell the plans apart (e.g.
  // every feature 0); no table is better than that one. Measured samples are
  // still written (--samples): they took the GPU time and show what went wrong.
  if (std::all_of(m.coefficients.begin(), m.coefficients.end(), [](double c) { return c == 0; })) {
    if (!run.samples_out.empty()) write_output(run.samples_out, to_json(data), "calibrate --auto --samples");
    throw Error("calibrate --auto: coefficients = 0 for every feature, fitted on " +
                std::to_string(data.samples.size()) +
                " samples: they do not tell per-query's and node's times apart (are their features all 0?); "
                "no table written");
  }
  // The shape margins: auto's plans with the fitted coefficients, timed
  // under each pair (a measuring run); or the samples' own such times.
  if (configs) {
    std::printf("shape margins: auto with the fitted table under %zu pairs of margins, each distinct plan timed\n",
                kShapeMarginPairs);
    measure_shape_margins(o, *configs, m, data.samples);
  }
  if (!run.samples_out.empty()) write_output(run.samples_out, to_json(data), "calibrate --auto --samples");
  const bool shape_runs = std::all_of(data.samples.begin(), data.samples.end(),
                                      [](const AutoCostSample& s) { return s.shape_us.size() == kShapeMarginPairs; });
  if (shape_runs) {
    const ShapeMargins chosen = choose_shape_margins(data.samples);
    m.smaller_tiles_margin = chosen.smaller_tiles;
    m.wider_units_margin = chosen.wider_units;
  }
  m.device = data.device;
  m.date = utc_date();
  m.commit = current_commit(TREEATTN_SOURCE_DIR);
  std::vector<std::string> groups;
  for (const AutoCostSample& s : data.samples)
    if (std::find(groups.begin(), groups.end(), s.group) == groups.end()) groups.push_back(s.group);
  // Where the samples were measured; a samples file may lack the commit or
  // device ("unknown", as current_commit() says where git cannot tell). A fit
  // from samples files names its own commit too (measuring runs fit at theirs).
  std::string suites;
  for (const std::string& g : groups) suites += g.empty() ? "" : " " + g;
  m.source = "per-query and node timed on " + std::to_string(data.samples.size()) + " configs" +
             (suites.empty() ? "" : " (suites" + suites + ")") + " at commit " +
             (data.commit.empty() ? std::string("unknown") : data.commit) + " on " +
             (data.device.empty() ? std::string("an unnamed device") : data.device) +
             (data.date.empty() ? "" : ", " + data.date) +
             (run.from_samples.empty() ? "" : "; fitted at commit " + m.commit);
  m.fit = run.from_samples.empty() ? data.command : "treeattn calibrate --auto --from-samples " + source;

  const int n = int(data.samples.size());
  std::printf("coefficients (us per unit):");
  for (int i = 0; i < kAutoCostFeatures; ++i) std::printf(" %s %.4g", kAutoCostFeatureNames[i], m.coefficients[i]);
  std::printf("; margin %.2f\n", m.margin);
  std::printf("auto within 3 %% of the faster of per-query and node: %d/%d with this table, %d/%d with the built-in %s table\n",
              auto_cost_hits(m, data.samples), n, auto_cost_hits(builtin_auto_cost_model(), data.samples), n,
              builtin_auto_cost_model().device.c_str());
  // Each suite held out: fitted on the others, scored on it.
  if (groups.size() > 1)
    for (const std::string& g : groups) {
      std::vector<AutoCostSample> train, test;
      for (const AutoCostSample& s : data.samples) (s.group == g ? test : train).push_back(s);
      const AutoCostModel held = fit_auto_cost_model(train);
      std::printf("  held out %s (fitted on the others): %d/%zu\n", g.c_str(), auto_cost_hits(held, test), test.size());
    }
  if (shape_runs) {
    const AutoCostModel defaults;
    const ShapeMargins chosen = score_shape_margins(data.samples, shape_margin_index(m.smaller_tiles_margin, m.wider_units_margin));
    const ShapeMargins old =
        score_shape_margins(data.samples, shape_margin_index(defaults.smaller_tiles_margin, defaults.wider_units_margin));
    std::printf("shape margins %.3f (smaller tiles), %.3f (wider units)%s: auto's plans within 3 %% of min(per-query, "
                "node) on %d/%d, geomean %.4fx; the defaults (%.2f, %.2f): %d/%d, %.4fx\n",
                chosen.smaller_tiles, chosen.wider_units,
                configs ? "" : " (from the samples' shape_us, timed with the table of their measuring run)", chosen.hits,
                n, chosen.geomean, defaults.smaller_tiles_margin, defaults.wider_units_margin, old.hits, n, old.geomean);
  }
  // auto's own plans as measured (planned with the table in use then, node's
  // shape choice included): issue 21's first criterion on these configs.
  int measured = 0, within = 0;
  std::string misses;
  for (const AutoCostSample& s : data.samples) {
    if (s.auto_us <= 0) continue;
    ++measured;
    const double best = std::min(s.per_query_us, s.node_us);
    if (s.auto_us <= kAutoCostHitSlack * best) {
      ++within;
    } else {
      char line[512];
      std::snprintf(line, sizeof line, "    %s: auto %.1f us, per-query %.1f, node %.1f (%.3fx)\n", s.config.c_str(),
                    s.auto_us, s.per_query_us, s.node_us, s.auto_us / best);
      misses += line;
    }
  }
  if (measured > 0)
    std::printf("auto's plans as measured (the table then in use, node's shape choice included): within 3 %% of "
                "min(per-query, node) on %d/%d\n%s",
                within, measured, misses.c_str());
  if (!test.samples.empty())
    std::printf("on the --test-samples (%zu configs the fit did not see): %d with this table, %d with the built-in one\n",
                test.samples.size(), auto_cost_hits(m, test.samples), auto_cost_hits(builtin_auto_cost_model(), test.samples));
  if (run.out.empty()) {
    std::printf("%s", to_json(m).c_str());
  } else {
    write_output(run.out, to_json(m), "calibrate --auto --out");
    std::printf("use it with --auto-cost %s\n", run.out.c_str());
  }
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      "measure the forge cost table C(rows, kv), or with --pat-tiles PAT's KV-tile rules, or with --auto the "
      "auto planner's cost model, on this GPU");
  auto o = std::make_shared<CommonOptions>();
  add_common_options(cmd, *o);
  auto out = std::make_shared<std::string>();
  auto waves = std::make_shared<int>(2);
  auto pat_tiles = std::make_shared<bool>(false);
  cmd->add_option("--out", *out, "output file (default: print the table)");
  auto* waves_opt = cmd->add_option("--waves", *waves,
                                    "full waves of identical units per measurement (default: 2, with --pat-tiles 8)");
  cmd->add_flag("--pat-tiles", *pat_tiles,
                "measure PAT's tile rules (every compiled KV tile n per Q tile m over KV lengths) instead, "
                "e.g. --out data/pat_tile_rules.json");
  auto auto_cost = std::make_shared<bool>(false);
  auto run = std::make_shared<AutoCostRun>();
  cmd->add_flag("--auto", *auto_cost,
                "fit the auto planner's cost model instead: time per-query and node on the suites' configs, "
                "e.g. --out data/auto_cost_<gpu>.json, then pass it with --auto-cost FILE");
  cmd->add_option("--suite", run->suites,
                  "with --auto: a suite to measure (built-in name or file; repeatable; default: fasttree pat deft)");
  cmd->add_flag("--quick", run->quick, "with --auto: the suites' --quick subsets only");
  cmd->add_option("--samples", run->samples_out, "with --auto: also write the measured samples here");
  cmd->add_option("--from-samples", run->from_samples,
                  "with --auto: fit from these samples files (written by --samples) instead of measuring; no GPU");
  cmd->add_option("--test-samples", run->test_samples,
                  "with --auto: also score the fitted and the built-in table on these samples files");
  cmd->callback([cmd, o, out, waves, waves_opt, pat_tiles, auto_cost, run] {
    if (*waves < 1 || *waves > 64) throw Error("waves: " + std::to_string(*waves) + " is out of range [1, 64]");
    if (*pat_tiles && *auto_cost) throw Error("calibrate: --pat-tiles and --auto are two different tables: pick one");
    if (!*auto_cost && (!run->suites.empty() || run->quick || !run->samples_out.empty() || !run->from_samples.empty() ||
                       !run->test_samples.empty()))
      throw Error("calibrate: --suite, --quick, --samples, --from-samples and --test-samples need --auto");
    if (*auto_cost) {
      AutoCostRun r = *run;
      r.out = *out;
      if (r.suites.empty()) r.suites = {"fasttree", "pat", "deft"};
      // The features price waves of resident CTAs: plan for this GPU's SMs,
      // as the runtime does, unless --sms says otherwise.
      CommonOptions c = *o;
      if (cmd->count("--sms") == 0 && gpu_sm_count() > 0) c.num_sms = gpu_sm_count();
      return calibrate_auto_cost(c, r);
    }
    if (*pat_tiles) return calibrate_pat_tiles(*o, *out, waves_opt->count() ? *waves : 8);
    require_gpu("calibrate");
    const WorkloadParams p = workload_params(*o);
    const PlanOptions opt = plan_options(*o);
    const int g = p.heads.group_size();
    const int slots = opt.num_sms * opt.ctas_per_sm;  // the planner's model of resident CTAs
    const int units = std::max(1, *waves * slots / p.heads.num_kv_heads);

    ForgeCostTable t;
    t.device = gpu_device_name();
    t.source = "measured";
    t.head_dim = p.heads.head_dim;
    t.dtype = p.dtype;
    for (int rows : {1, 16, 32, 64, 128})
      if (rows >= g && rows % g == 0) t.q_rows.push_back(rows);
    if (t.q_rows.empty() || t.q_rows.front() != g) t.q_rows.insert(t.q_rows.begin(), g);
    t.kv_tokens = {0, 16, 64, 256, 1024, 4096, 16384};
    BenchOptions b;
    b.verify_queries = 0;
    b.graph = false;
    b.seed = o->seed;
    std::printf("calibrate on %s: heads %d/%d, d=%d, %s, %d units x %d kv heads per point (%d waves of %d CTAs)\n",
                t.device.c_str(), p.heads.num_qo_heads, p.heads.num_kv_heads, p.heads.head_dim,
                std::string(to_string(p.dtype)).c_str(), units, p.heads.num_kv_heads, *waves, slots);
    std::printf("%8s", "rows\\kv");
    for (double kv : t.kv_tokens) std::printf(" %9.0f", kv);
    std::printf("   (us per unit)\n");
    for (double rows : t.q_rows) {
      std::printf("%8.0f", rows);
      for (double kv : t.kv_tokens) {
        auto [w, plan] = identical_units(units, int(kv), int(rows) / g, p);
        GpuBench gpu(w, o->seed);
        const GpuTiming timing = gpu.time(plan, b);
        const double per_unit = timing.us * slots / (double(units) * p.heads.num_kv_heads);
        t.cost_us.push_back(per_unit);
        std::printf(" %9.2f", per_unit);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
    t.note = "Measured by `treeattn calibrate --heads " + o->heads + " --head-dim " + std::to_string(p.heads.head_dim) +
             " --dtype " + o->dtype + "` at commit " + current_commit(TREEATTN_SOURCE_DIR) +
             ": median kernel time of " + std::to_string(*waves) + " full waves of identical units (L2 flushed), times " +
             std::to_string(slots) + " resident CTA slots / CTAs launched.";
    t.validate();
    if (out->empty()) {
      std::printf("%s\n", to_json(t).c_str());
    } else {
      write_output(*out, to_json(t) + "\n", "calibrate --out");
    }
  });
}

}  // namespace treeattn::cli
