// The single rule registry, keyed by TF op name. Each <family>_rules.cc registers its
// ops in one block at its bottom, one row per op: the op, its rule, its traits.
#ifndef TF_DTENSOR_CC_RULES_REGISTRY_H_
#define TF_DTENSOR_CC_RULES_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cc/rules/rule.h"
#include "cc/rules/traits.h"

namespace tf_dtensor {

// What the registry holds for an op: its rule and its traits.
struct RegisteredRule {
  std::shared_ptr<const Rule> rule;
  RuleTraits traits;
};

// One row of a family's registration block:
//   {"MatMul", Matmul(), Traits().Linear(Linearity::kOneInput)},
struct RuleRegistration {
  std::string op_name;
  std::shared_ptr<const Rule> rule;
  RuleTraits traits = RuleTraits();
};

class RuleRegistry {
 public:
  static RuleRegistry& Global();
  // Adds the rule for `op_name`. An op registered twice (two families claiming it) is an
  // AlreadyExists error naming the op; the first rule stays.
  Status Register(RuleRegistration row);
  // Registers each row and keeps the failures in registration_errors().
  void RegisterAll(std::vector<RuleRegistration> rows);
  // What RegisterAll refused. Registration runs during static initialisation, where there
  // is no one to tell, so importing the extension raises these (cc/python/bindings.cc).
  const std::vector<Status>& registration_errors() const { return registration_errors_; }
  // The op's rule and traits, or null for an op without a rule.
  const RegisteredRule* Find(const std::string& op_name) const;
  std::vector<std::string> OpNames() const;

  // The policy for ops with no rule (README, "Ops without a rule"): strict raises, else
  // inputs are gathered and the op runs replicated. One flag for the process, so it
  // outlives the devices that TensorFlow context resets delete and re-create.
  bool strict() const { return strict_.load(); }
  void set_strict(bool strict) { strict_.store(strict); }

 private:
  std::map<std::string, RegisteredRule> rules_;
  std::vector<Status> registration_errors_;
  std::atomic<bool> strict_{false};
};

// What an op without a rule runs with: Replicated() (ReplicatedStateful() for a stateful
// op), every input read whole as a host value.
const RegisteredRule& FallbackRule(bool stateful);

// Declarative rules shared across families.
// Elementwise with broadcasting: inputs and output share the merged sharding.
std::shared_ptr<const Rule> Pointwise();
// All inputs read whole (host or replicated), outputs replicated: creation ops, and the
// policy for ops with no rule. Registered with host-argument traits for every input.
std::shared_ptr<const Rule> Replicated();
// Replicated for a stateful op (random, shuffle): it runs once and every device gets that
// result, so replicas agree on devices that do not share memory too.
std::shared_ptr<const Rule> ReplicatedStateful();

// Registers each row in the global registry; used as
// `const bool kRegistered = RegisterRules({...})`. False when one was refused.
bool RegisterRules(std::vector<RuleRegistration> rows);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_REGISTRY_H_
