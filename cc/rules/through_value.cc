#include "cc/rules/through_value.h"

#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

class ThroughValueRule : public Rule {
 public:
  explicit ThroughValueRule(ThroughValueSpec spec) : spec_(std::move(spec)) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan inner, InnerPlan(ctx));
    const Layout& variable = ctx.inputs[0].resource->value_layout;
    const Layout value = inner.inputs[0] ? *inner.inputs[0] : variable;
    Plan plan = inner;
    plan.through = std::make_shared<const Plan>(std::move(inner));
    plan.inputs[0] = std::nullopt;
    if (value != variable) {
      plan.notes.push_back("reads the DVariable's value " + variable.ShortString() + " as " +
                           value.ShortString() + " for '" + spec_.functional + "'" +
                           (spec_.writes ? ", and writes the result back as " +
                                               variable.ShortString()
                                         : ""));
    }
    if (spec_.writes) {
      plan.outputs.clear();
      plan.partial_dims.clear();
    }
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    // Forward's plan of the functional op (planned again only for a plan made elsewhere).
    Plan planned;
    if (!plan.through) {
      TFD_ASSIGN_OR_RETURN(planned, InnerPlan(ctx));
    }
    const Plan& inner = plan.through ? *plan.through : planned;
    const ResourceInfo& resource = *ctx.inputs[0].resource;
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    const ValueId handle = inputs[0];
    LocalOpOptions read;
    read.copy_attrs = false;
    read.overrides = {AttrOverride::Type("dtype", resource.value_dtype)};
    read.global_shapes = {resource.value_shape};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> value,
                         builder.LocalOp("ReadVariableOp", {handle}, read,
                                         {resource.value_layout}));
    inputs[0] = value[0];
    if (inner.inputs[0] && *inner.inputs[0] != resource.value_layout) {
      TFD_ASSIGN_OR_RETURN(inputs[0], Relayout(builder, inputs[0], *inner.inputs[0],
                                               "the value of the DVariable of '" +
                                                   ctx.op_name + "'"));
    }
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = plan.overrides;
    for (const std::string& name : spec_.carried) {
      const std::string& from = name == spec_.renamed.first ? spec_.renamed.second : name;
      const AttrValue* a = ctx.attrs->Find(from);
      if (!a) continue;
      if (a->type) options.overrides.push_back(AttrOverride::Type(name, *a->type));
      if (a->i) options.overrides.push_back(AttrOverride::Int(name, *a->i));
      if (a->s) options.overrides.push_back(AttrOverride::String(name, *a->s));
      if (a->b) options.overrides.push_back(AttrOverride::Bool(name, *a->b));
    }
    OpContext functional(spec_.functional, ctx.attrs, ctx.mesh);
    if (!spec_.writes) return ExpandWithInputs(functional, plan, inputs, options, builder);
    options.global_shapes = {resource.value_shape};  // an update keeps the value's shape
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> updated,
                         ExpandWithInputs(functional, inner, inputs, options, builder));
    ValueId back = updated[0];
    if (*builder.layout(back) != resource.value_layout) {
      TFD_ASSIGN_OR_RETURN(back, Relayout(builder, back, resource.value_layout,
                                          "the result of '" + ctx.op_name + "'"));
    }
    LocalOpOptions assign;
    assign.copy_attrs = false;
    assign.overrides = {AttrOverride::Type("dtype", resource.value_dtype)};
    TFD_RETURN_IF_ERROR(builder.LocalOp("AssignVariableOp", {handle, back}, assign, {}).status());
    return std::vector<ValueId>{};
  }

 private:
  // The functional op's plan, its input 0 the DVariable's value.
  StatusOr<Plan> InnerPlan(const OpContext& ctx) const {
    if (ctx.inputs.empty() || !ctx.inputs[0].resource) {
      return InvalidArgument("'" + ctx.op_name + "' needs a DVariable handle as input 0; got " +
                             (ctx.inputs.empty() ? std::string("no input") : ctx.Describe(0)) +
                             ".");
    }
    const ResourceInfo& resource = *ctx.inputs[0].resource;
    const RegisteredRule* rule = RuleRegistry::Global().Find(spec_.functional);
    if (!rule) {
      return Internal("'" + spec_.functional + "' has no rule to run '" + ctx.op_name +
                      "' with.");
    }
    OpContext inner(spec_.functional, ctx.attrs, ctx.mesh);
    inner.inputs = ctx.inputs;
    inner.inputs[0] = InputInfo{resource.value_shape, resource.value_dtype,
                                resource.value_layout};
    inner.keep_partial = ctx.keep_partial;
    inner.in_function = ctx.in_function;
    return rule->rule->Forward(inner);
  }

  ThroughValueSpec spec_;
};

}  // namespace

std::shared_ptr<const Rule> ThroughValue(ThroughValueSpec spec) {
  return std::make_shared<ThroughValueRule>(std::move(spec));
}

}  // namespace tf_dtensor
