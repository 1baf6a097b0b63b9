// `treeattn`: plan, verify, benchmark and demo prefix-aware tree attention.
// Every bad input ends with a message naming the problem and exit code 2.
#include <cstdio>
#include <new>

#include "cli/commands.hpp"
#include "treeattn/types.hpp"

int main(int argc, char** argv) {
  CLI::App app{"treeattn: prefix-aware attention for tree-structured LLM decoding"};
  app.require_subcommand(1);
  app.fallthrough(false);
  treeattn::cli::add_workloads_command(app);
  treeattn::cli::add_plan_command(app);
  treeattn::cli::add_verify_command(app);
  treeattn::cli::add_demo_command(app);
  treeattn::cli::add_bench_command(app);
  treeattn::cli::add_calibrate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // a command's own exit code (verify: 1)
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const treeattn::Error& e) {
    std::fprintf(stderr, "treeattn: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // Past what the memory checks foresee (they read MemAvailable, not a
    // ulimit or cgroup limit; planners' own arrays are not estimated).
    std::fprintf(stderr, "treeattn: error: out of host memory (std::bad_alloc): the workload is too large for this "
                         "machine or its memory limit\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "treeattn: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
