// The choice of collective lowering per mesh and policy, its cache, and what follows
// from it without a TF runtime: buffer sharing and the leader tables.
#include "cc/spmd/lowering.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;

// Restores "auto" when a test that forces a lowering ends, pass or fail.
struct AutoPolicyAfter {
  ~AutoPolicyAfter() { (void)SetCollectiveLoweringPolicy("auto"); }
};

TEST(CollectiveLowering, AutoSharesBuffersOnCpusAndCopiesBetweenGpus) {
  AutoPolicyAfter reset;
  ASSERT_OK(SetCollectiveLoweringPolicy("auto"));
  const CollectiveLowering& cpu = CollectiveLowering::For(MakeMesh({{"x", 2}, {"y", 2}}));
  EXPECT_EQ(cpu.name(), "shared");
  EXPECT_TRUE(cpu.shares_buffers());
  // GPUs of this process: device-to-device copies, no shared buffers.
  const CollectiveLowering& gpu = CollectiveLowering::For(MakeMesh({{"x", 2}}, "GPU"));
  EXPECT_EQ(gpu.name(), "copies");
  EXPECT_FALSE(gpu.shares_buffers());
  EXPECT_EQ(CollectiveLoweringPolicy(), "auto");
}

TEST(CollectiveLowering, SettingThePolicyInForceKeepsTheGeneration) {
  AutoPolicyAfter reset;
  ASSERT_OK(SetCollectiveLoweringPolicy("copies"));
  const uint64_t before = CollectiveLoweringGeneration();
  ASSERT_OK(SetCollectiveLoweringPolicy("copies"));
  EXPECT_EQ(CollectiveLoweringGeneration(), before);
  EXPECT_EQ(CollectiveLowering::For(MakeMesh({{"x", 2}})).name(), "copies");
  ASSERT_OK(SetCollectiveLoweringPolicy("ops"));
  EXPECT_NE(CollectiveLoweringGeneration(), before);
}

TEST(CollectiveLowering, ForcingOpsChangesTheCachedChoiceAndTheLeaders) {
  AutoPolicyAfter reset;
  ASSERT_OK(SetCollectiveLoweringPolicy("auto"));
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  EXPECT_EQ(CollectiveLowering::For(mesh).name(), "shared");
  EXPECT_EQ(LocalLeaders(mesh, {0}), (std::vector<int>{0, 0, 2, 2}));
  const uint64_t before = CollectiveLoweringGeneration();
  ASSERT_OK(SetCollectiveLoweringPolicy("ops"));
  EXPECT_NE(CollectiveLoweringGeneration(), before);
  EXPECT_EQ(CollectiveLoweringPolicy(), "ops");
  // The same mesh, asked again: the cached choice follows the policy.
  EXPECT_EQ(CollectiveLowering::For(mesh).name(), "ops");
  EXPECT_FALSE(CollectiveLowering::For(mesh).shares_buffers());
  // Without shared buffers every device computes its own block.
  EXPECT_EQ(LocalLeaders(mesh, {0}), (std::vector<int>{0, 1, 2, 3}));
  ASSERT_OK(SetCollectiveLoweringPolicy("auto"));
  EXPECT_EQ(CollectiveLowering::For(mesh).name(), "shared");
  EXPECT_EQ(LocalLeaders(mesh, {0}), (std::vector<int>{0, 0, 2, 2}));
}

TEST(CollectiveLowering, ForcedSharedBuffersNeedSharedMemory) {
  AutoPolicyAfter reset;
  ASSERT_OK(SetCollectiveLoweringPolicy("shared"));
  EXPECT_EQ(CollectiveLowering::For(MakeMesh({{"x", 2}})).name(), "shared");
  // GPUs share no buffers: "auto"'s choice stands.
  EXPECT_EQ(CollectiveLowering::For(MakeMesh({{"x", 2}}, "GPU")).name(), "copies");
}

TEST(CollectiveLowering, UnknownPolicyIsRefusedAndNamesTheChoices) {
  AutoPolicyAfter reset;
  ASSERT_OK(SetCollectiveLoweringPolicy("ops"));
  Status status = SetCollectiveLoweringPolicy("nccl");
  EXPECT_TRUE(status.code() == Code::kInvalidArgument);
  EXPECT_TRUE(status.message().find("`nccl`") != std::string::npos);
  EXPECT_TRUE(status.message().find("expected `auto`, `shared`, `copies` or `ops`") != std::string::npos);
  // The policy in force stays.
  EXPECT_EQ(CollectiveLoweringPolicy(), "ops");
}

// The device id at the end of a device name: "...GPU:3" -> 3.
int TrailingId(const std::string& device) {
  return std::stoi(device.substr(device.rfind(':') + 1));
}

// Sets DTENSOR_GPU_USE_NCCL_COMMUNICATION and a physical-GPU lookup for one test.
struct NcclAsked {
  explicit NcclAsked(PhysicalDeviceLookup lookup) {
    setenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "1", 1);
    SetPhysicalDeviceLookup(std::move(lookup));
  }
  ~NcclAsked() {
    unsetenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION");
    SetPhysicalDeviceLookup(nullptr);
  }
};

TEST(CollectiveLowering, NcclServesDistinctPhysicalGpusWhenAskedFor) {
  AutoPolicyAfter reset;
  ASSERT_OK(SetCollectiveLoweringPolicy("auto"));
  const Mesh gpus = MakeMesh({{"x", 4}}, "GPU");
  EXPECT_FALSE(UsesNccl(gpus));  // not asked for
  {
    // One physical GPU per device: NCCL, through the collective-ops lowering.
    NcclAsked asked([](const std::string& d) { return std::optional<int>(TrailingId(d)); });
    EXPECT_TRUE(UsesNccl(gpus));
    EXPECT_EQ(CollectiveLowering::For(gpus).name(), "ops");
    EXPECT_FALSE(UsesNccl(MakeMesh({{"x", 4}})));  // CPUs: never
    EXPECT_EQ(CollectiveLowering::For(MakeMesh({{"x", 4}})).name(), "shared");
  }
  {
    // Logical GPUs, two to a physical GPU: NCCL cannot run there; the copies stay.
    NcclAsked asked([](const std::string& d) { return std::optional<int>(TrailingId(d) / 2); });
    EXPECT_FALSE(UsesNccl(gpus));
    EXPECT_EQ(CollectiveLowering::For(gpus).name(), "copies");
  }
  {
    // A device TF does not know as a GPU: not NCCL.
    NcclAsked asked([](const std::string&) { return std::optional<int>(); });
    EXPECT_FALSE(UsesNccl(gpus));
    EXPECT_EQ(CollectiveLowering::For(gpus).name(), "copies");
  }
  // Unset again: the copies.
  EXPECT_EQ(CollectiveLowering::For(gpus).name(), "copies");
}

}  // namespace
}  // namespace tf_dtensor
