// Host-side preparation shared by the CUDA executors (plan_upload.hpp): unit,
// segment and merge descriptors, device limits, pipeline depths, and the
// checks of a run's tensors.
#include "exec/cuda/plan_upload.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "treeattn/cuda_executor.hpp"

namespace treeattn::cuda {

DeviceLimits DeviceLimits::current() {
  DeviceLimits d;
  check_cuda(cudaGetDevice(&d.device), "cudaGetDevice");
  auto attr = [&](int& v, cudaDeviceAttr a, const char* what) { check_cuda(cudaDeviceGetAttribute(&v, a, d.device), what); };
  attr(d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  attr(d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
       "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
  attr(d.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, "cudaDeviceGetAttribute(ReservedSharedMemoryPerBlock)");
  attr(d.num_sms, cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(MultiProcessorCount)");
  attr(d.major, cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  return d;
}

void build_unit_descs(const Workload& w, const Plan& p, const int32_t* node_page_offset, UnitDesc* desc,
                      SegDesc* segs) {
  // Written through locals: desc and segs may alias the plan's arrays for
  // all the compiler knows, which would make it reload them every store.
  const int U = p.num_units();
  for (int u = 0; u < U; ++u) {
    const int32_t seg_off = p.unit_segment_offset[u], nseg = p.unit_num_segments(u);
    const int32_t ent_off = p.unit_query_offset[u], nent = p.unit_num_queries(u);
    int32_t pos = 0;
    SegDesc seg0{0, 0, 0, 0};
    // segs may be pinned staging memory: written, never read back.
    for (int32_t s = 0; s < nseg; ++s) {
      const Segment& sg = p.segments[size_t(seg_off + s)];
      // The kernel counts a segment's tokens in slots of the node's page list:
      // a node that starts inside a page (Node::first_slot) starts that much later.
      const SegDesc sd{node_page_offset[sg.node], sg.begin + w.tree.nodes[size_t(sg.node)].first_slot, pos,
                       pos + sg.size()};
      segs[seg_off + s] = sd;
      if (s == 0) seg0 = sd;
      pos += sg.size();
    }
    const uint64_t full = full_mask(nseg);
    uint64_t missing = 0;
    for (int32_t e = ent_off; e < ent_off + nent; ++e) missing |= ~p.entry_mask[size_t(e)] & full;
    desc[u] = UnitDesc{seg_off, nseg, ent_off, nent, missing, /*len=*/pos, /*pad=*/0, seg0};
  }
}

int32_t build_merge_descs(const Plan& p, int32_t num_queries, MergeDesc* merges) {
  int32_t n = 0;
  for (int32_t q = 0; q < num_queries; ++q)
    if (p.query_slot_offset[q + 1] > p.query_slot_offset[q]) {
      MergeDesc md{q, p.query_slot_offset[q], p.query_slot_offset[q + 1] - p.query_slot_offset[q], 0, {}};
      for (int i = 0; i < MergeDesc::kInline; ++i) md.slot[i] = i < md.count ? p.query_slots[md.first + i] : 0;
      merges[n++] = md;
    }
  return n;
}

void set_kernel_attributes(const KernelEntry& k, const DeviceLimits& dl) {
  check_cuda(cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  std::min(dl.smem_optin, k.smem_bytes(k.max_stages))),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  // All of an SM's unified L1/shared memory as shared memory: an SM takes
  // the carveout of the first CTA it runs, and a smaller one keeps CTAs of
  // a concurrent launch off it until it drains.
  check_cuda(cudaFuncSetAttribute(k.kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int(cudaSharedmemCarveoutMaxShared)),
             "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
}

// Pipeline depth of a launch: the CTAs an SM can hold by registers, but no
// more than the grid needs (a grid of at most one CTA per SM gets one CTA per
// SM and the deepest pipeline), at least two when other launches run
// alongside; then the most stages (up to one more than the longest unit has
// tiles) that keep that many CTAs per SM.
void choose_stages(Launch& l, int64_t ctas, const DeviceLimits& dl, bool concurrent) {
  const int num_sms = dl.num_sms, smem_per_sm = dl.smem_per_sm, smem_reserved = dl.smem_reserved,
            smem_optin = dl.smem_optin;
  const cuda::KernelEntry& k = l.kernel;
  cudaFuncAttributes attr{};
  check_cuda(cudaFuncGetAttributes(&attr, k.kernel), "cudaFuncGetAttributes(attention kernel)");
  const int warps = k.threads / 32;
  const int regs_per_warp = (attr.numRegs * 32 + 255) / 256 * 256;
  const int by_regs = std::max(1, 65536 / (regs_per_warp * warps));
  int per_sm = int(std::min<int64_t>(by_regs, std::max<int64_t>(1, (ctas + num_sms - 1) / num_sms)));
  // With other launches running at the same time, leave an SM room for one of
  // their CTAs: a deep pipeline that takes a whole SM's shared memory makes
  // them queue behind it, and buys nothing for 128-row CTAs, which are
  // issue-bound, not latency-bound. This holds for a tree's upper level of
  // at most one CTA per SM too: taking all of an SM but one CTA's worth kept
  // most of the short leaf CTAs an SM holds waiting for the root
  // (docs/cuda.md, "Executor").
  if (concurrent) per_sm = std::max(per_sm, 2);
  const int tiles = (l.max_len + k.n - 1) / k.n;
  // One stage only where every unit has one tile (nothing to overlap inside
  // the CTA) and the kernel allows it: then more short CTAs fit on an SM.
  const int min_stages = tiles <= 1 ? k.min_stages : std::max(k.min_stages, 2);
  const int want = std::clamp(tiles + 1, min_stages, k.max_stages);
  for (; per_sm >= 1; --per_sm) {
    int s = want;
    while (s >= min_stages &&
           (k.smem_bytes(s) > smem_optin || per_sm * (k.smem_bytes(s) + smem_reserved) > smem_per_sm))
      --s;
    if (s >= min_stages) {
      l.stages = s;
      l.smem = k.smem_bytes(s);
      return;
    }
  }
  throw Error("cuda executor: tile m=" + std::to_string(k.m) + " n=" + std::to_string(k.n) + " needs " +
              std::to_string(k.smem_bytes(min_stages)) + " bytes of shared memory for " + std::to_string(min_stages) +
              " K/V stage(s) (units of " + std::to_string(l.max_len) + " tokens), the device allows " +
              std::to_string(std::min(smem_optin, smem_per_sm - smem_reserved)) + " per CTA");
}

int64_t wave_ctas(const Launch& l, const DeviceLimits& dl) {
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, l.kernel.kernel, l.kernel.threads, size_t(l.smem)),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(attention kernel)");
  return int64_t(std::max(per_sm, 1)) * dl.num_sms;
}

void set_run_tensors(const TensorShape& t, const AttentionArgs& args, AttnParams& a, MergeParams& mg) {
  const int D = t.heads.head_dim;
  check_scales(args);
  const float scale = args.scale != 0.f ? args.scale : 1.f / std::sqrt(float(D));
  if (!args.q || !args.k || !args.v || !args.out) throw Error("cuda executor: null tensor pointer in AttentionArgs");
  Workload shape;  // resolve_strides needs only the heads and the page size
  shape.heads = t.heads;
  shape.layout.page_size = t.page_size;
  const Strides s = resolve_strides(shape, args);
  // 16-byte copies (8 elements, 16 of fp8): every row start must be 16-byte aligned.
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const char* bad = !aligned(args.q) ? "q" : !aligned(args.k) ? "k" : !aligned(args.v) ? "v" : !aligned(args.out) ? "out"
                                                                                                               : nullptr;
  if (bad) throw Error(std::string("cuda executor: ") + bad + " is not 16-byte aligned");
  auto check_stride = [](int64_t v, int64_t min, int64_t multiple, const char* name) {
    if (v < min || v % multiple != 0)
      throw Error(std::string("cuda executor: ") + name + " = " + std::to_string(v) + " must be >= " +
                  std::to_string(min) + " and a multiple of " + std::to_string(multiple) + " elements");
  };
  const int64_t kv_chunk = 16 / int64_t(dtype_size(t.kv_dtype));  // elements of a 16-byte copy
  check_stride(s.q, int64_t(t.heads.num_qo_heads) * D, 8, "q_stride");
  check_stride(s.out, int64_t(t.heads.num_qo_heads) * D, 8, "out_stride");
  check_stride(s.kv_token, int64_t(t.heads.num_kv_heads) * D, kv_chunk, "kv_token_stride");
  // Divisions, not products: the strides are the caller's and may be near INT64_MAX
  // (for a positive kv_token, kv_page < kv_token x page_size iff kv_page / page_size < kv_token).
  if (s.kv_page / t.page_size < s.kv_token || s.kv_page % s.kv_token != 0)
    throw Error("cuda executor: kv_page_stride = " + std::to_string(s.kv_page) + " must be a multiple of kv_token_stride (" +
                std::to_string(s.kv_token) + ") and >= page_size x that");
  const int64_t rows_per_page = s.kv_page / s.kv_token;
  const int64_t element_bytes = int64_t(dtype_size(t.kv_dtype));
  if (rows_per_page > INT32_MAX / std::max<int64_t>(t.num_pages, 1) || s.kv_token > int64_t(UINT32_MAX) / element_bytes)
    throw Error("cuda executor: a pool of " + std::to_string(t.num_pages) + " pages of " + std::to_string(rows_per_page) +
                " rows of " + std::to_string(s.kv_token) + " x " + std::to_string(element_bytes) + " bytes exceeds the kernels' 32-bit row indexing");
  a.q = args.q;
  a.k = args.k;
  a.v = args.v;
  a.out = args.out;
  a.lse_out = args.lse;
  a.q_stride = s.q;
  a.o_stride = s.out;
  a.kv_token_bytes = uint32_t(s.kv_token * element_bytes);
  a.rows_per_page = int32_t(rows_per_page);
  a.scale_log2 = scale * args.k_scale * 1.4426950408889634f;
  a.v_scale = args.v_scale;
  mg.out = args.out;
  mg.o_stride = s.out;
  mg.lse_out = args.lse;
}

cudaAccessPolicyWindow plan_l2_window(const void* base, size_t bytes) {
  cudaAccessPolicyWindow win{};
  int dev = 0, max_window = 0, max_persist = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, dev),
             "cudaDeviceGetAttribute(max access policy window)");
  check_cuda(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, dev),
             "cudaDeviceGetAttribute(max persisting L2)");
  if (max_window <= 0 || max_persist <= 0 || bytes == 0) return win;
  size_t set_aside = 0;
  check_cuda(cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize), "cudaDeviceGetLimit(persisting L2)");
  const size_t window = std::min(bytes, size_t(max_window)), wanted = std::min(window, size_t(max_persist));
  if (set_aside < wanted) {
    // MPS fixes the set-aside at server start: there the call fails, and the
    // window works with what is set aside (none: no policy).
    if (cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, wanted) == cudaSuccess) {
      set_aside = wanted;
    } else {
      (void)cudaGetLastError();
      if (set_aside == 0) return win;
    }
  }
  win.base_ptr = const_cast<void*>(base);
  win.num_bytes = window;
  // More window than set-aside: a hit ratio below 1 keeps the persisting
  // lines within the set-aside instead of evicting one another.
  win.hitRatio = float(std::min(1.0, double(set_aside) / double(window)));
  win.hitProp = cudaAccessPropertyPersisting;
  win.missProp = cudaAccessPropertyStreaming;
  return win;
}

}  // namespace treeattn::cuda
