// The cost models and decision rules of the paper planners, as plain functions
// that the planners call and the tests check against the papers' worked cases:
// FastTree's padding + reduction costs and Algorithm 1, PAT's merge rule and
// tile-rule table, FlashForge's cost table, makespan bound and LPT schedule;
// and the calibrated cost model by which `auto` chooses its plan.
// docs/planners.md explains each rule and where it deviates from its paper.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "treeattn/planner.hpp"

namespace treeattn {

// ---- FastTree (MLSys'25) ---------------------------------------------------

// Cost-model parameters; the defaults are those of the authors' artifact.
// Tiles are per phase: phase 0 (many queries, near the root) and phase 1 (few
// queries, near the leaves). q_tile_rows counts Q tile rows (queries x group
// size), so a GQA group of g heads fits q_tile_rows / g queries.
struct FastTreeParams {
  double alpha = 0.66;  // weight of Q-tile padding
  double beta = 0.33;   // weight of KV-tile padding
  double gamma = 0.1;   // weight of one extra partial result (reduction)
  std::array<int, 2> q_tile_rows = {64, 16};
  std::array<int, 2> kv_tile = {64, 64};
  int group_size = 1;
  int head_dim = 128;

  int q_tile_queries(int phase) const;
  // Phase of a group of nq queries: 0 when it does not fit phase 1's Q tile.
  int phase_of(int64_t nq) const { return nq > q_tile_queries(1) ? 0 : 1; }
  // Reads alpha, beta, gamma, q_tile0, q_tile1 (rows), kv_tile0, kv_tile1 from
  // opt.extra; group size and head dim from the workload.
  static FastTreeParams from(const Workload& w, const PlanOptions& opt);
};

// Pad(TS, N) = TS - ((N - 1) mod TS + 1): slots left empty in the last tile; 0 for N = 0.
int64_t fasttree_pad(int64_t tile, int64_t n);
// C_P(nQ, len) = alpha * Pad(TS_q, nQ) * g * len * d + beta * nQ * g * Pad(TS_kv, min(len, TS_kv)) * d,
// with the tiles of nQ's phase.
double fasttree_padding_cost(const FastTreeParams& p, int64_t nq, int64_t len);
// Keep the edge v -> l split: v's group (nq_curr queries) and l's group each
// pay their padding, and l's nq_l queries write one more partial.
double fasttree_split_kv_cost(const FastTreeParams& p, int64_t nq_curr, int64_t nq_l, int64_t len_v, int64_t len_l);
// Concatenate v's KV into l's group: v keeps nq_curr - nq_l queries, l's
// group reads len_v + len_l tokens.
double fasttree_split_q_cost(const FastTreeParams& p, int64_t nq_curr, int64_t nq_l, int64_t len_v, int64_t len_l);

// Algorithm 1: BFS over the nodes; for each child l of v, concatenate (mark
// the edge, nQ_curr -= nQ_l, L[l] += L[v]) when SplitKVCost > SplitQCost.
struct FastTreeAssignment {
  std::vector<uint8_t> concat;          // concat[l] = 1: edge parent(l) -> l is concatenated
  std::vector<int64_t> virtual_len;     // L[v]: tokens of v's group (v plus concatenated ancestors)
  std::vector<int64_t> group_queries;   // nQ_curr at the end: v's own queries + split children's
};
FastTreeAssignment fasttree_assign(const Workload& w, const TreeIndex& ix, const FastTreeParams& p);

// ---- PAT (ASPLOS'26) -------------------------------------------------------

// The memory-centric merge rule of TreeHeuristic: merge u's KV (l_u tokens,
// u's own plus what u inherited) into child c's units when that saves memory
// traffic. `S` queries are still in u's group, c holds s_c of them, a CTA
// holds at most `mm` queries. Merging changes the number of times u's KV is
// loaded by ceil(S/mm) - ceil((S-s_c)/mm) - ceil(s_c/mm) (usually -1: one more
// load) and saves 4 units per query of c (partial O written and read, each
// query's Q loaded once more). With every group in one CTA the rule is PAT's
// 4 * s_c > l_u.
bool pat_should_merge(int64_t S, int64_t s_c, int64_t l_u, int64_t mm);

// Tile selector: m is the smallest compiled Q tile holding the rows; n comes
// from the first rule with rows <= max_rows and kv_tokens <= max_kv, then the
// compiled config with that m whose n is nearest (ties: the smaller n).
struct PatTileRule {
  int max_rows = kMaxTileRows;
  int64_t max_kv = -1;  // -1: unbounded
  int n = 64;
};
// One measurement behind a measured table: the median time of a launch of
// identical units with m Q rows over kv KV tokens, run with KV tile n.
struct PatTileTiming {
  int m = 0;
  int64_t kv = 0;
  int n = 0;
  double us = 0;
};
struct PatTileRules {
  std::string source;  // "pat-artifact" (PAT's thresholds), "measured", ...
  std::string note;
  std::vector<PatTileRule> rules;
  // Measured tables only (`treeattn calibrate --pat-tiles`): where and how,
  // and the times the rules were derived from. Empty otherwise.
  std::string device, date, commit, config;
  std::vector<PatTileTiming> measurements;
};
PatTileRules parse_pat_tile_rules(std::string_view json_text);  // throws Error
PatTileRules load_pat_tile_rules(const std::string& path);       // throws Error
// with_measurements = false: the table without its measurements (the form of
// the built-in copy in src/plan/planners/pat.cpp).
std::string to_json(const PatTileRules& rules, bool with_measurements = true);
// Rules from measured times: for each m (ascending) and KV length (ascending),
// the fastest n, where an n within `tie` (relative) of the fastest counts as a
// tie and ties go to the larger n; adjacent lengths with the same winner form
// one rule {max_rows = m, max_kv = the longest length of the run, n}, and the
// last run of each m has no max_kv. Throws Error on an empty table or a time
// that is not positive and finite.
std::vector<PatTileRule> derive_pat_tile_rules(const std::vector<PatTileTiming>& times, double tie = 0.02);
// The table shipped in data/pat_tile_rules.json (a test keeps them equal).
const PatTileRules& builtin_pat_tile_rules();
// The rules the registered `pat` planner uses: the built-in table unless
// replaced (e.g. by the CLI from a measured file). Thread-safe.
std::shared_ptr<const PatTileRules> default_pat_tile_rules();
void set_default_pat_tile_rules(std::shared_ptr<const PatTileRules> rules);
// The tile for a unit of `rows` Q rows and `kv_tokens` tokens: m = the
// smallest n = 64 tile holding the rows, n = the first matching rule's,
// resolved to the nearest compiled n of that m that fits head_dim.
int pat_select_tile(const PatTileRules& rules, int rows, int64_t kv_tokens, int head_dim = 128);

// PAT with explicit rules and no cache (what `pat` and PatPlanner run).
Plan plan_pat_with(const Workload& w, const PlanOptions& opt, const PatTileRules& rules);

// ---- FlashForge --------------------------------------------------------------

// Time of one unit (one CTA, one kv head) with `q_rows` Q rows (queries x group
// size) over `kv_tokens` KV tokens, on a grid of measured points; bilinear
// interpolation between points, clamped in rows, linear extrapolation in KV
// beyond the last column.
struct ForgeCostTable {
  std::string device;
  std::string source;  // "model" (analytic, until `treeattn calibrate`) or "measured"
  std::string note;
  int head_dim = 128;
  DType dtype = DType::fp16;
  std::vector<double> q_rows;     // ascending
  std::vector<double> kv_tokens;  // ascending
  std::vector<double> cost_us;    // [q_rows.size() x kv_tokens.size()], row-major

  double operator()(double rows, double kv) const;
  void validate() const;  // throws Error naming the field
};
ForgeCostTable parse_forge_cost_table(std::string_view json_text);
ForgeCostTable load_forge_cost_table(const std::string& path);
std::string to_json(const ForgeCostTable& table);

// Bandwidth/latency model of one CTA on a fully occupied GPU: a fixed start
// cost, then max(KV + Q + partial bytes / per-CTA share of HBM bandwidth,
// padded tensor-core FLOPs / per-CTA share of the tensor throughput).
struct ForgeModelParams {
  std::string device = "NVIDIA H100 SXM (model)";
  double hbm_gbps = 3350;        // HBM bandwidth, GB/s
  double tensor_tflops = 600;    // dense fp16 mma.sync throughput reachable, TFLOP/s
  int num_sms = 132;
  int ctas_per_sm = 2;
  double cta_start_us = 2.0;     // launch, Q load, pipeline fill, epilogue
  int head_dim = 128;
  DType dtype = DType::fp16;
};
ForgeCostTable analytic_forge_cost_table(const ForgeModelParams& p = {});
// What the registered `forge` planner uses: analytic_forge_cost_table() (the
// content of data/forge_cost_h100.json until calibrated) unless replaced.
std::shared_ptr<const ForgeCostTable> default_forge_cost_table();
void set_default_forge_cost_table(std::shared_ptr<const ForgeCostTable> table);

// KV division: the smallest cost_l such that sum_i min(ceil(cost[i] / cost_l),
// max_parts[i]) <= slots (binary search), then parts[i] = that min. When even
// one part per task exceeds the slots, cost_l = max cost and parts are 1.
struct ForgeDivision {
  double cost_l = 0;
  std::vector<int32_t> parts;
};
ForgeDivision forge_divide(const std::vector<double>& cost, const std::vector<int32_t>& max_parts, int64_t slots);

// Longest-processing-time list scheduling: subtasks by decreasing cost, each
// to the least-loaded slot (ties: lowest slot). `order` lists subtask indices
// in that order; slot[i] is the slot of subtask i.
struct ForgeAssignment {
  std::vector<int32_t> order;
  std::vector<int32_t> slot;
  double makespan = 0;
};
ForgeAssignment forge_lpt(const std::vector<double>& cost, int64_t slots);

// FlashForge with an explicit cost table.
Plan plan_forge_with(const Workload& w, const PlanOptions& opt, const ForgeCostTable& table);

// ---- auto --------------------------------------------------------------------

// What the auto cost model prices in a plan: cheap sums over its units (one
// pass), in the units of the table's coefficients (microseconds per unit).
// scripts/fit_auto_cost.py reads them from `treeattn plan --json`
// ("auto_features"), so they are defined here only.
inline constexpr int kAutoCostFeatures = 11;
inline constexpr std::array<const char*, kAutoCostFeatures> kAutoCostFeatureNames = {
    "const",         // 1
    "launches",      // attention launches: tile configs used (m16 units of <= 32 tokens apart)
    "kv_mb",         // KV bytes the plan loads, MB (1e6 bytes)
    "unique_kv_mb",  // the tree's KV bytes, MB
    "partial_mb",    // partial bytes, written and read by the merge, MB
    "max_unit_kt",   // tokens of the longest unit, thousands
    "kctas",         // units x kv heads, thousands
    "ksegments",     // segments x kv heads, thousands
    "padded_gflop",  // attention GFLOP over the units' tile rows (padding included)
    "wave_kt",       // per launch, waves of CTAs over the resident slots x its longest unit:
                     // summed, thousands of tokens
    "masked_kt",     // tokens of the longest masked unit (a compact subtree's or a pack's:
                     // its tiles apply the entries' masks), thousands
};
// Features added after the first tables: a table without one prices it at 0.
inline constexpr int kAutoCostFeaturesRequired = 10;
using AutoCostFeatures = std::array<double, kAutoCostFeatures>;
// The features of plan p of w, planned with opt (its SM count). A launch
// runs the units of one tile config (as the CUDA executor groups them); its
// resident slots are opt.num_sms x the CTAs of that tile whose shared memory
// ((m + 4n) x head_dim x 2 bytes + 8 KB, as tile_fits_head_dim) fits in an
// SM's 228 KB, at most 8.
AutoCostFeatures auto_cost_features(const Workload& w, const Plan& p, const PlanOptions& opt = {});

// The GPU-time model of `auto`: time_us = coefficients . features, fitted per
// device by scripts/fit_auto_cost.py from `treeattn bench --suite` results.
// auto plans node, and switches to per-query when the model predicts it
// faster by more than `margin` (a fraction of node's predicted time).
struct AutoCostModel {
  std::string device, date, commit;
  std::string source;  // the results the fit read
  std::string fit;     // the command that wrote the table
  double margin = 0;
  AutoCostFeatures coefficients{};  // >= 0 (auto's lower bounds rely on it)
  // node's shape (auto.cpp): auto takes smaller Q tiles where the model
  // predicts them faster than the shape in hand by more than this fraction,
  // and wider compact-subtree units likewise with the second. The model errs
  // by a few percent on single plans; these keep it from trading a measured
  // time for a predicted one. Fitted by `calibrate --auto` from auto's own
  // plans timed with each pair (choose_shape_margins); JSON "shape_margins":
  // {"smaller_tiles", "wider_units"}, these defaults where it is absent.
  double smaller_tiles_margin = 0.10, wider_units_margin = 0.05;

  double predict(const AutoCostFeatures& f) const;
  void validate() const;  // throws Error naming the field
};
AutoCostModel parse_auto_cost_model(std::string_view json_text);  // throws Error naming the field
AutoCostModel load_auto_cost_model(const std::string& path);       // throws Error (path first)
std::string to_json(const AutoCostModel& model);
// The table shipped in data/auto_cost_h100.json (a test keeps them equal).
const AutoCostModel& builtin_auto_cost_model();
// The model the registered `auto` planner uses: the built-in table unless
// replaced (the CLI's --auto-cost FILE). Thread-safe.
std::shared_ptr<const AutoCostModel> default_auto_cost_model();
void set_default_auto_cost_model(std::shared_ptr<const AutoCostModel> model);

// auto with an explicit model.
Plan plan_auto_with(const Workload& w, const PlanOptions& opt, const AutoCostModel& model);

// ---- fitting the auto cost model (treeattn calibrate --auto-cost) -------------

// One calibration config: a workload (at one head config) planned by
// per-query and by node, each plan's features and its measured GPU time.
struct AutoCostSample {
  std::string config;  // "SPEC @qo/kv", for reports
  std::string group;   // the suite it came from (leave-one-group-out checks)
  AutoCostFeatures per_query{}, node{};
  double per_query_us = 0, node_us = 0;
  // The time of auto's own plan with the table in use when measured (its
  // choice of node's shape included); 0: not measured. Not used by the fit.
  double auto_us = 0;
  // auto's plan timed under each pair of shape margins (kShapeMarginSteps;
  // planned with the coefficients fitted in the measuring run); empty: not
  // measured.
  std::vector<double> shape_us;
};
// auto's rule on a sample: per-query when the model predicts it faster than
// node by more than the margin (auto.cpp, which also needs a shared token).
bool auto_picks_per_query(const AutoCostModel& m, const AutoCostSample& s);
// The slack of issue 21's first criterion: auto <= 1.03 x min(node, per-query).
inline constexpr double kAutoCostHitSlack = 1.03;
// The samples whose pick under m runs within that slack of the faster of the
// two plans.
int auto_cost_hits(const AutoCostModel& m, const std::vector<AutoCostSample>& samples);
// The fit of scripts/fit_auto_cost.py with its default candidates:
// non-negative least squares on relative errors (each plan's time, weight
// 0.3, and the two plans' difference, weight 1, both over the faster time),
// then the smallest margin of 0, 0.01, ..., 0.10 with the most hits. Throws
// Error on no samples or a time that is not a finite number > 0. Only the
// margin and coefficients are set.
AutoCostModel fit_auto_cost_model(const std::vector<AutoCostSample>& samples);
// Lawson-Hanson: x >= 0 minimising |A x - b| (A: rows x cols, row-major).
std::vector<double> nonnegative_least_squares(const std::vector<double>& a, size_t rows, size_t cols,
                                              const std::vector<double>& b);
// The shape margins calibrate tries: every pair of these steps, as
// (smaller_tiles, wider_units) = (steps[i / n], steps[i % n]) for pair i.
inline constexpr std::array<double, 7> kShapeMarginSteps = {0, 0.025, 0.05, 0.075, 0.10, 0.15, 0.20};
inline constexpr size_t kShapeMarginPairs = kShapeMarginSteps.size() * kShapeMarginSteps.size();
// Pair `pair` as (smaller_tiles, wider_units) (Error past kShapeMarginPairs),
// and the index of a pair of steps (kShapeMarginPairs where either margin is
// not a step).
std::pair<double, double> shape_margin_pair(size_t pair);
size_t shape_margin_index(double smaller_tiles, double wider_units);
struct ShapeMargins {
  double smaller_tiles = 0, wider_units = 0;
  int hits = 0;          // configs within kAutoCostHitSlack of min(per-query, node)
  double geomean = 0;    // of auto's time over min(per-query, node)
};
// The pair of shape margins under which auto's own plans, timed with each
// pair (AutoCostSample::shape_us), run within kAutoCostHitSlack of the faster
// of per-query and node on the most samples; ties go to the lower geomean
// time, then to the pair nearest the defaults (0.10, 0.05). Every sample
// needs shape_us of kShapeMarginPairs times; throws Error otherwise.
ShapeMargins choose_shape_margins(const std::vector<AutoCostSample>& samples);
// The same score for one pair (index into the pairs as above).
ShapeMargins score_shape_margins(const std::vector<AutoCostSample>& samples, size_t pair);

// Samples as JSON ("treeattn-auto-cost-samples/1": device, commit, date,
// command, samples[{config, group, per_query_us, node_us, auto_us (optional),
// shape_us (optional), per_query{feature: value}, node{...}}]) and back;
// parse throws Error naming the field.
struct AutoCostSamples {
  std::string device, commit, date, command;
  std::vector<AutoCostSample> samples;
};
std::string to_json(const AutoCostSamples& s);
AutoCostSamples parse_auto_cost_samples(std::string_view json_text);

}  // namespace treeattn
