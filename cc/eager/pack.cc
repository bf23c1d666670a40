#include "cc/eager/pack.h"

#include <cstdlib>
#include <memory>

#include "cc/core/strings.h"
#include "cc/spmd/layout_types.h"
#include "cc/spmd/relayout.h"
#include "cc/tf/handles.h"
#include "tensorflow/c/tf_tensor.h"
#include "tensorflow/c/tf_tstring.h"

namespace tf_dtensor {

StatusOr<TFE_TensorHandle*> Pack(TFE_Context* context, const std::string& device_name,
                                 const Layout& user_layout,
                                 const std::vector<TFE_TensorHandle*>& components) {
  StatusPtr status(TF_NewStatus());
  const int n = static_cast<int>(components.size());
  // A single-device layout fits components of any rank.
  const int rank0 = n > 0 ? TFE_TensorHandleNumDims(components[0], status.get()) : 0;
  TFD_RETURN_IF_TF_ERROR(status.get(), "reading pack component 0");
  const Layout layout = RuntimeLayout(user_layout, rank0);
  const Mesh& mesh = layout.mesh();
  TFD_RETURN_IF_ERROR(CheckRunsHere(mesh, "pack to " + user_layout.ShortString()));
  if (n != mesh.num_local_devices()) {
    return InvalidArgument("pack got " + std::to_string(n) + " components for layout " +
                           user_layout.ShortString() + ", whose mesh has " +
                           std::to_string(mesh.num_local_devices()) +
                           " local devices; pass one component per local device.");
  }
  const bool parted = user_layout.is_parted();
  std::vector<std::vector<int64_t>> shapes;
  TF_DataType dtype = TF_FLOAT;
  std::vector<HandlePtr> placed;
  for (int i = 0; i < n; ++i) {
    TFE_TensorHandle* h = components[i];
    if (TensorWithLayout::FromHandle(h, device_name)) {
      return InvalidArgument("pack component " + std::to_string(i) +
                             " is already a DTensor; pack takes plain tensors.");
    }
    std::vector<int64_t> shape = HandleShape(h, status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "reading the shape of pack component " +
                                             std::to_string(i));
    const TF_DataType t = TFE_TensorHandleDataType(h);
    if (i == 0) {
      dtype = t;
      if (static_cast<int>(shape.size()) != layout.rank()) {
        return InvalidArgument("pack components have rank " + std::to_string(shape.size()) +
                               " (shape " + ShapeString(shape) + ") but layout " +
                               layout.ShortString() + " has rank " +
                               std::to_string(layout.rank()) +
                               " (Packed layout should have the same rank as the components).");
      }
    } else if (t != dtype || shape.size() != shapes[0].size() ||
               (parted && shape != shapes[0])) {
      return InvalidArgument("pack component " + std::to_string(i) + " has shape " +
                             ShapeString(shape) + " and dtype " + DataTypeName(t) +
                             " but component 0 has shape " + ShapeString(shapes[0]) +
                             " and dtype " + DataTypeName(dtype) +
                             "; all components must have one rank and dtype" +
                             (parted ? " and, parted, one shape." : "."));
    }
    shapes.push_back(std::move(shape));
    // Place each component on its device (on virtual CPUs this shares the buffer).
    TFE_TensorHandle* on_device =
        TFE_TensorHandleCopyToDevice(h, context, mesh.local_devices()[i].c_str(), status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "copying pack component " + std::to_string(i));
    placed.emplace_back(on_device);
  }
  // Parts stand alone: each is a block of the even global shape. Otherwise the global
  // shape adds up the blocks along each sharded axis, and then every component must be
  // exactly the block the shard geometry gives its device (uneven shards included).
  std::vector<int64_t> global = parted ? layout.GlobalShape(shapes[0])
                                       : layout.GlobalShapeOfBlocks([&](int d) { return shapes[d]; });
  const bool whole_mesh = static_cast<int64_t>(mesh.num_local_devices()) == mesh.size();
  for (int i = 0; i < n && !parted && !layout.is_single_device() && whole_mesh; ++i) {
    ShardGeometry block = layout.GeometryOfDevice(global, i);
    if (block.shape != shapes[i]) {
      return InvalidArgument(
          "pack component " + std::to_string(i) + " has shape " + ShapeString(shapes[i]) +
          ", but layout " + layout.ShortString() + " with the global shape " +
          ShapeString(global) + " these components add up to puts a block of shape " +
          ShapeString(block.shape) + " at offset " + ShapeString(block.offset) + " on " +
          ShortDeviceName(mesh.local_devices()[i]) +
          ". Give each device its block: ceil(n / k)-sized pieces along each sharded axis, "
          "the last ones smaller or empty.");
    }
  }
  TFD_RETURN_IF_ERROR(CheckReductionsFit(layout, dtype, "pack"));
  auto tensor = std::make_unique<TensorWithLayout>(layout, std::move(global), dtype,
                                                   std::move(placed));
  tensor->set_parted(parted);
  TFE_TensorHandle* out =
      TensorWithLayout::MakeHandle(context, device_name, std::move(tensor), status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "pack");
  return out;
}

Status Unpack(TFE_Context* context, const TensorWithLayout& tensor, int* num_outputs,
              TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  const Mesh& mesh = tensor.layout().mesh();
  if (*num_outputs < tensor.num_components()) {
    return InvalidArgument("unpack expected " + std::to_string(*num_outputs) +
                           " components but the DTensor has " +
                           std::to_string(tensor.num_components()) + ".");
  }
  // Components handed out before a later one fails are released again: TensorFlow takes
  // none of them when the op fails.
  auto fail = [&](int made, const std::string& what) {
    Status error = FromTF(status.get(), what);
    for (int k = 0; k < made; ++k) {
      TFE_DeleteTensorHandle(outputs[k]);
      outputs[k] = nullptr;
    }
    return error;
  };
  for (int i = 0; i < tensor.num_components(); ++i) {
    TFE_TensorHandle* c = tensor.component(i);
    // Shared components live on another CPU: give each its own device name (no copy).
    const char* device = TFE_TensorHandleDeviceName(c, status.get());
    if (TF_GetCode(status.get()) != TF_OK) return fail(i, "unpack component " + std::to_string(i));
    if (mesh.local_devices()[i] == device) {
      outputs[i] = TFE_TensorHandleCopySharingTensor(c, status.get());
    } else {
      outputs[i] = TFE_TensorHandleCopyToDevice(c, context, mesh.local_devices()[i].c_str(),
                                                status.get());
    }
    if (TF_GetCode(status.get()) != TF_OK) return fail(i, "unpack component " + std::to_string(i));
  }
  *num_outputs = tensor.num_components();
  return Status::Ok();
}

StatusOr<TFE_TensorHandle*> FetchLayout(const TensorWithLayout& tensor) {
  StatusPtr status(TF_NewStatus());
  std::string text = tensor.visible_layout().ToString();
  // A string tensor's element owns heap memory that TF frees only through the buffer's
  // deallocator: with TF_AllocateTensor every call leaked the layout's text. The buffer
  // is aligned as TF wants it, so TF_NewTensor takes it as it is instead of copying it
  // (a copy would share the element's heap string with the original).
  constexpr size_t kAlign = 64;
  void* data = std::aligned_alloc(kAlign, kAlign);
  if (data == nullptr) return Internal("fetch_layout: out of memory.");
  TF_TString* tstring = static_cast<TF_TString*>(data);
  TF_TString_Init(tstring);
  TF_TString_Copy(tstring, text.data(), text.size());
  TF_Tensor* host = TF_NewTensor(
      TF_STRING, nullptr, 0, data, sizeof(TF_TString),
      [](void* buffer, size_t, void*) {
        TF_TString_Dealloc(static_cast<TF_TString*>(buffer));
        std::free(buffer);
      },
      nullptr);
  TFE_TensorHandle* out = TFE_NewTensorHandle(host, status.get());
  TF_DeleteTensor(host);
  TFD_RETURN_IF_TF_ERROR(status.get(), "fetch_layout");
  return out;
}

}  // namespace tf_dtensor
