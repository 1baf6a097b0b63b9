// The pieces of the Python extension treeattn._treeattn, one function per
// layer it exposes (module.cpp calls each).
#pragma once

#include <nanobind/nanobind.h>

namespace treeattn::python {

void bind_runtime(nanobind::module_& m);  // TreeAttention (module.cpp)
void bind_cache(nanobind::module_& m);    // RadixCache (bind_cache.cpp)

}  // namespace treeattn::python
