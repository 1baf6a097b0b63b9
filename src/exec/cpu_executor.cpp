// The CPU executor: runs any valid Plan with fp32 math, writing partials and
// merging them exactly as the GPU executor does. It is the no-GPU path of the
// demo and the second opinion in every GPU test.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <tuple>

#include "treeattn/executor.hpp"
#include "treeattn/numeric.hpp"

namespace treeattn {

namespace {

constexpr int kBlock = 32;  // KV tokens converted to fp32 at once, shared by a unit's rows

struct Partials {
  std::vector<float> o;    // [slot, qo head, head_dim], normalised
  std::vector<float> lse;  // [slot, qo head], natural log; -inf when nothing was seen
};

// One unit for one kv head: every row (entry x qo head of the group) streams
// the unit's segments with an online softmax.
void run_unit(const Workload& w, const Plan& p, const AttentionArgs& a, const Strides& str, float scale, int32_t u,
              int kvh, Partials& part) {
  const int H = w.heads.num_qo_heads, D = w.heads.head_dim;
  const int g = w.heads.group_size(), ps = w.layout.page_size;
  const DType t = w.layout.dtype, kt = w.layout.kv_type();
  const int32_t e0 = p.unit_query_offset[u], ne = p.unit_num_queries(u);
  const int rows = ne * g;

  std::vector<float> q(size_t(rows) * D), acc(size_t(rows) * D, 0.f);
  std::vector<SoftmaxState> st(rows);
  for (int r = 0; r < rows; ++r) {
    const int64_t qh = int64_t(p.entry_query[e0 + r / g]) * str.q + int64_t(kvh * g + r % g) * D;
    for (int d = 0; d < D; ++d) q[size_t(r) * D + d] = load_element(a.q, t, qh + d) * scale;
  }

  std::vector<float> kb(size_t(kBlock) * D), vb(size_t(kBlock) * D), s(kBlock);
  for (int32_t k = 0; k < p.unit_num_segments(u); ++k) {
    const Segment& seg = p.segments[p.unit_segment_offset[u] + k];
    const Node& node = w.tree.nodes[seg.node];
    for (int32_t t0 = seg.begin; t0 < seg.end; t0 += kBlock) {
      const int n = std::min<int32_t>(kBlock, seg.end - t0);
      for (int j = 0; j < n; ++j) {
        const int64_t row = node.token_row(t0 + j, ps);
        const int64_t base = row / ps * str.kv_page + row % ps * str.kv_token + int64_t(kvh) * D;
        for (int d = 0; d < D; ++d) {
          kb[size_t(j) * D + d] = load_element(a.k, kt, base + d) * a.k_scale;
          vb[size_t(j) * D + d] = load_element(a.v, kt, base + d) * a.v_scale;
        }
      }
      for (int r = 0; r < rows; ++r) {
        if (!(p.entry_mask[e0 + r / g] >> k & 1)) continue;
        const float* qr = &q[size_t(r) * D];
        float mx = st[r].m;
        for (int j = 0; j < n; ++j) {
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += qr[d] * kb[size_t(j) * D + d];
          s[j] = dot;
          mx = std::max(mx, dot);
        }
        const float rescale = std::exp(st[r].m - mx);  // exp(-inf) = 0 for the empty state
        float* o = &acc[size_t(r) * D];
        for (int d = 0; d < D; ++d) o[d] *= rescale;
        float sum = st[r].d * rescale;
        for (int j = 0; j < n; ++j) {
          const float pj = std::exp(s[j] - mx);
          sum += pj;
          for (int d = 0; d < D; ++d) o[d] += pj * vb[size_t(j) * D + d];
        }
        st[r] = {mx, sum};
      }
    }
  }

  for (int r = 0; r < rows; ++r) {
    const int32_t e = e0 + r / g, h = kvh * g + r % g;
    const float inv = st[r].empty() ? 0.f : 1.f / st[r].d;  // fully masked row: zeros
    const float* o = &acc[size_t(r) * D];
    if (p.entry_slot[e] < 0) {
      const int64_t off = int64_t(p.entry_query[e]) * str.out + int64_t(h) * D;
      for (int d = 0; d < D; ++d) store_element(a.out, t, off + d, o[d] * inv);
      if (a.lse) a.lse[int64_t(p.entry_query[e]) * H + h] = st[r].lse();
    } else {
      const size_t off = (size_t(p.entry_slot[e]) * H + h) * D;
      for (int d = 0; d < D; ++d) part.o[off + d] = o[d] * inv;
      part.lse[size_t(p.entry_slot[e]) * H + h] = st[r].lse();
    }
  }
}

void merge_query(const Workload& w, const Plan& p, const AttentionArgs& a, const Strides& str, const Partials& part,
                 int32_t q) {
  const int H = w.heads.num_qo_heads, D = w.heads.head_dim;
  std::vector<float> o(D);
  for (int h = 0; h < H; ++h) {
    std::fill(o.begin(), o.end(), 0.f);
    float lse = -INFINITY;
    for (int32_t k = p.query_slot_offset[q]; k < p.query_slot_offset[q + 1]; ++k) {
      const int32_t slot = p.query_slots[k];
      const MergeWeights mw = merge_weights(lse, part.lse[size_t(slot) * H + h]);
      const float* po = &part.o[(size_t(slot) * H + h) * D];
      for (int d = 0; d < D; ++d) o[d] = mw.wa * o[d] + mw.wb * po[d];
      lse = mw.lse;
    }
    for (int d = 0; d < D; ++d) store_element(a.out, w.layout.dtype, int64_t(q) * str.out + int64_t(h) * D + d, o[d]);
    if (a.lse) a.lse[int64_t(q) * H + h] = lse;
  }
}

template <class F>
void parallel_for(int64_t n, int threads, F&& f) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) f(i);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

// |s| as an unsigned value, INT64_MIN included.
uint64_t magnitude(int64_t s) { return s < 0 ? 0 - uint64_t(s) : uint64_t(s); }

// Elements spanned by n rows of `row` elements, `stride` apart: (n - 1) x
// |stride| + row; UINT64_MAX where that overflows.
uint64_t rows_span(int64_t n, int64_t stride, uint64_t row) {
  uint64_t steps = 0;
  if (n > 1 && __builtin_mul_overflow(uint64_t(n - 1), magnitude(stride), &steps)) return UINT64_MAX;
  return steps > UINT64_MAX - row ? UINT64_MAX : steps + row;
}

// The strides against the shapes the executor knows (AttentionArgs takes
// pointers, not sizes): q and out [num_queries] rows of num_qo_heads x
// head_dim, the pools [num_pages, page_size] rows of num_kv_heads x head_dim.
// Rows one stride steps over must not overlap: units write out's rows
// concurrently, and a q or pool stride below its row is a wrong stride, not a
// layout. Negative strides are a reversed view and are read as such. The
// elements a tensor spans must stay addressable in bytes (the offsets are
// int64). A few comparisons a run.
void check_strides(const Workload& w, const Strides& s) {
  const int64_t Q = w.num_queries(), ps = w.layout.page_size, pages = w.layout.num_pages;
  const uint64_t qo_row = uint64_t(w.heads.num_qo_heads) * uint64_t(w.heads.head_dim);
  const uint64_t kv_row = uint64_t(w.heads.num_kv_heads) * uint64_t(w.heads.head_dim);
  auto fail = [](const char* field, int64_t value, const std::string& why) {
    throw Error(std::string(field) + " = " + std::to_string(value) + ": " + why);
  };
  auto beyond_int64 = [](uint64_t elements, DType t) {
    return elements > uint64_t(INT64_MAX) / uint64_t(dtype_size(t));
  };
  for (const auto& [field, tensor, stride] : {std::tuple{"q_stride", "q", s.q}, {"out_stride", "out", s.out}}) {
    if (Q > 1 && magnitude(stride) < qo_row)
      fail(field, stride, std::string("the queries' rows of ") + tensor + " overlap (|" + field +
                              "| < num_qo_heads x head_dim = " + std::to_string(qo_row) + ")");
    if (beyond_int64(rows_span(Q, stride, qo_row), w.layout.dtype))
      fail(field, stride,
           std::to_string(Q) + " queries' rows of " + tensor + " span more bytes than int64 offsets reach");
  }
  if (ps > 1 && magnitude(s.kv_token) < kv_row)
    fail("kv_token_stride", s.kv_token, "a page's token rows overlap (|kv_token_stride| < num_kv_heads x head_dim = " +
                                            std::to_string(kv_row) + ")");
  const uint64_t page = rows_span(ps, s.kv_token, kv_row);  // elements of one page
  if (pages > 1 && magnitude(s.kv_page) < page)
    fail("kv_page_stride", s.kv_page,
         "the pool's pages overlap (|kv_page_stride| < (page_size - 1) x |kv_token_stride| + "
         "num_kv_heads x head_dim = " +
             (page == UINT64_MAX ? std::string("more than 2^64") : std::to_string(page)) + ")");
  if (beyond_int64(rows_span(std::max<int64_t>(pages, 1), s.kv_page, page), w.layout.kv_type()))
    fail("kv_page_stride", s.kv_page,
         std::to_string(pages) + " pages of the pools span more bytes than int64 offsets reach");
}

}  // namespace

Strides check_tensors(const Workload& w, const AttentionArgs& a, bool writes) {
  const auto null = [](const char* name) { throw Error(std::string(name) + ": null tensor pointer in AttentionArgs"); };
  // (A pool of no pages may be null, as an empty vector's data() is.)
  const bool rows = w.num_queries() > 0, pool = w.layout.num_pages > 0;
  if (rows && !a.q) null("q");
  if (pool && !a.k) null("k");
  if (pool && !a.v) null("v");
  if (rows && writes && !a.out) null("out");
  const Strides s = resolve_strides(w, a);
  check_strides(w, s);
  return s;
}

void run_cpu(const Workload& w, const Plan& p, const AttentionArgs& a, int threads) {
  check_scales(a);
  const Strides str = check_tensors(w, a, /*writes=*/true);
  const int H = w.heads.num_qo_heads, Hkv = w.heads.num_kv_heads;
  Partials part;
  part.o.assign(size_t(p.num_slots) * H * w.heads.head_dim, 0.f);
  part.lse.assign(size_t(p.num_slots) * H, -INFINITY);
  const float scale = effective_scale(w, a.scale);
  parallel_for(int64_t(p.num_units()) * Hkv, threads,
               [&](int64_t i) { run_unit(w, p, a, str, scale, int32_t(i / Hkv), int(i % Hkv), part); });
  std::vector<int32_t> merged;
  for (int32_t q = 0; q < w.num_queries(); ++q)
    if (p.query_slot_offset[q + 1] > p.query_slot_offset[q]) merged.push_back(q);
  parallel_for(int64_t(merged.size()), threads, [&](int64_t i) { merge_query(w, p, a, str, part, merged[i]); });
}

}  // namespace treeattn
