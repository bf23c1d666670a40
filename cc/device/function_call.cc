#include "cc/device/function_call.h"

#include <cctype>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "cc/core/strings.h"
#include "cc/core/wire.h"
#include "cc/device/program_check.h"
#include "cc/eager/collective_recovery.h"
#include "cc/spmd/ledger.h"
#include "cc/tf/attrs.h"
#include "cc/tf/handles.h"
#include "cc/tf/resource_value.h"

namespace tf_dtensor {
namespace {

bool FullyKnown(const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

// Results wrapped before a later one fails are released again: TensorFlow takes none of
// them when the op fails.
Status Release(Status error, int wrapped, TFE_TensorHandle** outputs) {
  for (int k = 0; k < wrapped; ++k) {
    TFE_DeleteTensorHandle(outputs[k]);
    outputs[k] = nullptr;
  }
  return error;
}

// Parts stand alone: each device runs the original function on its own parts (the
// expansion only gives the result layouts; its collectives would combine the parts).
// A static input joins each part as its component: only where its shards line up with
// the parts (the same layout) or it is whole (replicated).
Status RunOnParts(const FunctionCall& call, const ExpandedFunction& expanded,
                  const std::string& device_name, TFE_TensorHandle** outputs) {
  const std::string& function = call.function;
  for (size_t i = 0; i < call.dtensors.size(); ++i) {
    const TensorWithLayout* t = call.dtensors[i];
    if (!t || t->parted() || t->resource() || t->layout().IsFullyReplicated()) continue;
    bool aligned = false;
    for (const TensorWithLayout* p : call.dtensors) {
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
  StatusPtr status(TF_NewStatus());
  const int num_results = static_cast<int>(expanded.outputs.size());
  std::vector<std::vector<HandlePtr>> per_result(num_results);
  for (int d = 0; d < call.mesh.num_local_devices(); ++d) {
    const std::string& device = call.mesh.local_devices()[d];
    OpPtr op(TFE_NewOp(call.context, function.c_str(), status.get()));
    TFD_RETURN_IF_TF_ERROR(status.get(), "calling '" + function + "' on a part");
    TFE_OpAddAttrs(op.get(), call.attrs);
    TFE_OpSetDevice(op.get(), device.c_str(), status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "placing '" + function + "' on " + device);
    for (size_t i = 0; i < call.handles.size(); ++i) {
      TFE_OpAddInput(op.get(), call.dtensors[i] ? call.dtensors[i]->component(d) : call.handles[i],
                     status.get());
      TFD_RETURN_IF_TF_ERROR(status.get(), "passing input " + std::to_string(i) + " to '" +
                                               function + "'");
    }
    std::vector<TFE_TensorHandle*> results(num_results, nullptr);
    int count = num_results;
    TFE_Execute(op.get(), results.data(), &count, status.get());
    TFD_RETURN_IF_TF_ERROR(status.get(), "running tf.function '" + function +
                                             "' on the part on " + ShortDeviceName(device));
    for (int k = 0; k < count; ++k) per_result[k].emplace_back(results[k]);
  }
  for (int k = 0; k < num_results; ++k) {
    const ValueMeta& m = expanded.outputs[k];
    const std::string what = "result " + std::to_string(k) + " of '" + function + "'";
    if (!m.layout || m.resource ||
        static_cast<int>(per_result[k].size()) != call.mesh.num_local_devices()) {
      return Release(Unimplemented("Result " + std::to_string(k) + " of tf.function '" +
                                   function + "' on parted inputs is not a tensor of the mesh; "
                                   "return tensors computed from the parts."),
                     k, outputs);
    }
    std::vector<int64_t> local = HandleShape(per_result[k][0].get(), status.get());
    if (TF_GetCode(status.get()) != TF_OK) {
      return Release(FromTF(status.get(), "reading the shape of " + what), k, outputs);
    }
    StatusOr<std::vector<int64_t>> global = m.layout->GlobalShapeChecked(local, what);
    if (!global.ok()) return Release(global.status(), k, outputs);
    auto tensor = std::make_unique<TensorWithLayout>(*m.layout, std::move(global).value(),
                                                     static_cast<TF_DataType>(m.dtype),
                                                     std::move(per_result[k]));
    tensor->set_parted(true);
    outputs[k] = TensorWithLayout::MakeHandle(call.context, device_name, std::move(tensor),
                                              status.get());
    if (TF_GetCode(status.get()) != TF_OK) {
      return Release(FromTF(status.get(), "wrapping " + what), k, outputs);
    }
  }
  return Status::Ok();
}

// What the SPMD function keeps of a call's serialized ConfigProto: soft placement (field
// 7) and XLA auto-clustering (graph_options (10) . optimizer_options (3) . global_jit_level
// (5); 0 is DEFAULT, -1 OFF, 1 and 2 ON).
struct CallConfig {
  bool soft_placement = false;
  int64_t jit_level = 0;
};

// The first length-delimited field `wanted` of a serialized message (empty if none).
std::string_view SubMessage(std::string_view message, int wanted) {
  WireReader reader(message);
  int field = 0, wire_type = 0;
  std::string_view found;
  while (!reader.done() && reader.ReadTag(&field, &wire_type)) {
    if (field == wanted && wire_type == 2) {
      if (!reader.ReadBytes(&found)) return {};
    } else if (!reader.Skip(wire_type)) {
      break;
    }
  }
  return found;
}

// The last value of varint field `wanted` of a serialized message (protobuf's rule for a
// repeated scalar field), or `fallback`.
int64_t VarintField(std::string_view message, int wanted, int64_t fallback) {
  WireReader reader(message);
  int field = 0, wire_type = 0;
  int64_t value = fallback;
  while (!reader.done() && reader.ReadTag(&field, &wire_type)) {
    if (field == wanted && wire_type == 0) {
      uint64_t raw = 0;
      if (!reader.ReadVarint(&raw)) break;
      value = static_cast<int64_t>(raw);
    } else if (!reader.Skip(wire_type)) {
      break;
    }
  }
  return value;
}

CallConfig ParseCallConfig(std::string_view config) {
  CallConfig parsed;
  parsed.soft_placement = VarintField(config, 7, 0) != 0;
  parsed.jit_level = VarintField(SubMessage(SubMessage(config, 10), 3), 5, 0);
  return parsed;
}

// The call's placement, compilation and executor choices carry over to the SPMD function:
// TF gives every tf.function call a `config_proto` and an `executor_type`.
// - Soft placement, for meshes of accelerators: without it an op with no kernel for the
//   mesh's device type (CholeskyGrad, ResizeBicubic, int8 ArgMax on GPUs) fails to place,
//   where the same function on one device runs it on the host. Not on CPUs: every op has a
//   kernel there, and with soft placement TF's placer changed how an AddN of complex values
//   ran on some devices (its replicas differed in the last bit, fuzz case AddN under the
//   `ops` lowering).
// - The XLA auto-clustering level (`tf.config.optimizer.set_jit`): TF's clustering pass
//   then fuses each device's ops of the SPMD function into XLA clusters, as it does for the
//   function on one device.
// The rest of the config is TF's business for the call, not the SPMD function's.
Status CarryRunOptions(const TFE_OpAttrs* attrs, TFE_Op* op, const std::string& function,
                       const Mesh& mesh) {
  if (attrs == nullptr) return Status::Ok();
  StatusPtr status(TF_NewStatus());
  const std::string bytes = SerializedAttrs(attrs, status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "reading the attributes of the call to '" + function + "'");
  StatusOr<AttrMap> parsed = AttrMap::Parse(bytes);
  if (!parsed.ok()) return parsed.status();
  std::optional<std::string> config = parsed.value().GetString("config_proto");
  if (config) {
    const CallConfig wanted = ParseCallConfig(*config);
    WireWriter kept;
    if (mesh.device_type() != "CPU" && wanted.soft_placement) {
      kept.Varint(7, 1);  // ConfigProto.allow_soft_placement
    }
    // OFF (-1) is what DEFAULT (0) is: not clustered. Carried, it gave the SPMD function
    // Grappler (a call gets it only with a config_proto), which rewrote the devices' copies
    // of a replicated computation unevenly (x / 5 on one, x * 0.2 on another): on CPU
    // meshes their results differed in the last bit (`tf.config.optimizer.set_jit(False)`;
    // the program fuzzer, seed 70397).
    if (wanted.jit_level > 0) {
      WireWriter optimizer;
      optimizer.Varint(5, static_cast<uint64_t>(wanted.jit_level));
      WireWriter graph;
      graph.Bytes(3, optimizer.str());
      kept.Bytes(10, graph.str());
    }
    if (!kept.str().empty()) {
      TFE_OpSetAttrString(op, "config_proto", kept.str().data(), kept.str().size());
    }
  }
  std::optional<std::string> executor = parsed.value().GetString("executor_type");
  if (executor) TFE_OpSetAttrString(op, "executor_type", executor->data(), executor->size());
  return Status::Ok();
}

// The SPMD function, called once with every input's components (one per local device of
// its mesh) and returning each result's components.
Status RunWhole(const FunctionCall& call, const ExpandedFunction& expanded,
                const std::string& device_name, TFE_TensorHandle** outputs) {
  const std::string& function = call.function;
  StatusPtr status(TF_NewStatus());
  OpPtr op(TFE_NewOp(call.context, expanded.name.c_str(), status.get()));
  TFD_RETURN_IF_TF_ERROR(status.get(), "calling the SPMD function of '" + function + "'");
  TFE_OpSetDevice(op.get(), call.mesh.local_devices()[0].c_str(), status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "placing the SPMD function of '" + function + "'");
  TFD_RETURN_IF_ERROR(CarryRunOptions(call.attrs, op.get(), function, call.mesh));
  for (size_t i = 0; i < call.handles.size(); ++i) {
    if (!call.dtensors[i]) {
      TFE_OpAddInput(op.get(), call.handles[i], status.get());
    } else {
      for (int d = 0; d < call.dtensors[i]->num_components(); ++d) {
        TFE_OpAddInput(op.get(), call.dtensors[i]->component(d), status.get());
      }
    }
    TFD_RETURN_IF_TF_ERROR(status.get(), "passing input " + std::to_string(i) + " to '" +
                                             function + "'");
  }
  // Each result has one component per local device of its own mesh.
  int flat = 0;
  for (const ValueMeta& m : expanded.outputs) flat += m.num_flat();
  std::vector<TFE_TensorHandle*> raw(flat, nullptr);
  TFE_Execute(op.get(), raw.data(), &flat, status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "running tf.function '" + function + "' on " +
                                           call.mesh.ShortString());
  std::vector<HandlePtr> results;
  for (int r = 0; r < flat; ++r) results.emplace_back(raw[r]);
  int next = 0;
  for (size_t k = 0; k < expanded.outputs.size(); ++k) {
    const ValueMeta& m = expanded.outputs[k];
    const std::string what = "result " + std::to_string(k) + " of '" + function + "'";
    std::vector<HandlePtr> components;
    for (int d = 0; d < m.num_flat() && next < flat; ++d) components.push_back(std::move(results[next++]));
    // A data-dependent size (tf.where, tf.unique) is unknown when the function is traced
    // but known now: an eager value's shape is always whole and global, read from the
    // components (summing the pieces of sharded axes).
    std::vector<int64_t> shape = m.shape;
    if (!m.resource && !FullyKnown(shape)) {
      shape = m.layout->GlobalShapeOfBlocks([&](int d) {
        if (TF_GetCode(status.get()) != TF_OK) return std::vector<int64_t>();
        return HandleShape(components[d].get(), status.get());
      });
      if (TF_GetCode(status.get()) != TF_OK) {
        return Release(FromTF(status.get(), "reading the shape of " + what), k, outputs);
      }
    }
    auto tensor = std::make_unique<TensorWithLayout>(*m.layout, std::move(shape),
                                                     static_cast<TF_DataType>(m.dtype),
                                                     std::move(components));
    tensor->set_resource(m.resource);
    tensor->set_parted((call.parts_out && !m.resource && call.requested &&
                        *m.layout == *call.requested) ||
                       (k < expanded.parted_outputs.size() && expanded.parted_outputs[k]));
    outputs[k] = TensorWithLayout::MakeHandle(call.context, device_name, std::move(tensor),
                                              status.get());
    if (TF_GetCode(status.get()) != TF_OK) {
      return Release(FromTF(status.get(), "wrapping " + what), k, outputs);
    }
  }
  return Status::Ok();
}

// Before an SPMD function first runs on a mesh that spans processes, every client of it
// checks that the others are about to run the same (ProgramCheck): the function's name
// (without TF's numeric suffix), its inputs' dtypes, shapes and layouts, and the
// collectives one call issues, in order. Alike inputs are not enough: a function whose
// graph depends on a Python value it captured (a relayout target, a branch taken while
// tracing) can expand to other collectives on each client, which would then wait in each
// other's collectives forever (an all-gather and an all-to-all never meet).
Status CheckProgramOnce(const FunctionCall& call, const ExpandedFunction& expanded,
                        const std::vector<ValueMeta>& metas) {
  // Keyed by the expansion itself, not its address: an address is reused once a deleted
  // function's expansion is freed, at moments that differ between clients (garbage
  // collection), and a client that skipped a check would leave the others waiting for it.
  bool expected = false;
  if (!expanded.program_checked.compare_exchange_strong(expected, true)) return Status::Ok();
  std::string name = call.function;
  while (!name.empty() && std::isdigit(static_cast<unsigned char>(name.back()))) name.pop_back();
  if (!name.empty() && name.back() == '_') name.pop_back();
  std::string description = "tf.function '" + name + "' on (";
  for (size_t i = 0; i < metas.size(); ++i) {
    const ValueMeta& m = metas[i];
    description += (i ? ", " : "") + std::string(m.resource ? "resource " : "") +
                   DataTypeName(m.dtype) + ShapeString(m.shape) +
                   (m.layout ? " " + m.layout->ShortString() : std::string(" host"));
  }
  description += ") issuing " + std::to_string(expanded.collectives.size()) + " collective(s)";
  for (size_t i = 0; i < expanded.collectives.size(); ++i) {
    const CollectiveRecord& r = expanded.collectives[i];
    description += std::string(i ? "; " : ": ") + r.kind +
                   (r.reduction.empty() ? "" : "(" + r.reduction + ")") + " over " +
                   Join(r.mesh_dims, "+") + " of " + DataTypeName(r.dtype) +
                   ShapeString(r.shape) + " " + r.layout_in + " -> " + r.layout_out;
  }
  Status s = CheckSameProgram(call.context, call.mesh, description);
  if (!s.ok()) expanded.program_checked = false;
  return s;
}

}  // namespace

Status CallFunction(const FunctionCall& call, FunctionExpander& expander,
                    const FallbackPolicy& policy, const std::string& device_name,
                    int* num_outputs, TFE_TensorHandle** outputs) {
  StatusPtr status(TF_NewStatus());
  std::vector<ValueMeta> metas;
  // Per input, a local handle holding its whole value (a host tensor, or a replicated
  // DTensor's first component), for the expansion to read where it must.
  std::vector<TFE_TensorHandle*> value_handles(call.handles.size(), nullptr);
  for (size_t i = 0; i < call.handles.size(); ++i) {
    ValueMeta m;
    if (const TensorWithLayout* t = call.dtensors[i]) {
      m.layout = t->layout();
      m.shape = t->shape();
      m.dtype = t->dtype();
      m.resource = t->resource();
      if (!t->resource() && !t->parted() && t->layout().IsFullyReplicated() &&
          t->num_components() > 0) {
        value_handles[i] = t->component(0);
      }
    } else {
      m.shape = HandleShape(call.handles[i], status.get());
      TFD_RETURN_IF_TF_ERROR(status.get(), "reading the shape of input " + std::to_string(i) +
                                               " of '" + call.function + "'");
      m.dtype = TFE_TensorHandleDataType(call.handles[i]);
      value_handles[i] = call.handles[i];
      // A plain tf.Variable the function captured: its handle says the value's dtype and
      // shape, which the function's graph does not (the variable stays where it is; the
      // function's ops read it there).
      if (std::optional<ResourceValue> value = ResourceValueOf(call.handles[i])) {
        m.resource = ResourceInfo{
            Layout::Replicated(call.mesh, static_cast<int>(value->shape.size())),
            std::move(value->shape), value->dtype};
      }
    }
    metas.push_back(std::move(m));
  }
  OutputRequest request;
  if (call.requested && call.requested->mesh() == call.mesh) request.single = call.requested;
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> expanded,
                       expander.ExpandEagerCall(call.context, call.function, call.mesh,
                                                metas, value_handles, request, policy));
  const int num_results = static_cast<int>(expanded->outputs.size());
  if (num_results > *num_outputs) {
    return Internal("The SPMD function of '" + call.function +
                    "' returns more results than TensorFlow expects.");
  }
  if (call.mesh.spans_processes()) {
    TFD_RETURN_IF_ERROR(CheckProgramOnce(call, *expanded, metas));
  }
  // A run with TF collective ops runs alone among calls of its expansion, and keeps TF's
  // collective state usable whether it fails or a failure before it left it aborted.
  std::optional<CollectiveRun> collective_run;
  std::unique_lock<std::mutex> one_at_a_time(expanded->run_mutex, std::defer_lock);
  if (expanded->uses_instance_keys.load()) {
    collective_run.emplace(call.context);
    one_at_a_time.lock();
  }
  Status ran = call.parts_in ? RunOnParts(call, *expanded, device_name, outputs)
                             : RunWhole(call, *expanded, device_name, outputs);
  if (one_at_a_time.owns_lock()) one_at_a_time.unlock();
  if (!ran.ok() && collective_run) collective_run->Failed();
  TFD_RETURN_IF_ERROR(ran);
  if (ledger::Active()) {
    for (CollectiveRecord record : expanded->collectives) {
      record.where = call.function;
      ledger::Record(std::move(record));
    }
  }
  *num_outputs = num_results;
  return Status::Ok();
}

}  // namespace tf_dtensor
