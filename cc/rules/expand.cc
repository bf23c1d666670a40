#include "cc/rules/expand.h"

#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

StatusOr<std::vector<ValueId>> PrepareInputs(const OpContext& ctx, const Plan& plan,
                                             Builder& builder) {
  std::vector<ValueId> inputs;
  for (int i = 0; i < builder.num_inputs(); ++i) {
    auto host = plan.host_inputs.find(i);
    if (host != plan.host_inputs.end()) {
      int dtype = ctx.inputs[i].dtype;
      std::vector<int64_t> shape = {static_cast<int64_t>(host->second.size())};
      TFD_ASSIGN_OR_RETURN(ValueId v, builder.HostConstant(host->second, shape, dtype));
      inputs.push_back(v);
    } else if (i < static_cast<int>(plan.inputs.size()) && plan.inputs[i] &&
               builder.layout(builder.input(i)) != plan.inputs[i]) {
      // The description is formatted only when a relayout is needed (the common case
      // is an input already in its planned layout).
      TFD_ASSIGN_OR_RETURN(ValueId v,
                           Relayout(builder, builder.input(i), *plan.inputs[i], ctx.Describe(i)));
      inputs.push_back(v);
    } else {
      inputs.push_back(builder.input(i));
    }
  }
  return inputs;
}

StatusOr<std::vector<ValueId>> ExpandDefault(const OpContext& ctx, const Plan& plan,
                                             Builder& builder) {
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
  LocalOpOptions options;
  options.overrides = plan.overrides;
  return ExpandWithInputs(ctx, plan, inputs, options, builder);
}

StatusOr<std::vector<ValueId>> ExpandWithInputs(const OpContext& ctx, const Plan& plan,
                                                const std::vector<ValueId>& inputs,
                                                const LocalOpOptions& options, Builder& builder) {
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> outputs,
                       builder.LocalOp(ctx.op_name, inputs, options, plan.outputs));
  for (size_t o = 0; o < outputs.size() && o < plan.partial_dims.size(); ++o) {
    if (plan.partial_dims[o].empty()) continue;
    // Deferred (PlanOp put the pending reductions in the output layout): nothing to do.
    bool deferred = true;
    for (int d : plan.partial_dims[o]) {
      bool found = false;
      for (const PartialSpec& p : builder.layout(outputs[o])->partial()) found = found || p.mesh_dim == d;
      deferred = deferred && found;
    }
    if (deferred) continue;
    TFD_ASSIGN_OR_RETURN(outputs[o],
                         builder.AllReduce(outputs[o], plan.partial_dims[o], plan.partial_op));
  }
  return outputs;
}

StatusOr<ValueId> PerDeviceEntry(Builder& builder, const Mesh& mesh,
                                 const std::vector<int64_t>& values, int mesh_dim, int dtype,
                                 bool as_scalar) {
  // A replicated vector sliced over the mesh dimension, then reshaped to a scalar.
  TFD_ASSIGN_OR_RETURN(ValueId host, builder.HostConstant(
                                         values, {static_cast<int64_t>(values.size())}, dtype));
  TFD_ASSIGN_OR_RETURN(ValueId all, builder.Broadcast(host, mesh));
  TFD_ASSIGN_OR_RETURN(ValueId piece, builder.Slice(all, 0, mesh_dim));
  if (!as_scalar) return piece;
  TFD_ASSIGN_OR_RETURN(ValueId scalar_shape, builder.HostConstant({}, {0}, TF_INT32));
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT32)};
  options.distinct_over = {mesh_dim};
  return builder.LocalOpValue("Reshape", {piece, scalar_shape}, options,
                              Layout::Replicated(mesh, 0));
}

}  // namespace tf_dtensor
