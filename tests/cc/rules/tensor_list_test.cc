// TensorList ops: a list records its elements' layout; element ops pass it through.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;
using testing::OpCase;

const Mesh& Mesh2x2() {
  static const Mesh* mesh = new Mesh(MakeMesh({{"x", 2}, {"y", 2}}, "CPU"));
  return *mesh;
}

// A list input whose elements have layout `spec` and global `shape`.
void List(OpCase& op, const std::string& spec, std::vector<int64_t> shape) {
  op.In("[]", {}, TF_VARIANT).Elements(spec, std::move(shape), TF_FLOAT);
}

TEST(TensorListRules, NewListsLeaveTheElementShapeOpen) {
  OpCase op("TensorListReserve", Mesh2x2());
  op.Host({4, 3}).HostScalar(5);
  EXPECT_EQ(op.PlanString(), "host[-1, -1] host -> []");
  EXPECT_LINES(op.Steps(), {"host constant [-1, -1] int32",
                            "local TensorListReserve host [2] host [] -> []"});
}

TEST(TensorListRules, SetItemTakesTheListsElementLayout) {
  OpCase op("TensorListSetItem", Mesh2x2());
  List(op, "[x,*]", {4, 3});
  op.HostScalar(1).In("[*,y]", {4, 3});
  EXPECT_EQ(op.PlanString(), "= host [x,*] -> []");
  EXPECT_LINES(op.Collectives(), {"input 2: slice axis 0 over x [*,y] -> [x,y]",
                                  "input 2: all-gather axis 1 [x,y] -> [x,*]"});
}

TEST(TensorListRules, StackPutsTheElementsOnANewAxis) {
  OpCase op("TensorListStack", Mesh2x2());
  List(op, "[x,y]", {4, 6});
  op.Host({4, 6});
  EXPECT_EQ(op.PlanString(), "= host[2, 3] -> [*,x,y]");
  EXPECT_LINES(op.Steps(), {"host constant [2, 3] int32",
                            "local TensorListStack [] host [2] -> [*,x,y]"});
}

TEST(TensorListRules, GetItemOfUnevenElements) {
  OpCase op("TensorListGetItem", Mesh2x2());
  List(op, "[x,y]", {5, 6});
  op.HostScalar(0).Host({5, 6});
  // 5 rows over x=2 are uneven: the local element shape leaves them open.
  EXPECT_EQ(op.PlanString(), "= host host[-1, 3] -> [x,y]");
}

TEST(TensorListRules, FromTensorGathersTheLeadingAxis) {
  OpCase op("TensorListFromTensor", Mesh2x2());
  op.In("[x,y,*]", {4, 6, 2}).Host({6, 2});
  EXPECT_EQ(op.PlanString(), "[*,y,*] host[3, 2] -> []");
}

TEST(TensorListRules, ConcatGathersTheElementsAxisZero) {
  OpCase op("TensorListConcatV2", Mesh2x2());
  List(op, "[x,y]", {4, 6});
  op.Host({-1, 6}).Host({});
  // Each device's joined blocks would interleave the elements' rows: axis 0 is gathered.
  EXPECT_EQ(op.PlanString(), "= host[-1, 3] host -> [*,y] [*]");
  EXPECT_LINES(op.Collectives(),
               {"elements of list input 0: all-gather axis 1 [*,x,y] -> [*,*,y]"});
  EXPECT_LINES(op.Steps(), {"host constant [-1, 3] int32", "host constant [2, 3] int32",
                            "local TensorListStack [] host [2] -> [*,x,y] element_dtype=float32 "
                            "num_elements=-1",
                            "all-gather axis 1 [*,x,y] -> [*,*,y]", "host constant [4, 3] int32",
                            "local TensorListFromTensor [*,*,y] host [2] -> [] "
                            "element_dtype=float32 shape_type=int32",
                            "local TensorListConcatV2 [] host [2] host [0] -> [*,y] [*]"});
}

TEST(TensorListRules, ConcatOfElementsOfDifferingLengths) {
  OpCase op("TensorListConcatV2", Mesh2x2());
  List(op, "[*,y]", {-1, 6});
  op.Host({-1, 6}).Host({});
  EXPECT_EQ(op.PlanString(), "= host[-1, 3] host -> [*,y] [*]");
  EXPECT_LINES(op.Collectives(), {});
}

TEST(TensorListRules, AddNOfListsSlicesTheirElementsToOneLayout) {
  // A loop gradient's sum of the zeros it starts from (replicated rows) and a step's
  // gradient rows (sharded): the replicated elements are sliced, with no communication.
  OpCase op("AddN", Mesh2x2());
  List(op, "[*,*]", {4, 3});
  List(op, "[x,*]", {4, 3});
  EXPECT_EQ(op.PlanString(), "[] [] -> []");
  EXPECT_LINES(op.Collectives(),
               {"elements of list input 0: slice axis 1 over x [*,*,*] -> [*,x,*]"});
  EXPECT_LINES(op.Steps(), {"host constant [4, 3] int32",
                            "local TensorListStack [] host [2] -> [*,*,*] element_dtype=float32 "
                            "num_elements=-1",
                            "slice axis 1 over x [*,*,*] -> [*,x,*]", "host constant [2, 3] int32",
                            "local TensorListFromTensor [*,x,*] host [2] -> [] "
                            "element_dtype=float32 shape_type=int32",
                            "local AddN [] [] -> []"});
}

TEST(TensorListRules, AddNOfListsOfCrossedElementsTakesTheFirstLayout) {
  OpCase op("AddN", Mesh2x2());
  List(op, "[x,*]", {4, 6});
  List(op, "[*,x]", {4, 6});
  EXPECT_LINES(op.Collectives(),
               {"elements of list input 1: all-to-all axis 2 -> 1 [*,*,x] -> [*,x,*]"});
}

}  // namespace
}  // namespace tf_dtensor
