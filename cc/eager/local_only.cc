#include "cc/eager/local_only.h"

#include <optional>
#include <string>

#include "cc/eager/device_threads.h"

namespace tf_dtensor {

const Mesh* LocalOnlyReplays::MeshOf(const RegisteredRule* rule,
                                     const std::vector<const TensorWithLayout*>& dtensors,
                                     bool layout_requested) {
  if (!rule || layout_requested) return nullptr;
  const int n = static_cast<int>(dtensors.size());
  const Mesh* mesh = nullptr;
  for (int i = 0; i < n; ++i) {
    const TensorWithLayout* t = dtensors[i];
    if (rule->traits.IsHostInput(i, n)) {
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

bool LocalOnlyReplays::Replay(const EagerOp& op, const RegisteredRule* rule, const Mesh& mesh,
                              const std::string& device_name, int* num_outputs,
                              TFE_TensorHandle** outputs) {
  TF_Status* status = EagerBuilder::ThreadStatus();
  const size_t n = op.handles.size();
  std::vector<PlanCache::InputView> views(n);
  // Host arguments' shapes and values (sized at the first one, before views point in).
  std::vector<std::vector<int64_t>> host_shapes;
  std::vector<std::optional<std::vector<int64_t>>> host_values;
  for (size_t i = 0; i < n; ++i) {
    if (const TensorWithLayout* t = op.dtensors[i]) {
      views[i] = {&t->layout(), &t->shape(), t->dtype()};
      continue;
    }
    if (host_shapes.empty()) {
      host_shapes.resize(n);
      host_values.resize(n);
    }
    host_shapes[i] = HandleShape(op.handles[i], status);
    if (TF_GetCode(status) != TF_OK) return false;  // expanded again, which reports it
    host_values[i] = ReadIntValue(op.handles[i]);
    if (!host_values[i]) return false;
    views[i] = {nullptr, &host_shapes[i], TFE_TensorHandleDataType(op.handles[i]),
                &*host_values[i]};
  }
  std::shared_ptr<const LocalOnlyRun> run =
      plans_.FindLocalOnly(*rule, op.name, mesh, *num_outputs, views, op.attrs);
  return run && Run(op, mesh, *run, device_name, num_outputs, outputs);
}

bool LocalOnlyReplays::Run(const EagerOp& op, const Mesh& mesh, const LocalOnlyRun& run,
                           const std::string& device_name, int* num_outputs,
                           TFE_TensorHandle** outputs) {
  TF_Status* status = EagerBuilder::ThreadStatus();
  TFE_Op* local = pool_.Take(op.context, status);
  if (!local) return false;
  const int devices = mesh.num_local_devices();
  const int max_outputs = *num_outputs;
  const int num_results = static_cast<int>(run.outputs.size());
  // results[d * max_outputs + j]: output j of leading device d, run as the expansion ran
  // it (EagerBuilder::RunLocal: the op, its attributes, the device's components).
  std::vector<TFE_TensorHandle*> results(static_cast<size_t>(devices) * max_outputs, nullptr);
  static const LocalOpOptions kAsIs;
  auto run_on = [&](int d, TFE_Op* local_op, TF_Status* s) {
    std::vector<TFE_TensorHandle*> inputs(op.dtensors.size());
    for (size_t i = 0; i < op.dtensors.size(); ++i) {
      inputs[i] = op.dtensors[i] ? op.dtensors[i]->component(d) : op.handles[i];
    }
    int made = max_outputs;
    return EagerBuilder::RunLocal(local_op, op.name, mesh.local_devices()[d],
                                  TFE_OpGetAttrs(op.op), inputs, kAsIs, kernels_,
                                  &results[d * max_outputs], &made, s)
               .ok() &&
           made == num_results;
  };
  std::vector<int> leading;
  for (int d = 0; d < devices; ++d) {
    if (run.leaders[d] == d) leading.push_back(d);
  }
  bool ran = true;
  if (leading.size() > 1 && DispatchOnThreads(mesh)) {
    // One thread per leading device (TF's kernels launch on each device's stream from
    // there): the devices' host work overlaps instead of adding up.
    std::vector<char> ok(leading.size(), 0);
    RunConcurrently(static_cast<int>(leading.size()), [&](int i) {
      TF_Status* s = TF_NewStatus();
      TFE_Op* own = i == 0 ? local : pool_.Take(op.context, s);
      if (own) {
        ok[i] = run_on(leading[i], own, s);
        if (i != 0) pool_.Return(own, s);
      }
      TF_DeleteStatus(s);
    });
    for (char k : ok) ran = ran && k;
  } else {
    for (size_t i = 0; i < leading.size() && ran; ++i) ran = run_on(leading[i], local, status);
  }
  pool_.Return(local, status);
  TF_SetStatus(status, TF_OK, "");  // Return uses it as scratch
  auto result = [&](int d, int j) -> TFE_TensorHandle*& {
    return results[run.leaders[d] * max_outputs + j];
  };
  int wrapped = 0;
  for (; ran && wrapped < num_results; ++wrapped) {
    const int j = wrapped;
    TFE_TensorHandle* first = result(0, j);
    std::vector<int64_t> shape = HandleShape(first, status);
    if (TF_GetCode(status) != TF_OK) break;
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
      shape = layout->GlobalShapeOfBlocks([&](int d) {
        return d == 0 || TF_GetCode(status) != TF_OK ? shape : HandleShape(result(d, j), status);
      });
      if (TF_GetCode(status) != TF_OK) break;
    }
    std::vector<HandlePtr> components;
    components.reserve(devices);
    for (int d = 0; d < devices && TF_GetCode(status) == TF_OK; ++d) {
      if (run.leaders[d] == d) {
        components.emplace_back(result(d, j));  // owned by the record from here on
        result(d, j) = nullptr;
      } else {
        components.push_back(ShareHandle(components[run.leaders[d]].get(), status));
      }
    }
    if (TF_GetCode(status) != TF_OK) break;
    const TF_DataType dtype = TFE_TensorHandleDataType(components[0].get());
    auto tensor = std::make_unique<TensorWithLayout>(*layout, std::move(shape), dtype,
                                                     std::move(components));
    outputs[j] = TensorWithLayout::MakeHandle(op.context, device_name, std::move(tensor), status);
    if (TF_GetCode(status) != TF_OK) break;
  }
  if (ran && wrapped == num_results) {
    *num_outputs = num_results;
    runs_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // Nothing is handed out: the op is expanded again and reports what went wrong.
  for (int k = 0; k < wrapped; ++k) TFE_DeleteTensorHandle(outputs[k]);
  for (TFE_TensorHandle* h : results) {
    if (h) TFE_DeleteTensorHandle(h);
  }
  TF_SetStatus(status, TF_OK, "");
  return false;
}

void LocalOnlyReplays::Record(const EagerBuilder& builder, const RegisteredRule* rule,
                              const OpContext& ctx, const std::vector<ValueId>& outputs) {
  if (ctx.requested) return;
  if (std::optional<LocalOnlyRun> run = builder.LocalOnly(outputs)) {
    plans_.SetLocalOnly(*rule, ctx, std::make_shared<const LocalOnlyRun>(std::move(*run)));
  }
}

}  // namespace tf_dtensor
