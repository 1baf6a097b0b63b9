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

#include <cstdint>
#include <optional>
#include <span>
#include <string>

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

std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.shape(i));
  return s + "]";
}

[[noreturn]] void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }

// A tensor of `dtype` on the runtime's device with `ndim` dimensions whose
// last two are dense [heads, head_dim].
void check_tensor(const char* name, const Tensor& t, const TreeAttentionConfig& c, size_t ndim, int64_t heads) {
  const bool want_cuda = c.device == Device::cuda;
  const int dev = t.device_type();
  if (want_cuda ? dev != nb::device::cuda::value : dev != nb::device::cpu::value)
    value_error(std::string(name) + ": expected a tensor on " + (want_cuda ? "cuda" : "the cpu") +
                " (the TreeAttention's device), got device type " + std::to_string(dev));
  const nb::dlpack::dtype dt = t.dtype();
  const bool fp16 = dt.code == uint8_t(nb::dlpack::dtype_code::Float) && dt.bits == 16 && dt.lanes == 1;
  const bool bf16 = dt.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1;
  if (!(c.dtype == DType::fp16 ? fp16 : bf16))
    throw nb::type_error((std::string(name) + ": expected dtype " + (c.dtype == DType::fp16 ? "float16" : "bfloat16") +
                          " (the TreeAttention's dtype), got code " + std::to_string(dt.code) + " bits " +
                          std::to_string(dt.bits))
                             .c_str());
  if (t.ndim() != ndim)
    value_error(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, got shape " + shape_str(t));
  const int64_t D = c.heads.head_dim;
  if (int64_t(t.shape(ndim - 1)) != D || int64_t(t.shape(ndim - 2)) != heads)
    value_error(std::string(name) + ": shape " + shape_str(t) + " must end in [" + std::to_string(heads) + ", " +
                std::to_string(D) + "] (heads, head_dim)");
  if (t.stride(ndim - 1) != 1 || t.stride(ndim - 2) != D)
    value_error(std::string(name) + ": the last two dimensions must be dense (strides " + std::to_string(D) +
                ", 1), got strides " + std::to_string(t.stride(ndim - 2)) + ", " + std::to_string(t.stride(ndim - 1)));
}

void run(const TreeAttention& ta, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
         std::optional<Tensor> lse, float scale, uintptr_t stream) {
  const TreeAttentionConfig& c = ta.config();
  const int64_t Q = ta.num_queries();
  if (Q == 0) value_error("run(): nothing planned yet (call a plan_* method first)");
  check_tensor("q", q, c, 3, c.heads.num_qo_heads);
  check_tensor("out", out, c, 3, c.heads.num_qo_heads);
  check_tensor("k_pool", k, c, 4, c.heads.num_kv_heads);
  check_tensor("v_pool", v, c, 4, c.heads.num_kv_heads);
  if (int64_t(q.shape(0)) != Q) value_error("q: " + std::to_string(q.shape(0)) + " queries, the plan has " + std::to_string(Q));
  if (int64_t(out.shape(0)) != Q)
    value_error("out: " + std::to_string(out.shape(0)) + " queries, the plan has " + std::to_string(Q));
  for (const auto& [name, t] : {std::pair{"k_pool", &k}, std::pair{"v_pool", &v}}) {
    if (int64_t(t->shape(0)) < c.num_pages || int64_t(t->shape(1)) != c.page_size)
      value_error(std::string(name) + ": shape " + shape_str(*t) + " must be [>= num_pages = " +
                  std::to_string(c.num_pages) + ", page_size = " + std::to_string(c.page_size) + ", ...]");
  }
  if (k.stride(0) != v.stride(0) || k.stride(1) != v.stride(1))
    value_error("k_pool and v_pool must have the same strides, got (" + std::to_string(k.stride(0)) + ", " +
                std::to_string(k.stride(1)) + ") and (" + std::to_string(v.stride(0)) + ", " +
                std::to_string(v.stride(1)) + ")");
  AttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = out.data();
  a.scale = scale;
  a.q_stride = q.stride(0);
  a.out_stride = out.stride(0);
  a.kv_page_stride = k.stride(0);
  a.kv_token_stride = k.stride(1);
  if (lse) {
    const Tensor& l = *lse;
    const nb::dlpack::dtype dt = l.dtype();
    if (!(dt.code == uint8_t(nb::dlpack::dtype_code::Float) && dt.bits == 32))
      throw nb::type_error("lse: expected dtype float32");
    if (l.ndim() != 2 || int64_t(l.shape(0)) != Q || int64_t(l.shape(1)) != c.heads.num_qo_heads ||
        l.stride(1) != 1 || l.stride(0) != c.heads.num_qo_heads)
      value_error("lse: expected a contiguous [" + std::to_string(Q) + ", " + std::to_string(c.heads.num_qo_heads) +
                  "] tensor, got shape " + shape_str(l));
    if (l.device_type() != q.device_type()) value_error("lse: must be on the same device as q");
    a.lse = static_cast<float*>(l.data());
  }
  if (q.data() == out.data()) value_error("out: must not alias q");
  nb::gil_scoped_release release;  // the CPU executor may run for a while
  ta.run(a, reinterpret_cast<void*>(stream));
}

TreeArrays tree_of(const Index& parents, const Index& num_tokens, const Index& page_offsets, const Index& page_ids,
                   const Index& query_nodes, const std::optional<Index>& first_slots) {
  return {span_of(parents), span_of(num_tokens), span_of(page_offsets), span_of(page_ids), span_of(query_nodes),
          span_of(first_slots)};
}

}  // namespace

void bind_runtime(nb::module_& m) {
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
