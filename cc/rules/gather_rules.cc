// Indexing with integer tensors: gathers, one-hot encodings and segment sums.
//   gather(params [V,D] [*,y], indices [B] [x]) -> [x,y]   (every device holds whole rows)
//   gather(params [x,*], ...) -> gather axis 0 of params first
//   one_hot(indices [x], depth) -> [x,*]                  (the new axis is unsharded)
//   unsorted_segment_sum(data [x,y], ids [x], n) -> partial(x) -> all-reduce -> [*,y]
// An index axis that would share a mesh dimension with a params axis is gathered (indices
// are small).
#include "cc/core/strings.h"
#include "cc/propagation/merge.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// GatherV2(params, indices, axis) with attribute batch_dims, and Gather(params, indices)
// (axis 0). Output: params[:axis] + indices[batch_dims:] + params[axis+1:].
class GatherRule : public Rule {
 public:
  explicit GatherRule(bool has_axis) : has_axis_(has_axis) {}

  bool IsHostArgument(int input, int) const override { return has_axis_ && input == 2; }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& params = ctx.layout(0);
    const Layout& indices = ctx.layout(1);
    int64_t axis = 0;
    if (has_axis_) {
      TFD_ASSIGN_OR_RETURN(std::vector<int64_t> value, ctx.IntValue(2, "axis"));
      if (value.size() != 1) return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis.");
      axis = value[0];
    }
    int64_t batch_dims = ctx.attrs->GetInt("batch_dims", 0);
    if (batch_dims < 0) batch_dims += indices.rank();
    if (axis < 0) axis += params.rank();
    if (axis < 0 || axis >= params.rank() || batch_dims < 0 || batch_dims > axis ||
        batch_dims > indices.rank()) {
      return InvalidArgument("'" + ctx.op_name + "' got axis " + std::to_string(axis) +
                             " and batch_dims " + std::to_string(batch_dims) + " for " +
                             ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
    }
    // Every device reads whole rows along the gathered axis.
    std::vector<DimSpec> p = params.specs();
    p[axis] = DimSpec::Replicated();
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    for (const DimSpec& s : p) {
      if (s.sharded()) used[s.mesh_dim] = true;
    }
    std::vector<DimSpec> i = indices.specs();
    for (int d = 0; d < indices.rank(); ++d) {
      if (d < batch_dims) {
        // Batch axes are shared: the params' sharding, else the indices' when it is free.
        if (p[d].sharded() || (i[d].sharded() && used[i[d].mesh_dim])) {
          i[d] = p[d];
        } else if (i[d].sharded()) {
          p[d] = i[d];
          used[i[d].mesh_dim] = true;
        }
        continue;
      }
      if (!i[d].sharded()) continue;
      if (used[i[d].mesh_dim]) {
        i[d] = DimSpec::Replicated();
      } else {
        used[i[d].mesh_dim] = true;
      }
    }
    std::vector<DimSpec> out(p.begin(), p.begin() + axis);
    out.insert(out.end(), i.begin() + batch_dims, i.end());
    out.insert(out.end(), p.begin() + axis + 1, p.end());
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    plan.inputs[0] = params.WithSpecs(p);
    plan.inputs[1] = indices.WithSpecs(i);
    plan.outputs = {params.WithSpecs(out)};
    return plan;
  }

 private:
  bool has_axis_;
};

// OneHot(indices, depth, on_value, off_value), attribute axis (-1: last): the indices'
// axes keep their sharding and the new axis is unsharded.
class OneHotRule : public Rule {
 public:
  bool IsHostArgument(int input, int) const override { return input == 1; }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& indices = ctx.layout(0);
    int64_t axis = ctx.attrs->GetInt("axis", -1);
    if (axis == -1) axis = indices.rank();
    if (axis < 0 || axis > indices.rank()) {
      return InvalidArgument("'OneHot' axis " + std::to_string(axis) + " is out of range for " +
                             ctx.Describe(0) + ".");
    }
    std::vector<DimSpec> out = indices.specs();
    out.insert(out.begin() + axis, DimSpec::Replicated());
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    plan.inputs[0] = indices;
    plan.outputs = {indices.WithSpecs(out)};
    return plan;
  }
};

// UnsortedSegmentSum/Max/Min/Prod(data, segment_ids, num_segments): the segment-id axes
// (data's leading axes) may be sharded; each device then combines its own rows into
// partial segments, and the partials are all-reduced. Data's other axes keep their
// sharding.
class SegmentReduceRule : public Rule {
 public:
  explicit SegmentReduceRule(ReduceOp op) : op_(op) {}

  bool IsHostArgument(int input, int) const override { return input == 2; }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& data = ctx.layout(0);
    const Layout& ids = ctx.layout(1);
    const int k = ids.rank();
    if (k > data.rank()) {
      return InvalidArgument("'" + ctx.op_name + "' needs segment ids whose shape prefixes the "
                             "data's; got " + ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
    }
    std::vector<bool> used(ctx.mesh.num_dims(), false);
    std::vector<DimSpec> trailing(data.specs().begin() + k, data.specs().end());
    for (const DimSpec& s : trailing) {
      if (s.sharded()) used[s.mesh_dim] = true;
    }
    Layout data_ids = data.WithSpecs({data.specs().begin(), data.specs().begin() + k});
    std::vector<DimSpec> leading = MergeAligned({&data_ids, &ids}, k, {}, &used);
    std::vector<int> partial;
    for (const DimSpec& s : leading) {
      if (s.sharded()) partial.push_back(s.mesh_dim);
    }
    std::vector<DimSpec> data_specs = leading;
    data_specs.insert(data_specs.end(), trailing.begin(), trailing.end());
    std::vector<DimSpec> out = {DimSpec::Replicated()};
    out.insert(out.end(), trailing.begin(), trailing.end());
    Plan plan;
    plan.inputs = {data.WithSpecs(data_specs), ids.WithSpecs(leading), std::nullopt};
    plan.outputs = {data.WithSpecs(out)};
    plan.partial_dims = {partial};
    plan.partial_op = op_;
    return plan;
  }

 private:
  ReduceOp op_;
};

const bool kRegistered = RegisterRules({
    {"Gather", std::make_shared<GatherRule>(/*has_axis=*/false)},
    {"GatherV2", std::make_shared<GatherRule>(/*has_axis=*/true)},
    {"OneHot", std::make_shared<OneHotRule>()},
    {"UnsortedSegmentMax", std::make_shared<SegmentReduceRule>(ReduceOp::kMax)},
    {"UnsortedSegmentMin", std::make_shared<SegmentReduceRule>(ReduceOp::kMin)},
    {"UnsortedSegmentProd", std::make_shared<SegmentReduceRule>(ReduceOp::kProd)},
    {"UnsortedSegmentSum", std::make_shared<SegmentReduceRule>(ReduceOp::kSum)},
});

}  // namespace
}  // namespace tf_dtensor
