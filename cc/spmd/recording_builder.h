// RecordingBuilder: a Builder that runs nothing. It tracks the layout, global shape and
// dtype of every value and records each step as one readable line, so a test (or
// `debug.explain`) shows a rule's or a relayout's SPMD program without running it:
//   local MatMul [x,*] [*,*] -> [x,*]
//   all-reduce(sum) [*,*] over x
//   all-gather axis 0 [x,*] -> [*,*]
//   slice axis 1 over y [*,*] -> [*,y]
//   all-to-all axis 0 -> 1 [x,*] -> [*,x]
//   move [*,*] @ mesh(x=2) -> [*,*] @ mesh(y=2)
//   host constant [2, 4] int32
//   broadcast host [2] -> [*] @ mesh(x=2)
// Collectives are recorded as the relayout planner writes its steps (RelayoutStep, whose
// layouts it also takes), so a planned relayout and its emission read the same. Misuse
// (gathering an unsharded axis, slicing over a mesh dimension in use) fails with an
// Internal status, so a rule that asks for an impossible step fails its test.
#ifndef TF_DTENSOR_CC_SPMD_RECORDING_BUILDER_H_
#define TF_DTENSOR_CC_SPMD_RECORDING_BUILDER_H_

#include <optional>
#include <string>
#include <vector>

#include "cc/spmd/builder.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {

class RecordingBuilder : public Builder {
 public:
  // Adds an input of the op being expanded (a host value when `layout` is nullopt).
  ValueId AddInput(std::optional<Layout> layout, std::vector<int64_t> shape, int dtype);
  // Global shapes that LocalOp gives its outputs, in order; outputs past them get [].
  void set_output_shapes(std::vector<std::vector<int64_t>> shapes) {
    output_shapes_ = std::move(shapes);
  }
  // The recorded steps, in order.
  const std::vector<std::string>& steps() const { return steps_; }

  void SetInputs(std::vector<ValueId> inputs) override { inputs_ = std::move(inputs); }
  // Host values are described to rules through OpContext in these tests.
  std::optional<std::vector<int64_t>> IntValue(ValueId) override { return std::nullopt; }
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
  // Recorded as one step, as the relayout plan asks for it.
  StatusOr<ValueId> ReduceScatter(ValueId value, int dim, int mesh_dim, ReduceOp op) override;
  StatusOr<ValueId> ToPartial(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override;
  StatusOr<ValueId> AllGather(ValueId value, int dim) override;
  StatusOr<ValueId> Slice(ValueId value, int dim, int mesh_dim) override;
  // Also over several mesh dimensions ([*] -> [x+y]), as one step.
  StatusOr<ValueId> SliceOver(ValueId value, int dim, const DimSpec& spec) override;
  // Recorded as one exchange, the step the relayout plan asks for (the runtime builders
  // may carry it out as gather + slice).
  StatusOr<ValueId> AllToAll(ValueId value, int from_dim, int to_dim) override;
  StatusOr<ValueId> HostConstant(const std::vector<int64_t>& values,
                                 const std::vector<int64_t>& shape, int dtype) override;
  StatusOr<ValueId> Broadcast(ValueId host_value, const Mesh& mesh) override;
  StatusOr<ValueId> MoveToMesh(ValueId value, const Mesh& mesh) override;

 private:
  struct Value {
    std::optional<Layout> layout;
    std::vector<int64_t> shape;
    int dtype = 0;
    std::optional<ResourceInfo> resource;
  };
  ValueId Add(Value value);
  // "[x,*]" for a value on the builder's mesh, "host [2]" for a host value.
  std::string Describe(ValueId value) const;
  // Records `step` (made from the layout of `value`) and adds its result.
  StatusOr<ValueId> Record(ValueId value, StatusOr<RelayoutStep> step);
  // The layout of `value`, or an Internal error naming `step` for a host value.
  StatusOr<Layout> LayoutOf(ValueId value, const char* step) const;

  std::vector<Value> values_;
  std::vector<ValueId> inputs_;
  std::vector<std::vector<int64_t>> output_shapes_;
  std::vector<std::string> steps_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_RECORDING_BUILDER_H_
