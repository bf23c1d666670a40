// Ops of a tf.function body that run on the host inside an expansion: once (a side effect,
// or an op on a plain variable, its DTensor inputs made whole first), or, for a lookup in a
// host table with keys on the mesh, once per device on that device's keys.
#include "cc/graph/function_expansion.h"

#include "cc/core/layout.h"
#include "cc/graph/graph_builder.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {

Status FunctionExpansion::EmitOnceOnHost(const NodeSpec& node, std::vector<ValueId> inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueId v = inputs[i];
    if (builder_.is_host(v)) continue;
    const std::string what = "input " + std::to_string(i) + " of '" + node.name + "' (" +
                             node.op + ", run once on the host)";
    if (builder_.resource(v)) {
      return InvalidArgument(
          "'" + node.name + "' (" + node.op + ") of tf.function '" + function_ + "' runs once, "
          "where a plain tf.Variable it takes lives, or as a side effect of the host, but " +
          what + " is a DVariable (" + builder_.resource(v)->value_layout.ShortString() +
          "), whose value lives on the mesh. Make a plain variable it takes a DVariable "
          "(`dtensor.DVariable(dtensor.copy_to_mesh(value, layout))`), or pass the "
          "DVariable's value (`v.read_value()`).");
    }
    // Whole, as eagerly TensorFlow copies a replicated DTensor to the variable's device:
    // a sharded value is gathered, a pending sum reduced. The first device's block is it.
    const Layout whole = Layout::Replicated(builder_.layout(v)->mesh(),
                                            builder_.layout(v)->rank());
    TFD_ASSIGN_OR_RETURN(ValueId replicated, Relayout(builder_, v, whole, what));
    inputs[i] = builder_.AddHost(builder_.component(replicated, 0));
  }
  return EmitHostOp(node, inputs);
}

StatusOr<bool> FunctionExpansion::EmitLookupPerDevice(const NodeSpec& node,
                                                      const std::vector<ValueId>& inputs) {
  if ((node.op != "LookupTableFindV2" && node.op != "LookupTableFind") || inputs.size() != 3) {
    return false;
  }
  const ValueId table = inputs[0];
  const ValueId keys = inputs[1];
  const ValueId fallback = inputs[2];
  if (!builder_.is_host(table) || builder_.dtype(table) != TF_RESOURCE ||
      builder_.is_host(keys) || builder_.resource(keys) || !builder_.is_host(fallback) ||
      builder_.rank_unknown(fallback)) {
    return false;
  }
  if (builder_.layout(keys)->type() != LayoutType::kStatic) return false;
  // Keys are looked up as they are: a pending sum of integer keys is reduced first.
  ValueId blocks = keys;
  if (builder_.layout(keys)->is_partial()) {
    TFD_ASSIGN_OR_RETURN(blocks, Relayout(builder_, keys, builder_.layout(keys)->WithoutPartial(),
                                          "input 1 of '" + node.name + "' (" + node.op +
                                              ", the keys of a lookup)"));
  }
  const Layout key_layout = *builder_.layout(blocks);
  // [k0, k1] keys, a default value of shape [v] -> values [k0, k1, v]: the keys' specs,
  // then the value's axes replicated.
  std::vector<DimSpec> specs = key_layout.specs();
  std::vector<int64_t> shape = builder_.shape(blocks);
  const std::vector<int64_t> value_shape = builder_.shape(fallback);
  for (int64_t s : value_shape) {
    specs.push_back(DimSpec::Replicated());
    shape.push_back(s);
  }
  TFD_ASSIGN_OR_RETURN(Layout out_layout,
                       Layout::FromSpecs(specs, key_layout.mesh(), key_layout.type()));
  bool known = true;
  for (int64_t s : shape) known = known && s >= 0;
  const Mesh& mesh = key_layout.mesh();
  std::vector<TF_Output> components;
  for (int d = 0; d < mesh.num_local_devices(); ++d) {
    // The lookup runs where the table lives (the placer finds it); its result joins the
    // device's block.
    TFD_ASSIGN_OR_RETURN(
        TF_Operation * lookup,
        builder_.Emit(node.op,
                      {builder_.host(table), builder_.component(blocks, d),
                       builder_.host(fallback)},
                      LocalOpOptions{}, std::string()));
    // TF infers no shape for the lookup (the table's handle data is missing): the block's
    // shape, where it is known, is set and checked by EnsureShape.
    LocalOpOptions to_device;
    to_device.copy_attrs = false;
    if (known) {
      to_device.overrides = {
          AttrOverride::Shape("shape", out_layout.GeometryOfDevice(shape, d).shape),
          AttrOverride::Type("T", TF_OperationOutputType(TF_Output{lookup, 0}))};
    }
    TFD_ASSIGN_OR_RETURN(TF_Operation * on_device,
                         builder_.Emit(known ? "EnsureShape" : "Identity",
                                       {TF_Output{lookup, 0}}, to_device,
                                       mesh.local_devices()[d]));
    components.push_back(TF_Output{on_device, 0});
  }
  outputs_[node.name].push_back(builder_.AddDTensor(out_layout, shape,
                                                    TF_OperationOutputType(components[0]),
                                                    std::nullopt, components));
  return true;
}

Status FunctionExpansion::EmitHostOp(const NodeSpec& node, const std::vector<ValueId>& inputs) {
  std::vector<TF_Output> flat;
  bool uses_resource = false;
  for (ValueId v : inputs) {
    flat.push_back(builder_.host(v));
    uses_resource = uses_resource || builder_.dtype(v) == TF_RESOURCE;
  }
  LocalOpOptions options;
  // Ops on a plain resource run where the resource lives; the placer finds it.
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       uses_resource ? builder_.Emit(node.op, flat, options, std::string())
                                     : builder_.EmitOnHost(node.op, flat, options));
  std::vector<ValueId>& outs = outputs_[node.name];
  for (int i = 0; i < TF_OperationNumOutputs(op); ++i) {
    outs.push_back(builder_.AddHost(TF_Output{op, i}));
  }
  return Status::Ok();
}

}  // namespace tf_dtensor
