#include "cc/eager/executor.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cc/core/strings.h"
#include "cc/eager/collective_recovery.h"
#include "cc/eager/device_threads.h"
#include "cc/tf/op_registry.h"
#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {

OpPool::~OpPool() {
  for (TFE_Op* op : free_) TFE_DeleteOp(op);
}

TFE_Op* OpPool::Take(TFE_Context* context, TF_Status* status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      TFE_Op* op = free_.back();
      free_.pop_back();
      return op;
    }
  }
  TFE_Op* op = TFE_NewOp(context, "NoOp", status);
  if (TF_GetCode(status) != TF_OK) {
    if (op) TFE_DeleteOp(op);
    return nullptr;
  }
  return op;
}

void OpPool::Return(TFE_Op* op, TF_Status* status) {
  // Resetting drops the input handles the op holds since it last ran.
  TFE_OpReset(op, "NoOp", nullptr, status);
  if (TF_GetCode(status) != TF_OK) {
    TFE_DeleteOp(op);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(op);
}

namespace {

// The most threads one ShareAll makes its copies from.
constexpr int kMaxCopyThreads = 64;

// Runs work(i, status) for every item i < n from `threads` threads (thread t takes items t,
// t + threads, ...), each thread with a TF_Status of its own, cleared after a failure. The
// first failure by item, or OK.
Status ForEachItemOnThreads(int n, int threads,
                            const std::function<Status(int, TF_Status*)>& work) {
  std::vector<Status> failures(n);
  RunConcurrently(threads, [&](int t) {
    TF_Status* status = TF_NewStatus();
    for (int i = t; i < n; i += threads) {
      failures[i] = work(i, status);
      if (!failures[i].ok()) TF_SetStatus(status, TF_OK, "");
    }
    TF_DeleteStatus(status);
  });
  for (const Status& failure : failures) {
    if (!failure.ok()) return failure;
  }
  return Status::Ok();
}

// While alive, the calling thread's eager ops go to a synchronous executor of the thread's
// own (made once per thread, kept for the process, as TF's parallel device keeps one per
// device thread) instead of the context's. In an asynchronous context every thread shares
// the context's one executor, which runs its queue in order on one thread: the first
// device's collective would wait there for peers queued behind it, forever. Each op
// still waits for its inputs, which the context's executor makes.
class ThreadExecutor {
 public:
  explicit ThreadExecutor(TFE_Context* context)
      : context_(context), previous_(TFE_ContextGetExecutorForThread(context)) {
    thread_local TFE_Executor* own = TFE_NewExecutor(/*is_async=*/false,
                                                     /*enable_streaming_enqueue=*/true,
                                                     /*in_flight_nodes_limit=*/0);
    TFE_ContextSetExecutorForThread(context_, own);
  }
  ~ThreadExecutor() {
    TFE_ContextSetExecutorForThread(context_, previous_);
    TFE_DeleteExecutor(previous_);  // the handle only: the context owns its executor
  }
  ThreadExecutor(const ThreadExecutor&) = delete;
  ThreadExecutor& operator=(const ThreadExecutor&) = delete;

 private:
  TFE_Context* context_;
  TFE_Executor* previous_;
};

// Each thread keeps the value table of its last finished builder, so that an eager op
// does not allocate one (an op's inputs and outputs: about 2 KiB, a malloc and a free per
// op). Nested builders find it taken and allocate their own.
template <typename Value>
std::vector<Value>& SpareValues() {
  thread_local std::vector<Value> spare;
  return spare;
}

}  // namespace

EagerBuilder::EagerBuilder(TFE_Context* context, Mesh mesh, const TFE_OpAttrs* attrs,
                           int max_outputs, OpPool& pool, KernelCache& kernels)
    : ComponentBuilder(std::move(mesh)),
      context_(context),
      pool_(pool),
      kernels_(kernels),
      attrs_(attrs),
      max_outputs_(max_outputs),
      status_(ThreadStatus()) {
  values_.swap(SpareValues<Value>());
  if (values_.capacity() == 0) values_.reserve(8);  // most ops, without regrowing
}

EagerBuilder::~EagerBuilder() {
  for (Value& v : values_) {
    if (!v.owned) continue;
    for (TFE_TensorHandle* h : v.handles) {
      if (h) TFE_DeleteTensorHandle(h);
    }
    if (v.host) TFE_DeleteTensorHandle(v.host);
  }
  if (op_) pool_.Return(op_, status_);  // the builder's own status is done with
  values_.clear();
  std::vector<Value>& spare = SpareValues<Value>();
  if (spare.capacity() < values_.capacity()) spare.swap(values_);
}

TF_Status* EagerBuilder::ThreadStatus() {
  // A builder lives on one thread and checks its status after every call, so builders of
  // one thread (one at a time, or nested) can share it; each starts it clean.
  thread_local std::unique_ptr<TF_Status, decltype(&TF_DeleteStatus)> status(TF_NewStatus(),
                                                                             TF_DeleteStatus);
  TF_SetStatus(status.get(), TF_OK, "");
  return status.get();
}

ValueId EagerBuilder::AddInput(const TensorWithLayout* tensor) {
  Value v;
  v.layout = tensor->layout();
  v.shape = tensor->shape();
  v.dtype = tensor->dtype();
  v.resource = tensor->resource();
  v.handles.reserve(tensor->num_components());
  for (int i = 0; i < tensor->num_components(); ++i) v.handles.push_back(tensor->component(i));
  v.owned = false;
  return Add(std::move(v));
}

ValueId EagerBuilder::AddHostInput(TFE_TensorHandle* handle, std::vector<int64_t> shape,
                                   TF_DataType dtype) {
  Value v;
  v.shape = std::move(shape);
  v.dtype = dtype;
  v.host = handle;
  v.owned = false;
  return Add(std::move(v));
}

StatusOr<std::unique_ptr<TensorWithLayout>> EagerBuilder::Release(ValueId value) {
  Value& v = values_[value];
  if (!v.layout) return Internal("Releasing a host value as a DTensor.");
  std::vector<HandlePtr> components;
  components.reserve(v.handles.size());
  for (TFE_TensorHandle* h : v.handles) {
    if (v.owned) {
      components.emplace_back(h);
    } else {
      components.push_back(ShareHandle(h, status_));
      TFD_RETURN_IF_TF_ERROR(status_, "sharing a component");
    }
  }
  // The record owns the handles now; later releases share them.
  v.owned = false;
  auto tensor = std::make_unique<TensorWithLayout>(*v.layout, v.shape,
                                                   static_cast<TF_DataType>(v.dtype),
                                                   std::move(components));
  tensor->set_resource(v.resource);
  return tensor;
}

Status EagerBuilder::Emit(const std::vector<ValueId>& values, const std::string& device_name,
                          bool parted, int* num_outputs, TFE_TensorHandle** outputs) {
  if (static_cast<int>(values.size()) > *num_outputs) {
    return Internal("The op produced more outputs than TensorFlow expects.");
  }
  TF_SetStatus(status_, TF_OK, "");
  // Outputs wrapped before a later one fails are released again: TensorFlow takes none
  // of them when the op fails.
  auto fail = [&](size_t wrapped, Status error) {
    for (size_t k = 0; k < wrapped; ++k) {
      TFE_DeleteTensorHandle(outputs[k]);
      outputs[k] = nullptr;
    }
    return error;
  };
  for (size_t i = 0; i < values.size(); ++i) {
    StatusOr<std::unique_ptr<TensorWithLayout>> tensor = Release(values[i]);
    if (!tensor.ok()) return fail(i, tensor.status());
    (*tensor)->set_parted(parted && !(*tensor)->resource());
    outputs[i] = TensorWithLayout::MakeHandle(context_, device_name, std::move(tensor).value(),
                                              status_);
    if (TF_GetCode(status_) != TF_OK) return fail(i, FromTF(status_, "wrapping an output"));
  }
  *num_outputs = static_cast<int>(values.size());
  return Status::Ok();
}


std::optional<std::vector<int64_t>> EagerBuilder::LocalShapeOf(TFE_TensorHandle* handle) {
  std::vector<int64_t> shape = HandleShape(handle, status_);
  if (TF_GetCode(status_) != TF_OK) return std::nullopt;
  return shape;
}

StatusOr<TFE_TensorHandle*> EagerBuilder::Share(TFE_TensorHandle* leader_handle, int device) {
  TFE_TensorHandle* out;
  if (lowering().shares_buffers()) {
    out = TFE_TensorHandleCopySharingTensor(leader_handle, status_);
  } else {
    out = TFE_TensorHandleCopyToDevice(leader_handle, context_,
                                       mesh_.local_devices()[device].c_str(), status_);
  }
  TFD_RETURN_IF_TF_ERROR(status_, "placing a component on " + mesh_.local_devices()[device]);
  return out;
}

StatusOr<std::vector<TFE_TensorHandle*>> EagerBuilder::ShareAll(
    const std::vector<TFE_TensorHandle*>& leaders, const std::vector<int>& devices) {
  const int n = static_cast<int>(leaders.size());
  if (n < 2 || lowering().shares_buffers() || !DispatchOnThreads(mesh_)) {
    return ComponentBuilder::ShareAll(leaders, devices);
  }
  std::vector<TFE_TensorHandle*> out(n, nullptr);
  const Mesh mesh = mesh_;
  TFE_Context* context = context_;
  // A thread per copy, up to kMaxCopyThreads: an eager copy between accelerators holds its
  // thread until the copy's event has been seen done (TF's EventMgr polls for it), about
  // 150-250 us on an H100 for a copy the GPU makes in 5. With one thread per device, an
  // all-to-all's 56 copies over 8 logical GPUs went in 7 waves of 8, each waiting its turn
  // (the trace of 2026-11-27: 1.3 ms of a 4.5 ms relayout); with a thread each they wait
  // together. The threads only wait: they take no core while they do.
  Status done = ForEachItemOnThreads(
      n, std::min(n, std::max(kMaxCopyThreads, mesh_.num_local_devices())),
      [&](int i, TF_Status* status) {
        const std::string& device = mesh.local_devices()[devices[i]];
        TFE_TensorHandle* copy =
            TFE_TensorHandleCopyToDevice(leaders[i], context, device.c_str(), status);
        if (TF_GetCode(status) != TF_OK) return FromTF(status, "placing a component on " + device);
        out[i] = copy;
        return Status::Ok();
      });
  if (!done.ok()) {
    for (TFE_TensorHandle* made : out) Discard(made);
    return done;
  }
  return out;
}

StatusOr<std::vector<std::vector<TFE_TensorHandle*>>> EagerBuilder::RunOnEach(
    const std::string& op_name, const std::vector<std::vector<TFE_TensorHandle*>>& inputs,
    const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs) {
  const int n = static_cast<int>(inputs.size());
  if (n < 2 || lowering().shares_buffers() || !DispatchOnThreads(mesh_) || num_outputs < 0) {
    return ComponentBuilder::RunOnEach(op_name, inputs, devices, options, num_outputs);
  }
  // At most one thread per local device.
  return RunAtOnce(op_name, inputs, devices, options, num_outputs,
                   std::min(n, mesh_.num_local_devices()));
}

StatusOr<std::vector<std::vector<TFE_TensorHandle*>>> EagerBuilder::RunAtOnce(
    const std::string& op_name, const std::vector<std::vector<TFE_TensorHandle*>>& inputs,
    const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs,
    int threads, bool executor_of_its_own) {
  if (watch_) watch_->local_only = false;
  const int n = static_cast<int>(inputs.size());
  std::vector<std::vector<TFE_TensorHandle*>> out(n);
  const Mesh mesh = mesh_;
  TFE_Context* context = context_;
  Status done = ForEachItemOnThreads(n, threads, [&](int i, TF_Status* status) {
    std::optional<ThreadExecutor> own;
    if (executor_of_its_own) own.emplace(context);
    const std::string& device = mesh.local_devices()[devices[i]];
    TFE_Op* op = pool_.Take(context_, status);
    if (op == nullptr) {
      return FromTF(status, "creating '" + op_name + "' on " + ShortDeviceName(device));
    }
    std::vector<TFE_TensorHandle*> outputs(num_outputs, nullptr);
    int count = num_outputs;
    Status run = RunLocal(op, op_name, device, attrs_, inputs[i], options, kernels_,
                          outputs.data(), &count, status);
    pool_.Return(op, status);
    if (!run.ok()) return run;
    outputs.resize(count);
    out[i] = std::move(outputs);
    return Status::Ok();
  });
  if (!done.ok()) {
    for (const std::vector<TFE_TensorHandle*>& made : out) DiscardAll(made);
    return done;
  }
  return out;
}

StatusOr<std::vector<TFE_TensorHandle*>> EagerBuilder::RunOn(
    const std::string& op_name, const std::vector<TFE_TensorHandle*>& inputs,
    const LocalOpOptions& options, int device, int num_outputs) {
  // One op object serves every local op of this builder.
  if (!op_) op_ = pool_.Take(context_, status_);
  TFD_RETURN_IF_TF_ERROR(status_, "creating '" + op_name + "'");
  std::vector<TFE_TensorHandle*> outputs(num_outputs, nullptr);
  int n = num_outputs;
  TFD_RETURN_IF_ERROR(RunLocal(op_, op_name, mesh_.local_devices()[device], attrs_, inputs,
                               options, kernels_, outputs.data(), &n, status_));
  outputs.resize(n);
  if (watch_ && watch_->local_only) {
    Watch& w = *watch_;
    bool same = op_name == w.op_name && options.copy_attrs && options.overrides.empty() &&
                inputs.size() == w.inputs.size() && w.outputs[device].empty();
    for (size_t i = 0; same && i < inputs.size(); ++i) {
      same = inputs[i] == local(w.inputs[i], device);
    }
    w.local_only = same;
    if (same) w.outputs[device] = outputs;
  }
  return outputs;
}

void EagerBuilder::WatchLocalOnly(const std::string& op_name, std::vector<ValueId> inputs) {
  watch_ = Watch{op_name, std::move(inputs), true,
                 std::vector<std::vector<TFE_TensorHandle*>>(mesh_.num_local_devices())};
}

std::optional<LocalOnlyRun> EagerBuilder::LocalOnly(const std::vector<ValueId>& outputs) const {
  if (!watch_ || !watch_->local_only) return std::nullopt;
  const Watch& w = *watch_;
  const int n = mesh_.num_local_devices();
  LocalOnlyRun run;
  run.leaders.assign(n, -1);
  for (int d = 0; d < n; ++d) {
    if (w.outputs[d].empty()) continue;
    if (w.outputs[d].size() != outputs.size()) return std::nullopt;
    run.leaders[d] = d;
  }
  if (outputs.empty() || run.leaders[0] != 0) return std::nullopt;
  for (size_t j = 0; j < outputs.size(); ++j) {
    const Value& v = values_[outputs[j]];
    if (!v.layout || v.resource || !v.owned || v.layout->is_partial() ||
        static_cast<int>(v.handles.size()) != n) {
      return std::nullopt;
    }
    // Each device holds its own result or, shared, the very handle of a device that ran.
    for (int d = 0; d < n; ++d) {
      if (run.leaders[d] < 0) {  // first output: find the device it shares with
        for (int l = 0; l < d && run.leaders[d] < 0; ++l) {
          if (!w.outputs[l].empty() && w.outputs[l][0] == v.handles[d]) run.leaders[d] = l;
        }
        if (run.leaders[d] < 0) return std::nullopt;
      }
      if (v.handles[d] != w.outputs[run.leaders[d]][j]) return std::nullopt;
    }
    run.outputs.push_back(*v.layout);
  }
  return run;
}

namespace {

// The lock an op that TF's eager dispatch runs on `device_name` takes, or null. TF runs
// such an op as a one-op function; on a CPU device other than the host, its inputs that
// live on the host (a Slice's begin and size, SplitV's sizes, ConcatV2's axis) reach it by
// _Send/_Recv, and two runs of that function at once on one device cross their inputs
// (most likely shared rendezvous keys): shape errors, or wrong values where shapes agree.
// Plain TensorFlow does the same from 8 threads on CPU:1 and up (a few tf.slice calls in
// 2,400), never on CPU:0 or with one device per thread. Those runs
// go one at a time per device; runs on different devices, and every op on the host or a
// GPU, do not wait. Stateful ops (a collective waits for its peers) take no lock.
std::mutex* DispatchLock(const std::string& device_name, const std::string& op_name) {
  static constexpr size_t kLocks = 64;
  static std::mutex* const locks = new std::mutex[kLocks];
  static const std::string kCpu = "/device:CPU:";
  const size_t at = device_name.rfind(kCpu);
  if (at == std::string::npos) return nullptr;
  const char* index = device_name.c_str() + at + kCpu.size();
  if (index[0] == '0' && index[1] == '\0') return nullptr;  // the host
  thread_local std::unordered_map<std::string, bool> stateless;  // TF's registry locks
  auto known = stateless.find(op_name);
  if (known == stateless.end()) {
    known = stateless.emplace(op_name, IsStatelessWithoutFunctions(op_name)).first;
  }
  if (!known->second) return nullptr;
  return &locks[std::strtoul(index, nullptr, 10) % kLocks];
}

}  // namespace

Status EagerBuilder::RunLocal(TFE_Op* op, const std::string& op_name,
                              const std::string& device_name, const TFE_OpAttrs* attrs,
                              const std::vector<TFE_TensorHandle*>& inputs,
                              const LocalOpOptions& options, KernelCache& kernels,
                              TFE_TensorHandle** outputs, int* num_outputs, TF_Status* status) {
  // One reset names the op and places it (an executed op's device is unset again).
  TFE_OpReset(op, op_name.c_str(), device_name.c_str(), status);
  TFD_RETURN_IF_TF_ERROR(status,
                         "creating '" + op_name + "' on " + ShortDeviceName(device_name));
  // Overrides first: TF's eager attribute builder keeps the first value set for a name,
  // so the copied attributes fill in only what the overrides leave out.
  for (const AttrOverride& a : options.overrides) {
    switch (a.kind) {
      case AttrOverride::Kind::kShape:
        TFE_OpSetAttrShape(op, a.name.c_str(), a.ints.data(),
                           static_cast<int>(a.ints.size()), status);
        break;
      case AttrOverride::Kind::kType:
        TFE_OpSetAttrType(op, a.name.c_str(), static_cast<TF_DataType>(a.type));
        break;
      case AttrOverride::Kind::kInt:
        TFE_OpSetAttrInt(op, a.name.c_str(), a.ints[0]);
        break;
      case AttrOverride::Kind::kBool:
        TFE_OpSetAttrBool(op, a.name.c_str(), a.boolean);
        break;
      case AttrOverride::Kind::kString:
        TFE_OpSetAttrString(op, a.name.c_str(), a.text.data(), a.text.size());
        break;
      case AttrOverride::Kind::kIntList:
        TFE_OpSetAttrIntList(op, a.name.c_str(), a.ints.data(), static_cast<int>(a.ints.size()));
        break;
    }
    TFD_RETURN_IF_TF_ERROR(status, "setting attribute '" + a.name + "' of '" + op_name + "'");
  }
  if (options.copy_attrs && attrs) TFE_OpAddAttrs(op, attrs);
  for (TFE_TensorHandle* h : inputs) {
    TFE_OpAddInput(op, h, status);
    TFD_RETURN_IF_TF_ERROR(status, "adding an input to '" + op_name + "'");
  }
  if (!kernels.Run(op, device_name.c_str(), outputs, num_outputs, status)) {
    std::mutex* lock = DispatchLock(device_name, op_name);
    if (lock != nullptr) {
      std::lock_guard<std::mutex> one_at_a_time(*lock);
      TFE_Execute(op, outputs, num_outputs, status);
    } else {
      TFE_Execute(op, outputs, num_outputs, status);
    }
  }
  TFD_RETURN_IF_TF_ERROR(status,
                         "running '" + op_name + "' on " + ShortDeviceName(device_name));
  return Status::Ok();
}


std::optional<std::vector<int64_t>> EagerBuilder::IntValue(ValueId value) {
  Value& v = values_[value];
  if (v.int_value_read) return v.int_value;
  v.int_value_read = true;
  if (!v.layout) {
    v.int_value = ReadIntValue(v.host);
  } else if (v.layout->IsFullyReplicated() && !v.resource && !v.handles.empty()) {
    v.int_value = ReadIntValue(v.handles[0]);
  }
  return v.int_value;
}

StatusOr<std::vector<TFE_TensorHandle*>> EagerBuilder::RunCollective(
    const std::string& op_name, const std::vector<std::vector<TFE_TensorHandle*>>& inputs,
    const LocalOpOptions& options) {
  // Every participant blocks until the whole group has arrived: one thread per device.
  CollectiveRun run(context_);
  const int n = static_cast<int>(inputs.size());
  std::vector<int> devices(n);
  for (int d = 0; d < n; ++d) devices[d] = d;
  StatusOr<std::vector<std::vector<TFE_TensorHandle*>>> ran =
      RunAtOnce(op_name, inputs, devices, options, 1, n,
                /*executor_of_its_own=*/!collectives_done_on_return());
  if (!ran.ok()) run.Failed();
  TFD_ASSIGN_OR_RETURN(std::vector<std::vector<TFE_TensorHandle*>> out, std::move(ran));
  std::vector<TFE_TensorHandle*> outputs;
  outputs.reserve(n);
  for (const std::vector<TFE_TensorHandle*>& o : out) outputs.push_back(o[0]);
  return outputs;
}

bool EagerBuilder::collectives_done_on_return() const {
  TFE_Executor* executor = TFE_ContextGetExecutorForThread(context_);
  const bool async = TFE_ExecutorIsAsync(executor);
  TFE_DeleteExecutor(executor);
  return !async;
}

StatusOr<ValueId> EagerBuilder::HostConstant(const std::vector<int64_t>& values,
                                             const std::vector<int64_t>& shape, int dtype) {
  TFD_ASSIGN_OR_RETURN(TF_Tensor * tensor, IntTensor(values, shape, dtype));
  TFE_TensorHandle* handle = TFE_NewTensorHandle(tensor, status_);
  TF_DeleteTensor(tensor);
  if (watch_) watch_->local_only = false;
  TFD_RETURN_IF_TF_ERROR(status_, "creating a host constant");
  Value v;
  v.shape = shape;
  v.dtype = dtype;
  v.host = handle;
  return Add(std::move(v));
}

}  // namespace tf_dtensor
