// Subcommands of the `treeattn` tool; each adds itself to the app.
#pragma once

#include <CLI/CLI.hpp>

namespace treeattn::cli {

void add_workloads_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_bench_command(CLI::App& app);  // cmd_bench.cpp (GPU timing)
void add_calibrate_command(CLI::App& app);

}  // namespace treeattn::cli
