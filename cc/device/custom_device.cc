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

// TensorFlow's default keeps an op with a resource input of a physical device (a plain
// tf.Variable's handle) on that device, copying the DTensor inputs there: a tf.function that
// captures a plain variable would gather its sharded inputs on one device (or be refused).
// The DTensor device takes such a function call, as TensorFlow's DTensor does; otherwise
// TensorFlow's default rule stands (TF calls this only when every custom-device input of the
// op is a DTensor).
bool ShallPinToThisDevice(const TFE_Op* op, TF_Status* status) {
  TFE_Context* context = TFE_OpGetContext(op, status);
  if (TF_GetCode(status) != TF_OK) return false;
  const int num_inputs = TFE_OpGetFlatInputCount(op, status);
  if (TF_GetCode(status) != TF_OK) return false;
  bool plain_resource = false;
  for (int i = 0; i < num_inputs && !plain_resource; ++i) {
    TFE_TensorHandle* input = TFE_OpGetFlatInput(op, i, status);
    if (TF_GetCode(status) != TF_OK) return false;
    if (TFE_TensorHandleDataType(input) != TF_RESOURCE) continue;
    const char* on = TFE_TensorHandleDeviceName(input, status);
    if (TF_GetCode(status) != TF_OK) return false;
    if (TFE_IsCustomDevice(context, on)) return true;  // a DVariable's handle: ours
    plain_resource = true;
  }
  const char* name = TFE_OpGetName(op, status);
  if (TF_GetCode(status) != TF_OK) return false;
  if (plain_resource) return TFE_ContextHasFunction(context, name);
  const char* device = TFE_OpGetDevice(op, status);
  if (TF_GetCode(status) != TF_OK) return false;
  // No resource input: an explicit placement is kept, as TensorFlow's rule keeps it.
  return device == nullptr || device[0] == '\0' || TFE_IsCustomDevice(context, device);
}

}  // namespace

StatusOr<DTensorDevice*> RegisterDTensorDevice(TFE_Context* context,
                                               const std::string& device_name) {
  TFE_CustomDevice device;
  device.copy_tensor_to_device = &CopyToDevice;
  device.copy_tensor_from_device = &CopyFromDevice;
  device.execute = &Execute;
  device.delete_device = &DeleteDevice;
  device.shall_pin_to_this_device = &ShallPinToThisDevice;
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
