// What a plain resource handle (a tf.Variable's, not a DVariable's) says of its value.
// TensorFlow keeps the variable's dtype and shape with the eager handle (its handle data),
// which the C API does not expose; a tf.function that captures the variable needs them,
// since its graph gives the value no shape.
#ifndef TF_DTENSOR_CC_TF_RESOURCE_VALUE_H_
#define TF_DTENSOR_CC_TF_RESOURCE_VALUE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "tensorflow/c/eager/c_api.h"

namespace tf_dtensor {

struct ResourceValue {
  int dtype = 0;
  std::vector<int64_t> shape;  // -1 where a dimension is unknown
};

// The dtype and shape of the one value behind a local resource handle; nullopt where the
// handle does not say (no handle data, several values, an unknown rank).
std::optional<ResourceValue> ResourceValueOf(TFE_TensorHandle* handle);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_RESOURCE_VALUE_H_
