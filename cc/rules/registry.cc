#include "cc/rules/registry.h"

#include "cc/core/strings.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {

RuleRegistry& RuleRegistry::Global() {
  static RuleRegistry* registry = new RuleRegistry();
  return *registry;
}

Status RuleRegistry::Register(const std::string& op_name, std::shared_ptr<const Rule> rule) {
  if (!rules_.emplace(op_name, std::move(rule)).second) {
    return Status(Code::kAlreadyExists,
                  "The rule for op '" + op_name +
                      "' is registered twice; each op has one rule, registered in the block "
                      "at the bottom of its family's <family>_rules.cc. Remove one.");
  }
  return Status::Ok();
}

void RuleRegistry::RegisterAll(
    std::vector<std::pair<std::string, std::shared_ptr<const Rule>>> rules) {
  for (auto& [name, rule] : rules) {
    Status status = Register(name, std::move(rule));
    if (!status.ok()) registration_errors_.push_back(std::move(status));
  }
}

const Rule* RuleRegistry::Find(const std::string& op_name) const {
  auto it = rules_.find(op_name);
  return it == rules_.end() ? nullptr : it->second.get();
}

std::vector<std::string> RuleRegistry::OpNames() const {
  std::vector<std::string> names;
  for (const auto& [name, rule] : rules_) names.push_back(name);
  return names;
}

bool RegisterRules(std::vector<std::pair<std::string, std::shared_ptr<const Rule>>> rules) {
  RuleRegistry& registry = RuleRegistry::Global();
  const size_t errors = registry.registration_errors().size();
  registry.RegisterAll(std::move(rules));
  return registry.registration_errors().size() == errors;
}

std::string OpContext::Describe(int input) const {
  const InputInfo& in = inputs[input];
  std::string text = "input " + std::to_string(input) + " (shape " + ShapeString(in.shape);
  if (in.layout) text += ", layout " + in.layout->SpecString();
  return text + ") of '" + op_name + "'";
}

std::string OpContext::DescribeInputs() const {
  std::vector<std::string> parts;
  for (const InputInfo& in : inputs) {
    parts.push_back(in.layout ? in.layout->ShortString() : "host " + ShapeString(in.shape));
  }
  return Join(parts, ", ");
}

std::string OpContext::DescribeOp() const {
  return "'" + op_name + "' with inputs (" + DescribeInputs() + ")";
}

StatusOr<std::vector<int64_t>> OpContext::IntValue(int input, const std::string& what) const {
  if (input >= static_cast<int>(inputs.size()) || !inputs[input].int_value) {
    return InvalidArgument("'" + op_name + "' needs its " + what + " (input " +
                           std::to_string(input) +
                           ") as a constant integer tensor that is on the host or replicated; "
                           "got a sharded or non-integer tensor. Relayout it to replicated.");
  }
  return *inputs[input].int_value;
}

std::vector<std::string> Plan::Collectives(const OpContext& ctx) const {
  std::vector<std::string> out;
  // The inputs' relayouts, planned by the function that plans them for ExpandDefault.
  for (size_t i = 0; i < inputs.size() && i < ctx.inputs.size(); ++i) {
    const InputInfo& in = ctx.inputs[i];
    if (!inputs[i] || !in.layout || *inputs[i] == *in.layout) continue;
    for (const std::string& line : DescribeRelayout(*in.layout, *inputs[i], in.shape,
                                                    ctx.Describe(static_cast<int>(i)),
                                                    in.resource.has_value())) {
      out.push_back("input " + std::to_string(i) + ": " + line);
    }
  }
  for (size_t o = 0; o < partial_dims.size(); ++o) {
    if (partial_dims[o].empty()) continue;
    std::vector<std::string> names;
    for (int d : partial_dims[o]) names.push_back(ctx.mesh.dims()[d].name);
    out.push_back((ctx.keep_partial ? "partial(" : "all-reduce(") +
                  std::string(ReduceOpName(partial_op)) + ") of output " + std::to_string(o) +
                  " over " + Join(names, ",") + (ctx.keep_partial ? ", reduced where needed" : ""));
  }
  out.insert(out.end(), notes.begin(), notes.end());
  if (!passed_partial.empty()) {
    std::vector<std::string> names;
    for (const PartialSpec& p : passed_partial) {
      names.push_back(ctx.mesh.dims()[p.mesh_dim].name + ":" + ReduceOpName(p.op));
    }
    out.push_back("outputs stay partial(" + Join(names, ",") + ")");
  }
  return out;
}

namespace {

bool SumLike(const std::vector<PartialSpec>& partial) {
  for (const PartialSpec& p : partial) {
    if (p.op != ReduceOp::kSum && p.op != ReduceOp::kMean) return false;
  }
  return true;
}

bool AllOps(const std::vector<PartialSpec>& partial, ReduceOp op) {
  for (const PartialSpec& p : partial) {
    if (p.op != op) return false;
  }
  return true;
}

class LinearRule : public Rule {
 public:
  LinearRule(std::shared_ptr<const Rule> inner, Linearity how)
      : inner_(std::move(inner)), how_(how) {}
  bool IsHostArgument(int input, int num_inputs) const override {
    return inner_->IsHostArgument(input, num_inputs);
  }
  StatusOr<Plan> Forward(const OpContext& ctx) const override { return inner_->Forward(ctx); }
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx,
      const std::vector<std::optional<Layout>>& requested_outputs) const override {
    return inner_->Backward(ctx, requested_outputs);
  }
  bool ReadsRequest() const override { return inner_->ReadsRequest(); }
  bool MakesMeshValue() const override { return inner_->MakesMeshValue(); }
  bool HandlesMultiDimAxes() const override { return inner_->HandlesMultiDimAxes(); }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    return inner_->Expand(ctx, plan, builder);
  }
  std::optional<std::vector<PartialSpec>> PartialThrough(const OpContext& ctx) const override {
    const int n = static_cast<int>(ctx.inputs.size());
    std::vector<int> data, partial;
    for (int i = 0; i < n; ++i) {
      if (IsHostArgument(i, n) || !ctx.inputs[i].layout) continue;
      data.push_back(i);
      if (ctx.inputs[i].layout->is_partial()) partial.push_back(i);
    }
    if (partial.empty()) return std::nullopt;
    const std::vector<PartialSpec>& first = ctx.inputs[partial[0]].layout->partial();
    switch (how_) {
      case Linearity::kEachInput:
        if (partial.size() != data.size() || !SumLike(first)) return std::nullopt;
        for (int i : partial) {
          if (ctx.inputs[i].layout->partial() != first) return std::nullopt;
        }
        return first;
      case Linearity::kOneInput:
        if (partial.size() != 1 || !SumLike(first)) return std::nullopt;
        return first;
      case Linearity::kFirstInput:
        if (partial.size() != 1 || partial[0] != data[0] || !SumLike(first)) return std::nullopt;
        return first;
      case Linearity::kStructural:
        if (data.size() != 1) return std::nullopt;
        return first;
      case Linearity::kSum:
        if (data.size() != 1 || !SumLike(first)) return std::nullopt;
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

 private:
  std::shared_ptr<const Rule> inner_;
  Linearity how_;
};

}  // namespace

std::shared_ptr<const Rule> Linear(std::shared_ptr<const Rule> rule, Linearity how) {
  return std::make_shared<LinearRule>(std::move(rule), how);
}

namespace {

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

StatusOr<Plan> PlanPartialInputs(const Rule& rule, const OpContext& ctx, Plan plan) {
  bool any_partial = false;
  for (const InputInfo& in : ctx.inputs) any_partial = any_partial || (in.layout && in.layout->is_partial());
  if (!any_partial) return plan;
  const int n = static_cast<int>(ctx.inputs.size());
  if (plan.inputs.size() < ctx.inputs.size()) plan.inputs.resize(ctx.inputs.size());
  // Try to keep the pending reductions: each partial input keeps its own, the outputs get
  // the op's. Any clash with the planned sharding (a mesh dim both sharding and pending)
  // falls back to reducing first.
  std::optional<std::vector<PartialSpec>> through = rule.PartialThrough(ctx);
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
  if (through && !kept.outputs.empty()) {
    kept.passed_partial = *through;
    return kept;
  }
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

StatusOr<Plan> PlanOp(const Rule& rule, const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(Plan plan, rule.Forward(ctx));
  TFD_ASSIGN_OR_RETURN(plan, PlanPartialInputs(rule, ctx, std::move(plan)));
  return DeferContraction(ctx, std::move(plan));
}

StatusOr<std::vector<ValueId>> PrepareInputs(const OpContext& ctx, const Plan& plan,
                                             Builder& builder) {
  std::vector<ValueId> inputs;
  for (int i = 0; i < builder.num_inputs(); ++i) {
    auto host = plan.host_inputs.find(i);
    if (host != plan.host_inputs.end()) {
      int dtype = ctx.inputs[i].dtype;
      std::vector<int64_t> shape = {static_cast<int64_t>(host->second.size())};
      TFD_ASSIGN_OR_RETURN(ValueId v, builder.HostConstant(host->second, shape, dtype));
      inputs.push_back(v);
    } else if (i < static_cast<int>(plan.inputs.size()) && plan.inputs[i] &&
               builder.layout(builder.input(i)) != plan.inputs[i]) {
      // The description is formatted only when a relayout is needed (the common case
      // is an input already in its planned layout).
      TFD_ASSIGN_OR_RETURN(ValueId v,
                           Relayout(builder, builder.input(i), *plan.inputs[i], ctx.Describe(i)));
      inputs.push_back(v);
    } else {
      inputs.push_back(builder.input(i));
    }
  }
  return inputs;
}

StatusOr<std::vector<ValueId>> ExpandDefault(const OpContext& ctx, const Plan& plan,
                                             Builder& builder) {
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
  LocalOpOptions options;
  options.overrides = plan.overrides;
  return ExpandWithInputs(ctx, plan, inputs, options, builder);
}

StatusOr<std::vector<ValueId>> ExpandWithInputs(const OpContext& ctx, const Plan& plan,
                                                const std::vector<ValueId>& inputs,
                                                const LocalOpOptions& options, Builder& builder) {
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> outputs,
                       builder.LocalOp(ctx.op_name, inputs, options, plan.outputs));
  for (size_t o = 0; o < outputs.size() && o < plan.partial_dims.size(); ++o) {
    if (plan.partial_dims[o].empty()) continue;
    // Deferred (PlanOp put the pending reductions in the output layout): nothing to do.
    bool deferred = true;
    for (int d : plan.partial_dims[o]) {
      bool found = false;
      for (const PartialSpec& p : builder.layout(outputs[o])->partial()) found = found || p.mesh_dim == d;
      deferred = deferred && found;
    }
    if (deferred) continue;
    TFD_ASSIGN_OR_RETURN(outputs[o],
                         builder.AllReduce(outputs[o], plan.partial_dims[o], plan.partial_op));
  }
  return outputs;
}

const Layout* UsableRequest(const OpContext& ctx,
                            const std::vector<std::optional<Layout>>& requested_outputs, int o,
                            int rank) {
  if (o < 0 || o >= static_cast<int>(requested_outputs.size())) return nullptr;
  const std::optional<Layout>& r = requested_outputs[o];
  if (!r || r->mesh() != ctx.mesh || r->rank() != rank || r->is_single_device()) return nullptr;
  return &*r;
}

std::vector<std::optional<Layout>> Rule::Backward(
    const OpContext& ctx, const std::vector<std::optional<Layout>>&) const {
  return std::vector<std::optional<Layout>>(ctx.inputs.size());
}

StatusOr<std::vector<ValueId>> Rule::Expand(const OpContext& ctx, const Plan& plan,
                                            Builder& builder) const {
  return ExpandDefault(ctx, plan, builder);
}

}  // namespace tf_dtensor
