// The prefix tree of KV tokens and the decode queries attached to it: the
// input of every planner. A Workload is a tree, its queries, the head shape and
// the KV pool layout; validate() is the single gate for all of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/types.hpp"

namespace treeattn {

// A run of tokens. Token t lives in page pages[(first_slot + t) / page_size]
// at slot (first_slot + t) % page_size: a node's tokens start at a page
// boundary (first_slot = 0) except where it continues a page that another
// node began -- the draft tokens of a speculative token tree, written one
// after another into their request's pages. A node may be empty (no tokens,
// no pages). Two nodes may share a page only in disjoint slots.
struct Node {
  int32_t parent = -1;  // -1: a root
  int32_t num_tokens = 0;
  std::vector<int32_t> pages;
  int32_t first_slot = 0;  // in [0, page_size)

  // The page and slot of token t, as a row of the pool viewed as
  // [num_pages * page_size] token rows.
  int64_t token_row(int32_t t, int page_size) const {
    const int32_t s = first_slot + t;
    return int64_t(pages[s / page_size]) * page_size + s % page_size;
  }
};

// A forest in general (several roots are allowed, e.g. PAT's B=2,... specs);
// builders that need exactly one root check it themselves.
struct Tree {
  std::vector<Node> nodes;
};

// Derived, read-only views of a validated tree, computed once.
struct TreeIndex {
  // Node v's parent and token count, as in the tree, dense: loops over many
  // nodes read these rather than Node, whose page vector makes it 40 bytes.
  std::vector<int32_t> parent, tokens;
  std::vector<int32_t> roots;
  std::vector<int32_t> child_offset;  // CSR over nodes: children of v are
  std::vector<int32_t> children;      // children[child_offset[v] .. child_offset[v+1])
  std::vector<int32_t> bfs_order;     // parents before children
  std::vector<int32_t> depth;         // roots have depth 0
  std::vector<int64_t> path_tokens;   // tokens root..v inclusive
  std::vector<int32_t> subtree_queries;  // queries attached in v's subtree
  // Queries numbered depth-first (a node's own queries, then each child's
  // subtree in child order): v's subtree holds numbers [query_begin[v],
  // query_begin[v] + subtree_queries[v]). So a node x with queries lies on
  // v's subtree (v on the path root..x) iff query_begin[x] is in v's range.
  std::vector<int32_t> query_begin;

  // Throws Error on a parent out of range or a cycle.
  static TreeIndex build(const Tree& tree, const std::vector<int32_t>& query_nodes);
  // The same into this index's arrays (no allocation once they have grown).
  // Where the tree's parents and the queries are those of the last rebuild
  // that completed (a tree planned again with its nodes grown), only the
  // token counts are read again (tokens, path_tokens): the other arrays
  // depend on the parents and the queries alone, so callers change none of
  // them between rebuilds (tokens and path_tokens they may).
  void rebuild(const Tree& tree, const std::vector<int32_t>& query_nodes);
  int num_children(int32_t v) const { return child_offset[v + 1] - child_offset[v]; }

 private:
  // The queries of the last rebuild, valid (with `parent`) while complete_.
  std::vector<int32_t> built_queries_;
  bool complete_ = false;
};

// Reusable memory of Workload::validate: a bit per pool page, set while a
// call checks the tree's pages (clear between calls), and one more for the
// pages used in part; the uses of partial pages; and the tree's index, which
// holds the index of the last tree validated (a planner may reuse it).
// With keep_page_bits, a call that succeeds with the bits (pool of at most
// 2^30 pages) leaves them set and says so in page_bits_kept: page_used then
// holds the tree's pages and page_partial those it uses in part, and the
// caller clears both (or swaps in clear vectors of the same size) before the
// next call. pages_shared: some page is used in part by two nodes.
// pages_checked: the caller has checked the page ids (each in range, each
// slot of the pool used by at most one node) against its own record of the
// pool, and the call checks everything else (TreeAttention, which checks
// only the nodes that changed since its last tree).
struct ValidateScratch {
  std::vector<uint64_t> page_used, page_partial;
  bool pages_checked = false;
  bool keep_page_bits = false;
  bool page_bits_kept = false;
  bool pages_shared = false;
  struct PageUse {
    int32_t page, begin, end, node;  // slots [begin, end) of the page
  };
  std::vector<PageUse> partial_uses;
  TreeIndex index;
};

// The longest root-to-query path a Workload accepts: 2^30 tokens (far past
// any context a GPU holds; ~0.5 TB of fp16 K/V at 32/8 heads, d = 128).
// Token positions inside a node are 32-bit; path sums are 64-bit everywhere,
// and this bound keeps the planners' unit counts (path / chunk) allocatable.
inline constexpr int64_t kMaxPathTokens = int64_t(1) << 30;

struct Workload {
  std::string name;
  Tree tree;
  std::vector<int32_t> query_nodes;  // query i attends to the path root..query_nodes[i]
  HeadConfig heads;
  KvLayout layout;

  int32_t num_queries() const { return static_cast<int32_t>(query_nodes.size()); }
  // Nodes on the path root..node, root first. Error on a node out of range,
  // and on a parent out of range or a cycle on the way (an unvalidated tree).
  std::vector<int32_t> path(int32_t node) const;
  int64_t total_tokens() const;  // tokens stored in the tree (each once)
  // Bytes of one token's K and V over all kv heads.
  int64_t kv_bytes_per_token() const;
  int64_t unique_kv_bytes() const { return total_tokens() * kv_bytes_per_token(); }

  // Checks everything a planner or executor relies on; throws Error naming the
  // field and value: heads, head_dim, page size, parents (range, cycles), page
  // ids (range, reuse), node length vs page count, query nodes, empty tree,
  // sizes that overflow the 32-bit row / 64-bit element indexing, paths
  // longer than kMaxPathTokens. scratch: memory a caller that validates every
  // decode step keeps between calls, so that the page check is O(pages)
  // without allocating.
  void validate(struct ValidateScratch* scratch = nullptr) const;
};

// Hands out page ids for builders. Pages are shuffled (seeded) so that no
// executor can rely on a node's pages being contiguous in the pool.
class PageAllocator {
 public:
  explicit PageAllocator(int page_size, uint64_t seed = 0x9e3779b97f4a7c15ull)
      : page_size_(page_size), seed_(seed) {}
  // Appends a node of `num_tokens` tokens under `parent` to `tree`; returns its id.
  int32_t add_node(Tree& tree, int32_t parent, int32_t num_tokens);
  // Renumbers all handed-out pages by a seeded permutation; returns the pool size.
  int64_t finish(Tree& tree) const;
  int page_size() const { return page_size_; }

 private:
  int page_size_;
  uint64_t seed_;
  int64_t next_page_ = 0;
};

}  // namespace treeattn
