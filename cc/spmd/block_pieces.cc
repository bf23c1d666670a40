// Cutting blocks into pieces and joining pieces into blocks, at every device of a group at
// once: the steps the shared-buffer and copies lowerings (shared_buffer_lowering.cc) share
// for all-to-all, all-gather and reduce-scatter, and the forms the copies lowering takes on
// GPUs (FoldedPieces).
#include "cc/spmd/block_pieces.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "cc/spmd/ledger.h"

#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace pieces {
namespace {

using Handles = std::vector<LocalHandle>;

}  // namespace

int64_t Product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

namespace {

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

}  // namespace

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
// DynamicStitch, int32: see Foldable).
bool FoldedPieces() {
  const char* env = std::getenv("TF_DTENSOR_COPIES_PIECES");
  return !(env && std::string_view(env) == "split");
}

namespace {

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

// Whether pieces of `dtype` may take the folded forms at all. Not int32: TensorFlow keeps
// a GPU's int32 tensors in host memory (its Reshape, Split and ConcatV2 of int32 are host
// kernels there) while its GPU Transpose and DynamicStitch of int32 take device memory,
// and the folded forms run the two kinds back to back. On an H200 split into 8 logical
// GPUs they gave wrong values: an int32 all-gather 64 times in 240 and an all-to-all 20 in
// 30, where the split form of int32, and int64 and float32 in either form, were always
// right (2026-11-30). The split form keeps int32 in host kernels throughout.
bool Foldable(int dtype) { return static_cast<TF_DataType>(dtype) != TF_INT32; }

// The folds of the transposed cut, one per source block: nullopt where the sizes are not
// known and even, the dtype is not Foldable, or the pieces would not be aligned views
// (TF's SplitV makes views along the first axis only for 64-byte aligned pieces, the
// widest alignment its Eigen builds ask; else it copies each piece).
std::optional<std::vector<Folded>> CutFolds(const std::vector<std::vector<int64_t>>& blocks,
                                            int dim, int64_t pieces, int dtype) {
  if (!Foldable(dtype)) return std::nullopt;
  const int64_t width = static_cast<int64_t>(DTypeBytes(dtype));
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
// block shape, or, `as_rows`, as the views are ([1, p, r]; [1, r] where p is 1), which a
// stacked join takes as its rows without reshaping each piece at both ends.
StatusOr<std::vector<Handles>> CutTransposed(CollectiveRunner& run, ValueId value,
                                             const std::vector<int>& sources,
                                             const std::vector<std::vector<int64_t>>& blocks,
                                             const std::vector<Folded>& folds, int dim,
                                             int64_t pieces, bool as_rows) {
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
  if (as_rows) {  // the views as they are: [1, p, r] ([1, r] where p is 1)
    run.DiscardAll(made);
    std::vector<Handles> out(sources.size());
    for (size_t i = 0; i < sources.size(); ++i) {
      std::vector<int64_t> row = {1, folds[i].p, folds[i].r};
      if (folds[i].p == 1) row.erase(row.begin() + 1);
      for (LocalHandle h : (*cut)[i]) {
        out[i].push_back(h);
        run.SetLocalShape(h, row);
      }
    }
    return out;
  }
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
// known and even, the dtype is not Foldable or has no GPU DynamicStitch, or there are 16
// pieces or more (where TF's ConcatV2 is one kernel itself).
std::optional<std::vector<Folded>> JoinFolds(const std::vector<std::vector<int64_t>>& blocks,
                                             int dim, int64_t pieces, int dtype) {
  if (!Foldable(dtype) || !Stitchable(dtype) || pieces >= 16) return std::nullopt;
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
  // Each piece as one row of the stack ([1, p * r]), but a target whose pieces all come
  // as rows of one shape ([1, ...]: a transposed cut's views) stacks them as they are.
  std::vector<Handles> row_inputs;
  std::vector<int> on;
  std::vector<bool> as_rows(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    const std::optional<std::vector<int64_t>> first = run.LocalShape(parts[t][0]);
    as_rows[t] = first && !first->empty() && (*first)[0] == 1 &&
                 Product(*first, 0, first->size()) == folds[t].p * folds[t].r &&
                 std::all_of(parts[t].begin(), parts[t].end(),
                             [&](LocalHandle h) { return run.LocalShape(h) == first; });
    if (as_rows[t]) continue;
    StatusOr<LocalHandle> row = run.Host({1, folds[t].p * folds[t].r}, {2}, TF_INT64);
    if (!row.ok()) return fail(row.status());
    for (LocalHandle h : parts[t]) {
      row_inputs.push_back({h, *row});
      on.push_back(targets[t]);
    }
  }
  std::vector<Handles> rows;
  if (!row_inputs.empty()) {
    StatusOr<std::vector<Handles>> shaped = run.RunOnEach("Reshape", row_inputs, on, reshape, 1);
    if (!shaped.ok()) return fail(shaped.status());
    for (const Handles& h : *shaped) made.push_back(h[0]);
    rows = *std::move(shaped);
  }
  Handles indices;
  for (int64_t c = 0; c < pieces; ++c) {
    StatusOr<LocalHandle> index = run.Host({c}, {1}, TF_INT32);
    if (!index.ok()) return fail(index.status());
    indices.push_back(*index);
  }
  std::vector<Handles> stitch_inputs;
  for (size_t t = 0, m = 0; t < targets.size(); ++t) {
    Handles inputs = indices;
    for (int64_t c = 0; c < pieces; ++c) {
      inputs.push_back(as_rows[t] ? parts[t][c] : rows[m++][0]);
    }
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

}  // namespace

// Every source in `sources` cuts its block of `value` along `dim` into the pieces of
// `out_layout`, all at once: transposed where `fold` and that form applies, else SplitV;
// each source's pieces.
StatusOr<std::vector<Handles>> CutEach(CollectiveRunner& run, ValueId value,
                                       const std::vector<int>& sources, int dim,
                                       const Layout& out_layout, bool fold, bool as_rows) {
  Builder& b = run.builder();
  const std::vector<int64_t> global = b.shape(value);
  const std::vector<int64_t> sizes = out_layout.PieceSizes(global, dim);
  const int64_t pieces = static_cast<int64_t>(sizes.size());
  if (fold) {
    const Layout layout = *b.layout(value);
    std::vector<std::vector<int64_t>> blocks;
    for (int source : sources) blocks.push_back(layout.GeometryOfDevice(global, source).shape);
    if (std::optional<std::vector<Folded>> folds = CutFolds(blocks, dim, pieces, b.dtype(value))) {
      return CutTransposed(run, value, sources, blocks, *folds, dim, pieces, as_rows);
    }
  }
  return SplitEach(run, value, sources, dim, sizes);
}

bool JoinStacks(const std::vector<int>& targets, const Layout& out_layout,
                const std::vector<int64_t>& global, int dim, int64_t pieces, int dtype) {
  std::vector<std::vector<int64_t>> blocks;
  for (int target : targets) blocks.push_back(out_layout.GeometryOfDevice(global, target).shape);
  return JoinFolds(blocks, dim, pieces, dtype).has_value();
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

}  // namespace pieces
}  // namespace tf_dtensor
