// RadixCache: the radix tree over token ids at page granularity, its reference
// counts and its LRU eviction. Every operation validates its input before it
// changes anything, so an Error always leaves the cache as it was.
//
// Invariants kept here (check() verifies them all):
//  - a node's tokens are whole pages (> 0 except the root); its children are
//    keyed by their first page of tokens, so two children never share one;
//  - refs = locks + the children's refs, so a node's refs bound its subtree's;
//  - a node's last_access is never newer than its parent's: every match or
//    insert stamps the whole path, so LRU order evicts leaves before parents;
//  - each page is free, cached by exactly one node (page_node_), or handed out;
//  - lru_ holds exactly the evictable leaves (unlocked, childless, not the root).
#include <algorithm>
#include <unordered_map>

#include "treeattn/cache.hpp"

namespace treeattn {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
std::string node_str(int32_t v) { return "node " + str(v); }
}  // namespace

bool RadixCache::TokensLess::operator()(std::span<const int32_t> a, std::span<const int32_t> b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

RadixCache::RadixCache(int64_t num_pages, int page_size) : page_size_(page_size), pool_(num_pages) {
  if (page_size < 1) throw Error("kv cache: page_size = " + str(page_size) + " must be >= 1");
  nodes_.emplace_back();
  nodes_[kRoot].alive = true;
  page_node_.assign(static_cast<size_t>(num_pages), -1);
  mark_.assign(static_cast<size_t>(num_pages), 0);
}

const RadixCache::RadixNode& RadixCache::live(int32_t node, const char* what) const {
  if (node < 0 || static_cast<size_t>(node) >= nodes_.size() || !nodes_[static_cast<size_t>(node)].alive)
    throw Error(std::string("kv cache: ") + what + ": " + node_str(node) +
                " is not a live node (evicted, or never returned by match_prefix/insert)");
  return nodes_[static_cast<size_t>(node)];
}

int64_t RadixCache::common_pages(const RadixNode& n, std::span<const int32_t> tokens, size_t at) const {
  const size_t ps = static_cast<size_t>(page_size_);
  int64_t k = 0;
  for (size_t off = 0; off < n.tokens.size() && at + off + ps <= tokens.size(); off += ps, ++k) {
    if (!std::equal(n.tokens.begin() + static_cast<ptrdiff_t>(off),
                    n.tokens.begin() + static_cast<ptrdiff_t>(off + ps), tokens.begin() + static_cast<ptrdiff_t>(at + off)))
      break;
  }
  return k;
}

int32_t RadixCache::new_node() {
  int32_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[static_cast<size_t>(id)].alive = true;
  return id;
}

bool RadixCache::is_evictable_leaf(const RadixNode& n, int32_t id) const {
  return id != kRoot && n.alive && n.refs == 0 && n.children.empty();
}

void RadixCache::lru_update(int32_t node) {
  RadixNode& n = nodes_[static_cast<size_t>(node)];
  lru_.erase({n.last_access, node});
  if (is_evictable_leaf(n, node)) lru_.insert({n.last_access, node});
}

void RadixCache::set_last_access(int32_t node, uint64_t t) {
  RadixNode& n = nodes_[static_cast<size_t>(node)];
  lru_.erase({n.last_access, node});
  n.last_access = t;
  lru_update(node);
}

int32_t RadixCache::split(int32_t node, int64_t k) {
  const int32_t top = new_node();  // may move nodes_: take references after it
  RadixNode& c = nodes_[static_cast<size_t>(node)];
  RadixNode& n = nodes_[static_cast<size_t>(top)];
  const auto kt = static_cast<ptrdiff_t>(k * page_size_);
  // The new node takes the first k pages and the place under the parent; the
  // old handle keeps the deeper part, so it still denotes the same token path.
  // Locks stay on the old node: the new one has its refs and no locks of its own.
  n.parent = c.parent;
  n.refs = c.refs;
  n.last_access = c.last_access;
  n.tokens.assign(c.tokens.begin(), c.tokens.begin() + kt);
  n.pages.assign(c.pages.begin(), c.pages.begin() + static_cast<ptrdiff_t>(k));
  c.tokens.erase(c.tokens.begin(), c.tokens.begin() + kt);
  c.pages.erase(c.pages.begin(), c.pages.begin() + static_cast<ptrdiff_t>(k));
  for (int32_t p : n.pages) page_node_[static_cast<size_t>(p)] = top;
  // The parent's key (the first page) is unchanged; only the node it names.
  nodes_[static_cast<size_t>(n.parent)].children.find(first_page(n))->second = top;
  n.children.emplace(std::vector<int32_t>(first_page(c).begin(), first_page(c).end()), node);
  c.parent = top;
  // Counters and lru_ are unchanged: pages only moved between nodes of equal
  // refs, the old node keeps its children and its (last_access, id) key, and
  // the new node has a child.
  return top;
}

RadixCache::Match RadixCache::match_prefix(std::span<const int32_t> tokens) {
  const size_t ps = static_cast<size_t>(page_size_);
  const uint64_t t = ++clock_;
  Match m;
  int32_t cur = kRoot;
  size_t at = 0;
  nodes_[kRoot].last_access = t;
  while (at + ps <= tokens.size()) {
    auto& children = nodes_[static_cast<size_t>(cur)].children;
    auto it = children.find(tokens.subspan(at, ps));
    if (it == children.end()) break;
    int32_t child = it->second;
    const int64_t k = common_pages(nodes_[static_cast<size_t>(child)], tokens, at);  // >= 1: the key matched
    if (k < static_cast<int64_t>(nodes_[static_cast<size_t>(child)].pages.size())) child = split(child, k);
    set_last_access(child, t);
    const auto& pages = nodes_[static_cast<size_t>(child)].pages;
    m.pages.insert(m.pages.end(), pages.begin(), pages.end());
    at += static_cast<size_t>(k) * ps;
    cur = child;
  }
  m.node = cur;
  m.num_tokens = static_cast<int64_t>(at);
  return m;
}

RadixCache::Match RadixCache::peek_prefix(std::span<const int32_t> tokens) const {
  const size_t ps = static_cast<size_t>(page_size_);
  Match m;
  int32_t cur = kRoot;
  size_t at = 0;
  while (at + ps <= tokens.size()) {
    const auto& children = nodes_[static_cast<size_t>(cur)].children;
    auto it = children.find(tokens.subspan(at, ps));
    if (it == children.end()) break;
    const RadixNode& child = nodes_[static_cast<size_t>(it->second)];
    const int64_t k = common_pages(child, tokens, at);
    m.pages.insert(m.pages.end(), child.pages.begin(), child.pages.begin() + static_cast<ptrdiff_t>(k));
    at += static_cast<size_t>(k) * ps;
    if (k < static_cast<int64_t>(child.pages.size())) break;  // ends inside child
    cur = it->second;
  }
  m.node = cur;
  m.num_tokens = static_cast<int64_t>(at);
  return m;
}

void RadixCache::lock(int32_t node) {
  live(node, "lock");
  nodes_[static_cast<size_t>(node)].locks++;
  for (int32_t v = node; v != -1; v = nodes_[static_cast<size_t>(v)].parent) {
    RadixNode& n = nodes_[static_cast<size_t>(v)];
    if (n.refs++ == 0 && v != kRoot) {
      evictable_pages_ -= static_cast<int64_t>(n.pages.size());
      lru_update(v);
    }
  }
}

void RadixCache::unlock(int32_t node) {
  const RadixNode& target = live(node, "unlock");
  if (target.locks == 0)
    throw Error("kv cache: unlock: " + node_str(node) + " is not locked" +
                (target.refs > 0 ? " (locks held on nodes below it: " + str(target.refs) + ")" : std::string()));
  nodes_[static_cast<size_t>(node)].locks--;
  for (int32_t v = node; v != -1; v = nodes_[static_cast<size_t>(v)].parent) {
    RadixNode& n = nodes_[static_cast<size_t>(v)];
    if (--n.refs == 0 && v != kRoot) {
      evictable_pages_ += static_cast<int64_t>(n.pages.size());
      lru_update(v);
    }
  }
}

std::vector<int32_t> RadixCache::alloc(int64_t n) {
  if (n < 0) throw Error("kv cache: alloc of " + str(n) + " pages (must be >= 0)");
  const int64_t free = pool_.num_free();
  // Every unlocked page can be evicted: unlocked nodes have unlocked subtrees,
  // which become leaves once their descendants are gone.
  if (n > free + evictable_pages_) {
    const int64_t locked = cached_pages_ - evictable_pages_;
    const int64_t handed_out = num_pages() - free - cached_pages_;
    throw Error("kv cache: " + str(n) + " pages requested, " + str(free) + " free + " + str(evictable_pages_) +
                " evictable of " + str(num_pages()) + " (" + str(locked) + " cached and locked, " +
                str(handed_out) + " handed out to requests)");
  }
  if (n > free) evict(n - free);
  return pool_.alloc(n);
}

void RadixCache::free(std::span<const int32_t> pages) {
  for (size_t i = 0; i < pages.size(); ++i) {
    const int32_t p = pages[i];
    if (p >= 0 && p < num_pages() && page_node_[static_cast<size_t>(p)] >= 0)
      throw Error("kv cache: free: pages[" + str(static_cast<int64_t>(i)) + "] = " + str(p) + " is cached by " +
                  node_str(page_node_[static_cast<size_t>(p)]) + "; only pages handed out by alloc can be freed");
  }
  pool_.free(pages);  // range, double free and repeats; throws before changing anything
}

int32_t RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages) {
  const size_t ps = static_cast<size_t>(page_size_);
  if (tokens.size() % ps != 0)
    throw Error("kv cache: insert: tokens.size() = " + str(static_cast<int64_t>(tokens.size())) +
                " is not a multiple of page_size = " + str(page_size_));
  const size_t num_new_pages = tokens.size() / ps;
  if (pages.size() != num_new_pages)
    throw Error("kv cache: insert: pages.size() = " + str(static_cast<int64_t>(pages.size())) +
                " but tokens.size() = " + str(static_cast<int64_t>(tokens.size())) + " needs " +
                str(static_cast<int64_t>(num_new_pages)) + " (page_size " + str(page_size_) + ")");

  // Validate every page before changing anything. Where the prefix is cached a
  // page is the cached one itself or a handed-out duplicate; beyond it, handed out.
  const Match cached = peek_prefix(tokens);
  if (++mark_epoch_ == 0) {  // wrapped: clear the stale marks once
    std::fill(mark_.begin(), mark_.end(), 0u);
    mark_epoch_ = 1;
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const int32_t p = pages[i];
    auto fail = [&](const std::string& why) {
      throw Error("kv cache: insert: pages[" + str(static_cast<int64_t>(i)) + "] = " + str(p) + why);
    };
    if (p < 0 || p >= num_pages()) fail(" is out of range [0, " + str(num_pages()) + ")");
    uint32_t& mark = mark_[static_cast<size_t>(p)];
    if (mark == mark_epoch_) fail(" is listed twice");
    mark = mark_epoch_;
    if (i < cached.pages.size() && cached.pages[i] == p) continue;
    if (pool_.is_free(p)) fail(" is free (not handed out by alloc)");
    if (page_node_[static_cast<size_t>(p)] >= 0)
      fail(" is cached by " + node_str(page_node_[static_cast<size_t>(p)]) +
           (i < cached.pages.size() ? " but this position caches page " + str(cached.pages[i]) : std::string()));
  }

  const uint64_t t = ++clock_;
  nodes_[kRoot].last_access = t;
  std::vector<int32_t> duplicates;
  int32_t cur = kRoot;
  size_t i = 0;  // pages consumed
  while (i < num_new_pages) {
    const size_t at = i * ps;
    auto& children = nodes_[static_cast<size_t>(cur)].children;
    auto it = children.find(tokens.subspan(at, ps));
    if (it == children.end()) {
      // The rest is new: one leaf.
      const int32_t leaf = new_node();
      RadixNode& l = nodes_[static_cast<size_t>(leaf)];
      l.parent = cur;
      l.last_access = t;
      l.tokens.assign(tokens.begin() + static_cast<ptrdiff_t>(at), tokens.end());
      l.pages.assign(pages.begin() + static_cast<ptrdiff_t>(i), pages.end());
      for (int32_t p : l.pages) page_node_[static_cast<size_t>(p)] = leaf;
      const auto added = static_cast<int64_t>(l.pages.size());
      cached_pages_ += added;
      evictable_pages_ += added;  // a new leaf has no locks
      nodes_[static_cast<size_t>(cur)].children.emplace(
          std::vector<int32_t>(first_page(l).begin(), first_page(l).end()), leaf);
      lru_update(cur);  // no longer a leaf
      lru_update(leaf);
      cur = leaf;
      break;
    }
    int32_t child = it->second;
    const int64_t k = common_pages(nodes_[static_cast<size_t>(child)], tokens, at);
    if (k < static_cast<int64_t>(nodes_[static_cast<size_t>(child)].pages.size())) child = split(child, k);
    const auto& owned = nodes_[static_cast<size_t>(child)].pages;
    for (int64_t j = 0; j < k; ++j)
      if (pages[i + static_cast<size_t>(j)] != owned[static_cast<size_t>(j)])
        duplicates.push_back(pages[i + static_cast<size_t>(j)]);
    set_last_access(child, t);
    i += static_cast<size_t>(k);
    cur = child;
  }
  pool_.free(duplicates);  // validated above: handed out, distinct
  return cur;
}

void RadixCache::remove_leaf(int32_t node) {
  RadixNode& n = nodes_[static_cast<size_t>(node)];
  lru_.erase({n.last_access, node});
  pool_.free(n.pages);
  for (int32_t p : n.pages) page_node_[static_cast<size_t>(p)] = -1;
  cached_pages_ -= static_cast<int64_t>(n.pages.size());
  evictable_pages_ -= static_cast<int64_t>(n.pages.size());  // refs == 0: it was counted
  const int32_t parent = n.parent;
  auto& siblings = nodes_[static_cast<size_t>(parent)].children;
  siblings.erase(siblings.find(first_page(n)));
  n = RadixNode{};  // alive = false
  free_nodes_.push_back(node);
  lru_update(parent);  // may have become an evictable leaf
}

int64_t RadixCache::evict(int64_t num_pages) {
  if (num_pages < 0) throw Error("kv cache: evict of " + str(num_pages) + " pages (must be >= 0)");
  int64_t freed = 0;
  while (freed < num_pages && !lru_.empty()) {
    const int32_t leaf = lru_.begin()->second;
    freed += static_cast<int64_t>(nodes_[static_cast<size_t>(leaf)].pages.size());
    remove_leaf(leaf);
  }
  return freed;
}

RadixCache::Export RadixCache::export_tree(std::span<const int32_t> nodes) const {
  Export e;
  e.page_offsets.push_back(0);
  e.node_index.reserve(nodes.size());
  std::unordered_map<int32_t, int32_t> index;  // radix handle -> position in e
  std::vector<int32_t> chain;
  for (int32_t r : nodes) {
    live(r, "export_tree");
    if (r == kRoot) {
      e.node_index.push_back(-1);
      continue;
    }
    // Walk up to the root or to a node already exported, then emit top-down so
    // that parents come before children.
    chain.clear();
    int32_t v = r;
    for (; v != kRoot && !index.contains(v); v = nodes_[static_cast<size_t>(v)].parent) chain.push_back(v);
    int32_t parent = v == kRoot ? -1 : index.at(v);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const RadixNode& n = nodes_[static_cast<size_t>(*it)];
      const auto idx = static_cast<int32_t>(e.parents.size());
      index.emplace(*it, idx);
      e.parents.push_back(parent);
      e.num_tokens.push_back(static_cast<int32_t>(n.tokens.size()));
      e.page_ids.insert(e.page_ids.end(), n.pages.begin(), n.pages.end());
      e.page_offsets.push_back(static_cast<int32_t>(e.page_ids.size()));
      parent = idx;
    }
    e.node_index.push_back(index.at(r));
  }
  return e;
}

void RadixCache::check() const {
  auto fail = [](const std::string& what) { throw Error("kv cache: check: " + what); };
  pool_.check();
  const RadixNode& root = nodes_[kRoot];
  if (!root.alive || root.parent != -1 || !root.tokens.empty() || !root.pages.empty())
    fail("the root must be alive, parentless and empty");

  // Handles: live ones plus the reusable ones are all of them.
  int64_t num_alive = 0;
  for (const RadixNode& n : nodes_) num_alive += n.alive;
  std::vector<uint8_t> seen(nodes_.size(), 0);
  for (int32_t v : free_nodes_) {
    if (v < 0 || static_cast<size_t>(v) >= nodes_.size() || nodes_[static_cast<size_t>(v)].alive ||
        seen[static_cast<size_t>(v)]++)
      fail("free handle " + str(v) + " is out of range, live or listed twice");
  }
  if (num_alive + static_cast<int64_t>(free_nodes_.size()) != static_cast<int64_t>(nodes_.size()))
    fail(str(num_alive) + " live nodes + " + str(static_cast<int64_t>(free_nodes_.size())) +
         " free handles != " + str(static_cast<int64_t>(nodes_.size())) + " handles");

  const size_t ps = static_cast<size_t>(page_size_);
  int64_t owned_pages = 0, evictable = 0, evictable_leaves = 0;
  for (size_t vi = 0; vi < nodes_.size(); ++vi) {
    const RadixNode& n = nodes_[vi];
    if (!n.alive) continue;
    const auto v = static_cast<int32_t>(vi);
    const std::string name = node_str(v);
    if (v != kRoot) {
      if (n.parent < 0 || static_cast<size_t>(n.parent) >= nodes_.size() || !nodes_[static_cast<size_t>(n.parent)].alive)
        fail(name + " has parent " + str(n.parent) + ", not a live node");
      if (n.tokens.empty() || n.tokens.size() % ps != 0)
        fail(name + " has " + str(static_cast<int64_t>(n.tokens.size())) + " tokens, not a positive multiple of page_size " +
             str(page_size_));
      if (n.pages.size() * ps != n.tokens.size())
        fail(name + " has " + str(static_cast<int64_t>(n.pages.size())) + " pages for " +
             str(static_cast<int64_t>(n.tokens.size())) + " tokens");
      const auto& siblings = nodes_[static_cast<size_t>(n.parent)].children;
      auto it = siblings.find(first_page(n));
      if (it == siblings.end() || it->second != v) fail(name + " is not its parent's child under its first page");
      if (n.last_access > nodes_[static_cast<size_t>(n.parent)].last_access)
        fail(name + " was used more recently than its parent " + str(n.parent));
      if (n.refs == 0) evictable += static_cast<int64_t>(n.pages.size());
    }
    if (n.last_access > clock_) fail(name + " has last_access " + str(static_cast<int64_t>(n.last_access)) + " in the future");
    int64_t child_refs = 0;
    for (const auto& [key, c] : n.children) {
      if (c < 0 || static_cast<size_t>(c) >= nodes_.size() || !nodes_[static_cast<size_t>(c)].alive)
        fail(name + " has child " + str(c) + ", not a live node");
      const RadixNode& cn = nodes_[static_cast<size_t>(c)];
      if (cn.parent != v) fail(name + " lists child " + str(c) + " whose parent is " + str(cn.parent));
      if (key.size() != ps || cn.tokens.size() < ps || !std::equal(key.begin(), key.end(), cn.tokens.begin()))
        fail(name + " keys child " + str(c) + " by tokens other than its first page");
      child_refs += cn.refs;
    }
    if (n.locks < 0 || n.refs != n.locks + child_refs)
      fail(name + " has refs " + str(n.refs) + " but " + str(n.locks) + " locks + " + str(child_refs) + " in its children");
    for (int32_t p : n.pages) {
      if (p < 0 || p >= num_pages()) fail(name + " holds page " + str(p) + ", out of range");
      if (page_node_[static_cast<size_t>(p)] != v)
        fail(name + " holds page " + str(p) + " which is recorded as cached by " + str(page_node_[static_cast<size_t>(p)]));
      if (pool_.is_free(p)) fail(name + " holds page " + str(p) + " which is also free");
    }
    owned_pages += static_cast<int64_t>(n.pages.size());
    const bool in_lru = lru_.contains({n.last_access, v});
    if (in_lru != is_evictable_leaf(n, v))
      fail(name + (in_lru ? " is in the LRU set but is not an evictable leaf" : " is an evictable leaf missing from the LRU set"));
    evictable_leaves += in_lru;
  }
  if (static_cast<int64_t>(lru_.size()) != evictable_leaves)
    fail("the LRU set has " + str(static_cast<int64_t>(lru_.size())) + " entries but " + str(evictable_leaves) +
         " evictable leaves (stale entries)");

  // Each non-root node is one child entry; reachability from the root rules out cycles.
  std::vector<uint8_t> reached(nodes_.size(), 0);
  std::vector<int32_t> stack{kRoot};
  int64_t num_reached = 0;
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    if (reached[static_cast<size_t>(v)]++) fail(node_str(v) + " is reached twice from the root");
    ++num_reached;
    for (const auto& [key, c] : nodes_[static_cast<size_t>(v)].children) stack.push_back(c);
  }
  if (num_reached != num_alive)
    fail(str(num_reached) + " nodes reachable from the root but " + str(num_alive) + " live");

  int64_t recorded = 0;
  for (int32_t owner : page_node_) recorded += owner >= 0;
  if (owned_pages != cached_pages_ || recorded != cached_pages_)
    fail("nodes hold " + str(owned_pages) + " pages and " + str(recorded) + " are recorded as cached, counter says " +
         str(cached_pages_));
  if (evictable != evictable_pages_)
    fail(str(evictable) + " pages in unlocked nodes but the counter says " + str(evictable_pages_));
  if (num_free_pages() + cached_pages_ > num_pages())
    fail(str(num_free_pages()) + " free + " + str(cached_pages_) + " cached pages exceed the pool of " + str(num_pages()));
}

}  // namespace treeattn
