// XLA cluster scopes for the SPMD graph of a function whose collectives are TF collective
// ops (the `ops` lowering: other processes, NCCL).
//
// TF's collective ops link the devices of one collective with no graph edge: a device's
// CollectiveReduceV2 completes only once every member of its group has run its own. XLA's
// clustering (the `_XlaCompile` marks of jit_compile, set_jit's auto-clustering) sees no
// such link. It may put into one cluster of device d an op that feeds d's part of a
// collective and an op that depends on the collective's result through another device (a
// tf.cond's predicate, read on the host from device e's result). A cluster runs once all
// its inputs are there, so it waits for the predicate, the predicate for the collective
// and the collective for the cluster: the program hangs (found by the program fuzzer: a
// cond on the maximum of a sharded DVariable, under jit_compile).
//
// Each op gets a scope (`_XlaScope`, which jit_compile's clustering respects, and
// `_XlaInternalScope`, which auto-clustering respects), "tfd<function>_<phase>". The phase
// counts the collectives on the longest path to the op, where a collective's result is one
// phase past the inputs of every member of its group: an op after a collective is never
// clustered with one before it, and one function's ops never with another's (a nested
// function inlined into its caller).
#ifndef TF_DTENSOR_CC_GRAPH_CLUSTER_PHASES_H_
#define TF_DTENSOR_CC_GRAPH_CLUSTER_PHASES_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/c/c_api.h"

namespace tf_dtensor {

class ClusterPhases {
 public:
  ClusterPhases();

  // The phase of an op that reads `inputs` and waits for `controls`.
  int Of(const std::vector<TF_Output>& inputs, const std::vector<TF_Operation*>& controls);
  // `op` is a member of the collective `group` (the instance key of a TF collective op, or
  // any other key that all its members share): its results are one phase past the inputs
  // of every member. All members are added before an op that reads one asks its phase.
  void AddMember(TF_Operation* op, int64_t group);
  // The scope of ops of `phase`.
  std::string Scope(int phase) const;

 private:
  int PhaseOfOp(TF_Operation* op);
  // What `op` waits for: its inputs and control inputs, and for a member of a collective,
  // every member's.
  std::vector<TF_Operation*> Dependencies(TF_Operation* op) const;

  int64_t id_;
  std::unordered_map<TF_Operation*, int> phase_;
  std::unordered_map<TF_Operation*, int64_t> group_of_;
  std::unordered_map<int64_t, std::vector<TF_Operation*>> members_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_CLUSTER_PHASES_H_
