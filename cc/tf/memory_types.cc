#include "cc/tf/memory_types.h"

#include <string>

#include "tensorflow/core/framework/memory_types.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/device_name_utils.h"

namespace tf_dtensor {

namespace tf = ::tensorflow;

std::optional<std::vector<bool>> InputsInHostMemory(TF_Operation* op) {
  tf::DeviceNameUtils::ParsedName device;
  if (!tf::DeviceNameUtils::ParseFullName(TF_OperationDevice(op), &device) || !device.has_type) {
    return std::nullopt;
  }
  TF_Buffer* buffer = TF_NewBuffer();
  TF_Status* status = TF_NewStatus();
  TF_OperationToNodeDef(op, buffer, status);
  tf::NodeDef node;
  const bool parsed = TF_GetCode(status) == TF_OK &&
                      node.ParseFromArray(buffer->data, static_cast<int>(buffer->length));
  TF_DeleteStatus(status);
  TF_DeleteBuffer(buffer);
  if (!parsed) return std::nullopt;
  tf::MemoryTypeVector inputs, outputs;
  if (!tf::MemoryTypesForNode(tf::OpRegistry::Global(), tf::DeviceType(device.type), node,
                              &inputs, &outputs)
           .ok()) {
    return std::nullopt;
  }
  std::vector<bool> host(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) host[i] = inputs[i] == tf::HOST_MEMORY;
  return host;
}

}  // namespace tf_dtensor
