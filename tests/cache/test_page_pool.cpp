// KvPagePool: allocation, freeing, and every error path (each message names the
// value and leaves the pool as it was).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <set>

#include "cache/cache_test_util.hpp"
#include "treeattn/cache.hpp"

using namespace treeattn;

TEST(CachePagePool, AllocHandsOutDistinctIdsInRange) {
  KvPagePool pool(8);
  EXPECT_EQ(pool.num_pages(), 8);
  EXPECT_EQ(pool.num_free(), 8);
  auto a = pool.alloc(3);
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  auto b = pool.alloc(5);
  EXPECT_EQ(pool.num_free(), 0);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 7);
  EXPECT_TRUE(pool.alloc(0).empty());
  pool.check();
}

TEST(CachePagePool, FreedPagesAreReusedFirst) {
  KvPagePool pool(8);
  auto a = pool.alloc(4);
  pool.free(std::vector<int32_t>{2});
  EXPECT_TRUE(pool.is_free(2));
  EXPECT_EQ(pool.alloc(1), std::vector<int32_t>{2});
  std::vector<int32_t> out{99};
  pool.alloc(2, out);  // appends
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], 99);
  EXPECT_EQ(pool.num_free(), 2);
  pool.check();
}

TEST(CachePagePool, AllocTooManyNamesRequestedAndFree) {
  KvPagePool pool(1024);
  pool.alloc(1021);
  EXPECT_ERROR_HAS(pool.alloc(12), "kv cache: 12 pages requested, 3 free of 1024");
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_ERROR_HAS(pool.alloc(-1), "alloc of -1 pages");
  EXPECT_EQ(pool.num_free(), 3);
  pool.check();
}

TEST(CachePagePool, FreeErrorsNameTheIdAndChangeNothing) {
  KvPagePool pool(8);
  auto a = pool.alloc(4);  // 0..3 handed out
  EXPECT_ERROR_HAS(pool.free(std::vector<int32_t>{1, 6}), "pages[1] = 6 is already free");
  EXPECT_ERROR_HAS(pool.free(std::vector<int32_t>{1, 8}), "pages[1] = 8 is out of range [0, 8)");
  EXPECT_ERROR_HAS(pool.free(std::vector<int32_t>{-1}), "pages[0] = -1 is out of range");
  EXPECT_ERROR_HAS(pool.free(std::vector<int32_t>{2, 3, 2}), "pages[2] = 2 is already free (double free)");
  // Nothing was freed by the failed calls.
  EXPECT_EQ(pool.num_free(), 4);
  for (int32_t id : a) EXPECT_FALSE(pool.is_free(id));
  EXPECT_ERROR_HAS(pool.is_free(8), "page id 8 is out of range [0, 8)");
  EXPECT_ERROR_HAS(pool.is_free(-1), "page id -1 is out of range [0, 8)");
  pool.check();
  pool.free(a);
  EXPECT_EQ(pool.num_free(), 8);
  pool.check();
}

TEST(CachePagePool, BadSize) {
  EXPECT_ERROR_HAS(KvPagePool(0), "num_pages = 0 must be in [1, 2147483647]");
  EXPECT_ERROR_HAS(KvPagePool(-5), "num_pages = -5");
  EXPECT_ERROR_HAS(KvPagePool(int64_t{INT32_MAX} + 1), "num_pages = 2147483648");
}
