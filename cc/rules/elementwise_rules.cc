// Elementwise ops, unary and binary with broadcasting:
//   [x,*] + [x,*] -> [x,*]     [x,*] * [*] -> [x,*]     relu([*,y]) -> [*,y]
//   identity_n([x,*], [*,y]) -> [x,*], [*,y]
// The string ops that map each element alone (StringLength, StringUpper, Substr,
// StringToHashBucketFast, RegexReplace, ...) are elementwise too: upper([x,y]) -> [x,y],
// with no gather (TF's collective ops cannot all-gather strings).
// No collectives unless the inputs disagree; then the merge rule in
// propagation/merge.h picks the output and the other inputs are relaid out.
#include "cc/rules/merge.h"
#include "cc/rules/expand.h"
#include "cc/rules/factor.h"
#include "cc/rules/list_elements.h"
#include "cc/rules/registry.h"
#include "cc/spmd/ledger.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

class PointwiseRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<const Layout*> layouts;
    for (const InputInfo& in : ctx.inputs) {
      shapes.push_back(in.shape);
      layouts.push_back(in.layout ? &*in.layout : nullptr);
    }
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> out_shape, BroadcastShapes(shapes, ctx.op_name));
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    std::vector<DimSpec> out = MergeBroadcast(layouts, shapes, out_shape, &used);
    Plan plan;
    Layout out_layout = Layout::Replicated(ctx.mesh, 0).WithSpecs(out);
    for (const InputInfo& in : ctx.inputs) {
      plan.inputs.push_back(out_layout.WithSpecs(ProjectBroadcast(out, in.shape, out_shape)));
    }
    plan.outputs.assign(ctx.num_outputs, out_layout);
    return plan;
  }

  // A replicated input whose size along an axis is known only at run time, beside an
  // input sharded along it, may broadcast there (size 1 when it runs: x * r with r =
  // reduce_sum(x, run_time_axes, keepdims=True)): it is cut with SliceMayBroadcast, which
  // keeps the one row on every device in that case. Cut as a value of the other's size,
  // each device but the first got an empty block and the result lost its rows.
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    bool run_time_size = false;  // the common case (every size known) returns at once
    for (const InputInfo& in : ctx.inputs) {
      for (int64_t size : in.shape) run_time_size = run_time_size || size < 0;
    }
    if (!run_time_size) return ExpandDefault(ctx, plan, builder);
    const int n = static_cast<int>(ctx.inputs.size());
    size_t out_rank = 0;
    for (const InputInfo& in : ctx.inputs) out_rank = std::max(out_rank, in.shape.size());
    // sharded_out[a]: some input is already sharded along output axis a.
    std::vector<bool> sharded_out(out_rank, false);
    for (const InputInfo& in : ctx.inputs) {
      if (!in.layout) continue;
      const size_t offset = out_rank - in.shape.size();
      for (size_t a = 0; a < in.shape.size(); ++a) {
        if (in.layout->spec(static_cast<int>(a)).sharded()) sharded_out[offset + a] = true;
      }
    }
    Plan first = plan;  // the planned layouts but for the axes cut below
    std::vector<std::vector<int>> may_broadcast(n);
    for (int i = 0; i < n && i < static_cast<int>(plan.inputs.size()); ++i) {
      const std::optional<Layout>& given = ctx.inputs[i].layout;
      if (!given || !plan.inputs[i]) continue;
      const std::vector<int64_t>& shape = ctx.inputs[i].shape;
      const size_t offset = out_rank - shape.size();
      std::vector<DimSpec> specs = plan.inputs[i]->specs();
      for (int a = 0; a < static_cast<int>(shape.size()); ++a) {
        if (shape[a] >= 0 || given->spec(a).sharded() || !specs[a].sharded() ||
            specs[a].multi() || !sharded_out[offset + a]) {
          continue;
        }
        may_broadcast[i].push_back(a);
        specs[a] = DimSpec::Replicated();
      }
      if (!may_broadcast[i].empty()) first.inputs[i] = plan.inputs[i]->WithSpecs(specs);
    }
    bool any = false;
    for (const std::vector<int>& axes : may_broadcast) any = any || !axes.empty();
    if (!any) return ExpandDefault(ctx, plan, builder);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, first, builder));
    for (int i = 0; i < n; ++i) {
      for (int a : may_broadcast[i]) {
        TFD_ASSIGN_OR_RETURN(inputs[i],
                             builder.SliceMayBroadcast(inputs[i], a, plan.inputs[i]->spec(a)));
      }
    }
    LocalOpOptions options;
    options.overrides = plan.overrides;
    return ExpandWithInputs(ctx, plan, inputs, options, builder);
  }

  // The request projected onto each input through broadcasting, right-aligned:
  //   want [x,y] of [4,8] + [8]   -> [x,y], [y]
  //   want [x,y] of [4,8] + [1,8] -> [x,y], [*,y]   (a size-1 axis broadcasts, unsharded)
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    std::vector<std::optional<Layout>> out(ctx.inputs.size());
    std::vector<std::vector<int64_t>> shapes;
    for (const InputInfo& in : ctx.inputs) shapes.push_back(in.shape);
    StatusOr<std::vector<int64_t>> out_shape = BroadcastShapes(shapes, ctx.op_name);
    if (!out_shape.ok()) return out;
    const Layout* want =
        UsableRequest(ctx, requested, 0, static_cast<int>(out_shape->size()));
    if (!want) return out;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      out[i] = want->WithSpecs(ProjectBroadcast(want->specs(), ctx.inputs[i].shape, *out_shape));
    }
    return out;
  }
};


// AddN of TensorLists (variant scalars, replicated) adds them element by element: a loop's
// gradient sums the list it carries and the one a step's TensorListGetItem gradient
// makes. Their elements may be laid out differently (the carried list starts as zeros
// like the forward list's replicated rows, the step's holds sharded gradient rows), and
// the local lists must hold blocks of one shape: the elements all take one layout first
// (list_elements.h), preferring the most sharded one, reached by slicing alone:
//   list of [*] + list of [x] -> list of [x]   (the first list's elements sliced)
class AddNRule : public PointwiseRule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, PointwiseRule::Forward(ctx));
    if (std::optional<Layout> common = CommonLayout(ctx)) {
      for (size_t i = 0; i < ctx.inputs.size(); ++i) {
        if (!ctx.inputs[i].resource) continue;
        for (std::string& line : DescribeListRelayout(*ctx.inputs[i].resource, *common,
                                                      "the elements of " + ctx.Describe(i))) {
          plan.notes.push_back("elements of list input " + std::to_string(i) + ": " + line);
        }
      }
    }
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    std::optional<Layout> common = CommonLayout(ctx);
    if (!common) return PointwiseRule::Expand(ctx, plan, builder);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    std::optional<ResourceInfo> info;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!ctx.inputs[i].resource) continue;
      TFD_ASSIGN_OR_RETURN(inputs[i], RelayoutListElements(builder, inputs[i], *common,
                                                           "the elements of " + ctx.Describe(i)));
      if (!info) info = builder.resource(inputs[i]);
    }
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> outs,
                         builder.LocalOp(ctx.op_name, inputs, LocalOpOptions(), plan.outputs));
    info->element_value.reset();  // a sum of the elements, not the value they held
    for (ValueId out : outs) builder.set_resource(out, *info);
    return outs;
  }

 private:
  // The one element layout of lists whose element layouts differ; nullopt for plain
  // tensors and for lists that agree (or whose elements are not set yet).
  static std::optional<Layout> CommonLayout(const OpContext& ctx) {
    std::vector<Layout> layouts;
    for (const InputInfo& in : ctx.inputs) {
      if (in.dtype != TF_VARIANT) return std::nullopt;
      if (!in.resource) continue;  // a list not written yet: its elements take any layout
      layouts.push_back(in.resource->value_layout);
    }
    bool same = true;
    for (const Layout& l : layouts) same = same && l == layouts.front();
    if (same) return std::nullopt;  // none, one, or all alike
    const std::vector<int64_t>* shape = nullptr;
    for (const InputInfo& in : ctx.inputs) {
      if (in.resource && !shape) shape = &in.resource->value_shape;
    }
    return CommonElementLayout(layouts, *shape);
  }
};

// Select (v1) takes a rank-1 condition that picks whole rows: it aligns on the left.
class SelectRule : public PointwiseRule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    if (ctx.inputs.size() != 3 || ctx.rank(0) != 1 || ctx.rank(1) <= 1) {
      return PointwiseRule::Forward(ctx);
    }
    // Shard like the branches; the condition follows their first axis.
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    std::vector<const Layout*> layouts = {&ctx.layout(1), &ctx.layout(2)};
    std::vector<std::vector<int64_t>> shapes = {ctx.inputs[1].shape, ctx.inputs[2].shape};
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> out_shape, BroadcastShapes(shapes, ctx.op_name));
    std::vector<DimSpec> out = MergeBroadcast(layouts, shapes, out_shape, &used);
    Layout out_layout = ctx.layout(1).WithSpecs(out);
    Plan plan;
    plan.inputs = {out_layout.WithSpecs({out[0]}), out_layout, out_layout};
    plan.outputs = {out_layout};
    return plan;
  }

  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    if (ctx.inputs.size() != 3 || ctx.rank(0) != 1 || ctx.rank(1) <= 1) {
      return PointwiseRule::Backward(ctx, requested);
    }
    std::vector<std::optional<Layout>> out(3);
    if (ctx.inputs[1].shape != ctx.inputs[2].shape) return out;
    const Layout* want = UsableRequest(ctx, requested, 0, ctx.rank(1));
    if (!want) return out;
    return {want->WithSpecs({want->spec(0)}), *want, *want};
  }
};

// IdentityN passes each input through with its layout.
class IdentityNRule : public Rule {
 public:
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    std::vector<std::optional<Layout>> out(ctx.inputs.size());
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      if (const Layout* want = UsableRequest(ctx, requested, static_cast<int>(i), ctx.rank(i))) {
        out[i] = *want;
      }
    }
    return out;
  }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    for (size_t i = 0; i < ctx.inputs.size(); ++i) plan.outputs.push_back(ctx.layout(i));
    return plan;
  }
};

// BiasAdd adds a rank-1 bias along the channel axis: the last (NHWC) or axis 1 (NCHW).
class BiasAddRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& value = ctx.layout(0);
    std::optional<std::string> format = ctx.attrs->GetString("data_format");
    int channel = format && *format == "NCHW" ? 1 : value.rank() - 1;
    if (channel < 0 || channel >= value.rank()) {
      return InvalidArgument("BiasAdd needs a value of rank 2 or more; got " + ctx.Describe(0) +
                             ".");
    }
    // A channel axis the value leaves whole takes the bias's sharding where the bias has
    // one the value does not use: each device slices its own channels of the value (no
    // communication) rather than gathering the bias, as TensorFlow's DTensor does.
    std::vector<DimSpec> specs = value.specs();
    const Layout& bias = ctx.layout(1);
    if (!specs[channel].sharded() && bias.rank() == 1 && bias.spec(0).sharded() &&
        ctx.inputs[0].shape[channel] % bias.NumShards(0) == 0) {
      bool used = false;
      for (const DimSpec& s : specs) {
        for (int m : s.mesh_dims()) {
          for (int b : bias.spec(0).mesh_dims()) used = used || m == b;
        }
      }
      if (!used) specs[channel] = bias.spec(0);
    }
    Layout runs = value.WithSpecs(specs);
    Plan plan;
    plan.inputs = {runs, runs.WithSpecs({specs[channel]})};
    plan.outputs = {runs};
    return plan;
  }
};

// Bitcast reinterprets each element's bytes. Between types of one size it is pointwise;
// to a smaller type each element becomes a new trailing axis, and from a smaller type the
// trailing axis (its bytes) is read whole:
//   bitcast([x,y] f32 -> i32) -> [x,y]     bitcast([x,y] f32 -> u8) -> [x,y,*]
//   bitcast([x,y] of [4, 8, 4] u8 -> f32) -> gather axis 2 -> [x,y]
StatusOr<FactorSpec> BitcastFactors(const OpContext& ctx) {
  const int from = static_cast<int>(DTypeBytes(ctx.attrs->GetType("T").value_or(ctx.inputs[0].dtype)));
  const int to = static_cast<int>(DTypeBytes(ctx.attrs->GetType("type").value_or(0)));
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(ctx.rank(0));
  spec.inputs = {axes};
  std::vector<int> out = axes;
  if (from > to && to > 0) {
    out.push_back(FactorSpec::kNew);
  } else if (from < to && from > 0) {
    if (axes.empty()) {
      return InvalidArgument("'Bitcast' to a larger type needs a trailing axis of bytes; got " +
                             ctx.Describe(0) + ".");
    }
    spec.factors[axes.back()] = FactorKind::kNeedReplication;
    out.pop_back();
  }
  spec.outputs = {out};
  return spec;
}

// Identity and its kin copy their one input: an axis over several mesh dimensions
// ([x+y,*], see DimSpec) passes as it is, so a tf.function can return one.
const RuleTraits kCopy = Traits().Linear(Linearity::kStructural).MultiDimAxes();

const bool kRegistered = RegisterRules({
    {"Abs", Pointwise()},
    {"Acos", Pointwise()},
    {"Acosh", Pointwise()},
    {"Add", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"AddN", std::make_shared<AddNRule>(), Traits().Linear(Linearity::kEachInput)},
    {"AddV2", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"Angle", Pointwise()},
    {"ApproximateEqual", Pointwise()},
    {"AsString", Pointwise()},
    {"Asin", Pointwise()},
    {"Asinh", Pointwise()},
    {"Atan", Pointwise()},
    {"Atan2", Pointwise()},
    {"Atanh", Pointwise()},
    {"BesselI0", Pointwise()},
    {"BesselI0e", Pointwise()},
    {"BesselI1", Pointwise()},
    {"BesselI1e", Pointwise()},
    {"BesselJ0", Pointwise()},
    {"BesselJ1", Pointwise()},
    {"BesselK0", Pointwise()},
    {"BesselK0e", Pointwise()},
    {"BesselK1", Pointwise()},
    {"BesselK1e", Pointwise()},
    {"BesselY0", Pointwise()},
    {"BesselY1", Pointwise()},
    {"Betainc", Pointwise()},
    {"BiasAdd", std::make_shared<BiasAddRule>()},
    {"Bitcast", Factors(BitcastFactors)},
    {"BitwiseAnd", Pointwise()},
    {"BitwiseOr", Pointwise()},
    {"BitwiseXor", Pointwise()},
    {"Bucketize", Pointwise()},
    {"Cast", Pointwise()},
    {"Ceil", Pointwise()},
    {"CheckNumerics", Pointwise()},
    {"CheckNumericsV2", Pointwise()},
    {"ClipByValue", Pointwise()},
    {"Complex", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"ComplexAbs", Pointwise()},
    {"Conj", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"Cos", Pointwise()},
    {"Cosh", Pointwise()},
    {"Dawsn", Pointwise()},
    {"DebugGradientIdentity", Pointwise(), Traits().Linear(Linearity::kStructural)},
    {"DecodeBase64", Pointwise()},
    {"Digamma", Pointwise()},
    {"Div", Pointwise(), Traits().Linear(Linearity::kFirstInput)},
    {"DivNoNan", Pointwise(), Traits().Linear(Linearity::kFirstInput)},
    {"Elu", Pointwise()},
    {"EluGrad", Pointwise()},
    {"EncodeBase64", Pointwise()},
    {"Equal", Pointwise()},
    {"Erf", Pointwise()},
    {"Erfc", Pointwise()},
    {"Erfinv", Pointwise()},
    {"Exp", Pointwise()},
    {"Expint", Pointwise()},
    {"Expm1", Pointwise()},
    {"Floor", Pointwise()},
    {"FloorDiv", Pointwise()},
    {"FloorMod", Pointwise()},
    {"FresnelCos", Pointwise()},
    {"FresnelSin", Pointwise()},
    {"Greater", Pointwise()},
    {"GreaterEqual", Pointwise()},
    {"Identity", Pointwise(), kCopy},
    {"IdentityN", std::make_shared<IdentityNRule>(), Traits().MultiDimAxes()},
    {"Igamma", Pointwise()},
    {"IgammaGradA", Pointwise()},
    {"Igammac", Pointwise()},
    {"Imag", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"Inv", Pointwise()},
    {"InvGrad", Pointwise()},
    {"Invert", Pointwise()},
    {"IsFinite", Pointwise()},
    {"IsInf", Pointwise()},
    {"IsNan", Pointwise()},
    {"LeakyRelu", Pointwise()},
    {"LeakyReluGrad", Pointwise()},
    {"LeftShift", Pointwise()},
    {"Less", Pointwise()},
    {"LessEqual", Pointwise()},
    {"Lgamma", Pointwise()},
    {"Log", Pointwise()},
    {"Log1p", Pointwise()},
    {"LogicalAnd", Pointwise()},
    {"LogicalNot", Pointwise()},
    {"LogicalOr", Pointwise()},
    {"Maximum", Pointwise()},
    {"Minimum", Pointwise()},
    {"Mod", Pointwise()},
    {"Mul", Pointwise(), Traits().Linear(Linearity::kOneInput)},
    {"MulNoNan", Pointwise(), Traits().Linear(Linearity::kFirstInput)},
    {"Ndtri", Pointwise()},
    {"Neg", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"NextAfter", Pointwise()},
    {"NotEqual", Pointwise()},
    {"OnesLike", Pointwise()},
    {"Polygamma", Pointwise()},
    {"PopulationCount", Pointwise()},
    {"Pow", Pointwise()},
    {"PreventGradient", Pointwise(), Traits().MultiDimAxes()},
    {"RandomGammaGrad", Pointwise()},
    {"Real", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"RealDiv", Pointwise(), Traits().Linear(Linearity::kFirstInput)},
    {"Reciprocal", Pointwise()},
    {"ReciprocalGrad", Pointwise()},
    {"RegexFullMatch", Pointwise()},
    {"RegexReplace", Pointwise()},
    {"Relu", Pointwise()},
    {"Relu6", Pointwise()},
    {"Relu6Grad", Pointwise()},
    {"ReluGrad", Pointwise()},
    {"RightShift", Pointwise()},
    {"Rint", Pointwise()},
    {"Round", Pointwise()},
    {"Rsqrt", Pointwise()},
    {"RsqrtGrad", Pointwise()},
    {"Select", std::make_shared<SelectRule>()},
    {"SelectV2", Pointwise()},
    {"Selu", Pointwise()},
    {"SeluGrad", Pointwise()},
    {"Sigmoid", Pointwise()},
    {"SigmoidGrad", Pointwise()},
    {"Sign", Pointwise()},
    {"Sin", Pointwise()},
    {"Sinh", Pointwise()},
    {"Snapshot", Pointwise(), Traits().MultiDimAxes()},
    {"Softplus", Pointwise()},
    {"SoftplusGrad", Pointwise()},
    {"Softsign", Pointwise()},
    {"SoftsignGrad", Pointwise()},
    {"Spence", Pointwise()},
    {"Sqrt", Pointwise()},
    {"SqrtGrad", Pointwise()},
    {"Square", Pointwise()},
    {"SquaredDifference", Pointwise()},
    {"StaticRegexFullMatch", Pointwise()},
    {"StaticRegexReplace", Pointwise()},
    {"StopGradient", Pointwise(), kCopy},
    {"StringJoin", Pointwise()},
    {"StringLength", Pointwise()},
    {"StringLower", Pointwise()},
    {"StringStrip", Pointwise()},
    {"StringToHashBucket", Pointwise()},
    {"StringToHashBucketFast", Pointwise()},
    {"StringToHashBucketStrong", Pointwise()},
    {"StringToNumber", Pointwise()},
    {"StringUpper", Pointwise()},
    {"Sub", Pointwise(), Traits().Linear(Linearity::kEachInput)},
    {"Substr", Pointwise()},
    {"Tan", Pointwise()},
    {"Tanh", Pointwise()},
    {"TanhGrad", Pointwise()},
    {"TruncateDiv", Pointwise()},
    {"TruncateMod", Pointwise()},
    {"UnicodeScript", Pointwise()},
    {"UnicodeTranscode", Pointwise()},
    {"Xdivy", Pointwise()},
    {"Xlog1py", Pointwise()},
    {"Xlogy", Pointwise()},
    {"ZerosLike", Pointwise()},
    {"Zeta", Pointwise()},
});

}  // namespace

std::shared_ptr<const Rule> Pointwise() { return std::make_shared<PointwiseRule>(); }

}  // namespace tf_dtensor
