// Which inputs of a graph op TF keeps in host memory on the op's device (TF's
// MemoryTypesForNode: the kernel's HostMemory arguments, and int32 on GPUs). The graph
// builder asks it to place constants where the op reads them.
#ifndef TF_DTENSOR_CC_TF_MEMORY_TYPES_H_
#define TF_DTENSOR_CC_TF_MEMORY_TYPES_H_

#include <optional>
#include <vector>

#include "tensorflow/c/c_api.h"

namespace tf_dtensor {

// Per input of `op` (as placed: its requested device's type), whether TF reads it from
// host memory; nullopt when TF cannot tell (an unknown op, a device it does not parse).
std::optional<std::vector<bool>> InputsInHostMemory(TF_Operation* op);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_MEMORY_TYPES_H_
