#include "cc/device/dtensor_device.h"

#include <memory>
#include <mutex>
#include <set>

#include "cc/core/strings.h"
#include "cc/tf/attrs.h"
#include "cc/eager/executor.h"
#include "cc/eager/kernel_cache.h"
#include "cc/tf/ops.h"
#include "cc/rules/dispatch.h"
#include "cc/rules/registry.h"
#include "cc/spmd/layout_types.h"
#include "cc/spmd/parted_builder.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_tensor.h"
#include "tensorflow/c/tf_tstring.h"

namespace tf_dtensor {
namespace {

struct StatusDeleter {
  void operator()(TF_Status* s) const { TF_DeleteStatus(s); }
};
using StatusPtr = std::unique_ptr<TF_Status, StatusDeleter>;

// The op's attributes, read when a rule first asks for one.
AttrMap ReadAttrs(const TFE_Op* op) {
  const TFE_OpAttrs* attrs = TFE_OpGetAttrs(op);
  return AttrMap::Lazy([attrs] {
    StatusPtr status(TF_NewStatus());
    TF_Buffer* buffer = TF_NewBuffer();
    TFE_OpAttrsSerialize(attrs, buffer, status.get());
    std::string bytes;
    if (TF_GetCode(status.get()) == TF_OK) {
      bytes.assign(static_cast<const char*>(buffer->data), buffer->length);
    }
    TF_DeleteBuffer(buffer);
    return bytes;
  });
}

std::atomic<int> live_devices{0};

// The global shape that the blocks of a DTensor (one shape per local device) add up to:
// along a sharded axis the sum of its pieces, one per coordinate of the mesh dimension
// that shards it (uneven blocks are valid), elsewhere the block's size. Parts stand alone;
// and where another client holds some pieces, blocks are taken as even (as TF DTensor
// does): this client cannot see the others' sizes.
//   [x,*] @ mesh(x=2), blocks [9,2] and [8,2] -> [17,2]
std::vector<int64_t> GlobalShapeOfBlocks(const Layout& layout,
                                         const std::vector<std::vector<int64_t>>& blocks,
                                         bool parted) {
  std::vector<int64_t> global = blocks.empty() ? std::vector<int64_t>{} : blocks[0];
  if (layout.is_single_device() || static_cast<int>(global.size()) != layout.rank()) {
    return global;
  }
  for (int axis = 0; axis < layout.rank(); ++axis) {
    if (!layout.spec(axis).sharded()) continue;
    const std::vector<int> firsts = layout.FirstDeviceOfPieces(axis);
    if (parted || static_cast<int64_t>(firsts.size()) < layout.NumShards(axis)) {
      global[axis] = blocks[0][axis] * layout.NumShards(axis);
      continue;
    }
    global[axis] = 0;
    for (int device : firsts) global[axis] += blocks[device][axis];
  }
  return global;
}

bool FullyKnown(const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

// The runtime form of a requested (call_with_layout / default) layout. A single-device
// request only names the mesh: every tensor there is whole, so nothing is left to ask.
std::optional<Layout> RuntimeRequest(const std::optional<Layout>& requested) {
  if (!requested || requested->is_single_device()) return std::nullopt;
  return RuntimeLayout(*requested, requested->rank());
}

// Outputs go back to TF as custom-device handles.
// `parted`: the outputs are parts (parted layouts).
Status EmitOutputs(EagerBuilder& builder, const std::vector<ValueId>& values,
                   TFE_Context* context, const std::string& device_name, int* num_outputs,
                   TFE_TensorHandle** outputs, bool parted = false) {
  if (static_cast<int>(values.size()) > *num_outputs) {
    return Internal("The op produced more outputs than TensorFlow expects.");
  }
  TF_Status* status = EagerBuilder::ThreadStatus();
  // Outputs wrapped before a later one fails are released again: TensorFlow takes none
  // of them when the op fails.
  auto fail = [&](size_t wrapped, Status error) {
    for (size_t k = 0; k < wrapped; ++k) {
      TFE_DeleteTensorHandle(outputs[k]);
      outputs[k] = nullptr;
    }
    return error;
  };
  for (size_t i = 0; i < values.size(); ++i) {
    StatusOr<std::unique_ptr<TensorWithLayout>> tensor = builder.Release(values[i]);
    if (!tensor.ok()) return fail(i, tensor.status());
    (*tensor)->set_parted(parted && !(*tensor)->resource());
    outputs[i] = TensorWithLayout::MakeHandle(context, device_name, std::move(tensor).value(),
                                              status);
    if (TF_GetCode(status) != TF_OK) return fail(i, FromTF(status, "wrapping an output"));
  }
  *num_outputs = static_cast<int>(values.size());
  return Status::Ok();
}

// The mesh of an op's inputs when a local-only run may serve it (PlanCache::SetLocalOnly):
// every input a DTensor of one mesh (no resource, no parts, nothing partial, each axis
// over one mesh dimension) where the rule reads data, and a host tensor where it reads a
// host argument (an axis, a permutation: its value is part of the plan); else null.
// (Where results are copied to devices rather than shared, GPUs, a replicated op is not
// recorded: EagerBuilder::LocalOnly sees the copies.)
const Mesh* LocalOnlyMesh(const RuleTraits& traits,
                          const std::vector<const TensorWithLayout*>& dtensors) {
  const int n = static_cast<int>(dtensors.size());
  const Mesh* mesh = nullptr;
  for (int i = 0; i < n; ++i) {
    const TensorWithLayout* t = dtensors[i];
    if (traits.IsHostInput(i, n)) {
      if (t) return nullptr;
      continue;
    }
    if (!t || t->resource() || t->parted() || t->layout().is_partial() ||
        t->layout().is_single_device() || t->layout().HasMultiDimAxis() ||
        (mesh && t->layout().mesh() != *mesh)) {
      return nullptr;
    }
    mesh = &t->layout().mesh();
  }
  return mesh;
}

}  // namespace

void ToTF(const Status& status, TF_Status* tf_status) {
  TF_SetStatus(tf_status, static_cast<TF_Code>(status.code()), status.message().c_str());
}

DTensorDevice::DTensorDevice(std::string name) : name_(std::move(name)) {
  RegisterOps();
  live_devices.fetch_add(1);
}

DTensorDevice::~DTensorDevice() {
  alive_->store(false);
  live_devices.fetch_sub(1);
}

int DTensorDevice::num_live() { return live_devices.load(); }

void DTensorDevice::PushDefaultMesh(std::optional<Mesh> mesh) {
  std::lock_guard<std::mutex> lock(mutex_);
  mesh_stack_.push_back(std::move(mesh));
}

void DTensorDevice::PopDefaultMesh() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!mesh_stack_.empty()) mesh_stack_.pop_back();
}

std::optional<Mesh> DTensorDevice::default_mesh() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = mesh_stack_.rbegin(); it != mesh_stack_.rend(); ++it) {
    if (*it) return *it;
  }
  return std::nullopt;
}

void DTensorDevice::PushDefaultLayout(std::optional<Layout> layout) {
  std::lock_guard<std::mutex> lock(mutex_);
  layout_stack_.push_back(std::move(layout));
  layouts_pushed_.store(static_cast<int>(layout_stack_.size()));
}

void DTensorDevice::PopDefaultLayout() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!layout_stack_.empty()) layout_stack_.pop_back();
  layouts_pushed_.store(static_cast<int>(layout_stack_.size()));
}

std::optional<Layout> DTensorDevice::default_layout() const {
  if (layouts_pushed_.load() == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  return layout_stack_.empty() ? std::nullopt : layout_stack_.back();
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
  // The thread's status (the builder's too): these calls only report into it.
  TF_Status* status = EagerBuilder::ThreadStatus();
  const std::string op_name = TFE_OpGetName(op, status);
  if (op_name == kPackOp) return Pack(op, num_outputs, outputs);
  if (op_name == kUnpackOp) return Unpack(op, num_outputs, outputs);
  if (op_name == kFetchLayoutOp) return FetchLayout(op, num_outputs, outputs);
  TFE_Context* context = TFE_OpGetContext(op, status);
  AttrMap attrs = ReadAttrs(op);

  const int num_inputs = TFE_OpGetFlatInputCount(op, status);
  std::vector<TFE_TensorHandle*> handles;
  std::vector<const TensorWithLayout*> dtensors;
  handles.reserve(num_inputs);
  dtensors.reserve(num_inputs);
  for (int i = 0; i < num_inputs; ++i) {
    TFE_TensorHandle* h = TFE_OpGetFlatInput(op, i, status);
    handles.push_back(h);
    dtensors.push_back(TensorWithLayout::FromHandle(h, name_));
    if (dtensors.back() && dtensors.back()->context() != context) {
      return InvalidArgument(
          "Input " + std::to_string(i) + " of '" + op_name + "' is a DTensor (" +
          dtensors.back()->layout().ShortString() +
          ") created before TensorFlow's eager context was reset; tensors do not survive a "
          "reset (TensorFlow invalidates its own too). Create it again after the reset.");
    }
  }

  const RegisteredRule* rule = RuleRegistry::Global().Find(op_name);
  const bool has_rule = rule != nullptr;
  // No rule: run replicated (the documented policy, applied by Dispatch).
  if (!rule) rule = &FallbackRule(/*stateful=*/false);

  // A repeated op whose expansion was local-only runs its local ops directly.
  const Mesh* local_only_mesh =
      has_rule && layouts_pushed_.load() == 0 ? LocalOnlyMesh(rule->traits, dtensors) : nullptr;
  if (local_only_mesh) {
    std::vector<PlanCache::InputView> views(num_inputs);
    // Host arguments' shapes and values (sized at the first one, before views point in).
    std::vector<std::vector<int64_t>> host_shapes;
    std::vector<std::optional<std::vector<int64_t>>> host_values;
    bool readable = true;
    for (int i = 0; i < num_inputs && readable; ++i) {
      if (const TensorWithLayout* t = dtensors[i]) {
        views[i] = {&t->layout(), &t->shape(), t->dtype()};
        continue;
      }
      if (host_shapes.empty()) {
        host_shapes.resize(num_inputs);
        host_values.resize(num_inputs);
      }
      host_shapes[i] = HandleShape(handles[i], status);
      host_values[i] = ReadIntValue(handles[i]);
      readable = TF_GetCode(status) == TF_OK && host_values[i].has_value();
      views[i] = {nullptr, &host_shapes[i], TFE_TensorHandleDataType(handles[i]),
                  readable ? &*host_values[i] : nullptr};
    }
    std::shared_ptr<const LocalOnlyRun> run =
        readable ? plan_cache_.FindLocalOnly(*rule, op_name, *local_only_mesh, *num_outputs,
                                             views, attrs)
                 : nullptr;
    if (run && RunLocalOnly(op, op_name, *local_only_mesh, *run, handles, dtensors,
                            num_outputs, outputs)) {
      return Status::Ok();
    }
  }

  // A replicated scalar, or a replicated value read as a host argument (a shape, an
  // axis), may come from another mesh: TF caches small constants per device, and one
  // device serves every mesh. Such inputs move to the op's mesh; nothing else does.
  // A tf.function call reads every input as data: only scalars move.
  const bool is_function = !has_rule && TFE_ContextHasFunction(context, op_name.c_str());
  auto movable = [&](int i) {
    const TensorWithLayout* t = dtensors[i];
    return t && !t->resource() && !t->parted() && t->layout().IsFullyReplicated() &&
           (t->shape().empty() || (!is_function && rule->traits.IsHostInput(i, num_inputs)));
  };
  // The mesh: the inputs' (all must agree), else the requested layout's, else the default.
  std::optional<Mesh> mesh;
  for (int i = 0; i < num_inputs; ++i) {
    if (!dtensors[i] || movable(i)) continue;
    const Mesh& m = dtensors[i]->layout().mesh();
    // A tf.function may take arguments on several meshes; it runs from its first one's.
    if (mesh && *mesh != m && (is_function || op_name == kRelayoutLikeOp)) continue;
    if (mesh && *mesh != m) {
      return InvalidArgument("'" + op_name + "' got inputs on different meshes: " +
                             UserMesh(*mesh).ShortString() + " and " + UserMesh(m).ShortString() +
                             " (input " +
                             std::to_string(i) +
                             "). An op runs on one mesh; move a tensor with `copy_to_mesh` "
                             "(from its unpacked components) first.");
    }
    mesh = m;
  }
  const std::optional<Layout> user_requested = default_layout();
  const std::optional<Layout> requested = RuntimeRequest(user_requested);
  // Outputs are parts when an input is, or when parts were asked for; a relayout's output
  // has the type of its target.
  bool any_parted = false;
  for (const TensorWithLayout* t : dtensors) any_parted = any_parted || (t && t->parted());
  bool parted_out = any_parted;
  if (op_name == kRelayoutOp) {
    if (std::optional<std::string> text = attrs.GetString("layout")) {
      TFD_ASSIGN_OR_RETURN(Layout target, Layout::FromString(*text));
      if (!mesh) mesh = RuntimeMesh(target.mesh());
      parted_out = target.is_parted();
    }
  }
  if (!mesh && user_requested) mesh = RuntimeMesh(user_requested->mesh());
  if (!mesh) {
    if (std::optional<Mesh> m = default_mesh()) mesh = RuntimeMesh(*m);
  }
  for (int i = 0; i < num_inputs && !mesh; ++i) {
    if (dtensors[i]) mesh = dtensors[i]->layout().mesh();
  }
  for (int i = 0; i < num_inputs; ++i) {
    if (movable(i) && dtensors[i]->layout().mesh() != *mesh) {
      handles[i] = dtensors[i]->component(0);
      dtensors[i] = nullptr;
    }
  }
  if (!mesh) {
    return InvalidArgument("'" + op_name +
                           "' was placed on the DTensor device but none of its inputs is a "
                           "DTensor and no mesh is set. Run it under `dtensor.run_on(mesh)` or "
                           "use `dtensor.call_with_layout(fn, layout, ...)`.");
  }
  if (is_function) {
    return ExecuteFunction(op, op_name, *mesh, handles, dtensors, requested, any_parted,
                           any_parted || (user_requested && user_requested->is_parted()),
                           num_outputs, outputs);
  }
  OpContext ctx(op_name, &attrs, *mesh);
  ctx.requested = requested;
  ctx.num_outputs = *num_outputs;

  EagerBuilder builder(context, ctx.mesh, TFE_OpGetAttrs(op), *num_outputs, op_pool_, kernels_);
  std::vector<ValueId> inputs;
  inputs.reserve(num_inputs);
  ctx.inputs.reserve(num_inputs);
  for (int i = 0; i < num_inputs; ++i) {
    InputInfo info;
    if (dtensors[i]) {
      info.shape = dtensors[i]->shape();
      info.dtype = dtensors[i]->dtype();
      info.layout = dtensors[i]->layout();
      info.resource = dtensors[i]->resource();
      inputs.push_back(builder.AddInput(dtensors[i]));
    } else {
      info.shape = HandleShape(handles[i], status);
      info.dtype = TFE_TensorHandleDataType(handles[i]);
      inputs.push_back(builder.AddHostInput(handles[i], info.shape,
                                            static_cast<TF_DataType>(info.dtype)));
    }
    ctx.inputs.push_back(std::move(info));
  }
  // Ops on parts run part by part (a relayout of parts is a real relayout).
  // Only then is the wrapper built: most ops see no parts and expand on `builder` itself.
  std::optional<PartedBuilder> parted_builder;
  if (any_parted && op_name != kRelayoutOp) {
    std::set<ValueId> parts;
    for (int i = 0; i < num_inputs; ++i) {
      if (dtensors[i] && dtensors[i]->parted()) parts.insert(inputs[i]);
    }
    parted_builder.emplace(builder, ctx.mesh, std::move(parts));
  }
  DispatchOptions options;
  options.policy = policy();
  options.expand_with = parted_builder ? &*parted_builder : nullptr;
  options.cache = &plan_cache_;
  options.stateful = !has_rule && IsStatefulOp(op_name);
  if (local_only_mesh) builder.WatchLocalOnly(op_name, inputs);
  StatusOr<std::vector<ValueId>> results =
      Dispatch(has_rule ? rule : nullptr, ctx, std::move(inputs), builder, options);
  if (!results.ok()) return results.status();
  std::vector<ValueId> out = std::move(results).value();
  // The plan's expansion was local-only: later calls run its local ops directly.
  if (local_only_mesh && !ctx.requested && !parted_builder) {
    if (std::optional<LocalOnlyRun> run = builder.LocalOnly(out)) {
      plan_cache_.SetLocalOnly(*rule, ctx,
                               std::make_shared<const LocalOnlyRun>(std::move(*run)));
    }
  }

  // call_with_layout: a single output of the requested rank takes the requested layout,
  // where its shape allows. Constants made from Python values (_EagerConst, a python
  // constant by its traits) are mostly arguments (shapes, seeds) and stay replicated;
  // call_with_layout relayouts its final result, so a constant returned as the result
  // still gets the layout, or a clear error.
  if (ctx.requested && out.size() == 1 && !rule->traits.python_constant &&
      builder.layout(out[0]) &&
      !builder.resource(out[0]) && builder.layout(out[0])->rank() == ctx.requested->rank() &&
      ctx.requested->UniformLocalShape(builder.shape(out[0]), "").ok()) {
    TFD_ASSIGN_OR_RETURN(out[0], Relayout(builder, out[0], *ctx.requested,
                                          "the output of '" + op_name + "'"));
    // Parts were asked for: the output made in the requested layout is parts.
    if (user_requested->is_parted() && builder.layout(out[0]) == ctx.requested) parted_out = true;
  }
  return EmitOutputs(builder, out, context, name_, num_outputs, outputs, parted_out);
}

bool DTensorDevice::RunLocalOnly(const TFE_Op* op, const std::string& op_name, const Mesh& mesh,
                                 const LocalOnlyRun& run,
                                 const std::vector<TFE_TensorHandle*>& handles,
                                 const std::vector<const TensorWithLayout*>& dtensors,
                                 int* num_outputs, TFE_TensorHandle** outputs) {
  TF_Status* status = EagerBuilder::ThreadStatus();
  TFE_Context* context = TFE_OpGetContext(op, status);
  TFE_Op* local = op_pool_.Take(context, status);
  if (!local) return false;
  const int devices = mesh.num_local_devices();
  const int max_outputs = *num_outputs;
  const int num_results = static_cast<int>(run.outputs.size());
  // results[d * max_outputs + j]: output j of leading device d, run as the expansion ran
  // it (EagerBuilder::RunLocal: the op, its attributes, the device's components).
  std::vector<TFE_TensorHandle*> results(static_cast<size_t>(devices) * max_outputs, nullptr);
  static const LocalOpOptions kAsIs;
  std::vector<TFE_TensorHandle*> inputs(dtensors.size());
  bool ran = true;
  for (int d = 0; d < devices && ran; ++d) {
    if (run.leaders[d] != d) continue;
    for (size_t i = 0; i < dtensors.size(); ++i) {
      inputs[i] = dtensors[i] ? dtensors[i]->component(d) : handles[i];
    }
    int n = max_outputs;
    ran = EagerBuilder::RunLocal(local, op_name, mesh.local_devices()[d], TFE_OpGetAttrs(op),
                                 inputs, kAsIs, kernels_, &results[d * max_outputs], &n, status)
              .ok() &&
          n == num_results;
  }
  op_pool_.Return(local, status);
  int wrapped = 0;
  for (; ran && wrapped < num_results; ++wrapped) {
    const int j = wrapped;
    TFE_TensorHandle* first = results[j];
    std::vector<int64_t> shape = HandleShape(first, status);
    const Layout* layout = &run.outputs[j];
    std::optional<Layout> adapted;
    if (layout->rank() != static_cast<int>(shape.size())) {
      // As LocalOp: a replicated plan takes the kernel's rank; anything else is expanded
      // again, which reports it.
      if (!layout->IsFullyReplicated()) break;
      adapted = Layout::Replicated(mesh, static_cast<int>(shape.size()));
      layout = &*adapted;
    }
    if (!layout->IsFullyReplicated()) {
      std::vector<std::vector<int64_t>> blocks(devices);
      for (int d = 0; d < devices && TF_GetCode(status) == TF_OK; ++d) {
        blocks[d] = d == 0 ? shape : HandleShape(results[run.leaders[d] * max_outputs + j], status);
      }
      shape = GlobalShapeOfBlocks(*layout, blocks, /*parted=*/false);
    }
    std::vector<HandlePtr> components;
    components.reserve(devices);
    for (int d = 0; d < devices && TF_GetCode(status) == TF_OK; ++d) {
      TFE_TensorHandle*& result = results[run.leaders[d] * max_outputs + j];
      if (run.leaders[d] == d) {
        components.emplace_back(result);  // owned by the record from here on
        result = nullptr;
      } else {
        components.push_back(ShareHandle(components[run.leaders[d]].get(), status));
      }
    }
    if (TF_GetCode(status) != TF_OK) break;
    const TF_DataType dtype = TFE_TensorHandleDataType(first);
    auto tensor = std::make_unique<TensorWithLayout>(*layout, std::move(shape), dtype,
                                                     std::move(components));
    outputs[j] = TensorWithLayout::MakeHandle(context, name_, std::move(tensor), status);
    if (TF_GetCode(status) != TF_OK) break;
  }
  if (ran && wrapped == num_results) {
    *num_outputs = num_results;
    local_only_runs_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // Nothing is handed out: the op is expanded again and reports what went wrong.
  for (int k = 0; k < wrapped; ++k) TFE_DeleteTensorHandle(outputs[k]);
  for (TFE_TensorHandle* h : results) {
    if (h) TFE_DeleteTensorHandle(h);
  }
  return false;
}

FallbackPolicy DTensorDevice::policy() {
  FallbackPolicy p;
  p.strict = RuleRegistry::Global().strict();
  p.warn = [this](const std::string& op_name, const std::string& message) {
    WarnOnce(op_name, message);
  };
  return p;
}

Status DTensorDevice::ExecuteFunction(const TFE_Op* op, const std::string& function,
                                      const Mesh& mesh,
                                      const std::vector<TFE_TensorHandle*>& handles,
                                      const std::vector<const TensorWithLayout*>& dtensors,
                                      std::optional<Layout> requested, bool parts_in,
                                      bool parts_out, int* num_outputs,
                                      TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  TFE_Context* context = TFE_OpGetContext(op, status.get());
  std::vector<ValueMeta> metas;
  for (size_t i = 0; i < handles.size(); ++i) {
    ValueMeta m;
    if (dtensors[i]) {
      m.layout = dtensors[i]->layout();
      m.shape = dtensors[i]->shape();
      m.dtype = dtensors[i]->dtype();
      m.resource = dtensors[i]->resource();
    } else {
      m.shape = HandleShape(handles[i], status.get());
      m.dtype = TFE_TensorHandleDataType(handles[i]);
    }
    metas.push_back(std::move(m));
  }
  OutputRequest request;
  if (requested && requested->mesh() == mesh) request.single = requested;
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> expanded,
                       expander_.Expand(context, function, mesh, metas, request, policy()));

  struct OpDeleter {
    void operator()(TFE_Op* o) const { TFE_DeleteOp(o); }
  };
  if (static_cast<int>(expanded->outputs.size()) > *num_outputs) {
    return Internal("The SPMD function of '" + function + "' returns more results than TensorFlow expects.");
  }
  const int n = mesh.num_local_devices();
  if (parts_in) {
    // Parts stand alone: each device runs the original function on its own parts (the
    // expansion only gives the result layouts; its collectives would combine the parts).
    // A static input joins each part as its component: only where its shards line up with
    // the parts (the same layout) or it is whole (replicated).
    for (size_t i = 0; i < dtensors.size(); ++i) {
      const TensorWithLayout* t = dtensors[i];
      if (!t || t->parted() || t->resource() || t->layout().IsFullyReplicated()) continue;
      bool aligned = false;
      for (const TensorWithLayout* p : dtensors) {
        aligned = aligned || (p && p->parted() && p->layout() == t->layout());
      }
      if (!aligned) {
        return Unimplemented(
            "tf.function '" + function + "' on parted inputs runs on each part alone, but input " +
            std::to_string(i) + " has static layout " + t->layout().ShortString() +
            ", whose shards do not line up with the parts. Relayout it to the parted input's "
            "layout (or to replicated) before the call.");
      }
    }
    const int num_results = static_cast<int>(expanded->outputs.size());
    std::vector<std::vector<HandlePtr>> per_result(num_results);
    for (int d = 0; d < n; ++d) {
      std::unique_ptr<TFE_Op, OpDeleter> call(TFE_NewOp(context, function.c_str(), status.get()));
      TFD_RETURN_IF_TF_ERROR(status.get(), "calling '" + function + "' on a part");
      TFE_OpAddAttrs(call.get(), TFE_OpGetAttrs(op));
      TFE_OpSetDevice(call.get(), mesh.local_devices()[d].c_str(), status.get());
      for (size_t i = 0; i < handles.size(); ++i) {
        TFE_OpAddInput(call.get(), dtensors[i] ? dtensors[i]->component(d) : handles[i],
                       status.get());
        TFD_RETURN_IF_TF_ERROR(status.get(), "passing input " + std::to_string(i) +
                                                     " to '" + function + "'");
      }
      std::vector<TFE_TensorHandle*> results(num_results, nullptr);
      int count = num_results;
      TFE_Execute(call.get(), results.data(), &count, status.get());
      TFD_RETURN_IF_TF_ERROR(status.get(), "running tf.function '" + function + "' on the part on " +
                                                   ShortDeviceName(mesh.local_devices()[d]));
      for (int k = 0; k < count; ++k) per_result[k].emplace_back(results[k]);
    }
    for (int k = 0; k < num_results; ++k) {
      const ValueMeta& m = expanded->outputs[k];
      if (!m.layout || m.resource || static_cast<int>(per_result[k].size()) != n) {
        return Unimplemented("Result " + std::to_string(k) + " of tf.function '" + function +
                             "' on parted inputs is not a tensor of the mesh; return tensors "
                             "computed from the parts.");
      }
      std::vector<int64_t> local = HandleShape(per_result[k][0].get(), status.get());
      TFD_RETURN_IF_TF_ERROR(status.get(), "reading the shape of a result of '" + function + "'");
      TFD_ASSIGN_OR_RETURN(std::vector<int64_t> global,
                           m.layout->GlobalShapeChecked(local, "result " + std::to_string(k) +
                                                                   " of '" + function + "'"));
      auto tensor = std::make_unique<TensorWithLayout>(*m.layout, std::move(global),
                                                       static_cast<TF_DataType>(m.dtype),
                                                       std::move(per_result[k]));
      tensor->set_parted(true);
      outputs[k] = TensorWithLayout::MakeHandle(context, name_, std::move(tensor), status.get());
      TFD_RETURN_IF_TF_ERROR(status.get(), "wrapping a result of '" + function + "'");
    }
    *num_outputs = num_results;
    return Status::Ok();
  }
  std::unique_ptr<TFE_Op, OpDeleter> call(TFE_NewOp(context, expanded->name.c_str(), status.get()));
  TFD_RETURN_IF_TF_ERROR(status.get(), "calling the SPMD function of '" + function + "'");
  TFE_OpSetDevice(call.get(), mesh.local_devices()[0].c_str(), status.get());
  for (size_t i = 0; i < handles.size(); ++i) {
    if (!dtensors[i]) {
      TFE_OpAddInput(call.get(), handles[i], status.get());
    } else {
      for (int d = 0; d < dtensors[i]->num_components(); ++d) {
        TFE_OpAddInput(call.get(), dtensors[i]->component(d), status.get());
      }
    }
    TFD_RETURN_IF_TF_ERROR(status.get(), "passing input " + std::to_string(i) + " to '" +
                                                 function + "'");
  }
  // Each result has one component per local device of its own mesh.
  int flat = 0;
  for (const ValueMeta& m : expanded->outputs) flat += m.num_flat();
  std::vector<TFE_TensorHandle*> results(flat, nullptr);
  TFE_Execute(call.get(), results.data(), &flat, status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "running tf.function '" + function + "' on " +
                                               mesh.ShortString());
  int next = 0;
  for (size_t k = 0; k < expanded->outputs.size(); ++k) {
    const ValueMeta& m = expanded->outputs[k];
    std::vector<HandlePtr> components;
    for (int d = 0; d < m.num_flat(); ++d) components.emplace_back(results[next++]);
    // A data-dependent size (tf.where, tf.unique) is unknown when the function is traced
    // but known now: an eager value's shape is always whole and global, read from the
    // components (summing the pieces of sharded axes).
    std::vector<int64_t> shape = m.shape;
    if (!m.resource && !FullyKnown(shape)) {
      std::vector<std::vector<int64_t>> blocks;
      for (const HandlePtr& c : components) {
        blocks.push_back(HandleShape(c.get(), status.get()));
        TFD_RETURN_IF_TF_ERROR(status.get(), "reading the shape of result " +
                                                     std::to_string(k) + " of '" + function + "'");
      }
      shape = GlobalShapeOfBlocks(*m.layout, blocks, false);
    }
    auto tensor = std::make_unique<TensorWithLayout>(*m.layout, std::move(shape),
                                                     static_cast<TF_DataType>(m.dtype),
                                                     std::move(components));
    tensor->set_resource(m.resource);
    tensor->set_parted(parts_out && !m.resource && requested && *m.layout == *requested);
    outputs[k] = TensorWithLayout::MakeHandle(context, name_, std::move(tensor), status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "wrapping a result of '" + function + "'");
  }
  *num_outputs = static_cast<int>(expanded->outputs.size());
  return Status::Ok();
}

Status DTensorDevice::Pack(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  TFE_Context* context = TFE_OpGetContext(op, status.get());
  AttrMap attrs = ReadAttrs(op);
  TFD_ASSIGN_OR_RETURN(Layout user_layout,
                       Layout::FromString(attrs.GetString("layout").value_or("")));
  const int n = TFE_OpGetFlatInputCount(op, status.get());
  // A single-device layout fits components of any rank.
  const int rank0 = n > 0 ? TFE_TensorHandleNumDims(TFE_OpGetFlatInput(op, 0, status.get()),
                                                    status.get())
                          : 0;
  TFD_RETURN_IF_TF_ERROR(status.get(), "reading pack component 0");
  const Layout layout = RuntimeLayout(user_layout, rank0);
  const Mesh& mesh = layout.mesh();
  if (n != mesh.num_local_devices()) {
    return InvalidArgument("pack got " + std::to_string(n) + " components for layout " +
                           user_layout.ShortString() + ", whose mesh has " +
                           std::to_string(mesh.num_local_devices()) +
                           " local devices; pass one component per local device.");
  }
  std::vector<int64_t> local;
  std::vector<std::vector<int64_t>> shapes;
  TF_DataType dtype = TF_FLOAT;
  std::vector<HandlePtr> components;
  for (int i = 0; i < n; ++i) {
    TFE_TensorHandle* h = TFE_OpGetFlatInput(op, i, status.get());
    if (TensorWithLayout::FromHandle(h, name_)) {
      return InvalidArgument("pack component " + std::to_string(i) +
                             " is already a DTensor; pack takes plain tensors.");
    }
    std::vector<int64_t> shape = HandleShape(h, status.get());
    TF_DataType t = TFE_TensorHandleDataType(h);
    if (i == 0) {
      local = shape;
      dtype = t;
      if (static_cast<int>(shape.size()) != layout.rank()) {
        return InvalidArgument("pack components have rank " + std::to_string(shape.size()) +
                               " (shape " + ShapeString(shape) + ") but layout " +
                               layout.ShortString() + " has rank " +
                               std::to_string(layout.rank()) + ".");
      }
    } else if (t != dtype || shape.size() != local.size() ||
               (user_layout.is_parted() && shape != local)) {
      return InvalidArgument("pack component " + std::to_string(i) + " has shape " +
                             ShapeString(shape) + " and dtype " + DataTypeName(t) +
                             " but component 0 has shape " + ShapeString(local) + " and dtype " +
                             DataTypeName(dtype) +
                             "; all components must have one rank and dtype" +
                             (user_layout.is_parted() ? " and, parted, one shape." : "."));
    }
    shapes.push_back(shape);
    // Place each component on its device (on virtual CPUs this shares the buffer).
    TFE_TensorHandle* placed =
        TFE_TensorHandleCopyToDevice(h, context, mesh.local_devices()[i].c_str(), status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "copying pack component " + std::to_string(i));
    components.emplace_back(placed);
  }
  // The global shape adds up the blocks along each sharded axis; then every component must
  // be exactly the block the shard geometry gives its device (uneven shards included).
  std::vector<int64_t> global = GlobalShapeOfBlocks(layout, shapes, user_layout.is_parted());
  for (int i = 0; i < n && !user_layout.is_parted() && !layout.is_single_device(); ++i) {
    ShardGeometry block = layout.GeometryOfDevice(global, i);
    if (static_cast<int64_t>(mesh.num_local_devices()) < mesh.size()) break;
    if (block.shape != shapes[i]) {
      return InvalidArgument(
          "pack component " + std::to_string(i) + " has shape " + ShapeString(shapes[i]) +
          ", but layout " + layout.ShortString() + " with the global shape " +
          ShapeString(global) + " these components add up to puts a block of shape " +
          ShapeString(block.shape) + " at offset " + ShapeString(block.offset) + " on " +
          ShortDeviceName(mesh.local_devices()[i]) +
          ". Give each device its block: ceil(n / k)-sized pieces along each sharded axis, "
          "the last ones smaller or empty.");
    }
  }
  auto tensor = std::make_unique<TensorWithLayout>(layout, std::move(global), dtype,
                                                   std::move(components));
  tensor->set_parted(user_layout.is_parted());
  outputs[0] = TensorWithLayout::MakeHandle(context, name_, std::move(tensor), status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "pack");
  *num_outputs = 1;
  return Status::Ok();
}

Status DTensorDevice::Unpack(const TFE_Op* op, int* num_outputs, TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  TFE_Context* context = TFE_OpGetContext(op, status.get());
  TFE_TensorHandle* input = TFE_OpGetFlatInput(op, 0, status.get());
  const TensorWithLayout* tensor = TensorWithLayout::FromHandle(input, name_);
  if (!tensor) return InvalidArgument("unpack takes a DTensor; got a regular tensor.");
  const Mesh& mesh = tensor->layout().mesh();
  if (*num_outputs < tensor->num_components()) {
    return InvalidArgument("unpack expected " + std::to_string(*num_outputs) +
                           " components but the DTensor has " +
                           std::to_string(tensor->num_components()) + ".");
  }
  for (int i = 0; i < tensor->num_components(); ++i) {
    TFE_TensorHandle* c = tensor->component(i);
    // Shared components live on another CPU: give each its own device name (no copy).
    const char* device = TFE_TensorHandleDeviceName(c, status.get());
    if (mesh.local_devices()[i] == device) {
      outputs[i] = TFE_TensorHandleCopySharingTensor(c, status.get());
    } else {
      outputs[i] = TFE_TensorHandleCopyToDevice(c, context, mesh.local_devices()[i].c_str(),
                                                status.get());
    }
    TFD_RETURN_IF_TF_ERROR(status.get(), "unpack component " + std::to_string(i));
  }
  *num_outputs = tensor->num_components();
  return Status::Ok();
}

Status DTensorDevice::FetchLayout(const TFE_Op* op, int* num_outputs,
                                  TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  const TensorWithLayout* tensor =
      TensorWithLayout::FromHandle(TFE_OpGetFlatInput(op, 0, status.get()), name_);
  if (!tensor) return InvalidArgument("fetch_layout takes a DTensor; got a regular tensor.");
  std::string text = tensor->visible_layout().ToString();
  TF_Tensor* host = TF_AllocateTensor(TF_STRING, nullptr, 0, sizeof(TF_TString));
  TF_TString* tstring = static_cast<TF_TString*>(TF_TensorData(host));
  TF_TString_Init(tstring);
  TF_TString_Copy(tstring, text.data(), text.size());
  outputs[0] = TFE_NewTensorHandle(host, status.get());
  TF_DeleteTensor(host);
  TFD_RETURN_IF_TF_ERROR(status.get(), "fetch_layout");
  *num_outputs = 1;
  return Status::Ok();
}

TFE_TensorHandle* DTensorDevice::CopyToDevice(TFE_Context* context, TFE_TensorHandle* tensor,
                                              TF_Status* status) {
  const std::optional<Layout> user_layout = default_layout();
  std::optional<Mesh> mesh = user_layout ? std::optional<Mesh>(user_layout->mesh()) : default_mesh();
  if (mesh) mesh = RuntimeMesh(*mesh);
  if (!mesh) {
    ToTF(InvalidArgument("Cannot copy a regular tensor onto the DTensor device without a "
                         "layout. Use `dtensor.copy_to_mesh(tensor, layout)`, or create it "
                         "under `dtensor.run_on(mesh)` to replicate it."),
         status);
    return nullptr;
  }
  EagerBuilder builder(context, *mesh, nullptr, 1, op_pool_, kernels_);
  TF_DataType dtype = TFE_TensorHandleDataType(tensor);
  std::vector<int64_t> shape = HandleShape(tensor, status);
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
  Status s = value.ok() ? EmitOutputs(builder, {*value}, context, name_, &one, &out, parted)
                        : value.status();
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
  if (t->resource() || !t->layout().IsFullyReplicated()) {
    ToTF(Unimplemented("Cannot copy a DTensor with layout " + t->visible_layout().ShortString() +
                       " to " + target_device +
                       ": it is sharded, and reading it whole would gather every shard on one "
                       "device. Use `dtensor.unpack(t)` for the components, or "
                       "`dtensor.relayout(t, dtensor.Layout.replicated(mesh, rank))` first."),
         status);
    return nullptr;
  }
  return TFE_TensorHandleCopyToDevice(t->component(0), context, target_device.c_str(), status);
}

}  // namespace tf_dtensor
