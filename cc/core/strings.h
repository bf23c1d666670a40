// String helpers shared by the core's parsers and printers.
#ifndef TF_DTENSOR_CC_CORE_STRINGS_H_
#define TF_DTENSOR_CC_CORE_STRINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tf_dtensor {

std::vector<std::string> Split(std::string_view text, char separator);
std::string Join(const std::vector<std::string>& parts, std::string_view separator);
std::optional<int64_t> ParseInt(std::string_view text);
std::string_view Trim(std::string_view text);
// "[2, 3]" for a shape or an index list.
std::string ShapeString(const std::vector<int64_t>& values);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_CORE_STRINGS_H_
