// libFuzzer target: the recorded Medusa token-tree format (data/workloads/
// README.md, src/tree/recorded.cpp). Bytes 0..2 pick the record, the step and
// the prefix length; the rest is the file's text.
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.hpp"
#include "tree/builder_util.hpp"

static const treeattn_fuzz::SmallInputLimit kLimit;  // fuzz_util.hpp: small files and trees

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int record = data[0] % 4, step = data[1] % 32, prefix = 1 + data[2] * 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 3), size - 3);
  try {
    treeattn::detail::medusa_workload_from_text(text, "fuzz.json", record, step, prefix,
                                                treeattn_fuzz::small_params());
  } catch (const treeattn::Error&) {
  }
  return 0;
}
