// CudaExecutor: plan-time packing and upload of the plan + page table, the
// partial workspace, and the run-time launch sequence (attention launches per
// tile config, chained in one stream or forked over internal streams, then the
// merge). Also the RAII device buffer and the device-tensor helper of
// cuda_executor.hpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "exec/cuda/attention_params.hpp"
#include "exec/cuda/kernels.hpp"
#include "exec/cuda/plan_upload.hpp"
#include "treeattn/cuda_executor.hpp"

namespace treeattn {

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw Error(std::string(what) + ": " + cudaGetErrorString(status) + " (" + std::to_string(int(status)) + ")");
}

// ---- DeviceBuffer -------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0)
    check_cuda(cudaMalloc(&ptr_, bytes), ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor; a failure here leaks nothing more
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

// ---- DeviceTensors ------------------------------------------------------------

namespace {
DeviceBuffer upload_bytes(const std::vector<uint8_t>& h, const char* what) {
  DeviceBuffer d(h.size());
  if (!h.empty()) check_cuda(cudaMemcpy(d.get(), h.data(), h.size(), cudaMemcpyHostToDevice), what);
  return d;
}
}  // namespace

DeviceTensors DeviceTensors::upload(const HostTensors& h) {
  DeviceTensors d;
  d.dtype = h.dtype;
  d.k_scale = h.k_scale;
  d.v_scale = h.v_scale;
  d.q = upload_bytes(h.q, "upload q");
  d.k = upload_bytes(h.k, "upload k");
  d.v = upload_bytes(h.v, "upload v");
  d.out = upload_bytes(h.out, "upload out");
  return d;
}

void DeviceTensors::download_out(HostTensors& h) const {
  if (h.out.size() != out.size())
    throw Error("download_out: host out has " + std::to_string(h.out.size()) + " bytes, device " +
                std::to_string(out.size()));
  if (!h.out.empty()) check_cuda(cudaMemcpy(h.out.data(), out.get(), out.size(), cudaMemcpyDeviceToHost), "download out");
}

void DeviceTensors::poison_out(cudaStream_t stream) const {
  if (out.size()) check_cuda(cudaMemsetAsync(out.get(), 0xff, out.size(), stream), "poison out");
}

AttentionArgs DeviceTensors::args(float scale) const {
  AttentionArgs a{q.get(), k.get(), v.get(), out.get(), scale};
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  return a;
}

// ---- CudaExecutor -------------------------------------------------------------

namespace {

// Lays out arrays in one buffer, each 16-byte aligned, and remembers where.
class Packer {
 public:
  template <class T>
  size_t add(const T* data, size_t count) {
    size_t off = (size_ + 15) & ~size_t(15);
    items_.push_back({off, static_cast<const void*>(data), count * sizeof(T)});
    size_ = off + count * sizeof(T);
    return off;
  }
  template <class T>
  size_t add(const std::vector<T>& v) { return add(v.data(), v.size()); }
  size_t size() const { return std::max<size_t>(size_, 16); }
  void write(uint8_t* dst) const {
    for (const Item& it : items_)
      if (it.bytes) std::memcpy(dst + it.offset, it.src, it.bytes);
  }

 private:
  struct Item {
    size_t offset;
    const void* src;
    size_t bytes;
  };
  std::vector<Item> items_;
  size_t size_ = 0;
};

#if defined(TREEATTN_CTA_TRACE)
constexpr bool kCtaTraceCompiled = true;
#else
constexpr bool kCtaTraceCompiled = false;
#endif

}  // namespace

using cuda::Launch;

struct CudaExecutor::Impl {
  cuda::TensorShape shape;
  DType dtype;
  int head_dim, num_kv_heads;
  DeviceBuffer plan_buf, workspace;
  std::vector<Launch> launches;
  cuda::AttnParams attn{};  // plan pointers filled at plan time, tensors per run
  cuda::MergeParams merge{};
  bool chained = false;           // launches after the first use programmatic dependent launch
  cudaAccessPolicyWindow l2_window{};  // CudaExecutorOptions::l2_persistent_plan (0 bytes: none)
  std::vector<cudaStream_t> aux;  // aux[i] runs launches[i] (stream_per_tile_config, several launches)
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> join;

  DeviceBuffer trace;  // CudaExecutorOptions::trace: kTracePoints stamps per CTA, attention then merge
  int64_t attention_ctas = 0, merge_ctas = 0;

  ~Impl() {
    for (cudaEvent_t e : join) cudaEventDestroy(e);
    if (fork) cudaEventDestroy(fork);
    for (cudaStream_t s : aux) cudaStreamDestroy(s);
  }
};

CudaExecutor::CudaExecutor(const Workload& w, const Plan& p, const CudaExecutorOptions& o)
    : impl_(std::make_unique<Impl>()) {
  validate_plan(w, p);
  Impl& m = *impl_;
  m.shape = {w.layout.dtype, w.layout.kv_type(), w.heads, w.layout.page_size, w.layout.num_pages};
  m.dtype = w.layout.dtype;
  m.head_dim = w.heads.head_dim;
  m.num_kv_heads = w.heads.num_kv_heads;
  if (m.dtype != DType::fp16 && m.dtype != DType::bf16)
    throw Error("cuda executor: dtype " + std::string(to_string(m.dtype)) + " is not supported (fp16, bf16)");

  // The tree's page table: every node's pages, concatenated.
  std::vector<int32_t> node_page_offset(w.tree.nodes.size() + 1, 0), page_ids;
  for (size_t v = 0; v < w.tree.nodes.size(); ++v) {
    const auto& pages = w.tree.nodes[v].pages;
    page_ids.insert(page_ids.end(), pages.begin(), pages.end());
    node_page_offset[v + 1] = int32_t(page_ids.size());
  }

  // Kernel-side unit descriptors and segment records (attention_params.hpp).
  const int U = p.num_units();
  std::vector<cuda::UnitDesc> desc(static_cast<size_t>(U));
  std::vector<cuda::SegDesc> segs(p.segments.size());
  cuda::build_unit_descs(w, p, node_page_offset.data(), desc.data(), segs.data());

  // Units grouped by tile config, longest first within each group (the
  // longest CTAs start first, so the tail is short ones).
  std::vector<cuda::UnitDesc> unit_order;
  unit_order.reserve(U);
  const cuda::DeviceLimits dl = cuda::DeviceLimits::current();
  const int num_sms = dl.num_sms;
  // The tile each unit runs with: the plan's, except that a launch of the
  // n = 64 m = 16 tile whose units all have at most 32 tokens (a tree's short
  // leaves, from planners that only count rows) runs the m = 16 n = 32 tile:
  // 2 warps and half the shared memory per CTA, so 8 instead of 4 of these
  // latency-bound CTAs share an SM, and half of each 64-token tile is no
  // longer copied and multiplied as zeros. It joins the plan's own m16n32
  // units (PAT's tile selector) in one launch.
  constexpr int kTile16 = tile_index(16, kDefaultKvTile), kTile16Short = tile_index(16, 32);
  static_assert(kTile16 >= 0 && kTile16Short >= 0, "the m = 16 tiles with n = 64 and n = 32 must be compiled");
  std::vector<uint8_t> run_tile(p.unit_tile);
  {
    bool any = false, all_short = true;
    for (int u = 0; u < U; ++u)
      if (p.unit_tile[u] == kTile16) {
        any = true;
        all_short = all_short && desc[u].len <= 32;
      }
    if (o.short_m16 && any && all_short)
      for (uint8_t& t : run_tile)
        if (t == kTile16) t = uint8_t(kTile16Short);
  }
  // Masked units of the 128-row tile run its skip variant where one is
  // compiled (a launch of their own): its warpgroups skip the masked K/V
  // tiles none of their rows see, which the plain loop would compute as -inf
  // scores; unmasked units keep the plain loop, whose schedule the skip's
  // test would slow.
  constexpr int kTile128 = tile_index(kMaxTileRows, kDefaultKvTile);
  static_assert(kTile128 >= 0, "the 128-row tile must be compiled");
  const cuda::KernelEntry skip_kernel =
      o.skip_unseen ? cuda::find_attention_skip_kernel(m.dtype, m.shape.kv_dtype, m.head_dim) : cuda::KernelEntry{};
  for (int group = 0; group <= int(kTileConfigs.size()); ++group) {  // the tiles, then the skip variant
    const bool skip = group == int(kTileConfigs.size());
    const int tile = skip ? kTile128 : group;
    if (skip && !skip_kernel.kernel) break;
    const auto in_group = [&](int u) {
      return run_tile[u] == tile && (tile != kTile128 || !skip_kernel.kernel || (desc[u].any_missing != 0) == skip);
    };
    const size_t first = unit_order.size();
    for (int u = 0; u < U; ++u)
      if (in_group(u)) unit_order.push_back(desc[u]);
    if (unit_order.size() == first) continue;
    std::stable_sort(unit_order.begin() + first, unit_order.end(),
                     [](const cuda::UnitDesc& a, const cuda::UnitDesc& b) { return a.len > b.len; });
    Launch l{skip ? skip_kernel : cuda::find_attention_kernel(m.dtype, m.shape.kv_dtype, m.head_dim, tile),
             int32_t(first), int32_t(unit_order.size() - first)};
    if (int64_t(l.num_units) * m.num_kv_heads > int64_t(INT32_MAX))
      throw Error("cuda executor: " + std::to_string(l.num_units) + " units x " + std::to_string(m.num_kv_heads) +
                  " kv heads exceed the grid");
    l.max_len = unit_order[first].len;
    cuda::set_kernel_attributes(l.kernel, dl);
    m.launches.push_back(l);
  }
  for (Launch& l : m.launches)
    cuda::choose_stages(l, int64_t(l.num_units) * m.num_kv_heads, dl, m.launches.size() > 1);
  // A launch with more items than fit on the GPU at once, of units longer
  // than one K/V tile, runs one wave of CTAs that claim items as they finish
  // (attention_kernel.cuh); its CTAs fetch the next descriptor during an
  // item's epilogue, and the merge launch may start (and load its plan data)
  // as soon as the wave is resident. Units of one K/V tile keep one CTA per
  // item: most of such an item is the wait for its one tile, the same either
  // way, and they measured no faster persistent (docs/cuda.md, "Persistent
  // launches").
  for (Launch& l : m.launches) {
    const int64_t items = int64_t(l.num_units) * m.num_kv_heads;
    const int64_t wave = cuda::wave_ctas(l, dl);
    l.persistent = o.persistent && l.kernel.persistent && items > wave && l.max_len > l.kernel.n;
    l.grid = l.persistent ? wave : items;
  }
  // The launch with the longest CTAs goes first and on the highest-priority
  // stream: its CTAs must not queue behind a grid of short ones (the tail).
  std::stable_sort(m.launches.begin(), m.launches.end(),
                   [](const Launch& a, const Launch& b) { return a.max_len > b.max_len; });

  std::vector<cuda::MergeDesc> merges(size_t(w.num_queries()));
  merges.resize(size_t(cuda::build_merge_descs(p, w.num_queries(), merges.data())));

  Packer pk;
  const size_t o_units = pk.add(unit_order);
  const size_t o_segs = pk.add(segs);
  const size_t o_eq = pk.add(p.entry_query);
  const size_t o_em = pk.add(p.entry_mask);
  const size_t o_es = pk.add(p.entry_slot);
  const size_t o_pages = pk.add(page_ids);
  const size_t o_qs = pk.add(p.query_slots);
  const size_t o_mq = pk.add(merges);

  // Workspace: fp32 partials, their lse, two counters of chained runs and
  // two per persistent launch (zeroed with the upload below; every run
  // leaves them zero).
  const int H = w.heads.num_qo_heads, D = w.heads.head_dim;
  const size_t o_bytes = size_t(p.num_slots) * H * D * sizeof(float);
  const size_t lse_bytes = size_t(p.num_slots) * H * sizeof(float);
  const size_t counters = (o_bytes + lse_bytes + 15) / 16 * 16;
  size_t counter_bytes = 2 * sizeof(unsigned int);  // chained runs: attention CTAs done, merge CTAs past the wait
  for (Launch& l : m.launches)
    if (l.persistent) {
      l.work_offset = counters + counter_bytes;
      counter_bytes += 2 * sizeof(unsigned int);
    }
  m.workspace = DeviceBuffer(counters + counter_bytes);

  // One pinned staging buffer, one copy.
  void* host = nullptr;
  check_cuda(cudaMallocHost(&host, pk.size()), "cuda executor: pinned plan buffer");
  std::unique_ptr<void, decltype(&cudaFreeHost)> host_guard(host, &cudaFreeHost);
  pk.write(static_cast<uint8_t*>(host));
  m.plan_buf = DeviceBuffer(pk.size());
  cudaStream_t up = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking), "cuda executor: upload stream");
  cudaError_t st = cudaMemcpyAsync(m.plan_buf.get(), host, pk.size(), cudaMemcpyHostToDevice, up);
  if (st == cudaSuccess) st = cudaMemsetAsync(m.workspace.as<uint8_t>() + counters, 0, counter_bytes, up);
  if (st == cudaSuccess) st = cudaStreamSynchronize(up);
  cudaStreamDestroy(up);
  check_cuda(st, "cuda executor: plan upload");

  if (o.l2_persistent_plan) m.l2_window = cuda::plan_l2_window(m.plan_buf.get(), m.plan_buf.size());

  auto at = [&](size_t off) { return static_cast<const uint8_t*>(m.plan_buf.get()) + off; };
  cuda::AttnParams& a = m.attn;
  a.partial_o = m.workspace.as<float>();
  a.partial_lse = reinterpret_cast<float*>(m.workspace.as<uint8_t>() + o_bytes);
  a.units = reinterpret_cast<const cuda::UnitDesc*>(at(o_units));
  a.segs = reinterpret_cast<const cuda::SegDesc*>(at(o_segs));
  a.entry_query = reinterpret_cast<const int32_t*>(at(o_eq));
  a.entry_mask = reinterpret_cast<const uint64_t*>(at(o_em));
  a.entry_slot = reinterpret_cast<const int32_t*>(at(o_es));
  a.page_ids = reinterpret_cast<const int32_t*>(at(o_pages));
  a.num_qo_heads = H;
  a.num_kv_heads = w.heads.num_kv_heads;
  a.group = w.heads.group_size();
  a.page_size = w.layout.page_size;
  a.page_divisor = cuda::Divisor::of(a.page_size);
  a.group_divisor = cuda::Divisor::of(a.group);

  cuda::MergeParams& mg = m.merge;
  mg.partial_o = a.partial_o;
  mg.partial_lse = a.partial_lse;
  mg.merges = reinterpret_cast<const cuda::MergeDesc*>(at(o_mq));
  mg.query_slots = reinterpret_cast<const int32_t*>(at(o_qs));
  mg.num_merges = int32_t(merges.size());
  mg.max_slots = 0;
  for (const cuda::MergeDesc& md : merges) mg.max_slots = std::max(mg.max_slots, md.count);
  mg.num_qo_heads = H;
  mg.num_sms = num_sms;

  for (Launch& l : m.launches) {
    l.first_cta = m.attention_ctas;
    m.attention_ctas += l.grid;
  }
  m.merge_ctas = mg.num_merges ? cuda::merge_ctas(mg) : 0;
  if (o.trace) {
    if (!kCtaTraceCompiled)
      throw Error("cuda executor: trace needs a library built with -DTREEATTN_CTA_TRACE=ON");
    m.trace = DeviceBuffer(size_t(m.attention_ctas + m.merge_ctas) * cuda::kTracePoints * sizeof(uint64_t));
    check_cuda(cudaMemset(m.trace.get(), 0, m.trace.size()), "cuda executor: trace buffer");
    a.trace = m.trace.as<unsigned long long>();
    mg.trace = a.trace + m.attention_ctas * cuda::kTracePoints;
  }

  // Tile configs run concurrently. Chained (default, sm_90+, plans with a
  // merge): in the caller's stream, each launch after the first (and the
  // merge) with programmatic stream serialization, so it may start as soon as
  // every CTA of the launch before it has (attention_kernel.cuh); the merge
  // then waits on a counter of finished attention CTAs (merge_kernel.cu). The
  // first launch is an ordinary one: it overwrites the partials the previous
  // run's merge read. Otherwise, with several launches, each gets an
  // internal stream, forked from and joined back into the caller's stream
  // with events (which also works under stream capture); stream priorities
  // follow the launch order (longest CTAs highest).
  m.chained = !o.stream_per_tile_config && dl.major >= 9 && mg.num_merges > 0 && !m.launches.empty();
  if (m.chained) {
    unsigned int* c = reinterpret_cast<unsigned int*>(m.workspace.as<uint8_t>() + counters);
    a.ctas_done = mg.ctas_done = c;
    mg.merge_ctas_past = c + 1;
    if (m.attention_ctas > int64_t(UINT32_MAX))
      throw Error("cuda executor: " + std::to_string(m.attention_ctas) +
                  " attention CTAs per run exceed the chained counter");
    mg.attention_ctas = uint32_t(m.attention_ctas);
  } else if (m.launches.size() > 1) {
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check_cuda(cudaEventCreateWithFlags(&m.fork, cudaEventDisableTiming), "cudaEventCreate");
    for (size_t i = 0; i < m.launches.size(); ++i) {
      cudaStream_t s = nullptr;
      const int prio = std::min(least, greatest + int(i));  // numerically lower = higher priority
      check_cuda(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, prio), "cudaStreamCreateWithPriority");
      m.aux.push_back(s);
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      m.join.push_back(e);
    }
  }
}

CudaExecutor::~CudaExecutor() = default;
CudaExecutor::CudaExecutor(CudaExecutor&&) noexcept = default;
CudaExecutor& CudaExecutor::operator=(CudaExecutor&&) noexcept = default;

size_t CudaExecutor::plan_bytes() const { return impl_->plan_buf.size(); }
size_t CudaExecutor::workspace_bytes() const { return impl_->workspace.size(); }
int CudaExecutor::num_launches() const { return int(impl_->launches.size()); }

std::string CudaExecutor::describe() const {
  std::string out;
  for (const Launch& l : impl_->launches)
    out += (out.empty() ? "" : "; ") + std::string("m") + std::to_string(l.kernel.m) +
           (l.kernel.n != 64 ? "n" + std::to_string(l.kernel.n) : std::string()) +
           (l.kernel.skips_unseen ? " skip" : "") + " ctas=" +
           std::to_string(l.grid) + (l.persistent ? " persistent" : "") + " stages=" + std::to_string(l.stages) +
           " smem=" + std::to_string(l.smem / 1024) + "K maxlen=" + std::to_string(l.max_len);
  if (impl_->merge.num_merges) out += "; merge " + std::to_string(impl_->merge.num_merges) + " queries";
  return out;
}

std::string CudaExecutor::trace_report() const {
  const Impl& m = *impl_;
  if (!m.trace.get()) throw Error("cuda executor: trace_report needs CudaExecutorOptions::trace");
  constexpr int P = cuda::kTracePoints;
  std::vector<uint64_t> t(m.trace.size() / sizeof(uint64_t));
  check_cuda(cudaMemcpy(t.data(), m.trace.get(), m.trace.size(), cudaMemcpyDeviceToHost), "cuda executor: trace read");
  const int64_t ctas = m.attention_ctas + m.merge_ctas;
  uint64_t t0 = UINT64_MAX;
  for (int64_t c = 0; c < ctas; ++c) t0 = std::min(t0, t[c * P + cuda::kTraceStart]);
  if (ctas == 0 || t0 == 0) return "no traced run\n";
  // p50 / max (or p90) of a phase over the CTAs of one launch, in µs.
  auto stat = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
  };
  std::string out;
  auto line = [&](const std::string& name, int64_t first, int64_t n, bool merge) {
    std::vector<double> start, end, wait, loop, store, count, life;
    for (int64_t c = first; c < first + n; ++c) {
      const uint64_t* s = &t[c * P];
      auto us = [](uint64_t a, uint64_t b) { return (double(b) - double(a)) / 1000.0; };
      start.push_back(us(t0, s[cuda::kTraceStart]));
      end.push_back(us(t0, s[cuda::kTraceDone]));
      wait.push_back(us(s[cuda::kTraceStart], s[cuda::kTraceFirstTile]));
      loop.push_back(us(s[cuda::kTraceFirstTile], s[cuda::kTraceLoopDone]));
      store.push_back(us(s[cuda::kTraceLoopDone], s[cuda::kTraceStored]));
      count.push_back(us(s[cuda::kTraceStored], s[cuda::kTraceDone]));
      life.push_back(us(s[cuda::kTraceStart], s[cuda::kTraceDone]));
    }
    char buf[400];
    if (merge)
      std::snprintf(buf, sizeof buf,
                    "  %-10s %6lld CTAs  start %6.2f..%6.2f  end p50 %6.2f max %6.2f | wait %5.2f/%5.2f | "
                    "merge %5.2f/%5.2f\n",
                    name.c_str(), (long long)n, stat(start, 0), stat(start, 1), stat(end, .5), stat(end, 1),
                    stat(wait, .5), stat(wait, .9), stat(store, .5), stat(store, .9));
    else
      std::snprintf(buf, sizeof buf,
                    "  %-10s %6lld CTAs  start %6.2f..%6.2f  end p50 %6.2f max %6.2f | to first tile %5.2f/%5.2f | "
                    "kv loop %5.2f/%5.2f | stores %5.2f/%5.2f | count %5.2f/%5.2f | life %5.2f/%5.2f\n",
                    name.c_str(), (long long)n, stat(start, 0), stat(start, 1), stat(end, .5), stat(end, 1),
                    stat(wait, .5), stat(wait, .9), stat(loop, .5), stat(loop, .9), stat(store, .5), stat(store, .9),
                    stat(count, .5), stat(count, .9), stat(life, .5), stat(life, .9));
    out += buf;
  };
  for (const Launch& l : m.launches)
    line("m" + std::to_string(l.kernel.m) + "n" + std::to_string(l.kernel.n) + " s" + std::to_string(l.stages) +
             (l.persistent ? " p" : "") + (l.kernel.skips_unseen ? " skip" : ""),
         l.first_cta, l.grid, false);
  if (m.merge_ctas) line("merge", m.attention_ctas, m.merge_ctas, true);
  return out;
}

void CudaExecutor::run(const AttentionArgs& args, cudaStream_t stream) const {
  const Impl& m = *impl_;
  cuda::AttnParams a = m.attn;
  cuda::MergeParams mg = m.merge;
  cuda::set_run_tensors(m.shape, args, a, mg);

  const cudaAccessPolicyWindow* l2_window = m.l2_window.num_bytes ? &m.l2_window : nullptr;
  auto launch = [&](const Launch& l, cudaStream_t s, bool chained) {
    cuda::AttnParams lp = a;
    lp.units = a.units + l.first_unit;
    lp.num_items = l.num_units * m.num_kv_heads;
    lp.work = l.persistent ? reinterpret_cast<unsigned int*>(m.workspace.as<uint8_t>() + l.work_offset) : nullptr;
    lp.stages = l.stages;
    lp.trace_first_cta = l.first_cta;
    void* kargs[] = {&lp};
    const cuda::LaunchConfig lc(dim3(unsigned(l.grid)), dim3(l.kernel.threads), size_t(l.smem), s, chained,
                                l2_window);
    check_cuda(cudaLaunchKernelExC(&lc.cfg, l.kernel.kernel, kargs), "cuda executor: attention launch");
  };
  if (m.aux.empty()) {
    for (size_t i = 0; i < m.launches.size(); ++i) launch(m.launches[i], stream, m.chained && i > 0);
  } else {
    check_cuda(cudaEventRecord(m.fork, stream), "cudaEventRecord(fork)");
    for (size_t i = 0; i < m.launches.size(); ++i) {
      check_cuda(cudaStreamWaitEvent(m.aux[i], m.fork, 0), "cudaStreamWaitEvent(fork)");
      launch(m.launches[i], m.aux[i], false);
      check_cuda(cudaEventRecord(m.join[i], m.aux[i]), "cudaEventRecord(join)");
    }
    for (size_t i = 0; i < m.launches.size(); ++i)
      check_cuda(cudaStreamWaitEvent(stream, m.join[i], 0), "cudaStreamWaitEvent(join)");
  }

  cuda::launch_merge(m.dtype, m.head_dim, mg, stream, m.chained, l2_window);
}

}  // namespace treeattn
