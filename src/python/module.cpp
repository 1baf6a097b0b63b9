// The Python extension treeattn._treeattn (nanobind): TreeAttention over
// DLPack tensors. Tensors come in as nb::ndarray (any framework that speaks
// DLPack: PyTorch, CuPy, JAX, NumPy) and are checked here -- device, dtype,
// shape, strides -- before a pointer reaches the runtime; index arrays come as
// contiguous int32 / int64 host arrays (the Python layer converts lists and
// CPU tensors). treeattn::Error surfaces as ValueError, wrong dtypes as
// TypeError, each naming the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "python/bindings.hpp"
#include "treeattn/runtime.hpp"

namespace nb = nanobind;

namespace treeattn::python {

namespace {

using Index = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Index64 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Tensor = nb::ndarray<>;

std::span<const int32_t> span_of(const Index& a) { return {a.data(), a.size()}; }
std::span<const int32_t> span_of(const std::optional<Index>& a) { return a ? span_of(*a) : std::span<const int32_t>{}; }

// What run() needs of a tensor, from an ndarray (DLPack) or from the Python
// layer's fast path for PyTorch tensors (data_ptr, shape, stride): the checks
// below are the same for both.
struct View {
  uintptr_t ptr = 0;
  std::vector<int64_t> shape, strides;  // strides in elements
  std::string dtype;                    // "fp16", "bf16", "fp32", or what it is
  bool cuda = false;
};

std::string dtype_name(const nb::dlpack::dtype& dt) {
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(nb::dlpack::dtype_code::Float)) return "fp16";
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(nb::dlpack::dtype_code::Bfloat)) return "bf16";
  if (dt.lanes == 1 && dt.bits == 32 && dt.code == uint8_t(nb::dlpack::dtype_code::Float)) return "fp32";
  return "code " + std::to_string(dt.code) + " bits " + std::to_string(dt.bits);
}

View view_of(const Tensor& t) {
  View v;
  v.ptr = reinterpret_cast<uintptr_t>(t.data());
  for (size_t i = 0; i < t.ndim(); ++i) v.shape.push_back(int64_t(t.shape(i))), v.strides.push_back(t.stride(i));
  v.dtype = dtype_name(t.dtype());
  v.cuda = t.device_type() == nb::device::cuda::value;
  return v;
}

std::string shape_str(const View& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

[[noreturn]] void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }

// A tensor of the runtime's dtype on its device with `ndim` dimensions whose
// last two are dense [heads, head_dim].
void check_tensor(const char* name, const View& t, const TreeAttentionConfig& c, size_t ndim, int64_t heads) {
  const bool want_cuda = c.device == Device::cuda;
  if (t.cuda != want_cuda)
    value_error(std::string(name) + ": expected a tensor on " + (want_cuda ? "cuda" : "the cpu") +
                " (the TreeAttention's device), got one on " + (t.cuda ? "cuda" : "another device"));
  const std::string want = c.dtype == DType::fp16 ? "fp16" : "bf16";
  if (t.dtype != want)
    throw nb::type_error((std::string(name) + ": expected dtype " + (c.dtype == DType::fp16 ? "float16" : "bfloat16") +
                          " (the TreeAttention's dtype), got " + t.dtype)
                             .c_str());
  if (t.shape.size() != ndim)
    value_error(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, got shape " + shape_str(t));
  const int64_t D = c.heads.head_dim;
  if (t.shape[ndim - 1] != D || t.shape[ndim - 2] != heads)
    value_error(std::string(name) + ": shape " + shape_str(t) + " must end in [" + std::to_string(heads) + ", " +
                std::to_string(D) + "] (heads, head_dim)");
  if (t.strides[ndim - 1] != 1 || t.strides[ndim - 2] != D)
    value_error(std::string(name) + ": the last two dimensions must be dense (strides " + std::to_string(D) +
                ", 1), got strides " + std::to_string(t.strides[ndim - 2]) + ", " + std::to_string(t.strides[ndim - 1]));
}

// The checks of a run's tensors against the runtime and its last plan; the
// arguments the runtime's run() takes.
AttentionArgs checked_args(const TreeAttention& ta, const View& q, const View& k, const View& v, const View& out,
                           const std::optional<View>& lse, float scale) {
  const TreeAttentionConfig& c = ta.config();
  const int64_t Q = ta.num_queries();
  if (Q == 0) value_error("run(): nothing planned yet (call a plan_* method first)");
  check_tensor("q", q, c, 3, c.heads.num_qo_heads);
  check_tensor("out", out, c, 3, c.heads.num_qo_heads);
  check_tensor("k_pool", k, c, 4, c.heads.num_kv_heads);
  check_tensor("v_pool", v, c, 4, c.heads.num_kv_heads);
  if (q.shape[0] != Q) value_error("q: " + std::to_string(q.shape[0]) + " queries, the plan has " + std::to_string(Q));
  if (out.shape[0] != Q)
    value_error("out: " + std::to_string(out.shape[0]) + " queries, the plan has " + std::to_string(Q));
  for (const auto& [name, t] : {std::pair{"k_pool", &k}, std::pair{"v_pool", &v}}) {
    if (t->shape[0] < c.num_pages || t->shape[1] != c.page_size)
      value_error(std::string(name) + ": shape " + shape_str(*t) + " must be [>= num_pages = " +
                  std::to_string(c.num_pages) + ", page_size = " + std::to_string(c.page_size) + ", ...]");
  }
  if (k.strides[0] != v.strides[0] || k.strides[1] != v.strides[1])
    value_error("k_pool and v_pool must have the same strides, got (" + std::to_string(k.strides[0]) + ", " +
                std::to_string(k.strides[1]) + ") and (" + std::to_string(v.strides[0]) + ", " +
                std::to_string(v.strides[1]) + ")");
  AttentionArgs a;
  a.q = reinterpret_cast<const void*>(q.ptr);
  a.k = reinterpret_cast<const void*>(k.ptr);
  a.v = reinterpret_cast<const void*>(v.ptr);
  a.out = reinterpret_cast<void*>(out.ptr);
  a.scale = scale;
  a.q_stride = q.strides[0];
  a.out_stride = out.strides[0];
  a.kv_page_stride = k.strides[0];
  a.kv_token_stride = k.strides[1];
  if (lse) {
    const View& l = *lse;
    if (l.dtype != "fp32") throw nb::type_error(("lse: expected dtype float32, got " + l.dtype).c_str());
    if (l.shape.size() != 2 || l.shape[0] != Q || l.shape[1] != c.heads.num_qo_heads || l.strides[1] != 1 ||
        l.strides[0] != c.heads.num_qo_heads)
      value_error("lse: expected a contiguous [" + std::to_string(Q) + ", " + std::to_string(c.heads.num_qo_heads) +
                  "] tensor, got shape " + shape_str(l));
    if (l.cuda != q.cuda) value_error("lse: must be on the same device as q");
    a.lse = reinterpret_cast<float*>(l.ptr);
  }
  if (q.ptr == out.ptr) value_error("out: must not alias q");
  return a;
}

void run_views(const TreeAttention& ta, const View& q, const View& k, const View& v, const View& out,
               const std::optional<View>& lse, float scale, uintptr_t stream) {
  const AttentionArgs a = checked_args(ta, q, k, v, out, lse, scale);
  nb::gil_scoped_release release;  // the CPU executor may run for a while
  ta.run(a, reinterpret_cast<void*>(stream));
}

// run() with its tensors checked once (TreeAttention.bind): a call only
// compares the plan's query count with the bound tensors' and launches. The
// Python object keeps the tensors alive.
struct BoundRun {
  const TreeAttention* ta;
  AttentionArgs args;
  int64_t num_queries;
  void operator()(uintptr_t stream) const {
    if (ta->num_queries() != num_queries)
      value_error("bound run: the plan has " + std::to_string(ta->num_queries()) + " queries, the bound tensors " +
                  std::to_string(num_queries) + " (bind again after a plan of another size)");
    nb::gil_scoped_release release;
    ta->run(args, reinterpret_cast<void*>(stream));
  }
};

void run(const TreeAttention& ta, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
         std::optional<Tensor> lse, float scale, uintptr_t stream) {
  std::optional<View> l;
  if (lse) l = view_of(*lse);
  run_views(ta, view_of(q), view_of(k), view_of(v), view_of(out), l, scale, stream);
}

// The Python layer's fast path for PyTorch tensors: (data_ptr, shape, strides,
// dtype name, is_cuda) tuples, read without a DLPack capsule per tensor.
using RawTensor = std::tuple<uintptr_t, std::vector<int64_t>, std::vector<int64_t>, std::string, bool>;
View view_of(const RawTensor& r) {
  return View{std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<4>(r)};
}
BoundRun bind_raw(const TreeAttention& ta, const RawTensor& q, const RawTensor& k, const RawTensor& v,
                  const RawTensor& out, const std::optional<RawTensor>& lse, float scale) {
  std::optional<View> l;
  if (lse) l = view_of(*lse);
  return {&ta, checked_args(ta, view_of(q), view_of(k), view_of(v), view_of(out), l, scale), ta.num_queries()};
}
BoundRun bind(const TreeAttention& ta, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              std::optional<Tensor> lse, float scale) {
  std::optional<View> l;
  if (lse) l = view_of(*lse);
  return {&ta, checked_args(ta, view_of(q), view_of(k), view_of(v), view_of(out), l, scale), ta.num_queries()};
}

void run_raw(const TreeAttention& ta, const RawTensor& q, const RawTensor& k, const RawTensor& v, const RawTensor& out,
             const std::optional<RawTensor>& lse, float scale, uintptr_t stream) {
  std::optional<View> l;
  if (lse) l = view_of(*lse);
  run_views(ta, view_of(q), view_of(k), view_of(v), view_of(out), l, scale, stream);
}

TreeArrays tree_of(const Index& parents, const Index& num_tokens, const Index& page_offsets, const Index& page_ids,
                   const Index& query_nodes, const std::optional<Index>& first_slots) {
  return {span_of(parents), span_of(num_tokens), span_of(page_offsets), span_of(page_ids), span_of(query_nodes),
          span_of(first_slots)};
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<BoundRun>(m, "_BoundRun").def("__call__", &BoundRun::operator(), nb::arg("stream"));
  nb::class_<TreeAttention>(m, "_TreeAttention")
      .def(
          "__init__",
          [](TreeAttention* self, int num_qo_heads, int num_kv_heads, int head_dim, int page_size, int64_t num_pages,
             const std::string& dtype, const std::string& device, int32_t max_queries, int32_t max_nodes,
             int64_t max_page_refs, const std::string& planner, int num_sms, int cpu_threads) {
            TreeAttentionConfig c;
            c.heads = {num_qo_heads, num_kv_heads, head_dim};
            c.dtype = parse_dtype(dtype);
            c.page_size = page_size;
            c.num_pages = num_pages;
            if (device != "cpu" && device != "cuda")
              value_error("device: expected 'cpu' or 'cuda', got '" + device + "'");
            c.device = device == "cuda" ? Device::cuda : Device::cpu;
            c.max_queries = max_queries;
            c.max_nodes = max_nodes;
            c.max_page_refs = max_page_refs;
            c.planner = planner;
            c.plan_options.num_sms = num_sms;
            c.cpu_threads = cpu_threads;
            new (self) TreeAttention(c);
          },
          nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("page_size"),
          nb::arg("num_pages"), nb::arg("dtype"), nb::arg("device"), nb::arg("max_queries"), nb::arg("max_nodes"),
          nb::arg("max_page_refs"), nb::arg("planner"), nb::arg("num_sms"), nb::arg("cpu_threads"))
      .def(
          "plan_tree",
          [](TreeAttention& ta, const Index& parents, const Index& num_tokens, const Index& page_offsets,
             const Index& page_ids, const Index& query_nodes, const std::optional<Index>& first_slots,
             uintptr_t stream) {
            ta.plan_tree(tree_of(parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots),
                         reinterpret_cast<void*>(stream));
          },
          nb::arg("parents"), nb::arg("num_tokens"), nb::arg("page_offsets"), nb::arg("page_ids"),
          nb::arg("query_nodes"), nb::arg("first_slots").none(), nb::arg("stream"))
      .def(
          "plan_block_tables",
          [](TreeAttention& ta, const nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& bt,
             const Index& seq_lens, uintptr_t stream) {
            ta.plan_block_tables({bt.data(), bt.size()}, int32_t(bt.shape(0)), int32_t(bt.shape(1)), span_of(seq_lens),
                                 reinterpret_cast<void*>(stream));
          },
          nb::arg("block_tables"), nb::arg("seq_lens"), nb::arg("stream"))
      .def(
          "plan_tree_queries",
          [](TreeAttention& ta, const Index& parents, const Index& num_tokens, const Index& page_offsets,
             const Index& page_ids, const Index& query_nodes, const std::optional<Index>& first_slots,
             const Index& draft_nodes, const Index& draft_parents, const Index64& draft_rows, uintptr_t stream) {
            ta.plan_tree_queries(tree_of(parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots),
                                 {span_of(draft_nodes), span_of(draft_parents), {draft_rows.data(), draft_rows.size()}},
                                 reinterpret_cast<void*>(stream));
          },
          nb::arg("parents"), nb::arg("num_tokens"), nb::arg("page_offsets"), nb::arg("page_ids"),
          nb::arg("query_nodes"), nb::arg("first_slots").none(), nb::arg("draft_nodes"), nb::arg("draft_parents"),
          nb::arg("draft_rows"), nb::arg("stream"))
      .def("run", &run, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("out"), nb::arg("lse").none(),
           nb::arg("scale"), nb::arg("stream"))
      .def("bind", &bind, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("out"), nb::arg("lse").none(),
           nb::arg("scale"), nb::keep_alive<0, 1>())
      .def("bind_raw", &bind_raw, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("out"),
           nb::arg("lse").none(), nb::arg("scale"), nb::keep_alive<0, 1>())
      .def("run_raw", &run_raw, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("out"),
           nb::arg("lse").none(), nb::arg("scale"), nb::arg("stream"))
      .def_prop_ro("num_queries", &TreeAttention::num_queries)
      .def("describe", &TreeAttention::describe)
      .def("plan_summary", [](const TreeAttention& ta) {
        const PlanSummary s = ta.summary();
        nb::dict d;
        d["planner"] = s.planner;
        d["units"] = s.units;
        d["rows"] = s.rows;
        d["segments"] = s.segments;
        d["kv_bytes"] = s.kv_bytes;
        d["unique_kv_bytes"] = s.unique_kv_bytes;
        d["kv_ratio"] = s.unique_kv_bytes ? double(s.kv_bytes) / double(s.unique_kv_bytes) : 0.0;
        d["partial_bytes"] = s.partial_bytes;
        d["padded_rows"] = s.padded_rows;
        d["masked_units"] = s.masked_units;
        d["max_unit_tokens"] = s.max_unit_tokens;
        d["queries"] = ta.num_queries();
        d["nodes"] = int64_t(ta.workload().tree.nodes.size());
        return d;
      });
}

}  // namespace treeattn::python

NB_MODULE(_treeattn, m) {
  m.doc() = "treeattn's C++ runtime (use the treeattn package, not this module)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const treeattn::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
#if defined(TREEATTN_HAVE_CUDA)
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
  treeattn::python::bind_runtime(m);
  treeattn::python::bind_cache(m);
}
