#include "cc/spmd/halo.h"

#include <vector>

#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// A local op of one output with the layout of `like` (every block transformed alike).
StatusOr<ValueId> Local(Builder& builder, const std::string& op, const std::vector<ValueId>& inputs,
                        std::vector<AttrOverride> attrs, ValueId like) {
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = std::move(attrs);
  options.overrides.push_back(AttrOverride::Type("T", builder.dtype(like)));
  return builder.LocalOpValue(op, inputs, options, *builder.layout(like));
}

StatusOr<ValueId> Concat(Builder& builder, const std::vector<ValueId>& parts, int axis,
                         ValueId like) {
  if (parts.size() == 1) return parts[0];
  TFD_ASSIGN_OR_RETURN(ValueId dim, builder.HostConstant({axis}, {}, TF_INT32));
  std::vector<ValueId> inputs = parts;
  inputs.push_back(dim);
  return Local(builder, "ConcatV2", inputs,
               {AttrOverride::Type("Tidx", TF_INT32),
                AttrOverride::Int("N", static_cast<int64_t>(parts.size()))},
               like);
}

// `rows` rows of the fill, shaped like `value`'s blocks elsewhere (from its first rows).
StatusOr<ValueId> Filler(Builder& builder, ValueId value, int axis, int64_t rows, HaloFill fill) {
  TFD_ASSIGN_OR_RETURN(ValueId strip, SliceRows(builder, value, axis, 0, rows));
  TFD_ASSIGN_OR_RETURN(ValueId zeros, Local(builder, "ZerosLike", {strip}, {}, strip));
  if (fill == HaloFill::kZeros) return zeros;
  return Local(builder, "Log", {zeros}, {}, zeros);  // log(0) = -inf
}

// Every device's `rows`-row strip of the previous (`forward`: next) block along `axis`
// of `strips` (one strip per block), the fill where there is none.
StatusOr<ValueId> Neighbour(Builder& builder, ValueId strips, int axis, int64_t rows,
                            bool from_previous, HaloFill fill) {
  const int mesh_dim = builder.layout(strips)->spec(axis).mesh_dim;
  const int64_t pieces = builder.layout(strips)->NumShards(axis);
  TFD_ASSIGN_OR_RETURN(ValueId all, builder.AllGather(strips, axis));
  TFD_ASSIGN_OR_RETURN(ValueId edge, Filler(builder, all, axis, rows, fill));
  ValueId shifted;
  if (from_previous) {
    TFD_ASSIGN_OR_RETURN(ValueId head, SliceRows(builder, all, axis, 0, (pieces - 1) * rows));
    TFD_ASSIGN_OR_RETURN(shifted, Concat(builder, {edge, head}, axis, all));
  } else {
    TFD_ASSIGN_OR_RETURN(ValueId tail, SliceRows(builder, all, axis, rows, 0, true));
    TFD_ASSIGN_OR_RETURN(shifted, Concat(builder, {tail, edge}, axis, all));
  }
  return builder.Slice(shifted, axis, mesh_dim);
}

}  // namespace

StatusOr<ValueId> SliceRows(Builder& builder, ValueId value, int axis, int64_t begin,
                            int64_t end, bool to_end) {
  const int rank = builder.layout(value)->rank();
  std::vector<int64_t> begins(rank, 0), ends(rank, 0), strides(rank, 1);
  begins[axis] = begin;
  ends[axis] = end;
  int64_t others = ((int64_t{1} << rank) - 1) & ~(int64_t{1} << axis);
  TFD_ASSIGN_OR_RETURN(ValueId b, builder.HostConstant(begins, {rank}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId e, builder.HostConstant(ends, {rank}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(ValueId s, builder.HostConstant(strides, {rank}, TF_INT64));
  return Local(builder, "StridedSlice", {value, b, e, s},
               {AttrOverride::Type("Index", TF_INT64), AttrOverride::Int("begin_mask", others),
                AttrOverride::Int("end_mask", to_end ? others | (int64_t{1} << axis) : others),
                AttrOverride::Int("ellipsis_mask", 0), AttrOverride::Int("new_axis_mask", 0),
                AttrOverride::Int("shrink_axis_mask", 0)},
               value);
}

StatusOr<ValueId> ExchangeHalo(Builder& builder, ValueId value, int axis, int64_t before,
                               int64_t after, HaloFill fill) {
  std::vector<ValueId> parts;
  if (before > 0) {
    TFD_ASSIGN_OR_RETURN(ValueId strip, SliceRows(builder, value, axis, -before, 0, true));
    TFD_ASSIGN_OR_RETURN(ValueId prev, Neighbour(builder, strip, axis, before, true, fill));
    parts.push_back(prev);
  }
  if (after < 0) {
    TFD_ASSIGN_OR_RETURN(ValueId kept, SliceRows(builder, value, axis, 0, after));
    parts.push_back(kept);
  } else {
    parts.push_back(value);
  }
  if (after > 0) {
    TFD_ASSIGN_OR_RETURN(ValueId strip, SliceRows(builder, value, axis, 0, after));
    TFD_ASSIGN_OR_RETURN(ValueId next, Neighbour(builder, strip, axis, after, false, fill));
    parts.push_back(next);
  }
  return Concat(builder, parts, axis, value);
}

StatusOr<ValueId> ReturnHalo(Builder& builder, ValueId value, int axis, int64_t before,
                             int64_t after) {
  if (after < 0) {
    TFD_ASSIGN_OR_RETURN(ValueId zeros, Filler(builder, value, axis, -after, HaloFill::kZeros));
    TFD_ASSIGN_OR_RETURN(value, Concat(builder, {value, zeros}, axis, value));
    after = 0;
  }
  TFD_ASSIGN_OR_RETURN(ValueId own, SliceRows(builder, value, axis, before, -after, after == 0));
  if (after > 0) {
    // The next block's first rows, as this block computed them, go back to it.
    TFD_ASSIGN_OR_RETURN(ValueId tail, SliceRows(builder, value, axis, -after, 0, true));
    TFD_ASSIGN_OR_RETURN(ValueId from_prev,
                         Neighbour(builder, tail, axis, after, true, HaloFill::kZeros));
    TFD_ASSIGN_OR_RETURN(ValueId first, SliceRows(builder, own, axis, 0, after));
    TFD_ASSIGN_OR_RETURN(ValueId rest, SliceRows(builder, own, axis, after, 0, true));
    TFD_ASSIGN_OR_RETURN(first, Local(builder, "AddV2", {first, from_prev}, {}, own));
    TFD_ASSIGN_OR_RETURN(own, Concat(builder, {first, rest}, axis, own));
  }
  if (before > 0) {
    TFD_ASSIGN_OR_RETURN(ValueId head, SliceRows(builder, value, axis, 0, before));
    TFD_ASSIGN_OR_RETURN(ValueId from_next,
                         Neighbour(builder, head, axis, before, false, HaloFill::kZeros));
    TFD_ASSIGN_OR_RETURN(ValueId body, SliceRows(builder, own, axis, 0, -before));
    TFD_ASSIGN_OR_RETURN(ValueId last, SliceRows(builder, own, axis, -before, 0, true));
    TFD_ASSIGN_OR_RETURN(last, Local(builder, "AddV2", {last, from_next}, {}, own));
    TFD_ASSIGN_OR_RETURN(own, Concat(builder, {body, last}, axis, own));
  }
  return own;
}

StatusOr<ValueId> PadAxis(Builder& builder, ValueId value, int axis, int64_t before,
                          int64_t after, HaloFill fill) {
  if (before == 0 && after == 0) return value;
  const int rank = builder.layout(value)->rank();
  std::vector<int64_t> paddings(2 * rank, 0);
  paddings[2 * axis] = before;
  paddings[2 * axis + 1] = after;
  TFD_ASSIGN_OR_RETURN(ValueId p, builder.HostConstant(paddings, {rank, 2}, TF_INT64));
  const std::vector<AttrOverride> pad = {AttrOverride::Type("Tpaddings", TF_INT64)};
  TFD_ASSIGN_OR_RETURN(ValueId padded, Local(builder, "Pad", {value, p}, pad, value));
  if (fill == HaloFill::kZeros) return padded;
  // -inf where the padding is: log of a zero-padded mask of ones is 0 inside, -inf outside.
  TFD_ASSIGN_OR_RETURN(ValueId ones, Local(builder, "OnesLike", {value}, {}, value));
  TFD_ASSIGN_OR_RETURN(ValueId mask, Local(builder, "Pad", {ones, p}, pad, value));
  TFD_ASSIGN_OR_RETURN(ValueId log, Local(builder, "Log", {mask}, {}, value));
  return Local(builder, "AddV2", {padded, log}, {}, value);
}

}  // namespace tf_dtensor
