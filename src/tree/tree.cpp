// Tree indexing, workload validation and page allocation.
#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "treeattn/tree.hpp"

namespace treeattn {

namespace {
std::string node_field(int32_t v, const char* field) {
  return "node " + std::to_string(v) + ": " + field;
}
}  // namespace

TreeIndex TreeIndex::build(const Tree& tree, const std::vector<int32_t>& query_nodes) {
  TreeIndex ix;
  ix.rebuild(tree, query_nodes);
  return ix;
}

void TreeIndex::rebuild(const Tree& tree, const std::vector<int32_t>& query_nodes) {
  const int32_t n = static_cast<int32_t>(tree.nodes.size());
  TreeIndex& ix = *this;
  if (complete_ && ix.parent.size() == size_t(n) && built_queries_ == query_nodes) {
    bool same = true;
    for (int32_t v = 0; v < n; ++v) {
      same &= tree.nodes[v].parent == ix.parent[v];
      ix.tokens[v] = tree.nodes[v].num_tokens;
    }
    if (same) {
      for (const int32_t r : ix.roots) ix.path_tokens[r] = ix.tokens[r];
      for (size_t i = ix.roots.size(); i < ix.bfs_order.size(); ++i) {
        const int32_t c = ix.bfs_order[i];
        ix.path_tokens[c] = ix.path_tokens[ix.parent[c]] + ix.tokens[c];
      }
      return;
    }
  }
  complete_ = false;  // until the arrays below are all the tree's
  ix.roots.clear();
  ix.parent.resize(size_t(n));
  ix.tokens.resize(size_t(n));
  ix.child_offset.assign(n + 1, 0);
  for (int32_t v = 0; v < n; ++v) {
    const int32_t p = tree.nodes[v].parent;
    ix.parent[v] = p;
    ix.tokens[v] = tree.nodes[v].num_tokens;
    if (p == -1) {
      ix.roots.push_back(v);
    } else if (p < 0 || p >= n) {
      throw Error(node_field(v, "parent") + " = " + std::to_string(p) + " is out of range [-1, " +
                  std::to_string(n) + ")");
    } else if (p == v) {
      throw Error(node_field(v, "parent") + " = " + std::to_string(p) + " is the node itself (a cycle)");
    } else {
      ++ix.child_offset[p + 1];
    }
  }
  std::partial_sum(ix.child_offset.begin(), ix.child_offset.end(), ix.child_offset.begin());
  ix.children.resize(ix.child_offset[n]);
  // depth doubles as the fill position of each node's children until the BFS.
  std::vector<int32_t>& fill = ix.depth;
  fill.assign(ix.child_offset.begin(), ix.child_offset.end() - 1);
  for (int32_t v = 0; v < n; ++v)
    if (ix.parent[v] >= 0) ix.children[fill[ix.parent[v]]++] = v;

  // BFS from the roots; nodes never reached lie on a cycle. Each node's
  // children, in one block, follow those of the nodes before it (copied in
  // a plain loop: most blocks hold a few nodes, where a memmove call costs
  // more than the copy).
  ix.depth.assign(n, -1);
  ix.path_tokens.resize(size_t(n));
  ix.bfs_order.resize(size_t(n));
  size_t placed = 0;
  for (int32_t r : ix.roots) ix.bfs_order[placed++] = r;
  for (size_t i = 0; i < placed; ++i) {
    const int32_t v = ix.bfs_order[i], first = ix.child_offset[v], count = ix.child_offset[v + 1] - first;
    const int32_t* const from = ix.children.data() + first;
    int32_t* const to = ix.bfs_order.data() + placed;
    for (int32_t k = 0; k < count; ++k) to[k] = from[k];
    placed += size_t(count);
  }
  ix.bfs_order.resize(placed);
  // Depths and path tokens, parents first.
  for (const int32_t r : ix.roots) {
    ix.depth[r] = 0;
    ix.path_tokens[r] = ix.tokens[r];
  }
  for (size_t i = ix.roots.size(); i < placed; ++i) {
    const int32_t c = ix.bfs_order[i], v = ix.parent[c];
    ix.depth[c] = ix.depth[v] + 1;
    ix.path_tokens[c] = ix.path_tokens[v] + ix.tokens[c];
  }
  if (static_cast<int32_t>(placed) != n) {
    for (int32_t v = 0; v < n; ++v)
      if (ix.depth[v] < 0)
        throw Error(node_field(v, "parent") + " = " + std::to_string(tree.nodes[v].parent) +
                    " closes a cycle (node is not reachable from any root)");
  }

  ix.subtree_queries.assign(n, 0);
  for (size_t i = 0; i < query_nodes.size(); ++i) {
    int32_t q = query_nodes[i];
    if (q < 0 || q >= n)
      throw Error("query " + std::to_string(i) + ": node = " + std::to_string(q) +
                  " is out of range [0, " + std::to_string(n) + ")");
    ++ix.subtree_queries[q];
  }
  for (size_t i = placed; i-- > ix.roots.size();) {
    const int32_t v = ix.bfs_order[i], p = ix.parent[v];
    ix.subtree_queries[p] += ix.subtree_queries[v];
  }
  // Query numbers top-down: the roots' ranges one after another, and each
  // child's range placed back from the end of its parent's.
  ix.query_begin.resize(size_t(n));
  int32_t at = 0;
  for (const int32_t r : ix.roots) {
    ix.query_begin[r] = at;
    at += ix.subtree_queries[r];
  }
  for (const int32_t v : ix.bfs_order) {
    int32_t child_at = ix.query_begin[v] + ix.subtree_queries[v];
    for (int32_t k = ix.child_offset[v + 1] - 1; k >= ix.child_offset[v]; --k) {
      child_at -= ix.subtree_queries[ix.children[k]];
      ix.query_begin[ix.children[k]] = child_at;
    }
  }
  built_queries_.assign(query_nodes.begin(), query_nodes.end());
  complete_ = true;
}

std::vector<int32_t> Workload::path(int32_t node) const {
  const int64_t n = int64_t(tree.nodes.size());
  if (node < 0 || node >= n)
    throw Error("path: node = " + std::to_string(node) + " is out of range [0, " + std::to_string(n) + ")");
  std::vector<int32_t> p;
  // Bounded by the node count and range-checked: an unvalidated tree's parent
  // out of range or cycle is an Error, not a read past nodes or an endless walk.
  for (int32_t v = node; v >= 0; v = tree.nodes[size_t(v)].parent) {
    if (v >= n || int64_t(p.size()) == n)
      throw Error("path: node " + std::to_string(p.back()) + ": parent = " + std::to_string(v) +
                  (v >= n ? " is out of range [-1, " + std::to_string(n) + ")" : " closes a cycle"));
    p.push_back(v);
  }
  std::reverse(p.begin(), p.end());
  return p;
}

int64_t Workload::total_tokens() const {
  int64_t t = 0;
  for (const Node& n : tree.nodes) t += n.num_tokens;
  return t;
}

int64_t Workload::kv_bytes_per_token() const {
  return int64_t(heads.num_kv_heads) * heads.head_dim * 2 * int64_t(dtype_size(layout.kv_type()));
}

void Workload::validate(ValidateScratch* scratch) const {
  heads.validate();
  for (const auto& [t, field] : {std::pair{layout.dtype, "dtype"}, std::pair{layout.kv_type(), "kv_dtype"}})
    if (uint8_t(t) > uint8_t(DType::fp8_e4m3))  // an enum cast from a number: no executor would read or write it
      throw Error(std::string(field) + ": " + std::to_string(int(t)) + " is not a DType (fp16, bf16, fp32, fp8_e4m3)");
  if (layout.dtype == DType::fp8_e4m3)
    throw Error("dtype: fp8_e4m3 is a storage type of the K/V pools only (q and out are fp16, bf16 or fp32; set "
                "kv_dtype)");
  if (layout.kv_type() != layout.dtype && layout.kv_type() != DType::fp8_e4m3)
    throw Error("kv_dtype: " + std::string(to_string(layout.kv_type())) + " with dtype " +
                std::string(to_string(layout.dtype)) + " (the K/V pools are of the dtype or fp8_e4m3)");
  const int ps = layout.page_size;
  if (ps <= 0 || ps > 65536)
    throw Error("page_size: " + std::to_string(ps) + " is out of range [1, 65536]");
  if (layout.num_pages < 0)
    throw Error("num_pages: " + std::to_string(layout.num_pages) + " is negative");
  if (tree.nodes.empty()) throw Error("tree: the tree has no nodes");
  if (tree.nodes.size() > size_t(std::numeric_limits<int32_t>::max() / 2))
    throw Error("tree: " + std::to_string(tree.nodes.size()) + " nodes exceed the 32-bit node index");
  if (query_nodes.empty()) throw Error("queries: the workload has no queries");

  // Per-node token offsets are 32-bit; the pool's element offsets 64-bit.
  check_pool_size(layout.num_pages, ps, heads);
  const __int128 q_elems = __int128(query_nodes.size()) * heads.num_qo_heads * heads.head_dim;
  if (q_elems > std::numeric_limits<int32_t>::max())
    throw Error("queries: " + std::to_string(query_nodes.size()) + " queries x " +
                std::to_string(heads.num_qo_heads) + " qo heads x " + std::to_string(heads.head_dim) +
                " overflow 32-bit row indexing");

  // Page uses: every slot of the pool is used by at most one node. Whole-page
  // uses are checked with a bit per pool page when the pool is not much
  // larger than the tree (or the caller keeps a scratch), so that a decode
  // loop pays O(pages); partial pages (a node's last page, or its first when
  // it starts inside one) are sorted by (page, first slot) to find overlaps
  // when two share a page. Otherwise every use is sorted: memory follows the
  // pages the tree uses, not num_pages (which may be up to 2^46 / row size).
  // A kept scratch (the runtime's) has the bits whatever the tree, up to
  // num_pages = 2^30: num_pages / 4 bytes (256 MiB at 2^30), against a K pool
  // of num_pages x page_size x kv heads x head_dim elements that run() requires.
  using PageUse = ValidateScratch::PageUse;
  const bool pages_checked = scratch && scratch->pages_checked;
  int64_t refs = 0;
  if (!pages_checked)
    for (const Node& n : tree.nodes) refs += int64_t(n.pages.size());
  ValidateScratch local;
  ValidateScratch* sc = pages_checked ? nullptr : scratch;
  if (!sc && !pages_checked && layout.num_pages <= 4 * refs + 65536) sc = &local;
  if (sc && layout.num_pages > (int64_t(1) << 30)) sc = nullptr;
  const size_t words = size_t((layout.num_pages + 63) / 64);
  if (sc && sc->page_used.size() < words) {
    sc->page_used.assign(words, 0);
    sc->page_partial.assign(words, 0);
  }
  // The bits are clear between calls: cleared on the way out, thrown or not,
  // unless the caller keeps them (keep_page_bits) and the tree passed.
  if (scratch) scratch->page_bits_kept = scratch->pages_shared = false;
  struct ClearBits {
    ValidateScratch* sc;
    const Tree& tree;
    size_t words;
    int64_t refs;
    bool keep = false;
    ~ClearBits() {
      if (!sc || keep) return;
      if (int64_t(words) <= refs) {
        std::fill_n(sc->page_used.begin(), words, 0);
        std::fill_n(sc->page_partial.begin(), words, 0);
        return;
      }
      for (const Node& n : tree.nodes)
        for (const int32_t pg : n.pages)
          if (pg >= 0 && size_t(pg) / 64 < words) {
            sc->page_used[size_t(pg) / 64] = 0;
            sc->page_partial[size_t(pg) / 64] = 0;
          }
    }
  } clear_bits{sc, tree, words, refs};
  // The first node (in node order) that uses page pg: the owner a conflict names.
  const auto first_user = [&](int32_t pg) {
    for (int32_t v = 0; v < static_cast<int32_t>(tree.nodes.size()); ++v)
      if (std::find(tree.nodes[v].pages.begin(), tree.nodes[v].pages.end(), pg) != tree.nodes[v].pages.end()) return v;
    return int32_t(-1);
  };
  auto conflict = [&](int32_t node, int32_t page, int32_t begin, int32_t end, int32_t other) {
    throw Error(node_field(node, "pages") + ": page id " + std::to_string(page) + " slots [" + std::to_string(begin) +
                ", " + std::to_string(end) + ") are also used by node " + std::to_string(other));
  };
  std::vector<PageUse> local_uses;
  std::vector<PageUse>& uses = sc ? sc->partial_uses : local_uses;  // partial uses only with the bits, else all
  uses.clear();
  // With the bits, uses[0 .. partial_uses) are the partial uses so far, at
  // most two a node (its first and last pages).
  size_t partial_uses = 0;
  if (sc) uses.resize(2 * tree.nodes.size());
  bool shared_partial_page = !sc && !pages_checked;  // some page is used by two partial uses: they are sorted to find overlaps
  int64_t total = 0;
  for (int32_t v = 0; v < static_cast<int32_t>(tree.nodes.size()); ++v) {
    const Node& n = tree.nodes[v];
    if (n.num_tokens < 0)
      throw Error(node_field(v, "num_tokens") + " = " + std::to_string(n.num_tokens) + " is negative");
    if (n.first_slot < 0 || n.first_slot >= ps)
      throw Error(node_field(v, "first_slot") + " = " + std::to_string(n.first_slot) + " is out of range [0, " +
                  std::to_string(ps) + ")");
    const int64_t end_slot = int64_t(n.first_slot) + n.num_tokens;  // one past the node's last slot
    // Pages needed: none for no tokens, else ceil(end_slot / ps), checked as
    // (pages - 1) * ps < end_slot <= pages * ps (no division per node).
    const int64_t have = int64_t(n.pages.size());
    const bool fits = n.num_tokens == 0 ? have == 0 : have > 0 && (have - 1) * ps < end_slot && end_slot <= have * ps;
    if (!fits) {
      const int64_t need = n.num_tokens == 0 ? 0 : (end_slot + ps - 1) / ps;
      throw Error(node_field(v, "pages") + ": " + std::to_string(n.pages.size()) + " pages for " +
                  std::to_string(n.num_tokens) + " tokens from slot " + std::to_string(n.first_slot) +
                  " with page_size " + std::to_string(ps) + " (expected " + std::to_string(need) + ")");
    }
    total += n.num_tokens;
    if (pages_checked) continue;
    // Page i holds slots [begin, end): only the first page can start late,
    // only the last end early.
    const size_t last = n.pages.size() - 1;
    const auto out_of_range = [&](int32_t pg) {
      throw Error(node_field(v, "pages") + ": page id " + std::to_string(pg) + " is out of range [0, " +
                  std::to_string(layout.num_pages) + ")");
    };
    // Page i as a PageUse: all pages without the bits, else the first and last.
    const auto use_page = [&](size_t i) {
      const int32_t pg = n.pages[i];
      if (pg < 0 || pg >= layout.num_pages) out_of_range(pg);
      const PageUse u{pg, i == 0 ? n.first_slot : 0, i == last ? int32_t(end_slot - int64_t(i) * ps) : ps, v};
      if (!sc) {
        uses.push_back(u);
        return;
      }
      const bool whole = u.begin == 0 && u.end == ps;
      uint64_t &used = sc->page_used[size_t(pg) / 64], &partial = sc->page_partial[size_t(pg) / 64];
      const uint64_t bit = uint64_t(1) << (pg % 64);
      if (used & bit) {
        if (whole || !(partial & bit)) conflict(v, pg, u.begin, u.end, first_user(pg));
        shared_partial_page = true;
      }
      // Whether a first or last page is partial is data: no branch on it.
      used |= bit;
      partial |= whole ? 0 : bit;
      uses[partial_uses] = u;
      partial_uses += !whole;
    };
    if (!sc) {
      for (size_t i = 0; i < n.pages.size(); ++i) use_page(i);
    } else if (!n.pages.empty()) {
      use_page(0);
      // Inner pages are used whole: each must be in range (num_pages <= 2^30
      // here) and its bit clear. The loop stops at the first that is not,
      // with the bits of the pages before it set, as a page-by-page check.
      const int32_t* pages = n.pages.data();
      uint64_t* used = sc->page_used.data();
      const uint32_t limit = uint32_t(layout.num_pages);
      size_t i = 1;
      for (; i < last; ++i) {
        const uint32_t pg = uint32_t(pages[i]);
        if (pg >= limit) break;
        const uint64_t bit = uint64_t(1) << (pg % 64);
        if (used[pg / 64] & bit) break;
        used[pg / 64] |= bit;
      }
      if (i < last) {
        if (pages[i] < 0 || pages[i] >= layout.num_pages) out_of_range(pages[i]);
        conflict(v, pages[i], 0, ps, first_user(pages[i]));
      }
      if (last > 0) use_page(last);
    }
  }
  if (sc) uses.resize(partial_uses);
  // A page used by two nodes, in part each (any other reuse is refused):
  // ValidateScratch::pages_shared.
  bool pages_shared = false;
  if (total > (int64_t(1) << 40)) throw Error("tree: " + std::to_string(total) + " tokens is absurd");
  if (shared_partial_page) {
    std::sort(uses.begin(), uses.end(), [](const PageUse& a, const PageUse& b) {
      return a.page != b.page ? a.page < b.page : a.begin < b.begin;
    });
    for (size_t i = 1; i < uses.size(); ++i) {
      if (uses[i].page == uses[i - 1].page && uses[i].begin < uses[i - 1].end)
        conflict(uses[i].node, uses[i].page, uses[i].begin, uses[i].end, uses[i - 1].node);
      pages_shared |= uses[i].page == uses[i - 1].page;
    }
  }
  TreeIndex local_index;
  TreeIndex& ix = scratch ? scratch->index : local_index;
  ix.rebuild(tree, query_nodes);  // parents, cycles, query nodes
  for (size_t q = 0; q < query_nodes.size(); ++q)
    if (ix.path_tokens[query_nodes[q]] > kMaxPathTokens)
      throw Error("query " + std::to_string(q) + ": its path (root to node " + std::to_string(query_nodes[q]) +
                  ") holds " + std::to_string(ix.path_tokens[query_nodes[q]]) +
                  " tokens, over the limit of 2^30 (kMaxPathTokens)");
  if (scratch) {
    scratch->pages_shared = pages_shared;
    clear_bits.keep = scratch->page_bits_kept = sc && scratch->keep_page_bits;
  }
}

int32_t PageAllocator::add_node(Tree& tree, int32_t parent, int32_t num_tokens) {
  if (num_tokens < 0) throw Error("num_tokens: " + std::to_string(num_tokens) + " is negative");
  Node n;
  n.parent = parent;
  n.num_tokens = num_tokens;
  const int64_t pages = (int64_t(num_tokens) + page_size_ - 1) / page_size_;
  for (int64_t i = 0; i < pages; ++i) n.pages.push_back(static_cast<int32_t>(next_page_++));
  if (next_page_ > std::numeric_limits<int32_t>::max())
    throw Error("num_pages: more than 2^31 pages requested");
  tree.nodes.push_back(std::move(n));
  return static_cast<int32_t>(tree.nodes.size() - 1);
}

int64_t PageAllocator::finish(Tree& tree) const {
  std::vector<int32_t> perm(static_cast<size_t>(next_page_));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed_);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (Node& n : tree.nodes)
    for (int32_t& p : n.pages) p = perm[p];
  return next_page_;
}

}  // namespace treeattn
