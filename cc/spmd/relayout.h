// Relayout: moving a value from one layout to another, on its mesh or onto another.
//
// Planning and emitting are apart, as PyTorch's `_gen_transform_infos` is from its
// redistribute: `PlanRelayout` is a pure function of the layouts and the global shape
// that lists the collectives, `EmitRelayout` runs exactly those on a Builder, and
// `debug.explain` (Plan::Collectives) prints the same list, so what explain shows and what
// runs cannot drift apart.
#ifndef TF_DTENSOR_CC_SPMD_RELAYOUT_H_
#define TF_DTENSOR_CC_SPMD_RELAYOUT_H_

#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

// One collective of a relayout, with the layouts before and after it.
struct RelayoutStep {
  enum class Kind {
    kAllReduce,      // pending reductions over `mesh_dims` done: [*] +partial(x:sum) -> [*]
    kReduceScatter,  // the one over `mesh_dims[0]` done, leaving axis `axis` sharded over it
    kAllToAll,       // the sharding of axis `axis` moves to axis `to_axis`: [x,*] -> [*,x]
    kAllGather,      // axis `axis` unsharded: [x,*] -> [*,*]
    kSlice,          // axis `axis` sharded as `spec` (no communication): [*,*] -> [x,*]
    kToPartial,      // pending reductions `op` over `mesh_dims` added: [*] -> [*] +partial(x:sum)
    kMoveToMesh,     // a whole value handed to the mesh of `to`: [*] @ A -> [*] @ B
  };
  Kind kind;
  Layout from;
  Layout to;
  int axis = -1;
  int to_axis = -1;
  std::vector<int> mesh_dims;
  DimSpec spec = DimSpec::Replicated();
  ReduceOp op = ReduceOp::kSum;

  // One line, as RecordingBuilder records the step:
  //   all-reduce(sum) [*,*] +partial(y:sum) over y
  //   reduce-scatter(sum) axis 1 over y [x,*] +partial(y:sum) -> [x,y]
  //   all-to-all axis 0 -> 1 [x,*] -> [*,x]
  //   all-gather axis 0 [x,*] -> [*,*]
  //   slice axis 1 over y [*,*] -> [*,y]
  //   to-partial(sum) [x,*] -> [x,*] +partial(y:sum)
  //   move [*,*] @ mesh(x=2) -> [*,*] @ mesh(y=2)
  std::string ToString() const;
};

// The steps, each built from the layout before it (checked: a step that would make an
// invalid layout, such as slicing over a mesh dimension in use, is an Internal error).
StatusOr<RelayoutStep> AllReduceStep(const Layout& from, std::vector<int> mesh_dims, ReduceOp op);
StatusOr<RelayoutStep> ReduceScatterStep(const Layout& from, int axis, int mesh_dim, ReduceOp op);
StatusOr<RelayoutStep> AllToAllStep(const Layout& from, int axis, int to_axis);
StatusOr<RelayoutStep> AllGatherStep(const Layout& from, int axis);
StatusOr<RelayoutStep> SliceStep(const Layout& from, int axis, const DimSpec& spec);
StatusOr<RelayoutStep> ToPartialStep(const Layout& from, std::vector<int> mesh_dims, ReduceOp op);
StatusOr<RelayoutStep> MoveToMeshStep(const Layout& from, const Mesh& mesh, int rank);

// The collectives that take a value of global `shape` from `source` to `target`, in order
// (none when they are equal):
//   [x,*] -> [*,*]  all-gather on axis 0
//   [*,*] -> [x,*]  slice (each device keeps its piece; no communication)
//   [x,*] -> [*,x]  all-to-all
//   [x,*] -> [y,*]  all-gather, then slice
//   [x+y,*] <-> [*,*]  all-gather over x and y / nested slice (one axis over two dims)
//   [*] +partial(x:sum) -> [x]  reduce-scatter;  -> [*]  all-reduce
//   [*] -> [*] +partial(x:sum)  to-partial
//   [x] @ A -> [y] @ B  all-gather on A, move the whole value to B, slice there
// Where a plan has two steps or more, the cheapest order of such steps (bytes per device
// in the ledger's ring model, a shortest-path search) replaces the fixed one when it moves
// fewer bytes: [*,x] -> [y,*] slices over y, then gathers x (a quarter of the value).
// Fails with a message naming `what` across ranks, for a shape the target cannot hold, or
// for a variable handle (`variable_handle`) asked to change mesh. Runs without TensorFlow.
StatusOr<std::vector<RelayoutStep>> PlanRelayout(const Layout& source, const Layout& target,
                                                 const std::vector<int64_t>& shape,
                                                 const std::string& what,
                                                 bool variable_handle = false);

// PlanRelayout's steps as lines (RelayoutStep::ToString), or one line "cannot relayout:
// <message>" when it fails: what `debug.explain` shows for a planned relayout.
std::vector<std::string> DescribeRelayout(const Layout& source, const Layout& target,
                                          const std::vector<int64_t>& shape,
                                          const std::string& what, bool variable_handle = false);

// Whether values of `dtype` can hold the pending reductions of `layout`: none for strings,
// no max or min for complex numbers, no mean for booleans (their sum is a logical or).
// Fails naming `what`, the dtype, the reduction and the fix; pack and relayout check it,
// so a layout no kernel can reduce is refused where it is made, not at its reduction.
Status CheckReductionsFit(const Layout& layout, int dtype, const std::string& what);

// Runs `steps` on `builder`, one builder collective per step, starting from `value`.
StatusOr<ValueId> EmitRelayout(Builder& builder, ValueId value,
                               const std::vector<RelayoutStep>& steps);

// PlanRelayout from the value's layout, then EmitRelayout.
StatusOr<ValueId> Relayout(Builder& builder, ValueId value, const Layout& target,
                           const std::string& what);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_RELAYOUT_H_
