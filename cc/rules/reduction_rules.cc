// Reductions over some axes (input 1 holds the axes):
//   sum([x,*], axis=1) -> [x]                       (local)
//   sum([x,*], axis=0) -> partial(x) -> all-reduce -> [*]
//   mean([x,*], axis=0) -> local sum, all-reduce(sum), divide by the global count
//   argmax([x,*], axis=0) -> the input is first gathered along axis 0 -> [*]
// keep_dims keeps reduced axes as unsharded size-1 axes.
//   l2_loss([x,y]) -> partial(x,y) -> all-reduce -> []
//   bias_add_grad([x,y]) (channels last) -> partial(x) -> all-reduce -> [y]
// Softmax and LogSoftmax normalise over the last axis, which they gather if sharded; so do
// the softmax cross entropies, whose batch axis keeps its sharding:
//   sparse_softmax_cross_entropy(logits [x,y], labels [x]) -> gather y -> loss [x],
//     backprop [x,*]
// Cumsum and Cumprod scan along an axis, which they gather if sharded.
#include <set>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

StatusOr<std::set<int>> ReducedAxes(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.IntValue(1, "reduction axes"));
  const int rank = ctx.rank(0);
  std::set<int> out;
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) {
      return InvalidArgument("Reduction axis " + std::to_string(a) + " is out of range for " +
                             ctx.Describe(0) + ".");
    }
    out.insert(static_cast<int>(a < 0 ? a + rank : a));
  }
  return out;
}

// Each input axis a factor; reduced axes are contracted (partial results combined with
// `op`) or, with no `op`, need replication. keep_dims keeps them as new unsharded axes.
StatusOr<FactorSpec> ReduceFactors(const OpContext& ctx, std::optional<ReduceOp> op) {
  TFD_ASSIGN_OR_RETURN(std::set<int> axes, ReducedAxes(ctx));
  const bool keep_dims = ctx.attrs->GetBool("keep_dims", false);
  FactorSpec spec;
  std::vector<int> in, out;
  for (int d = 0; d < ctx.rank(0); ++d) {
    const bool reduced = axes.count(d) > 0;
    in.push_back(spec.Add(!reduced ? FactorKind::kPassThrough
                          : op     ? FactorKind::kContracted
                                   : FactorKind::kNeedReplication));
    if (!reduced) {
      out.push_back(in.back());
    } else if (keep_dims) {
      out.push_back(FactorSpec::kNew);
    }
  }
  spec.inputs = {in, std::nullopt};
  spec.outputs = {out};
  if (op) spec.reduce = *op;
  return spec;
}

class ReduceRule : public FactorRule {
 public:
  // `op`: how partial results combine; nullopt gathers reduced axes instead.
  explicit ReduceRule(std::optional<ReduceOp> op, bool mean = false)
      : FactorRule([op](const OpContext& ctx) { return ReduceFactors(ctx, op); },
                   SecondInputIsHost),
        mean_(mean) {}

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (!mean_ || plan.partial_dims[0].empty()) return ExpandDefault(ctx, plan, builder);
    // Mean over a sharded axis: sum locally, all-reduce, divide by the global count.
    TFD_ASSIGN_OR_RETURN(std::set<int> axes, ReducedAxes(ctx));
    int64_t count = 1;
    for (int a : axes) count *= ctx.inputs[0].shape[a];
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> sum,
                         builder.LocalOp("Sum", inputs, {}, plan.outputs));
    TFD_ASSIGN_OR_RETURN(ValueId total,
                         builder.AllReduce(sum[0], plan.partial_dims[0], ReduceOp::kSum));
    TFD_ASSIGN_OR_RETURN(ValueId host_count, builder.HostConstant({count}, {}, TF_INT64));
    LocalOpOptions cast;
    cast.copy_attrs = false;
    cast.overrides = {AttrOverride::Type("SrcT", TF_INT64),
                      AttrOverride::Type("DstT", ctx.inputs[0].dtype)};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> divisor,
                         builder.LocalOp("Cast", {host_count}, cast,
                                         {Layout::Replicated(ctx.mesh, 0)}));
    LocalOpOptions div;
    div.copy_attrs = false;
    div.overrides = {AttrOverride::Type("T", ctx.inputs[0].dtype)};
    // The quotient has the sum's layout after the all-reduce (plan.outputs may name the
    // deferred partial sum, which the all-reduce above has just done).
    return builder.LocalOp("Div", {total, divisor[0]}, div, {*builder.layout(total)});
  }

 private:
  bool mean_;
};

// Softmax-like ops normalise over the last axis, which needs replication.
StatusOr<FactorSpec> LastAxisFactors(const OpContext& ctx) {
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(ctx.rank(0));
  if (!axes.empty()) spec.factors[axes.back()] = FactorKind::kNeedReplication;
  spec.inputs = {axes};
  spec.outputs.assign(ctx.num_outputs, axes);
  return spec;
}

// SoftmaxCrossEntropyWithLogits(features [B,C], labels [B,C]) -> loss [B], backprop [B,C].
// SparseSoftmaxCrossEntropyWithLogits(features [B,C], labels [B]) -> the same outputs.
// Each example's softmax needs its whole class row, so the class axis is gathered; the
// batch axis keeps a sharding of either input ([x,*] with labels [x] runs locally).
// Dense labels may broadcast against the features along either axis.
StatusOr<FactorSpec> CrossEntropyFactors(const OpContext& ctx, bool sparse) {
  if (ctx.inputs.size() != 2 || ctx.rank(0) != 2 || ctx.rank(1) != (sparse ? 1 : 2)) {
    return InvalidArgument("'" + ctx.op_name + "' takes logits of rank 2 and labels of rank " +
                           (sparse ? "1" : "2") + "; got " + ctx.Describe(0) + " and " +
                           ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  const int batch = spec.Add(FactorKind::kPassThrough);
  const int classes = spec.Add(FactorKind::kNeedReplication);
  spec.inputs = {std::vector<int>{batch, classes},
                 sparse ? std::vector<int>{batch} : std::vector<int>{batch, classes}};
  spec.outputs = {{batch}, {batch, classes}};
  return spec;
}

// Sums over every axis that is sharded away: L2Loss (all axes) and BiasAddGrad (all but
// the channel axis). Sharded summed axes leave partial sums, all-reduced over their mesh
// dimensions; the channel axis keeps its sharding.
StatusOr<FactorSpec> SumToChannelFactors(const OpContext& ctx, bool keep_channel) {
  const int rank = ctx.rank(0);
  int channel = -1;
  if (keep_channel) {
    std::optional<std::string> format = ctx.attrs->GetString("data_format");
    channel = format && *format == "NCHW" ? 1 : rank - 1;
    if (rank < 2 || channel >= rank) {
      return InvalidArgument("'" + ctx.op_name + "' needs a value of rank 2 or more; got " +
                             ctx.Describe(0) + ".");
    }
  }
  FactorSpec spec;
  std::vector<int> in;
  for (int d = 0; d < rank; ++d) {
    in.push_back(spec.Add(d == channel ? FactorKind::kPassThrough : FactorKind::kContracted));
  }
  spec.inputs = {in};
  spec.outputs = {channel >= 0 ? std::vector<int>{in[channel]} : std::vector<int>{}};
  return spec;
}

// Cumsum(x, axis) / Cumprod: each element depends on every earlier one along the axis, so a
// sharded scan axis is gathered; other axes keep their sharding.
StatusOr<FactorSpec> ScanFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(1, "axis"));
  const int rank = ctx.rank(0);
  if (axis.size() != 1 || axis[0] < -rank || axis[0] >= rank) {
    return InvalidArgument("'" + ctx.op_name + "' axis " + ShapeString(axis) +
                           " is out of range for " + ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.factors[axes[axis[0] < 0 ? axis[0] + rank : axis[0]]] = FactorKind::kNeedReplication;
  spec.inputs = {axes, std::nullopt};
  spec.outputs = {axes};
  return spec;
}

StatusOr<FactorSpec> BiasAddGradFactors(const OpContext& ctx) {
  return SumToChannelFactors(ctx, /*keep_channel=*/true);
}
StatusOr<FactorSpec> L2LossFactors(const OpContext& ctx) {
  return SumToChannelFactors(ctx, /*keep_channel=*/false);
}
StatusOr<FactorSpec> DenseCrossEntropyFactors(const OpContext& ctx) {
  return CrossEntropyFactors(ctx, /*sparse=*/false);
}
StatusOr<FactorSpec> SparseCrossEntropyFactors(const OpContext& ctx) {
  return CrossEntropyFactors(ctx, /*sparse=*/true);
}

std::shared_ptr<const Rule> ReduceOver(std::optional<ReduceOp> op) {
  return std::make_shared<ReduceRule>(op);
}

const bool kRegistered = RegisterRules({
    {"All", ReduceOver(std::nullopt)},
    {"Any", ReduceOver(std::nullopt)},
    {"ArgMax", ReduceOver(std::nullopt)},
    {"ArgMin", ReduceOver(std::nullopt)},
    {"BiasAddGrad", Factors(BiasAddGradFactors)},
    {"Cumprod", Factors(ScanFactors, SecondInputIsHost)},
    {"Cumsum", Factors(ScanFactors, SecondInputIsHost)},
    {"EuclideanNorm", ReduceOver(std::nullopt)},
    {"L2Loss", Factors(L2LossFactors)},
    {"LogSoftmax", Factors(LastAxisFactors)},
    {"Max", Linear(ReduceOver(ReduceOp::kMax), Linearity::kMax)},
    {"Mean", std::make_shared<ReduceRule>(ReduceOp::kSum, /*mean=*/true)},
    {"Min", Linear(ReduceOver(ReduceOp::kMin), Linearity::kMin)},
    {"Prod", ReduceOver(ReduceOp::kProd)},
    {"Softmax", Factors(LastAxisFactors)},
    {"SoftmaxCrossEntropyWithLogits", Factors(DenseCrossEntropyFactors)},
    {"SparseSoftmaxCrossEntropyWithLogits", Factors(SparseCrossEntropyFactors)},
    {"Sum", Linear(ReduceOver(ReduceOp::kSum), Linearity::kSum)},
});

}  // namespace
}  // namespace tf_dtensor
