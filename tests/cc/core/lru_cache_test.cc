// The bounded cache behind the expanded-function cache: it keeps at most its capacity,
// and what goes is the entry used least recently.
#include "cc/core/lru_cache.h"

#include <string>

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

std::optional<int> Lookup(LruCache<std::string, int>& cache, const std::string& key) {
  const int* value = cache.Find(key);
  return value ? std::optional<int>(*value) : std::nullopt;
}

TEST(LruCache, DropsTheLeastRecentlyUsedEntryWhenFull) {
  LruCache<std::string, int> cache(2);
  cache.Insert("a", 1);
  cache.Insert("b", 2);
  EXPECT_EQ(Lookup(cache, "a"), std::optional<int>(1));  // "a" is now the most recent
  cache.Insert("c", 3);
  EXPECT_EQ(cache.size(), size_t{2});
  EXPECT_EQ(Lookup(cache, "b"), std::optional<int>());
  EXPECT_EQ(Lookup(cache, "a"), std::optional<int>(1));
  EXPECT_EQ(Lookup(cache, "c"), std::optional<int>(3));
  cache.Insert("d", 4);  // "a" was used before "c"
  EXPECT_EQ(Lookup(cache, "a"), std::optional<int>());
  EXPECT_EQ(Lookup(cache, "c"), std::optional<int>(3));
  EXPECT_EQ(Lookup(cache, "d"), std::optional<int>(4));
}

TEST(LruCache, InsertingAKeyAgainReplacesItsValue) {
  LruCache<std::string, int> cache(2);
  cache.Insert("a", 1);
  cache.Insert("b", 2);
  cache.Insert("a", 10);  // replaced, and the most recent: "b" goes next
  EXPECT_EQ(cache.size(), size_t{2});
  cache.Insert("c", 3);
  EXPECT_EQ(Lookup(cache, "a"), std::optional<int>(10));
  EXPECT_EQ(Lookup(cache, "b"), std::optional<int>());
}

TEST(LruCache, StaysWithinItsCapacityOverALongHistory) {
  LruCache<int, int> cache(256);
  for (int i = 0; i < 1000; ++i) {
    cache.Insert(i, i * i);
    EXPECT_TRUE(cache.size() <= size_t{256});
  }
  EXPECT_EQ(cache.size(), size_t{256});
  // The last 256 are there, the earlier ones gone.
  EXPECT_TRUE(cache.Find(743) == nullptr);
  ASSERT_TRUE(cache.Find(744) != nullptr);
  EXPECT_EQ(*cache.Find(999), 999 * 999);
}

}  // namespace
}  // namespace tf_dtensor
