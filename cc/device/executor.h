// The eager Builder: carries out an SPMD program at once on the mesh's devices.
//
// Each step runs on the calling thread, one TFE op per distinct shard. On meshes of
// virtual CPUs the devices that hold the same shard share one result buffer, so a
// replicated op runs once rather than once per device (TF's DTensor runs it on every
// device, each from its own executor thread).
#ifndef TF_DTENSOR_CC_DEVICE_EXECUTOR_H_
#define TF_DTENSOR_CC_DEVICE_EXECUTOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cc/device/tensor_with_layout.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

// Converts a failed TF_Status into our Status, with context.
Status FromTF(TF_Status* status, const std::string& context);

class EagerBuilder : public Builder {
 public:
  // `attrs` are the attributes of the op being expanded (copied into local ops).
  EagerBuilder(TFE_Context* context, Mesh mesh, const TFE_OpAttrs* attrs, int max_outputs);
  ~EagerBuilder() override;

  // Inputs, borrowed for the builder's lifetime.
  ValueId AddInput(const TensorWithLayout* tensor);
  ValueId AddHostInput(TFE_TensorHandle* handle, std::vector<int64_t> shape, TF_DataType dtype);
  // Marks a value as program input `index` (inputs are added in op order).
  void SetInputs(std::vector<ValueId> inputs) { inputs_ = std::move(inputs); }
  // Hands a DTensor value over as a new record (sharing buffers with the builder's).
  StatusOr<std::unique_ptr<TensorWithLayout>> Release(ValueId value);
  // Whether the value is a host (non-DTensor) tensor and its handle.
  TFE_TensorHandle* host_handle(ValueId value) const { return values_[value].host; }

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

 private:
  struct Value {
    std::optional<Layout> layout;
    std::vector<int64_t> shape;
    int dtype = 0;
    std::vector<TFE_TensorHandle*> handles;  // per local device, for DTensor values
    TFE_TensorHandle* host = nullptr;        // for host values
    bool owned = false;
    std::optional<ResourceInfo> resource;
  };

  // Devices that compute: leader[d] is the device whose result device d shares. Devices
  // share when they agree on the coordinates along `key_dims` (and memory is shared).
  std::vector<int> Leaders(const std::vector<int>& key_dims) const;
  // Whether local devices a and b sit at the same coordinates along `mesh_dims`.
  bool SameCoords(int a, int b, const std::vector<int>& mesh_dims) const;
  // Runs one TFE op on local device `device`; returns its outputs.
  StatusOr<std::vector<TFE_TensorHandle*>> Run(const std::string& op_name,
                                               const std::vector<TFE_TensorHandle*>& inputs,
                                               const LocalOpOptions& options, int device,
                                               int num_outputs);
  // Fills device d's slot from its leader: shares the buffer, or copies it across devices.
  StatusOr<TFE_TensorHandle*> FromLeader(TFE_TensorHandle* leader_handle, int device);
  ValueId AddOwned(Value value);

  struct OpDeleter {
    void operator()(TFE_Op* op) const { TFE_DeleteOp(op); }
  };

  TFE_Context* context_;
  Mesh mesh_;
  std::unique_ptr<TFE_Op, OpDeleter> op_;
  const TFE_OpAttrs* attrs_;
  int max_outputs_;
  TF_Status* status_;
  std::vector<Value> values_;
  std::vector<ValueId> inputs_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_DEVICE_EXECUTOR_H_
