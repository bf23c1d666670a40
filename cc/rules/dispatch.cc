#include "cc/rules/dispatch.h"

#include <set>
#include <string>

#include "cc/rules/plan.h"
#include "cc/spmd/ledger.h"
#include "cc/spmd/lowering.h"
#include "cc/spmd/relayout.h"
#include "cc/tf/ops.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

Status ApplyFallbackPolicy(const OpContext& ctx, const FallbackPolicy& policy) {
  bool gathers = false;
  for (const InputInfo& in : ctx.inputs) {
    if (in.resource && in.dtype == TF_VARIANT && !in.resource->value_layout.IsFullyReplicated()) {
      // A TensorList (a loop's accumulator, a TensorArray) whose elements are sharded: its
      // elements cannot be gathered inside it.
      return Unimplemented(
          "'" + ctx.op_name + "' has no tf_dtensor rule and takes a TensorList (a loop's "
          "accumulator or a TensorArray) whose elements are sharded (" +
          in.resource->value_layout.ShortString() + "); it cannot run on a replicated copy. "
          "Relayout the values written to the list to replicated, or, for a gradient "
          "through nested tf.cond and loops, make the loop's inputs replicated.");
    }
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

Status PrepareContext(const RuleTraits& traits, OpContext& ctx, bool in_function,
                      const std::string& where,
                      const std::function<std::optional<std::vector<int64_t>>(int)>& int_value) {
  const int n = static_cast<int>(ctx.inputs.size());
  for (int i = 0; i < n; ++i) {
    InputInfo& info = ctx.inputs[i];
    if (traits.IsHostInput(i, n)) {
      info.int_value = int_value(i);
      continue;
    }
    if (info.layout) continue;
    // A plain tensor used as data joins the mesh replicated.
    info.layout = Layout::Replicated(ctx.mesh, static_cast<int>(info.shape.size()));
    info.from_host = true;
  }
  // A variable whose replicas share one buffer (made under the shared lowering) cannot be
  // updated under a lowering that runs each device separately (each device's update would
  // go to the one buffer: applied N times), nor one with a variable per device under the
  // shared lowering (only the first device's copy would change). Reads are fine.
  static const std::set<std::string>* const kReadsOnly = new std::set<std::string>{
      "DestroyResourceOp", "ReadVariableOp", "VarIsInitializedOp", "VariableShape"};
  for (int i = 0; i < n; ++i) {
    const InputInfo& info = ctx.inputs[i];
    if (!info.resource || !info.resource->shared_storage) continue;
    const bool shares = CollectiveLowering::For(ctx.mesh).shares_buffers();
    if (*info.resource->shared_storage != shares && !kReadsOnly->count(ctx.op_name)) {
      return FailedPrecondition(
          "DTensor op " + ctx.DescribeOp() + where + " uses input " + std::to_string(i) +
          ", a DVariable (" + info.resource->value_layout.ShortString() + ") created under a "
          "collective lowering that " + (shares ? "gives each device its own" : "shares one") +
          " variable for devices holding the same block, but the lowering in force now " +
          (shares ? "shares buffers" : "runs each device separately") +
          ": an update now would be applied once per device, or to one device's copy only "
          "(reading it is fine). Choose the lowering (`set_collective_lowering`, "
          "TF_DTENSOR_COLLECTIVES) before creating variables, or create the variable again.");
    }
  }
  // An axis sharded over several mesh dimensions ("x+y") is a storage layout: rules other
  // than relayouts and variable ops see it over its major dimension only.
  //   [x+y,*] -> all-gather, slice over x -> [x,*] -> the rule
  if (!traits.multi_dim_axes) {
    for (int i = 0; i < n; ++i) {
      InputInfo& info = ctx.inputs[i];
      if (!info.layout || !info.layout->HasMultiDimAxis()) continue;
      if (info.resource) {
        return InvalidArgument(
            "DTensor op " + ctx.DescribeOp() + where + " cannot use input " +
            std::to_string(i) + ", a DVariable with layout " +
            info.resource->value_layout.ShortString() + " whose axes are sharded over several "
            "mesh dimensions, in place. Read the variable and pass the value instead.");
      }
      info.layout = info.layout->MajorOnly();
    }
    if (ctx.requested && ctx.requested->HasMultiDimAxis()) {
      ctx.requested = ctx.requested->MajorOnly();
    }
  }
  // Inside a function a contraction's all-reduce waits until the value is first needed
  // nonlinearly (or is returned). Eagerly it stays pending only when the user already works
  // with partial values; otherwise it is reduced at once, giving TF DTensor's layouts.
  ctx.in_function = in_function;
  ctx.keep_partial = in_function;
  for (const InputInfo& in : ctx.inputs) {
    ctx.keep_partial = ctx.keep_partial || (in.layout && in.layout->is_partial());
  }
  return Status::Ok();
}

// Whether a rule that could not plan runs as one device would instead (FallbackRule): some
// host input whose value it may need is known only at run time, no host input is sharded,
// and either every DTensor input is replicated on every axis (pending reductions allowed:
// each device computes what one device would, nothing is gathered) or the unknown host
// inputs are all axes. Which axes a reduction, scan, concat or reverse works on is then
// known only when it runs (the gradient of `x * y` of sizes known only at run time sums
// over the axes BroadcastGradientArgs gives): the sharded inputs are gathered, since any
// of their axes may be one of them, and each device runs the op as one device would.
bool RunsReplicatedWithoutValues(const RuleTraits& traits, const OpContext& ctx) {
  const int n = static_cast<int>(ctx.inputs.size());
  bool unknown = false;
  bool only_axes_unknown = true;
  bool sharded_data = false;
  for (int i = 0; i < n; ++i) {
    const InputInfo& in = ctx.inputs[i];
    if (in.resource) return false;
    const bool sharded = in.layout && !in.layout->WithoutPartial().IsFullyReplicated();
    const std::optional<HostValue> host = traits.HostInput(i, n);
    if (!host) {
      sharded_data = sharded_data || sharded;
      continue;
    }
    if (sharded) return false;
    if (!in.int_value) {
      unknown = true;
      only_axes_unknown = only_axes_unknown && *host == HostValue::kAxis;
    }
  }
  return unknown && (!sharded_data || only_axes_unknown);
}

StatusOr<std::vector<ValueId>> Dispatch(const RegisteredRule* entry, OpContext& ctx,
                                        std::vector<ValueId> inputs, Builder& builder,
                                        const DispatchOptions& options) {
  // No rule: run replicated (the documented policy, checked below); a stateful op once.
  const bool has_rule = entry != nullptr;
  // Names the op in the collective ledger (its registration row says whether it is the
  // user's relayout, whose collectives were asked for).
  const ledger::OpScope op_scope(ctx.op_name, has_rule && entry->traits.user_relayout);
  if (!entry) entry = &FallbackRule(options.stateful);
  const Rule* rule = entry->rule.get();
  const int n = static_cast<int>(inputs.size());
  std::vector<std::optional<Layout>> given(n);
  for (int i = 0; i < n; ++i) given[i] = ctx.inputs[i].layout;
  std::optional<Layout> caller_request = ctx.requested;
  TFD_RETURN_IF_ERROR(PrepareContext(entry->traits, ctx, options.in_function, options.where,
                                     [&](int i) { return builder.IntValue(inputs[i]); }));
  // Emit what PrepareContext decided: host data broadcast, then multi-dimension axes
  // relaid out to their major dimension.
  for (int i = 0; i < n; ++i) {
    if (!given[i] && ctx.inputs[i].from_host) {
      TFD_ASSIGN_OR_RETURN(inputs[i], builder.Broadcast(inputs[i], ctx.mesh));
    }
  }
  for (int i = 0; i < n; ++i) {
    if (!given[i] || !ctx.inputs[i].layout || *given[i] == *ctx.inputs[i].layout) continue;
    TFD_ASSIGN_OR_RETURN(inputs[i], Relayout(builder, inputs[i], *ctx.inputs[i].layout,
                                              "input " + std::to_string(i) + " of '" +
                                                  ctx.op_name + "'"));
  }
  builder.SetInputs(inputs);
  if (!has_rule) TFD_RETURN_IF_ERROR(ApplyFallbackPolicy(ctx, options.policy));
  std::shared_ptr<const Plan> plan = options.cache ? options.cache->Find(*entry, ctx) : nullptr;
  if (!plan) {
    StatusOr<Plan> made = PlanOp(*rule, entry->traits, ctx);
    // A rule that cannot plan without a host value known only at run time (a shape made
    // of data-dependent sizes) runs replicated where no input is sharded: each device
    // computes what one device would, nothing is gathered (pending sums are reduced).
    if (!made.ok() && has_rule && RunsReplicatedWithoutValues(entry->traits, ctx)) {
      entry = &FallbackRule(options.stateful);
      rule = entry->rule.get();
      made = PlanOp(*rule, entry->traits, ctx);
    }
    if (!made.ok()) return WithContext(made.status(), "DTensor op " + ctx.DescribeOp() + options.where);
    plan = std::make_shared<const Plan>(std::move(made).value());
    if (options.cache) options.cache->Insert(*entry, ctx, plan);
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
