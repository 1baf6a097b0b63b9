// The numerical edge cases of issue 20 (point 4), shared by the CPU test
// (tests/exec/test_numerics_edge.cpp) and its GPU counterpart
// (tests/gpu/numerics_edge_test.cpp): each case is a workload plus a change
// to its random inputs, checked for every planner against the fp64 reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn_numerics {

using namespace treeattn;

struct Case {
  std::string name;
  Workload w;
  std::function<void(const Workload&, HostTensors&)> edit;  // applied to make_random_inputs' tensors
  double tol;               // ||out - ref|| / ||ref|| over the clean queries
  int32_t poisoned = -1;    // a query whose q holds NaN/Inf: only it may be non-finite
  bool expect_nan = false;  // the poisoned query's output must be NaN (NaN input)
};

inline WorkloadParams params(int qo, int kv, int d, DType t, int page) {
  WorkloadParams p;
  p.heads = {qo, kv, d};
  p.page_size = page;
  p.dtype = t;
  return p;
}

// A JSON tree (docs/formats.md) from parents, token counts and query nodes.
inline Workload tree(const std::vector<int>& parent, const std::vector<int>& tokens, const std::vector<int>& queries,
                     const WorkloadParams& p) {
  std::string s = "{\"nodes\": [";
  for (size_t i = 0; i < parent.size(); ++i)
    s += (i ? ", " : "") + std::string("{\"id\": ") + std::to_string(i) + ", \"parent\": " +
         std::to_string(parent[i]) + ", \"tokens\": " + std::to_string(tokens[i]) + "}";
  s += "], \"queries\": [";
  for (size_t i = 0; i < queries.size(); ++i) s += (i ? ", " : "") + std::to_string(queries[i]);
  return workload_from_json(s + "]}", p);
}

inline void scale_q(const Workload& w, HostTensors& t, float f) {
  const int64_t n = int64_t(w.num_queries()) * w.heads.num_qo_heads * w.heads.head_dim;
  for (int64_t i = 0; i < n; ++i) store_element(t.q.data(), t.dtype, i, load_element(t.q.data(), t.dtype, i) * f);
}

// Every head of query q gets `value` in its first element (and, for NaN, a
// second one), so every output row of q depends on it.
inline void poison_query(const Workload& w, HostTensors& t, int32_t q, float value) {
  const int H = w.heads.num_qo_heads, D = w.heads.head_dim;
  for (int h = 0; h < H; ++h) {
    store_element(t.q.data(), t.dtype, (int64_t(q) * H + h) * D, value);
    store_element(t.q.data(), t.dtype, (int64_t(q) * H + h) * D + D - 1, value);
  }
}

// The cases; `long_path` adds the >= 2^20-token path (256 MB of K/V in fp16).
inline std::vector<Case> cases(bool long_path) {
  std::vector<Case> c;
  RandomTreeOptions shape;
  shape.max_nodes = 16;
  shape.max_tokens = 200;
  shape.empty_node_prob = 0.25;

  // |q.k| * scale of order 1e4: q scaled by 1000 (k in (-1, 1), d = 128). The
  // online softmax must subtract the running max (no exp overflow) and merges
  // must weight partials by exp(lse - max): fp32 holds logits to ~1e-3 here.
  for (uint64_t seed : {3, 4}) {
    Workload w = random_workload(seed, params(8, 2, 128, DType::fp32, 16), shape);
    c.push_back({"large_logits/seed" + std::to_string(seed), std::move(w),
                 [](const Workload& w, HostTensors& t) { scale_q(w, t, 1000.f); }, 1e-3});
  }
  // All keys equal: a uniform softmax, the output is the mean of V on the path.
  c.push_back({"all_equal_keys", random_workload(5, params(8, 2, 64, DType::fp16, 16), shape),
               [](const Workload& w, HostTensors& t) {
                 const int64_t row = int64_t(w.heads.head_dim);
                 const int64_t n = int64_t(t.k.size() / dtype_size(t.dtype));
                 for (int64_t i = 0; i < n; ++i) store_element(t.k.data(), t.dtype, i, load_element(t.k.data(), t.dtype, i % row));
               },
               2e-3});
  // A query whose path is one token (a 1-token root), beside longer paths.
  c.push_back({"one_token_path", tree({-1, -1, 1, 0}, {1, 40, 7, 3}, {0, 2, 3, 1}, params(4, 4, 64, DType::fp16, 16)),
               nullptr, 2e-3});
  // Empty nodes on the path, at the root, in the middle and at the end; a
  // query on an empty root sees nothing and gets zeros.
  c.push_back({"empty_nodes_on_path",
               tree({-1, 0, 1, 2, 3, 3, -1}, {0, 37, 0, 0, 21, 0, 0}, {4, 5, 3, 1, 6}, params(8, 2, 64, DType::fp16, 16)),
               nullptr, 2e-3});
  // Pages of one token: every token is its own page, in shuffled order.
  c.push_back({"one_token_pages", random_workload(6, params(8, 8, 64, DType::bf16, 1), shape), nullptr, 1e-2});
  // NaN / Inf in one query's q: NaN in that query's output only.
  for (const auto& [label, value] : std::vector<std::pair<std::string, float>>{
           {"nan", NAN}, {"inf", INFINITY}, {"minus_inf", -INFINITY}}) {
    Workload w = random_workload(7, params(8, 2, 64, DType::fp16, 16), shape);
    const int32_t bad = w.num_queries() / 2;
    const float v = value;
    c.push_back({"poisoned_query_" + label, std::move(w),
                 [bad, v](const Workload& w, HostTensors& t) { poison_query(w, t, bad, v); }, 2e-3, bad,
                 label == "nan"});
  }
  if (long_path) {
    // 2^20 + 2^16 tokens on the longest path (a chain of three nodes, one of
    // 2^20 tokens), a branch beside it: token, page and element indices pass
    // 2^20 and 2^26 elements; nothing may wrap in 32 bits.
    c.push_back({"path_of_2^20_tokens",
                 tree({-1, 0, 1, 0}, {1 << 20, 1 << 15, 1 << 15, 100}, {2, 3, 1}, params(2, 1, 64, DType::fp16, 16)),
                 nullptr, 2e-3});
  }
  return c;
}

// ||a - b|| / ||b|| over the queries other than `skip`, and whether they are
// all finite; `nan_in_skip`: every element of query `skip` is NaN.
struct Compare {
  double rel = 0;
  bool finite = true;
  bool nan_in_skip = true;
};
inline Compare compare(const Workload& w, const std::vector<uint8_t>& out, DType t, const std::vector<double>& ref,
                       int32_t skip) {
  Compare r;
  const int64_t row = int64_t(w.heads.num_qo_heads) * w.heads.head_dim;
  double num = 0, den = 0;
  for (int32_t q = 0; q < w.num_queries(); ++q)
    for (int64_t i = q * row; i < (q + 1) * row; ++i) {
      const double x = load_element(out.data(), t, i);
      if (q == skip) {
        r.nan_in_skip &= std::isnan(x);
        continue;
      }
      if (!std::isfinite(x)) r.finite = false;
      num += (x - ref[i]) * (x - ref[i]);
      den += ref[i] * ref[i];
    }
  r.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return r;
}

}  // namespace treeattn_numerics
