// Python bindings of the KV-cache bookkeeping (layer 6): treeattn.RadixCache.
// Token and page arguments take any sequence of ints or a 1-D integer array
// (an int32 C-contiguous CPU array is read in place); page arrays come back as
// numpy int32. treeattn::Error surfaces as ValueError through the module-wide
// exception translator.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "python/bindings.hpp"
#include "treeattn/cache.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace treeattn::python {

namespace {

using Int32Array = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

// An int32 argument: a view of the caller's array when it is already int32,
// C-contiguous and on the CPU; otherwise a converted copy. The view is valid
// while this object lives. At most `max_len` elements: more is a ValueError,
// checked before anything is copied (a huge range would be copied whole), or,
// with `truncate`, the rest is not read (match_prefix: no match is longer
// than the cache).
class Int32Arg {
 public:
  Int32Arg(nb::handle obj, const char* name, int64_t max_len = INT32_MAX, bool truncate = false) {
    const auto too_long = [&](int64_t n) {
      throw nb::value_error((std::string(name) + ": " + std::to_string(n) + " elements, more than the " +
                             std::to_string(max_len) + " the cache can hold").c_str());
    };
    if (nb::try_cast(obj, array_, /*convert=*/false)) {
      const int64_t n = int64_t(array_.shape(0));
      if (n > max_len && !truncate) too_long(n);
      view_ = std::span<const int32_t>(array_.data(), size_t(std::min(n, max_len)));
      return;
    }
    // A bool array or tensor (ids 0 and 1), bytes-like objects (their bytes as ids).
    if (bool_like(obj.ptr()) || nb::isinstance<nb::str>(obj) || nb::isinstance<nb::bytes>(obj) ||
        PyByteArray_Check(obj.ptr()) || PyMemoryView_Check(obj.ptr()))
      throw nb::type_error((std::string(name) + ": expected a sequence of ints or a 1-D int array, got " +
                            nb::type_name(obj.type()).c_str())
                               .c_str());
    nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> wide;
    if (nb::try_cast(obj, wide, /*convert=*/false)) {
      const int64_t n = int64_t(wide.shape(0));
      if (n > max_len && !truncate) too_long(n);
      copy_.reserve(size_t(std::min(n, max_len)));
      for (int64_t i = 0; i < std::min(n, max_len); ++i) push(wide.data()[i], name, size_t(i));
    } else {
      if (PyObject_HasAttrString(obj.ptr(), "ndim")) {
        nb::object nd = nb::steal(PyObject_GetAttrString(obj.ptr(), "ndim"));
        int overflow = 0;
        const long long d = nd.is_valid() && PyLong_Check(nd.ptr()) ? PyLong_AsLongLongAndOverflow(nd.ptr(), &overflow) : -1;
        PyErr_Clear();
        if (!nd.is_valid() || !PyLong_Check(nd.ptr()) || overflow || d != 1)
          throw nb::value_error((std::string(name) + ": expected a 1-D array, got ndim " +
                                 (nd.is_valid() ? std::string(nb::repr(nd).c_str()) : std::string("unreadable"))).c_str());
      }
      if (!nb::hasattr(obj, "__iter__"))
        throw nb::type_error((std::string(name) + ": expected a sequence of ints or a 1-D int array, got " +
                              nb::type_name(obj.type()).c_str())
                                 .c_str());
      const Py_ssize_t n = PyObject_Size(obj.ptr());  // -1: no len() (an iterator), counted below
      if (n < 0) PyErr_Clear();
      if (n > max_len && !truncate) too_long(n);
      if (n > 0) copy_.reserve(size_t(std::min<int64_t>(n, max_len)));
      size_t i = 0;
      for (nb::handle item : obj) {
        if (int64_t(i) == max_len) {
          if (truncate) break;
          too_long(int64_t(i) + 1);
        }
        int64_t v;
        if (bool_like(item.ptr()) || !nb::try_cast(item, v))
          throw nb::type_error((std::string(name) + "[" + std::to_string(i) + "]: expected an int, got " +
                                nb::type_name(item.type()).c_str())
                                   .c_str());
        push(v, name, i++);
      }
    }
    view_ = copy_;
  }
  std::span<const int32_t> span() const { return view_; }

 private:
  void push(int64_t v, const char* name, size_t i) {
    if (v < INT32_MIN || v > INT32_MAX)
      throw nb::value_error((std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(v) +
                             " does not fit in int32")
                                .c_str());
    copy_.push_back(static_cast<int32_t>(v));
  }

  nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> array_;
  std::vector<int32_t> copy_;
  std::span<const int32_t> view_;
};

// An int argument in [lo, hi]: TypeError or ValueError naming it (nanobind's
// own conversion error names neither the argument nor the value, and its int
// caster takes a bool: lock(True) locked node 1). Integers of other types
// (NumPy's) are taken where `index` is set, through __index__; a bool never.
int64_t int_arg(nb::handle obj, const char* name, int64_t lo, int64_t hi, bool index = false) {
  const bool is_int = PyLong_Check(obj.ptr()) || (index && PyIndex_Check(obj.ptr()));
  if (!is_int || bool_like(obj.ptr()))
    throw nb::type_error((std::string(name) + ": expected an int, got " + nb::type_name(obj.type()).c_str()).c_str());
  nb::object value = nb::steal(PyNumber_Index(obj.ptr()));
  if (!value.is_valid()) {  // an array of several elements, a float tensor, an __index__ that raises
    nb::python_error e;
    throw nb::type_error((std::string(name) + ": expected an int, got " + nb::type_name(obj.type()).c_str() + " (" +
                          nb::str(e.value()).c_str() + ")")
                             .c_str());
  }
  int64_t v = 0;
  if (!nb::try_cast(value, v) || v < lo || v > hi) {
    PyErr_Clear();
    throw nb::value_error((std::string(name) + " = " + nb::str(value).c_str() + " is out of range [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]")
                              .c_str());
  }
  return v;
}

// Tokens the cache can hold: num_pages x page_size (at most INT32_MAX, the
// tokens' index type).
int64_t capacity_tokens(const RadixCache& c) {
  return int64_t(c.page_size()) > INT32_MAX / std::max<int64_t>(c.num_pages(), 1) ? INT32_MAX
                                                                                   : int64_t(c.num_pages()) * c.page_size();
}

// Hands a vector to numpy without a copy: the array owns it through a capsule.
Int32Array to_numpy(std::vector<int32_t>&& v) {
  if (v.empty()) v.reserve(1);  // a non-null data pointer even for shape (0,)
  auto* owned = new std::vector<int32_t>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  const size_t shape[1] = {owned->size()};
  return Int32Array(owned->data(), 1, shape, owner);
}

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<RadixCache>(
      m, "RadixCache",
      "Radix tree over token ids at page granularity with its own pool of KV page ids\n"
      "0..num_pages-1 (engine-independent: it holds page ids, not KV memory).\n\n"
      "Every cached node holds whole pages, so matches and splits happen at page\n"
      "boundaries. Each page is free, cached by one node, or handed out to a request\n"
      "(alloc). Node handles (ints) stay valid until the node is evicted; lock() a node\n"
      "to keep it and its ancestors. Errors raise ValueError and change nothing.")
      .def(
          "__init__",
          [](RadixCache* self, nb::handle num_pages, nb::handle page_size) {
            // Ranges of the C++ types; RadixCache names the ranges it accepts.
            new (self) RadixCache(int_arg(num_pages, "num_pages", INT64_MIN, INT64_MAX, true),
                                  int(int_arg(page_size, "page_size", INT_MIN, INT_MAX, true)));
          },
          nb::sig("def __init__(self, num_pages: int, page_size: int) -> None"), "num_pages"_a, "page_size"_a)
      .def_prop_ro("num_pages", &RadixCache::num_pages, "Size of the page pool.")
      .def_prop_ro("page_size", &RadixCache::page_size, "Tokens per page.")
      .def_prop_ro("root", [](const RadixCache&) { return RadixCache::kRoot; },
                   "Handle of the (empty) root: what match_prefix returns when nothing is cached.")
      .def("num_free_pages", &RadixCache::num_free_pages)
      .def("num_cached_pages", &RadixCache::num_cached_pages)
      .def("num_evictable_pages", &RadixCache::num_evictable_pages,
           "Pages of unlocked nodes: what evicting everything would free.")
      .def(
          "match_prefix",
          [](RadixCache& c, nb::handle tokens) {
            Int32Arg t(tokens, "tokens", capacity_tokens(c), /*truncate=*/true);
            RadixCache::Match mt = c.match_prefix(t.span());
            return nb::make_tuple(mt.node, mt.num_tokens, to_numpy(std::move(mt.pages)));
          },
          "tokens"_a,
          "Longest cached prefix of tokens in whole pages -> (node, num_tokens, pages: int32[num_tokens // page_size]).\n"
          "Splits the node the match ends in, so that it ends at `node`; marks the path as used now.")
      .def(
          "lock",
          [](RadixCache& c, nb::handle node) { c.lock(int32_t(int_arg(node, "node", INT32_MIN, INT32_MAX, true))); },
          nb::sig("def lock(self, node: int) -> None"), "node"_a,
          "Adds a reference to node and its ancestors: they are not evicted.")
      .def(
          "unlock",
          [](RadixCache& c, nb::handle node) { c.unlock(int32_t(int_arg(node, "node", INT32_MIN, INT32_MAX, true))); },
          nb::sig("def unlock(self, node: int) -> None"), "node"_a, "Drops a reference taken by lock(node).")
      .def(
          "alloc",
          [](RadixCache& c, nb::handle n) { return to_numpy(c.alloc(int_arg(n, "n", 0, INT64_MAX, true))); },
          nb::sig("def alloc(self, n: int) -> typing.Annotated[numpy.typing.NDArray[numpy.int32], "
                  "dict(shape=(None,))]"),
          "n"_a,
          "n pages for a request's private tail (int32[n]); evicts least-recently-used unlocked\n"
          "leaves as needed; ValueError naming requested / free / evictable pages when it cannot.")
      .def(
          "free", [](RadixCache& c, nb::handle pages) { c.free(Int32Arg(pages, "pages", c.num_pages()).span()); },
          "pages"_a,
          "Returns pages handed out by alloc to the pool.")
      .def(
          "insert",
          [](RadixCache& c, nb::handle tokens, nb::handle pages) {
            Int32Arg t(tokens, "tokens", capacity_tokens(c)), p(pages, "pages", c.num_pages());
            return c.insert(t.span(), p.span());
          },
          "tokens"_a, "pages"_a,
          "Caches tokens (a multiple of page_size) with their pages (one per page) and returns the\n"
          "node of the last page. The cache takes every page: those of an already cached prefix are\n"
          "freed as duplicates unless they are the cached pages themselves.")
      .def(
          "evict",
          [](RadixCache& c, nb::handle num_pages) {
            return c.evict(int_arg(num_pages, "num_pages", 0, INT64_MAX, true));
          },
          nb::sig("def evict(self, num_pages: int) -> int"), "num_pages"_a,
          "Evicts least-recently-used unlocked leaves (whole nodes) until num_pages were freed or\n"
          "nothing is evictable; returns the pages freed.")
      .def("check", &RadixCache::check, "Verifies every invariant; ValueError naming the first violation.")
      .def(
          "export_tree",
          [](const RadixCache& c, nb::handle nodes) {
            RadixCache::Export e = c.export_tree(Int32Arg(nodes, "nodes").span());
            return nb::make_tuple(to_numpy(std::move(e.parents)), to_numpy(std::move(e.num_tokens)),
                                  to_numpy(std::move(e.page_offsets)), to_numpy(std::move(e.page_ids)),
                                  to_numpy(std::move(e.node_index)));
          },
          "nodes"_a,
          "The smallest forest holding the root->node paths of nodes, for planning ->\n"
          "(parents, num_tokens, page_offsets, page_ids, node_index), int32 arrays. The empty root is\n"
          "left out (its children have parent -1); parents come before children; node v's pages are\n"
          "page_ids[page_offsets[v]:page_offsets[v+1]]; node_index[i] is nodes[i]'s index (-1 for root).");
}

}  // namespace treeattn::python
