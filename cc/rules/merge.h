// Merging the shardings of several inputs into one output layout.
//
// Broadcasting ops align shapes on the right:
//   [x,*] + [*]   -> [x,*]      (the rank-1 input broadcasts along axis 0)
//   [x,*] + [*,y] -> [x,y]      (each output axis takes a sharded input's spec)
//   [x,*] + [*,x] -> [x,*]      (x can shard one axis only; input 1 is relaid out)
// Merge rule: for each output axis, the first input (in input order) that shards it
// wins, unless its mesh dimension already shards an earlier axis; sharded beats
// replicated because slicing a replicated input costs no communication.
#ifndef TF_DTENSOR_CC_RULES_MERGE_H_
#define TF_DTENSOR_CC_RULES_MERGE_H_

#include <cstdint>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"

namespace tf_dtensor {

// numpy-style broadcast of shapes; fails naming the shapes when they are incompatible.
StatusOr<std::vector<int64_t>> BroadcastShapes(const std::vector<std::vector<int64_t>>& shapes,
                                               const std::string& op_name);

// Output specs for `out_shape` from inputs right-aligned to it. `used` marks mesh
// dimensions already taken (by other axes of the same op) and is updated.
std::vector<DimSpec> MergeBroadcast(const std::vector<const Layout*>& layouts,
                                    const std::vector<std::vector<int64_t>>& shapes,
                                    const std::vector<int64_t>& out_shape,
                                    std::vector<bool>* used);

// The specs an input of `in_shape` must have for output specs `out` (right-aligned):
// the output's spec where the input spans the axis, unsharded where it broadcasts.
std::vector<DimSpec> ProjectBroadcast(const std::vector<DimSpec>& out,
                                      const std::vector<int64_t>& in_shape,
                                      const std::vector<int64_t>& out_shape);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_MERGE_H_
