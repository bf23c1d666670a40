#include "cc/eager/kernel_cache.h"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "cc/tf/op_registry.h"
#include "tensorflow/c/eager/tfe_op_internal.h"
#include "tensorflow/c/eager/tfe_tensorhandle_internal.h"
#include "tensorflow/c/tf_status_helper.h"
#include "tensorflow/core/common_runtime/eager/context.h"
#include "tensorflow/core/common_runtime/eager/eager_op_rewrite_registry.h"
#include "tensorflow/core/common_runtime/eager/eager_operation.h"
#include "tensorflow/core/common_runtime/eager/kernel_and_device.h"
#include "tensorflow/core/common_runtime/eager/tensor_handle.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/util.h"

namespace tf_dtensor {

namespace tf = ::tensorflow;

namespace {

// Bounds the cache: ops whose attributes take many values (shapes, sizes) would otherwise
// keep a kernel per value. Cleared when full, as the plan cache is.
constexpr size_t kMaxKernels = 4096;

// Whether oneDNN's graph pass (MklLayoutRewritePass) may replace the op: TFE_Execute runs
// an eager op as a one-node function, and that function's graph goes through the pass,
// which swaps ops that have a `_Mkl` or `_MklNative` CPU kernel for it (Softmax, Transpose,
// ConcatV2, pooling, batch norm: results can differ in the last bits). Such ops keep TF's
// dispatch while oneDNN is on; the check is by name, so it also keeps some the pass would
// leave alone (a dtype it does not cover), which only costs their speed.
bool MaybeRewrittenByOneDnn(const std::string& op_name) {
  if (!tf::IsMKLEnabled()) return false;
  for (const char* prefix : {"_Mkl", "_MklNative"}) {
    const tf::KernelList kernels = tf::GetRegisteredKernelsForOp(prefix + op_name);
    for (const tf::KernelDef& kernel : kernels.kernel()) {
      if (kernel.device_type() == tf::DEVICE_CPU) return true;
    }
  }
  return false;
}

// Whether TF runs the op as written: no eager rewrite (oneDNN replaces some CPU ops with
// its own before running them) in either phase, and no oneDNN graph rewrite.
bool RewrittenByTF(tf::EagerOperation* op) {
  if (MaybeRewrittenByOneDnn(op->Name())) return true;
  for (auto phase : {tf::EagerOpRewriteRegistry::PRE_EXECUTION,
                     tf::EagerOpRewriteRegistry::POST_PLACEMENT}) {
    std::unique_ptr<tf::EagerOperation> rewritten;
    if (!tf::EagerOpRewriteRegistry::Global()->RunRewrite(phase, op, &rewritten).ok() ||
        rewritten) {
      return true;
    }
  }
  return false;
}

}  // namespace

struct KernelCache::Impl {
  std::mutex mutex;
  // Null where the op runs with TFE_Execute (decided once per key).
  std::unordered_map<tf::Fprint128, tf::core::RefCountPtr<tf::KernelAndDeviceOp>,
                     tf::Fprint128Hasher>
      kernels;
  // What the kernels were made with. TF can replace both while the device lives
  // (enabling collective ops swaps the local devices and rebuilds the function
  // libraries, clearing TF's own kernel cache); the kernels are dropped when they change.
  // The old device manager stays alive in TF, so its address is not reused.
  const tf::DeviceMgr* device_mgr = nullptr;
  const tf::ProcessFunctionLibraryRuntime* libraries = nullptr;

  // TF's eager kernel for `op` on `device_name`, or null when the op is not one to run here.
  static tf::core::RefCountPtr<tf::KernelAndDeviceOp> Create(tf::EagerOperation* op,
                                                             const char* device_name) {
    if (op->is_function() || !IsStatelessWithoutFunctions(op->Name())) return nullptr;
    tf::EagerContext& context = op->EagerContext();
    tf::Device* device = nullptr;
    if (!context.local_device_mgr()->LookupDevice(device_name, &device).ok() ||
        device->device_type() != tf::DEVICE_CPU) {
      return nullptr;
    }
    tf::FunctionLibraryRuntime* library = context.func_lib(device);
    if (library == nullptr || RewrittenByTF(op)) return nullptr;
    // As TF's eager runtime makes the kernel of an op it does not wrap in a function.
    tf::core::RefCountPtr<tf::KernelAndDeviceOp> kernel(new tf::KernelAndDeviceOp(
        /*rendezvous=*/nullptr, context.LogMemory(), library, context.runner(),
        /*collective_executor=*/nullptr, context.HostCPU()));
    const tf::NodeDef& node_def = op->MutableAttrs()->BuildNodeDef();
    if (!kernel->Init(/*log_device_placement=*/false, node_def, /*graph_collector=*/nullptr,
                      std::nullopt)
             .ok() ||
        const_cast<tf::OpKernel*>(kernel->kernel())->AsAsync() != nullptr) {
      return nullptr;
    }
    for (const tf::DataTypeVector* types : {&kernel->input_dtypes(), &kernel->output_dtypes()}) {
      for (tf::DataType type : *types) {
        if (type == tf::DT_RESOURCE) return nullptr;
      }
    }
    return kernel;
  }
};

KernelCache::KernelCache() : impl_(std::make_unique<Impl>()) {}
KernelCache::~KernelCache() = default;

bool KernelCache::Enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TF_DTENSOR_DIRECT_KERNELS");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

bool KernelCache::Run(TFE_Op* op, const char* device_name, TFE_TensorHandle** outputs,
                      int* num_outputs, TF_Status* status) {
  // Other devices keep TF's dispatch; checked on the name first, before any lookup.
  if (!Enabled() || std::strstr(device_name, "/device:CPU:") == nullptr) return false;
  tf::EagerOperation* eager_op = tf::OperationFromInterface(tf::unwrap(op));
  // Asynchronous contexts queue ops on TF's executor; inputs there may not be computed yet.
  if (eager_op->Executor().Async() || eager_op->HasCustomDeviceInput()) return false;
  // While TF logs where each op runs, local ops go through its dispatch, which logs them.
  tf::EagerContext& context = eager_op->EagerContext();
  if (context.LogDevicePlacement()) return false;
  const tf::Fprint128 key = eager_op->MutableAttrs()->CacheKey(device_name);
  // A reference of our own: another thread may drop the cache's while this one runs.
  tf::core::RefCountPtr<tf::KernelAndDeviceOp> kernel;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->device_mgr != context.local_device_mgr() ||
        impl_->libraries != context.pflr()) {
      impl_->kernels.clear();
      impl_->device_mgr = context.local_device_mgr();
      impl_->libraries = context.pflr();
    }
    auto found = impl_->kernels.find(key);
    if (found != impl_->kernels.end()) {
      known = true;
      if (found->second) {
        found->second->Ref();
        kernel.reset(found->second.get());
      }
    }
  }
  if (!known) {
    // Made outside the lock (other threads' ops go on); a thread that made it first wins.
    tf::core::RefCountPtr<tf::KernelAndDeviceOp> made = Impl::Create(eager_op, device_name);
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->kernels.size() >= kMaxKernels) impl_->kernels.clear();
    auto& entry = impl_->kernels.try_emplace(key, std::move(made)).first->second;
    if (entry) {
      entry->Ref();
      kernel.reset(entry.get());
    }
  }
  if (kernel == nullptr) return false;

  // The inputs as TF's eager runtime hands them to a kernel: local tensors of the kernel's
  // types. CPU devices of one process share host memory, so a tensor on another CPU device
  // is used in place (TF's copy between them shares the buffer too). The kernel gets
  // copies, which share each buffer: a buffer held once could otherwise be taken over by
  // the kernel for its output (forwarding), overwriting an input that others still read
  // (TF's op-as-function run passes its arguments the same way).
  const auto inputs = eager_op->GetInputs();
  if (static_cast<int>(inputs.size()) != kernel->num_inputs() ||
      kernel->num_outputs() > *num_outputs) {
    return false;  // TFE_Execute reports it
  }
  absl::InlinedVector<tf::Tensor, 4> tensors(inputs.size());
  absl::InlinedVector<tf::TensorValue, 4> values(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!tf::TensorHandle::classof(inputs[i])) return false;
    tf::TensorHandle* handle = tf::TensorHandleFromInterface(inputs[i]);
    const tf::Tensor* tensor = nullptr;
    if (handle->Type() != tf::TensorHandle::LOCAL || handle->dtype != kernel->input_dtypes()[i] ||
        handle->DeviceOrHostCPU(context)->device_type() != tf::DEVICE_CPU ||
        !handle->Tensor(&tensor).ok()) {
      return false;
    }
    tensors[i] = *tensor;
    values[i] = tf::TensorValue(&tensors[i]);
  }
  tf::EagerKernelArgs args(std::move(values));
  std::vector<tf::EagerKernelRet> results;
  const absl::Status run = kernel->Run(context.StepContainer(), args, &results,
                                       /*cancellation_manager=*/nullptr, std::nullopt,
                                       std::nullopt, /*coordination_service_agent=*/nullptr);
  runs_.fetch_add(1, std::memory_order_relaxed);
  if (!run.ok()) {
    tsl::Set_TF_Status_from_Status(status, run);
    return true;
  }
  // Result handles as TF's eager runtime makes them (GetKernelOutputs): on the kernel's
  // output device, which is the host CPU's handle convention (no device) on CPU:0.
  for (size_t i = 0; i < results.size(); ++i) {
    outputs[i] = tf::wrap(tf::TensorHandle::CreateLocalHandle(
        std::move(std::get<tf::Tensor>(results[i])),
        context.CanonicalDevice(kernel->OutputDevice(i)), kernel->device(),
        kernel->OutputResourceDevice(i), &context));
  }
  *num_outputs = static_cast<int>(results.size());
  return true;
}

}  // namespace tf_dtensor
