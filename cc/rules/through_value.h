// Resource ops run as a functional op on a DVariable's value:
//   ResourceStridedSliceAssign(v, b, e, s, x) -> assign(v, TensorStridedSliceUpdate(read(v), ...))
//   ResourceScatterNd{Update,Add,Sub,Max,Min}(v, i, u) -> assign(v, TensorScatter*(read(v), i, u))
//   ResourceGatherNd(v, i) -> GatherNd(read(v), i)
// The functional op's own rule plans the value: an axis the update or gather leaves whole
// keeps its sharding (`v[:, 1:3].assign(x)` on [x,*] updates each device's rows with no
// communication), an indexed or cut axis is gathered. An update is relaid out back into
// the variable's layout and assigned.
#ifndef TF_DTENSOR_CC_RULES_THROUGH_VALUE_H_
#define TF_DTENSOR_CC_RULES_THROUGH_VALUE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/rules/rule.h"

namespace tf_dtensor {

struct ThroughValueSpec {
  // The functional op; its rule must be registered and expand as the default does.
  std::string functional;
  // Its attributes, read from the resource op's (under `renamed.second` where the
  // resource op names `renamed.first` otherwise: GatherNd's Tparams is `dtype`).
  std::vector<std::string> carried;
  // Whether the result is assigned back to the variable (the op has no outputs), or is
  // the op's output.
  bool writes = true;
  std::pair<std::string, std::string> renamed = {};
};

// The rule for a resource op whose input 0 is a DVariable handle.
std::shared_ptr<const Rule> ThroughValue(ThroughValueSpec spec);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_THROUGH_VALUE_H_
