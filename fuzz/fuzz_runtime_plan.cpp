// libFuzzer target: the runtime's plan calls (TreeAttention::plan_tree,
// plan_block_tables, plan_tree_queries on the CPU device) with the arrays an
// engine passes. The input bytes build up to four steps on one object: a
// valid random tree (or block tables, or a tree with draft tokens), or the
// last step's tree with its query nodes grown, or its block tables with their
// sequences grown (decode steps: the extension paths), then up to three
// entries changed (a raw, shifted, bit-flipped or boundary value). Oracles:
//   - a call either throws treeattn::Error or plans (no other exception, no
//     sanitizer report: the arrays are untrusted);
//   - a call that throws leaves the plan in force (the last accepted step);
//   - an accepted step's workload is the arrays as given (every node's parent,
//     tokens, first slot and pages; the queries; each draft a one-token node
//     under its parent at its row; each sequence's path its block table's
//     pages and seq_len tokens), its tree's parents and queries name only the
//     tree's nodes (not the drafts'), and the run matches the fp64 reference.
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "fuzz/fuzz_util.hpp"
#include "tests/support/plan_mutation.hpp"
#include "treeattn/executor.hpp"
#include "treeattn/runtime.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;  // fuzz_util.hpp: small files and trees

namespace {

using namespace treeattn;
using test_support::Reader;

constexpr int64_t kPages = 64;

// One step's arrays (block tables: `tables` row-major [seqs, width]).
struct Step {
  int mode = 0;  // 0 tree, 1 block tables, 2 tree queries
  std::vector<int32_t> parents, tokens, offsets{0}, pages, queries, first_slots;
  std::vector<int32_t> draft_nodes, draft_parents;
  std::vector<int64_t> draft_rows;
  std::vector<int32_t> tables, seq_lens;
  int32_t width = 0;
};

// A valid tree of 1-8 nodes on distinct pages (page-aligned nodes).
void random_tree(Reader& r, int ps, Step& s) {
  const int n = 1 + r.byte() % 8;
  std::vector<int32_t> perm(kPages);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[r.byte() % i]);
  size_t next = 0;
  for (int v = 0; v < n; ++v) {
    s.parents.push_back(v == 0 ? -1 : int32_t(r.byte() % (v + 1)) - 1);
    const int32_t t = int32_t(r.byte() % 12) + (v == 0);
    const size_t np = size_t((t + ps - 1) / ps);
    if (next + np > perm.size()) break;
    s.tokens.push_back(t);
    s.pages.insert(s.pages.end(), perm.begin() + int64_t(next), perm.begin() + int64_t(next + np));
    next += np;
    s.offsets.push_back(int32_t(s.pages.size()));
  }
  s.parents.resize(s.tokens.size());
  const int q = 1 + r.byte() % 6;
  for (int i = 0; i < q; ++i) s.queries.push_back(int32_t(r.byte() % s.tokens.size()));
  if (r.byte() % 2) s.first_slots.assign(s.tokens.size(), 0);
}

// The last step's tree with each query node a few tokens longer (a page from
// the pool's unused ones when its last fills): what a decode step passes.
bool grown(Reader& r, int ps, const Step& last, Step& s) {
  if (last.mode != 0 || last.parents.empty()) return false;
  s = last;
  std::vector<char> used(kPages, 0);
  for (const int32_t pg : s.pages)
    if (pg >= 0 && pg < kPages) used[size_t(pg)] = 1;
  std::vector<std::vector<int32_t>> node_pages(s.parents.size());
  for (size_t v = 0; v < s.parents.size(); ++v)
    node_pages[v].assign(s.pages.begin() + s.offsets[v], s.pages.begin() + s.offsets[v + 1]);
  std::vector<char> grows(s.parents.size(), 0);
  for (const int32_t v : s.queries) grows[size_t(v)] = 1;
  for (size_t v = 0; v < s.parents.size(); ++v) {
    const int32_t add = grows[v] ? r.byte() % 3 : 0;
    for (int32_t a = 0; a < add; ++a) {
      if (s.tokens[v] % ps == 0) {
        const auto it = std::find(used.begin(), used.end(), 0);
        if (it == used.end()) break;
        *it = 1;
        node_pages[v].push_back(int32_t(it - used.begin()));
      }
      ++s.tokens[v];
    }
  }
  s.pages.clear();
  s.offsets.assign(1, 0);
  for (const auto& p : node_pages) {
    s.pages.insert(s.pages.end(), p.begin(), p.end());
    s.offsets.push_back(int32_t(s.pages.size()));
  }
  return true;
}

// The last step's block tables with each sequence 0-2 tokens longer (a fresh
// page when its last fills; the table one column wider for them): a decode
// step of block tables.
bool grown_tables(Reader& r, int ps, const Step& last, Step& s) {
  if (last.mode != 1 || last.seq_lens.empty()) return false;
  s = last;
  const size_t seqs = s.seq_lens.size();
  const int32_t width = s.width + 1;
  std::vector<char> used(kPages, 0);
  for (const int32_t pg : s.tables)
    if (pg >= 0 && pg < kPages) used[size_t(pg)] = 1;
  s.tables.assign(seqs * size_t(width), -1);
  for (size_t q = 0; q < seqs; ++q)
    std::copy(last.tables.begin() + int64_t(q) * last.width, last.tables.begin() + int64_t(q + 1) * last.width,
              s.tables.begin() + int64_t(q) * width);
  s.width = width;
  for (size_t q = 0; q < seqs; ++q) {
    const int32_t add = r.byte() % 3;
    for (int32_t a = 0; a < add; ++a) {
      if (s.seq_lens[q] % ps == 0) {
        const int32_t k = s.seq_lens[q] / ps;  // the new page's column
        const auto it = std::find(used.begin(), used.end(), 0);
        if (k >= width || it == used.end()) break;
        *it = 1;
        s.tables[q * size_t(width) + size_t(k)] = int32_t(it - used.begin());
      }
      ++s.seq_lens[q];
    }
  }
  return true;
}

// 1-5 sequences sharing a prompt of 0-3 full pages, each with 1-2 pages of its own.
void random_block_tables(Reader& r, int ps, Step& s) {
  s.mode = 1;
  const int32_t seqs = 1 + r.byte() % 5, shared = r.byte() % 4;
  s.width = shared + 2;
  int32_t next = 0;
  std::vector<int32_t> prompt(static_cast<size_t>(shared));
  for (int32_t& pg : prompt) pg = next++;
  for (int32_t q = 0; q < seqs; ++q) {
    s.tables.insert(s.tables.end(), prompt.begin(), prompt.end());
    s.tables.push_back(next++);
    s.tables.push_back(next++);
    s.seq_lens.push_back(shared * ps + 1 + int32_t(r.byte() % (2 * ps)));
  }
}

// 1-3 drafts under the tree's first query node (or earlier drafts), in rows
// of the pool's last page, which the tree does not use.
void random_drafts(Reader& r, int ps, Step& s) {
  s.mode = 2;
  const int k = 1 + r.byte() % 3;
  for (int i = 0; i < k; ++i) {
    s.draft_nodes.push_back(s.queries[0]);
    s.draft_parents.push_back(int32_t(r.byte() % (i + 1)) - 1);
    s.draft_rows.push_back((kPages - 1) * ps + i);
  }
}

// Up to three entries of the step's arrays changed as the bytes say.
void mutate(Reader& r, Step& s) {
  const int changes = r.byte() % 4;
  for (int c = 0; c < changes; ++c) {
    const uint8_t which = r.byte(), mode = r.byte();
    const uint32_t index = r.byte(), raw = r.u32();
    std::vector<int32_t>* arrays[] = {&s.parents, &s.tokens, &s.offsets, &s.pages, &s.queries,
                                      &s.first_slots, &s.draft_nodes, &s.draft_parents, &s.tables, &s.seq_lens};
    if (which % 11 == 10) {
      test_support::poke(s.draft_rows, index, mode, raw, kPages);
    } else {
      test_support::poke(*arrays[which % 10], index, mode, raw, int64_t(arrays[which % 10]->size()));
    }
  }
}

// Whether ta's workload is step s as given (see the top of the file).
bool workload_is(const TreeAttention& ta, const Step& s, int ps) {
  const Workload& w = ta.workload();
  if (s.mode == 1) {
    if (w.num_queries() != int32_t(s.seq_lens.size())) return false;
    for (size_t q = 0; q < s.seq_lens.size(); ++q) {
      const std::span<const int32_t> row(s.tables.data() + q * size_t(s.width), size_t(s.width));
      if (!treeattn_fuzz::path_holds(w, int32_t(q), row, s.seq_lens[q])) return false;
    }
    return true;
  }
  const size_t n = s.parents.size(), k = s.draft_rows.size();
  if (w.tree.nodes.size() != n + k || size_t(w.num_queries()) != s.queries.size() + k) return false;
  for (size_t v = 0; v < n; ++v) {
    const Node& x = w.tree.nodes[v];
    const int32_t first_slot = s.first_slots.empty() ? 0 : s.first_slots[v];
    if (x.parent != s.parents[v] || x.num_tokens != s.tokens[v] || x.first_slot != first_slot ||
        !std::equal(x.pages.begin(), x.pages.end(), s.pages.begin() + s.offsets[v], s.pages.begin() + s.offsets[v + 1]))
      return false;
  }
  if (!std::equal(s.queries.begin(), s.queries.end(), w.query_nodes.begin())) return false;
  // The tree's parents and queries name its own nodes, never the drafts' (numbered after them).
  for (const int32_t p : s.parents)
    if (p >= int32_t(n)) return false;
  for (const int32_t q : s.queries)
    if (q >= int32_t(n)) return false;
  for (size_t i = 0; i < k; ++i) {
    const Node& d = w.tree.nodes[n + i];
    const int32_t parent = s.draft_parents[i] >= 0 ? int32_t(n) + s.draft_parents[i] : s.draft_nodes[i];
    if (d.parent != parent || d.num_tokens != 1 || d.first_slot != s.draft_rows[i] % ps ||
        d.pages != std::vector<int32_t>{int32_t(s.draft_rows[i] / ps)} ||
        w.query_nodes[s.queries.size() + i] != int32_t(n + i))
      return false;
  }
  return true;
}

// The run of ta's plan against the fp64 reference of its workload. Inputs
// depend only on the page size and the query count: made once for each
// (drawing the pools dominated the run time), the output poisoned each run.
double run_error(const TreeAttention& ta) {
  static std::map<std::pair<int, int32_t>, HostTensors> inputs;
  const Workload& w = ta.workload();
  const auto key = std::make_pair(w.layout.page_size, w.num_queries());
  auto it = inputs.find(key);
  if (it == inputs.end()) it = inputs.emplace(key, make_random_inputs(w, uint64_t(key.second))).first;
  HostTensors& h = it->second;
  h.poison_out();
  ta.run(h.args());
  return relative_error(w, h.out.data(), reference_attention(w, h.args()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  TreeAttentionConfig c;
  c.heads = {4, 2, 64};
  c.dtype = DType::fp16;
  constexpr int kPageSizes[] = {1, 4, 16};
  c.page_size = kPageSizes[r.byte() % 3];
  c.num_pages = kPages;
  c.device = Device::cpu;
  c.max_queries = 16;
  c.max_nodes = 24;
  c.max_page_refs = 128;
  c.max_extension_tokens = r.byte() % 2 ? 64 : 0;
  c.cpu_threads = 1;              // no thread pool per input
  c.plan_options.num_sms = 8;     // small plan capacities (and KV splits a small tree can show)
  const int ps = c.page_size;
  TreeAttention ta(c);
  Step last;
  bool planned = false;
  for (int step = 0; step < 4 && r.n > 0; ++step) {
    Step s;
    const int mode = r.byte() % 4;
    if (mode != 3 || !(grown(r, ps, last, s) || grown_tables(r, ps, last, s))) {
      s = Step();
      if (mode == 1) {
        random_block_tables(r, ps, s);
      } else {
        random_tree(r, ps, s);
        if (mode == 2) random_drafts(r, ps, s);
      }
    }
    mutate(r, s);
    try {
      const TreeArrays t{s.parents, s.tokens, s.offsets, s.pages, s.queries, s.first_slots};
      if (s.mode == 0) ta.plan_tree(t);
      if (s.mode == 1) ta.plan_block_tables(s.tables, int32_t(s.seq_lens.size()), s.width, s.seq_lens);
      if (s.mode == 2) ta.plan_tree_queries(t, {s.draft_nodes, s.draft_parents, s.draft_rows});
    } catch (const Error&) {
      if (planned) {
        treeattn_fuzz::require(workload_is(ta, last, ps), "a refused step leaves the last accepted one in force");
        treeattn_fuzz::require(run_error(ta) <= 2e-3, "the step in force matches the reference");
      }
      continue;
    }
    treeattn_fuzz::require(workload_is(ta, s, ps), "an accepted step's workload is its arrays as given");
    treeattn_fuzz::require(run_error(ta) <= 2e-3, "an accepted step matches the reference");
    last = s;
    planned = true;
  }
  return 0;
}
