// The pieces of the Python extension treeattn._treeattn, one function per
// layer it exposes (module.cpp calls each).
#pragma once

#include <nanobind/nanobind.h>

#include <cstring>

namespace treeattn::python {

// A boolean: Python's, or a NumPy / PyTorch one or array of them (np.True_,
// torch.tensor(True), np.array([True])), which would convert to the number 1
// (or ids of 0 and 1) where a number, a handle or an id belongs.
inline bool bool_like(PyObject* o) {
  if (PyBool_Check(o)) return true;
  if (PyLong_CheckExact(o) || PyFloat_CheckExact(o)) return false;
  PyObject* dtype = PyObject_GetAttrString(o, "dtype");
  if (!dtype) {
    PyErr_Clear();
    return false;
  }
  PyObject* s = PyObject_Str(dtype);
  Py_DECREF(dtype);
  const char* d = s ? PyUnicode_AsUTF8(s) : nullptr;
  const bool yes = d && (std::strcmp(d, "bool") == 0 || std::strcmp(d, "torch.bool") == 0);
  Py_XDECREF(s);
  PyErr_Clear();
  return yes;
}

void bind_runtime(nanobind::module_& m);  // TreeAttention (module.cpp)
void bind_cache(nanobind::module_& m);    // RadixCache (bind_cache.cpp)

}  // namespace treeattn::python
