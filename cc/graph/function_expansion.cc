// One expansion of one tf.function body (FunctionExpansion, function_expansion.h): the
// inputs become placeholders on their devices, the nodes are ordered and each goes
// through the rule of its op (Dispatch), the requests are solved backward, and the
// results leave the function. Calls, If and While are in control_flow.cc; ops that run on
// the host (once, or a table lookup per device) in host_ops.cc.
#include "cc/graph/function_expansion.h"

#include <algorithm>

#include <map>
#include <set>
#include <unordered_map>

#include "cc/core/strings.h"
#include "cc/core/wire.h"
#include "cc/graph/function_def.h"
#include "cc/graph/graph_builder.h"
#include "cc/propagation/propagate.h"
#include "cc/rules/mesh_choice.h"
#include "cc/rules/registry.h"
#include "cc/spmd/layout_types.h"
#include "cc/spmd/relayout.h"
#include "cc/tf/handles.h"
#include "cc/tf/op_registry.h"
#include "cc/tf/ops.h"

namespace tensorflow {
// Exported by libtensorflow_cc (declared in c_api_internal.h, which pulls in the C++
// runtime headers): sets the shape and dtype of the value a resource handle points to,
// so shape inference of ReadVariableOp sees the local shape of a DVariable.
void TF_GraphSetOutputHandleShapesAndTypes(TF_Graph* graph, TF_Output output,
                                           int num_shapes_and_types, const int64_t** shapes,
                                           const int* ranks, const TF_DataType* types,
                                           TF_Status* status);
}  // namespace tensorflow

namespace tf_dtensor {

using expansion_internal::IsCall;
using expansion_internal::IsBranching;
using expansion_internal::IsWhile;
using expansion_internal::SplitName;
using expansion_internal::TensorName;

ValueMeta FunctionExpansion::MetaOf(ValueId value) const {
  ValueMeta m;
  m.layout = builder_.layout(value);
  m.shape = builder_.shape(value);
  m.dtype = builder_.dtype(value);
  m.resource = builder_.resource(value);
  auto host_resource = host_resources_.find(value);
  if (!m.resource && host_resource != host_resources_.end()) m.resource = host_resource->second;
  return m;
}

// An argument the caller passes a known constant to is that constant here (a host value;
// its input stays, unread), so that the ops computed from it fold as the caller's would:
// the bounds a cond branch slices a shape with, the shape it packs for a ScatterNd.
Status FunctionExpansion::KnownArgument(const std::string& name, const ValueMeta& m) {
  TFD_ASSIGN_OR_RETURN(ValueId constant,
                       builder_.HostConstant(*m.int_value, m.shape, m.dtype));
  args_[name] = constant;
  return Status::Ok();
}

Status FunctionExpansion::AddInputs(const std::vector<ValueMeta>& inputs) {
  const std::vector<ArgSpec>& args = spec_.signature.inputs;
  if (args.size() != inputs.size()) {
    return InvalidArgument("Function '" + function_ + "' takes " + std::to_string(args.size()) +
                           " inputs but was called with " + std::to_string(inputs.size()) + ".");
  }
  builder_.BeginNode("input", "", nullptr, {});
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueMeta& m = inputs[i];
    auto placeholder = [&](const std::string& device, const std::vector<int64_t>& shape,
                           int d) -> StatusOr<TF_Output> {
      LocalOpOptions options;
      options.copy_attrs = false;
      options.overrides = {AttrOverride::Type("dtype", m.dtype)};
      // A TensorList (variant) has a shape of its own; a resource handle's is its value's.
      if (!m.resource || m.dtype == TF_VARIANT) {
        options.overrides.push_back(AttrOverride::Shape("shape", shape));
      }
      TFD_ASSIGN_OR_RETURN(TF_Operation * op,
                           builder_.Emit("Placeholder", {}, options, device));
      TF_Output out{op, 0};
      // A TensorList's handle data would need TensorFlow's full type (TFT_ARRAY), which
      // this C API cannot set; list ops get the local element shape as an argument instead.
      std::vector<int64_t> local_value;
      if (m.resource && m.dtype != TF_VARIANT) {
        // This device's block of the variable (blocks differ when shards are uneven).
        std::vector<int64_t>& local = local_value;
        local = m.resource->value_shape;
        if (d >= 0 && m.resource->value_layout.LocalShape(m.resource->value_shape, "a DVariable").ok()) {
          local = m.resource->value_layout.GeometryOfDevice(m.resource->value_shape, d).shape;
        }
        const int64_t* dims = local.data();
        int rank = static_cast<int>(local.size());
        TF_DataType type = static_cast<TF_DataType>(m.resource->value_dtype);
        tensorflow::TF_GraphSetOutputHandleShapesAndTypes(graph_.get(), out, 1, &dims, &rank,
                                                          &type, status_);
        TFD_RETURN_IF_ERROR(FromTF(status_, "describing a DVariable input"));
      }
      flat_inputs_.push_back(out);
      // What it holds on its device, for the cost: a variable's block, or a tensor.
      InputCharge charge{device, 0, m.resource && m.dtype != TF_VARIANT};
      const std::vector<int64_t>& held = charge.variable ? local_value : shape;
      const int held_dtype = charge.variable ? m.resource->value_dtype : m.dtype;
      int64_t elements = 1;
      for (int64_t dim : held) elements *= std::max<int64_t>(dim, 0);
      charge.bytes = elements * static_cast<int64_t>(DTypeBytes(held_dtype));
      // Replicas that share one buffer (virtual CPUs) hold it once, on the first of them.
      const bool shared = charge.variable ? m.resource->shared_storage.value_or(false)
                                          : !builder_.orders_per_device();
      const std::optional<Layout>& held_layout =
          charge.variable ? std::optional<Layout>(m.resource->value_layout) : m.layout;
      const std::vector<int64_t>& global = charge.variable ? m.resource->value_shape : m.shape;
      if (shared && d > 0 && held_layout && !held_layout->is_partial() &&
          held_layout->LocalShape(global, "a block").ok()) {
        const std::vector<int64_t> offset = held_layout->GeometryOfDevice(global, d).offset;
        for (int other = 0; other < d; ++other) {
          if (held_layout->GeometryOfDevice(global, other).offset == offset) charge.bytes = 0;
        }
      }
      input_charges_.push_back(std::move(charge));
      return out;
    };
    user_partial_ = user_partial_ || (m.layout && m.layout->is_partial());
    if (!m.layout) {
      TFD_ASSIGN_OR_RETURN(TF_Output out, placeholder(builder_.host_device(), m.shape, -1));
      args_[args[i].name] = builder_.AddHost(out);
      if (m.resource && m.dtype == TF_RESOURCE) {
        host_resources_.insert_or_assign(args_[args[i].name], *m.resource);
      }
      if (m.int_value) TFD_RETURN_IF_ERROR(KnownArgument(args[i].name, m));
      continue;
    }
    TFD_RETURN_IF_ERROR(m.layout->LocalShape(m.shape, "input " + std::to_string(i)).status());
    std::vector<TF_Output> components;
    const Mesh& arg_mesh = m.layout->mesh();
    for (int d = 0; d < arg_mesh.num_local_devices(); ++d) {
      std::vector<int64_t> local = m.layout->GeometryOfDevice(m.shape, d).shape;
      TFD_ASSIGN_OR_RETURN(TF_Output out, placeholder(arg_mesh.local_devices()[d], local, d));
      components.push_back(out);
    }
    args_[args[i].name] = builder_.AddDTensor(*m.layout, m.shape, m.dtype, m.resource,
                                              std::move(components));
    if (m.int_value && m.layout->IsFullyReplicated()) {
      TFD_RETURN_IF_ERROR(KnownArgument(args[i].name, m));
    }
  }
  return Status::Ok();
}

Status FunctionExpansion::Order() {
  for (const NodeSpec& node : spec_.nodes) by_name_[node.name] = &node;
  // Kahn's algorithm over data and control edges, keeping the FunctionDef's order among
  // ready nodes.
  std::unordered_map<std::string, int> pending;
  std::unordered_map<std::string, std::vector<const NodeSpec*>> users;
  for (const NodeSpec& node : spec_.nodes) {
    int count = 0;
    for (const std::string& in : node.inputs) {
      TensorName t = SplitName(in);
      if (!by_name_.count(t.node) || (!t.control && t.arg.empty() && args_.count(t.node))) {
        continue;
      }
      users[t.node].push_back(&node);
      ++count;
    }
    pending[node.name] = count;
  }
  std::vector<const NodeSpec*> ready;
  for (const NodeSpec& node : spec_.nodes) {
    if (pending[node.name] == 0) ready.push_back(&node);
  }
  for (size_t i = 0; i < ready.size(); ++i) {
    order_.push_back(ready[i]);
    for (const NodeSpec* user : users[ready[i]->name]) {
      if (--pending[user->name] == 0) ready.push_back(user);
    }
  }
  if (order_.size() != spec_.nodes.size()) {
    return InvalidArgument("Function '" + function_ + "' has a cycle; tf_dtensor expands acyclic "
                           "functions (loops arrive as While ops).");
  }
  return Status::Ok();
}

void FunctionExpansion::Requests(const OutputRequest& request) {
  auto ask = [&](const std::string& tensor, const Layout& layout) {
    TensorName t = SplitName(tensor);
    if (t.control || t.index != 0 || !by_name_.count(t.node)) return;
    seeds_.emplace(t.node, layout);
  };
  for (size_t i = 0; i < spec_.ret.size() && i < spec_.signature.outputs.size(); ++i) {
    const std::string& name = spec_.signature.outputs[i].name;
    for (const auto& [out, tensor] : spec_.ret) {
      if (out != name) continue;
      if (i < request.each.size() && request.each[i]) ask(tensor, *request.each[i]);
      if (request.single && i == 0) ask(tensor, *request.single);
    }
  }
  // A relayout asks its input's producer for its layout (also RelayoutRule::Backward;
  // seeded here so that the first round already has it).
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const NodeSpec& node = **it;
    if (node.op != kRelayoutOp || node.inputs.empty()) continue;
    std::optional<std::string> text = DecodeAttrs(node.attrs).GetString("layout");
    if (!text) continue;
    StatusOr<Layout> parsed = Layout::FromString(*text);
    if (parsed.ok()) ask(node.inputs[0], *parsed);
  }
  // A node made under `_default_layout(layout)` while tracing asks for that layout.
  for (const NodeSpec* node : order_) {
    if (std::optional<Layout> layout = DefaultLayoutAttr(*node)) seeds_.emplace(node->name, *layout);
  }
}

// TensorFlow's `_layout` attribute (one layout string per output), which
// `_default_layout(layout)` gives the ops traced in its scope; tf_dtensor reads the first.
std::optional<Layout> FunctionExpansion::DefaultLayoutAttr(const NodeSpec& node) {
  if (!FindRawAttr(node.attrs, "_layout")) return std::nullopt;
  const AttrMap attrs = DecodeAttrs(node.attrs);
  const AttrValue* value = attrs.Find("_layout");
  if (!value || value->list_s.empty()) return std::nullopt;
  StatusOr<Layout> layout = Layout::FromString(value->list_s[0]);
  if (!layout.ok()) return std::nullopt;
  return *layout;
}

// The first output of a node with a `_layout` attribute takes that layout (a host value
// moves onto its mesh first), where the ranks agree.
Status FunctionExpansion::ApplyDefaultLayout(const NodeSpec& node) {
  std::optional<Layout> layout = DefaultLayoutAttr(node);
  auto found = outputs_.find(node.name);
  if (!layout || found == outputs_.end() || found->second.empty()) return Status::Ok();
  ValueId& value = found->second[0];
  if (builder_.resource(value) ||
      static_cast<int>(builder_.shape(value).size()) != layout->rank()) {
    return Status::Ok();
  }
  if (builder_.is_host(value)) {
    TFD_ASSIGN_OR_RETURN(value, builder_.Broadcast(value, RuntimeMesh(layout->mesh())));
  }
  if (builder_.layout(value) == *layout) return Status::Ok();
  TFD_ASSIGN_OR_RETURN(value, Relayout(builder_, value, *layout,
                                       "the output of '" + node.name + "' (its default layout)"));
  return Status::Ok();
}

void FunctionExpansion::Record(const NodeSpec& node, const RegisteredRule* rule,
                               std::shared_ptr<const OpContext> ctx, bool request_sensitive) {
  auto it = position_.find(node.name);
  if (it == position_.end()) return;
  solver_nodes_[it->second].rule = rule;
  solver_nodes_[it->second].ctx = std::move(ctx);
  request_sensitive_[it->second] = request_sensitive;
}

std::shared_ptr<const OpContext> FunctionExpansion::HostContext(
    const NodeSpec& node, const RegisteredRule* rule, const std::vector<ValueId>& inputs) {
  auto recorded = std::make_shared<RecordedContext>(node.op, DecodeAttrs(node.attrs), mesh_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    InputInfo info;
    info.shape = builder_.shape(inputs[i]);
    info.dtype = builder_.dtype(inputs[i]);
    if (rule->traits.IsHostInput(static_cast<int>(i), static_cast<int>(inputs.size()))) {
      info.int_value = builder_.IntValue(inputs[i]);
    }
    recorded->ctx.inputs.push_back(std::move(info));
  }
  const OpSpec* op_spec = builder_.FindOp(node.op);
  recorded->ctx.num_outputs = op_spec ? static_cast<int>(op_spec->outputs.size()) : 1;
  return std::shared_ptr<const OpContext>(recorded, &recorded->ctx);
}

RequestMap FunctionExpansion::Solve() const {
  std::vector<SolverNode> nodes = solver_nodes_;
  for (size_t n = 0; n < nodes.size(); ++n) {
    auto seed = seeds_.find(order_[n]->name);
    if (seed != seeds_.end()) nodes[n].seeds = {seed->second};
  }
  std::vector<std::vector<std::optional<Layout>>> solved = SolveRequests(nodes);
  RequestMap out;
  for (size_t n = 0; n < solved.size(); ++n) {
    if (!solved[n].empty() && solved[n][0]) out.emplace(order_[n]->name, *solved[n][0]);
  }
  return out;
}

bool FunctionExpansion::Changes(const RequestMap& solved) const {
  for (size_t n = 0; n < order_.size(); ++n) {
    if (!request_sensitive_[n]) continue;
    auto now = requests_.find(order_[n]->name);
    auto next = solved.find(order_[n]->name);
    const bool had = now != requests_.end(), has = next != solved.end();
    if (had != has || (has && now->second != next->second)) return true;
  }
  return false;
}

Status FunctionExpansion::EnterNodeMesh(const NodeSpec& node, std::vector<ValueId>& inputs) {
  MeshChoiceOp op;
  op.name = node.op;
  op.where = " (node '" + node.name + "' of tf.function '" + function_ + "')";
  op.rule = RuleRegistry::Global().Find(node.op);
  op.calls_function = IsCall(node.op) || IsBranching(node.op) || IsWhile(node.op) ||
                      (!builder_.FindOp(node.op) &&
                       TFE_ContextHasFunction(context_, node.op.c_str()));
  if (node.op == kRelayoutOp) {
    std::optional<std::string> text = DecodeAttrs(node.attrs).GetString("layout");
    StatusOr<Layout> target = text ? Layout::FromString(*text) : InvalidArgument("no layout");
    if (target.ok()) op.target = target->mesh();
  }
  auto request = requests_.find(node.name);
  if (request != requests_.end()) op.requested = request->second.mesh();
  op.enclosing = home_;
  std::vector<MeshChoiceInput> seen(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (builder_.is_host(inputs[i])) continue;
    seen[i].layout = &*builder_.layout(inputs[i]);
    seen[i].scalar = builder_.shape(inputs[i]).empty();
    seen[i].resource = builder_.resource(inputs[i]).has_value();
  }
  TFD_ASSIGN_OR_RETURN(MeshChoice choice, ChooseMesh(op, seen));
  for (int i : choice.moved) {
    TFD_ASSIGN_OR_RETURN(inputs[i], builder_.MoveToMesh(inputs[i], choice.mesh));
  }
  mesh_ = choice.mesh;
  builder_.SetMesh(mesh_);
  return Status::Ok();
}

StatusOr<int> FunctionExpansion::FlatIndex(const NodeSpec& node, const std::string& arg,
                                           int index) {
  if (arg.empty()) return index;
  if (IsCall(node.op)) return index;  // "output" is the only (list) output
  const OpSpec* spec = builder_.FindOp(node.op);
  if (!spec) {
    // A direct call of a function (expanded already): one output per result, named as
    // in its signature.
    auto callee = callees_.find(node.name);
    if (callee == callees_.end()) return Internal("Cannot find the outputs of '" + node.op + "'.");
    const std::vector<std::string>& names = callee->second->output_names;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == arg) return static_cast<int>(i) + index;
    }
    return Internal("'" + node.op + "' has no output '" + arg + "'.");
  }
  AttrMap attrs;
  bool decoded = false;
  int offset = 0;
  for (const ArgSpec& out : spec->outputs) {
    if (out.name == arg) return offset + index;
    int64_t length = 1;
    if (!out.number_attr.empty() || !out.type_list_attr.empty()) {
      if (!decoded) {
        attrs = DecodeAttrs(node.attrs);
        decoded = true;
      }
      const AttrValue* v = attrs.Find(out.number_attr.empty() ? out.type_list_attr : out.number_attr);
      if (!v) return Internal("'" + node.name + "' lacks attribute for output '" + out.name + "'.");
      length = out.number_attr.empty() ? static_cast<int64_t>(v->list_type.size()) : v->i.value_or(0);
    }
    offset += static_cast<int>(length);
  }
  return Internal("'" + node.op + "' has no output '" + arg + "'.");
}

StatusOr<ValueId> FunctionExpansion::Resolve(const std::string& name) {
  TensorName t = SplitName(name);
  if (t.arg.empty() && !name.empty() && name.find(':') == std::string::npos) {
    auto it = args_.find(t.node);
    if (it != args_.end()) return it->second;
  }
  auto node = by_name_.find(t.node);
  auto outs = outputs_.find(t.node);
  if (node == by_name_.end() || outs == outputs_.end()) {
    return Internal("Function '" + function_ + "' refers to an unknown tensor '" + name + "'.");
  }
  TFD_ASSIGN_OR_RETURN(int index, FlatIndex(*node->second, t.arg, t.index));
  if (index < 0 || index >= static_cast<int>(outs->second.size())) {
    return Internal("Output " + std::to_string(index) + " of '" + t.node + "' (" +
                    node->second->op + ") is missing after expansion.");
  }
  return outs->second[index];
}

Status FunctionExpansion::ExpandWithRule(const NodeSpec& node, std::vector<ValueId> inputs) {
  // A value of unknown rank assigned to a DVariable (a checkpoint's restored tensor: TF
  // infers no shape for RestoreV2's) has the variable's shape, checked when it runs.
  static const std::set<std::string>* const kAssigns = new std::set<std::string>{
      "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"};
  if (kAssigns->count(node.op) && inputs.size() == 2 && builder_.resource(inputs[0]) &&
      builder_.is_host(inputs[1]) && builder_.rank_unknown(inputs[1])) {
    TFD_ASSIGN_OR_RETURN(inputs[1], builder_.EnsureHostShape(
                                        inputs[1], builder_.resource(inputs[0])->value_shape));
  }
  const RegisteredRule* rule = RuleRegistry::Global().Find(node.op);
  auto recorded = std::make_shared<RecordedContext>(node.op, DecodeAttrs(node.attrs), mesh_);
  OpContext& ctx = recorded->ctx;
  bool any_dtensor = false;
  auto request = requests_.find(node.name);
  if (request != requests_.end() && request->second.mesh() == mesh_) ctx.requested = request->second;
  const OpSpec* op_spec = builder_.FindOp(node.op);
  ctx.num_outputs = op_spec ? static_cast<int>(op_spec->outputs.size()) : 1;
  for (ValueId v : inputs) {
    any_dtensor = any_dtensor || !builder_.is_host(v);
    InputInfo info;
    info.shape = builder_.shape(v);
    info.dtype = builder_.dtype(v);
    info.layout = builder_.layout(v);
    info.resource = builder_.resource(v);
    ctx.inputs.push_back(std::move(info));
  }
  // The solver reads the context after this forward round, once Dispatch has filled in
  // host-argument values and host data's layouts.
  Record(node, rule, std::shared_ptr<const OpContext>(recorded, &ctx),
         rule && (!any_dtensor || rule->traits.reads_request));
  DispatchOptions options;
  options.policy = policy_;
  options.in_function = true;
  // The op's own OpDef, or TF's registry (which also counts seeded ops, FractionalMaxPool).
  options.stateful = (op_spec && op_spec->is_stateful) || IsStatefulOp(node.op);
  options.where = " (node '" + node.name + "' of tf.function '" + function_ + "')";
  StatusOr<std::vector<ValueId>> results =
      Dispatch(rule, ctx, std::move(inputs), builder_, options);
  if (!results.ok()) return results.status();
  outputs_[node.name] = std::move(results).value();
  // A relayout to a partial layout brings the user's partial values in. A relayout_like
  // does not: its `like` is partial only where the user's values already are, or where the
  // expansion deferred a reduction (the gradient of a relayout whose input was a matmul's
  // pending sum), which results must not keep.
  if (node.op == kRelayoutOp) {
    for (ValueId v : outputs_[node.name]) {
      user_partial_ = user_partial_ || (!builder_.is_host(v) && builder_.layout(v)->is_partial());
    }
  }
  return Status::Ok();
}

Status FunctionExpansion::ExpandNode(const NodeSpec& node) {
  std::vector<ValueId> inputs;
  std::vector<TF_Operation*> control;
  std::vector<SolverNode::Source> sources;
  for (const std::string& in : node.inputs) {
    TensorName t = SplitName(in);
    if (t.control) {
      auto it = ops_.find(t.node);
      if (it != ops_.end()) control.insert(control.end(), it->second.begin(), it->second.end());
      continue;
    }
    TFD_ASSIGN_OR_RETURN(ValueId v, Resolve(in));
    inputs.push_back(v);
    // Where the solver sends requests for this input: its producer (none for arguments).
    SolverNode::Source source;
    auto producer = position_.find(t.node);
    const bool argument = t.arg.empty() && in.find(':') == std::string::npos && args_.count(t.node);
    if (!argument && producer != position_.end()) {
      StatusOr<int> flat = FlatIndex(*by_name_.at(t.node), t.arg, t.index);
      if (flat.ok()) source = {producer->second, *flat};
    }
    sources.push_back(source);
  }
  solver_nodes_[position_.at(node.name)].inputs = std::move(sources);
  std::vector<bool> parted_in;
  for (ValueId v : inputs) parted_in.push_back(parted_.count(v) > 0);
  std::vector<std::string> control_devices;  // where the control inputs ran, in order
  for (TF_Operation* c : control) {
    std::string device = TF_OperationDevice(c);
    if (std::find(control_devices.begin(), control_devices.end(), device) ==
        control_devices.end()) {
      control_devices.push_back(std::move(device));
    }
  }
  builder_.BeginNode(node.name, node.op, &node.attrs, std::move(control));
  Status s = [&]() -> Status {
    TFD_RETURN_IF_ERROR(EnterNodeMesh(node, inputs));
    if (node.op == kPackOp || node.op == kUnpackOp || node.op == kFetchLayoutOp) {
      return Unimplemented("'" + node.op + "' (pack, unpack or fetch_layout) inside tf.function '" +
                           function_ + "': these move tensors between the host and the mesh "
                           "and run eagerly. Call them outside the function and pass DTensors in.");
    }
    if (IsCall(node.op) || IsBranching(node.op) || IsWhile(node.op) ||
        (!builder_.FindOp(node.op) && TFE_ContextHasFunction(context_, node.op.c_str()))) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        TFD_ASSIGN_OR_RETURN(inputs[i], Settle(inputs[i], "input " + std::to_string(i) + " of '" +
                                                              node.name + "'"));
      }
    }
    if (IsCall(node.op)) {
      const std::string* f = FindRawAttr(node.attrs, "f");
      std::optional<std::string> callee = f ? FunctionNameOf(*f) : std::nullopt;
      if (!callee) return Internal("Call '" + node.name + "' names no function.");
      return ExpandCall(node, *callee, inputs);
    }
    if (!builder_.FindOp(node.op) && TFE_ContextHasFunction(context_, node.op.c_str())) {
      return ExpandCall(node, node.op, inputs);
    }
    if (IsBranching(node.op)) return ExpandBranches(node, inputs);
    if (IsWhile(node.op)) return ExpandWhile(node, inputs);
    // A control-only op that gathers side effects (tf.function's automatic control dependencies make
    // one wait for a step's assigns, and the return wait for it) runs on every device its
    // control inputs ran on, each waiting for its own device's: one NoOp on the host
    // waited for every device's assigns and every device's return waited for it (on 8
    // GPUs, 96 _Send/_Recv pairs per step of the MLP). Where devices share buffers an
    // op's wait is not per device (ControlsFor), so one NoOp serves.
    // (Any op with neither inputs nor outputs and no state: NoOp, ControlTrigger.)
    const OpSpec* spec = builder_.FindOp(node.op);
    if (spec && spec->inputs.empty() && spec->outputs.empty() && !spec->is_stateful &&
        !control_devices.empty() && builder_.orders_per_device()) {
      for (const std::string& device : control_devices) {
        TFD_RETURN_IF_ERROR(builder_.Emit(node.op, {}, LocalOpOptions{}, device).status());
      }
      return Status::Ok();
    }
    // Ops that run once, on the host, with their DTensor inputs whole: an op on a plain
    // tf.Variable the function captured (a host resource: it runs where the variable lives,
    // as eagerly), and a side effect with no rule and no outputs (SaveV2 of a checkpoint,
    // WriteFile), which run on every device would write once per device.
    // (An update of a DVariable without a rule, ResourceApplyGradientDescent, keeps the
    // replicated fallback: its state lives on the mesh.) A Python callback
    // (tf.py_function, tf.numpy_function) runs once too, as eagerly: on every device it
    // would call the Python function once per device, and TF infers no shape for its
    // results (`tf.ensure_shape` gives them one before they join the mesh).
    static const std::set<std::string>* const kPythonCallbacks =
        new std::set<std::string>{"EagerPyFunc", "PyFunc", "PyFuncStateless"};
    bool side_effect = (spec && spec->is_stateful && spec->outputs.empty() &&
                        !RuleRegistry::Global().Find(node.op)) ||
                       kPythonCallbacks->count(node.op) > 0;
    bool plain_resource = false;
    for (ValueId v : inputs) {
      side_effect = side_effect && !builder_.resource(v);
      plain_resource = plain_resource || (builder_.is_host(v) && builder_.dtype(v) == TF_RESOURCE);
    }
    if (plain_resource) {
      TFD_ASSIGN_OR_RETURN(bool per_device, EmitLookupPerDevice(node, inputs));
      if (per_device) return Status::Ok();
    }
    if (side_effect || plain_resource) return EmitOnceOnHost(node, inputs);
    // Ops on host values alone stay on the host, unless a layout was requested of an op
    // that can make its blocks directly (Fill, random ops: those have rules).
    bool any_dtensor = false;
    for (ValueId v : inputs) any_dtensor = any_dtensor || !builder_.is_host(v);
    const RegisteredRule* rule = RuleRegistry::Global().Find(node.op);
    const bool made_in_layout =
        rule && (requests_.count(node.name) > 0 || rule->traits.makes_mesh_value);
    // A relayout always moves its input onto its layout's mesh, host constants included.
    if (!any_dtensor && !made_in_layout && node.op != kRelayoutOp &&
        node.op != kRelayoutLikeOp) {
      // A request reaching this op later makes it on the mesh (made_in_layout).
      if (rule) Record(node, rule, HostContext(node, rule, inputs), true);
      return EmitHostOp(node, inputs);
    }
    return ExpandWithRule(node, inputs);
  }();
  if (s.ok()) s = ApplyDefaultLayout(node);
  if (!s.ok()) return s;
  // Outputs a previous round saw reduced by some reader are reduced here, once.
  std::vector<ValueId>& outs = outputs_[node.name];
  for (size_t k = 0; k < outs.size() && !reduce_at_source_.empty(); ++k) {
    const ValueId v = outs[k];
    if (!reduce_at_source_.count({node.name, static_cast<int>(k)}) || user_partial_ ||
        builder_.is_host(v) || builder_.resource(v) || !builder_.layout(v)->is_partial() ||
        parted_.count(v)) {
      continue;
    }
    TFD_ASSIGN_OR_RETURN(outs[k], Relayout(builder_, v, builder_.layout(v)->WithoutPartial(),
                                           "output " + std::to_string(k) + " of '" +
                                               node.name + "' (reduced once for its readers)"));
  }
  ops_[node.name] = builder_.created();
  // Parts (TensorFlow's `Layout.to_parted()`): a relayout to a parted layout makes them and
  // Identity passes them on, so that a function returning one returns parts, as eagerly.
  const std::vector<ValueId>& made = outputs_[node.name];
  if (node.op == kRelayoutOp) {
    std::optional<std::string> text = DecodeAttrs(node.attrs).GetString("layout");
    StatusOr<Layout> target = text ? Layout::FromString(*text) : InvalidArgument("no layout");
    if (target.ok() && target->is_parted()) parted_.insert(made.begin(), made.end());
  } else if (node.op == "Identity" || node.op == "IdentityN") {
    for (size_t i = 0; i < made.size() && i < parted_in.size(); ++i) {
      if (parted_in[i]) parted_.insert(made[i]);
    }
  }
  solver_nodes_[position_.at(node.name)].num_outputs =
      static_cast<int>(outputs_[node.name].size());
  return Status::Ok();
}

Status FunctionExpansion::Build(const std::string& function, const std::vector<ValueMeta>& inputs,
                                const OutputRequest& request, const RequestMap* requests) {
  function_ = function;
  TF_Buffer* buffer = TF_NewBuffer();
  TFE_ContextGetFunctionDef(context_, function.c_str(), buffer, status_);
  Status fetched = FromTF(status_, "fetching tf.function '" + function + "'");
  StatusOr<FunctionSpec> spec =
      fetched.ok() ? ParseFunctionDef(std::string_view(static_cast<const char*>(buffer->data),
                                                       buffer->length))
                   : StatusOr<FunctionSpec>(fetched);
  TF_DeleteBuffer(buffer);
  TFD_RETURN_IF_ERROR(spec.status());
  spec_ = std::move(spec).value();
  // tf.function(jit_compile=True), or a body, branch or call inside one: each device's
  // part is compiled with XLA.
  xla_compile_ =
      inherited_xla_compile_ || DecodeAttrs(spec_.attrs).GetBool("_XlaMustCompile", false);
  builder_.set_xla_compile(xla_compile_);

  TFD_RETURN_IF_ERROR(AddInputs(inputs));
  TFD_RETURN_IF_ERROR(Order());
  solver_nodes_.resize(order_.size());
  request_sensitive_.assign(order_.size(), false);
  for (size_t n = 0; n < order_.size(); ++n) position_[order_[n]->name] = static_cast<int>(n);
  Requests(request);
  requests_ = requests ? *requests : seeds_;
  for (const NodeSpec* node : order_) TFD_RETURN_IF_ERROR(ExpandNode(*node));
  return Status::Ok();
}

std::set<std::pair<std::string, int>> FunctionExpansion::ReducedByReaders() const {
  std::set<std::pair<std::string, int>> reduced;
  if (user_partial_) return reduced;  // the user's partial values stay as they are asked
  const std::set<ValueId>& by_readers = builder_.reduced_by_readers();
  for (const auto& [node, values] : outputs_) {
    for (size_t k = 0; k < values.size(); ++k) {
      if (by_readers.count(values[k])) reduced.insert({node, static_cast<int>(k)});
    }
  }
  return reduced;
}

StatusOr<std::shared_ptr<const ExpandedFunction>> FunctionExpansion::Finish(
    const std::vector<ValueMeta>& inputs, const OutputRequest& request,
    const std::string& expanded_name) {
  const std::string& function = function_;
  auto result = std::make_shared<ExpandedFunction>();
  result->name = expanded_name;
  result->inputs = inputs;
  builder_.BeginNode("output", "", nullptr, {});
  mesh_ = home_;
  builder_.SetMesh(home_);
  std::vector<TF_Output> flat_outputs;
  std::vector<size_t> answers;  // the flat outputs the host reads (a loop's condition)
  const auto& outs = spec_.signature.outputs;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string* tensor = nullptr;
    for (const auto& [name, t] : spec_.ret) {
      if (name == outs[i].name) tensor = &t;
    }
    if (!tensor) return Internal("Function '" + function + "' does not return '" + outs[i].name + "'.");
    TFD_ASSIGN_OR_RETURN(ValueId v, Resolve(*tensor));
    const ValueId resolved = v;
    std::optional<Layout> target;
    if (!(i < request.each.size() && request.each[i] && request.each[i]->is_partial())) {
      TFD_ASSIGN_OR_RETURN(v, Settle(v, "result " + std::to_string(i) + " of '" + function + "'"));
    }
    if (i < request.each.size()) target = request.each[i];
    if (!target && request.single && i == 0 && !builder_.resource(v) &&
        request.single->rank() == static_cast<int>(builder_.shape(v).size())) {
      target = request.single;
    }
    if (target && builder_.is_host(v)) {
      TFD_ASSIGN_OR_RETURN(v, builder_.Broadcast(v, mesh_));
    }
    if (target && *target != *builder_.layout(v)) {
      TFD_ASSIGN_OR_RETURN(v, Relayout(builder_, v, *target,
                                       "result " + std::to_string(i) + " of '" + function + "'"));
    }
    // A handle on the host (a plain tf.Variable's, a dataset iterator's: a loop variable of
    // every tf.range loop that reads the variable) is one handle: it leaves as it came, even
    // where nothing is asked of it (the rounds in which a loop's body shows its layouts).
    const bool host_handle =
        !target && builder_.is_host(v) && builder_.dtype(v) == TF_RESOURCE;
    if (request.host(i) || host_handle) {
      if (!builder_.is_host(v) && !builder_.layout(v)->IsFullyReplicated()) {
        TFD_ASSIGN_OR_RETURN(v, Relayout(builder_, v,
                                         Layout::Replicated(builder_.layout(v)->mesh(),
                                                            builder_.layout(v)->rank()),
                                         "result " + std::to_string(i) + " of '" + function + "'"));
      }
      if (!host_handle) answers.push_back(flat_outputs.size());
      flat_outputs.push_back(builder_.is_host(v) ? builder_.host(v) : builder_.component(v, 0));
      ValueMeta m = MetaOf(v);
      m.layout.reset();
      result->outputs.push_back(std::move(m));
      result->parted_outputs.push_back(false);
      continue;
    }
    if (builder_.is_host(v)) {
      TFD_ASSIGN_OR_RETURN(v, builder_.Broadcast(v, mesh_));
    }
    builder_.SetMesh(builder_.layout(v)->mesh());
    for (int d = 0; d < builder_.layout(v)->mesh().num_local_devices(); ++d) {
      TFD_ASSIGN_OR_RETURN(TF_Output o, builder_.OnDevice(v, d));
      flat_outputs.push_back(o);
    }
    result->outputs.push_back(MetaOf(v));
    result->parted_outputs.push_back(v == resolved && parted_.count(v) > 0);
  }
  // The deferred all-reduces, combined where they can be; an output that is a stand-in
  // itself names its result instead.
  TFD_ASSIGN_OR_RETURN(auto replaced, builder_.CombineAllReduces());
  for (TF_Output& o : flat_outputs) {
    auto it = replaced.find(o.oper);
    if (it != replaced.end()) o = it->second;
  }
  // The host's answers wait for every collective of the function. A loop's condition is
  // inlined into the loop's frame, where its control outputs lead nowhere: its other
  // devices' parts of an all-reduce whose first device's result the host reads were then
  // pruned under auto-clustering, and that device waited for them for good.
  if (!answers.empty() && !builder_.must_run().empty()) {
    for (size_t i : answers) {
      const std::string name = "tfd_answer_" + std::to_string(i);
      TF_OperationDescription* desc = TF_NewOperation(graph_.get(), "Identity", name.c_str());
      TF_SetDevice(desc, TF_OperationDevice(flat_outputs[i].oper));
      TF_AddInput(desc, flat_outputs[i]);
      for (TF_Operation* op : builder_.must_run()) TF_AddControlInput(desc, op);
      TF_Operation* answer = TF_FinishOperation(desc, status_);
      TFD_RETURN_IF_ERROR(FromTF(status_, "adding an answer of '" + function + "'"));
      flat_outputs[i] = TF_Output{answer, 0};
    }
  }
  for (const ArgSpec& out : outs) result->output_names.push_back(out.name);
  // The function's control outputs (what must run: assigns, reads, collectives): one NoOp
  // per device, waiting for what the traced control outputs expanded into there. Each
  // control output the runtime waits for from another device is a _Send/_Recv pair per
  // call; on GPUs every expanded op of every control output was one (144 per MLP step
  // over 8 GPUs). All-reduce stand-ins that CombineAllReduces replaced carry no effect.
  std::map<std::string, std::vector<TF_Operation*>> must_run;  // device -> ops
  for (const auto& [name, node] : spec_.control_ret) {
    auto it = ops_.find(node);
    if (it == ops_.end()) continue;
    for (TF_Operation* op : it->second) {
      if (replaced.count(op)) continue;
      must_run[TF_OperationDevice(op)].push_back(op);
    }
  }
  for (TF_Operation* op : builder_.must_run()) must_run[TF_OperationDevice(op)].push_back(op);
  std::vector<TF_Operation*> control_outputs;
  std::vector<std::string> control_names;
  for (const auto& [device, ops] : must_run) {
    const std::string name = "tfd_control_output_" + std::to_string(control_outputs.size());
    TF_OperationDescription* desc = TF_NewOperation(graph_.get(), "NoOp", name.c_str());
    TF_SetDevice(desc, device.c_str());
    for (TF_Operation* op : ops) TF_AddControlInput(desc, op);
    TF_Operation* barrier = TF_FinishOperation(desc, status_);
    TFD_RETURN_IF_ERROR(FromTF(status_, "adding the control outputs of '" + function + "'"));
    control_outputs.push_back(barrier);
    control_names.push_back(name);
  }
  std::vector<const char*> control_name_ptrs;
  for (const std::string& n : control_names) control_name_ptrs.push_back(n.c_str());

  TF_Function* fn = TF_GraphToFunctionWithControlOutputs(
      graph_.get(), expanded_name.c_str(), 0, -1, nullptr,
      static_cast<int>(flat_inputs_.size()), flat_inputs_.data(),
      static_cast<int>(flat_outputs.size()), flat_outputs.data(), nullptr,
      static_cast<int>(control_outputs.size()), control_outputs.data(),
      control_name_ptrs.data(), nullptr, nullptr, status_);
  TFD_RETURN_IF_ERROR(FromTF(status_, "building the SPMD function for '" + function + "'"));
  TFE_ContextAddFunction(context_, fn, status_);
  TF_DeleteFunction(fn);
  TFD_RETURN_IF_ERROR(FromTF(status_, "registering the SPMD function for '" + function + "'"));
  result->cost = AnalyzeCost(graph_.get(), flat_inputs_, input_charges_, flat_outputs, functional_);
  size_t pos = 0;
  int count = 0;
  while (TF_GraphNextOperation(graph_.get(), &pos)) ++count;
  result->num_nodes = count;
  result->collectives = builder_.collectives();
  result->callees = bodies_;
  return std::shared_ptr<const ExpandedFunction>(std::move(result));
}

}  // namespace tf_dtensor
