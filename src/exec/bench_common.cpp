// The parts of bench.hpp that need no GPU: the commit a report names, and in a
// build without CUDA the GPU entry points (no GPU, nothing to time). The CUDA
// build implements those in src/exec/cuda/bench.cu.
#include <cstdio>
#include <cstdlib>

#include "treeattn/bench.hpp"

namespace treeattn {

std::string current_commit(const std::string& source_dir) {
  if (const char* env = std::getenv("TREEATTN_COMMIT"); env && *env) return env;
  std::string out;
  if (FILE* f = popen(("git -C '" + source_dir + "' rev-parse --short=12 HEAD 2>/dev/null").c_str(), "r")) {
    char buf[128];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

#if !defined(TREEATTN_HAVE_CUDA)
bool gpu_available() { return false; }
std::string gpu_device_name() { return ""; }
int gpu_sm_count() { return 0; }
double measure_hbm_bandwidth_gbps() { return 0; }
double measure_tensor_core_tflops(DType) { return 0; }

struct GpuBench::Impl {};
GpuBench::GpuBench(const Workload&, uint64_t) { throw Error("bench: this treeattn was built without CUDA"); }
GpuBench::~GpuBench() = default;
GpuTiming GpuBench::time(const Plan&, const BenchOptions&) { return {}; }

std::optional<GpuTiming> time_plan_on_gpu(const Workload&, const Plan&, const BenchOptions&) { return std::nullopt; }
#endif

}  // namespace treeattn
