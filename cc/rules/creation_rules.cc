// Ops that create values from host arguments (shapes, seeds, scalars).
//   fill(dims=[8,4], 1.0) with requested [x,*] -> each device fills its [8/|x|,4] block
//   empty(shape=[8,4], init=true) likewise (its values unset without init)
//   stateless_random_normal(shape, seed) with requested [x,y] -> the global value is drawn
//     once and sliced, so values equal the single-device result for every layout
// Ops whose inputs are all host arguments and whose outputs are replicated use
// Replicated(); the requested layout is then reached by slicing (no communication).
// _EagerConst (a constant made from a Python value under a mesh scope, such as a shape
// argument inside call_with_layout) is one of them.
#include <algorithm>

#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// Inputs stay as they are (host or replicated); outputs are replicated.
class ReplicatedRule : public Rule {
 public:
  explicit ReplicatedRule(bool stateful) : stateful_(stateful) {}
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    for (const InputInfo& in : ctx.inputs) {
      if (in.layout && !in.resource) {
        plan.inputs.push_back(Layout::Replicated(ctx.mesh, static_cast<int>(in.shape.size())));
      } else {
        plan.inputs.push_back(std::nullopt);
      }
    }
    return plan;  // empty outputs: replicated, whatever their rank
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    LocalOpOptions options;
    options.run_once = stateful_;
    return builder.LocalOp(ctx.op_name, inputs, options, plan.outputs);
  }

 private:
  bool stateful_;
};

// Fill(dims, value) and Empty(shape) (tf.nn.ctc_loss's buffers): each device makes its
// own block of the requested layout.
class FillRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                         ctx.IntValue(0, ctx.op_name == "Empty" ? "shape" : "dims"));
    Layout out = Layout::Replicated(ctx.mesh, static_cast<int>(dims.size()));
    // A request the shape cannot take (a size-1 axis that broadcasts later) leaves the
    // fill replicated; the result is relaid out where the request was made.
    if (ctx.requested && ctx.requested->rank() == out.rank() &&
        ctx.requested->UniformLocalShape(dims, "").ok()) {
      out = *ctx.requested;
    }
    Plan plan;
    plan.inputs = {std::nullopt};
    if (ctx.inputs.size() > 1) {  // Fill's value, a scalar
      plan.inputs.push_back(ctx.inputs[1].layout
                                ? std::optional<Layout>(Layout::Replicated(ctx.mesh, 0))
                                : std::nullopt);
    }
    plan.outputs = {out};
    TFD_ASSIGN_OR_RETURN(plan.host_inputs[0],
                         out.UniformLocalShape(dims, "the output of '" + ctx.op_name + "'"));
    return plan;
  }
};

// Range(start, limit, delta): replicated, or in a requested sharded layout, where each
// device makes its own block from its offset (uneven blocks included):
//   range(0, 10, 1) with requested [x] @ mesh(x=4) -> blocks [0,3) [3,6) [6,8) [8,10):
//     device i runs Range(start + offset_i * delta, start + (offset_i + size_i) * delta, delta)
// A non-integer range is made replicated; the request is then met by slicing.
class RangeRule : public Rule {
 public:

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    for (const InputInfo& in : ctx.inputs) {
      plan.inputs.push_back(in.layout ? std::optional<Layout>(Layout::Replicated(ctx.mesh, 0))
                                      : std::nullopt);
    }
    std::optional<Bounds> bounds = Read(ctx);
    Layout out = Layout::Replicated(ctx.mesh, 1);
    if (bounds && ctx.requested && ctx.requested->rank() == 1 &&
        ctx.requested->mesh() == ctx.mesh && !ctx.requested->is_partial() &&
        !ctx.requested->is_single_device()) {
      out = *ctx.requested;
    }
    plan.outputs = {out};
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    const Layout& out = plan.outputs[0];
    std::optional<Bounds> bounds = Read(ctx);
    if (!bounds || !out.spec(0).sharded()) return ExpandDefault(ctx, plan, builder);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    const int mesh_dim = out.spec(0).mesh_dim;
    const std::vector<int64_t> sizes = out.PieceSizes({bounds->count}, 0);
    std::vector<int64_t> starts, limits;
    int64_t offset = 0;
    for (int64_t size : sizes) {
      starts.push_back(bounds->start + offset * bounds->delta);
      limits.push_back(bounds->start + (offset + size) * bounds->delta);
      offset += size;
    }
    const int dtype = ctx.inputs[0].dtype;
    // Per device, its own scalar start and limit.
    auto own = [&](const std::vector<int64_t>& values) {
      return PerDeviceEntry(builder, ctx.mesh, values, mesh_dim, dtype);
    };
    TFD_ASSIGN_OR_RETURN(inputs[0], own(starts));
    TFD_ASSIGN_OR_RETURN(inputs[1], own(limits));
    return builder.LocalOp(ctx.op_name, inputs, LocalOpOptions(), plan.outputs);
  }

 private:
  struct Bounds {
    int64_t start, delta, count;
  };
  // The integer bounds and element count, or nullopt (not integers, not known, delta 0).
  static std::optional<Bounds> Read(const OpContext& ctx) {
    if (ctx.inputs.size() != 3) return std::nullopt;
    int64_t v[3];
    for (int i = 0; i < 3; ++i) {
      const std::optional<std::vector<int64_t>>& value = ctx.inputs[i].int_value;
      if (!value || value->size() != 1) return std::nullopt;
      v[i] = (*value)[0];
    }
    if (v[2] == 0) return std::nullopt;
    const int64_t span = v[1] - v[0];
    int64_t count = v[2] > 0 ? (span + v[2] - 1) / v[2] : (span + v[2] + 1) / v[2];
    return Bounds{v[0], v[2], std::max<int64_t>(count, 0)};
  }
};

}  // namespace

std::shared_ptr<const Rule> ReplicatedStateful() {
  return std::make_shared<ReplicatedRule>(true);
}

namespace {

// Random ops read their shape, then seeds and bounds, as host values.
const RuleTraits kShapeThenValues =
    Traits().Host(0, HostValue::kShape).Host(1, -1, HostValue::kValue);

const bool kRegistered = RegisterRules({
    {"Empty", std::make_shared<FillRule>(), Traits().Host(0, HostValue::kShape).ReadsRequest()},
    {"Fill", std::make_shared<FillRule>(),
     Traits().Host(0, HostValue::kShape).Host(1, HostValue::kValue).ReadsRequest()},
    {"LinSpace", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"RandomStandardNormal", ReplicatedStateful(), kShapeThenValues},
    {"RandomUniform", ReplicatedStateful(), kShapeThenValues},
    {"RandomUniformInt", ReplicatedStateful(), kShapeThenValues},
    {"Range", std::make_shared<RangeRule>(), Traits().AllHost(HostValue::kValue).ReadsRequest()},
    {"StatelessRandomGetAlg", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"StatelessRandomGetKeyCounter", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"StatelessRandomGetKeyCounterAlg", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"StatelessRandomNormal", Replicated(), kShapeThenValues},
    {"StatelessRandomNormalV2", Replicated(), kShapeThenValues},
    {"StatelessRandomUniform", Replicated(), kShapeThenValues},
    {"StatelessRandomUniformFullInt", Replicated(), kShapeThenValues},
    {"StatelessRandomUniformFullIntV2", Replicated(), kShapeThenValues},
    {"StatelessRandomUniformInt", Replicated(), kShapeThenValues},
    {"StatelessRandomUniformIntV2", Replicated(), kShapeThenValues},
    {"StatelessRandomUniformV2", Replicated(), kShapeThenValues},
    {"StatelessTruncatedNormal", Replicated(), kShapeThenValues},
    {"StatelessTruncatedNormalV2", Replicated(), kShapeThenValues},
    {"TruncatedNormal", ReplicatedStateful(), kShapeThenValues},
    {"_EagerConst", Replicated(), Traits().AllHost(HostValue::kValue).PythonConstant()},
});

}  // namespace

std::shared_ptr<const Rule> Replicated() { return std::make_shared<ReplicatedRule>(false); }

}  // namespace tf_dtensor
