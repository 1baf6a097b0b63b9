// libFuzzer target: the recorded tree-of-thoughts format (data/workloads/
// README.md, src/tree/recorded.cpp). Bytes 0..2 pick the task (0..3, or
// every task as one forest) and the iteration; the rest is the file's text.
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.hpp"
#include "tree/builder_util.hpp"
#include "treeattn/workloads.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;  // fuzz_util.hpp: small files and trees

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int pick = data[0] % 5, iter = data[1] | (data[2] << 8);
  const int task = pick == 4 ? treeattn::kTotAllTasks : pick;
  const std::string_view text(reinterpret_cast<const char*>(data + 3), size - 3);
  try {
    treeattn::detail::tot_workload_from_text(text, "fuzz.json", task, iter, treeattn_fuzz::small_params());
  } catch (const treeattn::Error&) {
  }
  return 0;
}
