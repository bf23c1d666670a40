#include "cc/spmd/relayout.h"

#include "cc/core/strings.h"

namespace tf_dtensor {

StatusOr<ValueId> Builder::AllToAll(ValueId value, int from_dim, int to_dim) {
  int mesh_dim = layout(value)->spec(from_dim).mesh_dim;
  TFD_ASSIGN_OR_RETURN(ValueId gathered, AllGather(value, from_dim));
  return Slice(gathered, to_dim, mesh_dim);
}

StatusOr<ValueId> Builder::ReduceScatter(ValueId value, int dim, int mesh_dim, ReduceOp op) {
  TFD_ASSIGN_OR_RETURN(ValueId reduced, AllReduce(value, {mesh_dim}, op));
  return Slice(reduced, dim, mesh_dim);
}

StatusOr<ValueId> Builder::SliceOver(ValueId value, int dim, const DimSpec& spec) {
  if (spec.multi()) {
    return Unimplemented("This builder cannot shard an axis over several mesh dimensions.");
  }
  return Slice(value, dim, spec.mesh_dim);
}

StatusOr<ValueId> Relayout(Builder& builder, ValueId value, const Layout& target,
                           const std::string& what) {
  const std::optional<Layout>& source_or = builder.layout(value);
  if (!source_or) return Internal("Relayout of a host value.");
  Layout source = *source_or;
  if (source == target) return value;
  if (source.mesh() != target.mesh()) {
    // [x,*] @ A -> [*,y] @ B: whole on A (all-gathers), handed to every device of B, then
    // sliced there. Values cross meshes only whole, so any pair of layouts works.
    if (builder.resource(value)) {
      return InvalidArgument("Cannot move " + what + " (a variable handle on " +
                             source.ShortString() + ") to another mesh (" +
                             target.ShortString() + "); read its value and move that.");
    }
    const int rank = static_cast<int>(builder.shape(value).size());
    TFD_RETURN_IF_ERROR(target.LocalShape(builder.shape(value), what).status());
    TFD_ASSIGN_OR_RETURN(ValueId whole,
                         Relayout(builder, value, Layout::Replicated(source.mesh(), rank), what));
    TFD_ASSIGN_OR_RETURN(ValueId moved, builder.MoveToMesh(whole, target.mesh()));
    return Relayout(builder, moved, target, what);
  }
  if (source.rank() != target.rank()) {
    return InvalidArgument("Cannot relayout " + what + " of rank " +
                           std::to_string(source.rank()) + " to layout " + target.ShortString() +
                           " of rank " + std::to_string(target.rank()) + ".");
  }
  TFD_RETURN_IF_ERROR(target.LocalShape(builder.shape(value), what).status());
  ValueId current = value;
  // Pending reductions the target does not keep are done first, where the target shards
  // an axis over the same mesh dimension as a reduce-scatter:
  //   [*] +partial(x:sum) -> [x]: reduce-scatter     [*] +partial(x:sum) -> [*]: all-reduce
  for (const PartialSpec& p : source.partial()) {
    bool kept = false;
    for (const PartialSpec& q : target.partial()) kept = kept || q == p;
    if (kept) continue;
    int scatter_axis = -1;
    for (int i = 0; i < target.rank(); ++i) {
      if (target.spec(i) == DimSpec::Sharded(p.mesh_dim) &&
          !builder.layout(current)->spec(i).sharded()) {
        scatter_axis = i;
      }
    }
    if (scatter_axis >= 0) {
      TFD_ASSIGN_OR_RETURN(current, builder.ReduceScatter(current, scatter_axis, p.mesh_dim, p.op));
    } else {
      TFD_ASSIGN_OR_RETURN(current, builder.AllReduce(current, {p.mesh_dim}, p.op));
    }
  }
  // Pairs [a at i] -> [a at j]: the mesh dimension moves between axes: one all-to-all.
  for (int i = 0; i < source.rank(); ++i) {
    const DimSpec& from = builder.layout(current)->spec(i);
    if (!from.sharded() || from.multi() || from == target.spec(i)) continue;
    for (int j = 0; j < target.rank(); ++j) {
      if (j != i && target.spec(j) == from && !builder.layout(current)->spec(j).sharded()) {
        TFD_ASSIGN_OR_RETURN(current, builder.AllToAll(current, i, j));
        break;
      }
    }
  }
  // Unshard every axis whose sharding differs from the target.
  for (int i = 0; i < target.rank(); ++i) {
    const DimSpec& now = builder.layout(current)->spec(i);
    if (now.sharded() && now != target.spec(i)) {
      TFD_ASSIGN_OR_RETURN(current, builder.AllGather(current, i));
    }
  }
  // Shard the axes the target shards.
  for (int i = 0; i < target.rank(); ++i) {
    const DimSpec& now = builder.layout(current)->spec(i);
    if (target.spec(i).sharded() && !now.sharded()) {
      TFD_ASSIGN_OR_RETURN(current, builder.SliceOver(current, i, target.spec(i)));
    }
  }
  // Pending reductions the target adds: [*] -> [*] +partial(x:sum) keeps the value on the
  // first device along x and zeros elsewhere.
  for (const PartialSpec& q : target.partial()) {
    bool have = false;
    for (const PartialSpec& p : builder.layout(current)->partial()) have = have || p == q;
    if (have) continue;
    TFD_ASSIGN_OR_RETURN(current, builder.ToPartial(current, {q.mesh_dim}, q.op));
  }
  return current;
}

}  // namespace tf_dtensor
