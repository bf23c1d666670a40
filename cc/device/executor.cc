#include "cc/device/executor.h"

#include <map>

#include "cc/core/strings.h"
#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {
namespace {

std::vector<int64_t> LocalShapeOf(TFE_TensorHandle* handle, TF_Status* status) {
  std::vector<int64_t> shape;
  int rank = TFE_TensorHandleNumDims(handle, status);
  for (int d = 0; d < rank; ++d) shape.push_back(TFE_TensorHandleDim(handle, d, status));
  return shape;
}

}  // namespace

Status FromTF(TF_Status* status, const std::string& context) {
  TF_Code code = TF_GetCode(status);
  if (code == TF_OK) return Status::Ok();
  return Status(static_cast<Code>(code), context + ": " + TF_Message(status));
}

EagerBuilder::EagerBuilder(TFE_Context* context, Mesh mesh, const TFE_OpAttrs* attrs,
                           int max_outputs)
    : context_(context),
      mesh_(std::move(mesh)),
      attrs_(attrs),
      max_outputs_(max_outputs),
      status_(TF_NewStatus()) {}

EagerBuilder::~EagerBuilder() {
  for (Value& v : values_) {
    if (!v.owned) continue;
    for (TFE_TensorHandle* h : v.handles) {
      if (h) TFE_DeleteTensorHandle(h);
    }
    if (v.host) TFE_DeleteTensorHandle(v.host);
  }
  TF_DeleteStatus(status_);
}

ValueId EagerBuilder::AddOwned(Value value) {
  value.owned = true;
  values_.push_back(std::move(value));
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId EagerBuilder::AddInput(const TensorWithLayout* tensor) {
  Value v;
  v.layout = tensor->layout();
  v.shape = tensor->shape();
  v.dtype = tensor->dtype();
  v.resource = tensor->resource();
  for (int i = 0; i < tensor->num_components(); ++i) v.handles.push_back(tensor->component(i));
  values_.push_back(std::move(v));
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId EagerBuilder::AddHostInput(TFE_TensorHandle* handle, std::vector<int64_t> shape,
                                   TF_DataType dtype) {
  Value v;
  v.shape = std::move(shape);
  v.dtype = dtype;
  v.host = handle;
  values_.push_back(std::move(v));
  return static_cast<ValueId>(values_.size() - 1);
}

StatusOr<std::unique_ptr<TensorWithLayout>> EagerBuilder::Release(ValueId value) {
  Value& v = values_[value];
  if (!v.layout) return Internal("Releasing a host value as a DTensor.");
  std::vector<HandlePtr> components;
  for (TFE_TensorHandle* h : v.handles) {
    if (v.owned) {
      components.emplace_back(h);
    } else {
      components.push_back(ShareHandle(h, status_));
      TFD_RETURN_IF_ERROR(FromTF(status_, "sharing a component"));
    }
  }
  // The record owns the handles now; later releases share them.
  v.owned = false;
  auto tensor = std::make_unique<TensorWithLayout>(*v.layout, v.shape,
                                                   static_cast<TF_DataType>(v.dtype),
                                                   std::move(components));
  tensor->set_resource(v.resource);
  return tensor;
}

bool EagerBuilder::SameCoords(int a, int b, const std::vector<int>& mesh_dims) const {
  for (int k : mesh_dims) {
    if (mesh_.LocalCoord(a, k) != mesh_.LocalCoord(b, k)) return false;
  }
  return true;
}

std::vector<int> EagerBuilder::Leaders(const std::vector<int>& key_dims) const {
  const int n = mesh_.num_local_devices();
  std::vector<int> leaders(n);
  for (int d = 0; d < n; ++d) {
    leaders[d] = d;
    if (!mesh_.shares_host_memory()) continue;
    for (int e = 0; e < d; ++e) {
      if (SameCoords(d, e, key_dims)) {
        leaders[d] = e;
        break;
      }
    }
  }
  return leaders;
}

StatusOr<TFE_TensorHandle*> EagerBuilder::FromLeader(TFE_TensorHandle* leader_handle, int device) {
  TFE_TensorHandle* out;
  if (mesh_.shares_host_memory()) {
    out = TFE_TensorHandleCopySharingTensor(leader_handle, status_);
  } else {
    out = TFE_TensorHandleCopyToDevice(leader_handle, context_,
                                       mesh_.local_devices()[device].c_str(), status_);
  }
  TFD_RETURN_IF_ERROR(FromTF(status_, "placing a component on " + mesh_.local_devices()[device]));
  return out;
}

StatusOr<std::vector<TFE_TensorHandle*>> EagerBuilder::Run(
    const std::string& op_name, const std::vector<TFE_TensorHandle*>& inputs,
    const LocalOpOptions& options, int device, int num_outputs) {
  const std::string& device_name = mesh_.local_devices()[device];
  // One TFE_Op object is reset and reused for every local op of this expansion.
  if (!op_) {
    op_.reset(TFE_NewOp(context_, op_name.c_str(), status_));
    if (TF_GetCode(status_) != TF_OK) op_.reset();
  } else {
    TFE_OpReset(op_.get(), op_name.c_str(), nullptr, status_);
  }
  TFD_RETURN_IF_ERROR(FromTF(status_, "creating '" + op_name + "'"));
  TFE_Op* op = op_.get();
  if (options.copy_attrs && attrs_) TFE_OpAddAttrs(op, attrs_);
  for (const AttrOverride& a : options.overrides) {
    switch (a.kind) {
      case AttrOverride::Kind::kShape:
        TFE_OpSetAttrShape(op, a.name.c_str(), a.ints.data(),
                           static_cast<int>(a.ints.size()), status_);
        break;
      case AttrOverride::Kind::kType:
        TFE_OpSetAttrType(op, a.name.c_str(), static_cast<TF_DataType>(a.type));
        break;
      case AttrOverride::Kind::kInt:
        TFE_OpSetAttrInt(op, a.name.c_str(), a.ints[0]);
        break;
      case AttrOverride::Kind::kBool:
        TFE_OpSetAttrBool(op, a.name.c_str(), a.boolean);
        break;
      case AttrOverride::Kind::kString:
        TFE_OpSetAttrString(op, a.name.c_str(), a.text.data(), a.text.size());
        break;
    }
    TFD_RETURN_IF_ERROR(FromTF(status_, "setting attribute '" + a.name + "' of '" + op_name + "'"));
  }
  TFE_OpSetDevice(op, device_name.c_str(), status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "placing '" + op_name + "'"));
  for (TFE_TensorHandle* h : inputs) {
    TFE_OpAddInput(op, h, status_);
    TFD_RETURN_IF_ERROR(FromTF(status_, "adding an input to '" + op_name + "'"));
  }
  std::vector<TFE_TensorHandle*> outputs(num_outputs, nullptr);
  int n = num_outputs;
  TFE_Execute(op, outputs.data(), &n, status_);
  TFD_RETURN_IF_ERROR(
      FromTF(status_, "running '" + op_name + "' on " + ShortDeviceName(device_name)));
  outputs.resize(n);
  return outputs;
}

StatusOr<std::vector<ValueId>> EagerBuilder::LocalOp(const std::string& op_name,
                                                     const std::vector<ValueId>& inputs,
                                                     const LocalOpOptions& options,
                                                     const std::vector<Layout>& out_layouts) {
  // Devices that agree on these mesh coordinates hold the same inputs and outputs.
  std::vector<int> key_dims = options.distinct_over;
  for (ValueId v : inputs) {
    if (!values_[v].layout) continue;
    for (int d : values_[v].layout->ShardedMeshDims()) key_dims.push_back(d);
    // A DVariable handle stands for one variable per shard of its value.
    if (values_[v].resource) {
      for (int d : values_[v].resource->value_layout.ShardedMeshDims()) key_dims.push_back(d);
    }
  }
  for (const Layout& l : out_layouts) {
    for (int d : l.ShardedMeshDims()) key_dims.push_back(d);
  }
  const int n = mesh_.num_local_devices();
  std::vector<int> leaders = options.run_once ? std::vector<int>(n, 0) : Leaders(key_dims);
  if (options.run_once && !mesh_.shares_host_memory()) leaders[0] = 0;
  const int num_outputs = out_layouts.empty() ? max_outputs_ : static_cast<int>(out_layouts.size());

  std::vector<std::vector<TFE_TensorHandle*>> per_device(n);
  Status failure;
  for (int d = 0; d < n && failure.ok(); ++d) {
    if (leaders[d] != d) {
      for (TFE_TensorHandle* h : per_device[leaders[d]]) {
        StatusOr<TFE_TensorHandle*> shared = FromLeader(h, d);
        if (!shared.ok()) {
          failure = shared.status();
          break;
        }
        per_device[d].push_back(*shared);
      }
      continue;
    }
    std::vector<TFE_TensorHandle*> local_inputs;
    for (ValueId v : inputs) {
      local_inputs.push_back(values_[v].layout ? values_[v].handles[d] : values_[v].host);
    }
    StatusOr<std::vector<TFE_TensorHandle*>> outs = Run(op_name, local_inputs, options, d, num_outputs);
    if (!outs.ok()) {
      failure = outs.status();
      break;
    }
    per_device[d] = std::move(outs).value();
  }
  if (!failure.ok()) {
    for (auto& hs : per_device) {
      for (TFE_TensorHandle* h : hs) TFE_DeleteTensorHandle(h);
    }
    return failure;
  }
  std::vector<ValueId> result;
  const int produced = static_cast<int>(per_device[0].size());
  for (int j = 0; j < produced; ++j) {
    Value v;
    TFE_TensorHandle* first = per_device[0][j];
    std::vector<int64_t> local = LocalShapeOf(first, status_);
    TFD_RETURN_IF_ERROR(FromTF(status_, "reading the shape of '" + op_name + "'"));
    v.layout = j < static_cast<int>(out_layouts.size())
                   ? out_layouts[j]
                   : Layout::Replicated(mesh_, static_cast<int>(local.size()));
    v.shape = v.layout->rank() == static_cast<int>(local.size()) ? v.layout->GlobalShape(local)
                                                                  : local;
    v.dtype = TFE_TensorHandleDataType(first);
    for (int d = 0; d < n; ++d) v.handles.push_back(per_device[d][j]);
    result.push_back(AddOwned(std::move(v)));
  }
  return result;
}

StatusOr<ValueId> EagerBuilder::AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                                          ReduceOp op) {
  const Layout layout = *values_[value].layout;
  std::vector<int> key_dims = layout.ShardedMeshDims();
  const int n = mesh_.num_local_devices();
  std::vector<int> leaders = Leaders(key_dims);
  const int dtype = values_[value].dtype;
  Value out{layout, values_[value].shape, dtype};
  out.handles.assign(n, nullptr);
  for (int d = 0; d < n; ++d) {
    if (leaders[d] != d) {
      TFD_ASSIGN_OR_RETURN(out.handles[d], FromLeader(out.handles[leaders[d]], d));
      continue;
    }
    // One partial value per coordinate tuple along `mesh_dims`, within d's group.
    std::map<std::vector<int64_t>, TFE_TensorHandle*> partials;
    for (int e = 0; e < n; ++e) {
      if (!SameCoords(d, e, key_dims)) continue;
      std::vector<int64_t> coords;
      for (int k : mesh_dims) coords.push_back(mesh_.LocalCoord(e, k));
      partials.emplace(coords, values_[value].handles[e]);
    }
    std::vector<TFE_TensorHandle*> parts;
    for (auto& [coords, h] : partials) parts.push_back(h);
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype)};
    if (op == ReduceOp::kSum) {
      options.overrides.push_back(AttrOverride::Int("N", static_cast<int64_t>(parts.size())));
      TFD_ASSIGN_OR_RETURN(std::vector<TFE_TensorHandle*> r, Run("AddN", parts, options, d, 1));
      out.handles[d] = r[0];
      continue;
    }
    const char* binary = op == ReduceOp::kMax ? "Maximum" : op == ReduceOp::kMin ? "Minimum" : "Mul";
    TFE_TensorHandle* acc = nullptr;
    for (size_t i = 1; i < parts.size(); ++i) {
      TFD_ASSIGN_OR_RETURN(std::vector<TFE_TensorHandle*> r,
                           Run(binary, {acc ? acc : parts[0], parts[i]}, options, d, 1));
      if (acc) TFE_DeleteTensorHandle(acc);
      acc = r[0];
    }
    if (!acc) {
      TFD_ASSIGN_OR_RETURN(acc, FromLeader(parts[0], d));
    }
    out.handles[d] = acc;
  }
  return AddOwned(std::move(out));
}

StatusOr<ValueId> EagerBuilder::AllGather(ValueId value, int dim) {
  const Layout layout = *values_[value].layout;
  const int mesh_dim = layout.spec(dim).mesh_dim;
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = DimSpec::Replicated();
  Layout out_layout = layout.WithSpecs(specs);
  std::vector<int> key_dims = out_layout.ShardedMeshDims();
  const int n = mesh_.num_local_devices();
  std::vector<int> leaders = Leaders(key_dims);
  const int64_t pieces = mesh_.DimSize(mesh_dim);
  TFD_ASSIGN_OR_RETURN(ValueId axis, HostConstant({dim}, {}, TF_INT32));
  Value out{out_layout, values_[value].shape, values_[value].dtype};
  out.handles.assign(n, nullptr);
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", values_[value].dtype),
                       AttrOverride::Type("Tidx", TF_INT32), AttrOverride::Int("N", pieces)};
  for (int d = 0; d < n; ++d) {
    if (leaders[d] != d) {
      TFD_ASSIGN_OR_RETURN(out.handles[d], FromLeader(out.handles[leaders[d]], d));
      continue;
    }
    std::vector<TFE_TensorHandle*> parts(pieces, nullptr);
    for (int e = 0; e < n; ++e) {
      int64_t c = mesh_.LocalCoord(e, mesh_dim);
      if (SameCoords(d, e, key_dims) && !parts[c]) parts[c] = values_[value].handles[e];
    }
    parts.push_back(values_[axis].host);
    TFD_ASSIGN_OR_RETURN(std::vector<TFE_TensorHandle*> r, Run("ConcatV2", parts, options, d, 1));
    out.handles[d] = r[0];
  }
  return AddOwned(std::move(out));
}

StatusOr<ValueId> EagerBuilder::Slice(ValueId value, int dim, int mesh_dim) {
  const Layout layout = *values_[value].layout;
  std::vector<DimSpec> specs = layout.specs();
  specs[dim] = DimSpec::Sharded(mesh_dim);
  TFD_ASSIGN_OR_RETURN(Layout out_layout, Layout::FromSpecs(specs, layout.mesh()));
  TFD_RETURN_IF_ERROR(out_layout.LocalShape(values_[value].shape, "the relaid-out tensor").status());
  // Split once per distinct input shard; each device keeps its piece.
  std::vector<int> leaders = Leaders(layout.ShardedMeshDims());
  const int n = mesh_.num_local_devices();
  const int64_t pieces = mesh_.DimSize(mesh_dim);
  TFD_ASSIGN_OR_RETURN(ValueId axis, HostConstant({dim}, {}, TF_INT32));
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", values_[value].dtype),
                       AttrOverride::Int("num_split", pieces)};
  Value out{out_layout, values_[value].shape, values_[value].dtype};
  out.handles.assign(n, nullptr);
  std::map<int, std::vector<TFE_TensorHandle*>> splits;  // leader -> pieces
  Status failure;
  for (int d = 0; d < n && failure.ok(); ++d) {
    int leader = leaders[d];
    if (!splits.count(leader)) {
      StatusOr<std::vector<TFE_TensorHandle*>> r =
          Run("Split", {values_[axis].host, values_[value].handles[leader]}, options, leader, pieces);
      if (!r.ok()) {
        failure = r.status();
        break;
      }
      splits[leader] = std::move(r).value();
    }
    StatusOr<TFE_TensorHandle*> piece = FromLeader(splits[leader][mesh_.LocalCoord(d, mesh_dim)], d);
    if (!piece.ok()) {
      failure = piece.status();
      break;
    }
    out.handles[d] = *piece;
  }
  for (auto& [leader, hs] : splits) {
    for (TFE_TensorHandle* h : hs) TFE_DeleteTensorHandle(h);
  }
  if (!failure.ok()) {
    for (TFE_TensorHandle* h : out.handles) {
      if (h) TFE_DeleteTensorHandle(h);
    }
    return failure;
  }
  return AddOwned(std::move(out));
}

StatusOr<ValueId> EagerBuilder::HostConstant(const std::vector<int64_t>& values,
                                             const std::vector<int64_t>& shape, int dtype) {
  if (dtype != TF_INT32 && dtype != TF_INT64) {
    return Internal("Host constants are int32 or int64.");
  }
  size_t width = dtype == TF_INT32 ? 4 : 8;
  TF_Tensor* tensor = TF_AllocateTensor(static_cast<TF_DataType>(dtype), shape.data(),
                                        static_cast<int>(shape.size()), width * values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == TF_INT32) {
      static_cast<int32_t*>(TF_TensorData(tensor))[i] = static_cast<int32_t>(values[i]);
    } else {
      static_cast<int64_t*>(TF_TensorData(tensor))[i] = values[i];
    }
  }
  TFE_TensorHandle* handle = TFE_NewTensorHandle(tensor, status_);
  TF_DeleteTensor(tensor);
  TFD_RETURN_IF_ERROR(FromTF(status_, "creating a host constant"));
  Value v;
  v.shape = shape;
  v.dtype = dtype;
  v.host = handle;
  return AddOwned(std::move(v));
}

StatusOr<ValueId> EagerBuilder::Broadcast(ValueId host_value, const Mesh& mesh) {
  const Value& host = values_[host_value];
  Value out{Layout::Replicated(mesh, static_cast<int>(host.shape.size())), host.shape, host.dtype};
  for (int d = 0; d < mesh_.num_local_devices(); ++d) {
    TFD_ASSIGN_OR_RETURN(TFE_TensorHandle * h, FromLeader(values_[host_value].host, d));
    out.handles.push_back(h);
  }
  return AddOwned(std::move(out));
}

}  // namespace tf_dtensor
