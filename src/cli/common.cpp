// Shared flags and helpers of the subcommands.
#include "cli/common.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "treeattn/bench.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn::cli {

void add_common_options(CLI::App* cmd, CommonOptions& o) {
  cmd->add_option("-w,--workload", o.workloads,
                  "workload spec, repeatable (see `treeattn workloads`), e.g. fasttree:N=1,4,16:C=128,32,32");
  cmd->add_option("--heads", o.heads, "qo/kv heads, e.g. 32/8")->capture_default_str();
  // Numeric flags are range-checked while parsing (CLI11's Range): a bad value
  // stops with "--FLAG: Value V not in range [LO - HI]" and exit code 2.
  cmd->add_option("--head-dim", o.head_dim, "head dimension (64, 128, 256)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--dtype", o.dtype, "element type: fp16, bf16, fp32")->capture_default_str();
  cmd->add_option("--kv-dtype", o.kv_dtype,
                  "element type of the K/V pools when not --dtype: fp8_e4m3 (per-tensor scaled, as vLLM's fp8 "
                  "KV cache)");
  cmd->add_option("--page-size", o.page_size, "tokens per KV page, 1..65536")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("-p,--planner", o.planners,
                  "planner name, repeatable, or `all` (default: auto; demo and bench --suite: all, they compare "
                  "planners)");
  cmd->add_flag("--json", o.json, "print JSON instead of a table");
  // CLI11 reads "-1" or 2^64 into a uint64_t by saturating or wrapping: the
  // text is checked first, as the spec strings' seed= is.
  const CLI::Validator uint64_text(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size())
          return "expected an integer in [0, 2^64), got '" + text + "'";
        return {};
      },
      "UINT64");
  cmd->add_option("--seed", o.seed, "seed for page shuffling, random trees and inputs")
      ->capture_default_str()
      ->check(uint64_text);
  // kMaxNumSms (planner.hpp): planners size their unit lists by sms x
  // ctas_per_sm, so an unbounded value is a memory bomb.
  cmd->add_option("--sms", o.num_sms, "SM count the planners target, 1.." + std::to_string(kMaxNumSms))
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxNumSms));
  // An empty path (an unset shell variable) would mean the default table: refused, not taken silently.
  const CLI::Validator file_path(
      [](std::string& text) -> std::string {
        return text.empty() ? "an empty path (leave the option out for the default)" : std::string();
      },
      "FILE");
  cmd->add_option("--forge-table", o.forge_table,
                  "forge's cost table (treeattn calibrate output; default: data/forge_cost_h100.json)")
      ->check(file_path);
  cmd->add_option("--pat-rules", o.pat_rules,
                  "pat's KV-tile rules (treeattn calibrate --pat-tiles output; default: data/pat_tile_rules.json)")
      ->check(file_path);
  cmd->add_option("--auto-cost", o.auto_cost,
                  "auto's cost model (treeattn calibrate --auto or scripts/fit_auto_cost.py output; default: the built-in copy of "
                  "data/auto_cost_h100.json)")
      ->check(file_path);
  cmd->add_option("--plan-opt", o.plan_opts,
                  "planner option KEY=NUMBER, repeatable: ctas_per_sm, chunk_tokens, min_split_tokens, or a "
                  "planner's own knob (node: split_tokens, split_scale, split_sm_ctas, pack_tokens, flat_tokens, flat_rows, fold_tokens, reread_ratio, compact_stretch, "
                  "tile_rows; "
                  "fasttree: alpha, beta, gamma, q_tile0, q_tile1, kv_tile0, kv_tile1, kv_split_long, kv_split_short; pat: "
                  "pat_max_rows; flatten: fill)");
}

WorkloadParams workload_params(const CommonOptions& o) {
  WorkloadParams p;
  p.heads = parse_heads(o.heads, o.head_dim);
  p.page_size = o.page_size;
  p.dtype = parse_dtype(o.dtype, "--dtype");
  if (!o.kv_dtype.empty()) p.kv_dtype = parse_dtype(o.kv_dtype, "--kv-dtype");
  p.seed = o.seed;
  return p;
}


PlanOptions plan_options(const CommonOptions& o) {
  PlanOptions opt;
  if (o.num_sms <= 0) throw Error("sms: " + std::to_string(o.num_sms) + " must be positive");
  opt.num_sms = o.num_sms;
  std::vector<std::string> seen;  // a key given twice is refused, as in spec strings (not "the last wins")
  for (const std::string& kv : o.plan_opts) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), text = eq == std::string::npos ? "" : kv.substr(eq + 1);
    double value = 0;
    // Decimal only (std::stod also reads "0x10" as 16).
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::general);
    if (key.empty() || text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
      throw Error("plan-opt: '" + kv + "' is not KEY=NUMBER");
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw Error("plan-opt: " + key + " is given twice");
    seen.push_back(key);
    set_plan_option(opt, key, value);
  }
  // Without a data directory forge and pat keep their built-in tables (the
  // same numbers as the shipped files), so planning still works.
  const std::string data = data_dir().dir;
  const std::string shipped = data.empty() ? "" : data + "/forge_cost_h100.json";
  const std::string table = !o.forge_table.empty()                          ? o.forge_table
                            : !shipped.empty() && std::filesystem::exists(shipped) ? shipped
                                                                                   : "";
  if (!table.empty()) set_default_forge_cost_table(std::make_shared<ForgeCostTable>(load_forge_cost_table(table)));
  const std::string shipped_rules = data.empty() ? "" : data + "/pat_tile_rules.json";
  const std::string rules = !o.pat_rules.empty()                                       ? o.pat_rules
                            : !shipped_rules.empty() && std::filesystem::exists(shipped_rules) ? shipped_rules
                                                                                               : "";
  if (!rules.empty()) set_default_pat_tile_rules(std::make_shared<PatTileRules>(load_pat_tile_rules(rules)));
  if (!o.auto_cost.empty())
    set_default_auto_cost_model(std::make_shared<AutoCostModel>(load_auto_cost_model(o.auto_cost)));
  return opt;
}

namespace {
// Families whose second field is a file path.
std::string resolve_file(const std::string& spec) {
  for (const char* family : {"json:", "tot:", "medusa:", "blocktable:"}) {
    const std::string f = family;
    if (spec.rfind(f, 0) != 0) continue;
    const size_t end = spec.find(':', f.size());
    const std::string file = spec.substr(f.size(), end == std::string::npos ? std::string::npos : end - f.size());
    namespace fs = std::filesystem;
    if (file.empty() || fs::exists(file) || fs::path(file).is_absolute()) return spec;
    const std::string cwd = fs::current_path().string();
    if (data_dir().dir.empty())
      throw Error(family + std::string(" file '") + file + "': not found (looked in: " + cwd +
                  "; the data directory's workloads/, but no data directory was found: " + data_dir().looked + ")");
    const fs::path shipped = fs::path(data_dir().dir) / "workloads" / file;
    if (fs::exists(shipped)) return f + shipped.string() + (end == std::string::npos ? "" : spec.substr(end));
    throw Error(family + std::string(" file '") + file + "': not found (looked in: " + cwd + "; " +
                (fs::path(data_dir().dir) / "workloads").string() + ")");
  }
  return spec;
}
}  // namespace

std::vector<Workload> load_workloads(const CommonOptions& o, const std::vector<std::string>& fallback) {
  const WorkloadParams p = workload_params(o);
  std::vector<Workload> out;
  for (const std::string& spec : o.workloads.empty() ? fallback : o.workloads)
    out.push_back(make_workload(resolve_file(spec), p));
  if (out.empty()) throw Error("workload: none given (use --workload SPEC; `treeattn workloads` lists them)");
  return out;
}

std::vector<std::string> selected_planners(const CommonOptions& o, const std::string& when_none) {
  const std::vector<std::string> asked = o.planners.empty() ? std::vector<std::string>{when_none} : o.planners;
  std::vector<std::string> names;
  if (std::find(asked.begin(), asked.end(), "all") != asked.end()) {
    for (const PlannerInfo& p : planners()) names.push_back(p.name);
  } else {
    for (const std::string& n : asked) {
      if (n.empty()) {  // said in words: quoted, the empty name prints as ''
        std::string known;
        for (const PlannerInfo& p : planners()) known += (known.empty() ? "" : ", ") + p.name;
        throw Error("--planner: the name is empty (known: " + known + ")");
      }
      names.push_back(find_planner(n).name);
    }
  }
  return names;
}

std::string dtype_label(const KvLayout& l) {
  std::string s(to_string(l.dtype));
  if (l.kv_type() != l.dtype) s += ", kv " + std::string(to_string(l.kv_type()));
  return s;
}

double tolerance(DType t) {
  switch (t) {
    case DType::fp32: return 1e-5;
    case DType::fp16: return 2e-3;
    case DType::bf16: return 1e-2;
    case DType::fp8_e4m3: break;  // not an output type
  }
  return 0;
}

namespace {
namespace fs = std::filesystem;

// The running executable's path (Linux: /proc/self/exe), empty if unknown.
fs::path self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : p;
}

// The source tree of the CMake build directory `dir`, from its CMakeCache.txt
// (treeattn_SOURCE_DIR); empty if `dir` is not a treeattn build directory.
std::string source_of_build_dir(const fs::path& dir) {
  std::ifstream cache(dir / "CMakeCache.txt");
  for (std::string line; std::getline(cache, line);)
    if (line.rfind("treeattn_SOURCE_DIR:STATIC=", 0) == 0) return line.substr(line.find('=') + 1);
  return "";
}

DataDir find_data_dir() {
  DataDir d;
  const auto consider = [&](const std::string& label, const fs::path& dir) {
    if (!d.dir.empty()) return;
    std::error_code ec;
    const char* why = nullptr;
    if (!fs::is_directory(dir, ec)) why = "no such directory";
    else if (!fs::is_directory(dir / "suites", ec)) why = "no suites/ in it";
    if (!why) {
      d.dir = fs::weakly_canonical(dir, ec).string();
      if (ec) d.dir = dir.string();
      return;
    }
    d.looked += (d.looked.empty() ? "" : "; ") + label + dir.string() + " (" + why + ")";
  };
  const fs::path exe = self_exe();
  if (exe.empty()) {
    d.looked = "the executable's directory (/proc/self/exe unreadable)";
  } else {
    const fs::path bin = exe.parent_path();
    consider("", bin / ".." / "share" / "treeattn");
    const std::string src = source_of_build_dir(bin);
    if (!src.empty()) consider("", fs::path(src) / "data");
    else if (d.dir.empty()) d.looked += "; " + bin.string() + " (not a CMake build directory)";
  }
  if (const char* env = std::getenv("TREEATTN_DATA_DIR"); env && *env) consider("$TREEATTN_DATA_DIR = ", env);
  else if (d.dir.empty()) d.looked += "; $TREEATTN_DATA_DIR (unset)";
  return d;
}
}  // namespace

const DataDir& data_dir() {
  static const DataDir d = find_data_dir();
  return d;
}

std::string require_data_dir(const std::string& what) {
  const DataDir& d = data_dir();
  if (d.dir.empty())
    throw Error(what + ": no data directory found (looked in: " + d.looked +
                "); install treeattn (cmake --install) or set TREEATTN_DATA_DIR to the repository's data/");
  return d.dir;
}

bench::Suite load_named_suite(const std::string& name, const std::string& what) {
  return bench::load_suite(name, std::filesystem::is_regular_file(name) ? std::string()
                                                                        : require_data_dir(what + " " + name));
}

// ---- Progress ------------------------------------------------------------

struct Progress::State {
  std::string command;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now(), step_start = start;
  std::string what;
  int done = 0, total = 0;
  bool tty = isatty(fileno(stderr)) != 0;
  bool shown = false, stop = false, printed_step = false;
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
};

namespace {
constexpr double kQuietSeconds = 2.0;
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Progress::Progress(std::string command) : s_(std::make_unique<State>()) {
  s_->command = std::move(command);
  s_->thread = std::thread([this] { loop(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
  if (s_->shown && s_->tty) std::fprintf(stderr, "\r\033[K");
}

void Progress::step(const std::string& what, int total) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->what.empty()) ++s_->done;
  if (total >= 0) s_->total = total;
  s_->what = what;
  s_->step_start = std::chrono::steady_clock::now();
  s_->printed_step = false;
  s_->cv.notify_all();
}

void Progress::clear() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->tty && s_->shown) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

void Progress::loop() {
  State& s = *s_;
  std::unique_lock<std::mutex> lock(s.mu);
  double last_line = 0;
  while (!s.stop) {
    s.cv.wait_for(lock, std::chrono::milliseconds(500));
    if (s.stop || s.what.empty()) continue;
    const double t = seconds_since(s.start);
    if (t < kQuietSeconds) continue;
    const std::string count = s.total > 0 ? std::to_string(s.done + 1) + "/" + std::to_string(s.total)
                                          : std::to_string(s.done + 1);
    const double in_step = seconds_since(s.step_start);
    if (s.tty) {
      std::fprintf(stderr, "\r[%s %s] %-70.70s %6.0f s", s.command.c_str(), count.c_str(), s.what.c_str(), in_step);
    } else if (!s.printed_step || t - last_line >= 10) {
      std::fprintf(stderr, "[%s %s] %s (%.0f s in this step, %.0f s in all)\n", s.command.c_str(), count.c_str(),
                   s.what.c_str(), in_step, t);
      last_line = t;
      s.printed_step = true;
    }
    s.shown = true;
    std::fflush(stderr);
  }
}

void require_gpu(const std::string& what) {
  if (gpu_available()) return;
#if defined(TREEATTN_HAVE_CUDA)
  throw Error(what + ": no CUDA device is visible to this process");
#else
  throw Error(what + ": no CUDA device: this treeattn was built without CUDA (no nvcc at build time)");
#endif
}

void require_inputs_memory(const Workload& w, const std::string& what) {
  const double elems = double(w.num_queries()) * w.heads.num_qo_heads * w.heads.head_dim;
  const double pool = 2.0 * double(w.layout.num_pages) * w.layout.page_size * w.heads.num_kv_heads *
                      w.heads.head_dim * dtype_size(w.layout.kv_type());
  require_host_memory(pool + elems * (2 * dtype_size(w.layout.dtype) + 8), what);
}

void require_partials_memory(const Workload& w, const Plan& p, const std::string& what) {
  require_host_memory(double(p.num_slots) * w.heads.num_qo_heads * (w.heads.head_dim + 1) * 4, what);
}

void require_host_memory(double bytes, const std::string& what) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib && key != "MemAvailable:") meminfo.ignore(256, '\n');
  if (key != "MemAvailable:" || kib <= 0) return;  // unknown: no check
  const double available = kib * 1024;
  if (bytes > available)
    throw Error(what + " needs about " + format_bytes(bytes) + " of host memory, more than the " +
                format_bytes(available) + " available");
}

std::string format_bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1000 && i < 4) b /= 1000, ++i;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, unit[i]);
  return buf;
}

}  // namespace treeattn::cli

namespace treeattn::cli {
nlohmann::json summary_json(const Workload& w, const PlanSummary& s) {
  return {{"workload", w.name},
          {"num_qo_heads", w.heads.num_qo_heads},
          {"num_kv_heads", w.heads.num_kv_heads},
          {"head_dim", w.heads.head_dim},
          {"dtype", std::string(to_string(w.layout.dtype))},
          {"kv_dtype", std::string(to_string(w.layout.kv_type()))},
          {"page_size", w.layout.page_size},
          {"queries", w.num_queries()},
          {"nodes", w.tree.nodes.size()},
          {"planner", s.planner},
          {"units", s.units},
          {"rows", s.rows},
          {"segments", s.segments},
          {"kv_bytes", s.kv_bytes},
          {"unique_kv_bytes", s.unique_kv_bytes},
          {"kv_over_floor", kv_over_floor(s.kv_bytes, s.unique_kv_bytes)},
          {"partial_bytes", s.partial_bytes},
          {"padded_rows", s.padded_rows},
          {"masked_units", s.masked_units},
          {"max_unit_tokens", s.max_unit_tokens},
          {"flops", s.flops}};
}
}  // namespace treeattn::cli
