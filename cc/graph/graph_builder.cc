#include "cc/graph/graph_builder.h"

#include <set>

#include "cc/core/strings.h"
#include "cc/tf/handles.h"
#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {
namespace {

// The host CPU of the task that owns `device`: ".../device:GPU:1" -> ".../device:CPU:0".
std::string HostDeviceOf(const std::string& device) {
  size_t pos = device.rfind("/device:");
  if (pos == std::string::npos) return device;
  return device.substr(0, pos) + "/device:CPU:0";
}

// Attributes that name other nodes of the original graph, or describe its shapes.
bool DropsAttr(const std::string& name) {
  return name == "_class" || name == "_output_shapes" || name == "_read_only_resource_inputs" ||
         name == "_num_original_outputs";
}

}  // namespace

GraphBuilder::GraphBuilder(TF_Graph* graph, Mesh mesh)
    : ComponentBuilder(std::move(mesh)),
      graph_(graph),
      host_device_(lowering().shares_buffers() ? mesh_.local_devices()[0]
                                               : HostDeviceOf(mesh_.local_devices()[0])),
      status_(TF_NewStatus()) {}

GraphBuilder::~GraphBuilder() { TF_DeleteStatus(status_); }

ValueId GraphBuilder::AddDTensor(Layout layout, std::vector<int64_t> shape, int dtype,
                                 std::optional<ResourceInfo> resource,
                                 std::vector<TF_Output> components) {
  Value v;
  v.layout = std::move(layout);
  v.shape = std::move(shape);
  v.dtype = dtype;
  v.resource = std::move(resource);
  v.handles = std::move(components);
  return Add(std::move(v));
}

ValueId GraphBuilder::AddHost(TF_Output output) {
  Value v;
  v.host = output;
  v.dtype = TF_OperationOutputType(output);
  v.shape = InferredShape(output).value_or(std::vector<int64_t>{});
  return Add(std::move(v));
}

std::optional<std::vector<int64_t>> GraphBuilder::InferredShape(TF_Output output) const {
  TF_Status* status = TF_NewStatus();
  int rank = TF_GraphGetTensorNumDims(graph_, output, status);
  std::optional<std::vector<int64_t>> shape;
  if (TF_GetCode(status) == TF_OK && rank >= 0) {
    std::vector<int64_t> dims(rank);
    TF_GraphGetTensorShape(graph_, output, dims.data(), rank, status);
    if (TF_GetCode(status) == TF_OK) shape = std::move(dims);
  }
  TF_DeleteStatus(status);
  return shape;
}

std::optional<std::vector<int64_t>> GraphBuilder::IntValue(ValueId value) {
  Value& v = values_[value];
  if (v.int_value_read) return v.int_value;
  v.int_value_read = true;
  if ((v.dtype != TF_INT32 && v.dtype != TF_INT64) || v.resource) return std::nullopt;
  if (v.layout && !v.layout->IsFullyReplicated()) return std::nullopt;
  TF_Output out = v.layout ? v.handles[0] : v.host;
  TF_Tensor* tensor = nullptr;
  if (!TF_TryEvaluateConstant(graph_, out, &tensor, status_) || !tensor) return std::nullopt;
  const int64_t count = TF_TensorElementCount(tensor);
  std::vector<int64_t> values(count);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = v.dtype == TF_INT32 ? static_cast<const int32_t*>(TF_TensorData(tensor))[i]
                                    : static_cast<const int64_t*>(TF_TensorData(tensor))[i];
  }
  TF_DeleteTensor(tensor);
  v.int_value = std::move(values);
  return v.int_value;
}

void GraphBuilder::BeginNode(const std::string& name, const std::string& op,
                             const RawAttrs* attrs, std::vector<TF_Operation*> control_inputs) {
  node_name_ = name;
  node_op_ = op;
  node_attrs_ = attrs;
  node_attr_map_.reset();
  control_inputs_ = std::move(control_inputs);
  created_.clear();
}

const OpSpec* GraphBuilder::FindOp(const std::string& op_type) {
  auto it = op_specs_.find(op_type);
  if (it != op_specs_.end()) return it->second.get();
  TF_Buffer* buffer = TF_NewBuffer();
  TF_GraphGetOpDef(graph_, op_type.c_str(), buffer, status_);
  std::unique_ptr<OpSpec> spec;
  if (TF_GetCode(status_) == TF_OK) {
    StatusOr<OpSpec> parsed =
        ParseOpDef(std::string_view(static_cast<const char*>(buffer->data), buffer->length));
    if (parsed.ok()) spec = std::make_unique<OpSpec>(std::move(parsed).value());
  }
  TF_DeleteBuffer(buffer);
  const OpSpec* result = spec.get();
  op_specs_[op_type] = std::move(spec);
  return result;
}

std::string GraphBuilder::UniqueName(const std::string& op_type) {
  std::string base = node_name_.empty() ? "tfd" : node_name_;
  return base + "/" + op_type + "_" + std::to_string(counter_++);
}

StatusOr<TF_Operation*> GraphBuilder::Emit(const std::string& op_type,
                                           const std::vector<TF_Output>& inputs,
                                           const LocalOpOptions& options,
                                           const std::string& device,
                                           const RawAttrs& extra_attrs) {
  const OpSpec* spec = FindOp(op_type);
  TF_OperationDescription* desc =
      TF_NewOperation(graph_, op_type.c_str(), UniqueName(op_type).c_str());
  TF_SetDevice(desc, device.c_str());

  std::set<std::string> set_names;
  for (const AttrOverride& a : options.overrides) set_names.insert(a.name);
  for (const auto& [name, value] : extra_attrs) set_names.insert(name);
  auto set_raw = [&](const std::string& name, const std::string& value) {
    TF_SetAttrValueProto(desc, name.c_str(), value.data(), value.size(), status_);
  };
  for (const auto& [name, value] : extra_attrs) set_raw(name, value);
  if (options.copy_attrs && node_attrs_) {
    const bool same_op = op_type == node_op_;
    for (const auto& [name, value] : *node_attrs_) {
      if (set_names.count(name) || DropsAttr(name)) continue;
      bool known = same_op && !name.empty() && name[0] == '_';
      if (!known && spec) {
        for (const std::string& a : spec->attrs) known = known || a == name;
      }
      if (known || (!spec && same_op)) set_raw(name, value);
    }
  }
  for (const AttrOverride& a : options.overrides) {
    switch (a.kind) {
      case AttrOverride::Kind::kShape:
        TF_SetAttrShape(desc, a.name.c_str(), a.ints.data(), static_cast<int>(a.ints.size()));
        break;
      case AttrOverride::Kind::kType:
        TF_SetAttrType(desc, a.name.c_str(), static_cast<TF_DataType>(a.type));
        break;
      case AttrOverride::Kind::kInt:
        TF_SetAttrInt(desc, a.name.c_str(), a.ints[0]);
        break;
      case AttrOverride::Kind::kBool:
        TF_SetAttrBool(desc, a.name.c_str(), a.boolean);
        break;
      case AttrOverride::Kind::kString:
        TF_SetAttrString(desc, a.name.c_str(), a.text.data(), a.text.size());
        break;
      case AttrOverride::Kind::kIntList:
        TF_SetAttrIntList(desc, a.name.c_str(), a.ints.data(), static_cast<int>(a.ints.size()));
        break;
    }
  }

  // Flat inputs go into the op's arguments; list arguments take as many as their
  // length attribute says (from the overrides, the copied attributes, or what is left).
  if (!spec) {
    for (const TF_Output& in : inputs) TF_AddInput(desc, in);
  } else {
    int num_lists = 0;
    for (const ArgSpec& arg : spec->inputs) {
      num_lists += !arg.number_attr.empty() || !arg.type_list_attr.empty();
    }
    const int singles = static_cast<int>(spec->inputs.size()) - num_lists;
    size_t next = 0;
    for (const ArgSpec& arg : spec->inputs) {
      if (arg.number_attr.empty() && arg.type_list_attr.empty()) {
        if (next < inputs.size()) TF_AddInput(desc, inputs[next++]);
        continue;
      }
      int64_t length = -1;
      const std::string& len_attr = arg.number_attr.empty() ? arg.type_list_attr : arg.number_attr;
      for (const AttrOverride& a : options.overrides) {
        if (a.name == len_attr && a.kind == AttrOverride::Kind::kInt) length = a.ints[0];
      }
      if (length < 0 && FindRawAttr(extra_attrs, len_attr)) {
        if (const AttrValue* v = DecodeAttrs(extra_attrs).Find(len_attr)) {
          length = arg.number_attr.empty() ? static_cast<int64_t>(v->list_type.size())
                                           : v->i.value_or(-1);
        }
      }
      if (length < 0 && options.copy_attrs && node_attrs_) {
        if (!node_attr_map_) node_attr_map_ = DecodeAttrs(*node_attrs_);
        if (const AttrValue* v = node_attr_map_->Find(len_attr)) {
          length = arg.number_attr.empty() ? static_cast<int64_t>(v->list_type.size())
                                           : v->i.value_or(-1);
        }
      }
      if (length < 0 && num_lists == 1) {
        length = static_cast<int64_t>(inputs.size()) - singles;
      }
      if (length < 0 || next + length > inputs.size()) {
        return Internal("Cannot group the inputs of '" + op_type + "' into its arguments.");
      }
      std::vector<TF_Output> list(inputs.begin() + next, inputs.begin() + next + length);
      TF_AddInputList(desc, list.data(), static_cast<int>(list.size()));
      next += length;
    }
  }
  for (TF_Operation* control : control_inputs_) TF_AddControlInput(desc, control);
  TF_Operation* op = TF_FinishOperation(desc, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "adding '" + op_type + "' to the SPMD graph"));
  created_.push_back(op);
  return op;
}

StatusOr<TF_Output> GraphBuilder::Share(TF_Output leader_output, int device) {
  if (lowering().shares_buffers()) return leader_output;
  LocalOpOptions options;
  options.copy_attrs = false;
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       Emit("Identity", {leader_output}, options, mesh_.local_devices()[device]));
  return TF_Output{op, 0};
}

void GraphBuilder::SetLocalShape(TF_Output output, const std::vector<int64_t>& shape) {
  TF_Status* status = TF_NewStatus();
  TF_GraphSetTensorShape(graph_, output, shape.data(), static_cast<int>(shape.size()), status);
  TF_DeleteStatus(status);  // a conflicting shape stays as inferred
}

StatusOr<TF_Output> GraphBuilder::OnDevice(ValueId value, int device) {
  TF_Output out = local(value, device);
  LocalOpOptions options;
  options.copy_attrs = false;
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       Emit("Identity", {out}, options, mesh_.local_devices()[device]));
  return TF_Output{op, 0};
}

StatusOr<std::vector<TF_Output>> GraphBuilder::RunOn(const std::string& op_type,
                                                     const std::vector<TF_Output>& inputs,
                                                     const LocalOpOptions& options, int device,
                                                     int num_outputs) {
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       Emit(op_type, inputs, options, mesh_.local_devices()[device]));
  std::vector<TF_Output> outputs;
  for (int i = 0; i < TF_OperationNumOutputs(op); ++i) outputs.push_back(TF_Output{op, i});
  return outputs;
}

StatusOr<ValueId> GraphBuilder::HostConstant(const std::vector<int64_t>& values,
                                             const std::vector<int64_t>& shape, int dtype) {
  TFD_ASSIGN_OR_RETURN(TF_Tensor * tensor, IntTensor(values, shape, dtype));
  TF_OperationDescription* desc = TF_NewOperation(graph_, "Const", UniqueName("Const").c_str());
  TF_SetDevice(desc, host_device_.c_str());
  TF_SetAttrTensor(desc, "value", tensor, status_);
  TF_DeleteTensor(tensor);
  TFD_RETURN_IF_ERROR(FromTF(status_, "creating a host constant"));
  TF_SetAttrType(desc, "dtype", static_cast<TF_DataType>(dtype));
  TF_Operation* op = TF_FinishOperation(desc, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "creating a host constant"));
  created_.push_back(op);
  Value v;
  v.shape = shape;
  v.dtype = dtype;
  v.host = TF_Output{op, 0};
  v.int_value_read = true;
  v.int_value = values;
  return Add(std::move(v));
}

}  // namespace tf_dtensor
