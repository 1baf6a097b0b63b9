// `treeattn verify`: each selected planner's plan (default auto; --planner
// all: every planner), run by the CPU executor on random
// inputs, against the fp64 reference. Exit code 1 when any error exceeds the
// dtype's tolerance.
#include <chrono>
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "treeattn/executor.hpp"

namespace treeattn::cli {

void add_verify_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "check planners on the CPU against the fp64 reference");
  auto o = std::make_shared<CommonOptions>();
  add_common_options(cmd, *o);
  cmd->callback([o] {
    const PlanOptions opt = plan_options(*o);
    bool ok = true;
    nlohmann::json records = nlohmann::json::array();
    Progress progress("verify");
    progress.step("building workloads");
    const std::vector<Workload> workloads = load_workloads(*o, {});
    const std::vector<std::string> names = selected_planners(*o);
    const int steps = int(1 + workloads.size() * (1 + names.size()));
    for (const Workload& w : workloads) {
      const std::string tag = w.name + " (" + std::to_string(w.num_queries()) + " queries)";
      progress.step("inputs and fp64 reference: " + tag, steps);
      require_inputs_memory(w, "verify: " + tag);
      HostTensors t = make_random_inputs(w, o->seed);
      const std::vector<double> ref = reference_attention(w, t.args());
      const double tol = tolerance(w.layout.dtype);
      progress.clear();
      if (!o->json)
        std::printf("%s  (%d queries, %s, tolerance %.0e)\n", w.name.c_str(), w.num_queries(),
                    dtype_label(w.layout).c_str(), tol);
      for (const std::string& name : names) {
        progress.step(name + ": plan, validate, run on the CPU: " + tag);
        const Plan p = make_plan(name, w, opt);
        validate_plan(w, p);
        require_partials_memory(w, p, "verify: " + name + "'s partials on " + tag);
        t.poison_out();
        const auto t0 = std::chrono::steady_clock::now();
        run_cpu(w, p, t.args());
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double err = relative_error(w, t.out.data(), ref);
        const bool pass = err <= tol;
        ok &= pass;
        if (o->json) {
          nlohmann::json r = summary_json(w, summarize(w, p));
          r["max_rel_err"] = err;
          r["tolerance"] = tol;
          r["pass"] = pass;
          records.push_back(r);
        } else {
          progress.clear();
          std::printf("  %-12s rel err %.3e  %s  (cpu %.1f ms)\n", name.c_str(), err, pass ? "ok" : "FAIL", ms);
          std::fflush(stdout);
        }
      }
    }
    progress.clear();
    if (o->json) std::printf("%s\n", records.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    if (!ok) throw CLI::RuntimeError("verification failed", 1);
  });
}

}  // namespace treeattn::cli
