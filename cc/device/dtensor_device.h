// The DTensor device: one TFE custom device serves every mesh; the layout (and so the
// mesh) travels with each tensor, as in TF's DTensor. One device keeps `with
// tf.device(dtensor.device_name())` meaningful for all meshes and lets an op see all of
// its inputs' meshes, so mixing meshes is reported rather than silently copied.
#ifndef TF_DTENSOR_CC_DEVICE_DTENSOR_DEVICE_H_
#define TF_DTENSOR_CC_DEVICE_DTENSOR_DEVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/eager/executor.h"
#include "cc/eager/local_only.h"
#include "cc/eager/tensor_with_layout.h"
#include "cc/graph/function_expander.h"

namespace tf_dtensor {

class DTensorDevice {
 public:
  explicit DTensorDevice(std::string name);
  ~DTensorDevice();

  // Set to false when TensorFlow deletes the device (with its context): Python holds the
  // flag, never the device alone, so a context reset cannot leave it a dangling pointer.
  std::shared_ptr<const std::atomic<bool>> alive() const { return alive_; }
  // Devices not yet deleted by TensorFlow, in this process (tests check that context
  // resets leave none behind).
  static int num_live();

  const std::string& name() const { return name_; }

  // Scopes set from Python (dtensor.default_mesh / run_on, call_with_layout).
  void PushDefaultMesh(std::optional<Mesh> mesh);
  void PopDefaultMesh();
  std::optional<Mesh> default_mesh() const;
  // The mesh of an op placed on the device with no DTensor input: the default mesh, else
  // the one mesh this device has seen (packed into, copied or relayouted to, or made
  // default), as TensorFlow's DTensor picks its single registered mesh; none when it has
  // seen several or none.
  std::optional<Mesh> mesh_for_unplaced() const;
  // Whether the device has a default mesh or has seen any mesh (one or several).
  bool has_seen_mesh() const;
  // The meshes seen, when there are several and no default mesh (else none).
  std::vector<Mesh> ambiguous_meshes() const;
  // Notes a mesh the user put values on (see mesh_for_unplaced).
  void RegisterMesh(const Mesh& mesh);
  void PushDefaultLayout(std::optional<Layout> layout);
  void PopDefaultLayout();
  // tf.functions expanded and cached so far (for tests and debugging).
  int64_t num_expanded_functions() const { return expander_.num_cached(); }
  // The function cache's counters, after dropping the expansions of deleted functions.
  FunctionExpander::Stats function_cache_stats(TFE_Context* context) {
    expander_.DropDeleted(context);
    return expander_.stats();
  }
  // The expansion a call of `function` with `inputs` from `mesh` runs (the cached one, or
  // made and cached now), without running it: its collectives and cost
  // (`debug.estimate`). A later call with the same inputs reuses it.
  StatusOr<std::shared_ptr<const ExpandedFunction>> PlanFunction(
      TFE_Context* context, const std::string& function, const Mesh& mesh,
      const std::vector<ValueMeta>& inputs) {
    return expander_.Expand(context, function, mesh, inputs, OutputRequest(), policy());
  }
  size_t num_cached_plans() const { return plan_cache_.size(); }
  // Eager ops run by their plan's local-only run (LocalOnlyReplays), for tests.
  int64_t num_local_only_runs() const { return local_only_.num_runs(); }
  // Local ops run with their cached TF kernel (KernelCache), for tests.
  int64_t num_direct_kernel_runs() const { return kernels_.num_runs(); }
  // Receives the one-time warnings (the binding forwards them to Python's warnings).
  void set_warning_handler(std::function<void(const std::string&)> handler) {
    warning_handler_ = std::move(handler);
  }

  // TFE_CustomDevice callbacks.
  void Execute(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs, TF_Status* status);
  TFE_TensorHandle* CopyToDevice(TFE_Context* context, TFE_TensorHandle* tensor, TF_Status* status);
  TFE_TensorHandle* CopyFromDevice(TFE_Context* context, TFE_TensorHandle* tensor,
                                   const std::string& target_device, TF_Status* status);

 private:
  // An op on its way to Dispatch, as ExecuteOp routed it.
  struct Routed {
    const RegisteredRule* rule = nullptr;  // null: no rule (Dispatch applies the fallback policy)
    std::optional<Mesh> mesh;    // the mesh it runs on (ChooseMesh)
    // Not null: the expansion is watched, and recorded when local-only (LocalOnlyReplays).
    const Mesh* local_only = nullptr;
    std::optional<Layout> requested;  // call_with_layout's layout, in its runtime form
    bool parts_in = false;            // some input is parted
    bool parted_out = false;          // the outputs are parts
    bool parts_requested = false;     // call_with_layout asked for parts
  };
  // Reads the op and its inputs and routes it: pack, unpack and fetch_layout; a replay
  // of a local-only run; the mesh choice; a tf.function call (CallFunction) or DispatchOp.
  Status ExecuteOp(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs);
  // The op through its rule on the eager builder, and the outputs back to TF.
  Status DispatchOp(const EagerOp& op, const Routed& routed, int* num_outputs,
                    TFE_TensorHandle** outputs);
  FallbackPolicy policy();
  static bool IsHostDataOp(const std::string& op_name);
  Status RunOnHost(const TFE_Op* op, TFE_Context* context, const std::string& op_name,
                   const std::vector<TFE_TensorHandle*>& handles, int* num_outputs,
                   TFE_TensorHandle** outputs);
  std::optional<Layout> default_layout() const;
  void WarnOnce(const std::string& op_name, const std::string& message);

  std::string name_;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
  mutable std::mutex mutex_;
  // The default mesh and layout scopes, per thread: a scope opened in one thread must not
  // place or lay out another thread's ops (the custom device runs each op in the thread
  // that issues it).
  std::map<std::thread::id, std::vector<std::optional<Mesh>>> mesh_stacks_;
  std::vector<Mesh> registered_meshes_;  // distinct user meshes seen, at most two kept
  std::map<std::thread::id, std::vector<std::optional<Layout>>> layout_stacks_;
  // Whether this thread has a layout scope open on this device: read without the lock on
  // every op (an open scope turns off the local-only replay fast path). Per thread, so
  // one thread's `call_with_layout` leaves the others' fast path on.
  bool layout_scope_open_here() const;
  // This device's number, never reused (a device made again may get a freed address):
  // keys the per-thread count of open layout scopes.
  const uint64_t serial_;
  std::set<std::string> warned_;
  std::function<void(const std::string&)> warning_handler_;
  FunctionExpander expander_;
  PlanCache plan_cache_;  // eager plans, reused by repeated ops
  OpPool op_pool_;        // the eager builders' local TFE ops, reused
  KernelCache kernels_;   // TF's kernels for local ops on CPU devices, run directly
  LocalOnlyReplays local_only_{plan_cache_, op_pool_, kernels_};
};

// Sets `status` from ours.
void ToTF(const Status& status, TF_Status* tf_status);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_DEVICE_DTENSOR_DEVICE_H_
