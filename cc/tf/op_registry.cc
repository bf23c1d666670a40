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
  if (def == nullptr) return false;
  if (def->is_stateful()) return true;
  // Seed attributes on an op TF registers as stateless: its kernel draws random numbers
  // (FractionalMaxPool, FractionalAvgPool: with seed 0 each kernel draws its own pooling
  // sequence), so devices that each ran it would hold different "replicas".
  bool seed = false, seed2 = false;
  for (const auto& attr : def->attr()) {
    seed = seed || (attr.name() == "seed" && attr.type() == "int");
    seed2 = seed2 || (attr.name() == "seed2" && attr.type() == "int");
  }
  return seed && seed2;
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

std::vector<int> InputDTypes(const std::string& op_name, const AttrMap& attrs) {
  std::vector<int> dtypes;
  const tf::OpDef* def = RegisteredOpDef(op_name);
  if (def == nullptr) return dtypes;
  for (const auto& arg : def->input_arg()) {
    if (!arg.type_list_attr().empty()) {
      const AttrValue* types = attrs.Find(arg.type_list_attr());
      if (types == nullptr) return dtypes;
      dtypes.insert(dtypes.end(), types->list_type.begin(), types->list_type.end());
      continue;
    }
    int64_t count = 1;
    if (!arg.number_attr().empty()) {
      count = attrs.GetInt(arg.number_attr(), -1);
      if (count < 0) return dtypes;
    }
    int dtype = static_cast<int>(arg.type());
    if (!arg.type_attr().empty()) dtype = attrs.GetType(arg.type_attr()).value_or(0);
    dtypes.insert(dtypes.end(), count, dtype);
  }
  return dtypes;
}

}  // namespace tf_dtensor
