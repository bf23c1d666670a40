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
#include "cc/propagation/merge.h"
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
    // The quotient has the sum's layout after the all-reduce (plan.outputs may name the
    // deferred partial sum, which the all-reduce above has just done).
    return builder.LocalOp("Div", {total, divisor[0]}, div, {*builder.layout(total)});
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

// SoftmaxCrossEntropyWithLogits(features [B,C], labels [B,C]) -> loss [B], backprop [B,C].
// SparseSoftmaxCrossEntropyWithLogits(features [B,C], labels [B]) -> the same outputs.
// Each example's softmax needs its whole class row, so the class axis is gathered; the
// batch axis keeps a sharding of either input ([x,*] with labels [x] runs locally).
// Dense labels may broadcast against the features along either axis.
class CrossEntropyRule : public Rule {
 public:
  explicit CrossEntropyRule(bool sparse) : sparse_(sparse) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    if (ctx.inputs.size() != 2 || ctx.rank(0) != 2 || ctx.rank(1) != (sparse_ ? 1 : 2)) {
      return InvalidArgument("'" + ctx.op_name + "' takes logits of rank 2 and labels of rank " +
                             (sparse_ ? "1" : "2") + "; got " + ctx.Describe(0) + " and " +
                             ctx.Describe(1) + ".");
    }
    const int64_t batch = std::max(ctx.inputs[0].shape[0], ctx.inputs[1].shape[0]);
    // Only an input that spans the whole batch axis can lend it its sharding.
    std::vector<const Layout*> sources;
    for (int k = 0; k < 2; ++k) {
      sources.push_back(ctx.inputs[k].shape[0] == batch ? &ctx.layout(k) : nullptr);
    }
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    DimSpec spec = MergeAligned(sources, 1, {}, &used)[0];
    auto batch_spec = [&](int k) {
      return ctx.inputs[k].shape[0] == batch ? spec : DimSpec::Replicated();
    };
    const Layout& logits = ctx.layout(0);
    Plan plan;
    plan.inputs = {logits.WithSpecs({batch_spec(0), DimSpec::Replicated()}),
                   sparse_ ? logits.WithSpecs({batch_spec(1)})
                           : logits.WithSpecs({batch_spec(1), DimSpec::Replicated()})};
    plan.outputs = {logits.WithSpecs({spec}), logits.WithSpecs({spec, DimSpec::Replicated()})};
    return plan;
  }

 private:
  bool sparse_;
};

// Sums over every axis that is sharded away: L2Loss (all axes) and BiasAddGrad (all but
// the channel axis). Sharded summed axes leave partial sums, all-reduced over their mesh
// dimensions; the channel axis keeps its sharding.
class SumToChannelRule : public Rule {
 public:
  explicit SumToChannelRule(bool keep_channel) : keep_channel_(keep_channel) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& in = ctx.layout(0);
    int channel = -1;
    if (keep_channel_) {
      std::optional<std::string> format = ctx.attrs->GetString("data_format");
      channel = format && *format == "NCHW" ? 1 : in.rank() - 1;
      if (in.rank() < 2 || channel >= in.rank()) {
        return InvalidArgument("'" + ctx.op_name + "' needs a value of rank 2 or more; got " +
                               ctx.Describe(0) + ".");
      }
    }
    std::vector<int> partial;
    for (int d = 0; d < in.rank(); ++d) {
      if (d != channel && in.spec(d).sharded()) partial.push_back(in.spec(d).mesh_dim);
    }
    Plan plan;
    plan.inputs = {in};
    plan.outputs = {channel >= 0 ? in.WithSpecs({in.spec(channel)}) : in.WithSpecs({})};
    plan.partial_dims = {partial};
    return plan;
  }

 private:
  bool keep_channel_;
};

// Cumsum(x, axis) / Cumprod: each element depends on every earlier one along the axis, so a
// sharded scan axis is gathered; other axes keep their sharding.
class ScanRule : public Rule {
 public:
  bool IsHostArgument(int input, int) const override { return input == 1; }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(1, "axis"));
    const Layout& in = ctx.layout(0);
    if (axis.size() != 1 || axis[0] < -in.rank() || axis[0] >= in.rank()) {
      return InvalidArgument("'" + ctx.op_name + "' axis " + ShapeString(axis) +
                             " is out of range for " + ctx.Describe(0) + ".");
    }
    std::vector<DimSpec> specs = in.specs();
    specs[axis[0] < 0 ? axis[0] + in.rank() : axis[0]] = DimSpec::Replicated();
    Plan plan;
    plan.inputs = {in.WithSpecs(specs), std::nullopt};
    plan.outputs = {in.WithSpecs(specs)};
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
    {"BiasAddGrad", std::make_shared<SumToChannelRule>(/*keep_channel=*/true)},
    {"Cumprod", std::make_shared<ScanRule>()},
    {"Cumsum", std::make_shared<ScanRule>()},
    {"EuclideanNorm", ReduceOver(std::nullopt)},
    {"L2Loss", std::make_shared<SumToChannelRule>(/*keep_channel=*/false)},
    {"LogSoftmax", std::make_shared<LastAxisRule>()},
    {"Max", Linear(ReduceOver(ReduceOp::kMax), Linearity::kMax)},
    {"Mean", std::make_shared<ReduceRule>(ReduceOp::kSum, /*mean=*/true)},
    {"Min", Linear(ReduceOver(ReduceOp::kMin), Linearity::kMin)},
    {"Prod", ReduceOver(ReduceOp::kProd)},
    {"Softmax", std::make_shared<LastAxisRule>()},
    {"SoftmaxCrossEntropyWithLogits", std::make_shared<CrossEntropyRule>(/*sparse=*/false)},
    {"SparseSoftmaxCrossEntropyWithLogits", std::make_shared<CrossEntropyRule>(/*sparse=*/true)},
    {"Sum", Linear(ReduceOver(ReduceOp::kSum), Linearity::kSum)},
});

}  // namespace
}  // namespace tf_dtensor
