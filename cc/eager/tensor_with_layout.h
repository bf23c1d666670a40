// The per-tensor record of a DTensor: global shape, dtype, layout and one component
// handle per local device of the mesh.
//
// On meshes of virtual CPUs, devices that hold the same shard share one buffer: their
// handles are copies sharing one tensor, and each distinct shard is computed once.
#ifndef TF_DTENSOR_CC_EAGER_TENSOR_WITH_LAYOUT_H_
#define TF_DTENSOR_CC_EAGER_TENSOR_WITH_LAYOUT_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/spmd/builder.h"
#include "cc/spmd/layout_types.h"
#include "cc/tf/handles.h"
#include "tensorflow/c/eager/c_api.h"
#include "tensorflow/c/eager/c_api_experimental.h"

namespace tf_dtensor {

struct HandleDeleter {
  void operator()(TFE_TensorHandle* h) const {
    if (h) TFE_DeleteTensorHandle(h);
  }
};
using HandlePtr = std::unique_ptr<TFE_TensorHandle, HandleDeleter>;

class TensorWithLayout {
 public:
  TensorWithLayout(Layout layout, std::vector<int64_t> shape, TF_DataType dtype,
                   std::vector<HandlePtr> components)
      : layout_(std::move(layout)),
        shape_(std::move(shape)),
        dtype_(dtype),
        components_(std::move(components)) {
    live_count_.fetch_add(1);
  }
  ~TensorWithLayout() { live_count_.fetch_sub(1); }
  TensorWithLayout(const TensorWithLayout&) = delete;
  TensorWithLayout& operator=(const TensorWithLayout&) = delete;
  // DTensor records alive in this process (tests check that nothing holds them forever).
  static int num_live() { return live_count_.load(); }

  const Layout& layout() const { return layout_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  TF_DataType dtype() const { return dtype_; }
  int num_components() const { return static_cast<int>(components_.size()); }
  TFE_TensorHandle* component(int i) const { return components_[i].get(); }
  const std::optional<ResourceInfo>& resource() const { return resource_; }
  void set_resource(std::optional<ResourceInfo> info) { resource_ = std::move(info); }
  // The TensorFlow context whose custom-device handle wraps this record (set by
  // MakeHandle). A context reset replaces the device; records of the old context must not
  // mix with the new one.
  const TFE_Context* context() const { return context_; }
  // `layout()` is the runtime layout (cc/spmd/layout_types.h): static, with single-device
  // tensors replicated on a one-device mesh. Whether the shards are parts (parted layout):
  bool parted() const { return parted_; }
  void set_parted(bool parted) { parted_ = parted; }
  // The layout users see: the value layout for DVariable handles, else the user form of
  // the runtime layout (single-device, parted or static).
  Layout visible_layout() const {
    return resource_ ? resource_->value_layout : UserLayout(layout_, parted_);
  }

  // TF-style text: the value when replicated, else one entry per device, then the layout.
  std::string Summarize(TF_Status* status) const;

  // Wraps the record in a TFE handle on the custom device (which takes ownership).
  static TFE_TensorHandle* MakeHandle(TFE_Context* context, const std::string& device_name,
                                      std::unique_ptr<TensorWithLayout> tensor,
                                      TF_Status* status);
  // The record behind `handle`, or nullptr if it is not on `device_name`.
  static TensorWithLayout* FromHandle(TFE_TensorHandle* handle, const std::string& device_name);

 private:
  Layout layout_;
  std::vector<int64_t> shape_;
  TF_DataType dtype_;
  std::vector<HandlePtr> components_;
  std::optional<ResourceInfo> resource_;
  bool parted_ = false;
  const TFE_Context* context_ = nullptr;
  static inline std::atomic<int> live_count_{0};
};

// Text of one host tensor in TF's print format ("[[1 2] [3 4]]", 3 items per edge).
std::string FormatTensor(TFE_TensorHandle* handle, TF_Status* status);


// A handle sharing `handle`'s tensor (no copy).
HandlePtr ShareHandle(TFE_TensorHandle* handle, TF_Status* status);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_TENSOR_WITH_LAYOUT_H_
