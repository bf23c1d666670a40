// The eager Builder: carries out an SPMD program at once on the mesh's devices.
//
// Each step runs on the calling thread, one TFE op per distinct shard. On meshes of
// virtual CPUs the devices that hold the same shard share one result buffer, so a
// replicated op runs once rather than once per device (TF's DTensor runs it on every
// device, each from its own executor thread). TF collective ops (the collective-ops
// lowering: GPUs, or TF_DTENSOR_COLLECTIVES=ops) are the exception: their participants
// wait for each other, so they run on a thread per device (device_threads.h). Which
// device computes what, and the collectives, are ComponentBuilder's; this file runs the ops.
#ifndef TF_DTENSOR_CC_EAGER_EXECUTOR_H_
#define TF_DTENSOR_CC_EAGER_EXECUTOR_H_

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cc/eager/kernel_cache.h"
#include "cc/eager/tensor_with_layout.h"
#include "cc/spmd/component_builder.h"
#include "cc/tf/handles.h"

namespace tf_dtensor {

// TFE_Op objects kept for reuse, owned by the DTensor device (so by one context): a
// builder takes one and gives it back, instead of allocating and deleting an op per eager
// op. Pooled ops are reset to NoOp, so they hold no input handles (no buffers kept alive);
// a taken op is reset by its user to the op and device it runs (one TFE_OpReset).
class OpPool {
 public:
  OpPool() = default;
  OpPool(const OpPool&) = delete;
  OpPool& operator=(const OpPool&) = delete;
  ~OpPool();

  // A pooled op, or a new one; nullptr with `status` set on failure. Thread-safe.
  TFE_Op* Take(TFE_Context* context, TF_Status* status);
  // Gives `op` back (deleted instead if it cannot be reset; `status` is scratch).
  void Return(TFE_Op* op, TF_Status* status);

 private:
  std::mutex mutex_;
  std::vector<TFE_Op*> free_;
};

class EagerBuilder : public ComponentBuilder<TFE_TensorHandle*> {
 public:
  // `attrs` are the attributes of the op being expanded (copied into local ops). Local ops
  // come from `pool` and run with `kernels`' kernels where they can.
  EagerBuilder(TFE_Context* context, Mesh mesh, const TFE_OpAttrs* attrs, int max_outputs,
               OpPool& pool, KernelCache& kernels);
  ~EagerBuilder() override;

  // This thread's status object, reset to OK (a TF_Status per op was a malloc and a free).
  static TF_Status* ThreadStatus();

  // Inputs, borrowed for the builder's lifetime.
  ValueId AddInput(const TensorWithLayout* tensor);
  ValueId AddHostInput(TFE_TensorHandle* handle, std::vector<int64_t> shape, TF_DataType dtype);
  // Hands a DTensor value over as a new record (sharing buffers with the builder's).
  StatusOr<std::unique_ptr<TensorWithLayout>> Release(ValueId value);
  // Hands `values` back to TF as DTensor handles of the device `device_name` (parts when
  // `parted`; a resource never is), and sets `*num_outputs` (at least values.size()) to
  // their number. On an error no handle is left in `outputs`.
  Status Emit(const std::vector<ValueId>& values, const std::string& device_name, bool parted,
              int* num_outputs, TFE_TensorHandle** outputs);
  // Whether the value is a host (non-DTensor) tensor and its handle.
  TFE_TensorHandle* host_handle(ValueId value) const { return values_[value].host; }

  StatusOr<ValueId> HostConstant(const std::vector<int64_t>& values,
                                 const std::vector<int64_t>& shape, int dtype) override;
  // Reads the host tensor, or component 0 of a replicated DTensor (not a resource).
  std::optional<std::vector<int64_t>> IntValue(ValueId value) override;

  // Runs one local op the way every eager local op runs: `op` (a pooled op) reset to
  // `op_name` on `device_name`, `options`' overrides, then `attrs` (the expanded op's,
  // when options.copy_attrs), then `inputs`, run with its kernel from `kernels` or else
  // TFE_Execute. At most `*num_outputs` results go to `outputs`; `*num_outputs` is then
  // how many were made. Errors name the op and device.
  static Status RunLocal(TFE_Op* op, const std::string& op_name, const std::string& device_name,
                         const TFE_OpAttrs* attrs, const std::vector<TFE_TensorHandle*>& inputs,
                         const LocalOpOptions& options, KernelCache& kernels,
                         TFE_TensorHandle** outputs, int* num_outputs, TF_Status* status);

  // Watches the expansion for a local-only run (PlanCache::SetLocalOnly): whether it runs
  // nothing but `op_name` itself, with the expanded op's attributes, on each device's
  // components of `inputs` (DTensors and host arguments on the builder).
  void WatchLocalOnly(const std::string& op_name, std::vector<ValueId> inputs);
  // After the expansion, given its results: the run when it was local-only, else nullopt.
  std::optional<LocalOnlyRun> LocalOnly(const std::vector<ValueId>& outputs) const;

  // `check` is asked before each collective the expansion issues; its error stops the op
  // before the collective runs (clients comparing their eager collectives).
  void set_collective_check(std::function<Status(const CollectiveRecord&)> check) {
    collective_check_ = std::move(check);
  }

 protected:
  StatusOr<std::vector<TFE_TensorHandle*>> RunOn(const std::string& op_name,
                                                 const std::vector<TFE_TensorHandle*>& inputs,
                                                 const LocalOpOptions& options, int device,
                                                 int num_outputs) override;
  StatusOr<TFE_TensorHandle*> Share(TFE_TensorHandle* leader, int device) override;
  // A lowering's ops on several devices (a relayout's splits at each source, its joins at
  // each target) go from a thread each where DispatchOnThreads says so: an eager kernel on
  // an accelerator holds the host for its launch (a SplitV along an inner axis launches a
  // kernel per piece), which the devices' launches can then overlap.
  StatusOr<std::vector<std::vector<TFE_TensorHandle*>>> RunOnEach(
      const std::string& op_name, const std::vector<std::vector<TFE_TensorHandle*>>& inputs,
      const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs) override;
  // TF's eager copy between accelerators returns once the copy is done on the device (its
  // host waits for it), so the copies of one collective go from a thread each, as the
  // per-device kernels of a replay do (DispatchOnThreads).
  StatusOr<std::vector<TFE_TensorHandle*>> ShareAll(const std::vector<TFE_TensorHandle*>& leaders,
                                                    const std::vector<int>& devices) override;
  std::optional<std::vector<int64_t>> LocalShapeOf(TFE_TensorHandle* handle) override;
  int DTypeOf(TFE_TensorHandle* handle) override { return TFE_TensorHandleDataType(handle); }
  void Discard(TFE_TensorHandle* handle) override {
    if (handle) TFE_DeleteTensorHandle(handle);
  }
  int default_num_outputs() const override { return max_outputs_; }
  bool checks_collectives() const override { return static_cast<bool>(collective_check_); }
  Status BeforeCollective(const CollectiveRecord& record) override {
    return collective_check_(record);
  }
  // RunOn for every `inputs[i]` on `devices[i]` from `threads` threads at once
  // (RunOnEach's and RunCollective's way); on failure nothing it made is kept. With
  // `executor_of_its_own`, each thread runs its ops on a synchronous executor of its own
  // (collectives in an asynchronous context: see ThreadExecutor in executor.cc).
  StatusOr<std::vector<std::vector<TFE_TensorHandle*>>> RunAtOnce(
      const std::string& op_name, const std::vector<std::vector<TFE_TensorHandle*>>& inputs,
      const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs,
      int threads, bool executor_of_its_own = false);
  // TF collective ops: every device's op on its own thread (device_threads.h), since
  // the participants wait for each other.
  StatusOr<std::vector<TFE_TensorHandle*>> RunCollective(
      const std::string& op_name, const std::vector<std::vector<TFE_TensorHandle*>>& inputs,
      const LocalOpOptions& options) override;
  // Unless the thread's executor is asynchronous (ops then run after they return).
  bool collectives_done_on_return() const override;

 private:
  TFE_Context* context_;
  OpPool& pool_;
  KernelCache& kernels_;
  TFE_Op* op_ = nullptr;  // reset and reused for every local op of this builder
  const TFE_OpAttrs* attrs_;
  int max_outputs_;
  TF_Status* status_;
  // What a watched expansion did (WatchLocalOnly): still local-only so far, and each
  // device's results of the op (empty where it did not run).
  struct Watch {
    std::string op_name;
    std::vector<ValueId> inputs;
    bool local_only = true;
    std::vector<std::vector<TFE_TensorHandle*>> outputs;
  };
  std::optional<Watch> watch_;
  std::function<Status(const CollectiveRecord&)> collective_check_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_EXECUTOR_H_
