// A rule's traits: what the dispatch paths, the plan cache and propagation need to know
// about an op besides its Forward/Backward/Expand, declared as data in its registration
// row (STYLE §4) rather than as virtual methods:
//   {"Transpose", Factors(TransposeFactors),
//    Traits().Linear(Linearity::kStructural).Host(1, HostValue::kPermutation)},
#ifndef TF_DTENSOR_CC_RULES_TRAITS_H_
#define TF_DTENSOR_CC_RULES_TRAITS_H_

#include <optional>
#include <string>
#include <vector>

namespace tf_dtensor {

// How an op passes pending reductions of its inputs to its outputs (see PlanOp).
enum class Linearity {
  kNone,        // nonlinear: partial inputs are reduced first (relu, exp)
  kEachInput,   // every data input has the same sum/mean pending: add, sub, add_n, neg
  kOneInput,    // exactly one data input has a sum/mean pending: mul, matmul
  kFirstInput,  // only input 0 has a sum/mean pending: div (the numerator)
  kStructural,  // moves elements without arithmetic; any reduction: identity, transpose
  kSum,         // sums elements: sum/mean pending passes (reduce_sum)
  kMax,         // max pending passes (reduce_max)
  kMin,         // min pending passes (reduce_min)
};

// What a host argument holds. A host argument is read as a value, not as data, which
// decides three things on both paths: dispatch reads its integer value for Forward
// (OpContext::IntValue) and the plan cache keys on that value; it is never broadcast
// onto the mesh or resharded (it stays on the host or replicated); and, when it is a
// replicated DTensor on another mesh, it moves to the op's mesh (TF caches small
// constants per device, and one device serves every mesh).
enum class HostValue {
  kAxis,         // an axis or list of axes: Sum's reduction_indices, ConcatV2's axis
  kShape,        // a shape or sizes: Reshape's shape, Fill's dims, Slice's size
  kPermutation,  // Transpose's perm
  kMultiples,    // Tile's multiples
  kPaddings,     // Pad's paddings
  kBounds,       // slice bounds: begin, end, strides
  kCount,        // a count or an index: OneHot's depth, TopK's k, a list index
  kValue,        // any other value read whole: a seed, a fill value, a range bound, and
                 // every input of an op without a rule
};

// "an axis", "a shape", ... for messages.
const char* HostValueName(HostValue what);

// Inputs first..last (inclusive) hold `what`. Negative positions count from the end of
// a variable-length input list: ConcatV2's axis follows its N values and is input -1.
struct HostInputs {
  int first;
  int last;
  HostValue what;
};

struct RuleTraits {
  Linearity linearity = Linearity::kNone;
  std::vector<HostInputs> host_inputs;
  // Forward reads ctx.requested (ops that make their blocks in the requested layout): a
  // new request changes their plan even when they have DTensor inputs.
  bool reads_request = false;
  // The op runs on the mesh even when all its inputs are host values (which otherwise
  // keep it on the host inside tf.function): ops that make a handle whose per-device
  // contents differ (TensorListReserve: each device lists its own blocks).
  bool makes_mesh_value = false;
  // The rule takes layouts with an axis sharded over several mesh dimensions ("x+y")
  // as they are: relayouts and variable handles, which only move or hold blocks. Every
  // other rule sees such inputs and requests over each axis's major mesh dimension.
  bool multi_dim_axes = false;
  // The op makes a constant from a Python value (_EagerConst): mostly arguments (shapes,
  // seeds), so call_with_layout leaves it replicated rather than relaying it out.
  bool python_constant = false;
  // The op is the user's relayout (relayout, relayout_like, copy_to_mesh): the collective
  // ledger marks the collectives it issues as asked for, not implied by a rule.
  bool user_relayout = false;

  // Chained setters for registration rows: Traits().Linear(kOneInput).Host(1, kAxis).
  RuleTraits& Linear(Linearity how) {
    linearity = how;
    return *this;
  }
  RuleTraits& Host(int input, HostValue what) { return Host(input, input, what); }
  RuleTraits& Host(int first, int last, HostValue what) {
    host_inputs.push_back({first, last, what});
    return *this;
  }
  // Every input, however many: creation ops and the policy for ops without a rule.
  RuleTraits& AllHost(HostValue what) { return Host(0, -1, what); }
  RuleTraits& ReadsRequest() {
    reads_request = true;
    return *this;
  }
  RuleTraits& MakesMeshValue() {
    makes_mesh_value = true;
    return *this;
  }
  RuleTraits& MultiDimAxes() {
    multi_dim_axes = true;
    return *this;
  }
  RuleTraits& PythonConstant() {
    python_constant = true;
    return *this;
  }
  RuleTraits& UserRelayout() {
    user_relayout = true;
    return *this;
  }

  // What input `input` of `num_inputs` holds if it is a host argument, else nullopt.
  std::optional<HostValue> HostInput(int input, int num_inputs) const;
  bool IsHostInput(int input, int num_inputs) const {
    return HostInput(input, num_inputs).has_value();
  }
  // "linear(one input), host inputs 1 (a permutation), reads the request", for tests and
  // messages; "none" when the op declares nothing.
  std::string Describe() const;
};

// The empty traits, to chain setters on in a registration row.
inline RuleTraits Traits() { return RuleTraits(); }

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_TRAITS_H_
