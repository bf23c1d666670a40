#include "cc/rules/traits.h"

#include "cc/core/strings.h"

namespace tf_dtensor {
namespace {

const char* LinearityName(Linearity how) {
  switch (how) {
    case Linearity::kNone: return "none";
    case Linearity::kEachInput: return "each input";
    case Linearity::kOneInput: return "one input";
    case Linearity::kFirstInput: return "first input";
    case Linearity::kStructural: return "structural";
    case Linearity::kSum: return "sum";
    case Linearity::kMax: return "max";
    case Linearity::kMin: return "min";
  }
  return "none";
}

std::string Position(int input) {
  return input >= 0 ? std::to_string(input) : "last" + (input == -1 ? "" : std::to_string(input + 1));
}

}  // namespace

const char* HostValueName(HostValue what) {
  switch (what) {
    case HostValue::kAxis: return "an axis";
    case HostValue::kShape: return "a shape";
    case HostValue::kPermutation: return "a permutation";
    case HostValue::kMultiples: return "multiples";
    case HostValue::kPaddings: return "paddings";
    case HostValue::kBounds: return "slice bounds";
    case HostValue::kCount: return "a count";
    case HostValue::kValue: return "a value";
  }
  return "a value";
}

std::optional<HostValue> RuleTraits::HostInput(int input, int num_inputs) const {
  for (const HostInputs& h : host_inputs) {
    const int first = h.first < 0 ? num_inputs + h.first : h.first;
    const int last = h.last < 0 ? num_inputs + h.last : h.last;
    if (input >= first && input <= last) return h.what;
  }
  return std::nullopt;
}

std::string RuleTraits::Describe() const {
  std::vector<std::string> parts;
  if (linearity != Linearity::kNone) parts.push_back(std::string("linear(") + LinearityName(linearity) + ")");
  for (const HostInputs& h : host_inputs) {
    std::string where = Position(h.first);
    if (h.last != h.first) where += ".." + Position(h.last);
    parts.push_back("host inputs " + where + " (" + HostValueName(h.what) + ")");
  }
  if (reads_request) parts.push_back("reads the request");
  if (makes_mesh_value) parts.push_back("makes a mesh value");
  if (multi_dim_axes) parts.push_back("multi-dimension axes");
  if (python_constant) parts.push_back("python constant");
  return parts.empty() ? "none" : Join(parts, ", ");
}

}  // namespace tf_dtensor
