// Helpers shared by the libFuzzer targets in fuzz/: small shape parameters,
// a hard failure that libFuzzer reports (abort), tree equality, and whether
// a query's path holds a block-table sequence.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "treeattn/workloads.hpp"

namespace treeattn_fuzz {

// Failing an oracle must crash, so that libFuzzer saves the input.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz oracle failed: %s\n", what);
    std::abort();
  }
}

// Small heads keep each execution cheap; the parsers do not depend on them.
inline treeattn::WorkloadParams small_params() {
  treeattn::WorkloadParams p;
  p.heads = {4, 2, 64};
  p.page_size = 4;
  return p;
}

inline bool same_tree(const treeattn::Workload& a, const treeattn::Workload& b) {
  if (a.tree.nodes.size() != b.tree.nodes.size() || a.query_nodes != b.query_nodes) return false;
  for (size_t v = 0; v < a.tree.nodes.size(); ++v) {
    const treeattn::Node &x = a.tree.nodes[v], &y = b.tree.nodes[v];
    if (x.parent != y.parent || x.num_tokens != y.num_tokens || x.pages != y.pages) return false;
  }
  return a.layout.page_size == b.layout.page_size && a.layout.num_pages == b.layout.num_pages &&
         a.heads.num_qo_heads == b.heads.num_qo_heads && a.heads.num_kv_heads == b.heads.num_kv_heads &&
         a.heads.head_dim == b.heads.head_dim;
}

// Whether w's query q holds a sequence of `len` tokens whose block table is
// `table`: its path's pages are table[0 .. ceil(len / page_size)) and its
// tokens `len`.
inline bool path_holds(const treeattn::Workload& w, int32_t q, std::span<const int32_t> table, int64_t len) {
  std::vector<int32_t> pages;
  int64_t tokens = 0;
  for (const int32_t v : w.path(w.query_nodes[size_t(q)])) {
    pages.insert(pages.end(), w.tree.nodes[v].pages.begin(), w.tree.nodes[v].pages.end());
    tokens += w.tree.nodes[v].num_tokens;
  }
  const int64_t need = (len + w.layout.page_size - 1) / w.layout.page_size;
  return tokens == len && int64_t(pages.size()) == need && int64_t(table.size()) >= need &&
         std::equal(pages.begin(), pages.end(), table.begin());
}

// Files that specs name are read through the size limit; keep it small here
// so that a spec naming /dev/zero costs milliseconds, not 256 MiB.
// Small limits for every input: files of at most 64 KB, trees of at most 4096
// nodes and 65536 pages (a larger tree builds correctly, but for seconds
// under ASan, which libFuzzer reports as a timeout).
struct SmallInputLimit {
  SmallInputLimit() {
    setenv("TREEATTN_MAX_INPUT_BYTES", "65536", 1);
    setenv("TREEATTN_MAX_BUILDER_NODES", "4096", 1);
    setenv("TREEATTN_MAX_BUILDER_PAGES", "65536", 1);
  }
};

}  // namespace treeattn_fuzz
