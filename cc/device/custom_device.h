// Registration of the DTensor device with a TFE context.
#ifndef TF_DTENSOR_CC_DEVICE_CUSTOM_DEVICE_H_
#define TF_DTENSOR_CC_DEVICE_CUSTOM_DEVICE_H_

#include <string>

#include "cc/core/status.h"
#include "cc/device/dtensor_device.h"

namespace tf_dtensor {

// Registers a DTensorDevice named `device_name` with `context`. TF owns the device and
// deletes it with the context; the pointer stays valid until then.
StatusOr<DTensorDevice*> RegisterDTensorDevice(TFE_Context* context,
                                               const std::string& device_name);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_DEVICE_CUSTOM_DEVICE_H_
