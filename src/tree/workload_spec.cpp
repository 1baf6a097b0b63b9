// Workload spec strings ("fasttree:N=1,4,16:C=128,32,32", "tot:FILE:task=3:iter=200",
// ...): parsing, dispatch to the builders, and the list of families for
// `treeattn workloads`. The built workload's name is the canonical spec.
#include <charconv>
#include <limits>
#include <string>
#include <vector>

#include "tree/builder_util.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {

namespace {

struct Field {
  std::string key, value;
  bool used = false;
};

// A parsed spec: family, FILE (file families only) and key=value fields.
struct Spec {
  std::string text, family, file;
  std::vector<Field> fields;

  [[noreturn]] void fail(const std::string& msg) const { throw Error(family + ": " + msg + " in '" + text + "'"); }

  const Field* find(std::string_view key) {
    for (Field& f : fields)
      if (f.key == key) return f.used = true, &f;
    return nullptr;
  }
  const Field& need(std::string_view key) {
    if (const Field* f = find(key)) return *f;
    fail("missing key '" + std::string(key) + "'");
  }
  int64_t number(const std::string& key, std::string_view s, int64_t lo, int64_t hi) const {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec == std::errc::invalid_argument || ptr != s.data() + s.size())
      fail(key + " = '" + std::string(s) + "' is not an integer");
    if (ec == std::errc::result_out_of_range || v < lo || v > hi)
      fail(key + " = " + std::string(s) + (lo == 1 && ec != std::errc::result_out_of_range && v < lo ? " must be positive"
                                                             : " is out of range [" + std::to_string(lo) + ", " +
                                                                   std::to_string(hi) + "]"));
    return v;
  }
  int integer(std::string_view key, int64_t lo = 1) {
    return int(number(std::string(key), need(key).value, lo, std::numeric_limits<int32_t>::max()));
  }
  std::vector<int> list(std::string_view key) {
    const std::string& s = need(key).value;
    std::vector<int> out;
    size_t pos = 0;
    while (true) {
      const size_t comma = s.find(',', pos);
      const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      out.push_back(int(number(std::string(key) + "[" + std::to_string(out.size()) + "]", item, 1,
                               std::numeric_limits<int32_t>::max())));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    return out;
  }
  void check_all_used() const {
    for (const Field& f : fields)
      if (!f.used) fail("unknown key '" + f.key + "'");
  }
};

bool is_key(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t k = s.find(sep, pos);
    out.emplace_back(s.substr(pos, k == std::string_view::npos ? std::string_view::npos : k - pos));
    if (k == std::string_view::npos) return out;
    pos = k + 1;
  }
}

// FILE may itself contain ':' (only the trailing key=value fields are keys);
// for json and blocktable everything after the family is FILE.
Spec parse_spec(std::string_view text, bool has_file, bool file_only) {
  Spec sp;
  sp.text = std::string(text);
  const size_t colon = text.find(':');
  sp.family = std::string(text.substr(0, colon));
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  std::vector<std::string> parts = rest.empty() ? std::vector<std::string>{} : split(rest, ':');
  size_t nfile = has_file ? parts.size() : 0;
  if (has_file && !file_only) {
    while (nfile > 0) {
      const std::string& f = parts[nfile - 1];
      const size_t eq = f.find('=');
      if (eq == std::string::npos || !is_key(std::string_view(f).substr(0, eq))) break;
      --nfile;
    }
  }
  for (size_t i = 0; i < nfile; ++i) sp.file += (i ? ":" : "") + parts[i];
  if (has_file && sp.file.empty()) sp.fail("missing FILE");
  for (size_t i = nfile; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos || !is_key(std::string_view(parts[i]).substr(0, eq)))
      sp.fail("'" + parts[i] + "' is not of the form key=value");
    Field f{parts[i].substr(0, eq), parts[i].substr(eq + 1)};
    for (const Field& g : sp.fields)
      if (g.key == f.key) sp.fail("key '" + f.key + "' is given twice");
    sp.fields.push_back(std::move(f));
  }
  return sp;
}

}  // namespace

const std::vector<WorkloadFamily>& workload_families() {
  static const std::vector<WorkloadFamily> families = {
      {"fasttree", "fasttree:N=1,4,16:C=128,32,32",
       "FastTree levels: level i has N[i] nodes of C[i] tokens, spread evenly under level i-1 "
       "(N[i] a multiple of N[i-1]); one query per leaf"},
      {"pat", "pat:B=1,4,16:L=128,256,1024",
       "PAT levels: B[i] nodes of L[i] tokens; the last level is one leaf (its own KV) per query; "
       "B[0] > 1 gives several roots, pat:B=256:L=1024 has no sharing"},
      {"fewshot", "fewshot:prompt=4000:branches=32:len=256",
       "one shared prompt with `branches` children of `len` tokens, one query per child"},
      {"random", "random:seed=7[:nodes=24][:tokens=300]",
       "seeded random forest of 1..nodes nodes of 0..tokens tokens each (chains, fans, 1-token and empty "
       "nodes, queries on leaves and some internal nodes)"},
      {"json", "json:FILE", "a tree with its queries in the treeattn.tree/1 JSON format (docs/formats.md)"},
      {"blocktable", "blocktable:FILE",
       "vLLM-style block tables + seq_lens (JSON, docs/formats.md); equal leading pages become shared prefixes"},
      {"tot", "tot:FILE:task=3:iter=200",
       "tree-of-thoughts replay (data/workloads/*ToT.json) of task k at decode iteration t: one query per "
       "node still generating; task=all: the forest of every task at t, as the engine batches them"},
      {"kary", "kary:arity=2:depth=5:total=65536[:leftmost=1]",
       "FlashForge's shapes: complete arity-ary tree of depth levels below the root at a fixed total of "
       "tokens (a query per leaf); leftmost=1: only the leftmost node of a level has children"},
      {"medusa", "medusa:FILE:record=0:step=10:prefix=4096",
       "Medusa token tree (data/workloads/APPS_tree_size*.json) on a sequence of prefix + accepted tokens; "
       "a query on the sequence's last token and on every draft token"},
  };
  return families;
}

Workload make_workload(std::string_view spec, const WorkloadParams& p) {
  const std::string family(spec.substr(0, spec.find(':')));
  Workload w;
  if (family == "fasttree" || family == "pat" || family == "fewshot" || family == "random" || family == "kary") {
    Spec sp = parse_spec(spec, false, false);
    if (family == "fasttree") {
      auto N = sp.list("N"), C = sp.list("C");
      sp.check_all_used();
      w = fasttree_workload(N, C, p);
    } else if (family == "pat") {
      auto B = sp.list("B"), L = sp.list("L");
      sp.check_all_used();
      w = pat_workload(B, L, p);
    } else if (family == "fewshot") {
      const int prompt = sp.integer("prompt"), branches = sp.integer("branches"), len = sp.integer("len");
      sp.check_all_used();
      w = fewshot_workload(prompt, branches, len, p);
    } else if (family == "kary") {
      const int arity = sp.integer("arity"), depth = sp.integer("depth", 0), total = sp.integer("total");
      const bool leftmost = sp.find("leftmost") && sp.number("leftmost", sp.need("leftmost").value, 0, 1) == 1;
      sp.check_all_used();
      w = kary_workload(arity, depth, total, leftmost, p);
    } else {
      RandomTreeOptions o;
      const auto seed = uint64_t(sp.number("seed", sp.need("seed").value, 0, std::numeric_limits<int64_t>::max()));
      if (sp.find("nodes")) o.max_nodes = sp.integer("nodes");
      if (sp.find("tokens")) o.max_tokens = sp.integer("tokens");
      sp.check_all_used();
      w = random_workload(seed, p, o);
    }
    // The builders name their result canonically (no optional parts omitted).
    return w;
  }
  if (family == "json" || family == "blocktable") {
    Spec sp = parse_spec(spec, true, true);
    w = family == "json" ? read_workload_file(sp.file, p) : read_block_tables_file(sp.file, p);
    w.name = family + ":" + sp.file;
    return w;
  }
  if (family == "tot") {
    Spec sp = parse_spec(spec, true, false);
    const Field* task_field = sp.find("task");
    const bool all = task_field && task_field->value == "all";
    const int task = all ? kTotAllTasks : sp.integer("task", 0), iter = sp.integer("iter", 0);
    sp.check_all_used();
    return tot_workload(sp.file, task, iter, p);
  }
  if (family == "medusa") {
    Spec sp = parse_spec(spec, true, false);
    const int record = sp.integer("record", 0), step = sp.integer("step", 0), prefix = sp.integer("prefix");
    sp.check_all_used();
    return medusa_workload(sp.file, record, step, prefix, p);
  }
  std::string known;
  for (const WorkloadFamily& f : workload_families()) known += (known.empty() ? "" : ", ") + f.prefix;
  throw Error("workload: unknown family '" + family + "' in '" + std::string(spec) + "' (known: " + known + ")");
}

}  // namespace treeattn
