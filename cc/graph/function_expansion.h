// One expansion of one tf.function body into an SPMD function (FunctionExpansion):
// function_expansion.cc (inputs, nodes, results, the requests solved backward) and
// control_flow.cc (calls, If, While). FunctionExpander (function_expander.h) runs its
// rounds and caches the result.
#ifndef TF_DTENSOR_CC_GRAPH_FUNCTION_EXPANSION_H_
#define TF_DTENSOR_CC_GRAPH_FUNCTION_EXPANSION_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/core/strings.h"
#include "cc/core/wire.h"
#include "cc/graph/function_def.h"
#include "cc/graph/function_expander.h"
#include "cc/graph/graph_builder.h"
#include "cc/propagation/propagate.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {
namespace expansion_internal {

using RequestMap = std::unordered_map<std::string, Layout>;

// An op's context with the attributes it points to, kept for the solver.
struct RecordedContext {
  RecordedContext(std::string op, AttrMap op_attrs, Mesh mesh)
      : attrs(std::move(op_attrs)), ctx(std::move(op), &attrs, std::move(mesh)) {}
  RecordedContext(const RecordedContext&) = delete;
  RecordedContext& operator=(const RecordedContext&) = delete;
  AttrMap attrs;
  OpContext ctx;
};

inline bool IsCall(const std::string& op) {
  return op == "PartitionedCall" || op == "StatefulPartitionedCall";
}

inline bool IsIf(const std::string& op) { return op == "If" || op == "StatelessIf"; }
inline bool IsCase(const std::string& op) { return op == "Case" || op == "StatelessCase"; }
// One of several branches runs (If, Case).
inline bool IsBranching(const std::string& op) { return IsIf(op) || IsCase(op); }
inline bool IsWhile(const std::string& op) { return op == "While" || op == "StatelessWhile"; }

// An empty list AttrValue (e.g. output_shapes: "not given").
inline std::string EmptyListAttr() {
  WireWriter value;
  value.Bytes(1, "");
  return value.Take();
}

// Splits "node:out_arg:3" into ("node", "out_arg", 3); "arg" into ("arg", "", 0).
struct TensorName {
  std::string node;
  std::string arg;
  int index = 0;
  bool control = false;
};

inline TensorName SplitName(const std::string& text) {
  TensorName t;
  if (!text.empty() && text[0] == '^') {
    t.control = true;
    t.node = text.substr(1);
    return t;
  }
  size_t first = text.find(':');
  if (first == std::string::npos) {
    t.node = text;
    return t;
  }
  t.node = text.substr(0, first);
  size_t second = text.find(':', first + 1);
  if (second == std::string::npos) {
    t.index = std::stoi(text.substr(first + 1));
  } else {
    t.arg = text.substr(first + 1, second - first - 1);
    t.index = std::stoi(text.substr(second + 1));
  }
  return t;
}

struct GraphDeleter {
  void operator()(TF_Graph* g) const { TF_DeleteGraph(g); }
};


}  // namespace expansion_internal

using expansion_internal::GraphDeleter;
using expansion_internal::RecordedContext;
using expansion_internal::RequestMap;

// One expansion of one function body.
class FunctionExpansion {
 public:
  FunctionExpansion(FunctionExpander* owner, TFE_Context* context, const Mesh& mesh,
                    const FallbackPolicy& policy, int depth)
      : owner_(owner),
        context_(context),
        home_(mesh),
        mesh_(mesh),
        policy_(policy),
        depth_(depth),
        graph_(TF_NewGraph()),
        builder_(graph_.get(), mesh),
        status_(TF_NewStatus()) {}
  ~FunctionExpansion() { TF_DeleteStatus(status_); }

  // One round: parses `function` and expands every node with the layout requests in
  // `requests` (the previous round's solution), or in the first round (null) those made
  // by the caller and by relayouts inside the function.
  Status Build(const std::string& function, const std::vector<ValueMeta>& inputs,
               const OutputRequest& request, const RequestMap* requests);
  // The requests of every node (output 0) solved backward over this round's graph.
  RequestMap Solve() const;
  // Node outputs (node, output index) that are partial where they are made and that some
  // reader had reduced in this round: the next round reduces each once, where it is made,
  // for all its readers (an Adam step reads a gradient in (1-b1)·g and in g², which
  // reduced it, or sums built from it, three times).
  std::set<std::pair<std::string, int>> ReducedByReaders() const;
  // Outputs to reduce where they are made (the previous rounds' ReducedByReaders).
  void ReduceAtSource(std::set<std::pair<std::string, int>> outputs) {
    reduce_at_source_ = std::move(outputs);
  }
  // The caller was traced with jit_compile=True: this body, branch or nested function is
  // compiled as its caller is, whatever its own attributes say (TensorFlow compiles a
  // jit_compile function's loops and calls whole).
  void InheritXlaCompile(bool compile) { inherited_xla_compile_ = compile; }
  // Whether `solved` differs from this round's requests at a node where a request
  // changes the expansion (a node without DTensor inputs, or whose rule reads it).
  bool Changes(const RequestMap& solved) const;
  // Emits the results and registers the expanded function.
  StatusOr<std::shared_ptr<const ExpandedFunction>> Finish(const std::vector<ValueMeta>& inputs,
                                                           const OutputRequest& request,
                                                           const std::string& expanded_name);

 private:
  Status KnownArgument(const std::string& name, const ValueMeta& m);
  Status AddInputs(const std::vector<ValueMeta>& inputs);
  Status Order();
  void Requests(const OutputRequest& request);
  // Records `node` for the solver: its rule, its context as the forward pass saw it, and
  // whether a request can change how it expands.
  void Record(const NodeSpec& node, const RegisteredRule* rule,
              std::shared_ptr<const OpContext> ctx, bool request_sensitive);
  // The context of an op expanded on the host (for the solver: shapes, attrs, host values).
  std::shared_ptr<const OpContext> HostContext(const NodeSpec& node, const RegisteredRule* rule,
                                               const std::vector<ValueId>& inputs);
  Status ExpandNode(const NodeSpec& node);
  Status ExpandCall(const NodeSpec& node, const std::string& callee,
                    const std::vector<ValueId>& inputs);
  // If and Case: one of several branches runs, chosen by input 0 (a predicate or an index).
  Status ExpandBranches(const NodeSpec& node, const std::vector<ValueId>& inputs);
  Status ExpandWhile(const NodeSpec& node, std::vector<ValueId> inputs);
  // Emits a functional op (a call, If, Case, While) over the flat components of `inputs`
  // after `prefix` (e.g. If's predicate); its results are `results`' values. `bodies`:
  // the expanded functions it runs (the callee, the branches, cond and body), for its cost.
  Status EmitFunctional(const NodeSpec& node, const std::string& op_type,
                        const std::vector<TF_Output>& prefix, const std::vector<ValueId>& inputs,
                        RawAttrs attrs, const std::vector<ValueMeta>& results,
                        bool copy_attrs,
                        std::vector<std::shared_ptr<const ExpandedFunction>> bodies);
  // `name` expanded for `inputs`. Small integer constants among them are passed on as
  // constants (ValueMeta::int_value), but not into a loop's body or condition
  // (`loop`), whose arguments change from one iteration to the next.
  StatusOr<std::shared_ptr<const ExpandedFunction>> Callee(const std::string& name,
                                                         const std::vector<ValueId>& inputs,
                                                         const OutputRequest& request,
                                                         bool loop = false);
  // A scalar predicate (or branch index) as one host tensor: a host value, or a
  // replicated DTensor's.
  StatusOr<TF_Output> Predicate(const NodeSpec& node, ValueId value);
  Status ExpandWithRule(const NodeSpec& node, std::vector<ValueId> inputs);
  // Chooses the mesh `node` runs on (ChooseMesh, as the eager path does: its DTensor
  // inputs', whole values of another mesh moving there; else the mesh of a layout asked
  // of it, else the function's) and makes it the builder's.
  Status EnterNodeMesh(const NodeSpec& node, std::vector<ValueId>& inputs);
  static std::optional<Layout> DefaultLayoutAttr(const NodeSpec& node);
  Status ApplyDefaultLayout(const NodeSpec& node);
  Status EmitHostOp(const NodeSpec& node, const std::vector<ValueId>& inputs);
  // An op that runs once on the host (one on a plain tf.Variable the function captured, a
  // side effect without a rule): its DTensor inputs join it whole.
  Status EmitOnceOnHost(const NodeSpec& node, std::vector<ValueId> inputs);
  // A lookup in a hash table the function captured (LookupTableFind(V2): Keras'
  // StringLookup) whose keys are a DTensor: each device looks up its own block of keys in
  // the table, where the table lives, and the result has the keys' layout (`[x,y]` keys ->
  // `[x,y]` values, the value's own axes replicated). Gathering the keys first needs an
  // all-gather of strings, which TF's collective ops cannot do. Returns false (nothing
  // emitted) for other ops and inputs.
  StatusOr<bool> EmitLookupPerDevice(const NodeSpec& node, const std::vector<ValueId>& inputs);
  StatusOr<ValueId> Resolve(const std::string& name);
  StatusOr<int> FlatIndex(const NodeSpec& node, const std::string& arg, int index);
  ValueMeta MetaOf(ValueId value) const;
  // The value a plain tf.Variable's handle (a host argument) points to: passed on to
  // nested calls, whose own argument then carries it, as the top level's does.
  std::map<ValueId, ResourceInfo> host_resources_;

  FunctionExpander* owner_;
  TFE_Context* context_;
  // The function's mesh (its first DTensor argument's) and the mesh of the node being
  // expanded: a function may hold values of several meshes (a host mesh feeding an
  // accelerator mesh); each op runs on its inputs' mesh.
  const Mesh home_;
  Mesh mesh_;
  FallbackPolicy policy_;
  int depth_;
  bool inherited_xla_compile_ = false;
  bool xla_compile_ = false;  // inherited, or the function's own `_XlaMustCompile`
  // Whether the user brought partial values in (a partial argument, or a relayout to a
  // partial layout). If not, pending reductions the expansion deferred are done before a
  // result leaves the function or enters a call, so results have TF DTensor's layouts.
  bool user_partial_ = false;
  // Values whose components are parts: relayouts to a parted layout, and Identity of one.
  std::set<ValueId> parted_;
  StatusOr<ValueId> Settle(ValueId v, const std::string& what) {
    if (user_partial_ || builder_.is_host(v) || !builder_.layout(v)->is_partial()) return v;
    return Relayout(builder_, v, builder_.layout(v)->WithoutPartial(), what);
  }
  std::unique_ptr<TF_Graph, GraphDeleter> graph_;
  GraphBuilder builder_;
  TF_Status* status_;
  std::string function_;
  FunctionSpec spec_;
  std::vector<const NodeSpec*> order_;
  std::unordered_map<std::string, const NodeSpec*> by_name_;
  std::unordered_map<std::string, ValueId> args_;
  std::unordered_map<std::string, std::vector<ValueId>> outputs_;
  std::unordered_map<std::string, std::vector<TF_Operation*>> ops_;
  RequestMap requests_;  // the requests this round expands with
  std::set<std::pair<std::string, int>> reduce_at_source_;
  RequestMap seeds_;     // those made by the caller and by relayouts
  // Per node of order_ (same index): what the solver knows of it.
  std::vector<SolverNode> solver_nodes_;
  std::vector<bool> request_sensitive_;
  std::unordered_map<std::string, int> position_;
  std::unordered_map<std::string, std::shared_ptr<const ExpandedFunction>> callees_;
  std::vector<TF_Output> flat_inputs_;
  // For the cost (cost.h): what each flat input holds, and the functional ops' bodies
  // (kept alive until Finish).
  std::vector<InputCharge> input_charges_;
  std::map<TF_Operation*, FunctionalCost> functional_;
  std::vector<std::shared_ptr<const ExpandedFunction>> bodies_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_FUNCTION_EXPANSION_H_
