// Ops on shapes and axis order.
//   Shape/Size/Rank/ShapeN([x,*] of [8,4]) -> the GLOBAL values, replicated
//   BroadcastGradientArgs, InvertPermutation: computed from their host arguments, replicated
//   transpose([x,y], perm=[1,0]) -> [y,x]
//   expand_dims([x,*], 1) -> [x,*,*]        squeeze([x,*,*] of [8,1,4], [1]) -> [x,*]
//   reshape keeps a sharding when it maps cleanly:
//     [B,T,D] [x,*,*] -> [B*T,D] [x,*]      (the sharded axis leads its merged block)
//     [B*T,D] [x,*]   -> [B,T,D] [x,*,*]    (B divisible by |x|)
//   otherwise the blocking axes are gathered first.
//   broadcast_to([x] of [8], [4,8]) -> [*,x]   (new and size-1 axes: unsharded, or the
//     requested layout's sharding, as each device fills only its own block)
//   tile([x,*], [1,3]) -> [x,*]        tile([x,*], [2,1]) -> gather axis 0 -> [*,*]
#include <algorithm>
#include <numeric>

#include "cc/core/strings.h"
#include "cc/rules/merge.h"
#include "cc/rules/factor.h"
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

class ShapeInfoRule : public Rule {
 public:
  enum class Kind { kShape, kShapeN, kSize, kRank };
  explicit ShapeInfoRule(Kind kind) : kind_(kind) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    const bool vector = kind_ == Kind::kShape || kind_ == Kind::kShapeN;
    const size_t count = kind_ == Kind::kShapeN ? ctx.inputs.size() : 1;
    plan.outputs.assign(count, Layout::Replicated(ctx.mesh, vector ? 1 : 0));
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    std::vector<ValueId> outputs;
    for (size_t i = 0; i < plan.outputs.size(); ++i) {
      const std::vector<int64_t>& shape = ctx.inputs[i].shape;
      int dtype = ctx.attrs->GetType("out_type").value_or(TF_INT32);
      std::vector<int64_t> values;
      std::vector<int64_t> dims;
      switch (kind_) {
        case Kind::kShape:
        case Kind::kShapeN:
          values = shape;
          dims = {static_cast<int64_t>(shape.size())};
          break;
        case Kind::kSize:
          values = {std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                    std::multiplies<int64_t>())};
          break;
        case Kind::kRank:
          values = {static_cast<int64_t>(shape.size())};
          dtype = TF_INT32;
          break;
      }
      const bool known = std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; });
      if (!known && kind_ != Kind::kRank) {
        TFD_ASSIGN_OR_RETURN(ValueId out, RunTimeShape(ctx, static_cast<int>(i), dtype, builder));
        outputs.push_back(out);
        continue;
      }
      TFD_ASSIGN_OR_RETURN(ValueId host, builder.HostConstant(values, dims, dtype));
      TFD_ASSIGN_OR_RETURN(ValueId out, builder.Broadcast(host, ctx.mesh));
      outputs.push_back(out);
    }
    return outputs;
  }

 private:
  // The global shape (or size) of input `i`, some of whose sizes are known only at run
  // time (tf.where's rows inside tf.function): the local Shape op, whose unknown sizes are
  // global once their axes are unsharded (gathered first if need be), with the known
  // sizes of sharded axes put in: local * keep + fixed, keep 0 and fixed the global size
  // where the size is known.
  StatusOr<ValueId> RunTimeShape(const OpContext& ctx, int i, int dtype, Builder& builder) const {
    const std::vector<int64_t>& shape = ctx.inputs[i].shape;
    ValueId value = builder.input(i);
    const std::optional<Layout>& layout = builder.layout(value);
    const int rank = static_cast<int>(shape.size());
    std::vector<int64_t> keep(rank, 1), fixed(rank, 0);
    if (layout && !layout->is_single_device()) {
      std::vector<DimSpec> specs = layout->WithoutPartial().specs();
      bool gather = false;
      for (int d = 0; d < rank; ++d) {
        if (!specs[d].sharded()) continue;
        if (shape[d] < 0) {
          specs[d] = DimSpec::Replicated();
          gather = true;
        } else {
          keep[d] = 0;
          fixed[d] = shape[d];
        }
      }
      if (gather) {
        TFD_ASSIGN_OR_RETURN(value, Relayout(builder, value, layout->WithSpecs(specs),
                                             ctx.Describe(i)));
      }
    }
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", ctx.inputs[i].dtype),
                         AttrOverride::Type("out_type", dtype)};
    const Layout vector = Layout::Replicated(ctx.mesh, 1);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> local,
                         builder.LocalOp("Shape", {value}, options, {vector}));
    ValueId out = local[0];
    LocalOpOptions arithmetic;
    arithmetic.copy_attrs = false;
    arithmetic.overrides = {AttrOverride::Type("T", dtype)};
    if (std::find(keep.begin(), keep.end(), 0) != keep.end()) {
      TFD_ASSIGN_OR_RETURN(ValueId k, builder.HostConstant(keep, {rank}, dtype));
      TFD_ASSIGN_OR_RETURN(ValueId f, builder.HostConstant(fixed, {rank}, dtype));
      TFD_ASSIGN_OR_RETURN(local, builder.LocalOp("Mul", {out, k}, arithmetic, {vector}));
      TFD_ASSIGN_OR_RETURN(local, builder.LocalOp("AddV2", {local[0], f}, arithmetic, {vector}));
      out = local[0];
    }
    if (kind_ == Kind::kSize) {
      TFD_ASSIGN_OR_RETURN(ValueId axis, builder.HostConstant({0}, {}, TF_INT32));
      LocalOpOptions prod = arithmetic;
      prod.overrides.push_back(AttrOverride::Type("Tidx", TF_INT32));
      TFD_ASSIGN_OR_RETURN(local, builder.LocalOp("Prod", {out, axis}, prod,
                                                  {Layout::Replicated(ctx.mesh, 0)}));
      out = local[0];
    }
    return out;
  }

  Kind kind_;
};

// Transpose(x, perm): a permutation of factors, "ab->ba" for perm [1,0].
StatusOr<FactorSpec> TransposeFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> perm, ctx.IntValue(1, "permutation"));
  const int rank = ctx.rank(0);
  if (static_cast<int>(perm.size()) != rank) {
    return InvalidArgument("Transpose permutation " + ShapeString(perm) + " does not match " +
                           ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  std::vector<int> out;
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= rank) {
      return InvalidArgument("Transpose permutation " + ShapeString(perm) +
                             " is out of range for " + ctx.Describe(0) + ".");
    }
    if (seen[p]) {
      return InvalidArgument("Transpose permutation " + ShapeString(perm) + " names axis " +
                             std::to_string(p) + " twice; it must list each axis of " +
                             ctx.Describe(0) + " once.");
    }
    seen[p] = true;
    out.push_back(axes[p]);
  }
  spec.inputs = {axes, std::nullopt};
  spec.outputs = {out};
  return spec;
}

// ExpandDims(x, axis): the input's factors with a new unsharded axis inserted.
StatusOr<FactorSpec> ExpandDimsFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(1, "axis"));
  const int rank = ctx.rank(0);
  if (axis.size() != 1) return InvalidArgument("ExpandDims takes one axis.");
  int64_t a = axis[0] < 0 ? axis[0] + rank + 1 : axis[0];
  if (a < 0 || a > rank) {
    return InvalidArgument("ExpandDims axis " + std::to_string(axis[0]) +
                           " is out of range for " + ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.inputs = {axes, std::nullopt};
  axes.insert(axes.begin() + a, FactorSpec::kNew);
  spec.outputs = {axes};
  return spec;
}

class SqueezeRule : public Rule {
 public:
  // The input axes Squeeze drops; an error for an axis out of range or not of size 1.
  static StatusOr<std::vector<bool>> Dropped(const OpContext& ctx) {
    const int rank = ctx.rank(0);
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    std::vector<int64_t> dims = ctx.attrs->GetIntList("squeeze_dims");
    std::vector<bool> drop(rank, false);
    if (dims.empty()) {
      for (int d = 0; d < rank; ++d) drop[d] = shape[d] == 1;
    }
    for (int64_t d : dims) {
      if (d < -rank || d >= rank) {
        return InvalidArgument("'Squeeze' got axis " + std::to_string(d) + ", out of range for " +
                               ctx.Describe(0) + "; axes run from " + std::to_string(-rank) +
                               " to " + std::to_string(rank - 1) + ".");
      }
      const int axis = static_cast<int>(d < 0 ? d + rank : d);
      if (shape[axis] != 1) {
        return InvalidArgument("'Squeeze' can only drop axes of size 1, but axis " +
                               std::to_string(axis) + " of " + ctx.Describe(0) + " has size " +
                               std::to_string(shape[axis]) + ".");
      }
      drop[axis] = true;
    }
    return drop;
  }

  // want [x,y] of squeeze([8,1,4]) -> [x,*,y]
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    StatusOr<std::vector<bool>> dropped = Dropped(ctx);
    if (!dropped.ok()) return {std::nullopt};
    const std::vector<bool>& drop = *dropped;
    int kept = 0;
    for (bool d : drop) kept += d ? 0 : 1;
    const Layout* want = UsableRequest(ctx, requested, 0, kept);
    if (!want) return {std::nullopt};
    std::vector<DimSpec> specs;
    int next = 0;
    for (bool d : drop) specs.push_back(d ? DimSpec::Replicated() : want->spec(next++));
    return {want->WithSpecs(specs)};
  }

  // A dropped axis has size 1, so sharding it leaves some devices an empty block that
  // cannot be squeezed: it is gathered first. [y,x] of squeeze([1,3], 0) -> [*,x] -> [x]
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& given = ctx.layout(0);
    TFD_ASSIGN_OR_RETURN(std::vector<bool> drop, Dropped(ctx));
    std::vector<DimSpec> in, out;
    for (int d = 0; d < given.rank(); ++d) {
      in.push_back(drop[d] ? DimSpec::Replicated() : given.spec(d));
      if (!drop[d]) out.push_back(given.spec(d));
    }
    Plan plan;
    plan.inputs = {given.WithSpecs(in)};
    plan.outputs = {given.WithSpecs(out)};
    // Without squeeze_dims each device would drop the size-1 axes of its own block (one
    // row of an uneven shard: [1,3] as [*,x] has blocks [1,2] and [1,1]), so the local op
    // is told the global op's axes; with none to drop it is an Identity (Expand).
    if (ctx.attrs->GetIntList("squeeze_dims").empty()) {
      std::vector<int64_t> axes;
      for (int d = 0; d < given.rank(); ++d) {
        if (drop[d]) axes.push_back(d);
      }
      if (!axes.empty()) plan.overrides.push_back(AttrOverride::IntList("squeeze_dims", axes));
    }
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<bool> drop, Dropped(ctx));
    if (std::find(drop.begin(), drop.end(), true) != drop.end()) {
      return ExpandDefault(ctx, plan, builder);
    }
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    LocalOpOptions identity;
    identity.copy_attrs = false;
    identity.overrides = {AttrOverride::Type("T", ctx.inputs[0].dtype)};
    return builder.LocalOp("Identity", inputs, identity, plan.outputs);
  }
};

// The plan of an op whose input 1 is its output's global shape (Reshape, BroadcastTo):
// the input relaid out to `in`, the output in `out`, and the shape made local.
StatusOr<Plan> ShapedPlan(const OpContext& ctx, const Layout& in, const Layout& out,
                          const std::vector<int64_t>& target) {
  Plan plan;
  plan.inputs = {in, std::nullopt};
  plan.outputs = {out};
  TFD_ASSIGN_OR_RETURN(plan.host_inputs[1],
                       out.UniformLocalShape(target, "the output of '" + ctx.op_name + "'"));
  return plan;
}

class ReshapeRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const std::vector<int64_t>& in_shape = ctx.inputs[0].shape;
    const bool shape_known = ctx.inputs.size() == 2 && ctx.inputs[1].int_value.has_value();
    const bool size_known =
        std::find(in_shape.begin(), in_shape.end(), int64_t{-1}) == in_shape.end();
    if ((!shape_known || !size_known) && ctx.inputs.size() == 2 &&
        ctx.inputs[1].shape.size() == 1 && ctx.inputs[1].shape[0] >= 0) {
      // A shape known only at run time (computed from a data-dependent size inside
      // tf.function, as the gradient of boolean_mask's gather does), or an input of such a
      // size (boolean_mask's, dynamic_partition's rows) reshaped to a given shape: the input
      // is gathered, every device reshapes it whole and the kernel checks the count.
      return Plan::Whole(ctx, static_cast<int>(ctx.inputs[1].shape[0]));
    }
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> target, ctx.IntValue(1, "shape"));
    const Layout& in = ctx.layout(0);
    int64_t total = std::accumulate(in_shape.begin(), in_shape.end(), int64_t{1},
                                    std::multiplies<int64_t>());
    // Resolve a -1 in the target shape.
    int64_t known = 1;
    int unknown = -1;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i] == -1) {
        unknown = static_cast<int>(i);
      } else {
        known *= target[i];
      }
    }
    if (unknown >= 0 && known > 0) target[unknown] = total / known;
    int64_t target_total = std::accumulate(target.begin(), target.end(), int64_t{1},
                                           std::multiplies<int64_t>());
    if (target_total != total) {
      return InvalidArgument("Cannot reshape " + ctx.Describe(0) + " to " + ShapeString(target) +
                             ": the element counts differ.");
    }
    // Walk both shapes in blocks of equal element count.
    std::vector<DimSpec> in_specs = in.specs();
    std::vector<DimSpec> out(target.size(), DimSpec::Replicated());
    size_t i = 0, j = 0;
    while (i < in_shape.size() || j < target.size()) {
      size_t i0 = i, j0 = j;
      int64_t a = i < in_shape.size() ? in_shape[i++] : 1;
      int64_t b = j < target.size() ? target[j++] : 1;
      while (a != b) {
        if (a < b && i < in_shape.size()) {
          a *= in_shape[i++];
        } else if (b < a && j < target.size()) {
          b *= target[j++];
        } else {
          break;
        }
      }
      // Only the leading input axis of a block may stay sharded, and only if the leading
      // output axis of the block divides evenly. Size-1 axes lead nothing: [1,4] [*,y] ->
      // [4] [y] and [4] [y] -> [1,4] [*,y], as gradients reshape to and from kept dims.
      size_t lead_in = i0, lead_out = j0;
      while (lead_in + 1 < i && in_shape[lead_in] == 1) ++lead_in;
      while (lead_out + 1 < j && target[lead_out] == 1) ++lead_out;
      for (size_t k = i0; k < i; ++k) {
        if (!in_specs[k].sharded()) continue;
        bool keeps = k == lead_in && lead_out < target.size() &&
                     target[lead_out] % in.NumShards(static_cast<int>(k)) == 0 &&
                     in_shape[k] % in.NumShards(static_cast<int>(k)) == 0 && a == b;
        if (keeps) {
          out[lead_out] = in_specs[k];
        } else {
          in_specs[k] = DimSpec::Replicated();
        }
      }
    }
    return ShapedPlan(ctx, in.WithSpecs(in_specs), in.WithSpecs(out), target);
  }

  // The request projected onto the axes the input spans (right-aligned):
  //   want [x,y] of broadcast_to([8] -> [4,8]) -> [y]
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    std::vector<std::optional<Layout>> out(ctx.inputs.size());
    if (ctx.inputs.size() < 2 || !ctx.inputs[1].int_value) return out;
    const std::vector<int64_t>& target = *ctx.inputs[1].int_value;
    const Layout* want = UsableRequest(ctx, requested, 0, static_cast<int>(target.size()));
    if (!want || ctx.inputs[0].shape.size() > target.size()) return out;
    out[0] = want->WithSpecs(ProjectBroadcast(want->specs(), ctx.inputs[0].shape, target));
    return out;
  }
};

// Ops whose outputs are small integer vectors computed from their (host) integer inputs:
// the values are computed here and broadcast, with no per-device work. An input that is
// sharded (or not an integer constant) is gathered and the op runs on every device.
class IntFunctionRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    for (const InputInfo& in : ctx.inputs) {
      bool sharded = in.layout && !in.layout->IsFullyReplicated();
      plan.inputs.push_back(sharded ? std::optional<Layout>(Layout::Replicated(
                                          ctx.mesh, static_cast<int>(in.shape.size())))
                                    : std::nullopt);
    }
    plan.outputs.assign(NumOutputs(ctx), Layout::Replicated(ctx.mesh, 1));
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    std::vector<std::vector<int64_t>> values;
    for (const InputInfo& in : ctx.inputs) {
      if (!in.int_value) return ExpandDefault(ctx, plan, builder);
      values.push_back(*in.int_value);
    }
    TFD_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> results, Compute(ctx, values));
    const int dtype = OutputDtype(ctx);
    std::vector<ValueId> outputs;
    for (const std::vector<int64_t>& r : results) {
      TFD_ASSIGN_OR_RETURN(ValueId host,
                           builder.HostConstant(r, {static_cast<int64_t>(r.size())}, dtype));
      TFD_ASSIGN_OR_RETURN(ValueId out, builder.Broadcast(host, ctx.mesh));
      outputs.push_back(out);
    }
    return outputs;
  }

 protected:
  virtual int NumOutputs(const OpContext& ctx) const = 0;
  // The outputs' dtype: T, or the first input's.
  virtual int OutputDtype(const OpContext& ctx) const {
    return ctx.attrs->GetType("T").value_or(ctx.inputs[0].dtype);
  }
  virtual StatusOr<std::vector<std::vector<int64_t>>> Compute(
      const OpContext& ctx, const std::vector<std::vector<int64_t>>& inputs) const = 0;
};

// The axes along which each operand of a broadcasting binary op was broadcast, which its
// gradient sums over: [8,4] vs [4] -> r0 = [], r1 = [0]. Matches TensorFlow's BCast: equal
// shapes give no axes; otherwise each operand reduces every (left-padded) axis where it
// has size 1.
class BroadcastGradientArgsRule : public IntFunctionRule {
 protected:
  int NumOutputs(const OpContext&) const override { return 2; }
  StatusOr<std::vector<std::vector<int64_t>>> Compute(
      const OpContext& ctx, const std::vector<std::vector<int64_t>>& shapes) const override {
    if (shapes.size() != 2) return InvalidArgument("BroadcastGradientArgs takes two shapes.");
    std::vector<std::vector<int64_t>> axes(2);
    if (shapes[0] == shapes[1]) return axes;
    TFD_RETURN_IF_ERROR(BroadcastShapes(shapes, ctx.op_name).status());
    const size_t rank = std::max(shapes[0].size(), shapes[1].size());
    for (int k = 0; k < 2; ++k) {
      const size_t offset = rank - shapes[k].size();
      for (size_t d = 0; d < rank; ++d) {
        if (d < offset || shapes[k][d - offset] == 1) axes[k].push_back(static_cast<int64_t>(d));
      }
    }
    return axes;
  }
};

// ConcatOffset(axis, shape_0..shape_N-1): where each input of a concat starts in its
// output, which the gradient of a concat slices with. TF folds it where the shapes are
// known when tracing; a function traced with sizes known only at run time keeps it:
// axis 1, shapes [2, 3] [2, 5] -> offsets [0, 0] [0, 3]. The shapes are global, so the
// offsets are too.
class ConcatOffsetRule : public IntFunctionRule {
 protected:
  int NumOutputs(const OpContext& ctx) const override {
    return std::max(0, static_cast<int>(ctx.inputs.size()) - 1);
  }
  int OutputDtype(const OpContext& ctx) const override {
    return ctx.attrs->GetType("shape_type")
        .value_or(ctx.inputs.size() > 1 ? ctx.inputs[1].dtype : ctx.inputs[0].dtype);
  }
  StatusOr<std::vector<std::vector<int64_t>>> Compute(
      const OpContext& ctx, const std::vector<std::vector<int64_t>>& inputs) const override {
    if (inputs.size() < 2 || inputs[0].size() != 1) {
      return InvalidArgument("ConcatOffset takes a scalar axis and one shape per input; got " +
                             std::to_string(inputs.size()) + " inputs.");
    }
    const std::vector<int64_t>& first = inputs[1];
    const int64_t rank = static_cast<int64_t>(first.size());
    const int64_t axis = inputs[0][0] < 0 ? inputs[0][0] + rank : inputs[0][0];
    if (axis < 0 || axis >= rank) {
      return InvalidArgument("ConcatOffset axis " + std::to_string(inputs[0][0]) +
                             " is out of range for shapes of rank " + std::to_string(rank) + ".");
    }
    std::vector<std::vector<int64_t>> offsets;
    int64_t offset = 0;
    for (size_t i = 1; i < inputs.size(); ++i) {
      const std::vector<int64_t>& shape = inputs[i];
      bool agree = shape.size() == first.size();
      for (int64_t d = 0; agree && d < rank; ++d) agree = d == axis || shape[d] == first[d];
      if (!agree) {
        return InvalidArgument("ConcatOffset: shape " + std::to_string(i - 1) + " " +
                               ShapeString(shape) + " does not match shape 0 " +
                               ShapeString(first) + " off axis " + std::to_string(axis) + ".");
      }
      std::vector<int64_t> start(rank, 0);
      start[axis] = offset;
      offsets.push_back(start);
      offset += shape[axis];
    }
    return offsets;
  }
};

// DynamicStitch(indices_0..N-1, data_0..N-1): merged[indices_i[j]] = data_i[j], later
// inputs winning. TF's gradients of reductions over axes given as a tensor build the
// reduced shape with it (math_ops.reduced_shape): small integer vectors, computed here
// when their values are known, so that the Reshape reading the result plans with a known
// shape. Otherwise (data of other dtypes or with element axes, values known only at run
// time) the inputs are gathered and every device stitches the whole result.
class DynamicStitchRule : public IntFunctionRule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, IntFunctionRule::Forward(ctx));
    const int n = static_cast<int>(ctx.inputs.size()) / 2;
    if (n < 1 || 2 * n != static_cast<int>(ctx.inputs.size())) {
      return InvalidArgument("DynamicStitch takes N index tensors and N data tensors; got " +
                             std::to_string(ctx.inputs.size()) + " inputs.");
    }
    // Each data tensor is its indices' shape followed by the element shape.
    const int rank = 1 + ctx.rank(n) - ctx.rank(0);
    plan.outputs = {Layout::Replicated(ctx.mesh, std::max(rank, 1))};
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    const int n = static_cast<int>(ctx.inputs.size()) / 2;
    for (int i = 0; i < n; ++i) {
      // Values computed here only for scalar elements (data shaped as its indices).
      if (ctx.inputs[n + i].shape != ctx.inputs[i].shape) return ExpandDefault(ctx, plan, builder);
    }
    return IntFunctionRule::Expand(ctx, plan, builder);
  }

 protected:
  int NumOutputs(const OpContext&) const override { return 1; }
  StatusOr<std::vector<std::vector<int64_t>>> Compute(
      const OpContext& ctx, const std::vector<std::vector<int64_t>>& inputs) const override {
    const size_t n = inputs.size() / 2;
    int64_t size = 0;
    for (size_t i = 0; i < n; ++i) {
      for (int64_t index : inputs[i]) {
        if (index < 0) {
          return InvalidArgument("DynamicStitch got the negative index " +
                                 std::to_string(index) + " in indices " + std::to_string(i) +
                                 " (" + ShapeString(inputs[i]) + ").");
        }
        size = std::max(size, index + 1);
      }
    }
    std::vector<int64_t> merged(size, 0);  // an index no input gives is 0, as TF's kernel
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < inputs[i].size(); ++j) merged[inputs[i][j]] = inputs[n + i][j];
    }
    return std::vector<std::vector<int64_t>>{merged};
  }
};

class InvertPermutationRule : public IntFunctionRule {
 protected:
  int NumOutputs(const OpContext&) const override { return 1; }
  StatusOr<std::vector<std::vector<int64_t>>> Compute(
      const OpContext& ctx, const std::vector<std::vector<int64_t>>& inputs) const override {
    const std::vector<int64_t>& perm = inputs[0];
    std::vector<int64_t> inverse(perm.size(), -1);
    for (size_t i = 0; i < perm.size(); ++i) {
      int64_t p = perm[i];
      if (p < 0 || p >= static_cast<int64_t>(perm.size()) || inverse[p] >= 0) {
        return InvalidArgument("InvertPermutation got " + ShapeString(perm) +
                               ", which is not a permutation of 0.." +
                               std::to_string(static_cast<int64_t>(perm.size()) - 1) + ".");
      }
      inverse[p] = static_cast<int64_t>(i);
    }
    return std::vector<std::vector<int64_t>>{inverse};
  }
};

// BroadcastTo(input, shape): axes the input spans keep their sharding; broadcast axes are
// unsharded unless the requested layout shards them, which costs nothing (each device
// broadcasts to its own block).
class BroadcastToRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    if (ctx.inputs.size() == 2 && !ctx.inputs[1].int_value &&
        ctx.inputs[1].shape.size() == 1 && ctx.inputs[1].shape[0] >= 0) {
      // A shape known only at run time: the gradient of a sum or mean over a batch of
      // unknown size (a tf.function traced for a `None` batch, as Keras' fit traces its
      // step) broadcasts to `tf.shape(x)`. Every device broadcasts the gathered input to
      // the global shape: [*,y] to shape(x) -> [*,*], as Reshape does with such a shape.
      return Plan::Whole(ctx, static_cast<int>(ctx.inputs[1].shape[0]));
    }
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> target, ctx.IntValue(1, "shape"));
    const Layout& in = ctx.layout(0);
    const std::vector<int64_t>& in_shape = ctx.inputs[0].shape;
    const int rank = static_cast<int>(target.size());
    const int offset = rank - in.rank();
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> merged,
                         BroadcastShapes({in_shape, target}, ctx.op_name));
    if (offset < 0 || merged != target) {
      return InvalidArgument("Cannot broadcast " + ctx.Describe(0) + " to " +
                             ShapeString(target) + ".");
    }
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    std::vector<DimSpec> in_specs = in.specs();
    std::vector<DimSpec> out(rank, DimSpec::Replicated());
    std::vector<bool> broadcast(rank, true);
    for (int i = 0; i < in.rank(); ++i) {
      if (in_shape[i] != target[offset + i]) {
        in_specs[i] = DimSpec::Replicated();
        continue;
      }
      broadcast[offset + i] = false;
      // The shape argument becomes one local shape for every device, so an unevenly
      // sharded axis is gathered first: [x] of broadcast_to([4] -> [4]) on x=8 -> [*].
      if (in_specs[i].sharded() && in_shape[i] % ctx.mesh.DimSize(in_specs[i].mesh_dim) != 0) {
        in_specs[i] = DimSpec::Replicated();
      }
      out[offset + i] = in_specs[i];
      if (in_specs[i].sharded()) used[in_specs[i].mesh_dim] = true;
    }
    if (ctx.requested && ctx.requested->rank() == rank && ctx.requested->mesh() == ctx.mesh) {
      for (int d = 0; d < rank; ++d) {
        const DimSpec& want = ctx.requested->spec(d);
        if (!broadcast[d] || !want.sharded() || used[want.mesh_dim] ||
            target[d] % ctx.mesh.DimSize(want.mesh_dim) != 0) {
          continue;
        }
        out[d] = want;
        used[want.mesh_dim] = true;
      }
    }
    return ShapedPlan(ctx, in.WithSpecs(in_specs), in.WithSpecs(out), target);
  }

  // The request projected onto the axes the input spans (right-aligned):
  //   want [x,y] of broadcast_to([8] -> [4,8]) -> [y]
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    std::vector<std::optional<Layout>> out(ctx.inputs.size());
    if (ctx.inputs.size() < 2 || !ctx.inputs[1].int_value) return out;
    const std::vector<int64_t>& target = *ctx.inputs[1].int_value;
    const Layout* want = UsableRequest(ctx, requested, 0, static_cast<int>(target.size()));
    if (!want || ctx.inputs[0].shape.size() > target.size()) return out;
    out[0] = want->WithSpecs(ProjectBroadcast(want->specs(), ctx.inputs[0].shape, target));
    return out;
  }
};

// Tile(input, multiples): an axis tiled once keeps its sharding; an axis tiled more than
// once needs replication ([a0 a1] tiled twice is [a0 a1 a0 a1], not blocks).
// Multiples known only at run time (from a data-dependent size inside tf.function, as the
// gradient of a sum over boolean_mask's rows has) gather every axis.
StatusOr<FactorSpec> TileFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  std::vector<int64_t> multiples(rank, 0);
  const bool run_time = ctx.inputs.size() == 2 && !ctx.inputs[1].int_value &&
                        ctx.inputs[1].shape == std::vector<int64_t>{rank};
  if (!run_time) {
    TFD_ASSIGN_OR_RETURN(multiples, ctx.IntValue(1, "multiples"));
  }
  if (static_cast<int>(multiples.size()) != rank) {
    return InvalidArgument("Tile multiples " + ShapeString(multiples) + " do not match " +
                           ctx.Describe(0) + ": give one multiple per axis.");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  for (int d = 0; d < rank; ++d) {
    if (multiples[d] != 1) spec.factors[axes[d]] = FactorKind::kNeedReplication;
  }
  spec.inputs = {axes, std::nullopt};
  spec.outputs = {axes};
  return spec;
}

const bool kRegistered = RegisterRules({
    {"BroadcastGradientArgs", std::make_shared<BroadcastGradientArgsRule>(),
     Traits().AllHost(HostValue::kShape)},
    {"BroadcastTo", std::make_shared<BroadcastToRule>(),
     Traits().Host(1, HostValue::kShape).ReadsRequest()},
    {"ConcatOffset", std::make_shared<ConcatOffsetRule>(),
     Traits().Host(0, HostValue::kAxis).Host(1, -1, HostValue::kShape)},
    {"DynamicStitch", std::make_shared<DynamicStitchRule>(),
     Traits().AllHost(HostValue::kValue)},
    {"ExpandDims", Factors(ExpandDimsFactors),
     Traits().Linear(Linearity::kStructural).Host(1, HostValue::kAxis)},
    {"InvertPermutation", std::make_shared<InvertPermutationRule>(),
     Traits().AllHost(HostValue::kPermutation)},
    {"ParallelDynamicStitch", std::make_shared<DynamicStitchRule>(),
     Traits().AllHost(HostValue::kValue)},
    {"Rank", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kRank)},
    {"Reshape", std::make_shared<ReshapeRule>(),
     Traits().Linear(Linearity::kStructural).Host(1, HostValue::kShape)},
    {"Shape", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kShape)},
    {"ShapeN", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kShapeN)},
    {"Size", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kSize)},
    {"Squeeze", std::make_shared<SqueezeRule>(), Traits().Linear(Linearity::kStructural)},
    {"Tile", Factors(TileFactors), Traits().Host(1, HostValue::kMultiples)},
    {"Transpose", Factors(TransposeFactors),
     Traits().Linear(Linearity::kStructural).Host(1, HostValue::kPermutation)},
});

}  // namespace
}  // namespace tf_dtensor
