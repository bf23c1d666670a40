// Ops whose output shape depends on the values: Where (indices of true elements) and
// Unique. Their input is gathered and every device computes the whole result, which is
// replicated:
//   where(cond [x,y] of [5, 6]) -> gather -> indices [*,*] of [n, 2]
//   unique(x [x] of [N]) -> gather -> y [*] of [u], idx [*] of [N]
// Why not local indices shifted by each block's offset, concatenated? The row count of
// every block would then be data-dependent as well, and each later op on those rows
// (a relayout, a gather) would have to exchange block sizes at run time. The inputs are
// conditions and index vectors, small next to the tensors they select from, and what
// follows (boolean_mask's GatherV2) reads whole rows anyway. A layout asked of the result
// (call_with_layout, relayout) slices the rows afterwards; inside tf.function the piece
// sizes are then computed at run time (ComponentBuilder::DynamicPieceSizes) and the
// result's global shape is read from its components when the function returns.
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// Every input axis of data input `data` needs replication; `outputs` outputs, each of
// the given rank, are new (unsharded). Other inputs (Unique's axis) are host arguments.
FactorSpec GatheredFactors(const OpContext& ctx, int data, const std::vector<int>& out_ranks) {
  FactorSpec spec;
  std::vector<int> axes;
  for (int d = 0; d < ctx.rank(data); ++d) axes.push_back(spec.Add(FactorKind::kNeedReplication));
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[data] = axes;
  for (int rank : out_ranks) spec.outputs.push_back(std::vector<int>(rank, FactorSpec::kNew));
  return spec;
}

// Where(condition) -> int64 [n, rank]: n is data-dependent.
StatusOr<FactorSpec> WhereFactors(const OpContext& ctx) {
  if (ctx.inputs.size() != 1) {
    return InvalidArgument("'Where' takes one condition; got " + ctx.DescribeInputs() +
                           ". (tf.where(c, x, y) runs as SelectV2.)");
  }
  return GatheredFactors(ctx, 0, {2});
}

// Unique(x [N]) -> y [u], idx [N]; UniqueWithCounts adds count [u]. The V2 ops take an
// axis (a host argument): y keeps x's rank, idx and count are vectors.
StatusOr<FactorSpec> UniqueFactors(const OpContext& ctx, int num_outputs) {
  const int rank = ctx.rank(0);
  if (rank < 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs an input of rank 1 or more; got " +
                           ctx.Describe(0) + ".");
  }
  std::vector<int> ranks = {rank, 1};
  if (num_outputs == 3) ranks.push_back(1);
  return GatheredFactors(ctx, 0, ranks);
}

std::shared_ptr<const Rule> Unique(int num_outputs) {
  return Factors([=](const OpContext& ctx) { return UniqueFactors(ctx, num_outputs); });
}

const bool kRegistered = RegisterRules({
    {"Unique", Unique(2)},
    {"UniqueV2", Unique(2), Traits().Host(1, HostValue::kAxis)},
    {"UniqueWithCounts", Unique(3)},
    {"UniqueWithCountsV2", Unique(3), Traits().Host(1, HostValue::kAxis)},
    {"Where", Factors(WhereFactors)},
});

}  // namespace
}  // namespace tf_dtensor
