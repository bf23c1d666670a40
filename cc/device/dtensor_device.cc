#include "cc/device/dtensor_device.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>

#include "cc/core/strings.h"
#include "cc/device/function_call.h"
#include "cc/device/program_check.h"
#include "cc/eager/executor.h"
#include "cc/eager/kernel_cache.h"
#include "cc/eager/pack.h"
#include "cc/rules/dispatch.h"
#include "cc/rules/mesh_choice.h"
#include "cc/rules/registry.h"
#include "cc/spmd/layout_types.h"
#include "cc/spmd/parted_builder.h"
#include "cc/spmd/relayout.h"
#include "cc/tf/attrs.h"
#include "cc/tf/handles.h"
#include "cc/tf/op_registry.h"
#include "cc/tf/ops.h"

namespace tf_dtensor {
namespace {

// The op's attributes, read when a rule first asks for one.
AttrMap ReadAttrs(const TFE_Op* op) {
  const TFE_OpAttrs* attrs = TFE_OpGetAttrs(op);
  return AttrMap::Lazy([attrs] {
    StatusPtr status(TF_NewStatus());
    return SerializedAttrs(attrs, status.get());
  });
}

std::atomic<int> live_devices{0};

// On meshes spanning clients every eager collective is compared across the clients before
// it runs, so that clients running different programs fail instead of waiting in
// mismatched collectives forever. It costs a round trip through the coordination service
// each (measured: an eager all-reduce across 2 local clients 3.5 -> 4.3 ms, TensorFlow's
// DTensor 4.2 ms); TF_DTENSOR_CHECK_EAGER_COLLECTIVES=0 turns it off. tf.functions are
// compared once per expansion regardless.
bool ChecksEagerCollectives() {
  static const bool on = [] {
    const char* value = std::getenv("TF_DTENSOR_CHECK_EAGER_COLLECTIVES");
    return value == nullptr || *value == '\0' ||
           (std::string(value) != "0" && std::string(value) != "false");
  }();
  return on;
}

// The runtime form of a requested (call_with_layout / default) layout. A single-device
// request only names the mesh: every tensor there is whole, so nothing is left to ask.
std::optional<Layout> RuntimeRequest(const std::optional<Layout>& requested) {
  if (!requested || requested->is_single_device()) return std::nullopt;
  return RuntimeLayout(*requested, requested->rank());
}

}  // namespace

void ToTF(const Status& status, TF_Status* tf_status) {
  TF_SetStatus(tf_status, static_cast<TF_Code>(status.code()), status.message().c_str());
}

DTensorDevice::DTensorDevice(std::string name)
    : name_(std::move(name)), serial_([] {
        static std::atomic<uint64_t> next{0};
        return next.fetch_add(1) + 1;
      }()) {
  RegisterOps();
  live_devices.fetch_add(1);
}

DTensorDevice::~DTensorDevice() {
  alive_->store(false);
  live_devices.fetch_sub(1);
}

int DTensorDevice::num_live() { return live_devices.load(); }

void DTensorDevice::PushDefaultMesh(std::optional<Mesh> mesh) {
  if (mesh) RegisterMesh(*mesh);
  std::lock_guard<std::mutex> lock(mutex_);
  mesh_stacks_[std::this_thread::get_id()].push_back(std::move(mesh));
}

void DTensorDevice::RegisterMesh(const Mesh& mesh) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (registered_meshes_.size() >= 2) return;  // already ambiguous
  Mesh user = UserMesh(mesh);
  for (const Mesh& m : registered_meshes_) {
    if (m == user) return;
  }
  registered_meshes_.push_back(std::move(user));
}

std::optional<Mesh> DTensorDevice::mesh_for_unplaced() const {
  if (std::optional<Mesh> mesh = default_mesh()) return mesh;
  std::lock_guard<std::mutex> lock(mutex_);
  if (registered_meshes_.size() == 1) return registered_meshes_[0];
  return std::nullopt;
}

bool DTensorDevice::has_seen_mesh() const {
  if (default_mesh()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  return !registered_meshes_.empty();
}

std::vector<Mesh> DTensorDevice::ambiguous_meshes() const {
  if (default_mesh()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  return registered_meshes_.size() >= 2 ? registered_meshes_ : std::vector<Mesh>();
}

void DTensorDevice::PopDefaultMesh() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto stack = mesh_stacks_.find(std::this_thread::get_id());
  if (stack == mesh_stacks_.end()) return;
  if (!stack->second.empty()) stack->second.pop_back();
  if (stack->second.empty()) mesh_stacks_.erase(stack);
}

std::optional<Mesh> DTensorDevice::default_mesh() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto stack = mesh_stacks_.find(std::this_thread::get_id());
  if (stack == mesh_stacks_.end()) return std::nullopt;
  for (auto it = stack->second.rbegin(); it != stack->second.rend(); ++it) {
    if (*it) return *it;
  }
  return std::nullopt;
}

namespace {

// Per thread: device serial -> layout scopes open there.
std::map<uint64_t, int>& LayoutScopesOfThisThread() {
  thread_local std::map<uint64_t, int> open;
  return open;
}

}  // namespace

bool DTensorDevice::layout_scope_open_here() const {
  const std::map<uint64_t, int>& open = LayoutScopesOfThisThread();
  return !open.empty() && open.count(serial_);
}

void DTensorDevice::PushDefaultLayout(std::optional<Layout> layout) {
  std::lock_guard<std::mutex> lock(mutex_);
  layout_stacks_[std::this_thread::get_id()].push_back(std::move(layout));
  ++LayoutScopesOfThisThread()[serial_];
}

void DTensorDevice::PopDefaultLayout() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto stack = layout_stacks_.find(std::this_thread::get_id());
  if (stack == layout_stacks_.end() || stack->second.empty()) return;
  stack->second.pop_back();
  std::map<uint64_t, int>& open = LayoutScopesOfThisThread();
  auto count = open.find(serial_);
  if (count != open.end() && --count->second <= 0) open.erase(count);
  if (stack->second.empty()) layout_stacks_.erase(stack);
}

std::optional<Layout> DTensorDevice::default_layout() const {
  if (!layout_scope_open_here()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto stack = layout_stacks_.find(std::this_thread::get_id());
  return stack == layout_stacks_.end() || stack->second.empty() ? std::nullopt
                                                                 : stack->second.back();
}

// tf.data's ops (datasets, their iterators and optionals) run on the host only.
bool DTensorDevice::IsHostDataOp(const std::string& op_name) {
  return op_name.find("Dataset") != std::string::npos ||
         op_name.find("Iterator") != std::string::npos ||
         op_name.rfind("Optional", 0) == 0;
}

// A tf.data op placed on the DTensor device with no DTensor input (a dataset built or
// iterated inside `run_on` or `default_mesh`) runs on the host CPU and gives regular
// tensors, as TensorFlow's DTensor keeps datasets off the mesh; DTensorDataset lays their
// elements out.
Status DTensorDevice::RunOnHost(const TFE_Op* op, TFE_Context* context,
                                const std::string& op_name,
                                const std::vector<TFE_TensorHandle*>& handles, int* num_outputs,
                                TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  OpPtr host(TFE_NewOp(context, op_name.c_str(), status.get()));
  TFD_RETURN_IF_TF_ERROR(status.get(), "making '" + op_name + "' for the host");
  TFE_OpAddAttrs(host.get(), TFE_OpGetAttrs(op));
  TFE_OpSetDevice(host.get(), "/device:CPU:0", status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "placing '" + op_name + "' on the host");
  for (TFE_TensorHandle* handle : handles) {
    TFE_OpAddInput(host.get(), handle, status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "passing an input to '" + op_name + "'");
  }
  TFE_Execute(host.get(), outputs, num_outputs, status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "running tf.data op '" + op_name + "' on the host");
  return Status::Ok();
}

void DTensorDevice::WarnOnce(const std::string& op_name, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!warned_.insert(op_name).second) return;
  }
  if (warning_handler_) warning_handler_(message);
}

void DTensorDevice::Execute(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs,
                            TF_Status* status) {
  Status s = ExecuteOp(op, num_outputs, outputs);
  if (!s.ok()) ToTF(s, status);
}

Status DTensorDevice::ExecuteOp(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs) {
  // The thread's status (the builder's too): each call reports into it and is checked.
  TF_Status* status = EagerBuilder::ThreadStatus();
  const std::string op_name = TFE_OpGetName(op, status);
  TFD_RETURN_IF_TF_ERROR(status, "reading the name of an op on the DTensor device");
  TFE_Context* context = TFE_OpGetContext(op, status);
  TFD_RETURN_IF_TF_ERROR(status, "reading the context of '" + op_name + "'");
  const int num_inputs = TFE_OpGetFlatInputCount(op, status);
  TFD_RETURN_IF_TF_ERROR(status, "counting the inputs of '" + op_name + "'");
  std::vector<TFE_TensorHandle*> handles(num_inputs);
  std::vector<const TensorWithLayout*> dtensors(num_inputs);
  for (int i = 0; i < num_inputs; ++i) {
    handles[i] = TFE_OpGetFlatInput(op, i, status);
    TFD_RETURN_IF_TF_ERROR(status, "reading input " + std::to_string(i) + " of '" + op_name + "'");
    dtensors[i] = TensorWithLayout::FromHandle(handles[i], name_);
    if (dtensors[i] && dtensors[i]->context() != context) {
      return InvalidArgument(
          "Input " + std::to_string(i) + " of '" + op_name + "' is a DTensor (" +
          dtensors[i]->layout().ShortString() +
          ") of another TensorFlow eager context than the op's: TensorFlow's context was "
          "reset between them. Either the DTensor was made before the reset (tensors do not "
          "survive a reset; make it again), or the op is a tf.function traced before the "
          "reset, which still runs in the old context (create the tf.function again after "
          "the reset).");
    }
  }
  AttrMap attrs = ReadAttrs(op);

  if (op_name == kPackOp) {
    TFD_ASSIGN_OR_RETURN(Layout layout,
                         Layout::FromString(attrs.GetString("layout").value_or("")));
    TFD_ASSIGN_OR_RETURN(outputs[0], Pack(context, name_, layout, handles));
    RegisterMesh(layout.mesh());
    *num_outputs = 1;
    return Status::Ok();
  }
  if (op_name == kUnpackOp || op_name == kFetchLayoutOp) {
    const TensorWithLayout* tensor = num_inputs == 1 ? dtensors[0] : nullptr;
    const char* what = op_name == kUnpackOp ? "unpack" : "fetch_layout";
    if (!tensor) return InvalidArgument(std::string(what) + " takes a DTensor; got a regular tensor.");
    if (op_name == kUnpackOp) return Unpack(context, *tensor, num_outputs, outputs);
    TFD_ASSIGN_OR_RETURN(outputs[0], FetchLayout(*tensor));
    *num_outputs = 1;
    return Status::Ok();
  }

  const EagerOp eager{op, context, op_name, attrs, handles, dtensors};
  Routed routed;
  routed.rule = RuleRegistry::Global().Find(op_name);
  const bool any_dtensor =
      std::any_of(dtensors.begin(), dtensors.end(), [](const auto* t) { return t != nullptr; });
  // tf.data ops with no DTensor input run on the host. The Optional ops have rules (for
  // functions and DTensor inputs), but an optional made of regular values stays regular.
  if (!any_dtensor && IsHostDataOp(op_name)) {
    return RunOnHost(op, context, op_name, handles, num_outputs, outputs);
  }
  // A constant made from a Python value on the device (`tf.constant(...)` inside `run_on`,
  // `default_mesh` or `call_with_layout`, or converted under `colocate_with(dtensor)`, as
  // `tf.nn.embedding_lookup` converts its ids) stays the regular tensor it is, as in
  // TensorFlow's DTensor, once the device has seen a mesh (several too): an op that takes
  // it puts it on that op's mesh, and call_with_layout relayouts a constant it returns.
  // Before any mesh, ChooseMesh refuses it below, as TensorFlow's DTensor does ("No
  // default mesh has been registered").
  if (routed.rule && routed.rule->traits.python_constant && num_inputs == 1 && !dtensors[0] &&
      (default_layout() || has_seen_mesh())) {
    TF_Status* status = EagerBuilder::ThreadStatus();
    outputs[0] = TFE_TensorHandleCopySharingTensor(handles[0], status);
    TFD_RETURN_IF_TF_ERROR(status, "passing a constant through the DTensor device");
    *num_outputs = 1;
    return Status::Ok();
  }
  // A repeated op whose expansion was local-only runs its local ops directly.
  routed.local_only = LocalOnlyReplays::MeshOf(routed.rule, dtensors, layout_scope_open_here());
  if (routed.local_only &&
      local_only_.Replay(eager, routed.rule, *routed.local_only, name_, num_outputs, outputs)) {
    return Status::Ok();
  }

  // No rule: run replicated (the documented policy, applied by Dispatch); the fallback's
  // traits (no host arguments) serve the mesh choice.
  const bool is_function = !routed.rule && TFE_ContextHasFunction(context, op_name.c_str());
  const std::optional<Layout> user_requested = default_layout();
  MeshChoiceOp choice_op;
  choice_op.name = op_name;
  choice_op.rule = routed.rule ? routed.rule : &FallbackRule(/*stateful=*/false);
  choice_op.calls_function = is_function;
  if (user_requested) {
    choice_op.requested = user_requested->mesh();
    RegisterMesh(user_requested->mesh());
  }
  // The single-registered-mesh fallback matters only to ops without DTensor inputs (and
  // costs a second lock): others keep the default mesh alone, as before.
  choice_op.default_mesh = any_dtensor ? default_mesh() : mesh_for_unplaced();
  if (!any_dtensor && !choice_op.default_mesh) choice_op.ambiguous = ambiguous_meshes();
  std::optional<Layout> target;  // a relayout's
  if (op_name == kRelayoutOp) {
    if (std::optional<std::string> text = attrs.GetString("layout")) {
      TFD_ASSIGN_OR_RETURN(target, Layout::FromString(*text));
      choice_op.target = target->mesh();
      RegisterMesh(target->mesh());
    }
  }
  std::vector<MeshChoiceInput> seen(num_inputs);
  for (int i = 0; i < num_inputs; ++i) {
    if (const TensorWithLayout* t = dtensors[i]) {
      seen[i] = {&t->layout(), t->shape().empty(), t->resource().has_value(), t->parted()};
      routed.parts_in = routed.parts_in || t->parted();
    }
  }
  TFD_ASSIGN_OR_RETURN(MeshChoice choice, ChooseMesh(choice_op, seen));
  // Inputs that move are whole: their first component joins as a host tensor.
  for (int i : choice.moved) {
    handles[i] = dtensors[i]->component(0);
    dtensors[i] = nullptr;
  }
  routed.requested = RuntimeRequest(user_requested);
  routed.parts_requested = user_requested && user_requested->is_parted();
  if (is_function) {
    return CallFunction({context, TFE_OpGetAttrs(op), op_name, choice.mesh, handles, dtensors,
                         routed.requested, routed.parts_in,
                         routed.parts_in || routed.parts_requested},
                        expander_, policy(), name_, num_outputs, outputs);
  }
  // Outputs are parts when an input is; a relayout's have the type of its target.
  routed.parted_out = target ? target->is_parted() : routed.parts_in;
  routed.mesh = std::move(choice.mesh);
  return DispatchOp(eager, routed, num_outputs, outputs);
}

Status DTensorDevice::DispatchOp(const EagerOp& op, const Routed& routed, int* num_outputs,
                                 TFE_TensorHandle** outputs) {
  TF_Status* status = EagerBuilder::ThreadStatus();
  OpContext ctx(op.name, &op.attrs, *routed.mesh);
  ctx.requested = routed.requested;
  ctx.num_outputs = *num_outputs;
  EagerBuilder builder(op.context, ctx.mesh, TFE_OpGetAttrs(op.op), *num_outputs, op_pool_,
                       kernels_);
  if (ctx.mesh.spans_processes() && ChecksEagerCollectives()) {
    // Each eager collective is compared with every other client's before it runs: a
    // client whose eager program went another way gets an error naming both, not a hang.
    // The description names the mesh in full (its size and device order) and the op's
    // inputs (global shapes): a loss's all-reduce of a scalar is the same collective on
    // clients whose meshes or blocks differ.
    TFE_Context* context = op.context;
    const Mesh mesh = ctx.mesh;
    const OpContext* op_ctx = &ctx;  // outlives the builder, which runs the check
    builder.set_collective_check([context, mesh, op_ctx](const CollectiveRecord& r) {
      const std::string kind =
          r.reduction.empty() ? r.kind : r.kind + "(" + r.reduction + ")";
      std::string inputs;  // what every client has alike: global shapes and layouts
      for (const InputInfo& in : op_ctx->inputs) {
        inputs += (inputs.empty() ? "" : ", ") + DataTypeName(in.dtype) + ShapeString(in.shape) +
                  (in.layout ? " " + in.layout->ShortString() : std::string(" host"));
      }
      std::string ids;
      for (int64_t id : mesh.global_device_ids()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      return CheckSameProgram(context, mesh,
                              "eager " + kind + " over " + Join(r.mesh_dims, "+") + " of " +
                                  DataTypeName(r.dtype) + ShapeString(r.shape) + " " +
                                  r.layout_in + " (op '" + r.op + "' of " + inputs + "; " +
                                  mesh.ShortString() + " of devices " + ids + ")");
    });
  }
  const int num_inputs = static_cast<int>(op.handles.size());
  std::vector<ValueId> inputs;
  inputs.reserve(num_inputs);
  ctx.inputs.reserve(num_inputs);
  for (int i = 0; i < num_inputs; ++i) {
    InputInfo info;
    if (const TensorWithLayout* t = op.dtensors[i]) {
      info.shape = t->shape();
      info.dtype = t->dtype();
      info.layout = t->layout();
      info.resource = t->resource();
      inputs.push_back(builder.AddInput(t));
    } else {
      info.shape = HandleShape(op.handles[i], status);
      TFD_RETURN_IF_TF_ERROR(status, "reading the shape of input " + std::to_string(i) +
                                         " of '" + op.name + "'");
      info.dtype = TFE_TensorHandleDataType(op.handles[i]);
      inputs.push_back(builder.AddHostInput(op.handles[i], info.shape,
                                            static_cast<TF_DataType>(info.dtype)));
    }
    ctx.inputs.push_back(std::move(info));
  }
  // Ops on parts run part by part (a relayout of parts is a real relayout).
  // Only then is the wrapper built: most ops see no parts and expand on `builder` itself.
  std::optional<PartedBuilder> parted_builder;
  if (routed.parts_in && op.name != kRelayoutOp) {
    std::set<ValueId> parts;
    for (int i = 0; i < num_inputs; ++i) {
      if (op.dtensors[i] && op.dtensors[i]->parted()) parts.insert(inputs[i]);
    }
    parted_builder.emplace(builder, ctx.mesh, std::move(parts));
  }
  DispatchOptions options;
  options.policy = policy();
  options.expand_with = parted_builder ? &*parted_builder : nullptr;
  options.cache = &plan_cache_;
  options.stateful = !routed.rule && IsStatefulOp(op.name);
  if (routed.local_only) builder.WatchLocalOnly(op.name, inputs);
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                       Dispatch(routed.rule, ctx, std::move(inputs), builder, options));
  // The plan's expansion was local-only: later calls run its local ops directly.
  if (routed.local_only) local_only_.Record(builder, routed.rule, ctx, out);

  // call_with_layout: a single output of the requested rank takes the requested layout,
  // where its shape allows. Constants made from Python values (_EagerConst, a python
  // constant by its traits) are mostly arguments (shapes, seeds) and stay replicated;
  // call_with_layout relayouts its final result, so a constant returned as the result
  // still gets the layout, or a clear error.
  bool parted_out = routed.parted_out;
  if (ctx.requested && out.size() == 1 && !(routed.rule && routed.rule->traits.python_constant) &&
      builder.layout(out[0]) &&
      !builder.resource(out[0]) && builder.layout(out[0])->rank() == ctx.requested->rank() &&
      ctx.requested->UniformLocalShape(builder.shape(out[0]), "").ok()) {
    TFD_ASSIGN_OR_RETURN(out[0], Relayout(builder, out[0], *ctx.requested,
                                          "the output of '" + op.name + "'"));
    // Parts were asked for: the output made in the requested layout is parts.
    parted_out = parted_out || (routed.parts_requested && builder.layout(out[0]) == ctx.requested);
  }
  return builder.Emit(out, name_, parted_out, num_outputs, outputs);
}

FallbackPolicy DTensorDevice::policy() {
  FallbackPolicy p;
  p.strict = RuleRegistry::Global().strict();
  p.warn = [this](const std::string& op_name, const std::string& message) {
    WarnOnce(op_name, message);
  };
  return p;
}

TFE_TensorHandle* DTensorDevice::CopyToDevice(TFE_Context* context, TFE_TensorHandle* tensor,
                                              TF_Status* status) {
  const std::optional<Layout> user_layout = default_layout();
  std::optional<Mesh> mesh =
      user_layout ? std::optional<Mesh>(user_layout->mesh()) : mesh_for_unplaced();
  if (mesh) mesh = RuntimeMesh(*mesh);
  if (!mesh) {
    ToTF(InvalidArgument("Cannot copy a regular tensor onto the DTensor device without a "
                         "layout. Use `dtensor.copy_to_mesh(tensor, layout)`, or create it "
                         "under `dtensor.run_on(mesh)` to replicate it."),
         status);
    return nullptr;
  }
  if (Status here = CheckRunsHere(*mesh, "Copying a tensor onto the DTensor device"); !here.ok()) {
    ToTF(here, status);
    return nullptr;
  }
  EagerBuilder builder(context, *mesh, nullptr, 1, op_pool_, kernels_);
  TF_DataType dtype = TFE_TensorHandleDataType(tensor);
  std::vector<int64_t> shape = HandleShape(tensor, status);
  if (TF_GetCode(status) != TF_OK) return nullptr;
  std::optional<Layout> layout;
  if (user_layout) layout = RuntimeLayout(*user_layout, static_cast<int>(shape.size()));
  auto run = [&]() -> StatusOr<ValueId> {
    TFD_ASSIGN_OR_RETURN(ValueId value,
                         builder.Broadcast(builder.AddHostInput(tensor, shape, dtype), *mesh));
    if (layout && layout->rank() == static_cast<int>(shape.size())) {
      return Relayout(builder, value, *layout, "a tensor copied to the mesh");
    }
    return value;
  };
  StatusOr<ValueId> value = run();
  int one = 1;
  TFE_TensorHandle* out = nullptr;
  const bool parted = user_layout && user_layout->is_parted() && value.ok() &&
                      builder.layout(*value) == layout;
  Status s = value.ok() ? builder.Emit({*value}, name_, parted, &one, &out) : value.status();
  if (!s.ok()) ToTF(s, status);
  return out;
}

TFE_TensorHandle* DTensorDevice::CopyFromDevice(TFE_Context* context, TFE_TensorHandle* tensor,
                                                const std::string& target_device,
                                                TF_Status* status) {
  const TensorWithLayout* t = TensorWithLayout::FromHandle(tensor, name_);
  if (!t) {
    ToTF(Internal("Copying a tensor that is not a DTensor off the DTensor device."), status);
    return nullptr;
  }
  if (t->resource()) {
    ToTF(Unimplemented("Cannot copy the handle of a DVariable (" + t->visible_layout().ShortString() +
                       ") to " + target_device +
                       ": its value lives on the mesh's devices. Read it first "
                       "(`v.read_value()`), or give the op that uses it a DTensor input so it "
                       "runs on the mesh; a checkpoint saves a DVariable through its own "
                       "saveable, not by copying the handle. If TensorFlow's context was reset "
                       "since the DVariable was made (a test base's setUp, "
                       "`initialize_accelerator_system(experimental_reset_context=True)`), the "
                       "DVariable did not survive the reset: make it again after the reset."),
         status);
    return nullptr;
  }
  if (!t->layout().IsFullyReplicated()) {
    // A partial value's devices hold terms of a pending sum (or max...), not shards.
    const bool partial = t->visible_layout().is_partial();
    ToTF(Unimplemented("Cannot copy a DTensor with layout " + t->visible_layout().ShortString() +
                       " to " + target_device + ": it " +
                       (partial ? "holds pending reductions (each device a term of the value)"
                                : "is sharded") +
                       ", and reading it whole would gather every " +
                       (partial ? "term" : "shard") +
                       " on one device. Use `dtensor.unpack(t)` for the components, or "
                       "`dtensor.relayout(t, dtensor.Layout.replicated(mesh, rank))` first."),
         status);
    return nullptr;
  }
  return TFE_TensorHandleCopyToDevice(t->component(0), context, target_device.c_str(), status);
}

}  // namespace tf_dtensor
