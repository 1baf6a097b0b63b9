// Synthetic workload generators: the FastTree and PAT level specs, few-shot
// (one prompt, many branches) and seeded random trees for property tests.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tree/builder_util.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {

namespace {

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// Levels of counts[i] nodes of lens[i] tokens; node j of level i hangs under
// node j / (counts[i] / counts[i-1]) of level i-1, so every node of a level has
// the same number of children. One query per node of the last level.
// `family`, `cname`, `lname` only shape the messages ("fasttree", "N", "C").
Workload level_workload(const std::string& family, const char* cname, const char* lname,
                        const std::vector<int>& counts, const std::vector<int>& lens,
                        const WorkloadParams& p) {
  const std::string c = cname, l = lname;
  if (counts.empty()) throw Error(family + ": " + c + " is empty (give at least one level)");
  if (counts.size() != lens.size())
    throw Error(family + ": " + c + " has " + std::to_string(counts.size()) + " levels but " + l +
                " has " + std::to_string(lens.size()));
  detail::check_page_size(p.page_size);
  __int128 nodes = 0, pages = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::string at = std::string("[") + std::to_string(i) + "]";
    if (counts[i] <= 0)
      throw Error(family + ": " + c + at + " = " + std::to_string(counts[i]) + " must be positive");
    if (lens[i] <= 0)
      throw Error(family + ": " + l + at + " = " + std::to_string(lens[i]) + " must be positive");
    if (i > 0 && counts[i] % counts[i - 1] != 0)
      throw Error(family + ": " + c + at + " = " + std::to_string(counts[i]) + " is not a multiple of " +
                  c + "[" + std::to_string(i - 1) + "] = " + std::to_string(counts[i - 1]) +
                  " (children must spread evenly over the previous level)");
    nodes += counts[i];
    pages += __int128(counts[i]) * detail::pages_for(lens[i], p.page_size);
  }
  const std::string name = family + ":" + c + "=" + join_ints(counts) + ":" + l + "=" + join_ints(lens);
  detail::check_budget(nodes, pages, name);

  PageAllocator alloc(p.page_size, detail::mix_seed(p.seed, 0x1e7e1));
  Tree tree;
  tree.nodes.reserve(static_cast<size_t>(nodes));
  int32_t prev_first = -1;
  std::vector<int32_t> queries;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int32_t first = static_cast<int32_t>(tree.nodes.size());
    const int fan = i ? counts[i] / counts[i - 1] : 1;
    for (int j = 0; j < counts[i]; ++j) {
      const int32_t parent = i ? prev_first + j / fan : -1;
      const int32_t v = alloc.add_node(tree, parent, lens[i]);
      if (i + 1 == counts.size()) queries.push_back(v);
    }
    prev_first = first;
  }
  return detail::finish_workload(name, std::move(tree), std::move(queries), alloc, p);
}

// Portable randomness: std:: distributions differ between standard libraries,
// mt19937_64's raw output does not, so a seed gives the same tree everywhere.
struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  int uniform(int lo, int hi) {  // inclusive; hi >= lo
    return lo + static_cast<int>(g() % uint64_t(int64_t(hi) - lo + 1));
  }
  double real() { return double(g() >> 11) * 0x1.0p-53; }
  bool coin(double p) { return real() < p; }
};

}  // namespace

Workload fasttree_workload(const std::vector<int>& N, const std::vector<int>& C,
                           const WorkloadParams& p) {
  return level_workload("fasttree", "N", "C", N, C, p);
}

Workload pat_workload(const std::vector<int>& B, const std::vector<int>& L, const WorkloadParams& p) {
  return level_workload("pat", "B", "L", B, L, p);
}

Workload fewshot_workload(int prompt, int branches, int len, const WorkloadParams& p) {
  if (prompt <= 0) throw Error("fewshot: prompt = " + std::to_string(prompt) + " must be positive");
  if (branches <= 0) throw Error("fewshot: branches = " + std::to_string(branches) + " must be positive");
  if (len <= 0) throw Error("fewshot: len = " + std::to_string(len) + " must be positive");
  detail::check_page_size(p.page_size);
  const std::string name = "fewshot:prompt=" + std::to_string(prompt) +
                           ":branches=" + std::to_string(branches) + ":len=" + std::to_string(len);
  detail::check_budget(__int128(branches) + 1,
                       detail::pages_for(prompt, p.page_size) +
                           __int128(branches) * detail::pages_for(len, p.page_size),
                       name);
  PageAllocator alloc(p.page_size, detail::mix_seed(p.seed, 0xf5));
  Tree tree;
  const int32_t root = alloc.add_node(tree, -1, prompt);
  std::vector<int32_t> queries;
  for (int b = 0; b < branches; ++b) queries.push_back(alloc.add_node(tree, root, len));
  return detail::finish_workload(name, std::move(tree), std::move(queries), alloc, p);
}

// Shapes vary per seed on purpose: property tests must meet deep chains, wide
// fans, forests, 1-token and empty nodes, page-aligned and ragged lengths,
// several queries per node and queries on internal nodes. Every query sees at
// least one token (a decode query attends at least to itself).
Workload random_workload(uint64_t seed, const WorkloadParams& p, const RandomTreeOptions& o) {
  if (o.max_nodes <= 0) throw Error("random: nodes = " + std::to_string(o.max_nodes) + " must be positive");
  if (o.max_tokens <= 0)
    throw Error("random: tokens = " + std::to_string(o.max_tokens) + " must be positive");
  if (!(o.empty_node_prob >= 0 && o.empty_node_prob <= 1))
    throw Error("random: empty_node_prob = " + std::to_string(o.empty_node_prob) + " is not in [0, 1]");
  if (!(o.internal_query_prob >= 0 && o.internal_query_prob <= 1))
    throw Error("random: internal_query_prob = " + std::to_string(o.internal_query_prob) +
                " is not in [0, 1]");
  if (o.max_queries_per_node <= 0)
    throw Error("random: max_queries_per_node = " + std::to_string(o.max_queries_per_node) +
                " must be positive");
  detail::check_page_size(p.page_size);
  const std::string name = "random:seed=" + std::to_string(seed) + ":nodes=" +
                           std::to_string(o.max_nodes) + ":tokens=" + std::to_string(o.max_tokens);
  detail::check_budget(o.max_nodes, __int128(o.max_nodes) * detail::pages_for(o.max_tokens, p.page_size),
                       name);

  Rng rng(seed);
  const int n = rng.uniform(1, o.max_nodes);
  const int shape = rng.uniform(0, 4);     // how parents are drawn
  const int lengths = rng.uniform(0, 3);   // how token counts are drawn
  const double extra_root_prob = rng.coin(0.3) ? 0.1 : 0.0;

  std::vector<int32_t> parent(n, -1), tokens(n, 0);
  auto draw_tokens = [&](int mode) {
    const int ps = p.page_size, mx = o.max_tokens;
    switch (mode) {
      case 0: return rng.uniform(0, mx);                                   // ragged
      case 1: return rng.uniform(1, std::min(mx, 3));                      // speculative-like
      case 2: return mx >= ps ? ps * rng.uniform(0, mx / ps) : rng.uniform(0, mx);  // page-aligned
      default: return rng.coin(0.5) ? rng.uniform(1, std::min(mx, 2)) : rng.uniform(0, mx);
    }
  };
  for (int v = 0; v < n; ++v) {
    if (v > 0 && !rng.coin(extra_root_prob)) {
      switch (shape) {
        case 0: parent[v] = rng.uniform(0, v - 1); break;                            // uniform
        case 1: parent[v] = rng.coin(0.9) ? v - 1 : rng.uniform(0, v - 1); break;    // deep chain
        case 2: parent[v] = rng.coin(0.85) ? 0 : rng.uniform(0, v - 1); break;       // wide fan
        case 3: parent[v] = v - 1 - rng.uniform(0, std::min(v - 1, 3)); break;      // recent
        default: parent[v] = (v - 1) / 2; break;                                     // binary
      }
    }
    tokens[v] = rng.coin(o.empty_node_prob) ? 0 : draw_tokens(lengths == 3 ? rng.uniform(0, 2) : lengths);
  }

  std::vector<int> num_children(n, 0);
  for (int v = 0; v < n; ++v)
    if (parent[v] >= 0) ++num_children[parent[v]];
  std::vector<int32_t> queries;
  std::vector<int64_t> path(n, 0);
  for (int v = 0; v < n; ++v) {  // parents precede children: one forward pass
    int q = 0;
    if (num_children[v] == 0)
      q = rng.coin(0.25) ? rng.uniform(1, o.max_queries_per_node) : 1;
    else if (rng.coin(o.internal_query_prob))
      q = rng.uniform(1, o.max_queries_per_node);
    path[v] = (parent[v] >= 0 ? path[parent[v]] : 0) + tokens[v];
    if (q > 0 && path[v] == 0) tokens[v] = 1, path[v] = 1;
    for (int i = 0; i < q; ++i) queries.push_back(v);
  }
  // Query order carries no meaning; shuffle so planners cannot rely on it.
  for (size_t i = queries.size(); i > 1; --i)
    std::swap(queries[i - 1], queries[size_t(rng.g() % i)]);

  PageAllocator alloc(p.page_size, detail::mix_seed(p.seed, seed));
  Tree tree;
  tree.nodes.reserve(n);
  for (int v = 0; v < n; ++v) alloc.add_node(tree, parent[v], tokens[v]);
  return detail::finish_workload(name, std::move(tree), std::move(queries), alloc, p);
}

}  // namespace treeattn
