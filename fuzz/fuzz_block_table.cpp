// libFuzzer target: the JSON block-table format (block_tables_from_json):
// an Error or a valid Workload, whose tree holds every sequence's pages.
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.hpp"
#include "treeattn/workloads.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;  // fuzz_util.hpp: small files and trees

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const treeattn::Workload w = treeattn::block_tables_from_json(text, treeattn_fuzz::small_params());
    w.validate();  // built workloads are validated; this must not throw
  } catch (const treeattn::Error&) {
  }
  return 0;
}
