// Relayout: moving a value from one layout to another, on its mesh or onto another.
#ifndef TF_DTENSOR_CC_SPMD_RELAYOUT_H_
#define TF_DTENSOR_CC_SPMD_RELAYOUT_H_

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

// Emits the collectives that take `value` to `target`:
//   [x,*] -> [*,*]  all-gather on axis 0
//   [*,*] -> [x,*]  slice (each device keeps its piece; no communication)
//   [x,*] -> [*,x]  all-to-all
//   [x,*] -> [y,*]  all-gather, then slice
//   [x+y,*] <-> [*,*]  all-gather over x and y / nested slice (one axis over two dims)
//   [x] @ A -> [y] @ B  all-gather on A, move the whole value to B, slice there
// Fails with a clear message across ranks, for indivisible shapes or variable handles.
StatusOr<ValueId> Relayout(Builder& builder, ValueId value, const Layout& target,
                           const std::string& what);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_RELAYOUT_H_
