// A stable LSD radix sort of 64-bit keys (no comparisons, so no branch
// mispredictions on keys that change from call to call).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace treeattn {

// Sorts `keys` ascending by their bits [low_bit, 64), keeping the order of
// keys equal there (stable): where the low bits hold each key's index, in
// increasing order on entry, the result is std::sort's. 8 bits a pass, a pass
// skipped where every key has the same digit; `tmp`: scratch. O(passes x
// (keys + 256)). The CUDA step executor sorts its units' keys every decode
// step (step_pack.cpp), where the keys change a little each step and
// std::sort's comparisons mispredict.
inline void radix_sort_keys(std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp, int low_bit) {
  if (keys.empty()) return;
  tmp.resize(keys.size());
  std::array<uint32_t, 256> start;
  for (int shift = low_bit; shift < 64; shift += 8) {
    start.fill(0);
    for (const uint64_t k : keys) ++start[(k >> shift) & 0xFF];
    if (start[(keys[0] >> shift) & 0xFF] == keys.size()) continue;  // one digit: the order stands
    uint32_t at = 0;
    for (uint32_t& s : start) {
      const uint32_t n = s;
      s = at;
      at += n;
    }
    for (const uint64_t k : keys) tmp[start[(k >> shift) & 0xFF]++] = k;
    keys.swap(tmp);
  }
}

}  // namespace treeattn
