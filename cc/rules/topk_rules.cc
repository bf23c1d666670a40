// Top-k over the last axis: batch-parallel over the leading axes, the ranked axis whole.
//   top_k([x,y] of [B, N], k) -> values [x,*] [B, k], indices [x,*]     (y is gathered)
//   in_top_k(predictions [x,*] [B, C], targets [x] [B], k) -> [x]
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// TopKV2(input [..., n], k) -> values, indices [..., k]: leading axes pass through, the
// ranked axis needs replication and the outputs' last axis is new.
StatusOr<FactorSpec> TopKFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  if (rank < 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs an input of rank 1 or more; got " +
                           ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.factors[axes.back()] = FactorKind::kNeedReplication;
  std::vector<int> out(axes.begin(), axes.end() - 1);
  out.push_back(FactorSpec::kNew);
  spec.inputs = {axes, std::nullopt};
  spec.outputs = {out, out};
  return spec;
}

// InTopKV2(predictions [B, C], targets [B], k) -> [B]: the batch axis shared by both
// inputs passes through, the class axis needs replication.
StatusOr<FactorSpec> InTopKFactors(const OpContext& ctx) {
  if (ctx.inputs.size() != 3 || ctx.rank(0) != 2 || ctx.rank(1) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' takes predictions of rank 2 and targets of "
                           "rank 1; got " + ctx.DescribeInputs() + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(2);
  spec.factors[axes[1]] = FactorKind::kNeedReplication;
  spec.inputs = {axes, std::vector<int>{axes[0]}, std::nullopt};
  spec.outputs = {{axes[0]}};
  return spec;
}


const bool kRegistered = RegisterRules({
    {"InTopKV2", Factors(InTopKFactors), Traits().Host(2, HostValue::kCount)},
    {"TopKV2", Factors(TopKFactors), Traits().Host(1, HostValue::kCount)},
});

}  // namespace
}  // namespace tf_dtensor
