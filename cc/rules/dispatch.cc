#include "cc/rules/dispatch.h"

#include "cc/rules/registry.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

Status ApplyFallbackPolicy(const OpContext& ctx, const FallbackPolicy& policy) {
  bool gathers = false;
  for (const InputInfo& in : ctx.inputs) {
    if (in.resource && !in.resource->value_layout.IsFullyReplicated()) {
      return Unimplemented("'" + ctx.op_name + "' has no tf_dtensor rule and uses a DVariable with "
                           "sharded layout " + in.resource->value_layout.ShortString() +
                           "; it cannot run on a replicated copy. Read the variable first "
                           "and pass the value instead.");
    }
    gathers = gathers || (in.layout && !in.resource && !in.layout->IsFullyReplicated());
  }
  if (policy.strict) {
    return Unimplemented(
        "'" + ctx.op_name + "' has no tf_dtensor rule (inputs: " + ctx.DescribeInputs() +
        "). Relayout its inputs to replicated yourself, or leave strict mode "
        "(`tf_dtensor.set_strict_mode(False)` or TF_DTENSOR_STRICT=0) to let tf_dtensor do "
        "that with a warning.");
  }
  if (gathers && policy.warn) {
    policy.warn(ctx.op_name, "tf_dtensor has no rule for '" + ctx.op_name +
                                 "': its sharded inputs were gathered to replicated and it ran "
                                 "on every device (inputs: " + ctx.DescribeInputs() +
                                 "). The result is correct but the work is not distributed.");
  }
  return Status::Ok();
}

StatusOr<std::vector<ValueId>> Dispatch(const Rule* rule, OpContext& ctx,
                                        std::vector<ValueId> inputs, Builder& builder,
                                        const DispatchOptions& options) {
  // No rule: run replicated (the documented policy, checked below); a stateful op once.
  static const std::shared_ptr<const Rule> fallback = Replicated();
  static const std::shared_ptr<const Rule> stateful_fallback = ReplicatedStateful();
  const bool has_rule = rule != nullptr;
  if (!rule) rule = options.stateful ? stateful_fallback.get() : fallback.get();
  const int n = static_cast<int>(inputs.size());
  for (int i = 0; i < n; ++i) {
    InputInfo& info = ctx.inputs[i];
    if (rule->IsHostArgument(i, n)) {
      info.int_value = builder.IntValue(inputs[i]);
      continue;
    }
    if (info.layout) continue;
    // A plain tensor used as data joins the mesh replicated.
    TFD_ASSIGN_OR_RETURN(inputs[i], builder.Broadcast(inputs[i], ctx.mesh));
    info.layout = Layout::Replicated(ctx.mesh, static_cast<int>(info.shape.size()));
    info.from_host = true;
  }
  // An axis sharded over several mesh dimensions ("x+y") is a storage layout: rules other
  // than relayouts and variable ops see it over its major dimension only.
  //   [x+y,*] -> all-gather, slice over x -> [x,*] -> the rule
  std::optional<Layout> caller_request = ctx.requested;
  if (!rule->HandlesMultiDimAxes()) {
    for (int i = 0; i < n; ++i) {
      InputInfo& info = ctx.inputs[i];
      if (!info.layout || !info.layout->HasMultiDimAxis()) continue;
      if (info.resource) {
        return InvalidArgument(
            "DTensor op " + ctx.DescribeOp() + options.where + " cannot use input " +
            std::to_string(i) + ", a DVariable with layout " +
            info.resource->value_layout.ShortString() + " whose axes are sharded over several "
            "mesh dimensions, in place. Read the variable and pass the value instead.");
      }
      TFD_ASSIGN_OR_RETURN(inputs[i], Relayout(builder, inputs[i], info.layout->MajorOnly(),
                                                "input " + std::to_string(i) + " of '" +
                                                    ctx.op_name + "'"));
      info.layout = info.layout->MajorOnly();
    }
    if (ctx.requested && ctx.requested->HasMultiDimAxis()) {
      ctx.requested = ctx.requested->MajorOnly();
    }
  }
  builder.SetInputs(inputs);
  if (!has_rule) TFD_RETURN_IF_ERROR(ApplyFallbackPolicy(ctx, options.policy));
  // Inside a function a contraction's all-reduce waits until the value is first needed
  // nonlinearly (or is returned). Eagerly it stays pending only when the user already works
  // with partial values; otherwise it is reduced at once, giving TF DTensor's layouts.
  ctx.in_function = options.in_function;
  ctx.keep_partial = options.in_function;
  for (const InputInfo& in : ctx.inputs) {
    ctx.keep_partial = ctx.keep_partial || (in.layout && in.layout->is_partial());
  }
  std::shared_ptr<const Plan> plan = options.cache ? options.cache->Find(rule, ctx) : nullptr;
  if (!plan) {
    StatusOr<Plan> made = PlanOp(*rule, ctx);
    if (!made.ok()) return WithContext(made.status(), "DTensor op " + ctx.DescribeOp() + options.where);
    plan = std::make_shared<const Plan>(std::move(made).value());
    if (options.cache) options.cache->Insert(rule, ctx, plan);
  }
  Builder& expand_with = options.expand_with ? *options.expand_with : builder;
  StatusOr<std::vector<ValueId>> results = rule->Expand(ctx, *plan, expand_with);
  ctx.requested = std::move(caller_request);
  if (!results.ok()) {
    return WithContext(results.status(), "DTensor op " + ctx.DescribeOp() + options.where);
  }
  // A TensorList (a variant DTensor) records its elements' layout as handle metadata
  // (tensor_list_rules.cc). Ops that pass lists on without knowing them (Identity,
  // ZerosLike, AddN of gradient lists) give a variant output that of their first list.
  for (ValueId out : *results) {
    if (!expand_with.layout(out) || expand_with.dtype(out) != TF_VARIANT ||
        expand_with.resource(out)) {
      continue;
    }
    for (int i = 0; i < n; ++i) {
      if (ctx.inputs[i].dtype == TF_VARIANT && ctx.inputs[i].resource) {
        expand_with.set_resource(out, *ctx.inputs[i].resource);
        break;
      }
    }
  }
  return results;
}

}  // namespace tf_dtensor
