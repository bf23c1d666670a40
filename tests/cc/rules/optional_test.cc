// Optionals: one holding a TensorList takes the list's element metadata; a plain value is
// held whole.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;
using testing::OpCase;

const Mesh& Mesh2x2() {
  static const Mesh* mesh = new Mesh(MakeMesh({{"x", 2}, {"y", 2}}, "CPU"));
  return *mesh;
}

TEST(OptionalRules, FromValueHoldsAListOfShardedElementsAsItIs) {
  OpCase op("OptionalFromValue", Mesh2x2());
  op.In("[]", {}, TF_VARIANT).Elements("[x,*]", {4, 3}, TF_FLOAT);
  EXPECT_EQ(op.PlanString(), "= -> replicated");
  EXPECT_LINES(op.Collectives(), {});
}

TEST(OptionalRules, FromValueHoldsAPlainValueWhole) {
  OpCase op("OptionalFromValue", Mesh2x2());
  op.In("[x,y]", {4, 6});
  EXPECT_EQ(op.PlanString(), "[*,*] -> replicated");
  EXPECT_LINES(op.Collectives(), {"input 0: all-gather axis 0 [x,y] -> [*,y]",
                                  "input 0: all-gather axis 1 [*,y] -> [*,*]"});
}

TEST(OptionalRules, OneListPerOptional) {
  OpCase op("OptionalFromValue", Mesh2x2());
  op.In("[]", {}, TF_VARIANT).Elements("[x,*]", {4, 3}, TF_FLOAT);
  op.In("[]", {}, TF_VARIANT).Elements("[*,y]", {4, 6}, TF_FLOAT);
  EXPECT_ERROR(op.Forward(), kUnimplemented, {"at most one list"});
}

TEST(OptionalRules, GetValueAndHasValuePassTheOptional) {
  OpCase get("OptionalGetValue", Mesh2x2());
  get.In("[]", {}, TF_VARIANT).Elements("[x,*]", {4, 3}, TF_FLOAT);
  EXPECT_EQ(get.PlanString(), "= -> replicated");
  OpCase has("OptionalHasValue", Mesh2x2());
  has.In("[]", {}, TF_VARIANT);
  EXPECT_EQ(has.PlanString(), "= -> replicated");
}

}  // namespace
}  // namespace tf_dtensor
