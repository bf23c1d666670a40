// Variable (resource) ops. A DVariable's handle is a scalar DTensor whose components are
// per-device variable handles; it records the layout and global shape of the value:
//   VarHandleOp (layout L requested)  -> each device creates a variable of L's local shape
//   AssignVariableOp(handle, value)    -> value relaid out into L: a DVariable's layout is fixed
//   ReadVariableOp(handle)             -> a DTensor with layout L
//   VariableShape(handle)              -> the GLOBAL shape, a constant, replicated
#include <algorithm>

#include "cc/core/strings.h"
#include "cc/rules/registry.h"
#include "cc/rules/through_value.h"
#include "cc/spmd/lowering.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

StatusOr<ResourceInfo> Resource(const OpContext& ctx) {
  if (ctx.inputs.empty() || !ctx.inputs[0].resource) {
    return InvalidArgument("'" + ctx.op_name + "' needs a DVariable handle as input 0; got " +
                           ctx.Describe(0) + ".");
  }
  return *ctx.inputs[0].resource;
}

class VarHandleRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const AttrValue* shape_attr = ctx.attrs->Find("shape");
    Plan plan;
    plan.outputs = {Layout::Replicated(ctx.mesh, 0)};
    if (!shape_attr || !shape_attr->shape || shape_attr->unknown_rank) return plan;
    const std::vector<int64_t>& shape = *shape_attr->shape;
    Layout value = Layout::Replicated(ctx.mesh, static_cast<int>(shape.size()));
    if (ctx.requested) value = *ctx.requested;
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> local,
                         value.LocalShape(shape, "the variable created by '" + ctx.op_name + "'"));
    // Blocks of an uneven axis differ by device: the one shape attribute leaves it open.
    for (int d = 0; d < value.rank() && !value.is_single_device(); ++d) {
      if (shape[d] >= 0 && shape[d] % value.NumShards(d) != 0) local[d] = -1;
    }
    plan.overrides = {AttrOverride::Shape("shape", local)};
    return plan;
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    const AttrValue* shape_attr = ctx.attrs->Find("shape");
    std::vector<int64_t> shape = shape_attr && shape_attr->shape ? *shape_attr->shape
                                                                 : std::vector<int64_t>{};
    Layout value = ctx.requested ? *ctx.requested
                                 : Layout::Replicated(ctx.mesh, static_cast<int>(shape.size()));
    // Each shard of the value gets its own variable.
    LocalOpOptions options;
    options.overrides = plan.overrides;
    options.distinct_over = value.ShardedMeshDims();
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         builder.LocalOp(ctx.op_name, {}, options, plan.outputs));
    ResourceInfo info{value, shape, ctx.attrs->GetType("dtype").value_or(0)};
    if (static_cast<int>(value.ShardedMeshDims().size()) < ctx.mesh.num_dims()) {
      info.shared_storage = CollectiveLowering::For(ctx.mesh).shares_buffers();
    }
    builder.set_resource(out[0], std::move(info));
    return out;
  }
};

class ReadVariableRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(ResourceInfo resource, Resource(ctx));
    Plan plan;
    plan.inputs = {std::nullopt};
    plan.outputs = {resource.value_layout};
    return plan;
  }
};

class AssignVariableRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(ResourceInfo resource, Resource(ctx));
    const InputInfo& value = ctx.inputs[1];
    // A DVariable's layout is fixed when it is created: a value of another layout (a
    // regular tensor, a Python value, a DTensor laid out otherwise, a Partial sum such as
    // a deferred all-reduce of a gradient) is relaid out into the variable's layout on the
    // way in, eagerly and inside a tf.function alike, as TF's DTensor does (the solver asks
    // for the variable's layout in a function, see Backward, so there it is rarely needed).
    // Inside a tf.function a value's dimension may be unknown (-1): a gradient computed in
    // a while loop's branch over batches of unknown size, [4,-1] for a [4,2] DVariable.
    // Such a value fits; the variable's shape is the value's.
    const bool fits =
        value.shape.size() == resource.value_shape.size() &&
        std::equal(value.shape.begin(), value.shape.end(), resource.value_shape.begin(),
                   [](int64_t a, int64_t b) { return a == b || a < 0 || b < 0; });
    if (!fits && !resource.value_shape.empty()) {
      return InvalidArgument("Cannot " + ctx.op_name + ": the value has shape " +
                             ShapeString(value.shape) + " but the DVariable has shape " +
                             ShapeString(resource.value_shape) + ".");
    }
    Plan plan;
    plan.inputs = {std::nullopt, resource.value_layout};
    return plan;
  }
  // The value should be produced in the variable's layout.
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>&) const override {
    std::vector<std::optional<Layout>> wanted(ctx.inputs.size());
    if (wanted.size() == 2 && ctx.inputs[0].resource) {
      wanted[1] = ctx.inputs[0].resource->value_layout;
    }
    return wanted;
  }
};

// The variable's global shape, as Shape gives a DTensor's: a constant every device holds,
// which the ops it sizes read as one (a gradient's zeros in a while loop, an embedding's
// sparse gradient made dense: ScatterNd's shape).
class VariableShapeRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_RETURN_IF_ERROR(Resource(ctx).status());
    Plan plan;
    plan.inputs = {std::nullopt};
    plan.outputs = {Layout::Replicated(ctx.mesh, 1)};
    return plan;
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan&,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(ResourceInfo resource, Resource(ctx));
    const std::vector<int64_t>& shape = resource.value_shape;
    for (int64_t d : shape) {
      if (d < 0) {
        return Unimplemented("'" + ctx.op_name + "' of a DVariable of unknown shape " +
                             ShapeString(shape) + ": give the variable a fixed shape.");
      }
    }
    TFD_ASSIGN_OR_RETURN(ValueId host,
                         builder.HostConstant(shape, {static_cast<int64_t>(shape.size())},
                                              ctx.attrs->GetType("out_type").value_or(TF_INT32)));
    TFD_ASSIGN_OR_RETURN(ValueId out, builder.Broadcast(host, ctx.mesh));
    return std::vector<ValueId>{out};
  }
};

// Per-component ops on handles that produce replicated (or no) outputs.
class HandleRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    return plan;
  }
};

// v.scatter_nd_*(indices, updates) as TensorScatter*(read(v), indices, updates), written
// back (through_value.h).
std::shared_ptr<const Rule> ScatterNdThrough(const std::string& functional) {
  return ThroughValue({functional, {"T", "Tindices", "bad_indices_policy"}, /*writes=*/true});
}

// Variable ops only hold or move blocks: a value over several mesh dimensions per axis
// ([x+y,*]) is theirs as it is.
const RuleTraits kVariable = Traits().MultiDimAxes();

const bool kRegistered = RegisterRules({
    {"AssignAddVariableOp", std::make_shared<AssignVariableRule>(), kVariable},
    {"AssignSubVariableOp", std::make_shared<AssignVariableRule>(), kVariable},
    {"AssignVariableOp", std::make_shared<AssignVariableRule>(), kVariable},
    {"DestroyResourceOp", std::make_shared<HandleRule>(), kVariable},
    {"DisableCopyOnRead", std::make_shared<HandleRule>(), kVariable},
    {"ReadVariableOp", std::make_shared<ReadVariableRule>(), kVariable},
    {"ResourceGatherNd",
     ThroughValue({"GatherNd", {"Tparams", "Tindices"}, /*writes=*/false, {"Tparams", "dtype"}}),
     kVariable},
    {"ResourceScatterNdAdd", ScatterNdThrough("TensorScatterAdd"), kVariable},
    {"ResourceScatterNdMax", ScatterNdThrough("TensorScatterMax"), kVariable},
    {"ResourceScatterNdMin", ScatterNdThrough("TensorScatterMin"), kVariable},
    {"ResourceScatterNdSub", ScatterNdThrough("TensorScatterSub"), kVariable},
    {"ResourceScatterNdUpdate", ScatterNdThrough("TensorScatterUpdate"), kVariable},
    {"ResourceStridedSliceAssign",
     ThroughValue({"TensorStridedSliceUpdate",
                   {"T", "Index", "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                    "shrink_axis_mask"},
                   /*writes=*/true}),
     Traits().MultiDimAxes().Host(1, 3, HostValue::kBounds)},
    {"VarHandleOp", std::make_shared<VarHandleRule>(), Traits().MultiDimAxes().ReadsRequest()},
    {"VarIsInitializedOp", std::make_shared<HandleRule>(), kVariable},
    {"VariableShape", std::make_shared<VariableShapeRule>(), kVariable},
});

}  // namespace
}  // namespace tf_dtensor
