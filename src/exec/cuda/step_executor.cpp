// CudaStepExecutor: a CUDA executor whose device buffers and launches are
// fixed at construction, so that one CUDA graph per batch shape survives a new
// plan every decode step (cuda_executor.hpp).
//
// Layout of the plan buffer (device): a header of per-launch (first unit,
// unit count) pairs and the merge count, then every array at the offset its
// capacity gives it; the kernels read the counts from the header, so their
// grids never change. set_plan() writes the used part of each array, packed
// one after another, into a pinned staging buffer, copies that in one
// cudaMemcpyAsync and places the arrays with one copy_ranges launch: two
// driver calls a step whatever the plan, and no copy of unused capacity.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <string>
#include <vector>

#include "exec/cuda/attention_params.hpp"
#include "exec/cuda/kernels.hpp"
#include "exec/cuda/plan_upload.hpp"
#include "exec/cuda/step_pack.hpp"
#include "treeattn/cuda_executor.hpp"

namespace treeattn {

namespace {

constexpr int kStaging = 2;  // pinned staging buffers used in turn

void check_capacity(const char* name, int64_t value, int64_t cap) {
  if (value > cap)
    throw Error("step executor: the plan needs " + std::to_string(value) + " " + name + ", capacity " + name + " is " +
                std::to_string(cap) + " (raise it at construction)");
}

// Throws unless `t` has w's shape: an offset per node and one past the
// last, from 0 to its ids' count, each node's page count; and, where
// `compare_ids`, w's page ids.
void check_page_table(const Workload& w, const PageTableView& t, bool compare_ids) {
  const size_t n = w.tree.nodes.size();
  if (t.node_offsets.size() != n + 1 || t.node_offsets[0] != 0 || size_t(t.node_offsets[n]) != t.ids.size())
    throw Error("step executor: the page table has " + std::to_string(t.node_offsets.size()) + " node offsets for " +
                std::to_string(n) + " nodes (expected nodes + 1, from 0 to its " + std::to_string(t.ids.size()) +
                " ids)");
  for (size_t v = 0; v < n; ++v) {
    const std::vector<int32_t>& pages = w.tree.nodes[v].pages;
    const int32_t at = t.node_offsets[v];
    if (t.node_offsets[v + 1] - at != int32_t(pages.size()) ||
        (compare_ids && !std::equal(pages.begin(), pages.end(), t.ids.begin() + at)))
      throw Error("step executor: the page table's node " + std::to_string(v) + " differs from the workload's (" +
                  std::to_string(t.node_offsets[v + 1] - at) + " pages, the node has " + std::to_string(pages.size()) +
                  ")");
  }
}

// Owning pinned host allocation.
struct PinnedBuffer {
  void* ptr = nullptr;
  explicit PinnedBuffer(size_t bytes) { check_cuda(cudaMallocHost(&ptr, bytes), "step executor: pinned staging buffer"); }
  ~PinnedBuffer() {
    if (ptr) cudaFreeHost(ptr);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

}  // namespace

struct CudaStepExecutor::Impl {
  cuda::TensorShape shape;
  StepCapacity cap;
  cuda::StepLayout layout{};
  std::vector<cuda::Launch> launches;
  cuda::UnitLaunches unit_launches;  // plan tile (and mask) -> launch
  DeviceBuffer plan_buf, workspace;
  DeviceBuffer packed;  // the staged copy lands here, then copy_ranges places it in plan_buf
  std::vector<std::unique_ptr<PinnedBuffer>> staging;
  std::array<cudaEvent_t, kStaging> staged{};  // the copies out of staging[i] have run
  int next_staging = 0;
  bool has_plan = false;
  // The header of the plan in force (a host copy of what its upload puts in
  // counts): per launch, its first unit and its units; then the merges.
  std::vector<int32_t> counts;
  bool skip_unused_launches = true;  // CudaStepOptions
  uint32_t graph_launches = 0;       // set_graph_launches(): a captured run's attention launches

  // What an eager run launches (skip_unused_launches): attention launch i
  // only if the plan in force gives it units, the merge only for merges.
  bool plan_uses_launch(size_t i) const { return counts[2 * i + 1] > 0; }
  int32_t plan_merges() const { return counts[2 * launches.size()]; }
  uint32_t all_launches() const { return (1u << launches.size()) - 1; }
  // The shape of the last plan set (PlanCheck::extension must keep it).
  struct PlanShape {
    int32_t queries = 0, units = 0, slots = 0;
    size_t segments = 0, entries = 0, slot_refs = 0;
    bool operator==(const PlanShape&) const = default;
  } last_shape;
  bool chained = false;
  cudaAccessPolicyWindow l2_window{};  // CudaStepOptions::l2_persistent_plan (0 bytes: none)
  cuda::AttnParams attn{};
  cuda::MergeParams merge{};
  int64_t merge_grid = 0;
  // Reused host scratch (no allocation once grown to a step's size).
  cuda::StepPackScratch pack_scratch;
  ValidatePlanScratch validate_scratch;

  ~Impl() {
    for (cudaEvent_t e : staged)
      if (e) cudaEventDestroy(e);
  }
};

CudaStepExecutor::CudaStepExecutor(const HeadConfig& heads, const KvLayout& layout, const StepCapacity& cap,
                                   const CudaStepOptions& o)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  heads.validate();
  const DType dtype = layout.dtype, kv_dtype = layout.kv_type();
  const int page_size = layout.page_size;
  const int64_t num_pages = layout.num_pages;
  if (dtype != DType::fp16 && dtype != DType::bf16)
    throw Error("step executor: dtype " + std::string(to_string(dtype)) + " is not supported (fp16, bf16)");
  if (kv_dtype != dtype && kv_dtype != DType::fp8_e4m3)
    throw Error("step executor: kv_dtype " + std::string(to_string(kv_dtype)) + " is not supported with dtype " +
                std::string(to_string(dtype)) + " (fp8_e4m3, or the dtype)");
  if (page_size <= 0 || page_size > 65536)
    throw Error("step executor: page_size " + std::to_string(page_size) + " is out of range [1, 65536]");
  if (num_pages <= 0) throw Error("step executor: num_pages " + std::to_string(num_pages) + " must be positive");
  auto positive = [](const char* name, int64_t v, int64_t hi) {
    if (v <= 0 || v > hi)
      throw Error("step executor: capacity " + std::string(name) + " = " + std::to_string(v) + " is out of range [1, " +
                  std::to_string(hi) + "]");
  };
  positive("max_queries", cap.max_queries, 1 << 20);
  positive("max_units", cap.max_units, 1 << 24);
  positive("max_segments", cap.max_segments, 1 << 26);
  positive("max_entries", cap.max_entries, 1 << 26);
  positive("max_slots", cap.max_slots, 1 << 26);
  positive("max_page_refs", cap.max_page_refs, int64_t(1) << 30);
  m.shape = {dtype, kv_dtype, heads, page_size, num_pages};
  m.cap = cap;
  m.skip_unused_launches = o.skip_unused_launches;
  const cuda::DeviceLimits dl = cuda::DeviceLimits::current();

  // The launches: one per tile, in the order given; a plan tile runs on the
  // launch of the smallest m that holds its rows. Default: the n = 64 tiles,
  // largest m first. The launch order is the start order: a tree's shared
  // nodes are the long units of many rows, and must not queue behind a wave
  // of short leaves (the tail).
  std::vector<int> tiles = o.tiles.empty() ? cuda::default_step_tiles(heads.head_dim) : o.tiles;
  for (int t : tiles)
    if (t < 0 || t >= int(kTileConfigs.size()) || !tile_fits_head_dim(t, heads.head_dim))
      throw Error("step executor: tile " + std::to_string(t) + " is not a compiled tile that fits head_dim " +
                  std::to_string(heads.head_dim));
  // The 128-row tile's skip variant, where one is compiled, gets a launch of
  // its own right after the plain one, for the masked units that launch
  // would run (as CudaExecutor runs them).
  const cuda::KernelEntry skip_kernel =
      o.skip_unseen ? cuda::find_attention_skip_kernel(dtype, kv_dtype, heads.head_dim) : cuda::KernelEntry{};
  m.unit_launches = cuda::UnitLaunches::of(std::move(tiles), skip_kernel.kernel != nullptr);
  const int skip_launch = m.unit_launches.skip_launch;
  for (int i = 0; i < m.unit_launches.count(); ++i) {
    cuda::Launch l;
    l.kernel = i == skip_launch
                   ? skip_kernel
                   : cuda::find_attention_kernel(dtype, kv_dtype, heads.head_dim, m.unit_launches.tiles[size_t(i)]);
    l.max_len = 1 << 20;  // any plan: as deep a pipeline as the occupancy allows
    cuda::set_kernel_attributes(l.kernel, dl);
    m.launches.push_back(l);
  }
  if (m.launches.size() > 31)  // the launch masks are 32-bit
    throw Error("step executor: " + std::to_string(m.launches.size()) + " launches, at most 31");
  // A graph records every launch but the skip variant's by default: a plan
  // without masked 128-row units leaves that launch empty, and an empty
  // launch before others costs a replay 2-3 us; masked units then run on the
  // plain launch (the same result). A mask that names it records it.
  m.graph_launches = m.all_launches() & ~(skip_launch >= 0 ? 1u << skip_launch : 0u);
  const int64_t many = int64_t(dl.num_sms) * 64;  // stands for "more items than one wave"
  for (cuda::Launch& l : m.launches) {
    cuda::choose_stages(l, many, dl, m.launches.size() > 1);
    l.grid = cuda::wave_ctas(l, dl);
    l.persistent = l.kernel.persistent;
  }

  // Workspace: partials and their lse, the chained-run counters, two claim
  // counters per persistent launch (zeroed once; every run leaves them zero).
  const int H = heads.num_qo_heads, D = heads.head_dim;
  const size_t o_bytes = size_t(cap.max_slots) * H * D * sizeof(float);
  const size_t lse_bytes = size_t(cap.max_slots) * H * sizeof(float);
  const size_t counters = (o_bytes + lse_bytes + 15) / 16 * 16;
  size_t counter_bytes = 2 * sizeof(unsigned int);
  for (cuda::Launch& l : m.launches)
    if (l.persistent) {
      l.work_offset = counters + counter_bytes;
      counter_bytes += 2 * sizeof(unsigned int);
    }
  m.workspace = DeviceBuffer(counters + counter_bytes);
  check_cuda(cudaMemset(m.workspace.as<uint8_t>() + counters, 0, counter_bytes), "step executor: counters");

  m.layout = cuda::StepLayout::make(cap, int(m.launches.size()));
  m.plan_buf = DeviceBuffer(m.layout.total);
  m.packed = DeviceBuffer(m.layout.total);  // packed arrays never take more than their capacities
  check_cuda(cudaMemset(m.plan_buf.get(), 0, m.layout.total), "step executor: plan buffer");
  if (o.l2_persistent_plan) m.l2_window = cuda::plan_l2_window(m.plan_buf.get(), m.layout.total);
  for (int i = 0; i < kStaging; ++i) {
    m.staging.push_back(std::make_unique<PinnedBuffer>(m.layout.total));
    check_cuda(cudaEventCreateWithFlags(&m.staged[i], cudaEventDisableTiming), "step executor: cudaEventCreate");
  }
  check_cuda(cudaDeviceSynchronize(), "step executor: set-up");

  const uint8_t* base = m.plan_buf.as<uint8_t>();
  cuda::AttnParams& a = m.attn;
  a.partial_o = m.workspace.as<float>();
  a.partial_lse = reinterpret_cast<float*>(m.workspace.as<uint8_t>() + o_bytes);
  a.units = reinterpret_cast<const cuda::UnitDesc*>(base + m.layout.units);
  a.segs = reinterpret_cast<const cuda::SegDesc*>(base + m.layout.segs);
  a.entry_query = reinterpret_cast<const int32_t*>(base + m.layout.entry_query);
  a.entry_mask = reinterpret_cast<const uint64_t*>(base + m.layout.entry_mask);
  a.entry_slot = reinterpret_cast<const int32_t*>(base + m.layout.entry_slot);
  a.page_ids = reinterpret_cast<const int32_t*>(base + m.layout.page_ids);
  a.counts = reinterpret_cast<const int32_t*>(base + m.layout.counts);
  a.grid_stride = true;
  a.num_qo_heads = H;
  a.num_kv_heads = heads.num_kv_heads;
  a.group = heads.group_size();
  a.page_size = page_size;
  a.page_divisor = cuda::Divisor::of(page_size);
  a.group_divisor = cuda::Divisor::of(a.group);

  cuda::MergeParams& mg = m.merge;
  mg.partial_o = a.partial_o;
  mg.partial_lse = a.partial_lse;
  mg.merges = reinterpret_cast<const cuda::MergeDesc*>(base + m.layout.merges);
  mg.query_slots = reinterpret_cast<const int32_t*>(base + m.layout.query_slots);
  mg.num_merges_dev = a.num_merges_dev = a.counts + 2 * m.launches.size();
  mg.num_merges = cap.max_queries;  // sizes the grid; the count itself is read on the device
  mg.max_slots = cuda::MergeDesc::kInline + 1;  // the general merge variant (any slot count)
  mg.num_qo_heads = H;
  mg.num_sms = dl.num_sms;
  m.merge_grid = cuda::merge_ctas(mg);

  // Chained on sm_90+ (executor.cpp): the merge waits on the count of
  // attention CTAs, which the fixed grids make a constant for each set of
  // launches a run makes.
  m.chained = dl.major >= 9;
  if (m.chained) {  // (run() sets MergeParams::attention_ctas: the CTAs of the launches it makes)
    unsigned int* c = reinterpret_cast<unsigned int*>(m.workspace.as<uint8_t>() + counters);
    a.ctas_done = mg.ctas_done = c;
    mg.merge_ctas_past = c + 1;
  }
}

CudaStepExecutor::~CudaStepExecutor() = default;
CudaStepExecutor::CudaStepExecutor(CudaStepExecutor&&) noexcept = default;
CudaStepExecutor& CudaStepExecutor::operator=(CudaStepExecutor&&) noexcept = default;

const StepCapacity& CudaStepExecutor::capacity() const { return impl_->cap; }
size_t CudaStepExecutor::device_bytes() const { return impl_->plan_buf.size() + impl_->workspace.size(); }
int CudaStepExecutor::num_launches() const { return int(impl_->launches.size()); }

std::string CudaStepExecutor::describe() const {
  std::string out;
  for (const cuda::Launch& l : impl_->launches)
    out += (out.empty() ? "" : "; ") + std::string("m") + std::to_string(l.kernel.m) +
           (l.kernel.n != 64 ? "n" + std::to_string(l.kernel.n) : std::string()) +
           (l.kernel.skips_unseen ? " skip" : "") + " ctas=" + std::to_string(l.grid) +
           (l.persistent ? " persistent" : " grid-stride") + " stages=" + std::to_string(l.stages) +
           " smem=" + std::to_string(l.smem / 1024) + "K";
  return out + "; merge ctas=" + std::to_string(impl_->merge_grid);
}

void CudaStepExecutor::set_plan(const Workload& w, const Plan& p, cudaStream_t stream, PlanCheck check,
                                const PageTableView* pages, const TreeIndex* index) {
  Impl& m = *impl_;
  const cuda::TensorShape& t = m.shape;
  if (w.heads.num_qo_heads != t.heads.num_qo_heads || w.heads.num_kv_heads != t.heads.num_kv_heads ||
      w.heads.head_dim != t.heads.head_dim)
    throw Error("step executor: workload heads " + std::to_string(w.heads.num_qo_heads) + "/" +
                std::to_string(w.heads.num_kv_heads) + " d=" + std::to_string(w.heads.head_dim) +
                " differ from the executor's " + std::to_string(t.heads.num_qo_heads) + "/" +
                std::to_string(t.heads.num_kv_heads) + " d=" + std::to_string(t.heads.head_dim));
  if (w.layout.dtype != t.dtype || w.layout.kv_type() != t.kv_dtype || w.layout.page_size != t.page_size ||
      w.layout.num_pages > t.num_pages)
    throw Error("step executor: workload layout (dtype " + std::string(to_string(w.layout.dtype)) + ", kv_dtype " +
                std::string(to_string(w.layout.kv_type())) + ", page_size " + std::to_string(w.layout.page_size) +
                ", num_pages " + std::to_string(w.layout.num_pages) + ") does not fit the executor's (dtype " +
                std::string(to_string(t.dtype)) + ", kv_dtype " + std::string(to_string(t.kv_dtype)) + ", page_size " +
                std::to_string(t.page_size) + ", num_pages " + std::to_string(t.num_pages) + ")");
  if (check == PlanCheck::validate) validate_plan(w, p, &m.validate_scratch, index);
  check_capacity("max_queries", w.num_queries(), m.cap.max_queries);
  check_capacity("max_units", p.num_units(), m.cap.max_units);
  check_capacity("max_segments", int64_t(p.segments.size()), m.cap.max_segments);
  check_capacity("max_entries", int64_t(p.entry_query.size()), m.cap.max_entries);
  check_capacity("max_slots", p.num_slots, m.cap.max_slots);
  int64_t refs = 0;
  for (const Node& n : w.tree.nodes) refs += int64_t(n.pages.size());
  check_capacity("max_page_refs", refs, m.cap.max_page_refs);
  if (pages) check_page_table(w, *pages, check == PlanCheck::validate && !pages->source_of_workload);
  const Impl::PlanShape shape{w.num_queries(), p.num_units(),       p.num_slots,
                              p.segments.size(), p.entry_query.size(), p.query_slots.size()};
  const bool extension = check == PlanCheck::extension;
  if (extension && !(m.has_plan && shape == m.last_shape))
    throw Error("step executor: PlanCheck::extension, but the plan's queries, units, segments, entries or slots " +
                std::string(m.has_plan ? "differ from the last plan's" : "have no last plan to extend"));

  // Stage into the next pinned buffer once the copy out of it has run.
  const int si = m.next_staging;
  m.next_staging = (si + 1) % kStaging;
  check_cuda(cudaEventSynchronize(m.staged[si]), "step executor: staging buffer wait");
  uint8_t* const host = static_cast<uint8_t*>(m.staging[si]->ptr);
  // The pack throws (a unit's tile) before it changes anything; after it,
  // its scratch describes this plan, which is in force once its upload is
  // enqueued (a failed driver call leaves no plan to run or extend).
  cuda::CopyRanges ranges =
      cuda::pack_step_plan(w, p, m.layout, m.unit_launches, host, m.pack_scratch, pages, /*keep_entries=*/extension);
  m.has_plan = false;
  ranges.src = m.packed.as<uint8_t>();
  ranges.dst = m.plan_buf.as<uint8_t>();
  check_cuda(cudaMemcpyAsync(m.packed.get(), host, ranges.src_bytes, cudaMemcpyHostToDevice, stream),
             "step executor: plan copy");
  check_cuda(cudaEventRecord(m.staged[si], stream), "step executor: cudaEventRecord");
  cuda::launch_copy_ranges(ranges, stream);
  m.counts.assign(m.pack_scratch.counts.begin(), m.pack_scratch.counts.end());
  m.has_plan = true;
  m.last_shape = shape;
}

namespace {

// Whether work enqueued on `stream` now would be captured into a graph. An
// unanswered query counts as a capture: the caller then launches what a
// capture needs.
bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // the query's own error (the legacy stream during another stream's capture)
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

uint32_t CudaStepExecutor::plan_launches() const {
  const Impl& m = *impl_;
  uint32_t set = 0;
  for (size_t i = 0; m.has_plan && i < m.launches.size(); ++i) set |= m.plan_uses_launch(i) ? 1u << i : 0u;
  return set;
}

void CudaStepExecutor::set_graph_launches(uint32_t launches) {
  Impl& m = *impl_;
  std::vector<int> launch_m;
  for (const cuda::Launch& l : m.launches) launch_m.push_back(l.kernel.m);
  if (const std::string e = cuda::graph_launches_error(launch_m, launches); !e.empty()) throw Error("step executor: " + e);
  m.graph_launches = launches;
}

uint32_t CudaStepExecutor::graph_launches() const { return impl_->graph_launches; }

int CudaStepExecutor::num_eager_launches() const {
  const Impl& m = *impl_;
  if (!m.has_plan) return 0;
  if (!m.skip_unused_launches) return int(m.launches.size()) + 1;
  int n = m.plan_merges() > 0 ? 1 : 0;
  for (size_t i = 0; i < m.launches.size(); ++i) n += m.plan_uses_launch(i) ? 1 : 0;
  return n;
}

void CudaStepExecutor::run(const AttentionArgs& args, cudaStream_t stream) const {
  const Impl& m = *impl_;
  if (!m.has_plan)
    throw Error("step executor: run() without a plan (no set_plan() yet, or the last one failed in its upload)");
  cuda::AttnParams a = m.attn;
  cuda::MergeParams mg = m.merge;
  cuda::set_run_tensors(m.shape, args, a, mg);
  const cudaAccessPolicyWindow* l2_window = m.l2_window.num_bytes ? &m.l2_window : nullptr;
  // A captured run launches the graph's launches (every grid unless
  // set_graph_launches() chose fewer) and the merge: the kernels read the
  // plan's counts on the device, and a launch also runs the units of the plan
  // launches after it that the graph leaves out (they hold fewer rows), so
  // the graph holds for any later plan. Launch 0 is always recorded: last,
  // where the mask leaves it out (a fallback for plans that need it; empty,
  // it then holds no SM while the others run). An eager run knows the plan
  // in force (set_plan packed it on the host): it launches only the grids
  // that have units and the merge only for merges, on a grid of their number
  // (launch_merge launches nothing for none). Without merges no attention CTA
  // counts itself, eager or captured: they read the plan's merge count on the
  // device (AttnParams::num_merges_dev).
  const bool captured = stream_is_capturing(stream), eager = m.skip_unused_launches && !captured;
  uint32_t launched = captured ? m.graph_launches | 1u : m.all_launches();
  if (eager) {
    mg.num_merges = m.plan_merges();
    launched = 0;
    for (size_t i = 0; i < m.launches.size(); ++i) launched |= m.plan_uses_launch(i) ? 1u << i : 0u;
  }
  uint32_t attention_ctas = 0;
  const auto launch = [&](size_t i) {
    const cuda::Launch& l = m.launches[i];
    cuda::AttnParams lp = a;
    lp.launch_index = int32_t(i);
    // Up to the next launch launched: those between have no units (eager)
    // or are left out of the graph.
    const uint32_t after = launched >> (i + 1);
    lp.launch_last = after ? int32_t(i) + std::countr_zero(after) : int32_t(m.launches.size()) - 1;
    lp.num_items = 0;  // read from counts on the device
    lp.work = l.persistent ? reinterpret_cast<unsigned int*>(m.workspace.as<uint8_t>() + l.work_offset) : nullptr;
    lp.stages = l.stages;
    void* kargs[] = {&lp};
    // Chained to the attention launch before it; the first waits for the plan's upload.
    const cuda::LaunchConfig lc(dim3(unsigned(l.grid)), dim3(l.kernel.threads), size_t(l.smem), stream,
                                m.chained && attention_ctas > 0, l2_window);
    check_cuda(cudaLaunchKernelExC(&lc.cfg, l.kernel.kernel, kargs), "step executor: attention launch");
    attention_ctas += uint32_t(l.grid);
  };
  const bool first_last = captured && !(m.graph_launches & 1u);
  for (size_t i = first_last ? 1 : 0; i < m.launches.size(); ++i)
    if (launched >> i & 1) launch(i);
  if (first_last) launch(0);
  mg.attention_ctas = attention_ctas;
  cuda::launch_merge(m.shape.dtype, m.shape.heads.head_dim, mg, stream, m.chained && attention_ctas > 0, l2_window);
}

}  // namespace treeattn
