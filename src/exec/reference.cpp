// The fp64 reference: dense attention of each query over its materialised
// root-to-node context. Independent of any plan.
#include <algorithm>
#include <cmath>

#include "treeattn/executor.hpp"

namespace treeattn {

std::vector<double> reference_attention(const Workload& w, const AttentionArgs& a) {
  const int H = w.heads.num_qo_heads, D = w.heads.head_dim;
  const Strides str = check_tensors(w, a, /*writes=*/false);  // reads q, k and v (out is not its)
  const int g = w.heads.group_size(), ps = w.layout.page_size;
  const DType t = w.layout.dtype, kt = w.layout.kv_type();
  const double scale = effective_scale(w, a.scale);
  std::vector<double> out(size_t(w.num_queries()) * H * D, 0.0);
  std::vector<double> scores, qv(D);
  for (int32_t q = 0; q < w.num_queries(); ++q) {
    // Element offsets of this query's context tokens (head 0).
    std::vector<int64_t> tokens;
    for (int32_t v : w.path(w.query_nodes[q])) {
      const Node& n = w.tree.nodes[v];
      for (int32_t i = 0; i < n.num_tokens; ++i) {
        const int64_t row = n.token_row(i, ps);
        tokens.push_back(row / ps * str.kv_page + row % ps * str.kv_token);
      }
    }
    if (tokens.empty()) continue;  // empty context: zeros
    scores.resize(tokens.size());
    for (int h = 0; h < H; ++h) {
      const int64_t kvh = (h / g) * D;
      for (int d = 0; d < D; ++d) qv[d] = load_element(a.q, t, int64_t(q) * str.q + int64_t(h) * D + d);
      double mx = -INFINITY;
      for (size_t j = 0; j < tokens.size(); ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += qv[d] * load_element(a.k, kt, tokens[j] + kvh + d);
        scores[j] = s * double(a.k_scale) * scale;
        mx = std::max(mx, scores[j]);
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - mx));
      double* o = &out[(size_t(q) * H + h) * D];
      for (size_t j = 0; j < tokens.size(); ++j)
        for (int d = 0; d < D; ++d)
          o[d] += scores[j] / sum * double(a.v_scale) * load_element(a.v, kt, tokens[j] + kvh + d);
    }
  }
  return out;
}

}  // namespace treeattn
