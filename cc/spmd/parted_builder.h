// PartedBuilder: runs an op on parted inputs part by part.
//
// TF DTensor's parted layout keeps a tensor's shards as independent tensors: an op on
// them runs on each device's part and nothing combines the parts. The rule of the op
// plans as for static layouts, and this decorator of the real builder changes what the
// plan's collectives do:
//   AllReduce: the identity (each device keeps its own partial result);
//   AllGather: the axis becomes unsharded without moving data (each part stands alone,
//     so its global shape is its own shape);
//   LocalOp:   every device computes its own output (parts differ even where the layout
//     says replicated), never sharing another device's result.
// Values not made from parts (a static input, a host constant) get the real collectives.
// Slicing a part further would need each device to cut its own part, which the builder
// cannot express: it is refused with a message naming the fix.
#ifndef TF_DTENSOR_CC_SPMD_PARTED_BUILDER_H_
#define TF_DTENSOR_CC_SPMD_PARTED_BUILDER_H_

#include <set>
#include <utility>
#include <vector>

#include "cc/spmd/builder.h"

namespace tf_dtensor {

class PartedBuilder : public Builder {
 public:
  // `parted`: the values that are parts (the parted inputs).
  PartedBuilder(Builder& inner, Mesh mesh, std::set<ValueId> parted)
      : inner_(inner), mesh_(std::move(mesh)), parted_(std::move(parted)) {}

  void SetInputs(std::vector<ValueId> inputs) override { inner_.SetInputs(std::move(inputs)); }
  std::optional<std::vector<int64_t>> IntValue(ValueId value) override {
    return inner_.IntValue(value);
  }
  int num_inputs() const override { return inner_.num_inputs(); }
  ValueId input(int index) const override { return inner_.input(index); }
  const std::optional<Layout>& layout(ValueId value) const override {
    return inner_.layout(value);
  }
  const std::vector<int64_t>& shape(ValueId value) const override { return inner_.shape(value); }
  int dtype(ValueId value) const override { return inner_.dtype(value); }
  const std::optional<ResourceInfo>& resource(ValueId value) const override {
    return inner_.resource(value);
  }
  void set_resource(ValueId value, ResourceInfo info) override {
    inner_.set_resource(value, std::move(info));
  }

  StatusOr<std::vector<ValueId>> LocalOp(const std::string& op_name,
                                         const std::vector<ValueId>& inputs,
                                         const LocalOpOptions& options,
                                         const std::vector<Layout>& out_layouts) override {
    bool from_parts = false;
    for (ValueId v : inputs) from_parts = from_parts || parted_.count(v) > 0;
    if (!from_parts) return inner_.LocalOp(op_name, inputs, options, out_layouts);
    LocalOpOptions per_part = options;
    per_part.run_once = false;
    for (int d = 0; d < mesh_.num_dims(); ++d) per_part.distinct_over.push_back(d);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         inner_.LocalOp(op_name, inputs, per_part, out_layouts));
    parted_.insert(out.begin(), out.end());
    return out;
  }
  StatusOr<ValueId> AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override {
    if (!parted_.count(value)) return inner_.AllReduce(value, mesh_dims, op);
    return value;
  }
  StatusOr<ValueId> ToPartial(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override {
    return inner_.ToPartial(value, mesh_dims, op);
  }
  StatusOr<ValueId> AllGather(ValueId value, int dim) override {
    if (!parted_.count(value)) return inner_.AllGather(value, dim);
    std::vector<DimSpec> specs = layout(value)->specs();
    specs[dim] = DimSpec::Replicated();
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype(value))};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         LocalOp("Identity", {value}, options, {layout(value)->WithSpecs(specs)}));
    return out[0];
  }
  StatusOr<ValueId> Slice(ValueId value, int dim, int mesh_dim) override {
    if (parted_.count(value)) {
      return Unimplemented(
          "This op would shard axis " + std::to_string(dim) + " of a parted tensor (layout " +
          layout(value)->ToParted().value().ShortString() +
          ") further, cutting each part; parts are not resharded. Relayout the other inputs "
          "to match the parted one, or relayout it to a static layout first.");
    }
    return inner_.Slice(value, dim, mesh_dim);
  }
  StatusOr<ValueId> SliceMayBroadcast(ValueId value, int dim, const DimSpec& spec) override {
    if (parted_.count(value) || spec.multi()) return Builder::SliceMayBroadcast(value, dim, spec);
    return inner_.SliceMayBroadcast(value, dim, spec);
  }
  StatusOr<ValueId> HostConstant(const std::vector<int64_t>& values,
                                 const std::vector<int64_t>& shape, int dtype) override {
    return inner_.HostConstant(values, shape, dtype);
  }
  StatusOr<ValueId> Broadcast(ValueId host_value, const Mesh& mesh) override {
    return inner_.Broadcast(host_value, mesh);
  }
  StatusOr<ValueId> MoveToMesh(ValueId value, const Mesh& mesh) override {
    return inner_.MoveToMesh(value, mesh);
  }

 private:
  Builder& inner_;
  Mesh mesh_;
  std::set<ValueId> parted_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_PARTED_BUILDER_H_
