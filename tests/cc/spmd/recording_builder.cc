#include "tests/cc/spmd/recording_builder.h"

#include <algorithm>

#include "cc/core/strings.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace testing {
namespace {

std::string DtypeName(int dtype) {
  switch (dtype) {
    case TF_FLOAT: return "float32";
    case TF_DOUBLE: return "float64";
    case TF_INT32: return "int32";
    case TF_INT64: return "int64";
    case TF_BOOL: return "bool";
    default: return "dtype" + std::to_string(dtype);
  }
}

std::string MeshDimNames(const Mesh& mesh, const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (int d : dims) names.push_back(mesh.dims()[d].name);
  return Join(names, ",");
}

}  // namespace

ValueId RecordingBuilder::Add(Value value) {
  values_.push_back(std::move(value));
  return static_cast<ValueId>(values_.size()) - 1;
}

ValueId RecordingBuilder::AddInput(std::optional<Layout> layout, std::vector<int64_t> shape,
                                   int dtype) {
  ValueId id = Add({std::move(layout), std::move(shape), dtype, std::nullopt});
  inputs_.push_back(id);
  return id;
}

std::string RecordingBuilder::Describe(ValueId value) const {
  const Value& v = values_[value];
  return v.layout ? v.layout->SpecString() : "host " + ShapeString(v.shape);
}

StatusOr<Layout> RecordingBuilder::WithSpec(ValueId value, int dim, DimSpec spec,
                                            const char* step) const {
  const std::optional<Layout>& layout = values_[value].layout;
  if (!layout) return Internal(std::string(step) + " of a host value");
  if (dim < 0 || dim >= layout->rank()) {
    return Internal(std::string(step) + " of axis " + std::to_string(dim) + " of " +
                    layout->ShortString());
  }
  std::vector<DimSpec> specs = layout->specs();
  specs[dim] = spec;
  StatusOr<Layout> out =
      Layout::FromSpecs(std::move(specs), layout->mesh(), layout->type(), layout->partial());
  if (!out.ok()) return Internal(std::string(step) + ": " + out.status().message());
  return out;
}

StatusOr<std::vector<ValueId>> RecordingBuilder::LocalOp(const std::string& op_name,
                                                         const std::vector<ValueId>& inputs,
                                                         const LocalOpOptions& options,
                                                         const std::vector<Layout>& out_layouts) {
  std::vector<std::string> ins, outs;
  for (ValueId v : inputs) ins.push_back(Describe(v));
  std::vector<ValueId> results;
  for (size_t o = 0; o < out_layouts.size(); ++o) {
    std::vector<int64_t> shape = o < output_shapes_.size() ? output_shapes_[o] : std::vector<int64_t>{};
    int dtype = inputs.empty() ? TF_FLOAT : values_[inputs[0]].dtype;
    results.push_back(Add({out_layouts[o], std::move(shape), dtype, std::nullopt}));
    outs.push_back(out_layouts[o].SpecString());
  }
  std::string line = "local " + op_name;
  if (!ins.empty()) line += " " + Join(ins, " ");
  line += " -> " + (outs.empty() ? std::string("replicated") : Join(outs, " "));
  for (const AttrOverride& a : options.overrides) {
    line += " " + a.name + "=";
    switch (a.kind) {
      case AttrOverride::Kind::kShape: line += ShapeString(a.ints); break;
      case AttrOverride::Kind::kInt: line += std::to_string(a.ints.at(0)); break;
      case AttrOverride::Kind::kType: line += DtypeName(a.type); break;
      case AttrOverride::Kind::kBool: line += a.boolean ? "true" : "false"; break;
      case AttrOverride::Kind::kString: line += a.text; break;
    }
  }
  if (options.run_once) line += " (once)";
  steps_.push_back(line);
  return results;
}

StatusOr<ValueId> RecordingBuilder::AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                                              ReduceOp op) {
  const std::optional<Layout>& layout = values_[value].layout;
  if (!layout) return Internal("all-reduce of a host value");
  steps_.push_back("all-reduce(" + std::string(ReduceOpName(op)) + ") " + Describe(value) +
                   " over " + MeshDimNames(layout->mesh(), mesh_dims));
  // The pending reductions over `mesh_dims` are done; others stay.
  std::vector<PartialSpec> still;
  for (const PartialSpec& p : layout->partial()) {
    if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
      still.push_back(p);
    }
  }
  Value out = values_[value];
  out.resource.reset();
  TFD_ASSIGN_OR_RETURN(out.layout, layout->WithoutPartial().WithPartial(still));
  return Add(std::move(out));
}

StatusOr<ValueId> RecordingBuilder::ReduceScatter(ValueId value, int dim, int mesh_dim,
                                                  ReduceOp op) {
  const std::optional<Layout>& layout = values_[value].layout;
  if (!layout) return Internal("reduce-scatter of a host value");
  std::vector<PartialSpec> still;
  for (const PartialSpec& p : layout->partial()) {
    if (p.mesh_dim != mesh_dim) still.push_back(p);
  }
  std::vector<DimSpec> specs = layout->specs();
  specs[dim] = DimSpec::Sharded(mesh_dim);
  StatusOr<Layout> out = Layout::FromSpecs(specs, layout->mesh(), layout->type(), still);
  if (!out.ok()) return Internal("reduce-scatter: " + out.status().message());
  steps_.push_back("reduce-scatter(" + std::string(ReduceOpName(op)) + ") axis " +
                   std::to_string(dim) + " over " + layout->mesh().dims()[mesh_dim].name + " " +
                   Describe(value) + " -> " + out->SpecString());
  return Add({*out, values_[value].shape, values_[value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::ToPartial(ValueId value, const std::vector<int>& mesh_dims,
                                              ReduceOp op) {
  const std::optional<Layout>& layout = values_[value].layout;
  if (!layout) return Internal("to-partial of a host value");
  std::vector<PartialSpec> added;
  for (int d : mesh_dims) added.push_back({d, op});
  StatusOr<Layout> out = layout->WithPartial(added);
  if (!out.ok()) return Internal("to-partial: " + out.status().message());
  steps_.push_back("to-partial(" + std::string(ReduceOpName(op)) + ") " + Describe(value) +
                   " -> " + out->SpecString());
  return Add({*out, values_[value].shape, values_[value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::AllGather(ValueId value, int dim) {
  if (values_[value].layout && !values_[value].layout->spec(dim).sharded()) {
    return Internal("all-gather of unsharded axis " + std::to_string(dim) + " of " +
                    values_[value].layout->ShortString());
  }
  TFD_ASSIGN_OR_RETURN(Layout layout, WithSpec(value, dim, DimSpec::Replicated(), "all-gather"));
  steps_.push_back("all-gather axis " + std::to_string(dim) + " " + Describe(value) + " -> " +
                   layout.SpecString());
  return Add({layout, values_[value].shape, values_[value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::Slice(ValueId value, int dim, int mesh_dim) {
  if (values_[value].layout && values_[value].layout->spec(dim).sharded()) {
    return Internal("slice of sharded axis " + std::to_string(dim) + " of " +
                    values_[value].layout->ShortString());
  }
  TFD_ASSIGN_OR_RETURN(Layout layout, WithSpec(value, dim, DimSpec::Sharded(mesh_dim), "slice"));
  steps_.push_back("slice axis " + std::to_string(dim) + " over " +
                   layout.mesh().dims()[mesh_dim].name + " " + Describe(value) + " -> " +
                   layout.SpecString());
  return Add({layout, values_[value].shape, values_[value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::AllToAll(ValueId value, int from_dim, int to_dim) {
  const std::optional<Layout>& source = values_[value].layout;
  if (!source || !source->spec(from_dim).sharded() || source->spec(to_dim).sharded()) {
    return Internal("all-to-all from axis " + std::to_string(from_dim) + " to " +
                    std::to_string(to_dim) + " of " + Describe(value));
  }
  std::vector<DimSpec> specs = source->specs();
  std::swap(specs[from_dim], specs[to_dim]);
  StatusOr<Layout> layout = Layout::FromSpecs(std::move(specs), source->mesh(), source->type());
  if (!layout.ok()) return Internal("all-to-all: " + layout.status().message());
  steps_.push_back("all-to-all axis " + std::to_string(from_dim) + " -> " +
                   std::to_string(to_dim) + " " + Describe(value) + " -> " +
                   layout->SpecString());
  return Add({*layout, values_[value].shape, values_[value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::HostConstant(const std::vector<int64_t>& values,
                                                 const std::vector<int64_t>& shape, int dtype) {
  steps_.push_back("host constant " + ShapeString(values) + " " + DtypeName(dtype));
  return Add({std::nullopt, shape, dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::Broadcast(ValueId host_value, const Mesh& mesh) {
  Layout layout = Layout::Replicated(mesh, static_cast<int>(values_[host_value].shape.size()));
  steps_.push_back("broadcast " + Describe(host_value) + " -> " + layout.ShortString());
  return Add({layout, values_[host_value].shape, values_[host_value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::MoveToMesh(ValueId value, const Mesh& mesh) {
  const std::optional<Layout>& source = values_[value].layout;
  if (!source || (!source->IsFullyReplicated() && !source->is_single_device())) {
    return Internal("move to another mesh of " + Describe(value) + ", which is not whole");
  }
  Layout layout = Layout::Replicated(mesh, static_cast<int>(values_[value].shape.size()));
  steps_.push_back("move " + source->ShortString() + " -> " + layout.ShortString());
  return Add({layout, values_[value].shape, values_[value].dtype, std::nullopt});
}

}  // namespace testing
}  // namespace tf_dtensor
