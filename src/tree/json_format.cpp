// The JSON tree format "treeattn.tree/1" (docs/formats.md): reading with
// errors that name the JSON field, and writing that round-trips exactly.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {

namespace detail {

WorkloadParams parse_shape_keys(const json& top, const WorkloadParams& defaults) {
  WorkloadParams p = defaults;
  if (auto it = top.find("heads"); it != top.end()) {
    require_object(*it, "heads");
    static constexpr std::string_view keys[] = {"qo", "kv", "head_dim"};
    check_keys(*it, "heads", keys);
    if (auto h = it->find("qo"); h != it->end()) p.heads.num_qo_heads = int(get_int(*h, "heads.qo", 1, 4096));
    if (auto h = it->find("kv"); h != it->end()) p.heads.num_kv_heads = int(get_int(*h, "heads.kv", 1, 1024));
    if (auto h = it->find("head_dim"); h != it->end())
      p.heads.head_dim = int(get_int(*h, "heads.head_dim", 1, 1 << 16));
  }
  if (p.heads.num_qo_heads % p.heads.num_kv_heads != 0)
    throw Error("heads.qo = " + std::to_string(p.heads.num_qo_heads) + " is not a multiple of heads.kv = " +
                std::to_string(p.heads.num_kv_heads));
  if (!is_supported_head_dim(p.heads.head_dim))
    throw Error("heads.head_dim = " + std::to_string(p.heads.head_dim) + " is not supported (64, 128 or 256)");
  if (auto it = top.find("page_size"); it != top.end()) p.page_size = int(get_int(*it, "page_size", 1, 65536));
  if (auto it = top.find("dtype"); it != top.end()) {
    if (!it->is_string()) throw Error("dtype = " + brief(*it) + " is not a string (fp16, bf16 or fp32)");
    p.dtype = parse_dtype(it->get<std::string>());
  }
  if (auto it = top.find("kv_dtype"); it != top.end()) {
    if (!it->is_string()) throw Error("kv_dtype = " + brief(*it) + " is not a string (fp8_e4m3, or the dtype)");
    p.kv_dtype = parse_dtype(it->get<std::string>(), "kv_dtype");
  }
  return p;
}

}  // namespace detail

using detail::brief;
using detail::get_int;
using detail::json;

namespace {

constexpr std::string_view kFormat = "treeattn.tree/1";

std::string at(const char* array, size_t i) { return std::string(array) + "[" + std::to_string(i) + "]"; }

}  // namespace

// Reading order: shape keys, nodes (ids, parents, tokens, pages), queries, then
// the structural checks (unknown parent, cycle, roots) with JSON field names,
// and last Workload::validate() as the common gate.
Workload workload_from_json(std::string_view text, const WorkloadParams& defaults) {
  const json top = detail::parse_json(text, "json");
  detail::require_object(top, "json: top level");
  static constexpr std::string_view keys[] = {"format", "name", "heads", "page_size", "dtype", "kv_dtype",
                                              "num_pages", "nodes", "queries", "single_root"};
  detail::check_keys(top, "", keys);
  if (auto it = top.find("format"); it != top.end() && !(it->is_string() && *it == kFormat))
    throw Error("format = " + brief(*it) + " is not supported (expected \"" + std::string(kFormat) + "\")");
  const WorkloadParams p = detail::parse_shape_keys(top, defaults);
  const int ps = p.page_size;

  Workload w;
  w.name = "json";
  if (auto it = top.find("name"); it != top.end()) {
    if (!it->is_string()) throw Error("name = " + brief(*it) + " is not a string");
    w.name = it->get<std::string>();
  }
  w.heads = p.heads;
  w.layout.page_size = ps;
  w.layout.dtype = p.dtype;
  w.layout.kv_dtype = p.kv_dtype;

  // ---- nodes: index i in the file, id k in the tree.
  const json& jn = detail::require(top, "nodes", "");
  detail::require_array(jn, "nodes");
  if (jn.empty()) throw Error("nodes: empty (a tree needs at least one node)");
  const size_t n = jn.size();
  detail::check_budget(n, 0, "nodes");
  std::vector<int32_t> slot(n, -1);  // id -> index in the file
  std::vector<int32_t> parent(n), tokens(n);
  std::vector<const json*> pages(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const std::string f = at("nodes", i);
    detail::require_object(jn[i], f);
    static constexpr std::string_view nkeys[] = {"id", "parent", "tokens", "pages"};
    detail::check_keys(jn[i], f, nkeys);
    const int64_t id = get_int(detail::require(jn[i], "id", f), f + ".id", 0, int64_t(n) - 1);
    if (slot[id] >= 0)
      throw Error(f + ".id = " + std::to_string(id) + " is a duplicate of nodes[" + std::to_string(slot[id]) +
                  "].id (ids must be 0.." + std::to_string(n - 1) + ", each once)");
    slot[id] = int32_t(i);
    parent[i] = int32_t(get_int(detail::require(jn[i], "parent", f), f + ".parent", -1));
    tokens[i] = int32_t(get_int(detail::require(jn[i], "tokens", f), f + ".tokens", 0));
    if (auto it = jn[i].find("pages"); it != jn[i].end()) {
      detail::require_array(*it, f + ".pages");
      pages[i] = &*it;
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (parent[i] >= int64_t(n))
      throw Error(at("nodes", i) + ".parent = " + std::to_string(parent[i]) + ": no node has this id (ids are 0.." +
                  std::to_string(n - 1) + ")");

  // Cycles, walked over ids: 0 unseen, 1 on the current walk, 2 reaches a root.
  {
    std::vector<uint8_t> state(n, 0);
    std::vector<int32_t> walk;
    for (size_t start = 0; start < n; ++start) {
      walk.clear();
      int32_t v = int32_t(start);
      while (v >= 0 && state[v] == 0) {
        state[v] = 1;
        walk.push_back(v);
        v = parent[slot[v]];
      }
      if (v >= 0 && state[v] == 1) {
        std::string ids;
        auto pos = std::find(walk.begin(), walk.end(), v);
        for (auto it = pos; it != walk.end() && ids.size() < 120; ++it) ids += std::to_string(*it) + " -> ";
        throw Error(at("nodes", size_t(slot[v])) + ".parent = " + std::to_string(parent[slot[v]]) +
                    " closes a cycle (ids " + ids + std::to_string(v) + ")");
      }
      for (int32_t u : walk) state[u] = 2;
    }
  }
  bool single_root = false;
  if (auto it = top.find("single_root"); it != top.end()) {
    if (!it->is_boolean()) throw Error("single_root = " + brief(*it) + " is not true or false");
    single_root = it->get<bool>();
  }
  if (single_root) {
    int32_t first = -1;
    for (size_t i = 0; i < n; ++i) {
      if (parent[i] != -1) continue;
      if (first >= 0)
        throw Error(at("nodes", i) + ".parent = -1: a second root where one is required (single_root; the first "
                    "root is nodes[" + std::to_string(first) + "])");
      first = int32_t(i);
    }
  }

  // ---- pages: given for every node that has tokens, or for none.
  bool any_pages = false, any_missing = false;
  size_t first_given = 0, first_missing = 0;
  for (size_t i = 0; i < n; ++i) {
    // An empty node may say "pages": [] in either mode.
    const bool given = pages[i] && (tokens[i] > 0 || !pages[i]->empty());
    if (given && !any_pages) any_pages = true, first_given = i;
    if (!pages[i] && tokens[i] > 0 && !any_missing) any_missing = true, first_missing = i;
  }
  if (any_pages && any_missing)
    throw Error(at("nodes", first_missing) + ".pages: missing, but nodes[" + std::to_string(first_given) +
                "] gives pages (give pages for every node or for none)");
  int64_t num_pages = -1;
  if (auto it = top.find("num_pages"); it != top.end())
    num_pages = get_int(*it, "num_pages", 0, std::numeric_limits<int64_t>::max());

  w.tree.nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Node& node = w.tree.nodes[jn[i]["id"].get<int64_t>()];
    node.parent = parent[i];
    node.num_tokens = tokens[i];
  }
  if (any_pages) {
    int64_t max_page = -1;
    std::unordered_map<int32_t, int32_t> owner;  // page id -> file index
    for (size_t i = 0; i < n; ++i) {
      if (!pages[i]) continue;
      const std::string f = at("nodes", i) + ".pages";
      const json& pj = *pages[i];
      const int64_t need = (int64_t(tokens[i]) + ps - 1) / ps;
      if (int64_t(pj.size()) != need)
        throw Error(f + ": " + std::to_string(pj.size()) + " pages for " + std::to_string(tokens[i]) +
                    " tokens with page_size " + std::to_string(ps) + " (expected " + std::to_string(need) + ")");
      Node& node = w.tree.nodes[jn[i]["id"].get<int64_t>()];
      for (size_t k = 0; k < pj.size(); ++k) {
        const std::string fk = f + "[" + std::to_string(k) + "]";
        const int32_t pg = int32_t(get_int(pj[k], fk, 0));
        if (num_pages >= 0 && pg >= num_pages)
          throw Error(fk + " = " + std::to_string(pg) + " is beyond the pool (num_pages " +
                      std::to_string(num_pages) + ")");
        if (auto [o, fresh] = owner.emplace(pg, int32_t(i)); !fresh)
          throw Error(fk + " = " + std::to_string(pg) + " is also used by nodes[" + std::to_string(o->second) +
                      "] (a page holds one node position)");
        max_page = std::max<int64_t>(max_page, pg);
        node.pages.push_back(pg);
      }
    }
    w.layout.num_pages = num_pages >= 0 ? num_pages : max_page + 1;
  } else {
    __int128 need = 0;
    for (size_t i = 0; i < n; ++i) need += detail::pages_for(tokens[i], ps);
    detail::check_budget(n, need, "nodes");
    if (num_pages >= 0 && num_pages < need)
      throw Error("num_pages = " + std::to_string(num_pages) + " is smaller than the " +
                  std::to_string(int64_t(need)) + " pages the nodes need");
    // Allocate in id order; the allocator's shuffle keeps ids non-contiguous.
    PageAllocator alloc(ps, detail::mix_seed(p.seed, 0x15011));
    Tree tmp;
    for (const Node& node : w.tree.nodes) alloc.add_node(tmp, node.parent, node.num_tokens);
    const int64_t used = alloc.finish(tmp);
    w.tree = std::move(tmp);
    w.layout.num_pages = std::max(used, num_pages);
  }

  // ---- queries: [3, 3, 5] or [{"node": 3}, ...].
  const json& jq = detail::require(top, "queries", "");
  detail::require_array(jq, "queries");
  if (jq.empty()) throw Error("queries: empty (a workload needs at least one query)");
  for (size_t i = 0; i < jq.size(); ++i) {
    std::string f = at("queries", i);
    const json* v = &jq[i];
    if (v->is_object()) {
      static constexpr std::string_view qkeys[] = {"node"};
      detail::check_keys(*v, f, qkeys);
      v = &detail::require(*v, "node", f);
      f += ".node";
    }
    const int64_t q = get_int(*v, f);
    if (q < 0 || q >= int64_t(n))
      throw Error(f + " = " + std::to_string(q) + ": no node has this id (ids are 0.." + std::to_string(n - 1) + ")");
    w.query_nodes.push_back(int32_t(q));
  }
  w.validate();
  return w;
}

Workload read_workload_file(const std::string& path, const WorkloadParams& defaults) {
  const std::string text = detail::read_text_file(path, "json");
  try {
    Workload w = workload_from_json(text, defaults);
    return w;
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

// One node per line: readable, diffable, and still plain JSON.
std::string workload_to_json(const Workload& w) {
  std::string s = "{\n";
  s += "  \"format\": \"" + std::string(kFormat) + "\",\n";
  s += "  \"name\": " + json(w.name).dump(-1, ' ', false, json::error_handler_t::replace) + ",\n";
  s += "  \"heads\": {\"qo\": " + std::to_string(w.heads.num_qo_heads) + ", \"kv\": " +
       std::to_string(w.heads.num_kv_heads) + ", \"head_dim\": " + std::to_string(w.heads.head_dim) + "},\n";
  s += "  \"page_size\": " + std::to_string(w.layout.page_size) + ",\n";
  s += "  \"dtype\": \"" + std::string(to_string(w.layout.dtype)) + "\",\n";
  if (w.layout.kv_dtype) s += "  \"kv_dtype\": \"" + std::string(to_string(*w.layout.kv_dtype)) + "\",\n";
  s += "  \"num_pages\": " + std::to_string(w.layout.num_pages) + ",\n";
  s += "  \"nodes\": [\n";
  for (size_t v = 0; v < w.tree.nodes.size(); ++v) {
    const Node& node = w.tree.nodes[v];
    s += "    {\"id\": " + std::to_string(v) + ", \"parent\": " + std::to_string(node.parent) +
         ", \"tokens\": " + std::to_string(node.num_tokens) + ", \"pages\": [";
    for (size_t k = 0; k < node.pages.size(); ++k) s += (k ? ", " : "") + std::to_string(node.pages[k]);
    s += v + 1 < w.tree.nodes.size() ? "]},\n" : "]}\n";
  }
  s += "  ],\n  \"queries\": [";
  for (size_t i = 0; i < w.query_nodes.size(); ++i) s += (i ? ", " : "") + std::to_string(w.query_nodes[i]);
  s += "]\n}\n";
  return s;
}

}  // namespace treeattn
