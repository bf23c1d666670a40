// The part of a Builder that is the same whether the SPMD program runs at once (eager)
// or is written down as a graph (tf.function): which devices compute a value, and the
// hand-over of collectives to the mesh's CollectiveLowering (lowering.h), through a thin
// runner over this builder's handles.
//
// A value is one handle per local device. Where the mesh's lowering shares buffers
// (virtual CPUs), devices that agree on every mesh coordinate a value is sharded over
// hold the same block, so only one of them (the leader) computes it and the others share
// the leader's result: a replicated op runs once, a [x,*] op once per x.
#ifndef TF_DTENSOR_CC_SPMD_COMPONENT_BUILDER_H_
#define TF_DTENSOR_CC_SPMD_COMPONENT_BUILDER_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cc/spmd/ledger.h"
#include "cc/spmd/builder.h"
#include "cc/spmd/collectives.h"
#include "cc/spmd/lowering.h"
#include "tensorflow/c/tf_datatype.h"
#include "tensorflow/c/tf_tensor.h"

namespace tf_dtensor {

template <typename Handle>
class ComponentBuilder : public Builder {
 public:
  explicit ComponentBuilder(Mesh mesh) : mesh_(std::move(mesh)) {}

  const Mesh& mesh() const { return mesh_; }
  void SetInputs(std::vector<ValueId> inputs) override { inputs_ = std::move(inputs); }

  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  ValueId input(int index) const override { return inputs_[index]; }
  const std::optional<Layout>& layout(ValueId value) const override {
    return values_[value].layout;
  }
  const std::vector<int64_t>& shape(ValueId value) const override { return values_[value].shape; }
  int dtype(ValueId value) const override { return values_[value].dtype; }
  const std::optional<ResourceInfo>& resource(ValueId value) const override {
    return values_[value].resource;
  }
  void set_resource(ValueId value, ResourceInfo info) override {
    values_[value].resource = std::move(info);
  }

  StatusOr<std::vector<ValueId>> LocalOp(const std::string& op_name,
                                         const std::vector<ValueId>& inputs,
                                         const LocalOpOptions& options,
                                         const std::vector<Layout>& out_layouts) override;
  StatusOr<ValueId> AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override;
  StatusOr<ValueId> ReduceScatter(ValueId value, int dim, int mesh_dim, ReduceOp op) override;
  StatusOr<ValueId> ToPartial(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override;
  StatusOr<ValueId> AllGather(ValueId value, int dim) override;
  StatusOr<ValueId> Slice(ValueId value, int dim, int mesh_dim) override;
  StatusOr<ValueId> SliceOver(ValueId value, int dim, const DimSpec& spec) override;
  StatusOr<ValueId> SliceMayBroadcast(ValueId value, int dim, const DimSpec& spec) override;
  // The pieces `shards` (shard indices i) of axis `dim` of `handle` over `pieces` shards,
  // computed on `device` from its size n at run time (a data-dependent size inside
  // tf.function: tf.where's rows) by the shard geometry's rule: each starts at
  // i * ceil(n / k) and holds min(max(n - start, 0), ceil(n / k)). int64 vectors.
  struct DynamicPieces {
    Handle n;      // [1]
    Handle start;  // one per shard
    Handle size;   // one per shard
  };
  StatusOr<DynamicPieces> DynamicPieceGeometry(Handle handle, int dim, int64_t pieces,
                                               const std::vector<int64_t>& shards, int device);
  // The sizes of every piece (shards 0 .. pieces - 1).
  StatusOr<Handle> DynamicPieceSizes(Handle handle, int dim, int64_t pieces, int device);
  // `op` of one output on `device`, with only the attributes `overrides` gives.
  StatusOr<Handle> RunOne(const std::string& op, std::vector<Handle> inputs,
                          std::vector<AttrOverride> overrides, int device) {
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = std::move(overrides);
    TFD_ASSIGN_OR_RETURN(std::vector<Handle> r, RunOn(op, inputs, options, device, 1));
    return r[0];
  }
  StatusOr<ValueId> AllToAll(ValueId value, int from_dim, int to_dim) override;
  StatusOr<ValueId> Broadcast(ValueId host_value, const Mesh& mesh) override;
  StatusOr<ValueId> MoveToMesh(ValueId value, const Mesh& mesh) override;
  // The mesh later ops run on (a tf.function may hold values of several meshes).
  void SetMesh(const Mesh& mesh) { mesh_ = mesh; }

 protected:
  struct Value {
    std::optional<Layout> layout;  // nullopt for a host value
    std::vector<int64_t> shape;    // global shape
    int dtype = 0;
    std::vector<Handle> handles;  // per local device, for DTensor values
    Handle host{};                // for host values
    std::optional<ResourceInfo> resource;
    bool owned = true;  // the builder created the handles (and releases them)
    bool int_value_read = false;
    std::optional<std::vector<int64_t>> int_value;
  };

  // Runs one local op on `device`. `num_outputs` is what the op is expected to produce
  // (-1: as many as it has).
  virtual StatusOr<std::vector<Handle>> RunOn(const std::string& op_type,
                                              const std::vector<Handle>& inputs,
                                              const LocalOpOptions& options, int device,
                                              int num_outputs) = 0;
  // RunOn for several ops of one type and options: `inputs[i]` on `devices[i]`, each of
  // `num_outputs` outputs. A builder whose eager kernels each hold the host for long
  // (launches on accelerators) runs them at once. On failure nothing it made is kept.
  virtual StatusOr<std::vector<std::vector<Handle>>> RunOnEach(
      const std::string& op_type, const std::vector<std::vector<Handle>>& inputs,
      const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs) {
    std::vector<std::vector<Handle>> out;
    out.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      StatusOr<std::vector<Handle>> r = RunOn(op_type, inputs[i], options, devices[i], num_outputs);
      if (!r.ok()) {
        for (const std::vector<Handle>& made : out) DiscardAll(made);
        return r.status();
      }
      out.push_back(std::move(r).value());
    }
    return out;
  }
  // Device `device`'s handle for a value its leader computed: shared, or copied over.
  virtual StatusOr<Handle> Share(Handle leader, int device) = 0;
  // Share for several (`leaders[i]` for `devices[i]`); a builder whose copies block until
  // done makes them at once. On failure nothing it made is kept.
  virtual StatusOr<std::vector<Handle>> ShareAll(const std::vector<Handle>& leaders,
                                                 const std::vector<int>& devices) {
    std::vector<Handle> out;
    out.reserve(leaders.size());
    for (size_t i = 0; i < leaders.size(); ++i) {
      StatusOr<Handle> h = Share(leaders[i], devices[i]);
      if (!h.ok()) {
        for (Handle& made : out) Discard(made);
        return h.status();
      }
      out.push_back(*h);
    }
    return out;
  }
  // ShareAll of one handle to every local device, in device order.
  StatusOr<std::vector<Handle>> ShareToEvery(Handle handle) {
    std::vector<int> devices(mesh_.num_local_devices());
    for (int d = 0; d < static_cast<int>(devices.size()); ++d) devices[d] = d;
    return ShareAll(std::vector<Handle>(devices.size(), handle), devices);
  }
  virtual std::optional<std::vector<int64_t>> LocalShapeOf(Handle handle) = 0;
  virtual int DTypeOf(Handle handle) = 0;
  // Drops a handle the builder made and no value keeps.
  virtual void Discard(Handle handle) {}
  // Outputs a local op has when no output layouts are given (-1: as many as it makes).
  virtual int default_num_outputs() const { return -1; }
  // Runs one TF collective op on every local device at once (`inputs[d]` on device d) and
  // returns each device's single output. Participants wait for each other, so a builder
  // that executes ops must not run them one after another on one thread.
  virtual StatusOr<std::vector<Handle>> RunCollective(const std::string& op_type,
                                                      const std::vector<std::vector<Handle>>& inputs,
                                                      const LocalOpOptions& options) {
    return RunEach(op_type, inputs, options);
  }
  // Whether every local participant has finished a collective when RunCollective
  // returns (a synchronous eager builder), so that its instance key may serve a later
  // step (TakeInstanceKey). Not in a graph: its collectives may run at once.
  virtual bool collectives_done_on_return() const { return false; }
  // Tells a graph builder the local shape of a collective's result, which TF's shape
  // inference leaves partly unknown (CollectiveGatherV2's first axis).
  virtual void SetLocalShape(Handle handle, const std::vector<int64_t>& shape) {}
  // The collective ledger (ledger.h). Eagerly a collective goes to the open ledger, if
  // any; a graph builder keeps every one with its function (`keeps_collectives`), since
  // the function may be called later under a ledger.
  virtual bool keeps_collectives() const { return false; }
  virtual void NoteCollective(CollectiveRecord record) { ledger::Record(std::move(record)); }
  // Notes the collective `kind` on `value` (to `out_specs`, partial `out_partial`) unless
  // it is part of another (a lowering's gather inside an all-to-all): while the returned
  // guard lives, nested collectives are not noted.
  struct NestedCollectives {
    explicit NestedCollectives(int& depth) : depth_(depth) { ++depth_; }
    ~NestedCollectives() { --depth_; }
    int& depth_;
  };
  // Notes a collective about to be issued (not one nested in another): to the ledger, and
  // to BeforeCollective where the builder checks collectives, whose error stops it.
  Status Note(const std::string& kind, ReduceOp op, bool reduces, ValueId value,
              const std::vector<int>& mesh_dims, std::vector<DimSpec> out_specs,
              std::vector<PartialSpec> out_partial) {
    const bool record = keeps_collectives() || ledger::Active();
    if (collective_depth_ > 0 || !(record || checks_collectives())) return Status::Ok();
    Layout layout = *values_[value].layout;
    StatusOr<Layout> out = Layout::FromSpecs(std::move(out_specs), layout.mesh(), layout.type(),
                                             std::move(out_partial));
    if (reduces) layout = PendingOver(layout, mesh_dims, op);
    CollectiveRecord note =
        MakeCollectiveRecord(kind, reduces ? ReduceOpName(op) : "", layout,
                             values_[value].shape, values_[value].dtype, mesh_dims,
                             out.ok() ? *out : layout);
    // Over mesh dimensions of size 1 nothing moves between devices: not a collective.
    if (note.group_size <= 1) return Status::Ok();
    if (checks_collectives()) TFD_RETURN_IF_ERROR(BeforeCollective(note));
    if (record) NoteCollective(std::move(note));
    return Status::Ok();
  }
  // Whether BeforeCollective is called before each collective issued (the eager builder
  // where clients compare their collectives: TF_DTENSOR_CHECK_EAGER_COLLECTIVES).
  virtual bool checks_collectives() const { return false; }
  virtual Status BeforeCollective(const CollectiveRecord&) { return Status::Ok(); }
  // `layout` with a pending `op` over each of `mesh_dims` it does not already list: what
  // a reduction's input is. Eagerly a rule reduces its devices' partial results while
  // their value still carries the result's layout ([*,*], reduced over y: shown as
  // [*,*] +partial(y:sum), as inside a tf.function).
  static Layout PendingOver(const Layout& layout, const std::vector<int>& mesh_dims,
                            ReduceOp op) {
    std::vector<PartialSpec> added;
    for (int d : mesh_dims) {
      if (std::none_of(layout.partial().begin(), layout.partial().end(),
                       [d](const PartialSpec& p) { return p.mesh_dim == d; })) {
        added.push_back(PartialSpec{d, op});
      }
    }
    if (added.empty()) return layout;
    StatusOr<Layout> shown = layout.WithPartial(std::move(added));
    return shown.ok() ? *shown : layout;
  }
  // The pending reductions of `layout` that are not over `mesh_dims`.
  static std::vector<PartialSpec> PartialsBesides(const Layout& layout,
                                                  const std::vector<int>& mesh_dims) {
    std::vector<PartialSpec> kept;
    for (const PartialSpec& p : layout.partial()) {
      if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
        kept.push_back(p);
      }
    }
    return kept;
  }
  int collective_depth_ = 0;
  // Runs `op_type` of one output on every local device with its own inputs; discards what
  // it made on failure.
  StatusOr<std::vector<Handle>> RunEach(const std::string& op_type,
                                        const std::vector<std::vector<Handle>>& inputs,
                                        const LocalOpOptions& options) {
    std::vector<Handle> outputs;
    for (int d = 0; d < static_cast<int>(inputs.size()); ++d) {
      StatusOr<std::vector<Handle>> r = RunOn(op_type, inputs[d], options, d, 1);
      if (!r.ok()) {
        DiscardAll(outputs);
        return r.status();
      }
      outputs.push_back(r.value()[0]);
    }
    return outputs;
  }
  // The lowering of the mesh ops run on now.
  const CollectiveLowering& lowering() const { return CollectiveLowering::For(mesh_); }
  // Refuses a collective some of whose participants belong to processes that cannot
  // take part (CheckCollectiveParticipants).
  Status CheckParticipants(const std::vector<int>& mesh_dims, const std::string& what) const {
    const CollectiveGroups& groups = CollectiveGroups::For(mesh_, mesh_dims);
    if (groups.all_local()) return Status::Ok();
    return CheckCollectiveParticipants(mesh_, groups, what);
  }

  ValueId Add(Value value) {
    values_.push_back(std::move(value));
    return static_cast<ValueId>(values_.size() - 1);
  }
  // leader[d]: the device whose result device d shares (agreeing along `key_dims`).
  // Cached per (mesh, dims): see LocalLeaders.
  const std::vector<int>& Leaders(const std::vector<int>& key_dims) const {
    return LocalLeaders(mesh_, key_dims);
  }
  Handle local(ValueId v, int device) const {
    return values_[v].layout ? values_[v].handles[device] : values_[v].host;
  }
  // An int32 or int64 tensor holding `values` (a host constant), or an error.
  static StatusOr<TF_Tensor*> IntTensor(const std::vector<int64_t>& values,
                                        const std::vector<int64_t>& shape, int dtype) {
    if (dtype != TF_INT32 && dtype != TF_INT64) {
      return Internal("Host constants are int32 or int64.");
    }
    size_t width = dtype == TF_INT32 ? 4 : 8;
    TF_Tensor* tensor = TF_AllocateTensor(static_cast<TF_DataType>(dtype), shape.data(),
                                          static_cast<int>(shape.size()), width * values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == TF_INT32) {
        static_cast<int32_t*>(TF_TensorData(tensor))[i] = static_cast<int32_t>(values[i]);
      } else {
        static_cast<int64_t*>(TF_TensorData(tensor))[i] = values[i];
      }
    }
    return tensor;
  }
  // The first data input whose block on `device` is empty (LocalOpOptions::
  // zeros_for_empty_blocks), or nullopt.
  std::optional<ValueId> EmptyBlockInput(const std::vector<ValueId>& inputs, int device) const {
    for (ValueId v : inputs) {
      const Value& value = values_[v];
      if (!value.layout || value.resource) continue;
      bool known = true;
      for (int64_t s : value.shape) known = known && s >= 0;
      if (!known) continue;
      for (int64_t s : value.layout->GeometryOfDevice(value.shape, device).shape) {
        if (s == 0) return v;
      }
    }
    return std::nullopt;
  }
  // Device `device`'s block of every output as zeros, made from the empty block of
  // `empty` (Reshape to all-zero sizes, then Pad up to the block): no kernel of the op runs.
  StatusOr<std::vector<Handle>> ZerosOn(ValueId empty, const LocalOpOptions& options,
                                        const std::vector<Layout>& out_layouts, int device) {
    std::vector<Handle> outs;
    auto fail = [&](const Status& status) {
      DiscardAll(outs);
      return status;
    };
    const int dtype = values_[empty].dtype;
    for (size_t j = 0; j < out_layouts.size(); ++j) {
      if (j >= options.global_shapes.size() || !options.global_shapes[j] ||
          static_cast<int>(options.global_shapes[j]->size()) != out_layouts[j].rank() ||
          out_layouts[j].rank() == 0) {
        return fail(Internal("zeros_for_empty_blocks needs the rank > 0 global shape of "
                             "every output"));
      }
      std::vector<int64_t> block =
          out_layouts[j].GeometryOfDevice(*options.global_shapes[j], device).shape;
      if (j < options.zeros_grow.size()) {
        for (size_t a = 0; a < block.size() && a < options.zeros_grow[j].size(); ++a) {
          block[a] += options.zeros_grow[j][a];
        }
      }
      const int64_t rank = static_cast<int64_t>(block.size());
      std::vector<int64_t> paddings;
      for (int64_t s : block) {
        paddings.push_back(0);
        paddings.push_back(s);
      }
      StatusOr<ValueId> zero_shape = HostConstant(std::vector<int64_t>(rank, 0), {rank}, TF_INT32);
      if (!zero_shape.ok()) return fail(zero_shape.status());
      StatusOr<ValueId> pads = HostConstant(paddings, {rank, 2}, TF_INT32);
      if (!pads.ok()) return fail(pads.status());
      LocalOpOptions reshape;
      reshape.copy_attrs = false;
      reshape.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT32)};
      StatusOr<std::vector<Handle>> flat =
          RunOn("Reshape", {local(empty, device), local(*zero_shape, device)}, reshape, device, 1);
      if (!flat.ok()) return fail(flat.status());
      LocalOpOptions pad;
      pad.copy_attrs = false;
      pad.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tpaddings", TF_INT32)};
      StatusOr<std::vector<Handle>> zeros =
          RunOn("Pad", {(*flat)[0], local(*pads, device)}, pad, device, 1);
      DiscardAll(*flat);
      if (!zeros.ok()) return fail(zeros.status());
      outs.push_back((*zeros)[0]);
    }
    return outs;
  }
  void DiscardAll(const std::vector<Handle>& handles) {
    for (const Handle& h : handles) Discard(h);
  }

  Mesh mesh_;
  std::vector<Value> values_;
  std::vector<ValueId> inputs_;

 private:
  class Runner;
};

// The CollectiveRunner of one collective: a table of this builder's handles that the
// lowering names by index (LocalHandle).
template <typename Handle>
class ComponentBuilder<Handle>::Runner final : public CollectiveRunner {
 public:
  explicit Runner(ComponentBuilder& builder) : b_(builder) {}

  Builder& builder() override { return b_; }
  const Mesh& mesh() const override { return b_.mesh_; }
  LocalHandle Local(ValueId value, int device) override { return Put(b_.local(value, device)); }
  StatusOr<std::vector<LocalHandle>> RunOn(const std::string& op_type,
                                           const std::vector<LocalHandle>& inputs,
                                           const LocalOpOptions& options, int device,
                                           int num_outputs) override {
    TFD_ASSIGN_OR_RETURN(std::vector<Handle> out,
                         b_.RunOn(op_type, Get(inputs), options, device, num_outputs));
    return Put(out);
  }
  StatusOr<std::vector<LocalHandle>> RunCollective(
      const std::string& op_type, const std::vector<std::vector<LocalHandle>>& inputs,
      const LocalOpOptions& options) override {
    std::vector<std::vector<Handle>> handles;
    handles.reserve(inputs.size());
    for (const std::vector<LocalHandle>& in : inputs) handles.push_back(Get(in));
    TFD_ASSIGN_OR_RETURN(std::vector<Handle> out, b_.RunCollective(op_type, handles, options));
    return Put(out);
  }
  StatusOr<std::vector<std::vector<LocalHandle>>> RunOnEach(
      const std::string& op_type, const std::vector<std::vector<LocalHandle>>& inputs,
      const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs) override {
    std::vector<std::vector<Handle>> handles;
    handles.reserve(inputs.size());
    for (const std::vector<LocalHandle>& in : inputs) handles.push_back(Get(in));
    TFD_ASSIGN_OR_RETURN(std::vector<std::vector<Handle>> out,
                         b_.RunOnEach(op_type, handles, devices, options, num_outputs));
    std::vector<std::vector<LocalHandle>> put;
    put.reserve(out.size());
    for (const std::vector<Handle>& o : out) put.push_back(Put(o));
    return put;
  }
  StatusOr<LocalHandle> Share(LocalHandle leader, int device) override {
    TFD_ASSIGN_OR_RETURN(Handle h, b_.Share(table_[leader], device));
    return Put(h);
  }
  StatusOr<std::vector<LocalHandle>> ShareAll(const std::vector<LocalHandle>& leaders,
                                              const std::vector<int>& devices) override {
    TFD_ASSIGN_OR_RETURN(std::vector<Handle> out, b_.ShareAll(Get(leaders), devices));
    return Put(out);
  }
  void Discard(LocalHandle handle) override { b_.Discard(table_[handle]); }
  bool collectives_done_on_return() const override { return b_.collectives_done_on_return(); }
  std::optional<std::vector<int64_t>> LocalShape(LocalHandle handle) override {
    return b_.LocalShapeOf(table_[handle]);
  }
  void SetLocalShape(LocalHandle handle, const std::vector<int64_t>& shape) override {
    b_.SetLocalShape(table_[handle], shape);
  }
  ValueId AddValue(Layout layout, std::vector<int64_t> shape, int dtype,
                   const std::vector<LocalHandle>& handles) override {
    Value value{std::move(layout), std::move(shape), dtype};
    value.handles = Get(handles);
    return b_.Add(std::move(value));
  }

 private:
  LocalHandle Put(Handle handle) {
    table_.push_back(handle);
    return static_cast<LocalHandle>(table_.size() - 1);
  }
  std::vector<LocalHandle> Put(const std::vector<Handle>& handles) {
    std::vector<LocalHandle> out;
    out.reserve(handles.size());
    for (const Handle& h : handles) out.push_back(Put(h));
    return out;
  }
  std::vector<Handle> Get(const std::vector<LocalHandle>& handles) const {
    std::vector<Handle> out;
    out.reserve(handles.size());
    for (LocalHandle h : handles) out.push_back(table_[h]);
    return out;
  }

  ComponentBuilder& b_;
  std::vector<Handle> table_;
};

template <typename Handle>
StatusOr<std::vector<ValueId>> ComponentBuilder<Handle>::LocalOp(
    const std::string& op_name, const std::vector<ValueId>& inputs, const LocalOpOptions& options,
    const std::vector<Layout>& out_layouts) {
  // Devices that agree on these mesh coordinates hold the same inputs and outputs.
  std::vector<int> key_dims = options.distinct_over;
  for (ValueId v : inputs) {
    if (!values_[v].layout) continue;
    for (int d : values_[v].layout->DistinctMeshDims()) key_dims.push_back(d);
    // A DVariable handle stands for one variable per shard of its value.
    if (values_[v].resource) {
      for (int d : values_[v].resource->value_layout.DistinctMeshDims()) key_dims.push_back(d);
    }
  }
  for (const Layout& l : out_layouts) {
    for (int d : l.DistinctMeshDims()) key_dims.push_back(d);
  }
  const int n = mesh_.num_local_devices();
  std::vector<int> once;
  if (options.run_once) once.assign(n, 0);
  const std::vector<int>& leaders = options.run_once ? once : Leaders(key_dims);
  const int num_outputs =
      out_layouts.empty() ? default_num_outputs() : static_cast<int>(out_layouts.size());

  // The leaders run the op; every other device shares its leader's outputs.
  // per_output[j][d]: device d's handle of output j (Handle{} until made; an output's
  // vector moves into its value once that value is made). Device 0 always leads.
  std::vector<std::vector<Handle>> per_output;
  auto fail = [&](const Status& status) {
    for (const auto& hs : per_output) DiscardAll(hs);
    return status;
  };
  std::vector<Handle> local_inputs;
  local_inputs.reserve(inputs.size());
  for (int d = 0; d < n; ++d) {
    if (leaders[d] != d) {
      for (auto& hs : per_output) {
        StatusOr<Handle> shared = Share(hs[leaders[d]], d);
        if (!shared.ok()) return fail(shared.status());
        hs[d] = *shared;
      }
      continue;
    }
    local_inputs.clear();
    for (ValueId v : inputs) local_inputs.push_back(local(v, d));
    std::optional<ValueId> empty = options.zeros_for_empty_blocks
                                       ? EmptyBlockInput(inputs, d)
                                       : std::nullopt;
    StatusOr<std::vector<Handle>> outs =
        empty ? ZerosOn(*empty, options, out_layouts, d)
              : RunOn(op_name, local_inputs, options, d, num_outputs);
    if (!outs.ok()) return fail(outs.status());
    if (d == 0) {
      per_output.assign(outs->size(), std::vector<Handle>(n));
    } else if (outs->size() != per_output.size()) {
      DiscardAll(*outs);
      return fail(Internal("'" + op_name + "' made " + std::to_string(outs->size()) +
                           " outputs on device " + std::to_string(d) + " but " +
                           std::to_string(per_output.size()) + " on device 0."));
    }
    for (size_t j = 0; j < outs->size(); ++j) per_output[j][d] = (*outs)[j];
  }
  std::vector<ValueId> result;
  for (size_t j = 0; j < per_output.size(); ++j) {
    const Handle first = per_output[j][0];
    std::optional<std::vector<int64_t>> local_shape = LocalShapeOf(first);
    const std::optional<std::vector<int64_t>>* given =
        j < options.global_shapes.size() && options.global_shapes[j] ? &options.global_shapes[j]
                                                                     : nullptr;
    // Shape inference knew nothing (TensorListPopBack's element without handle data):
    // the rule's global shape gives the blocks.
    if (!local_shape && given && j < out_layouts.size() &&
        out_layouts[j].rank() == static_cast<int>((*given)->size())) {
      local_shape = std::vector<int64_t>((*given)->size(), -1);
      std::vector<int64_t> global = **given;
      for (int d = 0; d < n; ++d) {
        SetLocalShape(per_output[j][d], out_layouts[j].GeometryOfDevice(global, d).shape);
      }
    }
    if (!local_shape) {
      return fail(FailedPrecondition(
          "The shape of output " + std::to_string(j) + " of '" + op_name +
          "' is unknown, even its rank; tf_dtensor needs static shapes. Give the function "
          "inputs of fixed shape; where the op's axes or shape are known only when it runs "
          "(a reduction over run-time axes without keepdims, and its gradient), compute them "
          "from static shapes or keep the reduced axes (keepdims=True). A plain tf.Variable "
          "read inside the function is such an "
          "input (TF gives its value no shape there): make it a DVariable "
          "(`dtensor.DVariable(dtensor.copy_to_mesh(value, layout))`), or pass its value in "
          "(`fn(x, variable.read_value())`)."));
    }
    Value v;
    v.dtype = DTypeOf(first);
    v.layout = j < out_layouts.size()
                   ? out_layouts[j]
                   : Layout::Replicated(mesh_, static_cast<int>(local_shape->size()));
    v.shape = *local_shape;
    // The planned rank must be the kernel's. A replicated plan adapts (Svd's unused u and v
    // are scalars eagerly but [0] vectors in a graph); anything else would index axes that
    // do not exist, so it is an error, never a crash.
    if (v.layout->rank() != static_cast<int>(v.shape.size())) {
      if (!v.layout->IsFullyReplicated()) {
        return fail(Internal("Output " + std::to_string(j) + " of '" + op_name +
                             "' has rank " + std::to_string(v.shape.size()) +
                             " but its rule planned " + v.layout->ShortString() + "."));
      }
      v.layout = Layout::Replicated(mesh_, static_cast<int>(v.shape.size()));
    }
    if (v.layout->rank() == static_cast<int>(local_shape->size())) {
      // The pieces add up along sharded axes (uneven shards); unknown pieces give -1.
      v.shape = v.layout->GlobalShapeOfBlocks([&](int device) {
        if (device == 0) return *local_shape;
        return LocalShapeOf(per_output[j][device])
            .value_or(std::vector<int64_t>(local_shape->size(), -1));
      });
    }
    v.handles = std::move(per_output[j]);
    if (given && (*given)->size() == v.shape.size() &&
        v.layout->rank() == static_cast<int>(v.shape.size())) {
      bool filled = false;
      for (size_t axis = 0; axis < v.shape.size(); ++axis) {
        if (v.shape[axis] >= 0 || (**given)[axis] < 0) continue;
        v.shape[axis] = (**given)[axis];
        filled = true;
      }
      for (int d = 0; d < n && filled; ++d) {
        SetLocalShape(v.handles[d], v.layout->GeometryOfDevice(v.shape, d).shape);
      }
    }
    result.push_back(Add(std::move(v)));
  }
  return result;
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllReduce(ValueId value,
                                                      const std::vector<int>& mesh_dims,
                                                      ReduceOp op) {
  const Layout layout = *values_[value].layout;
  mesh_ = layout.mesh();  // a collective runs on its value's mesh
  TFD_RETURN_IF_ERROR(CheckParticipants(
      mesh_dims, std::string("all-reduce (") + ReduceOpName(op) + ") a " + layout.ShortString() +
                     " value"));
  if (ledger::DropsAllReduceForTesting(ledger::CurrentOp())) {
    Value dropped = values_[value];  // the same components, claimed to be the sum
    dropped.layout = layout.WithoutPartial();
    dropped.owned = false;
    return Add(std::move(dropped));
  }
  TFD_RETURN_IF_ERROR(Note("all-reduce", op, true, value, mesh_dims, layout.specs(),
                           PartialsBesides(layout, mesh_dims)));
  NestedCollectives nested(collective_depth_);
  Runner runner(*this);
  return lowering().AllReduce(runner, value, mesh_dims, op);
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::ReduceScatter(ValueId value, int dim, int mesh_dim,
                                                          ReduceOp op) {
  const Layout layout = *values_[value].layout;
  mesh_ = layout.mesh();  // a collective runs on its value's mesh
  TFD_RETURN_IF_ERROR(CheckParticipants(
      {mesh_dim}, std::string("reduce-scatter (") + ReduceOpName(op) + ") axis " +
                      std::to_string(dim) + " of a " + layout.ShortString() + " value"));
  std::vector<DimSpec> scattered = layout.specs();
  scattered[dim] = DimSpec::Sharded(mesh_dim);
  TFD_RETURN_IF_ERROR(Note("reduce-scatter", op, true, value, {mesh_dim}, scattered,
                           PartialsBesides(layout, {mesh_dim})));
  NestedCollectives nested(collective_depth_);
  Runner runner(*this);
  return lowering().ReduceScatter(runner, value, dim, mesh_dim, op);
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::ToPartial(ValueId value,
                                                      const std::vector<int>& mesh_dims,
                                                      ReduceOp op) {
  mesh_ = values_[value].layout->mesh();
  Runner runner(*this);
  return lowering().ToPartial(runner, value, mesh_dims, op);
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllGather(ValueId value, int dim) {
  const Layout layout = *values_[value].layout;
  mesh_ = layout.mesh();  // a collective runs on its value's mesh
  TFD_RETURN_IF_ERROR(CheckParticipants(
      layout.spec(dim).mesh_dims(),
      "all-gather axis " + std::to_string(dim) + " of a " + layout.ShortString() + " value"));
  std::vector<DimSpec> gathered = layout.specs();
  gathered[dim] = DimSpec::Replicated();
  TFD_RETURN_IF_ERROR(Note("all-gather", ReduceOp::kSum, false, value,
                           layout.spec(dim).mesh_dims(), gathered, layout.partial()));
  NestedCollectives nested(collective_depth_);
  Runner runner(*this);
  return lowering().AllGather(runner, value, dim);
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::AllToAll(ValueId value, int from_dim, int to_dim) {
  const Layout layout = *values_[value].layout;
  mesh_ = layout.mesh();  // a collective runs on its value's mesh
  TFD_RETURN_IF_ERROR(CheckParticipants(
      layout.spec(from_dim).mesh_dims(),
      "all-to-all axis " + std::to_string(from_dim) + " of a " + layout.ShortString() + " value"));
  std::vector<DimSpec> moved = layout.specs();
  moved[to_dim] = moved[from_dim];
  moved[from_dim] = DimSpec::Replicated();
  TFD_RETURN_IF_ERROR(Note("all-to-all", ReduceOp::kSum, false, value,
                           layout.spec(from_dim).mesh_dims(), moved, layout.partial()));
  NestedCollectives nested(collective_depth_);
  Runner runner(*this);
  return lowering().AllToAll(runner, value, from_dim, to_dim);
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::Broadcast(ValueId host_value, const Mesh& mesh) {
  const Value host = values_[host_value];
  Value out{Layout::Replicated(mesh, static_cast<int>(host.shape.size())), host.shape, host.dtype};
  TFD_ASSIGN_OR_RETURN(out.handles, ShareToEvery(host.host));
  out.int_value_read = host.int_value_read;
  out.int_value = host.int_value;
  return Add(std::move(out));
}

template <typename Handle>
StatusOr<ValueId> ComponentBuilder<Handle>::MoveToMesh(ValueId value, const Mesh& mesh) {
  const Value source = values_[value];  // a copy: Add below may reallocate values_
  if (!source.layout || source.resource || source.handles.empty() ||
      !(source.layout->IsFullyReplicated() || source.layout->is_single_device())) {
    return Internal("Only a whole (replicated) tensor value moves between meshes.");
  }
  mesh_ = mesh;
  Value out{Layout::Replicated(mesh, static_cast<int>(source.shape.size())), source.shape,
            source.dtype};
  TFD_ASSIGN_OR_RETURN(out.handles, ShareToEvery(source.handles[0]));
  out.int_value_read = source.int_value_read;
  out.int_value = source.int_value;
  return Add(std::move(out));
}

}  // namespace tf_dtensor

// The slicing members (Slice, SliceOver, SliceMayBroadcast and the run-time piece
// geometry) are defined in their own file.
#include "cc/spmd/component_builder_slicing.h"  // IWYU pragma: export

#endif  // TF_DTENSOR_CC_SPMD_COMPONENT_BUILDER_H_
