#include "cc/propagation/propagate.h"

namespace tf_dtensor {

std::vector<std::vector<std::optional<Layout>>> SolveRequests(
    const std::vector<SolverNode>& nodes) {
  std::vector<std::vector<std::optional<Layout>>> requests(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    requests[n] = nodes[n].seeds;
    requests[n].resize(std::max<size_t>(nodes[n].num_outputs, nodes[n].seeds.size()));
  }
  // One sweep from the last op to the first reaches a fixed point: a node's requests
  // come only from nodes after it.
  for (size_t n = nodes.size(); n-- > 0;) {
    const SolverNode& node = nodes[n];
    bool any = false;
    for (const std::optional<Layout>& r : requests[n]) any = any || r.has_value();
    if (!any || !node.rule || !node.ctx) continue;
    // Requests over several mesh dimensions per axis ("x+y", made by a relayout) reach
    // other rules as their major dimension only, as dispatch gives them their inputs.
    std::vector<std::optional<Layout>> asked = requests[n];
    if (!node.rule->traits.multi_dim_axes) {
      for (std::optional<Layout>& r : asked) {
        if (r && r->HasMultiDimAxis()) r = r->MajorOnly();
      }
    }
    std::vector<std::optional<Layout>> wanted = node.rule->rule->Backward(*node.ctx, asked);
    for (size_t i = 0; i < wanted.size() && i < node.inputs.size(); ++i) {
      const SolverNode::Source& source = node.inputs[i];
      if (!wanted[i] || source.node < 0 || source.node >= static_cast<int>(n)) continue;
      std::vector<std::optional<Layout>>& target = requests[source.node];
      if (source.output >= static_cast<int>(target.size())) target.resize(source.output + 1);
      if (!target[source.output]) target[source.output] = wanted[i];
    }
  }
  return requests;
}

}  // namespace tf_dtensor
