// tf.function control flow inside an expansion: calls of other functions (expanded with
// the layouts of their arguments, and cached), If (both branches asked for the
// then-branch's result layouts) and While (loop variables keep their entry layouts).
#include "cc/graph/function_expansion.h"

#include <set>

#include "cc/spmd/relayout.h"
#include "cc/tf/handles.h"

namespace tf_dtensor {

using expansion_internal::EmptyListAttr;
using expansion_internal::IsCall;
using expansion_internal::IsIf;
using expansion_internal::IsWhile;

StatusOr<std::shared_ptr<const ExpandedFunction>> FunctionExpansion::Callee(
    const std::string& name, const std::vector<ValueId>& inputs, const OutputRequest& request,
    bool loop) {
  std::vector<ValueMeta> metas;
  for (ValueId v : inputs) {
    metas.push_back(MetaOf(v));
    // Small integer constants travel with the call: the callee's rules read them as the
    // caller's would (a ScatterNd's shape passed into a cond branch).
    const int dtype = builder_.dtype(v);
    int64_t elements = 1;
    for (int64_t d : builder_.shape(v)) elements *= d;
    if (!loop && (dtype == TF_INT32 || dtype == TF_INT64) && !builder_.resource(v) &&
        elements >= 0 && elements <= kKnownArgumentElements) {
      metas.back().int_value = builder_.IntValue(v);
    }
  }
  return owner_->Expand(context_, name, mesh_, metas, request, policy_, depth_ + 1);
}

Status FunctionExpansion::EmitFunctional(const NodeSpec& node, const std::string& op_type,
                                         const std::vector<TF_Output>& prefix,
                                         const std::vector<ValueId>& inputs, RawAttrs attrs,
                                         const std::vector<ValueMeta>& results, bool copy_attrs,
                                         std::vector<std::shared_ptr<const ExpandedFunction>> bodies) {
  std::vector<TF_Output> flat;
  for (ValueId v : inputs) {
    if (builder_.is_host(v)) {
      flat.push_back(builder_.host(v));
    } else {
      const int n = builder_.layout(v)->mesh().num_local_devices();
      for (int d = 0; d < n; ++d) flat.push_back(builder_.component(v, d));
    }
  }
  std::vector<int> types;
  for (const TF_Output& o : flat) types.push_back(TF_OperationOutputType(o));
  std::vector<int> out_types;
  for (const ValueMeta& m : results) {
    for (int k = 0; k < m.num_flat(); ++k) {
      // A TensorList's metadata rides on a variant, not a resource.
      out_types.push_back(m.resource && m.dtype != TF_VARIANT ? TF_RESOURCE : m.dtype);
    }
  }
  if (IsWhile(op_type)) {
    attrs.emplace_back("T", TypeListAttr(types));
  } else {
    attrs.emplace_back("Tin", TypeListAttr(types));
    attrs.emplace_back("Tout", TypeListAttr(out_types));
  }
  if (!IsCall(op_type)) attrs.emplace_back("output_shapes", EmptyListAttr());
  std::vector<TF_Output> all = prefix;
  all.insert(all.end(), flat.begin(), flat.end());
  LocalOpOptions options;
  options.copy_attrs = copy_attrs;
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       builder_.Emit(op_type, all, options, builder_.host_device(), attrs));
  FunctionalCost& cost = functional_[op];
  cost.alternatives = IsIf(op_type);
  cost.loop = IsWhile(op_type);
  for (const ValueMeta& m : results) {
    for (int k = 0; k < m.num_flat(); ++k) {
      cost.output_devices.push_back(m.layout ? m.layout->mesh().local_devices()[k]
                                             : builder_.host_device());
    }
  }
  for (std::shared_ptr<const ExpandedFunction>& body : bodies) {
    cost.bodies.push_back(&body->cost);
    bodies_.push_back(std::move(body));
  }
  std::vector<ValueId>& outs = outputs_[node.name];
  int next = 0;
  for (const ValueMeta& m : results) {
    if (!m.layout) {
      outs.push_back(builder_.AddHost(TF_Output{op, next++}));
      continue;
    }
    TFD_RETURN_IF_ERROR(m.layout->LocalShape(m.shape, "a result").status());
    std::vector<TF_Output> components;
    for (int d = 0; d < m.layout->mesh().num_local_devices(); ++d) {
      TF_Output o{op, next++};
      if (!m.resource || m.dtype == TF_VARIANT) {
        std::vector<int64_t> local = m.layout->GeometryOfDevice(m.shape, d).shape;
        TF_GraphSetTensorShape(graph_.get(), o, local.data(), static_cast<int>(local.size()),
                               status_);
        TFD_RETURN_IF_ERROR(FromTF(status_, "setting the shape of a result of '" + node.name + "'"));
      }
      components.push_back(o);
    }
    outs.push_back(builder_.AddDTensor(*m.layout, m.shape, m.dtype, m.resource,
                                       std::move(components)));
  }
  return Status::Ok();
}

Status FunctionExpansion::ExpandCall(const NodeSpec& node, const std::string& callee,
                                     const std::vector<ValueId>& inputs) {
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> expanded,
                       Callee(callee, inputs, OutputRequest()));
  callees_[node.name] = expanded;
  builder_.AddCollectives(expanded->collectives, false);
  return EmitFunctional(node, "StatefulPartitionedCall", {}, inputs,
                        {{"f", FunctionAttr(expanded->name)}}, expanded->outputs, false,
                        {expanded});
}

StatusOr<TF_Output> FunctionExpansion::Predicate(const NodeSpec& node, ValueId value) {
  if (builder_.is_host(value)) return builder_.host(value);
  if (!builder_.layout(value)->IsFullyReplicated() || !builder_.shape(value).empty()) {
    return InvalidArgument("The condition of '" + node.name + "' (" + node.op + ") in tf.function '" +
                           function_ + "' must be a replicated scalar; got layout " +
                           builder_.layout(value)->ShortString() + " and shape " +
                           ShapeString(builder_.shape(value)) + ".");
  }
  return builder_.component(value, 0);
}

Status FunctionExpansion::ExpandIf(const NodeSpec& node, const std::vector<ValueId>& inputs) {
  const std::string* then_attr = FindRawAttr(node.attrs, "then_branch");
  const std::string* else_attr = FindRawAttr(node.attrs, "else_branch");
  std::optional<std::string> then_name = then_attr ? FunctionNameOf(*then_attr) : std::nullopt;
  std::optional<std::string> else_name = else_attr ? FunctionNameOf(*else_attr) : std::nullopt;
  if (!then_name || !else_name || inputs.empty()) {
    return Internal("'" + node.name + "' (" + node.op + ") lacks its branches.");
  }
  TFD_ASSIGN_OR_RETURN(TF_Output predicate, Predicate(node, inputs[0]));
  std::vector<ValueId> args(inputs.begin() + 1, inputs.end());
  // Each result takes the then-branch's sharding, plus the else-branch's on axes the
  // then-branch leaves unsharded (as TensorFlow's DTensor merges them: [x,*] and [*,y]
  // give [x,y]); both branches are asked for it, which costs a branch at most a slice
  // where it was less sharded.
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> then_free,
                       Callee(*then_name, args, OutputRequest()));
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> else_free,
                       Callee(*else_name, args, OutputRequest()));
  OutputRequest same;
  for (size_t i = 0; i < then_free->outputs.size(); ++i) {
    std::optional<Layout> merged = then_free->outputs[i].layout;
    const std::optional<Layout>& other =
        i < else_free->outputs.size() ? else_free->outputs[i].layout : std::nullopt;
    if (merged && other && !then_free->outputs[i].resource && merged->mesh() == other->mesh() &&
        merged->rank() == other->rank() && !merged->is_partial() && !other->is_partial() &&
        !merged->HasMultiDimAxis() && !other->HasMultiDimAxis()) {
      std::vector<DimSpec> specs = merged->specs();
      std::set<int> used;
      for (const DimSpec& d : specs) {
        if (d.sharded()) used.insert(d.mesh_dim);
      }
      for (int a = 0; a < merged->rank(); ++a) {
        const DimSpec& e = other->spec(a);
        if (!specs[a].sharded() && e.sharded() && !used.count(e.mesh_dim)) {
          specs[a] = e;
          used.insert(e.mesh_dim);
        }
      }
      merged = merged->WithSpecs(specs);
    }
    same.each.push_back(merged);
  }
  bool then_as_is = true;
  for (size_t i = 0; i < same.each.size(); ++i) {
    then_as_is = then_as_is && same.each[i] == then_free->outputs[i].layout;
  }
  std::shared_ptr<const ExpandedFunction> then_fn = then_free;
  if (!then_as_is) {
    TFD_ASSIGN_OR_RETURN(then_fn, Callee(*then_name, args, same));
  }
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> else_fn,
                       Callee(*else_name, args, same));
  // Both branches' collectives are listed; one branch runs per call.
  builder_.AddCollectives(then_fn->collectives, false, true);
  builder_.AddCollectives(else_fn->collectives, false, true);
  // A list's element value (ResourceInfo::element_value) holds after the If only where both
  // branches leave it.
  std::vector<ValueMeta> results = then_fn->outputs;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].resource || !results[i].resource->element_value) continue;
    const bool same = i < else_fn->outputs.size() && else_fn->outputs[i].resource &&
                      else_fn->outputs[i].resource->element_value ==
                          results[i].resource->element_value;
    if (!same) results[i].resource->element_value.reset();
  }
  return EmitFunctional(node, node.op, {predicate}, args,
                        {{"then_branch", FunctionAttr(then_fn->name)},
                         {"else_branch", FunctionAttr(else_fn->name)}},
                        results, true, {then_fn, else_fn});
}

Status FunctionExpansion::ExpandWhile(const NodeSpec& node, std::vector<ValueId> inputs) {
  const std::string* cond_attr = FindRawAttr(node.attrs, "cond");
  const std::string* body_attr = FindRawAttr(node.attrs, "body");
  std::optional<std::string> cond_name = cond_attr ? FunctionNameOf(*cond_attr) : std::nullopt;
  std::optional<std::string> body_name = body_attr ? FunctionNameOf(*body_attr) : std::nullopt;
  if (!cond_name || !body_name) return Internal("'" + node.name + "' lacks cond or body.");
  // A loop variable that enters less sharded than the body makes it (an accumulator
  // started from zeros, while each step adds a sharded term) takes the body's layout when
  // the entry value reaches it by slicing alone: that is free, and the body then needs no
  // gather at the end of every iteration. So does one that enters as a host value. Repeated
  // while it changes something (a few rounds: each can only add shardings).
  for (int round = 0; round < 3; ++round) {
    const OutputRequest free;  // nothing asked: the layouts the body gives
    TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> natural,
                         Callee(*body_name, inputs, free, /*loop=*/true));
    bool changed = false;
    for (size_t i = 0; i < inputs.size() && i < natural->outputs.size(); ++i) {
      const std::optional<Layout>& entry = builder_.layout(inputs[i]);
      const ValueMeta& out = natural->outputs[i];
      const std::string what =
          "loop variable " + std::to_string(i) + " of '" + node.name + "'";
      if (!entry && out.layout && !out.resource && out.dtype != TF_RESOURCE) {
        // Entered as a host value (zeros made in the function), made a DTensor by the
        // body: it joins the mesh before the loop instead of being gathered to the host
        // at the end of every iteration. Not a plain resource (a dataset iterator): that
        // is one handle, and per-device copies of it as loop variables would each need a
        // Merge and NextIteration colocated with the resource, which TensorFlow cannot do
        // where the copies sit on devices that share no buffers (across clients).
        TFD_ASSIGN_OR_RETURN(ValueId on_mesh,
                             builder_.Broadcast(inputs[i], out.layout->mesh()));
        TFD_ASSIGN_OR_RETURN(inputs[i], Relayout(builder_, on_mesh, *out.layout, what));
        changed = true;
        continue;
      }
      if (!entry || !out.layout || out.resource || *entry == *out.layout ||
          entry->is_partial() || out.layout->is_partial() ||
          entry->mesh() != out.layout->mesh()) {
        continue;
      }
      StatusOr<std::vector<RelayoutStep>> steps =
          PlanRelayout(*entry, *out.layout, builder_.shape(inputs[i]), "a loop variable");
      if (!steps.ok() || steps->empty()) continue;
      bool slices = true;
      for (const RelayoutStep& step : *steps) {
        slices = slices && step.kind == RelayoutStep::Kind::kSlice;
      }
      if (!slices) continue;
      TFD_ASSIGN_OR_RETURN(inputs[i], Relayout(builder_, inputs[i], *out.layout, what));
      changed = true;
    }
    if (!changed) break;
  }
  // Loop variables keep the layouts they enter with (host values stay host values); the
  // body is asked to return them so (a relayout at the end of the body where it would
  // not), which is the fixed point of the loop.
  OutputRequest keep;
  for (ValueId v : inputs) {
    keep.each.push_back(builder_.layout(v));
    keep.host_each.push_back(builder_.is_host(v));
  }
  OutputRequest predicate;
  predicate.host_outputs = true;
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> cond_fn,
                       Callee(*cond_name, inputs, predicate, /*loop=*/true));
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> body_fn,
                       Callee(*body_name, inputs, keep, /*loop=*/true));
  builder_.AddCollectives(cond_fn->collectives, true);
  builder_.AddCollectives(body_fn->collectives, true);
  return EmitFunctional(node, node.op, {}, inputs,
                        {{"cond", FunctionAttr(cond_fn->name)},
                         {"body", FunctionAttr(body_fn->name)}},
                        body_fn->outputs, true, {cond_fn, body_fn});
}

}  // namespace tf_dtensor
