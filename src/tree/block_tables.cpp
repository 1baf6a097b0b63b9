// vLLM-style batches (a block table and a length per sequence) turned into a
// radix tree over page ids: equal leading page ids are a shared prefix, as in
// PAT's tree-structure block table. Also reads the "blocktable:FILE" format.
#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {

namespace {

// One page of the trie. A page id occurs in at most one trie node: the same
// physical page cannot hold tokens of two different prefixes.
struct TriePage {
  int32_t page;
  int32_t parent;      // trie node, -1 at a root
  int32_t fill;        // tokens in this page (equal in every sequence through it)
  int32_t first_seq;   // the sequence that created it (for messages)
  int32_t children = 0;
  bool ends = false;   // some sequence ends here
};

}  // namespace

// A trie node starts a new tree node unless it is the only child of a parent at
// which no sequence ends: then both are shared by exactly the same sequences
// and belong to one maximal run. A partially filled page must be the last page
// of every sequence through it with the same fill; otherwise the batch is
// rejected (a shared page cannot be partial in one sequence and full, or
// differently filled, in another: its tokens would differ).
Workload from_block_tables(const std::vector<std::vector<int32_t>>& block_tables,
                           const std::vector<int32_t>& seq_lens, int64_t num_pages,
                           const WorkloadParams& p) {
  detail::check_page_size(p.page_size);
  const int ps = p.page_size;
  if (block_tables.size() != seq_lens.size())
    throw Error("block_tables: " + std::to_string(block_tables.size()) + " sequences but seq_lens has " +
                std::to_string(seq_lens.size()));
  if (block_tables.empty()) throw Error("block_tables: empty (a batch needs at least one sequence)");
  if (num_pages <= 0) throw Error("num_pages: " + std::to_string(num_pages) + " must be positive");
  detail::check_budget(block_tables.size(), 0, "block_tables");

  std::vector<TriePage> trie;
  std::unordered_map<int32_t, int32_t> where;  // page id -> trie node
  std::vector<int32_t> seq_end(seq_lens.size());
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const std::string seq = "seq " + std::to_string(s);
    const int32_t len = seq_lens[s];
    if (len <= 0) throw Error(seq + ": seq_len = " + std::to_string(len) + " must be positive");
    const int64_t npages = (int64_t(len) + ps - 1) / ps;
    if (int64_t(block_tables[s].size()) < npages)
      throw Error(seq + ": seq_len = " + std::to_string(len) + " needs " + std::to_string(npages) +
                  " pages of " + std::to_string(ps) + " tokens but its block table has " +
                  std::to_string(block_tables[s].size()));
    // Entries past the sequence's last page are padding (vLLM tables are rectangular): ignored.
    int32_t cur = -1;
    for (int64_t k = 0; k < npages; ++k) {
      const int32_t pg = block_tables[s][k];
      const std::string at = seq + ": block_tables[" + std::to_string(s) + "][" + std::to_string(k) + "] = page " +
                             std::to_string(pg);
      if (pg < 0 || pg >= num_pages)
        throw Error(at + " is beyond the pool (num_pages " + std::to_string(num_pages) + ")");
      const int32_t fill = k + 1 == npages ? int32_t(len - k * ps) : ps;
      auto [it, fresh] = where.emplace(pg, int32_t(trie.size()));
      if (fresh) {
        // cur (if any) is full here, and so everywhere (fills are checked equal):
        // a partial page never gets a child.
        trie.push_back({pg, cur, fill, int32_t(s)});
        if (cur >= 0) ++trie[cur].children;
      } else {
        const TriePage& t = trie[it->second];
        if (t.parent != cur) {
          const std::string prev = cur >= 0 ? "page " + std::to_string(trie[cur].page) : "the start";
          const std::string other = t.parent >= 0 ? "page " + std::to_string(trie[t.parent].page) : "the start";
          throw Error(at + " follows " + prev + " here but " + other + " in seq " + std::to_string(t.first_seq) +
                      " (a page can hold only one prefix)");
        }
        if (t.fill != fill)
          throw Error(seq + ": page " + std::to_string(pg) + " is shared but partially filled (" +
                      std::to_string(fill) + " of " + std::to_string(ps) + " tokens here, " +
                      std::to_string(t.fill) + " in seq " + std::to_string(t.first_seq) + ")");
      }
      cur = it->second;
    }
    trie[cur].ends = true;
    seq_end[s] = cur;
  }

  // Trie nodes are created parents first, so one forward pass assigns runs.
  Workload w;
  std::vector<int32_t> node_of(trie.size());
  for (size_t t = 0; t < trie.size(); ++t) {
    const int32_t par = trie[t].parent;
    if (par >= 0 && trie[par].children == 1 && !trie[par].ends) {
      node_of[t] = node_of[par];
    } else {
      node_of[t] = int32_t(w.tree.nodes.size());
      w.tree.nodes.push_back(Node{par >= 0 ? node_of[par] : -1, 0, {}});
    }
    Node& node = w.tree.nodes[node_of[t]];
    node.pages.push_back(trie[t].page);
    node.num_tokens += trie[t].fill;
  }
  for (int32_t e : seq_end) w.query_nodes.push_back(node_of[e]);
  w.name = "blocktable";
  w.heads = p.heads;
  w.layout = KvLayout{ps, num_pages, p.dtype};
  w.validate();
  return w;
}

using detail::json;

Workload block_tables_from_json(std::string_view text, const WorkloadParams& defaults) {
  const json top = detail::parse_json(text, "blocktable");
  detail::require_object(top, "blocktable: top level");
  static constexpr std::string_view keys[] = {"block_tables", "seq_lens", "num_pages", "page_size", "heads",
                                              "dtype"};
  detail::check_keys(top, "", keys);
  const WorkloadParams p = detail::parse_shape_keys(top, defaults);
  const json& jb = detail::require(top, "block_tables", "");
  const json& jl = detail::require(top, "seq_lens", "");
  detail::require_array(jb, "block_tables");
  detail::require_array(jl, "seq_lens");
  std::vector<std::vector<int32_t>> tables(jb.size());
  std::vector<int32_t> lens;
  int64_t max_page = -1;
  for (size_t s = 0; s < jb.size(); ++s) {
    const std::string f = "block_tables[" + std::to_string(s) + "]";
    detail::require_array(jb[s], f);
    for (size_t k = 0; k < jb[s].size(); ++k) {
      tables[s].push_back(int32_t(detail::get_int(jb[s][k], f + "[" + std::to_string(k) + "]", 0)));
      max_page = std::max<int64_t>(max_page, tables[s].back());
    }
  }
  for (size_t s = 0; s < jl.size(); ++s)
    lens.push_back(int32_t(detail::get_int(jl[s], "seq_lens[" + std::to_string(s) + "]", 1)));
  int64_t num_pages = max_page + 1;
  if (auto it = top.find("num_pages"); it != top.end())
    num_pages = detail::get_int(*it, "num_pages", 1, std::numeric_limits<int64_t>::max());
  return from_block_tables(tables, lens, num_pages, p);
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
