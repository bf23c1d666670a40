// ComponentBuilder's collective-ops lowering: abstract collectives as TF's
// CollectiveReduceV2 / CollectiveGatherV2, one op per local device, grouped by
// CollectiveGroups (group key per group, one instance key per step). Included at the end
// of component_builder.h; used for meshes that cannot share buffers and when the policy
// asks for it (TF_DTENSOR_COLLECTIVES=ops).
#ifndef TF_DTENSOR_CC_SPMD_COLLECTIVE_OPS_LOWERING_H_
#define TF_DTENSOR_CC_SPMD_COLLECTIVE_OPS_LOWERING_H_

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cc/spmd/collectives.h"
#include "cc/spmd/component_builder.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace collective_internal {

inline AttrOverride StringAttr(std::string name, std::string value) {
  AttrOverride a{std::move(name), AttrOverride::Kind::kString, {}};
  a.text = std::move(value);
  return a;
}

// The attributes every V2 collective op takes besides its own.
inline LocalOpOptions CollectiveOptions(int dtype) {
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("Nordering_token", 0),
                       StringAttr("communication_hint", "auto")};
  return options;
}

// How a dtype the collective ops do not take travels: converted to `wire` (by Cast, or
// by Bitcast, which gives complex numbers a trailing axis of 2) and back.
struct Wire {
  int wire;
  bool bitcast;
  bool supported = true;
};

// CollectiveGatherV2 takes float, half, double, int32 and int64.
inline Wire GatherWire(int dtype) {
  switch (dtype) {
    case TF_FLOAT: case TF_HALF: case TF_DOUBLE: case TF_INT32: case TF_INT64:
      return {dtype, false};
    case TF_BOOL: case TF_INT8: case TF_UINT8: case TF_INT16: case TF_UINT16:
      return {TF_INT32, false};
    case TF_BFLOAT16: return {TF_FLOAT, false};
    case TF_UINT32: return {TF_INT32, true};
    case TF_UINT64: return {TF_INT64, true};
    case TF_COMPLEX64: return {TF_FLOAT, true};
    case TF_COMPLEX128: return {TF_DOUBLE, true};
    default: return {dtype, false, false};
  }
}

// CollectiveReduceV2 reduces float, half, double, int32 and int64 (bfloat16 goes as
// float: not every device has a bfloat16 kernel).
inline Wire ReduceWire(int dtype, ReduceOp op) {
  switch (dtype) {
    case TF_FLOAT: case TF_HALF: case TF_DOUBLE: case TF_INT32: case TF_INT64:
      return {dtype, false};
    case TF_BOOL: case TF_INT8: case TF_UINT8: case TF_INT16: case TF_UINT16:
      return {TF_INT32, false};
    case TF_UINT32: return {TF_INT64, false};
    case TF_BFLOAT16: return {TF_FLOAT, false};
    // A sum of complex numbers is the sum of the real and of the imaginary parts.
    case TF_COMPLEX64: return {TF_FLOAT, true, op == ReduceOp::kSum};
    case TF_COMPLEX128: return {TF_DOUBLE, true, op == ReduceOp::kSum};
    default: return {dtype, false, false};
  }
}

inline Status UnsupportedCollectiveType(const char* collective, int dtype) {
  std::string name = dtype == TF_STRING     ? "string"
                     : dtype == TF_RESOURCE ? "resource"
                     : dtype == TF_VARIANT  ? "variant"
                                            : "TF_DataType " + std::to_string(dtype);
  return Unimplemented(std::string("TF's collective ops cannot ") + collective +
                       " a tensor of dtype " + name +
                       ". Cast it first, or use the shared-buffer lowering "
                       "(`config.set_collective_lowering(\"auto\")`) on a mesh of local CPUs.");
}

}  // namespace collective_internal

template <typename Handle>
StatusOr<std::vector<Handle>> ComponentBuilder<Handle>::ConvertEach(
    const std::vector<Handle>& handles, int from, int to, bool bitcast) {
  LocalOpOptions options;
  options.copy_attrs = false;
  if (bitcast) {
    options.overrides = {AttrOverride::Type("T", from), AttrOverride::Type("type", to)};
  } else {
    options.overrides = {AttrOverride::Type("SrcT", from), AttrOverride::Type("DstT", to)};
  }
  std::vector<std::vector<Handle>> inputs;
  for (const Handle& h : handles) inputs.push_back({h});
  return RunEach(bitcast ? "Bitcast" : "Cast", inputs, options);
}

template <typename Handle>
StatusOr<std::vector<std::vector<Handle>>> ComponentBuilder<Handle>::CollectiveInputs(
    const std::vector<Handle>& values, const CollectiveGroups& groups) {
  TFD_ASSIGN_OR_RETURN(ValueId size, HostConstant({groups.group_size()}, {}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(ValueId instance, HostConstant({NextInstanceKey()}, {}, TF_INT32));
  std::map<int, ValueId> keys;  // group -> its key, as a host constant
  std::vector<std::vector<Handle>> inputs(values.size());
  for (int d = 0; d < static_cast<int>(values.size()); ++d) {
    const int g = groups.group_of(d);
    if (!keys.count(g)) {
      TFD_ASSIGN_OR_RETURN(ValueId key, HostConstant({groups.group_key(g)}, {}, TF_INT32));
      keys[g] = key;
    }
    inputs[d] = {values[d], values_[size].host, values_[keys[g]].host, values_[instance].host};
  }
  return inputs;
}

template <typename Handle>
StatusOr<std::vector<Handle>> ComponentBuilder<Handle>::RunEach(
    const std::string& op_type, const std::vector<std::vector<Handle>>& inputs,
    const LocalOpOptions& options) {
  std::vector<Handle> outputs;
  for (int d = 0; d < static_cast<int>(inputs.size()); ++d) {
    StatusOr<std::vector<Handle>> r = RunOn(op_type, inputs[d], options, d, 1);
    if (!r.ok()) {
      DiscardAll(outputs);
      return r.status();
    }
    outputs.push_back(r.value()[0]);
  }
  return outputs;
}

// [x,*] partial over x -> every device of a group holds the group's reduction:
// CollectiveReduceV2(local, group_size, group_key(g), instance_key) on every device.
template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllReduceByOps(ValueId value,
                                                           const std::vector<int>& mesh_dims,
                                                           ReduceOp op) {
  const CollectiveGroups& groups = CollectiveGroups::For(mesh_, mesh_dims);
  const Value& in = values_[value];
  // Pending reductions over `mesh_dims` are done; others stay pending.
  std::vector<PartialSpec> still_partial;
  for (const PartialSpec& p : in.layout->partial()) {
    if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
      still_partial.push_back(p);
    }
  }
  TFD_ASSIGN_OR_RETURN(Layout out_layout, in.layout->WithoutPartial().WithPartial(still_partial));
  Value out{out_layout, in.shape, in.dtype};
  const int n = mesh_.num_local_devices();
  if (groups.group_size() == 1) {
    for (int d = 0; d < n; ++d) {
      StatusOr<Handle> h = Share(local(value, d), d);
      if (!h.ok()) {
        DiscardAll(out.handles);
        return h.status();
      }
      out.handles.push_back(*h);
    }
    return Add(std::move(out));
  }
  const int dtype = values_[value].dtype;
  const collective_internal::Wire wire = collective_internal::ReduceWire(dtype, op);
  if (!wire.supported) return collective_internal::UnsupportedCollectiveType("all-reduce", dtype);
  std::vector<Handle> sent(n);
  for (int d = 0; d < n; ++d) sent[d] = local(value, d);
  if (wire.wire != dtype) {
    TFD_ASSIGN_OR_RETURN(sent, ConvertEach(sent, dtype, wire.wire, wire.bitcast));
  }
  StatusOr<std::vector<std::vector<Handle>>> inputs = CollectiveInputs(sent, groups);
  if (!inputs.ok()) {
    if (wire.wire != dtype) DiscardAll(sent);
    return inputs.status();
  }
  LocalOpOptions options = collective_internal::CollectiveOptions(wire.wire);
  options.overrides.push_back(collective_internal::StringAttr("merge_op", CollectiveMergeOp(op)));
  options.overrides.push_back(
      collective_internal::StringAttr("final_op", op == ReduceOp::kMean ? "Div" : "Id"));
  StatusOr<std::vector<Handle>> reduced = RunCollective("CollectiveReduceV2", *inputs, options);
  if (wire.wire != dtype) DiscardAll(sent);
  if (!reduced.ok()) return reduced.status();
  if (wire.wire != dtype) {
    StatusOr<std::vector<Handle>> back = ConvertEach(*reduced, wire.wire, dtype, wire.bitcast);
    DiscardAll(*reduced);
    if (!back.ok()) return back.status();
    reduced = std::move(back);
  }
  Value result{out_layout, values_[value].shape, dtype};
  result.handles = std::move(reduced).value();
  return Add(std::move(result));
}

// [x,*] -> [*,*] along tensor axis `dim`: CollectiveGatherV2 stacks the pieces along axis
// 0, so another axis is moved to the front first and back after:
//   local [a, b/x] -> transpose [b/x, a] -> gather [b, a] -> transpose [a, b].
// TF stacks the pieces in its own ranking of the group's devices (by task, then device
// index); where that differs from the order along the mesh dimension, the pieces are
// split and concatenated in mesh order.
// Uneven shards (the shard geometry's ceil-sized pieces, trailing ones smaller or empty):
// each piece is padded to the chunk size before the gather, and after it one GatherV2 per
// device keeps the real rows of each chunk, in mesh order.
template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllGatherByOps(ValueId value, int dim) {
  const Layout layout = *values_[value].layout;
  const DimSpec spec = layout.spec(dim);
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(Layout out_layout, layout.WithSpecs(specs).WithPartial(layout.partial()));
  const CollectiveGroups& groups = CollectiveGroups::For(mesh_, spec.mesh_dims());
  const int n = mesh_.num_local_devices();
  const int rank = layout.rank();
  const int dtype = values_[value].dtype;
  const collective_internal::Wire wire = collective_internal::GatherWire(dtype);
  if (!wire.supported) return collective_internal::UnsupportedCollectiveType("all-gather", dtype);
  const int64_t group_size = groups.group_size();
  const int64_t chunk = Layout::Piece(values_[value].shape[dim], group_size, 0).first;
  const std::vector<int64_t> piece_sizes = layout.PieceSizes(values_[value].shape, dim);
  // The group is ordered row-major over its mesh dimensions in mesh order; an axis over
  // several of them in another order ("y+x") numbers its pieces differently:
  // piece_at[r] is the piece held at group position r.
  std::vector<int64_t> piece_at(group_size);
  bool reordered = false;
  {
    std::vector<int> sorted = spec.mesh_dims();
    std::sort(sorted.begin(), sorted.end());
    for (int64_t r = 0; r < group_size; ++r) {
      std::vector<int64_t> coord(mesh_.num_dims(), 0);
      int64_t rest = r;
      for (size_t k = sorted.size(); k-- > 0;) {
        coord[sorted[k]] = rest % mesh_.DimSize(sorted[k]);
        rest /= mesh_.DimSize(sorted[k]);
      }
      int64_t piece = 0;
      for (int m : spec.mesh_dims()) piece = piece * mesh_.DimSize(m) + coord[m];
      piece_at[r] = piece;
      reordered = reordered || piece != r;
    }
  }
  // Uneven pieces are padded to the chunk size and trimmed after; reordered pieces take
  // the same trimming gather, which puts them in piece order.
  const bool uneven = values_[value].shape[dim] % group_size != 0 || reordered;

  // Handles made here and not handed on; discarded whatever happens.
  std::vector<Handle> temporaries;
  auto cleanup = [&](Status status) {
    DiscardAll(temporaries);
    return status;
  };
  std::vector<Handle> current(n);
  for (int d = 0; d < n; ++d) current[d] = local(value, d);

  std::vector<int64_t> perm;  // moves `dim` to the front; its inverse moves it back
  std::vector<int64_t> inverse;
  auto transpose = [&](const std::vector<int64_t>& p) -> Status {
    StatusOr<ValueId> perm_value = HostConstant(p, {static_cast<int64_t>(p.size())}, TF_INT32);
    if (!perm_value.ok()) return perm_value.status();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tperm", TF_INT32)};
    std::vector<std::vector<Handle>> inputs(n);
    for (int d = 0; d < n; ++d) inputs[d] = {current[d], values_[*perm_value].host};
    StatusOr<std::vector<Handle>> r = RunEach("Transpose", inputs, options);
    if (!r.ok()) return r.status();
    current = std::move(r).value();
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    return Status::Ok();
  };
  if (dim != 0) {
    perm.push_back(dim);
    for (int i = 0; i < rank; ++i) {
      if (i != dim) perm.push_back(i);
    }
    inverse.assign(rank, 0);
    for (int i = 0; i < rank; ++i) inverse[perm[i]] = i;
    Status s = transpose(perm);
    if (!s.ok()) return cleanup(s);
  }

  if (uneven) {
    // Every piece to the chunk size: zeros after the real rows (axis `dim` is first now).
    std::vector<std::vector<Handle>> inputs(n);
    for (int d = 0; d < n; ++d) {
      const int64_t size = piece_sizes[layout.ShardIndex(d, dim)];
      std::vector<int64_t> paddings(2 * rank, 0);
      paddings[1] = chunk - size;
      StatusOr<ValueId> p = HostConstant(paddings, {rank, 2}, TF_INT32);
      if (!p.ok()) return cleanup(p.status());
      inputs[d] = {current[d], values_[*p].host};
    }
    LocalOpOptions pad;
    pad.copy_attrs = false;
    pad.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tpaddings", TF_INT32)};
    StatusOr<std::vector<Handle>> padded = RunEach("Pad", inputs, pad);
    if (!padded.ok()) return cleanup(padded.status());
    current = std::move(padded).value();
    temporaries.insert(temporaries.end(), current.begin(), current.end());
  }
  if (wire.wire != dtype) {
    StatusOr<std::vector<Handle>> sent = ConvertEach(current, dtype, wire.wire, wire.bitcast);
    if (!sent.ok()) return cleanup(sent.status());
    current = std::move(sent).value();
    temporaries.insert(temporaries.end(), current.begin(), current.end());
  }
  StatusOr<std::vector<std::vector<Handle>>> inputs = CollectiveInputs(current, groups);
  if (!inputs.ok()) return cleanup(inputs.status());
  StatusOr<std::vector<Handle>> gathered = RunCollective(
      "CollectiveGatherV2", *inputs, collective_internal::CollectiveOptions(wire.wire));
  if (!gathered.ok()) return cleanup(gathered.status());
  current = std::move(gathered).value();
  if (wire.wire != dtype) {
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    StatusOr<std::vector<Handle>> back = ConvertEach(current, wire.wire, dtype, wire.bitcast);
    if (!back.ok()) return cleanup(back.status());
    current = std::move(back).value();
  }
  StatusOr<std::vector<int64_t>> whole = out_layout.LocalShape(values_[value].shape, "the value");
  if (whole.ok()) {
    std::vector<int64_t> front = *whole;  // the gathered axis first
    for (size_t i = 0; i < perm.size(); ++i) front[i] = (*whole)[perm[i]];
    if (uneven) front[0] = chunk * group_size;  // padded until trimmed below
    for (int d = 0; d < n; ++d) SetLocalShape(current[d], front);
  }

  if (!groups.tf_order_is_identity()) {
    // Piece j of the gather belongs to the device at position tf_order[j] of the group.
    StatusOr<ValueId> axis = HostConstant({0}, {}, TF_INT32);
    if (!axis.ok()) return cleanup(axis.status());
    const int64_t pieces = groups.group_size();
    LocalOpOptions split;
    split.copy_attrs = false;
    split.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("num_split", pieces)};
    LocalOpOptions concat;
    concat.copy_attrs = false;
    concat.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tidx", TF_INT32),
                        AttrOverride::Int("N", pieces)};
    for (int d = 0; d < n; ++d) {
      temporaries.push_back(current[d]);
      StatusOr<std::vector<Handle>> parts =
          RunOn("Split", {values_[*axis].host, current[d]}, split, d, static_cast<int>(pieces));
      if (!parts.ok()) return cleanup(parts.status());
      temporaries.insert(temporaries.end(), parts->begin(), parts->end());
      const std::vector<int>& order = groups.tf_order(groups.group_of(d));
      std::vector<Handle> ordered(pieces);
      for (int64_t j = 0; j < pieces; ++j) ordered[order[j]] = (*parts)[j];
      ordered.push_back(values_[*axis].host);
      StatusOr<std::vector<Handle>> joined = RunOn("ConcatV2", ordered, concat, d, 1);
      if (!joined.ok()) return cleanup(joined.status());
      current[d] = (*joined)[0];
    }
  }
  if (uneven) {
    // Keep rows [r * chunk, r * chunk + size) of the chunk at each group position r, in
    // piece order.
    std::vector<int64_t> position_of(group_size);
    for (int64_t r = 0; r < group_size; ++r) position_of[piece_at[r]] = r;
    std::vector<int64_t> rows;
    for (int64_t c = 0; c < group_size; ++c) {
      for (int64_t j = 0; j < piece_sizes[c]; ++j) rows.push_back(position_of[c] * chunk + j);
    }
    StatusOr<ValueId> indices = HostConstant(rows, {static_cast<int64_t>(rows.size())}, TF_INT32);
    if (!indices.ok()) return cleanup(indices.status());
    StatusOr<ValueId> axis = HostConstant({0}, {}, TF_INT32);
    if (!axis.ok()) return cleanup(axis.status());
    LocalOpOptions gather;
    gather.copy_attrs = false;
    gather.overrides = {AttrOverride::Type("Tparams", dtype), AttrOverride::Type("Tindices", TF_INT32),
                        AttrOverride::Type("Taxis", TF_INT32), AttrOverride::Int("batch_dims", 0)};
    std::vector<std::vector<Handle>> inputs(n);
    for (int d = 0; d < n; ++d) inputs[d] = {current[d], values_[*indices].host, values_[*axis].host};
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    StatusOr<std::vector<Handle>> trimmed = RunEach("GatherV2", inputs, gather);
    if (!trimmed.ok()) return cleanup(trimmed.status());
    current = std::move(trimmed).value();
  }
  if (dim != 0) {
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    Status s = transpose(inverse);
    if (!s.ok()) return cleanup(s);
    // The transposed results are handed on, not temporaries.
    temporaries.resize(temporaries.size() - current.size());
  }
  DiscardAll(temporaries);
  Value out{out_layout, values_[value].shape, dtype};
  out.handles = std::move(current);
  return Add(std::move(out));
}

template <typename Handle>
StatusOr<std::vector<Handle>> ComponentBuilder<Handle>::PermuteChunks(
    const std::vector<Handle>& handles, int64_t pieces, const CollectiveGroups& groups,
    bool to_tf_order, int dtype, std::vector<Handle>& made) {
  TFD_ASSIGN_OR_RETURN(ValueId axis, HostConstant({0}, {}, TF_INT32));
  LocalOpOptions split;
  split.copy_attrs = false;
  split.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("num_split", pieces)};
  LocalOpOptions concat;
  concat.copy_attrs = false;
  concat.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tidx", TF_INT32),
                      AttrOverride::Int("N", pieces)};
  std::vector<Handle> result;
  for (int d = 0; d < static_cast<int>(handles.size()); ++d) {
    StatusOr<std::vector<Handle>> parts =
        RunOn("Split", {values_[axis].host, handles[d]}, split, d, static_cast<int>(pieces));
    if (!parts.ok()) {
      made.insert(made.end(), result.begin(), result.end());
      return parts.status();
    }
    made.insert(made.end(), parts->begin(), parts->end());
    // tf_order[j]: the mesh position of TF's j-th participant.
    const std::vector<int>& order = groups.tf_order(groups.group_of(d));
    std::vector<Handle> ordered(pieces);
    for (int64_t j = 0; j < pieces; ++j) {
      if (to_tf_order) {
        ordered[j] = (*parts)[order[j]];
      } else {
        ordered[order[j]] = (*parts)[j];
      }
    }
    ordered.push_back(values_[axis].host);
    StatusOr<std::vector<Handle>> joined = RunOn("ConcatV2", ordered, concat, d, 1);
    if (!joined.ok()) {
      made.insert(made.end(), result.begin(), result.end());
      return joined.status();
    }
    result.push_back((*joined)[0]);
  }
  return result;
}

// [x,*] -> [*,x] in one exchange. With f = from_dim, t = to_dim and N devices along x,
// device c holds rows block c; it sends its column block k to device k and receives
// every device's rows of its own column block:
//   local [a/N, b] -> transpose t first [b, a/N] -> reshape [N, b/N, a/N]
//   -> CollectiveAllToAllV2 (chunk k to device k; the result stacks the chunks by
//   sender) [N, b/N, a/N] -> transpose [N, a/N, b/N] -> reshape [a, b/N].
// Dtypes the op lacks and uneven shards take the gather + slice path.
template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllToAllByOps(ValueId value, int from_dim,
                                                          int to_dim) {
  const Layout layout = *values_[value].layout;
  const int mesh_dim = layout.spec(from_dim).mesh_dim;
  const CollectiveGroups& groups = CollectiveGroups::For(mesh_, {mesh_dim});
  if (!groups.all_local()) {
    TFD_RETURN_IF_ERROR(CheckCollectiveParticipants(
        mesh_, groups, "all-to-all axis " + std::to_string(from_dim) + " of a " +
                           layout.ShortString() + " value"));
  }
  const int64_t pieces = groups.group_size();
  const std::vector<int64_t> global = values_[value].shape;
  const int dtype = values_[value].dtype;
  const collective_internal::Wire wire = collective_internal::GatherWire(dtype);
  if (!wire.supported || wire.wire != dtype || pieces == 1 || global[from_dim] % pieces != 0 ||
      global[to_dim] % pieces != 0) {
    return Builder::AllToAll(value, from_dim, to_dim);
  }
  std::vector<DimSpec> specs = layout.specs();
  specs[to_dim] = specs[from_dim];
  specs[from_dim] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), layout.partial()));
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> in_shape, layout.LocalShape(global, "the value"));
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> out_shape,
                       out_layout.LocalShape(global, "the relaid-out value"));
  const int rank = layout.rank();
  const int n = mesh_.num_local_devices();

  std::vector<Handle> made;  // temporaries, discarded at the end
  auto cleanup = [&](Status status) {
    DiscardAll(made);
    return status;
  };
  std::vector<Handle> current(n);
  for (int d = 0; d < n; ++d) current[d] = local(value, d);
  // Runs one local op on every device: inputs = {current[d], extra...}.
  auto each = [&](const std::string& op_type, std::vector<ValueId> extra,
                  LocalOpOptions options) -> Status {
    std::vector<std::vector<Handle>> inputs(n);
    for (int d = 0; d < n; ++d) {
      inputs[d] = {current[d]};
      for (ValueId v : extra) inputs[d].push_back(values_[v].host);
    }
    StatusOr<std::vector<Handle>> r = RunEach(op_type, inputs, options);
    if (!r.ok()) return r.status();
    current = std::move(r).value();
    made.insert(made.end(), current.begin(), current.end());
    return Status::Ok();
  };
  auto transpose = [&](const std::vector<int64_t>& perm) -> Status {
    StatusOr<ValueId> p = HostConstant(perm, {static_cast<int64_t>(perm.size())}, TF_INT32);
    if (!p.ok()) return p.status();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tperm", TF_INT32)};
    return each("Transpose", {*p}, options);
  };
  auto reshape = [&](const std::vector<int64_t>& shape) -> Status {
    StatusOr<ValueId> s = HostConstant(shape, {static_cast<int64_t>(shape.size())}, TF_INT32);
    if (!s.ok()) return s.status();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT32)};
    return each("Reshape", {*s}, options);
  };

  // 1. The scattered axis first: [L[t], rest...].
  std::vector<int> rest;
  for (int i = 0; i < rank; ++i) {
    if (i != to_dim) rest.push_back(i);
  }
  if (to_dim != 0) {
    std::vector<int64_t> perm = {to_dim};
    for (int i : rest) perm.push_back(i);
    Status s = transpose(perm);
    if (!s.ok()) return cleanup(s);
  }
  // 2. Chunk k goes to the device at mesh position k, i.e. to TF's rank of that device.
  if (!groups.tf_order_is_identity()) {
    StatusOr<std::vector<Handle>> r = PermuteChunks(current, pieces, groups, true, dtype, made);
    if (!r.ok()) return cleanup(r.status());
    current = std::move(r).value();
    made.insert(made.end(), current.begin(), current.end());
  }
  // 3. The exchange, of a [N, L[t]/N, rest...] tensor: TF's all-to-all wants the group
  // size as the first axis.
  std::vector<int64_t> split_shape = {pieces, in_shape[to_dim] / pieces};
  for (int i : rest) split_shape.push_back(in_shape[i]);
  Status s = reshape(split_shape);
  if (!s.ok()) return cleanup(s);
  StatusOr<std::vector<std::vector<Handle>>> inputs = CollectiveInputs(current, groups);
  if (!inputs.ok()) return cleanup(inputs.status());
  StatusOr<std::vector<Handle>> exchanged = RunCollective(
      "CollectiveAllToAllV2", *inputs, collective_internal::CollectiveOptions(dtype));
  if (!exchanged.ok()) return cleanup(exchanged.status());
  current = std::move(exchanged).value();
  made.insert(made.end(), current.begin(), current.end());
  for (int d = 0; d < n; ++d) SetLocalShape(current[d], split_shape);
  // 4. Chunks back in mesh order of their senders.
  if (!groups.tf_order_is_identity()) {
    StatusOr<std::vector<Handle>> r = PermuteChunks(current, pieces, groups, false, dtype, made);
    if (!r.ok()) return cleanup(r.status());
    current = std::move(r).value();
    made.insert(made.end(), current.begin(), current.end());
  }
  // 5. [N, L[t]/N, rest...]: the sender axis next to the gathered axis, then merged.
  std::vector<int64_t> perm;
  for (int i = 0; i < rank; ++i) {
    if (i == to_dim) {
      perm.push_back(1);
      continue;
    }
    const int position = 2 + static_cast<int>(std::find(rest.begin(), rest.end(), i) - rest.begin());
    if (i == from_dim) perm.push_back(0);
    perm.push_back(position);
  }
  s = transpose(perm);
  if (!s.ok()) return cleanup(s);
  s = reshape(out_shape);
  if (!s.ok()) return cleanup(s);
  // The last reshape's results are the value's; everything before goes.
  made.resize(made.size() - current.size());
  DiscardAll(made);
  Value out{out_layout, global, dtype};
  out.handles = std::move(current);
  return Add(std::move(out));
}

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_COLLECTIVE_OPS_LOWERING_H_
