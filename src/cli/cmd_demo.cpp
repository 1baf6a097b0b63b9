// `treeattn demo`: the main job. A few-shot tree (one 4000-token prompt, 32
// branches of 256 tokens, heads 32/8, d=128, fp16) planned by every planner,
// verified on the CPU against the fp64 reference, with the KV bytes each plan
// loads against the unique-KV floor; on a GPU also the time of each plan
// against the floor at the HBM bandwidth measured in the same run.
#include <chrono>
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "treeattn/bench.hpp"
#include "treeattn/executor.hpp"

namespace treeattn::cli {

namespace {

void time_on_gpu(const Workload& w, const std::vector<std::string>& names, const PlanOptions& opt, uint64_t seed) {
  const double bw = measure_hbm_bandwidth_gbps();
  std::printf("\n  GPU: %s, HBM %.0f GB/s measured (median of 50 L2-flushed runs; graph = CUDA-graph replay)\n",
              gpu_device_name().c_str(), bw);
  std::printf("  %-12s %9s %9s %9s %7s %12s %9s\n", "planner", "us", "us graph", "GB/s", "floor", "vs per-query",
              "max err");
  GpuBench bench(w, seed);
  double per_query_us = 0;
  for (const std::string& name : names) {
    const GpuTiming t = bench.time(make_plan(name, w, opt));
    if (name == "per-query") per_query_us = t.us;
    char sp[32] = "-";
    if (per_query_us > 0) std::snprintf(sp, sizeof sp, "%.2fx", per_query_us / t.us);
    std::printf("  %-12s %9.1f %9.1f %9.0f %6.0f%% %12s %9.1e\n", name.c_str(), t.us, t.us_graph,
                double(t.kv_bytes) / (t.us * 1e3), 100 * t.floor_us / t.us, sp, t.max_rel_err);
  }
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "few-shot tree through every planner: bytes vs floor, CPU check");
  auto o = std::make_shared<CommonOptions>();
  add_common_options(cmd, *o);
  cmd->callback([o] {
    const PlanOptions opt = plan_options(*o);
    for (const Workload& w : load_workloads(*o, {"fewshot:prompt=4000:branches=32:len=256"})) {
      std::printf("treeattn demo: %s\n  %d queries over %zu nodes, %lld tokens stored; heads %d/%d, d=%d, %s, page %d\n",
                  w.name.c_str(), w.num_queries(), w.tree.nodes.size(), (long long)w.total_tokens(),
                  w.heads.num_qo_heads, w.heads.num_kv_heads, w.heads.head_dim,
                  dtype_label(w.layout).c_str(), w.layout.page_size);
      std::printf("  unique-KV floor: %s\n\n", format_bytes(double(w.unique_kv_bytes())).c_str());
      require_inputs_memory(w, "demo: " + w.name);
      HostTensors inputs = make_random_inputs(w, o->seed);
      const std::vector<double> ref = reference_attention(w, inputs.args());
      const double tol = tolerance(w.layout.dtype);

      std::printf("  %-12s %6s %12s %9s %11s %11s %10s %s\n", "planner", "units", "KV loaded", "x floor",
                  "vs per-query", "rel err", "cpu ms", "");
      double per_query_bytes = 0, best_bytes = 0;
      std::string best;
      bool ok = true;
      for (const std::string& name : selected_planners(*o, "all")) {
        const Plan p = make_plan(name, w, opt);
        validate_plan(w, p);
        const PlanSummary s = summarize(w, p);
        if (name == "per-query") per_query_bytes = double(s.kv_bytes);
        if (best.empty() || double(s.kv_bytes) < best_bytes) best = name, best_bytes = double(s.kv_bytes);
        require_partials_memory(w, p, "demo: " + name + "'s partials on " + w.name);
        inputs.poison_out();
        const auto t0 = std::chrono::steady_clock::now();
        run_cpu(w, p, inputs.args());
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double err = relative_error(w, inputs.out.data(), ref);
        ok &= err <= tol;
        char fewer[32] = "-";
        if (per_query_bytes > 0) std::snprintf(fewer, sizeof fewer, "%.1fx fewer", per_query_bytes / double(s.kv_bytes));
        std::printf("  %-12s %6lld %12s %9.3f %11s %11.2e %10.1f %s\n", name.c_str(), (long long)s.units,
                    format_bytes(double(s.kv_bytes)).c_str(), kv_over_floor(s.kv_bytes, s.unique_kv_bytes),
                    fewer, err, ms, err <= tol ? "ok" : "FAIL");
      }
      if (per_query_bytes > 0)
        std::printf("\n  %s loads %.1fx fewer KV bytes than per-query, %.3fx the unique-KV floor\n", best.c_str(),
                    per_query_bytes / best_bytes, kv_over_floor(int64_t(best_bytes), w.unique_kv_bytes()));
      std::printf("\n  all plans validated; CPU results %s the fp64 reference (tolerance %.0e)\n",
                  ok ? "match" : "DO NOT match", tol);
      if (!ok) throw CLI::RuntimeError("verification failed", 1);
      if (gpu_available()) time_on_gpu(w, selected_planners(*o, "all"), opt, o->seed);
      else std::printf("  no GPU here: the CUDA path is not timed (treeattn bench times it on a GPU)\n");
    }
  });
}

}  // namespace treeattn::cli
