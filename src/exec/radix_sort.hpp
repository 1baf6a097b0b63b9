// Sorts of 64-bit keys for the CUDA step executor's units (step_pack.cpp):
// a stable LSD radix sort (no comparisons, so no branch mispredictions on
// keys that change from call to call), and an insertion sort for keys in
// nearly sorted order (the last step's order, a token longer).
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

// Sorts distinct `keys` ascending by insertion if that takes at most
// `max_moves` moves (a key passing another): O(keys + moves), one
// comparison per key where the order stands. Returns false, the keys then
// partly sorted (a permutation of the input), once it would take more.
inline bool insertion_sort_keys(std::vector<uint64_t>& keys, size_t max_moves) {
  size_t moves = 0;
  for (size_t i = 1; i < keys.size(); ++i) {
    const uint64_t k = keys[i];
    size_t j = i;
    for (; j > 0 && keys[j - 1] > k; --j) keys[j] = keys[j - 1];
    keys[j] = k;
    moves += i - j;
    if (moves > max_moves) return false;
  }
  return true;
}

}  // namespace treeattn
