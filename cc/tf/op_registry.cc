#include "cc/tf/op_registry.h"

#include "tensorflow/core/framework/op.h"

namespace tf_dtensor {
namespace {

namespace tf = ::tensorflow;

// The op's definition in TF's op registry, or null for an op TF does not know.
const tf::OpDef* RegisteredOpDef(const std::string& op_name) {
  const tf::OpRegistrationData* registration = nullptr;
  if (!tf::OpRegistry::Global()->LookUp(op_name, &registration).ok()) return nullptr;
  return &registration->op_def;
}

}  // namespace

bool IsStatefulOp(const std::string& op_name) {
  const tf::OpDef* def = RegisteredOpDef(op_name);
  return def != nullptr && def->is_stateful();
}

bool IsStatelessWithoutFunctions(const std::string& op_name) {
  const tf::OpDef* def = RegisteredOpDef(op_name);
  if (def == nullptr || def->is_stateful()) return false;
  for (const auto& attr : def->attr()) {
    if (attr.type() == "func" || attr.type() == "list(func)") return false;
  }
  return true;
}

std::optional<OpArgCounts> ArgCountsOf(const std::string& op_name) {
  const tf::OpDef* def = RegisteredOpDef(op_name);
  if (def == nullptr) return std::nullopt;
  auto count = [](const auto& args) {
    ArgCount c;
    for (const auto& arg : args) {
      if (arg.number_attr().empty() && arg.type_list_attr().empty()) {
        ++c.fixed;
      } else {
        c.lists = true;
      }
    }
    return c;
  };
  return OpArgCounts{count(def->input_arg()), count(def->output_arg())};
}

}  // namespace tf_dtensor
