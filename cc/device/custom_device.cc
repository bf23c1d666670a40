// Translates the TFE custom-device callbacks into DTensorDevice calls. No policy here.
#include "cc/device/custom_device.h"

#include <mutex>

#include "cc/eager/executor.h"
#include "cc/spmd/lowering.h"
#include "cc/tf/physical_devices.h"

namespace tf_dtensor {
namespace {

DTensorDevice* AsDevice(void* device_info) { return static_cast<DTensorDevice*>(device_info); }

TFE_TensorHandle* CopyToDevice(TFE_Context* context, TFE_TensorHandle* tensor, TF_Status* status,
                               void* device_info) {
  return AsDevice(device_info)->CopyToDevice(context, tensor, status);
}

TFE_TensorHandle* CopyFromDevice(TFE_Context* context, TFE_TensorHandle* tensor,
                                 const char* target_device_name, TF_Status* status,
                                 void* device_info) {
  return AsDevice(device_info)->CopyFromDevice(context, tensor, target_device_name, status);
}

void Execute(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs, TF_Status* status,
             void* device_info) {
  AsDevice(device_info)->Execute(op, num_outputs, outputs, status);
}

void DeleteDevice(void* device_info) { delete AsDevice(device_info); }

}  // namespace

StatusOr<DTensorDevice*> RegisterDTensorDevice(TFE_Context* context,
                                               const std::string& device_name) {
  TFE_CustomDevice device;
  device.copy_tensor_to_device = &CopyToDevice;
  device.copy_tensor_from_device = &CopyFromDevice;
  device.execute = &Execute;
  device.delete_device = &DeleteDevice;
  // Where NCCL can serve a mesh depends on the physical GPUs behind its devices, which TF
  // knows once it has created them (before any device of ours exists).
  static std::once_flag physical;
  std::call_once(physical, [] { SetPhysicalDeviceLookup(&PhysicalGpuId); });
  auto* info = new DTensorDevice(device_name);
  TF_Status* status = TF_NewStatus();
  TFE_RegisterCustomDevice(context, device, device_name.c_str(), info, status);
  Status s = FromTF(status, "registering the DTensor device " + device_name);
  TF_DeleteStatus(status);
  if (!s.ok()) return s;  // TF already deleted `info` through delete_device.
  return info;
}

}  // namespace tf_dtensor
