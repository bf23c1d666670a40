// TF's dtypes (TF_DataType values) in messages. Its own file, with no TF symbol: the
// planning code (linked into the C++ tests without TF's libraries) names dtypes too.
#ifndef TF_DTENSOR_CC_TF_DTYPES_H_
#define TF_DTENSOR_CC_TF_DTYPES_H_

#include <string>

namespace tf_dtensor {

// "float32" for TF_FLOAT: dtype names as Python shows them, for messages.
std::string DataTypeName(int dtype);

// Whether `dtype` is a signed or unsigned integer type (int8 .. uint64): its division
// truncates, so it does not distribute over a sum, and its mean is a truncated quotient.
bool IsIntegerDType(int dtype);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_DTYPES_H_
