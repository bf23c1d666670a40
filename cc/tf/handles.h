// TF C-API glue for tensor handles and statuses, shared by the eager executor, the graph
// expansion and the device: status conversion, a handle's shape, small integer values.
#ifndef TF_DTENSOR_CC_TF_HANDLES_H_
#define TF_DTENSOR_CC_TF_HANDLES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/status.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/eager/c_api.h"
#include "tensorflow/c/eager/c_api_experimental.h"
#include "tensorflow/c/tf_status.h"

namespace tf_dtensor {

// Owning pointers for the TF C-API objects tf_dtensor creates.
struct StatusDeleter {
  void operator()(TF_Status* s) const { TF_DeleteStatus(s); }
};
using StatusPtr = std::unique_ptr<TF_Status, StatusDeleter>;
struct OpDeleter {
  void operator()(TFE_Op* o) const { TFE_DeleteOp(o); }
};
using OpPtr = std::unique_ptr<TFE_Op, OpDeleter>;

// Converts a failed TF_Status into our Status, with context.
Status FromTF(TF_Status* status, const std::string& context);

// An op's attributes as the C API serializes them (a NameAttrList); `status` says whether
// they could be read (empty when not).
std::string SerializedAttrs(const TFE_OpAttrs* attrs, TF_Status* status);

// The shape of a local tensor; `status` says whether it could be read.
std::vector<int64_t> HandleShape(TFE_TensorHandle* handle, TF_Status* status);

// The integer value of a small int32 or int64 tensor (a host argument: an axis, a shape),
// or nullopt for other tensors.
std::optional<std::vector<int64_t>> ReadIntValue(TFE_TensorHandle* handle);

// Returns FromTF(status, context) from the enclosing function when `status` holds an
// error. `context` is evaluated only then: hot paths build no message on success.
#define TFD_RETURN_IF_TF_ERROR(status, context)                      \
  do {                                                               \
    if (TF_GetCode(status) != TF_OK) return FromTF(status, context); \
  } while (0)

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_HANDLES_H_
