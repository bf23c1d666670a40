// The one mesh chooser of the eager and the tf.function paths: inputs on one mesh decide,
// whole values of another mesh move, and the named meshes decide in order otherwise.
#include "cc/rules/mesh_choice.h"

#include "cc/rules/registry.h"
#include "cc/spmd/layout_types.h"
#include "cc/tf/ops.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;

// Two disjoint meshes: A on CPU:0-3, B on CPU:4-5.
const Mesh& A() {
  static const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  return mesh;
}
const Mesh& B() {
  static const Mesh mesh = MakeMesh({{"x", 2}}, "CPU", 4);
  return mesh;
}

MeshChoiceInput DTensor(const Layout& layout, bool scalar = false) {
  MeshChoiceInput in;
  in.layout = &layout;
  in.scalar = scalar;
  return in;
}

MeshChoiceOp Op(const std::string& name) {
  MeshChoiceOp op;
  op.name = name;
  op.rule = RuleRegistry::Global().Find(name);
  return op;
}

TEST(MeshChoice, InputsOnOneMeshDecideAndOthersRaise) {
  const Layout a = MakeLayout("[x,*]", A()), b = MakeLayout("[x,*]", B());
  ASSERT_OK_AND_ASSIGN(MeshChoice same, ChooseMesh(Op("AddV2"), {DTensor(a), DTensor(a)}));
  EXPECT_EQ(same.mesh, A());
  EXPECT_EQ(same.moved, std::vector<int>{});
  MeshChoiceOp add = Op("AddV2");
  add.where = " (node 'add' of tf.function 'f')";
  EXPECT_ERROR(ChooseMesh(add, {DTensor(a), DTensor(b)}), kInvalidArgument,
               {"'AddV2' (node 'add' of tf.function 'f') got inputs on different meshes: "
                "mesh(x=2,y=2) and mesh(x=2) (input 1, [x,*] @ mesh(x=2))",
                "`dtensor.copy_to_mesh`"});
  // A replicated non-scalar used as data is a value of its mesh: it does not move.
  const Layout whole_b = Layout::Replicated(B(), 2);
  EXPECT_ERROR(ChooseMesh(Op("AddV2"), {DTensor(a), DTensor(whole_b)}), kInvalidArgument,
               {"different meshes"});
}

TEST(MeshChoice, ReplicatedScalarsAndHostArgumentsMove) {
  const Layout a = MakeLayout("[x,y]", A());
  const Layout scalar_b = Layout::Replicated(B(), 0);
  // The scalar comes first but does not decide: it moves to the data's mesh.
  ASSERT_OK_AND_ASSIGN(MeshChoice add,
                       ChooseMesh(Op("AddV2"), {DTensor(scalar_b, true), DTensor(a)}));
  EXPECT_EQ(add.mesh, A());
  EXPECT_EQ(add.moved, std::vector<int>{0});
  // Reshape reads input 1 (the shape) as a host argument: a replicated vector moves.
  const Layout shape_b = Layout::Replicated(B(), 1);
  ASSERT_OK_AND_ASSIGN(MeshChoice reshape,
                       ChooseMesh(Op("Reshape"), {DTensor(a), DTensor(shape_b)}));
  EXPECT_EQ(reshape.mesh, A());
  EXPECT_EQ(reshape.moved, std::vector<int>{1});
  // A resource or a part never moves, scalar or not.
  MeshChoiceInput handle = DTensor(scalar_b, true);
  handle.resource = true;
  EXPECT_ERROR(ChooseMesh(Op("AddV2"), {DTensor(a), handle}), kInvalidArgument,
               {"different meshes"});
  MeshChoiceInput part = DTensor(scalar_b, true);
  part.parted = true;
  EXPECT_ERROR(ChooseMesh(Op("AddV2"), {DTensor(a), part}), kInvalidArgument,
               {"different meshes", "input 1, parted[] @ mesh(x=2)"});
  // Host tensors take no part in the choice.
  ASSERT_OK_AND_ASSIGN(MeshChoice host, ChooseMesh(Op("AddV2"), {MeshChoiceInput{}, DTensor(a)}));
  EXPECT_EQ(host.mesh, A());
}

TEST(MeshChoice, FunctionCallsTakeSeveralMeshesAndMoveOnlyScalars) {
  const Layout b = MakeLayout("[x]", B()), a = MakeLayout("[x,y]", A());
  const Layout vector_a = Layout::Replicated(A(), 1), scalar_a = Layout::Replicated(A(), 0);
  MeshChoiceOp call = Op("f");
  call.calls_function = true;
  ASSERT_OK_AND_ASSIGN(
      MeshChoice choice,
      ChooseMesh(call, {DTensor(scalar_a, true), DTensor(b), DTensor(a), DTensor(vector_a)}));
  EXPECT_EQ(choice.mesh, B());  // the first argument that is not a scalar
  EXPECT_EQ(choice.moved, std::vector<int>{0});
}

TEST(MeshChoice, RelayoutLikeRunsOnItsLayoutInputsMesh) {
  const Layout a = MakeLayout("[x,y]", A()), b = MakeLayout("[x,*]", B());
  ASSERT_OK_AND_ASSIGN(MeshChoice choice, ChooseMesh(Op(kRelayoutLikeOp), {DTensor(a), DTensor(b)}));
  EXPECT_EQ(choice.mesh, B());
  EXPECT_EQ(choice.moved, std::vector<int>{});
}

TEST(MeshChoice, NamedMeshesDecideInOrderWhenNoInputDoes) {
  const Layout scalar_b = Layout::Replicated(B(), 0);
  const Mesh c = MakeMesh({{"x", 4}}, "CPU", 8);
  MeshChoiceOp op = Op("AddV2");
  op.enclosing = c;
  // Only movable inputs: the enclosing function's mesh comes after theirs.
  ASSERT_OK_AND_ASSIGN(MeshChoice moved, ChooseMesh(op, {DTensor(scalar_b, true)}));
  EXPECT_EQ(moved.mesh, B());
  // The user's default mesh comes before them; the requested layout's before that, and
  // a relayout's target first.
  op.default_mesh = A();
  ASSERT_OK_AND_ASSIGN(MeshChoice by_default, ChooseMesh(op, {DTensor(scalar_b, true)}));
  EXPECT_EQ(by_default.mesh, A());
  EXPECT_EQ(by_default.moved, std::vector<int>{0});
  op.requested = c;
  ASSERT_OK_AND_ASSIGN(MeshChoice requested, ChooseMesh(op, {DTensor(scalar_b, true)}));
  EXPECT_EQ(requested.mesh, c);
  op.target = B();
  ASSERT_OK_AND_ASSIGN(MeshChoice target, ChooseMesh(op, {DTensor(scalar_b, true)}));
  EXPECT_EQ(target.mesh, B());
  EXPECT_EQ(target.moved, std::vector<int>{});
  // With only host inputs, the enclosing mesh is the last resort.
  MeshChoiceOp inner = Op("AddV2");
  inner.enclosing = c;
  ASSERT_OK_AND_ASSIGN(MeshChoice enclosing, ChooseMesh(inner, {MeshChoiceInput{}}));
  EXPECT_EQ(enclosing.mesh, c);
}

TEST(MeshChoice, NamedSingleDeviceMeshesTakeTheirRuntimeForm) {
  ASSERT_OK_AND_ASSIGN(Mesh single, Mesh::FromDevice("CPU:1"));
  MeshChoiceOp op = Op("AddV2");
  op.default_mesh = single;
  ASSERT_OK_AND_ASSIGN(MeshChoice choice, ChooseMesh(op, {MeshChoiceInput{}}));
  EXPECT_EQ(choice.mesh, RuntimeMesh(single));
  EXPECT_TRUE(IsRuntimeSingleDeviceMesh(choice.mesh));
}

TEST(MeshChoice, NoMeshAtAllRaises) {
  EXPECT_ERROR(ChooseMesh(Op("AddV2"), {MeshChoiceInput{}, MeshChoiceInput{}}), kInvalidArgument,
               {"'AddV2' was placed on the DTensor device", "`dtensor.run_on(mesh)`"});
}

}  // namespace
}  // namespace tf_dtensor
