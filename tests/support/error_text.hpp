// The message of the treeattn::Error a call throws, for tests that check
// what an error names.
#pragma once

#include <string>

#include "treeattn/types.hpp"

namespace treeattn::test_support {

// f()'s Error message, or "(accepted)" when it throws none.
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace treeattn::test_support
