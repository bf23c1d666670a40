// Which mesh an op runs on: one chooser for the eager executor (cc/device) and the
// tf.function expander (cc/graph), pure (layouts in, a mesh out).
//
// An op runs on its DTensor inputs' mesh, and they must agree:
//   AddV2([x,*] @ A, [*,*] @ A) -> A        AddV2([x,*] @ A, [x,*] @ B) -> error
// Some inputs may come from another mesh and move to the op's: a replicated scalar, and a
// replicated value the op reads as a host argument (a shape, an axis). TF caches small
// constants per device and one device serves every mesh, so such values turn up on any
// mesh; they are whole, so moving them copies no shard:
//   Reshape([x,*] @ A, shape [*] @ B) -> A, the shape moves to A
// A call of a function (a call, If, While) takes arguments on several meshes (its body
// places each op) and runs from its first one's; it reads every argument as data, so only
// its scalars move. relayout_like runs on the mesh of its layout input.
// With no input to decide, in order: the mesh of a relayout's target, of the layout
// requested of the result, the user's default mesh (run_on), a movable input's mesh, and
// last the enclosing function's mesh.
#ifndef TF_DTENSOR_CC_RULES_MESH_CHOICE_H_
#define TF_DTENSOR_CC_RULES_MESH_CHOICE_H_

#include <optional>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/mesh.h"
#include "cc/core/status.h"
#include "cc/rules/registry.h"
#include "cc/rules/rule.h"

namespace tf_dtensor {

// One input as the chooser sees it.
struct MeshChoiceInput {
  const Layout* layout = nullptr;  // null: a host (non-DTensor) tensor
  bool scalar = false;
  bool resource = false;
  bool parted = false;  // parts stand alone: they never move
};

// The op, and the meshes that decide when its inputs do not.
struct MeshChoiceOp {
  std::string name;  // the op type
  // Appended to the op name in errors, e.g. " (node 'add' of tf.function 'f')".
  std::string where;
  // Its rule: inputs it reads as host arguments may move. Null: none does.
  const RegisteredRule* rule = nullptr;
  // A call of a function (a call, If, While): its arguments may be on several meshes.
  bool calls_function = false;
  // The mesh of a relayout's target layout.
  std::optional<Mesh> target;
  // The mesh of the layout requested of the op's result (call_with_layout, a request
  // solved backward inside a function).
  std::optional<Mesh> requested;
  // The user's default mesh (dtensor.run_on): it wins over a movable input's mesh.
  std::optional<Mesh> default_mesh;
  // The enclosing function's mesh: the last resort.
  std::optional<Mesh> enclosing;
  // With no mesh above, the meshes the device has seen, when there are several (for the
  // message: which one an op without DTensor inputs runs on is then ambiguous).
  std::vector<Mesh> ambiguous;
};

struct MeshChoice {
  Mesh mesh;
  // The inputs to move onto `mesh` (increasing): whole values of another mesh.
  std::vector<int> moved;
};

// The mesh `op` runs on, and the inputs that move there. An error names the op and both
// meshes when DTensor inputs that cannot move disagree, or when nothing names a mesh.
StatusOr<MeshChoice> ChooseMesh(const MeshChoiceOp& op, const std::vector<MeshChoiceInput>& inputs);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_MESH_CHOICE_H_
