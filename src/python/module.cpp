// The Python extension treeattn._treeattn (nanobind): TreeAttention over
// tensors. run()'s tensors come in as Python objects to one C++ entry
// (_Runner): PyTorch tensors are read through their attributes (data_ptr,
// shape, stride, dtype, the device flag; no DLPack capsule), anything else
// through DLPack (nb::ndarray: CuPy, JAX, NumPy), and checked here -- device,
// dtype, shape, strides -- on every call before a pointer reaches the runtime.
// Index arrays come as contiguous int32 / int64 host arrays (the Python layer
// converts lists and CPU tensors). treeattn::Error surfaces as ValueError,
// wrong dtypes as TypeError, each naming the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "python/bindings.hpp"
#include "treeattn/cost_models.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/runtime.hpp"

namespace nb = nanobind;

namespace treeattn::python {

namespace {

using Index = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Index64 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Tensor = nb::ndarray<>;

std::span<const int32_t> span_of(const Index& a) { return {a.data(), a.size()}; }
std::span<const int32_t> span_of(const std::optional<Index>& a) { return a ? span_of(*a) : std::span<const int32_t>{}; }

// What run() needs of a tensor. PyTorch tensors (the fast path) are read
// through a few attribute calls -- data_ptr(), shape, stride(), dtype and the
// device flag -- with no DLPack capsule; anything else goes through DLPack
// (nb::ndarray: CuPy, JAX, NumPy, ...). The checks below are the same for both.
// No heap allocation on the success path: the shape and strides sit in fixed
// arrays, the dtype is a code, and the descriptions an error message needs are
// built only when one is raised (from `obj`, which the caller keeps alive).
constexpr int kMaxDims = 8;  // more dimensions are only ever an error: the rest is not kept

// fp8: torch.float8_e4m3fn; u8: uint8, taken as the raw bytes of fp8 K/V
// pools (NumPy has no fp8 type; vLLM has kept fp8 caches as uint8 tensors).
enum class Code : uint8_t { fp16, bf16, fp32, fp8, u8, other };

struct View {
  PyObject* obj = nullptr;  // borrowed: the argument, for error messages
  bool torch = false;
  uintptr_t ptr = 0;
  int ndim = 0;
  int64_t shape[kMaxDims] = {}, strides[kMaxDims] = {};  // strides in elements
  Code dtype = Code::other;
  bool on_device = false;  // on the TreeAttention's device (cuda / cpu)
  int32_t device_index = -1;  // CUDA tensors: the device's index, where read (-1: not read)
  nb::dlpack::dtype dl_dtype{};
  int32_t dl_device = 0;
  // PyTorch tensors: the bytes their storage holds, [storage_begin, storage_end)
  // (an empty range where the storage could not be read: the device check names those).
  uintptr_t storage_begin = 0, storage_end = 0;
  Tensor nd;  // the DLPack import, kept while the view is used
  nb::ndarray<nb::ro> nd_read_only;  // that of a read-only input (q, k_pool, v_pool)
};

[[noreturn]] void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }

// str(o), or repr(o) where `repr` (a value in a message: 'abc', not abc).
std::string str_of(PyObject* o, bool repr = false) {
  nb::object s = nb::steal(repr ? PyObject_Repr(o) : PyObject_Str(o));
  if (!s.is_valid()) {
    PyErr_Clear();
    return "?";
  }
  return nb::cast<std::string>(s);
}

// "float16", "torch.int64", "code 0 bits 32": what the view's dtype is, for messages.
std::string dtype_desc(const View& t) {
  switch (t.dtype) {
    case Code::fp16: return "float16";
    case Code::bf16: return "bfloat16";
    case Code::fp32: return "float32";
    case Code::fp8: return "float8_e4m3fn";
    case Code::u8: return "uint8";
    case Code::other: break;
  }
  if (t.torch) {
    nb::object d = nb::steal(PyObject_GetAttrString(t.obj, "dtype"));
    if (!d.is_valid()) PyErr_Clear();
    return d.is_valid() ? str_of(d.ptr()) : "?";
  }
  // Another framework's array: its own dtype name (NumPy, CuPy, JAX), else
  // the DLPack type's.
  nb::object d = nb::steal(PyObject_GetAttrString(t.obj, "dtype"));
  if (d.is_valid()) return str_of(d.ptr());
  PyErr_Clear();
  static const char* const kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const uint8_t code = t.dl_dtype.code;
  return (code < 7 ? std::string(kinds[code]) : "dlpack type " + std::to_string(code) + " of ") +
         std::to_string(t.dl_dtype.bits) + (t.dl_dtype.lanes != 1 ? " x" + std::to_string(t.dl_dtype.lanes) : "");
}

std::string device_desc(const View& t) {
  if (t.torch) {
    nb::object d = nb::steal(PyObject_GetAttrString(t.obj, "device"));
    if (!d.is_valid()) PyErr_Clear();
    return d.is_valid() ? str_of(d.ptr()) : "another device";
  }
  if (t.dl_device == nb::device::cuda::value) return "cuda";
  if (t.dl_device == nb::device::cpu::value) return "the cpu";
  return "DLPack device type " + std::to_string(t.dl_device);
}

std::string ints_str(const View& t, const int64_t* v) {
  std::string s = "[";
  for (int i = 0; i < std::min(t.ndim, kMaxDims); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (t.ndim > kMaxDims) s += ", ...";
  return s + "]";
}
std::string shape_str(const View& t) { return ints_str(t, t.shape); }
std::string strides_str(const View& t) { return ints_str(t, t.strides); }

// PyTorch, as far as the fast path needs it: its Tensor class, the dtypes the
// runtime takes, and the attribute names, looked up once. The references are
// kept for the life of the process (nothing to release after the interpreter
// is gone). Types are classified once each (torch.Tensor and its subclasses:
// the fast path; anything else: DLPack) and remembered with a reference, so a
// type's address cannot be reused by another while it is remembered.
//
// The attribute reads are most of run()'s overhead (~60 ns each through
// PyObject_GetAttr / a method call, 5 per tensor). For a type whose data_ptr,
// shape, stride, dtype, is_cuda and is_cpu are TensorBase's own C descriptors
// (torch.Tensor, nn.Parameter, any subclass that does not override them) the
// descriptors' C functions are called directly, which skips the attribute
// lookup and the bound method (~10 ns each); PyTorch's functions themselves
// run as through the attribute (__torch_function__ included). Any other type,
// or a PyTorch whose descriptors are not of the expected kinds: attributes.
struct Torch {
  PyObject *tensor = nullptr, *fp16 = nullptr, *bf16 = nullptr, *fp32 = nullptr;
  PyObject *fp8 = nullptr, *u8 = nullptr;  // fp8: nullptr in a PyTorch without float8_e4m3fn
  PyObject *s_data_ptr, *s_shape, *s_stride, *s_dtype, *s_is_cuda, *s_is_cpu, *s_is_neg, *s_untyped_storage, *s_nbytes;
  PyObject* empty_tuple;
  // TensorBase's descriptors (owned) and their C functions, when usable.
  PyObject *d_data_ptr = nullptr, *d_shape = nullptr, *d_stride = nullptr, *d_dtype = nullptr, *d_is_cuda = nullptr,
           *d_is_cpu = nullptr;
  PyCFunction f_data_ptr = nullptr;
  // TensorBase.untyped_storage and StorageBase's nbytes / data_ptr (METH_NOARGS
  // C functions), for storages of type `storage_type` (torch.UntypedStorage).
  PyCFunction f_untyped_storage = nullptr, f_storage_nbytes = nullptr, f_storage_data_ptr = nullptr;
  PyObject* storage_type = nullptr;
  PyCFunction f_is_neg = nullptr;  // TensorBase.is_neg's C function, of either calling convention
  PyCFunctionWithKeywords f_is_neg_kw = nullptr;
  PyCFunctionWithKeywords f_stride = nullptr;
  const PyGetSetDef *g_shape = nullptr, *g_dtype = nullptr, *g_is_cuda = nullptr, *g_is_cpu = nullptr;
  static constexpr int kTypes = 16;
  PyTypeObject* types[kTypes] = {};
  bool is_torch[kTypes] = {}, direct[kTypes] = {};
  int num_types = 0;

  Torch() {
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_is_cuda = PyUnicode_InternFromString("is_cuda");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_is_neg = PyUnicode_InternFromString("is_neg");
    s_untyped_storage = PyUnicode_InternFromString("untyped_storage");
    s_nbytes = PyUnicode_InternFromString("nbytes");
    empty_tuple = PyTuple_New(0);
  }

  static const PyGetSetDef* getset_of(PyObject* d) {
    if (!d || !Py_IS_TYPE(d, &PyGetSetDescr_Type)) return nullptr;
    const PyGetSetDef* g = reinterpret_cast<PyGetSetDescrObject*>(d)->d_getset;
    return g && g->get ? g : nullptr;
  }
  static const PyMethodDef* method_of(PyObject* d, int flags) {
    if (!d || !Py_IS_TYPE(d, &PyMethodDescr_Type)) return nullptr;
    const PyMethodDef* m = reinterpret_cast<PyMethodDescrObject*>(d)->d_method;
    return m && m->ml_meth && m->ml_flags == flags ? m : nullptr;
  }

  // torch.Tensor, the dtypes and TensorBase's descriptors; false when torch is
  // not (fully) imported.
  bool init(PyObject* torch) {
    PyObject* t = PyObject_GetAttrString(torch, "Tensor");
    PyObject* f16 = PyObject_GetAttrString(torch, "float16");
    PyObject* bf = PyObject_GetAttrString(torch, "bfloat16");
    PyObject* f32 = PyObject_GetAttrString(torch, "float32");
    if (!(t && f16 && bf && f32)) {  // a partly imported or odd torch: no fast path (DLPack still works)
      PyErr_Clear();
      Py_XDECREF(t), Py_XDECREF(f16), Py_XDECREF(bf), Py_XDECREF(f32);
      return false;
    }
    tensor = t, fp16 = f16, bf16 = bf, fp32 = f32;
    fp8 = PyObject_GetAttrString(torch, "float8_e4m3fn");
    u8 = PyObject_GetAttrString(torch, "uint8");
    if (!fp8 || !u8) PyErr_Clear();
    // The class that defines the descriptors: torch._C.TensorBase (_TensorBase before PyTorch 2.2).
    PyObject* c = PyObject_GetAttrString(torch, "_C");
    PyObject* base = c ? PyObject_GetAttrString(c, "TensorBase") : nullptr;
    if (c && !base) {
      PyErr_Clear();
      base = PyObject_GetAttrString(c, "_TensorBase");
    }
    if (!base) PyErr_Clear();
    Py_XDECREF(c);
    if (base) {
      PyObject** ds[] = {&d_data_ptr, &d_shape, &d_stride, &d_dtype, &d_is_cuda, &d_is_cpu};
      PyObject* names[] = {s_data_ptr, s_shape, s_stride, s_dtype, s_is_cuda, s_is_cpu};
      for (int i = 0; i < 6; ++i) {
        *ds[i] = PyObject_GetAttr(base, names[i]);  // a class attribute: the descriptor itself
        if (!*ds[i]) PyErr_Clear();
      }
      PyObject* neg = PyObject_GetAttr(base, s_is_neg);
      if (!neg) PyErr_Clear();
      if (const PyMethodDef* n = method_of(neg, METH_NOARGS)) f_is_neg = n->ml_meth;
      else if (const PyMethodDef* n = method_of(neg, METH_VARARGS | METH_KEYWORDS))
        f_is_neg_kw = reinterpret_cast<PyCFunctionWithKeywords>(reinterpret_cast<void (*)(void)>(n->ml_meth));
      Py_XDECREF(neg);  // the class keeps the descriptor alive
      PyObject* us = PyObject_GetAttr(base, s_untyped_storage);
      if (!us) PyErr_Clear();
      if (const PyMethodDef* m = method_of(us, METH_NOARGS)) f_untyped_storage = m->ml_meth;
      Py_XDECREF(us);
      Py_DECREF(base);
      // torch.UntypedStorage, whose nbytes / data_ptr are StorageBase's (not overridden).
      PyObject* ut = PyObject_GetAttrString(torch, "UntypedStorage");
      PyObject* nb_ = ut ? PyObject_GetAttr(ut, s_nbytes) : nullptr;
      PyObject* dp_ = ut ? PyObject_GetAttr(ut, s_data_ptr) : nullptr;
      if (!(ut && nb_ && dp_)) PyErr_Clear();
      const PyMethodDef* mn = method_of(nb_, METH_NOARGS);
      const PyMethodDef* md = method_of(dp_, METH_NOARGS);
      if (ut && mn && md) {
        storage_type = ut;  // kept (the module holds it anyway)
        f_storage_nbytes = mn->ml_meth;
        f_storage_data_ptr = md->ml_meth;
      } else {
        Py_XDECREF(ut);
      }
      Py_XDECREF(nb_);
      Py_XDECREF(dp_);
      const PyMethodDef* dp = method_of(d_data_ptr, METH_NOARGS);
      const PyMethodDef* st = method_of(d_stride, METH_VARARGS | METH_KEYWORDS);
      g_shape = getset_of(d_shape), g_dtype = getset_of(d_dtype), g_is_cuda = getset_of(d_is_cuda);
      g_is_cpu = getset_of(d_is_cpu);
      if (dp && st && g_shape && g_dtype && g_is_cuda && g_is_cpu) {
        f_data_ptr = dp->ml_meth;
        f_stride = reinterpret_cast<PyCFunctionWithKeywords>(reinterpret_cast<void (*)(void)>(st->ml_meth));
      }
    }
    return true;
  }

  // The type's attributes are TensorBase's descriptors (not overridden).
  bool plain(PyTypeObject* type) {
    if (!f_data_ptr) return false;
    PyObject* names[] = {s_data_ptr, s_shape, s_stride, s_dtype, s_is_cuda, s_is_cpu};
    PyObject* ds[] = {d_data_ptr, d_shape, d_stride, d_dtype, d_is_cuda, d_is_cpu};
    for (int i = 0; i < 6; ++i) {
      PyObject* d = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), names[i]);
      if (!d) PyErr_Clear();
      Py_XDECREF(d);
      if (d != ds[i]) return false;
    }
    return true;
  }

  // Whether `type` is a PyTorch tensor type; `*direct`: whether its attributes
  // can be read through TensorBase's C functions.
  bool classify(PyTypeObject* type, bool* is_direct) {
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (torch && !tensor && !init(torch)) return *is_direct = false;  // not remembered: torch may complete later
    bool yes = false, dir = false;
    if (tensor) {  // torch not imported: no torch tensor exists, and the type is remembered as not one
      const int r = PyObject_IsSubclass(reinterpret_cast<PyObject*>(type), tensor);
      if (r < 0) PyErr_Clear();
      yes = r == 1;
      dir = yes && plain(type);
    }
    if (num_types < kTypes) {
      Py_INCREF(type);
      types[num_types] = type;
      is_torch[num_types] = yes;
      direct[num_types++] = dir;
    }
    *is_direct = dir;
    return yes;
  }

  bool is_tensor(PyObject* o, bool* is_direct) {
    PyTypeObject* type = Py_TYPE(o);
    for (int i = 0; i < num_types; ++i)
      if (types[i] == type) return *is_direct = direct[i], is_torch[i];
    return classify(type, is_direct);
  }

  PyObject* data_ptr(PyObject* o, bool dir) const {
    return dir ? f_data_ptr(o, nullptr) : PyObject_CallMethodNoArgs(o, s_data_ptr);
  }
  PyObject* stride(PyObject* o, bool dir) const {
    return dir ? f_stride(o, empty_tuple, nullptr) : PyObject_CallMethodNoArgs(o, s_stride);
  }
  static PyObject* get(PyObject* o, bool dir, const PyGetSetDef* g, PyObject* name) {
    return dir ? g->get(o, g->closure) : PyObject_GetAttr(o, name);
  }
};

Torch& torch_info() {
  static Torch* t = new Torch();  // never destroyed (see above)
  return *t;
}

// An attribute read of a PyTorch tensor that failed (a tensor without storage,
// a sparse one, ...): ValueError naming the argument, with PyTorch's message.
[[noreturn]] void torch_read_error(const char* name, const char* what) {
  nb::python_error e;  // its type and message: what() would append the traceback
  const std::string msg = str_of(e.value().ptr());
  value_error(std::string(name) + ": cannot read the tensor's " + what + " (" + nb::inst_name(e.value()).c_str() +
              (msg.empty() ? "" : ": " + msg.substr(0, msg.find('\n'))) + ")");
}

// A tuple of ints (torch.Size or stride()'s tuple) into `dst`; the count.
int read_ints(const char* name, const char* what, PyObject* tuple, int64_t* dst) {
  if (!PyTuple_Check(tuple)) value_error(std::string(name) + ": the tensor's " + what + " is not a tuple");
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  for (Py_ssize_t i = 0; i < std::min<Py_ssize_t>(n, kMaxDims); ++i) {
    dst[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (dst[i] == -1 && PyErr_Occurred()) torch_read_error(name, what);
  }
  return int(n);
}

// Where the runtime's tensors must be: cuda (and on which device) or the cpu.
struct Where {
  bool cuda = false;
  int device_index = -1;       // the TreeAttention's CUDA device
  bool torch_index = false;    // read a PyTorch tensor's device index (a process that sees several GPUs)
};

void read_torch(const char* name, PyObject* o, View& v, const Where& where, bool dir, const Torch& T) {
  const bool want_cuda = where.cuda;
  v.torch = true;
  nb::object ptr = nb::steal(T.data_ptr(o, dir));
  if (!ptr.is_valid()) torch_read_error(name, "data_ptr()");
  v.ptr = uintptr_t(PyLong_AsUnsignedLongLongMask(ptr.ptr()));
  if (v.ptr == uintptr_t(-1) && PyErr_Occurred()) torch_read_error(name, "data_ptr()");
  nb::object shape = nb::steal(Torch::get(o, dir, T.g_shape, T.s_shape));
  if (!shape.is_valid()) torch_read_error(name, "shape");
  v.ndim = read_ints(name, "shape", shape.ptr(), v.shape);
  nb::object strides = nb::steal(T.stride(o, dir));
  if (!strides.is_valid()) torch_read_error(name, "stride()");
  if (read_ints(name, "stride()", strides.ptr(), v.strides) != v.ndim)
    value_error(std::string(name) + ": stride() and shape differ in length");
  PyObject* dt = Torch::get(o, dir, T.g_dtype, T.s_dtype);
  if (!dt) torch_read_error(name, "dtype");
  v.dtype = dt == T.fp16   ? Code::fp16
            : dt == T.bf16 ? Code::bf16
            : dt == T.fp32 ? Code::fp32
            : dt == T.fp8  ? Code::fp8  // dt is not null; T.fp8 is in a PyTorch without float8
            : dt == T.u8   ? Code::u8
                           : Code::other;
  Py_DECREF(dt);
  // The flag of the device it must be on: is_cuda for a CUDA runtime (as before),
  // is_cpu for a CPU one (so an MPS, XPU or meta tensor is not taken for a CPU one).
  PyObject* flag = want_cuda ? Torch::get(o, dir, T.g_is_cuda, T.s_is_cuda) : Torch::get(o, dir, T.g_is_cpu, T.s_is_cpu);
  if (!flag) torch_read_error(name, want_cuda ? "is_cuda" : "is_cpu");
  v.on_device = flag == Py_True;
  Py_DECREF(flag);
  // A negated view (the neg bit: the .imag of a conj()ed complex-half tensor)
  // holds the negation of what its memory says: read or written raw, every
  // value would have the wrong sign. Direct types: TensorBase.is_neg's C
  // function (~10 ns); others: the attribute, where it exists.
  nb::object neg = nb::steal(dir && T.f_is_neg      ? T.f_is_neg(o, nullptr)
                             : dir && T.f_is_neg_kw ? T.f_is_neg_kw(o, T.empty_tuple, nullptr)
                                                    : PyObject_CallMethodNoArgs(o, T.s_is_neg));
  if (!neg.is_valid()) PyErr_Clear();
  if (neg.is_valid() && neg.ptr() == Py_True)
    value_error(std::string(name) + ": a tensor with its negative bit set (a lazy negation: its memory holds the "
                "negated values); pass .resolve_neg()");
  // The storage's bytes: a view may reach past them where the storage was
  // shrunk after the view was made (untyped_storage().resize_(n)), which
  // PyTorch itself does not check. Unreadable (a meta or fake tensor): left
  // empty, and the device or null-pointer check names the tensor.
  // (Direct types: the C functions, ~0.06 us a tensor; others: the methods.)
  nb::object storage = nb::steal(dir && T.f_untyped_storage ? T.f_untyped_storage(o, nullptr)
                                                             : PyObject_CallMethodNoArgs(o, T.s_untyped_storage));
  const bool plain_storage = storage.is_valid() && T.storage_type &&
                             reinterpret_cast<PyObject*>(Py_TYPE(storage.ptr())) == T.storage_type;
  nb::object sptr = !storage.is_valid() ? nb::object()
                    : plain_storage     ? nb::steal(T.f_storage_data_ptr(storage.ptr(), nullptr))
                                        : nb::steal(PyObject_CallMethodNoArgs(storage.ptr(), T.s_data_ptr));
  nb::object sbytes = !sptr.is_valid() ? nb::object()
                      : plain_storage  ? nb::steal(T.f_storage_nbytes(storage.ptr(), nullptr))
                                       : nb::steal(PyObject_CallMethodNoArgs(storage.ptr(), T.s_nbytes));
  if (sbytes.is_valid()) {
    const unsigned long long b = PyLong_AsUnsignedLongLongMask(sptr.ptr()), n = PyLong_AsUnsignedLongLong(sbytes.ptr());
    if (!PyErr_Occurred()) v.storage_begin = uintptr_t(b), v.storage_end = uintptr_t(b + n);
  }
  PyErr_Clear();
  if (want_cuda && v.on_device && where.torch_index) {
    nb::object i = nb::steal(PyObject_CallMethod(o, "get_device", nullptr));
    if (!i.is_valid()) torch_read_error(name, "get_device()");
    v.device_index = int32_t(PyLong_AsLong(i.ptr()));
    if (v.device_index == -1 && PyErr_Occurred()) torch_read_error(name, "get_device()");
  }
}

// The view's fields from a DLPack import (writable, or a read-only input's).
template <class Array>
void fill_from_dlpack(const Array& t, View& v, bool want_cuda) {
  v.ptr = reinterpret_cast<uintptr_t>(t.data());
  v.ndim = int(t.ndim());
  for (int i = 0; i < std::min(v.ndim, kMaxDims); ++i) v.shape[i] = int64_t(t.shape(size_t(i))), v.strides[i] = t.stride(size_t(i));
  const nb::dlpack::dtype dt = t.dtype();
  v.dl_dtype = dt;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(nb::dlpack::dtype_code::Float)) v.dtype = Code::fp16;
  else if (dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(nb::dlpack::dtype_code::Bfloat)) v.dtype = Code::bf16;
  else if (dt.lanes == 1 && dt.bits == 32 && dt.code == uint8_t(nb::dlpack::dtype_code::Float)) v.dtype = Code::fp32;
  else if (dt.lanes == 1 && dt.bits == 8 && dt.code == uint8_t(nb::dlpack::dtype_code::UInt)) v.dtype = Code::u8;
  v.dl_device = t.device_type();
  v.on_device = want_cuda ? v.dl_device == nb::device::cuda::value
                          : v.dl_device == nb::device::cpu::value || v.dl_device == nb::device::cuda_host::value;
  if (want_cuda && v.on_device) v.device_index = t.device_id();
}

// `input`: only read (q and the pools), so a read-only array is taken too.
void read_dlpack(const char* name, PyObject* o, View& v, const Where& where, bool input) {
  try {
    v.nd = nb::cast<Tensor>(nb::handle(o), /*convert=*/false);  // no copies: out must be the caller's memory
    return fill_from_dlpack(v.nd, v, where.cuda);
  } catch (const nb::cast_error&) {
  }
  if (input) {
    try {
      v.nd_read_only = nb::cast<nb::ndarray<nb::ro>>(nb::handle(o), /*convert=*/false);
      return fill_from_dlpack(v.nd_read_only, v, where.cuda);
    } catch (const nb::cast_error&) {
    }
  }
  // A read-only NumPy array has no writable DLPack export: say so, not "no tensor".
  nb::object flags = nb::steal(PyObject_GetAttrString(o, "flags"));
  if (!flags.is_valid()) PyErr_Clear();
  nb::object writeable = flags.is_valid() ? nb::steal(PyObject_GetAttrString(flags.ptr(), "writeable")) : nb::object();
  if (flags.is_valid() && !writeable.is_valid()) PyErr_Clear();
  if (writeable.is_valid() && writeable.ptr() == Py_False)
    value_error(std::string(name) + ": a read-only array (the runtime writes it; pass a writable one)");
  // An array whose own export refuses it (NumPy: byte strides that are not a
  // multiple of the item size): its exporter's reason, not "no tensor".
  if (PyObject_HasAttrString(o, "__dlpack__")) {
    try {
      nb::handle(o).attr("__dlpack__")();
    } catch (const nb::python_error& e) {
      value_error(std::string(name) + ": its DLPack export failed (" + nb::str(e.value()).c_str() + ")");
    }
  }
  throw nb::type_error((std::string(name) + ": expected a tensor (PyTorch, or anything with DLPack), got " +
                        nb::inst_name(nb::handle(o)).c_str())
                           .c_str());
}

void read_view(const char* name, nb::handle h, View& v, const Where& where, bool input) {
  v.obj = h.ptr();
  Torch& T = torch_info();
  bool dir = false;
  if (T.is_tensor(h.ptr(), &dir))
    read_torch(name, h.ptr(), v, where, dir, T);
  else
    read_dlpack(name, h.ptr(), v, where, input);
}

// A tensor of the runtime's dtype (the K/V pools: of its kv dtype) on its
// device with `ndim` dimensions whose last two are dense [heads, head_dim].
void check_tensor(const char* name, const View& t, const TreeAttentionConfig& c, int ndim, int64_t heads,
                  bool kv = false) {
  const bool want_cuda = c.device == Device::cuda;
  if (!t.on_device)
    value_error(std::string(name) + ": expected a tensor on " +
                (want_cuda ? "cuda:" + std::to_string(c.device_index) : std::string("the cpu")) +
                " (the TreeAttention's device), got one on " + device_desc(t));
  if (want_cuda && t.device_index >= 0 && t.device_index != c.device_index)
    value_error(std::string(name) + ": expected a tensor on cuda:" + std::to_string(c.device_index) +
                " (the TreeAttention's device), got one on cuda:" + std::to_string(t.device_index));
  if (kv && c.kv_dtype == DType::fp8_e4m3) {
    if (t.dtype != Code::fp8 && t.dtype != Code::u8)
      throw nb::type_error((std::string(name) + ": expected dtype float8_e4m3fn (or uint8 holding its bytes; the "
                            "TreeAttention's kv_dtype), got " + dtype_desc(t))
                               .c_str());
  } else {
    const Code want = c.dtype == DType::fp16 ? Code::fp16 : Code::bf16;
    if (t.dtype != want)
      throw nb::type_error((std::string(name) + ": expected dtype " +
                            (c.dtype == DType::fp16 ? "float16" : "bfloat16") + " (the TreeAttention's dtype), got " +
                            dtype_desc(t))
                               .c_str());
  }
  if (t.ndim != ndim)
    value_error(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, got shape " + shape_str(t));
  const int64_t D = c.heads.head_dim;
  if (t.shape[ndim - 1] != D || t.shape[ndim - 2] != heads)
    value_error(std::string(name) + ": shape " + shape_str(t) + " must end in [" + std::to_string(heads) + ", " +
                std::to_string(D) + "] (heads, head_dim)");
  bool empty = false;  // an empty tensor's strides mean nothing (NumPy exports 0s): its shape is named below
  for (int d = 0; d < ndim; ++d) empty = empty || t.shape[d] == 0;
  if (!empty && (t.strides[ndim - 1] != 1 || t.strides[ndim - 2] != D))
    value_error(std::string(name) + ": the last two dimensions must be dense (strides " + std::to_string(D) +
                ", 1), got strides " + std::to_string(t.strides[ndim - 2]) + ", " + std::to_string(t.strides[ndim - 1]));
}

// The bytes [first, end) a view's elements span, strides of either sign (an
// empty view spans none).
std::pair<uintptr_t, uintptr_t> byte_span(const View& t) {
  const int64_t item = t.dtype == Code::fp32 ? 4 : t.dtype == Code::fp16 || t.dtype == Code::bf16 ? 2 : 1;
  int64_t lo = 0, hi = 0;  // element offsets from ptr of the first and the last element
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return {t.ptr, t.ptr};
    const int64_t extent = (t.shape[d] - 1) * t.strides[d];
    (extent < 0 ? lo : hi) += extent;
  }
  return {uintptr_t(int64_t(t.ptr) + lo * item), uintptr_t(int64_t(t.ptr) + (hi + 1) * item)};
}

// ValueError where `written` shares bytes with `read`.
void check_disjoint(const char* written_name, const View& written, const char* read_name, const View& read) {
  const auto [w0, w1] = byte_span(written);
  const auto [r0, r1] = byte_span(read);
  if (w0 < r1 && r0 < w1)
    value_error(std::string(written_name) + ": must not overlap " + read_name + "'s memory (the runtime reads " +
                read_name + " while it writes " + written_name + ")");
}

// The checks of a run's tensors against the runtime and its last plan; the
// arguments the runtime's run() takes.
AttentionArgs checked_args(const TreeAttention& ta, const View& q, const View& k, const View& v, const View& out,
                           const View* lse, float scale, float k_scale, float v_scale) {
  const TreeAttentionConfig& c = ta.config();
  const int64_t Q = ta.num_queries();
  if (Q == 0) value_error("run(): nothing planned yet (call a plan_* method first)");
  check_tensor("q", q, c, 3, c.heads.num_qo_heads);
  check_tensor("out", out, c, 3, c.heads.num_qo_heads);
  check_tensor("k_pool", k, c, 4, c.heads.num_kv_heads, /*kv=*/true);
  check_tensor("v_pool", v, c, 4, c.heads.num_kv_heads, /*kv=*/true);
  if (q.shape[0] != Q) value_error("q: " + std::to_string(q.shape[0]) + " queries, the plan has " + std::to_string(Q));
  if (out.shape[0] != Q)
    value_error("out: " + std::to_string(out.shape[0]) + " queries, the plan has " + std::to_string(Q));
  for (const auto& [name, t] : {std::pair{"k_pool", &k}, std::pair{"v_pool", &v}}) {
    if (t->shape[0] < c.num_pages || t->shape[1] != c.page_size)
      value_error(std::string(name) + ": shape " + shape_str(*t) + " must be [>= num_pages = " +
                  std::to_string(c.num_pages) + ", page_size = " + std::to_string(c.page_size) + ", ...]");
  }
  // AttentionArgs reads a stride of 0 as "dense": an expanded (broadcast)
  // dimension of more than one element would be read, or written, as if it
  // were contiguous.
  for (const auto& [name, t, dims] : {std::tuple{"q", &q, 1}, {"out", &out, 1}, {"k_pool", &k, 2}, {"v_pool", &v, 2}})
    for (int d = 0; d < dims; ++d)
      if (t->shape[d] > 1 && t->strides[d] == 0)
        value_error(std::string(name) + ": stride 0 in dimension " + std::to_string(d) + " (an expanded or broadcast "
                    "view: shape " + shape_str(*t) + ", strides " + strides_str(*t) +
                    ") is not supported; pass a contiguous copy");
  // Each query's rows of out must be its own: CTAs write them concurrently.
  const int64_t out_row = int64_t(c.heads.num_qo_heads) * c.heads.head_dim;
  if (Q > 1 && std::llabs(out.strides[0]) < out_row)
    value_error("out: its queries' rows overlap (shape " + shape_str(out) + ", strides " + strides_str(out) +
                "; |stride[0]| must be >= num_qo_heads x head_dim = " + std::to_string(out_row) + ")");
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
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  check_scales(a);  // as the executors do on every run; bind() reports it at once
  a.q_stride = q.strides[0];
  a.out_stride = out.strides[0];
  a.kv_page_stride = k.strides[0];
  a.kv_token_stride = k.strides[1];
  a.num_queries = Q;  // checked again by run() under the runtime's lock: another thread may plan in between
  if (lse) {
    const View& l = *lse;
    if (l.dtype != Code::fp32) throw nb::type_error(("lse: expected dtype float32, got " + dtype_desc(l)).c_str());
    if (l.ndim != 2 || l.shape[0] != Q || l.shape[1] != c.heads.num_qo_heads || l.strides[1] != 1 ||
        l.strides[0] != c.heads.num_qo_heads)
      value_error("lse: expected a contiguous [" + std::to_string(Q) + ", " + std::to_string(c.heads.num_qo_heads) +
                  "] tensor, got shape " + shape_str(l) + ", strides " + strides_str(l));
    if (!l.on_device || (l.device_index >= 0 && l.device_index != c.device_index))
      value_error("lse: must be on the TreeAttention's device, as q, got one on " +
                  (l.device_index >= 0 ? "cuda:" + std::to_string(l.device_index) : device_desc(l)));
    a.lse = reinterpret_cast<float*>(l.ptr);
  }
  // A tensor without memory (a FakeTensor, PyTorch's efficient zero tensor, a
  // storage resized to 0): named here; an lse at address 0 would read as "no lse".
  for (const auto& [name, t] : {std::pair{"q", &q}, {"k_pool", &k}, {"v_pool", &v}, {"out", &out}, {"lse", lse}})
    if (t && t->ptr == 0)
      value_error(std::string(name) + ": its data pointer is null (a tensor without memory: a fake, meta or "
                  "efficient-zero tensor, or one whose storage was freed)");
  // A PyTorch view must lie within its storage (see read_torch): else the run
  // reads, or writes, memory the tensor does not own.
  for (const auto& [name, t] : {std::pair{"q", &q}, {"k_pool", &k}, {"v_pool", &v}, {"out", &out}, {"lse", lse}}) {
    if (!t || !t->torch || t->storage_end == t->storage_begin) continue;
    const auto [b0, b1] = byte_span(*t);
    if (b0 < t->storage_begin || b1 > t->storage_end)
      value_error(std::string(name) + ": the view's elements span bytes [" + std::to_string(int64_t(b0 - t->storage_begin)) +
                  ", " + std::to_string(int64_t(b1 - t->storage_begin)) + ") of its storage, which holds " +
                  std::to_string(t->storage_end - t->storage_begin) +
                  " (a storage resized after the view was made?)");
  }
  // What run() writes must not share memory with what it reads (nor lse with
  // out): CTAs would read values other CTAs already overwrote.
  check_disjoint("out", out, "q", q);
  check_disjoint("out", out, "k_pool", k);
  check_disjoint("out", out, "v_pool", v);
  if (lse)
    for (const auto& [name, t] : {std::pair{"q", &q}, {"k_pool", &k}, {"v_pool", &v}, {"out", &out}})
      check_disjoint("lse", *lse, name, *t);
  return a;
}

// A float argument; None: `none`.
float float_of(const char* name, nb::handle x, float none) {
  if (x.is_none()) return none;
  if (bool_like(x.ptr()))  // True would be 1.0: a flag passed where a number belongs
    throw nb::type_error((std::string(name) + ": expected a number, got " + str_of(x.ptr(), /*repr=*/true)).c_str());
  const double s = PyFloat_AsDouble(x.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    // An int beyond a double (2**2000) overflows; anything else (a string, an
    // array of several elements, a __float__ that raises) is not a number.
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
    PyErr_Clear();
    if (overflow) {
      const std::string v = str_of(x.ptr());
      value_error(std::string(name) + " = " + (v.size() > 24 ? v.substr(0, 20) + "..." : v) +
                  " is not representable as a float32 (it overflows)");
    }
    throw nb::type_error((std::string(name) + ": expected a number, got " + str_of(x.ptr(), /*repr=*/true)).c_str());
  }
  // The runtime takes float32: a value that rounds to 0 (which means the
  // default for scale) or overflows would silently become another one.
  const float f = float(s);
  if (std::isfinite(s) && s != 0 && (f == 0.f || !std::isfinite(f)))
    value_error(std::string(name) + " = " + str_of(x.ptr()) + " is not representable as a float32 (" +
                (f == 0.f ? "it rounds to 0" : "it overflows") + ")");
  return f;
}

// The tensors of a run, read and checked.
AttentionArgs read_args(const TreeAttention& ta, const Where& where, nb::handle q, nb::handle k, nb::handle v,
                        nb::handle out, nb::handle lse, nb::handle scale, nb::handle k_scale, nb::handle v_scale) {
  View vq, vk, vv, vo, vl;
  read_view("q", q, vq, where, /*input=*/true);
  read_view("k_pool", k, vk, where, /*input=*/true);
  read_view("v_pool", v, vv, where, /*input=*/true);
  read_view("out", out, vo, where, /*input=*/false);
  const bool has_lse = !lse.is_none();
  if (has_lse) read_view("lse", lse, vl, where, /*input=*/false);
  return checked_args(ta, vq, vk, vv, vo, has_lse ? &vl : nullptr, float_of("scale", scale, 0.f),
                      float_of("k_scale", k_scale, 1.f), float_of("v_scale", v_scale, 1.f));
}

// A stream argument as the handle (cudaStream_t) it names: an integer, or an
// object whose int() is the handle (a stream wrapper that defines __int__;
// torch.cuda.Stream does not: pass its .cuda_stream). run() and plan_*() alike.
uintptr_t stream_handle(nb::handle s) {
  const auto refuse = [&] {
    throw nb::type_error(("stream: expected a stream handle (an int), got " + str_of(s.ptr(), /*repr=*/true)).c_str());
  };
  // int(1.5), int(True) and int('7') would name streams 1 and 7: an integer
  // (operator.index), or else an object whose int() is its handle but that is
  // no number or text.
  nb::object i;
  if (PyLong_CheckExact(s.ptr())) {
    i = nb::borrow(s);
  } else {
    if (bool_like(s.ptr())) refuse();
    i = nb::steal(PyNumber_Index(s.ptr()));
    if (!i.is_valid()) {
      PyErr_Clear();
      PyNumberMethods* nm = Py_TYPE(s.ptr())->tp_as_number;
      if (PyUnicode_Check(s.ptr()) || PyBytes_Check(s.ptr()) || PyByteArray_Check(s.ptr()) || !nm || !nm->nb_int ||
          nm->nb_float)
        refuse();
      i = nb::steal(PyNumber_Long(s.ptr()));  // int(stream)
      if (!i.is_valid()) {
        PyErr_Clear();
        refuse();
      }
    }
  }
  const unsigned long long h = PyLong_AsUnsignedLongLong(i.ptr());
  if (h == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    value_error("stream: expected a stream handle (an int in [0, 2**64)), got " + str_of(s.ptr()));
  }
  return uintptr_t(h);
}

// Where run() takes its stream from when none is given: PyTorch's current
// stream through `fn(arg)` (or `fn()` when arg is None; no fn: 0, the default
// stream), as the Python layer found it at construction.
struct StreamSource {
  nb::object fn, arg;
  uintptr_t get(nb::handle stream) const {
    if (!stream.is_none()) return stream_handle(stream);
    if (!fn.is_valid() || fn.is_none()) return 0;
    return stream_handle(arg.is_valid() && !arg.is_none() ? fn(arg) : fn());
  }
};

// run() with its tensors checked once (TreeAttention.bind): a call only
// compares the plan's query count with the bound tensors' and launches. The
// Python object keeps the tensors alive.
struct BoundRun {
  const TreeAttention* ta;
  AttentionArgs args;
  int64_t num_queries;
  StreamSource stream_source;
  void operator()(nb::handle stream) const {
    const uintptr_t s = stream_source.get(stream);
    if (ta->num_queries() != num_queries)
      value_error("bound run: the plan has " + std::to_string(ta->num_queries()) + " queries, the bound tensors " +
                  std::to_string(num_queries) + " (bind again after a plan of another size)");
    nb::gil_scoped_release release;
    ta->run(args, reinterpret_cast<void*>(s));
  }
};

// TreeAttention.run()'s entry (one per TreeAttention, made by the Python layer
// with its stream source): reads and checks the tensors, takes the stream, runs.
struct Runner {
  const TreeAttention* ta;
  StreamSource stream_source;
  Where where;
  nb::object alloc;  // alloc(q, num_qo_heads, lse): run()'s out, or its lse, allocated like q
  void run(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle scale,
           nb::handle k_scale, nb::handle v_scale, nb::handle stream) const {
    const AttentionArgs a = read_args(*ta, where, q, k, v, out, lse, scale, k_scale, v_scale);
    const uintptr_t s = stream_source.get(stream);
    nb::gil_scoped_release release;  // the CPU executor may run for a while
    ta->run(a, reinterpret_cast<void*>(s));
  }
  // TreeAttention.run() whole: out, and lse where return_lse asks for it,
  // allocated where not given; returns out, or (out, lse) when there is an lse.
  nb::object call(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle return_lse, nb::handle lse,
                  nb::handle scale, nb::handle k_scale, nb::handle v_scale, nb::handle stream) const {
    // A bool (Python's, NumPy's or a one-element PyTorch one), 0 or 1, or
    // None: a string or an array would read as true by its length.
    const bool flag = return_lse.is_none() || bool_like(return_lse.ptr()) ||
                      (PyLong_CheckExact(return_lse.ptr()) && PyLong_AsLong(return_lse.ptr()) >> 1 == 0);
    const int truth = flag ? PyObject_IsTrue(return_lse.ptr()) : -1;
    if (truth < 0) {
      PyErr_Clear();
      throw nb::type_error(("return_lse: expected a bool, got " + str_of(return_lse.ptr(), /*repr=*/true)).c_str());
    }
    const int heads = ta->config().heads.num_qo_heads;
    nb::object o = out.is_none() ? alloc(q, heads, false) : nb::borrow(out);
    nb::object l = lse.is_none() && truth ? alloc(q, heads, true) : nb::borrow(lse);
    run(q, k, v, o, l, scale, k_scale, v_scale, stream);
    if (l.is_none()) return o;
    return nb::make_tuple(o, l);
  }
  BoundRun bind(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle scale,
                nb::handle k_scale, nb::handle v_scale) const {
    return {ta, read_args(*ta, where, q, k, v, out, lse, scale, k_scale, v_scale), ta->num_queries(), stream_source};
  }
};


TreeArrays tree_of(const Index& parents, const Index& num_tokens, const Index& page_offsets, const Index& page_ids,
                   const Index& query_nodes, const std::optional<Index>& first_slots) {
  return {span_of(parents), span_of(num_tokens), span_of(page_offsets), span_of(page_ids), span_of(query_nodes),
          span_of(first_slots)};
}

}  // namespace

void bind_runtime(nb::module_& m) {
  // run()'s number check for the other entries that take scales (run_op).
  m.def(
      "_number", [](const std::string& name, nb::handle x, float none) { return float_of(name.c_str(), x, none); },
      nb::arg("name"), nb::arg("x").none(), nb::arg("none"));
  nb::class_<BoundRun>(m, "_BoundRun")
      .def("__call__", &BoundRun::operator(), nb::arg("stream") = nb::none(),
           "Launches the bound run on `stream` (None: the runner's stream source).");
  nb::class_<TreeAttention>(m, "_TreeAttention")
      .def(
          "__init__",
          [](TreeAttention* self, int num_qo_heads, int num_kv_heads, int head_dim, int page_size, int64_t num_pages,
             const std::string& dtype, const std::string& kv_dtype, const std::string& device, int32_t max_queries,
             int32_t max_nodes,
             int64_t max_page_refs, const std::string& planner, int num_sms, int cpu_threads,
             int32_t max_extension_tokens, int device_index, bool l2_persistent_plan,
             const std::map<std::string, double>& plan_options) {
            TreeAttentionConfig c;
            for (const auto& [key, value] : plan_options) set_plan_option(c.plan_options, key, value);
            c.heads = {num_qo_heads, num_kv_heads, head_dim};
            c.dtype = parse_dtype(dtype);
            if (!kv_dtype.empty()) c.kv_dtype = parse_dtype(kv_dtype, "kv_dtype");
            c.page_size = page_size;
            c.num_pages = num_pages;
            if (device != "cpu" && device != "cuda")
              value_error("device: expected 'cpu' or 'cuda', got '" + device + "'");
            c.device = device == "cuda" ? Device::cuda : Device::cpu;
            c.device_index = device_index;
            c.max_queries = max_queries;
            c.max_nodes = max_nodes;
            c.max_page_refs = max_page_refs;
            c.planner = planner;
            c.plan_options.num_sms = num_sms;
            c.cpu_threads = cpu_threads;
            c.max_extension_tokens = max_extension_tokens;
            c.l2_persistent_plan = l2_persistent_plan;
            new (self) TreeAttention(c);
          },
          nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("page_size"),
          nb::arg("num_pages"), nb::arg("dtype"), nb::arg("kv_dtype"), nb::arg("device"), nb::arg("max_queries"), nb::arg("max_nodes"),
          nb::arg("max_page_refs"), nb::arg("planner"), nb::arg("num_sms"), nb::arg("cpu_threads"),
          nb::arg("max_extension_tokens"), nb::arg("device_index"), nb::arg("l2_persistent_plan") = false,
          nb::arg("plan_options") = std::map<std::string, double>{})
      .def(
          "plan_tree",
          [](TreeAttention& ta, const Index& parents, const Index& num_tokens, const Index& page_offsets,
             const Index& page_ids, const Index& query_nodes, const std::optional<Index>& first_slots,
             nb::handle stream) {
            ta.plan_tree(tree_of(parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots),
                         reinterpret_cast<void*>(stream_handle(stream)));
          },
          nb::arg("parents"), nb::arg("num_tokens"), nb::arg("page_offsets"), nb::arg("page_ids"),
          nb::arg("query_nodes"), nb::arg("first_slots").none(), nb::arg("stream"))
      .def(
          "plan_block_tables",
          [](TreeAttention& ta, const nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& bt,
             const Index& seq_lens, nb::handle stream) {
            if (bt.shape(0) > size_t(INT32_MAX) || bt.shape(1) > size_t(INT32_MAX))  // int32_t() would wrap them
              value_error("block_tables: shape [" + std::to_string(bt.shape(0)) + ", " + std::to_string(bt.shape(1)) +
                          "] is out of range (each dimension at most 2147483647)");
            ta.plan_block_tables({bt.data(), bt.size()}, int32_t(bt.shape(0)), int32_t(bt.shape(1)), span_of(seq_lens),
                                 reinterpret_cast<void*>(stream_handle(stream)));
          },
          nb::arg("block_tables"), nb::arg("seq_lens"), nb::arg("stream"))
      .def(
          "plan_tree_queries",
          [](TreeAttention& ta, const Index& parents, const Index& num_tokens, const Index& page_offsets,
             const Index& page_ids, const Index& query_nodes, const std::optional<Index>& first_slots,
             const Index& draft_nodes, const Index& draft_parents, const Index64& draft_rows, nb::handle stream) {
            ta.plan_tree_queries(tree_of(parents, num_tokens, page_offsets, page_ids, query_nodes, first_slots),
                                 {span_of(draft_nodes), span_of(draft_parents), {draft_rows.data(), draft_rows.size()}},
                                 reinterpret_cast<void*>(stream_handle(stream)));
          },
          nb::arg("parents"), nb::arg("num_tokens"), nb::arg("page_offsets"), nb::arg("page_ids"),
          nb::arg("query_nodes"), nb::arg("first_slots").none(), nb::arg("draft_nodes"), nb::arg("draft_parents"),
          nb::arg("draft_rows"), nb::arg("stream"))
      .def_prop_ro("num_queries", &TreeAttention::num_queries)
      .def_prop_ro("device_index", [](const TreeAttention& ta) { return ta.config().device_index; })
      .def("describe", &TreeAttention::describe)
      .def_prop_rw("graph_launches", &TreeAttention::graph_launches, &TreeAttention::set_graph_launches)
      .def_prop_ro("plan_launches", &TreeAttention::plan_launches)
      .def("plan_stats",
           [](const TreeAttention& ta) {
             const PlanStats s = ta.plan_stats();
             nb::dict d;
             d["planned"] = s.planned;
             d["extended"] = s.extended;
             d["pages_rechecked"] = s.pages_rechecked;
             return d;
           })
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
  nb::class_<Runner>(m, "_Runner")
      .def(
          "__init__",
          [](Runner* self, const TreeAttention& ta, nb::object stream_fn, nb::object stream_arg, bool torch_index,
             nb::object alloc) {
            const TreeAttentionConfig& c = ta.config();
            new (self) Runner{&ta, {std::move(stream_fn), std::move(stream_arg)},
                              {c.device == Device::cuda, c.device_index, torch_index}, std::move(alloc)};
          },
          nb::arg("attn"), nb::arg("stream_fn").none(), nb::arg("stream_arg").none(), nb::arg("torch_device_index"),
          nb::arg("alloc"), nb::keep_alive<1, 2>(),
          "TreeAttention.run()'s entry: `stream_fn(stream_arg)` (or `stream_fn()` when stream_arg is None) gives "
          "the stream when run() is given none; stream_fn None: the default stream. torch_device_index: check "
          "PyTorch tensors' device index (one more attribute call each; DLPack tensors always carry theirs). "
          "alloc(q, num_qo_heads, lse): the output (lse: float32 [queries, heads]) allocated like q, where run() "
          "is given none.")
      .def("call", &Runner::call, nb::arg("q").none(), nb::arg("k_pool").none(), nb::arg("v_pool").none(),
           nb::arg("out").none() = nb::none(), nb::kw_only(), nb::arg("return_lse").none() = false,
           nb::arg("lse").none() = nb::none(), nb::arg("scale").none() = nb::none(),
           nb::arg("k_scale").none() = nb::none(), nb::arg("v_scale").none() = nb::none(),
           nb::arg("stream").none() = nb::none(),
           "TreeAttention.run() (see its docstring): allocates out (and lse with return_lse) where not given, "
           "reads and checks the tensors (PyTorch: attributes; others: DLPack), runs; returns out, or (out, lse).")
      .def("bind", &Runner::bind, nb::arg("q").none(), nb::arg("k_pool").none(), nb::arg("v_pool").none(),
           nb::arg("out").none(), nb::arg("lse").none(), nb::arg("scale").none(), nb::arg("k_scale").none(),
           nb::arg("v_scale").none(), nb::keep_alive<0, 1>(),
           "Checks the tensors once; the returned callable runs them.");
}

}  // namespace treeattn::python

NB_MODULE(_treeattn, m) {
  m.doc() = "treeattn's C++ runtime (use the treeattn package, not this module)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const treeattn::Error& e) {
      // Messages may quote a file's bytes (a malformed cost model): decoded
      // leniently, so the ValueError is not replaced by a UnicodeDecodeError.
      PyObject* msg = PyUnicode_DecodeUTF8(e.what(), Py_ssize_t(std::strlen(e.what())), "backslashreplace");
      if (!msg) return;  // the decoder's error stands
      PyErr_SetObject(PyExc_ValueError, msg);
      Py_DECREF(msg);
    }
  });
#if defined(TREEATTN_HAVE_CUDA)
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
  treeattn::python::bind_runtime(m);
  treeattn::python::bind_cache(m);
  // The auto planner's cost model (treeattn calibrate --auto writes one):
  // process-wide, read by every plan of planner "auto".
  m.def(
      "_set_auto_cost_model",
      [](std::optional<std::string> path) {
        if (path && path->find('\0') != std::string::npos)  // the file opened would be the path's prefix
          throw nb::value_error("path: a file name with a NUL character");
        treeattn::set_default_auto_cost_model(
            path ? std::make_shared<const treeattn::AutoCostModel>(treeattn::load_auto_cost_model(*path)) : nullptr);
      },
      nb::arg("path").none());
  m.def("_auto_cost_model", [] { return treeattn::to_json(*treeattn::default_auto_cost_model()); });
  m.def(
      "planners",
      [] {
        std::vector<std::pair<std::string, std::string>> names;
        for (const treeattn::PlannerInfo& p : treeattn::planners()) names.emplace_back(p.name, p.description);
        return names;
      },
      "The planners a TreeAttention's ``planner=`` takes: (name, description) pairs, the default "
      "(\"auto\") first.");
}
