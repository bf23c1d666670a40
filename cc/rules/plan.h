// Planning one op: its rule's Forward, then the plan for pending reductions. Both
// dispatch paths and debug.explain plan through PlanOp.
#ifndef TF_DTENSOR_CC_RULES_PLAN_H_
#define TF_DTENSOR_CC_RULES_PLAN_H_

#include "cc/rules/rule.h"
#include "cc/rules/traits.h"

namespace tf_dtensor {

// Forward, then the plan for pending reductions: inputs an op is linear in (per its
// traits, or its rule's PartialThrough) keep theirs and pass them to the outputs;
// otherwise partial inputs are reduced first. With ctx.keep_partial a contraction's
// reduction stays pending in the output layouts.
StatusOr<Plan> PlanOp(const Rule& rule, const RuleTraits& traits, const OpContext& ctx);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_PLAN_H_
