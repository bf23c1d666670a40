#include "cc/tf/resource_value.h"

#include "tensorflow/c/eager/tfe_tensorhandle_internal.h"
#include "tensorflow/core/common_runtime/eager/tensor_handle.h"

namespace tf_dtensor {

std::optional<ResourceValue> ResourceValueOf(TFE_TensorHandle* handle) {
  namespace tf = ::tensorflow;
  if (handle == nullptr || TFE_TensorHandleDataType(handle) != TF_RESOURCE) return std::nullopt;
  tf::ImmediateExecutionTensorHandle* generic = tf::unwrap(handle);
  if (!tf::TensorHandle::classof(generic)) return std::nullopt;
  std::vector<tf::DtypeAndPartialTensorShape> values;
  if (!tf::TensorHandleFromInterface(generic)->GetResourceHandleDtypesAndShapes(&values).ok() ||
      values.size() != 1 || values[0].shape.unknown_rank()) {
    return std::nullopt;
  }
  ResourceValue value;
  value.dtype = static_cast<int>(values[0].dtype);
  for (int d = 0; d < values[0].shape.dims(); ++d) value.shape.push_back(values[0].shape.dim_size(d));
  return value;
}

}  // namespace tf_dtensor
