// Collective groups: who reduces or gathers with whom, their keys and the leader tables
// of the shared-buffer lowering, on CPU, GPU-typed and local-subset meshes.
#include "cc/spmd/collectives.h"

#include <string>
#include <vector>

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;

TEST(CollectiveGroups, GroupsFollowTheOtherCoordinates) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 4}});
  const CollectiveGroups& over_y = CollectiveGroups::For(mesh, {1});
  EXPECT_EQ(over_y.groups(), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(over_y.group_size(), 4);
  EXPECT_EQ(over_y.group_of(5), 1);
  EXPECT_EQ(over_y.rank_of(5), 1);
  const CollectiveGroups& over_x = CollectiveGroups::For(mesh, {0});
  EXPECT_EQ(over_x.groups().size(), 4u);
  EXPECT_EQ(over_x.groups()[1], (std::vector<int64_t>{1, 5}));
  const CollectiveGroups& both = CollectiveGroups::For(mesh, {0, 1});
  EXPECT_EQ(both.group_size(), 8);
  EXPECT_TRUE(over_y.all_local());
  // Cached: the same object for the same (mesh, dims).
  EXPECT_TRUE(&CollectiveGroups::For(mesh, {1}) == &over_y);
  // Keys differ between groups and agree for equal meshes.
  EXPECT_NE(over_y.group_key(0), over_y.group_key(1));
  EXPECT_EQ(CollectiveGroups::For(MakeMesh({{"x", 2}, {"y", 4}}), {1}).group_key(1),
            over_y.group_key(1));
}

TEST(CollectiveGroups, LeadersShareOnlyWhereMemoryIsShared) {
  // [x,*] on mesh(x=2,y=2): devices agreeing on x hold the same block.
  Mesh cpu = MakeMesh({{"x", 2}, {"y", 2}});
  EXPECT_EQ(LocalLeaders(cpu, {0}), (std::vector<int>{0, 0, 2, 2}));
  EXPECT_EQ(LocalLeaders(cpu, {}), (std::vector<int>{0, 0, 0, 0}));
  Mesh gpu = MakeMesh({{"x", 2}, {"y", 2}}, "GPU");
  EXPECT_EQ(LocalLeaders(gpu, {0}), (std::vector<int>{0, 1, 2, 3}));
  // A collective's result is still made once per group and copied to the rest.
  EXPECT_EQ(GroupLeaders(gpu, {0}), (std::vector<int>{0, 0, 2, 2}));
  EXPECT_EQ(GroupLeaders(gpu, {}), (std::vector<int>{0, 0, 0, 0}));
}

TEST(CollectiveGroups, InstanceKeysAreFresh) {
  const int64_t before = InstanceKeysIssued();
  const int32_t a = NextInstanceKey();
  const int32_t b = NextInstanceKey();
  EXPECT_NE(a, b);
  EXPECT_EQ(InstanceKeysIssued(), before + 2);
}

TEST(CollectiveGroups, ReturnedInstanceKeysServeOnlyTheirSignature) {
  const int32_t a = TakeInstanceKey("test-signature-a");
  const int32_t b = TakeInstanceKey("test-signature-a");  // `a` is still held: fresh
  EXPECT_NE(a, b);
  ReturnInstanceKey("test-signature-a", a);
  const int64_t before = InstanceKeysIssued();
  EXPECT_EQ(TakeInstanceKey("test-signature-a"), a);
  EXPECT_EQ(InstanceKeysIssued(), before);
  EXPECT_NE(TakeInstanceKey("test-signature-b"), a);  // another signature gets its own
  EXPECT_EQ(InstanceKeysIssued(), before + 1);
}

TEST(CollectiveGroups, MeshesNoLongerHeldLeaveTheCache) {
  // A program that made a new mesh per step (new dimension names) kept each mesh's
  // groups, leaders and text in the cache for good: about 3 KB a mesh, without bound.
  Mesh kept = MakeMesh({{"kept", 2}, {"other", 4}});
  const CollectiveGroups& kept_groups = CollectiveGroups::For(kept, {1});
  const std::vector<int>* kept_leaders = &LocalLeaders(kept, {0});
  for (int i = 0; i < 2000; ++i) {
    Mesh mesh = MakeMesh({{"a" + std::to_string(i), 2}, {"b", 4}});
    EXPECT_EQ(CollectiveGroups::For(mesh, {1}).group_size(), 4);
    EXPECT_EQ(CollectiveGroups::For(mesh, {0, 1}).group_size(), 8);
    EXPECT_EQ(LocalLeaders(mesh, {0}).size(), 8u);
  }
  EXPECT_TRUE(CollectiveCacheEntries() < 1000);  // 6,000 and more before
  // A mesh still held keeps its entries: the same objects as before.
  EXPECT_TRUE(&CollectiveGroups::For(kept, {1}) == &kept_groups);
  EXPECT_TRUE(&LocalLeaders(kept, {0}) == kept_leaders);
  EXPECT_EQ(kept_groups.groups()[0], (std::vector<int64_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace tf_dtensor
