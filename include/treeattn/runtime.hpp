// The engine-facing runtime (layer 5): what a serving engine holds for its
// lifetime. TreeAttention is made once with the engine's limits; plan_*()
// once per decode step from what the engine has (vLLM-style block tables, an
// explicit tree as a radix cache holds it, or tree-structured draft queries),
// then run() once per layer with the same plan. On the GPU every device buffer
// is allocated at construction and run() only launches fixed grids, so a CUDA
// graph captured over the run() calls of a step stays valid when the next
// step is planned (CudaStepExecutor). On the CPU the same calls run the CPU
// executor: one API, so engines and tests can run without a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "treeattn/executor.hpp"
#include "treeattn/planner.hpp"

namespace treeattn {

enum class Device : uint8_t { cpu, cuda };

struct TreeAttentionConfig {
  HeadConfig heads;
  DType dtype = DType::fp16;      // of q and out
  std::optional<DType> kv_dtype;  // of the K/V pools when not dtype: fp8_e4m3 (run()'s k_scale / v_scale)
  int page_size = 16;
  int64_t num_pages = 0;  // pages of the KV pools run() will be given, 1 .. 2^31 - 1 (page ids are int32)
  Device device = Device::cuda;
  // The CUDA device that holds the buffers and runs the kernels; -1: the
  // device current at construction (config() then reports it). plan_*() and
  // run() make it current for their CUDA calls and restore the caller's.
  int device_index = -1;
  // Capacities: a plan beyond one of them is refused with an Error naming it.
  int32_t max_queries = 256;
  int32_t max_nodes = 4096;
  int64_t max_page_refs = 65536;  // pages of all nodes of one step's tree
  // Capacities of the plan itself, on the CPU too; 0: derived from the above
  // (see tree_attention.cpp).
  int32_t max_units = 0, max_segments = 0, max_entries = 0, max_slots = 0;
  // The capacities above as a CudaStepExecutor takes them.
  StepCapacity step_capacity() const {
    return {max_queries, max_units, max_segments, max_entries, max_slots, max_page_refs};
  }
  std::string planner = "auto";
  // num_sms = 0: the device's (132 on the CPU); each option in the range
  // check_plan_options (planner.hpp) accepts, else the constructor throws.
  PlanOptions plan_options;
  int cpu_threads = 0;       // CPU executor threads, 0: all
  // Plan extension (plan_tree only): a step whose tree differs from the last
  // one only in that some childless nodes grew (more tokens, pages appended;
  // the nodes, parents, queries and first slots the same: a decode step)
  // reuses the last plan with those nodes' tail segments lengthened, until a
  // unit would hold more than this many tokens beyond what the planner gave
  // it; then the step is planned afresh. Coverage is exact either way: the
  // tree's growth is checked as a fresh tree would be, and a plan valid for
  // the last tree, extended so, is valid for the grown one (it is not
  // validated again). Only the balance of the units can lag a fresh plan's,
  // by at most this many tokens a unit. 0: every step is planned afresh.
  int32_t max_extension_tokens = kDefaultKvTile;
  // CUDA: keep the plan's device arrays in the L2 set-aside for persisting
  // accesses (CudaExecutorOptions::l2_persistent_plan), so that each layer's
  // run finds them in L2 after the model's other kernels streamed through
  // it. Raises the device-wide persisting L2 limit to the plan buffer's size
  // (at most the device's maximum). The CPU ignores it.
  bool l2_persistent_plan = false;
};

// How the steps so far were planned: afresh or by extending the last plan.
struct PlanStats {
  int64_t planned = 0;   // plans made by the planner
  int64_t extended = 0;  // steps that extended the last plan
  // Of the fresh plans, those whose pages were checked only where their
  // nodes differ from the last tree's (its page bits kept; no page shared).
  int64_t pages_rechecked = 0;
};

// A tree as flat arrays, nodes in any order with parents given by index:
// node v has num_tokens[v] tokens in pages page_ids[page_offsets[v] ..
// page_offsets[v + 1]); query i attends to the path root..query_nodes[i].
// first_slots (optional, one per node): slot of the node's first token in its
// first page (Node::first_slot); empty: 0 for every node.
struct TreeArrays {
  std::span<const int32_t> parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots;
};

// Speculative-decoding draft tokens as queries: draft i is a one-token node
// whose KV is at pool row draft_rows[i] (= page * page_size + slot), under
// draft draft_parents[i] when that is >= 0 (drafts are listed parents first),
// else under tree node draft_nodes[i]. Its query attends to that node's path,
// the draft ancestors and itself. Queries: the tree's own query_nodes first,
// then one per draft.
struct DraftArrays {
  std::span<const int32_t> draft_nodes, draft_parents;
  std::span<const int64_t> draft_rows;
};

// Threads: any member function may be called from any thread. Calls on one
// object are serialised by its mutex (a run() waits for a plan_*() in
// progress and the other way round), so each run() sees one whole plan; which
// one is the callers' to order. workload() and plan() return the plan in
// force, valid until the next plan_*() replaces it: read them only while no
// other thread plans. A moved-from TreeAttention may only be destroyed or
// assigned to.
class TreeAttention {
 public:
  explicit TreeAttention(const TreeAttentionConfig& config);
  ~TreeAttention();
  TreeAttention(TreeAttention&&) noexcept;
  TreeAttention& operator=(TreeAttention&&) noexcept;

  // Plans a step; stream: the cudaStream_t of the runs that follow (ignored
  // on the CPU). The tree is validated, and a fresh plan too, before
  // anything reaches the device (an extension, max_extension_tokens, is
  // valid by construction). On an error the previous plan stays in force.
  void plan_tree(const TreeArrays& tree, void* stream = nullptr);
  // A batch of sequences: block_tables row-major [batch, width] page ids,
  // seq_lens [batch]; equal leading page ids are a shared prefix.
  void plan_block_tables(std::span<const int32_t> block_tables, int32_t batch, int32_t width,
                         std::span<const int32_t> seq_lens, void* stream = nullptr);
  void plan_tree_queries(const TreeArrays& tree, const DraftArrays& drafts, void* stream = nullptr);

  // Attention of the planned queries: tensors on the configured device, of
  // the configured dtype, shapes and strides as AttentionArgs says. Throws
  // if nothing was planned.
  void run(const AttentionArgs& args, void* stream = nullptr) const;

  const TreeAttentionConfig& config() const;
  int32_t num_queries() const;      // of the last plan
  const Workload& workload() const; // the last plan's tree
  const Plan& plan() const;
  PlanSummary summary() const;
  PlanStats plan_stats() const;
  std::string describe() const;     // the executor's launches (GPU) or "cpu"

  // CUDA graphs (CudaStepExecutor::set_graph_launches): the attention
  // launches a captured run() records, a mask over describe()'s launches
  // (default: all but the 128-row tile's skip variant's, whose masked units
  // then run the plain loop; launch 0 recorded anyway, last where the mask leaves it
  // out), and a graph captured under any mask runs any later plan correctly.
  // One captured under the mask plan_launches() gave launches no tile the
  // plan leaves empty but that last launch 0, so an engine may keep a graph
  // per plan_launches() value and replay the one that matches each step's
  // plan. On the CPU there are no launches: both read 0, and a mask other
  // than 0 is refused.
  void set_graph_launches(uint32_t launches);
  uint32_t graph_launches() const;
  uint32_t plan_launches() const;  // of the plan in force (0 before any plan)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace treeattn
