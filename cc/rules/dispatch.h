// One op through its rule: the path shared by the eager executor (cc/device) and the
// tf.function expander (cc/graph). The callers describe the inputs (ctx.inputs: shape,
// dtype, layout or none for a host tensor, resource) and add them to a Builder; dispatch
// does the rest the same way for both:
//   - host arguments (shapes, axes: RuleTraits::host_inputs) are read as integer values;
//   - a host tensor used as data joins the op's mesh replicated;
//   - an op without a rule follows the one policy (FallbackPolicy, flag in the registry);
//   - the plan (PlanOp: Forward plus pending reductions) and its expansion.
#ifndef TF_DTENSOR_CC_RULES_DISPATCH_H_
#define TF_DTENSOR_CC_RULES_DISPATCH_H_

#include <functional>
#include <string>
#include <vector>

#include "cc/rules/plan_cache.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {

// How ops without a rule are treated (README, "Ops without a rule"): strict mode raises,
// otherwise sharded inputs are gathered with a warning once per op name.
struct FallbackPolicy {
  bool strict = false;
  std::function<void(const std::string& op_name, const std::string& message)> warn;
};

// Checks an op with no rule against the policy: strict mode raises, a sharded DVariable
// cannot be used, and gathering sharded inputs warns once per op name.
Status ApplyFallbackPolicy(const OpContext& ctx, const FallbackPolicy& policy);

struct DispatchOptions {
  FallbackPolicy policy;
  // Inside tf.function a contraction's all-reduce is deferred to where it is needed.
  bool in_function = false;
  // The builder the rule expands on, when it wraps `builder` (parted values); else null.
  Builder* expand_with = nullptr;
  // Appended to "DTensor op 'X' with inputs (...)" in errors, e.g. " (node 'n' of ...)".
  std::string where;
  // The op is stateful (its OpDef says so): without a rule it runs once and its result is
  // shared, so the replicas of an unregistered random or shuffle op agree on every mesh.
  bool stateful = false;
  // Plans made before (the eager path); null plans every time (tf.function expansion,
  // which runs once per traced signature anyway).
  PlanCache* cache = nullptr;
};

// The pure front half of Dispatch: makes `ctx` what the rule sees, with no builder.
//   - host arguments (per the traits) get their integer values from `int_value(i)`
//     (nullopt: not a constant, which Forward reports if it reads it);
//   - any other input without a layout is a host tensor used as data: it joins the mesh
//     replicated (from_host);
//   - unless the traits take axes over several mesh dimensions, such layouts and the
//     request are seen over each axis's major dimension ([x+y,*] -> [x,*]); a DVariable
//     with such a layout cannot be used in place (an error naming the op and `where`);
//   - keep_partial: inside a function, or when an input is already partial.
// Dispatch emits what this decided (broadcasts, relayouts); debug.explain plans on it.
Status PrepareContext(const RuleTraits& traits, OpContext& ctx, bool in_function,
                      const std::string& where,
                      const std::function<std::optional<std::vector<int64_t>>(int)>& int_value);

// Runs the op described by `ctx` (its registry entry is `rule`, or null for an op without
// one) on `builder`, whose values for the op's inputs are `inputs`. Returns the outputs.
StatusOr<std::vector<ValueId>> Dispatch(const RegisteredRule* rule, OpContext& ctx,
                                        std::vector<ValueId> inputs, Builder& builder,
                                        const DispatchOptions& options);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_DISPATCH_H_
