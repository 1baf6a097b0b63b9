// forge (FlashForge §4, workload balancing): every node with queries below it
// is one task (the node's KV, all of its queries: no division along queries),
// costed by a table C(n_q, n) measured per device (`treeattn calibrate`) with
// bilinear interpolation. Tasks are divided along KV only: with cost_l the
// smallest makespan bound for which sum_i ceil(C_i / cost_l) subtasks fit the
// resident CTA slots (binary search), task i gets b_k[i] = ceil(C_i / cost_l)
// parts; the subtasks are then assigned longest-first to the least-loaded slot
// (LPT) and the units are emitted in that order, so the hardware's in-order CTA
// dispatch reproduces the schedule.
// Deviations: a node whose queries exceed one Q tile (128 rows) becomes one
// task per Q tile; KV parts are never shorter than opt.min_split_tokens.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/planners/planners.hpp"
#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "plan/planners/tree_walk.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn {

namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "treeattn-forge-cost/1";

// Index i with axis[i] <= x < axis[i + 1], clamped to [0, size - 2].
size_t bracket(const std::vector<double>& axis, double x) {
  if (axis.size() < 2 || x <= axis.front()) return 0;
  const size_t i = static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  return std::min(i - 1, axis.size() - 2);
}

std::vector<double> number_array(const json& j, const char* key, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) throw Error(what + ": " + key + " must be an array of numbers");
  std::vector<double> v;
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_number()) throw Error(what + ": " + key + "[" + std::to_string(i) + "] = " + (*it)[i].dump() + " is not a number");
    v.push_back((*it)[i].get<double>());
  }
  return v;
}

std::mutex g_table_mutex;
std::shared_ptr<const ForgeCostTable> g_table;

}  // namespace

// ---- the cost table --------------------------------------------------------

void ForgeCostTable::validate() const {
  const auto ascending = [](const std::vector<double>& a, const char* name) {
    if (a.empty()) throw Error(std::string("forge cost table: ") + name + " is empty");
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(a[i] >= 0) || !std::isfinite(a[i]))
        throw Error(std::string("forge cost table: ") + name + "[" + std::to_string(i) + "] = " + std::to_string(a[i]) + " is not a finite value >= 0");
      if (i > 0 && !(a[i] > a[i - 1]))
        throw Error(std::string("forge cost table: ") + name + "[" + std::to_string(i) + "] = " + std::to_string(a[i]) + " is not above the previous entry");
    }
  };
  ascending(q_rows, "q_rows");
  ascending(kv_tokens, "kv_tokens");
  if (cost_us.size() != q_rows.size() * kv_tokens.size())
    throw Error("forge cost table: cost_us has " + std::to_string(cost_us.size()) + " entries, expected " +
                std::to_string(q_rows.size()) + " x " + std::to_string(kv_tokens.size()));
  for (size_t i = 0; i < cost_us.size(); ++i)
    if (!(cost_us[i] > 0) || !std::isfinite(cost_us[i]))
      throw Error("forge cost table: cost_us[" + std::to_string(i / kv_tokens.size()) + "][" + std::to_string(i % kv_tokens.size()) +
                  "] = " + std::to_string(cost_us[i]) + " is not a positive time");
}

double ForgeCostTable::operator()(double rows, double kv) const {
  const size_t nr = q_rows.size(), nk = kv_tokens.size();
  // Along KV: linear between columns, extrapolated past the last one (time
  // keeps growing with KV), clamped below the first. The KV position is the
  // same for both rows of the bracket.
  size_t k = 0;
  double tk = 0;
  if (nk > 1) {
    k = bracket(kv_tokens, kv);
    tk = (std::max(kv, kv_tokens.front()) - kv_tokens[k]) / (kv_tokens[k + 1] - kv_tokens[k]);
  }
  const auto along_kv = [&](size_t r) {
    const double* row = cost_us.data() + r * nk;
    return nk == 1 ? row[0] : std::max(row[k] + tk * (row[k + 1] - row[k]), 0.0);
  };
  if (nr == 1 || rows <= q_rows.front()) return along_kv(0);
  if (rows >= q_rows.back()) return along_kv(nr - 1);
  const size_t r = bracket(q_rows, rows);
  const double t = (rows - q_rows[r]) / (q_rows[r + 1] - q_rows[r]);
  return along_kv(r) + t * (along_kv(r + 1) - along_kv(r));
}

ForgeCostTable parse_forge_cost_table(std::string_view text) {
  const std::string what = "forge cost table";
  const json j = detail::parse_json(text, what);  // depth-limited
  if (!j.is_object()) throw Error(what + ": the top level is not an object");
  detail::require_format(j, kFormat, what);
  ForgeCostTable t;
  const auto text_field = [&](const char* key, std::string fallback = {}) {
    return detail::optional_string(j, key, what + ": " + key, std::move(fallback));
  };
  t.device = text_field("device");
  t.source = text_field("source");
  t.note = text_field("note");
  if (!j.contains("head_dim") || !j["head_dim"].is_number_integer()) throw Error(what + ": head_dim must be an integer");
  t.head_dim = j["head_dim"].get<int>();
  t.dtype = parse_dtype(text_field("dtype", "fp16"));
  t.q_rows = number_array(j, "q_rows", what);
  t.kv_tokens = number_array(j, "kv_tokens", what);
  const auto it = j.find("cost_us");
  if (it == j.end() || !it->is_array() || it->size() != t.q_rows.size())
    throw Error(what + ": cost_us must be an array of " + std::to_string(t.q_rows.size()) + " rows (one per q_rows entry)");
  for (size_t r = 0; r < it->size(); ++r) {
    const json& row = (*it)[r];
    if (!row.is_array() || row.size() != t.kv_tokens.size())
      throw Error(what + ": cost_us[" + std::to_string(r) + "] must hold " + std::to_string(t.kv_tokens.size()) + " numbers (one per kv_tokens entry)");
    for (size_t k = 0; k < row.size(); ++k) {
      if (!row[k].is_number()) throw Error(what + ": cost_us[" + std::to_string(r) + "][" + std::to_string(k) + "] = " + row[k].dump() + " is not a number");
      t.cost_us.push_back(row[k].get<double>());
    }
  }
  t.validate();
  return t;
}

ForgeCostTable load_forge_cost_table(const std::string& path) {
  const std::string text = detail::read_text_file(path, "forge cost table");  // size-limited
  try {
    return parse_forge_cost_table(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

std::string to_json(const ForgeCostTable& t) {
  // One line per Q-row count keeps the file readable as a table.
  const auto num = [](double x) {
    std::ostringstream s;
    s.precision(10);
    s << x;
    return s.str();
  };
  const auto arr = [&](const std::vector<double>& v, size_t b, size_t e) {
    std::string s = "[";
    for (size_t i = b; i < e; ++i) s += (i > b ? ", " : "") + num(v[i]);
    return s + "]";
  };
  std::string s = "{\n";
  s += "  \"format\": \"" + std::string(kFormat) + "\",\n";
  s += "  \"device\": " + json(t.device).dump() + ",\n";
  s += "  \"source\": " + json(t.source).dump() + ",\n";
  s += "  \"note\": " + json(t.note).dump() + ",\n";
  s += "  \"head_dim\": " + std::to_string(t.head_dim) + ",\n";
  s += "  \"dtype\": \"" + std::string(to_string(t.dtype)) + "\",\n";
  s += "  \"q_rows\": " + arr(t.q_rows, 0, t.q_rows.size()) + ",\n";
  s += "  \"kv_tokens\": " + arr(t.kv_tokens, 0, t.kv_tokens.size()) + ",\n";
  s += "  \"cost_us\": [\n";
  const size_t nk = t.kv_tokens.size();
  for (size_t r = 0; r < t.q_rows.size(); ++r)
    s += "    " + arr(t.cost_us, r * nk, (r + 1) * nk) + (r + 1 < t.q_rows.size() ? ",\n" : "\n");
  s += "  ]\n}\n";
  return s;
}

ForgeCostTable analytic_forge_cost_table(const ForgeModelParams& p) {
  ForgeCostTable t;
  t.device = p.device;
  t.source = "model";
  const auto num = [](double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  };
  t.note =
      "Model-derived, not measured: cost = cta_start_us + max(bytes / (HBM bandwidth / resident CTAs), "
      "padded MMA FLOPs / (tensor throughput / resident CTAs)) with bytes = K and V of the unit's tokens "
      "+ its Q rows + its fp32 partial rows; hbm_gbps = " + num(p.hbm_gbps) + ", tensor_tflops = " +
      num(p.tensor_tflops) + ", " + num(p.num_sms) + " SMs x " + num(p.ctas_per_sm) +
      " CTAs, cta_start_us = " + num(p.cta_start_us) + ". Replace with `treeattn calibrate` output.";
  t.head_dim = p.head_dim;
  t.dtype = p.dtype;
  t.q_rows = {1, 16, 32, 64, 128};
  t.kv_tokens = {0, 16, 64, 256, 1024, 4096, 16384, 65536};
  const double es = double(dtype_size(p.dtype)), d = p.head_dim;
  const double ctas = double(p.num_sms) * p.ctas_per_sm;
  const double bytes_per_us = p.hbm_gbps * 1e3 / ctas;       // GB/s -> bytes per microsecond, per CTA
  const double flops_per_us = p.tensor_tflops * 1e6 / ctas;  // TFLOP/s -> FLOP per microsecond, per CTA
  for (const double rows : t.q_rows) {
    const double padded = std::max(16.0, std::ceil(rows / 16) * 16);
    for (const double kv : t.kv_tokens) {
      const double bytes = kv * d * 2 * es + rows * d * es + rows * (d + 1) * 4;
      const double flops = 4 * padded * kv * d;  // S = Q K^T and O += P V
      const double us = p.cta_start_us + std::max(bytes / bytes_per_us, flops / flops_per_us);
      t.cost_us.push_back(std::round(us * 1000) / 1000);
    }
  }
  t.validate();
  return t;
}

std::shared_ptr<const ForgeCostTable> default_forge_cost_table() {
  std::lock_guard<std::mutex> lock(g_table_mutex);
  if (!g_table) g_table = std::make_shared<const ForgeCostTable>(analytic_forge_cost_table());
  return g_table;
}

void set_default_forge_cost_table(std::shared_ptr<const ForgeCostTable> table) {
  if (table) table->validate();
  std::lock_guard<std::mutex> lock(g_table_mutex);
  g_table = std::move(table);
}

// ---- division and scheduling -----------------------------------------------

ForgeDivision forge_divide(const std::vector<double>& cost, const std::vector<int32_t>& max_parts, int64_t slots) {
  if (cost.size() != max_parts.size())
    throw Error("forge_divide: " + std::to_string(cost.size()) + " costs but " + std::to_string(max_parts.size()) + " part limits");
  ForgeDivision d;
  const size_t n = cost.size();
  d.parts.assign(n, 1);
  if (n == 0) return d;
  slots = std::max<int64_t>(slots, 1);
  double sum = 0, mx = 0, lo = 0;
  for (size_t i = 0; i < n; ++i) {
    sum += cost[i];
    mx = std::max(mx, cost[i]);
    lo = std::max(lo, cost[i] / std::max(1, max_parts[i]));
  }
  if (mx <= 0) {
    d.cost_l = mx;
    return d;
  }
  // ceil by conversion: std::ceil is a libm call without SSE4.1, and this loop
  // runs once per task per bisection step.
  const auto parts_at = [&](double c, std::vector<int32_t>* out) {
    const double inv = 1.0 / c;
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const double x = cost[i] * inv;
      int64_t b = static_cast<int64_t>(x);
      b += double(b) < x;
      b = std::min<int64_t>(std::max<int64_t>(b, 1), std::max(1, max_parts[i]));
      total += b;
      if (out) (*out)[i] = static_cast<int32_t>(b);
    }
    return total;
  };
  // No bound can beat the average load per slot or the longest unsplittable piece.
  lo = std::max(lo, sum / double(slots));
  if (int64_t(n) >= slots) {
    // At least as many tasks as slots: LPT packs several per slot, so the
    // bound is the average load; only longer tasks are divided. (FlashForge's
    // bisection, below, has no solution here and would divide nothing.)
    d.cost_l = lo;
    parts_at(lo, &d.parts);
    return d;
  }
  double hi = mx;
  if (parts_at(lo, nullptr) <= slots) {
    hi = lo;
  } else {
    // Invariant: parts(lo) > slots >= parts(hi).
    // To 1e-6 relative, then snapped below to the exact bound of the parts found.
    for (int it = 0; it < 64 && hi - lo > 1e-6 * hi; ++it) {
      const double mid = 0.5 * (lo + hi);
      (parts_at(mid, nullptr) <= slots ? hi : lo) = mid;
    }
  }
  parts_at(hi, &d.parts);
  // Snap to the exact bound: the largest piece cost at these part counts.
  d.cost_l = 0;
  for (size_t i = 0; i < n; ++i) d.cost_l = std::max(d.cost_l, cost[i] / d.parts[i]);
  return d;
}

ForgeAssignment forge_lpt(const std::vector<double>& cost, int64_t slots) {
  ForgeAssignment a;
  const size_t n = cost.size();
  std::vector<std::pair<double, int32_t>> by_cost(n);  // (-cost, index): longest first, ties by index
  for (size_t i = 0; i < n; ++i) by_cost[i] = {-cost[i], static_cast<int32_t>(i)};
  std::sort(by_cost.begin(), by_cost.end());
  a.order.resize(n);
  for (size_t i = 0; i < n; ++i) a.order[i] = by_cost[i].second;
  a.slot.assign(n, 0);
  const int64_t used = std::min<int64_t>(std::max<int64_t>(slots, 1), std::max<size_t>(n, 1));
  using Load = std::pair<double, int64_t>;  // (load, slot): least load first, then lowest slot
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int64_t s = 0; s < used; ++s) heap.push({0.0, s});
  for (const int32_t i : a.order) {
    auto [load, s] = heap.top();
    heap.pop();
    a.slot[i] = static_cast<int32_t>(s);
    load += cost[i];
    a.makespan = std::max(a.makespan, load);
    heap.push({load, s});
  }
  return a;
}

// ---- the planner -----------------------------------------------------------

Plan plan_forge_with(const Workload& w, const PlanOptions& opt, const ForgeCostTable& table) {
  const planning::DfsView dv(w);
  const int g = w.heads.group_size();
  const int per_unit = planning::queries_per_unit(w);
  const int64_t min_piece = std::max(1, opt.min_split_tokens);

  // Tasks: (node, Q-tile group of the queries below it).
  struct Task {
    int32_t node, q_begin, q_count;
  };
  std::vector<Task> tasks;
  std::vector<double> cost;
  std::vector<int32_t> max_parts;
  tasks.reserve(dv.preorder.size());
  cost.reserve(dv.preorder.size());
  max_parts.reserve(dv.preorder.size());
  for (const int32_t v : dv.preorder) {
    const int32_t len = w.tree.nodes[v].num_tokens;
    const int32_t nq = dv.subtree_queries(v);
    if (len == 0 || nq == 0) continue;
    for (int32_t q0 = 0; q0 < nq; q0 += per_unit) {
      const int32_t cnt = std::min(per_unit, nq - q0);
      tasks.push_back({v, dv.q_begin[v] + q0, cnt});
      cost.push_back(table(double(cnt) * g, len));
      max_parts.push_back(static_cast<int32_t>(std::max<int64_t>(1, len / min_piece)));
    }
  }
  const int64_t slots = std::max(1, opt.target_ctas(w.heads) / w.heads.num_kv_heads);
  const ForgeDivision div = forge_divide(cost, max_parts, slots);

  // Subtasks: task i cut into parts[i] equal KV ranges.
  struct Sub {
    int32_t task, begin, end;
  };
  std::vector<Sub> subs;
  std::vector<double> sub_cost;
  subs.reserve(tasks.size() + slots);
  sub_cost.reserve(tasks.size() + slots);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const int32_t len = w.tree.nodes[tasks[i].node].num_tokens;
    if (div.parts[i] == 1) {
      subs.push_back({static_cast<int32_t>(i), 0, len});
      sub_cost.push_back(cost[i]);
      continue;
    }
    const int32_t piece = static_cast<int32_t>(planning::ceil_div(len, div.parts[i]));
    for (int32_t t0 = 0; t0 < len; t0 += piece) {
      const int32_t t1 = std::min(len, t0 + piece);
      subs.push_back({static_cast<int32_t>(i), t0, t1});
      sub_cost.push_back(table(double(tasks[i].q_count) * g, t1 - t0));
    }
  }
  const ForgeAssignment lpt = forge_lpt(sub_cost, slots);

  PlanBuilder b(w, "forge");
  for (const int32_t k : lpt.order) {
    const Sub& s = subs[k];
    const Task& t = tasks[s.task];
    b.begin_unit();
    b.add_segment(t.node, s.begin, s.end);
    for (int32_t i = 0; i < t.q_count; ++i) b.add_query(dv.queries[t.q_begin + i]);
    b.end_unit();
  }
  return b.finish();
}

Plan plan_forge(const Workload& w, const PlanOptions& opt) { return plan_forge_with(w, opt, *default_forge_cost_table()); }

}  // namespace treeattn
