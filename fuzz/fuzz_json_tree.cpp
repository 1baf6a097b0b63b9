// libFuzzer target: the JSON tree format (docs/formats.md, workload_from_json).
// Any input either gives an Error or a valid Workload; an accepted tree must
// round-trip through workload_to_json to the same tree.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_util.hpp"
#include "treeattn/workloads.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;  // fuzz_util.hpp: small files and trees

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  treeattn::Workload w;
  try {
    w = treeattn::workload_from_json(text, treeattn_fuzz::small_params());
  } catch (const treeattn::Error&) {
    return 0;
  }
  const treeattn::Workload again = treeattn::workload_from_json(treeattn::workload_to_json(w), {});
  treeattn_fuzz::require(treeattn_fuzz::same_tree(w, again), "json round trip changed the tree");
  return 0;
}
