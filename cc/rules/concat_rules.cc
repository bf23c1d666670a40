// Joining and splitting tensors along an axis.
//   concat([x,*], [x,*], axis=1) -> [x,*]          (the other axes keep their sharding)
//   concat([x,*], [*,y], axis=0) -> gather axis 0 -> [*,y]
//   stack([x,*], [x,*], axis=0) -> [*,x,*]          (the new axis is unsharded)
//   unstack([x,y], axis=1) -> gather y -> [x], [x], ...
//   split([x,y], 2, axis=1) -> gather y -> [x,*], [x,*]
// The joined or split axis is gathered if sharded (a need-replication factor, factor.h):
// its pieces do not line up with the shards.
#include <numeric>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// Each value's axes are shared factors; `axis` (joined or split) needs replication.
// Inputs disagreeing on another axis follow the first input that shards it.
FactorSpec AlignedFactors(int rank, int axis) {
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  if (axis >= 0) spec.factors[axes[axis]] = FactorKind::kNeedReplication;
  return spec;
}

// ConcatV2(values..., axis) and Concat(axis, values...).
StatusOr<FactorSpec> ConcatFactors(const OpContext& ctx, bool axis_first) {
  const int n = static_cast<int>(ctx.inputs.size()) - 1;
  const int first = axis_first ? 1 : 0;
  const int axis_input = axis_first ? 0 : n;
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
  FactorSpec spec = AlignedFactors(rank, a);
  std::vector<int> axes(rank);
  std::iota(axes.begin(), axes.end(), 0);
  spec.inputs.assign(ctx.inputs.size(), axes);
  spec.inputs[axis_input] = std::nullopt;
  spec.outputs = {axes};
  return spec;
}

StatusOr<FactorSpec> ConcatV2Factors(const OpContext& ctx) { return ConcatFactors(ctx, false); }
StatusOr<FactorSpec> ConcatV1Factors(const OpContext& ctx) { return ConcatFactors(ctx, true); }

// Pack(values..., axis=a): values of one shape stacked along a new (unsharded) axis a.
StatusOr<FactorSpec> PackFactors(const OpContext& ctx) {
  const int n = static_cast<int>(ctx.inputs.size());
  if (n < 1) return InvalidArgument("'Pack' needs at least one value.");
  const int rank = ctx.rank(0);
  TFD_ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.attrs->GetInt("axis", 0), rank + 1, 0));
  FactorSpec spec = AlignedFactors(rank, -1);
  std::vector<int> axes(rank);
  std::iota(axes.begin(), axes.end(), 0);
  spec.inputs.assign(n, axes);
  axes.insert(axes.begin() + axis, FactorSpec::kNew);
  spec.outputs = {axes};
  return spec;
}

// Unpack(value, num, axis=a): `num` values, each without axis a.
StatusOr<FactorSpec> UnpackFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  TFD_ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.attrs->GetInt("axis", 0), rank, 0));
  FactorSpec spec = AlignedFactors(rank, axis);
  std::vector<int> axes(rank);
  std::iota(axes.begin(), axes.end(), 0);
  spec.inputs = {axes};
  axes.erase(axes.begin() + axis);
  spec.outputs.assign(ctx.attrs->GetInt("num", ctx.inputs[0].shape[axis]), axes);
  return spec;
}

// Split(axis, value, num_split) and SplitV(value, size_splits, axis, num_split).
StatusOr<FactorSpec> SplitFactors(const OpContext& ctx, bool sizes) {
  const int value = sizes ? 0 : 1;
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(sizes ? 2 : 0, "axis"));
  if (axis.size() != 1) {
    return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis; got " +
                           ShapeString(axis) + ".");
  }
  const int rank = ctx.rank(value);
  TFD_ASSIGN_OR_RETURN(int a, NormalizeAxis(ctx, axis[0], rank, value));
  FactorSpec spec = AlignedFactors(rank, a);
  std::vector<int> axes(rank);
  std::iota(axes.begin(), axes.end(), 0);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[value] = axes;
  spec.outputs.assign(ctx.attrs->GetInt("num_split", ctx.num_outputs), axes);
  return spec;
}

StatusOr<FactorSpec> SplitV1Factors(const OpContext& ctx) { return SplitFactors(ctx, false); }
StatusOr<FactorSpec> SplitVFactors(const OpContext& ctx) { return SplitFactors(ctx, true); }

const bool kRegistered = RegisterRules({
    {"Concat", Factors(ConcatV1Factors), Traits().Host(0, HostValue::kAxis)},
    {"ConcatV2", Factors(ConcatV2Factors), Traits().Host(-1, HostValue::kAxis)},
    {"Pack", Factors(PackFactors)},
    {"Split", Factors(SplitV1Factors), Traits().Host(0, HostValue::kAxis)},
    {"SplitV", Factors(SplitVFactors),
     Traits().Host(1, HostValue::kShape).Host(2, HostValue::kAxis)},
    {"Unpack", Factors(UnpackFactors)},
});

}  // namespace
}  // namespace tf_dtensor
