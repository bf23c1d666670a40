// The default expansion of a plan, and its parts for rules that expand themselves:
// relayout the inputs to the plan, run the op on each device's blocks, all-reduce the
// partial outputs (or leave them pending).
#ifndef TF_DTENSOR_CC_RULES_EXPAND_H_
#define TF_DTENSOR_CC_RULES_EXPAND_H_

#include <vector>

#include "cc/rules/rule.h"

namespace tf_dtensor {

// Runs the default expansion: relayout inputs, local op, all-reduce partial outputs
// (or, with ctx.keep_partial, leave them pending).
StatusOr<std::vector<ValueId>> ExpandDefault(const OpContext& ctx, const Plan& plan,
                                             Builder& builder);
// The second half of ExpandDefault: runs the op on `inputs` (already in the plan's
// layouts) with `options`, then all-reduces partial outputs (or leaves them pending).
StatusOr<std::vector<ValueId>> ExpandWithInputs(const OpContext& ctx, const Plan& plan,
                                                const std::vector<ValueId>& inputs,
                                                const LocalOpOptions& options, Builder& builder);
// Relayouts (or replaces) the inputs as the plan says.
StatusOr<std::vector<ValueId>> PrepareInputs(const OpContext& ctx, const Plan& plan,
                                             Builder& builder);
// On each device of `mesh`, its own entry of `values` (one per shard along `mesh_dim`) as
// a value of `dtype`: a scalar, or with `as_scalar` false a [1] tensor (one op fewer; it
// broadcasts as a scalar does against any value of rank 1 or more). Replicated in
// layout, distinct along `mesh_dim` in value.
StatusOr<ValueId> PerDeviceEntry(Builder& builder, const Mesh& mesh,
                                 const std::vector<int64_t>& values, int mesh_dim, int dtype,
                                 bool as_scalar = true);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_EXPAND_H_
