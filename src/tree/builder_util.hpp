// Helpers shared by the workload builders (src/tree/*.cpp only, not public):
// size budgets checked before anything is allocated, file reading, and the
// common final step that fills the layout and validates.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "treeattn/workloads.hpp"

namespace treeattn::detail {

// Builders refuse shapes whose host-side description alone would not fit in
// memory, before allocating: a typo like N=1,65536,1073741824 must give an
// Error, not bad_alloc or a swap storm. Far above any real decode batch.
inline constexpr int64_t kMaxBuilderNodes = int64_t(1) << 22;
inline constexpr int64_t kMaxBuilderPages = int64_t(1) << 26;

// Throws Error naming `what` when `nodes` or `pages` exceed the budgets above,
// or the lower ones in $TREEATTN_MAX_BUILDER_NODES / $TREEATTN_MAX_BUILDER_PAGES
// (the fuzz targets set them, so that no input builds for seconds).
void check_budget(__int128 nodes, __int128 pages, const std::string& what);

// ceil(tokens / page_size) in 128 bits (callers sum these before checking).
inline __int128 pages_for(__int128 tokens, int page_size) {
  return (tokens + page_size - 1) / page_size;
}

// Throws Error if the page size is not usable for building (the later
// validate() would say so too, but only after allocating).
void check_page_size(int page_size);

// Every file the library or the CLI reads (trees, block tables, recorded runs,
// cost tables, tile rules, suites, results) goes through read_text_file and is
// refused past this many bytes: 256 MiB, over 300x the largest shipped file
// (data/workloads/sorting128ToT.json, 0.76 MB) and above a JSON tree at the
// builder's node budget. Reading stops at the limit, so /dev/zero or a FIFO
// gives an Error, not an unbounded allocation. $TREEATTN_MAX_INPUT_BYTES
// (a positive integer) overrides it for a process.
inline constexpr int64_t kMaxInputFileBytes = int64_t(256) << 20;
// The limit in force: $TREEATTN_MAX_INPUT_BYTES when set, else kMaxInputFileBytes.
// A malformed value is an Error naming the variable and its value.
int64_t max_input_file_bytes();

// Reads a whole file of at most `limit` bytes (-1: max_input_file_bytes());
// throws Error "<field>: cannot read '<path>': <reason>", or
// "<field>: '<path>' is larger than the input limit of N bytes (...)".
std::string read_text_file(const std::string& path, std::string_view field, int64_t limit = -1);

// Fills name, heads and layout (pages renumbered by the allocator's seeded
// permutation), then validates. Every generated workload goes through here.
Workload finish_workload(std::string name, Tree tree, std::vector<int32_t> query_nodes,
                         const PageAllocator& alloc, const WorkloadParams& p);

// The recorded formats (src/tree/recorded.cpp) from text instead of a file:
// what tot_workload / medusa_workload do after reading `path` (named in
// messages only). For tests and the fuzz targets; no caching.
Workload tot_workload_from_text(std::string_view text, const std::string& path, int task, int iter,
                                const WorkloadParams& p);
Workload medusa_workload_from_text(std::string_view text, const std::string& path, int record, int step,
                                   int prefix, const WorkloadParams& p);

// A seed for page shuffling derived from the params' seed and a builder salt,
// so that two builders with the same p.seed do not share a permutation.
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace treeattn::detail
