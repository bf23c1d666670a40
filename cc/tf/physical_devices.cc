#include "cc/tf/physical_devices.h"

#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "tensorflow/core/util/device_name_utils.h"

namespace tf_dtensor {

std::optional<int> PhysicalGpuId(const std::string& device_name) {
  tensorflow::DeviceNameUtils::ParsedName parsed;
  if (!tensorflow::DeviceNameUtils::ParseFullOrLocalName(device_name, &parsed) ||
      !parsed.has_type || parsed.type != "GPU" || !parsed.has_id) {
    return std::nullopt;
  }
  tsl::PlatformDeviceId platform;
  if (!tensorflow::GpuIdManager::TfToPlatformDeviceId(tsl::TfDeviceId(parsed.id), &platform)
           .ok()) {
    return std::nullopt;
  }
  return platform.value();
}

}  // namespace tf_dtensor
