// Ops that create values from host arguments (shapes, seeds, scalars).
//   fill(dims=[8,4], 1.0) with requested [x,*] -> each device fills its [8/|x|,4] block
//   stateless_random_normal(shape, seed) with requested [x,y] -> the global value is drawn
//     once and sliced, so values equal the single-device result for every layout
// Ops whose inputs are all host arguments and whose outputs are replicated use
// Replicated(); the requested layout is then reached by slicing (no communication).
// _EagerConst (a constant made from a Python value under a mesh scope, such as a shape
// argument inside call_with_layout) is one of them.
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// Inputs stay as they are (host or replicated); outputs are replicated.
class ReplicatedRule : public Rule {
 public:
  explicit ReplicatedRule(bool stateful) : stateful_(stateful) {}
  bool IsHostArgument(int, int) const override { return true; }
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

// Fill(dims, value): each device fills its own block of the requested layout.
class FillRule : public Rule {
 public:
  bool ReadsRequest() const override { return true; }
  bool IsHostArgument(int, int) const override { return true; }
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ctx.IntValue(0, "dims"));
    Layout out = Layout::Replicated(ctx.mesh, static_cast<int>(dims.size()));
    // A request the shape cannot take (a size-1 axis that broadcasts later) leaves the
    // fill replicated; the result is relaid out where the request was made.
    if (ctx.requested && ctx.requested->rank() == out.rank() &&
        ctx.requested->UniformLocalShape(dims, "").ok()) {
      out = *ctx.requested;
    }
    Plan plan;
    plan.inputs = {std::nullopt, ctx.inputs[1].layout ? std::optional<Layout>(
                                                            Layout::Replicated(ctx.mesh, 0))
                                                      : std::nullopt};
    plan.outputs = {out};
    TFD_ASSIGN_OR_RETURN(plan.host_inputs[0],
                         out.UniformLocalShape(dims, "the output of '" + ctx.op_name + "'"));
    return plan;
  }
};

}  // namespace

std::shared_ptr<const Rule> ReplicatedStateful() {
  return std::make_shared<ReplicatedRule>(true);
}

namespace {

const bool kRegistered = RegisterRules({
    {"Fill", std::make_shared<FillRule>()},
    {"LinSpace", Replicated()},
    {"RandomStandardNormal", ReplicatedStateful()},
    {"RandomUniform", ReplicatedStateful()},
    {"RandomUniformInt", ReplicatedStateful()},
    {"Range", Replicated()},
    {"StatelessRandomGetAlg", Replicated()},
    {"StatelessRandomGetKeyCounter", Replicated()},
    {"StatelessRandomGetKeyCounterAlg", Replicated()},
    {"StatelessRandomNormal", Replicated()},
    {"StatelessRandomNormalV2", Replicated()},
    {"StatelessRandomUniform", Replicated()},
    {"StatelessRandomUniformFullInt", Replicated()},
    {"StatelessRandomUniformFullIntV2", Replicated()},
    {"StatelessRandomUniformInt", Replicated()},
    {"StatelessRandomUniformIntV2", Replicated()},
    {"StatelessRandomUniformV2", Replicated()},
    {"StatelessTruncatedNormal", Replicated()},
    {"StatelessTruncatedNormalV2", Replicated()},
    {"TruncatedNormal", ReplicatedStateful()},
    {"_EagerConst", Replicated()},
});

}  // namespace

std::shared_ptr<const Rule> Replicated() { return std::make_shared<ReplicatedRule>(false); }

}  // namespace tf_dtensor
