// Reductions over some axes (input 1 holds the axes):
//   sum([x,*], axis=1) -> [x]                       (local)
//   sum([x,*], axis=0) -> partial(x) -> all-reduce -> [*]
//   mean([x,*], axis=0) -> local sum, all-reduce(sum), divide by the global count
//   argmax([x,*], axis=0) -> the input is first gathered along axis 0 -> [*]
// keep_dims keeps reduced axes as unsharded size-1 axes.
// Softmax and LogSoftmax normalise over the last axis, which they gather if sharded.
#include <set>

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

class ReduceRule : public Rule {
 public:
  // `op`: how partial results combine; nullopt gathers reduced axes instead.
  explicit ReduceRule(std::optional<ReduceOp> op, bool mean = false) : op_(op), mean_(mean) {}

  bool IsHostArgument(int input, int) const override { return input == 1; }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::set<int> axes, ReducedAxes(ctx));
    const Layout& in = ctx.layout(0);
    bool keep_dims = ctx.attrs->GetBool("keep_dims", false);
    std::vector<DimSpec> input_specs = in.specs();
    std::vector<DimSpec> out_specs;
    std::vector<int> partial;
    for (int d = 0; d < in.rank(); ++d) {
      if (!axes.count(d)) {
        out_specs.push_back(in.spec(d));
        continue;
      }
      if (in.spec(d).sharded()) {
        if (op_) {
          partial.push_back(in.spec(d).mesh_dim);
        } else {
          input_specs[d] = DimSpec::Replicated();
        }
      }
      if (keep_dims) out_specs.push_back(DimSpec::Replicated());
    }
    Plan plan;
    plan.inputs = {in.WithSpecs(input_specs), std::nullopt};
    plan.outputs = {in.WithSpecs(out_specs)};
    plan.partial_dims = {partial};
    if (op_) plan.partial_op = *op_;
    return plan;
  }

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
    return builder.LocalOp("Div", {total, divisor[0]}, div, plan.outputs);
  }

 private:
  std::optional<ReduceOp> op_;
  bool mean_;
};

// Softmax-like ops normalise over the last axis.
class LastAxisRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& in = ctx.layout(0);
    std::vector<DimSpec> specs = in.specs();
    if (!specs.empty()) specs.back() = DimSpec::Replicated();
    Plan plan;
    Layout required = in.WithSpecs(specs);
    plan.inputs = {required};
    plan.outputs.assign(ctx.num_outputs, required);
    return plan;
  }
};

std::shared_ptr<const Rule> ReduceOver(std::optional<ReduceOp> op) {
  return std::make_shared<ReduceRule>(op);
}

const bool kRegistered = RegisterRules({
    {"All", ReduceOver(std::nullopt)},
    {"Any", ReduceOver(std::nullopt)},
    {"ArgMax", ReduceOver(std::nullopt)},
    {"ArgMin", ReduceOver(std::nullopt)},
    {"EuclideanNorm", ReduceOver(std::nullopt)},
    {"LogSoftmax", std::make_shared<LastAxisRule>()},
    {"Max", ReduceOver(ReduceOp::kMax)},
    {"Mean", std::make_shared<ReduceRule>(ReduceOp::kSum, /*mean=*/true)},
    {"Min", ReduceOver(ReduceOp::kMin)},
    {"Prod", ReduceOver(ReduceOp::kProd)},
    {"Softmax", std::make_shared<LastAxisRule>()},
    {"Sum", ReduceOver(ReduceOp::kSum)},
});

}  // namespace
}  // namespace tf_dtensor
