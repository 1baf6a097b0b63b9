// Replays of recorded tree-structured decoding runs (the formats of
// data/workloads/README.md): tree-of-thoughts trees at an iteration, and Medusa
// token trees at a step. Any file of the same format works.
#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tree/builder_util.hpp"
#include "tree/json_util.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {

using detail::get_int;
using detail::json;

namespace {

struct TotNode {
  int64_t id;
  int32_t value, start, end;
  std::vector<int64_t> children;
};

// One task, checked: `order` is a BFS from the root (parents first). A task
// that fails its checks keeps the message, thrown when that task is asked for.
struct TotTask {
  std::vector<TotNode> nodes;
  std::vector<int32_t> parent, order;
  int32_t root = -1;
  std::string error;
};

TotTask parse_tot_task(const json& jt, const std::string& where) {
  TotTask tt;
  detail::require_object(jt, where);
  const json& data = detail::require(jt, "data", where);
  detail::require_object(data, where + ".data");
  if (data.empty()) throw Error(where + ".data: empty (no nodes)");
  std::vector<TotNode>& nodes = tt.nodes;
  std::unordered_map<int64_t, int32_t> index;  // recorded id -> position in `nodes`
  for (auto it = data.begin(); it != data.end(); ++it) {
    const std::string f = where + ".data[\"" + it.key() + "\"]";
    detail::require_object(*it, f);
    TotNode n;
    n.id = get_int(detail::require(*it, "id", f), f + ".id", 0);
    n.value = int32_t(get_int(detail::require(*it, "value", f), f + ".value", 0));
    n.start = int32_t(get_int(detail::require(*it, "start", f), f + ".start"));
    n.end = int32_t(get_int(detail::require(*it, "end", f), f + ".end"));
    // The key is the node's id (README): children name nodes by id.
    if (std::to_string(n.id) != it.key())
      throw Error(f + ".id = " + std::to_string(n.id) + " differs from its key \"" + it.key() + "\"");
    // A node generates its tokens during iterations start..end (inclusive),
    // at most one per iteration, and may stay live after its last one: the
    // span holds at least `value` iterations (none for an empty node, whose
    // end is start - 1).
    if (n.start > int64_t(n.end) + 1)
      throw Error(f + ": start = " + std::to_string(n.start) + ", end = " + std::to_string(n.end) +
                  ": end is before start - 1 (start..end are the iterations generating the node's tokens)");
    if (int64_t(n.end) - n.start + 1 < n.value)
      throw Error(f + ": start = " + std::to_string(n.start) + ", end = " + std::to_string(n.end) + " give " +
                  std::to_string(int64_t(n.end) - n.start + 1) + " iterations, fewer than value = " +
                  std::to_string(n.value) + " tokens");
    const json& ch = detail::require(*it, "children", f);
    detail::require_array(ch, f + ".children");
    for (size_t k = 0; k < ch.size(); ++k)
      n.children.push_back(get_int(ch[k], f + ".children[" + std::to_string(k) + "]", 0));
    index.emplace(n.id, int32_t(nodes.size()));  // ids are keys, and parse_json refuses a repeated key
    nodes.push_back(std::move(n));
  }
  const int32_t n = int32_t(nodes.size());
  detail::check_budget(n, 0, where);
  tt.parent.assign(n, -1);
  for (int32_t v = 0; v < n; ++v)
    for (int64_t c : nodes[v].children) {
      auto it = index.find(c);
      if (it == index.end())
        throw Error(where + ": node " + std::to_string(nodes[v].id) + ": child " + std::to_string(c) +
                    " does not exist");
      if (tt.parent[it->second] >= 0)
        throw Error(where + ": node " + std::to_string(c) + " is a child of both node " +
                    std::to_string(nodes[tt.parent[it->second]].id) + " and node " + std::to_string(nodes[v].id));
      tt.parent[it->second] = v;
    }
  for (int32_t v = 0; v < n; ++v) {
    if (tt.parent[v] >= 0) continue;
    if (tt.root >= 0)
      throw Error(where + ": node " + std::to_string(nodes[v].id) + " is a second root (node " +
                  std::to_string(nodes[tt.root].id) + " is the first; a ToT tree has one root)");
    tt.root = v;
  }
  if (tt.root < 0) throw Error(where + ": no root (every node is some node's child: a cycle)");
  tt.order = {tt.root};
  for (size_t i = 0; i < tt.order.size(); ++i)
    for (int64_t c : nodes[tt.order[i]].children) tt.order.push_back(index.at(c));
  if (int32_t(tt.order.size()) != n)
    throw Error(where + ": " + std::to_string(n - int32_t(tt.order.size())) +
                " nodes are not reachable from the root (a cycle)");
  return tt;
}

std::shared_ptr<const std::vector<TotTask>> parse_tot_tasks(std::string_view text, const std::string& path) {
  const json top = detail::parse_json(text, "tot: " + path);
  if (!top.is_array()) throw Error("tot: " + path + ": the top level is not a list of tasks");
  auto tasks = std::make_shared<std::vector<TotTask>>(top.size());
  for (size_t k = 0; k < top.size(); ++k) {
    try {
      (*tasks)[k] = parse_tot_task(top[k], "tot: " + path + ": [" + std::to_string(k) + "]");
    } catch (const Error& e) {
      (*tasks)[k] = TotTask{};
      (*tasks)[k].error = e.what();
    }
  }
  return tasks;
}

// Benchmarks replay many iterations of one file; parsing it once per call
// would dominate. Parsed files are kept per path and reloaded when the file's
// size or modification time changes. Files that fail to parse are not kept.
std::shared_ptr<const std::vector<TotTask>> load_tot_file(const std::string& path) {
  namespace fs = std::filesystem;
  struct Entry {
    uintmax_t size;
    fs::file_time_type mtime;
    std::shared_ptr<const std::vector<TotTask>> tasks;
  };
  static std::mutex mu;
  static std::map<std::string, Entry> cache;
  std::error_code e1, e2;
  const uintmax_t size = fs::file_size(path, e1);
  const fs::file_time_type mtime = fs::last_write_time(path, e2);
  const bool stat_ok = !e1 && !e2;
  if (stat_ok) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(path);
    if (it != cache.end() && it->second.size == size && it->second.mtime == mtime) return it->second.tasks;
  }
  auto tasks = parse_tot_tasks(detail::read_text_file(path, "tot"), path);
  if (stat_ok) {
    std::lock_guard<std::mutex> lock(mu);
    cache[path] = Entry{size, mtime, tasks};
  }
  return tasks;
}

}  // namespace

// Replay rule (README): at iteration t a node exists when start <= t (the root,
// the prefilled prompt, always); its length is min(value, t - start + 1), the
// root's is its full value (the recorded prompt length in tokens: we use the
// file's count, not a tokenisation of the prompt text). A node generates when
// start <= t <= end and then holds one decode query. A finished node stays
// only while its subtree still holds a generating node: it is the shared
// prefix of those; finished subtrees with nothing generating below are dropped,
// as a decode engine would have evicted them, and they get no query.
namespace {
Workload tot_replay(const std::vector<TotTask>* tasks, const std::string& path, int task, int iter,
                    const WorkloadParams& p);
}  // namespace

Workload tot_workload(const std::string& path, int task, int iter, const WorkloadParams& p) {
  detail::check_page_size(p.page_size);
  if (iter < 0) throw Error("tot: iter = " + std::to_string(iter) + " must be >= 0");
  const auto tasks = load_tot_file(path);
  return tot_replay(tasks.get(), path, task, iter, p);
}

namespace detail {
Workload tot_workload_from_text(std::string_view text, const std::string& path, int task, int iter,
                                const WorkloadParams& p) {
  detail::check_page_size(p.page_size);
  if (iter < 0) throw Error("tot: iter = " + std::to_string(iter) + " must be >= 0");
  const auto tasks = parse_tot_tasks(text, path);
  return tot_replay(tasks.get(), path, task, iter, p);
}
}  // namespace detail

namespace {
// A task at one iteration (the replay rule above): which nodes are kept and
// which generate; nothing is kept when none generates.
struct TotAt {
  std::vector<uint8_t> keep, generating;
  int32_t last_iter = 0;  // the task's last generating iteration
};

TotAt tot_at(const TotTask& tt, int iter) {
  const int32_t n = int32_t(tt.nodes.size());
  TotAt at;
  at.keep.assign(n, 0);
  at.generating.assign(n, 0);
  std::vector<uint8_t> exists(n, 0);
  for (int32_t v : tt.order) {
    const TotNode& t = tt.nodes[v];
    at.last_iter = std::max(at.last_iter, t.end);
    exists[v] = v == tt.root || (exists[tt.parent[v]] && t.start <= iter);
    at.generating[v] = exists[v] && t.start <= iter && iter <= t.end;
  }
  for (auto it = tt.order.rbegin(); it != tt.order.rend(); ++it) {
    at.keep[*it] |= at.generating[*it];
    if (at.keep[*it] && tt.parent[*it] >= 0) at.keep[tt.parent[*it]] = 1;
  }
  return at;
}

__int128 tot_pages(const TotTask& tt, const TotAt& at, int page_size) {
  __int128 pages = 0;
  for (int32_t v : tt.order) pages += at.keep[v] ? detail::pages_for(tt.nodes[v].value, page_size) : 0;
  return pages;
}

// Adds the kept nodes of task tt at iteration iter to tree (its root a root of
// the tree) and a query per generating node.
void add_tot_nodes(const TotTask& tt, const TotAt& at, int iter, PageAllocator& alloc, Tree& tree,
                   std::vector<int32_t>& queries) {
  std::vector<int32_t> out(tt.nodes.size(), -1);
  for (int32_t v : tt.order) {
    if (!at.keep[v]) continue;
    const TotNode& t = tt.nodes[v];
    const bool root = v == tt.root;
    const int32_t len = root ? t.value : int32_t(std::min<int64_t>(t.value, int64_t(iter) - t.start + 1));
    out[v] = alloc.add_node(tree, root ? -1 : out[tt.parent[v]], len);
    if (at.generating[v]) queries.push_back(out[v]);
  }
}

// task = kTotAllTasks: the forest of every task that has a generating node at iter.
Workload tot_replay(const std::vector<TotTask>* tasks, const std::string& path, int task, int iter,
                    const WorkloadParams& p) {
  const bool all = task == kTotAllTasks;
  const std::string name =
      "tot:" + path + ":task=" + (all ? std::string("all") : std::to_string(task)) + ":iter=" + std::to_string(iter);
  if (!all && (task < 0 || size_t(task) >= tasks->size()))
    throw Error("tot: task = " + std::to_string(task) + " is out of range [0, " + std::to_string(tasks->size()) +
                ") in " + path);
  const size_t first = all ? 0 : size_t(task), last = all ? tasks->size() : size_t(task) + 1;
  std::vector<TotAt> at(last - first);
  __int128 nodes = 0, pages = 0;
  int32_t last_iter = 0;
  for (size_t k = first; k < last; ++k) {
    const TotTask& tt = (*tasks)[k];
    if (!tt.error.empty()) throw Error(tt.error);
    at[k - first] = tot_at(tt, iter);
    last_iter = std::max(last_iter, at[k - first].last_iter);
    nodes += tt.nodes.size();
    pages += tot_pages(tt, at[k - first], p.page_size);
  }
  const auto kept = [&](size_t k) { return at[k - first].keep[(*tasks)[k].root] != 0; };
  bool any = false;
  for (size_t k = first; k < last; ++k) any |= kept(k);
  if (!any)
    throw Error("tot: " + (all ? std::string("no task has a") : "task " + std::to_string(task) + " has no") +
                " generating node at iter " + std::to_string(iter) + " (last iteration " +
                std::to_string(last_iter) + ")");
  detail::check_budget(nodes, pages, name);
  PageAllocator alloc(p.page_size, detail::mix_seed(p.seed, 0x7071));
  Tree tree;
  std::vector<int32_t> queries;
  for (size_t k = first; k < last; ++k)
    if (kept(k)) add_tot_nodes((*tasks)[k], at[k - first], iter, alloc, tree, queries);
  return detail::finish_workload(name, std::move(tree), std::move(queries), alloc, p);
}
}  // namespace

// The sequence node holds prefix + Accept_length[0..step) tokens; its last
// token is the token tree's root (the base model's token, counted in
// Token_Tree_size and verified with the drafts), so it holds one query too.
// Each path of Tree_Structure is a one-token node under the node of the path
// without its last element (the sequence node for one-element paths), with one
// query. Queries: 1 + len(Tree_Structure) = Token_Tree_size.
Workload medusa_workload(const std::string& path, int record, int step, int prefix, const WorkloadParams& p) {
  detail::check_page_size(p.page_size);
  return detail::medusa_workload_from_text(detail::read_text_file(path, "medusa"), path, record, step, prefix, p);
}

Workload detail::medusa_workload_from_text(std::string_view text, const std::string& path, int record, int step,
                                           int prefix, const WorkloadParams& p) {
  const std::string name = "medusa:" + path + ":record=" + std::to_string(record) + ":step=" +
                           std::to_string(step) + ":prefix=" + std::to_string(prefix);
  detail::check_page_size(p.page_size);
  if (prefix <= 0) throw Error("medusa: prefix = " + std::to_string(prefix) + " must be positive");
  if (step < 0) throw Error("medusa: step = " + std::to_string(step) + " must be >= 0");
  const json top = detail::parse_json(text, "medusa: " + path);
  const std::string where = "medusa: " + path + ": ";
  detail::require_object(top, where + "top level");
  const json& ts = detail::require(top, "Tree_Structure", "");
  detail::require_array(ts, where + "Tree_Structure");
  // Token_Tree_size counts the root token too (the APPS files: 32 with 31 paths).
  if (const auto size = top.find("Token_Tree_size"); size != top.end()) {
    const int64_t n = get_int(*size, where + "Token_Tree_size", 0, std::numeric_limits<int64_t>::max());
    if (uint64_t(n) != ts.size() + 1)
      throw Error(where + "Token_Tree_size = " + std::to_string(n) + " disagrees with Tree_Structure's " +
                  std::to_string(ts.size()) + " paths (the size is 1 + the paths: the root token counts)");
  }
  const json& recs = detail::require(top, "Records", "");
  detail::require_array(recs, where + "Records");
  if (record < 0 || size_t(record) >= recs.size())
    throw Error("medusa: record = " + std::to_string(record) + " is out of range [0, " +
                std::to_string(recs.size()) + ") in " + path);
  const std::string rf = where + "Records[" + std::to_string(record) + "]";
  detail::require_object(recs[record], rf);
  const json& acc = detail::require(recs[record], "Accept_length", rf);
  detail::require_array(acc, rf + ".Accept_length");
  if (size_t(step) >= acc.size())
    throw Error("medusa: step = " + std::to_string(step) + " is out of range [0, " + std::to_string(acc.size()) +
                ") for record " + std::to_string(record) + " in " + path);
  int64_t seq = prefix;
  for (int i = 0; i < step; ++i)
    seq += get_int(acc[i], rf + ".Accept_length[" + std::to_string(i) + "]", 0);
  if (seq > std::numeric_limits<int32_t>::max())
    throw Error("medusa: prefix = " + std::to_string(prefix) + " plus " + std::to_string(seq - prefix) +
                " accepted tokens overflow a node's 32-bit token count");

  // Paths, shortest first so that a path's parent exists before it.
  std::vector<std::vector<int64_t>> paths(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string f = where + "Tree_Structure[" + std::to_string(i) + "]";
    detail::require_array(ts[i], f);
    if (ts[i].empty()) throw Error(f + ": empty path");
    for (size_t k = 0; k < ts[i].size(); ++k)
      paths[i].push_back(get_int(ts[i][k], f + "[" + std::to_string(k) + "]", 0));
  }
  detail::check_budget(__int128(paths.size()) + 1, detail::pages_for(seq, p.page_size) + paths.size(), name);
  std::vector<size_t> order(paths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return paths[a].size() < paths[b].size(); });

  PageAllocator alloc(p.page_size, detail::mix_seed(p.seed, 0x3ed05a));
  Tree tree;
  const int32_t root = alloc.add_node(tree, -1, int32_t(seq));
  std::vector<int32_t> queries{root};
  std::map<std::vector<int64_t>, std::pair<int32_t, size_t>> node_of;  // path -> (node, index in file)
  for (size_t i : order) {
    const std::string f = where + "Tree_Structure[" + std::to_string(i) + "] = " + detail::brief(ts[i]);
    int32_t par = root;
    if (paths[i].size() > 1) {
      auto it = node_of.find(std::vector<int64_t>(paths[i].begin(), paths[i].end() - 1));
      if (it == node_of.end()) throw Error(f + ": its parent path is not in the tree");
      par = it->second.first;
    }
    const int32_t v = alloc.add_node(tree, par, 1);
    if (auto [it, fresh] = node_of.emplace(paths[i], std::make_pair(v, i)); !fresh)
      throw Error(f + " is a duplicate of Tree_Structure[" + std::to_string(it->second.second) + "]");
    queries.push_back(v);
  }
  return detail::finish_workload(name, std::move(tree), std::move(queries), alloc, p);
}

}  // namespace treeattn
