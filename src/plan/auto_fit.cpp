// Fitting the auto planner's cost model from measured plans: what `treeattn
// calibrate --auto-cost` does on a GPU, and scripts/fit_auto_cost.py does
// offline from suite results (the same loss, rows and margin rule; the script
// can also score other candidate sets and issue 21's second criterion, which
// needs every planner's time).
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "tree/json_util.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn {

namespace {

using json = nlohmann::json;
constexpr const char* kSamplesFormat = "treeattn-auto-cost-samples/1";
// The loss of scripts/fit_auto_cost.py: each plan's time at this weight, the
// difference of the two plans' times at weight 1, all over the faster time.
constexpr double kAbsWeight = 0.3;

// Least squares over the columns `cols_used` of A (row-major, `cols` wide):
// Householder QR, the solution in the used columns' order. A column that is
// (numerically) a combination of the ones before it gets 0 (its diagonal
// stays 0).
std::vector<double> least_squares(const std::vector<double>& a, size_t rows, size_t cols,
                                  const std::vector<size_t>& cols_used, const std::vector<double>& b) {
  const size_t k = cols_used.size();
  std::vector<double> r(rows * k), y(b);  // column-major copy of the used columns
  for (size_t j = 0; j < k; ++j)
    for (size_t i = 0; i < rows; ++i) r[j * rows + i] = a[i * cols + cols_used[j]];
  std::vector<double> diag(k, 0.0);
  for (size_t j = 0; j < k && j < rows; ++j) {
    double* col = &r[j * rows];
    double norm = 0, scale = 0;
    for (size_t i = 0; i < rows; ++i) scale = std::max(scale, std::abs(a[i * cols + cols_used[j]]));
    for (size_t i = j; i < rows; ++i) norm += col[i] * col[i];
    norm = std::sqrt(norm);
    if (norm <= 1e-12 * std::max(scale, 1e-300) * std::sqrt(double(rows))) continue;
    const double alpha = col[j] > 0 ? -norm : norm;
    // v = col[j..] - alpha e_j, H = I - 2 v v^T / (v^T v).
    col[j] -= alpha;
    double vv = 0;
    for (size_t i = j; i < rows; ++i) vv += col[i] * col[i];
    const auto reflect = [&](double* x) {
      double d = 0;
      for (size_t i = j; i < rows; ++i) d += col[i] * x[i];
      d = 2 * d / vv;
      for (size_t i = j; i < rows; ++i) x[i] -= d * col[i];
    };
    for (size_t c = j + 1; c < k; ++c) reflect(&r[c * rows]);
    reflect(y.data());
    diag[j] = alpha;
  }
  std::vector<double> x(k, 0.0);
  for (size_t jj = std::min(k, rows); jj-- > 0;) {
    if (diag[jj] == 0) continue;
    double s = y[jj];
    for (size_t c = jj + 1; c < k; ++c) s -= r[c * rows + jj] * x[c];
    x[jj] = s / diag[jj];
  }
  return x;
}

// A^T (b - A x).
std::vector<double> gradient(const std::vector<double>& a, size_t rows, size_t cols, const std::vector<double>& b,
                             const std::vector<double>& x) {
  std::vector<double> w(cols, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    double res = b[i];
    for (size_t j = 0; j < cols; ++j) res -= a[i * cols + j] * x[j];
    for (size_t j = 0; j < cols; ++j) w[j] += a[i * cols + j] * res;
  }
  return w;
}

void check_sample(const AutoCostSample& s, size_t i) {
  const auto bad = [&](double v) { return !(v > 0) || !std::isfinite(v); };
  if (bad(s.per_query_us) || bad(s.node_us))
    throw Error("auto cost fit: samples[" + std::to_string(i) + "] (" + s.config + "): times " +
                std::to_string(s.per_query_us) + " / " + std::to_string(s.node_us) +
                " us are not finite numbers > 0");
  for (int f = 0; f < kAutoCostFeatures; ++f)
    if (!std::isfinite(s.per_query[f]) || !std::isfinite(s.node[f]))
      throw Error("auto cost fit: samples[" + std::to_string(i) + "] (" + s.config + "): feature " +
                  kAutoCostFeatureNames[f] + " is not finite");
}

json features_json(const AutoCostFeatures& f) {
  json j = json::object();
  for (int i = 0; i < kAutoCostFeatures; ++i) j[kAutoCostFeatureNames[i]] = f[i];
  return j;
}

AutoCostFeatures features_from(const json& j, const std::string& where) {
  detail::require_object(j, where);
  AutoCostFeatures f{};
  size_t found = 0;
  for (int i = 0; i < kAutoCostFeatures; ++i) {
    if (i >= kAutoCostFeaturesRequired && !j.contains(kAutoCostFeatureNames[i])) continue;  // older samples: 0
    const json& v = detail::require(j, kAutoCostFeatureNames[i], where);
    if (!v.is_number())
      throw Error(detail::member_field(where, kAutoCostFeatureNames[i]) + " = " + detail::brief(v) +
                  " is not a number");
    f[i] = v.get<double>();
    ++found;
  }
  if (j.size() != found)
    for (const auto& item : j.items()) {
      const std::string& key = item.key();
      if (std::find_if(kAutoCostFeatureNames.begin(), kAutoCostFeatureNames.end(),
                       [&](const char* n) { return key == n; }) == kAutoCostFeatureNames.end())
        throw Error(detail::member_field(where, key) + ": not a feature of the auto cost model");
    }
  return f;
}

}  // namespace

std::vector<double> nonnegative_least_squares(const std::vector<double>& a, size_t rows, size_t cols,
                                              const std::vector<double>& b) {
  if (a.size() != rows * cols || b.size() != rows)
    throw Error("nonnegative_least_squares: A has " + std::to_string(a.size()) + " entries and b " +
                std::to_string(b.size()) + " for " + std::to_string(rows) + " x " + std::to_string(cols));
  std::vector<double> x(cols, 0.0);
  std::vector<char> passive(cols, 0);
  std::vector<double> w = gradient(a, rows, cols, b, x);
  for (size_t iter = 0; iter < 10 * cols + 10; ++iter) {
    size_t j = cols;
    for (size_t c = 0; c < cols; ++c)
      if (!passive[c] && w[c] > 1e-12 && (j == cols || w[c] > w[j])) j = c;
    if (j == cols) break;  // KKT: no free direction that lowers the residual
    passive[j] = 1;
    for (size_t inner = 0; inner <= cols; ++inner) {
      std::vector<size_t> used;
      for (size_t c = 0; c < cols; ++c)
        if (passive[c]) used.push_back(c);
      const std::vector<double> zs = least_squares(a, rows, cols, used, b);
      std::vector<double> z(cols, 0.0);
      bool positive = true;
      for (size_t k = 0; k < used.size(); ++k) {
        z[used[k]] = zs[k];
        positive = positive && zs[k] > 0;
      }
      if (positive) {
        x = z;
        break;
      }
      // Step from x towards z as far as x stays >= 0; the columns that hit 0 leave.
      double alpha = 1;
      for (const size_t c : used)
        if (z[c] <= 0) alpha = std::min(alpha, x[c] / (x[c] - z[c]));
      for (size_t c = 0; c < cols; ++c) {
        x[c] += alpha * (z[c] - x[c]);
        if (passive[c] && x[c] <= 1e-12) {
          passive[c] = 0;
          x[c] = 0;
        }
      }
    }
    w = gradient(a, rows, cols, b, x);
  }
  return x;
}

bool auto_picks_per_query(const AutoCostModel& m, const AutoCostSample& s) {
  return m.predict(s.per_query) < (1 - m.margin) * m.predict(s.node);
}

int auto_cost_hits(const AutoCostModel& m, const std::vector<AutoCostSample>& samples) {
  int hits = 0;
  for (const AutoCostSample& s : samples) {
    const double t = auto_picks_per_query(m, s) ? s.per_query_us : s.node_us;
    hits += t <= kAutoCostHitSlack * std::min(s.per_query_us, s.node_us);
  }
  return hits;
}

AutoCostModel fit_auto_cost_model(const std::vector<AutoCostSample>& samples) {
  if (samples.empty()) throw Error("auto cost fit: no samples");
  for (size_t i = 0; i < samples.size(); ++i) check_sample(samples[i], i);
  const size_t cols = kAutoCostFeatures, rows = 3 * samples.size();
  std::vector<double> a(rows * cols), b(rows);
  size_t row = 0;
  const auto add_row = [&](const AutoCostFeatures& f, double scale, double target) {
    for (size_t c = 0; c < cols; ++c) a[row * cols + c] = f[c] * scale;
    b[row++] = target;
  };
  for (const AutoCostSample& s : samples) {
    add_row(s.per_query, kAbsWeight / s.per_query_us, kAbsWeight);
    add_row(s.node, kAbsWeight / s.node_us, kAbsWeight);
    AutoCostFeatures diff{};
    for (size_t c = 0; c < cols; ++c) diff[c] = s.per_query[c] - s.node[c];
    const double faster = std::min(s.per_query_us, s.node_us);
    add_row(diff, 1 / faster, (s.per_query_us - s.node_us) / faster);
  }
  const std::vector<double> x = nonnegative_least_squares(a, rows, cols, b);
  AutoCostModel m;
  for (size_t c = 0; c < cols; ++c) m.coefficients[c] = x[c];
  int best = -1;
  double best_margin = 0;
  for (int i = 0; i <= 10; ++i) {
    m.margin = i / 100.0;
    const int hits = auto_cost_hits(m, samples);
    if (hits > best) best = hits, best_margin = m.margin;
  }
  m.margin = best_margin;
  m.validate();
  return m;
}

namespace {
void check_shape_runs(const std::vector<AutoCostSample>& samples) {
  if (samples.empty()) throw Error("shape margins: no samples");
  for (size_t i = 0; i < samples.size(); ++i)
    if (samples[i].shape_us.size() != kShapeMarginPairs)
      throw Error("shape margins: samples[" + std::to_string(i) + "] (" + samples[i].config + ") has " +
                  std::to_string(samples[i].shape_us.size()) + " shape_us times, expected " +
                  std::to_string(kShapeMarginPairs) + " (one per pair of margins)");
}
}  // namespace

std::pair<double, double> shape_margin_pair(size_t pair) {
  if (pair >= kShapeMarginPairs)
    throw Error("shape margins: pair " + std::to_string(pair) + " is out of range [0, " + std::to_string(kShapeMarginPairs) + ")");
  return {kShapeMarginSteps[pair / kShapeMarginSteps.size()], kShapeMarginSteps[pair % kShapeMarginSteps.size()]};
}

size_t shape_margin_index(double smaller_tiles, double wider_units) {
  const auto step = [](double x) {
    return size_t(std::find(kShapeMarginSteps.begin(), kShapeMarginSteps.end(), x) - kShapeMarginSteps.begin());
  };
  const size_t a = step(smaller_tiles), b = step(wider_units), n = kShapeMarginSteps.size();
  return a < n && b < n ? a * n + b : kShapeMarginPairs;
}

ShapeMargins score_shape_margins(const std::vector<AutoCostSample>& samples, size_t pair) {
  check_shape_runs(samples);
  ShapeMargins r;
  std::tie(r.smaller_tiles, r.wider_units) = shape_margin_pair(pair);  // throws on a pair out of range
  double log_sum = 0;
  for (const AutoCostSample& s : samples) {
    const double best = std::min(s.per_query_us, s.node_us), t = s.shape_us[pair];
    r.hits += t <= kAutoCostHitSlack * best;
    log_sum += std::log(t / best);
  }
  r.geomean = std::exp(log_sum / double(samples.size()));
  return r;
}

ShapeMargins choose_shape_margins(const std::vector<AutoCostSample>& samples) {
  const AutoCostModel defaults;
  const auto distance = [&](const ShapeMargins& m) {
    return std::abs(m.smaller_tiles - defaults.smaller_tiles_margin) + std::abs(m.wider_units - defaults.wider_units_margin);
  };
  ShapeMargins best = score_shape_margins(samples, 0);
  for (size_t pair = 1; pair < kShapeMarginPairs; ++pair) {
    const ShapeMargins m = score_shape_margins(samples, pair);
    // Geomeans within 1e-9 are ties (the same plans timed once give equal
    // sums in any order only up to rounding).
    const bool better = m.hits != best.hits                      ? m.hits > best.hits
                        : std::abs(m.geomean - best.geomean) > 1e-9 ? m.geomean < best.geomean
                                                                    : distance(m) < distance(best);
    if (better) best = m;
  }
  return best;
}

std::string to_json(const AutoCostSamples& s) {
  json list = json::array();
  for (const AutoCostSample& x : s.samples) {
    json e = {{"config", x.config},
              {"group", x.group},
              {"per_query_us", x.per_query_us},
              {"node_us", x.node_us},
              {"per_query", features_json(x.per_query)},
              {"node", features_json(x.node)}};
    if (x.auto_us > 0) e["auto_us"] = x.auto_us;
    if (!x.shape_us.empty()) e["shape_us"] = x.shape_us;
    list.push_back(std::move(e));
  }
  const json doc = {{"format", kSamplesFormat}, {"device", s.device}, {"commit", s.commit},
                    {"date", s.date},           {"command", s.command}, {"samples", list}};
  return doc.dump(1) + "\n";
}

AutoCostSamples parse_auto_cost_samples(std::string_view text) {
  const json j = detail::parse_json(text, "auto cost samples");
  detail::require_object(j, "auto cost samples");
  detail::require_format(j, kSamplesFormat, "auto cost samples");
  AutoCostSamples out;
  const auto str = [&](const json& obj, const char* key, const std::string& where, bool required) {
    if (required) detail::require(obj, key, where);
    return detail::optional_string(obj, key, detail::member_field(where, key));
  };
  out.device = str(j, "device", "", false);
  out.commit = str(j, "commit", "", false);
  out.date = str(j, "date", "", false);
  out.command = str(j, "command", "", false);
  const json& list = detail::require(j, "samples", "");
  detail::require_array(list, "samples");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "samples[" + std::to_string(i) + "]";
    const json& e = list[i];
    detail::require_object(e, where);
    AutoCostSample s;
    s.config = str(e, "config", where, true);
    s.group = str(e, "group", where, false);
    for (const auto& [key, dst] : {std::pair{"per_query_us", &s.per_query_us}, std::pair{"node_us", &s.node_us}}) {
      const json& v = detail::require(e, key, where);
      if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
        throw Error(detail::member_field(where, key) + " = " + detail::brief(v) + " is not a number > 0");
      *dst = v.get<double>();
    }
    if (const auto a = e.find("auto_us"); a != e.end()) {
      if (!a->is_number() || !(a->get<double>() > 0) || !std::isfinite(a->get<double>()))
        throw Error(detail::member_field(where, "auto_us") + " = " + detail::brief(*a) + " is not a number > 0");
      s.auto_us = a->get<double>();
    }
    if (const auto a = e.find("shape_us"); a != e.end()) {
      const std::string field = detail::member_field(where, "shape_us");
      if (!a->is_array() || a->size() != kShapeMarginPairs)
        throw Error(field + " is not an array of " + std::to_string(kShapeMarginPairs) + " times (one per pair of margins)");
      for (size_t k = 0; k < a->size(); ++k) {
        const json& v = (*a)[k];
        if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
          throw Error(field + "[" + std::to_string(k) + "] = " + detail::brief(v) + " is not a number > 0");
        s.shape_us.push_back(v.get<double>());
      }
    }
    s.per_query = features_from(detail::require(e, "per_query", where), detail::member_field(where, "per_query"));
    s.node = features_from(detail::require(e, "node", where), detail::member_field(where, "node"));
    out.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace treeattn
