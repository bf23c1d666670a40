// Op rules: how one TF op runs on DTensors.
//
// A rule has two halves:
//   Forward(ctx) -> Plan: the layouts the inputs must have, the layouts of the outputs,
//     and the partial outputs that need an all-reduce. Pure: shapes, attrs and layouts in,
//     no TF runtime, so it serves tests, debugging and graph propagation alike.
//   Backward(ctx, requested_outputs) -> per input, the layout that would make the op
//     produce the requested output layouts without a relayout (nullopt: no preference).
//     Pure as well; the propagation solver (cc/propagation/propagate.h) sends layout
//     requests back through a function with it.
//   Expand(ctx, plan, builder): writes the SPMD program. The default relayouts the inputs
//     to the plan, runs the op on each shard and all-reduces partial outputs, which is
//     right for most families; rules that rewrite host arguments or emit other ops
//     override it.
#ifndef TF_DTENSOR_CC_RULES_RULE_H_
#define TF_DTENSOR_CC_RULES_RULE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/tf/attrs.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

struct InputInfo {
  std::vector<int64_t> shape;  // global shape
  int dtype = 0;               // TF_DataType
  std::optional<Layout> layout;  // nullopt for a host (non-DTensor) tensor
  // The value of a small integer tensor that is on the host or replicated: axes, shapes.
  std::optional<std::vector<int64_t>> int_value;
  std::optional<ResourceInfo> resource;  // set for DVariable handles
  // A regular (non-DTensor) tensor used as data: it joined the mesh replicated, and any
  // layout of it is a local slice.
  bool from_host = false;
};

struct OpContext {
  OpContext(std::string op, const AttrMap* op_attrs, Mesh op_mesh)
      : op_name(std::move(op)), attrs(op_attrs), mesh(std::move(op_mesh)) {}
  std::string op_name;
  const AttrMap* attrs = nullptr;
  std::vector<InputInfo> inputs;
  Mesh mesh;
  // The layout asked for with call_with_layout / default layout, if any.
  std::optional<Layout> requested;
  // Whether a contraction's partial results may stay pending (a Partial layout) rather
  // than be all-reduced at once: inside tf.function, and eagerly when an input is already
  // partial. Eager ops on plain inputs reduce at once and give TF DTensor's layouts.
  bool keep_partial = false;
  // Whether the op is expanded inside a tf.function (whose intermediate layouts are
  // tf_dtensor's choice) rather than run eagerly on the user's values.
  bool in_function = false;
  int num_outputs = 1;

  // "input 1 (shape [4, 8], layout [x,*]) of 'MatMul'", for error messages.
  std::string Describe(int input) const;
  // "'MatMul' with inputs ([x,*] @ mesh(x=2), [*,*] @ mesh(x=2))".
  std::string DescribeOp() const;
  // "[x,*] @ mesh(x=2), host [2]".
  std::string DescribeInputs() const;
  int rank(int input) const { return static_cast<int>(inputs[input].shape.size()); }
  const Layout& layout(int input) const { return *inputs[input].layout; }
  // The constant integer value of `input` or an error naming the op.
  StatusOr<std::vector<int64_t>> IntValue(int input, const std::string& what) const;
};

struct Plan {
  // Layout each input must have before the local op; nullopt passes it unchanged.
  std::vector<std::optional<Layout>> inputs;
  // Layouts of the outputs; empty means "replicated, whatever their rank".
  std::vector<Layout> outputs;
  // Per output: mesh dimensions along which the local results are partial.
  std::vector<std::vector<int>> partial_dims;
  ReduceOp partial_op = ReduceOp::kSum;
  // Attributes of the local op that differ from the global op (e.g. a local shape).
  std::vector<AttrOverride> overrides;
  // Host arguments replaced with local values (e.g. Reshape's shape): input -> values.
  std::map<int, std::vector<int64_t>> host_inputs;
  // Communication a rule's own Expand adds beyond relayouts and partial outputs (a halo
  // exchange, synchronised batch-norm statistics, a softmax's row max and sum), and why
  // an axis was gathered, in words for Collectives() and debug.
  std::vector<std::string> notes;
  // A rule that runs the op as another op (ThroughValue: a resource op as the functional op
  // on the variable's value) keeps that op's plan here for its Expand, planned once.
  std::shared_ptr<const Plan> through;

  // Every input that has a layout whole on each device, and one output of `output_rank`,
  // replicated: the plan of an op that runs as one device would (operands known only at
  // run time, sizes only known then).
  static Plan Whole(const OpContext& ctx, int output_rank);
  // Pending reductions of the inputs that the op passes to its outputs unreduced (it is
  // linear in them): those an input has (in `ctx`) and keeps in its planned layout, which
  // PlanOp also puts in the outputs' layouts.
  std::vector<PartialSpec> PassedPartial(const OpContext& ctx) const;
  // The collectives this plan emits, e.g. "all-reduce(sum) over x", for tests and debug.
  std::vector<std::string> Collectives(const OpContext& ctx) const;
};

class Rule {
 public:
  virtual ~Rule() = default;
  virtual StatusOr<Plan> Forward(const OpContext& ctx) const = 0;
  // For rules whose linearity no RuleTraits::linearity describes: given inputs with
  // pending reductions (ctx's layouts), the pending reductions of the outputs when the op
  // can run on the unreduced terms, or nullopt when the inputs must be reduced first (the
  // default). Consulted only when the traits declare Linearity::kNone.
  virtual std::optional<std::vector<PartialSpec>> PartialThrough(const OpContext& ctx) const {
    return std::nullopt;
  }
  // Whether Forward's input layouts are final, pending reductions included: a relayout,
  // whose input is moved to its target (partial to partial: [P,P] -> [P,R] reduces over
  // the second mesh dimension only), is not reduced first as other ops' inputs are.
  virtual bool PlansPendingReductions() const { return false; }
  // `requested_outputs` has one entry per output (nullopt: nothing asked). The default
  // has no preference for any input.
  virtual std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested_outputs) const;
  // The default is ExpandDefault (cc/rules/expand.h).
  virtual StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                                Builder& builder) const;
};

// The request for output `o` when it fits an output of `rank` on the op's mesh, else null.
const Layout* UsableRequest(const OpContext& ctx,
                            const std::vector<std::optional<Layout>>& requested_outputs, int o,
                            int rank);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_RULE_H_
