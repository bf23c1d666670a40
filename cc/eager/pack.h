// The ops that move tensors between the host and the mesh, which run eagerly only:
// pack (one plain tensor per local device -> a DTensor), unpack (a DTensor -> its
// components) and fetch_layout (a DTensor -> its layout's text).
#ifndef TF_DTENSOR_CC_EAGER_PACK_H_
#define TF_DTENSOR_CC_EAGER_PACK_H_

#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/eager/tensor_with_layout.h"

namespace tf_dtensor {

// A DTensor of `user_layout` (as the user wrote it: single-device or parted layouts
// included) from `components`, one plain tensor per local device of its mesh, each placed
// on its device. The global shape is what the blocks add up to, and each component must
// be the block the shard geometry gives its device (uneven shards included); parts stand
// alone and must share one shape. The DTensor is a handle of the device `device_name`.
StatusOr<TFE_TensorHandle*> Pack(TFE_Context* context, const std::string& device_name,
                                 const Layout& user_layout,
                                 const std::vector<TFE_TensorHandle*>& components);

// The components of `tensor`, one per local device, each on its device: `*num_outputs`
// (at least the number of components) becomes that number.
Status Unpack(TFE_Context* context, const TensorWithLayout& tensor, int* num_outputs,
              TFE_TensorHandle** outputs);

// A host string tensor holding the text (Layout::ToString) of the layout users see.
StatusOr<TFE_TensorHandle*> FetchLayout(const TensorWithLayout& tensor);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_PACK_H_
