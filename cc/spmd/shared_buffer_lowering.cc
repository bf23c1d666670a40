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

#include "cc/spmd/block_pieces.h"
#include "cc/spmd/ledger.h"
#include "cc/spmd/lowering.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

using Handles = std::vector<LocalHandle>;
using pieces::CutEach;
using pieces::FoldedPieces;
using pieces::JoinEach;
using pieces::JoinStacks;
using pieces::Product;


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
  const size_t width = DTypeBytes(dtype);
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
    for (size_t k = 0; k < made.size(); ++k) {
      out[at[k]] = made[k];
      // A copy has its source's shape (a transposed cut's rows are stacked as they come).
      if (std::optional<std::vector<int64_t>> shape = run.LocalShape(send[k])) {
        run.SetLocalShape(made[k], *shape);
      }
    }
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
    // A mean of narrow integers adds in int64 (terms that fit can sum past the type), and
    // its quotient returns to the dtype: one device's mean of them.
    const bool widen = op == ReduceOp::kMean && count > 1 && IsIntegerDType(dtype) &&
                       DTypeBytes(dtype) < 8;
    const int sum_dtype = widen ? TF_INT64 : dtype;
    auto cast_each = [&](const Handles& values, int from, int to) -> StatusOr<Handles> {
      LocalOpOptions cast;
      cast.copy_attrs = false;
      cast.overrides = {AttrOverride::Type("SrcT", from), AttrOverride::Type("DstT", to)};
      std::vector<Handles> one;
      for (LocalHandle h : values) one.push_back({h});
      TFD_ASSIGN_OR_RETURN(std::vector<Handles> cast_out,
                           run.RunOnEach("Cast", one, devices, cast, 1));
      return Firsts(cast_out);
    };
    std::vector<Handles> summed = parts;
    Handles widened;  // made here, discarded once added
    for (size_t k = 0; widen && k < parts[0].size(); ++k) {
      Handles column;
      for (const Handles& p : parts) column.push_back(p[k]);
      StatusOr<Handles> wide = cast_each(column, dtype, TF_INT64);
      if (!wide.ok()) {
        run.DiscardAll(widened);
        return wide.status();
      }
      for (size_t i = 0; i < parts.size(); ++i) summed[i][k] = (*wide)[i];
      widened.insert(widened.end(), wide->begin(), wide->end());
    }
    LocalOpOptions add;
    add.copy_attrs = false;
    add.overrides = {AttrOverride::Type("T", sum_dtype),
                     AttrOverride::Int("N", static_cast<int64_t>(parts[0].size()))};
    StatusOr<std::vector<Handles>> sums = run.RunOnEach("AddN", summed, devices, add, 1);
    run.DiscardAll(widened);
    if (!sums.ok()) return sums.status();
    Handles out = Firsts(*sums);
    if (op == ReduceOp::kSum || count == 1) return out;
    // The divisor as one scalar of the sum's dtype on every device, from one host constant.
    StatusOr<LocalHandle> host = run.Host({count}, {}, TF_INT64);
    LocalOpOptions cast;
    cast.copy_attrs = false;
    cast.overrides = {AttrOverride::Type("SrcT", TF_INT64), AttrOverride::Type("DstT", sum_dtype)};
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
    // Integers' mean truncates, as TF's Mean of integers and the collective ops' final Div.
    LocalOpOptions divide;
    divide.copy_attrs = false;
    divide.overrides = {AttrOverride::Type("T", sum_dtype)};
    StatusOr<std::vector<Handles>> q = run.RunOnEach(IsIntegerDType(dtype) ? "Div" : "RealDiv",
                                                     quotients, devices, divide, 1);
    run.DiscardAll(out);
    run.DiscardAll(Firsts(*scales));
    if (!q.ok()) return q.status();
    if (!widen) return Firsts(*q);
    StatusOr<Handles> narrow = cast_each(Firsts(*q), TF_INT64, dtype);
    run.DiscardAll(Firsts(*q));
    return narrow;
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
  // Where the targets stack, the sources' views go as they are (no reshape of each piece
  // at either end: 2 K eager ops fewer per device on GPUs, where each is a host call).
  const bool as_rows = fold && JoinStacks(targets, out_layout, global, from_dim, pieces, dtype);
  StatusOr<std::vector<Handles>> split_blocks =
      CutEach(run, value, sources, to_dim, out_layout, fold, as_rows);
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
