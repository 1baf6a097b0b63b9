// Prints the markdown table of docs/planners.md: for the 15 FastTree and 20
// PAT kernel-benchmark configs at heads 32/8 (d = 128, fp16, page 16), the KV
// bytes every registered planner's plan loads divided by the unique-KV floor
// (1.00 = every token once), plus the unit count. Every plan is validated.
//   treeattn_kv_table [heads, default 32/8]
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

int main(int argc, char** argv) {
  const std::vector<std::string> fasttree = {
      "1,2,64;8,256,32", "1,4,256;8,256,32", "1,4,8,256;8,256,256,32", "1,256;256,32", "1,1024;2048,32",
      "1,16,64;1024,256,32", "1,4,16,512;1024,256,128,32", "1,4,16,64,256,1024;256,8,256,64,32,256", "1,10;4000,400",
      "1,2,4,8,16,32,64,128,1024;16,16,16,16,16,16,16,16,16", "1,2,4,8,16,32,64,128,1024;256,128,64,16,16,16,16,16,16",
      "1,8,16,32,64,128,1024;256,128,64,16,16,16,16", "1,8,16,32,64,256,1024;256,128,64,16,16,16,16",
      "1,16,32,64,128,1024;256,128,64,16,16,16", "1,16,32,64,256,1024;256,128,64,16,16,16"};
  const std::vector<std::string> pat = {
      "1,10_4096,416", "1,256_256,32", "1,1024_2048,32", "1,2,64_1024,256,256", "1,4,256_32,256,32",
      "1,8,512_32,512,256", "1,8,512_32,2048,256", "1,8,512_512,512,256", "1,4,8,256_32,256,256,32",
      "1,4,16,512_1024,256,128,32", "1,4,16,64,256,1024_256,32,256,64,32,256", "1,16,32,64,128,1024_256,128,64,32,32,32",
      "1,16,32,64,256,1024_256,128,64,32,32,32", "1,8,16,32,64,128,1024_256,128,64,32,32,32,32",
      "1,8,16,32,64,256,1024_256,128,64,32,32,32,32", "2,8,16,256_256,256,32,32", "4,16,256,512_512,32,128,32",
      "8,16,32,256_512,512,256,32", "256_1024", "256_4096"};

  WorkloadParams wp;
  wp.heads = parse_heads(argc > 1 ? argv[1] : "32/8", 128);
  wp.page_size = 16;
  wp.dtype = DType::fp16;
  std::vector<std::pair<std::string, std::string>> specs;  // (label, spec)
  for (const std::string& c : fasttree) {
    const size_t k = c.find(';');
    specs.push_back({"FT " + c, "fasttree:N=" + c.substr(0, k) + ":C=" + c.substr(k + 1)});
  }
  for (const std::string& c : pat) {
    const size_t k = c.find('_');
    specs.push_back({"PAT " + c, "pat:B=" + c.substr(0, k) + ":L=" + c.substr(k + 1)});
  }

  std::printf("| config (heads %d/%d) |", wp.heads.num_qo_heads, wp.heads.num_kv_heads);
  for (const PlannerInfo& p : planners()) std::printf(" %s |", p.name.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < planners().size(); ++i) std::printf("---:|");
  std::printf("\n");
  std::map<std::string, double> log_sum;
  for (const auto& [label, spec] : specs) {
    const Workload w = make_workload(spec, wp);
    std::printf("| %s |", label.c_str());
    for (const PlannerInfo& info : planners()) {
      const Plan p = info.fn(w, PlanOptions{});
      validate_plan(w, p);
      const PlanSummary s = summarize(w, p);
      const double ratio = double(s.kv_bytes) / double(s.unique_kv_bytes);
      log_sum[info.name] += std::log(ratio);
      std::printf(" %.2f (%lld) |", ratio, (long long)s.units);
    }
    std::printf("\n");
  }
  std::printf("| **geomean** |");
  for (const PlannerInfo& p : planners()) std::printf(" **%.2f** |", std::exp(log_sum[p.name] / double(specs.size())));
  std::printf("\n");
  return 0;
}
