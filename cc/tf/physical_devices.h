// Which physical device a TF device of this process runs on. Logical GPUs that split one
// physical GPU (tf.config.set_logical_device_configuration) share it: NCCL cannot run
// between them.
#ifndef TF_DTENSOR_CC_TF_PHYSICAL_DEVICES_H_
#define TF_DTENSOR_CC_TF_PHYSICAL_DEVICES_H_

#include <optional>
#include <string>

namespace tf_dtensor {

// The platform (CUDA) id of the physical GPU behind a local GPU device
// ("/job:localhost/replica:0/task:0/device:GPU:3"), or nullopt for other devices and GPUs TF
// has not created.
std::optional<int> PhysicalGpuId(const std::string& device_name);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_PHYSICAL_DEVICES_H_
