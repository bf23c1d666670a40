#include "cc/tf/dtypes.h"

#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

std::string DataTypeName(int dtype) {
  switch (dtype) {
    case TF_FLOAT: return "float32";
    case TF_DOUBLE: return "float64";
    case TF_HALF: return "float16";
    case TF_BFLOAT16: return "bfloat16";
    case TF_INT8: return "int8";
    case TF_INT16: return "int16";
    case TF_INT32: return "int32";
    case TF_INT64: return "int64";
    case TF_UINT8: return "uint8";
    case TF_UINT16: return "uint16";
    case TF_UINT32: return "uint32";
    case TF_UINT64: return "uint64";
    case TF_BOOL: return "bool";
    case TF_STRING: return "string";
    case TF_COMPLEX64: return "complex64";
    case TF_COMPLEX128: return "complex128";
    case TF_RESOURCE: return "resource";
    default: return "dtype " + std::to_string(dtype);
  }
}

bool IsIntegerDType(int dtype) {
  switch (dtype) {
    case TF_INT8: case TF_INT16: case TF_INT32: case TF_INT64:
    case TF_UINT8: case TF_UINT16: case TF_UINT32: case TF_UINT64:
      return true;
    default:
      return false;
  }
}

}  // namespace tf_dtensor
