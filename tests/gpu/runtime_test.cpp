// GPU tests of the engine-facing runtime: TreeAttention / CudaStepExecutor
// against the fp64 reference on random trees and the suites' families (every
// planner, GQA 1-16 (7 and 5 too), fp16/bf16, page sizes 1, 5, 16 and 100, strided pools, pages
// with NaN rows between them, lse);
// draft token trees; and one CUDA graph of several runs captured once and
// replayed after re-planning with other trees, each replay bit-equal to an
// eager run (also with the plan kept in L2). Tests named Sanitize* run under
// compute-sanitizer.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "treeattn/cuda_executor.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "tests/support/tree_arrays.hpp"
#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

using test_support::Arrays;

TreeAttentionConfig config_for(const Workload& w, const std::string& planner, int64_t num_pages) {
  TreeAttentionConfig c;
  c.heads = w.heads;
  c.dtype = w.layout.dtype;
  c.kv_dtype = w.layout.kv_dtype;
  c.page_size = w.layout.page_size;
  c.num_pages = num_pages;
  c.device = Device::cuda;
  c.max_queries = 2048;
  c.max_nodes = 8192;
  c.max_page_refs = 1 << 20;
  c.planner = planner;
  return c;
}

// Runs w (inputs h, reference ref) through a TreeAttention planned from its
// arrays, output poisoned; returns the relative error against ref.
double runtime_error(const Workload& w, const std::string& planner, const HostTensors& h, DeviceTensors& d,
                     const std::vector<double>& ref) {
  TreeAttention ta(config_for(w, planner, w.layout.num_pages));
  const Arrays arr(w);
  ta.plan_tree(arr.view(), nullptr);
  d.poison_out();
  ta.run(d.args(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "runtime run");
  HostTensors g = h;
  d.download_out(g);
  return relative_error(w, g.out.data(), ref);
}

double tolerance(DType t) { return t == DType::bf16 ? 1e-2 : 2e-3; }

// The lse a GPU run wrote into dlse against the CPU executor's on the same
// plan and inputs (which the CPU tests check against fp64).
void expect_lse_of_cpu_executor(const Workload& w, const Plan& p, const HostTensors& h, const DeviceBuffer& dlse,
                                const std::string& what) {
  const size_t n = size_t(w.num_queries()) * w.heads.num_qo_heads;
  std::vector<float> lse(n), cpu_lse(n);
  check_cuda(cudaMemcpy(lse.data(), dlse.get(), n * 4, cudaMemcpyDeviceToHost), "lse");
  HostTensors c = h;
  AttentionArgs ca = c.args();
  ca.lse = cpu_lse.data();
  run_cpu(w, p, ca);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(lse[i], cpu_lse[i], 1e-3) << what << " lse " << i;
}

TEST(Runtime, EveryPlannerRandomTreesAndFamilies) {
  std::vector<std::string> specs = {"fasttree:N=1,4,16:C=256,64,32", "pat:B=1,8,64:L=512,128,32",
                                    "fewshot:prompt=1000:branches=16:len=64", "pat:B=64:L=300"};
  for (int s = 0; s < 3; ++s) specs.push_back("random:seed=" + std::to_string(11 + s));
  for (const auto& [qo, kv, d, t, page] : std::vector<std::tuple<int, int, int, DType, int>>{
           {32, 8, 128, DType::fp16, 16}, {16, 1, 128, DType::bf16, 16}, {8, 8, 64, DType::fp16, 1},
           {16, 4, 256, DType::bf16, 16},
           // Group sizes and pages that are not powers of two (Qwen2.5-7B's 28/4; 40/8): the
           // kernels divide by both with cuda::Divisor.
           {28, 4, 128, DType::bf16, 5}, {40, 8, 64, DType::fp16, 100}}) {
    WorkloadParams p;
    p.heads = {qo, kv, d};
    p.dtype = t;
    p.page_size = page;
    for (const std::string& spec : specs) {
      const Workload w = make_workload(spec, p);
      HostTensors h = make_random_inputs(w, 3);
      const std::vector<double> ref = reference_attention(w, h.args());
      DeviceTensors dev = DeviceTensors::upload(h);
      for (const PlannerInfo& pl : planners()) {
        const double e = runtime_error(w, pl.name, h, dev, ref);
        EXPECT_LE(e, tolerance(t)) << spec << " planner " << pl.name << " heads " << qo << "/" << kv << " d" << d;
      }
    }
  }
}

// q sliced from a fused QKV (query stride > H * D), pools as views of a
// [pages, 2, page_size, Hkv, D] K/V-interleaved cache, and lse requested.
TEST(Runtime, SanitizeStridedTensorsAndLse) {
  WorkloadParams p;
  p.heads = {16, 4, 128};
  p.page_size = 16;
  const Workload w = make_workload("fasttree:N=1,4,16:C=200,40,20", p);
  const int H = 16, Hkv = 4, D = 128, ps = 16;
  const int64_t pages = w.layout.num_pages, Q = w.num_queries();
  HostTensors h = make_random_inputs(w, 5);
  const std::vector<double> ref = reference_attention(w, h.args());
  // Strided host copies: q rows (H + 2 Hkv) * D apart, K/V interleaved per page.
  const int64_t qs = int64_t(H + 2 * Hkv) * D, tok = int64_t(Hkv) * D, page_stride = 2 * ps * tok;
  std::vector<uint16_t> q(Q * qs), kv(pages * page_stride);
  const auto* q16 = reinterpret_cast<const uint16_t*>(h.q.data());
  const auto* k16 = reinterpret_cast<const uint16_t*>(h.k.data());
  const auto* v16 = reinterpret_cast<const uint16_t*>(h.v.data());
  for (int64_t i = 0; i < Q; ++i) std::copy(q16 + i * H * D, q16 + (i + 1) * H * D, q.begin() + i * qs);
  for (int64_t pg = 0; pg < pages; ++pg) {
    std::copy(k16 + pg * ps * tok, k16 + (pg + 1) * ps * tok, kv.begin() + pg * page_stride);
    std::copy(v16 + pg * ps * tok, v16 + (pg + 1) * ps * tok, kv.begin() + pg * page_stride + ps * tok);
  }
  DeviceBuffer dq(q.size() * 2), dkv(kv.size() * 2), dout(h.out.size()), dlse(size_t(Q) * H * 4);
  check_cuda(cudaMemcpy(dq.get(), q.data(), q.size() * 2, cudaMemcpyHostToDevice), "q");
  check_cuda(cudaMemcpy(dkv.get(), kv.data(), kv.size() * 2, cudaMemcpyHostToDevice), "kv");
  for (const char* planner : {"node", "per-query"}) {
    TreeAttention ta(config_for(w, planner, pages));
    const Arrays arr(w);
    ta.plan_tree(arr.view(), nullptr);
    AttentionArgs a;
    a.q = dq.get();
    a.k = dkv.get();
    a.v = dkv.as<uint16_t>() + ps * tok;
    a.out = dout.get();
    a.lse = dlse.as<float>();
    a.q_stride = qs;
    a.kv_token_stride = tok;
    a.kv_page_stride = page_stride;
    check_cuda(cudaMemset(dout.get(), 0xff, dout.size()), "poison");
    ta.run(a, nullptr);
    check_cuda(cudaDeviceSynchronize(), "run");
    HostTensors g = h;
    check_cuda(cudaMemcpy(g.out.data(), dout.get(), dout.size(), cudaMemcpyDeviceToHost), "out");
    EXPECT_LE(relative_error(w, g.out.data(), ref), 2e-3) << planner;
    expect_lse_of_cpu_executor(w, ta.plan(), h, dlse, planner);
  }
}

// Pools whose pages are rows_per_page = page_size + 8 rows apart, the 8 rows
// between pages NaN, so that a K/V row read from a wrong row or past its page
// poisons the output: page sizes 16, 32 and 64, head_dim 64, 128 and 256,
// long shared nodes (64- and 128-row units, whole-page tiles and a partial
// last one), node, auto and per-query. (A K/V copy by TMA boxes of a page's
// rows was tried against these: docs/cuda.md, "Tried".)
TEST(Runtime, SanitizePagesWithGapsBetweenThem) {
  for (const auto& [qo, kv, d, t, ps] : std::vector<std::tuple<int, int, int, DType, int>>{
           {32, 8, 128, DType::fp16, 16}, {16, 4, 64, DType::bf16, 32}, {16, 8, 256, DType::fp16, 64}}) {
    WorkloadParams p;
    p.heads = {qo, kv, d};
    p.dtype = t;
    p.page_size = ps;
    for (const char* spec : {"fasttree:N=1,32:C=1000,24", "pat:B=1,16,64:L=700,136,8"}) {
      const Workload w = make_workload(spec, p);
      const int64_t pages = w.layout.num_pages, tok = int64_t(kv) * d, rows_per_page = ps + 8;
      HostTensors h = make_random_inputs(w, 9);
      const std::vector<double> ref = reference_attention(w, h.args());
      const uint16_t nan16 = t == DType::bf16 ? 0x7fc0 : 0x7e00;
      std::vector<uint16_t> k(size_t(pages * rows_per_page * tok), nan16), v = k;
      const auto* k16 = reinterpret_cast<const uint16_t*>(h.k.data());
      const auto* v16 = reinterpret_cast<const uint16_t*>(h.v.data());
      for (int64_t pg = 0; pg < pages; ++pg) {
        std::copy(k16 + pg * ps * tok, k16 + (pg + 1) * ps * tok, k.begin() + pg * rows_per_page * tok);
        std::copy(v16 + pg * ps * tok, v16 + (pg + 1) * ps * tok, v.begin() + pg * rows_per_page * tok);
      }
      DeviceTensors dev = DeviceTensors::upload(h);
      DeviceBuffer dk(k.size() * 2), dv(v.size() * 2);
      check_cuda(cudaMemcpy(dk.get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice), "k");
      check_cuda(cudaMemcpy(dv.get(), v.data(), v.size() * 2, cudaMemcpyHostToDevice), "v");
      for (const char* planner : {"node", "auto", "per-query"}) {
        TreeAttention ta(config_for(w, planner, pages));
        const Arrays arr(w);
        ta.plan_tree(arr.view(), nullptr);
        AttentionArgs a = dev.args();
        a.k = dk.get();
        a.v = dv.get();
        a.kv_token_stride = tok;
        a.kv_page_stride = rows_per_page * tok;
        dev.poison_out();
        ta.run(a, nullptr);
        check_cuda(cudaDeviceSynchronize(), "run");
        HostTensors g = h;
        dev.download_out(g);
        EXPECT_LE(relative_error(w, g.out.data(), ref), tolerance(t))
            << spec << " " << planner << " heads " << qo << "/" << kv << " d" << d << " page " << ps;
      }
    }
  }
}

// fp8 K/V pools (e4m3, per-tensor scales other than 1) through the runtime:
// K and V interleaved per page (strided views into one cache), q strided,
// lse requested; every planner's output and lse against the fp64 reference
// over the dequantised pools and the CPU executor. A 16-bit pool's stride
// rules (multiples of 8 elements) would accept a token stride of 8 fp8
// elements; the fp8 kernels copy 16 at once, so that one is refused.
TEST(Runtime, SanitizeFp8KvStridedPoolsAndScales) {
  for (DType t : {DType::fp16, DType::bf16}) {
    WorkloadParams p;
    p.heads = {16, 4, 128};
    p.page_size = 16;
    p.dtype = t;
    p.kv_dtype = DType::fp8_e4m3;
    const Workload w = make_workload("fasttree:N=1,4,16:C=200,40,20", p);
    const int H = 16, Hkv = 4, D = 128, ps = 16;
    const int64_t pages = w.layout.num_pages, Q = w.num_queries();
    HostTensors h = make_random_inputs(w, 7);
    ASSERT_NE(h.k_scale, 1.f);
    const std::vector<double> ref = reference_attention(w, h.args());
    const int64_t tok = int64_t(Hkv) * D, page_stride = 2 * ps * tok;  // elements = bytes
    std::vector<uint8_t> kv(size_t(pages * page_stride));
    for (int64_t pg = 0; pg < pages; ++pg) {
      std::copy(h.k.begin() + pg * ps * tok, h.k.begin() + (pg + 1) * ps * tok, kv.begin() + pg * page_stride);
      std::copy(h.v.begin() + pg * ps * tok, h.v.begin() + (pg + 1) * ps * tok, kv.begin() + pg * page_stride + ps * tok);
    }
    DeviceTensors d = DeviceTensors::upload(h);
    DeviceBuffer dkv(kv.size()), dlse(size_t(Q) * H * 4);
    check_cuda(cudaMemcpy(dkv.get(), kv.data(), kv.size(), cudaMemcpyHostToDevice), "kv");
    for (const PlannerInfo& pl : planners()) {
      TreeAttention ta(config_for(w, pl.name, pages));
      const Arrays arr(w);
      ta.plan_tree(arr.view(), nullptr);
      AttentionArgs a = d.args();
      a.k = dkv.get();
      a.v = dkv.as<uint8_t>() + ps * tok;
      a.lse = dlse.as<float>();
      a.kv_token_stride = tok;
      a.kv_page_stride = page_stride;
      d.poison_out();
      ta.run(a, nullptr);
      check_cuda(cudaDeviceSynchronize(), "run");
      HostTensors g = h;
      d.download_out(g);
      const std::string what = pl.name + " " + std::string(to_string(t));
      EXPECT_LE(relative_error(w, g.out.data(), ref), tolerance(t)) << what;
      expect_lse_of_cpu_executor(w, ta.plan(), h, dlse, what);
      if (pl.name == "auto") {
        AttentionArgs bad = a;
        bad.kv_token_stride = tok + 8;
        EXPECT_THROW(ta.run(bad, nullptr), Error);
        bad = a;
        bad.v_scale = 0.f;
        EXPECT_THROW(ta.run(bad, nullptr), Error);
        // Strides whose products pass int64 are refused, not wrapped: a
        // page of huge token rows, a huge page of rows, huge token rows.
        const int64_t huge = std::numeric_limits<int64_t>::max() / 32 * 16;  // a multiple of every 16-byte copy
        for (const auto& [token, page] : {std::pair{huge, int64_t(0)}, std::pair{tok, huge / tok * tok},
                                          std::pair{huge / 256 * 16, huge / 256 * 16 * ps}}) {
          bad = a;
          bad.kv_token_stride = token;
          bad.kv_page_stride = page;
          EXPECT_THROW(ta.run(bad, nullptr), Error) << token << " " << page;
        }
      }
    }
  }
}

// Draft token trees: each request's drafts are one-token nodes in its own
// pages after its tokens (Node::first_slot), planned as tree queries.
TEST(Runtime, SanitizeDraftTokenTrees) {
  WorkloadParams p;
  p.heads = {32, 8, 128};
  p.page_size = 16;
  const Workload base = make_workload("fewshot:prompt=700:branches=4:len=21", p);
  Workload w = base;
  std::vector<int32_t> dn, dp;
  std::vector<int64_t> rows;
  std::mt19937 rng(9);
  int64_t next_page = w.layout.num_pages;
  for (int32_t qn : base.query_nodes) {
    const Node& leaf = base.tree.nodes[qn];
    const int64_t first = int64_t(leaf.pages.back()) * 16 + leaf.num_tokens % 16;  // after the leaf's tokens
    const int first_draft = int(dn.size());
    for (int i = 0; i < 40; ++i) {
      dn.push_back(qn);
      dp.push_back(i == 0 ? -1 : first_draft + int(rng() % i));
      dp.back() = dp.back() < 0 ? -1 : dp.back();
      const int64_t r = first + i;
      rows.push_back(r < int64_t(leaf.pages.back() + 1) * 16 ? r : (next_page + (r - first) / 16) * 16 + r % 16);
    }
    next_page += 4;
  }
  const int64_t pool = next_page + 4;
  TreeAttentionConfig c = config_for(base, "auto", pool);
  TreeAttention ta(c);
  const Arrays arr(base);
  ta.plan_tree_queries(arr.view(), {dn, dp, rows}, nullptr);
  const Workload& planned = ta.workload();
  ASSERT_EQ(planned.num_queries(), base.num_queries() + int32_t(dn.size()));
  HostTensors h = make_random_inputs(planned, 4);
  const std::vector<double> ref = reference_attention(planned, h.args());
  DeviceTensors d = DeviceTensors::upload(h);
  d.poison_out();
  ta.run(d.args(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "draft run");
  HostTensors g = h;
  d.download_out(g);
  EXPECT_LE(relative_error(planned, g.out.data(), ref), 2e-3);
}

// One graph of 4 runs (4 "layers") captured once; re-planned `num_steps`
// times with growing and changing trees between replays; every replay
// bit-equal to an eager run of the same plan, and within tolerance of the
// reference.
void graph_survives_replanning(int num_steps, bool l2_persistent_plan = false) {
  WorkloadParams p;
  p.heads = {32, 8, 128};
  p.page_size = 16;
  p.dtype = DType::bf16;
  const int layers = 4;
  std::vector<Workload> steps;
  for (int s = 0; s < num_steps; ++s) {
    const std::string spec = s % 3 == 0   ? "fewshot:prompt=" + std::to_string(500 + 37 * s) + ":branches=" + std::to_string(8 + s) + ":len=" + std::to_string(5 + s)
                             : s % 3 == 1 ? "random:seed=" + std::to_string(100 + s)
                                          : "pat:B=" + std::to_string(16 + s) + ":L=" + std::to_string(64 + 9 * s);
    steps.push_back(make_workload(spec, p));
  }
  int64_t pool = 0;
  int32_t max_q = 0;
  for (const Workload& w : steps) pool = std::max(pool, w.layout.num_pages), max_q = std::max(max_q, w.num_queries());
  TreeAttentionConfig c = config_for(steps[0], "auto", pool);
  c.l2_persistent_plan = l2_persistent_plan;
  TreeAttention ta(c);
  // Inputs sized for the largest step; every step's tensors are views of them.
  Workload big = steps[0];
  big.layout.num_pages = pool;
  big.query_nodes.assign(max_q, 0);
  HostTensors h = make_random_inputs(big, 6);
  DeviceTensors d = DeviceTensors::upload(h);
  std::vector<DeviceBuffer> outs, eager;
  for (int l = 0; l < layers; ++l) outs.emplace_back(h.out.size()), eager.emplace_back(h.out.size());
  cudaStream_t st;
  check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  auto args = [&](void* out) {
    AttentionArgs a = d.args();
    a.out = out;
    return a;
  };
  ta.plan_tree(Arrays(steps[0]).view(), st);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
  for (int l = 0; l < layers; ++l) ta.run(args(outs[l].get()), st);
  check_cuda(cudaStreamEndCapture(st, &graph), "end capture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (size_t s = 0; s < steps.size(); ++s) {
    const Workload& w = steps[s];
    ta.plan_tree(Arrays(w).view(), st);
    for (auto& o : outs) check_cuda(cudaMemsetAsync(o.get(), 0xff, o.size(), st), "poison");
    check_cuda(cudaGraphLaunch(exec, st), "replay");
    for (int l = 0; l < layers; ++l) ta.run(args(eager[l].get()), st);
    check_cuda(cudaStreamSynchronize(st), "sync");
    const size_t bytes = size_t(w.num_queries()) * w.heads.num_qo_heads * w.heads.head_dim * 2;
    std::vector<uint8_t> a(bytes), b(bytes);
    for (int l = 0; l < layers; ++l) {
      check_cuda(cudaMemcpy(a.data(), outs[l].get(), bytes, cudaMemcpyDeviceToHost), "replayed");
      check_cuda(cudaMemcpy(b.data(), eager[l].get(), bytes, cudaMemcpyDeviceToHost), "eager");
      ASSERT_EQ(a, b) << "step " << s << " layer " << l << ": replay differs from eager";
    }
    HostTensors hw = make_random_inputs(w, 1);  // only for its shapes
    hw.q.assign(h.q.begin(), h.q.begin() + hw.q.size());
    hw.k = h.k;
    hw.v = h.v;
    Workload wp = w;
    wp.layout.num_pages = pool;
    const std::vector<double> ref = reference_attention(wp, hw.args());
    EXPECT_LE(relative_error(wp, a.data(), ref), 1e-2) << "step " << s;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

TEST(Runtime, GraphSurvivesReplanning) { graph_survives_replanning(30); }
TEST(Runtime, SanitizeGraphSurvivesReplanning) { graph_survives_replanning(4); }
// The same with the plan buffer under an L2 persisting window, which the
// captured launches carry as a launch attribute.
TEST(Runtime, GraphSurvivesReplanningWithPlanInL2) { graph_survives_replanning(9, /*l2_persistent_plan=*/true); }

// Workloads (spec, planner) of the step-executor tests below, at heads p,
// and the pool that holds the largest of them.
struct PlannedCase {
  std::string spec, planner;
};
struct PlannedCases {
  std::vector<Workload> workloads;
  KvLayout layout;  // the first workload's, with the largest pool
  int32_t max_queries = 0;
};
PlannedCases workloads_of(const std::vector<PlannedCase>& cases, const WorkloadParams& p) {
  PlannedCases c;
  int64_t pool = 0;
  for (const PlannedCase& pc : cases) {
    c.workloads.push_back(make_workload(pc.spec, p));
    pool = std::max(pool, c.workloads.back().layout.num_pages);
    c.max_queries = std::max(c.max_queries, c.workloads.back().num_queries());
  }
  for (Workload& w : c.workloads) w.layout.num_pages = pool;
  c.layout = c.workloads[0].layout;
  return c;
}

// Eager runs launch only the grids the plan in force uses
// (CudaStepOptions::skip_unused_launches): over plans that use one tile or
// several, with merges and without, fewer items than a wave of CTAs or more,
// in turn on one executor (so that a run without merges, which counts
// no CTA, comes between runs with them), the
// output is bit-equal to an executor that launches every grid, and within
// tolerance of the reference; the number of launches is the plan's tiles
// plus a merge where it has merges.
TEST(Runtime, SanitizeEagerRunsLaunchOnlyWhatThePlanUses) {
  WorkloadParams p;
  p.heads = {32, 8, 128};
  p.page_size = 16;
  const std::vector<PlannedCase> cases = {{"fasttree:N=1,4,16:C=256,64,32", "node"},
                                   {"pat:B=12:L=40", "per-query"},  // one short path per query: m16, no merge
                                   {"fewshot:prompt=600:branches=8:len=20", "auto"},
                                   {"random:seed=5", "per-query"},
                                   {"fasttree:N=1,2,64:C=8,256,32", "auto"},
                                   // 200 units x 8 kv heads: more items than a wave, claimed in turn
                                   {"pat:B=1,200:L=40,40", "per-query"}};
  const PlannedCases pc = workloads_of(cases, p);
  const KvLayout& layout = pc.layout;
  CudaStepOptions all;
  all.skip_unused_launches = false;
  CudaStepExecutor skipping(p.heads, layout, StepCapacity{}), every(p.heads, layout, StepCapacity{}, all);
  int without_merges = 0, with_merges = 0, single_launch = 0;
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < cases.size(); ++i) {
      const Workload& w = pc.workloads[i];
      const Plan plan = make_plan(cases[i].planner, w, PlanOptions{});
      HostTensors h = make_random_inputs(w, 7 + i);
      DeviceTensors d = DeviceTensors::upload(h);
      skipping.set_plan(w, plan, nullptr);
      every.set_plan(w, plan, nullptr);
      // The default launches, one per m of the n = 64 tiles and the 128-row
      // tile's skip variant: a unit runs on the launch of its tile's m, a
      // masked one of 128 rows on the skip variant's.
      std::set<std::pair<int, bool>> used;
      for (int32_t u = 0; u < plan.num_units(); ++u) {
        const int m = kTileConfigs[plan.unit_tile[u]].m;
        used.insert({m, m == 128 && plan.unit_masked[u]});
      }
      const int expected = int(used.size()) + (plan.num_slots > 0 ? 1 : 0);
      EXPECT_EQ(skipping.num_eager_launches(), expected) << cases[i].spec;
      EXPECT_EQ(every.num_eager_launches(), every.num_launches() + 1) << cases[i].spec;
      (plan.num_slots > 0 ? with_merges : without_merges) += 1;
      single_launch += expected == 1 ? 1 : 0;
      d.poison_out();
      skipping.run(d.args(), nullptr);
      HostTensors a = h;
      d.download_out(a);
      d.poison_out();
      every.run(d.args(), nullptr);
      HostTensors b = h;
      d.download_out(b);
      ASSERT_EQ(a.out, b.out) << cases[i].spec << ": skipping unused launches changed the output";
      EXPECT_LE(relative_error(w, a.out.data(), reference_attention(w, h.args())), 2e-3) << cases[i].spec;
    }
  EXPECT_GT(without_merges, 0);
  EXPECT_GT(with_merges, 0);
  EXPECT_GT(single_launch, 0);
}

// Graphs captured under fewer launches (CudaStepExecutor::set_graph_launches):
// one graph of two runs per mask (eight of the sixteen over the four default
// launches, so that racecheck finishes: with launch 0 and without, one
// launch or several, contiguous or not), each replayed
// after every plan of cases that use one tile or several, with merges and
// without. A graph holds popcount(mask | 1) attention launches (launch 0
// always: last where the mask leaves it out) and the merge. Its output is
// bit-equal to an eager run where the mask holds the plan's launches but 0
// (each unit on its own tile), and within tolerance of the reference where
// it does not (units of a left-out launch run on the recorded one before it,
// of more rows).
TEST(Runtime, SanitizeGraphsOfFewerLaunchesRunAnyPlan) {
  WorkloadParams p;
  // Two KV heads of four query heads each: the units' rows, and so their
  // tiles, are those of 32/8; racecheck runs a quarter of the CTAs.
  p.heads = {8, 2, 128};
  p.page_size = 16;
  const std::vector<PlannedCase> cases = {{"fasttree:N=1,4,16:C=256,64,32", "node"},
                                   {"pat:B=12:L=40", "per-query"},
                                   {"fewshot:prompt=600:branches=8:len=20", "auto"},
                                   {"fasttree:N=1,2,64:C=8,256,32", "auto"},
                                   {"pat:B=1,200:L=40,40", "per-query"}};
  const PlannedCases pc = workloads_of(cases, p);
  const KvLayout& layout = pc.layout;
  const int32_t max_q = pc.max_queries;
  StepCapacity cap;
  cap.max_queries = max_q;
  CudaStepOptions four;  // the four plain launches (the skip variant's has a test of its own)
  four.skip_unseen = false;
  CudaStepExecutor ex(p.heads, layout, cap, four);
  ASSERT_EQ(ex.num_launches(), 4) << ex.describe();
  EXPECT_EQ(ex.graph_launches(), 15u);
  EXPECT_THROW(ex.set_graph_launches(16), Error);
  Workload big = pc.workloads[0];
  big.query_nodes.assign(size_t(max_q), 0);
  HostTensors h = make_random_inputs(big, 11);
  DeviceTensors d = DeviceTensors::upload(h);
  cudaStream_t st;
  check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  // A plan to capture under (the kernels read the plan in force when replayed).
  const Workload& w0 = pc.workloads[0];
  ex.set_plan(w0, make_plan(cases[0].planner, w0, PlanOptions{}), st);
  struct Captured {
    uint32_t mask;
    cudaGraphExec_t exec;
  };
  std::vector<Captured> graphs;
  for (const uint32_t mask : {0u, 1u, 6u, 8u, 9u, 10u, 13u, 15u}) {
    ex.set_graph_launches(mask);
    ASSERT_EQ(ex.graph_launches(), mask);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    for (int r = 0; r < 2; ++r) ex.run(d.args(), st);
    check_cuda(cudaStreamEndCapture(st, &graph), "end capture");
    size_t nodes = 0;
    check_cuda(cudaGraphGetNodes(graph, nullptr, &nodes), "graph nodes");
    EXPECT_EQ(nodes, size_t(2 * (std::popcount(mask | 1u) + 1))) << "mask " << mask;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaGraphDestroy(graph);
    graphs.push_back({mask, exec});
  }
  int covered = 0, left_out = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Workload& w = pc.workloads[i];
    const Plan plan = make_plan(cases[i].planner, w, PlanOptions{});
    ex.set_plan(w, plan, st);
    uint32_t uses = 0;  // launch i holds the tiles of m 128 >> i
    for (const uint8_t t : plan.unit_tile) uses |= 1u << std::countr_zero(unsigned(128 / kTileConfigs[t].m));
    EXPECT_EQ(ex.plan_launches(), uses) << cases[i].spec;
    HostTensors hw = make_random_inputs(w, 1);  // the step's shapes; its data are views of h's
    hw.q.assign(h.q.begin(), h.q.begin() + hw.q.size());
    hw.k = h.k;
    hw.v = h.v;
    const std::vector<double> ref = reference_attention(w, hw.args());
    const size_t bytes = hw.out.size();
    d.poison_out(st);
    ex.run(d.args(), st);
    check_cuda(cudaStreamSynchronize(st), "eager");
    std::vector<uint8_t> eager(bytes), replayed(bytes);
    check_cuda(cudaMemcpy(eager.data(), d.out.get(), bytes, cudaMemcpyDeviceToHost), "eager out");
    for (const Captured& g : graphs) {
      d.poison_out(st);
      check_cuda(cudaGraphLaunch(g.exec, st), "replay");
      check_cuda(cudaStreamSynchronize(st), "replay sync");
      check_cuda(cudaMemcpy(replayed.data(), d.out.get(), bytes, cudaMemcpyDeviceToHost), "replayed out");
      if ((uses & ~(g.mask | 1u)) == 0) {
        ++covered;
        ASSERT_EQ(replayed, eager) << cases[i].spec << ", mask " << g.mask << ": replay differs from eager";
      } else {
        ++left_out;
        HostTensors out = hw;
        std::memcpy(out.out.data(), replayed.data(), bytes);
        EXPECT_LE(relative_error(w, out.out.data(), ref), 2e-3) << cases[i].spec << ", mask " << g.mask;
      }
    }
  }
  EXPECT_GT(covered, 0);
  EXPECT_GT(left_out, 0);
  for (const Captured& g : graphs) cudaGraphExecDestroy(g.exec);
  cudaStreamDestroy(st);
}

// The 128-row tile's skip variant in the step executor
// (CudaStepOptions::skip_unseen): a launch right after the plain 128-row one
// runs the plan's masked units of that tile, the plain launch its unmasked
// ones. A tree planned as both (the root in unmasked 128-row units, each
// subtree one masked unit), and one without masked units, in turn: eager
// runs within tolerance of fp64 and bit-equal to an executor without the
// variant; plan_launches() names the skip launch only where the plan has
// masked 128-row units. A graph under the default mask (the skip launch left
// out: its units run on the plain launch) and one under every launch,
// replayed after each plan, bit-equal to the eager runs.
TEST(Runtime, SanitizeSkipLaunchRunsMaskedUnitsOfTheLargestTile) {
  WorkloadParams p;
  p.heads = {32, 8, 128};
  p.page_size = 16;
  const std::vector<PlannedCase> cases = {{"fasttree:N=1,2,64:C=512,300,24", "node"},
                                          {"fewshot:prompt=600:branches=32:len=20", "node"}};
  const PlannedCases pc = workloads_of(cases, p);
  PlanOptions opt;  // 128-row compact subtrees, however long
  opt.extra["flat_rows"] = 128;
  opt.extra["compact_stretch"] = 1000;
  StepCapacity cap;
  cap.max_queries = pc.max_queries;
  CudaStepOptions plain_loop;
  plain_loop.skip_unseen = false;
  CudaStepExecutor ex(p.heads, pc.layout, cap), plain(p.heads, pc.layout, cap, plain_loop);
  ASSERT_EQ(ex.num_launches(), 5) << ex.describe();
  ASSERT_EQ(plain.num_launches(), 4) << plain.describe();
  EXPECT_NE(ex.describe().find("m128 skip"), std::string::npos) << ex.describe();
  EXPECT_EQ(plain.describe().find("skip"), std::string::npos) << plain.describe();
  EXPECT_EQ(ex.graph_launches(), 0b11101u) << "the default graph leaves out the skip launch";
  const Workload& w0 = pc.workloads[0];
  Workload big = w0;
  big.query_nodes.assign(size_t(pc.max_queries), 0);
  HostTensors h = make_random_inputs(big, 13);
  DeviceTensors d = DeviceTensors::upload(h);
  cudaStream_t st;
  check_cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  ex.set_plan(w0, make_plan(cases[0].planner, w0, opt), st);
  std::vector<cudaGraphExec_t> graphs;  // the default mask, then every launch
  for (const uint32_t mask : {ex.graph_launches(), 0b11111u}) {
    ex.set_graph_launches(mask);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check_cuda(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    ex.run(d.args(), st);
    check_cuda(cudaStreamEndCapture(st, &graph), "end capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaGraphDestroy(graph);
    graphs.push_back(exec);
  }
  size_t bytes = 0;  // of the step's output
  auto output = [&](auto&& run) {
    d.poison_out(st);
    run();
    check_cuda(cudaStreamSynchronize(st), "skip launch run");
    std::vector<uint8_t> out(bytes);
    check_cuda(cudaMemcpy(out.data(), d.out.get(), bytes, cudaMemcpyDeviceToHost), "out");
    return out;
  };
  int with_skip = 0;
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < cases.size(); ++i) {
      const Workload& w = pc.workloads[i];
      const Plan plan = make_plan(cases[i].planner, w, opt);
      bool masked128 = false;
      for (int32_t u = 0; u < plan.num_units(); ++u)
        masked128 |= kTileConfigs[plan.unit_tile[u]].m == 128 && plan.unit_masked[u];
      with_skip += masked128;
      ex.set_plan(w, plan, st);
      plain.set_plan(w, plan, st);
      EXPECT_EQ((ex.plan_launches() >> 1) & 1u, masked128 ? 1u : 0u) << cases[i].spec;
      const uint32_t others = plain.plan_launches();  // the plain launches, launch 1 on: one place later in ex
      EXPECT_EQ(ex.plan_launches() & ~2u, (others & 1u) | (others & ~1u) << 1) << cases[i].spec;
      HostTensors hw = make_random_inputs(w, 1);  // the step's shapes; its data are views of h's
      hw.q.assign(h.q.begin(), h.q.begin() + hw.q.size());
      hw.k = h.k;
      hw.v = h.v;
      bytes = hw.out.size();
      const std::vector<uint8_t> eager = output([&] { ex.run(d.args(), st); });
      HostTensors got = hw;
      std::memcpy(got.out.data(), eager.data(), bytes);
      EXPECT_LE(relative_error(w, got.out.data(), reference_attention(w, hw.args())), tolerance(w.layout.dtype))
          << cases[i].spec;
      EXPECT_EQ(output([&] { plain.run(d.args(), st); }), eager) << cases[i].spec << ": the plain loop differs";
      for (size_t g = 0; g < graphs.size(); ++g)
        EXPECT_EQ(output([&] { check_cuda(cudaGraphLaunch(graphs[g], st), "replay"); }), eager)
            << cases[i].spec << ": graph " << g << " differs from the eager run";
    }
  EXPECT_EQ(with_skip, 2) << "one of the two trees has masked 128-row units";
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
  cudaStreamDestroy(st);
}

TEST(Runtime, CapacityErrorsNameTheCapacity) {
  WorkloadParams p;
  p.heads = {32, 8, 128};
  const Workload w = make_workload("fewshot:prompt=100:branches=16:len=8", p);
  TreeAttentionConfig c = config_for(w, "node", w.layout.num_pages);
  c.max_queries = 8;
  TreeAttention ta(c);
  try {
    ta.plan_tree(Arrays(w).view(), nullptr);
    FAIL() << "expected a capacity error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queries = 16 exceeds the capacity 8"), std::string::npos) << e.what();
  }
  c.max_queries = 64;
  c.max_units = 2;
  TreeAttention small(c);
  try {
    small.plan_tree(Arrays(w).view(), nullptr);
    FAIL() << "expected a unit-capacity error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_units"), std::string::npos) << e.what();
  }
  // The tree passed validation before its plan was refused: the page bits the
  // validation kept for plan extension are cleared, so a tree on the same
  // pages (an 8-token prompt and a 1-token branch on pages 0 and 1: one unit)
  // plans.
  const Workload one = make_workload("fewshot:prompt=8:branches=1:len=1", p);
  EXPECT_NO_THROW(small.plan_tree(Arrays(one).view(), nullptr));
  EXPECT_EQ(small.num_queries(), one.num_queries());
}

// set_plan's flat page table: the same output as the pages gathered from the
// workload's nodes, validated, trusted or as an extension of the last plan
// (whose entries stay on the device); a table of another shape is
// refused whatever the check, and one with another page id when validated
// (unless it says it is the source of the workload's pages), each naming the
// table and the node.
TEST(Runtime, SanitizeFlatPageTableOfSetPlan) {
  WorkloadParams p;
  p.heads = {8, 2, 128};
  p.page_size = 16;
  const Workload w = make_workload("fewshot:prompt=300:branches=12:len=40", p);
  const Plan plan = make_plan("node", w);
  const Arrays arr(w);
  StepCapacity cap;
  cap.max_queries = 64;
  cap.max_page_refs = 4096;
  CudaStepExecutor ex(w.heads, w.layout, cap);
  HostTensors h = make_random_inputs(w, 3);
  DeviceTensors d = DeviceTensors::upload(h);
  const std::vector<double> ref = reference_attention(w, h.args());
  const PageTableView flat{arr.page_ids, arr.page_offsets};
  for (const PlanCheck check : {PlanCheck::validate, PlanCheck::trusted, PlanCheck::extension})
    for (const PageTableView* table : {static_cast<const PageTableView*>(nullptr), &flat}) {
      ex.set_plan(w, plan, nullptr, check, table);
      d.poison_out();
      ex.run(d.args(), nullptr);
      check_cuda(cudaDeviceSynchronize(), "flat page table run");
      HostTensors g = h;
      d.download_out(g);
      EXPECT_LE(relative_error(w, g.out.data(), ref), tolerance(w.layout.dtype)) << (table ? "flat" : "gathered");
    }
  auto error_of = [&](const PageTableView& t, PlanCheck check) {
    try {
      ex.set_plan(w, plan, nullptr, check, &t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::vector<int32_t> short_offsets(arr.page_offsets.begin(), arr.page_offsets.end() - 1);
  EXPECT_NE(error_of({arr.page_ids, short_offsets}, PlanCheck::trusted).find("node offsets for"), std::string::npos);
  std::vector<int32_t> moved = arr.page_offsets;  // node 1 a page longer, node 2 a page shorter
  ++moved[2];
  EXPECT_NE(error_of({arr.page_ids, moved}, PlanCheck::trusted).find("node 1 differs"), std::string::npos);
  std::vector<int32_t> other = arr.page_ids;  // node 2's first page id changed
  int32_t& id = other[size_t(arr.page_offsets[2])];
  id = int32_t((id + 1) % w.layout.num_pages);
  EXPECT_NE(error_of({other, arr.page_offsets}, PlanCheck::validate).find("node 2 differs"), std::string::npos);
  // A table that says it is the source of w's pages is checked for its shape only.
  EXPECT_NE(error_of({arr.page_ids, moved, true}, PlanCheck::validate).find("node 1 differs"), std::string::npos);
  EXPECT_EQ(error_of({other, arr.page_offsets, true}, PlanCheck::validate), "no error");
  // An extension must keep the last plan's shape, and needs a last plan.
  const auto extension_error = [](CudaStepExecutor& e, const Workload& x, const Plan& y) {
    try {
      e.set_plan(x, y, nullptr, PlanCheck::extension);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(extension_error(ex, w, make_plan("per-query", w)).find("differ from the last plan's"), std::string::npos);
  CudaStepExecutor unplanned(w.heads, w.layout, cap);
  EXPECT_NE(extension_error(unplanned, w, plan).find("no last plan to extend"), std::string::npos);
  check_cuda(cudaDeviceSynchronize(), "flat page table errors");
}

// The device index: -1 resolves to the current device; past the devices the
// process sees is an error naming it; plan and run leave the caller's current
// device as it was.
TEST(Runtime, DeviceIndexIsResolvedCheckedAndRestored) {
  WorkloadParams p;
  p.heads = {8, 2, 64};
  const Workload w = make_workload("fewshot:prompt=100:branches=4:len=8", p);
  int devices = 0, current = -1;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  TreeAttentionConfig c = config_for(w, "auto", w.layout.num_pages);
  TreeAttention ta(c);
  EXPECT_EQ(ta.config().device_index, current);
  // num_sms = 0: the planners target this device's SMs (132 was assumed before).
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current), cudaSuccess);
  c.plan_options.num_sms = 0;
  EXPECT_EQ(TreeAttention(c).config().plan_options.num_sms, sms);
  c.plan_options.num_sms = 7;
  EXPECT_EQ(TreeAttention(c).config().plan_options.num_sms, 7);
  c.device_index = devices;
  try {
    TreeAttention past(c);
    FAIL() << "expected a device-index error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_index = " + std::to_string(devices) + " is out of range [0, " +
                                         std::to_string(devices) + ")"),
              std::string::npos)
        << e.what();
  }
  c.device_index = devices - 1;  // the last device, while `current` stays current
  TreeAttention last(c);
  last.plan_tree(Arrays(w).view(), nullptr);
  int after = -1;
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, current);
}

}  // namespace
}  // namespace treeattn
