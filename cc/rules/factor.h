// Declarative op rules: an op described by factors, in the style of Shardy's sharding
// rules and PyTorch's einsum strategies.
//
// Each axis of each data input and output names a factor; a factor is an index of the
// op's iteration space. MatMul is "mk,kn->mn":
//   m, n: pass-through factors (they reach the output);
//   k:    contracted (it does not reach the output): sharding it leaves partial results
//         that are all-reduced over its mesh dimension.
// Other kinds:
//   need-replication: an axis the op cuts, joins, scans or pads (Concat's axis, Cumsum's
//         axis, a padded axis): its pieces do not line up with shards, so it is gathered.
//   new:  an output axis with no input counterpart (Pack's axis, keep_dims): unsharded.
// Permutations fall out of the mapping: Transpose(perm=[1,0]) is "ab->ba".
//
// The engine (FactorRule) derives everything else once, for every family:
//   Forward: each factor takes the mesh dimension of the first input axis (input order)
//     that shards it, visiting factors in the spec's priority order; a mesh dimension
//     shards at most one factor, so a later factor whose mesh dimension is taken stays
//     unsharded and its inputs are relaid out:
//       matmul [x,*] @ [*,x]: m takes x, n loses it -> b runs as [*,*], output [x,*]
//     An input axis of size 1 that broadcasts against a larger factor never shards.
//     Inputs then run with their factors' specs (one side of a sharded k sliced to
//     match: free), outputs take them, and sharded contracted factors become partial
//     dimensions of every output.
//   Backward: the requested outputs' specs are given to their factors (first output
//     first; a mesh dimension once; only to pass-through factors whose size the mesh
//     dimension divides), and each input is asked for the specs of its factors, an axis
//     that broadcasts unsharded:  want [x,y] of matmul -> a [x,*], b [*,y].
// N-D meshes need nothing more: the rules above are per mesh dimension.
#ifndef TF_DTENSOR_CC_RULES_FACTOR_H_
#define TF_DTENSOR_CC_RULES_FACTOR_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cc/rules/rule.h"

namespace tf_dtensor {

enum class FactorKind { kPassThrough, kContracted, kNeedReplication };

struct FactorSpec {
  static constexpr int kNew = -1;  // an output axis with no factor: unsharded

  std::vector<FactorKind> factors;  // by factor id
  // Per input: the factor of each axis; nullopt for an input that is not data (a host
  // argument, or a value the op passes unchanged), which keeps its layout.
  std::vector<std::optional<std::vector<int>>> inputs;
  // Per output: the factor of each axis, or kNew.
  std::vector<std::vector<int>> outputs;
  // Factor ids in the order they claim mesh dimensions in Forward; empty: id order.
  std::vector<int> priority;
  // How partial results of contracted factors combine.
  ReduceOp reduce = ReduceOp::kSum;

  int Add(FactorKind kind) {
    factors.push_back(kind);
    return static_cast<int>(factors.size()) - 1;
  }
  // Factor ids for `rank` fresh pass-through factors.
  std::vector<int> AddAxes(int rank);
};

// The mesh dimension each factor is sharded over (DimSpec per factor id).
using FactorAssignment = std::vector<DimSpec>;

// Builds a FactorSpec from the op's context (attrs, host argument values, shapes), or
// fails naming the op.
using FactorSpecFn = std::function<StatusOr<FactorSpec>(const OpContext&)>;

class FactorRule : public Rule {
 public:
  // Host arguments (read as values, never resharded) are the registration row's traits.
  explicit FactorRule(FactorSpecFn spec) : spec_(std::move(spec)) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override;
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override;

 protected:
  // A cost hook run after Forward's assignment and before the plan is built; it may
  // unshard factors (never shard new ones). The default keeps the assignment.
  virtual void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                             FactorAssignment& assignment) const {}

 private:
  FactorSpecFn spec_;
};

// A FactorRule for `spec`.
std::shared_ptr<const Rule> Factors(FactorSpecFn spec);
// A FactorRule for `spec` whose kernels must not see an empty block (TF's max pooling
// gradients abort on one; TensorScatter* refuses updates into an empty tensor): a factor
// whose sharding would leave a device no element (3 over 4) is read whole instead.
std::shared_ptr<const Rule> FactorsWithoutEmptyBlocks(FactorSpecFn spec);

// The factor sizes of `spec` over ctx's input shapes (the largest axis naming each).
std::vector<int64_t> FactorSizes(const OpContext& ctx, const FactorSpec& spec);

// The plan for a given assignment: inputs take their factors' specs (broadcast and
// unassigned axes unsharded), outputs likewise, partial dims from contracted factors.
Plan FactorPlan(const OpContext& ctx, const FactorSpec& spec, const FactorAssignment& assignment);

// `axis` of an input of `rank` in [-rank, rank) as a non-negative axis, or an error
// naming the op and input.
StatusOr<int> NormalizeAxis(const OpContext& ctx, int64_t axis, int rank, int input);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_FACTOR_H_
