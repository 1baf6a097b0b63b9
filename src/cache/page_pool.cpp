// KvPagePool: the fixed set of KV page ids that the radix cache and the
// requests share. Free ids are a stack, so recently freed (likely still warm)
// pages are handed out first.
#include <climits>
#include <string>

#include "treeattn/cache.hpp"

namespace treeattn {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

KvPagePool::KvPagePool(int64_t num_pages) {
  // Page ids are int32 everywhere (plans, block tables).
  if (num_pages < 1 || num_pages > INT32_MAX)
    throw Error("kv cache: num_pages = " + str(num_pages) + " must be in [1, " + str(INT32_MAX) + "]");
  free_.reserve(static_cast<size_t>(num_pages));
  // Pushed high to low so that the first alloc hands out 0, 1, 2, ...
  for (int64_t id = num_pages - 1; id >= 0; --id) free_.push_back(static_cast<int32_t>(id));
  is_free_.assign(static_cast<size_t>(num_pages), 1);
}

void KvPagePool::throw_out_of_range(int32_t id) const {
  throw Error("kv cache: page id " + str(id) + " is out of range [0, " + str(num_pages()) + ")");
}

std::vector<int32_t> KvPagePool::alloc(int64_t n) {
  std::vector<int32_t> out;
  alloc(n, out);
  return out;
}

void KvPagePool::alloc(int64_t n, std::vector<int32_t>& out) {
  if (n < 0) throw Error("kv cache: alloc of " + str(n) + " pages (must be >= 0)");
  if (n > num_free())
    throw Error("kv cache: " + str(n) + " pages requested, " + str(num_free()) + " free of " +
                str(num_pages()) + " (free pages or make the pool larger)");
  out.reserve(out.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = free_.back();
    free_.pop_back();
    is_free_[static_cast<size_t>(id)] = 0;
    out.push_back(id);
  }
}

void KvPagePool::free(std::span<const int32_t> ids) {
  // Flags are set as we go and rolled back on error, which also catches an id
  // listed twice without any scratch memory.
  size_t done = 0;
  auto fail = [&](const std::string& why) {
    for (size_t j = 0; j < done; ++j) is_free_[static_cast<size_t>(ids[j])] = 0;
    throw Error("kv cache: free: pages[" + str(static_cast<int64_t>(done)) + "] = " + str(ids[done]) + why);
  };
  for (; done < ids.size(); ++done) {
    int32_t id = ids[done];
    if (id < 0 || id >= num_pages()) fail(" is out of range [0, " + str(num_pages()) + ")");
    if (is_free_[static_cast<size_t>(id)]) fail(" is already free (double free)");
    is_free_[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : ids) free_.push_back(id);  // capacity num_pages: no allocation
}

void KvPagePool::check() const {
  int64_t flagged = 0;
  for (uint8_t f : is_free_) flagged += f;
  if (flagged != num_free())
    throw Error("kv cache: pool has " + str(flagged) + " pages flagged free but " + str(num_free()) +
                " on its free stack");
  std::vector<uint8_t> seen(is_free_.size(), 0);
  for (int32_t id : free_) {
    if (id < 0 || id >= num_pages()) throw Error("kv cache: pool free stack holds " + str(id) + ", out of range");
    if (!is_free_[static_cast<size_t>(id)] || seen[static_cast<size_t>(id)]++)
      throw Error("kv cache: pool free stack holds page " + str(id) + " twice or unflagged");
  }
}

}  // namespace treeattn
