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
  for (size_t i = 0; i < inputs.size() && i < ctx.inputs.size(); ++i) {
    if (inputs[i] && ctx.inputs[i].layout && *inputs[i] != *ctx.inputs[i].layout) {
      out.push_back("relayout input " + std::to_string(i) + " " +
                    ctx.inputs[i].layout->SpecString() + " -> " + inputs[i]->SpecString());
    }
  }
  for (size_t o = 0; o < partial_dims.size(); ++o) {
    if (partial_dims[o].empty()) continue;
    std::vector<std::string> names;
    for (int d : partial_dims[o]) names.push_back(ctx.mesh.dims()[d].name);
    out.push_back("all-reduce(" + std::string(ReduceOpName(partial_op)) + ") of output " +
                  std::to_string(o) + " over " + Join(names, ","));
  }
  return out;
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
    } else if (i < static_cast<int>(plan.inputs.size()) && plan.inputs[i]) {
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
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> outputs,
                       builder.LocalOp(ctx.op_name, inputs, options, plan.outputs));
  for (size_t o = 0; o < outputs.size() && o < plan.partial_dims.size(); ++o) {
    if (plan.partial_dims[o].empty()) continue;
    TFD_ASSIGN_OR_RETURN(outputs[o],
                         builder.AllReduce(outputs[o], plan.partial_dims[o], plan.partial_op));
  }
  return outputs;
}

StatusOr<std::vector<ValueId>> Rule::Expand(const OpContext& ctx, const Plan& plan,
                                            Builder& builder) const {
  return ExpandDefault(ctx, plan, builder);
}

}  // namespace tf_dtensor
