// radix_sort_keys and insertion_sort_keys (src/exec/radix_sort.hpp), the
// CUDA step executor's sorts of its units' (launch, length, unit) keys,
// against std::sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "exec/radix_sort.hpp"

using namespace treeattn;

TEST(RadixSort, EqualsStdSortOnStepExecutorKeys) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> keys, tmp, expect;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = trial == 0 ? 0 : size_t(rng() % 3000);
    // Launch in [0, 16), length from a range that varies by trial (a few
    // values, up to 2^30), the unit's index in the low 24 bits: the step
    // pack's key. Every 8th trial has one launch and lengths under 16: keys
    // with one digit in all passes but one (the passes the sort skips).
    const bool narrow = trial % 8 == 1;
    const uint64_t launches = narrow ? 1 : 1 + rng() % 16, lengths = narrow ? 16 : uint64_t(1) << (rng() % 31);
    keys.resize(n);
    for (size_t u = 0; u < n; ++u)
      keys[u] = (rng() % launches) << 60 | (UINT32_MAX - uint32_t(rng() % lengths)) << 24 | uint64_t(u);
    expect = keys;
    std::sort(expect.begin(), expect.end());
    radix_sort_keys(keys, tmp, 24);
    ASSERT_EQ(keys, expect) << "trial " << trial << " n " << n << " launches " << launches << " lengths " << lengths;
  }
}

TEST(RadixSort, KeepsTheOrderOfKeysEqualAboveLowBit) {
  // Equal above bit 8, the low byte unsorted: the order on entry stays.
  std::vector<uint64_t> keys{0x305, 0x101, 0x207, 0x103, 0x102}, tmp;
  radix_sort_keys(keys, tmp, 8);
  EXPECT_EQ(keys, (std::vector<uint64_t>{0x101, 0x103, 0x102, 0x207, 0x305}));
}

TEST(InsertionSort, SortsWithinItsMoveBoundAndGivesUpPastIt) {
  std::mt19937_64 rng(11);
  std::vector<uint64_t> keys, expect;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = size_t(rng() % 600);
    // Sorted distinct keys, then a few of them changed (a decode step's
    // lengths): nearly sorted, as the step pack starts from.
    expect.resize(n);
    for (size_t i = 0; i < n; ++i) expect[i] = (uint64_t(i) * 3 + rng() % 3) << 24 | i;
    keys = expect;
    const size_t changed = trial % 3 == 0 ? n : size_t(rng() % 8);
    for (size_t c = 0; c < changed && n > 0; ++c) {
      uint64_t& k = keys[rng() % n];
      k = (rng() % (3 * n + 3)) << 24 | (k & 0xFFFFFF);
    }
    expect = keys;
    std::sort(expect.begin(), expect.end());
    size_t inversions = 0;  // the moves an insertion sort makes
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) inversions += keys[i] > keys[j];
    std::vector<uint64_t> bounded = keys;
    const bool done = insertion_sort_keys(bounded, inversions);
    ASSERT_TRUE(done) << "trial " << trial;
    ASSERT_EQ(bounded, expect) << "trial " << trial;
    if (inversions > 0) {  // one move short: gives up, the keys still a permutation of the input
      bounded = keys;
      ASSERT_FALSE(insertion_sort_keys(bounded, inversions - 1)) << "trial " << trial;
      std::sort(bounded.begin(), bounded.end());
      ASSERT_EQ(bounded, expect) << "trial " << trial;
    }
  }
}
