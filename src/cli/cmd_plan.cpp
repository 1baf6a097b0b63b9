// `treeattn plan`: what each planner does with a workload, as a table or JSON.
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn::cli {

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "summarise the plans of planners on workloads (validated)");
  auto o = std::make_shared<CommonOptions>();
  add_common_options(cmd, *o);
  cmd->callback([o] {
    const PlanOptions opt = plan_options(*o);
    nlohmann::json records = nlohmann::json::array();
    Progress progress("plan");
    progress.step("building workloads");
    const std::vector<Workload> workloads = load_workloads(*o, {});
    const std::vector<std::string> names = selected_planners(*o);
    const int steps = int(1 + workloads.size() * names.size());
    for (const Workload& w : workloads) {
      progress.clear();
      if (!o->json)
        std::printf("%s  (%d queries, %zu nodes, heads %d/%d, d=%d, %s, page %d)\n", w.name.c_str(),
                    w.num_queries(), w.tree.nodes.size(), w.heads.num_qo_heads, w.heads.num_kv_heads,
                    w.heads.head_dim, dtype_label(w.layout).c_str(), w.layout.page_size);
      if (!o->json)
        std::printf("  %-12s %7s %8s %9s %12s %9s %12s %8s\n", "planner", "units", "rows", "segments",
                    "kv_bytes", "x floor", "partials", "padded");
      for (const std::string& name : names) {
        progress.step(name + ": plan and validate: " + w.name + " (" + std::to_string(w.num_queries()) + " queries)",
                      steps);
        const Plan p = make_plan(name, w, opt);
        validate_plan(w, p);
        const PlanSummary s = summarize(w, p);
        if (o->json) {
          records.push_back(summary_json(w, s));
          // What auto's cost model prices (scripts/fit_auto_cost.py reads it).
          const AutoCostFeatures f = auto_cost_features(w, p, opt);
          for (int i = 0; i < kAutoCostFeatures; ++i) records.back()["auto_features"][kAutoCostFeatureNames[i]] = f[i];
        } else {
          progress.clear();
          std::printf("  %-12s %7lld %8lld %9lld %12s %9.3f %12s %8lld\n", name.c_str(), (long long)s.units,
                      (long long)s.rows, (long long)s.segments, format_bytes(double(s.kv_bytes)).c_str(),
                      kv_over_floor(s.kv_bytes, s.unique_kv_bytes), format_bytes(double(s.partial_bytes)).c_str(),
                      (long long)s.padded_rows);
          std::fflush(stdout);
        }
      }
    }
    progress.clear();
    if (o->json) std::printf("%s\n", records.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  });
}

}  // namespace treeattn::cli
