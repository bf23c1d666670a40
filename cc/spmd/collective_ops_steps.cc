#include "cc/spmd/collective_ops_steps.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace collective_ops {
namespace {

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
                         each("ConcatV2",
                              [&](int d) { return Handles{minus_one, elements[d], axis}; },
                              {int64_type, AttrOverride::Type("Tidx", TF_INT32),
                               AttrOverride::Int("N", 2)}));
    TFD_ASSIGN_OR_RETURN(Handles real,
                         each("Slice",
                              [&](int d) { return Handles{stacked[d], begin[d], sizes[d]}; },
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

}  // namespace

LocalOpOptions CollectiveOptions(const Mesh& mesh, int dtype) {
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("Nordering_token", 0),
                       AttrOverride::String("communication_hint",
                                            UsesNccl(mesh) ? "nccl" : "auto")};
  return options;
}

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

StatusOr<Handles> RunEachWith(CollectiveRunner& run, const std::string& op_type,
                              const Handles& handles, LocalHandle extra,
                              const LocalOpOptions& options) {
  std::vector<Handles> inputs(handles.size());
  for (size_t d = 0; d < handles.size(); ++d) inputs[d] = {handles[d], extra};
  return run.RunEach(op_type, inputs, options);
}

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

bool IsEmpty(Builder& b, ValueId value) {
  for (int64_t s : b.shape(value)) {
    if (s == 0) return true;
  }
  return false;
}

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

}  // namespace collective_ops
}  // namespace tf_dtensor
