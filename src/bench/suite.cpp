// Suite files and reports; see suite.hpp for the format.
#include "bench/suite.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tree/builder_util.hpp"

namespace treeattn::bench {

namespace {
std::string trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

std::vector<HeadConfig> parse_head_list(const std::string& value, int head_dim, const std::string& where) {
  std::vector<HeadConfig> out;
  std::istringstream in(value);
  for (std::string item; in >> item;) {
    try {
      out.push_back(parse_heads(item, head_dim));
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  if (out.empty()) throw Error(where + ": no head configs given");
  return out;
}
}  // namespace

Suite parse_suite(std::string_view text, const std::string& name) {
  Suite s;
  s.name = name;
  std::string heads, quick_heads;
  std::istringstream in{std::string(text)};
  int lineno = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++lineno;
    const std::string where = "suite " + name + " line " + std::to_string(lineno);
    std::string line = trim(raw);
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (s.description.empty()) s.description = trim(std::string_view(line).substr(1));
      continue;
    }
    const size_t colon = line.find(": ");
    const std::string key = colon == std::string::npos ? "" : line.substr(0, colon);
    const std::string value = colon == std::string::npos ? "" : trim(std::string_view(line).substr(colon + 2));
    if (key == "heads") {
      heads = value;
    } else if (key == "quick_heads") {
      quick_heads = value;
    } else if (key == "head_dim" || key == "page_size") {
      int v = 0;
      try {
        v = std::stoi(value);
      } catch (...) {
        throw Error(where + ": " + key + " '" + value + "' is not an integer");
      }
      (key == "head_dim" ? s.head_dim : s.page_size) = v;
    } else if (key == "dtype") {
      s.dtype = parse_dtype(value);
    } else if (line.find(' ') != std::string::npos) {
      throw Error(where + ": cannot read '" + line + "' (expected KEY: VALUE or a workload spec)");
    } else {
      const bool quick = line[0] == '+';
      s.entries.push_back({quick ? line.substr(1) : line, quick});
    }
  }
  s.heads = parse_head_list(heads.empty() ? "32/8" : heads, s.head_dim, "suite " + name + ": heads");
  s.quick_heads = quick_heads.empty() ? std::vector<HeadConfig>{s.heads.front()}
                                      : parse_head_list(quick_heads, s.head_dim, "suite " + name + ": quick_heads");
  if (s.entries.empty()) throw Error("suite " + name + ": no workloads");
  return s;
}

std::vector<std::string> builtin_suites() { return {"fasttree", "pat", "flashforge", "deft", "forests"}; }

Suite load_suite(const std::string& name_or_path, const std::string& data_dir) {
  namespace fs = std::filesystem;
  fs::path path = name_or_path;
  std::string name = name_or_path;
  // A name that is no regular file is a built-in suite's: a directory of that
  // name (a run's own --out, as `--suite pat --out pat` makes) is not a suite.
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    path = fs::path(data_dir) / "suites" / (name_or_path + ".suite");
  } else {
    name = path.stem().string();
  }
  if (!std::ifstream(path)) {
    // The suites the data directory holds (offsuite too), else the built-in names.
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(fs::path(data_dir) / "suites", ec))
      if (e.path().extension() == ".suite") names.push_back(e.path().stem().string());
    if (names.empty()) names = builtin_suites();
    std::sort(names.begin(), names.end());
    std::string known;
    for (const auto& b : names) known += " " + b;
    throw Error("suite: '" + name_or_path + "' is neither a built-in suite (" + trim(known) + ") nor a readable file");
  }
  return parse_suite(detail::read_text_file(path.string(), "suite"), name);  // size-limited
}

namespace {
double geomean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / double(v.size()));
}
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
}  // namespace

std::string markdown_report(const nlohmann::json& records, const std::string& title) {
  // Group by (workload, heads); planners as columns in first-seen order.
  std::vector<std::string> planners_seen, configs_seen;
  std::map<std::string, std::map<std::string, nlohmann::json>> by_config;
  for (const auto& r : records) {
    const std::string heads = std::to_string(r.at("num_qo_heads").get<int>()) + "/" +
                              std::to_string(r.at("num_kv_heads").get<int>());
    const std::string cfg = r.at("workload").get<std::string>() + " @" + heads;
    const std::string pl = r.at("planner").get<std::string>();
    if (!by_config.count(cfg)) configs_seen.push_back(cfg);
    if (std::find(planners_seen.begin(), planners_seen.end(), pl) == planners_seen.end()) planners_seen.push_back(pl);
    by_config[cfg][pl] = r;
  }
  std::ostringstream md;
  md << "# " << title << "\n\n";
  if (!records.empty()) {
    const auto& r0 = records.front();
    md << "Device: " << r0.value("device", "?") << " · commit " << r0.value("commit", "?") << " · HBM "
       << fmt("%.0f", r0.value("bandwidth_gbps", 0.0)) << " GB/s";
    if (r0.contains("tensor_tflops")) md << " and tensor cores " << fmt("%.0f", r0.value("tensor_tflops", 0.0)) << " TFLOP/s";
    md << " measured in the run\n\n";
  }
  md << "Per config: median µs · fraction of the roofline (max of the unique-KV floor and the compute floor; "
        "results without a compute floor: the unique-KV floor) · speedup over per-query.\n\n| config |";
  for (const auto& p : planners_seen) md << " " << p << " |";
  md << "\n|---|";
  for (size_t i = 0; i < planners_seen.size(); ++i) md << "---|";
  md << "\n";
  std::map<std::string, std::vector<double>> floor_frac, speedup;
  std::map<std::string, std::map<std::string, std::vector<double>>> speedup_by_heads;
  for (const auto& cfg : configs_seen) {
    md << "| `" << cfg << "` |";
    const auto& row = by_config[cfg];
    const double base = row.count("per-query") ? row.at("per-query").at("us").get<double>() : NAN;
    for (const auto& p : planners_seen) {
      if (!row.count(p)) {
        md << " – |";
        continue;
      }
      const auto& r = row.at(p);
      const double us = r.at("us").get<double>(), fl = r.value("roofline_us", r.at("floor_us").get<double>()) / us;
      md << " " << fmt("%.1f", us) << " · " << fmt("%.0f%%", 100 * fl);
      floor_frac[p].push_back(fl);
      if (!std::isnan(base)) {
        md << " · " << fmt("%.2fx", base / us);
        speedup[p].push_back(base / us);
        speedup_by_heads[p][cfg.substr(cfg.rfind('@') + 1)].push_back(base / us);
      }
      if (r.contains("max_rel_err") && !r["max_rel_err"].is_null()) md << fmt(" (err %.0e)", r["max_rel_err"].get<double>());
      md << " |";
    }
    md << "\n";
  }
  md << "\n## Geometric means\n\n| planner | fraction of roofline | speedup vs per-query |";
  std::set<std::string> heads_set;
  for (const auto& [p, m] : speedup_by_heads)
    for (const auto& [h, v] : m) heads_set.insert(h);
  for (const auto& h : heads_set) md << " speedup @" << h << " |";
  md << "\n|---|---|---|";
  for (size_t i = 0; i < heads_set.size(); ++i) md << "---|";
  md << "\n";
  for (const auto& p : planners_seen) {
    md << "| " << p << " | " << fmt("%.1f%%", 100 * geomean(floor_frac[p])) << " | " << fmt("%.2fx", geomean(speedup[p])) << " |";
    for (const auto& h : heads_set) md << " " << fmt("%.2fx", geomean(speedup_by_heads[p][h])) << " |";
    md << "\n";
  }
  return md.str();
}

size_t completed_configs(const nlohmann::json& doc, const SuiteRunKey& key, const std::vector<HeadConfig>& heads,
                         const std::function<std::string(size_t)>& workload_name,
                         const std::vector<std::string>& planners) {
  const auto same = [&](const char* field, const std::string& want) {
    const std::string have = doc.contains(field) && doc[field].is_string() ? doc[field].get<std::string>() : "(none)";
    if (have != want)
      throw Error(std::string("bench --suite --resume: results.json's ") + field + " is '" + have + "', this run's '" +
                  want + "'");
  };
  same("suite", key.suite);
  same("commit", key.commit);
  same("device", key.device);
  same("command", key.command);
  if (!doc.contains("records") || !doc["records"].is_array())
    throw Error("bench --suite --resume: results.json has no records array");
  const nlohmann::json& records = doc["records"];
  const auto matches = [&](const nlohmann::json& r, size_t config, const std::string& name, const std::string& planner) {
    return r.is_object() && r.value("workload", "") == name && r.value("planner", "") == planner &&
           r.value("num_qo_heads", -1) == heads[config].num_qo_heads &&
           r.value("num_kv_heads", -1) == heads[config].num_kv_heads;
  };
  size_t done = 0;
  if (planners.empty()) return done;
  for (; done < heads.size() && (done + 1) * planners.size() <= records.size(); ++done) {
    const std::string name = workload_name(done);
    for (size_t k = 0; k < planners.size(); ++k)
      if (!matches(records[done * planners.size() + k], done, name, planners[k])) return done;
  }
  return done;
}

}  // namespace treeattn::bench
