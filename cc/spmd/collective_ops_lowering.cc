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

#include "cc/spmd/collective_ops_steps.h"
#include "cc/spmd/lowering.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

using collective_ops::AnyPadding;
using collective_ops::CollectiveOptions;
using collective_ops::ConvertEach;
using collective_ops::EmptyAxisPadding;
using collective_ops::EmptyResult;
using collective_ops::GatherRunTimeSizes;
using collective_ops::GatherWire;
using collective_ops::Handles;
using collective_ops::IsEmpty;
using collective_ops::PadEach;
using collective_ops::PermuteChunks;
using collective_ops::ReduceWire;
using collective_ops::RunCollectiveStep;
using collective_ops::RunEachWith;
using collective_ops::TrimToBlocks;
using collective_ops::UnsupportedCollectiveType;
using collective_ops::Wire;

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
