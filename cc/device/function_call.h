// A tf.function called on DTensors, eagerly: expanded for its inputs' layouts
// (FunctionExpander, cached) and run as one SPMD function over the mesh, in one call. On
// parts, each device runs the original function on its own parts instead.
//
// Here because it joins the two paths below the device: the expansion (cc/graph) and the
// eager DTensor records (cc/eager).
#ifndef TF_DTENSOR_CC_DEVICE_FUNCTION_CALL_H_
#define TF_DTENSOR_CC_DEVICE_FUNCTION_CALL_H_

#include <optional>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/eager/tensor_with_layout.h"
#include "cc/graph/function_expander.h"

namespace tf_dtensor {

struct FunctionCall {
  TFE_Context* context;
  const TFE_OpAttrs* attrs;  // the call's attributes, for the runs on parts
  const std::string& function;
  const Mesh& mesh;  // the mesh the call runs from (ChooseMesh)
  // The inputs as TF gives them, and for each its DTensor record or null (a host tensor).
  const std::vector<TFE_TensorHandle*>& handles;
  const std::vector<const TensorWithLayout*>& dtensors;
  std::optional<Layout> requested;  // call_with_layout's layout, in its runtime form
  bool parts_in = false;   // some input is parted: each device runs the function on its parts
  bool parts_out = false;  // parts were requested
};

// Runs `call`; the results become DTensor handles of the device `device_name`.
Status CallFunction(const FunctionCall& call, FunctionExpander& expander,
                    const FallbackPolicy& policy, const std::string& device_name,
                    int* num_outputs, TFE_TensorHandle** outputs);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_DEVICE_FUNCTION_CALL_H_
