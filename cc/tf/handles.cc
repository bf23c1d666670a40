#include "cc/tf/handles.h"

#include <memory>

#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {

Status FromTF(TF_Status* status, const std::string& context) {
  TF_Code code = TF_GetCode(status);
  if (code == TF_OK) return Status::Ok();
  return Status(static_cast<Code>(code), context + ": " + TF_Message(status));
}

std::string SerializedAttrs(const TFE_OpAttrs* attrs, TF_Status* status) {
  TF_Buffer* buffer = TF_NewBuffer();
  TFE_OpAttrsSerialize(attrs, buffer, status);
  std::string bytes;
  if (TF_GetCode(status) == TF_OK) {
    bytes.assign(static_cast<const char*>(buffer->data), buffer->length);
  }
  TF_DeleteBuffer(buffer);
  return bytes;
}

std::vector<int64_t> HandleShape(TFE_TensorHandle* handle, TF_Status* status) {
  std::vector<int64_t> shape;
  int rank = TFE_TensorHandleNumDims(handle, status);
  if (rank > 0) shape.reserve(rank);
  for (int d = 0; d < rank; ++d) shape.push_back(TFE_TensorHandleDim(handle, d, status));
  return shape;
}

std::optional<std::vector<int64_t>> ReadIntValue(TFE_TensorHandle* handle) {
  // Host arguments are small (shapes, axes, permutations); larger tensors are data.
  constexpr int64_t kMaxIntValueElements = 1 << 12;
  TF_DataType dtype = TFE_TensorHandleDataType(handle);
  if (dtype != TF_INT32 && dtype != TF_INT64) return std::nullopt;
  // Its own scratch status (not the thread's, which a builder may be reading): a status
  // per call was a malloc on the eager path of every op with a host argument.
  thread_local std::unique_ptr<TF_Status, decltype(&TF_DeleteStatus)> scratch(TF_NewStatus(),
                                                                              TF_DeleteStatus);
  TF_Status* status = scratch.get();
  TF_SetStatus(status, TF_OK, "");
  int64_t count = TFE_TensorHandleNumElements(handle, status);
  if (TF_GetCode(status) != TF_OK || count > kMaxIntValueElements) return std::nullopt;
  TF_Tensor* tensor = TFE_TensorHandleResolve(handle, status);
  if (TF_GetCode(status) != TF_OK) return std::nullopt;
  std::vector<int64_t> values(count);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = dtype == TF_INT32 ? static_cast<const int32_t*>(TF_TensorData(tensor))[i]
                                  : static_cast<const int64_t*>(TF_TensorData(tensor))[i];
  }
  TF_DeleteTensor(tensor);
  return values;
}

}  // namespace tf_dtensor
