// Golden tables for the creation ops (cc/rules/creation_rules.cc) that make their value
// in the requested layout: Fill and Empty (each device its block), random ops and
// LinSpace (drawn whole, then sliced). (Range: batch_parallel_test.cc.)
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;
using testing::OpCase;

TEST(CreationRules, EmptyMakesTheRequestedBlocks) {
  OpCase op("Empty", MakeMesh({{"x", 2}, {"y", 2}}));
  op.Host({8, 6}).Requested("[x,y]");
  EXPECT_EQ(op.PlanString(), "host[4, 3] -> [x,y]");
  // Each device runs Empty with its own block's shape: no communication.
  EXPECT_LINES(op.Steps(), {"host constant [4, 3] int32", "local Empty host [2] -> [x,y]"});
  EXPECT_LINES(op.Collectives(), {});
}

TEST(CreationRules, EmptyWithoutARequestIsReplicated) {
  OpCase op("Empty", MakeMesh({{"x", 2}}));
  op.Host({5, 3});
  EXPECT_EQ(op.PlanString(), "host[5, 3] -> [*,*]");
}

TEST(CreationRules, EmptyMakesUnevenBlocksOnEachDevice) {
  // 5 rows over x=2 (3 and 2), 3 columns over y=2 (2 and 1): each device takes its own
  // block's shape from a table of them, [x][y] -> shape, sliced over x and y.
  OpCase op("Empty", MakeMesh({{"x", 2}, {"y", 2}}));
  op.Host({5, 3}).Requested("[x,y]");
  EXPECT_EQ(op.PlanString(), "host -> [x,y]");
  EXPECT_LINES(op.Steps(), {"host constant [3, 2, 3, 1, 2, 2, 2, 1] int32",
                            "broadcast host [2, 2, 2] -> [*,*,*] @ mesh(x=2,y=2)",
                            "slice axis 0 over x [*,*,*] -> [x,*,*]",
                            "slice axis 1 over y [x,*,*] -> [x,y,*]",
                            "host constant [2] int32",
                            "local Reshape [x,y,*] host [1] -> [*] T=int32 Tshape=int32",
                            "local Empty [*] -> [x,y]"});
  EXPECT_LINES(op.Collectives(), {});
}

TEST(CreationRules, AnAxisOfSizeOneOverSeveralDevicesStaysReplicated) {
  // tf.ones([1, 4]) * x under call_with_layout: a broadcast operand, not cut.
  OpCase op("Fill", MakeMesh({{"x", 2}, {"y", 2}}));
  op.Host({1, 4}).In("[]", {}).Requested("[x,y]");
  EXPECT_EQ(op.PlanString(), "host[1, 4] [] -> [*,*]");
  // Over a mesh dimension of size 1 nothing is cut: the request stands.
  OpCase one("Fill", MakeMesh({{"x", 1}, {"y", 4}}));
  one.Host({1, 4}).In("[]", {}).Requested("[x,y]");
  EXPECT_EQ(one.PlanString(), "host[1, 1] [] -> [x,y]");
}

TEST(CreationRules, RandomOpsAreDrawnWholeThenSliced) {
  // The key and counter stay whole, so every layout gives the single-device values;
  // uneven blocks (5 rows over 4: 2, 2, 1, 0) are cut from the whole draw.
  OpCase op("StatelessRandomNormal", MakeMesh({{"x", 4}}));
  op.Host({5, 3}).Host({1, 2}, TF_INT64).Requested("[x,*]");
  EXPECT_EQ(op.PlanString(), "host host -> [x,*]");
  EXPECT_LINES(op.Steps(), {"local StatelessRandomNormal host [2] host [2] -> [*,*]",
                            "slice axis 0 over x [*,*] -> [x,*]"});
  EXPECT_LINES(op.Collectives(), {});
  // Without a request: replicated, whatever the rank.
  OpCase plain("StatelessRandomNormal", MakeMesh({{"x", 4}}));
  plain.Host({5, 3}).Host({1, 2}, TF_INT64);
  EXPECT_EQ(plain.PlanString(), "host host -> replicated");
}

TEST(CreationRules, LinSpaceIsMadeWholeThenSliced) {
  OpCase op("LinSpace", MakeMesh({{"x", 4}}));
  op.HostScalar(0, TF_FLOAT).HostScalar(1, TF_FLOAT).HostScalar(7).Requested("[x]");
  EXPECT_EQ(op.PlanString(), "host host host -> [x]");
  EXPECT_LINES(op.Collectives(), {});
}

TEST(CreationRules, FillMakesTheRequestedBlocks) {
  OpCase op("Fill", MakeMesh({{"x", 2}, {"y", 2}}));
  op.Host({8, 6}).In("[]", {}).Requested("[*,y]");
  EXPECT_EQ(op.PlanString(), "host[8, 3] [] -> [*,y]");
}

TEST(CreationRules, EmptyNeedsItsShape) {
  OpCase op("Empty", MakeMesh({{"x", 2}}));
  op.In("[x]", {2}, TF_INT32);
  const std::string plan = op.PlanString();
  EXPECT_TRUE(plan.find("'Empty' needs its shape (input 0)") != std::string::npos);
}

}  // namespace
}  // namespace tf_dtensor
