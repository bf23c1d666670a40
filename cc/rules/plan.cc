#include "cc/rules/plan.h"

#include "cc/tf/dtypes.h"

namespace tf_dtensor {
namespace {

// Pending sums, and means of real or complex numbers, pass through linear ops; an integer
// mean truncates (trunc(a/n) + trunc(b/n) is not trunc((a+b)/n)), so it is made first.
bool SumLike(const std::vector<PartialSpec>& partial, int dtype) {
  for (const PartialSpec& p : partial) {
    if (p.op != ReduceOp::kSum && (p.op != ReduceOp::kMean || IsIntegerDType(dtype))) return false;
  }
  return true;
}

bool AllOps(const std::vector<PartialSpec>& partial, ReduceOp op) {
  for (const PartialSpec& p : partial) {
    if (p.op != op) return false;
  }
  return true;
}

// The pending reductions the outputs get when the op runs on partial inputs unreduced,
// or nullopt when they must be reduced first; see Linearity.
std::optional<std::vector<PartialSpec>> PassedReductions(const Rule& rule,
                                                         const RuleTraits& traits,
                                                         const OpContext& ctx) {
  if (traits.linearity == Linearity::kNone) return rule.PartialThrough(ctx);
  const int n = static_cast<int>(ctx.inputs.size());
  std::vector<int> data, partial;
  for (int i = 0; i < n; ++i) {
    if (traits.IsHostInput(i, n) || !ctx.inputs[i].layout) continue;
    data.push_back(i);
    if (ctx.inputs[i].layout->is_partial()) partial.push_back(i);
  }
  if (partial.empty()) return std::nullopt;
  const std::vector<PartialSpec>& first = ctx.inputs[partial[0]].layout->partial();
  const int dtype = ctx.inputs[partial[0]].dtype;
  switch (traits.linearity) {
    case Linearity::kNone:
      return std::nullopt;
    case Linearity::kEachInput:
      if (partial.size() != data.size() || !SumLike(first, dtype)) return std::nullopt;
      for (int i : partial) {
        if (ctx.inputs[i].layout->partial() != first) return std::nullopt;
      }
      return first;
    case Linearity::kOneInput:
      if (partial.size() != 1 || !SumLike(first, dtype)) return std::nullopt;
      return first;
    case Linearity::kFirstInput:
      // (a + b) / c is a/c + b/c for real and complex numbers, not for truncating integers.
      if (partial.size() != 1 || partial[0] != data[0] || !SumLike(first, dtype) ||
          IsIntegerDType(ctx.inputs[partial[0]].dtype)) {
        return std::nullopt;
      }
      return first;
    case Linearity::kStructural:
      if (data.size() != 1) return std::nullopt;
      return first;
    case Linearity::kSum:
      if (data.size() != 1 || !SumLike(first, dtype)) return std::nullopt;
      return first;
    case Linearity::kMax:
      if (data.size() != 1 || !AllOps(first, ReduceOp::kMax)) return std::nullopt;
      return first;
    case Linearity::kMin:
      if (data.size() != 1 || !AllOps(first, ReduceOp::kMin)) return std::nullopt;
      return first;
  }
  return std::nullopt;
}

// With ctx.keep_partial, a contraction's partial results stay pending: the output layouts
// say so ([*,x] @ [x,*] -> [*,*] +partial(x:sum)) and the expansion skips the all-reduce.
Plan DeferContraction(const OpContext& ctx, Plan plan) {
  if (!ctx.keep_partial) return plan;
  for (size_t o = 0; o < plan.partial_dims.size() && o < plan.outputs.size(); ++o) {
    std::vector<PartialSpec> pending;
    for (int d : plan.partial_dims[o]) pending.push_back({d, plan.partial_op});
    StatusOr<Layout> with = plan.outputs[o].WithPartial(pending);
    if (with.ok()) plan.outputs[o] = *with;
  }
  return plan;
}

StatusOr<Plan> PlanPartialInputs(const Rule& rule, const RuleTraits& traits, const OpContext& ctx,
                                 Plan plan) {
  bool any_partial = false;
  for (const InputInfo& in : ctx.inputs) any_partial = any_partial || (in.layout && in.layout->is_partial());
  if (!any_partial) return plan;
  const int n = static_cast<int>(ctx.inputs.size());
  if (plan.inputs.size() < ctx.inputs.size()) plan.inputs.resize(ctx.inputs.size());
  // Try to keep the pending reductions: each partial input keeps its own, the outputs get
  // the op's. Any clash with the planned sharding (a mesh dim both sharding and pending)
  // falls back to reducing first.
  std::optional<std::vector<PartialSpec>> through = PassedReductions(rule, traits, ctx);
  Plan kept = plan;
  for (int i = 0; through && i < n; ++i) {
    const std::optional<Layout>& in = ctx.inputs[i].layout;
    if (!in || !in->is_partial() || plan.host_inputs.count(i)) continue;
    const Layout base = (plan.inputs[i] ? *plan.inputs[i] : *in).WithoutPartial();
    StatusOr<Layout> with = base.WithPartial(in->partial());
    if (!with.ok()) through.reset();
    else kept.inputs[i] = *with;
  }
  for (size_t o = 0; through && o < kept.outputs.size(); ++o) {
    StatusOr<Layout> with = kept.outputs[o].WithoutPartial().WithPartial(*through);
    if (!with.ok()) through.reset();
    else kept.outputs[o] = *with;
  }
  for (size_t o = 0; through && o < kept.partial_dims.size(); ++o) {
    for (int d : kept.partial_dims[o]) {
      for (const PartialSpec& p : *through) {
        if (p.mesh_dim == d) through.reset();
      }
      if (!through) break;
    }
  }
  if (through && !kept.outputs.empty()) return kept;
  // Reduce first: partial inputs are relaid out to their sharding without pending values.
  for (int i = 0; i < n; ++i) {
    const std::optional<Layout>& in = ctx.inputs[i].layout;
    if (!in || !in->is_partial() || plan.host_inputs.count(i)) continue;
    plan.inputs[i] = (plan.inputs[i] ? *plan.inputs[i] : *in).WithoutPartial();
  }
  for (Layout& out : plan.outputs) out = out.WithoutPartial();
  return plan;
}

}  // namespace

StatusOr<Plan> PlanOp(const Rule& rule, const RuleTraits& traits, const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(Plan plan, rule.Forward(ctx));
  if (!rule.PlansPendingReductions()) {
    TFD_ASSIGN_OR_RETURN(plan, PlanPartialInputs(rule, traits, ctx, std::move(plan)));
  }
  return DeferContraction(ctx, std::move(plan));
}

}  // namespace tf_dtensor
