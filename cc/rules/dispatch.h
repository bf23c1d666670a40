// One op through its rule: the path shared by the eager executor (cc/device) and the
// tf.function expander (cc/graph). The callers describe the inputs (ctx.inputs: shape,
// dtype, layout or none for a host tensor, resource) and add them to a Builder; dispatch
// does the rest the same way for both:
//   - host arguments (shapes, axes: Rule::IsHostArgument) are read as integer values;
//   - a host tensor used as data joins the op's mesh replicated;
//   - an op without a rule follows the one policy (FallbackPolicy, flag in the registry);
//   - the plan (PlanOp: Forward plus pending reductions) and its expansion.
#ifndef TF_DTENSOR_CC_RULES_DISPATCH_H_
#define TF_DTENSOR_CC_RULES_DISPATCH_H_

#include <functional>
#include <string>
#include <vector>

#include "cc/rules/plan_cache.h"
#include "cc/rules/rule.h"

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

// Runs the op described by `ctx` (its rule is `rule`, or null for an op without one) on
// `builder`, whose values for the op's inputs are `inputs`. Returns the outputs.
StatusOr<std::vector<ValueId>> Dispatch(const Rule* rule, OpContext& ctx,
                                        std::vector<ValueId> inputs, Builder& builder,
                                        const DispatchOptions& options);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_DISPATCH_H_
