#include "cc/rules/registry.h"

#include "cc/core/strings.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {

RuleRegistry& RuleRegistry::Global() {
  static RuleRegistry* registry = new RuleRegistry();
  return *registry;
}

Status RuleRegistry::Register(RuleRegistration row) {
  if (!rules_.emplace(row.op_name, RegisteredRule{std::move(row.rule), std::move(row.traits)})
           .second) {
    return Status(Code::kAlreadyExists,
                  "The rule for op '" + row.op_name +
                      "' is registered twice; each op has one rule, registered in the block "
                      "at the bottom of its family's <family>_rules.cc. Remove one.");
  }
  return Status::Ok();
}

void RuleRegistry::RegisterAll(std::vector<RuleRegistration> rows) {
  for (RuleRegistration& row : rows) {
    Status status = Register(std::move(row));
    if (!status.ok()) registration_errors_.push_back(std::move(status));
  }
}

const RegisteredRule* RuleRegistry::Find(const std::string& op_name) const {
  auto it = rules_.find(op_name);
  return it == rules_.end() ? nullptr : &it->second;
}

std::vector<std::string> RuleRegistry::OpNames() const {
  std::vector<std::string> names;
  for (const auto& [name, rule] : rules_) names.push_back(name);
  return names;
}

const RegisteredRule& FallbackRule(bool stateful) {
  static const RegisteredRule* fallback =
      new RegisteredRule{Replicated(), Traits().AllHost(HostValue::kValue)};
  static const RegisteredRule* stateful_fallback =
      new RegisteredRule{ReplicatedStateful(), Traits().AllHost(HostValue::kValue)};
  return stateful ? *stateful_fallback : *fallback;
}

bool RegisterRules(std::vector<RuleRegistration> rows) {
  RuleRegistry& registry = RuleRegistry::Global();
  const size_t errors = registry.registration_errors().size();
  registry.RegisterAll(std::move(rows));
  return registry.registration_errors().size() == errors;
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
  const std::vector<PartialSpec> passed_partial = PassedPartial(ctx);
  if (!passed_partial.empty()) {
    std::vector<std::string> names;
    for (const PartialSpec& p : passed_partial) {
      names.push_back(ctx.mesh.dims()[p.mesh_dim].name + ":" + ReduceOpName(p.op));
    }
    out.push_back("outputs stay partial(" + Join(names, ",") + ")");
  }
  return out;
}

}  // namespace tf_dtensor
