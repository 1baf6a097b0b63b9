// Runs a benchmark suite: every (workload, head config) x planner timed on the
// GPU, with progress, then the JSON records, a markdown report and plots.
#include "cli/suite_runner.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"

namespace treeattn::cli {

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string file_safe(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  return s;
}

// A progress bar on a terminal, plain lines otherwise (logs, CI, device runs).
void progress(int done, int total, const std::string& what) {
  if (isatty(fileno(stderr))) {
    const int width = 30, filled = total ? done * width / total : width;
    std::fprintf(stderr, "\r[%s%s] %d/%d %-60.60s", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total, what.c_str());
    if (done == total) std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "[%d/%d] %s\n", done, total, what.c_str());
  }
  std::fflush(stderr);
}

}  // namespace

nlohmann::json timing_record(const Workload& w, const Plan& p, const GpuTiming& t, const std::string& commit,
                             double plan_ms, const BenchOptions& b) {
  nlohmann::json r = summary_json(w, summarize(w, p));
  r["device"] = t.device;
  r["commit"] = commit;
  r["date"] = utc_now();
  r["us"] = t.us;
  r["us_min"] = t.us_min;
  r["us_graph"] = t.us_graph;
  r["kv_bytes"] = t.kv_bytes;
  r["unique_kv_bytes"] = t.unique_kv_bytes;
  r["io_bytes"] = t.io_bytes;
  r["bandwidth_gbps"] = t.bandwidth_gbps;
  r["achieved_gbps"] = double(t.kv_bytes) / (t.us * 1e3);
  r["floor_us"] = t.floor_us;
  r["fraction_of_floor"] = t.floor_us / t.us;
  r["tensor_tflops"] = t.tensor_tflops;
  r["compute_floor_us"] = t.compute_floor_us;
  r["roofline_us"] = t.roofline_us;
  r["fraction_of_roofline"] = t.roofline_us / t.us;
  r["read_us"] = t.read_us > 0 ? nlohmann::json(t.read_us) : nlohmann::json();
  r["max_rel_err"] = t.max_rel_err < 0 ? nlohmann::json() : nlohmann::json(t.max_rel_err);
  r["launches"] = t.launches;
  r["launches_graph"] = t.launches_graph;
  r["launch_info"] = t.launch_info;
  if (!t.trace.empty()) r["cta_trace"] = t.trace;
  if (t.host_gate_timeouts > 0) r["host_gate_timeouts"] = t.host_gate_timeouts;  // those runs' times include the host's
  r["slots"] = t.slots;
  r["iters"] = b.iters;
  r["l2_flush"] = b.flush_l2;
  r["executor"] = b.step_executor ? "step" : "plan";
  r["plan_ms"] = plan_ms;
  return r;
}

// Runs `argv` without a shell (a path in it is never parsed as shell
// syntax), its stderr to /dev/null; true when it exits with 0.
bool run_quietly(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int started = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (started != 0) return false;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string write_report(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path results = fs::path(dir) / "results.json";
  const nlohmann::json doc =
      detail::parse_json(detail::read_text_file(results.string(), "report"), "report: " + results.string());
  std::string md;
  size_t num_records = 0;
  try {  // the fields a suite run writes; a file of another shape is named, not an internal error
    const nlohmann::json& records = doc.at("records");
    if (!records.is_array()) throw Error("records is not an array");
    num_records = records.size();
    md = bench::markdown_report(records, "Suite `" + doc.value("suite", "?") + "`");
    md += "\nCommand: `" + doc.value("command", "?") + "` · date " + doc.value("date", "?") + " · " +
          std::to_string(int(doc.value("minutes", 0.0) * 60)) + " s · " + std::to_string(num_records) +
          " records\n\n![speedup](speedup.png)\n![floor](floor.png)\n![normalized](normalized.png)\n";
  } catch (const nlohmann::json::exception& e) {
    throw Error("report: " + results.string() + " is not a suite's results file (" + e.what() + ")");
  } catch (const Error& e) {
    throw Error("report: " + results.string() + " is not a suite's results file (" + e.what() + ")");
  }
  const fs::path report = fs::path(dir) / "report.md";
  std::ofstream out(report);
  out << md;
  out.close();
  if (!out) throw Error("report: cannot write " + report.string());
  const std::vector<std::string> plot = {"python3", std::string(TREEATTN_SOURCE_DIR) + "/scripts/plot_suite.py",
                                         results.string(), dir};
  if (run_quietly(plot)) {
    std::printf("wrote %s and the plots (*.png) beside it\n", report.c_str());
  } else {
    std::printf("wrote %s; plots not written (needs python3 with matplotlib); run: python3 %s '%s' '%s'\n",
                report.c_str(), plot[1].c_str(), results.c_str(), dir.c_str());
  }
  return md;
}

std::string suite_command(const SuiteRun& run, const CommonOptions& o, const BenchOptions& b) {
  const CommonOptions defaults;
  const BenchOptions bench_defaults;
  std::string c = "treeattn bench --suite " + run.suite;
  const auto add = [&c](const std::string& flag, const std::string& value = {}) {
    c += " " + flag;
    if (!value.empty()) c += " " + value;
  };
  if (run.quick) add("--quick");
  for (const std::string& p : run.planners) add("-p", p);
  if (!o.kv_dtype.empty()) add("--kv-dtype", o.kv_dtype);
  for (const std::string& opt : o.plan_opts) add("--plan-opt", opt);
  if (o.seed != defaults.seed) add("--seed", std::to_string(o.seed));
  if (o.num_sms != defaults.num_sms) add("--sms", std::to_string(o.num_sms));
  if (!o.forge_table.empty()) add("--forge-table", o.forge_table);
  if (!o.pat_rules.empty()) add("--pat-rules", o.pat_rules);
  if (!o.auto_cost.empty()) add("--auto-cost", o.auto_cost);
  if (b.iters != bench_defaults.iters) add("--iters", std::to_string(b.iters));
  if (b.warmup != bench_defaults.warmup) add("--warmup", std::to_string(b.warmup));
  if (!b.flush_l2) add("--no-flush");
  if (!b.graph) add("--no-graph");
  if (!b.persistent) add("--no-persistent");
  if (!b.skip_unseen) add("--no-skip-unseen");
  if (b.streams) add("--streams");
  if (b.l2_persistent_plan) add("--l2-persistent-plan");
  if (b.step_executor) add("--step-executor");
  if (b.step_plan_tiles) {
    add("--step-tiles", "plan");
  } else if (!b.step_tiles.empty()) {
    std::string tiles;
    for (const int t : b.step_tiles)
      tiles += (tiles.empty() ? "" : ",") + std::to_string(kTileConfigs[t].m) + "x" + std::to_string(kTileConfigs[t].n);
    add("--step-tiles", tiles);
  }
  if (b.step_graph_plan_launches) add("--step-graph-launches", b.step_graph_first ? "plan-first" : "plan");
  if (b.trace) add("--trace");
  add("--verify", std::to_string(b.verify_queries));
  return c;
}

bool run_suite(const SuiteRun& run, const CommonOptions& common, const BenchOptions& b) {
  namespace fs = std::filesystem;
  const bench::Suite suite = load_named_suite(run.suite, "bench --suite");
  const std::string device = gpu_device_name();
  const std::string commit = current_commit(TREEATTN_SOURCE_DIR);
  const fs::path out = run.out_dir.empty()
                           ? fs::path(TREEATTN_SOURCE_DIR) / "bench" / "results" / file_safe(device) /
                                 (suite.name + (run.quick ? "-quick" : ""))
                           : fs::path(run.out_dir);
  fs::create_directories(out);

  CommonOptions o = common;
  o.planners = run.planners;
  o.head_dim = suite.head_dim;
  o.dtype = std::string(to_string(suite.dtype));
  o.page_size = suite.page_size;
  std::vector<std::string> names = selected_planners(o, "all");
  std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n == "per-query"; });
  const PlanOptions opt = plan_options(o);

  std::vector<std::pair<std::string, HeadConfig>> configs;
  for (const HeadConfig& h : run.quick ? suite.quick_heads : suite.heads)
    for (const auto& e : suite.entries)
      if (!run.quick || e.quick) configs.emplace_back(e.spec, h);

  const double bw = measure_hbm_bandwidth_gbps();
  const std::string command = suite_command(run, common, b);
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json records = nlohmann::json::array();
  size_t first = 0;          // configs before it are kept from the run resumed
  double earlier_minutes = 0;
  if (run.resume && fs::exists(out / "results.json")) {
    const fs::path path = out / "results.json";
    const nlohmann::json doc =
        detail::parse_json(detail::read_text_file(path.string(), "bench --suite --resume"), path.string());
    std::vector<HeadConfig> heads;
    for (const auto& c : configs) heads.push_back(c.second);
    const auto workload_name = [&](size_t i) {
      CommonOptions c = o;
      c.heads = std::to_string(configs[i].second.num_qo_heads) + "/" + std::to_string(configs[i].second.num_kv_heads);
      c.workloads = {configs[i].first};
      return load_workloads(c, {}).front().name;
    };
    first = bench::completed_configs(doc, {suite.name, commit, device, command}, heads, workload_name, names);
    for (size_t k = 0; k < first * names.size(); ++k) records.push_back(doc["records"][k]);
    earlier_minutes = doc.value("minutes", 0.0);
    std::printf("resuming %s: %zu of %zu configs done\n", path.string().c_str(), first, configs.size());
  } else if (run.resume) {
    std::printf("nothing to resume in %s: starting afresh\n", out.string().c_str());
  }
  // Rewritten after every config, so a run cut short still leaves its records.
  const auto write_results = [&] {
    const double minutes =
        earlier_minutes + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60;
    const nlohmann::json doc = {{"suite", suite.name}, {"description", suite.description}, {"device", device},
                                {"commit", commit},    {"date", utc_now()},                {"command", command},
                                {"bandwidth_gbps", bw}, {"minutes", minutes},              {"records", records}};
    std::ofstream(out / "results.json") << doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  };
  std::printf("treeattn bench --suite %s%s on %s (commit %s): %zu configs x %zu planners; HBM %.0f GB/s measured\n",
              suite.name.c_str(), run.quick ? " --quick" : "", device.c_str(), commit.c_str(), configs.size(),
              names.size(), bw);
  bool ok = true;
  for (size_t i = first; i < configs.size(); ++i) {
    const auto& [spec, heads] = configs[i];
    o.heads = std::to_string(heads.num_qo_heads) + "/" + std::to_string(heads.num_kv_heads);
    o.workloads = {spec};
    progress(int(i), int(configs.size()), spec + " @" + o.heads);
    const Workload w = load_workloads(o, {}).front();
    GpuBench gpu(w, o.seed);
    BenchOptions config_b = b;
    for (const std::string& name : names) {
      const auto t0 = std::chrono::steady_clock::now();
      const Plan p = make_plan(name, w, opt);
      const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const GpuTiming t = gpu.time(p, config_b);
      nlohmann::json r = timing_record(w, p, t, commit, plan_ms, config_b);
      // Graph replay matters where launch latency does; past a millisecond it only doubles the run time.
      if (name == "per-query" && t.us > 1000) config_b.graph = false;
      r["suite"] = suite.name;
      ok &= t.max_rel_err < 0 || t.max_rel_err <= tolerance(w.layout.dtype);
      records.push_back(std::move(r));
    }
    write_results();
  }
  progress(int(configs.size()), int(configs.size()), "done");
  write_results();
  std::printf("%s", write_report(out.string()).c_str());
  return ok;
}

}  // namespace treeattn::cli
