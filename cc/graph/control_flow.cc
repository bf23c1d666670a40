// tf.function control flow inside an expansion: calls of other functions (expanded with
// the layouts of their arguments, and cached), If and Case (every branch asked for the
// result layouts merged over the branches) and While (loop variables keep their entry
// layouts).
#include "cc/graph/function_expansion.h"

#include <algorithm>
#include <set>

#include "cc/rules/list_elements.h"
#include "cc/spmd/relayout.h"
#include "cc/tf/handles.h"

namespace tf_dtensor {

using expansion_internal::EmptyListAttr;
using expansion_internal::IsBranching;
using expansion_internal::IsCall;
using expansion_internal::IsCase;
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
  return owner_->Expand(context_, name, mesh_, metas, request, policy_, depth_ + 1,
                        xla_compile_);
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
  if (!IsCall(op_type)) {
    attrs.emplace_back("output_shapes", EmptyListAttr());
    // Lowered to Switch/Merge frames in the SPMD function, always. The op sits on the
    // host CPU and its branches or body hold every device's ops; TensorFlow runs a
    // functional If, Case or While that stays one op by calling its functions as
    // multi-device functions of their own, where collective ops of the `ops` lowering
    // (CollectiveReduceV2, ...) were seen to fail (a cond: "BufRendezvous::ProvideBuf
    // already called") or to hang for good (a loop). tf.function(jit_compile=True) traces
    // its control flow without the attribute (it expects XLA to compile the op whole,
    // which cannot span the mesh's devices); a plain tf.function sets it.
    attrs.emplace_back("_lower_using_switch_merge", BoolAttr(true));
  }
  std::vector<TF_Output> all = prefix;
  all.insert(all.end(), flat.begin(), flat.end());
  LocalOpOptions options;
  options.copy_attrs = copy_attrs;
  TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                       builder_.EmitOnHost(op_type, all, options, attrs));
  FunctionalCost& cost = functional_[op];
  cost.alternatives = IsBranching(op_type);
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
      // A plain variable's handle that a loop passes through keeps its value's shape.
      if (m.resource && m.dtype == TF_RESOURCE) {
        host_resources_.insert_or_assign(outs.back(), *m.resource);
      }
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
    return InvalidArgument(std::string(IsCase(node.op) ? "The branch index" : "The condition") +
                           " of '" + node.name + "' (" + node.op + ") in tf.function '" +
                           function_ + "' must be a replicated scalar; got layout " +
                           builder_.layout(value)->ShortString() + " and shape " +
                           ShapeString(builder_.shape(value)) + ".");
  }
  return builder_.component(value, 0);
}

namespace {

// `into` with the sharding of `other` on axes `into` leaves unsharded, where the mesh
// dimension is still free (as TensorFlow's DTensor merges an If's branches: [x,*] and
// [*,y] give [x,y]).
std::optional<Layout> MergeBranchLayout(const std::optional<Layout>& into,
                                        const std::optional<Layout>& other) {
  if (!into || !other || into->mesh() != other->mesh() || into->rank() != other->rank() ||
      into->is_partial() || other->is_partial() || into->HasMultiDimAxis() ||
      other->HasMultiDimAxis()) {
    return into;
  }
  std::vector<DimSpec> specs = into->specs();
  std::set<int> used;
  for (const DimSpec& d : specs) {
    if (d.sharded()) used.insert(d.mesh_dim);
  }
  for (int a = 0; a < into->rank(); ++a) {
    const DimSpec& e = other->spec(a);
    if (!specs[a].sharded() && e.sharded() && !used.count(e.mesh_dim)) {
      specs[a] = e;
      used.insert(e.mesh_dim);
    }
  }
  return into->WithSpecs(specs);
}

}  // namespace

Status FunctionExpansion::ExpandBranches(const NodeSpec& node, const std::vector<ValueId>& inputs) {
  // If: then_branch and else_branch, chosen by a predicate; Case: `branches`, chosen by an
  // index (out of range: the last).
  std::vector<std::string> names;
  if (IsCase(node.op)) {
    const std::string* branches = FindRawAttr(node.attrs, "branches");
    std::optional<std::vector<std::string>> found =
        branches ? FunctionNamesOf(*branches) : std::nullopt;
    if (found) names = *std::move(found);
  } else {
    for (const char* attr : {"then_branch", "else_branch"}) {
      const std::string* raw = FindRawAttr(node.attrs, attr);
      std::optional<std::string> name = raw ? FunctionNameOf(*raw) : std::nullopt;
      if (name) names.push_back(*std::move(name));
    }
  }
  if (names.empty() || (IsIf(node.op) && names.size() != 2) || inputs.empty()) {
    return Internal("'" + node.name + "' (" + node.op + ") lacks its branches.");
  }
  TFD_ASSIGN_OR_RETURN(TF_Output chooser, Predicate(node, inputs[0]));
  std::vector<ValueId> args(inputs.begin() + 1, inputs.end());
  // Each result takes the first branch's sharding, plus each later branch's on axes those
  // before it leave unsharded; every branch is asked for it, which costs a branch at most
  // a slice where it was less sharded.
  std::vector<std::shared_ptr<const ExpandedFunction>> free;
  for (const std::string& name : names) {
    TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> f,
                         Callee(name, args, OutputRequest()));
    free.push_back(std::move(f));
  }
  OutputRequest same;
  for (size_t i = 0; i < free[0]->outputs.size(); ++i) {
    std::optional<Layout> merged = free[0]->outputs[i].layout;
    if (!free[0]->outputs[i].resource) {
      for (size_t b = 1; b < free.size(); ++b) {
        if (i < free[b]->outputs.size()) merged = MergeBranchLayout(merged, free[b]->outputs[i].layout);
      }
    }
    same.each.push_back(merged);
  }
  // A result whose branches give it different sizes along some axis (tf.cond allows that)
  // has an unknown size there (-1), as TensorFlow's result has; it cannot be sharded along
  // such an axis (its shards' sizes would follow from a size nobody knows), so every branch
  // is asked for it unsharded there. Ranks that differ are refused below.
  std::vector<std::optional<std::vector<int64_t>>> varying(same.each.size());
  for (size_t i = 0; i < same.each.size(); ++i) {
    const ValueMeta& first = free[0]->outputs[i];
    if (!same.each[i] || first.resource || first.dtype == TF_VARIANT) continue;
    std::vector<int64_t> shape = first.shape;
    bool differs = false;
    for (size_t b = 1; b < free.size(); ++b) {
      if (i >= free[b]->outputs.size()) continue;
      const std::vector<int64_t>& other = free[b]->outputs[i].shape;
      if (other.size() != shape.size()) continue;
      for (size_t a = 0; a < shape.size(); ++a) {
        if (other[a] != shape[a]) {
          shape[a] = -1;
          differs = true;
        }
      }
    }
    if (!differs) continue;
    std::vector<DimSpec> specs = same.each[i]->specs();
    if (static_cast<int>(specs.size()) == static_cast<int>(shape.size())) {
      for (size_t a = 0; a < shape.size(); ++a) {
        if (shape[a] == -1) specs[a] = DimSpec::Replicated();
      }
      same.each[i] = same.each[i]->WithSpecs(specs);
    }
    varying[i] = std::move(shape);
  }
  std::vector<std::shared_ptr<const ExpandedFunction>> branches;
  for (size_t b = 0; b < names.size(); ++b) {
    bool as_is = free[b]->outputs.size() == same.each.size();
    for (size_t i = 0; as_is && i < same.each.size(); ++i) {
      as_is = same.each[i] == free[b]->outputs[i].layout;
    }
    if (as_is) {
      branches.push_back(free[b]);
      continue;
    }
    TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> asked,
                         Callee(names[b], args, same));
    branches.push_back(std::move(asked));
  }
  // Every branch's collectives are listed, each with its branch; one branch runs per call.
  for (size_t b = 0; b < branches.size(); ++b) {
    const std::string which = IsCase(node.op) ? "branch " + std::to_string(b)
                              : b == 0        ? std::string("then")
                                              : std::string("else");
    builder_.AddCollectives(branches[b]->collectives, false, "'" + node.name + "' " + which);
  }
  // A DTensor result has one global shape, set on the op's results (its shards' shapes
  // follow from it) whichever branch runs: branches that give it different shapes (tf.cond
  // allows that, the result's shape is then unknown) would leave shards of one branch's
  // size under the first branch's shape.
  for (size_t i = 0; i < branches[0]->outputs.size(); ++i) {
    const ValueMeta& first = branches[0]->outputs[i];
    if (!first.layout || first.resource || first.dtype == TF_VARIANT) continue;
    for (size_t b = 1; b < branches.size(); ++b) {
      if (i >= branches[b]->outputs.size() || branches[b]->outputs[i].shape == first.shape ||
          (varying[i] && branches[b]->outputs[i].shape.size() == first.shape.size())) {
        continue;
      }
      const std::string which = IsCase(node.op) ? "branch " + std::to_string(b) : "the else branch";
      const std::string first_name = IsCase(node.op) ? "branch 0" : "the then branch";
      return Unimplemented(
          "Result " + std::to_string(i) + " of '" + node.name + "' (" + node.op +
          ") in tf.function '" + function_ + "' has shape " + ShapeString(first.shape) +
          " from " + first_name + " but " + ShapeString(branches[b]->outputs[i].shape) +
          " from " + which + " (layout " + first.layout->ShortString() +
          "); a DTensor result must have one shape whichever branch runs (its shards' "
          "shapes follow from it). Make the branches return the same shape (pad the "
          "shorter one, or return the slice bounds and slice after the " +
          (IsCase(node.op) ? std::string("tf.switch_case") : std::string("tf.cond")) +
          "), or run it on a plain tensor.");
    }
  }
  // A list's element value and declared element shape (ResourceInfo) hold after the op
  // only where every branch leaves them.
  std::vector<ValueMeta> results = branches[0]->outputs;
  for (size_t i = 0; i < results.size() && i < varying.size(); ++i) {
    if (varying[i]) results[i].shape = *varying[i];
  }
  for (size_t i = 0; i < results.size(); ++i) {
    // A variant that the first branch leaves without element metadata (tf.cond's gradient
    // gives OptionalNone where the other branch wraps a loop's accumulator list) takes
    // the first other branch's that has it: its elements are only ever read where that
    // branch ran. Not its element value, which the first branch does not leave.
    if (!results[i].resource && results[i].dtype == TF_VARIANT) {
      for (size_t b = 1; b < branches.size(); ++b) {
        if (i < branches[b]->outputs.size() && branches[b]->outputs[i].resource) {
          results[i].resource = branches[b]->outputs[i].resource;
          results[i].resource->element_value.reset();
          break;
        }
      }
      continue;
    }
    if (!results[i].resource) continue;
    for (size_t b = 1; b < branches.size(); ++b) {
      const std::optional<ResourceInfo>* other =
          i < branches[b]->outputs.size() ? &branches[b]->outputs[i].resource : nullptr;
      ResourceInfo& info = *results[i].resource;
      if (!other || !*other || (*other)->element_value != info.element_value) {
        info.element_value.reset();
      }
      if (!other || !*other || (*other)->declared_element_shape != info.declared_element_shape) {
        info.declared_element_shape.reset();
      }
    }
  }
  RawAttrs attrs;
  if (IsCase(node.op)) {
    std::vector<std::string> expanded;
    for (const auto& branch : branches) expanded.push_back(branch->name);
    attrs.emplace_back("branches", FunctionListAttr(expanded));
  } else {
    attrs = {{"then_branch", FunctionAttr(branches[0]->name)},
             {"else_branch", FunctionAttr(branches[1]->name)}};
  }
  return EmitFunctional(node, node.op, {chooser}, args, std::move(attrs), results, true,
                        std::move(branches));
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
      const std::optional<ResourceInfo>& list = builder_.resource(inputs[i]);
      if (out.dtype == TF_VARIANT && list && out.resource &&
          list->value_layout != out.resource->value_layout &&
          list->value_layout.mesh() == out.resource->value_layout.mesh() &&
          list->value_layout.rank() == out.resource->value_layout.rank()) {
        // A TensorList whose elements the body leaves in another layout (a gradient loop
        // adds sharded rows to a list that enters as zeros of replicated rows): the entry
        // list takes the body's element layout once, before the loop (there a slice of
        // each element, no communication), so that every iteration sees the elements it
        // leaves. Unlike a loop variable of a layout, a list is not relaid out at the end
        // of the body.
        TFD_ASSIGN_OR_RETURN(inputs[i], RelayoutListElements(builder_, inputs[i],
                                                             out.resource->value_layout,
                                                             "the elements of " + what));
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
  // A loop variable whose shape the body changes (a `shape_invariants` entry with None: a
  // growing or shrinking carry) enters with an unknown size (-1) along the axes that change,
  // unsharded along them (a shard of a size nobody knows cannot be cut), as TensorFlow's
  // loop variable has; the body is then expanded for any size there. Repeated while it
  // changes something (each round can only add unknown axes).
  for (int round = 0; round < 3; ++round) {
    TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> natural,
                         Callee(*body_name, inputs, OutputRequest(), /*loop=*/true));
    bool changed = false;
    for (size_t i = 0; i < inputs.size() && i < natural->outputs.size(); ++i) {
      const std::optional<Layout>& entry = builder_.layout(inputs[i]);
      const ValueMeta& out = natural->outputs[i];
      const std::vector<int64_t>& shape = builder_.shape(inputs[i]);
      if (!entry || !out.layout || out.resource || out.dtype == TF_VARIANT ||
          builder_.resource(inputs[i]) || entry->is_partial() ||
          out.shape.size() != shape.size() || out.shape == shape) {
        continue;
      }
      std::vector<int64_t> general = shape;
      std::vector<DimSpec> specs = entry->specs();
      bool differs = false;
      for (size_t a = 0; a < shape.size(); ++a) {
        if (out.shape[a] != shape[a] && shape[a] != -1) {
          general[a] = -1;
          specs[a] = DimSpec::Replicated();
          differs = true;
        }
      }
      if (!differs) continue;
      const std::string what = "loop variable " + std::to_string(i) + " of '" + node.name + "'";
      const Layout layout = entry->WithSpecs(specs);
      TFD_ASSIGN_OR_RETURN(ValueId unsharded, Relayout(builder_, inputs[i], layout, what));
      // Each component through PlaceholderWithDefault of the unknown size: the While's
      // shape inference gives its results the shapes of its inputs.
      std::vector<TF_Output> components;
      for (int d = 0; d < layout.mesh().num_local_devices(); ++d) {
        const TF_Output component = builder_.component(unsharded, d);
        std::vector<int64_t> local =
            builder_.InferredShape(component).value_or(std::vector<int64_t>(general.size(), -1));
        for (size_t a = 0; a < general.size() && a < local.size(); ++a) {
          if (general[a] == -1) local[a] = -1;
        }
        LocalOpOptions options;
        options.copy_attrs = false;
        options.overrides = {AttrOverride::Type("dtype", out.dtype),
                             AttrOverride::Shape("shape", local)};
        TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                             builder_.Emit("PlaceholderWithDefault", {component}, options,
                                           layout.mesh().local_devices()[d]));
        components.push_back(TF_Output{op, 0});
      }
      inputs[i] = builder_.AddDTensor(layout, general, out.dtype, std::nullopt,
                                      std::move(components));
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
  for (size_t i = 0; i < inputs.size() && i < body_fn->outputs.size(); ++i) {
    const std::optional<ResourceInfo>& list = builder_.resource(inputs[i]);
    const ValueMeta& out = body_fn->outputs[i];
    if (out.dtype != TF_VARIANT || !list || !out.resource ||
        list->value_layout == out.resource->value_layout) {
      continue;
    }
    return Unimplemented("Loop variable " + std::to_string(i) + " of '" + node.name +
                         "' in tf.function '" + function_ + "' is a TensorList that enters "
                         "with elements " + list->value_layout.ShortString() +
                         " and leaves an iteration with elements " +
                         out.resource->value_layout.ShortString() +
                         "; the elements of a list must keep one layout through a loop. "
                         "Relayout the values written to the list to one layout.");
  }
  // What the unknown sizes above do not cover (a rank that changes, a Partial loop
  // variable whose size changes) would come out claiming its entry shape over shards of
  // another size: refused.
  for (size_t i = 0; i < inputs.size() && i < body_fn->outputs.size(); ++i) {
    const ValueMeta& out = body_fn->outputs[i];
    const std::vector<int64_t>& entry = builder_.shape(inputs[i]);
    // An axis the variable enters with unknown fits any size the body gives it.
    const bool fits = entry.size() == out.shape.size() &&
                      std::equal(entry.begin(), entry.end(), out.shape.begin(),
                                 [](int64_t e, int64_t o) { return e == o || e == -1; });
    if (!out.layout || out.resource || out.dtype == TF_VARIANT || fits) continue;
    return Unimplemented(
        "Loop variable " + std::to_string(i) + " of '" + node.name + "' (While) in tf.function '" +
        function_ + "' enters with shape " + ShapeString(builder_.shape(inputs[i])) +
        " and layout " + out.layout->ShortString() + " but leaves an iteration with shape " +
        ShapeString(out.shape) +
        (std::count(out.shape.begin(), out.shape.end(), -1) > 0 ? " (-1: unknown)" : "") +
        "; a DTensor loop variable whose size changes along an axis must keep its rank and "
        "not be Partial (it then enters with an unknown size there, unsharded along it). "
        "Keep its shape fixed (allocate the final size and fill it in), collect the pieces "
        "in a tf.TensorArray, relayout it out of Partial before the loop, or run the loop "
        "on a plain tensor.");
  }
  builder_.AddCollectives(cond_fn->collectives, true);
  builder_.AddCollectives(body_fn->collectives, true);
  return EmitFunctional(node, node.op, {}, inputs,
                        {{"cond", FunctionAttr(cond_fn->name)},
                         {"body", FunctionAttr(body_fn->name)}},
                        body_fn->outputs, true, {cond_fn, body_fn});
}

}  // namespace tf_dtensor
