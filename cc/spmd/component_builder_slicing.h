// ComponentBuilder's slicing members: cutting a value into the blocks a layout gives each
// device (Slice, SliceOver), cutting an operand that may broadcast (SliceMayBroadcast),
// and the geometry of pieces whose size is known only at run time. Included at the end
// of component_builder.h, whose class declares them; not to be included on its own.
#ifndef TF_DTENSOR_CC_SPMD_COMPONENT_BUILDER_SLICING_H_
#define TF_DTENSOR_CC_SPMD_COMPONENT_BUILDER_SLICING_H_

namespace tf_dtensor {

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::Slice(ValueId value, int dim, int mesh_dim) {
  return SliceOver(value, dim, DimSpec::Sharded(mesh_dim));
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::SliceOver(ValueId value, int dim,
                                                      const DimSpec& spec) {
  const Layout layout = *values_[value].layout;
  mesh_ = layout.mesh();  // a collective runs on its value's mesh
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = spec;
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), layout.partial()));
  TFD_RETURN_IF_ERROR(out_layout.LocalShape(values_[value].shape, "the relaid-out tensor").status());
  // Split once per distinct input shard; each device keeps its piece. The pieces follow
  // the shard geometry (SplitV): equal for an even axis, ceil-sized then smaller if not.
  std::vector<int> key_dims = layout.DistinctMeshDims();
  std::vector<int> leaders = Leaders(key_dims);
  const int n = mesh_.num_local_devices();
  const int64_t pieces = out_layout.NumShards(dim);
  if (spec.multi() && values_[value].shape[dim] < 0) {
    return InvalidArgument("Cannot shard axis " + std::to_string(dim) + " of unknown size over " +
                           out_layout.SpecName(spec) + " (" + out_layout.ShortString() +
                           "): nested pieces need the size. Give the value a static shape.");
  }
  TFD_ASSIGN_OR_RETURN(ValueId axis, HostConstant({dim}, {}, TF_INT32));
  // Static sizes go as int32 where they fit: a GPU keeps an int32 constant in host memory,
  // where SplitV reads its sizes (an int64 one would be copied there on every call).
  const std::vector<int64_t> piece_sizes_value = out_layout.PieceSizes(values_[value].shape, dim);
  const bool dynamic_sizes = values_[value].shape[dim] < 0;
  const int size_type =
      !dynamic_sizes && values_[value].shape[dim] <= INT32_MAX ? TF_INT32 : TF_INT64;
  TFD_ASSIGN_OR_RETURN(ValueId sizes, HostConstant(piece_sizes_value, {pieces}, size_type));
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", values_[value].dtype),
                       AttrOverride::Type("Tlen", dynamic_sizes ? TF_INT64 : size_type),
                       AttrOverride::Int("num_split", pieces)};
  Value out{out_layout, values_[value].shape, values_[value].dtype};
  out.handles.assign(n, Handle{});
  std::map<int, std::vector<Handle>> splits;  // leader -> pieces
  std::vector<bool> filled(n, false);
  Status failure;
  for (int d = 0; d < n && failure.ok(); ++d) {
    int leader = leaders[d];
    if (!splits.count(leader)) {
      Handle piece_sizes = values_[sizes].host;
      if (values_[value].shape[dim] < 0) {
        StatusOr<Handle> dynamic =
            DynamicPieceSizes(values_[value].handles[leader], dim, pieces, leader);
        if (!dynamic.ok()) {
          failure = dynamic.status();
          break;
        }
        piece_sizes = *dynamic;
      }
      StatusOr<std::vector<Handle>> r =
          RunOn("SplitV", {values_[value].handles[leader], piece_sizes, values_[axis].host},
                options, leader, pieces);
      if (!r.ok()) {
        failure = r.status();
        break;
      }
      splits[leader] = std::move(r).value();
    }
    StatusOr<Handle> piece = Share(splits[leader][out_layout.ShardIndex(d, dim)], d);
    if (!piece.ok()) {
      failure = piece.status();
      break;
    }
    out.handles[d] = *piece;
    filled[d] = true;
  }
  // Each device holds its own reference to its piece; the split results go.
  for (auto& [leader, hs] : splits) DiscardAll(hs);
  if (!failure.ok()) {
    for (int d = 0; d < n; ++d) {
      if (filled[d]) Discard(out.handles[d]);
    }
    return failure;
  }
  return Add(std::move(out));
}

// A size known only at run time: each device d slices [begin, begin + size) along `dim`
// with begin = (n == 1 ? 0 : min(i * ceil(n / k), n)) and size = (n == 1 ? 1 : its piece
// size), i its shard index, n the run-time size, k the pieces (Slice's size -1 keeps the
// other axes whole).
template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::SliceMayBroadcast(ValueId value, int dim,
                                                              const DimSpec& spec) {
  const Layout layout = *values_[value].layout;
  if (values_[value].shape[dim] >= 0 || spec.multi() || layout.spec(dim).sharded()) {
    return SliceOver(value, dim, spec);
  }
  mesh_ = layout.mesh();
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = spec;
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), layout.partial()));
  const int rank = layout.rank();
  const int64_t pieces = out_layout.NumShards(dim);
  TFD_ASSIGN_OR_RETURN(ValueId one, HostConstant({1}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId zero, HostConstant({0}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId axis0, HostConstant({0}, {}, TF_INT32));
  std::optional<ValueId> zeros_before, zeros_after, all_before, all_after;
  if (dim > 0) {
    TFD_ASSIGN_OR_RETURN(zeros_before,
                         HostConstant(std::vector<int64_t>(dim, 0), {dim}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(all_before,
                         HostConstant(std::vector<int64_t>(dim, -1), {dim}, TF_INT64));
  }
  if (dim < rank - 1) {
    const int64_t after = rank - 1 - dim;
    TFD_ASSIGN_OR_RETURN(zeros_after,
                         HostConstant(std::vector<int64_t>(after, 0), {after}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(all_after,
                         HostConstant(std::vector<int64_t>(after, -1), {after}, TF_INT64));
  }
  const int dtype = values_[value].dtype;
  Value out{out_layout, values_[value].shape, dtype};
  out.handles.assign(mesh_.num_local_devices(), Handle{});
  std::vector<Handle> made;
  std::vector<Handle> pieces_made;
  auto fail = [&](Status status) {
    DiscardAll(made);
    DiscardAll(pieces_made);
    return status;
  };
  for (int d = 0; d < mesh_.num_local_devices(); ++d) {
    auto run = [&](const std::string& op, std::vector<Handle> inputs,
                   std::vector<AttrOverride> overrides) -> StatusOr<Handle> {
      TFD_ASSIGN_OR_RETURN(Handle h, RunOne(op, std::move(inputs), std::move(overrides), d));
      made.push_back(h);
      return h;
    };
    const AttrOverride int64 = AttrOverride::Type("T", TF_INT64);
    auto host = [&](ValueId v) { return values_[v].host; };
    StatusOr<Handle> piece = [&]() -> StatusOr<Handle> {
      const Handle whole = values_[value].handles[d];
      TFD_ASSIGN_OR_RETURN(
          DynamicPieces geometry,
          DynamicPieceGeometry(whole, dim, pieces, {out_layout.ShardIndex(d, dim)}, d));
      const Handle n = geometry.n;
      const Handle start = geometry.start;
      const Handle size = geometry.size;
      made.insert(made.end(), {n, start, size});
      TFD_ASSIGN_OR_RETURN(
          Handle single,
          run("Equal", {n, host(one)},
              {int64, AttrOverride::Bool("incompatible_shape_error", true)}));
      // Past the end for the trailing empty pieces (2 rows over 8): Slice wants begin <= n.
      TFD_ASSIGN_OR_RETURN(Handle within, run("Minimum", {start, n}, {int64}));
      TFD_ASSIGN_OR_RETURN(Handle begin, run("SelectV2", {single, host(zero), within}, {int64}));
      TFD_ASSIGN_OR_RETURN(Handle length, run("SelectV2", {single, host(one), size}, {int64}));
      auto vector = [&](std::optional<ValueId> before, Handle middle,
                        std::optional<ValueId> after) -> StatusOr<Handle> {
        std::vector<Handle> parts;
        if (before) parts.push_back(host(*before));
        parts.push_back(middle);
        if (after) parts.push_back(host(*after));
        if (parts.size() == 1) return middle;
        const int64_t count = static_cast<int64_t>(parts.size());
        parts.push_back(host(axis0));
        return run("ConcatV2", parts, {int64, AttrOverride::Type("Tidx", TF_INT32),
                                       AttrOverride::Int("N", count)});
      };
      TFD_ASSIGN_OR_RETURN(Handle begins, vector(zeros_before, begin, zeros_after));
      TFD_ASSIGN_OR_RETURN(Handle sizes, vector(all_before, length, all_after));
      LocalOpOptions slice;
      slice.copy_attrs = false;
      slice.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Index", TF_INT64)};
      TFD_ASSIGN_OR_RETURN(std::vector<Handle> r,
                           RunOn("Slice", {whole, begins, sizes}, slice, d, 1));
      return r[0];
    }();
    if (!piece.ok()) return fail(piece.status());
    out.handles[d] = *piece;
    pieces_made.push_back(*piece);
  }
  DiscardAll(made);
  return Add(std::move(out));
}

template <typename Handle>
StatusOr<typename ComponentBuilder<Handle>::DynamicPieces>
ComponentBuilder<Handle>::DynamicPieceGeometry(Handle handle, int dim, int64_t pieces,
                                               const std::vector<int64_t>& shards, int device) {
  TFD_ASSIGN_OR_RETURN(ValueId begin, HostConstant({dim}, {1}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(ValueId one, HostConstant({1}, {1}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(ValueId k_minus_1, HostConstant({pieces - 1}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId k, HostConstant({pieces}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId zero, HostConstant({0}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId shard, HostConstant(shards, {static_cast<int64_t>(shards.size())},
                                                   TF_INT64));
  auto run = [&](const std::string& op, std::vector<Handle> inputs,
                 std::vector<AttrOverride> overrides) {
    return RunOne(op, std::move(inputs), std::move(overrides), device);
  };
  const AttrOverride int64 = AttrOverride::Type("T", TF_INT64);
  DynamicPieces out;
  TFD_ASSIGN_OR_RETURN(Handle shape, run("Shape", {handle},
                                          {AttrOverride::Type("T", DTypeOf(handle)),
                                           AttrOverride::Type("out_type", TF_INT64)}));
  TFD_ASSIGN_OR_RETURN(out.n, run("Slice", {shape, values_[begin].host, values_[one].host},
                                  {int64, AttrOverride::Type("Index", TF_INT32)}));
  TFD_ASSIGN_OR_RETURN(Handle up, run("AddV2", {out.n, values_[k_minus_1].host}, {int64}));
  TFD_ASSIGN_OR_RETURN(Handle chunk, run("FloorDiv", {up, values_[k].host}, {int64}));
  TFD_ASSIGN_OR_RETURN(out.start, run("Mul", {chunk, values_[shard].host}, {int64}));
  TFD_ASSIGN_OR_RETURN(Handle left, run("Sub", {out.n, out.start}, {int64}));
  TFD_ASSIGN_OR_RETURN(Handle at_least_0, run("Maximum", {left, values_[zero].host}, {int64}));
  TFD_ASSIGN_OR_RETURN(out.size, run("Minimum", {at_least_0, chunk}, {int64}));
  return out;
}

template <typename Handle>
StatusOr<Handle> ComponentBuilder<Handle>::DynamicPieceSizes(Handle handle, int dim,
                                                             int64_t pieces, int device) {
  std::vector<int64_t> index(pieces);
  for (int64_t i = 0; i < pieces; ++i) index[i] = i;
  TFD_ASSIGN_OR_RETURN(DynamicPieces geometry,
                       DynamicPieceGeometry(handle, dim, pieces, index, device));
  return geometry.size;
}

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_COMPONENT_BUILDER_SLICING_H_
