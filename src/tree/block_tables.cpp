// vLLM-style batches (a block table and a length per sequence) turned into a
// radix tree over page ids: equal leading page ids are a shared prefix, as in
// PAT's tree-structure block table. Also reads the "blocktable:FILE" format.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {

namespace {
// A block-table row shorter than its sequence needs, named by the row's
// length (`have`: the table's width, or a ragged row's own length).
[[noreturn]] void table_too_short(int64_t s, int32_t len, int64_t npages, int page_size, int64_t have) {
  throw Error("seq " + std::to_string(s) + ": seq_len = " + std::to_string(len) + " needs " + std::to_string(npages) +
              " pages of " + std::to_string(page_size) + " tokens but its block table has " + std::to_string(have));
}
}  // namespace

// One page of the trie. A page id occurs in at most one trie node: the same
// physical page cannot hold tokens of two different prefixes.
struct BlockTableTree::TriePage {
  int32_t page;
  int32_t parent;      // trie node, -1 at a root
  int32_t fill;        // tokens in this page (equal in every sequence through it)
  int32_t first_seq;   // the sequence that created it (for messages)
  int32_t children = 0;
  bool ends = false;   // some sequence ends here
};

// Page id -> its trie node in this build: a dense table stamped per build
// (no clearing) for pools of up to kDensePages pages, else a hash map.
struct BlockTableTree::Scratch {
  static constexpr int64_t kDensePages = int64_t(1) << 22;
  std::vector<TriePage> trie;
  std::vector<uint64_t> dense;  // stamp << 32 | trie node
  uint32_t stamp = 0;
  std::unordered_map<int32_t, int32_t> sparse;
  std::vector<int32_t> node_of, seq_end;
  std::vector<int32_t> path;  // trie node of each page of the sequence read last
  // The last build's batch, as the growth path (grow_block_table_tree)
  // needs it; `kept` only while the trie, the page map and the output
  // arrays all describe that batch (cleared when a build starts).
  bool kept = false;
  int page_size = 0;
  int64_t num_pages = 0;
  std::vector<int32_t> seq_len;   // each sequence's length
  std::vector<uint8_t> sole_end;  // its last trie page has no child and no other sequence ends there
  std::vector<int32_t> path_nodes, new_offsets, new_ids;  // growth scratch

  void begin(int64_t num_pages) {
    kept = false;
    trie.clear();
    if (num_pages > kDensePages) {
      sparse.clear();
      return;
    }
    if (int64_t(dense.size()) < num_pages) dense.resize(size_t(num_pages), 0);
    if (++stamp == 0) {  // wrapped: forget every old stamp
      std::fill(dense.begin(), dense.end(), 0);
      stamp = 1;
    }
  }
  // The trie node of page pg (in [0, num_pages)); -1 (and `created` registered) when new.
  int32_t find_or_add(int32_t pg, int32_t created, int64_t num_pages) {
    if (num_pages > kDensePages) {
      auto [it, fresh] = sparse.emplace(pg, created);
      return fresh ? -1 : it->second;
    }
    uint64_t& e = dense[size_t(pg)];
    if (uint32_t(e >> 32) == stamp) return int32_t(uint32_t(e));
    e = uint64_t(stamp) << 32 | uint32_t(created);
    return -1;
  }
};

BlockTableTree::BlockTableTree() : scratch_(std::make_unique<Scratch>()) {}
BlockTableTree::~BlockTableTree() = default;
BlockTableTree::BlockTableTree(BlockTableTree&&) noexcept = default;
BlockTableTree& BlockTableTree::operator=(BlockTableTree&&) noexcept = default;

namespace {
// A batch's block-table rows: row-major [batch, width], or ragged (row s at
// data[offsets[s] .. offsets[s + 1])). Entries past a sequence's last page
// are never read.
struct Rows {
  const int32_t* data;
  int64_t width;           // when offsets is null
  const int64_t* offsets;  // ragged rows, else null
  const int32_t* row(int32_t s) const { return data + (offsets ? offsets[s] : int64_t(s) * width); }
  int64_t size(int32_t s) const { return offsets ? offsets[s + 1] - offsets[s] : width; }
};

// A decode step's batch grown from the last one: the same sequences, each
// its last batch's pages (checked against its path in the last tree) then
// at most new pages of its own, and only a sequence that ends alone at a
// childless trie page may grow (its pages are then a leaf run of its own,
// which the new pages and tokens extend). Such a batch's tree is the last
// tree with those leaf runs longer: the same nodes in the same order, as a
// full build would number them. Returns false (no output written) for any
// other batch, and the full build decides and names the errors. The trie
// and the page map are kept in step, so the next step may grow again.
bool grow_block_table_tree(Rows rows, int32_t batch, std::span<const int32_t> seq_lens, BlockTableTree::Scratch& sc,
                           BlockTableTree& out) {
  const int ps = sc.page_size;
  if (!sc.kept || size_t(batch) != sc.seq_len.size()) return false;
  // Check every row before changing anything: its kept pages against its
  // path, its new pages in range and new to the tree (each taken in the page
  // map as it is checked; a step that fails leaves entries that the full
  // build's fresh stamp forgets).
  int64_t appended = 0;
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t len = seq_lens[s], old_len = sc.seq_len[size_t(s)];
    if (len < old_len) return false;
    const int64_t npages = (int64_t(len) + ps - 1) / ps;
    if (npages > rows.size(s) || (len > old_len && !sc.sole_end[size_t(s)])) return false;
    const int32_t* row = rows.row(s);
    sc.path_nodes.clear();
    for (int32_t v = out.query_nodes[size_t(s)]; v >= 0; v = out.parents[size_t(v)]) sc.path_nodes.push_back(v);
    int64_t k = 0;
    for (auto it = sc.path_nodes.rbegin(); it != sc.path_nodes.rend(); ++it) {
      const int32_t b = out.page_offsets[size_t(*it)], n = out.page_offsets[size_t(*it) + 1] - b;
      if (std::memcmp(row + k, out.page_ids.data() + b, sizeof(int32_t) * size_t(n)) != 0) return false;
      k += n;
    }
    for (; k < npages; ++k) {
      const int32_t pg = row[k];
      if (pg < 0 || pg >= sc.num_pages || sc.find_or_add(pg, int32_t(sc.trie.size() + appended), sc.num_pages) >= 0)
        return false;
      ++appended;
    }
  }
  // Then grow: each growing sequence's trie pages, its leaf run's tokens and
  // pages (the flat page table rebuilt once when pages were added; until
  // then new_offsets[v + 1] holds the pages node v gains).
  if (appended > 0) sc.new_offsets.assign(out.page_offsets.size(), 0);
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t len = seq_lens[s], old_len = sc.seq_len[size_t(s)];
    if (len == old_len) continue;
    const int64_t npages = (int64_t(len) + ps - 1) / ps, old_npages = (int64_t(old_len) + ps - 1) / ps;
    const int32_t* row = rows.row(s);
    int32_t cur = sc.seq_end[size_t(s)];
    for (int64_t k = old_npages; k < npages; ++k) {
      sc.trie[size_t(cur)].fill = ps;
      sc.trie[size_t(cur)].children = 1;
      sc.trie[size_t(cur)].ends = false;
      sc.trie.push_back({row[k], cur, ps, s});
      cur = int32_t(sc.trie.size()) - 1;
    }
    sc.trie[size_t(cur)].fill = int32_t(len - (npages - 1) * ps);
    sc.trie[size_t(cur)].ends = true;
    sc.seq_end[size_t(s)] = cur;
    const int32_t v = out.query_nodes[size_t(s)];
    out.num_tokens[size_t(v)] += len - old_len;
    if (appended > 0) sc.new_offsets[size_t(v) + 1] = int32_t(npages - old_npages);
    sc.seq_len[size_t(s)] = len;
  }
  for (size_t t = sc.node_of.size(); t < sc.trie.size(); ++t) sc.node_of.push_back(sc.node_of[size_t(sc.trie[t].parent)]);
  if (appended > 0) {
    // Node v's pages: its kept ones, then the pages its sequence added.
    const size_t nodes = out.parents.size();
    for (size_t v = 0; v < nodes; ++v)
      sc.new_offsets[v + 1] += sc.new_offsets[v] + (out.page_offsets[v + 1] - out.page_offsets[v]);
    sc.new_ids.resize(size_t(sc.new_offsets[nodes]));
    for (size_t v = 0; v < nodes; ++v)
      std::copy(out.page_ids.begin() + out.page_offsets[v], out.page_ids.begin() + out.page_offsets[v + 1],
                sc.new_ids.begin() + sc.new_offsets[v]);
    for (int32_t s = 0; s < batch; ++s) {
      const int32_t v = out.query_nodes[size_t(s)];
      const int32_t kept = out.page_offsets[size_t(v) + 1] - out.page_offsets[size_t(v)];
      const int32_t added = sc.new_offsets[size_t(v) + 1] - sc.new_offsets[size_t(v)] - kept;
      const int32_t* row = rows.row(s);
      const int64_t first = (int64_t(seq_lens[s]) + ps - 1) / ps - added;  // the row's first new page
      std::copy(row + first, row + first + added, sc.new_ids.begin() + sc.new_offsets[size_t(v)] + kept);
    }
    std::swap(out.page_ids, sc.new_ids);
    std::swap(out.page_offsets, sc.new_offsets);
  }
  return true;
}
}  // namespace

// A trie node starts a new tree node unless it is the only child of a parent at
// which no sequence ends: then both are shared by exactly the same sequences
// and belong to one maximal run. A partially filled page must be the last page
// of every sequence through it with the same fill; otherwise the batch is
// rejected (a shared page cannot be partial in one sequence and full, or
// differently filled, in another: its tokens would differ). Messages are
// built only on failure: this runs every decode step.
namespace {
// Both overloads' build, their arguments' shapes checked.
void build_rows(Rows rows, int32_t batch, std::span<const int32_t> seq_lens, int page_size, int64_t num_pages,
                BlockTableTree::Scratch& sc, BlockTableTree& out) {
  const int ps = page_size;
  if (seq_lens.size() != size_t(batch))
    throw Error("block_tables: " + std::to_string(batch) + " sequences but seq_lens has " +
                std::to_string(seq_lens.size()));
  if (num_pages <= 0) throw Error("num_pages: " + std::to_string(num_pages) + " must be positive");
  detail::check_budget(batch, 0, "block_tables");

  if (sc.kept && sc.page_size == page_size && sc.num_pages == num_pages &&
      grow_block_table_tree(rows, batch, seq_lens, sc, out)) {
    ++out.grown_builds;
    return;
  }
  std::vector<BlockTableTree::TriePage>& trie = sc.trie;
  sc.begin(num_pages);
  sc.seq_end.resize(size_t(batch));
  const auto seq = [](int32_t s) { return "seq " + std::to_string(s); };
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t len = seq_lens[s];
    if (len <= 0) throw Error(seq(s) + ": seq_len = " + std::to_string(len) + " must be positive");
    const int64_t npages = (int64_t(len) + ps - 1) / ps;
    if (npages > rows.size(s)) table_too_short(s, len, npages, ps, rows.size(s));
    const int32_t* row = rows.row(s);
    // The pages this sequence shares with the one before (the common case:
    // a batch's sequences of one prefix are neighbours) are its trie nodes
    // already, and were checked there: skipped with a memcmp. Only pages full
    // in both are skipped (a last page's fill is checked below).
    int64_t k0 = 0;
    if (s > 0) {
      const int32_t* prev = rows.row(s - 1);
      const int64_t full = std::min<int64_t>(npages, (int64_t(seq_lens[s - 1]) + ps - 1) / ps) - 1;
      constexpr int64_t kBlock = 64;
      while (k0 + kBlock <= full && std::memcmp(row + k0, prev + k0, sizeof(int32_t) * kBlock) == 0) k0 += kBlock;
      while (k0 < full && row[k0] == prev[k0]) ++k0;
    }
    if (sc.path.size() < size_t(npages)) sc.path.resize(size_t(npages));
    int32_t cur = k0 > 0 ? sc.path[size_t(k0 - 1)] : -1;
    for (int64_t k = k0; k < npages; ++k) {
      const int32_t pg = row[k];
      const auto at = [&] {
        return seq(s) + ": block_tables[" + std::to_string(s) + "][" + std::to_string(k) + "] = page " +
               std::to_string(pg);
      };
      if (pg < 0 || pg >= num_pages)
        throw Error(at() + " is beyond the pool (num_pages " + std::to_string(num_pages) + ")");
      const int32_t fill = k + 1 == npages ? int32_t(len - k * ps) : ps;
      const int32_t found = sc.find_or_add(pg, int32_t(trie.size()), num_pages);
      if (found < 0) {
        // cur (if any) is full here, and so everywhere (fills are checked equal):
        // a partial page never gets a child.
        trie.push_back({pg, cur, fill, s});
        if (cur >= 0) ++trie[size_t(cur)].children;
        cur = int32_t(trie.size()) - 1;
      } else {
        const BlockTableTree::TriePage& t = trie[size_t(found)];
        if (t.parent != cur) {
          const std::string prev = cur >= 0 ? "page " + std::to_string(trie[size_t(cur)].page) : "the start";
          const std::string other =
              t.parent >= 0 ? "page " + std::to_string(trie[size_t(t.parent)].page) : "the start";
          throw Error(at() + " follows " + prev + " here but " + other + " in seq " + std::to_string(t.first_seq) +
                      " (a page can hold only one prefix)");
        }
        if (t.fill != fill)
          throw Error(seq(s) + ": page " + std::to_string(pg) + " is shared but partially filled (" +
                      std::to_string(fill) + " of " + std::to_string(ps) + " tokens here, " +
                      std::to_string(t.fill) + " in seq " + std::to_string(t.first_seq) + ")");
        cur = found;
      }
      sc.path[size_t(k)] = cur;
    }
    trie[size_t(cur)].ends = true;
    sc.seq_end[size_t(s)] = cur;
  }

  // Trie nodes are created parents first, so one forward pass assigns runs;
  // a run's pages were created by one sequence, in order (a run never
  // continues past a page where a sequence ends), so they are consecutive.
  sc.node_of.resize(trie.size());
  out.parents.clear();
  out.num_tokens.clear();
  out.page_offsets.assign(1, 0);
  out.page_ids.resize(trie.size());
  for (size_t t = 0; t < trie.size(); ++t) {
    const int32_t par = trie[t].parent;
    if (par >= 0 && trie[size_t(par)].children == 1 && !trie[size_t(par)].ends) {
      sc.node_of[t] = sc.node_of[size_t(par)];
    } else {
      sc.node_of[t] = int32_t(out.parents.size());
      out.parents.push_back(par >= 0 ? sc.node_of[size_t(par)] : -1);
      out.num_tokens.push_back(0);
      out.page_offsets.push_back(out.page_offsets.back());
    }
    const int32_t v = sc.node_of[t];
    out.page_ids[size_t(out.page_offsets[size_t(v) + 1]++)] = trie[t].page;
    out.num_tokens[size_t(v)] += trie[t].fill;
  }
  out.query_nodes.resize(size_t(batch));
  for (int32_t s = 0; s < batch; ++s) out.query_nodes[size_t(s)] = sc.node_of[size_t(sc.seq_end[size_t(s)])];

  // What the next build needs to grow this batch: the lengths, and which
  // sequences end alone at a childless trie page.
  sc.seq_len.assign(seq_lens.begin(), seq_lens.end());
  // A page another sequence created (an earlier one: it passes through it)
  // has two sequences ending at it, or one continuing past it: neither may grow.
  sc.sole_end.resize(size_t(batch));
  for (int32_t s = 0; s < batch; ++s) {
    const BlockTableTree::TriePage& t = trie[size_t(sc.seq_end[size_t(s)])];
    sc.sole_end[size_t(s)] = t.children == 0;
    if (t.first_seq != s) sc.sole_end[size_t(s)] = sc.sole_end[size_t(t.first_seq)] = 0;
  }
  sc.page_size = page_size;
  sc.num_pages = num_pages;
  sc.kept = true;
}
}  // namespace

void build_block_table_tree(std::span<const int32_t> block_tables, int32_t batch, int32_t width,
                            std::span<const int32_t> seq_lens, int page_size, int64_t num_pages, BlockTableTree& out) {
  detail::check_page_size(page_size);
  if (batch <= 0) throw Error("block_tables: empty (a batch needs at least one sequence)");
  if (width < 0 || block_tables.size() != size_t(batch) * size_t(width))
    throw Error("block_tables: " + std::to_string(block_tables.size()) + " entries for " + std::to_string(batch) +
                " sequences of " + std::to_string(width) + " columns");
  build_rows(Rows{block_tables.data(), width, nullptr}, batch, seq_lens, page_size, num_pages, *out.scratch_, out);
}

void build_block_table_tree(std::span<const int32_t> pages, std::span<const int64_t> row_offsets,
                            std::span<const int32_t> seq_lens, int page_size, int64_t num_pages, BlockTableTree& out) {
  detail::check_page_size(page_size);
  if (row_offsets.size() <= 1) throw Error("block_tables: empty (a batch needs at least one sequence)");
  if (row_offsets.size() - 1 > size_t(std::numeric_limits<int32_t>::max()))
    throw Error("block_tables: " + std::to_string(row_offsets.size() - 1) + " sequences are too many");
  if (row_offsets[0] != 0) throw Error("row_offsets[0] = " + std::to_string(row_offsets[0]) + " must be 0");
  for (size_t s = 1; s < row_offsets.size(); ++s)
    if (row_offsets[s] < row_offsets[s - 1] || row_offsets[s] > int64_t(pages.size()))
      throw Error("row_offsets[" + std::to_string(s) + "] = " + std::to_string(row_offsets[s]) +
                  " must lie in [row_offsets[" + std::to_string(s - 1) + "] = " + std::to_string(row_offsets[s - 1]) +
                  ", " + std::to_string(pages.size()) + "] (the page entries given)");
  build_rows(Rows{pages.data(), 0, row_offsets.data()}, int32_t(row_offsets.size() - 1), seq_lens, page_size,
             num_pages, *out.scratch_, out);
}

Workload from_block_tables(const std::vector<std::vector<int32_t>>& block_tables,
                           const std::vector<int32_t>& seq_lens, int64_t num_pages,
                           const WorkloadParams& p) {
  detail::check_page_size(p.page_size);
  if (block_tables.size() != seq_lens.size())
    throw Error("block_tables: " + std::to_string(block_tables.size()) + " sequences but seq_lens has " +
                std::to_string(seq_lens.size()));
  if (block_tables.empty()) throw Error("block_tables: empty (a batch needs at least one sequence)");
  detail::check_budget(block_tables.size(), 0, "block_tables");
  // The rows back to back (memory follows the entries, not batch x the longest row).
  std::vector<int64_t> offsets(block_tables.size() + 1, 0);
  for (size_t s = 0; s < block_tables.size(); ++s) offsets[s + 1] = offsets[s] + int64_t(block_tables[s].size());
  std::vector<int32_t> pages(size_t(offsets.back()));
  for (size_t s = 0; s < block_tables.size(); ++s)
    std::copy(block_tables[s].begin(), block_tables[s].end(), pages.begin() + offsets[s]);
  BlockTableTree t;
  build_block_table_tree(pages, offsets, seq_lens, p.page_size, num_pages, t);
  Workload w;
  w.tree.nodes.resize(t.parents.size());
  for (size_t v = 0; v < t.parents.size(); ++v) {
    Node& n = w.tree.nodes[v];
    n.parent = t.parents[v];
    n.num_tokens = t.num_tokens[v];
    n.pages.assign(t.page_ids.begin() + t.page_offsets[v], t.page_ids.begin() + t.page_offsets[v + 1]);
  }
  w.query_nodes = t.query_nodes;
  w.name = "blocktable";
  w.heads = p.heads;
  w.layout = KvLayout{p.page_size, num_pages, p.dtype, p.kv_dtype};
  w.validate();
  return w;
}

using detail::json;

BlockTablesInput parse_block_tables_json(std::string_view text, const WorkloadParams& defaults) {
  const json top = detail::parse_json(text, "blocktable");
  detail::require_object(top, "blocktable: top level");
  static constexpr std::string_view keys[] = {"block_tables", "seq_lens", "num_pages", "page_size", "heads",
                                              "dtype"};
  detail::check_keys(top, "", keys);
  BlockTablesInput in;
  in.params = detail::parse_shape_keys(top, defaults);
  const json& jb = detail::require(top, "block_tables", "");
  const json& jl = detail::require(top, "seq_lens", "");
  detail::require_array(jb, "block_tables");
  detail::require_array(jl, "seq_lens");
  std::vector<std::vector<int32_t>>& tables = in.block_tables;
  tables.resize(jb.size());
  std::vector<int32_t>& lens = in.seq_lens;
  for (size_t s = 0; s < jl.size(); ++s)
    lens.push_back(int32_t(detail::get_int(jl[s], "seq_lens[" + std::to_string(s) + "]", 1)));
  // Entries past a sequence's ceil(seq_len / page_size) pages are padding
  // (any int32, vLLM pads with 0 or -1): they neither need to be page ids nor
  // count for the default num_pages. (Sequences without a length are
  // refused by from_block_tables.)
  const int64_t ps = std::max(1, in.params.page_size);
  int64_t max_page = -1;
  for (size_t s = 0; s < jb.size(); ++s) {
    const std::string f = "block_tables[" + std::to_string(s) + "]";
    detail::require_array(jb[s], f);
    const size_t used = s < lens.size() ? size_t((int64_t(lens[s]) + ps - 1) / ps) : jb[s].size();
    for (size_t k = 0; k < jb[s].size(); ++k) {
      const bool padding = k >= used;
      tables[s].push_back(int32_t(detail::get_int(jb[s][k], f + "[" + std::to_string(k) + "]",
                                                  padding ? std::numeric_limits<int32_t>::min() : 0)));
      if (!padding) max_page = std::max<int64_t>(max_page, tables[s].back());
    }
  }
  in.num_pages = max_page + 1;
  if (auto it = top.find("num_pages"); it != top.end())
    in.num_pages = detail::get_int(*it, "num_pages", 1, std::numeric_limits<int64_t>::max());
  return in;
}

Workload block_tables_from_json(std::string_view text, const WorkloadParams& defaults) {
  const BlockTablesInput in = parse_block_tables_json(text, defaults);
  return from_block_tables(in.block_tables, in.seq_lens, in.num_pages, in.params);
}


Workload read_block_tables_file(const std::string& path, const WorkloadParams& defaults) {
  const std::string text = detail::read_text_file(path, "blocktable");
  try {
    return block_tables_from_json(text, defaults);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace treeattn
