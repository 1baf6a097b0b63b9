// RadixCache against a reference model over random operation sequences: the
// model is a map from each cached page's token prefix to its page id, last use
// and lock count. After every operation: check(), no page lost (free + cached
// + handed out == num_pages), the cache holds exactly the model's pages, locked
// pages were never evicted, eviction followed LRU order, and a failed
// operation changed nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cache/cache_test_util.hpp"
#include "treeattn/cache.hpp"

using namespace treeattn;

namespace {
using Ids = std::vector<int32_t>;

// A model key is a leaf (no cached extension) unless the next key in map order
// extends it: the extensions of a key sort right after it.
bool is_prefix(const Ids& a, const Ids& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

struct ModelPage {
  int32_t page;
  uint64_t last_use;
  int locks;
};

struct Request {
  Ids tokens;
  int32_t node;           // locked
  int64_t matched_pages;  // pages[0 .. matched_pages) are cached, the rest its tail
  Ids pages;              // one per page of tokens, the last possibly partial
};

struct Params {
  int page_size;
  int64_t num_pages;
  int max_pages_per_seq;
  int num_ops;
  uint64_t seed;
};

class Harness {
 public:
  explicit Harness(const Params& p) : p_(p), cache_(p.num_pages, p.page_size), rng_(p.seed) {
    // A few stems shared by many sequences make prefixes collide at every page size.
    for (int s = 0; s < 6; ++s) stems_.push_back(random_tokens(p.max_pages_per_seq * p.page_size, 3));
  }

  void run() {
    for (int op = 0; op < p_.num_ops; ++op) {
      const int r = uniform(0, 99);
      if (r < 30) start_request();
      else if (r < 52) finish_request();
      else if (r < 60) abort_request();
      else if (r < 68) evict();
      else if (r < 78) plain_match();
      else if (r < 83) put();
      else bad_op();
      verify();
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "first failure at op " << op << " (seed " << p_.seed << ", page_size " << p_.page_size << ")";
        return;
      }
    }
    while (!active_.empty()) {
      finish_request();
      verify();
    }
    EXPECT_EQ(cache_.num_evictable_pages(), cache_.num_cached_pages());  // nothing locked
    evict_and_sync(cache_.num_pages());
    EXPECT_EQ(cache_.num_free_pages(), cache_.num_pages());
    EXPECT_EQ(cache_.num_nodes(), 1);
    cache_.check();
    std::printf("page_size %d: %d ops, %lld requests finished, %lld alloc failures, %lld pages evicted, at most %lld nodes\n",
                p_.page_size, p_.num_ops, static_cast<long long>(finished_), static_cast<long long>(alloc_failures_),
                static_cast<long long>(evicted_pages_), static_cast<long long>(max_nodes_));
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  Ids random_tokens(int n, int vocab) {
    Ids t(static_cast<size_t>(n));
    for (auto& x : t) x = uniform(0, vocab - 1);
    return t;
  }
  // A stem prefix of any length (not page-aligned) plus a short random suffix.
  Ids random_sequence() {
    const int ps = p_.page_size;
    const Ids& stem = stems_[static_cast<size_t>(uniform(0, static_cast<int>(stems_.size()) - 1))];
    const int max_len = p_.max_pages_per_seq * ps;
    Ids t(stem.begin(), stem.begin() + uniform(0, max_len));
    const int extra = std::min(uniform(0, 2 * ps), max_len - static_cast<int>(t.size()));
    Ids tail = random_tokens(extra, 2);
    t.insert(t.end(), tail.begin(), tail.end());
    if (t.empty()) t.push_back(0);
    return t;
  }
  Ids key(const Ids& tokens, int64_t page) const {  // tokens of the prefix ending at page `page`
    return Ids(tokens.begin(), tokens.begin() + (page + 1) * p_.page_size);
  }

  // The model's longest cached prefix, in pages.
  Ids model_match(const Ids& tokens) const {
    Ids pages;
    const int64_t n = static_cast<int64_t>(tokens.size()) / p_.page_size;
    for (int64_t i = 0; i < n; ++i) {
      auto it = model_.find(key(tokens, i));
      if (it == model_.end()) break;
      pages.push_back(it->second.page);
    }
    return pages;
  }
  // Pages on node's root path, from export_tree.
  Ids path_pages(int32_t node) const {
    auto e = cache_.export_tree(Ids{node});
    if (node == RadixCache::kRoot) return {};
    // One chain: parents come first, so the page ids are in path order.
    for (size_t v = 0; v < e.parents.size(); ++v) EXPECT_EQ(e.parents[v], static_cast<int32_t>(v) - 1);
    EXPECT_EQ(e.node_index[0], static_cast<int32_t>(e.parents.size()) - 1);
    return e.page_ids;
  }

  RadixCache::Match match(const Ids& tokens) {
    const Ids expected = model_match(tokens);
    auto m = cache_.match_prefix(tokens);
    EXPECT_EQ(m.num_tokens, static_cast<int64_t>(expected.size()) * p_.page_size);
    EXPECT_EQ(m.pages, expected);
    EXPECT_EQ(path_pages(m.node), expected) << "the match must end exactly at its node";
    const uint64_t t = ++clock_;
    for (size_t i = 0; i < expected.size(); ++i) model_.at(key(tokens, static_cast<int64_t>(i))).last_use = t;
    max_nodes_ = std::max(max_nodes_, cache_.num_nodes());
    return m;
  }

  void lock_model(const Request& r, int delta) {
    for (int64_t i = 0; i < r.matched_pages; ++i) model_.at(key(r.tokens, i)).locks += delta;
    if (r.matched_pages == 0) root_locks_ += delta;
  }

  // Snapshot for "a failed operation changes nothing".
  struct Snapshot {
    int64_t free, cached, evictable, nodes;
    bool operator==(const Snapshot&) const = default;
  };
  Snapshot snapshot() const {
    return {cache_.num_free_pages(), cache_.num_cached_pages(), cache_.num_evictable_pages(), cache_.num_nodes()};
  }

  void start_request() {
    if (active_.size() >= 6) return finish_request();
    Request r;
    r.tokens = random_sequence();
    auto m = match(r.tokens);
    r.node = m.node;
    r.matched_pages = static_cast<int64_t>(m.pages.size());
    r.pages = m.pages;
    cache_.lock(r.node);
    lock_model(r, +1);
    const int64_t ps = p_.page_size;
    const int64_t need = (static_cast<int64_t>(r.tokens.size()) + ps - 1) / ps - r.matched_pages;
    const bool fits = need <= cache_.num_free_pages() + cache_.num_evictable_pages();
    if (!fits) {
      const Snapshot before = snapshot();
      EXPECT_ERROR_HAS(cache_.alloc(need), std::to_string(need) + " pages requested",
                       std::to_string(before.free) + " free + " + std::to_string(before.evictable) + " evictable");
      EXPECT_EQ(snapshot(), before);
      sync_evictions(/*may_evict=*/false);
      ++alloc_failures_;
      cache_.unlock(r.node);
      lock_model(r, -1);
      return;
    }
    const int64_t short_by = need - cache_.num_free_pages();
    Ids tail = cache_.alloc(need);
    EXPECT_EQ(static_cast<int64_t>(tail.size()), need);
    for (int32_t p : tail) {
      EXPECT_TRUE(handed_out_.insert(p).second) << "page " << p << " handed out twice";
      EXPECT_FALSE(cache_.pool().is_free(p));
    }
    const int64_t evicted = sync_evictions(/*may_evict=*/true);
    if (short_by > 0) EXPECT_GE(evicted, short_by);
    else EXPECT_EQ(evicted, 0) << "alloc evicted with enough free pages";
    r.pages.insert(r.pages.end(), tail.begin(), tail.end());
    active_.push_back(std::move(r));
  }

  Request take_random_request() {
    const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(active_.size()) - 1));
    Request r = std::move(active_[i]);
    active_.erase(active_.begin() + static_cast<ptrdiff_t>(i));
    return r;
  }

  // Caches the request's whole pages, frees its partial last page, unlocks.
  void finish_request() {
    if (active_.empty()) return;
    Request r = take_random_request();
    const int64_t full = static_cast<int64_t>(r.tokens.size()) / p_.page_size;
    insert(Ids(r.tokens.begin(), r.tokens.begin() + full * p_.page_size), Ids(r.pages.begin(), r.pages.begin() + full));
    if (static_cast<int64_t>(r.pages.size()) > full) {
      Ids partial(r.pages.begin() + full, r.pages.end());
      cache_.free(partial);
      for (int32_t p : partial) handed_out_.erase(p);
    }
    cache_.unlock(r.node);
    lock_model(r, -1);
    ++finished_;
  }

  void abort_request() {
    if (active_.empty()) return;
    Request r = take_random_request();
    Ids tail(r.pages.begin() + r.matched_pages, r.pages.end());
    cache_.free(tail);
    for (int32_t p : tail) handed_out_.erase(p);
    cache_.unlock(r.node);
    lock_model(r, -1);
  }

  // insert() of pages the caller owns: handed out ones, or ones cached at the same position.
  void insert(const Ids& tokens, const Ids& pages) {
    const int32_t node = cache_.insert(tokens, pages);
    const uint64_t t = ++clock_;
    for (size_t i = 0; i < pages.size(); ++i) {
      const Ids k = key(tokens, static_cast<int64_t>(i));
      auto it = model_.find(k);
      if (it == model_.end()) {
        model_.emplace(k, ModelPage{pages[i], t, 0});
      } else {
        it->second.last_use = t;
        if (it->second.page != pages[i]) EXPECT_TRUE(cache_.pool().is_free(pages[i])) << "duplicate page not freed";
      }
      handed_out_.erase(pages[i]);
    }
    EXPECT_EQ(path_pages(node), model_match(tokens)) << "insert must return the node of the last page";
    EXPECT_EQ(model_match(tokens).size(), pages.size());
  }

  void put() {
    const int64_t n = std::min<int64_t>(uniform(1, p_.max_pages_per_seq), cache_.num_free_pages());
    if (n == 0) return;
    Ids pages = cache_.alloc(n);  // no eviction: there are n free pages
    for (int32_t p : pages) handed_out_.insert(p);
    Ids tokens = random_sequence();
    tokens.resize(static_cast<size_t>(n * p_.page_size), 1);
    insert(tokens, pages);
  }

  void plain_match() { match(random_sequence()); }

  void evict() {
    const int64_t n = uniform(0, 3 * p_.max_pages_per_seq);
    evict_and_sync(n);
  }
  void evict_and_sync(int64_t n) {
    const int64_t freed = cache_.evict(n);
    EXPECT_TRUE(freed >= n || cache_.num_evictable_pages() == 0) << "evict(" << n << ") freed only " << freed;
    EXPECT_EQ(sync_evictions(/*may_evict=*/true), freed);
  }

  // Drops the model pages the cache no longer has and checks that they were
  // evictable, are free now and were the least recently used. Returns how many.
  int64_t sync_evictions(bool may_evict) {
    std::vector<Ids> gone;
    uint64_t newest_gone = 0;
    for (const auto& [k, mp] : model_) {
      if (cache_.peek_prefix(k).num_tokens == static_cast<int64_t>(k.size())) continue;
      gone.push_back(k);
      newest_gone = std::max(newest_gone, mp.last_use);
      EXPECT_EQ(mp.locks, 0) << "a locked page (" << mp.page << ") was evicted";
      EXPECT_TRUE(cache_.pool().is_free(mp.page) || handed_out_.count(mp.page))
          << "evicted page " << mp.page << " is neither free nor handed out again";
    }
    if (!may_evict) EXPECT_TRUE(gone.empty()) << gone.size() << " pages vanished from the cache";
    for (const Ids& k : gone) model_.erase(k);
    if (!gone.empty()) {
      // LRU: every remaining unlocked leaf page is at least as recent as every evicted one.
      for (auto it = model_.begin(); it != model_.end(); ++it) {
        auto next = std::next(it);
        const bool leaf = next == model_.end() || !is_prefix(it->first, next->first);
        if (leaf && it->second.locks == 0)
          EXPECT_GE(it->second.last_use, newest_gone) << "evicted a page used more recently than an unlocked leaf";
      }
    }
    evicted_pages_ += static_cast<int64_t>(gone.size());
    return static_cast<int64_t>(gone.size());
  }

  // Operations that must fail and leave everything as it was.
  void bad_op() {
    const Snapshot before = snapshot();
    switch (uniform(0, 5)) {
      case 0: {
        const int64_t too_many = cache_.num_free_pages() + cache_.num_evictable_pages() + 1;
        EXPECT_ERROR_HAS(cache_.alloc(too_many), std::to_string(too_many) + " pages requested");
        break;
      }
      case 1:
        if (!model_.empty()) {
          auto it = std::next(model_.begin(), uniform(0, static_cast<int>(model_.size()) - 1));
          EXPECT_ERROR_HAS(cache_.free(Ids{it->second.page}), "free: pages[0] = " + std::to_string(it->second.page) + " is cached by node");
        }
        break;
      case 2:
        if (cache_.num_free_pages() > 0 && !handed_out_.empty()) {
          // A handed-out page then a free one: the second is rejected, the first is not taken.
          int32_t free_page = -1;
          for (int32_t p = 0; p < cache_.num_pages() && free_page < 0; ++p)
            if (cache_.pool().is_free(p)) free_page = p;
          Ids tokens = random_tokens(2 * p_.page_size, 5);
          EXPECT_ERROR_HAS(cache_.insert(tokens, Ids{*handed_out_.begin(), free_page}),
                           "pages[1] = " + std::to_string(free_page) + " is free");
        }
        break;
      case 3:
        EXPECT_ERROR_HAS(cache_.insert(random_tokens(p_.page_size, 3), Ids{}), "pages.size() = 0 but tokens.size() = " + std::to_string(p_.page_size));
        if (p_.page_size > 1)
          EXPECT_ERROR_HAS(cache_.insert(random_tokens(p_.page_size + 1, 3), Ids{0, 1}), "is not a multiple of page_size");
        break;
      case 4:
        if (!handed_out_.empty()) {
          const int32_t p = *handed_out_.rbegin();
          EXPECT_ERROR_HAS(cache_.free(Ids{p, p}), "pages[1] = " + std::to_string(p) + " is already free");
        }
        break;
      case 5:
        if (root_locks_ == 0) EXPECT_ERROR_HAS(cache_.unlock(RadixCache::kRoot), "node 0 is not locked");
        EXPECT_ERROR_HAS(cache_.evict(-1), "evict of -1 pages");
        break;
    }
    EXPECT_EQ(snapshot(), before);
    sync_evictions(/*may_evict=*/false);
  }

  void verify() {
    cache_.check();
    EXPECT_EQ(cache_.num_cached_pages(), static_cast<int64_t>(model_.size()));
    EXPECT_EQ(cache_.num_free_pages() + cache_.num_cached_pages() + static_cast<int64_t>(handed_out_.size()),
              cache_.num_pages())
        << "pages lost";
    for (int32_t p : handed_out_) EXPECT_FALSE(cache_.pool().is_free(p)) << "handed-out page " << p << " is free";
    int64_t unlocked = 0;
    for (auto it = model_.begin(); it != model_.end(); ++it) {
      unlocked += it->second.locks == 0;
      EXPECT_FALSE(handed_out_.count(it->second.page)) << "page " << it->second.page << " is cached and handed out";
      auto next = std::next(it);
      const bool leaf = next == model_.end() || !is_prefix(it->first, next->first);
      if (!leaf) continue;  // checked through its extension
      const auto m = cache_.peek_prefix(it->first);
      EXPECT_EQ(m.num_tokens, static_cast<int64_t>(it->first.size()));
      EXPECT_EQ(m.pages, model_match(it->first));
    }
    EXPECT_EQ(cache_.num_evictable_pages(), unlocked);
  }

  Params p_;
  RadixCache cache_;
  std::mt19937_64 rng_;
  std::vector<Ids> stems_;
  std::map<Ids, ModelPage> model_;  // token prefix ending at a cached page -> that page
  std::vector<Request> active_;
  std::set<int32_t> handed_out_;    // pages held by active requests (and by put() briefly)
  uint64_t clock_ = 0;
  int root_locks_ = 0;
  int64_t finished_ = 0, alloc_failures_ = 0, evicted_pages_ = 0, max_nodes_ = 0;
};
}  // namespace

TEST(RadixCacheProperty, PageSize1) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    Harness({1, 48, 20, 3000, seed}).run();
    if (HasFailure()) return;  // one report per test
  }
}

TEST(RadixCacheProperty, PageSize4) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    Harness({4, 40, 8, 3000, seed}).run();
    if (HasFailure()) return;  // one report per test
  }
}

TEST(RadixCacheProperty, PageSize16) {
  for (uint64_t seed : {21u, 22u, 23u}) {
    Harness({16, 32, 6, 3000, seed}).run();
    if (HasFailure()) return;  // one report per test
  }
}
