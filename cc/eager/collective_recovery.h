// Keeps TF's collective executor usable after a failed step.
//
// TF's V2 collective kernels abort the context's collective executor when their step is
// cancelled while they wait for their peers: a step of the collective-ops lowering that
// fails on one device (a NaN caught by check_numerics) after the other devices entered a
// collective cancels them, and the cancellation aborts the executor. TF 2.21 keeps it
// aborted until the context is reset: every later collective of the process fails ("The
// error could be from a previous operation. Restart your program to reset"), and a context
// reset drops every tensor. Whether the abort happens is a race between the failing
// device's error and its peers' arrival; a user's `abort_collective_ops` has the same
// effect.
//
// A failure can also leave a group cancelled without aborting the executor: a device still
// resolving the group when the step is cancelled marks it so in TF's resolver, and every
// later collective of that group fails ("group is cancelled"). Both states live in the
// context's collective executor manager.
//
// So every run that issues TF collective ops holds a `CollectiveRun`. One that fails
// renews the manager when it ends, before its error reaches the caller; one that finds the
// executor aborted (by a user's `abort_collective_ops`, or a collective run outside
// tf_dtensor) renews it before it runs. A renewal waits until no other such run is in
// flight, then gives the context a new local collective executor manager (the one TF's
// context makes at start: group and instance resolution, NCCL where TF has it), clears
// TF's kernel cache (its kernels hold the old executor) and renews the rendezvous eager
// functions share. Tensors, variables, functions and meshes are untouched; groups resolve
// again at their next collective. It costs one recompilation of each kernel TF runs next,
// paid only after a failure. The replaced manager is deleted (its threads end with it).
//
// Only in a context of one process. A context serving a cluster (multi-client meshes) runs
// TF's RPC collective manager, whose group state its peers share: it is left as it is, and
// a collective there fails as TF fails it.
//
// This file, cc/eager/kernel_cache.cc and cc/tf/op_registry.cc include TF's C++ runtime
// headers (the pinned tensorflow 2.21 wheel's).
#ifndef TF_DTENSOR_CC_EAGER_COLLECTIVE_RECOVERY_H_
#define TF_DTENSOR_CC_EAGER_COLLECTIVE_RECOVERY_H_

#include <cstdint>

#include "tensorflow/c/eager/c_api.h"

namespace tf_dtensor {

// Held for the length of one run that issues TF collective ops. The outermost on a thread
// renews an aborted executor (above), then holds a shared lock a renewal waits for; nested
// ones (a collective run inside another's callback) only count.
class CollectiveRun {
 public:
  explicit CollectiveRun(TFE_Context* context);
  // Renews the collectives when the run failed, once the lock is released.
  ~CollectiveRun();
  CollectiveRun(const CollectiveRun&) = delete;
  CollectiveRun& operator=(const CollectiveRun&) = delete;

  // The run failed.
  void Failed() { failed_ = true; }

 private:
  TFE_Context* context_;
  bool outermost_;
  bool failed_ = false;
};

// Whether `context`'s collective executor is aborted (tests, `debug`).
bool CollectivesAborted(TFE_Context* context);

// Collective executors renewed in this process so far (tests, `debug`).
int64_t CollectiveRenewals();

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_COLLECTIVE_RECOVERY_H_
