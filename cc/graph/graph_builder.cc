#include "cc/graph/graph_builder.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <unordered_map>

#include "cc/core/strings.h"
#include "cc/tf/handles.h"
#include "cc/tf/memory_types.h"
#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {
namespace {

// Ops whose output shape depends on their input's values, which tf_dtensor's rules emit.
bool SizedByValues(const std::string& op) {
  return op == "Where" || op == "Unique" || op == "UniqueV2" || op == "UniqueWithCounts" ||
         op == "UniqueWithCountsV2" || op == "ListDiff";
}

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
      host_on_mesh_(std::find(mesh_.local_devices().begin(), mesh_.local_devices().end(),
                              host_device_) != mesh_.local_devices().end()),
      status_(TF_NewStatus()),
      combine_limit_bytes_([] {
        const char* env = std::getenv("TF_DTENSOR_COMBINE_ALL_REDUCE_MIB");
        return (env && *env ? std::atoll(env) : 64) << 20;
      }()) {}

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
  std::optional<std::vector<int64_t>> shape = InferredShape(output);
  if (!shape) shape = LookupShape(output);
  v.shape = shape.value_or(std::vector<int64_t>{});
  const ValueId id = Add(std::move(v));
  if (!shape) unknown_rank_.insert(id);
  return id;
}

std::optional<std::vector<int64_t>> GraphBuilder::LookupShape(TF_Output output) {
  // A hash table's lookup (Keras' StringLookup, IntegerLookup, TextVectorization): TF
  // infers its shape only from the table handle's data, which a captured table lacks. The
  // kernel's is the keys' shape and then the value shape, which the default value has.
  const std::string type = TF_OperationOpType(output.oper);
  if ((type != "LookupTableFindV2" && type != "LookupTableFind") || output.index != 0 ||
      TF_OperationNumInputs(output.oper) != 3) {
    return std::nullopt;
  }
  std::optional<std::vector<int64_t>> keys =
      InferredShape(TF_OperationInput(TF_Input{output.oper, 1}));
  std::optional<std::vector<int64_t>> value =
      InferredShape(TF_OperationInput(TF_Input{output.oper, 2}));
  if (!keys || !value) return std::nullopt;
  keys->insert(keys->end(), value->begin(), value->end());
  SetLocalShape(output, *keys);
  return InferredShape(output);
}

StatusOr<ValueId> GraphBuilder::EnsureHostShape(ValueId value,
                                                 const std::vector<int64_t>& shape) {
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Shape("shape", shape),
                       AttrOverride::Type("T", values_[value].dtype)};
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       EmitOnHost("EnsureShape", {values_[value].host}, options));
  return AddHost(TF_Output{op, 0});
}

StatusOr<ValueId> GraphBuilder::Broadcast(ValueId host_value, const Mesh& mesh) {
  if (unknown_rank_.count(host_value)) {
    const TF_Output out = values_[host_value].host;
    return FailedPrecondition(
        "Output " + std::to_string(out.index) + " of '" + TF_OperationName(out.oper) + "' (" +
        TF_OperationOpType(out.oper) + ", run on the host) goes to " + mesh.ShortString() +
        " as a DTensor, but TensorFlow infers no shape for it, not even its rank; tf_dtensor "
        "needs static shapes. Give it one inside the function with `tf.ensure_shape` (a hash "
        "table's lookup: `tf.ensure_shape(table.lookup(keys), keys.shape)`), or pass the value "
        "in as an argument (a tf.Variable made with shape=None: `fn(x, v.read_value())`).");
  }
  return ComponentBuilder<TF_Output>::Broadcast(host_value, mesh);
}

namespace {
thread_local int64_t unknown_values_met = 0;
}  // namespace

int64_t UnknownValuesMet() { return unknown_values_met; }

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
  if (!shape || std::find(shape->begin(), shape->end(), -1) != shape->end()) {
    ++unknown_values_met;
  }
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
  if (!TF_TryEvaluateConstant(graph_, out, &tensor, status_) || !tensor) {
    ++unknown_values_met;
    return std::nullopt;
  }
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

std::vector<TF_Operation*> GraphBuilder::ControlsFor(const std::string& device,
                                                     const std::string& op_type) const {
  // Where devices share no buffers, a device's side effects (its component of a DVariable,
  // its place in a collective) are its own: an op waits for what its control inputs
  // expanded into on its own device, which keeps every device's order. Each control edge
  // between two devices costs a _Send/_Recv pair per call (8 devices: 56 of them for one
  // edge of the traced function). Shared buffers (one variable read by all devices), a
  // control input with nothing on this device (another mesh, the host) and an op on no
  // device keep every edge. So does a While, If, Case or call: placed on the host, its
  // bodies run ops on every device, also where the host is a mesh device too (CPU:0 of a
  // CPU mesh): a loop that assigns a DVariable after a read waits for every device's read.
  static const std::set<std::string>* const kFunctional = new std::set<std::string>{
      "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
      "PartitionedCall", "StatefulPartitionedCall"};
  if (control_inputs_.empty() || device.empty() || !orders_per_device() ||
      kFunctional->count(op_type)) {
    return control_inputs_;
  }
  std::vector<TF_Operation*> same;
  for (TF_Operation* c : control_inputs_) {
    if (device == TF_OperationDevice(c)) same.push_back(c);
  }
  return same.empty() ? control_inputs_ : same;
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
                                           const std::vector<TF_Output>& given_inputs,
                                           const LocalOpOptions& options,
                                           const std::string& device,
                                           const RawAttrs& extra_attrs) {
  std::vector<TF_Output> from_device;
  if (xla_compile_ && !host_on_mesh_ && mesh_.shares_host_memory() && !emitting_on_host_ &&
      device != host_device_) {
    from_device = given_inputs;
    for (TF_Output& in : from_device) {
      TFD_ASSIGN_OR_RETURN(in, HostValueOnDevice(in, device));
    }
  }
  const std::vector<TF_Output>& inputs = from_device.empty() ? given_inputs : from_device;
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
  // The host's ops (EmitOnHost) are never marked. Where the host is one of the mesh's
  // devices (virtual CPUs that include the host's, and every mesh of the shared-buffer
  // lowering) nothing is (set_xla_compile).
  // Nor are ops whose output size depends on their input's values (Where): XLA gives them
  // a bounded dynamic size, which the ops a rule builds on them (a Pad of the rows a
  // Where picked) lose inside the cluster; left outside, the cluster takes their results
  // at the sizes they have.
  if (xla_compile_ && !host_on_mesh_ && !emitting_on_host_ && device != host_device_ &&
      !set_names.count("_XlaCompile") && !SizedByValues(op_type)) {
    TF_SetAttrBool(desc, "_XlaCompile", 1);
    set_names.insert("_XlaCompile");
  }
  // TF's collective ops link devices with no graph edge: ops after a collective are kept
  // out of the XLA clusters of ops before it (cluster_phases.h).
  const bool collective_ops = lowering().name() == "ops";
  if (collective_ops && !set_names.count("_XlaScope")) {
    const std::string scope = phases_.Scope(phases_.Of(inputs, ControlsFor(device, op_type)));
    for (const char* attr : {"_XlaScope", "_XlaInternalScope"}) {
      TF_SetAttrString(desc, attr, scope.data(), scope.size());
      set_names.insert(attr);
    }
  }
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
  for (TF_Operation* control : ControlsFor(device, op_type)) TF_AddControlInput(desc, control);
  TF_Operation* op = TF_FinishOperation(desc, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "adding '" + op_type + "' to the SPMD graph"));
  created_.push_back(op);
  // The members of one collective share their instance key's host value.
  if (collective_ops && op_type.rfind("Collective", 0) == 0 && TF_OperationNumInputs(op) > 3) {
    const TF_Output key = TF_OperationInput(TF_Input{op, 3});
    phases_.AddMember(op, reinterpret_cast<intptr_t>(key.oper) * 8 + key.index);
    // Every member must run, read or not: a device whose part nobody reads (a predicate
    // the host takes from device 0) would otherwise be pruned by TensorFlow's passes
    // (under auto-clustering they drop it) and leave the others waiting for good.
    must_run_.push_back(op);
  }
  TFD_RETURN_IF_ERROR(PlaceConstants(op, device));
  TFD_RETURN_IF_ERROR(HoldForwardedInput(op, op_type, device));
  return op;
}

// TensorFlow's MaxPoolGradGrad and MaxPool3DGradGrad kernels take `grad` (input 2) as
// their output's buffer where nothing else holds it, and then read it while they write
// the output: in a graph where `grad` is made by the op before (a gather here; in plain
// TensorFlow, `grad * 2.0` or a concat), their result is wrong, on one device as well.
// An Identity of `grad` that waits for the op, and that the function must run, holds it.
Status GraphBuilder::HoldForwardedInput(TF_Operation* op, const std::string& op_type,
                                        const std::string& device) {
  if ((op_type != "MaxPoolGradGrad" && op_type != "MaxPool3DGradGrad") ||
      TF_OperationNumInputs(op) < 3) {
    return Status::Ok();
  }
  const std::string name = UniqueName(op_type + "_hold");
  TF_OperationDescription* desc = TF_NewOperation(graph_, "Identity", name.c_str());
  TF_SetDevice(desc, device.c_str());
  TF_AddInput(desc, TF_OperationInput(TF_Input{op, 2}));
  TF_AddControlInput(desc, op);
  TF_Operation* hold = TF_FinishOperation(desc, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "adding a hold of the gradient of '" + op_type + "'"));
  must_run_.push_back(hold);
  return Status::Ok();
}

StatusOr<TF_Output> GraphBuilder::ConstOn(TF_Output c, const std::string& device) {
  if (std::string_view(TF_OperationOpType(c.oper)) != "Const" ||
      TF_OperationNumControlInputs(c.oper) > 0 || device == TF_OperationDevice(c.oper)) {
    return c;
  }
  auto key = std::make_pair(c.oper, device);
  auto it = const_copies_.find(key);
  if (it != const_copies_.end()) return TF_Output{it->second, 0};
  TF_Tensor* value = nullptr;
  TF_OperationGetAttrTensor(c.oper, "value", &value, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "reading a constant"));
  TF_DataType dtype;
  TF_OperationGetAttrType(c.oper, "dtype", &dtype, status_);
  if (TF_GetCode(status_) != TF_OK) {
    TF_DeleteTensor(value);
    return FromTF(status_, "reading a constant's dtype");
  }
  std::string name = std::string(TF_OperationName(c.oper)) + "/on_" + std::to_string(counter_++);
  TF_OperationDescription* desc = TF_NewOperation(graph_, "Const", name.c_str());
  TF_SetDevice(desc, device.c_str());
  TF_SetAttrTensor(desc, "value", value, status_);
  TF_DeleteTensor(value);
  TFD_RETURN_IF_ERROR(FromTF(status_, "copying a constant"));
  TF_SetAttrType(desc, "dtype", dtype);
  TF_Operation* op = TF_FinishOperation(desc, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "copying a constant"));
  const_copies_[key] = op;
  return TF_Output{op, 0};
}

StatusOr<TF_Operation*> GraphBuilder::EmitOnHost(const std::string& op_type,
                                                 const std::vector<TF_Output>& inputs,
                                                 const LocalOpOptions& options,
                                                 const RawAttrs& extra_attrs) {
  emitting_on_host_ = true;
  StatusOr<TF_Operation*> op = Emit(op_type, inputs, options, host_device_, extra_attrs);
  emitting_on_host_ = false;
  return op;
}

StatusOr<TF_Output> GraphBuilder::HostValueOnDevice(TF_Output value, const std::string& device) {
  if (host_device_ != TF_OperationDevice(value.oper)) return value;
  const auto key = std::make_tuple(value.oper, value.index, device);
  if (auto it = host_values_on_device_.find(key); it != host_values_on_device_.end()) {
    return it->second;
  }
  TF_OperationDescription* desc =
      TF_NewOperation(graph_, "Identity", UniqueName("Identity").c_str());
  TF_SetDevice(desc, device.c_str());
  TF_AddInput(desc, value);
  TF_Operation* op = TF_FinishOperation(desc, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "reading a host value on " + device));
  host_values_on_device_[key] = TF_Output{op, 0};
  return TF_Output{op, 0};
}

Status GraphBuilder::PlaceConstants(TF_Operation* op, const std::string& device) {
  if (lowering().shares_buffers() || device == host_device_) return Status::Ok();
  std::optional<std::vector<bool>> host_memory;
  bool asked = false;
  const int n = TF_OperationNumInputs(op);
  for (int i = 0; i < n; ++i) {
    const TF_Output in = TF_OperationInput(TF_Input{op, i});
    if (host_device_ != TF_OperationDevice(in.oper) ||
        std::string_view(TF_OperationOpType(in.oper)) != "Const") {
      continue;
    }
    if (!asked) {
      host_memory = InputsInHostMemory(op);
      asked = true;
    }
    const bool in_host_memory =
        !host_memory || i >= static_cast<int>(host_memory->size()) || (*host_memory)[i];
    // An argument read from host memory takes an int32 constant of the device (TF keeps
    // those in host memory), not an int64 one (device memory on a GPU, which would be
    // copied back on every call): that one stays on the host.
    if (in_host_memory && TF_OperationOutputType(in) != TF_INT32) continue;
    TFD_ASSIGN_OR_RETURN(TF_Output local, ConstOn(in, device));
    if (local.oper == in.oper) continue;
    TF_UpdateEdge(graph_, local, TF_Input{op, i}, status_);
    TFD_RETURN_IF_ERROR(FromTF(status_, "placing a constant on " + device));
  }
  return Status::Ok();
}

StatusOr<TF_Output> GraphBuilder::Share(TF_Output leader_output, int device) {
  if (lowering().shares_buffers()) return leader_output;
  // A constant is made on the device that reads it, not copied there on every call.
  TFD_ASSIGN_OR_RETURN(TF_Output local, ConstOn(leader_output, mesh_.local_devices()[device]));
  if (local.oper != leader_output.oper) return local;
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

std::optional<ValueId> GraphBuilder::ReusableRelayout(ValueId value, const Layout& target) {
  auto it = relayouts_.find(value);
  if (it == relayouts_.end()) return std::nullopt;
  for (const auto& [layout, result] : it->second) {
    if (layout == target) return result;
  }
  return std::nullopt;
}

void GraphBuilder::NoteRelayout(ValueId value, const Layout& target, ValueId result) {
  if (control_inputs_.empty()) relayouts_[value].emplace_back(target, result);
  const std::optional<Layout>& source = layout(value);
  if (source && source->is_partial() && target == source->WithoutPartial()) {
    reduced_by_readers_.insert(value);
  }
}

void GraphBuilder::AddCollectives(const std::vector<CollectiveRecord>& records, bool in_loop,
                                  const std::string& branch) {
  for (CollectiveRecord r : records) {
    r.in_loop = r.in_loop || in_loop;
    if (!branch.empty()) {
      r.in_branch = true;
      r.branch = r.branch.empty() ? branch : branch + " / " + r.branch;
    }
    collectives_.push_back(std::move(r));
  }
}

}  // namespace tf_dtensor
