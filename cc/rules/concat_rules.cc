// Joining and splitting tensors along an axis.
//   concat([x,*], [x,*], axis=1) -> [x,*]          (the other axes keep their sharding)
//   concat([x,*], [*,y], axis=0) -> gather axis 0 -> [*,y]
//   stack([x,*], [x,*], axis=0) -> [*,x,*]          (the new axis is unsharded)
//   unstack([x,y], axis=1) -> gather y -> [x], [x], ...
//   split([x,y], 2, axis=1) -> gather y -> [x,*], [x,*]
// The joined or split axis is gathered if sharded: its pieces do not line up with the
// shards. Inputs disagreeing on another axis follow the first input that shards it.
#include "cc/core/strings.h"
#include "cc/propagation/merge.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// `axis` in [-rank, rank) as a non-negative axis, or an error naming the op.
StatusOr<int> NormalizeAxis(const OpContext& ctx, int64_t axis, int rank, int input) {
  if (axis < -rank || axis >= rank) {
    return InvalidArgument("'" + ctx.op_name + "' axis " + std::to_string(axis) +
                           " is out of range for " + ctx.Describe(input) + " (rank " +
                           std::to_string(rank) + ").");
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// Values `first` .. `first + count - 1` of equal rank, merged with `axis` unsharded; each
// runs with the merged specs and the output takes them too.
Plan MergedPlan(const OpContext& ctx, int first, int count, int axis) {
  const int rank = ctx.rank(first);
  std::vector<const Layout*> layouts;
  for (int i = first; i < first + count; ++i) layouts.push_back(&ctx.layout(i));
  std::vector<bool> unsharded(rank, false);
  if (axis >= 0) unsharded[axis] = true;
  std::vector<bool> used(ctx.mesh.num_dims(), false);
  Layout merged = ctx.layout(first).WithSpecs(MergeAligned(layouts, rank, unsharded, &used));
  Plan plan;
  plan.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (int i = first; i < first + count; ++i) plan.inputs[i] = merged;
  plan.outputs = {merged};
  return plan;
}

// ConcatV2(values..., axis) and Concat(axis, values...).
class ConcatRule : public Rule {
 public:
  explicit ConcatRule(bool axis_first) : axis_first_(axis_first) {}

  bool IsHostArgument(int input, int num_inputs) const override {
    return input == (axis_first_ ? 0 : num_inputs - 1);
  }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const int n = static_cast<int>(ctx.inputs.size()) - 1;
    const int first = axis_first_ ? 1 : 0;
    const int axis_input = axis_first_ ? 0 : n;
    if (n < 1) return InvalidArgument("'" + ctx.op_name + "' needs at least one value.");
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(axis_input, "axis"));
    if (axis.size() != 1) {
      return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis; got " +
                             ShapeString(axis) + ".");
    }
    const int rank = ctx.rank(first);
    for (int i = first; i < first + n; ++i) {
      if (ctx.rank(i) != rank) {
        return InvalidArgument("'" + ctx.op_name + "' joins values of one rank; got " +
                               ctx.Describe(first) + " and " + ctx.Describe(i) + ".");
      }
    }
    TFD_ASSIGN_OR_RETURN(int a, NormalizeAxis(ctx, axis[0], rank, first));
    return MergedPlan(ctx, first, n, a);
  }

 private:
  bool axis_first_;
};

// Pack(values..., axis=a): values of one shape stacked along a new axis a.
class PackRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const int n = static_cast<int>(ctx.inputs.size());
    if (n < 1) return InvalidArgument("'Pack' needs at least one value.");
    const int rank = ctx.rank(0);
    TFD_ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.attrs->GetInt("axis", 0), rank + 1, 0));
    Plan plan = MergedPlan(ctx, 0, n, -1);
    std::vector<DimSpec> out = plan.outputs[0].specs();
    out.insert(out.begin() + axis, DimSpec::Replicated());
    plan.outputs = {plan.outputs[0].WithSpecs(out)};
    return plan;
  }
};

// Unpack(value, num, axis=a): `num` values, each without axis a.
class UnpackRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& in = ctx.layout(0);
    TFD_ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.attrs->GetInt("axis", 0), in.rank(), 0));
    std::vector<DimSpec> specs = in.specs();
    specs[axis] = DimSpec::Replicated();
    std::vector<DimSpec> out = specs;
    out.erase(out.begin() + axis);
    Plan plan;
    plan.inputs = {in.WithSpecs(specs)};
    int64_t num = ctx.attrs->GetInt("num", ctx.inputs[0].shape[axis]);
    plan.outputs.assign(num, in.WithSpecs(out));
    return plan;
  }
};

// Split(axis, value, num_split) and SplitV(value, size_splits, axis, num_split).
class SplitRule : public Rule {
 public:
  explicit SplitRule(bool sizes) : sizes_(sizes) {}

  bool IsHostArgument(int input, int) const override {
    return sizes_ ? input == 1 || input == 2 : input == 0;
  }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const int value = sizes_ ? 0 : 1;
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(sizes_ ? 2 : 0, "axis"));
    if (axis.size() != 1) {
      return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis; got " +
                             ShapeString(axis) + ".");
    }
    const Layout& in = ctx.layout(value);
    TFD_ASSIGN_OR_RETURN(int a, NormalizeAxis(ctx, axis[0], in.rank(), value));
    std::vector<DimSpec> specs = in.specs();
    specs[a] = DimSpec::Replicated();
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    plan.inputs[value] = in.WithSpecs(specs);
    plan.outputs.assign(ctx.attrs->GetInt("num_split", ctx.num_outputs), in.WithSpecs(specs));
    return plan;
  }

 private:
  bool sizes_;
};

const bool kRegistered = RegisterRules({
    {"Concat", std::make_shared<ConcatRule>(/*axis_first=*/true)},
    {"ConcatV2", std::make_shared<ConcatRule>(/*axis_first=*/false)},
    {"Pack", std::make_shared<PackRule>()},
    {"Split", std::make_shared<SplitRule>(/*sizes=*/false)},
    {"SplitV", std::make_shared<SplitRule>(/*sizes=*/true)},
    {"Unpack", std::make_shared<UnpackRule>()},
});

}  // namespace
}  // namespace tf_dtensor
