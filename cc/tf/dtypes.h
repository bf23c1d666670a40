// TF's dtypes (TF_DataType values) in messages. Its own file, with no TF symbol: the
// planning code (linked into the C++ tests without TF's libraries) names dtypes too.
#ifndef TF_DTENSOR_CC_TF_DTYPES_H_
#define TF_DTENSOR_CC_TF_DTYPES_H_

#include <string>

namespace tf_dtensor {

// "float32" for TF_FLOAT: dtype names as Python shows them, for messages.
std::string DataTypeName(int dtype);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_DTYPES_H_
