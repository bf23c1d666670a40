// The collective-ops lowering: abstract collectives as TF's CollectiveReduceV2 /
// CollectiveGatherV2 / CollectiveAllToAllV2, one op per local device, grouped by
// CollectiveGroups (group key per group, one instance key per step). They need every
// participant at once (the eager executor runs them on a thread per device) and work
// between devices that share nothing: GPUs, other processes. Used for meshes that cannot
// share buffers, and on CPUs when the policy asks for it (TF_DTENSOR_COLLECTIVES=ops).
//
// Reduce-scatter stays all-reduce then slice here: TF 2.21 registers
// CollectiveReduceScatterV2, but only NCCL implements it; on CPUs its first run aborts the
// collective executor ("did not find collective implementation"), and every later
// collective of the process with it. A GPU lowering over NCCL is where a native one goes.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cc/spmd/lowering.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

using Handles = std::vector<LocalHandle>;

// The attributes every V2 collective op takes besides its own.
LocalOpOptions CollectiveOptions(const Mesh& mesh, int dtype) {
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("Nordering_token", 0),
                       AttrOverride::String("communication_hint",
                                            UsesNccl(mesh) ? "nccl" : "auto")};
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
Wire GatherWire(int dtype) {
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
// float: not every device has a bfloat16 kernel). On GPUs it refuses int32 ("does not
// support datatype DT_INT32 on DEVICE_GPU": TF keeps int32 in host memory there), so the
// small integers and bool travel as int64; a sum cast back wraps as int32 arithmetic does.
Wire ReduceWire(const Mesh& mesh, int dtype, ReduceOp op) {
  if (mesh.device_type() == "GPU") {
    switch (dtype) {
      case TF_INT32: case TF_BOOL: case TF_INT8: case TF_UINT8: case TF_INT16: case TF_UINT16:
        return {TF_INT64, false};
      default:
        break;
    }
  }
  switch (dtype) {
    case TF_FLOAT: case TF_HALF: case TF_DOUBLE: case TF_INT32: case TF_INT64:
      return {dtype, false};
    case TF_BOOL: case TF_INT8: case TF_UINT8: case TF_INT16: case TF_UINT16:
      return {TF_INT32, false};
    case TF_UINT32: return {TF_INT64, false};
    // Sums and products modulo 2^64 are the same bits signed or not.
    case TF_UINT64:
      return {TF_INT64, true, op == ReduceOp::kSum || op == ReduceOp::kProd};
    case TF_BFLOAT16: return {TF_FLOAT, false};
    // A sum (or mean) of complex numbers is the sum (mean) of the real and of the
    // imaginary parts.
    case TF_COMPLEX64:
      return {TF_FLOAT, true, op == ReduceOp::kSum || op == ReduceOp::kMean};
    case TF_COMPLEX128:
      return {TF_DOUBLE, true, op == ReduceOp::kSum || op == ReduceOp::kMean};
    default: return {dtype, false, false};
  }
}

Status UnsupportedCollectiveType(const char* collective, int dtype) {
  return Unimplemented(std::string("TF's collective ops cannot ") + collective +
                       " a tensor of dtype " + DataTypeName(dtype) +
                       ". Cast it first, or use the shared-buffer lowering "
                       "(`config.set_collective_lowering(\"auto\")`) on a mesh of local CPUs.");
}

// Every device's handle converted to `to` (Cast, or Bitcast when `bitcast`); the inputs
// stay the caller's.
StatusOr<Handles> ConvertEach(CollectiveRunner& run, const Handles& handles, int from, int to,
                              bool bitcast) {
  LocalOpOptions options;
  options.copy_attrs = false;
  if (bitcast) {
    options.overrides = {AttrOverride::Type("T", from), AttrOverride::Type("type", to)};
  } else {
    options.overrides = {AttrOverride::Type("SrcT", from), AttrOverride::Type("DstT", to)};
  }
  std::vector<Handles> inputs;
  for (LocalHandle h : handles) inputs.push_back({h});
  return run.RunEach(bitcast ? "Bitcast" : "Cast", inputs, options);
}

// Runs `op_type` on every device with inputs {handles[d], extra}, `extra` a host argument
// every device reads (an axis, a permutation); the inputs stay the caller's.
StatusOr<Handles> RunEachWith(CollectiveRunner& run, const std::string& op_type,
                              const Handles& handles, LocalHandle extra,
                              const LocalOpOptions& options) {
  std::vector<Handles> inputs(handles.size());
  for (size_t d = 0; d < handles.size(); ++d) inputs[d] = {handles[d], extra};
  return run.RunEach(op_type, inputs, options);
}

// What TF's collective runtime records of an instance key (op, dtype, each device's group
// and input shape, attributes), where a step may reuse a key: a synchronous eager step on
// a mesh of this process only (its participants are all done when RunCollective returns;
// across processes every client must derive the same keys, so those stay fresh). Empty
// where the step takes a fresh key.
std::string ReusableKeySignature(CollectiveRunner& run, const std::string& op_type,
                                 const Handles& values, const CollectiveGroups& groups,
                                 const LocalOpOptions& options) {
  if (!run.collectives_done_on_return() || run.mesh().spans_processes()) return std::string();
  std::string signature = op_type;
  for (const AttrOverride& a : options.overrides) {
    signature += ";" + a.name + "=" + std::to_string(a.type) + "/" + a.text;
    for (int64_t i : a.ints) signature += "," + std::to_string(i);
  }
  for (int d = 0; d < static_cast<int>(values.size()); ++d) {
    std::optional<std::vector<int64_t>> shape = run.LocalShape(values[d]);
    if (!shape) return std::string();
    signature += ";" + run.mesh().local_devices()[d] + "@" +
                 std::to_string(groups.group_key(groups.group_of(d))) + ":";
    for (int64_t dim : *shape) signature += std::to_string(dim) + ",";
  }
  return signature;
}

// LocalOpOptions of no copied attributes and `overrides`.
LocalOpOptions Attrs(std::vector<AttrOverride> overrides) {
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = std::move(overrides);
  return options;
}

// `op` on each of the `n` local devices d with inputs(d) and only the attributes `attrs`;
// the results are also kept in `made` (temporaries the caller discards).
StatusOr<Handles> RunEachKept(CollectiveRunner& run, int n, const std::string& op,
                              const std::function<Handles(int)>& inputs,
                              std::vector<AttrOverride> attrs, Handles& made) {
  std::vector<Handles> all(n);
  for (int d = 0; d < n; ++d) all[d] = inputs(d);
  TFD_ASSIGN_OR_RETURN(Handles out, run.RunEach(op, all, Attrs(std::move(attrs))));
  made.insert(made.end(), out.begin(), out.end());
  return out;
}

// Whether some device's piece has a size known only at run time (inside a tf.function).
bool AnyRunTimeShape(CollectiveRunner& run, const Handles& values) {
  for (LocalHandle h : values) {
    std::optional<std::vector<int64_t>> shape = run.LocalShape(h);
    if (!shape) return true;
    for (int64_t s : *shape) {
      if (s < 0) return true;
    }
  }
  return false;
}

// Pieces of up to 2^(kSizeBuckets - 1) elements take RunBucketedStep.
constexpr int32_t kSizeBuckets = 40;

// A reduce or gather step of pieces whose size is known only at run time. TF's collective
// runtime records an instance's shape per (step, instance key): in a tf.while_loop every
// iteration runs in one step, so a key whose pieces change size between iterations (the
// last, smaller batch of a loop over a tf.data iterator) aborted the collective ("Shape
// mismatch in the collective instance ... expected shape [2,4] but another member in the
// group expected shape [4,4]"), and every later one of the process with it. So each
// device's piece is flattened and padded with zeros to the next power of two of its
// element count (at least 1: TF's collective ops crash the process on an empty piece),
// and the step takes the key of that size bucket from a block of kSizeBuckets keys: one
// key, one shape. The members of a group hold pieces of one size, so they agree on the
// bucket. The padding is cut off after, and the result has the piece's shape (a gather:
// its first axis times the group size).
StatusOr<Handles> RunBucketedStep(CollectiveRunner& run, const std::string& op_type,
                                  const Handles& values, const CollectiveGroups& groups,
                                  const LocalOpOptions& options) {
  int dtype = -1;
  for (const AttrOverride& a : options.overrides) {
    if (a.name == "T") dtype = a.type;
  }
  const bool gather = op_type == "CollectiveGatherV2";
  const int n = static_cast<int>(values.size());
  const int64_t group_size = groups.group_size();
  Handles made;  // everything made here but the results
  auto each = [&](const std::string& op, const std::function<Handles(int)>& inputs,
                  std::vector<AttrOverride> attrs) {
    return RunEachKept(run, n, op, inputs, std::move(attrs), made);
  };
  const int32_t first_key = NextInstanceKeys(kSizeBuckets);
  StatusOr<Handles> result = [&]() -> StatusOr<Handles> {
    const AttrOverride int64_type = AttrOverride::Type("T", TF_INT64);
    const AttrOverride int64_shape = AttrOverride::Type("Tshape", TF_INT64);
    std::vector<int64_t> powers(kSizeBuckets);
    for (int32_t i = 0; i < kSizeBuckets; ++i) powers[i] = int64_t{1} << i;
    TFD_ASSIGN_OR_RETURN(LocalHandle bucket_sizes, run.Host(powers, {kSizeBuckets}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle zero, run.Host({0}, {1}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle one, run.Host({1}, {1}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle minus_one, run.Host({-1}, {1}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle scalar, run.Host({}, {0}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle pair, run.Host({1, 2}, {2}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle axis, run.Host({0}, {}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(LocalHandle first_key_value, run.Host({first_key}, {}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(LocalHandle size, run.Host({group_size}, {}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(LocalHandle groups_value, run.Host({group_size, -1}, {2}, TF_INT64));
    TFD_ASSIGN_OR_RETURN(LocalHandle group_factor, run.Host({group_size}, {1}, TF_INT64));
    made.insert(made.end(), {bucket_sizes, zero, one, minus_one, scalar, pair, axis,
                             first_key_value, size, groups_value, group_factor});
    // Each piece's shape and element count ([1]).
    TFD_ASSIGN_OR_RETURN(Handles shape, each("Shape", [&](int d) { return Handles{values[d]}; },
                                             {AttrOverride::Type("T", dtype),
                                              AttrOverride::Type("out_type", TF_INT64)}));
    TFD_ASSIGN_OR_RETURN(Handles count, each("Size", [&](int d) { return Handles{values[d]}; },
                                             {AttrOverride::Type("T", dtype),
                                              AttrOverride::Type("out_type", TF_INT64)}));
    TFD_ASSIGN_OR_RETURN(Handles elements,
                         each("Reshape", [&](int d) { return Handles{count[d], one}; },
                              {int64_type, int64_shape}));
    // The bucket: how many of 1, 2, 4, ... are below the count; its size, the padding.
    TFD_ASSIGN_OR_RETURN(Handles below,
                         each("Less", [&](int d) { return Handles{bucket_sizes, elements[d]}; },
                              {int64_type}));
    TFD_ASSIGN_OR_RETURN(Handles below_count,
                         each("Cast", [&](int d) { return Handles{below[d]}; },
                              {AttrOverride::Type("SrcT", TF_BOOL),
                               AttrOverride::Type("DstT", TF_INT64),
                               AttrOverride::Bool("Truncate", false)}));
    TFD_ASSIGN_OR_RETURN(Handles bucket,
                         each("Sum", [&](int d) { return Handles{below_count[d], axis}; },
                              {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                               AttrOverride::Bool("keep_dims", true)}));
    TFD_ASSIGN_OR_RETURN(Handles padded_size,
                         each("GatherV2",
                              [&](int d) { return Handles{bucket_sizes, bucket[d], axis}; },
                              {AttrOverride::Type("Tparams", TF_INT64),
                               AttrOverride::Type("Tindices", TF_INT64),
                               AttrOverride::Type("Taxis", TF_INT32),
                               AttrOverride::Int("batch_dims", 0)}));
    TFD_ASSIGN_OR_RETURN(Handles after,
                         each("Sub", [&](int d) { return Handles{padded_size[d], elements[d]}; },
                              {int64_type}));
    TFD_ASSIGN_OR_RETURN(Handles flat_paddings,
                         each("ConcatV2", [&](int d) { return Handles{zero, after[d], axis}; },
                              {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                               AttrOverride::Int("N", 2)}));
    TFD_ASSIGN_OR_RETURN(Handles paddings,
                         each("Reshape", [&](int d) { return Handles{flat_paddings[d], pair}; },
                              {int64_type, int64_shape}));
    TFD_ASSIGN_OR_RETURN(Handles flat,
                         each("Reshape", [&](int d) { return Handles{values[d], minus_one}; },
                              {AttrOverride::Type("T", dtype), int64_shape}));
    TFD_ASSIGN_OR_RETURN(Handles padded,
                         each("Pad", [&](int d) { return Handles{flat[d], paddings[d]}; },
                              {AttrOverride::Type("T", dtype),
                               AttrOverride::Type("Tpaddings", TF_INT64)}));
    // The bucket's key: first_key + bucket.
    TFD_ASSIGN_OR_RETURN(Handles bucket_scalar,
                         each("Reshape", [&](int d) { return Handles{bucket[d], scalar}; },
                              {int64_type, int64_shape}));
    TFD_ASSIGN_OR_RETURN(Handles bucket32,
                         each("Cast", [&](int d) { return Handles{bucket_scalar[d]}; },
                              {AttrOverride::Type("SrcT", TF_INT64),
                               AttrOverride::Type("DstT", TF_INT32),
                               AttrOverride::Bool("Truncate", false)}));
    TFD_ASSIGN_OR_RETURN(Handles key,
                         each("AddV2", [&](int d) { return Handles{bucket32[d], first_key_value}; },
                              {AttrOverride::Type("T", TF_INT32)}));
    std::map<int, LocalHandle> group_keys;  // group -> its key, as a host constant
    std::vector<Handles> inputs(n);
    for (int d = 0; d < n; ++d) {
      const int g = groups.group_of(d);
      if (!group_keys.count(g)) {
        TFD_ASSIGN_OR_RETURN(LocalHandle group_key, run.Host({groups.group_key(g)}, {}, TF_INT32));
        made.push_back(group_key);
        group_keys[g] = group_key;
      }
      inputs[d] = {padded[d], size, group_keys[g], key[d]};
    }
    TFD_ASSIGN_OR_RETURN(Handles out, run.RunCollective(op_type, inputs, options));
    made.insert(made.end(), out.begin(), out.end());
    if (!gather) {
      // [bucket size] -> the piece's elements -> its shape.
      TFD_ASSIGN_OR_RETURN(Handles real,
                           each("Slice", [&](int d) { return Handles{out[d], zero, elements[d]}; },
                                {AttrOverride::Type("T", dtype),
                                 AttrOverride::Type("Index", TF_INT64)}));
      std::vector<Handles> reshape(n);
      for (int d = 0; d < n; ++d) reshape[d] = {real[d], shape[d]};
      return run.RunEach("Reshape", reshape, Attrs({AttrOverride::Type("T", dtype), int64_shape}));
    }
    // [group size * bucket size] -> [group size, bucket size] -> each piece's elements
    // -> [group size * rows, the piece's other axes...].
    TFD_ASSIGN_OR_RETURN(Handles stacked,
                         each("Reshape", [&](int d) { return Handles{out[d], groups_value}; },
                              {AttrOverride::Type("T", dtype), int64_shape}));
    TFD_ASSIGN_OR_RETURN(Handles begin, [&]() -> StatusOr<Handles> {
      TFD_ASSIGN_OR_RETURN(LocalHandle b, run.Host({0, 0}, {2}, TF_INT64));
      made.push_back(b);
      return Handles(n, b);
    }());
    TFD_ASSIGN_OR_RETURN(Handles sizes,
                         each("ConcatV2", [&](int d) { return Handles{minus_one, elements[d], axis}; },
                              {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                               AttrOverride::Int("N", 2)}));
    TFD_ASSIGN_OR_RETURN(Handles real,
                         each("Slice", [&](int d) { return Handles{stacked[d], begin[d], sizes[d]}; },
                              {AttrOverride::Type("T", dtype),
                               AttrOverride::Type("Index", TF_INT64)}));
    TFD_ASSIGN_OR_RETURN(Handles rows,
                         each("Slice", [&](int d) { return Handles{shape[d], zero, one}; },
                              {int64_type, AttrOverride::Type("Index", TF_INT64)}));
    TFD_ASSIGN_OR_RETURN(Handles all_rows,
                         each("Mul", [&](int d) { return Handles{rows[d], group_factor}; },
                              {int64_type}));
    TFD_ASSIGN_OR_RETURN(Handles other_axes,
                         each("Slice", [&](int d) { return Handles{shape[d], one, minus_one}; },
                              {int64_type, AttrOverride::Type("Index", TF_INT64)}));
    TFD_ASSIGN_OR_RETURN(Handles gathered_shape,
                         each("ConcatV2",
                              [&](int d) { return Handles{all_rows[d], other_axes[d], axis}; },
                              {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                               AttrOverride::Int("N", 2)}));
    std::vector<Handles> reshape(n);
    for (int d = 0; d < n; ++d) reshape[d] = {real[d], gathered_shape[d]};
    return run.RunEach("Reshape", reshape, Attrs({AttrOverride::Type("T", dtype), int64_shape}));
  }();
  run.DiscardAll(made);
  if (!result.ok()) return result.status();
  // The piece's shape as far as it is known (a gather's first axis: the group's rows).
  for (int d = 0; d < n; ++d) {
    std::optional<std::vector<int64_t>> known = run.LocalShape(values[d]);
    if (!known || known->empty()) continue;
    if (gather && (*known)[0] >= 0) (*known)[0] *= group_size;
    run.SetLocalShape((*result)[d], *known);
  }
  return result;
}

// One TF collective step: `op_type` on every device d with {values[d], group size,
// group key(d's group), instance key}. The instance key is fresh, or, eagerly, one an
// earlier successful step of the same signature has finished with (collectives.h:
// TakeInstanceKey; TF keeps a record per key for the life of the context).
StatusOr<Handles> RunCollectiveStep(CollectiveRunner& run, const std::string& op_type,
                                    const Handles& values, const CollectiveGroups& groups,
                                    const LocalOpOptions& options) {
  if ((op_type == "CollectiveReduceV2" || op_type == "CollectiveGatherV2") &&
      AnyRunTimeShape(run, values)) {
    return RunBucketedStep(run, op_type, values, groups, options);
  }
  const std::string signature = ReusableKeySignature(run, op_type, values, groups, options);
  const int32_t key = signature.empty() ? NextInstanceKey() : TakeInstanceKey(signature);
  auto host = [&](int64_t value) { return run.Host({value}, {}, TF_INT32); };
  StatusOr<Handles> out = [&]() -> StatusOr<Handles> {
    TFD_ASSIGN_OR_RETURN(LocalHandle size, host(groups.group_size()));
    TFD_ASSIGN_OR_RETURN(LocalHandle instance, host(key));
    std::map<int, LocalHandle> keys;  // group -> its key, as a host constant
    std::vector<Handles> inputs(values.size());
    for (int d = 0; d < static_cast<int>(values.size()); ++d) {
      const int g = groups.group_of(d);
      if (!keys.count(g)) {
        TFD_ASSIGN_OR_RETURN(LocalHandle group_key, host(groups.group_key(g)));
        keys[g] = group_key;
      }
      inputs[d] = {values[d], size, keys[g], instance};
    }
    return run.RunCollective(op_type, inputs, options);
  }();
  // A failed step's key is not reused: some participants may have entered the collective.
  if (out.ok() && !signature.empty()) ReturnInstanceKey(signature, key);
  return out;
}

// Puts the `pieces` equal chunks along axis 0 of every device's handle in the order
// `order(device)[j]` names for chunk j (Split + ConcatV2); temporaries go to `made`.
StatusOr<Handles> PermuteChunks(CollectiveRunner& run, const Handles& handles, int64_t pieces,
                                const CollectiveGroups& groups, bool to_tf_order, int dtype,
                                Handles& made) {
  TFD_ASSIGN_OR_RETURN(LocalHandle axis, run.Host({0}, {}, TF_INT32));
  LocalOpOptions split;
  split.copy_attrs = false;
  split.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("num_split", pieces)};
  LocalOpOptions concat;
  concat.copy_attrs = false;
  concat.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tidx", TF_INT32),
                      AttrOverride::Int("N", pieces)};
  Handles result;
  for (int d = 0; d < static_cast<int>(handles.size()); ++d) {
    StatusOr<Handles> parts =
        run.RunOn("Split", {axis, handles[d]}, split, d, static_cast<int>(pieces));
    if (!parts.ok()) {
      made.insert(made.end(), result.begin(), result.end());
      return parts.status();
    }
    made.insert(made.end(), parts->begin(), parts->end());
    // tf_order[j]: the mesh position of TF's j-th participant.
    const std::vector<int>& order = groups.tf_order(groups.group_of(d));
    Handles ordered(pieces);
    for (int64_t j = 0; j < pieces; ++j) {
      if (to_tf_order) {
        ordered[j] = (*parts)[order[j]];
      } else {
        ordered[order[j]] = (*parts)[j];
      }
    }
    ordered.push_back(axis);
    StatusOr<Handles> joined = run.RunOn("ConcatV2", ordered, concat, d, 1);
    if (!joined.ok()) {
      made.insert(made.end(), result.begin(), result.end());
      return joined.status();
    }
    result.push_back((*joined)[0]);
  }
  return result;
}

// Whether every block of `value` is empty (a known axis of size 0). TF's collective ops
// are not run on those: CollectiveGatherV2 of empty pieces crashes the process.
bool IsEmpty(Builder& b, ValueId value) {
  for (int64_t s : b.shape(value)) {
    if (s == 0) return true;
  }
  return false;
}

// The result of a collective of an empty value: each device's own (empty) block reshaped
// to its block of `out_layout`; no data moves, as none exists.
StatusOr<ValueId> EmptyResult(CollectiveRunner& run, ValueId value, const Layout& out_layout) {
  Builder& b = run.builder();
  const std::vector<int64_t> global = b.shape(value);
  const int dtype = b.dtype(value);
  LocalOpOptions reshape;
  reshape.copy_attrs = false;
  reshape.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT64)};
  const int n = run.mesh().num_local_devices();
  std::vector<Handles> inputs(n);
  for (int d = 0; d < n; ++d) {
    const std::vector<int64_t> block = out_layout.GeometryOfDevice(global, d).shape;
    TFD_ASSIGN_OR_RETURN(LocalHandle shape,
                         run.Host(block, {static_cast<int64_t>(block.size())}, TF_INT64));
    inputs[d] = {run.Local(value, d), shape};
  }
  TFD_ASSIGN_OR_RETURN(Handles out, run.RunEach("Reshape", inputs, reshape));
  for (int d = 0; d < n; ++d) {
    run.SetLocalShape(out[d], out_layout.GeometryOfDevice(global, d).shape);
  }
  return run.AddValue(out_layout, global, dtype, out);
}

// Each device's handle padded with zeros after each axis by `padding[device][axis]`.
StatusOr<Handles> PadEach(CollectiveRunner& run, const Handles& handles,
                          const std::vector<std::vector<int64_t>>& padding, int dtype) {
  LocalOpOptions pad;
  pad.copy_attrs = false;
  pad.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tpaddings", TF_INT32)};
  std::vector<Handles> inputs(handles.size());
  for (int d = 0; d < static_cast<int>(handles.size()); ++d) {
    const int64_t rank = static_cast<int64_t>(padding[d].size());
    std::vector<int64_t> paddings(2 * rank, 0);
    for (int64_t a = 0; a < rank; ++a) paddings[2 * a + 1] = padding[d][a];
    TFD_ASSIGN_OR_RETURN(LocalHandle p, run.Host(paddings, {rank, 2}, TF_INT32));
    inputs[d] = {handles[d], p};
  }
  return run.RunEach("Pad", inputs, pad);
}

// Blocks that are empty where the value is not: uneven pieces can leave a device nothing
// along an axis ([3,1] over y=2 gives blocks of 1 and 0 columns). TF's collective ops
// crash the process on an input without elements, so such a block goes in padded to one
// row along each empty axis other than `keep` (-1: none kept), and the padding is cut off
// the result (TrimToBlocks). Every device of a group holds blocks of the same size along
// the axes its collective does not combine, so the group's devices agree on the padded
// shape. Returns, per device, the padding after each axis (all zero where nothing is).
std::vector<std::vector<int64_t>> EmptyAxisPadding(const Layout& layout,
                                                   const std::vector<int64_t>& global,
                                                   int devices, int keep) {
  std::vector<std::vector<int64_t>> padding(devices, std::vector<int64_t>(global.size(), 0));
  for (int d = 0; d < devices; ++d) {
    const std::vector<int64_t> block = layout.GeometryOfDevice(global, d).shape;
    for (int a = 0; a < static_cast<int>(block.size()); ++a) {
      if (a != keep && block[a] == 0) padding[d][a] = 1;
    }
  }
  return padding;
}

bool AnyPadding(const std::vector<std::vector<int64_t>>& padding) {
  for (const auto& device : padding) {
    for (int64_t p : device) {
      if (p != 0) return true;
    }
  }
  return false;
}

// Each device's handle sliced to its block of `layout` (the padding EmptyAxisPadding added
// taken off again); the padded handles go to `made`.
StatusOr<Handles> TrimToBlocks(CollectiveRunner& run, const Handles& handles,
                               const Layout& layout, const std::vector<int64_t>& global,
                               int dtype, Handles& made) {
  made.insert(made.end(), handles.begin(), handles.end());
  const int rank = static_cast<int>(global.size());
  LocalOpOptions slice;
  slice.copy_attrs = false;
  slice.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Index", TF_INT64)};
  TFD_ASSIGN_OR_RETURN(LocalHandle begin,
                       run.Host(std::vector<int64_t>(rank, 0), {rank}, TF_INT64));
  std::vector<Handles> inputs(handles.size());
  for (int d = 0; d < static_cast<int>(handles.size()); ++d) {
    TFD_ASSIGN_OR_RETURN(LocalHandle size,
                         run.Host(layout.GeometryOfDevice(global, d).shape, {rank}, TF_INT64));
    inputs[d] = {handles[d], begin, size};
  }
  return run.RunEach("Slice", inputs, slice);
}

// The all-gather along axis 0 of pieces whose sizes are known only at run time (inside a
// tf.function: a batch of a tf.data iterator, the last one partial). CollectiveGatherV2
// needs pieces of one shape, so each device's row count goes round first (a gather of one
// int64 each), every piece is padded with zeros to the largest (at least one row: TF's
// collective ops crash the process on a piece without elements), the padded pieces are
// gathered, and each device keeps the real rows of every chunk in piece order (RaggedRange
// of the chunks' row spans, then GatherV2). `current[d]` is device d's piece with the
// gathered axis first, of dtype `dtype` (a wire type); `position_of[c]` is the group
// position holding piece c. What it makes and does not hand on goes to `made`.
StatusOr<Handles> GatherRunTimeSizes(CollectiveRunner& run, const Handles& current, int rank,
                                     const CollectiveGroups& groups, int dtype,
                                     const std::vector<int64_t>& position_of, Handles& made) {
  const int n = static_cast<int>(current.size());
  const int64_t group_size = groups.group_size();
  auto each = [&](const std::string& op, const std::function<Handles(int)>& inputs,
                  std::vector<AttrOverride> attrs) {
    return RunEachKept(run, n, op, inputs, std::move(attrs), made);
  };
  const AttrOverride int64_type = AttrOverride::Type("T", TF_INT64);
  TFD_ASSIGN_OR_RETURN(LocalHandle zero, run.Host({0}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(LocalHandle one, run.Host({1}, {1}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(LocalHandle axis, run.Host({0}, {}, TF_INT32));
  // Each device's row count ([1]) and the group's ([group_size], in group order).
  TFD_ASSIGN_OR_RETURN(Handles shape,
                       each("Shape", [&](int d) { return Handles{current[d]}; },
                            {AttrOverride::Type("T", dtype),
                             AttrOverride::Type("out_type", TF_INT64)}));
  TFD_ASSIGN_OR_RETURN(Handles rows,
                       each("Slice", [&](int d) { return Handles{shape[d], zero, one}; },
                            {int64_type, AttrOverride::Type("Index", TF_INT64)}));
  TFD_ASSIGN_OR_RETURN(Handles sizes, RunCollectiveStep(run, "CollectiveGatherV2", rows, groups,
                                                        CollectiveOptions(run.mesh(), TF_INT64)));
  made.insert(made.end(), sizes.begin(), sizes.end());
  if (!groups.tf_order_is_identity()) {
    TFD_ASSIGN_OR_RETURN(sizes, PermuteChunks(run, sizes, group_size, groups,
                                              /*to_tf_order=*/false, TF_INT64, made));
    made.insert(made.end(), sizes.begin(), sizes.end());
  }
  // The chunk: the largest piece, at least one row; paddings [[0, chunk - rows], [0, 0]...].
  TFD_ASSIGN_OR_RETURN(Handles largest,
                       each("Max", [&](int d) { return Handles{sizes[d], axis}; },
                            {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                             AttrOverride::Bool("keep_dims", true)}));
  TFD_ASSIGN_OR_RETURN(Handles chunk,
                       each("Maximum", [&](int d) { return Handles{largest[d], one}; },
                            {int64_type}));
  TFD_ASSIGN_OR_RETURN(Handles after,
                       each("Sub", [&](int d) { return Handles{chunk[d], rows[d]}; },
                            {int64_type}));
  TFD_ASSIGN_OR_RETURN(LocalHandle rest, run.Host(std::vector<int64_t>(2 * (rank - 1), 0),
                                                  {2 * static_cast<int64_t>(rank - 1)},
                                                  TF_INT64));
  TFD_ASSIGN_OR_RETURN(Handles flat,
                       each("ConcatV2", [&](int d) { return Handles{zero, after[d], rest, axis}; },
                            {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                             AttrOverride::Int("N", 3)}));
  TFD_ASSIGN_OR_RETURN(LocalHandle pairs, run.Host({rank, 2}, {2}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(Handles paddings,
                       each("Reshape", [&](int d) { return Handles{flat[d], pairs}; },
                            {int64_type, AttrOverride::Type("Tshape", TF_INT64)}));
  TFD_ASSIGN_OR_RETURN(Handles padded,
                       each("Pad", [&](int d) { return Handles{current[d], paddings[d]}; },
                            {AttrOverride::Type("T", dtype),
                             AttrOverride::Type("Tpaddings", TF_INT64)}));
  TFD_ASSIGN_OR_RETURN(Handles gathered,
                       RunCollectiveStep(run, "CollectiveGatherV2", padded, groups,
                                         CollectiveOptions(run.mesh(), dtype)));
  if (!groups.tf_order_is_identity()) {
    made.insert(made.end(), gathered.begin(), gathered.end());
    TFD_ASSIGN_OR_RETURN(gathered, PermuteChunks(run, gathered, group_size, groups,
                                                 /*to_tf_order=*/false, dtype, made));
  }
  // Piece c's rows: [position_of[c] * chunk, position_of[c] * chunk + sizes[position_of[c]]).
  TFD_ASSIGN_OR_RETURN(LocalHandle positions, run.Host(position_of, {group_size}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(LocalHandle ones,
                       run.Host(std::vector<int64_t>(group_size, 1), {group_size}, TF_INT64));
  TFD_ASSIGN_OR_RETURN(Handles starts,
                       each("Mul", [&](int d) { return Handles{positions, chunk[d]}; },
                            {int64_type}));
  TFD_ASSIGN_OR_RETURN(Handles counts,
                       each("GatherV2", [&](int d) { return Handles{sizes[d], positions, axis}; },
                            {AttrOverride::Type("Tparams", TF_INT64),
                             AttrOverride::Type("Tindices", TF_INT64),
                             AttrOverride::Type("Taxis", TF_INT32),
                             AttrOverride::Int("batch_dims", 0)}));
  TFD_ASSIGN_OR_RETURN(Handles limits,
                       each("AddV2", [&](int d) { return Handles{starts[d], counts[d]}; },
                            {int64_type}));
  Handles kept(n);
  for (int d = 0; d < n; ++d) {
    TFD_ASSIGN_OR_RETURN(std::vector<LocalHandle> ranges,
                         run.RunOn("RaggedRange", {starts[d], limits[d], ones},
                                   Attrs({int64_type, AttrOverride::Type("Tsplits", TF_INT64)}),
                                   d, 2));
    made.insert(made.end(), ranges.begin(), ranges.end());
    kept[d] = ranges[1];
  }
  std::vector<Handles> take(n);
  for (int d = 0; d < n; ++d) take[d] = {gathered[d], kept[d], axis};
  made.insert(made.end(), gathered.begin(), gathered.end());
  return run.RunEach("GatherV2", take,
                     Attrs({AttrOverride::Type("Tparams", dtype),
                            AttrOverride::Type("Tindices", TF_INT64),
                            AttrOverride::Type("Taxis", TF_INT32),
                            AttrOverride::Int("batch_dims", 0)}));
}

class CollectiveOps final : public CollectiveLowering {
 public:
  std::string_view name() const override { return "ops"; }
  bool shares_buffers() const override { return false; }
  bool Serves(const Mesh& mesh, bool multi_client) const override { return true; }

  // [x,*] partial over x -> every device of a group holds the group's reduction:
  // CollectiveReduceV2(local, group_size, group_key(g), instance_key) on every device;
  // a floating-point sum, mean or product whose groups TF ranks in different orders
  // (a permuted device list) is gathered and reduced in mesh order (ReduceByGather).
  StatusOr<ValueId> AllReduce(CollectiveRunner& run, ValueId value,
                              const std::vector<int>& mesh_dims, ReduceOp op) const override;
  // [x,*] -> [*,*] along tensor axis `dim`: CollectiveGatherV2 stacks the pieces along
  // axis 0, so another axis is moved to the front first and back after:
  //   local [a, b/x] -> transpose [b/x, a] -> gather [b, a] -> transpose [a, b].
  // TF stacks the pieces in its own ranking of the group's devices (by task, then device
  // index); where that differs from the order along the mesh dimension, the pieces are
  // split and concatenated in mesh order.
  // Uneven shards (the shard geometry's ceil-sized pieces, trailing ones smaller or
  // empty): each piece is padded to the chunk size before the gather, and after it one
  // GatherV2 per device keeps the real rows of each chunk, in mesh order.
  StatusOr<ValueId> AllGather(CollectiveRunner& run, ValueId value, int dim) const override;
  // [x,*] -> [*,x] in one exchange. With f = from_dim, t = to_dim and N devices along x,
  // device c holds rows block c; it sends its column block k to device k and receives
  // every device's rows of its own column block:
  //   local [a/N, b] -> transpose t first [b, a/N] -> reshape [N, b/N, a/N]
  //   -> CollectiveAllToAllV2 (chunk k to device k; the result stacks the chunks by
  //   sender) [N, b/N, a/N] -> transpose [N, a/N, b/N] -> reshape [a, b/N].
  // Dtypes the op lacks and uneven shards take the gather + slice path.
  StatusOr<ValueId> AllToAll(CollectiveRunner& run, ValueId value, int from_dim,
                             int to_dim) const override;
};

// Whether adding (multiplying) the same terms in another order can round differently:
// floating-point sums, means and products. Integer sums wrap alike in any order; a
// maximum or minimum does not depend on the order.
bool OrderSensitive(int dtype, ReduceOp op) {
  if (op == ReduceOp::kMax || op == ReduceOp::kMin) return false;
  switch (dtype) {
    case TF_FLOAT: case TF_HALF: case TF_BFLOAT16: case TF_DOUBLE: case TF_COMPLEX64:
    case TF_COMPLEX128:
      return true;
    default:
      return false;
  }
}

// An all-reduce that CollectiveReduceV2 cannot do for this dtype (a product, maximum or
// minimum of complex numbers: their parts do not reduce on their own; a mean, maximum or
// minimum of uint64, which would read as int64), or one whose groups would add their terms
// in different orders (`tf_orders_agree`): every device's block is gathered on a new
// leading axis (CollectiveGatherV2, which takes complex numbers as float pairs), the pieces
// are put in mesh order, and they are reduced over that axis by the op's own reduction
// kernel (an integer Mean truncates, as one device's does), so every group adds the same
// terms in the same order and the replicas agree bit for bit. `blocks` are non-empty
// (padded by the caller); the results are new handles.
StatusOr<Handles> ReduceByGather(CollectiveRunner& run, const Handles& blocks,
                                 const CollectiveGroups& groups, int dtype, ReduceOp op) {
  const Wire wire = GatherWire(dtype);
  if (!wire.supported) return UnsupportedCollectiveType("all-reduce", dtype);
  Handles made;
  auto fail = [&](const Status& status) {
    run.DiscardAll(made);
    return status;
  };
  StatusOr<LocalHandle> zero = run.Host({0}, {}, TF_INT32);
  if (!zero.ok()) return zero.status();
  LocalOpOptions expand;
  expand.copy_attrs = false;
  expand.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tdim", TF_INT32)};
  StatusOr<Handles> stacked = RunEachWith(run, "ExpandDims", blocks, *zero, expand);
  if (!stacked.ok()) return stacked.status();
  Handles current = *stacked;
  made.insert(made.end(), current.begin(), current.end());
  if (wire.wire != dtype) {
    StatusOr<Handles> converted = ConvertEach(run, current, dtype, wire.wire, wire.bitcast);
    if (!converted.ok()) return fail(converted.status());
    current = *converted;
    made.insert(made.end(), current.begin(), current.end());
  }
  StatusOr<Handles> gathered = RunCollectiveStep(run, "CollectiveGatherV2", current, groups,
                                                 CollectiveOptions(run.mesh(), wire.wire));
  if (!gathered.ok()) return fail(gathered.status());
  current = *gathered;
  made.insert(made.end(), current.begin(), current.end());
  if (wire.wire != dtype) {
    StatusOr<Handles> back = ConvertEach(run, current, wire.wire, dtype, wire.bitcast);
    if (!back.ok()) return fail(back.status());
    current = *back;
    made.insert(made.end(), current.begin(), current.end());
  }
  if (!groups.tf_order_is_identity()) {
    // Piece j of the gather is the block of the device at position tf_order[j].
    StatusOr<Handles> ordered =
        PermuteChunks(run, current, groups.group_size(), groups, false, dtype, made);
    if (!ordered.ok()) return fail(ordered.status());
    current = *ordered;
    made.insert(made.end(), current.begin(), current.end());
  }
  LocalOpOptions reduce;
  reduce.copy_attrs = false;
  reduce.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tidx", TF_INT32),
                      AttrOverride::Bool("keep_dims", false)};
  const char* kernel = op == ReduceOp::kSum    ? "Sum"
                       : op == ReduceOp::kProd ? "Prod"
                       : op == ReduceOp::kMax  ? "Max"
                       : op == ReduceOp::kMean ? "Mean"
                                               : "Min";
  StatusOr<Handles> reduced = RunEachWith(run, kernel, current, *zero, reduce);
  run.DiscardAll(made);
  return reduced;
}

StatusOr<ValueId> CollectiveOps::AllReduce(CollectiveRunner& run, ValueId value,
                                           const std::vector<int>& mesh_dims, ReduceOp op) const {
  Builder& b = run.builder();
  const CollectiveGroups& groups = CollectiveGroups::For(run.mesh(), mesh_dims);
  const Layout layout = *b.layout(value);
  // Pending reductions over `mesh_dims` are done; others stay pending.
  std::vector<PartialSpec> still_partial;
  for (const PartialSpec& p : layout.partial()) {
    if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
      still_partial.push_back(p);
    }
  }
  TFD_ASSIGN_OR_RETURN(Layout out_layout, layout.WithoutPartial().WithPartial(still_partial));
  const int n = run.mesh().num_local_devices();
  const int dtype = b.dtype(value);
  if (groups.group_size() == 1 || IsEmpty(b, value)) {
    Handles out;
    for (int d = 0; d < n; ++d) {
      StatusOr<LocalHandle> h = run.Share(run.Local(value, d), d);
      if (!h.ok()) {
        run.DiscardAll(out);
        return h.status();
      }
      out.push_back(*h);
    }
    return run.AddValue(out_layout, b.shape(value), dtype, out);
  }
  const Wire wire = ReduceWire(run.mesh(), dtype, op);
  Handles sent(n);
  for (int d = 0; d < n; ++d) sent[d] = run.Local(value, d);
  const std::vector<int64_t> global = b.shape(value);
  const std::vector<std::vector<int64_t>> padding = EmptyAxisPadding(layout, global, n, -1);
  const bool padded = AnyPadding(padding);
  Handles made;  // padded blocks, discarded at the end
  if (padded) {
    TFD_ASSIGN_OR_RETURN(sent, PadEach(run, sent, padding, dtype));
    made = sent;
  }
  if (!wire.supported || (!groups.tf_orders_agree() && OrderSensitive(dtype, op))) {
    StatusOr<Handles> reduced = ReduceByGather(run, sent, groups, dtype, op);
    // TrimToBlocks puts the untrimmed results in `made` (once: twice was a double free).
    if (padded && reduced.ok()) {
      reduced = TrimToBlocks(run, *reduced, out_layout, global, dtype, made);
    }
    run.DiscardAll(made);
    if (!reduced.ok()) return reduced.status();
    return run.AddValue(out_layout, global, dtype, *reduced);
  }
  if (wire.wire != dtype) {
    StatusOr<Handles> converted = ConvertEach(run, sent, dtype, wire.wire, wire.bitcast);
    if (!converted.ok()) {
      run.DiscardAll(made);
      return converted.status();
    }
    sent = std::move(converted).value();
  }
  LocalOpOptions options = CollectiveOptions(run.mesh(), wire.wire);
  options.overrides.push_back(AttrOverride::String("merge_op", CollectiveMergeOp(op)));
  options.overrides.push_back(
      AttrOverride::String("final_op", op == ReduceOp::kMean ? "Div" : "Id"));
  StatusOr<Handles> reduced = RunCollectiveStep(run, "CollectiveReduceV2", sent, groups, options);
  if (wire.wire != dtype) run.DiscardAll(sent);
  if (!reduced.ok()) {
    run.DiscardAll(made);
    return reduced.status();
  }
  if (wire.wire != dtype) {
    StatusOr<Handles> back = ConvertEach(run, *reduced, wire.wire, dtype, wire.bitcast);
    run.DiscardAll(*reduced);
    if (!back.ok()) {
      run.DiscardAll(made);
      return back.status();
    }
    reduced = std::move(back);
  }
  if (padded) reduced = TrimToBlocks(run, *reduced, out_layout, global, dtype, made);
  run.DiscardAll(made);
  if (!reduced.ok()) return reduced.status();
  return run.AddValue(out_layout, global, dtype, *reduced);
}

StatusOr<ValueId> CollectiveOps::AllGather(CollectiveRunner& run, ValueId value, int dim) const {
  Builder& b = run.builder();
  const Mesh& mesh = run.mesh();
  const Layout layout = *b.layout(value);
  const DimSpec spec = layout.spec(dim);
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(Layout out_layout, layout.WithSpecs(specs).WithPartial(layout.partial()));
  if (IsEmpty(b, value)) return EmptyResult(run, value, out_layout);
  if (layout.NumShards(dim) == 1) return SameBlocks(run, value, out_layout);
  const std::vector<int64_t> global = b.shape(value);
  const CollectiveGroups& groups = CollectiveGroups::For(mesh, spec.mesh_dims());
  const int n = mesh.num_local_devices();
  const int rank = layout.rank();
  const int dtype = b.dtype(value);
  const Wire wire = GatherWire(dtype);
  if (!wire.supported) return UnsupportedCollectiveType("all-gather", dtype);
  const int64_t group_size = groups.group_size();
  // Pieces whose sizes are known only at run time take GatherRunTimeSizes.
  bool all_known = true;
  for (int64_t s : global) all_known = all_known && s >= 0;
  const bool run_time = global[dim] < 0;
  const int64_t chunk = run_time ? 0 : Layout::Piece(global[dim], group_size, 0).first;
  const std::vector<int64_t> piece_sizes =
      run_time ? std::vector<int64_t>() : layout.PieceSizes(global, dim);
  // The group is ordered row-major over its mesh dimensions in mesh order; an axis over
  // several of them in another order ("y+x") numbers its pieces differently:
  // piece_at[r] is the piece held at group position r.
  std::vector<int64_t> piece_at(group_size);
  bool reordered = false;
  {
    std::vector<int> sorted = spec.mesh_dims();
    std::sort(sorted.begin(), sorted.end());
    for (int64_t r = 0; r < group_size; ++r) {
      std::vector<int64_t> coord(mesh.num_dims(), 0);
      int64_t rest = r;
      for (size_t k = sorted.size(); k-- > 0;) {
        coord[sorted[k]] = rest % mesh.DimSize(sorted[k]);
        rest /= mesh.DimSize(sorted[k]);
      }
      int64_t piece = 0;
      for (int m : spec.mesh_dims()) piece = piece * mesh.DimSize(m) + coord[m];
      piece_at[r] = piece;
      reordered = reordered || piece != r;
    }
  }
  // Uneven pieces are padded to the chunk size and trimmed after; reordered pieces take
  // the same trimming gather, which puts them in piece order.
  const bool uneven = !run_time && (global[dim] % group_size != 0 || reordered);

  // Handles made here and not handed on; discarded whatever happens.
  Handles temporaries;
  auto cleanup = [&](Status status) {
    run.DiscardAll(temporaries);
    return status;
  };
  Handles current(n);
  for (int d = 0; d < n; ++d) current[d] = run.Local(value, d);

  std::vector<int64_t> perm;  // moves `dim` to the front; its inverse moves it back
  std::vector<int64_t> inverse;
  auto transpose = [&](const std::vector<int64_t>& p) -> Status {
    StatusOr<LocalHandle> perm_value = run.Host(p, {static_cast<int64_t>(p.size())}, TF_INT32);
    if (!perm_value.ok()) return perm_value.status();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tperm", TF_INT32)};
    StatusOr<Handles> r = RunEachWith(run, "Transpose", current, *perm_value, options);
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

  // Blocks empty along another axis than `dim` are padded there (EmptyAxisPadding).
  const std::vector<std::vector<int64_t>> empty_padding =
      all_known ? EmptyAxisPadding(layout, global, n, dim)
            : std::vector<std::vector<int64_t>>(n, std::vector<int64_t>(rank, 0));
  const bool pad_empty = AnyPadding(empty_padding);
  if (uneven || pad_empty) {
    // Every piece to the chunk size: zeros after the real rows (axis `dim` is first now).
    std::vector<std::vector<int64_t>> padding(n, std::vector<int64_t>(rank, 0));
    for (int d = 0; d < n; ++d) {
      padding[d][0] = chunk - piece_sizes[layout.ShardIndex(d, dim)];
      for (int i = 1; i < rank; ++i) padding[d][i] = empty_padding[d][dim != 0 ? perm[i] : i];
    }
    StatusOr<Handles> padded = PadEach(run, current, padding, dtype);
    if (!padded.ok()) return cleanup(padded.status());
    current = std::move(padded).value();
    temporaries.insert(temporaries.end(), current.begin(), current.end());
  }
  if (wire.wire != dtype) {
    StatusOr<Handles> sent = ConvertEach(run, current, dtype, wire.wire, wire.bitcast);
    if (!sent.ok()) return cleanup(sent.status());
    current = std::move(sent).value();
    temporaries.insert(temporaries.end(), current.begin(), current.end());
  }
  std::vector<int64_t> position_of(group_size);
  for (int64_t r = 0; r < group_size; ++r) position_of[piece_at[r]] = r;
  StatusOr<Handles> gathered =
      run_time ? GatherRunTimeSizes(run, current, rank, groups, wire.wire, position_of,
                                    temporaries)
               : RunCollectiveStep(run, "CollectiveGatherV2", current, groups,
                                   CollectiveOptions(run.mesh(), wire.wire));
  if (!gathered.ok()) return cleanup(gathered.status());
  current = std::move(gathered).value();
  if (wire.wire != dtype) {
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    StatusOr<Handles> back = ConvertEach(run, current, wire.wire, dtype, wire.bitcast);
    if (!back.ok()) return cleanup(back.status());
    current = std::move(back).value();
  }
  StatusOr<std::vector<int64_t>> whole = out_layout.LocalShape(global, "the value");
  if (whole.ok() && !pad_empty && !run_time) {
    std::vector<int64_t> front = *whole;  // the gathered axis first
    for (size_t i = 0; i < perm.size(); ++i) front[i] = (*whole)[perm[i]];
    if (uneven) front[0] = chunk * group_size;  // padded until trimmed below
    for (int d = 0; d < n; ++d) run.SetLocalShape(current[d], front);
  }

  if (!run_time && !groups.tf_order_is_identity()) {
    // Piece j of the gather belongs to the device at position tf_order[j] of the group.
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    StatusOr<Handles> ordered =
        PermuteChunks(run, current, group_size, groups, false, dtype, temporaries);
    if (!ordered.ok()) return cleanup(ordered.status());
    current = std::move(ordered).value();
  }
  if (uneven) {
    // Keep rows [r * chunk, r * chunk + size) of the chunk at each group position r, in
    // piece order.
    std::vector<int64_t> rows;
    for (int64_t c = 0; c < group_size; ++c) {
      for (int64_t j = 0; j < piece_sizes[c]; ++j) rows.push_back(position_of[c] * chunk + j);
    }
    StatusOr<LocalHandle> indices = run.Host(rows, {static_cast<int64_t>(rows.size())}, TF_INT32);
    if (!indices.ok()) return cleanup(indices.status());
    StatusOr<LocalHandle> axis = run.Host({0}, {}, TF_INT32);
    if (!axis.ok()) return cleanup(axis.status());
    LocalOpOptions gather;
    gather.copy_attrs = false;
    gather.overrides = {AttrOverride::Type("Tparams", dtype),
                        AttrOverride::Type("Tindices", TF_INT32),
                        AttrOverride::Type("Taxis", TF_INT32), AttrOverride::Int("batch_dims", 0)};
    std::vector<Handles> gather_inputs(n);
    for (int d = 0; d < n; ++d) gather_inputs[d] = {current[d], *indices, *axis};
    temporaries.insert(temporaries.end(), current.begin(), current.end());
    StatusOr<Handles> trimmed = run.RunEach("GatherV2", gather_inputs, gather);
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
  if (pad_empty) {
    StatusOr<Handles> trimmed = TrimToBlocks(run, current, out_layout, global, dtype, temporaries);
    if (!trimmed.ok()) return cleanup(trimmed.status());
    current = std::move(trimmed).value();
  }
  // Each device's block, uneven ones too (TF's gather leaves its first axis unknown, and
  // an op's shape function may need it: MatrixSetDiagV2 refuses an unknown axis).
  bool known = true;
  for (int64_t s : global) known = known && s >= 0;
  for (int d = 0; known && d < n; ++d) {
    run.SetLocalShape(current[d], out_layout.GeometryOfDevice(global, d).shape);
  }
  run.DiscardAll(temporaries);
  return run.AddValue(out_layout, global, dtype, current);
}

StatusOr<ValueId> CollectiveOps::AllToAll(CollectiveRunner& run, ValueId value, int from_dim,
                                          int to_dim) const {
  Builder& b = run.builder();
  const Layout layout = *b.layout(value);
  const int mesh_dim = layout.spec(from_dim).mesh_dim;
  const CollectiveGroups& groups = CollectiveGroups::For(run.mesh(), {mesh_dim});
  const int64_t pieces = groups.group_size();
  const std::vector<int64_t> global = b.shape(value);
  const int dtype = b.dtype(value);
  const Wire wire = GatherWire(dtype);
  std::vector<DimSpec> specs = layout.specs();
  specs[to_dim] = specs[from_dim];
  specs[from_dim] = DimSpec::Replicated();
  if (IsEmpty(b, value) && !layout.spec(from_dim).multi()) {
    TFD_ASSIGN_OR_RETURN(Layout out_layout, Layout::FromSpecs(specs, layout.mesh(), layout.type(),
                                                              layout.partial()));
    return EmptyResult(run, value, out_layout);
  }
  // The exchange below reshapes every block alike: uneven blocks (along any axis, not only
  // the two exchanged) take the gather + slice path.
  if (layout.spec(from_dim).multi() || !wire.supported || wire.wire != dtype || pieces == 1 ||
      global[from_dim] % pieces != 0 || global[to_dim] % pieces != 0 || !layout.IsEven(global)) {
    return b.Builder::AllToAll(value, from_dim, to_dim);
  }
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), layout.partial()));
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> in_shape, layout.LocalShape(global, "the value"));
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> out_shape,
                       out_layout.LocalShape(global, "the relaid-out value"));
  const int rank = layout.rank();
  const int n = run.mesh().num_local_devices();

  Handles made;  // temporaries, discarded at the end
  auto cleanup = [&](Status status) {
    run.DiscardAll(made);
    return status;
  };
  Handles current(n);
  for (int d = 0; d < n; ++d) current[d] = run.Local(value, d);
  // Runs one local op on every device: inputs = {current[d], extra}.
  auto each = [&](const std::string& op_type, LocalHandle extra,
                  const LocalOpOptions& options) -> Status {
    StatusOr<Handles> r = RunEachWith(run, op_type, current, extra, options);
    if (!r.ok()) return r.status();
    current = std::move(r).value();
    made.insert(made.end(), current.begin(), current.end());
    return Status::Ok();
  };
  auto transpose = [&](const std::vector<int64_t>& perm) -> Status {
    StatusOr<LocalHandle> p = run.Host(perm, {static_cast<int64_t>(perm.size())}, TF_INT32);
    if (!p.ok()) return p.status();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tperm", TF_INT32)};
    return each("Transpose", *p, options);
  };
  auto reshape = [&](const std::vector<int64_t>& shape) -> Status {
    StatusOr<LocalHandle> s = run.Host(shape, {static_cast<int64_t>(shape.size())}, TF_INT32);
    if (!s.ok()) return s.status();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT32)};
    return each("Reshape", *s, options);
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
    StatusOr<Handles> r = PermuteChunks(run, current, pieces, groups, true, dtype, made);
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
  StatusOr<Handles> exchanged = RunCollectiveStep(run, "CollectiveAllToAllV2", current, groups,
                                                  CollectiveOptions(run.mesh(), dtype));
  if (!exchanged.ok()) return cleanup(exchanged.status());
  current = std::move(exchanged).value();
  made.insert(made.end(), current.begin(), current.end());
  for (int d = 0; d < n; ++d) run.SetLocalShape(current[d], split_shape);
  // 4. Chunks back in mesh order of their senders.
  if (!groups.tf_order_is_identity()) {
    StatusOr<Handles> r = PermuteChunks(run, current, pieces, groups, false, dtype, made);
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
  run.DiscardAll(made);
  return run.AddValue(out_layout, global, dtype, current);
}

}  // namespace

const CollectiveLowering& CollectiveOpsLowering() {
  static const CollectiveOps lowering;
  return lowering;
}

}  // namespace tf_dtensor
