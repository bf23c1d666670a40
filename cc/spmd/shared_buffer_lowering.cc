// The shared-buffer lowering: every device can read its peers' local results (virtual
// CPUs of one process), so a collective is an AddN / Maximum / ConcatV2 over the peers'
// handles, computed once per distinct result and shared by the devices that hold it.
//
// Its all-to-all moves sub-blocks between devices as shared buffers, in one of two forms,
// both one copy of the data when they are chosen:
//   - split + concat: one SplitV per distinct source block, one ConcatV2 per distinct
//     target block; the split is a view when no axis before `to_dim` is > 1 ([*,x] ->
//     [x,*]), and this form takes uneven pieces;
//   - stitch: one ParallelDynamicStitch per group writes every source row in its place in
//     the stacked target blocks, cut into views by Split ([x,*] -> [*,x], where the split
//     would copy). Measured on 8 virtual CPUs for 64 MiB: about 1.5x the split + concat.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cc/spmd/lowering.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// Bytes per element of a fixed-width TF type, 0 for the others (strings, resources,
// variants): TF_DataTypeSize's answer, without linking TF's library into the planning
// layers (the C++ tests link them alone).
size_t FixedWidth(int dtype) {
  switch (static_cast<TF_DataType>(dtype)) {
    case TF_BOOL: case TF_INT8: case TF_UINT8: case TF_QINT8: case TF_QUINT8:
    case TF_FLOAT8_E5M2: case TF_FLOAT8_E4M3FN:
      return 1;
    case TF_INT16: case TF_UINT16: case TF_HALF: case TF_BFLOAT16: case TF_QINT16:
    case TF_QUINT16:
      return 2;
    case TF_FLOAT: case TF_INT32: case TF_UINT32: case TF_QINT32:
      return 4;
    case TF_DOUBLE: case TF_INT64: case TF_UINT64: case TF_COMPLEX64:
      return 8;
    case TF_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

using Handles = std::vector<LocalHandle>;

int64_t Product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
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
std::vector<int64_t> StitchIndices(const std::vector<int64_t>& global, int from, int to,
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

// [x,*] -> [*,x] in one pass: every source block, viewed as rows (Reshape, no copy), goes
// to its place in the stacked target blocks (ParallelDynamicStitch, one memcpy per row),
// which Split cuts along the stacking axis into views, one per target block. Taken when
// the target pieces are even (and, with from > to, the source pieces too), rows are at
// least 256 bytes, and SplitV along `to_dim` would copy (some axis before it is > 1);
// otherwise nullopt and the split + concat runs.
std::optional<StatusOr<ValueId>> AllToAllStitched(CollectiveRunner& run, ValueId value,
                                                  int from_dim, int to_dim,
                                                  const Layout& out_layout,
                                                  const std::vector<int>& other_dims) {
  Builder& b = run.builder();
  const Layout layout = *b.layout(value);  // a copy: HostConstant grows the values
  const int dtype = b.dtype(value);
  const int64_t pieces = layout.NumShards(from_dim);
  const int l = std::max(from_dim, to_dim);
  // The blocks' shape with the from- and to-axes whole: the other axes keep their
  // sharding (by other mesh dims), even, so that every group's blocks have one shape.
  std::vector<int64_t> dims = b.shape(value);
  for (int a = 0; a < static_cast<int>(dims.size()); ++a) {
    if (dims[a] < 0) return std::nullopt;
    if (a == from_dim || a == to_dim) continue;
    if (dims[a] % layout.NumShards(a) != 0) return std::nullopt;
    dims[a] /= layout.NumShards(a);
  }
  if (dims[to_dim] % pieces != 0 || (l == from_dim && dims[from_dim] % pieces != 0)) {
    return std::nullopt;
  }
  const size_t width = FixedWidth(dtype);
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
  const int n = run.mesh().num_local_devices();
  Handles made;  // temporaries
  Handles out(n, LocalHandle{});
  std::vector<bool> filled(n, false);
  auto fail = [&](const Status& status) -> StatusOr<ValueId> {
    run.DiscardAll(made);
    for (int d = 0; d < n; ++d) {
      if (filled[d]) run.Discard(out[d]);
    }
    return status;
  };
  auto local = [&](const std::string& op, const Handles& inputs,
                   std::vector<AttrOverride> overrides, int device,
                   int outputs) -> StatusOr<Handles> {
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = std::move(overrides);
    TFD_ASSIGN_OR_RETURN(Handles r, run.RunOn(op, inputs, options, device, outputs));
    made.insert(made.end(), r.begin(), r.end());
    return r;
  };
  const AttrOverride type = AttrOverride::Type("T", dtype);
  const AttrOverride tshape = AttrOverride::Type("Tshape", TF_INT64);
  StatusOr<LocalHandle> zero = run.Host({0}, {}, TF_INT32);
  if (!zero.ok()) return fail(zero.status());
  StatusOr<LocalHandle> block_shape =
      run.Host(target_block, {static_cast<int64_t>(target_block.size())}, TF_INT64);
  if (!block_shape.ok()) return fail(block_shape.status());
  std::map<int, Handles> blocks;  // group's first device -> target blocks by k
  for (int d = 0; d < n; ++d) {
    int group = d;
    for (int e = 0; e < d; ++e) {
      if (run.SameCoords(d, e, other_dims)) {
        group = e;
        break;
      }
    }
    if (!blocks.count(group)) {
      Handles indices(pieces), rows(pieces);
      std::vector<bool> found(pieces, false);
      for (int e = 0; e < n; ++e) {
        const int64_t c = layout.ShardIndex(e, from_dim);
        if (found[c] || !run.SameCoords(group, e, other_dims)) continue;
        found[c] = true;
        auto [size, offset] = layout.AxisPiece(from_dim, dims[from_dim], c);
        std::vector<int64_t> index =
            StitchIndices(dims, from_dim, to_dim, pieces, c, size, offset);
        const int64_t count = static_cast<int64_t>(index.size());
        StatusOr<LocalHandle> index_value = run.Host(index, {count}, TF_INT32);
        if (!index_value.ok()) return fail(index_value.status());
        StatusOr<LocalHandle> row_shape = run.Host({count, row_elements}, {2}, TF_INT64);
        if (!row_shape.ok()) return fail(row_shape.status());
        StatusOr<Handles> r =
            local("Reshape", {run.Local(value, e), *row_shape}, {type, tshape}, group, 1);
        if (!r.ok()) return fail(r.status());
        indices[c] = *index_value;
        rows[c] = (*r)[0];
      }
      if (std::find(found.begin(), found.end(), false) != found.end()) {
        return fail(Internal("all-to-all of a " + layout.ShortString() +
                             " value: a source piece has no local device."));
      }
      Handles inputs = indices;
      inputs.insert(inputs.end(), rows.begin(), rows.end());
      StatusOr<Handles> stacked = local("ParallelDynamicStitch", inputs,
                                        {type, AttrOverride::Int("N", pieces)}, group, 1);
      if (!stacked.ok()) return fail(stacked.status());
      StatusOr<Handles> split =
          local("Split", {*zero, (*stacked)[0]}, {type, AttrOverride::Int("num_split", pieces)},
                group, static_cast<int>(pieces));
      if (!split.ok()) return fail(split.status());
      Handles group_blocks;
      for (LocalHandle h : *split) {
        StatusOr<Handles> r = local("Reshape", {h, *block_shape}, {type, tshape}, group, 1);
        if (!r.ok()) return fail(r.status());
        run.SetLocalShape((*r)[0], target_block);
        group_blocks.push_back((*r)[0]);
      }
      blocks[group] = std::move(group_blocks);
    }
    StatusOr<LocalHandle> h = run.Share(blocks[group][out_layout.ShardIndex(d, to_dim)], d);
    if (!h.ok()) return fail(h.status());
    out[d] = *h;
    filled[d] = true;
  }
  run.DiscardAll(made);
  return run.AddValue(out_layout, b.shape(value), dtype, out);
}

// Two lowerings share these algorithms, which compute each collective once per group of
// devices that hold the same result, at the group's first device, from its peers' local
// results, and hand it to the others:
//   "shared"  virtual CPUs of one process: peers' results are read in place and results
//             handed over as shared buffers (no copy);
//   "copies"  any mesh whose devices are all in this process (logical GPUs of one GPU,
//             several GPUs of one host): peers' results come over as device-to-device
//             copies (TensorFlow's own: CopyToDevice eagerly, Send/Recv in a graph) and
//             results go back the same way. A gather is one concatenation at the leader
//             and an all-reduce one AddN there, then n - 1 copies out: 2(n - 1) copies of
//             the tensor, the bytes a ring moves, but all in flight at once, with none of
//             the ring's 2(n - 1) dependent steps through the collective executor.
class SharedBuffer final : public CollectiveLowering {
 public:
  explicit SharedBuffer(bool shares) : shares_(shares) {}
  std::string_view name() const override { return shares_ ? "shared" : "copies"; }
  bool shares_buffers() const override { return shares_; }
  // "shared": a mesh of virtual CPUs of this process. A local-subset mesh of CPUs keeps
  // the shared buffer while it runs in one process: its first collective is refused
  // (CheckCollectiveParticipants) instead of waiting for peers that never come.
  // "copies": a mesh whose devices this process holds, all of them, unless NCCL serves it
  // (UsesNccl: distinct physical GPUs, asked for).
  bool Serves(const Mesh& mesh, bool multi_client) const override {
    if (!shares_) return mesh.num_local_devices() == mesh.size() && !UsesNccl(mesh);
    return mesh.shares_host_memory() &&
           (mesh.num_local_devices() == mesh.size() || !multi_client);
  }

  StatusOr<ValueId> AllReduce(CollectiveRunner& run, ValueId value,
                              const std::vector<int>& mesh_dims, ReduceOp op) const override;
  StatusOr<ValueId> AllGather(CollectiveRunner& run, ValueId value, int dim) const override;
  // [x,*] -> [*,x] over x = mesh dim m with pieces c (rows) and k (columns):
  //   source block c [rows c, all columns] --SplitV along to_dim--> sub-blocks (c, k)
  //   target block k [all rows, columns k] = ConcatV2 along from_dim of (0, k), (1, k), ...
  // Pieces follow the shard geometry on both sides (uneven too). Devices that agree on the
  // other distinct mesh dims (other sharded axes, pending reductions) exchange among
  // themselves; replicas share their leader's blocks. The stitch form runs instead where
  // it applies (AllToAllStitched).
  StatusOr<ValueId> AllToAll(CollectiveRunner& run, ValueId value, int from_dim,
                             int to_dim) const override;
  // "copies": [*] partial over mesh dim m -> [m] in one hop. Each group's first holder of
  // every partial c splits it into the target pieces (SplitV along `dim`); the device at
  // coordinate k along m receives piece k of every partial and reduces them in coordinate
  // order: (P - 1) pieces of 1/P of the tensor per device, where the all-reduce then slice
  // moves the whole tensor twice through the group's leader. "shared": that all-reduce,
  // computed once and shared, then sliced.
  StatusOr<ValueId> ReduceScatter(CollectiveRunner& run, ValueId value, int dim, int mesh_dim,
                                  ReduceOp op) const override;

 private:
  // Peers' handles as other devices read them: `hs[i]`, held by device `es[i]`, as device
  // `ds[i]` reads it, in place when buffers are shared or the device is its holder, else
  // copied over. The copies are made at once (ShareAll) and go to `copies`, to be dropped
  // once used; on failure none is kept.
  StatusOr<Handles> ReachAll(CollectiveRunner& run, const Handles& hs, const std::vector<int>& es,
                             const std::vector<int>& ds, Handles& copies) const {
    Handles out = hs, send;
    std::vector<int> to;
    std::vector<size_t> at;
    for (size_t i = 0; i < hs.size(); ++i) {
      if (shares_ || es[i] == ds[i]) continue;
      send.push_back(hs[i]);
      to.push_back(ds[i]);
      at.push_back(i);
    }
    if (send.empty()) return out;
    TFD_ASSIGN_OR_RETURN(Handles made, run.ShareAll(send, to));
    for (size_t k = 0; k < made.size(); ++k) out[at[k]] = made[k];
    copies.insert(copies.end(), made.begin(), made.end());
    return out;
  }

  const bool shares_;
};

// Fills `out[d]` of every device that is not its group's leader with its leader's result,
// shared or copied (the copies at once). On failure, discards what it made and every
// leader's result.
Status ShareToReplicas(CollectiveRunner& run, const std::vector<int>& leaders, Handles& out) {
  Handles from;
  std::vector<int> to;
  for (int d = 0; d < static_cast<int>(leaders.size()); ++d) {
    if (leaders[d] == d) continue;
    from.push_back(out[leaders[d]]);
    to.push_back(d);
  }
  if (from.empty()) return Status::Ok();
  StatusOr<Handles> shared = run.ShareAll(from, to);
  if (!shared.ok()) {
    for (int d = 0; d < static_cast<int>(leaders.size()); ++d) {
      if (leaders[d] == d) run.Discard(out[d]);
    }
    return shared.status();
  }
  for (size_t k = 0; k < to.size(); ++k) out[to[k]] = (*shared)[k];
  return Status::Ok();
}

Handles Firsts(const std::vector<Handles>& results) {
  Handles out;
  for (const Handles& r : results) out.push_back(r[0]);
  return out;
}

// Device devices[i]'s reduction of parts[i] (its own or copied to it) by `op`, every device
// at once (RunOnEach); the parts in the same order on every device, so devices given the
// same parts hold the same bits. A mean divides by `count`. One part is the result itself.
StatusOr<Handles> ReduceOnEach(CollectiveRunner& run, const std::vector<Handles>& parts,
                               const std::vector<int>& devices, ReduceOp op, int dtype,
                               int64_t count) {
  if (parts[0].size() == 1) return run.ShareAll(Firsts(parts), devices);
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", dtype)};
  // Booleans have no AddN, Maximum or Mul: their sum (a ScatterNd's duplicates) and
  // maximum are a logical or, their product and minimum a logical and, as the collective
  // ops' int32 wire gives them.
  const bool logical = dtype == TF_BOOL;
  if (logical) options.overrides.clear();
  if (!logical && (op == ReduceOp::kSum || op == ReduceOp::kMean)) {
    LocalOpOptions add = options;
    add.overrides.push_back(AttrOverride::Int("N", static_cast<int64_t>(parts[0].size())));
    TFD_ASSIGN_OR_RETURN(std::vector<Handles> sums,
                         run.RunOnEach("AddN", parts, devices, add, 1));
    Handles out = Firsts(sums);
    if (op == ReduceOp::kSum || count == 1) return out;
    // The divisor as one scalar of the dtype on every device, from one host constant.
    StatusOr<LocalHandle> host = run.Host({count}, {}, TF_INT64);
    LocalOpOptions cast;
    cast.copy_attrs = false;
    cast.overrides = {AttrOverride::Type("SrcT", TF_INT64), AttrOverride::Type("DstT", dtype)};
    StatusOr<std::vector<Handles>> scales =
        host.ok() ? run.RunOnEach("Cast", std::vector<Handles>(devices.size(), {*host}), devices,
                                  cast, 1)
                  : StatusOr<std::vector<Handles>>(host.status());
    if (!scales.ok()) {
      run.DiscardAll(out);
      return scales.status();
    }
    std::vector<Handles> quotients;
    for (size_t i = 0; i < devices.size(); ++i) quotients.push_back({out[i], (*scales)[i][0]});
    StatusOr<std::vector<Handles>> q = run.RunOnEach("RealDiv", quotients, devices, options, 1);
    run.DiscardAll(out);
    run.DiscardAll(Firsts(*scales));
    if (!q.ok()) return q.status();
    return Firsts(*q);
  }
  const char* binary = op == ReduceOp::kMax ? "Maximum" : op == ReduceOp::kMin ? "Minimum" : "Mul";
  if (logical) {
    binary = op == ReduceOp::kMin || op == ReduceOp::kProd ? "LogicalAnd" : "LogicalOr";
  }
  Handles acc;
  for (const Handles& p : parts) acc.push_back(p[0]);
  for (size_t i = 1; i < parts[0].size(); ++i) {
    std::vector<Handles> inputs;
    for (size_t k = 0; k < devices.size(); ++k) inputs.push_back({acc[k], parts[k][i]});
    StatusOr<std::vector<Handles>> r = run.RunOnEach(binary, inputs, devices, options, 1);
    if (i > 1) run.DiscardAll(acc);
    if (!r.ok()) return r.status();
    acc = Firsts(*r);
  }
  return acc;
}

// Every source in `sources` cuts its block of `value` along `dim` into pieces of `sizes`
// (SplitV: a view along the first axis), all at once; each source's pieces.
StatusOr<std::vector<Handles>> SplitEach(CollectiveRunner& run, ValueId value,
                                         const std::vector<int>& sources, int dim,
                                         const std::vector<int64_t>& sizes) {
  const int64_t pieces = static_cast<int64_t>(sizes.size());
  TFD_ASSIGN_OR_RETURN(LocalHandle axis, run.Host({dim}, {}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(LocalHandle lengths, run.Host(sizes, {pieces}, TF_INT64));
  LocalOpOptions split;
  split.copy_attrs = false;
  split.overrides = {AttrOverride::Type("T", run.builder().dtype(value)),
                     AttrOverride::Type("Tlen", TF_INT64), AttrOverride::Int("num_split", pieces)};
  std::vector<Handles> inputs;
  for (int source : sources) inputs.push_back({run.Local(value, source), lengths, axis});
  return run.RunOnEach("SplitV", inputs, sources, split, static_cast<int>(pieces));
}

// How the copies lowering cuts blocks into pieces (all-to-all, reduce-scatter) and joins
// blocks from pieces (all-to-all, all-gather) (TF_DTENSOR_COPIES_PIECES, read per
// collective so that a benchmark can compare):
//   "split":     SplitV along the cut axis, ConcatV2 along the joined one. Below 16 pieces
//                TF's GPU kernels for both launch one kernel per piece (SplitV makes views
//                along the first axis only), so an all-to-all over 8 logical GPUs launched
//                128 of them, from the one host that launches for every logical GPU of a
//                physical one.
//   "transpose": (default where it applies) a block to cut is viewed as [p, K, r] (p: the
//                axes before the cut axis, K the pieces, r the rest), its pieces moved to
//                the front in one Transpose ([K, p, r]; none where p is 1) and cut off as
//                views along the first axis; a block to join stacks its K pieces in one
//                DynamicStitch and moves them into place with one Transpose ([K, p, r] ->
//                [p, K, r]; none where p is 1). At most two kernels a block, the same bytes.
// Each cut and join keeps SplitV or ConcatV2 where its form does not apply (uneven pieces,
// unknown sizes, pieces that would not be 64-byte aligned views, a dtype without a GPU
// DynamicStitch).
bool FoldedPieces() {
  const char* env = std::getenv("TF_DTENSOR_COPIES_PIECES");
  return !(env && std::string_view(env) == "split");
}

// `dims` folded around axis `axis` cut into `pieces` even parts: [p, K, r].
struct Folded {
  int64_t p = 1, k = 1, r = 1;
};
std::optional<Folded> FoldAround(const std::vector<int64_t>& dims, int axis, int64_t pieces) {
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
  }
  if (dims[axis] % pieces != 0) return std::nullopt;
  Folded f;
  f.p = Product(dims, 0, axis);
  f.k = pieces;
  f.r = dims[axis] / pieces * Product(dims, axis + 1, dims.size());
  // TF's GPU DynamicStitch and Transpose index with int32.
  if (f.p * f.k * f.r >= (int64_t{1} << 31)) return std::nullopt;
  return f;
}

// The options of a Reshape of `dtype` values to an int64 shape.
LocalOpOptions Reshaping(int dtype) {
  LocalOpOptions reshape;
  reshape.copy_attrs = false;
  reshape.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT64)};
  return reshape;
}

// Swaps the first two axes of `values[i]` ([a, b, r] -> [b, a, r], one Transpose each, all
// at once), held by `devices[i]`, where `folds[i].p > 1`; the others stay as they are. The
// new handles are also added to `made`.
Status SwapLeadingAxes(CollectiveRunner& run, int dtype, Handles& values,
                       const std::vector<int>& devices, const std::vector<Folded>& folds,
                       Handles& made) {
  TFD_ASSIGN_OR_RETURN(LocalHandle perm, run.Host({1, 0, 2}, {3}, TF_INT32));
  std::vector<Handles> inputs;
  std::vector<int> movers;
  for (size_t i = 0; i < values.size(); ++i) {
    if (folds[i].p == 1) continue;
    inputs.push_back({values[i], perm});
    movers.push_back(devices[i]);
  }
  if (movers.empty()) return Status::Ok();
  LocalOpOptions transpose;
  transpose.copy_attrs = false;
  transpose.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tperm", TF_INT32)};
  TFD_ASSIGN_OR_RETURN(std::vector<Handles> moved,
                       run.RunOnEach("Transpose", inputs, movers, transpose, 1));
  for (size_t i = 0, m = 0; i < values.size(); ++i) {
    if (folds[i].p == 1) continue;
    values[i] = moved[m++][0];
    made.push_back(values[i]);
  }
  return Status::Ok();
}

// The folds of the transposed cut, one per source block: nullopt where the sizes are not
// known and even, or the pieces would not be aligned views (TF's SplitV makes views along
// the first axis only for 64-byte aligned pieces, the widest alignment its Eigen builds
// ask; else it copies each piece).
std::optional<std::vector<Folded>> CutFolds(const std::vector<std::vector<int64_t>>& blocks,
                                            int dim, int64_t pieces, int dtype) {
  const int64_t width = static_cast<int64_t>(FixedWidth(dtype));
  std::vector<Folded> folds;
  for (const std::vector<int64_t>& block : blocks) {
    std::optional<Folded> f = FoldAround(block, dim, pieces);
    if (!f || width == 0 || (f->p * f->r * width) % 64 != 0) return std::nullopt;
    folds.push_back(*f);
  }
  return folds;
}

// Block `block` with axis `dim` cut `pieces` ways.
std::vector<int64_t> PieceOf(std::vector<int64_t> block, int dim, int64_t pieces) {
  block[dim] /= pieces;
  return block;
}

// The transposed cut: every source in `sources` (block shapes `blocks`, folded `folds`)
// views its block as [p, K, r], moves the pieces to the front (Transpose, where p > 1) and
// cuts them off as views (Split along the first axis); each source's pieces, in their
// block shape.
StatusOr<std::vector<Handles>> CutTransposed(CollectiveRunner& run, ValueId value,
                                             const std::vector<int>& sources,
                                             const std::vector<std::vector<int64_t>>& blocks,
                                             const std::vector<Folded>& folds, int dim,
                                             int64_t pieces) {
  const int dtype = run.builder().dtype(value);
  Handles made;  // temporaries
  auto fail = [&](const Status& status) {
    run.DiscardAll(made);
    return status;
  };
  const LocalOpOptions reshape = Reshaping(dtype);
  std::vector<Handles> fold_inputs;
  for (size_t i = 0; i < sources.size(); ++i) {
    const Folded& f = folds[i];
    const std::vector<int64_t> shape =
        f.p == 1 ? std::vector<int64_t>{f.k, f.r} : std::vector<int64_t>{f.p, f.k, f.r};
    StatusOr<LocalHandle> dims = run.Host(shape, {static_cast<int64_t>(shape.size())}, TF_INT64);
    if (!dims.ok()) return fail(dims.status());
    fold_inputs.push_back({run.Local(value, sources[i]), *dims});
  }
  StatusOr<std::vector<Handles>> folded = run.RunOnEach("Reshape", fold_inputs, sources, reshape, 1);
  if (!folded.ok()) return fail(folded.status());
  Handles front;
  for (const Handles& h : *folded) front.push_back(h[0]);
  made.insert(made.end(), front.begin(), front.end());
  if (Status moved = SwapLeadingAxes(run, dtype, front, sources, folds, made); !moved.ok()) {
    return fail(moved);
  }
  StatusOr<LocalHandle> zero = run.Host({0}, {}, TF_INT32);
  if (!zero.ok()) return fail(zero.status());
  LocalOpOptions split;
  split.copy_attrs = false;
  split.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("num_split", pieces)};
  std::vector<Handles> split_inputs;
  for (LocalHandle h : front) split_inputs.push_back({*zero, h});
  StatusOr<std::vector<Handles>> cut =
      run.RunOnEach("Split", split_inputs, sources, split, static_cast<int>(pieces));
  if (!cut.ok()) return fail(cut.status());
  for (const Handles& h : *cut) made.insert(made.end(), h.begin(), h.end());
  std::vector<Handles> shape_inputs;
  std::vector<int> on;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::vector<int64_t> piece = PieceOf(blocks[i], dim, pieces);
    StatusOr<LocalHandle> dims = run.Host(piece, {static_cast<int64_t>(piece.size())}, TF_INT64);
    if (!dims.ok()) return fail(dims.status());
    for (LocalHandle h : (*cut)[i]) {
      shape_inputs.push_back({h, *dims});
      on.push_back(sources[i]);
    }
  }
  StatusOr<std::vector<Handles>> shaped = run.RunOnEach("Reshape", shape_inputs, on, reshape, 1);
  if (!shaped.ok()) return fail(shaped.status());
  run.DiscardAll(made);
  std::vector<Handles> out(sources.size());
  for (size_t j = 0; j < shaped->size(); ++j) {
    const size_t i = j / pieces;
    out[i].push_back((*shaped)[j][0]);
    run.SetLocalShape(out[i].back(), PieceOf(blocks[i], dim, pieces));
  }
  return out;
}

// Dtypes with a GPU DynamicStitch kernel (TF registers it for the GPU number types, the
// complex types, int32 and int64).
bool Stitchable(int dtype) {
  switch (static_cast<TF_DataType>(dtype)) {
    case TF_HALF: case TF_BFLOAT16: case TF_FLOAT: case TF_DOUBLE: case TF_COMPLEX64:
    case TF_COMPLEX128: case TF_INT32: case TF_INT64:
      return true;
    default:
      return false;
  }
}

// The folds of the stacked join, one per target block: nullopt where the sizes are not
// known and even, the dtype has no GPU DynamicStitch, or there are 16 pieces or more
// (where TF's ConcatV2 is one kernel itself).
std::optional<std::vector<Folded>> JoinFolds(const std::vector<std::vector<int64_t>>& blocks,
                                             int dim, int64_t pieces, int dtype) {
  if (!Stitchable(dtype) || pieces >= 16) return std::nullopt;
  std::vector<Folded> folds;
  for (const std::vector<int64_t>& block : blocks) {
    std::optional<Folded> f = FoldAround(block, dim, pieces);
    if (!f) return std::nullopt;
    folds.push_back(*f);
  }
  return folds;
}

// The stacked join: every target in `targets` (block shapes `blocks`, folded `folds`)
// stacks its K pieces (`parts[t]`, in order along the axis they join on) as the rows of
// one DynamicStitch ([K, p * r]) and moves them into place ([K, p, r] -> [p, K, r], where
// p > 1); each target's block.
StatusOr<Handles> JoinStacked(CollectiveRunner& run, int dtype, const std::vector<Handles>& parts,
                              const std::vector<int>& targets,
                              const std::vector<std::vector<int64_t>>& blocks,
                              const std::vector<Folded>& folds, int64_t pieces) {
  Handles made;  // temporaries
  auto fail = [&](const Status& status) -> StatusOr<Handles> {
    run.DiscardAll(made);
    return status;
  };
  const LocalOpOptions reshape = Reshaping(dtype);
  // Each piece as one row of the stack ([1, p * r]).
  std::vector<Handles> row_inputs;
  std::vector<int> on;
  for (size_t t = 0; t < targets.size(); ++t) {
    StatusOr<LocalHandle> row = run.Host({1, folds[t].p * folds[t].r}, {2}, TF_INT64);
    if (!row.ok()) return fail(row.status());
    for (LocalHandle h : parts[t]) {
      row_inputs.push_back({h, *row});
      on.push_back(targets[t]);
    }
  }
  StatusOr<std::vector<Handles>> rows = run.RunOnEach("Reshape", row_inputs, on, reshape, 1);
  if (!rows.ok()) return fail(rows.status());
  for (const Handles& h : *rows) made.push_back(h[0]);
  Handles indices;
  for (int64_t c = 0; c < pieces; ++c) {
    StatusOr<LocalHandle> index = run.Host({c}, {1}, TF_INT32);
    if (!index.ok()) return fail(index.status());
    indices.push_back(*index);
  }
  std::vector<Handles> stitch_inputs;
  for (size_t t = 0; t < targets.size(); ++t) {
    Handles inputs = indices;
    for (int64_t c = 0; c < pieces; ++c) inputs.push_back((*rows)[t * pieces + c][0]);
    stitch_inputs.push_back(std::move(inputs));
  }
  LocalOpOptions stitch;
  stitch.copy_attrs = false;
  stitch.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Int("N", pieces)};
  StatusOr<std::vector<Handles>> stacked =
      run.RunOnEach("DynamicStitch", stitch_inputs, targets, stitch, 1);
  if (!stacked.ok()) return fail(stacked.status());
  for (const Handles& h : *stacked) made.push_back(h[0]);
  // Into place: [K, p, r] -> [p, K, r] where axes come before the pieces.
  Handles placed(targets.size());
  std::vector<Handles> cube_inputs;
  std::vector<int> cubed;
  for (size_t t = 0; t < targets.size(); ++t) {
    placed[t] = (*stacked)[t][0];
    if (folds[t].p == 1) continue;
    StatusOr<LocalHandle> dims = run.Host({folds[t].k, folds[t].p, folds[t].r}, {3}, TF_INT64);
    if (!dims.ok()) return fail(dims.status());
    cube_inputs.push_back({placed[t], *dims});
    cubed.push_back(targets[t]);
  }
  if (!cubed.empty()) {
    StatusOr<std::vector<Handles>> cubes = run.RunOnEach("Reshape", cube_inputs, cubed, reshape, 1);
    if (!cubes.ok()) return fail(cubes.status());
    for (size_t t = 0, m = 0; t < targets.size(); ++t) {
      if (folds[t].p == 1) continue;
      placed[t] = (*cubes)[m++][0];
      made.push_back(placed[t]);
    }
  }
  if (Status moved = SwapLeadingAxes(run, dtype, placed, targets, folds, made); !moved.ok()) {
    return fail(moved);
  }
  // Each target's block in its shape.
  std::vector<Handles> block_inputs;
  for (size_t t = 0; t < targets.size(); ++t) {
    StatusOr<LocalHandle> dims =
        run.Host(blocks[t], {static_cast<int64_t>(blocks[t].size())}, TF_INT64);
    if (!dims.ok()) return fail(dims.status());
    block_inputs.push_back({placed[t], *dims});
  }
  StatusOr<std::vector<Handles>> shaped = run.RunOnEach("Reshape", block_inputs, targets, reshape, 1);
  if (!shaped.ok()) return fail(shaped.status());
  run.DiscardAll(made);
  Handles out;
  for (size_t t = 0; t < targets.size(); ++t) {
    out.push_back((*shaped)[t][0]);
    run.SetLocalShape(out.back(), blocks[t]);
  }
  return out;
}

// Every source in `sources` cuts its block of `value` along `dim` into the pieces of
// `out_layout`, all at once: transposed where `fold` and that form applies, else SplitV;
// each source's pieces.
StatusOr<std::vector<Handles>> CutEach(CollectiveRunner& run, ValueId value,
                                       const std::vector<int>& sources, int dim,
                                       const Layout& out_layout, bool fold) {
  Builder& b = run.builder();
  const std::vector<int64_t> global = b.shape(value);
  const std::vector<int64_t> sizes = out_layout.PieceSizes(global, dim);
  const int64_t pieces = static_cast<int64_t>(sizes.size());
  if (fold) {
    const Layout layout = *b.layout(value);
    std::vector<std::vector<int64_t>> blocks;
    for (int source : sources) blocks.push_back(layout.GeometryOfDevice(global, source).shape);
    if (std::optional<std::vector<Folded>> folds = CutFolds(blocks, dim, pieces, b.dtype(value))) {
      return CutTransposed(run, value, sources, blocks, *folds, dim, pieces);
    }
  }
  return SplitEach(run, value, sources, dim, sizes);
}

// Every target in `targets` joins its parts (`parts[t]`, in order along `dim`) into its
// block of `out_layout` (global shape `global`), all at once: stacked where `fold` and that
// form applies, else one ConcatV2; each target's block.
StatusOr<Handles> JoinEach(CollectiveRunner& run, int dtype, const std::vector<Handles>& parts,
                           const std::vector<int>& targets, const Layout& out_layout,
                           const std::vector<int64_t>& global, int dim, bool fold) {
  const int64_t pieces = parts.empty() ? 0 : static_cast<int64_t>(parts[0].size());
  if (fold) {
    std::vector<std::vector<int64_t>> blocks;
    for (int target : targets) blocks.push_back(out_layout.GeometryOfDevice(global, target).shape);
    if (std::optional<std::vector<Folded>> folds = JoinFolds(blocks, dim, pieces, dtype)) {
      return JoinStacked(run, dtype, parts, targets, blocks, *folds, pieces);
    }
  }
  TFD_ASSIGN_OR_RETURN(LocalHandle axis, run.Host({dim}, {}, TF_INT32));
  LocalOpOptions concat;
  concat.copy_attrs = false;
  concat.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tidx", TF_INT32),
                      AttrOverride::Int("N", pieces)};
  std::vector<Handles> inputs = parts;
  for (Handles& in : inputs) in.push_back(axis);
  TFD_ASSIGN_OR_RETURN(std::vector<Handles> joined,
                       run.RunOnEach("ConcatV2", inputs, targets, concat, 1));
  Handles out;
  for (const Handles& h : joined) out.push_back(h[0]);
  return out;
}

// How the copies lowering all-reduces over a group of g devices that hold p distinct
// partial values (TF_DTENSOR_COPIES_ALL_REDUCE, read per collective so that a benchmark can
// compare):
//   "leader": the group's first device receives the p - 1 partials it lacks, reduces them
//             and sends the result to the g - 1 others: p + g - 2 copies, two hops in turn;
//   "direct": every device receives the p - 1 partials it lacks and reduces them itself, in
//             one order, so all hold the same bits: g (p - 1) copies, one hop;
//   "auto" (default): direct where it copies no more than the leader, which is where
//             (g - 1)(p - 2) <= 0: two partials (two devices, or two with replicas), else
//             leader. Where more bytes buy the hop is for a GPU run to measure
//             (bench/gpu.py --variants).
bool DirectAllReduce(int64_t partials, int64_t group) {
  const char* env = std::getenv("TF_DTENSOR_COPIES_ALL_REDUCE");
  const std::string_view form = env ? env : "";
  if (form == "leader") return false;
  if (form == "direct") return true;
  return group * (partials - 1) <= partials + group - 2;
}

StatusOr<ValueId> SharedBuffer::AllReduce(CollectiveRunner& run, ValueId value,
                                          const std::vector<int>& mesh_dims, ReduceOp op) const {
  Builder& b = run.builder();
  const Mesh& mesh = run.mesh();
  const Layout layout = *b.layout(value);
  std::vector<int> key_dims = layout.ShardedMeshDims();
  // Pending reductions over other mesh dims stay pending; those over `mesh_dims` are done.
  std::vector<PartialSpec> still_partial;
  for (const PartialSpec& p : layout.partial()) {
    if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
      still_partial.push_back(p);
      key_dims.push_back(p.mesh_dim);
    }
  }
  TFD_ASSIGN_OR_RETURN(Layout out_layout, layout.WithoutPartial().WithPartial(still_partial));
  const int n = mesh.num_local_devices();
  const std::vector<int>& leaders = GroupLeaders(mesh, key_dims);
  const int dtype = b.dtype(value);
  int64_t group_size = 1;
  for (int k : mesh_dims) group_size *= mesh.DimSize(k);
  auto coords_of = [&](int d) {
    std::vector<int64_t> coords;
    for (int k : mesh_dims) coords.push_back(mesh.LocalCoord(d, k));
    return coords;
  };
  // Each group's partial values (by its leader), one per coordinate tuple along
  // `mesh_dims`, in coordinate order: each with the first device of the group holding it.
  std::map<int, std::map<std::vector<int64_t>, int>> partials;
  for (int e = 0; e < n; ++e) partials[leaders[e]].emplace(coords_of(e), e);
  const int64_t p = static_cast<int64_t>(partials[leaders[0]].size());
  const int64_t g = std::count(leaders.begin(), leaders.end(), leaders[0]);
  // The devices that reduce: every device (direct), or each group's leader, whose result
  // then goes to the rest of its group.
  const bool direct = !shares_ && p > 1 && DirectAllReduce(p, g);
  std::vector<int> reducers;
  for (int d = 0; d < n; ++d) {
    if (direct || leaders[d] == d) reducers.push_back(d);
  }
  // Every reducer's parts (its own where it holds one, the others copied to it), all at
  // once, then every reducer's reduction at once.
  Handles held, copies;
  std::vector<int> holders, readers;
  for (int d : reducers) {
    const std::vector<int64_t> own = coords_of(d);
    for (const auto& [coords, e] : partials[leaders[d]]) {
      holders.push_back(coords == own ? d : e);
      held.push_back(run.Local(value, holders.back()));
      readers.push_back(d);
    }
  }
  if (held.size() != reducers.size() * static_cast<size_t>(p)) {
    return Internal("all-reduce of a " + layout.ShortString() +
                    " value: its groups hold different numbers of partial values.");
  }
  TFD_ASSIGN_OR_RETURN(Handles reached, ReachAll(run, held, holders, readers, copies));
  std::vector<Handles> parts;
  for (size_t r = 0; r < reducers.size(); ++r) {
    parts.emplace_back(reached.begin() + r * p, reached.begin() + (r + 1) * p);
  }
  StatusOr<Handles> reduced = ReduceOnEach(run, parts, reducers, op, dtype, group_size);
  run.DiscardAll(copies);
  if (!reduced.ok()) return reduced.status();
  Handles out(n, LocalHandle{});
  for (size_t r = 0; r < reducers.size(); ++r) out[reducers[r]] = (*reduced)[r];
  if (!direct) TFD_RETURN_IF_ERROR(ShareToReplicas(run, leaders, out));
  return run.AddValue(out_layout, b.shape(value), dtype, out);
}

StatusOr<ValueId> SharedBuffer::AllGather(CollectiveRunner& run, ValueId value, int dim) const {
  Builder& b = run.builder();
  const Layout layout = *b.layout(value);
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(Layout out_layout, layout.WithSpecs(specs).WithPartial(layout.partial()));
  const std::vector<int> key_dims = out_layout.DistinctMeshDims();
  const int n = run.mesh().num_local_devices();
  const std::vector<int>& leaders = GroupLeaders(run.mesh(), key_dims);
  const int64_t pieces = layout.NumShards(dim);
  if (pieces == 1) return SameBlocks(run, value, out_layout);  // mesh dims of size 1
  Handles out(n, LocalHandle{});
  // Every group leader's pieces (its own where it holds one: no copy of it) reach it at
  // once, then every leader joins its own at once.
  std::vector<int> targets;
  Handles held;
  std::vector<int> holders, readers;
  for (int d = 0; d < n; ++d) {
    if (leaders[d] != d) continue;
    targets.push_back(d);
    const size_t first = held.size();
    held.resize(first + pieces, LocalHandle{});
    holders.resize(first + pieces, -1);
    readers.resize(first + pieces, d);
    for (int e = 0; e < n; ++e) {
      int64_t c = layout.ShardIndex(e, dim);
      if (run.SameCoords(d, e, key_dims) && holders[first + c] < 0) {
        holders[first + c] = layout.ShardIndex(d, dim) == c ? d : e;
        held[first + c] = run.Local(value, holders[first + c]);
      }
    }
  }
  Handles copies;
  TFD_ASSIGN_OR_RETURN(Handles parts, ReachAll(run, held, holders, readers, copies));
  std::vector<Handles> join_parts;
  for (size_t t = 0; t < targets.size(); ++t) {
    join_parts.emplace_back(parts.begin() + t * pieces, parts.begin() + (t + 1) * pieces);
  }
  StatusOr<Handles> joined = JoinEach(run, b.dtype(value), join_parts, targets, out_layout,
                                      b.shape(value), dim, !shares_ && FoldedPieces());
  run.DiscardAll(copies);
  if (!joined.ok()) return joined.status();
  for (size_t t = 0; t < targets.size(); ++t) out[targets[t]] = (*joined)[t];
  TFD_RETURN_IF_ERROR(ShareToReplicas(run, leaders, out));
  return run.AddValue(out_layout, b.shape(value), b.dtype(value), out);
}

StatusOr<ValueId> SharedBuffer::AllToAll(CollectiveRunner& run, ValueId value, int from_dim,
                                         int to_dim) const {
  Builder& b = run.builder();
  const Layout layout = *b.layout(value);
  const DimSpec spec = layout.spec(from_dim);
  const std::vector<int64_t> global = b.shape(value);
  // Nested pieces and a target axis of unknown size (its pieces are only known at run
  // time) take the gather + slice path.
  if (spec.multi() || layout.spec(to_dim).sharded() || global[to_dim] < 0) {
    return b.Builder::AllToAll(value, from_dim, to_dim);
  }
  const int mesh_dim = spec.mesh_dim;
  std::vector<DimSpec> specs = layout.specs();
  specs[to_dim] = spec;
  specs[from_dim] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), layout.partial()));
  TFD_RETURN_IF_ERROR(out_layout.LocalShape(global, "the relaid-out tensor").status());
  const int n = run.mesh().num_local_devices();
  const int64_t pieces = layout.NumShards(from_dim);
  const int dtype = b.dtype(value);
  Handles out(n, LocalHandle{});
  const std::vector<int> in_leaders = LocalLeaders(run.mesh(), layout.DistinctMeshDims());
  const std::vector<int> out_leaders = LocalLeaders(run.mesh(), out_layout.DistinctMeshDims());
  if (pieces == 1) return SameBlocks(run, value, out_layout);  // only the spec moves
  // The exchange pairs devices that agree on every other distinct mesh dim.
  std::vector<int> other_dims;
  for (int k : layout.DistinctMeshDims()) {
    if (k != mesh_dim) other_dims.push_back(k);
  }
  // The stitch writes every row into place in one kernel on the host (no GPU kernel).
  if (shares_) {
    if (std::optional<StatusOr<ValueId>> stitched =
            AllToAllStitched(run, value, from_dim, to_dim, out_layout, other_dims)) {
      return *std::move(stitched);
    }
  }
  std::map<int, Handles> splits;  // source leader -> its sub-blocks, by k
  std::vector<bool> joined_at(n, false);
  auto fail = [&](const Status& status) {
    for (auto& [source, hs] : splits) run.DiscardAll(hs);
    for (int d = 0; d < n; ++d) {
      if (joined_at[d]) run.Discard(out[d]);
    }
    return status;
  };
  // Every target leader's sub-blocks, by source piece c: the device that splits off each
  // (its k-th piece), then the handle.
  std::vector<int> targets;
  std::vector<int64_t> ks;  // per held sub-block: its piece k of the source's split
  std::vector<int> holders, readers;
  for (int d = 0; d < n; ++d) {
    if (out_leaders[d] != d) continue;
    targets.push_back(d);
    std::vector<bool> found(pieces, false);
    const int64_t k = out_layout.ShardIndex(d, to_dim);
    const size_t first = holders.size();
    holders.resize(first + pieces, -1);
    readers.resize(first + pieces, d);
    ks.resize(first + pieces, k);
    for (int e = 0; e < n; ++e) {
      const int64_t c = layout.ShardIndex(e, from_dim);
      if (found[c] || !run.SameCoords(d, e, other_dims)) continue;
      holders[first + c] = in_leaders[e];
      found[c] = true;
    }
    if (std::find(found.begin(), found.end(), false) != found.end()) {
      return fail(Internal("all-to-all of a " + layout.ShortString() +
                           " value: a source piece has no local device."));
    }
  }
  // Every source splits its block at once (SplitV along the target axis).
  std::vector<int> sources;
  for (int h : holders) {
    if (std::find(sources.begin(), sources.end(), h) == sources.end()) sources.push_back(h);
  }
  // The copies lowering cuts and joins with a kernel or two a block where it can
  // (FoldedPieces); the shared one cuts views and joins in one concatenation.
  const bool fold = !shares_ && FoldedPieces();
  StatusOr<std::vector<Handles>> split_blocks =
      CutEach(run, value, sources, to_dim, out_layout, fold);
  if (!split_blocks.ok()) return fail(split_blocks.status());
  for (size_t i = 0; i < sources.size(); ++i) splits[sources[i]] = (*split_blocks)[i];
  Handles held(holders.size()), copies;
  for (size_t i = 0; i < holders.size(); ++i) held[i] = splits[holders[i]][ks[i]];
  // The sub-blocks move to their targets at once, then every target joins its own at once.
  StatusOr<Handles> parts = ReachAll(run, held, holders, readers, copies);
  if (!parts.ok()) return fail(parts.status());
  std::vector<Handles> join_parts;
  for (size_t t = 0; t < targets.size(); ++t) {
    join_parts.emplace_back(parts->begin() + t * pieces, parts->begin() + (t + 1) * pieces);
  }
  StatusOr<Handles> joined =
      JoinEach(run, dtype, join_parts, targets, out_layout, global, from_dim, fold);
  if (!joined.ok()) {
    run.DiscardAll(copies);
    return fail(joined.status());
  }
  for (size_t t = 0; t < targets.size(); ++t) {
    out[targets[t]] = (*joined)[t];
    joined_at[targets[t]] = true;
  }
  run.DiscardAll(copies);
  for (auto& [source, hs] : splits) run.DiscardAll(hs);
  splits.clear();
  TFD_RETURN_IF_ERROR(ShareToReplicas(run, out_leaders, out));
  return run.AddValue(out_layout, global, dtype, out);
}

StatusOr<ValueId> SharedBuffer::ReduceScatter(CollectiveRunner& run, ValueId value, int dim,
                                              int mesh_dim, ReduceOp op) const {
  Builder& b = run.builder();
  const Mesh& mesh = run.mesh();
  const Layout layout = *b.layout(value);
  const std::vector<int64_t> global = b.shape(value);
  const int64_t pieces = mesh.DimSize(mesh_dim);
  // An axis already sharded or of unknown size (pieces known only at run time) takes the
  // all-reduce and slice too.
  if (shares_ || pieces == 1 || layout.spec(dim).sharded() || global[dim] < 0) {
    return CollectiveLowering::ReduceScatter(run, value, dim, mesh_dim, op);
  }
  std::vector<int> key_dims = layout.ShardedMeshDims();  // devices that reduce together
  std::vector<PartialSpec> still;
  for (const PartialSpec& p : layout.partial()) {
    if (p.mesh_dim == mesh_dim) continue;
    still.push_back(p);
    key_dims.push_back(p.mesh_dim);
  }
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = DimSpec::Sharded(mesh_dim);
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, layout.mesh(), layout.type(), still));
  TFD_RETURN_IF_ERROR(out_layout.LocalShape(global, "the reduce-scattered tensor").status());
  const int n = mesh.num_local_devices();
  const int dtype = b.dtype(value);
  // holder[d][c]: the device that sends partial c (coordinate c along mesh_dim) of d's
  // group, the group's first holding it, so that devices that hold one piece receive the
  // same parts (replicas stay the same bits).
  std::vector<int> source_dims = key_dims;
  source_dims.push_back(mesh_dim);
  const std::vector<int>& first_holder = GroupLeaders(mesh, source_dims);
  std::vector<std::vector<int>> holder(n, std::vector<int>(pieces, -1));
  std::vector<int> sources;
  for (int d = 0; d < n; ++d) {
    for (int e = 0; e < n; ++e) {
      if (run.SameCoords(d, e, key_dims)) holder[d][mesh.LocalCoord(e, mesh_dim)] = first_holder[e];
    }
    for (int h : holder[d]) {
      if (h < 0) {
        return Internal("reduce-scatter of a " + layout.ShortString() +
                        " value: a partial value has no local device.");
      }
      if (std::find(sources.begin(), sources.end(), h) == sources.end()) sources.push_back(h);
    }
  }
  TFD_ASSIGN_OR_RETURN(std::vector<Handles> split_pieces,
                       CutEach(run, value, sources, dim, out_layout, !shares_ && FoldedPieces()));
  std::map<int, const Handles*> pieces_of;
  for (size_t i = 0; i < sources.size(); ++i) pieces_of[sources[i]] = &split_pieces[i];
  auto discard_pieces = [&] {
    for (const Handles& hs : split_pieces) run.DiscardAll(hs);
  };
  // Device d (coordinate k along mesh_dim) gets piece k of every partial, all at once.
  Handles held, copies;
  std::vector<int> holders, readers, devices;
  for (int d = 0; d < n; ++d) {
    devices.push_back(d);
    const int64_t k = mesh.LocalCoord(d, mesh_dim);
    for (int64_t c = 0; c < pieces; ++c) {
      holders.push_back(holder[d][c]);
      held.push_back((*pieces_of[holder[d][c]])[k]);
      readers.push_back(d);
    }
  }
  StatusOr<Handles> reached = ReachAll(run, held, holders, readers, copies);
  if (!reached.ok()) {
    discard_pieces();
    return reached.status();
  }
  std::vector<Handles> parts;
  for (int d = 0; d < n; ++d) {
    parts.emplace_back(reached->begin() + d * pieces, reached->begin() + (d + 1) * pieces);
  }
  StatusOr<Handles> reduced = ReduceOnEach(run, parts, devices, op, dtype, pieces);
  run.DiscardAll(copies);
  discard_pieces();
  if (!reduced.ok()) return reduced.status();
  return run.AddValue(out_layout, global, dtype, *reduced);
}

}  // namespace

const CollectiveLowering& SharedBufferLowering() {
  static const SharedBuffer lowering(/*shares=*/true);
  return lowering;
}

const CollectiveLowering& DeviceCopyLowering() {
  static const SharedBuffer lowering(/*shares=*/false);
  return lowering;
}

}  // namespace tf_dtensor
