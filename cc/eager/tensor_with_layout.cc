#include "cc/eager/tensor_with_layout.h"

#include <complex>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cc/core/strings.h"
#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {
namespace {

// TF's float text: the short precision (FLT_DIG / DBL_DIG) when it reads back as the same
// value, else the full round-trip precision: 0.769825, but 2.66521645.
template <typename T>
std::string FormatFloat(T value, int short_digits, int full_digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*g", short_digits, static_cast<double>(value));
  if (static_cast<T>(std::strtod(buffer, nullptr)) == value) return buffer;
  std::snprintf(buffer, sizeof(buffer), "%.*g", full_digits, static_cast<double>(value));
  return buffer;
}

// One element as TF prints it.
std::string FormatElement(const char* data, int64_t index, TF_DataType dtype) {
  switch (dtype) {
    case TF_FLOAT: return FormatFloat(reinterpret_cast<const float*>(data)[index], 6, 9);
    case TF_DOUBLE: return FormatFloat(reinterpret_cast<const double*>(data)[index], 15, 17);
    case TF_INT32: return std::to_string(reinterpret_cast<const int32_t*>(data)[index]);
    case TF_INT64: return std::to_string(reinterpret_cast<const int64_t*>(data)[index]);
    case TF_INT16: return std::to_string(reinterpret_cast<const int16_t*>(data)[index]);
    case TF_INT8: return std::to_string(reinterpret_cast<const int8_t*>(data)[index]);
    case TF_UINT8: return std::to_string(reinterpret_cast<const uint8_t*>(data)[index]);
    case TF_UINT16: return std::to_string(reinterpret_cast<const uint16_t*>(data)[index]);
    case TF_UINT32: return std::to_string(reinterpret_cast<const uint32_t*>(data)[index]);
    case TF_UINT64: return std::to_string(reinterpret_cast<const uint64_t*>(data)[index]);
    case TF_BOOL: return reinterpret_cast<const bool*>(data)[index] ? "True" : "False";
    case TF_HALF:
    case TF_BFLOAT16: {
      uint16_t bits;
      std::memcpy(&bits, data + 2 * index, 2);
      float f;
      if (dtype == TF_BFLOAT16) {
        uint32_t widened = static_cast<uint32_t>(bits) << 16;
        std::memcpy(&f, &widened, 4);
      } else {
        // IEEE half -> float.
        uint32_t sign = (bits >> 15) & 1, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
        f = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
            : exponent == 31 ? (mantissa ? NAN : INFINITY)
                             : std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
        if (sign) f = -f;
      }
      return FormatFloat(f, 4, 5);
    }
    default: return "?";
  }
}

// DTensor summaries keep nested rows on one line: "[[0 1] [2 3]]".
void DimSpacing(int, int, std::string* out) { *out += " "; }

void FormatDim(const char* data, TF_DataType dtype, const std::vector<int64_t>& shape, int dim,
               int64_t offset, std::string* out) {
  const int rank = static_cast<int>(shape.size());
  if (dim == rank) {
    *out += FormatElement(data, offset, dtype);
    return;
  }
  constexpr int64_t kEdge = 3;
  int64_t stride = 1;
  for (int d = dim + 1; d < rank; ++d) stride *= shape[d];
  *out += "[";
  const int64_t n = shape[dim];
  for (int64_t i = 0; i < n && i < kEdge; ++i) {
    if (i > 0) DimSpacing(dim, rank, out);
    FormatDim(data, dtype, shape, dim + 1, offset + i * stride, out);
  }
  if (n > 2 * kEdge) {
    DimSpacing(dim, rank, out);
    *out += "...";
  }
  for (int64_t i = std::max(kEdge, n - kEdge); i < n; ++i) {
    DimSpacing(dim, rank, out);
    FormatDim(data, dtype, shape, dim + 1, offset + i * stride, out);
  }
  *out += "]";
}

int64_t NumDims(void* data, TF_Status*) {
  auto* t = static_cast<TensorWithLayout*>(data);
  return t->resource() ? 0 : static_cast<int64_t>(t->shape().size());
}

}  // namespace

std::string FormatTensor(TFE_TensorHandle* handle, TF_Status* status) {
  if (TFE_TensorHandleDataType(handle) == TF_RESOURCE) return "<ResourceHandle>";
  TF_Tensor* tensor = TFE_TensorHandleResolve(handle, status);
  if (TF_GetCode(status) != TF_OK) return "";
  std::vector<int64_t> shape;
  for (int d = 0; d < TF_NumDims(tensor); ++d) shape.push_back(TF_Dim(tensor, d));
  std::string out;
  FormatDim(static_cast<const char*>(TF_TensorData(tensor)), TF_TensorType(tensor), shape, 0, 0,
            &out);
  TF_DeleteTensor(tensor);
  return out;
}

HandlePtr ShareHandle(TFE_TensorHandle* handle, TF_Status* status) {
  return HandlePtr(TFE_TensorHandleCopySharingTensor(handle, status));
}

std::string TensorWithLayout::Summarize(TF_Status* status) const {
  std::string value;
  if (layout_.IsFullyReplicated() && !resource_) {
    value = FormatTensor(components_[0].get(), status);
  } else {
    std::vector<std::string> parts;
    const Mesh& mesh = layout_.mesh();
    for (int i = 0; i < num_components(); ++i) {
      parts.push_back("\"" + ShortDeviceName(mesh.local_devices()[i]) +
                      "\": " + FormatTensor(components_[i].get(), status));
      if (TF_GetCode(status) != TF_OK) return "";
    }
    value = "{" + Join(parts, ", ") + "}";
  }
  return value + ", layout=\"" + visible_layout().ToString() + "\"";
}

TFE_TensorHandle* TensorWithLayout::MakeHandle(TFE_Context* context,
                                               const std::string& device_name,
                                               std::unique_ptr<TensorWithLayout> tensor,
                                               TF_Status* status) {
  TFE_CustomDeviceTensorHandle methods;
  methods.num_dims = [](void* data, TF_Status* s) -> int {
    return static_cast<int>(NumDims(data, s));
  };
  methods.dim = [](void* data, int dim, TF_Status*) -> int64_t {
    return static_cast<TensorWithLayout*>(data)->shape()[dim];
  };
  methods.deallocator = [](void* data) { delete static_cast<TensorWithLayout*>(data); };
  methods.summarize = [](void* data, TF_Status* s) -> TF_Buffer* {
    std::string text = static_cast<TensorWithLayout*>(data)->Summarize(s);
    if (TF_GetCode(s) != TF_OK) return nullptr;
    return TF_NewBufferFromString(text.data(), text.size());
  };
  TF_DataType dtype = tensor->dtype();
  tensor->context_ = context;
  return TFE_NewCustomDeviceTensorHandle(context, device_name.c_str(), dtype, tensor.release(),
                                         methods, status);
}

TensorWithLayout* TensorWithLayout::FromHandle(TFE_TensorHandle* handle,
                                               const std::string& device_name) {
  thread_local TF_Status* status = TF_NewStatus();
  const char* device = TFE_TensorHandleDeviceName(handle, status);
  TensorWithLayout* out = nullptr;
  if (TF_GetCode(status) == TF_OK && device_name == device) {
    out = static_cast<TensorWithLayout*>(TFE_TensorHandleDevicePointer(handle, status));
    if (TF_GetCode(status) != TF_OK) out = nullptr;
  }
  return out;
}

}  // namespace tf_dtensor
