// Shared builder helpers: size budgets, file reading, the common final step.
#include "tree/builder_util.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace treeattn::detail {

namespace {
std::string i128_str(__int128 v) {
  if (v == 0) return "0";
  bool neg = v < 0;
  if (neg) v = -v;
  std::string s;
  while (v > 0) {
    s.insert(s.begin(), char('0' + int(v % 10)));
    v /= 10;
  }
  return neg ? "-" + s : s;
}
}  // namespace

namespace {
// A budget, lowered (never raised) by the environment variable `env`.
int64_t budget(const char* env, int64_t limit) {
  const char* v = std::getenv(env);
  if (!v || !*v) return limit;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return (*end == '\0' && x > 0) ? std::min<int64_t>(limit, x) : limit;
}
}  // namespace

void check_budget(__int128 nodes, __int128 pages, const std::string& what) {
  const int64_t max_nodes = budget("TREEATTN_MAX_BUILDER_NODES", kMaxBuilderNodes);
  const int64_t max_pages = budget("TREEATTN_MAX_BUILDER_PAGES", kMaxBuilderPages);
  if (nodes > max_nodes)
    throw Error(what + ": " + i128_str(nodes) + " nodes exceed the builder limit of " + std::to_string(max_nodes));
  if (pages > max_pages)
    throw Error(what + ": " + i128_str(pages) + " pages exceed the builder limit of " + std::to_string(max_pages));
}

void check_page_size(int page_size) {
  if (page_size <= 0 || page_size > 65536)
    throw Error("page_size: " + std::to_string(page_size) + " is out of range [1, 65536]");
}

int64_t max_input_file_bytes() {
  const char* env = std::getenv("TREEATTN_MAX_INPUT_BYTES");
  if (!env || !*env) return kMaxInputFileBytes;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (errno || *end || v <= 0)
    throw Error(std::string("TREEATTN_MAX_INPUT_BYTES = '") + env + "' is not a positive integer (bytes)");
  return v;
}

// Reads in chunks and stops one byte past the limit: the size reported by the
// file system cannot be trusted (devices, FIFOs, /proc files report 0).
std::string read_text_file(const std::string& path, std::string_view field, int64_t limit) {
  if (limit < 0) limit = max_input_file_bytes();
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const char* why = errno ? std::strerror(errno) : "cannot open";
    throw Error(std::string(field) + ": cannot read '" + path + "': " + why);
  }
  std::string text;
  constexpr size_t kChunk = size_t(1) << 20;
  while (in) {
    const size_t old = text.size();
    const size_t want = size_t(std::min<int64_t>(int64_t(kChunk), limit + 1 - int64_t(old)));
    text.resize(old + want);
    in.read(text.data() + old, std::streamsize(want));
    text.resize(old + size_t(in.gcount()));
    if (int64_t(text.size()) > limit)
      throw Error(std::string(field) + ": '" + path + "' is larger than the input limit of " +
                  std::to_string(limit) + " bytes (set TREEATTN_MAX_INPUT_BYTES to raise it)");
  }
  if (in.bad()) throw Error(std::string(field) + ": cannot read '" + path + "': read error");
  return text;
}

Workload finish_workload(std::string name, Tree tree, std::vector<int32_t> query_nodes,
                         const PageAllocator& alloc, const WorkloadParams& p) {
  Workload w;
  w.name = std::move(name);
  w.layout.page_size = alloc.page_size();
  w.layout.dtype = p.dtype;
  w.layout.kv_dtype = p.kv_dtype;
  w.layout.num_pages = alloc.finish(tree);
  w.tree = std::move(tree);
  w.query_nodes = std::move(query_nodes);
  w.heads = p.heads;
  w.validate();
  return w;
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  // splitmix64 of a ^ rotated b: cheap, well mixed, portable.
  uint64_t z = a ^ ((b << 29) | (b >> 35)) ^ 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace treeattn::detail
