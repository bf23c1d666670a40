// The layout solver: one fixed-point propagation over a function's ops, used by
// tf.function expansion (cc/graph/function_expansion.cc) and by debug.explain.
//
// Forward, each op's rule plans its output layouts from its input layouts (the SPMD
// expansion does this as it goes). Backward, a layout asked of a value (a `relayout`
// inside the function, or call_with_layout around it) is sent to the op producing it,
// whose rule's Backward says which input layouts would produce it without a relayout;
// those become requests of the inputs' producers, and so on back to the ops that create
// values (Fill, random ops, variables), which make their blocks in the requested layout:
//   y = matmul(a [*,*], transpose(ones([64,64])))  with y requested [*,x]
//     matmul: b wanted [*,x] -> transpose: ones wanted [x,*] -> Fill makes [x,*] blocks,
//     and y comes out [*,x] with no relayout.
// Forward wins: a request never changes an op whose inputs already decide its layout; it
// only reaches the places where the forward plan is free (creation ops, broadcast axes)
// and otherwise is met by a relayout where it was made. The expansion repeats until the
// requests stop changing (a request can reach an op only once the forward pass has seen
// its shapes).
#ifndef TF_DTENSOR_CC_PROPAGATION_PROPAGATE_H_
#define TF_DTENSOR_CC_PROPAGATION_PROPAGATE_H_

#include <memory>
#include <optional>
#include <vector>

#include "cc/rules/registry.h"

namespace tf_dtensor {

// One op of the graph, as the solver sees it.
struct SolverNode {
  // The op's rule and traits and its context (shapes, attributes, host argument values,
  // input layouts) as the forward pass saw them; a null rule (unknown op, or not reached
  // yet) stops requests at this node.
  const RegisteredRule* rule = nullptr;
  std::shared_ptr<const OpContext> ctx;
  // Per input: the producing node and its output, or node -1 for a value from outside
  // (a function argument).
  struct Source {
    int node = -1;
    int output = 0;
  };
  std::vector<Source> inputs;
  int num_outputs = 1;
  // Requests made here (a relayout's target, a requested function result), per output.
  std::vector<std::optional<Layout>> seeds;
};

// Per node, per output: the layout asked of it (nullopt: none). `nodes` are in
// topological order. Requests travel from consumers to producers through each rule's
// Backward; the first request a value gets wins (seeds first, then consumers from last
// to first).
std::vector<std::vector<std::optional<Layout>>> SolveRequests(const std::vector<SolverNode>& nodes);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_PROPAGATION_PROPAGATE_H_
