// Slicing, padding and reversing. An axis taken whole keeps its sharding and every device
// slices its own block; an axis that is cut, padded or reversed is gathered first, since
// its result does not line up with the shards.
//   x[:, 1:3] of [x,y] -> gather y -> [x,*]        x[..., 0] of [x,y] -> gather y -> [x]
//   tf.slice([x,*] of [8,4], [0,1], [-1,2]) -> [x,*]  (each device: begin [0,1], size [4,2])
//   x[:, None] of [x,*] -> [x,*,*]                    pad([x,*], [[0,0],[1,1]]) -> [x,*]
//   StridedSliceGrad (x[:, 1:3]'s gradient) with dy [x,*] -> [x,*]
//   x[:, 1::2] with x [*,x] (each block holds whole periods of 2) -> [*,x], no communication
#include <algorithm>
#include <memory>

#include "cc/core/strings.h"
#include "cc/rules/expand.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// How a StridedSlice spec (begin, end, strides and the five masks) maps the axes of the
// sliced tensor ("dense" axes) to the axes of its result.
struct StridedSliceAxes {
  // Per dense axis: taken whole (start 0, stop its size, stride 1, not shrunk).
  std::vector<bool> whole;
  // Per dense axis: the stride (> 1) of a slice that takes one element at offset `start` of
  // every period of `stride` along the whole axis (x[:, 1::2] of an axis of even size);
  // 0 otherwise. Such an axis keeps its sharding where each block holds whole periods.
  std::vector<int64_t> stride;
  std::vector<int64_t> start;
  // Per result axis: the dense axis it comes from, or -1 for a new (size-1) axis.
  std::vector<int> result_source;
  // Per entry of begin/end/strides: the dense axis it addresses, or -1 (ellipsis, new axis).
  std::vector<int> entry_axis;
};

bool Bit(int64_t mask, int i) { return (mask >> i) & 1; }

// Follows TensorFlow's BuildDenseSpec: an ellipsis (implied after the last entry when
// absent) stands for as many whole axes as the other entries leave.
// With `bounds_known` false (begin and end known only when the function runs: x[i] with a
// loop counter), an axis is whole only where both masks leave it so and its stride is 1.
StatusOr<StridedSliceAxes> AnalyzeStridedSlice(const OpContext& ctx,
                                               const std::vector<int64_t>& shape,
                                               const std::vector<int64_t>& begin,
                                               const std::vector<int64_t>& end,
                                               const std::vector<int64_t>& strides,
                                               bool bounds_known = true) {
  const int n = static_cast<int>(begin.size());
  if (static_cast<int>(end.size()) != n || static_cast<int>(strides.size()) != n) {
    return InvalidArgument("'" + ctx.op_name + "' needs begin, end and strides of one length; got " +
                           ShapeString(begin) + ", " + ShapeString(end) + ", " +
                           ShapeString(strides) + ".");
  }
  const int64_t begin_mask = ctx.attrs->GetInt("begin_mask", 0);
  const int64_t end_mask = ctx.attrs->GetInt("end_mask", 0);
  const int64_t ellipsis_mask = ctx.attrs->GetInt("ellipsis_mask", 0);
  const int64_t new_axis_mask = ctx.attrs->GetInt("new_axis_mask", 0);
  const int64_t shrink_mask = ctx.attrs->GetInt("shrink_axis_mask", 0);
  int ellipsis = -1;
  int new_after_ellipsis = 0;
  for (int i = 0; i < n; ++i) {
    if (ellipsis >= 0 && Bit(new_axis_mask, i)) ++new_after_ellipsis;
    if (Bit(ellipsis_mask, i) && ellipsis < 0) ellipsis = i;
  }
  const int entries = ellipsis >= 0 ? n : n + 1;
  if (ellipsis < 0) ellipsis = n;
  const int rank = static_cast<int>(shape.size());
  StridedSliceAxes axes;
  axes.whole.assign(rank, true);
  axes.stride.assign(rank, 0);
  axes.start.assign(rank, 0);
  axes.entry_axis.assign(n, -1);
  int dense = 0;
  for (int i = 0; i < entries; ++i) {
    if (i == ellipsis) {
      int next = std::min(rank - (entries - i) + 1 + new_after_ellipsis, rank);
      for (; dense < next; ++dense) axes.result_source.push_back(dense);
      continue;
    }
    if (Bit(new_axis_mask, i)) {
      axes.result_source.push_back(-1);
      continue;
    }
    if (dense >= rank) {
      return InvalidArgument("'" + ctx.op_name + "' has more slice entries than " +
                             ctx.Describe(0) + " has axes.");
    }
    const int d = dense++;
    axes.entry_axis[i] = d;
    if (Bit(shrink_mask, i)) {
      axes.whole[d] = false;
      continue;
    }
    axes.result_source.push_back(d);
    if (!bounds_known) {
      axes.whole[d] = Bit(begin_mask, i) && Bit(end_mask, i) && strides[i] == 1;
      continue;
    }
    const int64_t size = shape[d];
    auto clamp = [size](int64_t v) { return std::clamp(v < 0 ? v + size : v, int64_t{0}, size); };
    int64_t start = Bit(begin_mask, i) ? 0 : clamp(begin[i]);
    int64_t stop = Bit(end_mask, i) ? size : clamp(end[i]);
    axes.whole[d] = strides[i] == 1 && start == 0 && stop == size;
    const int64_t s = strides[i];
    if (s > 1 && size % s == 0 && start < s && stop > start &&
        (stop - start + s - 1) / s == size / s) {
      axes.stride[d] = s;
      axes.start[d] = start;
    }
  }
  return axes;
}

// Whether dense axis `d` (of `size`, split into `shards` blocks) keeps its sharding through
// the slice: taken whole, or periodic with every block holding whole periods.
bool KeepsSharding(const StridedSliceAxes& axes, int d, int64_t size, int shards) {
  if (axes.whole[d] || shards <= 1) return true;
  return axes.stride[d] > 0 && size % shards == 0 && (size / shards) % axes.stride[d] == 0;
}

// The size of result axis taken from dense axis `d`: whole, or one element per period.
int64_t KeptSize(const StridedSliceAxes& axes, int d, int64_t size) {
  return axes.whole[d] ? size : (axes.stride[d] > 0 ? size / axes.stride[d] : -1);
}

// Local begin/end for the entries that address whole, sharded axes: [0, local size).
void LocalizeEntries(const StridedSliceAxes& axes, const Layout& layout,
                     const std::vector<int64_t>& shape, std::vector<int64_t>* begin,
                     std::vector<int64_t>* end) {
  for (size_t i = 0; i < axes.entry_axis.size(); ++i) {
    int d = axes.entry_axis[i];
    // An axis in one block (sharded over a mesh dimension of size 1) is sliced as given.
    if (d < 0 || !layout.spec(d).sharded() || layout.NumShards(d) <= 1) continue;
    // The largest block; StridedSlice clamps `end`, so smaller (uneven) blocks are whole too.
    // A periodic axis starts at the same offset in every block.
    (*begin)[i] = axes.whole[d] ? 0 : axes.start[d];
    (*end)[i] = Layout::Piece(shape[d], layout.NumShards(d), 0).first;
  }
}

// Whether the integer operands `inputs` are known only when the function runs, each whole
// (on the host or replicated) and of static shape `shape`: then the op can run on whole
// inputs with them as they are.
bool RunTimeOperands(const OpContext& ctx, const std::vector<int>& inputs,
                     const std::vector<int64_t>& shape) {
  for (int i : inputs) {
    if (i >= static_cast<int>(ctx.inputs.size())) return false;
    const InputInfo& in = ctx.inputs[i];
    if ((in.layout && !in.layout->IsFullyReplicated()) || in.shape != shape) return false;
  }
  return true;
}

// The begin, end and strides inputs (1, 2, 3) of a strided slice op. Inside tf.function
// begin and end may be known only when it runs (x[i] with a loop counter, as TF's DTensor
// allows): then `known` is false, begin and end are zeros of their static length, and the
// rules keep only the sharding of axes the masks take whole, whose entries the kernel
// ignores, so every device runs the op with the run-time bounds as they are. The strides
// must be known (a run-time stride could reverse any axis); so must a sharded bound's value.
struct SliceBounds {
  std::vector<int64_t> begin, end, strides;
  bool known = true;
};

StatusOr<SliceBounds> ReadSliceBounds(const OpContext& ctx) {
  SliceBounds b;
  StatusOr<std::vector<int64_t>> begin = ctx.IntValue(1, "begin");
  StatusOr<std::vector<int64_t>> end = ctx.IntValue(2, "end");
  TFD_ASSIGN_OR_RETURN(b.strides, ctx.IntValue(3, "strides"));
  if (begin.ok() && end.ok()) {
    b.begin = *std::move(begin);
    b.end = *std::move(end);
    return b;
  }
  const size_t n = b.strides.size();
  if (!RunTimeOperands(ctx, {1, 2}, {static_cast<int64_t>(n)})) {
    return begin.ok() ? end.status() : begin.status();
  }
  b.begin.assign(n, 0);
  b.end.assign(n, 0);
  b.known = false;
  return b;
}

// StridedSlice(input, begin, end, strides).
class StridedSliceRule : public Rule {
 public:

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(SliceBounds bounds, ReadSliceBounds(ctx));
    std::vector<int64_t>& begin = bounds.begin;
    std::vector<int64_t>& end = bounds.end;
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    TFD_ASSIGN_OR_RETURN(StridedSliceAxes axes, AnalyzeStridedSlice(ctx, shape, begin, end,
                                                                    bounds.strides, bounds.known));
    const Layout& in = ctx.layout(0);
    std::vector<DimSpec> specs = in.specs();
    for (int d = 0; d < in.rank(); ++d) {
      if (!KeepsSharding(axes, d, shape[d], in.NumShards(d))) specs[d] = DimSpec::Replicated();
    }
    std::vector<DimSpec> out;
    for (int source : axes.result_source) {
      out.push_back(source < 0 ? DimSpec::Replicated() : specs[source]);
    }
    Plan plan;
    Layout runs = in.WithSpecs(specs);
    plan.inputs = {runs, std::nullopt, std::nullopt, std::nullopt};
    plan.outputs = {in.WithSpecs(out)};
    if (bounds.known && !runs.IsFullyReplicated()) {
      LocalizeEntries(axes, runs, shape, &begin, &end);
      plan.host_inputs[1] = begin;
      plan.host_inputs[2] = end;
    }
    return plan;
  }
};

// StridedSliceGrad(shape, begin, end, strides, dy): dy written into zeros of `shape` where
// StridedSlice took it from. A result axis that came from a whole axis keeps dy's sharding.
class StridedSliceGradRule : public Rule {
 public:

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ctx.IntValue(0, "shape"));
    TFD_ASSIGN_OR_RETURN(SliceBounds bounds, ReadSliceBounds(ctx));
    std::vector<int64_t>& begin = bounds.begin;
    std::vector<int64_t>& end = bounds.end;
    TFD_ASSIGN_OR_RETURN(StridedSliceAxes axes, AnalyzeStridedSlice(ctx, shape, begin, end,
                                                                    bounds.strides, bounds.known));
    const Layout& dy = ctx.layout(4);
    if (static_cast<int>(axes.result_source.size()) != dy.rank()) {
      return InvalidArgument("'" + ctx.op_name + "' got " + ctx.Describe(4) +
                             " but the slice gives rank " +
                             std::to_string(axes.result_source.size()) + ".");
    }
    std::vector<DimSpec> out(shape.size(), DimSpec::Replicated());
    std::vector<DimSpec> dy_specs(dy.rank(), DimSpec::Replicated());
    for (int j = 0; j < dy.rank(); ++j) {
      int source = axes.result_source[j];
      // The gradient's shape is one host argument: only evenly divided axes stay sharded.
      if (source >= 0 && shape[source] % dy.NumShards(j) == 0 &&
          KeepsSharding(axes, source, shape[source], dy.NumShards(j))) {
        out[source] = dy_specs[j] = dy.spec(j);
      }
    }
    Layout out_layout = dy.WithSpecs(out);
    Plan plan;
    plan.inputs = {std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                   dy.WithSpecs(dy_specs)};
    plan.outputs = {out_layout};
    if (!out_layout.IsFullyReplicated()) {
      TFD_ASSIGN_OR_RETURN(plan.host_inputs[0],
                           out_layout.UniformLocalShape(shape, "the output of '" + ctx.op_name + "'"));
      if (bounds.known) {
        LocalizeEntries(axes, out_layout, shape, &begin, &end);
        plan.host_inputs[1] = begin;
        plan.host_inputs[2] = end;
      }
    }
    return plan;
  }
};

// TensorStridedSliceUpdate(input, begin, end, strides, value): `input` with the slice that
// StridedSlice would take replaced by `value` (broadcast to the slice). As for StridedSlice,
// an axis taken whole keeps its sharding (every device updates its own block) and a cut
// axis is gathered; the value follows the input along the whole axes:
//   x[:, 1:3] = v with x [x,y], v [*,*] -> x [x,*], v [x,*] -> [x,*]
class TensorStridedSliceUpdateRule : public Rule {
 public:

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(SliceBounds bounds, ReadSliceBounds(ctx));
    std::vector<int64_t>& begin = bounds.begin;
    std::vector<int64_t>& end = bounds.end;
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    TFD_ASSIGN_OR_RETURN(StridedSliceAxes axes, AnalyzeStridedSlice(ctx, shape, begin, end,
                                                                    bounds.strides, bounds.known));
    const Layout& in = ctx.layout(0);
    const Layout& value = ctx.layout(4);
    const std::vector<int64_t>& value_shape = ctx.inputs[4].shape;
    const int result_rank = static_cast<int>(axes.result_source.size());
    if (value.rank() > result_rank) {
      return InvalidArgument("'" + ctx.op_name + "' got " + ctx.Describe(4) +
                             " but the slice has rank " + std::to_string(result_rank) + ".");
    }
    // Value axis j is result axis j + shift (broadcasting aligns on the right); it shards
    // with its input axis only when it spans it (a size-1 axis broadcasts).
    const int shift = result_rank - value.rank();
    auto spans = [&](int j) {
      const int source = axes.result_source[j + shift];
      return source >= 0 && (axes.whole[source] || axes.stride[source] > 0) &&
             value_shape[j] == KeptSize(axes, source, shape[source]);
    };
    std::vector<DimSpec> specs = in.specs();
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    for (int d = 0; d < in.rank(); ++d) {
      if (!KeepsSharding(axes, d, shape[d], in.NumShards(d))) specs[d] = DimSpec::Replicated();
      if (specs[d].sharded()) used[specs[d].mesh_dim] = true;
    }
    // A whole axis the input leaves unsharded takes the value's sharding.
    for (int j = 0; j < value.rank(); ++j) {
      const DimSpec& s = value.spec(j);
      if (!spans(j) || !s.sharded() || used[s.mesh_dim]) continue;
      const int source = axes.result_source[j + shift];
      if (specs[source].sharded() ||
          !KeepsSharding(axes, source, shape[source], value.NumShards(j))) {
        continue;
      }
      specs[source] = s;
      used[s.mesh_dim] = true;
    }
    std::vector<DimSpec> value_specs(value.rank(), DimSpec::Replicated());
    for (int j = 0; j < value.rank(); ++j) {
      if (spans(j)) value_specs[j] = specs[axes.result_source[j + shift]];
    }
    Layout runs = in.WithSpecs(specs);
    Plan plan;
    plan.inputs = {runs, std::nullopt, std::nullopt, std::nullopt, value.WithSpecs(value_specs)};
    plan.outputs = {runs};
    if (bounds.known && !runs.IsFullyReplicated()) {
      LocalizeEntries(axes, runs, shape, &begin, &end);
      plan.host_inputs[1] = begin;
      plan.host_inputs[2] = end;
    }
    return plan;
  }
};

// Slice(input, begin, size); a size of -1 runs to the end of the axis.
class SliceRule : public Rule {
 public:

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    StatusOr<std::vector<int64_t>> begin_value = ctx.IntValue(1, "begin");
    StatusOr<std::vector<int64_t>> size_value = ctx.IntValue(2, "size");
    if (!begin_value.ok() || !size_value.ok()) {
      // Known only when the function runs (tf.slice(x, [k, 0], ...) with a run-time k, as
      // TF's DTensor allows): every axis may be cut, so the input is gathered and every
      // device slices it whole.
      if (!RunTimeOperands(ctx, {1, 2}, {ctx.rank(0)})) {
        return begin_value.ok() ? size_value.status() : begin_value.status();
      }
      return Plan::Whole(ctx, ctx.rank(0));
    }
    std::vector<int64_t> begin = *std::move(begin_value);
    std::vector<int64_t> size = *std::move(size_value);
    const Layout& in = ctx.layout(0);
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    if (static_cast<int>(begin.size()) != in.rank() || static_cast<int>(size.size()) != in.rank()) {
      return InvalidArgument("'Slice' needs one begin and size per axis of " + ctx.Describe(0) +
                             "; got begin " + ShapeString(begin) + " and size " +
                             ShapeString(size) + ".");
    }
    std::vector<DimSpec> specs = in.specs();
    for (int d = 0; d < in.rank(); ++d) {
      bool whole = begin[d] == 0 && (size[d] == -1 || size[d] == shape[d]);
      if (!whole) {
        specs[d] = DimSpec::Replicated();
      } else if (specs[d].sharded()) {
        size[d] = -1;  // to the end of each device's block, whatever its (uneven) size
      }
    }
    Layout runs = in.WithSpecs(specs);
    Plan plan;
    plan.inputs = {runs, std::nullopt, std::nullopt};
    plan.outputs = {runs};
    if (!runs.IsFullyReplicated()) plan.host_inputs[2] = size;
    return plan;
  }
};

// Pad/PadV2/MirrorPad(input, paddings [rank, 2], ...): padded axes need replication.
StatusOr<FactorSpec> PadFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  StatusOr<std::vector<int64_t>> padding_value = ctx.IntValue(1, "paddings");
  if (!padding_value.ok() && !RunTimeOperands(ctx, {1}, {rank, 2})) {
    return padding_value.status();
  }
  // Paddings known only when the function runs pad any axis: every axis is gathered.
  std::vector<int64_t> paddings =
      padding_value.ok() ? *std::move(padding_value) : std::vector<int64_t>(2 * rank, 1);
  if (static_cast<int>(paddings.size()) != 2 * rank) {
    return InvalidArgument("'" + ctx.op_name + "' needs paddings of shape [" +
                           std::to_string(rank) + ", 2] for " + ctx.Describe(0) + "; got " +
                           std::to_string(paddings.size()) + " values.");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  for (int d = 0; d < rank; ++d) {
    if (paddings[2 * d] != 0 || paddings[2 * d + 1] != 0) {
      spec.factors[axes[d]] = FactorKind::kNeedReplication;
    }
  }
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = axes;
  spec.outputs = {axes};
  return spec;
}

// MirrorPad: TF's kernel refuses an axis of size 0 even where it pads nothing ("paddings
// must be less than the dimension size"), and uneven shards leave some devices such
// blocks: those devices make their (empty) output block as zeros instead. MirrorPadGrad
// (the gradient of a reflect padding: tf.pad(mode="REFLECT"), tf.image.sobel_edges) takes
// the padded gradient and folds the borders back: the same factors, the output smaller.
class MirrorPadRule : public FactorRule {
 public:
  // `sign`: +1 for MirrorPad (the output grows by the paddings), -1 for MirrorPadGrad.
  explicit MirrorPadRule(int sign) : FactorRule(PadFactors), sign_(sign) {}

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    LocalOpOptions options;
    options.overrides = plan.overrides;
    StatusOr<std::vector<int64_t>> padding_value = ctx.IntValue(1, "paddings");
    std::vector<int64_t> paddings = padding_value.ok() ? *padding_value : std::vector<int64_t>{};
    std::vector<int64_t> shape = ctx.inputs[0].shape;
    bool known = paddings.size() == 2 * shape.size();
    for (size_t d = 0; known && d < shape.size(); ++d) {
      known = shape[d] >= 0;
      shape[d] += sign_ * (paddings[2 * d] + paddings[2 * d + 1]);
    }
    if (known && plan.outputs.size() == 1) {
      options.zeros_for_empty_blocks = true;
      options.global_shapes = {shape};
    }
    return ExpandWithInputs(ctx, plan, inputs, options, builder);
  }

 private:
  int sign_;
};

// ReverseV2(tensor, axis): reversed axes need replication.
StatusOr<FactorSpec> ReverseFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> reversed, ctx.IntValue(1, "axis"));
  const int rank = ctx.rank(0);
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  for (int64_t a : reversed) {
    if (a < -rank || a >= rank) {
      return InvalidArgument("'" + ctx.op_name + "' axis " + std::to_string(a) +
                             " is out of range for " + ctx.Describe(0) + ".");
    }
    spec.factors[axes[a < 0 ? a + rank : a]] = FactorKind::kNeedReplication;
  }
  spec.inputs = {axes, std::nullopt};
  spec.outputs = {axes};
  return spec;
}

// Roll(input, shift, axis): a rolled axis moves elements across shard boundaries, so it
// is gathered; the other axes keep their sharding (tf.roll in shifted-window attention
// rolls h and w of [b, h, w, c]: [x,*,*,y] stays [x,*,*,y]).
StatusOr<FactorSpec> RollFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> rolled, ctx.IntValue(2, "axis"));
  const int rank = ctx.rank(0);
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  for (int64_t a : rolled) {
    if (a < -rank || a >= rank) {
      return InvalidArgument("'" + ctx.op_name + "' axis " + std::to_string(a) +
                             " is out of range for " + ctx.Describe(0) + ".");
    }
    spec.factors[axes[a < 0 ? a + rank : a]] = FactorKind::kNeedReplication;
  }
  spec.inputs = {axes, std::nullopt, std::nullopt};
  spec.outputs = {axes};
  return spec;
}

// ReverseSequence(input, seq_lengths) with attrs seq_dim, batch_dim: each batch element
// reverses its first seq_lengths[b] steps, so the sequence axis is gathered while the batch
// axis stays sharded, seq_lengths sharded alike: [x,y,*] (batch 0, seq 1) -> [x,*,*].
StatusOr<FactorSpec> ReverseSequenceFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  const int64_t seq = ctx.attrs->GetInt("seq_dim", -1);
  const int64_t batch = ctx.attrs->GetInt("batch_dim", 0);
  if (seq < 0 || seq >= rank || batch < 0 || batch >= rank || seq == batch ||
      ctx.rank(1) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs distinct seq_dim and batch_dim within " +
                           ctx.Describe(0) + " and 1-D seq_lengths; got seq_dim " +
                           std::to_string(seq) + ", batch_dim " + std::to_string(batch) +
                           " and " + ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.factors[axes[seq]] = FactorKind::kNeedReplication;
  spec.inputs = {axes, std::vector<int>{axes[batch]}};
  spec.outputs = {axes};
  return spec;
}

const bool kRegistered = RegisterRules({
    {"MirrorPad", std::make_shared<MirrorPadRule>(1), Traits().Host(1, HostValue::kPaddings)},
    {"MirrorPadGrad", std::make_shared<MirrorPadRule>(-1),
     Traits().Host(1, HostValue::kPaddings)},
    {"Pad", Factors(PadFactors), Traits().Host(1, HostValue::kPaddings)},
    {"PadV2", Factors(PadFactors), Traits().Host(1, HostValue::kPaddings)},
    {"ReverseSequence", Factors(ReverseSequenceFactors)},
    {"ReverseV2", Factors(ReverseFactors), Traits().Host(1, HostValue::kAxis)},
    {"Roll", Factors(RollFactors),
     Traits().Host(1, HostValue::kCount).Host(2, HostValue::kAxis)},
    {"Slice", std::make_shared<SliceRule>(), Traits().Host(1, -1, HostValue::kBounds)},
    {"StridedSlice", std::make_shared<StridedSliceRule>(),
     Traits().Host(1, -1, HostValue::kBounds)},
    {"StridedSliceGrad", std::make_shared<StridedSliceGradRule>(),
     Traits().Host(0, HostValue::kShape).Host(1, 3, HostValue::kBounds)},
    {"TensorStridedSliceUpdate", std::make_shared<TensorStridedSliceUpdateRule>(),
     Traits().Host(1, 3, HostValue::kBounds)},
});

}  // namespace
}  // namespace tf_dtensor
