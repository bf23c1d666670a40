#include "cc/rules/row_blocks.h"

#include <optional>
#include <string>

#include "cc/rules/expand.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

bool HasEmptyBlock(const Layout& layout, const std::vector<int64_t>& shape, int axis) {
  for (int64_t size : layout.PieceSizes(shape, axis)) {
    if (size <= 0) return true;
  }
  return false;
}

bool HasEmptyPiece(int64_t size, int64_t pieces) {
  if (size < 0) return true;
  for (int64_t i = 0; i < pieces; ++i) {
    if (Layout::Piece(size, pieces, i).first == 0) return true;
  }
  return false;
}

Layout UnshardedOver(const Layout& layout, int mesh_dim) {
  std::vector<DimSpec> specs = layout.specs();
  for (DimSpec& spec : specs) {
    if (spec.sharded() && spec.mesh_dim == mesh_dim) spec = DimSpec::Replicated();
  }
  return layout.WithSpecs(specs);
}

LocalOpOptions DistinctOver(int mesh_dim, std::vector<AttrOverride> overrides, bool copy_attrs) {
  LocalOpOptions options;
  options.copy_attrs = copy_attrs;
  options.overrides = std::move(overrides);
  options.distinct_over = {mesh_dim};
  return options;
}

namespace {

std::string RangeText(IdRange check, int64_t rows) {
  return check == IdRange::kInRange ? "[0, " + std::to_string(rows) + ")"
                                    : "below " + std::to_string(rows);
}

}  // namespace

StatusOr<ValueId> CheckIds(Builder& builder, ValueId ids, ValueId local, int64_t rows,
                           IdRange check, const std::string& op_name, const Layout& table,
                           int mesh_dim) {
  const std::string what = "tf_dtensor " + op_name + ": an index is out of range " +
                           RangeText(check, rows) + " (axis of " + std::to_string(rows) +
                           " rows, laid out " + table.ShortString() +
                           "); one device raises InvalidArgumentError for it too. Check the "
                           "indices against the table's size.";
  if (std::optional<std::vector<int64_t>> values = builder.IntValue(ids)) {
    for (int64_t id : *values) {
      if ((check == IdRange::kInRange && id < 0) || id >= rows) {
        return InvalidArgument(what + " (index " + std::to_string(id) + ")");
      }
    }
    return local;
  }
  const int dtype = builder.dtype(ids);
  const Layout ids_layout = *builder.layout(ids);
  const int rank = ids_layout.rank();
  LocalOpOptions typed;
  typed.copy_attrs = false;
  typed.overrides = {AttrOverride::Type("T", dtype)};
  TFD_ASSIGN_OR_RETURN(ValueId limit, builder.HostConstant({rows}, {}, dtype));
  TFD_ASSIGN_OR_RETURN(ValueId bad,
                       builder.LocalOpValue("GreaterEqual", {ids, limit}, typed, ids_layout));
  if (check == IdRange::kInRange) {
    TFD_ASSIGN_OR_RETURN(ValueId zero, builder.HostConstant({0}, {}, dtype));
    TFD_ASSIGN_OR_RETURN(ValueId negative,
                         builder.LocalOpValue("Less", {ids, zero}, typed, ids_layout));
    LocalOpOptions plain;
    plain.copy_attrs = false;
    TFD_ASSIGN_OR_RETURN(bad,
                         builder.LocalOpValue("LogicalOr", {bad, negative}, plain, ids_layout));
  }
  // Per device (its block of the ids): any bad id -> 1.0 -> log(1 - 1) = -inf, which
  // CheckNumerics refuses with `what`; else log(1) = 0, added to the local ids.
  std::vector<int64_t> axes;
  for (int a = 0; a < rank; ++a) axes.push_back(a);
  TFD_ASSIGN_OR_RETURN(ValueId all_axes,
                       builder.HostConstant(axes, {static_cast<int64_t>(rank)}, TF_INT32));
  LocalOpOptions scalar;
  scalar.copy_attrs = false;
  scalar.distinct_over = ids_layout.DistinctMeshDims();
  const Layout one = Layout::Replicated(ids_layout.mesh(), 0);
  LocalOpOptions any = scalar;
  any.overrides = {AttrOverride::Type("Tidx", TF_INT32), AttrOverride::Bool("keep_dims", false)};
  TFD_ASSIGN_OR_RETURN(ValueId any_bad, builder.LocalOpValue("Any", {bad, all_axes}, any, one));
  LocalOpOptions to_float = scalar;
  to_float.overrides = {AttrOverride::Type("SrcT", TF_BOOL), AttrOverride::Type("DstT", TF_FLOAT)};
  TFD_ASSIGN_OR_RETURN(ValueId flag, builder.LocalOpValue("Cast", {any_bad}, to_float, one));
  LocalOpOptions f32 = scalar;
  f32.overrides = {AttrOverride::Type("T", TF_FLOAT)};
  TFD_ASSIGN_OR_RETURN(ValueId ones, builder.LocalOpValue("OnesLike", {flag}, f32, one));
  TFD_ASSIGN_OR_RETURN(ValueId rest, builder.LocalOpValue("Sub", {ones, flag}, f32, one));
  TFD_ASSIGN_OR_RETURN(ValueId log, builder.LocalOpValue("Log", {rest}, f32, one));
  LocalOpOptions numerics = f32;
  numerics.overrides.push_back(AttrOverride::String("message", what));
  TFD_ASSIGN_OR_RETURN(ValueId checked,
                       builder.LocalOpValue("CheckNumerics", {log}, numerics, one));
  LocalOpOptions back = scalar;
  back.overrides = {AttrOverride::Type("SrcT", TF_FLOAT), AttrOverride::Type("DstT", dtype)};
  TFD_ASSIGN_OR_RETURN(ValueId zero_id, builder.LocalOpValue("Cast", {checked}, back, one));
  LocalOpOptions add = DistinctOver(mesh_dim, {AttrOverride::Type("T", dtype)});
  if (mesh_dim < 0) add.distinct_over.clear();
  return builder.LocalOpValue("AddV2", {local, zero_id}, add, *builder.layout(local));
}

StatusOr<BlockIds> LocalizeIds(Builder& builder, ValueId ids, const Layout& table,
                               const std::vector<int64_t>& table_shape, int axis, int64_t fill,
                               const std::string& op_name, IdRange check) {
  BlockIds out;
  out.mesh_dim = table.spec(axis).mesh_dim;
  const std::vector<int64_t> sizes = table.PieceSizes(table_shape, axis);
  std::vector<int64_t> lo, hi;
  int64_t start = 0;
  for (int64_t size : sizes) {
    lo.push_back(start);
    start += size;
    hi.push_back(start);
  }
  const int dtype = builder.dtype(ids);
  if (dtype != TF_INT32 && dtype != TF_INT64) {
    return InvalidArgument("Indices into a sharded axis must be int32 or int64.");
  }
  const Layout ids_layout = *builder.layout(ids);  // a copy: values move as the builder grows
  const Mesh& mesh = table.mesh();
  // The block's bounds: scalars against one id, else [1] tensors (one op fewer).
  const bool one_id = ids_layout.rank() == 0;
  TFD_ASSIGN_OR_RETURN(ValueId low,
                       PerDeviceEntry(builder, mesh, lo, out.mesh_dim, dtype, one_id));
  TFD_ASSIGN_OR_RETURN(ValueId high,
                       PerDeviceEntry(builder, mesh, hi, out.mesh_dim, dtype, one_id));
  const LocalOpOptions typed = DistinctOver(out.mesh_dim, {AttrOverride::Type("T", dtype)});
  TFD_ASSIGN_OR_RETURN(ValueId ge,
                       builder.LocalOpValue("GreaterEqual", {ids, low}, typed, ids_layout));
  TFD_ASSIGN_OR_RETURN(ValueId lt, builder.LocalOpValue("Less", {ids, high}, typed, ids_layout));
  TFD_ASSIGN_OR_RETURN(out.in_block, builder.LocalOpValue("LogicalAnd", {ge, lt},
                                         DistinctOver(out.mesh_dim, {}), ids_layout));
  TFD_ASSIGN_OR_RETURN(ValueId shifted, builder.LocalOpValue("Sub", {ids, low}, typed, ids_layout));
  TFD_ASSIGN_OR_RETURN(ValueId fills, FillLike(builder, "ZerosLike", shifted, out.mesh_dim));
  if (fill != 0) {
    TFD_ASSIGN_OR_RETURN(ValueId f, builder.HostConstant({fill}, {}, dtype));
    TFD_ASSIGN_OR_RETURN(fills, builder.LocalOpValue("AddV2", {fills, f}, typed, ids_layout));
  }
  TFD_ASSIGN_OR_RETURN(out.local,
                       Select(builder, out.in_block, shifted, fills, out.mesh_dim, ids_layout));
  if (check != IdRange::kUnchecked && mesh.device_type() == "CPU" && table_shape[axis] >= 0) {
    TFD_ASSIGN_OR_RETURN(out.local, CheckIds(builder, ids, out.local, table_shape[axis], check,
                                             op_name, table, out.mesh_dim));
  }
  return out;
}

StatusOr<ValueId> ListOfOne(Builder& builder, ValueId value, int mesh_dim) {
  TFD_ASSIGN_OR_RETURN(ValueId front, builder.HostConstant({0}, {}, TF_INT32));
  std::vector<DimSpec> specs = builder.layout(value)->specs();
  specs.insert(specs.begin(), DimSpec::Replicated());
  const Layout out = builder.layout(value)->WithSpecs(specs);
  return builder.LocalOpValue("ExpandDims", {value, front},
             DistinctOver(mesh_dim, {AttrOverride::Type("T", builder.dtype(value)),
                                     AttrOverride::Type("Tdim", TF_INT32)}),
             out);
}

StatusOr<ValueId> GatherInBlock(Builder& builder, ValueId value, ValueId where, int id_axes,
                                const std::vector<int>& distinct) {
  const std::vector<DimSpec>& specs = builder.layout(value)->specs();
  std::vector<DimSpec> kept(1, DimSpec::Replicated());
  kept.insert(kept.end(), specs.begin() + id_axes, specs.end());
  const Layout out = builder.layout(value)->WithSpecs(kept);
  LocalOpOptions options;
  options.overrides = {AttrOverride::Type("Tparams", builder.dtype(value)),
                       AttrOverride::Type("Tindices", TF_INT64)};
  options.distinct_over = distinct;
  return builder.LocalOpValue("GatherNd", {value, where}, options, out);
}

StatusOr<InBlockIds> KeepInBlock(Builder& builder, const BlockIds& ids) {
  InBlockIds out;
  ValueId in_block = ids.in_block, local = ids.local;
  if (builder.layout(in_block)->rank() == 0) {  // Where takes no scalar
    out.listed = true;
    TFD_ASSIGN_OR_RETURN(in_block, ListOfOne(builder, in_block, ids.mesh_dim));
    TFD_ASSIGN_OR_RETURN(local, ListOfOne(builder, local, ids.mesh_dim));
  }
  const Mesh& mesh = builder.layout(in_block)->mesh();
  // Ids sharded over another mesh dimension differ along it too: the positions and ids
  // kept, replicated in layout, are computed on every device that holds other ids.
  out.distinct = builder.layout(in_block)->DistinctMeshDims();
  out.distinct.push_back(ids.mesh_dim);
  LocalOpOptions where = DistinctOver(ids.mesh_dim, {AttrOverride::Type("T", TF_BOOL)});
  where.distinct_over = out.distinct;
  TFD_ASSIGN_OR_RETURN(out.where, builder.LocalOpValue("Where", {in_block}, where,
                                                       Layout::Replicated(mesh, 2)));
  const int rank = builder.layout(in_block)->rank();
  TFD_ASSIGN_OR_RETURN(out.local, GatherInBlock(builder, local, out.where, rank, out.distinct));
  return out;
}

StatusOr<ValueId> ExpandMask(Builder& builder, ValueId mask, int mesh_dim, int at, int inner,
                             int trailing) {
  std::vector<DimSpec> specs = builder.layout(mask)->specs();
  const Layout base = *builder.layout(mask);
  ValueId current = mask;
  auto expand = [&](int position) -> Status {
    TFD_ASSIGN_OR_RETURN(ValueId dim, builder.HostConstant({position}, {}, TF_INT32));
    specs.insert(specs.begin() + position, DimSpec::Replicated());
    LocalOpOptions options = DistinctOver(
        mesh_dim, {AttrOverride::Type("T", TF_BOOL), AttrOverride::Type("Tdim", TF_INT32)});
    TFD_ASSIGN_OR_RETURN(current, builder.LocalOpValue("ExpandDims", {current, dim}, options,
                                                       base.WithSpecs(specs)));
    return Status::Ok();
  };
  for (int i = 0; i < inner; ++i) TFD_RETURN_IF_ERROR(expand(at));
  for (int i = 0; i < trailing; ++i) TFD_RETURN_IF_ERROR(expand(static_cast<int>(specs.size())));
  return current;
}

StatusOr<ValueId> Select(Builder& builder, ValueId mask, ValueId value, ValueId fill,
                         int mesh_dim, const Layout& out) {
  return builder.LocalOpValue("SelectV2", {mask, value, fill},
             DistinctOver(mesh_dim, {AttrOverride::Type("T", builder.dtype(value))}), out);
}

StatusOr<ValueId> FillLike(Builder& builder, const char* op, ValueId value, int mesh_dim) {
  return builder.LocalOpValue(op, {value},
             DistinctOver(mesh_dim, {AttrOverride::Type("T", builder.dtype(value))}),
             *builder.layout(value));
}

}  // namespace tf_dtensor
