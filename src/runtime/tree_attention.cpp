// TreeAttention (runtime.hpp): an engine's step inputs -> a validated
// Workload and Plan -> the CPU executor or a CudaStepExecutor.
#include <algorithm>
#include <string>
#include <vector>

#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"
#if defined(TREEATTN_HAVE_CUDA)
#include "treeattn/cuda_executor.hpp"
#endif

namespace treeattn {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("tree attention: " + what); }

void check_capacity(const char* name, int64_t value, int64_t cap) {
  if (value > cap)
    fail(std::string(name) + " = " + std::to_string(value) + " exceeds the capacity " + std::to_string(cap) +
         " given at construction");
}

}  // namespace

struct TreeAttention::Impl {
  TreeAttentionConfig cfg;
  const PlannerInfo* planner = nullptr;
  // Memory reused step to step (no allocation once grown to the largest step):
  Workload w;        // the last plan's tree (its nodes' page vectors keep their capacity)
  Plan plan;
  Workload scratch;  // the tree being planned; swapped with w once its plan is accepted
  Plan next_plan;    // the plan being made; swapped with plan once accepted
  std::vector<Node> spare_nodes;     // nodes a smaller tree left over, page vectors and all
  ValidateScratch validate_scratch;  // also holds the index of the tree validated last
  PlanScratch plan_scratch;
  ValidatePlanScratch validate_plan_scratch;
  bool planned = false;
#if defined(TREEATTN_HAVE_CUDA)
  std::unique_ptr<CudaStepExecutor> cuda;
#endif

  // Plans `scratch`, hands the plan to the executor, then makes it current.
  void commit(void* stream) {
    scratch.validate(&validate_scratch);
    Plan& p = next_plan;
    plan_reusing(*planner, scratch, validate_scratch.index, cfg.plan_options, plan_scratch, p);
#if defined(TREEATTN_HAVE_CUDA)
    if (cuda)
      cuda->set_plan(scratch, p, static_cast<cudaStream_t>(stream));  // validates the plan before it packs it
    else
      validate_plan(scratch, p, &validate_plan_scratch);
#else
    (void)stream;
    validate_plan(scratch, p, &validate_plan_scratch);
#endif
    std::swap(w, scratch);
    std::swap(plan, next_plan);
    planned = true;
  }

  // Sets scratch's node count to n; nodes beyond it wait in spare_nodes, so
  // that trees of varying size reuse the same page vectors.
  void resize_nodes(size_t n) {
    std::vector<Node>& nodes = scratch.tree.nodes;
    for (; nodes.size() > n; nodes.pop_back()) spare_nodes.push_back(std::move(nodes.back()));
    for (; nodes.size() < n && !spare_nodes.empty(); spare_nodes.pop_back())
      nodes.push_back(std::move(spare_nodes.back()));
    nodes.resize(n);
  }

  // scratch <- the tree of `t` (sizes checked against each other and the capacities).
  void load_tree(const TreeArrays& t, size_t extra_nodes, size_t extra_queries) {
    const size_t n = t.parents.size();
    if (n == 0) fail("parents: the tree has no nodes");
    if (t.num_tokens.size() != n)
      fail("num_tokens has " + std::to_string(t.num_tokens.size()) + " entries, parents " + std::to_string(n));
    if (t.page_offsets.size() != n + 1)
      fail("page_offsets has " + std::to_string(t.page_offsets.size()) + " entries, expected nodes + 1 = " +
           std::to_string(n + 1));
    if (!t.first_slots.empty() && t.first_slots.size() != n)
      fail("first_slots has " + std::to_string(t.first_slots.size()) + " entries, parents " + std::to_string(n));
    check_capacity("nodes", int64_t(n + extra_nodes), cfg.max_nodes);
    check_capacity("queries", int64_t(t.query_nodes.size() + extra_queries), cfg.max_queries);
    check_capacity("page refs", int64_t(t.page_ids.size() + extra_nodes), cfg.max_page_refs);
    if (t.page_offsets[0] != 0 || size_t(t.page_offsets[n]) != t.page_ids.size())
      fail("page_offsets must run from 0 to len(page_ids) = " + std::to_string(t.page_ids.size()) + ", got " +
           std::to_string(t.page_offsets[0]) + " .. " + std::to_string(t.page_offsets[n]));
    resize_nodes(n);
    for (size_t v = 0; v < n; ++v) {
      const int32_t b = t.page_offsets[v], e = t.page_offsets[v + 1];
      if (e < b) fail("page_offsets decreases at node " + std::to_string(v) + " (" + std::to_string(b) + " > " +
                      std::to_string(e) + ")");
      Node& node = scratch.tree.nodes[v];
      node.parent = t.parents[v];
      node.num_tokens = t.num_tokens[v];
      node.first_slot = t.first_slots.empty() ? 0 : t.first_slots[v];
      node.pages.assign(t.page_ids.begin() + b, t.page_ids.begin() + e);
    }
    scratch.query_nodes.assign(t.query_nodes.begin(), t.query_nodes.end());
  }
};

TreeAttention::TreeAttention(const TreeAttentionConfig& config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = config;
  TreeAttentionConfig& c = m.cfg;
  c.heads.validate();
  if (c.dtype != DType::fp16 && c.dtype != DType::bf16)
    fail("dtype " + std::string(to_string(c.dtype)) + " is not supported (fp16, bf16)");
  if (c.page_size <= 0 || c.page_size > 65536)
    fail("page_size " + std::to_string(c.page_size) + " is out of range [1, 65536]");
  if (c.num_pages <= 0) fail("num_pages " + std::to_string(c.num_pages) + " must be positive");
  auto range = [](const char* name, int64_t v, int64_t hi) {
    if (v <= 0 || v > hi)
      fail(std::string(name) + " = " + std::to_string(v) + " is out of range [1, " + std::to_string(hi) + "]");
  };
  range("max_queries", c.max_queries, 1 << 20);
  range("max_nodes", c.max_nodes, 1 << 24);
  range("max_page_refs", c.max_page_refs, int64_t(1) << 30);
  m.planner = &find_planner(c.planner);
  if (c.plan_options.num_sms <= 0) c.plan_options.num_sms = 132;

  // Plan capacities a planner stays within for trees inside the capacities
  // above: a unit per (node piece, Q tile) and KV splits to fill the GPU.
  const int64_t ctas = int64_t(c.plan_options.num_sms) * std::max(1, c.plan_options.ctas_per_sm) * 4;
  auto derive = [](int32_t given, int64_t want) { return given > 0 ? given : int32_t(std::min<int64_t>(want, 1 << 24)); };
  c.max_units = derive(c.max_units, 2 * int64_t(c.max_nodes) + 4 * int64_t(c.max_queries) + ctas);
  c.max_segments = derive(c.max_segments, 2 * int64_t(c.max_units) + 2 * int64_t(c.max_nodes));
  c.max_entries = derive(c.max_entries, 2 * int64_t(c.max_units) + 8 * int64_t(c.max_queries));
  c.max_slots = derive(c.max_slots, c.max_entries);
  range("max_units", c.max_units, 1 << 24);
  range("max_segments", c.max_segments, 1 << 26);
  range("max_entries", c.max_entries, 1 << 26);
  range("max_slots", c.max_slots, 1 << 26);

  for (Workload* w : {&m.w, &m.scratch}) {
    w->name = "step";
    w->heads = c.heads;
    w->layout = {c.page_size, c.num_pages, c.dtype};
  }
  if (c.device == Device::cuda) {
#if defined(TREEATTN_HAVE_CUDA)
    StepCapacity cap;
    cap.max_queries = c.max_queries;
    cap.max_units = c.max_units;
    cap.max_segments = c.max_segments;
    cap.max_entries = c.max_entries;
    cap.max_slots = c.max_slots;
    cap.max_page_refs = c.max_page_refs;
    m.cuda = std::make_unique<CudaStepExecutor>(c.heads, c.dtype, c.page_size, c.num_pages, cap);
#else
    fail("device cuda: this build of treeattn has no CUDA executor (built without nvcc)");
#endif
  }
}

TreeAttention::~TreeAttention() = default;
TreeAttention::TreeAttention(TreeAttention&&) noexcept = default;
TreeAttention& TreeAttention::operator=(TreeAttention&&) noexcept = default;

void TreeAttention::plan_tree(const TreeArrays& tree, void* stream) {
  impl_->load_tree(tree, 0, 0);
  impl_->commit(stream);
}

void TreeAttention::plan_block_tables(std::span<const int32_t> block_tables, int32_t batch, int32_t width,
                                      std::span<const int32_t> seq_lens, void* stream) {
  Impl& m = *impl_;
  if (batch <= 0 || width <= 0) fail("block_tables shape [" + std::to_string(batch) + ", " + std::to_string(width) +
                                     "] must be positive");
  if (block_tables.size() != size_t(batch) * size_t(width))
    fail("block_tables has " + std::to_string(block_tables.size()) + " entries, expected " + std::to_string(batch) +
         " x " + std::to_string(width));
  if (seq_lens.size() != size_t(batch))
    fail("seq_lens has " + std::to_string(seq_lens.size()) + " entries, block_tables " + std::to_string(batch) + " rows");
  check_capacity("queries", batch, m.cfg.max_queries);
  std::vector<std::vector<int32_t>> tables(batch);
  for (int32_t b = 0; b < batch; ++b) {
    const int64_t need = (int64_t(std::max(seq_lens[b], 0)) + m.cfg.page_size - 1) / m.cfg.page_size;
    if (need > width)
      fail("seq_lens[" + std::to_string(b) + "] = " + std::to_string(seq_lens[b]) + " needs " + std::to_string(need) +
           " pages, block_tables has " + std::to_string(width) + " columns");
    tables[b].assign(block_tables.begin() + int64_t(b) * width, block_tables.begin() + int64_t(b) * width + need);
  }
  WorkloadParams wp;
  wp.heads = m.cfg.heads;
  wp.page_size = m.cfg.page_size;
  wp.dtype = m.cfg.dtype;
  Workload w = from_block_tables(tables, std::vector<int32_t>(seq_lens.begin(), seq_lens.end()), m.cfg.num_pages, wp);
  check_capacity("nodes", int64_t(w.tree.nodes.size()), m.cfg.max_nodes);
  int64_t refs = 0;
  for (const Node& n : w.tree.nodes) refs += int64_t(n.pages.size());
  check_capacity("page refs", refs, m.cfg.max_page_refs);
  w.name = "step";
  m.scratch = std::move(w);
  m.commit(stream);
}

void TreeAttention::plan_tree_queries(const TreeArrays& tree, const DraftArrays& d, void* stream) {
  Impl& m = *impl_;
  const size_t k = d.draft_nodes.size();
  if (d.draft_parents.size() != k || d.draft_rows.size() != k)
    fail("draft_nodes, draft_parents and draft_rows differ in length (" + std::to_string(k) + ", " +
         std::to_string(d.draft_parents.size()) + ", " + std::to_string(d.draft_rows.size()) + ")");
  m.load_tree(tree, k, k);
  const int32_t n = int32_t(tree.parents.size()), ps = m.cfg.page_size;
  m.resize_nodes(size_t(n) + k);
  for (size_t i = 0; i < k; ++i) {
    const std::string at = "draft " + std::to_string(i) + ": ";
    const int32_t par = d.draft_parents[i];
    if (par >= int32_t(i) || par < -1)
      fail(at + "draft_parents = " + std::to_string(par) + " must be -1 or an earlier draft (< " + std::to_string(i) +
           "): drafts are listed parents first, which also rules out cycles");
    const int32_t node = d.draft_nodes[i];
    if (par < 0 && (node < 0 || node >= n))
      fail(at + "draft_nodes = " + std::to_string(node) + " is out of range [0, " + std::to_string(n) + ")");
    const int64_t row = d.draft_rows[i];
    if (row < 0 || row >= m.cfg.num_pages * ps)
      fail(at + "draft_rows = " + std::to_string(row) + " is out of range [0, num_pages x page_size = " +
           std::to_string(m.cfg.num_pages * ps) + ")");
    Node& dn = m.scratch.tree.nodes[size_t(n) + i];
    dn.parent = par >= 0 ? n + par : node;
    dn.num_tokens = 1;
    dn.first_slot = int32_t(row % ps);
    dn.pages.assign(1, int32_t(row / ps));
    m.scratch.query_nodes.push_back(n + int32_t(i));
  }
  m.commit(stream);
}

void TreeAttention::run(const AttentionArgs& args, void* stream) const {
  const Impl& m = *impl_;
  if (!m.planned) fail("run() before any plan_*() call");
#if defined(TREEATTN_HAVE_CUDA)
  if (m.cuda) return m.cuda->run(args, static_cast<cudaStream_t>(stream));
#endif
  (void)stream;
  if (!args.q || !args.k || !args.v || !args.out) fail("run(): null tensor pointer");
  run_cpu(m.w, m.plan, args, m.cfg.cpu_threads);
}

const TreeAttentionConfig& TreeAttention::config() const { return impl_->cfg; }
int32_t TreeAttention::num_queries() const { return impl_->planned ? impl_->w.num_queries() : 0; }
const Workload& TreeAttention::workload() const { return impl_->w; }
const Plan& TreeAttention::plan() const { return impl_->plan; }
PlanSummary TreeAttention::summary() const {
  if (!impl_->planned) fail("summary() before any plan_*() call");
  return summarize(impl_->w, impl_->plan);
}
std::string TreeAttention::describe() const {
#if defined(TREEATTN_HAVE_CUDA)
  if (impl_->cuda) return impl_->cuda->describe();
#endif
  return "cpu executor";
}

}  // namespace treeattn
