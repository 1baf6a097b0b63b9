// Builders of workloads: the JSON tree format, vLLM-style block tables, the
// papers' generators, seeded random trees and the recorded real workloads.
// One spec string names any of them (see docs/formats.md), e.g.
//   fasttree:N=1,4,16:C=128,32,32     pat:B=1,4,16:L=128,256,1024
//   fewshot:prompt=4000:branches=32:len=256
//   random:seed=7:nodes=40           json:FILE
//   kary:arity=2:depth=5:total=65536[:leftmost=1]
//   tot:FILE:task=3:iter=200         medusa:FILE:record=0:step=10:prefix=4096
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treeattn/tree.hpp"

namespace treeattn {

// Shape and storage shared by every builder.
struct WorkloadParams {
  HeadConfig heads;
  int page_size = 16;
  DType dtype = DType::fp16;
  std::optional<DType> kv_dtype;  // the K/V pools' element type when not dtype (fp8_e4m3)
  uint64_t seed = 1;  // page shuffling and random trees
};

// Parses a spec (above) and builds the workload; the result is validated.
Workload make_workload(std::string_view spec, const WorkloadParams& p);

struct WorkloadFamily {
  std::string prefix;   // "fasttree", "pat", ...
  std::string syntax;   // e.g. "fasttree:N=1,4,16:C=128,32,32"
  std::string description;
};
const std::vector<WorkloadFamily>& workload_families();

// FastTree level spec: level i has N[i] nodes of C[i] tokens, children spread
// evenly over the previous level's nodes; one query per leaf.
Workload fasttree_workload(const std::vector<int>& N, const std::vector<int>& C,
                           const WorkloadParams& p);
// PAT spec: levels of B[i] nodes of L[i] tokens; the last level is one leaf per
// query (its own non-shared KV); B[0] > 1 gives several roots.
Workload pat_workload(const std::vector<int>& B, const std::vector<int>& L,
                      const WorkloadParams& p);
// One prompt of `prompt` tokens, `branches` children of `len` tokens, a query per branch.
Workload fewshot_workload(int prompt, int branches, int len, const WorkloadParams& p);

// FlashForge's shape family: a complete `arity`-ary tree of `depth` levels
// below the root (a query per leaf), every node of total / nodes tokens; with
// leftmost, only the leftmost node of each level has children (degenerate).
Workload kary_workload(int arity, int depth, int64_t total_tokens, bool leftmost, const WorkloadParams& p);

struct RandomTreeOptions {
  int max_nodes = 24;
  int max_tokens = 300;        // per node
  double empty_node_prob = 0.05;
  double internal_query_prob = 0.2;  // queries also on internal nodes
  int max_queries_per_node = 3;
};
Workload random_workload(uint64_t seed, const WorkloadParams& p,
                         const RandomTreeOptions& o = {});

// Tree-of-thoughts replay of data/workloads/*ToT.json (format: data/workloads/README.md): task k at iteration t;
// task = kTotAllTasks: the forest of every task still generating at t (all tasks decoded together, as the
// engine's ToT replay batches them), one root per task. Spec: "tot:FILE:task=all:iter=t".
inline constexpr int kTotAllTasks = -1;
Workload tot_workload(const std::string& path, int task, int iter, const WorkloadParams& p);
// Medusa token tree (APPS_tree_size*.json) of a record at a step, on top of a
// sequence of `prefix` tokens plus the tokens accepted before that step.
Workload medusa_workload(const std::string& path, int record, int step, int prefix,
                         const WorkloadParams& p);

// vLLM-style batch: per sequence its block table (page ids) and length.
// Equal leading page ids are shared prefixes; they become one radix tree
// (PAT's tree-structure block table). One query per sequence.
Workload from_block_tables(const std::vector<std::vector<int32_t>>& block_tables,
                           const std::vector<int32_t>& seq_lens, int64_t num_pages,
                           const WorkloadParams& p);

// The same tree as flat arrays (the layout of TreeArrays in runtime.hpp:
// nodes parents first, node v's pages at page_ids[page_offsets[v] ..
// page_offsets[v + 1]), one query node per sequence), for callers that build
// it every decode step: block_tables row-major [batch, width], entries past
// a sequence's last page are padding; errors name the sequence and page.
// The arrays and the scratch are reused (no allocation once grown).
// A build that follows a build of the same sequences, each grown by tokens
// and pages of its own (a decode step), extends the last tree's leaf runs
// instead of rebuilding the tree: it compares each row with its path in the
// last tree and looks up only the new pages; any other batch is built
// afresh. Either way the arrays are those a fresh build gives. The next
// build reads them: callers treat them as read-only.
// The second overload takes ragged rows: row s is pages[row_offsets[s] ..
// row_offsets[s + 1]) (batch = row_offsets.size() - 1), so memory follows the
// entries given, not batch x the longest row.
struct BlockTableTree {
  std::vector<int32_t> parents, num_tokens, page_offsets, page_ids, query_nodes;
  int64_t grown_builds = 0;  // builds that extended the last tree

  struct TriePage;  // block_tables.cpp
  struct Scratch;
  BlockTableTree();
  ~BlockTableTree();
  BlockTableTree(BlockTableTree&&) noexcept;
  BlockTableTree& operator=(BlockTableTree&&) noexcept;

 private:
  std::unique_ptr<Scratch> scratch_;
  friend void build_block_table_tree(std::span<const int32_t>, int32_t, int32_t, std::span<const int32_t>, int,
                                     int64_t, BlockTableTree&);
  friend void build_block_table_tree(std::span<const int32_t>, std::span<const int64_t>, std::span<const int32_t>,
                                     int, int64_t, BlockTableTree&);
};
void build_block_table_tree(std::span<const int32_t> block_tables, int32_t batch, int32_t width,
                            std::span<const int32_t> seq_lens, int page_size, int64_t num_pages, BlockTableTree& out);
void build_block_table_tree(std::span<const int32_t> pages, std::span<const int64_t> row_offsets,
                            std::span<const int32_t> seq_lens, int page_size, int64_t num_pages, BlockTableTree& out);

// The same from the JSON block-table format of docs/formats.md
// ({"block_tables": [[...], ...], "seq_lens": [...], "num_pages": N}).
Workload block_tables_from_json(std::string_view text, const WorkloadParams& defaults);
// That format's contents, read but not built (num_pages: the file's, else
// the largest page id + 1; params: defaults with the file's shape keys).
struct BlockTablesInput {
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<int32_t> seq_lens;
  int64_t num_pages = 0;
  WorkloadParams params;
};
BlockTablesInput parse_block_tables_json(std::string_view text, const WorkloadParams& defaults);
Workload read_block_tables_file(const std::string& path, const WorkloadParams& defaults);

// The JSON tree format of docs/formats.md.
Workload workload_from_json(std::string_view text, const WorkloadParams& defaults);
Workload read_workload_file(const std::string& path, const WorkloadParams& defaults);
std::string workload_to_json(const Workload& w);

}  // namespace treeattn
