// Ops that count values into bins: HistogramFixedWidth and DenseBincount. Each device
// counts the values of its own block into every bin, and the counts of the blocks add:
//   histogram_fixed_width(values [x,y] of [8, 6], range, nbins=4)
//     -> local counts [*] of [4] on every device -> partial(x,y) -> all-reduce -> [*]
//   dense_bincount(input [x] of [N], size=5) -> partial(x) [*] of [5]
//   dense_bincount(input [x,y] of [B, N], size=5) -> batch rows stay: partial(y) [x,*]
// A count of int32 (or a weight's dtype) adds exactly in any order, so the pending sum is
// left to the all-reduce (or, inside tf.function, to whoever reads it). With
// binary_output every count is 0 or 1 (whether a value occurs at all): the blocks'
// answers combine with max, not sum: partial(x:max).
// The bins (nbins, size) are new output axes, unsharded; value_range is read whole.
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// HistogramFixedWidth(values [...], value_range [2], nbins) -> counts [nbins].
StatusOr<FactorSpec> HistogramFactors(const OpContext& ctx) {
  if (ctx.inputs.size() != 3 || ctx.rank(1) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' takes values, a value_range of shape [2] " +
                           "and nbins; got " + ctx.DescribeInputs() + ".");
  }
  FactorSpec spec;
  std::vector<int> values;
  for (int d = 0; d < ctx.rank(0); ++d) values.push_back(spec.Add(FactorKind::kContracted));
  const int range = spec.Add(FactorKind::kNeedReplication);
  spec.inputs = {values, std::vector<int>{range}, std::nullopt};
  spec.outputs = {{FactorSpec::kNew}};
  return spec;
}

// DenseBincount(input [N] or [B, N], size, weights (input's shape, or [0]), binary_output)
// -> [size] or [B, size]. The counted axis is contracted; a batch axis passes through.
StatusOr<FactorSpec> BincountFactors(const OpContext& ctx) {
  const int rank = ctx.inputs.size() == 3 ? ctx.rank(0) : -1;
  if (rank != 1 && rank != 2) {
    return InvalidArgument("'" + ctx.op_name + "' takes an input of rank 1 or 2, a size and " +
                           "weights; got " + ctx.DescribeInputs() + ".");
  }
  FactorSpec spec;
  std::vector<int> input;
  if (rank == 2) input.push_back(spec.Add(FactorKind::kPassThrough));
  input.push_back(spec.Add(FactorKind::kContracted));
  // Weights are the input's shape (each value's weight, laid out as the value), or empty
  // (count ones): an empty vector is read whole.
  std::vector<int> weights = input;
  if (ctx.inputs[2].shape != ctx.inputs[0].shape) {
    if (ctx.rank(2) != 1 || ctx.inputs[2].shape[0] != 0) {
      return InvalidArgument("'" + ctx.op_name + "' needs weights of its input's shape or " +
                             "of shape [0]; got " + ctx.Describe(2) + " for " +
                             ctx.Describe(0) + ".");
    }
    weights = {spec.Add(FactorKind::kNeedReplication)};
  }
  spec.inputs = {input, std::nullopt, weights};
  spec.outputs = {rank == 2 ? std::vector<int>{input[0], FactorSpec::kNew}
                            : std::vector<int>{FactorSpec::kNew}};
  if (ctx.attrs->GetBool("binary_output", false)) spec.reduce = ReduceOp::kMax;
  return spec;
}

const bool kRegistered = RegisterRules({
    {"DenseBincount", Factors(BincountFactors), Traits().Host(1, HostValue::kCount)},
    {"HistogramFixedWidth", Factors(HistogramFactors), Traits().Host(2, HostValue::kCount)},
});

}  // namespace
}  // namespace tf_dtensor
