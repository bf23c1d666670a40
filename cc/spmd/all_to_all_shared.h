// The all-to-all of ComponentBuilder on meshes whose devices share host memory (virtual
// CPUs): sub-blocks move between devices as shared buffers, so the exchange is one split
// per distinct source block and one concatenation per distinct target block.
// Included by component_builder.h (templates).
#ifndef TF_DTENSOR_CC_SPMD_ALL_TO_ALL_SHARED_H_
#define TF_DTENSOR_CC_SPMD_ALL_TO_ALL_SHARED_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cc/spmd/component_builder.h"

namespace tf_dtensor {

// [x,*] -> [*,x] over x = mesh dim m with pieces c (rows) and k (columns):
//   source block c [rows c, all columns] --SplitV along to_dim--> sub-blocks (c, k)
//   target block k [all rows, columns k] = ConcatV2 along from_dim of (0, k), (1, k), ...
// Pieces follow the shard geometry on both sides (uneven too). Devices that agree on the
// other distinct mesh dims (other sharded axes, pending reductions) exchange among
// themselves; replicas share their leader's blocks.
template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllToAllShared(ValueId value, int from_dim,
                                                           int to_dim) {
  const Layout layout = *values_[value].layout;
  const DimSpec spec = layout.spec(from_dim);
  const std::vector<int64_t> global = values_[value].shape;
  // Nested pieces and a target axis of unknown size (its pieces are only known at run
  // time) take the gather + slice path.
  if (spec.multi() || layout.spec(to_dim).sharded() || global[to_dim] < 0) {
    return Builder::AllToAll(value, from_dim, to_dim);
  }
  const int mesh_dim = spec.mesh_dim;
  const CollectiveGroups& groups = CollectiveGroups::For(mesh_, {mesh_dim});
  if (!groups.all_local()) {
    TFD_RETURN_IF_ERROR(CheckCollectiveParticipants(
        mesh_, groups, "all-to-all axis " + std::to_string(from_dim) + " of a " +
                           layout.ShortString() + " value"));
  }
  std::vector<DimSpec> specs = layout.specs();
  specs[to_dim] = spec;
  specs[from_dim] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), layout.partial()));
  TFD_RETURN_IF_ERROR(out_layout.LocalShape(global, "the relaid-out tensor").status());
  const int n = mesh_.num_local_devices();
  const int64_t pieces = layout.NumShards(from_dim);
  const int dtype = values_[value].dtype;
  Value out{out_layout, global, dtype};
  out.handles.assign(n, Handle{});
  const std::vector<int> in_leaders = Leaders(layout.DistinctMeshDims());
  const std::vector<int> out_leaders = Leaders(out_layout.DistinctMeshDims());
  if (pieces == 1) {  // a mesh dimension of size 1: only the spec moves
    for (int d = 0; d < n; ++d) {
      StatusOr<Handle> h = Share(values_[value].handles[d], d);
      if (!h.ok()) {
        for (int e = 0; e < d; ++e) Discard(out.handles[e]);
        return h.status();
      }
      out.handles[d] = *h;
    }
    return Add(std::move(out));
  }
  // The exchange pairs devices that agree on every other distinct mesh dim.
  std::vector<int> other_dims;
  for (int k : layout.DistinctMeshDims()) {
    if (k != mesh_dim) other_dims.push_back(k);
  }
  TFD_ASSIGN_OR_RETURN(ValueId from_axis, HostConstant({from_dim}, {}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(ValueId to_axis, HostConstant({to_dim}, {}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(ValueId sizes, HostConstant(out_layout.PieceSizes(global, to_dim),
                                                   {pieces}, TF_INT64));
  LocalOpOptions split;
  split.copy_attrs = false;
  split.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tlen", TF_INT64),
                     AttrOverride::Int("num_split", pieces)};
  LocalOpOptions concat;
  concat.copy_attrs = false;
  concat.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tidx", TF_INT32),
                      AttrOverride::Int("N", pieces)};
  std::map<int, std::vector<Handle>> splits;  // source leader -> its sub-blocks, by k
  std::vector<bool> filled(n, false);
  Status failure;
  for (int d = 0; d < n && failure.ok(); ++d) {
    if (out_leaders[d] != d) continue;
    std::vector<Handle> parts(pieces, Handle{});
    std::vector<bool> found(pieces, false);
    const int64_t k = out_layout.ShardIndex(d, to_dim);
    for (int e = 0; e < n && failure.ok(); ++e) {
      const int64_t c = layout.ShardIndex(e, from_dim);
      if (found[c] || !SameCoords(d, e, other_dims)) continue;
      const int source = in_leaders[e];
      if (!splits.count(source)) {
        StatusOr<std::vector<Handle>> r = RunOn(
            "SplitV",
            {values_[value].handles[source], values_[sizes].host, values_[to_axis].host},
            split, source, pieces);
        if (!r.ok()) {
          failure = r.status();
          break;
        }
        splits[source] = std::move(r).value();
      }
      parts[c] = splits[source][k];
      found[c] = true;
    }
    if (!failure.ok()) break;
    if (std::find(found.begin(), found.end(), false) != found.end()) {
      failure = Internal("all-to-all of a " + layout.ShortString() +
                         " value: a source piece has no local device.");
      break;
    }
    parts.push_back(values_[from_axis].host);
    StatusOr<std::vector<Handle>> joined = RunOn("ConcatV2", parts, concat, d, 1);
    if (!joined.ok()) {
      failure = joined.status();
      break;
    }
    out.handles[d] = (*joined)[0];
    filled[d] = true;
  }
  for (auto& [source, hs] : splits) DiscardAll(hs);
  for (int d = 0; d < n && failure.ok(); ++d) {
    if (out_leaders[d] == d) continue;
    StatusOr<Handle> h = Share(out.handles[out_leaders[d]], d);
    if (!h.ok()) {
      failure = h.status();
      break;
    }
    out.handles[d] = *h;
    filled[d] = true;
  }
  if (!failure.ok()) {
    for (int d = 0; d < n; ++d) {
      if (filled[d]) Discard(out.handles[d]);
    }
    return failure;
  }
  return Add(std::move(out));
}

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_ALL_TO_ALL_SHARED_H_
