// GPU timing of plans (bench.hpp): device-generated inputs, L2 flush, event
// timing, graph replay, in-process HBM bandwidth, and the check of sampled
// queries against the fp64 reference on a compact copy of their context.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "treeattn/bench.hpp"
#include "treeattn/cuda_executor.hpp"
#include "treeattn/numeric.hpp"
#include "exec/cuda/primitives/wgmma.cuh"

namespace treeattn {

namespace {

// uniform(-1, 1) from a counter hash (splitmix64), written as 16-bit floats.
__global__ void fill_uniform_kernel(void* p, int64_t n, uint64_t seed, DType t) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (2.f / 16777216.f) - 1.f;
    if (t == DType::fp8_e4m3)
      static_cast<__nv_fp8_storage_t*>(p)[i] = __nv_fp8_e4m3(u).__x;
    else
      static_cast<uint16_t*>(p)[i] =
          t == DType::bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(u)) : __half_as_ushort(__float2half_rn(u));
  }
}

void fill_uniform(void* p, size_t bytes, uint64_t seed, DType t) {
  const int64_t n = int64_t(bytes / dtype_size(t));
  if (n == 0) return;
  fill_uniform_kernel<<<1024, 256>>>(p, n, seed, t);
  check_cuda(cudaGetLastError(), "bench: fill inputs");
}

// Reads a[0, na) then b[0, nb) once. The L2 flush reads a buffer of twice
// the L2 size with it, so that the next run starts with no useful line in L2
// (reading, not writing: a memset would leave L2 full of dirty lines whose
// write-back the timed run would pay for); the read-only bound of bench
// (GpuTiming::read_us) reads the unique KV bytes with it. Four independent
// 16-byte loads per thread per step keep enough bytes in flight to reach HBM
// bandwidth at a few MB.
__global__ void read_once_kernel(const int4* a, int64_t na, const int4* b, int64_t nb, int* sink) {
  constexpr int kUnroll = 4;
  int4 acc = make_int4(0, 0, 0, 0);
  const int64_t n = na + nb, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n; i0 += kUnroll * stride) {
    int4 x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = i0 + k * stride;
      x[k] = i < na ? __ldcg(a + i) : i < n ? __ldcg(b + (i - na)) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) acc.x ^= x[k].x, acc.y ^= x[k].y, acc.z ^= x[k].z, acc.w ^= x[k].w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == -1) *sink = 1;  // zeros or random inputs: practically never, never elided
}

// The tensor-core rate: two warpgroups per CTA, each issuing kTensorSteps
// m64n256k16 wgmma per round from shared-memory operands that never change
// (A: its own 64x64 tile, B: a shared 256x64 tile, both K-major in the
// 128-byte swizzle of wgmma.cuh), two commit groups in flight, accumulating
// into the same registers as a GEMM main loop does. The operands are random
// (power, hence clocks, depend on the data, so zeros would overstate the rate).
constexpr int kTensorThreads = 256, kTensorSteps = 4;
constexpr int kTensorSmem = 2 * 64 * 128 + 256 * 128;  // A tiles of both warpgroups + B tile

template <class T>
__global__ void __launch_bounds__(kTensorThreads, 1) tensor_rate_kernel(int rounds, uint64_t seed, float* sink) {
  __shared__ __align__(1024) uint8_t smem[kTensorSmem];
  uint16_t* e = reinterpret_cast<uint16_t*>(smem);
  for (int i = threadIdx.x; i < kTensorSmem / 2; i += kTensorThreads) {
    uint64_t z = (seed + uint64_t(i)) * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    const float u = float(z >> 40) * (2.f / 16777216.f) - 1.f;
    e[i] = std::is_same_v<T, __nv_bfloat16> ? __bfloat16_as_ushort(__float2bfloat16_rn(u))
                                             : __half_as_ushort(__float2half_rn(u));
  }
  cuda::fence_proxy_async();
  __syncthreads();
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t a = base + (threadIdx.x / 128) * 64 * 128, b = base + 2 * 64 * 128;
  float d[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
  for (int r = 0; r < rounds; ++r) {
    cuda::wgmma_fence();  // as a GEMM main loop does per k-block
#pragma unroll
    for (int k = 0; k < kTensorSteps; ++k)
      cuda::Wgmma<T, 256>::ss(d, cuda::wgmma_desc(a + k * 32, 16), cuda::wgmma_desc(b + k * 32, 16), 1);
    cuda::wgmma_commit();
    cuda::wgmma_wait<1>();
  }
  cuda::wgmma_wait<0>();
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) acc += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (acc == 12345.f) *sink = acc;  // keeps the accumulators live; practically never true
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Spins until the host sets flag[0], at most max_ns (then counts a timeout in
// flag[1] and returns, so that a host that never releases cannot hang the GPU).
__global__ void wait_for_host_kernel(const volatile int* flag, int* timeouts, uint64_t max_ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (flag[0] == 0) {
    __nanosleep(200);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > max_ns) {
      atomicAdd(timeouts, 1);
      return;
    }
  }
}

// Holds a stream until the host has enqueued the whole of a timed run, as
// nvbench's blocking kernel does: the flush, the start event, the run's
// launches and the stop event then follow one another on the GPU with no
// wait for the host, so the time between the events is the GPU's alone. A
// run's host enqueue (its launches' driver calls) is otherwise timed wherever
// it outlasts what is ahead of it on the stream: always with --no-flush, and
// with the flush when the host is slow or busy.
class HostGate {
 public:
  HostGate() {
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&host_), 2 * sizeof(int), cudaHostAllocMapped),
               "bench: host gate");
    host_[0] = host_[1] = 0;
    check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), host_, 0), "bench: host gate pointer");
  }
  ~HostGate() { cudaFreeHost(host_); }
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;
  // Enqueues the wait; the stream's earlier work must be done (the timer
  // synchronises on each run's stop event), so no earlier wait reads the flag.
  void hold(cudaStream_t s) {
    __atomic_store_n(&host_[0], 0, __ATOMIC_SEQ_CST);
    wait_for_host_kernel<<<1, 1, 0, s>>>(dev_, dev_ + 1, kMaxWaitNs);
    check_cuda(cudaGetLastError(), "bench: host gate");
  }
  void release() { __atomic_store_n(&host_[0], 1, __ATOMIC_SEQ_CST); }
  // The waits that ran out since the last call (the host took over kMaxWaitNs
  // to enqueue a run, whose time then includes part of that); the stream must
  // be idle.
  int take_timeouts() { return __atomic_exchange_n(&host_[1], 0, __ATOMIC_SEQ_CST); }

 private:
  static constexpr uint64_t kMaxWaitNs = 1000000000;  // 1 s
  int* host_ = nullptr;
  int* dev_ = nullptr;
};

// Event pair around one enqueue, elapsed in microseconds.
struct EventTimer {
  cudaEvent_t a = nullptr, b = nullptr;
  EventTimer() {
    check_cuda(cudaEventCreate(&a), "cudaEventCreate");
    check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  // gate: held before the caller's earlier enqueues (the flush), released
  // once the stop event is enqueued.
  template <class F>
  double time_us(cudaStream_t s, F&& f, HostGate* gate = nullptr) {
    check_cuda(cudaEventRecord(a, s), "cudaEventRecord");
    f();
    check_cuda(cudaEventRecord(b, s), "cudaEventRecord");
    if (gate) gate->release();
    check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    return double(ms) * 1000.0;
  }
};

}  // namespace

bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string gpu_device_name() {
  if (!gpu_available()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "";
  return prop.name;
}

int gpu_sm_count() {
  if (!gpu_available()) return 0;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 0;
  return sms;
}

double measure_hbm_bandwidth_gbps() {
  static std::once_flag once;
  static double gbps = 0;
  std::call_once(once, [] {
    const size_t bytes = size_t(1) << 30;
    DeviceBuffer src(bytes), dst(bytes);
    check_cuda(cudaMemset(src.get(), 1, bytes), "bench: bandwidth buffer");
    EventTimer t;
    std::vector<double> us;
    for (int i = 0; i < 12; ++i) {
      const double x = t.time_us(nullptr, [&] {
        check_cuda(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, nullptr), "bench: copy");
      });
      if (i >= 2) us.push_back(x);
    }
    gbps = 2.0 * double(bytes) / (median(us) * 1e3);  // read + write
  });
  return gbps;
}

double measure_tensor_core_tflops(DType dtype) {
  if (dtype != DType::fp16 && dtype != DType::bf16) return 0;
  static std::mutex mu;
  static std::map<DType, double> rate;
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = rate.find(dtype); it != rate.end()) return it->second;
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SMs)");
  DeviceBuffer sink(16);
  constexpr int kRounds = 4096;  // ~1 ms at the H100's rate
  EventTimer t;
  std::vector<double> us;
  for (int i = 0; i < 13; ++i) {
    const double x = t.time_us(nullptr, [&] {
      if (dtype == DType::bf16)
        tensor_rate_kernel<__nv_bfloat16><<<sms, kTensorThreads>>>(kRounds, uint64_t(i), sink.as<float>());
      else
        tensor_rate_kernel<__half><<<sms, kTensorThreads>>>(kRounds, uint64_t(i), sink.as<float>());
      check_cuda(cudaGetLastError(), "bench: tensor-core rate kernel");
    });
    if (i >= 3) us.push_back(x);
  }
  const double flops = double(sms) * 2 /*warpgroups*/ * kRounds * kTensorSteps * (2.0 * 64 * 256 * 16);
  return rate[dtype] = flops / (median(us) * 1e6);
}

struct GpuBench::Impl {
  const Workload& w;
  DeviceTensors d;
  DeviceBuffer flush;
  HostGate gate;
  cudaStream_t stream = nullptr;
  double read_us = 0;  // GpuTiming::read_us, measured with the first timed plan
  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
  }
};

GpuBench::GpuBench(const Workload& w, uint64_t seed) {
  if (!gpu_available()) throw Error("bench: no CUDA device");
  impl_.reset(new Impl{w});
  Impl& m = *impl_;
  const size_t es = dtype_size(w.layout.dtype);
  if (es != 2) throw Error("bench: dtype " + std::string(to_string(w.layout.dtype)) + " has no GPU kernels");
  const size_t qb = size_t(w.num_queries()) * w.heads.num_qo_heads * w.heads.head_dim * es;
  const size_t kvb = size_t(w.layout.num_pages) * w.layout.page_size * w.heads.num_kv_heads * w.heads.head_dim *
                     dtype_size(w.layout.kv_type());
  m.d.dtype = w.layout.dtype;
  m.d.q = DeviceBuffer(qb);
  m.d.k = DeviceBuffer(kvb);
  m.d.v = DeviceBuffer(kvb);
  m.d.out = DeviceBuffer(qb);
  fill_uniform(m.d.q.get(), qb, seed * 3 + 1, w.layout.dtype);
  fill_uniform(m.d.k.get(), kvb, seed * 3 + 2, w.layout.kv_type());  // fp8: scales 1
  fill_uniform(m.d.v.get(), kvb, seed * 3 + 3, w.layout.kv_type());
  int dev = 0, l2 = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute(L2)");
  m.flush = DeviceBuffer(size_t(std::max(l2, 1 << 20)) * 2 + 16);
  check_cuda(cudaMemset(m.flush.get(), 0, m.flush.size()), "bench: flush buffer");
  check_cuda(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaDeviceSynchronize(), "bench: input generation");
}

GpuBench::~GpuBench() = default;

namespace {

// Relative L2 error of each sampled query's output against fp64 attention
// over its context; returns the worst. The sampled queries' contexts are
// copied into a compact workload (its own pages) so that the reference needs
// only their tokens on the host.
double check_sampled_queries(const Workload& w, const DeviceTensors& d, int count) {
  const int nq = w.num_queries();
  count = std::min(count, nq);
  if (count <= 0) return -1;
  const int H = w.heads.num_qo_heads, Hkv = w.heads.num_kv_heads, D = w.heads.head_dim, ps = w.layout.page_size;
  const size_t es = dtype_size(w.layout.dtype);
  const size_t page_bytes = size_t(ps) * Hkv * D * dtype_size(w.layout.kv_type()), row_bytes = size_t(H) * D * es;

  Workload sub;
  sub.name = w.name + " (sampled)";
  sub.heads = w.heads;
  sub.layout = w.layout;
  std::map<int32_t, int32_t> node_map;  // old -> new
  std::vector<int32_t> sampled, old_pages;
  for (int i = 0; i < count; ++i) sampled.push_back(int32_t(int64_t(i) * nq / count));
  for (int32_t q : sampled) {
    int32_t parent = -1;
    for (int32_t v : w.path(w.query_nodes[q])) {
      auto it = node_map.find(v);
      if (it == node_map.end()) {
        Node n;
        n.parent = parent;
        n.num_tokens = w.tree.nodes[v].num_tokens;
        for (int32_t pg : w.tree.nodes[v].pages) {
          n.pages.push_back(int32_t(old_pages.size()));
          old_pages.push_back(pg);
        }
        it = node_map.emplace(v, int32_t(sub.tree.nodes.size())).first;
        sub.tree.nodes.push_back(std::move(n));
      }
      parent = it->second;
    }
    sub.query_nodes.push_back(parent);
  }
  sub.layout.num_pages = int64_t(old_pages.size());

  HostTensors h{w.layout.dtype, {}, {}, {}, {}};
  h.kv_dtype = w.layout.kv_type();
  h.k_scale = d.k_scale;
  h.v_scale = d.v_scale;
  h.q.resize(sampled.size() * row_bytes);
  h.out.resize(sampled.size() * row_bytes);
  h.k.resize(old_pages.size() * page_bytes);
  h.v.resize(old_pages.size() * page_bytes);
  for (size_t i = 0; i < sampled.size(); ++i) {
    const size_t off = size_t(sampled[i]) * row_bytes;
    check_cuda(cudaMemcpy(h.q.data() + i * row_bytes, d.q.as<uint8_t>() + off, row_bytes, cudaMemcpyDeviceToHost),
               "bench: download q");
    check_cuda(cudaMemcpy(h.out.data() + i * row_bytes, d.out.as<uint8_t>() + off, row_bytes, cudaMemcpyDeviceToHost),
               "bench: download out");
  }
  for (size_t i = 0; i < old_pages.size(); ++i) {
    const size_t off = size_t(old_pages[i]) * page_bytes;
    check_cuda(cudaMemcpy(h.k.data() + i * page_bytes, d.k.as<uint8_t>() + off, page_bytes, cudaMemcpyDeviceToHost),
               "bench: download k");
    check_cuda(cudaMemcpy(h.v.data() + i * page_bytes, d.v.as<uint8_t>() + off, page_bytes, cudaMemcpyDeviceToHost),
               "bench: download v");
  }
  const std::vector<double> ref = reference_attention(sub, h.args());
  double worst = 0;
  const size_t per_q = size_t(H) * D;
  for (size_t i = 0; i < sampled.size(); ++i) {
    double num = 0, den = 0;
    for (size_t j = 0; j < per_q; ++j) {
      const double o = load_element(h.out.data(), w.layout.dtype, int64_t(i * per_q + j));
      if (!std::isfinite(o)) return INFINITY;
      const double r = ref[i * per_q + j];
      num += (o - r) * (o - r);
      den += r * r;
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

}  // namespace

GpuTiming GpuBench::time(const Plan& p, const BenchOptions& o) {
  Impl& m = *impl_;
  const Workload& w = m.w;
  // The executor under test, made (and the plan uploaded) before any timing.
  std::optional<CudaExecutor> ex;
  std::optional<CudaStepExecutor> step;
  if (o.step_executor) {
    if (o.trace) throw Error("bench: --trace times CudaExecutor's launches, not the step executor's");
    StepCapacity cap;
    cap.max_queries = std::max(1, w.num_queries());
    cap.max_units = std::max(1, p.num_units());
    cap.max_segments = std::max<int32_t>(1, int32_t(p.segments.size()));
    cap.max_entries = std::max<int32_t>(1, int32_t(p.entry_query.size()));
    cap.max_slots = std::max(1, p.num_slots);
    int64_t refs = 0;
    for (const Node& n : w.tree.nodes) refs += int64_t(n.pages.size());
    cap.max_page_refs = std::max<int64_t>(1, refs);
    CudaStepOptions so;
    so.l2_persistent_plan = o.l2_persistent_plan;
    so.skip_unseen = o.skip_unseen;
    so.tiles = o.step_tiles;
    if (o.step_plan_tiles) {
      so.tiles.clear();
      for (int t = int(kTileConfigs.size()) - 1; t >= 0; --t)
        if (std::find(p.unit_tile.begin(), p.unit_tile.end(), uint8_t(t)) != p.unit_tile.end()) so.tiles.push_back(t);
      std::stable_sort(so.tiles.begin(), so.tiles.end(),
                       [](int a, int b) { return kTileConfigs[a].m > kTileConfigs[b].m; });
    }
    step.emplace(w.heads, w.layout, cap, so);
    step->set_plan(w, p, m.stream);
    if (o.step_graph_plan_launches) step->set_graph_launches(step->plan_launches() | (o.step_graph_first ? 1u : 0u));
    check_cuda(cudaStreamSynchronize(m.stream), "bench: step executor upload");
  } else {
    CudaExecutorOptions eo;
    eo.short_m16 = !o.exact_tiles;
    eo.stream_per_tile_config = o.streams;
    eo.persistent = o.persistent;
    eo.trace = o.trace;
    eo.l2_persistent_plan = o.l2_persistent_plan;
    eo.skip_unseen = o.skip_unseen;
    ex.emplace(w, p, eo);
  }
  const AttentionArgs args = m.d.args();
  const auto run = [&] { ex ? ex->run(args, m.stream) : step->run(args, m.stream); };
  const PlanSummary s = summarize(w, p);

  GpuTiming r;
  r.device = gpu_device_name();
  r.bandwidth_gbps = measure_hbm_bandwidth_gbps();
  r.kv_bytes = s.kv_bytes;
  r.unique_kv_bytes = s.unique_kv_bytes;
  r.io_bytes = int64_t(m.d.q.size() + m.d.out.size());
  r.partial_bytes = s.partial_bytes;
  r.floor_us = double(r.unique_kv_bytes + r.io_bytes) / (r.bandwidth_gbps * 1e3);
  r.flops = s.flops;
  r.tensor_tflops = measure_tensor_core_tflops(w.layout.dtype);
  r.compute_floor_us = r.tensor_tflops > 0 ? double(r.flops) / (r.tensor_tflops * 1e6) : 0;
  r.roofline_us = std::max(r.floor_us, r.compute_floor_us);
  r.units = p.num_units();
  r.slots = p.num_slots;
  r.launches = ex ? ex->num_launches() : step->num_eager_launches();
  r.launches_graph = ex ? ex->num_launches() : std::popcount(step->graph_launches() | 1u) + 1;
  r.launch_info = ex ? ex->describe() : "step executor: " + step->describe();

  // Verification first, on a poisoned output.
  m.d.poison_out(m.stream);
  run();
  check_cuda(cudaStreamSynchronize(m.stream), "bench: verification run");
  if (o.verify_queries > 0) r.max_rel_err = check_sampled_queries(w, m.d, o.verify_queries);

  EventTimer t;
  int* sink = reinterpret_cast<int*>(m.flush.as<uint8_t>() + m.flush.size() - 16);  // the flush buffer's last 16 bytes
  // One timed run, in microseconds: the stream held until the host has
  // enqueued all of it (m.gate), the L2 flush, then `enqueue` between the events.
  auto timed_run = [&](auto&& enqueue) {
    m.gate.hold(m.stream);
    if (o.flush_l2) {
      read_once_kernel<<<264, 512, 0, m.stream>>>(m.flush.as<int4>(), int64_t(m.flush.size() - 16) / 16, nullptr, 0,
                                                   sink);
      check_cuda(cudaGetLastError(), "bench: L2 flush");
    }
    return t.time_us(m.stream, enqueue, &m.gate);
  };
  std::vector<double> us;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    const double x = timed_run(run);
    if (i >= o.warmup) us.push_back(x);
  }
  r.us = median(us);
  if (o.flush_l2 && m.read_us == 0 && r.unique_kv_bytes >= 32) {
    // The unique KV bytes, half from each pool (the K and V bytes of the tree's
    // tokens), read from the start of the pools: contiguous, so the bound is
    // if anything optimistic against the paged gather of the runs. The best
    // of a few grid sizes (the fastest plain read, not one guess at it).
    const int64_t half = std::min<int64_t>(r.unique_kv_bytes / 2, int64_t(m.d.k.size())) / 16;
    int dev = 0, sms = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SMs)");
    double best = INFINITY;
    for (const int per_sm : {2, 4, 8}) {
      std::vector<double> rus;
      for (int i = 0; i < o.warmup + o.iters; ++i) {
        const double x = timed_run([&] {
          read_once_kernel<<<sms * per_sm, 256, 0, m.stream>>>(m.d.k.as<int4>(), half, m.d.v.as<int4>(), half, sink);
          check_cuda(cudaGetLastError(), "bench: read-once kernel");
        });
        if (i >= o.warmup) rus.push_back(x);
      }
      best = std::min(best, median(rus));
    }
    m.read_us = best;
  }
  r.read_us = m.read_us;
  r.us_min = *std::min_element(us.begin(), us.end());

  if (o.graph) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    check_cuda(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "bench: begin capture");
    run();
    check_cuda(cudaStreamEndCapture(m.stream, &graph), "bench: end capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "bench: graph instantiate");
    std::vector<double> gus;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      const double x = timed_run([&] { check_cuda(cudaGraphLaunch(exec, m.stream), "bench: graph launch"); });
      if (i >= o.warmup) gus.push_back(x);
    }
    r.us_graph = median(gus);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  check_cuda(cudaStreamSynchronize(m.stream), "bench: timing");
  r.host_gate_timeouts = m.gate.take_timeouts();
  if (r.host_gate_timeouts > 0)
    std::fprintf(stderr, "bench: %d timed runs waited over 1 s for the host to enqueue them; their times include part of it\n",
                 r.host_gate_timeouts);
  if (o.trace) r.trace = ex->trace_report();
  return r;
}

std::optional<GpuTiming> time_plan_on_gpu(const Workload& w, const Plan& p, const BenchOptions& o) {
  if (!gpu_available()) return std::nullopt;
  GpuBench b(w, o.seed);
  return b.time(p, o);
}

}  // namespace treeattn
