// TreeAttention (runtime.hpp): an engine's step inputs -> a validated
// Workload and Plan -> the CPU executor or a CudaStepExecutor.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "treeattn/runtime.hpp"
#include "treeattn/workloads.hpp"
#if defined(TREEATTN_HAVE_CUDA)
#include "treeattn/cuda_executor.hpp"
#endif

namespace treeattn {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("tree attention: " + what); }

#if defined(TREEATTN_HAVE_CUDA)
// Makes `device` current for a scope, then the caller's again (no driver
// call when it already is). Throws Error if the device cannot be made
// current, unless `nothrow` (for destructors: then it stays as it was).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool nothrow = false) {
    int current = 0;
    cudaError_t st = cudaGetDevice(&current);
    if (st == cudaSuccess && current != device) {
      st = cudaSetDevice(device);
      if (st == cudaSuccess) previous_ = current;
    }
    if (!nothrow) check_cuda(st, "tree attention: making the TreeAttention's device current");
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};
#endif

void check_capacity(const char* name, int64_t value, int64_t cap) {
  if (value > cap)
    fail(std::string(name) + " = " + std::to_string(value) + " exceeds the capacity " + std::to_string(cap) +
         " given at construction");
}

}  // namespace

struct TreeAttention::Impl {
  // Held by every public member function but config(), workload() and plan()
  // (TreeAttention's comment): the state below is one thread's at a time.
  mutable std::mutex mutex;
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
  PlanStats stats;
  BlockTableTree block_table_tree;  // plan_block_tables' tree, rebuilt in place each step
#if defined(TREEATTN_HAVE_CUDA)
  std::unique_ptr<CudaStepExecutor> cuda;
  ~Impl() {  // frees the executor's buffers on their device; never throws
    if (!cuda) return;
    DeviceGuard on(cfg.device_index, /*nothrow=*/true);
    cuda.reset();
  }
#endif

  // w's pages, a bit each, valid while `bits_valid` (then no two nodes of w
  // share a page): a fresh plan checks only the nodes that differ from w's
  // against them (check_pages_against_last), and plan extension
  // (TreeAttentionConfig::max_extension_tokens) the pages it appends. Per
  // unit of `plan`, the tokens added since the planner made it
  // (unit_growth). Per node of w, the segments of `plan` that end at its
  // end (tail segments, those an extension lengthens), made by the first
  // extension after a fresh plan (valid while `tails_valid`). Scratch for one
  // extension attempt.
  bool bits_valid = false;
  std::vector<uint64_t> page_bits;
  std::vector<int64_t> unit_growth;  // 64-bit: a unit's tails may together grow by more than 2^31 tokens
  struct SegmentEnd {
    int32_t unit, segment, end;  // a segment an attempt lengthened, and its end before
  };
  std::vector<SegmentEnd> lengthened;
  struct Growth {
    int32_t node, from, to;  // a node an attempt grows, from and to token counts
  };
  std::vector<Growth> grown;
  struct TailSegment {
    int32_t unit, segment;
  };
  bool tails_valid = false;
  std::vector<int32_t> tail_offset;  // node v's tail segments: tails[tail_offset[v] .. tail_offset[v + 1])
  std::vector<TailSegment> tails;
  std::vector<int32_t> new_pages; // pages set by an extension attempt or a page check against w's bits
  struct PageChange {
    int32_t node, from;  // a node of both trees whose page ids differ from position `from` on
  };
  std::vector<PageChange> changed;
  // The page tables of w and of scratch, flat as the caller's arrays give
  // them (node v's ids at ids[offsets[v] .. offsets[v + 1])): the CUDA
  // executor's pack copies them in one piece, and plan extension compares a
  // step's page ids with w's in runs of nodes rather than node by node.
  struct PageTable {
    std::vector<int32_t> ids, offsets;
  };
  PageTable table, scratch_table;

  // Plans `scratch`, hands the plan to the executor, then makes it current.
  // Its pages are checked against w's bits where they are valid, else by the
  // validation, which then keeps scratch's page bits
  // (ValidateScratch::keep_page_bits): they become w's (take_page_bits).
  void commit(void* stream) {
    const bool had_bits = bits_valid;
    bits_valid = false;  // the index below is the new tree's from here on
    const bool pages_checked = had_bits && check_pages_against_last();
    validate_scratch.pages_checked = pages_checked;
    validate_scratch.keep_page_bits = !pages_checked && page_bits_enabled();
    try {
      scratch.validate(&validate_scratch);
      plan_reusing(*planner, scratch, validate_scratch.index, cfg.plan_options, plan_scratch, next_plan);
      hand_to_executor(scratch, next_plan, stream, /*extension=*/false, scratch_table.ids, scratch_table.offsets);
    } catch (...) {
      if (validate_scratch.page_bits_kept) {  // the validator's bits must be clear for its next call
        clear_page_bits(validate_scratch.page_used, scratch.tree);
        clear_page_bits(validate_scratch.page_partial, scratch.tree);
        validate_scratch.page_bits_kept = false;
      }
      if (pages_checked) undo_page_check();
      if (had_bits) {  // w stays in force, with its bits: its index again
        validate_scratch.index.rebuild(w.tree, w.query_nodes);
        bits_valid = true;
      }
      throw;
    }
    std::swap(w, scratch);
    std::swap(table, scratch_table);
    std::swap(plan, next_plan);
    planned = true;
    ++stats.planned;
    stats.pages_rechecked += pages_checked;
    if (pages_checked)
      bits_valid = true;
    else
      take_page_bits();
    unit_growth.assign(size_t(plan.num_units()), 0);
    tails_valid = false;
  }

  bool page_bits_enabled() const { return cfg.num_pages <= (int64_t(1) << 30); }
  bool extendable() const { return bits_valid && cfg.max_extension_tokens > 0; }

  // Sets page pg's bit and records it in new_pages; false (nothing set)
  // where pg is out of the pool or its bit is set already.
  bool claim_page(int32_t pg) {
    if (pg < 0 || pg >= cfg.num_pages) return false;
    uint64_t& word = page_bits[size_t(pg) / 64];
    const uint64_t bit = uint64_t(1) << (pg % 64);
    if (word & bit) return false;
    word |= bit;
    new_pages.push_back(pg);
    return true;
  }
  // Clears the bits claim_page set.
  void release_new_pages() {
    for (const int32_t pg : new_pages) page_bits[size_t(pg) / 64] &= ~(uint64_t(1) << (pg % 64));
    new_pages.clear();
  }

  // Workload::validate's page check (each page in range, each slot used by
  // one node) against w's bits (bits_valid). Only page ids set bits: of each
  // node of both trees, the pages from the first where they differ on (none
  // for most nodes, the appended ones for a grown node) are cleared (w's)
  // and checked and set (scratch's). True when every page passed: page_bits
  // are then scratch's (no page shared), until undo_page_check. False,
  // page_bits unchanged, where a page is out of range or already used: the
  // full check then decides (two nodes may share a page in part) and names
  // the error.
  bool check_pages_against_last() {
    const std::vector<Node>& now = scratch.tree.nodes;
    const std::vector<int32_t>&old_at = table.offsets, &now_at = scratch_table.offsets;
    if (old_at.size() != w.tree.nodes.size() + 1 || now_at.size() != now.size() + 1) return false;  // not theirs
    const int32_t *const old_ids = table.ids.data(), *const now_ids = scratch_table.ids.data();
    changed.clear();
    new_pages.clear();
    // The nodes of both trees whose pages differ, from where: compared in
    // runs of nodes with as many pages in both (their pages then lie at
    // offsets moved by the same amount), one memcmp a run, node by node only
    // in a run that differs and at a node whose page count changed.
    const auto compare_node = [&](size_t v) {
      const int32_t *a = old_ids + old_at[v], *b = now_ids + now_at[v];
      const int32_t na = old_at[v + 1] - old_at[v], nb = now_at[v + 1] - now_at[v], both = std::min(na, nb);
      int32_t from = 0;
      while (from < both && a[from] == b[from]) ++from;
      if (from < na || from < nb) changed.push_back({int32_t(v), from});
    };
    size_t run = 0;  // the open run's first node
    const auto close_run = [&](size_t end) {  // nodes [run, end)
      const size_t len = size_t(old_at[end] - old_at[run]);
      if (len != 0 && std::memcmp(old_ids + old_at[run], now_ids + now_at[run], sizeof(int32_t) * len) != 0)
        for (size_t v = run; v < end; ++v) compare_node(v);
    };
    const size_t common = std::min(w.tree.nodes.size(), now.size());
    for (size_t v = 0; v < common; ++v)
      if (old_at[v + 1] - old_at[v] != now_at[v + 1] - now_at[v]) {
        close_run(v);
        compare_node(v);
        run = v + 1;
      }
    close_run(common);
    for_old_pages_not_kept([&](int32_t pg) { page_bits[size_t(pg) / 64] &= ~(uint64_t(1) << (pg % 64)); });
    const auto check = [&](const Node& n, size_t from) {
      for (size_t i = from; i < n.pages.size(); ++i)
        if (!claim_page(n.pages[i])) return false;
      return true;
    };
    bool ok = true;
    for (size_t i = 0; ok && i < changed.size(); ++i) ok = check(now[size_t(changed[i].node)], size_t(changed[i].from));
    for (size_t v = w.tree.nodes.size(); ok && v < now.size(); ++v) ok = check(now[v], 0);
    if (!ok) undo_page_check();
    return ok;
  }

  // page_bits back to w's after check_pages_against_last.
  void undo_page_check() {
    release_new_pages();
    for_old_pages_not_kept([&](int32_t pg) { page_bits[size_t(pg) / 64] |= uint64_t(1) << (pg % 64); });
  }

  // f(page) for each page of w's that scratch does not hold at the same
  // node and position: the changed nodes' from their first difference on,
  // and all of the nodes scratch lacks.
  template <class F>
  void for_old_pages_not_kept(F&& f) const {
    const std::vector<Node>& old = w.tree.nodes;
    for (const PageChange& c : changed) {
      const std::vector<int32_t>& pages = old[size_t(c.node)].pages;
      for (size_t i = size_t(c.from); i < pages.size(); ++i) f(pages[i]);
    }
    for (size_t v = scratch.tree.nodes.size(); v < old.size(); ++v)
      for (const int32_t pg : old[v].pages) f(pg);
  }

  // Clears the bits of t's pages: word by word where the pool has fewer
  // words than t has page references, else page by page.
  static void clear_page_bits(std::vector<uint64_t>& bits, const Tree& t) {
    int64_t refs = 0;
    for (const Node& n : t.nodes) refs += int64_t(n.pages.size());
    if (int64_t(bits.size()) <= refs) {
      std::fill(bits.begin(), bits.end(), 0);
      return;
    }
    for (const Node& n : t.nodes)
      for (const int32_t pg : n.pages) bits[size_t(pg) / 64] = 0;
  }

  // Checks p against the plan capacities and validates it for tree t (on
  // the GPU set_plan does, before it packs it) unless it is an `extension` of
  // the plan in force (try_extend), valid by construction. A fresh plan's
  // tree t is the one validated last, whose index validate_scratch holds.
  // The page table (`ids` at `offsets` per node) is the one t's node pages
  // were copied from, so set_plan checks only its shape.
  void hand_to_executor(const Workload& t, const Plan& p, void* stream, bool extension,
                        std::span<const int32_t> ids, std::span<const int32_t> offsets) {
#if defined(TREEATTN_HAVE_CUDA)
    if (cuda) {
      DeviceGuard on(cfg.device_index);
      const PageTableView pages{ids, offsets, /*source_of_workload=*/true};
      return cuda->set_plan(t, p, static_cast<cudaStream_t>(stream),
                            extension ? PlanCheck::extension : PlanCheck::validate, &pages, &validate_scratch.index);
    }
#endif
    (void)stream, (void)ids, (void)offsets;
    if (extension) return;
    // The plan capacities hold on the CPU too, so that a plan the GPU would
    // refuse is refused here (an extension keeps the counts of its plan).
    check_capacity("plan units (max_units)", p.num_units(), cfg.max_units);
    check_capacity("plan segments (max_segments)", int64_t(p.segments.size()), cfg.max_segments);
    check_capacity("plan entries (max_entries)", int64_t(p.entry_query.size()), cfg.max_entries);
    check_capacity("plan slots (max_slots)", p.num_slots, cfg.max_slots);
    validate_plan(t, p, &validate_plan_scratch, &validate_scratch.index);
  }

  // After a fresh plan checked by the validation: w's pages into page_bits,
  // valid where no page is shared by two nodes. The validation kept them
  // (commit): page_bits, cleared of the previous tree's (now in scratch),
  // is swapped with the validator's bits, whose partial-page bits are
  // cleared too, so that both are clear for its next call.
  void take_page_bits() {
    if (!validate_scratch.page_bits_kept) return;
    if (page_bits.size() != validate_scratch.page_used.size())
      page_bits.assign(validate_scratch.page_used.size(), 0);
    else
      clear_page_bits(page_bits, scratch.tree);
    std::swap(page_bits, validate_scratch.page_used);
    clear_page_bits(validate_scratch.page_partial, w.tree);
    validate_scratch.page_bits_kept = false;
    bits_valid = !validate_scratch.pages_shared;
  }

  // The extension of the last plan to tree t, if t is the last tree grown at
  // childless nodes (see max_extension_tokens) and no unit outgrows the
  // limit; false (nothing changed) otherwise, and for anything Workload::
  // validate would reject, which the fresh plan then reports. Checks first,
  // then changes w, plan and page_bits together.
  bool try_extend(const TreeArrays& t, void* stream) {
    if (!extendable()) return false;
    const size_t n = w.tree.nodes.size();
    if (table.offsets.size() != n + 1) return false;  // table is w's
    if (t.parents.size() != n || t.num_tokens.size() != n || t.page_offsets.size() != n + 1 ||
        (!t.first_slots.empty() && t.first_slots.size() != n) || t.page_offsets[0] != 0 ||
        size_t(t.page_offsets[n]) != t.page_ids.size() || int64_t(t.page_ids.size()) > cfg.max_page_refs ||
        !std::equal(t.query_nodes.begin(), t.query_nodes.end(), w.query_nodes.begin(), w.query_nodes.end()))
      return false;
    const TreeIndex& ix = validate_scratch.index;  // w's
    const int ps = cfg.page_size;
    grown.clear();
    new_pages.clear();
    const auto undo_bits = [&] {
      release_new_pages();
      return false;
    };
    // Each node's pages must start with w's: compared in runs of nodes whose
    // pages moved by the same amount (a run ends after a node that gained
    // pages), one memcmp a run. Invariant: the nodes of the run so far have
    // their old pages at ids[run_old + i] and their new at page_ids[run_new + i].
    const int32_t* old_ids = table.ids.data();
    const std::vector<int32_t>& old_at = table.offsets;
    size_t run_old = 0, run_new = 0;
    const auto run_kept = [&](size_t old_end) {  // the run, up to old_end, unchanged
      const size_t len = old_end - run_old;
      return len == 0 || std::memcmp(old_ids + run_old, t.page_ids.data() + run_new, sizeof(int32_t) * len) == 0;
    };
    for (size_t v = 0; v < n; ++v) {
      const Node& a = w.tree.nodes[v];
      const int32_t tokens = t.num_tokens[v], b = t.page_offsets[v], e = t.page_offsets[v + 1];
      const size_t had = a.pages.size();
      if (t.parents[v] != a.parent || (t.first_slots.empty() ? 0 : t.first_slots[v]) != a.first_slot || b < 0 ||
          e < b || size_t(e) > t.page_ids.size() || size_t(e - b) < had)
        return undo_bits();
      if (size_t(b) - run_new != size_t(old_at[v]) - run_old) {  // moved by another amount: a new run
        if (!run_kept(size_t(old_at[v]))) return undo_bits();
        run_old = size_t(old_at[v]);
        run_new = size_t(b);
      }
      if (tokens == a.num_tokens) {
        if (size_t(e - b) != had) return undo_bits();
        continue;
      }
      // Only a childless node with tokens (so with tail segments) may grow.
      if (tokens < a.num_tokens || a.num_tokens == 0 || ix.num_children(int32_t(v)) != 0) return undo_bits();
      const int64_t end_slot = int64_t(a.first_slot) + tokens, have = e - b;
      if (!((have - 1) * ps < end_slot && end_slot <= have * ps)) return undo_bits();
      if (ix.path_tokens[v] - a.num_tokens + tokens > kMaxPathTokens) return undo_bits();
      for (int32_t i = b + int32_t(had); i < e; ++i)  // each appended page new to the pool
        if (!claim_page(t.page_ids[size_t(i)])) return undo_bits();
      grown.push_back({int32_t(v), a.num_tokens, tokens});
    }
    if (!run_kept(table.ids.size())) return undo_bits();
    // The plan, in place: each grown node's segments that end at its old end
    // now end at its new one. The plan was valid for w, so each query on a
    // grown node's path saw exactly one of them (its visible ranges tiled the
    // node), and now sees each new token once: the extension is valid for
    // the grown tree by construction, and is not validated again (the tree
    // growth itself was checked above as Workload::validate would). Units,
    // entries, masks and slots are unchanged.
    lengthened.clear();
    const auto undo_plan = [&] {
      for (const SegmentEnd& x : lengthened) {
        Segment& sg = plan.segments[size_t(x.segment)];
        unit_growth[size_t(x.unit)] -= sg.end - x.end;
        sg.end = x.end;
      }
      return undo_bits();
    };
    if (!grown.empty() && !tails_valid) find_tails();
    for (const Growth& g : grown)
      for (int32_t i = tail_offset[size_t(g.node)]; i < tail_offset[size_t(g.node) + 1]; ++i) {
        const TailSegment x = tails[size_t(i)];
        Segment& sg = plan.segments[size_t(x.segment)];
        lengthened.push_back({x.unit, x.segment, sg.end});
        unit_growth[size_t(x.unit)] += g.to - sg.end;
        sg.end = g.to;
        if (unit_growth[size_t(x.unit)] > cfg.max_extension_tokens) return undo_plan();
      }
    // w grows in place; undone if the executor refuses the plan.
    for (const Growth& g : grown) {
      Node& a = w.tree.nodes[size_t(g.node)];
      validate_scratch.index.path_tokens[size_t(g.node)] += g.to - g.from;
      validate_scratch.index.tokens[size_t(g.node)] = g.to;
      a.num_tokens = g.to;
      a.pages.insert(a.pages.end(), t.page_ids.begin() + t.page_offsets[size_t(g.node)] + int32_t(a.pages.size()),
                     t.page_ids.begin() + t.page_offsets[size_t(g.node) + 1]);
    }
    try {
      hand_to_executor(w, plan, stream, /*extension=*/true, t.page_ids, t.page_offsets);
    } catch (...) {
      for (const Growth& g : grown) {
        Node& a = w.tree.nodes[size_t(g.node)];
        validate_scratch.index.path_tokens[size_t(g.node)] -= g.to - g.from;
        validate_scratch.index.tokens[size_t(g.node)] = g.from;
        a.num_tokens = g.from;
        a.pages.resize(size_t((int64_t(a.first_slot) + a.num_tokens + ps - 1) / ps));
      }
      undo_plan();
      throw;
    }
    table.ids.assign(t.page_ids.begin(), t.page_ids.end());
    table.offsets.assign(t.page_offsets.begin(), t.page_offsets.end());
    ++stats.extended;
    return true;
  }

  // tails of plan for w: each node's non-empty segments that end at its end,
  // in unit order. An extension lengthens exactly these, and they still end
  // at their node's end after it, so they stay valid until the next fresh plan.
  void find_tails() {
    const std::vector<Node>& nodes = w.tree.nodes;
    const auto is_tail = [&](const Segment& sg) {
      return sg.begin < sg.end && sg.end == nodes[size_t(sg.node)].num_tokens;
    };
    tail_offset.assign(nodes.size() + 1, 0);
    for (const Segment& sg : plan.segments)
      if (is_tail(sg)) ++tail_offset[size_t(sg.node) + 1];
    for (size_t v = 0; v < nodes.size(); ++v) tail_offset[v + 1] += tail_offset[v];
    tails.resize(size_t(tail_offset.back()));
    for (int32_t u = 0; u < plan.num_units(); ++u)
      for (int32_t k = plan.unit_segment_offset[u]; k < plan.unit_segment_offset[u + 1]; ++k)
        if (is_tail(plan.segments[size_t(k)])) tails[size_t(tail_offset[size_t(plan.segments[size_t(k)].node)]++)] = {u, k};
    for (size_t v = nodes.size(); v > 0; --v) tail_offset[v] = tail_offset[v - 1];  // back to each node's first
    tail_offset[0] = 0;
    tails_valid = true;
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
    for (size_t v = 0; v < n; ++v) {
      const int32_t b = t.page_offsets[v], e = t.page_offsets[v + 1];
      if (e < b) fail("page_offsets decreases at node " + std::to_string(v) + " (" + std::to_string(b) + " > " +
                      std::to_string(e) + ")");
      if (size_t(e) > t.page_ids.size())  // (offsets start at 0 and never decrease: b >= 0)
        fail("page_offsets[" + std::to_string(v + 1) + "] = " + std::to_string(e) + " is beyond len(page_ids) = " +
             std::to_string(t.page_ids.size()));
    }
    resize_nodes(n);
    load_pages(t);
    for (size_t v = 0; v < n; ++v) {
      Node& node = scratch.tree.nodes[v];
      node.parent = t.parents[v];
      node.num_tokens = t.num_tokens[v];
      node.first_slot = t.first_slots.empty() ? 0 : t.first_slots[v];
    }
    scratch.query_nodes.assign(t.query_nodes.begin(), t.query_nodes.end());
  }

  // scratch's node pages and scratch_table <- those of `t` (its offsets
  // checked). Invariant: scratch's nodes [0, scratch_table.offsets.size() - 1)
  // hold the pages scratch_table lists (a swap with w and table keeps it), so
  // only the nodes whose ids differ are copied: compared in runs of nodes
  // with as many pages in both (their pages then lie at offsets moved by the
  // same amount), one memcmp a run, as check_pages_against_last compares.
  // scratch_table keeps its leading nodes that equal t's (same page counts,
  // so same offsets, and same ids) and takes the rest from t.
  void load_pages(const TreeArrays& t) {
    const size_t n = t.parents.size();
    std::vector<int32_t>&had_at = scratch_table.offsets, &had_ids = scratch_table.ids;
    const size_t listed = had_at.empty() ? 0 : std::min(n, had_at.size() - 1);
    const auto copy = [&](size_t v) {
      const auto ids = t.page_ids.begin();
      scratch.tree.nodes[v].pages.assign(ids + t.page_offsets[v], ids + t.page_offsets[v + 1]);
    };
    size_t run = 0;       // the open run's first node
    size_t kept = listed;  // nodes [0, kept) of scratch_table equal t's
    const auto close_run = [&](size_t end) {  // nodes [run, end)
      const size_t len = size_t(had_at[end] - had_at[run]);
      if (len != 0 && std::memcmp(had_ids.data() + had_at[run], t.page_ids.data() + t.page_offsets[run],
                                  sizeof(int32_t) * len) != 0) {
        kept = std::min(kept, run);
        for (size_t v = run; v < end; ++v) copy(v);
      }
    };
    try {
      for (size_t v = 0; v < listed; ++v)
        if (had_at[v + 1] - had_at[v] != t.page_offsets[v + 1] - t.page_offsets[v]) {
          close_run(v);
          copy(v);
          kept = std::min(kept, v);
          run = v + 1;
        }
      if (listed > 0) close_run(listed);
      for (size_t v = listed; v < n; ++v) copy(v);
      // Offsets start at 0 in both, so nodes [0, kept) lie at the same offsets.
      const int32_t kept_ids = kept > 0 ? had_at[kept] : 0;
      had_ids.resize(size_t(kept_ids));
      had_ids.insert(had_ids.end(), t.page_ids.begin() + kept_ids, t.page_ids.end());
      had_at.resize(kept);
      had_at.insert(had_at.end(), t.page_offsets.begin() + kept, t.page_offsets.end());
    } catch (...) {
      scratch_table.offsets.clear();  // it lists none of scratch's pages now
      throw;
    }
  }

  // plan_tree's work, for the public functions that hold the mutex.
  void plan_tree(const TreeArrays& tree, void* stream);
  static std::string with_draft_names(const std::string& what, int32_t n, size_t k);
};

TreeAttention::TreeAttention(const TreeAttentionConfig& config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = config;
  TreeAttentionConfig& c = m.cfg;
  c.heads.validate();
  if (c.dtype != DType::fp16 && c.dtype != DType::bf16)
    fail("dtype " + std::string(to_string(c.dtype)) + " is not supported (fp16, bf16)");
  if (c.kv_dtype && *c.kv_dtype != c.dtype && *c.kv_dtype != DType::fp8_e4m3)
    fail("kv_dtype " + std::string(to_string(*c.kv_dtype)) + " is not supported with dtype " +
         std::string(to_string(c.dtype)) + " (fp8_e4m3, or the dtype)");
  if (c.page_size <= 0 || c.page_size > 65536)
    fail("page_size " + std::to_string(c.page_size) + " is out of range [1, 65536]");
  auto range = [](const char* name, int64_t v, int64_t hi) {
    if (v <= 0 || v > hi)
      fail(std::string(name) + " = " + std::to_string(v) + " is out of range [1, " + std::to_string(hi) + "]");
  };
  // Page ids are int32: every page of the pool (a draft row's page too) must be one.
  range("num_pages", c.num_pages, INT32_MAX);
  range("max_queries", c.max_queries, 1 << 20);
  if (c.max_extension_tokens < 0)
    fail("max_extension_tokens = " + std::to_string(c.max_extension_tokens) + " must be >= 0 (0: plan every step afresh)");
  range("max_nodes", c.max_nodes, 1 << 24);
  if (c.cpu_threads < 0 || c.cpu_threads > 1024)
    fail("cpu_threads = " + std::to_string(c.cpu_threads) + " is out of range [0, 1024] (0: every hardware thread)");
  range("max_page_refs", c.max_page_refs, int64_t(1) << 30);
  // The pool's size is fixed here: past what a plan accepts (Workload::validate), every plan would fail.
  try {
    check_pool_size(c.num_pages, c.page_size, c.heads);
  } catch (const Error& e) {
    fail(e.what());
  }
  m.planner = &find_planner(c.planner);
  if (c.device == Device::cuda) {
#if defined(TREEATTN_HAVE_CUDA)
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "tree attention: cudaGetDeviceCount");
    if (c.device_index < 0) check_cuda(cudaGetDevice(&c.device_index), "tree attention: cudaGetDevice");
    if (c.device_index >= devices)
      fail("device_index = " + std::to_string(c.device_index) + " is out of range [0, " + std::to_string(devices) +
           ") (the CUDA devices this process sees)");
    if (c.plan_options.num_sms == 0)  // the planners fill this device's SMs
      check_cuda(cudaDeviceGetAttribute(&c.plan_options.num_sms, cudaDevAttrMultiProcessorCount, c.device_index),
                 "tree attention: cudaDeviceGetAttribute(MultiProcessorCount)");
#else
    fail("device cuda: this build of treeattn has no CUDA executor (built without nvcc)");
#endif
  }
  if (c.plan_options.num_sms == 0) c.plan_options.num_sms = 132;  // CPU plans: an H100's, as the CLI's
  check_plan_options(c.plan_options);

  // Plan capacities a planner stays within for trees inside the capacities
  // above: a unit per (node piece, Q tile) and KV splits to fill the GPU.
  const int64_t ctas = int64_t(c.plan_options.num_sms) * c.plan_options.ctas_per_sm * 4;
  auto derive = [](const char* name, int32_t given, int64_t want) {
    if (given < 0) fail(std::string(name) + " = " + std::to_string(given) + " must be >= 0 (0: derived)");
    return given > 0 ? given : int32_t(std::min<int64_t>(want, 1 << 24));
  };
  c.max_units = derive("max_units", c.max_units, 2 * int64_t(c.max_nodes) + 4 * int64_t(c.max_queries) + ctas);
  c.max_segments = derive("max_segments", c.max_segments, 2 * int64_t(c.max_units) + 2 * int64_t(c.max_nodes));
  c.max_entries = derive("max_entries", c.max_entries, 2 * int64_t(c.max_units) + 8 * int64_t(c.max_queries));
  c.max_slots = derive("max_slots", c.max_slots, c.max_entries);
  range("max_units", c.max_units, 1 << 24);
  range("max_segments", c.max_segments, 1 << 26);
  range("max_entries", c.max_entries, 1 << 26);
  range("max_slots", c.max_slots, 1 << 26);

  for (Workload* w : {&m.w, &m.scratch}) {
    w->name = "step";
    w->heads = c.heads;
    w->layout = {c.page_size, c.num_pages, c.dtype, c.kv_dtype};
  }
  if (c.device == Device::cuda) {
#if defined(TREEATTN_HAVE_CUDA)
    DeviceGuard on(c.device_index);
    CudaStepOptions so;
    so.l2_persistent_plan = c.l2_persistent_plan;
    m.cuda = std::make_unique<CudaStepExecutor>(c.heads, m.w.layout, c.step_capacity(), so);
#endif
  }
}

TreeAttention::~TreeAttention() = default;
TreeAttention::TreeAttention(TreeAttention&&) noexcept = default;
TreeAttention& TreeAttention::operator=(TreeAttention&&) noexcept = default;

void TreeAttention::Impl::plan_tree(const TreeArrays& tree, void* stream) {
  if (try_extend(tree, stream)) return;
  load_tree(tree, 0, 0);
  commit(stream);
}

void TreeAttention::plan_tree(const TreeArrays& tree, void* stream) {
  const std::lock_guard lock(impl_->mutex);
  impl_->plan_tree(tree, stream);
}

void TreeAttention::plan_block_tables(std::span<const int32_t> block_tables, int32_t batch, int32_t width,
                                      std::span<const int32_t> seq_lens, void* stream) {
  Impl& m = *impl_;
  const std::lock_guard lock(m.mutex);
  if (batch <= 0 || width <= 0) fail("block_tables shape [" + std::to_string(batch) + ", " + std::to_string(width) +
                                     "] must be positive");
  if (block_tables.size() != size_t(batch) * size_t(width))
    fail("block_tables has " + std::to_string(block_tables.size()) + " entries, expected " + std::to_string(batch) +
         " x " + std::to_string(width));
  if (seq_lens.size() != size_t(batch))
    fail("seq_lens has " + std::to_string(seq_lens.size()) + " entries, block_tables " + std::to_string(batch) + " rows");
  check_capacity("queries", batch, m.cfg.max_queries);
  // The batch's radix tree as arrays, then planned as plan_tree plans them
  // (a decode step that only grew sequences extends the last plan).
  BlockTableTree& t = m.block_table_tree;
  build_block_table_tree(block_tables, batch, width, seq_lens, m.cfg.page_size, m.cfg.num_pages, t);
  m.plan_tree({t.parents, t.num_tokens, t.page_offsets, t.page_ids, t.query_nodes, {}}, stream);
}

// The checks of a step's tree name its nodes by number, and the drafts are
// nodes n .. n + k - 1 of it: a message that names one of those says which
// draft it is.
std::string TreeAttention::Impl::with_draft_names(const std::string& what, int32_t n, size_t k) {
  std::string named = what;
  bool names_draft = false;
  for (size_t at = what.find("node "); at != std::string::npos; at = what.find("node ", at + 5)) {
    const char* digits = what.c_str() + at + 5;
    char* end = nullptr;
    const long v = std::strtol(digits, &end, 10);
    names_draft |= end != digits && v >= n && v < n + int64_t(k);
  }
  if (names_draft)
    named += " (nodes " + std::to_string(n) + " .. " + std::to_string(n + int64_t(k) - 1) +
             " are the drafts: node " + std::to_string(n) + " + i is draft i, its KV at draft_rows[i])";
  return named;
}

void TreeAttention::plan_tree_queries(const TreeArrays& tree, const DraftArrays& d, void* stream) {
  Impl& m = *impl_;
  const std::lock_guard lock(m.mutex);
  const size_t k = d.draft_nodes.size();
  if (d.draft_parents.size() != k || d.draft_rows.size() != k)
    fail("draft_nodes, draft_parents and draft_rows differ in length (" + std::to_string(k) + ", " +
         std::to_string(d.draft_parents.size()) + ", " + std::to_string(d.draft_rows.size()) + ")");
  m.load_tree(tree, k, k);
  const int32_t n = int32_t(tree.parents.size()), ps = m.cfg.page_size;
  // The tree's parents and queries name its own nodes: the drafts' nodes,
  // numbered after them, are not theirs to name (the tree's check sees both).
  for (int32_t v = 0; v < n; ++v)
    if (tree.parents[size_t(v)] < -1 || tree.parents[size_t(v)] >= n)
      fail("parents[" + std::to_string(v) + "] = " + std::to_string(tree.parents[size_t(v)]) +
           " is out of range [-1, " + std::to_string(n) + ")");
  for (size_t j = 0; j < tree.query_nodes.size(); ++j)
    if (tree.query_nodes[j] < 0 || tree.query_nodes[j] >= n)
      fail("query_nodes[" + std::to_string(j) + "] = " + std::to_string(tree.query_nodes[j]) +
           " is out of range [0, " + std::to_string(n) + ")");
  m.resize_nodes(size_t(n) + k);
  for (size_t i = 0; i < k; ++i) {
    const auto at = [i] { return "draft " + std::to_string(i) + ": "; };  // built only on failure: this runs every step
    const int32_t par = d.draft_parents[i];
    if (par >= int32_t(i) || par < -1)
      fail(at() + "draft_parents = " + std::to_string(par) + " must be -1 or an earlier draft (< " + std::to_string(i) +
           "): drafts are listed parents first, which also rules out cycles");
    const int32_t node = d.draft_nodes[i];
    if (par < 0 && (node < 0 || node >= n))
      fail(at() + "draft_nodes = " + std::to_string(node) + " is out of range [0, " + std::to_string(n) + ")");
    const int64_t row = d.draft_rows[i];
    if (row < 0 || row >= m.cfg.num_pages * ps)
      fail(at() + "draft_rows = " + std::to_string(row) + " is out of range [0, num_pages x page_size = " +
           std::to_string(m.cfg.num_pages * ps) + ")");
    Node& dn = m.scratch.tree.nodes[size_t(n) + i];
    dn.parent = par >= 0 ? n + par : node;
    dn.num_tokens = 1;
    dn.first_slot = int32_t(row % ps);
    dn.pages.assign(1, int32_t(row / ps));
    m.scratch_table.ids.push_back(int32_t(row / ps));
    m.scratch_table.offsets.push_back(int32_t(m.scratch_table.ids.size()));
    m.scratch.query_nodes.push_back(n + int32_t(i));
  }
  try {
    m.commit(stream);
  } catch (const Error& e) {
    throw Error(Impl::with_draft_names(e.what(), n, k));
  }
}

void TreeAttention::run(const AttentionArgs& args, void* stream) const {
  const Impl& m = *impl_;
  const std::lock_guard lock(m.mutex);
  if (!m.planned) fail("run() before any plan_*() call");
  if (args.num_queries >= 0 && args.num_queries != m.w.num_queries())
    fail("run(): the tensors hold " + std::to_string(args.num_queries) + " queries, the plan in force " +
         std::to_string(m.w.num_queries()) + " (planned again since they were sized?)");
#if defined(TREEATTN_HAVE_CUDA)
  if (m.cuda) {
    DeviceGuard on(m.cfg.device_index);
    return m.cuda->run(args, static_cast<cudaStream_t>(stream));
  }
#endif
  (void)stream;
  if (!args.q || !args.k || !args.v || !args.out) fail("run(): null tensor pointer");
  run_cpu(m.w, m.plan, args, m.cfg.cpu_threads);
}

const TreeAttentionConfig& TreeAttention::config() const { return impl_->cfg; }
int32_t TreeAttention::num_queries() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->planned ? impl_->w.num_queries() : 0;
}
const Workload& TreeAttention::workload() const { return impl_->w; }
const Plan& TreeAttention::plan() const { return impl_->plan; }
PlanSummary TreeAttention::summary() const {
  const std::lock_guard lock(impl_->mutex);
  if (!impl_->planned) fail("summary() before any plan_*() call");
  return summarize(impl_->w, impl_->plan);
}
PlanStats TreeAttention::plan_stats() const {
  const std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}
void TreeAttention::set_graph_launches(uint32_t launches) {
  const std::lock_guard lock(impl_->mutex);
#if defined(TREEATTN_HAVE_CUDA)
  if (impl_->cuda) return impl_->cuda->set_graph_launches(launches);
#endif
  if (launches != 0)
    fail("set_graph_launches(" + std::to_string(launches) + "): the CPU executor has no launches (only 0 is accepted)");
}
uint32_t TreeAttention::graph_launches() const {
  const std::lock_guard lock(impl_->mutex);
#if defined(TREEATTN_HAVE_CUDA)
  if (impl_->cuda) return impl_->cuda->graph_launches();
#endif
  return 0;
}
uint32_t TreeAttention::plan_launches() const {
  const std::lock_guard lock(impl_->mutex);
#if defined(TREEATTN_HAVE_CUDA)
  if (impl_->cuda) return impl_->cuda->plan_launches();
#endif
  return 0;
}
std::string TreeAttention::describe() const {
  const std::lock_guard lock(impl_->mutex);
#if defined(TREEATTN_HAVE_CUDA)
  if (impl_->cuda) return impl_->cuda->describe();
#endif
  return "cpu executor";
}

}  // namespace treeattn
