// The graph Builder: writes an SPMD program as nodes of a TF_Graph.
//
// The same rules that drive the eager executor drive this builder, so a tf.function runs
// exactly the local ops, collectives and relayouts its ops would run eagerly; only here
// they become one multi-device function. Each node is placed on its mesh device. On
// meshes of virtual CPUs a value that is the same on several devices (a replicated
// value, or a shard two devices share) is computed once and its one output feeds every
// device, as in the eager executor (ComponentBuilder decides which device computes what).
#ifndef TF_DTENSOR_CC_GRAPH_GRAPH_BUILDER_H_
#define TF_DTENSOR_CC_GRAPH_GRAPH_BUILDER_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cc/graph/cluster_phases.h"
#include "cc/graph/function_def.h"
#include "cc/spmd/component_builder.h"
#include "tensorflow/c/c_api.h"

namespace tf_dtensor {

// How many values this thread's graph builders could not know before their function runs:
// an integer a rule plans with that folds to no constant (IntValue), a shape TensorFlow
// infers only in part (InferredShape). An expansion that failed without meeting one fails
// the same whatever values its arguments hold (FunctionExpander::ExpandEagerCall).
int64_t UnknownValuesMet();

class GraphBuilder : public ComponentBuilder<TF_Output> {
 public:
  GraphBuilder(TF_Graph* graph, Mesh mesh);
  ~GraphBuilder() override;

  TF_Graph* graph() const { return graph_; }
  // The device of host values (shapes, constants): the host CPU of the mesh.
  const std::string& host_device() const { return host_device_; }
  // Marks every op it then places on a mesh device for XLA (`_XlaCompile`): the traced
  // function asked for jit_compile=True, and TF's clustering pass compiles each device's
  // ops that XLA can compile into clusters of that device (collectives, Send/Recv and ops
  // without an XLA kernel stay outside). One XLA computation cannot span the devices.
  // Not where the host device is one of the mesh's (virtual CPUs with the host's among
  // them): there a device's ops and the host's share one device, and a cluster of both
  // could hold a host op that other devices' collectives wait for while it waits for
  // this device's (a deadlock no edge shows); such a function runs as without
  // jit_compile, as TensorFlow's DTensor runs every function on a mesh.
  void set_xla_compile(bool compile) { xla_compile_ = compile; }

  // Program values.
  ValueId AddDTensor(Layout layout, std::vector<int64_t> shape, int dtype,
                     std::optional<ResourceInfo> resource, std::vector<TF_Output> components);
  ValueId AddHost(TF_Output output);
  // A host value goes to the mesh replicated, with the shape TF inferred for it: one whose
  // rank TF does not know (a hash table's lookup, TF gives it no shape without the table's
  // handle data) is refused with the fix, never taken for a scalar.
  StatusOr<ValueId> Broadcast(ValueId host_value, const Mesh& mesh) override;
  // Whether TF's shape inference left the rank of host value `value` open.
  bool rank_unknown(ValueId value) const { return unknown_rank_.count(value) > 0; }
  // `value` (a host value) through EnsureShape: it has `shape` in the graph, and the run
  // checks it (a restored tensor assigned to a DVariable of that shape).
  StatusOr<ValueId> EnsureHostShape(ValueId value, const std::vector<int64_t>& shape);
  bool is_host(ValueId value) const { return !values_[value].layout; }
  TF_Output host(ValueId value) const { return values_[value].host; }
  TF_Output component(ValueId value, int device) const { return values_[value].handles[device]; }
  // The value of a small integer host or replicated value, when the graph determines it.
  std::optional<std::vector<int64_t>> IntValue(ValueId value) override;

  // The node being expanded: its attributes are what `copy_attrs` copies, and every op
  // created until the next BeginNode waits for `control_inputs` (those on its own device,
  // where devices share no buffers: ControlsFor).
  void BeginNode(const std::string& name, const std::string& op, const RawAttrs* attrs,
                 std::vector<TF_Operation*> control_inputs);
  // Whether an op waits only for its control inputs on its own device (devices share no
  // buffers: each orders its own side effects; ControlsFor).
  bool orders_per_device() const { return !lowering().shares_buffers(); }
  // The ops created since BeginNode.
  const std::vector<TF_Operation*>& created() const { return created_; }
  // Ops the function must run although nothing reads them (HoldForwardedInput).
  const std::vector<TF_Operation*>& must_run() const { return must_run_; }

  // Adds one node; inputs are flat and grouped into the op's list arguments here.
  StatusOr<TF_Operation*> Emit(const std::string& op_type, const std::vector<TF_Output>& inputs,
                               const LocalOpOptions& options, const std::string& device,
                               const RawAttrs& extra_attrs = {});
  // Adds one node on the host (shapes, functional control flow, ops on plain values). It
  // is never marked for XLA, even where the host is one of the mesh's devices (virtual
  // CPUs), whose own ops are: clustered with a device's ops, a host op that feeds other
  // devices' collectives could wait on that device's, which no edge shows (a deadlock).
  StatusOr<TF_Operation*> EmitOnHost(const std::string& op_type,
                                     const std::vector<TF_Output>& inputs,
                                     const LocalOpOptions& options,
                                     const RawAttrs& extra_attrs = {});
  // The shape of a graph tensor as inferred (-1 for unknown dims), or nullopt when even
  // the rank is unknown.
  std::optional<std::vector<int64_t>> InferredShape(TF_Output output) const;
  // The op's definition; nullptr for functions and unknown ops.
  const OpSpec* FindOp(const std::string& op_type);

  StatusOr<ValueId> HostConstant(const std::vector<int64_t>& values,
                                 const std::vector<int64_t>& shape, int dtype) override;

  // Component `device` of a value, placed on that device (an Identity there).
  StatusOr<TF_Output> OnDevice(ValueId value, int device);

  // All-reduces to replicated values are deferred (TF_DTENSOR_COMBINE_ALL_REDUCE_MIB, 64 by
  // default; 0 turns it off) where devices do not share buffers: the value they return is
  // an Identity of each device's partial value, a stand-in, until CombineAllReduces.
  StatusOr<ValueId> AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                              ReduceOp op) override;
  // Runs the deferred all-reduces, several as one where nothing orders them (as TF's
  // DTensor combines them): those of one mesh, reduction, dtype and partial layout, none
  // of which depends on another's result, up to the size limit. Each device flattens and
  // concatenates its parts, one all-reduce runs, and SplitV + Reshape give every consumer
  // of a stand-in its part. Returns stand-in -> its result, for outputs that name a
  // stand-in directly. Call once, when the graph is complete.
  StatusOr<std::map<TF_Operation*, TF_Output>> CombineAllReduces();

  // The collectives this graph issues per run, in the order emitted (ledger.h); a loop
  // body's or branch's are added by the caller (AddCollectives).
  const std::vector<CollectiveRecord>& collectives() const { return collectives_; }

  // Relayouts made while expanding a node without control inputs are handed out again
  // (Builder::ReusableRelayout); one made under control inputs waits for them, and a
  // later reader need not.
  std::optional<ValueId> ReusableRelayout(ValueId value, const Layout& target) override;
  void NoteRelayout(ValueId value, const Layout& target, ValueId result) override;
  // Partial values some reader had reduced (relayouted to their layout without the
  // pending reductions): FunctionExpansion reduces them once where they are made instead.
  const std::set<ValueId>& reduced_by_readers() const { return reduced_by_readers_; }
  // `branch`: the conditional branch they belong to ("" for none; see CollectiveRecord).
  void AddCollectives(const std::vector<CollectiveRecord>& records, bool in_loop,
                      const std::string& branch = "");

 protected:
  bool keeps_collectives() const override { return true; }
  void NoteCollective(CollectiveRecord record) override {
    // Outside an op's rule (a pending reduction done where a value leaves the function):
    // the node being expanded names it, "(output)" for the function's results.
    if (record.op.empty()) record.op = node_op_.empty() ? "(" + node_name_ + ")" : node_op_;
    collectives_.push_back(std::move(record));
  }
  StatusOr<std::vector<TF_Output>> RunOn(const std::string& op_type,
                                         const std::vector<TF_Output>& inputs,
                                         const LocalOpOptions& options, int device,
                                         int num_outputs) override;
  StatusOr<TF_Output> Share(TF_Output leader, int device) override;
  std::optional<std::vector<int64_t>> LocalShapeOf(TF_Output output) override {
    return InferredShape(output);
  }
  int DTypeOf(TF_Output output) override { return TF_OperationOutputType(output); }
  void SetLocalShape(TF_Output output, const std::vector<int64_t>& shape) override;

 private:
  std::string UniqueName(const std::string& op_type);
  // The shape of a hash table lookup whose handle carries no shape data, set on the graph
  // (LookupTableFindV2: the keys' shape, then the default value's); nullopt for other ops.
  std::optional<std::vector<int64_t>> LookupShape(TF_Output output);
  // Where devices do not share buffers (GPUs), a constant is made on each device that
  // reads it: TF builds a Const's tensor once, where an edge from another device would
  // copy it on every call (a host-to-device copy for a host constant). `c` itself when it
  // is not a Const, or has control inputs, or already is on `device`.
  StatusOr<TF_Output> ConstOn(TF_Output c, const std::string& device);
  // Where devices do not share buffers, the host constants `op` reads are made on its
  // device instead (ConstOn): int32 ones always (an edge from the host would send and
  // receive them on every call), others where the op reads them from device memory (else
  // a host-to-device copy on every call); an int64 read from host memory stays.
  Status PlaceConstants(TF_Operation* op, const std::string& device);
  // Under jit_compile on a mesh of CPUs apart from the host's, an op of a device reads a
  // host value through an Identity of its own device, left out of XLA: else a cluster of
  // that device takes a compile-time constant (a Slice's begin, from the gradient of a
  // Pad) from the host, and TF's XLA launch refuses a cluster whose inputs span two CPUs
  // ("Multiple CPU devices"; a GPU's cluster may read its constants from the host's CPU).
  // One Identity per value and device.
  StatusOr<TF_Output> HostValueOnDevice(TF_Output value, const std::string& device);
  std::map<std::tuple<TF_Operation*, int, std::string>, TF_Output> host_values_on_device_;

  TF_Graph* graph_;
  std::string host_device_;
  bool host_on_mesh_;  // the host device is one of the mesh's (virtual CPUs)
  bool emitting_on_host_ = false;  // within EmitOnHost
  std::set<ValueId> unknown_rank_;  // host values whose rank TF's shape inference leaves open
  bool xla_compile_ = false;
  // Where collectives are TF collective ops, the XLA cluster scope of every op.
  ClusterPhases phases_;
  TF_Status* status_;
  std::map<std::string, std::unique_ptr<OpSpec>> op_specs_;
  // The node being expanded.
  std::string node_name_;
  std::string node_op_;
  const RawAttrs* node_attrs_ = nullptr;
  std::optional<AttrMap> node_attr_map_;
  std::vector<TF_Operation*> control_inputs_;
  // The control inputs of an op created on `device` (see the definition).
  std::vector<TF_Operation*> ControlsFor(const std::string& device,
                                         const std::string& op_type) const;
  std::vector<TF_Operation*> created_;
  std::vector<TF_Operation*> must_run_;
  Status HoldForwardedInput(TF_Operation* op, const std::string& op_type,
                            const std::string& device);
  int counter_ = 0;
  std::map<std::pair<TF_Operation*, std::string>, TF_Operation*> const_copies_;
  // A deferred all-reduce: its partial value's components and the stand-ins.
  struct PendingAllReduce {
    Layout layout;  // of the partial value
    std::vector<int64_t> shape;
    int dtype;
    std::vector<int> mesh_dims;
    ReduceOp op;
    std::vector<TF_Output> inputs;
    std::vector<TF_Operation*> stand_ins;
    int record = -1;  // its entry in collectives_, marked `combined` when joined
  };
  std::vector<CollectiveRecord> collectives_;
  std::map<ValueId, std::vector<std::pair<Layout, ValueId>>> relayouts_;  // value -> (layout, result)
  std::set<ValueId> reduced_by_readers_;
  std::vector<PendingAllReduce> pending_;
  int64_t combine_limit_bytes_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_GRAPH_BUILDER_H_
