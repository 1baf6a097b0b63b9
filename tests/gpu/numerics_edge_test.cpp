// GPU counterpart of tests/exec/test_numerics_edge.cpp (issue 20, point 4):
// the cases of tests/exec/numerics_cases.hpp (logits of order 1e4, all-equal
// keys, a one-token path, empty nodes on the path, one-token pages, a path
// of 2^20 tokens, NaN/Inf in one query's q) for every planner through the
// CUDA executor, output poisoned first, against the fp64 reference: clean
// queries finite and within tolerance, a NaN query NaN, nothing leaking from
// a poisoned query's partials or merge into another query's output.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "exec/numerics_cases.hpp"
#include "treeattn/cuda_executor.hpp"

namespace {

using namespace treeattn;
using namespace treeattn_numerics;

void check_case_gpu(const Case& c) {
  HostTensors h = make_random_inputs(c.w, 11);
  if (c.edit) c.edit(c.w, h);
  const std::vector<double> ref = reference_attention(c.w, h.args());
  DeviceTensors d = DeviceTensors::upload(h);
  for (const PlannerInfo& info : planners()) {
    const Plan p = make_plan(info.name, c.w);
    CudaExecutor ex(c.w, p);  // validates the plan
    d.poison_out();
    ex.run(d.args(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "numerics edge run");
    HostTensors g = h;
    d.download_out(g);
    const Compare r = compare(c.w, g.out, g.dtype, ref, c.poisoned);
    EXPECT_TRUE(r.finite) << c.name << " " << info.name << ": a non-finite output in a clean query";
    EXPECT_LE(r.rel, c.tol) << c.name << " " << info.name;
    if (c.expect_nan) EXPECT_TRUE(r.nan_in_skip) << c.name << " " << info.name << ": the NaN query's output is not NaN";
  }
}

TEST(GpuNumericsEdge, EveryCaseEveryPlannerMatchesTheReference) {
  for (const Case& c : cases(/*long_path=*/true)) {
    SCOPED_TRACE(c.name);
    // The CUDA kernels read fp16/bf16 only: the fp32 large-logit cases run in
    // fp16 with q scaled so that logits stay of order 1e4 (|q| <= 1000 fits).
    if (c.w.layout.dtype == DType::fp32) {
      Case h = c;
      h.w.layout.dtype = DType::fp16;
      h.tol = 2e-3;
      check_case_gpu(h);
    } else {
      check_case_gpu(c);
    }
  }
}

}  // namespace
