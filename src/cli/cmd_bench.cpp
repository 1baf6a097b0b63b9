// `treeattn bench`: times workloads x planners on the GPU (CUDA events,
// warm-up, median of --iters runs with the L2 flushed before each, random
// device inputs), with the HBM bandwidth and the tensor-core rate measured in
// the same process, and reports per planner: time, KV bytes loaded, achieved
// GB/s, the fraction of the roofline reached (the larger of the unique-KV
// floor and the compute floor) and the speedup over per-query. Sampled queries
// are checked against the fp64 reference (exit 1 when over tolerance).
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "cli/suite_runner.hpp"
#include "treeattn/bench.hpp"

namespace treeattn::cli {


void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "time planners on the GPU: us, GB/s, fraction of the roofline (unique-KV bytes, FLOPs)");
  auto o = std::make_shared<CommonOptions>();
  auto b = std::make_shared<BenchOptions>();
  add_common_options(cmd, *o);
  cmd->add_option("--iters", b->iters, "timed runs (median reported), at least 50")->capture_default_str();
  cmd->add_option("--warmup", b->warmup, "untimed runs first")->capture_default_str();
  cmd->add_option("--verify", b->verify_queries, "queries checked against fp64 (0: none)")->capture_default_str();
  auto flags = std::make_shared<std::array<bool, 4>>();  // --no-flush, --no-graph, --no-persistent, --no-skip-unseen
  cmd->add_flag("--no-flush", (*flags)[0], "keep the L2 warm between runs");
  cmd->add_flag("--no-graph", (*flags)[1], "skip the CUDA-graph replay timing");
  cmd->add_flag("--no-persistent", (*flags)[2],
                "one CTA per (unit, kv head) even where they exceed one wave, instead of one wave of CTAs that "
                "claim them in turn");
  cmd->add_flag("--no-skip-unseen", (*flags)[3],
                "run masked 128-row units with the plain loop too, instead of the tile's skip variant (whose "
                "warpgroups skip the masked K/V tiles none of their rows see)");
  cmd->add_flag("--streams", b->streams,
                "one internal stream per tile config, joined with events (PAT's multi-stream forward), instead of "
                "chaining the launches in the caller's stream");
  cmd->add_flag("--l2-persistent-plan", b->l2_persistent_plan,
                "keep each plan's device arrays in the L2 set-aside for persisting accesses (the flush before each "
                "run then leaves them in L2, as they stay there between a model's layers)");
  cmd->add_flag("--step-executor", b->step_executor,
                "run each plan through the runtime's executor (CudaStepExecutor: fixed grids that read the plan "
                "from its upload, as TreeAttention and the Python package run it, graphs valid from plan to plan; "
                "capacities of the plan's own sizes) instead of one made for the plan (CudaExecutor)");
  auto step_tiles = std::make_shared<std::string>();
  cmd->add_option("--step-tiles", *step_tiles,
                  "with --step-executor: its launches, tiles MxN or M (n = 64) comma-separated in launch order "
                  "(e.g. 128,16x32), or `plan`: the tiles each plan's units use (default: 128,64,32,16)");
  auto step_graph = std::make_shared<std::string>();
  cmd->add_option("--step-graph-launches", *step_graph,
                  "with --step-executor: the launches its graph replay captures, `all` (the default: every launch, "
                  "one graph for any plan), `plan`: the plan's own (a graph per launch set, "
                  "CudaStepExecutor::set_graph_launches; launch 0 last where the plan leaves it empty) or "
                  "`plan-first`: the plan's own and launch 0 first");
  cmd->add_flag("--trace", b->trace,
                "print each launch's CTA timeline of the last timed run (phases per CTA, p50/p90 in us); needs a "
                "build with -DTREEATTN_CTA_TRACE=ON, and its timings are not the ones to report");
  auto suite = std::make_shared<SuiteRun>();
  cmd->add_option("--suite", suite->suite,
                  "run a whole suite (fasttree, pat, flashforge, deft, forests, offsuite, or a suite file; see data/suites/) and write "
                  "results.json, report.md and plots under bench/results/<device>/<suite>/");
  cmd->add_flag("--quick", suite->quick, "with --suite: only its representative subset ('+' lines, quick_heads)");
  cmd->add_option("--out", suite->out_dir, "with --suite: output directory");
  cmd->add_flag("--resume", suite->resume,
                "with --suite: keep the configs that the output directory's results.json (a run of the same suite, "
                "commit, device and command cut short) finished, and time the rest");
  auto report = std::make_shared<std::string>();
  cmd->add_option("--report", *report,
                  "no timing: rewrite report.md and the plots of DIR/results.json (a suite's output directory)");
  cmd->callback([o, b, flags, suite, report, step_tiles, step_graph] {
    if (!report->empty()) {
      std::printf("%s", write_report(*report).c_str());
      return;
    }
    if (suite->resume && suite->suite.empty()) throw Error("--resume: needs --suite");
    if (b->iters < 50) throw Error("iters: " + std::to_string(b->iters) + " must be at least 50");
    if (b->warmup < 0) throw Error("warmup: " + std::to_string(b->warmup) + " must not be negative");
    if (!step_tiles->empty()) {
      if (!b->step_executor) throw Error("--step-tiles: needs --step-executor");
      if (*step_tiles == "plan") {
        b->step_plan_tiles = true;
      } else {
        // A whole decimal number, else -1.
        const auto number = [](std::string_view text) {
          int v = -1;
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
          return ec == std::errc() && end == text.data() + text.size() && !text.empty() ? v : -1;
        };
        std::stringstream list(*step_tiles);
        for (std::string item; std::getline(list, item, ',');) {
          const size_t x = item.find('x');
          const int m = number(std::string_view(item).substr(0, x)),
                    n = x == std::string::npos ? kDefaultKvTile : number(std::string_view(item).substr(x + 1));
          const int t = m > 0 && n > 0 ? tile_index(m, n) : -1;
          if (t < 0)
            throw Error("--step-tiles: '" + item + "' is not a compiled tile (M or MxN, e.g. 128 or 16x32)");
          if (std::find(b->step_tiles.begin(), b->step_tiles.end(), t) != b->step_tiles.end())
            throw Error("--step-tiles: '" + item + "' is listed twice");
          b->step_tiles.push_back(t);
        }
      }
    }
    if (!step_graph->empty()) {
      if (!b->step_executor) throw Error("--step-graph-launches: needs --step-executor");
      if (*step_graph != "plan" && *step_graph != "plan-first" && *step_graph != "all")
        throw Error("--step-graph-launches: '" + *step_graph + "' is not `all`, `plan` or `plan-first`");
      b->step_graph_plan_launches = *step_graph != "all";
      b->step_graph_first = *step_graph == "plan-first";
    }
    require_gpu("bench");
    b->flush_l2 = !(*flags)[0];
    b->graph = !(*flags)[1];
    b->persistent = !(*flags)[2];
    b->skip_unseen = !(*flags)[3];
    b->seed = o->seed;
    if (!suite->suite.empty()) {
      if (!o->workloads.empty()) throw Error("suite: --suite and --workload exclude each other");
      suite->planners = o->planners;
      if (!run_suite(*suite, *o, *b)) throw CLI::RuntimeError("verification failed", 1);
      return;
    }
    const PlanOptions opt = plan_options(*o);
    const std::string commit = current_commit(TREEATTN_SOURCE_DIR);
    const std::string device = gpu_device_name();
    const double bw = measure_hbm_bandwidth_gbps();
    nlohmann::json records = nlohmann::json::array();
    bool ok = true;
    if (!o->json)
      std::printf("treeattn bench on %s (commit %s): HBM %.0f GB/s measured (1 GiB D2D copy)\n", device.c_str(),
                  commit.c_str(), bw);
    for (const Workload& w : load_workloads(*o, {})) {
      const double tol = tolerance(w.layout.dtype);
      if (!o->json) {
        std::printf("\n%s  (%d queries, %zu nodes, heads %d/%d, d=%d, %s, page %d); unique KV %s\n", w.name.c_str(),
                    w.num_queries(), w.tree.nodes.size(), w.heads.num_qo_heads, w.heads.num_kv_heads,
                    w.heads.head_dim, dtype_label(w.layout).c_str(), w.layout.page_size,
                    format_bytes(double(w.unique_kv_bytes())).c_str());
        std::printf("  %-11s %6s %3s %10s %10s %11s %8s %7s %8s %9s %9s\n", "planner", "units", "ln", "us", "us graph",
                    "KV loaded", "GB/s", "roofl.", "vs p-q", "max err", "plan ms");
      }
      GpuBench bench(w, o->seed);
      std::map<std::string, GpuTiming> done;
      const std::vector<std::string> names = selected_planners(*o);
      // per-query first, so every other planner has its baseline.
      std::vector<std::string> order;
      for (const std::string& n : names)
        if (n == "per-query") order.push_back(n);
      for (const std::string& n : names)
        if (n != "per-query") order.push_back(n);
      for (const std::string& name : order) {
        const auto t0 = std::chrono::steady_clock::now();
        const Plan p = make_plan(name, w, opt);
        const double plan_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const GpuTiming t = bench.time(p, *b);
        done[name] = t;
        const double gbps = double(t.kv_bytes) / (t.us * 1e3);
        const double frac = t.roofline_us / t.us;
        const auto base = done.find("per-query");
        const double speedup = base != done.end() ? base->second.us / t.us : NAN;
        const bool err_ok = t.max_rel_err < 0 || t.max_rel_err <= tol;
        ok &= err_ok;
        if (o->json) {
          nlohmann::json r = timing_record(w, p, t, commit, plan_ms, *b);
          r["speedup_vs_per_query"] = std::isnan(speedup) ? nlohmann::json() : nlohmann::json(speedup);
          records.push_back(r);
        } else {
          char err[32] = "-", sp[32] = "-";
          if (t.max_rel_err >= 0) std::snprintf(err, sizeof err, "%.1e%s", t.max_rel_err, err_ok ? "" : "!");
          if (!std::isnan(speedup)) std::snprintf(sp, sizeof sp, "%.2fx", speedup);
          std::printf("  %-11s %6d %3d %10.1f %10.1f %11s %8.0f %6.0f%% %8s %9s %9.2f\n", name.c_str(), t.units,
                      t.launches, t.us, t.us_graph, format_bytes(double(t.kv_bytes)).c_str(), gbps, 100 * frac, sp,
                      err, plan_ms);
          if (!t.trace.empty()) std::printf("%s", t.trace.c_str());
        }
      }
      if (!o->json && !done.empty()) {
        const GpuTiming& any = done.begin()->second;
        std::printf("  roofline %.1f us = max(memory floor: unique KV + q + out at %.0f GB/s, %.1f us; compute floor: "
                    "%.2f GFLOP at %.0f TFLOP/s, %.1f us)",
                    any.roofline_us, bw, any.floor_us, double(any.flops) * 1e-9, any.tensor_tflops,
                    any.compute_floor_us);
        if (any.read_us > 0) std::printf("; a kernel that only reads the unique KV: %.1f us", any.read_us);
        std::printf("\n");
      }
    }
    if (o->json) std::printf("%s\n", records.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    if (!ok) {
      std::fprintf(stderr, "treeattn bench: a sampled query is over the %s tolerance\n", "dtype's");
      throw CLI::RuntimeError("verification failed", 1);
    }
  });
}

}  // namespace treeattn::cli
