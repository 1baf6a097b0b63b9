// `treeattn calibrate`: measures FlashForge's cost table C(rows, kv) on this
// GPU -- the time of one unit (one CTA per kv head) with `rows` Q rows over
// `kv` KV tokens while the GPU is full of identical units -- and writes it in
// the treeattn-forge-cost/1 format that `forge` reads (--forge-table).
#include <cstdio>
#include <fstream>

#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "treeattn/bench.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn::cli {

namespace {

// `units` roots of `kv` tokens, each with `queries` queries attached, and the
// plan that gives every root exactly one unit (no split, no merge).
std::pair<Workload, Plan> identical_units(int units, int kv, int queries, const WorkloadParams& p) {
  Workload w;
  w.name = "calibrate:units=" + std::to_string(units) + ":kv=" + std::to_string(kv) + ":queries=" + std::to_string(queries);
  w.heads = p.heads;
  w.layout.page_size = p.page_size;
  w.layout.dtype = p.dtype;
  PageAllocator pages(p.page_size, p.seed);
  for (int u = 0; u < units; ++u) {
    const int32_t root = pages.add_node(w.tree, -1, kv);
    for (int q = 0; q < queries; ++q) w.query_nodes.push_back(root);
  }
  w.layout.num_pages = std::max<int64_t>(1, pages.finish(w.tree));  // kv = 0: an unused page keeps the pools non-null
  w.validate();
  PlanBuilder b(w, "calibrate");
  for (int u = 0; u < units; ++u) {
    b.begin_unit();
    if (kv > 0) b.add_segment(u, 0, kv);
    for (int q = 0; q < queries; ++q) b.add_query(u * queries + q);
    b.end_unit();
  }
  return {std::move(w), b.finish()};
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate", "measure the forge cost table C(rows, kv) on this GPU");
  auto o = std::make_shared<CommonOptions>();
  add_common_options(cmd, *o);
  auto out = std::make_shared<std::string>();
  auto waves = std::make_shared<int>(2);
  cmd->add_option("--out", *out, "output file (default: print the table)");
  cmd->add_option("--waves", *waves, "full waves of identical units per measurement")->capture_default_str();
  cmd->callback([o, out, waves] {
    if (!gpu_available()) throw Error("calibrate: no CUDA device (or treeattn was built without CUDA)");
    if (*waves < 1 || *waves > 64) throw Error("waves: " + std::to_string(*waves) + " is out of range [1, 64]");
    const WorkloadParams p = workload_params(*o);
    const PlanOptions opt = plan_options(*o);
    const int g = p.heads.group_size();
    const int slots = opt.num_sms * opt.ctas_per_sm;  // the planner's model of resident CTAs
    const int units = std::max(1, *waves * slots / p.heads.num_kv_heads);

    ForgeCostTable t;
    t.device = gpu_device_name();
    t.source = "measured";
    t.head_dim = p.heads.head_dim;
    t.dtype = p.dtype;
    for (int rows : {1, 16, 32, 64, 128})
      if (rows >= g && rows % g == 0) t.q_rows.push_back(rows);
    if (t.q_rows.empty() || t.q_rows.front() != g) t.q_rows.insert(t.q_rows.begin(), g);
    t.kv_tokens = {0, 16, 64, 256, 1024, 4096, 16384};
    BenchOptions b;
    b.verify_queries = 0;
    b.graph = false;
    b.seed = o->seed;
    std::printf("calibrate on %s: heads %d/%d, d=%d, %s, %d units x %d kv heads per point (%d waves of %d CTAs)\n",
                t.device.c_str(), p.heads.num_qo_heads, p.heads.num_kv_heads, p.heads.head_dim,
                std::string(to_string(p.dtype)).c_str(), units, p.heads.num_kv_heads, *waves, slots);
    std::printf("%8s", "rows\\kv");
    for (double kv : t.kv_tokens) std::printf(" %9.0f", kv);
    std::printf("   (us per unit)\n");
    for (double rows : t.q_rows) {
      std::printf("%8.0f", rows);
      for (double kv : t.kv_tokens) {
        auto [w, plan] = identical_units(units, int(kv), int(rows) / g, p);
        GpuBench gpu(w, o->seed);
        const GpuTiming timing = gpu.time(plan, b);
        const double per_unit = timing.us * slots / (double(units) * p.heads.num_kv_heads);
        t.cost_us.push_back(per_unit);
        std::printf(" %9.2f", per_unit);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
    t.note = "Measured by `treeattn calibrate --heads " + o->heads + " --head-dim " + std::to_string(p.heads.head_dim) +
             " --dtype " + o->dtype + "` at commit " + current_commit(TREEATTN_SOURCE_DIR) +
             ": median kernel time of " + std::to_string(*waves) + " full waves of identical units (L2 flushed), times " +
             std::to_string(slots) + " resident CTA slots / CTAs launched.";
    t.validate();
    if (out->empty()) {
      std::printf("%s\n", to_json(t).c_str());
    } else {
      std::ofstream(*out) << to_json(t) << "\n";
      std::printf("wrote %s\n", out->c_str());
    }
  });
}

}  // namespace treeattn::cli
