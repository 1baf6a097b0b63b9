// Engine-independent KV-cache bookkeeping (layer 6): a fixed pool of KV page
// ids and an SGLang-style radix tree over token ids at page granularity, with
// reference counts and LRU eviction. It owns no KV memory, only page ids: what
// export_tree() returns is the tree a planner receives.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "treeattn/types.hpp"

namespace treeattn {

// A fixed set of page ids 0..num_pages-1, each either free or handed out.
// Every array is sized at construction; alloc/free never allocate beyond the
// vectors they return. (tree.hpp's PageAllocator is something else: it numbers
// the pages of synthetic workloads.)
class KvPagePool {
 public:
  explicit KvPagePool(int64_t num_pages);  // 1 <= num_pages <= INT32_MAX

  // n free ids (the most recently freed first), or Error naming the pages
  // requested and free; on Error nothing changes.
  std::vector<int32_t> alloc(int64_t n);
  // Same, appending to `out` (no allocation when `out` has the capacity).
  void alloc(int64_t n, std::vector<int32_t>& out);
  // Returns ids to the pool. Error naming the id on one out of range, already
  // free, or listed twice; on Error nothing changes.
  void free(std::span<const int32_t> ids);

  int64_t num_pages() const { return static_cast<int64_t>(is_free_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  // Whether page `id` is free; Error naming the id when it is out of range.
  bool is_free(int32_t id) const {
    if (id < 0 || id >= num_pages()) throw_out_of_range(id);
    return is_free_[static_cast<size_t>(id)] != 0;
  }
  // Throws Error unless the free stack and the free flags agree.
  void check() const;

 private:
  [[noreturn]] void throw_out_of_range(int32_t id) const;
  std::vector<int32_t> free_;     // stack of free ids; capacity num_pages
  std::vector<uint8_t> is_free_;  // per id; 1 iff the id is on free_
};

// Radix tree over token ids, SGLang style, at page granularity: every node but
// the root holds a whole, non-zero number of pages, so every node's tokens start
// at a page boundary (tree.hpp's Node invariant) and matches and splits happen
// only at page boundaries. Each page id is at any time exactly one of: free (in
// the pool), cached (owned by one node), or handed out (to a request, by
// alloc()). Node handles are int32 and stay valid, denoting the same token path
// from the root, until the node is evicted (a split keeps the deeper part under
// the old handle); lock a node to keep it and its ancestors alive. Handles of
// evicted nodes are reused.
class RadixCache {
 public:
  static constexpr int32_t kRoot = 0;

  struct Match {
    int32_t node = kRoot;          // deepest node fully matched; kRoot if none
    int64_t num_tokens = 0;        // multiple of page_size
    std::vector<int32_t> pages;    // one id per matched page, in token order
  };

  // The smallest forest containing the root->node paths of some nodes, as flat
  // arrays for planning. The (empty) radix root is left out: its children are
  // roots (parent -1). Parents come before children.
  struct Export {
    std::vector<int32_t> parents;       // -1 for roots
    std::vector<int32_t> num_tokens;    // per node, multiple of page_size
    std::vector<int32_t> page_offsets;  // CSR, size n+1: node v's pages are
    std::vector<int32_t> page_ids;      // page_ids[page_offsets[v] .. page_offsets[v+1])
    std::vector<int32_t> node_index;    // per requested node, its index here; -1 for kRoot
  };

  RadixCache(int64_t num_pages, int page_size);  // num_pages as KvPagePool, page_size >= 1
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;
  RadixCache(RadixCache&&) = default;
  RadixCache& operator=(RadixCache&&) = default;

  // Longest cached prefix of `tokens` in whole pages. When the match ends
  // inside a node, that node is split there so that the match ends at a node.
  // Marks the path as used now (LRU).
  Match match_prefix(std::span<const int32_t> tokens);
  // Like match_prefix without changing anything (no split, no LRU update);
  // here `node` is the deepest node entirely inside the match, so its path may
  // be shorter than num_tokens.
  Match peek_prefix(std::span<const int32_t> tokens) const;

  // Reference counts on every node of the path node..root: a locked node and
  // its ancestors are never evicted. Error on a handle that is not a live node
  // and on unlocking a node that is not locked.
  void lock(int32_t node);
  void unlock(int32_t node);

  // Pages for a request's private tail; evicts least-recently-used unlocked
  // leaves as needed. Error naming requested / free / evictable pages when even
  // evicting everything evictable would not do; on Error nothing changes.
  std::vector<int32_t> alloc(int64_t n);
  // Returns handed-out pages to the pool. Error naming the page on one out of
  // range, free, cached (owned by a node) or listed twice; on Error nothing changes.
  void free(std::span<const int32_t> pages);

  // Caches tokens (a multiple of page_size) with their pages (one per page of
  // tokens) and returns the node ending at the last page (kRoot for no tokens).
  // The cache takes all given pages: where a prefix is already cached, the
  // given page must be the cached page itself (kept) or a handed-out one (a
  // duplicate: freed); elsewhere it must be handed out. Error naming the sizes
  // or the page otherwise; on Error nothing changes.
  int32_t insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

  // Evicts least-recently-used unlocked leaves (whole nodes; a parent left
  // unlocked without children becomes a leaf) until at least num_pages pages
  // were freed or nothing is evictable; returns the pages freed.
  int64_t evict(int64_t num_pages);

  // Verifies every invariant (tree shape and child keys, node lengths, page
  // ownership and the pool, reference counts, counters, the LRU set); throws
  // Error describing the first violation. O(tree + pool): for tests.
  void check() const;

  // See Export. Error on a handle that is not a live node.
  Export export_tree(std::span<const int32_t> nodes) const;

  int64_t num_pages() const { return pool_.num_pages(); }
  int page_size() const { return page_size_; }
  int64_t num_free_pages() const { return pool_.num_free(); }
  int64_t num_cached_pages() const { return cached_pages_; }
  // Pages of unlocked nodes: what evicting everything would free.
  int64_t num_evictable_pages() const { return evictable_pages_; }
  // Read-only view of the pool (which pages are free).
  const KvPagePool& pool() const { return pool_; }
  // Live nodes, the root included.
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_nodes_.size()); }

 private:
  // Orders child keys (a child's first page of tokens) lexicographically;
  // transparent so that a lookup takes a span of the query without a copy.
  struct TokensLess {
    using is_transparent = void;
    bool operator()(std::span<const int32_t> a, std::span<const int32_t> b) const;
  };

  struct RadixNode {
    int32_t parent = -1;
    bool alive = false;
    // int64: an engine that locks without unlocking cannot wrap them (2^63 calls).
    int64_t locks = 0;           // lock() calls on this node not yet unlocked
    int64_t refs = 0;            // locks + the children's refs: locks in the subtree
    uint64_t last_access = 0;    // clock_ at the last match/insert through it
    std::vector<int32_t> tokens; // whole pages
    std::vector<int32_t> pages;  // tokens.size() / page_size ids
    std::map<std::vector<int32_t>, int32_t, TokensLess> children;  // first page -> node
  };

  // The live node `node`, or Error naming `what` and the handle.
  const RadixNode& live(int32_t node, const char* what) const;
  std::span<const int32_t> first_page(const RadixNode& n) const {
    return std::span<const int32_t>(n.tokens).first(static_cast<size_t>(page_size_));
  }
  // Pages of `tokens` from `at` (in tokens) that equal node n's, from its start.
  int64_t common_pages(const RadixNode& n, std::span<const int32_t> tokens, size_t at) const;
  // Makes node's first k pages a new node (its parent), returns the new node.
  int32_t split(int32_t node, int64_t k);
  int32_t new_node();
  void set_last_access(int32_t node, uint64_t t);
  // Evictable leaves: alive, not the root, no children, refs == 0.
  bool is_evictable_leaf(const RadixNode& n, int32_t id) const;
  void lru_update(int32_t node);  // (re)files node in lru_ after a change
  void remove_leaf(int32_t node); // frees its pages and its handle

  int page_size_;
  KvPagePool pool_;
  std::vector<RadixNode> nodes_;    // by handle; nodes_[kRoot] is the root
  std::vector<int32_t> free_nodes_; // dead handles, reused first
  std::vector<int32_t> page_node_;  // per page id: owning node, or -1
  std::set<std::pair<uint64_t, int32_t>> lru_;  // evictable leaves by (last_access, id)
  uint64_t clock_ = 0;
  int64_t cached_pages_ = 0;
  int64_t evictable_pages_ = 0;     // pages of non-root nodes with refs == 0
  std::vector<uint32_t> mark_;      // per page id: scratch for duplicate checks
  uint32_t mark_epoch_ = 0;
};

}  // namespace treeattn
