// Ops on a SparseTensor's components (indices [nnz, R], values [nnz], dense shape [R]) with
// a dense DTensor: `sp * x`, `sp / x`, `tf.sparse.add(sp, x)`, `tf.sparse.reduce_sum` and
// `reduce_max`, and `tf.sparse.add` of two SparseTensors whose components are DTensors.
// (SparseTensorDenseMatMul is a matrix product: matmul_rules.cc.)
//
// The nonzeros are one factor, shared by the indices' axis 0 and the values. The
// coordinates inside the indices are global positions in the dense shape, so a dense
// operand they index is read whole, and a dense result they write into is made whole:
//   sp([x,*] [x]) * dense [*,y] -> gather dense -> values [x]     (each device its nonzeros)
//   reduce_sum(sp([x,*] [x]), axis) -> partial(x) -> all-reduce -> [*,...]
//   sp([x,*] [x]) + dense [x,y] -> gather all -> [*,*]
// The dense shape (and reduce_sum's axes) are host values.
#include <set>

#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// The nonzeros and coordinates of input 0 (indices) and 1 (values), checked.
struct SparseOperand {
  int nonzeros = -1;
  int coordinates = -1;
};

StatusOr<SparseOperand> AddSparseOperand(const OpContext& ctx, FactorKind nonzeros,
                                         FactorSpec& spec) {
  if (ctx.inputs.size() < 3 || ctx.rank(0) != 2 || ctx.rank(1) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs a SparseTensor's indices of shape "
                           "[nnz, rank] and values of shape [nnz]; got " + ctx.Describe(0) +
                           " and " + ctx.Describe(1) + ".");
  }
  SparseOperand sparse{spec.Add(nonzeros), spec.Add(FactorKind::kNeedReplication)};
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = std::vector<int>{sparse.nonzeros, sparse.coordinates};
  spec.inputs[1] = std::vector<int>{sparse.nonzeros};
  return sparse;
}

// Factors read whole for each axis of input `input`.
std::vector<int> Whole(const OpContext& ctx, int input, FactorSpec& spec) {
  std::vector<int> axes;
  for (int d = 0; d < ctx.rank(input); ++d) axes.push_back(spec.Add(FactorKind::kNeedReplication));
  return axes;
}

// SparseDenseCwiseAdd/Mul/Div(sp_indices, sp_values, sp_shape, dense) -> values [nnz]: each
// nonzero combined with the dense entry at its position (dense broadcasts to sp_shape).
// The nonzeros pass through; the dense operand is read whole.
StatusOr<FactorSpec> SparseDenseCwiseFactors(const OpContext& ctx) {
  FactorSpec spec;
  TFD_ASSIGN_OR_RETURN(SparseOperand sparse,
                       AddSparseOperand(ctx, FactorKind::kPassThrough, spec));
  spec.inputs[3] = Whole(ctx, 3, spec);
  spec.outputs = {{sparse.nonzeros}};
  return spec;
}

// SparseTensorDenseAdd(a_indices, a_values, a_shape, b) -> b + a, dense of b's shape: a's
// nonzeros land anywhere in b, so b and the nonzeros are read whole, and the sum is made
// whole on every device (TF's DTensor has no rule for it).
StatusOr<FactorSpec> SparseTensorDenseAddFactors(const OpContext& ctx) {
  FactorSpec spec;
  TFD_RETURN_IF_ERROR(AddSparseOperand(ctx, FactorKind::kNeedReplication, spec).status());
  spec.inputs[3] = Whole(ctx, 3, spec);
  spec.outputs = {std::vector<int>(ctx.rank(3), FactorSpec::kNew)};
  return spec;
}

// SparseReduceSum/Max(input_indices, input_values, input_shape, reduction_axes) -> dense
// reductions over the axes (none given: none reduced, whatever TF's op doc says;
// tf.sparse.reduce_sum passes every axis for axis=None), kept as 1 with keep_dims.
StatusOr<FactorSpec> SparseReduceFactors(const OpContext& ctx, FactorKind nonzeros) {
  FactorSpec spec;
  TFD_RETURN_IF_ERROR(AddSparseOperand(ctx, nonzeros, spec).status());
  const int64_t rank = ctx.inputs[0].shape[1];
  if (rank < 0) {
    return InvalidArgument("'" + ctx.op_name + "' needs the rank of its SparseTensor (the "
                           "indices' axis 1) to plan; got " + ctx.Describe(0) + ".");
  }
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.IntValue(3, "reduction_axes"));
  std::set<int64_t> reduced;
  for (int64_t axis : axes) {
    if (axis < -rank || axis >= rank) {
      return InvalidArgument("'" + ctx.op_name + "' got reduction axis " +
                             std::to_string(axis) + " for a SparseTensor of rank " +
                             std::to_string(rank) + " (" + ctx.Describe(0) + "). Use axes in [" +
                             std::to_string(-rank) + ", " + std::to_string(rank) + ").");
    }
    reduced.insert(axis < 0 ? axis + rank : axis);
  }
  const int64_t out_rank = ctx.attrs->GetBool("keep_dims", false)
                               ? rank
                               : rank - static_cast<int64_t>(reduced.size());
  spec.outputs = {std::vector<int>(out_rank, FactorSpec::kNew)};
  return spec;
}

// SparseReduceSum: each device sums its own nonzeros, a partial sum over their mesh
// dimension.
StatusOr<FactorSpec> SparseReduceSumFactors(const OpContext& ctx) {
  return SparseReduceFactors(ctx, FactorKind::kContracted);
}

// SparseReduceMax: each device's nonzeros cannot be reduced alone: a position with no
// nonzero gives 0, not the lowest value, so a device without one for a position would give
// 0 where the others' maximum is negative. The nonzeros are read whole and every device
// reduces all of them.
StatusOr<FactorSpec> SparseReduceMaxFactors(const OpContext& ctx) {
  return SparseReduceFactors(ctx, FactorKind::kNeedReplication);
}

// SparseAdd(a_indices, a_values, a_shape, b_indices, b_values, b_shape, thresh) -> sum's
// indices [n, R], values [n], shape [R]: n depends on the values (entries whose sum is
// below thresh are dropped, shared positions merge), as Where's count does
// (data_dependent_rules.cc): both operands are read whole and every device computes the
// whole sum. SparseAddGrad(backprop_val_grad, a_indices, b_indices, sum_indices) -> the
// gradients of a's and b's values, likewise.
StatusOr<FactorSpec> SparseAddFactors(const OpContext& ctx) {
  if (ctx.inputs.size() != 7 || ctx.rank(0) != 2 || ctx.rank(1) != 1 || ctx.rank(3) != 2 ||
      ctx.rank(4) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs two SparseTensors' indices [nnz, rank] "
                           "and values [nnz], their shapes and a threshold; got " +
                           ctx.DescribeInputs() + ".");
  }
  FactorSpec spec;
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (int i : {0, 1, 3, 4, 6}) spec.inputs[i] = Whole(ctx, i, spec);
  spec.outputs = {{FactorSpec::kNew, FactorSpec::kNew}, {FactorSpec::kNew}, {FactorSpec::kNew}};
  return spec;
}

StatusOr<FactorSpec> SparseAddGradFactors(const OpContext& ctx) {
  if (ctx.inputs.size() != 4 || ctx.rank(0) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs the sum's value gradient [n] and the "
                           "indices of a, b and the sum; got " + ctx.DescribeInputs() + ".");
  }
  FactorSpec spec;
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (int i = 0; i < 4; ++i) spec.inputs[i] = Whole(ctx, i, spec);
  spec.outputs = {{FactorSpec::kNew}, {FactorSpec::kNew}};
  return spec;
}

const RuleTraits kDenseShape = Traits().Host(2, HostValue::kShape);

const bool kRegistered = RegisterRules({
    {"SparseDenseCwiseAdd", Factors(SparseDenseCwiseFactors), kDenseShape},
    {"SparseDenseCwiseDiv", Factors(SparseDenseCwiseFactors), kDenseShape},
    {"SparseDenseCwiseMul", Factors(SparseDenseCwiseFactors), kDenseShape},
    {"SparseAdd", Factors(SparseAddFactors),
     Traits().Host(2, HostValue::kShape).Host(5, HostValue::kShape)},
    {"SparseAddGrad", Factors(SparseAddGradFactors)},
    {"SparseReduceMax", Factors(SparseReduceMaxFactors),
     Traits().Host(2, HostValue::kShape).Host(3, HostValue::kAxis)},
    {"SparseReduceSum", Factors(SparseReduceSumFactors),
     Traits().Host(2, HostValue::kShape).Host(3, HostValue::kAxis)},
    {"SparseTensorDenseAdd", Factors(SparseTensorDenseAddFactors), kDenseShape},
});

}  // namespace
}  // namespace tf_dtensor
