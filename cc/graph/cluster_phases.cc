#include "cc/graph/cluster_phases.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace tf_dtensor {

ClusterPhases::ClusterPhases() {
  static std::atomic<int64_t> counter{0};
  id_ = counter.fetch_add(1);
}

std::string ClusterPhases::Scope(int phase) const {
  return "tfd" + std::to_string(id_) + "_" + std::to_string(phase);
}

void ClusterPhases::AddMember(TF_Operation* op, int64_t group) {
  group_of_[op] = group;
  members_[group].push_back(op);
}

std::vector<TF_Operation*> ClusterPhases::Dependencies(TF_Operation* op) const {
  std::vector<TF_Operation*> deps;
  auto add = [&deps](TF_Operation* o) {
    const int n = TF_OperationNumInputs(o);
    for (int i = 0; i < n; ++i) deps.push_back(TF_OperationInput(TF_Input{o, i}).oper);
    std::vector<TF_Operation*> controls(TF_OperationNumControlInputs(o));
    if (!controls.empty()) {
      TF_OperationGetControlInputs(o, controls.data(), static_cast<int>(controls.size()));
      deps.insert(deps.end(), controls.begin(), controls.end());
    }
  };
  auto group = group_of_.find(op);
  if (group == group_of_.end()) {
    add(op);
  } else {
    for (TF_Operation* member : members_.at(group->second)) add(member);
  }
  return deps;
}

int ClusterPhases::PhaseOfOp(TF_Operation* op) {
  auto known = phase_.find(op);
  if (known != phase_.end()) return known->second;
  // Depth first without recursion (a long chain of ops would overflow the stack): an op's
  // phase once all it waits for have theirs. The graph has no cycle.
  std::vector<std::pair<TF_Operation*, bool>> stack = {{op, false}};
  while (!stack.empty()) {
    auto [o, ready] = stack.back();
    if (phase_.count(o)) {
      stack.pop_back();
      continue;
    }
    const std::vector<TF_Operation*> deps = Dependencies(o);
    if (!ready) {
      stack.back().second = true;
      for (TF_Operation* d : deps) {
        if (!phase_.count(d)) stack.push_back({d, false});
      }
      continue;
    }
    int phase = 0;
    for (TF_Operation* d : deps) phase = std::max(phase, phase_.at(d));
    if (group_of_.count(o)) ++phase;
    phase_[o] = phase;
    stack.pop_back();
  }
  return phase_.at(op);
}

int ClusterPhases::Of(const std::vector<TF_Output>& inputs,
                      const std::vector<TF_Operation*>& controls) {
  int phase = 0;
  for (const TF_Output& in : inputs) phase = std::max(phase, PhaseOfOp(in.oper));
  for (TF_Operation* c : controls) phase = std::max(phase, PhaseOfOp(c));
  return phase;
}

}  // namespace tf_dtensor
