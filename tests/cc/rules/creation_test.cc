// Golden tables for the creation ops (cc/rules/creation_rules.cc) that make their blocks
// in the requested layout: Fill and Empty. (Range: batch_parallel_test.cc.)
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
  // A request the shape cannot take evenly (5 rows over 2) stays replicated.
  OpCase uneven("Empty", MakeMesh({{"x", 2}}));
  uneven.Host({5, 3}).Requested("[x,*]");
  EXPECT_EQ(uneven.PlanString(), "host[5, 3] -> [*,*]");
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
