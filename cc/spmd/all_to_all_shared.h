// The all-to-all of ComponentBuilder on meshes whose devices share host memory (virtual
// CPUs): sub-blocks move between devices as shared buffers. Two forms, both one copy of
// the data when they are chosen:
//   - split + concat: one SplitV per distinct source block, one ConcatV2 per distinct
//     target block; the split is a view when no axis before `to_dim` is > 1 ([*,x] ->
//     [x,*]), and this form takes uneven pieces;
//   - stitch: one ParallelDynamicStitch per group writes every source row in its place in
//     the stacked target blocks, cut into views by Split ([x,*] -> [*,x], where the split
//     would copy). Measured on 8 virtual CPUs for 64 MiB: about 1.5x the split + concat.
// Included by component_builder.h (templates).
#ifndef TF_DTENSOR_CC_SPMD_ALL_TO_ALL_SHARED_H_
#define TF_DTENSOR_CC_SPMD_ALL_TO_ALL_SHARED_H_

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cc/spmd/component_builder.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

// [x,*] -> [*,x] over x = mesh dim m with pieces c (rows) and k (columns):
//   source block c [rows c, all columns] --SplitV along to_dim--> sub-blocks (c, k)
//   target block k [all rows, columns k] = ConcatV2 along from_dim of (0, k), (1, k), ...
// Pieces follow the shard geometry on both sides (uneven too). Devices that agree on the
// other distinct mesh dims (other sharded axes, pending reductions) exchange among
// themselves; replicas share their leader's blocks. The stitch form runs instead where
// it applies (AllToAllStitched).
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
  if (std::optional<StatusOr<ValueId>> stitched =
          AllToAllStitched(value, from_dim, to_dim, out_layout, other_dims)) {
    return *std::move(stitched);
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


namespace all_to_all_internal {

inline int64_t Product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

// For source piece c of an all-to-all of `global` from axis `from` to axis `to` over
// `pieces` devices (target pieces even, of T/K), where each target row (a run of
// contiguous elements) lands in the stacked target blocks [block 0 rows; block 1 rows;
// ...]. l = max(from, to) is the axis the rows cut: with l = to a row is one target
// piece of the to-axis times the inner axes; with l = from it is the whole source piece
// of the from-axis (even) times the inner axes.
inline std::vector<int64_t> StitchIndices(const std::vector<int64_t>& global, int from, int to,
                                          int64_t pieces, int64_t c, int64_t piece_size,
                                          int64_t piece_offset) {
  const int l = std::max(from, to);
  std::vector<int64_t> source = global;  // the source block's shape
  source[from] = piece_size;
  std::vector<int64_t> target = global;  // every target block's shape
  target[to] = global[to] / pieces;
  // Rows of a source block: its axes before l, then (l = to) the K target pieces.
  std::vector<int64_t> outer(source.begin(), source.begin() + l);
  const int64_t per_row = l == to ? pieces : 1;
  const int64_t target_rows = Product(target, 0, l) * (l == from ? pieces : 1);
  std::vector<int64_t> indices;
  indices.reserve(Product(outer, 0, outer.size()) * per_row);
  std::vector<int64_t> coord(outer.size(), 0);
  const int64_t count = Product(outer, 0, outer.size());
  for (int64_t i = 0; i < count; ++i) {
    // coord: row-major position i over `outer`.
    int64_t rest = i;
    for (int a = static_cast<int>(outer.size()) - 1; a >= 0; --a) {
      coord[a] = rest % outer[a];
      rest /= outer[a];
    }
    if (l == to) {
      // Target coordinates: the from-axis moves by this piece's offset.
      int64_t row = 0;
      for (int a = 0; a < l; ++a) {
        row = row * target[a] + (a == from ? coord[a] + piece_offset : coord[a]);
      }
      for (int64_t k = 0; k < pieces; ++k) indices.push_back(k * target_rows + row);
    } else {
      // The to-axis coordinate t is in target block k = t / (T/K), at t % (T/K); the row
      // continues with this source's piece c of the from-axis.
      const int64_t k = coord[to] / target[to];
      int64_t row = 0;
      for (int a = 0; a < l; ++a) {
        row = row * target[a] + (a == to ? coord[a] % target[to] : coord[a]);
      }
      indices.push_back(k * target_rows + row * pieces + c);
    }
  }
  return indices;
}

}  // namespace all_to_all_internal

// [x,*] -> [*,x] in one pass: every source block, viewed as rows (Reshape, no copy), goes
// to its place in the stacked target blocks (ParallelDynamicStitch, one memcpy per row),
// which Split cuts along the stacking axis into views, one per target block. Taken when
// the target pieces are even (and, with from > to, the source pieces too), rows are at
// least 256 bytes, and SplitV along `to_dim` would copy (some axis before it is > 1);
// otherwise nullopt and the split + concat runs.
template <typename Handle>
std::optional<StatusOr<ValueId>> ComponentBuilder<Handle>::AllToAllStitched(
    ValueId value, int from_dim, int to_dim, const Layout& out_layout,
    const std::vector<int>& other_dims) {
  using all_to_all_internal::Product;
  const Layout layout = *values_[value].layout;  // a copy: HostConstant grows values_
  const int dtype = values_[value].dtype;
  const int64_t pieces = layout.NumShards(from_dim);
  const int l = std::max(from_dim, to_dim);
  // The blocks' shape with the from- and to-axes whole: the other axes keep their
  // sharding (by other mesh dims), even, so that every group's blocks have one shape.
  std::vector<int64_t> dims = values_[value].shape;
  for (int a = 0; a < static_cast<int>(dims.size()); ++a) {
    if (dims[a] < 0) return std::nullopt;
    if (a == from_dim || a == to_dim) continue;
    if (dims[a] % layout.NumShards(a) != 0) return std::nullopt;
    dims[a] /= layout.NumShards(a);
  }
  if (dims[to_dim] % pieces != 0 || (l == from_dim && dims[from_dim] % pieces != 0)) {
    return std::nullopt;
  }
  const size_t width = TF_DataTypeSize(static_cast<TF_DataType>(dtype));
  const int64_t row_elements = Product(dims, l + 1, dims.size()) *
                               (l == to_dim ? dims[to_dim] / pieces : dims[from_dim] / pieces);
  const int64_t total = Product(dims, 0, dims.size());
  std::vector<int64_t> first_block = dims;
  first_block[from_dim] = layout.AxisPiece(from_dim, dims[from_dim], 0).first;
  if (width == 0 || row_elements * static_cast<int64_t>(width) < 256 || total == 0 ||
      total / row_elements >= (int64_t{1} << 31) || Product(first_block, 0, to_dim) <= 1) {
    return std::nullopt;
  }
  std::vector<int64_t> target_block = dims;
  target_block[to_dim] /= pieces;
  const int n = mesh_.num_local_devices();
  std::vector<Handle> made;  // temporaries
  Value out{out_layout, values_[value].shape, dtype};
  out.handles.assign(n, Handle{});
  std::vector<bool> filled(n, false);
  auto fail = [&](const Status& status) -> StatusOr<ValueId> {
    DiscardAll(made);
    for (int d = 0; d < n; ++d) {
      if (filled[d]) Discard(out.handles[d]);
    }
    return status;
  };
  auto run = [&](const std::string& op, const std::vector<Handle>& inputs,
                 std::vector<AttrOverride> overrides, int device,
                 int outputs) -> StatusOr<std::vector<Handle>> {
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = std::move(overrides);
    TFD_ASSIGN_OR_RETURN(std::vector<Handle> r, RunOn(op, inputs, options, device, outputs));
    made.insert(made.end(), r.begin(), r.end());
    return r;
  };
  const AttrOverride type = AttrOverride::Type("T", dtype);
  const AttrOverride tshape = AttrOverride::Type("Tshape", TF_INT64);
  StatusOr<ValueId> zero = HostConstant({0}, {}, TF_INT32);
  if (!zero.ok()) return fail(zero.status());
  StatusOr<ValueId> block_shape =
      HostConstant(target_block, {static_cast<int64_t>(target_block.size())}, TF_INT64);
  if (!block_shape.ok()) return fail(block_shape.status());
  std::map<int, std::vector<Handle>> blocks;  // group's first device -> target blocks by k
  for (int d = 0; d < n; ++d) {
    int group = d;
    for (int e = 0; e < d; ++e) {
      if (SameCoords(d, e, other_dims)) {
        group = e;
        break;
      }
    }
    if (!blocks.count(group)) {
      std::vector<Handle> indices(pieces), rows(pieces);
      std::vector<bool> found(pieces, false);
      for (int e = 0; e < n; ++e) {
        const int64_t c = layout.ShardIndex(e, from_dim);
        if (found[c] || !SameCoords(group, e, other_dims)) continue;
        found[c] = true;
        auto [size, offset] = layout.AxisPiece(from_dim, dims[from_dim], c);
        std::vector<int64_t> index = all_to_all_internal::StitchIndices(
            dims, from_dim, to_dim, pieces, c, size, offset);
        const int64_t count = static_cast<int64_t>(index.size());
        StatusOr<ValueId> index_value = HostConstant(index, {count}, TF_INT32);
        if (!index_value.ok()) return fail(index_value.status());
        StatusOr<ValueId> row_shape = HostConstant({count, row_elements}, {2}, TF_INT64);
        if (!row_shape.ok()) return fail(row_shape.status());
        StatusOr<std::vector<Handle>> r =
            run("Reshape", {values_[value].handles[e], values_[*row_shape].host},
                {type, tshape}, group, 1);
        if (!r.ok()) return fail(r.status());
        indices[c] = values_[*index_value].host;
        rows[c] = (*r)[0];
      }
      if (std::find(found.begin(), found.end(), false) != found.end()) {
        return fail(Internal("all-to-all of a " + layout.ShortString() +
                             " value: a source piece has no local device."));
      }
      std::vector<Handle> inputs = indices;
      inputs.insert(inputs.end(), rows.begin(), rows.end());
      StatusOr<std::vector<Handle>> stacked = run(
          "ParallelDynamicStitch", inputs, {type, AttrOverride::Int("N", pieces)}, group, 1);
      if (!stacked.ok()) return fail(stacked.status());
      StatusOr<std::vector<Handle>> split =
          run("Split", {values_[*zero].host, (*stacked)[0]},
              {type, AttrOverride::Int("num_split", pieces)}, group, static_cast<int>(pieces));
      if (!split.ok()) return fail(split.status());
      std::vector<Handle> group_blocks;
      for (const Handle& h : *split) {
        StatusOr<std::vector<Handle>> r =
            run("Reshape", {h, values_[*block_shape].host}, {type, tshape}, group, 1);
        if (!r.ok()) return fail(r.status());
        SetLocalShape((*r)[0], target_block);
        group_blocks.push_back((*r)[0]);
      }
      blocks[group] = std::move(group_blocks);
    }
    StatusOr<Handle> h = Share(blocks[group][out_layout.ShardIndex(d, to_dim)], d);
    if (!h.ok()) return fail(h.status());
    out.handles[d] = *h;
    filled[d] = true;
  }
  DiscardAll(made);
  return Add(std::move(out));
}

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_ALL_TO_ALL_SHARED_H_
