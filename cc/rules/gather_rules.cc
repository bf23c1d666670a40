// Indexing with integer tensors: gathers, one-hot encodings and segment sums.
//   gather(params [V,D] [*,y], indices [B] [x]) -> [x,y]   (every device holds whole rows)
//   gather(params [x,*], ...) -> gather axis 0 of params first
//   one_hot(indices [x], depth) -> [x,*]                  (the new axis is unsharded)
//   unsorted_segment_sum(data [x,y], ids [x], n) -> partial(x) -> all-reduce -> [*,y]
// An index axis that would share a mesh dimension with a params axis is gathered (indices
// are small).
#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// GatherV2(params, indices, axis) with attribute batch_dims, and Gather(params, indices)
// (axis 0). Output: params[:axis] + indices[batch_dims:] + params[axis+1:]. The gathered
// axis needs replication (every device reads whole rows); the leading batch_dims axes are
// factors shared by params and indices. Priority: params' own axes, then the batch axes
// (params' sharding, else the indices'), then the other index axes where still free.
StatusOr<FactorSpec> GatherFactors(const OpContext& ctx, bool has_axis) {
  const int params_rank = ctx.rank(0);
  const int indices_rank = ctx.rank(1);
  int64_t axis = 0;
  if (has_axis) {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> value, ctx.IntValue(2, "axis"));
    if (value.size() != 1) return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis.");
    axis = value[0];
  }
  int64_t batch_dims = ctx.attrs->GetInt("batch_dims", 0);
  if (batch_dims < 0) batch_dims += indices_rank;
  if (axis < 0) axis += params_rank;
  if (axis < 0 || axis >= params_rank || batch_dims < 0 || batch_dims > axis ||
      batch_dims > indices_rank) {
    return InvalidArgument("'" + ctx.op_name + "' got axis " + std::to_string(axis) +
                           " and batch_dims " + std::to_string(batch_dims) + " for " +
                           ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  std::vector<int> params = spec.AddAxes(params_rank);
  spec.factors[params[axis]] = FactorKind::kNeedReplication;
  std::vector<int> indices(params.begin(), params.begin() + batch_dims);
  for (int d = static_cast<int>(batch_dims); d < indices_rank; ++d) {
    indices.push_back(spec.Add(FactorKind::kPassThrough));
  }
  for (int d = static_cast<int>(batch_dims); d < params_rank; ++d) spec.priority.push_back(d);
  for (int d = 0; d < batch_dims; ++d) spec.priority.push_back(d);
  for (int f = params_rank; f < static_cast<int>(spec.factors.size()); ++f) {
    spec.priority.push_back(f);
  }
  std::vector<int> out(params.begin(), params.begin() + axis);
  out.insert(out.end(), indices.begin() + batch_dims, indices.end());
  out.insert(out.end(), params.begin() + axis + 1, params.end());
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = params;
  spec.inputs[1] = indices;
  spec.outputs = {out};
  return spec;
}

StatusOr<FactorSpec> GatherV1Factors(const OpContext& ctx) { return GatherFactors(ctx, false); }
StatusOr<FactorSpec> GatherV2Factors(const OpContext& ctx) { return GatherFactors(ctx, true); }

// OneHot(indices, depth, on_value, off_value), attribute axis (-1: last): the indices'
// axes keep their sharding and the new axis is unsharded.
StatusOr<FactorSpec> OneHotFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  int64_t axis = ctx.attrs->GetInt("axis", -1);
  if (axis == -1) axis = rank;
  if (axis < 0 || axis > rank) {
    return InvalidArgument("'OneHot' axis " + std::to_string(axis) + " is out of range for " +
                           ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = axes;
  axes.insert(axes.begin() + axis, FactorSpec::kNew);
  spec.outputs = {axes};
  return spec;
}

// UnsortedSegmentSum/Max/Min/Prod(data, segment_ids, num_segments): the segment-id axes
// (data's leading axes, shared with the ids) are contracted: each device combines its own
// rows into partial segments, and the partials are all-reduced with `op`. Data's other
// axes keep their sharding and claim mesh dimensions first; the output's leading axis
// (the segments) is new.
template <ReduceOp op>
StatusOr<FactorSpec> SegmentReduceFactors(const OpContext& ctx) {
  const int k = ctx.rank(1);
  const int rank = ctx.rank(0);
  if (k > rank) {
    return InvalidArgument("'" + ctx.op_name + "' needs segment ids whose shape prefixes the "
                           "data's; got " + ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  std::vector<int> leading;
  for (int d = 0; d < k; ++d) leading.push_back(spec.Add(FactorKind::kContracted));
  std::vector<int> trailing = spec.AddAxes(rank - k);
  spec.priority = trailing;
  spec.priority.insert(spec.priority.end(), leading.begin(), leading.end());
  std::vector<int> data = leading;
  data.insert(data.end(), trailing.begin(), trailing.end());
  std::vector<int> out = {FactorSpec::kNew};
  out.insert(out.end(), trailing.begin(), trailing.end());
  spec.inputs = {data, leading, std::nullopt};
  spec.outputs = {out};
  spec.reduce = op;
  return spec;
}

bool ThirdInputIsHost(int input, int) { return input == 2; }

const bool kRegistered = RegisterRules({
    {"Gather", Factors(GatherV1Factors)},
    {"GatherV2", Factors(GatherV2Factors, ThirdInputIsHost)},
    {"OneHot", Factors(OneHotFactors, SecondInputIsHost)},
    {"UnsortedSegmentMax", Factors(SegmentReduceFactors<ReduceOp::kMax>, ThirdInputIsHost)},
    {"UnsortedSegmentMin", Factors(SegmentReduceFactors<ReduceOp::kMin>, ThirdInputIsHost)},
    {"UnsortedSegmentProd", Factors(SegmentReduceFactors<ReduceOp::kProd>, ThirdInputIsHost)},
    {"UnsortedSegmentSum", Factors(SegmentReduceFactors<ReduceOp::kSum>, ThirdInputIsHost)},
});

}  // namespace
}  // namespace tf_dtensor
