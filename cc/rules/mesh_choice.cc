#include "cc/rules/mesh_choice.h"

#include "cc/spmd/layout_types.h"
#include "cc/tf/ops.h"

namespace tf_dtensor {
namespace {

// `mesh` in a message beside `other`: its short form ("mesh(x=4)"), with its name and
// devices where that alone would not tell the two apart.
std::string Distinct(const Mesh& mesh, const Mesh& other) {
  std::string text = mesh.ShortString();
  if (text != other.ShortString()) return text;
  std::string devices;
  const std::vector<std::string>& all = mesh.local_devices().empty() ? mesh.global_devices()
                                                                     : mesh.local_devices();
  for (size_t i = 0; i < all.size(); ++i) {
    devices += (i ? "," : "") + ShortDeviceName(all[i]);
  }
  return text + " (" + (mesh.name().empty() ? "" : "'" + mesh.name() + "' ") + "on " + devices +
         ")";
}

}  // namespace

StatusOr<MeshChoice> ChooseMesh(const MeshChoiceOp& op,
                                const std::vector<MeshChoiceInput>& inputs) {
  const int n = static_cast<int>(inputs.size());
  // relayout_like(x, like) puts x in like's layout, on like's mesh, whatever x's is.
  if (op.name == kRelayoutLikeOp && n == 2 && inputs[1].layout) {
    return MeshChoice{inputs[1].layout->mesh(), {}};
  }
  auto movable = [&](int i) {
    const MeshChoiceInput& in = inputs[i];
    return in.layout && !in.resource && !in.parted && in.layout->IsFullyReplicated() &&
           (in.scalar || (!op.calls_function && op.rule && op.rule->traits.IsHostInput(i, n)));
  };
  std::optional<Mesh> mesh;
  for (int i = 0; i < n; ++i) {
    if (!inputs[i].layout || movable(i)) continue;
    const Mesh& m = inputs[i].layout->mesh();
    if (!mesh) {
      mesh = m;
    } else if (*mesh != m && !op.calls_function) {
      return InvalidArgument(
          "'" + op.name + "'" + op.where + " got inputs on different meshes: " +
          Distinct(UserMesh(*mesh), UserMesh(m)) + " and " +
          Distinct(UserMesh(m), UserMesh(*mesh)) + " (input " +
          std::to_string(i) + ", " + UserLayout(*inputs[i].layout, inputs[i].parted).ShortString() +
          "). An op runs on one mesh and does not combine values of two meshes: move one "
          "first with `dtensor.copy_to_mesh`, or `dtensor.relayout` to a layout on the other "
          "mesh.");
    }
  }
  // Meshes named by the user or the caller are single-device in their user form; inputs
  // carry the runtime form (cc/spmd/layout_types.h).
  for (const std::optional<Mesh>* named : {&op.target, &op.requested, &op.default_mesh}) {
    if (!mesh && *named) mesh = RuntimeMesh(**named);
  }
  for (int i = 0; i < n && !mesh; ++i) {
    if (inputs[i].layout) mesh = inputs[i].layout->mesh();
  }
  if (!mesh && op.enclosing) mesh = RuntimeMesh(*op.enclosing);
  if (!mesh && op.ambiguous.size() >= 2) {
    return InvalidArgument(
        "'" + op.name + "'" + op.where +
        " was placed on the DTensor device but none of its inputs is a DTensor, no mesh is "
        "set, and the device has seen several meshes (" +
        Distinct(op.ambiguous[0], op.ambiguous[1]) + " and " +
        Distinct(op.ambiguous[1], op.ambiguous[0]) +
        "), so it cannot tell which one the op runs on. Run it under "
        "`dtensor.run_on(mesh)` or use `dtensor.call_with_layout(fn, layout, ...)`.");
  }
  if (!mesh) {
    return InvalidArgument("'" + op.name + "'" + op.where +
                           " was placed on the DTensor device but none of its inputs is a "
                           "DTensor and no mesh is set (No default mesh has been registered "
                           "to DTensor). Run it under `dtensor.run_on(mesh)` or use "
                           "`dtensor.call_with_layout(fn, layout, ...)`.");
  }
  TFD_RETURN_IF_ERROR(CheckRunsHere(*mesh, "'" + op.name + "'" + op.where));
  MeshChoice choice{*mesh, {}};
  for (int i = 0; i < n; ++i) {
    if (movable(i) && inputs[i].layout->mesh() != *mesh) choice.moved.push_back(i);
  }
  return choice;
}

}  // namespace tf_dtensor
