// `treeattn workloads`: the workload families and their spec syntax.
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/common.hpp"

namespace treeattn::cli {

void add_workloads_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("workloads", "list workload families (spec syntax) and planners");
  cmd->callback([] {
    std::printf("Workload families (use with --workload SPEC):\n");
    for (const WorkloadFamily& f : workload_families())
      std::printf("  %-52s %s\n", f.syntax.c_str(), f.description.c_str());
    std::printf("\nPlanners (use with --planner NAME, or all; default auto):\n");
    for (const PlannerInfo& p : planners()) std::printf("  %-12s %s\n", p.name.c_str(), p.description.c_str());
  });
}

}  // namespace treeattn::cli
