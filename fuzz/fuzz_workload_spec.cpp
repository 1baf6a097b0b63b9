// libFuzzer target: workload spec strings (make_workload), every family.
// Specs that name files read them through the input limit, set small here.
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.hpp"
#include "treeattn/workloads.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256) return 0;  // specs are one line
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  try {
    treeattn::make_workload(spec, treeattn_fuzz::small_params());
  } catch (const treeattn::Error&) {
  }
  return 0;
}
