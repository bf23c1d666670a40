#include "cc/spmd/recording_builder.h"

#include "cc/core/strings.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

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

StatusOr<Layout> RecordingBuilder::LayoutOf(ValueId value, const char* step) const {
  const std::optional<Layout>& layout = values_[value].layout;
  if (!layout) return Internal(std::string(step) + " of a host value");
  return *layout;
}

StatusOr<ValueId> RecordingBuilder::Record(ValueId value, StatusOr<RelayoutStep> step) {
  if (!step.ok()) return step.status();
  steps_.push_back(step->ToString());
  return Add({step->to, values_[value].shape, values_[value].dtype, std::nullopt});
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
    // A shape the rule gives is that of an op other than the one recorded (a list's
    // elements stacked to be relaid out), or better known than the recorded op's.
    if (o < options.global_shapes.size() && options.global_shapes[o]) {
      shape = *options.global_shapes[o];
    }
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
      case AttrOverride::Kind::kType: line += DataTypeName(a.type); break;
      case AttrOverride::Kind::kBool: line += a.boolean ? "true" : "false"; break;
      case AttrOverride::Kind::kString: line += a.text; break;
      case AttrOverride::Kind::kIntList: line += ShapeString(a.ints); break;
    }
  }
  if (options.run_once) line += " (once)";
  steps_.push_back(line);
  return results;
}

StatusOr<ValueId> RecordingBuilder::AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                                              ReduceOp op) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "all-reduce"));
  return Record(value, AllReduceStep(layout, mesh_dims, op));
}

StatusOr<ValueId> RecordingBuilder::ReduceScatter(ValueId value, int dim, int mesh_dim,
                                                  ReduceOp op) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "reduce-scatter"));
  return Record(value, ReduceScatterStep(layout, dim, mesh_dim, op));
}

StatusOr<ValueId> RecordingBuilder::ToPartial(ValueId value, const std::vector<int>& mesh_dims,
                                              ReduceOp op) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "to-partial"));
  return Record(value, ToPartialStep(layout, mesh_dims, op));
}

StatusOr<ValueId> RecordingBuilder::AllGather(ValueId value, int dim) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "all-gather"));
  return Record(value, AllGatherStep(layout, dim));
}

StatusOr<ValueId> RecordingBuilder::Slice(ValueId value, int dim, int mesh_dim) {
  return SliceOver(value, dim, DimSpec::Sharded(mesh_dim));
}

StatusOr<ValueId> RecordingBuilder::SliceOver(ValueId value, int dim, const DimSpec& spec) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "slice"));
  return Record(value, SliceStep(layout, dim, spec));
}

StatusOr<ValueId> RecordingBuilder::AllToAll(ValueId value, int from_dim, int to_dim) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "all-to-all"));
  return Record(value, AllToAllStep(layout, from_dim, to_dim));
}

StatusOr<ValueId> RecordingBuilder::HostConstant(const std::vector<int64_t>& values,
                                                 const std::vector<int64_t>& shape, int dtype) {
  steps_.push_back("host constant " + ShapeString(values) + " " + DataTypeName(dtype));
  return Add({std::nullopt, shape, dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::Broadcast(ValueId host_value, const Mesh& mesh) {
  Layout layout = Layout::Replicated(mesh, static_cast<int>(values_[host_value].shape.size()));
  steps_.push_back("broadcast " + Describe(host_value) + " -> " + layout.ShortString());
  return Add({layout, values_[host_value].shape, values_[host_value].dtype, std::nullopt});
}

StatusOr<ValueId> RecordingBuilder::MoveToMesh(ValueId value, const Mesh& mesh) {
  TFD_ASSIGN_OR_RETURN(Layout layout, LayoutOf(value, "move to another mesh"));
  return Record(value,
                MoveToMeshStep(layout, mesh, static_cast<int>(values_[value].shape.size())));
}

}  // namespace tf_dtensor
