// Helpers for the tree-layer builder tests: error-message checks, workload
// comparison, and where the fixture and recorded workload files live.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "treeattn/workloads.hpp"

namespace treeattn_test {

// The message of the treeattn::Error that f throws, or a marker that fails
// every substring check below.
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const treeattn::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a treeattn::Error: ") + e.what() + ")";
  }
  return "(no error thrown)";
}

inline std::string fixture(const std::string& name) {
  return std::string(TREEATTN_SOURCE_DIR) + "/tests/data/" + name;
}

// Directory of the recorded workloads: $TREEATTN_WORKLOADS, else the copy in
// the repository (data/workloads), else ../shared/workloads; "" when none exists.
inline std::string workloads_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TREEATTN_WORKLOADS"); env && *env) return env;
  for (const std::string& d : {std::string(TREEATTN_SOURCE_DIR) + "/data/workloads",
                              std::string(TREEATTN_SOURCE_DIR) + "/../shared/workloads"})
    if (fs::exists(d + "/docmergeToT.json")) return d;
  return "";
}

inline void expect_same_workload(const treeattn::Workload& a, const treeattn::Workload& b) {
  ASSERT_EQ(a.tree.nodes.size(), b.tree.nodes.size());
  for (size_t v = 0; v < a.tree.nodes.size(); ++v) {
    EXPECT_EQ(a.tree.nodes[v].parent, b.tree.nodes[v].parent) << "node " << v;
    EXPECT_EQ(a.tree.nodes[v].num_tokens, b.tree.nodes[v].num_tokens) << "node " << v;
    EXPECT_EQ(a.tree.nodes[v].pages, b.tree.nodes[v].pages) << "node " << v;
  }
  EXPECT_EQ(a.query_nodes, b.query_nodes);
  EXPECT_EQ(a.heads.num_qo_heads, b.heads.num_qo_heads);
  EXPECT_EQ(a.heads.num_kv_heads, b.heads.num_kv_heads);
  EXPECT_EQ(a.heads.head_dim, b.heads.head_dim);
  EXPECT_EQ(a.layout.page_size, b.layout.page_size);
  EXPECT_EQ(a.layout.num_pages, b.layout.num_pages);
  EXPECT_EQ(a.layout.dtype, b.layout.dtype);
}

// Random trees per property test: `fallback`, or $TREEATTN_PROPERTY_TREES
// when set (scripts/stress.sh runs 10^4).
inline uint64_t property_trees(uint64_t fallback) {
  const char* env = std::getenv("TREEATTN_PROPERTY_TREES");
  return env && *env ? std::strtoull(env, nullptr, 10) : fallback;
}

}  // namespace treeattn_test

// Expects `stmt` to throw treeattn::Error whose message contains every string given.
#define EXPECT_ERROR_WITH(stmt, ...)                                                        \
  do {                                                                                      \
    const std::string msg_ = treeattn_test::error_message([&] { (void)(stmt); });           \
    for (const char* part_ : {__VA_ARGS__})                                                 \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "expected '" << part_ << "' in: " << msg_; \
  } while (0)
