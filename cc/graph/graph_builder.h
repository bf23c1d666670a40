// The graph Builder: writes an SPMD program as nodes of a TF_Graph.
//
// The same rules that drive the eager executor drive this builder, so a tf.function runs
// exactly the local ops, collectives and relayouts its ops would run eagerly; only here
// they become one multi-device function. Each node is placed on its mesh device. On
// meshes of virtual CPUs a value that is the same on several devices (a replicated
// value, or a shard two devices share) is computed once and its one output feeds every
// device, as in the eager executor.
#ifndef TF_DTENSOR_CC_GRAPH_GRAPH_BUILDER_H_
#define TF_DTENSOR_CC_GRAPH_GRAPH_BUILDER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cc/graph/function_def.h"
#include "cc/spmd/builder.h"
#include "tensorflow/c/c_api.h"

namespace tf_dtensor {

class GraphBuilder : public Builder {
 public:
  GraphBuilder(TF_Graph* graph, Mesh mesh);
  ~GraphBuilder() override;

  const Mesh& mesh() const { return mesh_; }
  TF_Graph* graph() const { return graph_; }
  // The device of host values (shapes, constants): the host CPU of the mesh.
  const std::string& host_device() const { return host_device_; }

  // Program values.
  ValueId AddDTensor(Layout layout, std::vector<int64_t> shape, int dtype,
                     std::optional<ResourceInfo> resource, std::vector<TF_Output> components);
  ValueId AddHost(TF_Output output);
  bool is_host(ValueId value) const { return !values_[value].layout; }
  TF_Output host(ValueId value) const { return values_[value].host; }
  TF_Output component(ValueId value, int device) const { return values_[value].outputs[device]; }
  // The value of a small integer host or replicated value, when the graph determines it.
  std::optional<std::vector<int64_t>> IntValue(ValueId value);

  // The node being expanded: its attributes are what `copy_attrs` copies, and every op
  // created until the next BeginNode waits for `control_inputs`.
  void BeginNode(const std::string& name, const std::string& op, const RawAttrs* attrs,
                 std::vector<TF_Operation*> control_inputs);
  // The ops created since BeginNode.
  const std::vector<TF_Operation*>& created() const { return created_; }
  void SetInputs(std::vector<ValueId> inputs) { inputs_ = std::move(inputs); }

  // Adds one node; inputs are flat and grouped into the op's list arguments here.
  StatusOr<TF_Operation*> Emit(const std::string& op_type, const std::vector<TF_Output>& inputs,
                               const LocalOpOptions& options, const std::string& device,
                               const RawAttrs& extra_attrs = {});
  // The global shape of a graph tensor as inferred (-1 for unknown dims), or nullopt when
  // even the rank is unknown.
  std::optional<std::vector<int64_t>> InferredShape(TF_Output output) const;
  // The op's definition; nullptr for functions and unknown ops.
  const OpSpec* FindOp(const std::string& op_type);

  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  ValueId input(int index) const override { return inputs_[index]; }
  const std::optional<Layout>& layout(ValueId value) const override {
    return values_[value].layout;
  }
  const std::vector<int64_t>& shape(ValueId value) const override { return values_[value].shape; }
  int dtype(ValueId value) const override { return values_[value].dtype; }
  const std::optional<ResourceInfo>& resource(ValueId value) const override {
    return values_[value].resource;
  }
  void set_resource(ValueId value, ResourceInfo info) override {
    values_[value].resource = std::move(info);
  }

  StatusOr<std::vector<ValueId>> LocalOp(const std::string& op_name,
                                         const std::vector<ValueId>& inputs,
                                         const LocalOpOptions& options,
                                         const std::vector<Layout>& out_layouts) override;
  StatusOr<ValueId> AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override;
  StatusOr<ValueId> AllGather(ValueId value, int dim) override;
  StatusOr<ValueId> Slice(ValueId value, int dim, int mesh_dim) override;
  StatusOr<ValueId> HostConstant(const std::vector<int64_t>& values,
                                 const std::vector<int64_t>& shape, int dtype) override;
  StatusOr<ValueId> Broadcast(ValueId host_value, const Mesh& mesh) override;

  // Places component `device` of a value on that device (an Identity unless it is there).
  StatusOr<TF_Output> OnDevice(ValueId value, int device);

 private:
  struct Value {
    std::optional<Layout> layout;
    std::vector<int64_t> shape;
    int dtype = 0;
    std::vector<TF_Output> outputs;  // per local device, for DTensor values
    TF_Output host{nullptr, 0};      // for host values
    std::optional<ResourceInfo> resource;
    bool int_value_read = false;
    std::optional<std::vector<int64_t>> int_value;
  };

  std::vector<int> Leaders(const std::vector<int>& key_dims) const;
  bool SameCoords(int a, int b, const std::vector<int>& mesh_dims) const;
  StatusOr<TF_Output> FromLeader(TF_Output leader_output, int device);
  StatusOr<std::vector<TF_Output>> Run(const std::string& op_type,
                                       const std::vector<TF_Output>& inputs,
                                       const LocalOpOptions& options, int device);
  ValueId Add(Value value);
  std::string UniqueName(const std::string& op_type);

  TF_Graph* graph_;
  Mesh mesh_;
  std::string host_device_;
  TF_Status* status_;
  std::vector<Value> values_;
  std::vector<ValueId> inputs_;
  std::map<std::string, std::unique_ptr<OpSpec>> op_specs_;
  // The node being expanded.
  std::string node_name_;
  std::string node_op_;
  const RawAttrs* node_attrs_ = nullptr;
  std::optional<AttrMap> node_attr_map_;
  std::vector<TF_Operation*> control_inputs_;
  std::vector<TF_Operation*> created_;
  int counter_ = 0;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_GRAPH_BUILDER_H_
