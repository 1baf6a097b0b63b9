// The kernel's division by the page size and the group size (cuda::Divisor, a multiply and a
// shift): exact for every page size the executors accept (1..65536) on the
// positions that are hardest for it (around each multiple of the page size and
// at the top of the range) and on random ones. Plain C++: no GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "exec/cuda/attention_params.hpp"

namespace treeattn {
namespace {

TEST(Divisor, ExactForEveryDivisorUpTo65536Below2To31) {
  std::mt19937_64 rng(7);
  constexpr uint32_t kTop = (1u << 31) - 1;  // positions are below 2^31
  int64_t checked = 0;
  for (uint32_t d = 1; d <= 65536; ++d) {
    const cuda::Divisor div = cuda::Divisor::of(int32_t(d));
    const auto check = [&](uint32_t n) {
      if (n > kTop) return;
      ASSERT_EQ(div.divide(n), n / d) << "page size " << d << ", position " << n;
      ++checked;
    };
    for (const uint32_t n : {0u, 1u, d - 1, d, d + 1, kTop, kTop - d, kTop - kTop % d, kTop - kTop % d - 1}) check(n);
    // Just below and at multiples of d spread over the range.
    for (int i = 0; i < 8; ++i) {
      const uint32_t k = uint32_t(rng() % (uint64_t(kTop) / d + 1));
      check(k * d);
      if (k > 0) check(k * d - 1);
      check(uint32_t(rng() % (uint64_t(kTop) + 1)));
    }
  }
  EXPECT_GT(checked, 65536 * 20);
  // The multiplier fits 32 bits and the page size 1 is the identity.
  EXPECT_EQ(cuda::Divisor::of(1).divide(kTop), kTop);
  EXPECT_EQ(cuda::Divisor::of(16).shift, 35);
  EXPECT_EQ(cuda::Divisor::of(65536).divide(kTop), kTop >> 16);
}

}  // namespace
}  // namespace treeattn
