// libFuzzer target: the JSON block-table format (block_tables_from_json):
// an Error or a valid Workload whose tree holds every sequence (the path of
// sequence s's query node has exactly its block table's first pages, in
// order, and seq_lens[s] tokens). The builder skips the pages a row shares
// with the row before; the same batch with a one-page row of a fresh page
// between every two rows (so no row shares a page with the row before) must
// be accepted or refused alike, and hold the same sequences. And as a decode
// step: the batch built through a BlockTableTree that built it one step
// earlier (each sequence up to 3 tokens shorter, as the input's bytes say)
// gives the arrays, or the error, of a fresh build (the kept tree's growth
// path against the full build); the rows given ragged (the builder's second
// overload) give those arrays, or an error where it errs.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.hpp"
#include "treeattn/workloads.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;  // fuzz_util.hpp: small files and trees

namespace {

// A build's arrays as text.
std::string arrays(const treeattn::BlockTableTree& t) {
  std::string r;
  for (const auto* a : {&t.parents, &t.num_tokens, &t.page_offsets, &t.page_ids, &t.query_nodes}) {
    for (const int32_t x : *a) r += std::to_string(x) + ",";
    r += "|";
  }
  return r;
}

// The arrays of a build of the flat batch, or its error message.
std::string build(const std::vector<int32_t>& flat, int32_t batch, int32_t width, const std::vector<int32_t>& lens,
                  const treeattn::WorkloadParams& p, int64_t num_pages, treeattn::BlockTableTree& t) {
  try {
    treeattn::build_block_table_tree(flat, batch, width, lens, p.page_size, num_pages, t);
  } catch (const treeattn::Error& e) {
    return std::string("error: ") + e.what();
  }
  return arrays(t);
}

// The decode-step oracle of the header.
void check_decode_step(const treeattn::BlockTablesInput& in, const uint8_t* data, size_t size) {
  const size_t n = in.block_tables.size();
  size_t width = 0;
  for (const auto& row : in.block_tables) width = std::max(width, row.size());
  if (n == 0 || in.seq_lens.size() != n || n * width > (size_t(1) << 20)) return;
  std::vector<int32_t> flat(n * width, -1);
  for (size_t s = 0; s < n; ++s) std::copy(in.block_tables[s].begin(), in.block_tables[s].end(), flat.begin() + s * width);
  std::vector<int32_t> earlier = in.seq_lens;
  for (size_t s = 0; s < n; ++s) {
    const int32_t d = size > 0 ? int32_t(data[s % size] % 4) : 0;
    if (earlier[s] > d) earlier[s] -= d;
  }
  treeattn::BlockTableTree kept, fresh;
  // The earlier batch may be refused (its arrays or error do not matter):
  // the kept builder then has nothing to grow and builds the batch afresh.
  (void)build(flat, int32_t(n), int32_t(width), earlier, in.params, in.num_pages, kept);
  const std::string want = build(flat, int32_t(n), int32_t(width), in.seq_lens, in.params, in.num_pages, fresh);
  treeattn_fuzz::require(build(flat, int32_t(n), int32_t(width), in.seq_lens, in.params, in.num_pages, kept) == want,
                         "a decode step through a kept tree gives a fresh build's arrays or error");
  // The rows as given (ragged): the same arrays, or an error too (a short
  // row's message names its own length, not the width).
  std::vector<int32_t> pages;
  std::vector<int64_t> offsets{0};
  for (const auto& row : in.block_tables) {
    pages.insert(pages.end(), row.begin(), row.end());
    offsets.push_back(int64_t(pages.size()));
  }
  treeattn::BlockTableTree ragged;
  std::string got;
  try {
    treeattn::build_block_table_tree(pages, offsets, in.seq_lens, in.params.page_size, in.num_pages, ragged);
    got = arrays(ragged);
  } catch (const treeattn::Error&) {
    got = "error";
  }
  if (got != "error") treeattn_fuzz::require(got == want, "ragged rows give the padded rows' arrays");
  treeattn_fuzz::require((got == "error") == (want.rfind("error: ", 0) == 0),
                         "ragged and padded rows are accepted or refused alike");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  treeattn::BlockTablesInput in;
  try {
    in = treeattn::parse_block_tables_json(text, treeattn_fuzz::small_params());
  } catch (const treeattn::Error&) {
    return 0;
  }
  bool ok = true, spaced_ok = true;
  treeattn::Workload w, spaced;
  try {
    w = treeattn::from_block_tables(in.block_tables, in.seq_lens, in.num_pages, in.params);
  } catch (const treeattn::Error&) {
    ok = false;
  }
  check_decode_step(in, data, size);
  const size_t n = in.block_tables.size();
  if (n == 0 || in.seq_lens.size() != n) {  // no batch, or a length per sequence missing: refused
    treeattn_fuzz::require(!ok, "a batch without one length per sequence is refused");
    return 0;
  }
  // The spaced-out batch adds n - 1 rows (the builder limit is 4096 nodes)
  // and n pages past the pool: only where no page the sequences use lies
  // outside it (the pool grows for the spacers) and the ids still fit.
  // (Compared as num_pages > INT32_MAX - n: a pool of INT64_MAX pages would overflow the sum.)
  if (2 * n > 4000 || in.num_pages > std::numeric_limits<int32_t>::max() - int64_t(n)) return 0;
  for (size_t s = 0; s < n; ++s) {
    const int64_t need = (int64_t(in.seq_lens[s]) + in.params.page_size - 1) / std::max(1, in.params.page_size);
    for (int64_t k = 0; k < need && k < int64_t(in.block_tables[s].size()); ++k)
      if (in.block_tables[s][size_t(k)] >= in.num_pages) return 0;
  }
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> lens;
  for (size_t s = 0; s < n; ++s) {
    tables.push_back(in.block_tables[s]);
    lens.push_back(in.seq_lens[s]);
    if (s + 1 < n) {
      tables.push_back({int32_t(in.num_pages + int64_t(s))});
      lens.push_back(1);
    }
  }
  try {
    spaced = treeattn::from_block_tables(tables, lens, in.num_pages + int64_t(n), in.params);
  } catch (const treeattn::Error&) {
    spaced_ok = false;
  }
  treeattn_fuzz::require(ok == spaced_ok, "a batch and the same batch spaced out are accepted or refused alike");
  if (!ok) return 0;
  w.validate();  // built workloads are validated; this must not throw
  treeattn_fuzz::require(w.num_queries() == int32_t(n), "one query per sequence");
  for (size_t s = 0; s < n; ++s) {
    treeattn_fuzz::require(treeattn_fuzz::path_holds(w, int32_t(s), in.block_tables[s], in.seq_lens[s]), "a sequence's path holds its pages");
    treeattn_fuzz::require(treeattn_fuzz::path_holds(spaced, int32_t(2 * s), in.block_tables[s], in.seq_lens[s]),
                           "a spaced-out sequence's path holds its pages");
  }
  return 0;
}
